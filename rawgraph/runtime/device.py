"""Driver initialisation and device selection on the primary context.

rawgraph works in each device's *primary* context (``cuDevicePrimaryCtxRetain``), the one the CUDA
runtime, CuPy and PyTorch use too, so device pointers pass between them unchanged.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver

from . import _capturing
from .errors import CaptureRefusedError, NoDeviceError, call, cuda_error
from .resource import release

_here = threading.local()  # per thread: the context rawgraph last made current there

_lock = threading.RLock()  # re-entrant: get_device() holds it while Device() runs driver_status()
_init_state: tuple[bool, str] | None = None
_devices: dict[int, Device] = {}


def driver_status() -> tuple[bool, str]:
    """Run ``cuInit`` once; return ``(ok, reason)``. Never raises.

    Without a driver library ``cuda.bindings`` raises (rather than returning an error code); both
    cases come back as ``(False, reason)``.

    See Also
    --------
    cuInit : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__INITIALIZE.html
    """
    global _init_state
    with _lock:
        if _init_state is None:
            try:
                (err,) = driver.cuInit(0)
                if err != driver.CUresult.CUDA_SUCCESS:
                    _init_state = (False, f"cuInit failed: {driver.CUresult(int(err)).name}")
                else:
                    err, count = driver.cuDeviceGetCount()
                    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
                        _init_state = (False, "the CUDA driver loaded but found no GPU")
                    else:
                        _init_state = (True, f"{count} GPU(s)")
            except Exception as exc:  # DynamicLibNotFoundError and friends: no libcuda.so
                _init_state = (False, f"no CUDA driver found ({type(exc).__name__}: {exc})")
        return _init_state


def gpu_available() -> bool:
    """True when the CUDA driver loads and sees at least one GPU."""
    return driver_status()[0]


def driver_version() -> str | None:
    """The driver's CUDA version as ``"13.0"`` (``cuDriverGetVersion``), or None without one.

    See Also
    --------
    cuDriverGetVersion : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VERSION.html
    """
    if not gpu_available():
        return None
    v = driver_cuda_version()
    return f"{v // 1000}.{(v % 1000) // 10}"


def driver_cuda_version() -> int:
    """The driver's CUDA version as an integer, e.g. 13000 (``cuDriverGetVersion``). A binding newer
    than the driver names calls the driver does not export: code asks this before calling one.

    See Also
    --------
    cuDriverGetVersion : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VERSION.html
    """
    return int(call(driver.cuDriverGetVersion))


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    multiprocessors: int
    total_memory: int
    l2_bytes: int
    smem_per_sm: int = 0  # shared memory of one SM, bytes
    smem_per_block_optin: int = 0  # most one CTA may ask for (cuFuncSetAttribute opt-in)
    smem_reserved_per_block: int = 0  # what the driver keeps per resident CTA

    @property
    def arch(self) -> str:
        """NVRTC's real architecture name for this device, e.g. ``sm_90``."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


