"""A small DLPack consumer: read any ``__dlpack__`` producer's tensor without a copy.

DLPack is the array-exchange protocol that torch, CuPy, JAX and NumPy all speak. A producer's
``__dlpack__()`` returns a ``PyCapsule`` wrapping a ``DLManagedTensor`` (legacy, capsule name
``"dltensor"``) or a ``DLManagedTensorVersioned`` (DLPack >= 1.0, name ``"dltensor_versioned"``).
This module reads that struct with :mod:`ctypes` and returns a :class:`DLPackView`: the address,
shape, strides, dtype and device of the data, plus the capsule itself as ``keepalive``.

It deliberately judges nothing about *where* the memory is (host, device, which GPU): that is
:mod:`rawgraph.runtime.memory`'s job, which sits above this module. It only reports ``device_type`` and
offers :func:`is_cuda_device` and :func:`contiguous_c` to make that judgement easy.

Ownership
---------
A DLPack consumer normally *consumes* the capsule: it renames it to ``"used_dltensor"`` and
becomes responsible for calling the producer's ``deleter`` when it is done. We do not: the
capsule keeps its name, so its own destructor (installed by the producer) calls the deleter
when the capsule is collected. Holding the capsule in :attr:`DLPackView.keepalive` therefore
keeps the memory valid for exactly as long as the view (and whatever holds the view) lives, and
no code here ever has to call a C function pointer. The one cost: a capsule passed in directly
must not also be handed to another consumer, which would rename it and free the memory when
*it* is done.

Only the standard library, NumPy and :mod:`rawgraph.runtime.errors` are imported, so
:mod:`rawgraph.runtime.memory` can build on this module without an import cycle.
"""

from __future__ import annotations

import ctypes
import datetime
import math
import types
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from .errors import ArrayError, DTypeError, NotOnDeviceError

__all__ = ["DLDeviceType", "DLPackView", "contiguous_c", "dlpack_device", "is_cuda_device", "view_dlpack"]


