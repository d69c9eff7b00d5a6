"""The DLPack consumer (rawgraph.runtime.dlpack) on NumPy's own CPU capsules and hand-made ones: no GPU needed."""

from __future__ import annotations

import ctypes
import datetime
import gc
import weakref
from enum import IntEnum

import numpy as np
import pytest

from rawgraph.runtime.dlpack import DLPackView, contiguous_c, dlpack_device, is_cuda_device, view_dlpack
from rawgraph.runtime.errors import ArrayError, DTypeError, NotOnDeviceError

_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)


def capsule_name(capsule) -> str:
    return _get_name(capsule).decode()


class Wrapper:
    """Hands out a given capsule through the protocol, so np.from_dlpack can consume it."""

    def __init__(self, capsule, device=(1, 0)):
        self.capsule = capsule
        self.device = device
        self.calls: list[dict] = []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.capsule

    def __dlpack_device__(self):
        return self.device


# -- NumPy's capsules ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype",
    [
        np.float32,
        np.float64,
        np.float16,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.bool_,
        np.complex64,
        np.complex128,
    ],
)
def test_dtype_pointer_shape_device(dtype, rng):
    seed = rng.seed_used
    print(f"seed {seed}")
    a = (np.abs(rng.standard_normal((3, 5))) * 10).astype(dtype)
    v = view_dlpack(a)
    assert isinstance(v, DLPackView)
    assert v.dtype == np.dtype(dtype), f"seed {seed}"
    assert v.ptr == a.ctypes.data
    assert v.shape == (3, 5)
    assert v.strides == (5, 1)
    assert (v.device_type, v.device_id) == (1, 0)
    assert not is_cuda_device(v.device_type)
    assert not v.readonly
    assert v.size == 15 and v.nbytes == a.nbytes
    # The bytes at ptr are the array's bytes (so the pointer really is element 0).
    assert ctypes.string_at(v.ptr, v.nbytes) == a.tobytes(), f"seed {seed}"


def test_legacy_capsule_is_the_default_and_is_not_consumed():
    a = np.arange(6, dtype=np.float32)
    v = view_dlpack(a)
    assert capsule_name(v.keepalive) == "dltensor"
    # Passing a capsule directly: read twice, then still consumable by a real consumer.
    capsule = a.__dlpack__()
    assert view_dlpack(capsule).ptr == a.ctypes.data
    assert view_dlpack(capsule).ptr == a.ctypes.data
    assert capsule_name(capsule) == "dltensor"
    np.testing.assert_array_equal(np.from_dlpack(Wrapper(capsule)), a)
    assert capsule_name(capsule) == "used_dltensor"


def test_versioned_capsule_passed_directly():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    capsule = a.__dlpack__(max_version=(1, 0))
    assert capsule_name(capsule) == "dltensor_versioned"
    v = view_dlpack(capsule)
    assert v.keepalive is capsule
    assert (v.ptr, v.shape, v.strides, v.dtype) == (a.ctypes.data, (3, 4), (4, 1), np.dtype(np.int32))
    assert (v.device_type, v.device_id) == (1, 0)
    assert not v.readonly
    assert capsule_name(capsule) == "dltensor_versioned"


def test_readonly_array_falls_back_to_versioned_and_reports_readonly():
    a = np.arange(4.0)
    a.flags.writeable = False
    with pytest.raises(BufferError):  # the reason for the fallback: legacy DLPack can't say read-only
        a.__dlpack__()
    v = view_dlpack(a)
    assert capsule_name(v.keepalive) == "dltensor_versioned"
    assert v.readonly
    assert v.ptr == a.ctypes.data


def test_offset_view_pointer():
    a = np.arange(10, dtype=np.float64)
    v = view_dlpack(a[3:])
    assert v.ptr == a.ctypes.data + 3 * 8 == a[3:].ctypes.data
    assert v.shape == (7,)
    assert ctypes.c_double.from_address(v.ptr).value == 3.0