class Device:
    """One GPU and its retained primary context.

    Use :func:`get_device` rather than building one: there is one ``Device`` per ordinal.
    """

    ordinal: int
    handle: Any  # driver.CUdevice
    context: Any  # driver.CUcontext: the retained primary context
    info: DeviceInfo
    _finalizer: weakref.finalize[..., Any]

    def __init__(self, ordinal: int = 0):
        ok, reason = driver_status()
        if not ok:
            raise NoDeviceError(reason)
        count = call(driver.cuDeviceGetCount)
        if not 0 <= ordinal < count:
            raise NoDeviceError(f"device {ordinal} requested, {count} present")
        self.ordinal = ordinal
        self.handle = call(driver.cuDeviceGet, ordinal)
        # cuDevicePrimaryCtxRetain: the same context CuPy and PyTorch use on this device.
        self.context = call(driver.cuDevicePrimaryCtxRetain, self.handle)
        # Released at interpreter exit (or never: there is one Device per ordinal per process).
        self._finalizer = weakref.finalize(
            self, release, "cuDevicePrimaryCtxRelease", driver.cuDevicePrimaryCtxRelease, self.handle
        )
        self.activate()
        attr = driver.CUdevice_attribute

        def get(a: Any) -> int:
            value: int = call(driver.cuDeviceGetAttribute, a, self.handle)
            return value

        name = call(driver.cuDeviceGetName, 256, self.handle)
        self.info = DeviceInfo(
            ordinal=ordinal,
            name=name.split(b"\0", 1)[0].decode(),
            compute_capability=(
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            multiprocessors=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            total_memory=call(driver.cuDeviceTotalMem, self.handle),
            l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            smem_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
            smem_per_block_optin=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            smem_reserved_per_block=get(attr.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK),
        )

    @property
    def arch(self) -> str:
        return self.info.arch

    def activate(self) -> Device:
        """Make the primary context current on the calling thread (``cuCtxSetCurrent``).

        See Also
        --------
        cuCtxSetCurrent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
        """
        # Always set it: another library on this thread may have made a different context current.
        call(driver.cuCtxSetCurrent, self.context)
        _here.context = self.context
        return self

    def ensure_current(self) -> None:
        """Make the context current on this thread unless rawgraph already did (one thread-local
        read on the hot path; ``cuCtxSetCurrent`` the first time on each thread).

        Needed before every exec update: on a thread with no current context (a new worker
        thread), ``cuGraphExecKernelNodeSetParams`` crashes the process (driver 580:
        ``benchmarks/probes/thread_no_context.py``), where launches, copies and event records
        work and allocations return ``CUDA_ERROR_INVALID_CONTEXT``. A context another library
        makes current on the thread afterwards is not seen; the exec names its own context, so
        the update still goes to the right one.

        See Also
        --------
        cuCtxSetCurrent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if getattr(_here, "context", None) is not self.context:
            self.activate()

    def synchronize(self) -> None:
        """Wait for all work on the device (``cuCtxSynchronize``): the context-wide fence.

        Refused while any rawgraph capture is open in the process: in any thread, a context
        synchronize fails inside a capture and invalidates it, whatever the capture mode. Wait on
        the stream that did the work instead (:meth:`rawgraph.Stream.synchronize`).

        Raises
        ------
        CaptureRefusedError
            While a capture is open (nothing reaches the driver).

        See Also
        --------
        cuCtxSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
        """
        context_fence_allowed("Device.synchronize (cuCtxSynchronize)")
        self.activate()
        call(driver.cuCtxSynchronize)

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes (``cuMemGetInfo``).

        See Also
        --------
        cuMemGetInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        self.activate()
        free_total: tuple[int, int] = call(driver.cuMemGetInfo)
        return free_total

    def __repr__(self) -> str:
        i = self.info
        return f"<Device {i.ordinal}: {i.name} {i.arch}, {i.multiprocessors} SMs>"


def get_device(ordinal: int = 0) -> Device:
    """The :class:`Device` for ``ordinal``, made current on the calling thread.

    Raises
    ------
    NoDeviceError
        When no driver or no such GPU exists.
    """
    dev = _devices.get(ordinal)
    if dev is None:
        with _lock:
            dev = _devices.get(ordinal)
            if dev is None:
                dev = _devices[ordinal] = Device.__new__(Device)
                try:
                    Device.__init__(dev, ordinal)
                except BaseException:
                    del _devices[ordinal]
                    raise
    return dev.activate()


def context_fence_allowed(what: str) -> None:
    """Refuse a context-wide synchronize while any rawgraph capture is open (see
    :meth:`Device.synchronize`); ``what`` names the operation in the message."""
    open_now = _capturing.active()
    if open_now:
        where = "; ".join(r.describe() for r in open_now)
        raise CaptureRefusedError(
            f"{what} is a context-wide fence, refused while a capture is open ({where}): it would "
            "fail and invalidate that capture; pass a stream to wait on that stream instead"
        )


# Probes: CUDA_ERROR_INVALID_VALUE is the driver's answer "not a CUDA pointer" (documented for
# cuPointerGetAttribute), so the raw result is read and that code builds no error (one built here
# would be noted on an open capture as if the body had swallowed it). Any other failure (no
# context, a driver out of memory) is an error, raised naming the call, not taken for host memory.
def _pointer_attribute(attr: Any, ptr: int) -> Any:
    err, value = driver.cuPointerGetAttribute(attr, ptr)
    if err == driver.CUresult.CUDA_SUCCESS:
        return value
    if err == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
        return None
    raise cuda_error(err, "cuPointerGetAttribute")


def pointer_device(ptr: int) -> int | None:
    """Ordinal of the device that owns ``ptr`` (``cuPointerGetAttribute``); None for host memory.

    Raises
    ------
    CudaError
        The driver failed otherwise than by not knowing the pointer.

    See Also
    --------
    cuPointerGetAttribute : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html
    """
    value = _pointer_attribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    return None if value is None else int(value)


def pointer_is_device_memory(ptr: int) -> bool:
    """True for device (or managed) memory, False for host or unknown memory (raises
    :class:`~rawgraph.runtime.errors.CudaError` as :func:`pointer_device` does)."""
    kind = _pointer_attribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    if kind is None:
        return False
    return int(kind) in (int(driver.CUmemorytype.CU_MEMORYTYPE_DEVICE), int(driver.CUmemorytype.CU_MEMORYTYPE_UNIFIED))
