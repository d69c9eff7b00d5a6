"""Device memory: :class:`DeviceBuffer` (owned, ``cuMemAlloc``) and :class:`DeviceArray` (a checked
view of anyone's device memory, from ``__cuda_array_interface__``).

Everything that takes an array in rawgraph goes through :func:`as_device_array`, so CuPy arrays,
PyTorch CUDA tensors and rawgraph's own buffers are accepted the same way, without a copy, and a
NumPy array gets a clear :class:`~rawgraph.errors.NotOnDeviceError` instead of a crash on the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from cuda.bindings import driver

from .device import Device, get_device, pointer_device
from .resource import Resource
from .errors import ClosedError, DTypeError, LayoutError, NotOnDeviceError, ShapeError, call

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
    dtype : numpy.dtype
    owner : object
        The object that owns the memory; holding the view keeps it alive.
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: Any = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


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
    """

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
    def from_numpy(cls, array: np.ndarray, device: Device | None = None) -> "DeviceBuffer":
        """Allocate and copy a host array in (``cuMemcpyHtoD``)."""
        array = np.ascontiguousarray(array)
        buf = cls(array.shape, array.dtype, device)
        buf.copy_from_host(array)
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
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }

    # -- copies ---------------------------------------------------------------------------
    def copy_from_host(self, array: np.ndarray) -> None:
        """Copy a host array of the same shape and dtype in, synchronously (``cuMemcpyHtoD``).

        The context is synchronised first: rawgraph streams are non-blocking, so a plain
        ``cuMemcpyHtoD`` would not wait for kernels still using this buffer.
        """
        host = _check_host(array, self.shape, self.dtype)
        self.device.activate()
        call(driver.cuCtxSynchronize)
        call(driver.cuMemcpyHtoD, self.ptr, host.ctypes.data, self.nbytes)

    def to_numpy(self) -> np.ndarray:
        """Wait for the device, then copy to a new host array (``cuMemcpyDtoH``)."""
        out = np.empty(self.shape, self.dtype)
        self.device.activate()
        call(driver.cuCtxSynchronize)
        call(driver.cuMemcpyDtoH, out.ctypes.data, self.ptr, self.nbytes)
        return out

    def poison(self, stream: Any = None) -> None:
        """Fill with a NaN bit pattern (``cuMemsetD32Async`` on ``stream``, else synchronously)."""
        if self.dtype.itemsize != 4:
            raise DTypeError("poison() fills 32-bit elements")
        if stream is not None:
            call(driver.cuMemsetD32Async, self.ptr, POISON_BITS, self.size, stream.handle)
            return
        # No stream: fence on both sides, since rawgraph's streams don't order with the legacy one.
        self.device.activate()
        call(driver.cuCtxSynchronize)
        call(driver.cuMemsetD32, self.ptr, POISON_BITS, self.size)
        call(driver.cuCtxSynchronize)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._ptr:x}"
        return f"<DeviceBuffer {self.shape} {self.dtype} {state}>"


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

    Accepts a :class:`DeviceBuffer`, a :class:`DeviceArray`, or anything exposing
    ``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors, Numba arrays). No copy.

    Raises
    ------
    NotOnDeviceError
        For host arrays (NumPy, lists) and objects with no device-array interface.
    LayoutError
        For strided (non C-contiguous) views.
    ClosedError
        For a closed :class:`DeviceBuffer`.
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
        raise NotOnDeviceError(f"{what} of type {type(obj).__name__} exposes no __cuda_array_interface__")
    shape = tuple(int(s) for s in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    ptr = int(cai["data"][0])
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for s in reversed(shape):
            expected.append(step)
            step *= s
        # Dimensions of extent 1 carry arbitrary strides without changing the layout.
        if any(st != ex and dim > 1 for st, ex, dim in zip(strides, reversed(expected), shape)):
            raise LayoutError(f"{what} is strided (strides {tuple(strides)}, shape {shape}); pass a contiguous array")
    return DeviceArray(ptr, shape, dtype, obj)


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
