"""Device memory: :class:`DeviceBuffer` (owned, ``cuMemAlloc``) and :class:`DeviceArray` (a checked
view of anyone's device memory, from ``__cuda_array_interface__``).

Everything that takes an array in rawgraph goes through :func:`as_device_array`, so CuPy arrays,
PyTorch CUDA tensors and rawgraph's own buffers are accepted the same way, without a copy, and a
NumPy array gets a clear :class:`~rawgraph.runtime.errors.NotOnDeviceError` instead of a crash on the GPU.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cuda.bindings import driver

from .device import Device, context_fence_allowed, get_device, pointer_device
from .dlpack import contiguous_c, dlpack_device, is_cuda_device, view_dlpack
from .errors import CaptureRefusedError, ClosedError, DTypeError, LayoutError, NotOnDeviceError, ShapeError, call
from .resource import Resource
from .stream import stream_handle

_CAPTURE_NONE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE

# A quiet-NaN bit pattern: "poison" written over outputs so an unwritten element fails a check.
POISON_BITS = 0x7FC0DEAD


@dataclass(frozen=True)
class DeviceArray:
    """A contiguous, typed view of device memory that rawgraph has checked.

    Attributes
    ----------
    ptr : int
        Device address of element 0.
    shape : tuple of int
        An int is taken as a 1-D shape.
    dtype : numpy.dtype
        Anything ``numpy.dtype()`` takes (``np.float32``, ``"f4"``), stored as a dtype; never
        big-endian (:class:`DTypeError`): device code reads native, little-endian elements.
    owner : object
        The object that owns the memory; holding the view keeps it alive.
    readonly : bool
        The producer exported the memory read-only (``__cuda_array_interface__``'s
        ``data[1]``, DLPack's read-only flag): a kernel may only read it. Not part of equality:
        a read-only view is the same memory as a writable one.
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: Any = None
    readonly: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        shape = (self.shape,) if isinstance(self.shape, (int, np.integer)) else self.shape
        object.__setattr__(self, "shape", tuple(int(s) for s in shape))
        object.__setattr__(self, "dtype", native_dtype(self.dtype, "DeviceArray"))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def to_numpy(self, stream: Any = None) -> np.ndarray:
        """Copy the viewed elements to a new host array once the work before is done.

        The same copy as :meth:`DeviceBuffer.to_numpy`: with ``stream``, ``cuMemcpyDtoHAsync``
        queued on it then ``cuStreamSynchronize``; without, ``cuCtxSynchronize`` +
        ``cuMemcpyDtoH``, refused while a capture is open. A view whose owner is closed raises
        :class:`ClosedError` before any driver call.

        See Also
        --------
        cuMemcpyDtoHAsync, cuMemcpyDtoH : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        cuCtxSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
        """
        if isinstance(self.owner, Resource):
            self.owner._check_open()
        device = getattr(self.owner, "device", None)
        return _to_host(
            self.ptr,
            self.shape,
            self.dtype,
            device if isinstance(device, Device) else get_device(),
            stream,
            "DeviceArray.to_numpy",
        )


def native_dtype(dtype: Any, what: str) -> np.dtype:
    """``dtype`` as a :class:`numpy.dtype`, refused when its byte order is not the machine's
    (``>f4``): a kernel would read every element byte-swapped."""
    native: np.dtype[Any] = np.dtype(dtype)
    if not native.isnative:
        raise DTypeError(f"{what} is big-endian ({native.str}); pass native (little-endian) elements")
    return native


def _to_host(ptr: int, shape: tuple[int, ...], dtype: np.dtype, device: Device, stream: Any, what: str) -> np.ndarray:
    """Device -> new host array: stream-ordered with a stream, a context-wide fence without one
    (see the notes above :meth:`DeviceBuffer.copy_from_host`)."""
    out = np.empty(shape, dtype)
    if stream is not None:
        h = _copy_stream(stream, device, what)
        call(driver.cuMemcpyDtoHAsync, out.ctypes.data, ptr, out.nbytes, h)
        call(driver.cuStreamSynchronize, h)
        return out
    _copy_fence(device, what)
    call(driver.cuMemcpyDtoH, out.ctypes.data, ptr, out.nbytes)
    return out


def _copy_stream(stream: Any, device: Device, what: str) -> Any:
    """The handle of the stream a copy is queued on; refused when it is capturing (the copy would
    be recorded into the graph, not run now)."""
    handle = stream_handle(stream)
    if call(driver.cuStreamIsCapturing, handle) != _CAPTURE_NONE:
        raise CaptureRefusedError(f"{what} on a capturing stream would be recorded into the graph, not run now")
    device.activate()
    return handle


def _copy_fence(device: Device, what: str) -> None:
    """The context-wide fence of a copy without a stream (refused while a capture is open)."""
    context_fence_allowed(f"{what} without a stream (cuCtxSynchronize)")
    device.activate()
    call(driver.cuCtxSynchronize)


class DeviceBuffer(Resource):
    """An owned, C-contiguous device allocation with a shape and dtype.

    Wraps ``cuMemAlloc`` / ``cuMemFree``. ``close()`` may be called any number of times; the memory
    is also freed when the object is collected (``weakref.finalize``). Owns: ``cuMemAlloc`` /
    ``cuMemFree``.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : numpy dtype, default float32
    device : Device, optional
        Defaults to device 0.

    See Also
    --------
    cuMemAlloc, cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    device: Device
    nbytes: int

    def __init__(self, shape: int | Sequence[int], dtype: Any = np.float32, device: Device | None = None):
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ShapeError(f"negative dimension in shape {shape}")
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.device = (device or get_device()).activate()
        self.nbytes = math.prod(shape) * self.dtype.itemsize
        # cuMemAlloc rejects 0 bytes; keep one element so every buffer has a real address.
        self._ptr = int(call(driver.cuMemAlloc, max(self.nbytes, self.dtype.itemsize)))
        self._own(driver.cuMemFree, self._ptr)

    # -- construction helpers -------------------------------------------------------------
    @classmethod
    def from_numpy(cls, array: np.ndarray, device: Device | None = None, stream: Any = None) -> DeviceBuffer:
        """Allocate and copy a host array in (see :meth:`copy_from_host` for ``stream``)."""
        array = np.ascontiguousarray(array)
        buf = cls(array.shape, array.dtype, device)
        buf.copy_from_host(array, stream)
        return buf

    # -- state ----------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Device address; raises :class:`ClosedError` after ``close()``."""
        if not self._finalizer.alive:
            raise ClosedError("DeviceBuffer is closed")
        return self._ptr

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def view(self) -> DeviceArray:
        return DeviceArray(self.ptr, self.shape, self.dtype, self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }

    # -- copies ---------------------------------------------------------------------------
    # Each copy has two forms. With a stream it is stream-ordered: queued on that stream after
    # the work already there, then waited for on that stream only (``cuStreamSynchronize``), so
    # it is safe while other threads capture. Without one it is a context-wide fence
    # (``cuCtxSynchronize`` on both sides, since rawgraph's streams don't order with the legacy
    # stream), refused while any rawgraph capture is open: a context synchronize would fail
    # inside that capture and invalidate it.

    def copy_from_host(self, array: np.ndarray, stream: Any = None) -> None:
        """Copy a host array of the same shape and dtype in; returns once the copy is done.

        With ``stream``: ``cuMemcpyHtoDAsync`` on it after its queued work, then
        ``cuStreamSynchronize``. Without: ``cuCtxSynchronize`` + ``cuMemcpyHtoD`` (refused while
        a capture is open; see the class notes).

        See Also
        --------
        cuMemcpyHtoDAsync, cuMemcpyHtoD : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        cuCtxSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
        """
        self._check_open()
        host = _check_host(array, self.shape, self.dtype)
        if stream is not None:
            h = _copy_stream(stream, self.device, "DeviceBuffer.copy_from_host")
            call(driver.cuMemcpyHtoDAsync, self.ptr, host.ctypes.data, self.nbytes, h)
            call(driver.cuStreamSynchronize, h)
            return
        _copy_fence(self.device, "DeviceBuffer.copy_from_host")
        call(driver.cuMemcpyHtoD, self.ptr, host.ctypes.data, self.nbytes)

    def to_numpy(self, stream: Any = None) -> np.ndarray:
        """Copy to a new host array once the work before is done.

        With ``stream``: ``cuMemcpyDtoHAsync`` queued on it, then ``cuStreamSynchronize``
        (waits for that stream's work only). Without: ``cuCtxSynchronize`` + ``cuMemcpyDtoH``,
        refused while a capture is open.

        See Also
        --------
        cuMemcpyDtoHAsync, cuMemcpyDtoH : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        cuCtxSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
        """
        self._check_open()
        return _to_host(self.ptr, self.shape, self.dtype, self.device, stream, "DeviceBuffer.to_numpy")

    def poison(self, stream: Any = None) -> None:
        """Fill with a NaN bit pattern (``cuMemsetD32Async`` queued on ``stream``, not waited for;
        without a stream a fenced ``cuMemsetD32``, refused while a capture is open).

        See Also
        --------
        cuMemsetD32Async, cuMemsetD32 : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        self._check_open()
        if self.dtype.itemsize != 4:
            raise DTypeError("poison() fills 32-bit elements")
        if stream is not None:
            call(driver.cuMemsetD32Async, self.ptr, POISON_BITS, self.size, stream_handle(stream))
            return
        _copy_fence(self.device, "DeviceBuffer.poison")
        call(driver.cuMemsetD32, self.ptr, POISON_BITS, self.size)
        call(driver.cuCtxSynchronize)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._ptr:x}"
        return f"<DeviceBuffer {self.shape} {self.dtype} {state}>"


class HostBuffer(Resource):
    """Pinned (page-locked) host memory the GPU reads directly (``cuMemHostAlloc`` /
    ``cuMemFreeHost``), with a NumPy view of it.

    A memcpy node captured from pinned memory reads these bytes when each replay reaches it, so
    writing :attr:`array` between replays feeds the next replay without any driver call. The host
    must not rewrite bytes a queued replay has yet to read (see ``rawgraph.serving.slots``).

    Parameters
    ----------
    shape : int or sequence of int
    dtype : numpy dtype, default int32
    device : Device, optional

    See Also
    --------
    cuMemHostAlloc, cuMemFreeHost : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    device: Device
    nbytes: int

    def __init__(self, shape: int | Sequence[int], dtype: Any = np.int32, device: Device | None = None):
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(v) for v in shape)
        if any(v < 0 for v in shape):
            raise ShapeError(f"negative dimension in shape {shape}")
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.device = (device or get_device()).activate()
        self.nbytes = math.prod(shape) * self.dtype.itemsize
        self._ptr = int(call(driver.cuMemHostAlloc, max(self.nbytes, self.dtype.itemsize), 0))
        self._own(driver.cuMemFreeHost, self._ptr)
        raw = (ctypes.c_char * max(self.nbytes, 1)).from_address(self._ptr)
        # (a ctypes array is a buffer; NumPy's stubs name only some buffer types)
        self._array: np.ndarray = np.frombuffer(
            raw,
            dtype=self.dtype,  # type: ignore[call-overload]
            count=math.prod(shape),
        ).reshape(shape)

    @property
    def ptr(self) -> int:
        """Host address; raises :class:`ClosedError` after ``close()``."""
        if not self._finalizer.alive:
            raise ClosedError("HostBuffer is closed")
        return self._ptr

    @property
    def array(self) -> np.ndarray:
        """The NumPy view of the pinned bytes (invalid after ``close()``)."""
        self._check_open()
        return self._array