class DLDeviceType(IntEnum):
    """``DLDeviceType`` values from ``dlpack.h`` (used for messages and comparisons)."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    ROCM_HOST = 11
    EXT_DEV = 12
    CUDA_MANAGED = 13
    ONEAPI = 14
    WEBGPU = 15
    HEXAGON = 16
    MAIA = 17
    TRN = 18


# -- the C structs of dlpack.h ------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    # The deleter is a function pointer we never call (see "Ownership" above), so void* is enough.
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY (DLPack >= 1.0)

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
_USED = (b"used_dltensor", b"used_dltensor_versioned")

# -- the CPython capsule API ---------------------------------------------------------------------
# Private prototypes bound to ctypes.pythonapi rather than setting .argtypes/.restype on
# ctypes.pythonapi.PyCapsule_* themselves: those attributes are process-wide, shared with every
# other library that uses ctypes.pythonapi, and we must neither clobber nor depend on theirs.
# PYFUNCTYPE keeps the GIL held and turns a Python error the call sets into an exception.
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)

# types.CapsuleType exists from Python 3.13; before that, borrow the type of a capsule CPython
# always has. PyCapsule_GetName must only see real capsules (it raises on anything else).
_CapsuleType: type = getattr(types, "CapsuleType", None) or type(datetime.datetime_CAPI)

_TYPE_CODES = {0: "Int", 1: "UInt", 2: "Float", 3: "OpaqueHandle", 4: "Bfloat", 5: "Complex", 6: "Bool"}
_TYPE_CODES.update(
    {
        7: "Float8_e3m4",
        8: "Float8_e4m3",
        9: "Float8_e4m3b11fnuz",
        10: "Float8_e4m3fn",
        11: "Float8_e4m3fnuz",
        12: "Float8_e5m2",
        13: "Float8_e5m2fnuz",
        14: "Float8_e8m0fnu",
        15: "Float6_e2m3fn",
        16: "Float6_e3m2fn",
        17: "Float4_e2m1fn",
    }
)
# DLPack code -> NumPy kind letter, for the codes NumPy has a native dtype for.
_NUMPY_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
# The widths NumPy stores the same way. Not float128/complex256: DLPack means IEEE binary128 there,
# NumPy's "f16" is the x87 80-bit long double padded to 16 bytes, a different format.
_NUMPY_BITS = {"i": (8, 16, 32, 64), "u": (8, 16, 32, 64), "f": (16, 32, 64), "c": (64, 128), "b": (8,)}


@dataclass(frozen=True)
class DLPackView:
    """What a DLPack capsule describes, read without a copy.

    Attributes
    ----------
    ptr : int
        Address of element 0: the tensor's ``data`` plus ``byte_offset``.
    shape : tuple of int
    strides : tuple of int or None
        In **elements**, as DLPack gives them; ``None`` when the producer passed ``NULL``, which
        DLPack defines as C-contiguous.
    dtype : numpy.dtype
        Native byte order (DLPack has no other).
    device_type : int
        A ``DLDeviceType`` value: 1 CPU, 2 CUDA, 3 CUDA pinned host, 13 CUDA managed, ...
    device_id : int
        The device ordinal (0 for CPU, pinned and managed memory).
    keepalive : object
        The capsule, still unconsumed: its destructor frees the producer's memory, so ``ptr``
        stays valid while this object is referenced.
    readonly : bool
        The producer flagged the memory read-only (only a versioned capsule can say so; a legacy
        capsule always reads as ``False``).
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: np.dtype
    device_type: int
    device_id: int
    keepalive: Any
    readonly: bool = False

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes covered by the elements (not counting gaps of a strided layout)."""
        return self.size * self.dtype.itemsize


def dlpack_device(obj: Any) -> tuple[int, int] | None:
    """Return ``obj.__dlpack_device__()`` as plain ints, or ``None`` when ``obj`` has none.

    Parameters
    ----------
    obj : object
        Any object; producers return ``(device_type, device_id)``, often as an ``IntEnum`` pair.

    Returns
    -------
    tuple of (int, int) or None
    """
    method = getattr(obj, "__dlpack_device__", None)
    if method is None:
        return None
    device_type, device_id = method()
    return int(device_type), int(device_id)


def is_cuda_device(device_type: int) -> bool:
    """Whether a ``DLDeviceType`` is memory CUDA kernels address as device memory.

    ``kDLCUDA`` (2) and ``kDLCUDAManaged`` (13) count. ``kDLCUDAHost`` (3) does not: it is pinned
    *host* memory, reachable over the bus but not what rawgraph's kernels are planned for.

    Parameters
    ----------
    device_type : int

    Returns
    -------
    bool
    """
    return int(device_type) in (DLDeviceType.CUDA, DLDeviceType.CUDA_MANAGED)


def contiguous_c(shape: Sequence[int], strides: Sequence[int] | None) -> bool:
    """Whether ``strides`` (in elements) describe a C-contiguous (row-major, dense) layout.

    Parameters
    ----------
    shape : sequence of int
    strides : sequence of int or None
        ``None`` means contiguous, as a ``NULL`` DLPack stride pointer does.

    Returns
    -------
    bool
        ``True`` when every element sits where a dense row-major array would put it. Dimensions
        of extent 1 may carry any stride (it is never multiplied by a non-zero index), and an
        array with no elements is contiguous whatever its strides say.
    """
    if strides is None:
        return True
    if len(strides) != len(shape):
        return False
    if math.prod(shape) == 0:
        return True
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def view_dlpack(obj: Any, what: str = "array", stream: int | None = None) -> DLPackView:
    """Read a DLPack producer (or a capsule it made) into a :class:`DLPackView`, without a copy.

    Parameters
    ----------
    obj : object
        Anything with ``__dlpack__`` (torch tensors, CuPy/JAX/NumPy arrays), or a DLPack
        ``PyCapsule`` passed directly (then ``stream`` cannot reach the producer and is ignored).
    what : str
        How to name ``obj`` in error messages (e.g. the argument name).
    stream : int or None
        The consumer's stream, forwarded as ``__dlpack__(stream=stream)`` so the producer can
        order its pending work before ours: ``None`` lets it assume the legacy default stream,
        1 is the legacy stream, 2 per-thread default, -1 asks for no synchronisation, other
        values are a ``CUstream`` handle. It is dropped (``None`` sent) when
        ``__dlpack_device__`` reports a CPU array, where the protocol accepts only ``None``.

    Returns
    -------
    DLPackView

    Raises
    ------
    NotOnDeviceError
        ``obj`` has no ``__dlpack__`` and is not a capsule.
    ArrayError
        The capsule is not a DLPack tensor, was already consumed, has an unknown major version
        or a corrupt header; the producer refused to export (its ``BufferError`` is chained);
        or ``stream`` is 0, which DLPack forbids as ambiguous.
    DTypeError
        The element type has no NumPy equivalent (bfloat16, float8, vector lanes, sub-byte).

    Notes
    -----
    The legacy capsule is asked for first (no ``max_version``), because every producer old or
    new can make it. If the producer refuses with ``BufferError`` (NumPy does for read-only
    arrays, which the legacy struct cannot flag), the export is retried with
    ``max_version=(1, 0)``. A versioned capsule is read just as well, from either path.
    """
    if isinstance(obj, _CapsuleType):
        capsule = obj
    else:
        capsule = _export(obj, what, stream)
    return _read_capsule(capsule, what)


def _export(obj: Any, what: str, stream: int | None) -> Any:
    """Call the producer's ``__dlpack__`` and return its capsule."""
    exporter = getattr(obj, "__dlpack__", None)
    if exporter is None or not callable(exporter):
        raise NotOnDeviceError(f"{what} of type {type(obj).__name__} exposes no __dlpack__ and is not a DLPack capsule")
    if stream == 0:
        # DLPack forbids 0: it could mean "no stream", the legacy stream or the per-thread one.
        raise ArrayError(f"{what}: stream=0 is ambiguous in DLPack; pass 1 for the legacy default stream")
    if stream is not None:
        device = dlpack_device(obj)
        if device is not None and device[0] == DLDeviceType.CPU:
            stream = None  # the protocol: CPU (no streams) accepts only None; NumPy raises otherwise
    try:
        capsule = exporter(stream=stream)
    except BufferError as legacy_refusal:
        try:
            capsule = exporter(stream=stream, max_version=(1, 0))
        except TypeError:
            # An older producer that knows no max_version: its first answer stands.
            raise ArrayError(f"{what}: the producer refused a DLPack export: {legacy_refusal}") from legacy_refusal
        except BufferError as refusal:
            raise ArrayError(f"{what}: the producer refused a DLPack export: {refusal}") from refusal
    if not isinstance(capsule, _CapsuleType):
        raise ArrayError(f"{what}: __dlpack__ returned {type(capsule).__name__}, not a PyCapsule")
    return capsule