def test_transposed_and_sliced_strides_are_in_elements():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = view_dlpack(a.T)
    assert t.shape == (6, 4) and t.strides == (1, 6)
    assert not contiguous_c(t.shape, t.strides)
    s = view_dlpack(a[1:, ::2])
    assert s.shape == (3, 3) and s.strides == (6, 2)
    assert s.ptr == a.ctypes.data + 6 * 4
    assert not contiguous_c(s.shape, s.strides)
    whole = view_dlpack(a)
    assert whole.strides == (6, 1) and contiguous_c(whole.shape, whole.strides)


def test_zero_dim_array_has_null_strides():
    a = np.array(2.5, dtype=np.float32)
    v = view_dlpack(a)
    assert v.shape == () and v.strides is None  # NumPy passes NULL strides only for ndim 0
    assert ctypes.c_float.from_address(v.ptr).value == 2.5


def test_contiguity_matches_numpy_on_random_views(rng):
    seed = rng.seed_used
    print(f"seed {seed}")
    for trial in range(200):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(n) for n in rng.integers(1, 5, ndim))
        a = np.zeros(shape, np.float32)
        index = tuple(slice(int(rng.integers(0, 2)), None, int(rng.integers(1, 3))) for _ in shape)
        b = a[index]
        if rng.random() < 0.4:
            b = b.transpose(rng.permutation(b.ndim))
        v = view_dlpack(b)
        assert v.shape == b.shape, f"seed {seed} trial {trial}"
        assert v.strides == tuple(s // 4 for s in b.strides), f"seed {seed} trial {trial}"
        assert contiguous_c(v.shape, v.strides) == b.flags.c_contiguous, (
            f"seed {seed} trial {trial}: shape {b.shape} strides {v.strides}"
        )


def test_keepalive_keeps_the_memory_and_releases_it_after():
    a = np.arange(1000, dtype=np.float32) * 1.5
    saved = a.copy()
    alive = weakref.ref(a)
    v = view_dlpack(a)
    del a
    gc.collect()
    # NumPy's capsule owns a reference to the array: it must still be there, and the data intact.
    assert alive() is not None
    got = np.frombuffer(ctypes.string_at(v.ptr, v.nbytes), dtype=np.float32)
    np.testing.assert_array_equal(got, saved)
    # Dropping the view drops the capsule, whose destructor calls NumPy's deleter: no leak.
    del v, got
    gc.collect()
    assert alive() is None


def test_keepalive_of_an_offset_view():
    a = np.arange(100, dtype=np.int64)
    saved = a[10:].copy()
    v = view_dlpack(a[10:])
    del a
    gc.collect()
    got = np.frombuffer(ctypes.string_at(v.ptr, v.nbytes), dtype=np.int64)
    np.testing.assert_array_equal(got, saved)


# -- refusals -----------------------------------------------------------------------------------
def test_consumed_capsule_is_refused():
    a = np.arange(3.0)
    capsule = a.__dlpack__()
    np.from_dlpack(Wrapper(capsule))
    with pytest.raises(ArrayError, match="already consumed"):
        view_dlpack(capsule)
    versioned = a.__dlpack__(max_version=(1, 0))
    np.from_dlpack(Wrapper(versioned))
    assert capsule_name(versioned) == "used_dltensor_versioned"
    with pytest.raises(ArrayError, match="already consumed"):
        view_dlpack(versioned, what="x")


def test_foreign_capsule_is_refused():
    with pytest.raises(ArrayError, match="not a DLPack tensor"):
        view_dlpack(datetime.datetime_CAPI)


def test_object_without_dlpack_is_refused():
    for obj in ([1.0, 2.0], object(), 3.0, None):
        with pytest.raises(NotOnDeviceError, match="__dlpack__"):
            view_dlpack(obj, what="weights")


def test_producer_refusal_is_an_array_error():
    with pytest.raises(ArrayError, match="native byte order") as info:
        view_dlpack(np.ones(3, dtype=">f4"))
    assert isinstance(info.value.__cause__, BufferError)


def test_producer_returning_a_non_capsule_is_refused():
    with pytest.raises(ArrayError, match="not a PyCapsule"):
        view_dlpack(Wrapper("not a capsule"))


def test_stream_handling():
    with pytest.raises(ArrayError, match="stream=0"):
        view_dlpack(np.arange(3), stream=0)
    # CPU accepts only stream=None: the stream is dropped rather than making NumPy raise.
    with pytest.raises((RuntimeError, ValueError)):  # NumPy 2.4 raises RuntimeError, 2.5 ValueError
        np.arange(3).__dlpack__(stream=5)
    cpu = Wrapper(np.arange(3).__dlpack__(), device=(1, 0))
    view_dlpack(cpu, stream=5)
    assert cpu.calls == [{"stream": None}]
    # A CUDA producer gets the stream.
    cuda = Wrapper(np.arange(3).__dlpack__(), device=(2, 0))
    view_dlpack(cuda, stream=0x1234)
    assert cuda.calls == [{"stream": 0x1234}]


# -- hand-made capsules: what NumPy never produces ----------------------------------------------
class _Dev(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Dev),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Versioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _Tensor),
    ]