def _check_host(array: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise NotOnDeviceError(f"expected a NumPy array on the host, got {type(array).__name__}")
    if array.dtype != dtype:
        raise DTypeError(f"dtype {array.dtype} does not match {dtype}")
    if array.shape != shape:
        raise ShapeError(f"shape {array.shape} does not match {shape}")
    return np.ascontiguousarray(array)


def as_device_array(obj: Any, what: str = "array") -> DeviceArray:
    """Check ``obj`` is contiguous device memory and return a :class:`DeviceArray` view of it.

    Accepts a :class:`DeviceBuffer`, a :class:`DeviceArray`, anything exposing
    ``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors, Numba arrays), or a DLPack
    producer (``__dlpack__`` / ``__dlpack_device__``: JAX, CuPy, torch) or capsule. No copy.

    rawgraph's streams do not wait for the producer's: make sure the producer's work on the array
    is done (or ordered before rawgraph's stream) first, as for ``__cuda_array_interface__``.

    Raises
    ------
    NotOnDeviceError
        For host arrays (NumPy, lists) and objects with no device-array interface.
    LayoutError
        For strided (non C-contiguous) views.
    DTypeError
        For big-endian elements.
    ClosedError
        For a closed :class:`DeviceBuffer`.

    The view's ``readonly`` is the producer's read-only flag (``__cuda_array_interface__``'s
    ``data[1]``, DLPack's ``DLPACK_FLAG_BITMASK_READ_ONLY``); callers that write decide on it.
    """
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, DeviceBuffer):
        return obj.view()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        if isinstance(obj, np.ndarray) or hasattr(obj, "__array_interface__"):
            raise NotOnDeviceError(
                f"{what} is a host array ({type(obj).__name__}); pass device memory "
                "(rawgraph.DeviceBuffer, a CuPy array or a CUDA torch tensor)"
            )
        if hasattr(obj, "__dlpack__") or type(obj).__name__ == "PyCapsule":
            return _from_dlpack(obj, what)
        raise NotOnDeviceError(
            f"{what} of type {type(obj).__name__} exposes neither __cuda_array_interface__ nor __dlpack__"
        )
    shape = tuple(int(s) for s in cai["shape"])
    dtype = native_dtype(cai["typestr"], what)
    ptr, readonly = int(cai["data"][0]), bool(cai["data"][1])
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for s in reversed(shape):
            expected.append(step)
            step *= s
        # Dimensions of extent 1 carry arbitrary strides without changing the layout.
        if any(st != ex and dim > 1 for st, ex, dim in zip(strides, reversed(expected), shape)):
            raise LayoutError(f"{what} is strided (strides {tuple(strides)}, shape {shape}); pass a contiguous array")
    return DeviceArray(ptr, shape, dtype, obj, readonly)


