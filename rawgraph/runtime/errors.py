"""Typed errors, and the one helper that turns ``cuda.bindings`` results into values.

Every call into ``cuda.bindings`` returns a tuple ``(err, *values)``. :func:`call` runs a driver
function, raises :class:`CudaError` (or :class:`CaptureError` for capture-related codes) when
``err`` is not ``CUDA_SUCCESS``, and otherwise returns the values: nothing, one value, or a tuple.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuda.bindings import driver, nvrtc

from . import _capturing

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NVRTC_SUCCESS = nvrtc.nvrtcResult.NVRTC_SUCCESS


class RawgraphError(Exception):
    """Base class of every error rawgraph raises on purpose."""


class NoDeviceError(RawgraphError):
    """No CUDA driver or no GPU was found on this machine."""


class CaptureRefusedError(RawgraphError, ValueError):
    """A capture was refused before calling the driver (legacy stream, already capturing, ...)."""


class ClosedError(RawgraphError, ValueError):
    """A resource was used after ``close()``."""


class ArrayError(RawgraphError, ValueError):
    """An array argument does not fit what the kernel, plan or graph was built for."""


class ShapeError(ArrayError):
    """Wrong shape, or a buffer too small for the shape asked for."""


class DTypeError(ArrayError, TypeError):
    """Wrong element type (rawgraph's kernels are float32)."""


class LayoutError(ArrayError):
    """Non-contiguous, strided or misaligned memory."""


class NotOnDeviceError(ArrayError, TypeError):
    """A host array, or memory on another device, where device memory is needed."""


class ForeignNodeError(RawgraphError, ValueError):
    """A bind would move a buffer that a node rawgraph did not record (a foreign node) holds an
    address in: that node would keep reading or writing the old buffer."""


class DeviceUpdatableError(RawgraphError, ValueError):
    """An operation the driver forbids on a graph or exec holding device-updatable kernel nodes
    (a second instantiate, ``cuGraphExecUpdate``, host parameter pushes), refused before any
    driver call.

    See Also
    --------
    cuGraphExecUpdate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """


class SignatureError(RawgraphError, ValueError):
    """A kernel's ``__global__`` declaration could not be read (not found, overloaded, or a
    parameter type that is not known); give the argument types by hand instead."""


class ArgumentError(RawgraphError, TypeError, ValueError):
    """A kernel argument does not fit its C parameter: a float for an ``int``, a value out of the
    type's range, a host array for a pointer, a struct of the wrong size. Raised before any
    driver call."""


class RawgraphWarning(UserWarning):
    """Base class of rawgraph's warnings."""


class ReleaseWarning(RawgraphWarning, RuntimeWarning):
    """A driver call that releases a resource (``cuMemFree``, ``cuGraphDestroy``, ...) failed.

    The resource counts as released either way (it is never released twice); the warning names
    the call and the driver's error. Silent only at interpreter exit, where the driver may already
    be gone.

    See Also
    --------
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuGraphDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """


class EmptyCaptureWarning(RawgraphWarning):
    """A capture recorded no work: the graph has no nodes (legal, but rarely what was meant)."""


# Hints for the codes people meet while capturing graphs and launching from Python.
_HINTS: dict[str, str] = {
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": (
        "this call is not allowed while a stream is capturing (synchronize, blocking allocation, "
        "legacy-stream work); do it before the capture or after it ends"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": (
        "an earlier error invalidated this capture; the first failing call is the cause"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT": (
        "the legacy (NULL) stream was touched while another stream captures in global or "
        "thread-local mode; use explicit non-blocking streams"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD": ("capture must end on the thread that began it (or use relaxed mode)"),
    "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED": "end capture on the stream that began it",
    "CUDA_ERROR_STREAM_CAPTURE_UNJOINED": (
        "a forked stream was not joined back into the capturing stream before capture ended"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_ISOLATION": (
        "work from outside the capture was merged into it (event wait on an uncaptured event)"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_MERGE": "two independent captures were merged",
    "CUDA_ERROR_CAPTURED_EVENT": "this event operation is not allowed on an event recorded in a capture",
    "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE": (
        "the new graph does not match the exec (topology, node type or function changed); re-instantiate instead"
    ),
    "CUDA_ERROR_MISALIGNED_ADDRESS": (
        "a kernel argument was read from freed host memory, or a device pointer is misaligned; "
        "keep packed argument buffers alive for every launch and capture that reads them"
    ),
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "compile for this device's exact compute capability (CUBIN)",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": (
        "the driver is older than the NVRTC that made this PTX; compile to CUBIN instead"
    ),
    "CUDA_ERROR_NOT_INITIALIZED": "call rawgraph.get_device() first (it runs cuInit)",
    "CUDA_ERROR_INVALID_CONTEXT": "no current context on this thread: call Device.activate()",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel read or wrote outside its buffers; the context is now unusable",
}

CAPTURE_CODES = frozenset(name for name in _HINTS if "CAPTURE" in name or name == "CUDA_ERROR_CAPTURED_EVENT")


class CudaError(RawgraphError):
    """A CUDA driver call failed.

    Attributes
    ----------
    code : int
        The ``CUresult`` value.
    name : str
        The driver's error name, e.g. ``CUDA_ERROR_INVALID_VALUE``.
    message : str
        The driver's own error string (``cuGetErrorString``).
    call : str
        The driver function that returned the error.
    hint : str or None
        What usually causes this code, for capture and launch errors.

    See Also
    --------
    cuGetErrorString : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__ERROR.html
    """

    def __init__(self, code: int, name: str, message: str, call: str = "", hint: str | None = None):
        self.code = code
        self.name = name
        self.message = message
        self.call = call
        self.hint = hint
        text = f"{call + ': ' if call else ''}{name} ({message})"
        if hint:
            text += f" -- hint: {hint}"
        super().__init__(text)


class CaptureError(CudaError):
    """A driver call failed because of (or during) stream capture."""


class NvrtcError(RawgraphError):
    """NVRTC failed; ``log`` holds the whole compile log."""

    def __init__(self, name: str, message: str, log: str = "", source_name: str = ""):
        self.name = name
        self.log = log
        self.source_name = source_name
        text = f"NVRTC {name} compiling {source_name or '<source>'}: {message}"
        if log:
            text += "\n" + log
        super().__init__(text)


class GraphUpdateError(RawgraphError):
    """``cuGraphExecUpdate`` refused the new graph; the exec keeps its old parameters.

    Attributes
    ----------
    result : str
        The ``CUgraphExecUpdateResult`` name, e.g. ``CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED``.
    error_node, error_from_node : int
        Handles (as integers, 0 when the driver names none) of the node that failed and of the
        node in the original graph it was paired with.

    See Also
    --------
    cuGraphExecUpdate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    def __init__(self, result: str, error_node: int, error_from_node: int, detail: str = ""):
        self.result = result
        self.error_node = error_node
        self.error_from_node = error_from_node
        text = f"cuGraphExecUpdate: {result} (error node 0x{error_node:x}, from node 0x{error_from_node:x})"
        if detail:
            text += f": {detail}"
        text += "; the exec is unchanged -- re-instantiate the new graph to fall back"
        super().__init__(text)


def error_name(code: Any) -> str:
    """Name of a ``CUresult`` (works without a driver: the enum carries it)."""
    try:
        name: str = driver.CUresult(int(code)).name
        return name
    except Exception:  # an unknown code from a newer driver
        return f"CUDA_ERROR_{int(code)}"


def cuda_error(code: Any, call: str = "") -> CudaError:
    """Build the typed exception for a failing ``CUresult``."""
    name = error_name(code)
    try:
        err, text = driver.cuGetErrorString(code)
        message = text.decode() if err == _SUCCESS and text else "no description"
    except Exception:  # no driver library loaded
        message = "no description (driver not loaded)"
    cls = CaptureError if name in CAPTURE_CODES else CudaError
    exc = cls(int(code), name, message, call, _HINTS.get(name))
    # A capture open on this thread learns of the error even if the body catches it.
    _capturing.note_error(exc)
    return exc


def _values(result: tuple[Any, ...]) -> Any:
    """The values after the status: None, the single value, or a tuple of them."""
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def check(result: tuple[Any, ...], call: str = "") -> Any:
    """Return the values of a ``cuda.bindings`` driver result, or raise :class:`CudaError`."""
    if result[0] != _SUCCESS:
        raise cuda_error(result[0], call)
    return _values(result)


def call(fn: Callable[..., tuple[Any, ...]], *args: Any) -> Any:
    """Call a ``cuda.bindings.driver`` function and :func:`check` its result (names the call)."""
    return check(fn(*args), fn.__name__)


def nvrtc_check(result: tuple[Any, ...], call_name: str = "", source_name: str = "") -> Any:
    """Like :func:`check` for ``cuda.bindings.nvrtc`` results; raises :class:`NvrtcError`."""
    err = result[0]
    if err != _NVRTC_SUCCESS:
        try:
            _, msg = nvrtc.nvrtcGetErrorString(err)
            message = msg.decode()
        except Exception:
            message = ""
        raise NvrtcError(nvrtc.nvrtcResult(int(err)).name, f"{call_name}: {message}", "", source_name)
    return _values(result)
