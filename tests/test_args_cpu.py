"""Argument packing, launch-shape choice, validation and error mapping: no GPU needed."""

import ctypes

import numpy as np
import pytest
from cuda.bindings import driver

from rawgraph import (
    CaptureError,
    CudaError,
    DTypeError,
    KernelArgs,
    Launch,
    LayoutError,
    NotOnDeviceError,
    ShapeError,
    TinyBlock,
    as_device_array,
)
from rawgraph.ops.gemm import (
    GEMM_MIN_BATCH,
    _check_shape,
    gemm_shape,
    gemm_smem_bytes,
    matmul_shape,
    matvec_shape,
    residency_pad,
)
from rawgraph.runtime.errors import check, cuda_error


def test_packed_layout_alignment_and_pointer_table():
    args = KernelArgs([("x", "ptr"), ("n", "i32"), ("y", "ptr"), ("s", "f32"), ("m", "i32"), ("big", "i64")])
    assert args.offsets == {"x": 0, "n": 8, "y": 16, "s": 24, "m": 28, "big": 32}
    args.update({"x": 0xDEADBEEF000, "n": -7, "y": 2**63 + 5, "s": 1.5, "m": 42, "big": -(2**40)})
    # The void* table points at each slot; reading through it gives the values back.
    table = args.address
    ptrs = [ctypes.c_void_p.from_address(table + 8 * i).value for i in range(6)]
    assert ptrs[1] - ptrs[0] == 8 and ptrs[5] - ptrs[0] == 32
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0xDEADBEEF000
    assert ctypes.c_int32.from_address(ptrs[1]).value == -7
    assert ctypes.c_uint64.from_address(ptrs[2]).value == 2**63 + 5
    assert ctypes.c_float.from_address(ptrs[3]).value == 1.5
    assert ctypes.c_int32.from_address(ptrs[4]).value == 42
    assert ctypes.c_int64.from_address(ptrs[5]).value == -(2**40)


def test_edits_are_in_place_and_copies_are_independent():
    args = KernelArgs([("x", "ptr"), ("n", "i32")])
    addr = args.address
    args["x"] = 1234
    snap = args.snapshot()
    args["x"] = 5678
    assert args.address == addr and args["x"] == 5678 and args.snapshot() != snap
    other = args.copy()
    assert other.address != args.address and other.snapshot() == args.snapshot()
    other["x"] = 1
    assert args["x"] == 5678
    assert KernelArgs.from_bytes(args.spec, snap)["x"] == 1234


def test_buffers_of_one_spec_share_the_layout_not_the_values():
    spec = [("x", "ptr"), ("n", "i32"), ("t", "i32[3]")]
    a, b = KernelArgs(spec), KernelArgs(list(spec))
    assert a.offsets is b.offsets and a.spec == b.spec  # worked out once per spec
    with pytest.raises(TypeError):
        a.offsets["x"] = 8  # shared, so read-only
    a.update({"x": 11, "n": 3})
    a.array("t")[:] = [1, 2, 3]
    assert (b["x"], b["n"], b["t"]) == (0, 0, (0, 0, 0)) and a.address != b.address
    assert (a["x"], a["n"], a["t"]) == (11, 3, (1, 2, 3))
    with pytest.raises(KeyError):
        a["missing"] = 1


def test_a_spec_given_as_an_iterator_is_read_once_and_copies_are_independent():
    import copy
    import pickle

    spec = [("x", "ptr"), ("n", "i32")]
    a = KernelArgs(iter(spec))
    b = KernelArgs(spec)
    assert a.spec == b.spec == (("x", "ptr"), ("n", "i32"))
    a.update({"x": 7, "n": -3})
    for other in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert other.snapshot() == a.snapshot() and other.address != a.address
        other["n"] = 5
        assert a["n"] == -3


def test_by_value_int32_arrays_are_laid_out_as_c_structs():
    # struct { int idx[N]; } aligns to 4, not to its size: after two int32 it starts at byte 8.
    a = KernelArgs([("n", "i32"), ("m", "i32"), ("table", "i32[5]"), ("p", "ptr")])
    assert a.offsets == {"n": 0, "m": 4, "table": 8, "p": 32} and a.sizes["table"] == 20
    a.array("table")[:] = [7, -1, 3, 0, 9]
    a["n"] = 2
    assert a["table"] == (7, -1, 3, 0, 9) and a["n"] == 2
    raw = np.frombuffer(a.snapshot(), dtype=np.int32)
    assert list(raw[2:7]) == [7, -1, 3, 0, 9]
    b = KernelArgs.from_bytes(a.spec, a.snapshot())
    assert b["table"] == a["table"]
    with pytest.raises(ValueError, match="unknown kind"):
        KernelArgs([("t", "i32[0]")])