def _from_dlpack(obj: Any, what: str) -> DeviceArray:
    """A DLPack producer's tensor as a :class:`DeviceArray`, no copy (see :mod:`rawgraph.runtime.dlpack`).

    The producer's device is asked first (``__dlpack_device__``), so a host tensor is refused
    before anything is exported. ``owner`` is ``(obj, capsule)``: the capsule keeps exported
    memory alive even where the producer handed out a copy.
    """
    dev = dlpack_device(obj)
    if dev is not None and not is_cuda_device(dev[0]):
        raise NotOnDeviceError(
            f"{what} is a DLPack tensor on device type {dev[0]} (not CUDA device memory); pass device memory"
        )
    view = view_dlpack(obj, what)
    if not is_cuda_device(view.device_type):
        raise NotOnDeviceError(f"{what} is a DLPack tensor on device type {view.device_type} (not CUDA device memory)")
    if not contiguous_c(view.shape, view.strides):
        raise LayoutError(
            f"{what} is strided (DLPack strides {view.strides}, shape {view.shape}); pass a contiguous array"
        )
    return DeviceArray(view.ptr, view.shape, view.dtype, (obj, view.keepalive), view.readonly)


def check_array(
    arr: DeviceArray,
    shape: tuple[int, ...],
    dtype: Any = np.float32,
    what: str = "array",
    device: Device | None = None,
    align: int = 4,
) -> DeviceArray:
    """Check a view against the shape, dtype, alignment and device a kernel was planned for."""
    dtype = np.dtype(dtype)
    if arr.dtype != dtype:
        raise DTypeError(f"{what} has dtype {arr.dtype}, expected {dtype}")
    if arr.shape != shape:
        if arr.size < math.prod(shape):
            raise ShapeError(f"{what} has shape {arr.shape} ({arr.size} elements), too small for {shape}")
        raise ShapeError(f"{what} has shape {arr.shape}, expected {shape}")
    if arr.ptr % align:
        raise LayoutError(f"{what} address 0x{arr.ptr:x} is not {align}-byte aligned")
    if device is not None and arr.size:
        owner = pointer_device(arr.ptr)
        if owner is None:
            raise NotOnDeviceError(f"{what} at 0x{arr.ptr:x} is not device memory known to the driver")
        if owner != device.ordinal:
            raise NotOnDeviceError(f"{what} lives on device {owner}, the plan runs on device {device.ordinal}")
    return arr