class FakeCapsule:
    """Owns a hand-built DLManagedTensor[Versioned] and a capsule (no destructor) pointing at it."""

    def __init__(
        self,
        shape=(2, 3),
        strides=None,
        code=2,
        bits=32,
        lanes=1,
        data=0x10000,
        byte_offset=0,
        device=(2, 0),
        versioned=False,
        major=1,
        flags=0,
    ):
        self.shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides_arr = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        self.managed = _Versioned(major, 0, None, None, flags) if versioned else _Managed()
        t = self.managed.dl_tensor
        t.data, t.ndim, t.byte_offset = data, len(shape), byte_offset
        t.device = _Dev(*device)
        t.dtype = _DType(code, bits, lanes)
        t.shape = ctypes.addressof(self.shape_arr) if shape else None
        t.strides = None if self.strides_arr is None else ctypes.addressof(self.strides_arr)
        self.name = ctypes.create_string_buffer(b"dltensor_versioned" if versioned else b"dltensor")
        # The capsule has no destructor and does not own this object: keep the FakeCapsule alive
        # for as long as the capsule is read (view_fake does), or the structs are freed under it.
        self.capsule = _new_capsule(ctypes.addressof(self.managed), ctypes.addressof(self.name), None)


def view_fake(**kwargs) -> DLPackView:
    fake = FakeCapsule(**kwargs)
    view = view_dlpack(fake.capsule)
    assert view.keepalive is fake.capsule
    return view


def test_handmade_legacy_capsule_with_byte_offset_and_null_strides():
    v = view_fake(shape=(2, 3), strides=None, data=0x7000_0000, byte_offset=64, device=(2, 3))
    assert v.ptr == 0x7000_0000 + 64
    assert v.shape == (2, 3) and v.strides is None
    assert v.dtype == np.float32
    assert (v.device_type, v.device_id) == (2, 3)
    assert is_cuda_device(v.device_type)
    assert contiguous_c(v.shape, v.strides)


def test_handmade_versioned_capsule_flags_and_version():
    v = view_fake(versioned=True, flags=1, strides=(3, 1), device=(13, 0))
    assert v.readonly and v.strides == (3, 1) and v.device_type == 13
    assert is_cuda_device(v.device_type)
    copied_only = view_fake(versioned=True, flags=2)  # IS_COPIED, not read-only
    assert not copied_only.readonly
    with pytest.raises(ArrayError, match="version 2.0"):
        view_fake(versioned=True, major=2)