def _read_capsule(capsule: Any, what: str) -> DLPackView:
    """Parse a (legacy or versioned) DLPack capsule; never renames or consumes it."""
    name = _capsule_get_name(capsule)
    if name in _USED:
        raise ArrayError(
            f"{what}: this DLPack capsule was already consumed (named {name.decode()!r}); its memory "
            "belongs to another consumer now -- call __dlpack__() again for a fresh capsule"
        )
    if name not in (_LEGACY, _VERSIONED) or not _capsule_is_valid(capsule, name):
        shown = name.decode(errors="replace") if name is not None else None
        raise ArrayError(f"{what}: capsule named {shown!r} is not a DLPack tensor")
    address = _capsule_get_pointer(capsule, name)
    readonly = False
    if name == _VERSIONED:
        managed = _DLManagedTensorVersioned.from_address(address)
        major, minor = managed.version.major, managed.version.minor
        # The struct layout is only promised within one major version (the spec says a consumer
        # must refuse a major it does not know, even though it asked with max_version).
        if major != 1:
            raise ArrayError(f"{what}: DLPack version {major}.{minor} is not readable (this reader knows 1.x)")
        readonly = bool(managed.flags & _FLAG_READ_ONLY)
        tensor = managed.dl_tensor
    else:
        tensor = _DLManagedTensor.from_address(address).dl_tensor

    ndim = int(tensor.ndim)
    if ndim < 0:
        raise ArrayError(f"{what}: DLPack tensor has ndim {ndim}")
    if ndim and not tensor.shape:
        raise ArrayError(f"{what}: DLPack tensor of ndim {ndim} has a NULL shape")
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if any(extent < 0 for extent in shape):
        raise ArrayError(f"{what}: DLPack tensor has a negative extent in shape {shape}")
    # A NULL strides pointer means C-contiguous; keep that as None rather than inventing strides,
    # so the caller can tell "producer said contiguous" from "producer gave these strides".
    strides = tuple(int(tensor.strides[i]) for i in range(ndim)) if tensor.strides else None
    dtype = _numpy_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes, what)
    return DLPackView(
        ptr=(tensor.data or 0) + int(tensor.byte_offset),
        shape=shape,
        strides=strides,
        dtype=dtype,
        device_type=int(tensor.device.device_type),
        device_id=int(tensor.device.device_id),
        keepalive=capsule,
        readonly=readonly,
    )


def _numpy_dtype(code: int, bits: int, lanes: int, what: str) -> np.dtype:
    """Map a ``DLDataType`` to a NumPy dtype, or raise :class:`DTypeError`."""
    label = f"{_TYPE_CODES.get(code, f'code {code}')}{bits}"
    if lanes != 1:
        raise DTypeError(f"{what}: DLPack vector dtype {label}x{lanes} has no NumPy equivalent")
    kind = _NUMPY_KINDS.get(code)
    if kind is None or bits not in _NUMPY_BITS[kind]:
        raise DTypeError(f"{what}: DLPack dtype {label} has no NumPy equivalent")
    # "=": DLPack data is always native byte order.
    return np.dtype(f"={kind}{bits // 8}")