def test_bad_arg_specs():
    with pytest.raises(ValueError, match="unknown kind"):
        KernelArgs([("x", "float*")])
    with pytest.raises(ValueError, match="duplicate"):
        KernelArgs([("x", "ptr"), ("x", "i32")])


SHAPES = [(1, 1), (1, 33), (3, 128), (17, 1000), (8, 1024), (64, 4096), (1, 4096), (15, 1000), (100, 12)]


@pytest.fixture
def rule_only(monkeypatch):
    """matmul.cu's rule alone: the sweep's table (``SGEMM_CUTS``, tested in test_sgemm_cpu.py)
    takes the shapes it lists first, some of those below among them."""
    from rawgraph.ops import gemm

    monkeypatch.setattr(gemm, "SGEMM_CUTS", {})


@pytest.mark.parametrize("clusters", [True, False])
@pytest.mark.parametrize("batch,width", SHAPES)
def test_matmul_shape_covers_the_output(rule_only, batch, width, clusters):
    s = matmul_shape(batch, width, width, multiprocessors=132, clusters=clusters)
    cols, split, rows = s.grid
    assert cols * s.tc >= width and (cols - 1) * s.tc < width
    assert rows * s.bt >= batch and (rows - 1) * s.bt < batch
    assert split == s.split and split in (1, 2, 4, 8) and (clusters or split == 1)
    if s.kernel == "gemm":
        assert batch >= GEMM_MIN_BATCH and width % 4 == 0 and s.tc in (64, 128) and s.bt == 64
    else:
        assert s.bt * s.tc <= 512 and 32 % (s.tc // s.vec) == 0
        assert s.vec == (4 if width % 4 == 0 else 1)


def test_matmul_shape_picks_the_kernel_by_batch_and_alignment(rule_only):
    assert matmul_shape(8, 4096, 4096, 132).kernel == "matvec"
    assert matmul_shape(32, 2048, 2048, 132).kernel == "gemm"
    assert matmul_shape(64, 1024, 1024, 132).kernel == "matvec"  # W small enough for L2 to serve re-reads
    assert matmul_shape(64, 4096, 4096, 132, x_aligned16=False).kernel == "matvec"
    assert matmul_shape(64, 4096, 4098, 132).kernel == "matvec"  # N % 4 != 0: no 16-byte rows


def test_matmul_shape_fills_the_gpu_when_it_can(rule_only):
    s = matmul_shape(1, 4096, 4096, 132)
    assert s.ctas >= 132 and s.split > 1
    assert matmul_shape(1, 4096, 4096, 132, clusters=False).split == 1
    assert matmul_shape(1, 4096, 4096, 132, clusters=False).ctas >= 132  # narrower tiles instead
    assert matmul_shape(1, 4096, 4096, 132, w_aligned16=False).vec == 1
    big = matmul_shape(64, 4096, 4096, 132)
    assert big.ctas * big.threads >= 0.9 * 132 * 512  # 16 warps on (nearly) every SM
    # Small products are not split: a cluster's barrier and reduction cost more than they save.
    assert matmul_shape(1, 128, 128, 132).split == 1
    assert matmul_shape(1, 1024, 1024, 132).split > 1


def test_gemm_cut_rule(rule_only):
    big = matmul_shape(64, 4096, 4096, 132)
    # One 512-thread CTA (two K slices) per SM: 64 column tiles, a cluster split of 2.
    assert (big.kernel, big.tc, big.split, big.slices, big.threads, big.ctas) == ("gemm", 64, 2, 2, 512, 128)
    assert gemm_smem_bytes(big) == 2 * 3 * (64 * 20 + 16 * 64) * 4
    wide = matmul_shape(256, 4096, 4096, 132)  # enough tiles without a split
    assert (wide.split, wide.per_sm) == (1, 0)
    with pytest.raises(ShapeError, match="slices"):
        gemm_shape(64, 4096, 4096, 132, clusters=True, slices=3)
    assert gemm_shape(64, 4096, 4096, 132, clusters=False).split == 1
    with pytest.raises(ShapeError, match="per_sm"):
        gemm_shape(64, 4096, 4096, 132, clusters=True, split=2, per_sm=-1)


def _fake_device(smem_per_sm=233472, optin=232448, reserved=1024):
    from types import SimpleNamespace

    from rawgraph.runtime.device import DeviceInfo

    info = DeviceInfo(0, "fake H200", (9, 0), 132, 1 << 30, 50 << 20, smem_per_sm, optin, reserved)
    return SimpleNamespace(info=info)


@pytest.mark.parametrize("static,per_sm", [(27648, 2), (39936, 2), (27648, 1), (17536, 3), (0, 2)])
def test_residency_pad_fits_exactly_per_sm_ctas(static, per_sm):
    dev = _fake_device()
    pad = residency_pad(dev, static, per_sm)
    per_cta = static + pad + dev.info.smem_reserved_per_block
    assert per_sm * per_cta <= dev.info.smem_per_sm < (per_sm + 1) * per_cta
    assert residency_pad(dev, static, 0) == 0


def test_residency_pad_refuses_what_cannot_fit():
    with pytest.raises(ShapeError, match="cap residency"):
        residency_pad(_fake_device(), 39936, 8)  # eight 40 KB CTAs exceed 228 KB
    with pytest.raises(ShapeError, match="no shared memory"):
        residency_pad(_fake_device(smem_per_sm=0), 1024, 2)


def test_hand_picked_matmul_shapes_are_checked():
    x, w = as_device_array(FakeCAI((64, 1000))), as_device_array(FakeCAI((1000, 1000)))
    good = gemm_shape(64, 1000, 1000, 132, clusters=True, split=4, tile_n=128)
    assert good.grid == (8, 4, 1) and good.threads == 512
    _check_shape(good, 64, 1000, 1000, x, w, clusters=True)
    with pytest.raises(ShapeError, match="clusters"):
        _check_shape(good, 64, 1000, 1000, x, w, clusters=False)
    with pytest.raises(ShapeError, match="does not fit"):
        _check_shape(good, 65, 1000, 1000, x, w, clusters=True)
    w_odd = as_device_array(FakeCAI((1000, 1000), ptr=0x7F0000000004))
    with pytest.raises(LayoutError, match="16-byte"):
        _check_shape(good, 64, 1000, 1000, x, w_odd, clusters=True)
    mv = matvec_shape(64, 1000, 1000, 132, vec=4, clusters=True, tc=64, split=2)
    _check_shape(mv, 64, 1000, 1000, x, w, clusters=True)
    with pytest.raises(LayoutError, match="vec=4"):
        _check_shape(mv, 64, 1000, 1000, x, w_odd, clusters=True)
    with pytest.raises(ShapeError, match="column tile"):
        matvec_shape(8, 1000, 1000, 132, vec=4, clusters=True, tc=128)  # 8 x 128 partials do not fit


class FakeCAI:
    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


def test_host_arrays_are_refused_before_the_gpu():
    with pytest.raises(NotOnDeviceError, match="host array"):
        as_device_array(np.ones((2, 2), np.float32))
    with pytest.raises(NotOnDeviceError):
        as_device_array([1.0, 2.0])


def test_strided_views_are_refused():
    # A transposed (4, 8) float32 array: strides (4, 32) instead of (32, 4).
    with pytest.raises(LayoutError, match="strided"):
        as_device_array(FakeCAI((8, 4), strides=(4, 32)))
    # Contiguous strides spelled out are fine; extent-1 dims may carry any stride.
    assert as_device_array(FakeCAI((4, 8), strides=(32, 4))).shape == (4, 8)
    assert as_device_array(FakeCAI((1, 8), strides=(999, 4))).shape == (1, 8)


def test_dtype_and_shape_checks():
    from rawgraph.runtime.memory import check_array

    view = as_device_array(FakeCAI((4, 8), typestr="<f8"))
    with pytest.raises(DTypeError):
        check_array(view, (4, 8))
    view = as_device_array(FakeCAI((4, 8)))
    with pytest.raises(ShapeError, match="too small"):
        check_array(view, (8, 8))
    with pytest.raises(ShapeError, match="expected"):
        check_array(view, (8, 4))
    with pytest.raises(LayoutError, match="aligned"):
        check_array(as_device_array(FakeCAI((4, 8), ptr=0x7F0000000002)), (4, 8))


@pytest.mark.parametrize("kw", [{"width": 0}, {"batch": -1}, {"layers": 0}])
def test_model_sizes_must_be_positive(kw):
    args = {"width": 8, "batch": 1, "layers": 1, **kw}
    with pytest.raises(ShapeError, match=">= 1"):
        TinyBlock(**args)


@pytest.mark.parametrize("width", [33, 260, 2])
def test_block_form_refuses_widths_it_cannot_hold(width):
    with pytest.raises(ShapeError, match="form 'block'"):
        TinyBlock(width=width, batch=1, form="block")


def test_unknown_form():
    with pytest.raises(ValueError, match="form"):
        TinyBlock(width=8, batch=1, form="tiled")


def test_model_sizes_must_be_ints():
    with pytest.raises(TypeError):
        TinyBlock(width=8.0, batch=1)
    with pytest.raises(TypeError):
        TinyBlock(width=True, batch=1)


def test_error_mapping_names_the_code_and_the_call():
    with pytest.raises(CudaError) as info:
        check((driver.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuMemAlloc")
    e = info.value
    assert e.name == "CUDA_ERROR_INVALID_VALUE" and e.code == 1 and e.call == "cuMemAlloc"
    assert "cuMemAlloc" in str(e) and not isinstance(e, CaptureError)
    cap = cuda_error(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize")
    assert isinstance(cap, CaptureError) and cap.hint and "capturing" in cap.hint
    mis = cuda_error(driver.CUresult.CUDA_ERROR_MISALIGNED_ADDRESS)
    assert "argument" in mis.hint
    assert check((driver.CUresult.CUDA_SUCCESS, 5), "f") == 5
    assert check((driver.CUresult.CUDA_SUCCESS, 5, 6), "f") == (5, 6)
    assert check((driver.CUresult.CUDA_SUCCESS,), "f") is None


def test_node_params_describe_the_launch_and_point_at_its_arguments():
    class FakeKernel:  # only .handle and .name are read
        handle = 0
        name = "k"

    a = KernelArgs([("x", "ptr"), ("n", "i32")])
    b = a.copy()
    launch = Launch(FakeKernel(), (3, 2, 1), (128, 1, 1), a, {}, 4096, "t")
    p, q = launch.node_params(), launch.node_params(b)
    assert (p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.sharedMemBytes) == (3, 2, 1, 128, 1, 4096)
    assert int(p.kernelParams) == a.address and int(q.kernelParams) == b.address != a.address


def test_a_float_is_refused_only_when_it_would_round_to_infinity():
    from rawgraph import ArgumentError
    from rawgraph.runtime.launch import check_scalar

    # The largest finite half is 65504; everything below 65520 rounds to it (or less).
    for v in (65504.0, 65519.0, -65519.99, np.float32(65519.5)):
        check_scalar("f16", v, "h")
        args = KernelArgs([("h", "f16")])
        args["h"] = v
        assert abs(args["h"]) == 65504.0
    for v in (65520.0, -65520.0, 1e6, 70000):
        with pytest.raises(ArgumentError, match="would become infinite"):
            check_scalar("f16", v, "h")
    check_scalar("f32", 3.4028235e38, "s")  # above FLT_MAX, rounds down to it
    with pytest.raises(ArgumentError, match="would become infinite"):
        check_scalar("f32", 3.4028236e38, "s")
    # exactly halfway past FLT_MAX rounds (to even) to infinity; the double just below it does not
    halfway = 2.0**128 - 2.0**103
    check_scalar("f32", float(np.nextafter(halfway, 0)), "s")
    with pytest.raises(ArgumentError, match="would become infinite"):
        check_scalar("f32", halfway, "s")
    check_scalar("f16", float("inf"), "h")  # infinities and NaN pass as given
    check_scalar("f16", float("nan"), "h")


def test_a_device_array_normalises_its_dtype_and_shape():
    from rawgraph import DeviceArray

    view = DeviceArray(0x7F0000000000, [4, 8], np.float32, None)
    assert view.dtype == np.dtype(np.float32) and isinstance(view.dtype, np.dtype)
    assert view.shape == (4, 8) and view.nbytes == 128 and not view.readonly
    assert DeviceArray(0x7F0000000000, 5, "f8").shape == (5,)
    with pytest.raises(DTypeError, match="big-endian"):
        DeviceArray(0x7F0000000000, (4,), ">f4")


def test_read_only_and_big_endian_cuda_array_interfaces():
    class ReadOnly(FakeCAI):
        def __init__(self, typestr="<f4"):
            super().__init__((4,), typestr)
            self.__cuda_array_interface__["data"] = (0x7F0000000000, True)

    assert as_device_array(ReadOnly()).readonly and not as_device_array(FakeCAI((4,))).readonly
    for typestr in ("|u1", "|b1", "=f4", "<i8"):  # byte order: none, native or little
        assert as_device_array(FakeCAI((4,), typestr=typestr)).dtype == np.dtype(typestr)
    with pytest.raises(DTypeError, match="arr is big-endian"):
        as_device_array(FakeCAI((4,), typestr=">f4"), "arr")