@pytest.mark.parametrize(
    "code, bits, lanes",
    [
        (4, 16, 1),  # bfloat16
        (2, 32, 4),  # float32x4 vector
        (10, 8, 1),  # float8_e4m3fn
        (17, 4, 1),  # float4_e2m1fn
        (0, 4, 1),  # int4
        (2, 128, 1),  # IEEE quad, not NumPy's padded long double
        (5, 32, 1),  # complex32
        (6, 32, 1),  # a 32-bit bool
        (3, 64, 1),
    ],  # opaque handle
)
def test_unmappable_dtypes_are_refused(code, bits, lanes):
    with pytest.raises(DTypeError):
        view_fake(code=code, bits=bits, lanes=lanes)


@pytest.mark.parametrize(
    "code, bits, expected",
    [(0, 8, np.int8), (1, 64, np.uint64), (2, 16, np.float16), (5, 128, np.complex128), (6, 8, np.bool_)],
)
def test_handmade_dtypes_map(code, bits, expected):
    assert view_fake(code=code, bits=bits).dtype == np.dtype(expected)


def test_handmade_zero_dim_with_null_shape():
    v = view_fake(shape=(), strides=None)
    assert v.shape == () and v.strides is None and v.size == 1


# -- helpers ------------------------------------------------------------------------------------
def test_dlpack_device():
    assert dlpack_device(np.zeros(2)) == (1, 0)
    assert dlpack_device([1, 2]) is None

    class Kind(IntEnum):
        CUDA = 2

    got = dlpack_device(Wrapper(None, device=(Kind.CUDA, 1)))
    assert got == (2, 1) and type(got[0]) is int


def test_is_cuda_device():
    assert is_cuda_device(2) and is_cuda_device(13)
    assert not any(is_cuda_device(t) for t in (1, 3, 4, 10, 11, 14))


@pytest.mark.parametrize(
    "shape, strides, expected",
    [
        ((2, 3), None, True),
        ((2, 3), (3, 1), True),
        ((2, 3), (1, 2), False),  # Fortran order
        ((2, 3), (6, 2), False),  # every other column
        ((2, 3), (3, -1), False),  # reversed
        ((2, 3), (4, 1), False),  # padded rows
        ((1, 3), (99, 1), True),  # extent-1 dims may carry any stride
        ((2, 1), (1, 7), True),
        ((1, 1), (5, 9), True),
        ((0, 3), (7, 7), True),  # no elements: nothing is out of place
        ((), (), True),
        ((4,), (1,), True),
        ((4,), (2,), False),
        ((2, 3), (3,), False),
    ],  # strides of the wrong rank
)
def test_contiguous_c_truth_table(shape, strides, expected):
    assert contiguous_c(shape, strides) is expected


# -- through as_device_array (rawgraph.runtime.memory): what rawgraph accepts and refuses ---------------------
def test_as_device_array_takes_a_cuda_dlpack_tensor_without_a_copy():
    from rawgraph import as_device_array

    fake = FakeCapsule(shape=(4, 8), strides=(8, 1), data=0x7F00_0000_0000, byte_offset=16)
    arr = as_device_array(fake.capsule)
    assert (arr.ptr, arr.shape, arr.dtype) == (0x7F00_0000_0010, (4, 8), np.float32)
    assert arr.owner[1] is fake.capsule  # the capsule stays alive with the view


def test_as_device_array_refuses_strided_and_host_dlpack_tensors():
    from rawgraph import LayoutError, NotOnDeviceError, as_device_array

    strided = FakeCapsule(shape=(4, 8), strides=(1, 4))
    with pytest.raises(LayoutError, match="strided"):
        as_device_array(strided.capsule)
    pinned = FakeCapsule(device=(3, 0))
    with pytest.raises(NotOnDeviceError, match="device type 3"):
        as_device_array(pinned.capsule)
    host = np.ones((2, 3), np.float32)
    with pytest.raises(NotOnDeviceError, match="device type 1"):
        as_device_array(Wrapper(host))


def test_as_device_array_keeps_the_read_only_flag():
    from rawgraph import as_device_array

    ro = FakeCapsule(shape=(4,), versioned=True, flags=1)
    rw = FakeCapsule(shape=(4,), versioned=True, flags=0)
    assert as_device_array(ro.capsule).readonly and not as_device_array(rw.capsule).readonly
