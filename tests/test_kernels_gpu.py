"""Every kernel against a float64 NumPy reference, on the GPU."""

import numpy as np
import pytest
from helpers import random_input, rel_err

from rawgraph import DeviceBuffer, LaunchPlan, ops

pytestmark = pytest.mark.gpu


def _run(launches, stream):
    for l in launches:
        l(stream)
    stream.synchronize()


def _matmul_case(device, stream, rng, epilogue, batch, k, n, shape=None, pdl=False):
    """One matmul launch (optionally after another kernel, as a PDL launch) against float64."""
    xh, wh, rh = random_input(rng, (batch, k)), random_input(rng, (k, n)), random_input(rng, (batch, n))
    bufs = {
        "x": DeviceBuffer.from_numpy(xh),
        "W": DeviceBuffer.from_numpy(wh),
        "r": DeviceBuffer.from_numpy(rh),
        "y": DeviceBuffer((batch, n)),
    }
    if pdl:
        bufs["xsrc"], bufs["zero"] = DeviceBuffer.from_numpy(xh), DeviceBuffer.from_numpy(np.zeros_like(xh))
    views = {k_: v.view() for k_, v in bufs.items()}
    bufs["y"].poison(stream)
    launches = [ops.matmul(device, views, "x", "W", "y", epilogue, r="r" if epilogue == "add" else None, shape=shape)]
    if pdl:
        # A kernel before it writes x (x = xsrc + 0): the PDL matmul may start early, but must
        # read x only after that kernel finished. Poisoned x would show up as NaN.
        bufs["x"].poison(stream)
        launches.insert(0, ops.add(device, views, "xsrc", "zero", "x"))
    plan = LaunchPlan(launches, views, pdl=pdl)
    plan.run(stream)
    stream.synchronize()
    ref = xh.astype(np.float64) @ wh.astype(np.float64)
    if epilogue == "relu":
        ref = np.maximum(ref, 0)
    if epilogue == "add":
        ref = ref + rh
    return bufs["y"].to_numpy(), ref, launches[-1]


@pytest.mark.parametrize("epilogue", ["none", "relu", "add"])
@pytest.mark.parametrize(
    "batch,k,n",
    [
        (1, 1, 1),
        (1, 128, 128),
        (3, 33, 33),
        (17, 1000, 1000),
        (8, 1024, 1024),
        (64, 128, 4096),
        (5, 4096, 12),
        (2, 7, 300),
        (64, 256, 256),
        (100, 36, 68),
    ],
)
def test_matmul(device, stream, rng, epilogue, batch, k, n):
    for _ in range(8):  # a tiny relu product can be all zero: draw again (fresh inputs each time)
        got, ref, _ = _matmul_case(device, stream, rng, epilogue, batch, k, n)
        if np.any(ref):
            break
    assert rel_err(got, ref) < 1e-5, f"seed {rng.seed_used}"


def _shapes():
    """Hand-picked cuts: every kernel, every split, with tails in B, K and N."""
    cases = []
    for split in (1, 2, 4, 8):
        for bn in (64, 128):
            for sl in (1, 2):  # 2: two K slices per CTA; at K = 260, split 8, the last chunks are empty
                cases.append(
                    (17, 1000, 1000, ops.gemm_shape(17, 1000, 1000, 1, True, split, bn, slices=sl))
                )  # K, N tails
                cases.append(
                    (100, 260, 68, ops.gemm_shape(100, 260, 68, 1, True, split, bn, slices=sl))
                )  # 2 batch tiles
            if split > 1:  # residency capped at 2 CTAs/SM (padded dynamic shared memory)
                cases.append((100, 260, 68, ops.gemm_shape(100, 260, 68, 1, True, split, bn, per_sm=2, slices=1)))
        for tc in (128, 64, 32, 16):
            for batch in (1, 3, 8):
                if tc * (8 if batch > 4 else 4 if batch > 2 else batch) <= 512:
                    cases.append((batch, 777, 260, ops.matvec_shape(batch, 777, 260, 1, 4, True, tc, split)))
        for tc in (32, 16, 8):
            cases.append((5, 301, 37, ops.matvec_shape(5, 301, 37, 1, 1, True, tc, split)))
    cases.append((2, 9000, 64, ops.matvec_shape(2, 9000, 64, 1, 4, True, 64, 1)))  # three x pieces
    return cases


@pytest.fixture(scope="module")
def compiled_cuts():
    """Compile every hand-picked cut in one NVRTC program (one compile, not one per test)."""
    from rawgraph import get_device
    from rawgraph.runtime.module import get_kernels

    get_kernels("matmul", sorted({ops.matmul_expr("add", s) for *_, s in _shapes()}), get_device())


@pytest.mark.parametrize(
    "batch,k,n,shape",
    _shapes(),
    ids=lambda v: (
        str(v)
        if not hasattr(v, "kernel")
        else f"{v.kernel}-v{v.vec}-t{v.tc}-b{v.bt}-s{v.split}-c{v.per_sm}-sl{v.slices}"
    ),
)
def test_every_matmul_cut(device, stream, rng, compiled_cuts, batch, k, n, shape):
    got, ref, launch = _matmul_case(device, stream, rng, "add", batch, k, n, shape)
    assert launch.grid == shape.grid
    assert rel_err(got, ref) < 1e-5, f"seed {rng.seed_used}"


@pytest.mark.parametrize("bn", [64, 128])
def test_gemm_residency_cap_holds(device, stream, rng, bn):
    """The padded launch really fits at most per_sm CTAs per SM, where the kernel alone fits more."""
    from cuda.bindings import driver

    from rawgraph.runtime.errors import call

    bufs = {"x": DeviceBuffer((64, 4096)), "W": DeviceBuffer((4096, 4096)), "y": DeviceBuffer((64, 4096))}
    views = {k: v.view() for k, v in bufs.items()}
    shape = ops.gemm_shape(64, 4096, 4096, device.info.multiprocessors, True, 4, bn, per_sm=2, slices=1)
    launch = ops.matmul(device, views, "x", "W", "y", "none", shape=shape)
    occ = lambda smem: call(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor, launch.kernel.handle, 256, smem)  # noqa: E731
    need = ops.gemm_smem_bytes(shape)
    assert launch.shared_mem > need
    assert occ(need) > 2 and occ(launch.shared_mem) == 2
    for b in bufs.values():
        b.close()


@pytest.mark.parametrize("batch,k,n", [(1, 4096, 4096), (8, 1024, 1024), (64, 1024, 1024), (3, 33, 33)])
def test_matmul_after_a_writer_with_pdl(device, stream, rng, batch, k, n):
    got, ref, launch = _matmul_case(device, stream, rng, "none", batch, k, n, pdl=True)
    assert launch.pdl
    assert rel_err(got, ref) < 1e-5, f"seed {rng.seed_used}"


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_matmul_is_bit_identical_run_to_run(device, stream, rng, batch):
    seed = int(rng.integers(1 << 62))  # fresh inputs, drawn twice alike
    a = _matmul_case(device, stream, np.random.default_rng(seed), "add", batch, 4096, 4096)[0]
    b = _matmul_case(device, stream, np.random.default_rng(seed), "add", batch, 4096, 4096)[0]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cluster", [4, 8])
@pytest.mark.parametrize("batch,width", [(1, 4), (1, 128), (3, 132), (5, 256), (17, 64), (4, 200), (64, 128)])
def test_single_kernel_block(device, stream, rng, batch, width, cluster):
    xh = random_input(rng, (batch, width))
    w1h, w2h = (
        random_input(rng, (width, width)) / np.float32(width**0.5),
        random_input(rng, (width, width)) / np.float32(width**0.5),
    )
    bufs = {
        "x": DeviceBuffer.from_numpy(xh),
        "W1": DeviceBuffer.from_numpy(w1h),
        "W2": DeviceBuffer.from_numpy(w2h),
        "y": DeviceBuffer((batch, width)),
    }
    bufs["y"].poison(stream)
    launch = ops.block(device, {k: v.view() for k, v in bufs.items()}, "x", "W1", "W2", "y", cluster=cluster)
    _run([launch], stream)
    x64 = xh.astype(np.float64)
    ref = np.maximum(x64 @ w1h, 0) @ w2h.astype(np.float64) + x64
    assert rel_err(bufs["y"].to_numpy(), ref) < 1e-5, f"seed {rng.seed_used}"


def test_single_kernel_block_refuses_what_it_cannot_hold(device):
    from rawgraph import ShapeError

    bufs = {k: DeviceBuffer(s).view() for k, s in {"x": (1, 36), "W1": (36, 36), "W2": (36, 36), "y": (1, 36)}.items()}
    ops.block(device, bufs, "x", "W1", "W2", "y")  # 36 fits
    bufs = {k: DeviceBuffer(s).view() for k, s in {"x": (1, 33), "W1": (33, 33), "W2": (33, 33), "y": (1, 33)}.items()}
    with pytest.raises(ShapeError, match="multiple of 4"):
        ops.block(device, bufs, "x", "W1", "W2", "y")


def test_matmul_unaligned_weights_use_scalar_loads(device, stream, rng):
    # W starting 4 bytes into an allocation: 16-byte loads would be misaligned.
    k, n = 64, 128
    wh = random_input(rng, (k, n))
    big = DeviceBuffer.from_numpy(np.concatenate([[1.0], wh.ravel()]).astype(np.float32))
    from rawgraph.runtime.memory import DeviceArray

    wview = DeviceArray(big.ptr + 4, (k, n), np.dtype(np.float32), big)
    xh = random_input(rng, (2, k))
    x, y = DeviceBuffer.from_numpy(xh), DeviceBuffer((2, n))
    launch = ops.matmul(device, {"x": x.view(), "W": wview, "y": y.view()}, "x", "W", "y")
    assert launch.kernel.name.split("<")[1].split(",")[1].strip() == "1"  # VEC == 1: scalar loads
    y.poison(stream)
    _run([launch], stream)
    assert rel_err(y.to_numpy(), xh.astype(np.float64) @ wh) < 1e-5


@pytest.mark.parametrize("n", [1, 33, 1000, 262144])
def test_relu_and_add(device, stream, rng, n):
    ah, bh = random_input(rng, (n,)), random_input(rng, (n,))
    a, b, y1, y2 = DeviceBuffer.from_numpy(ah), DeviceBuffer.from_numpy(bh), DeviceBuffer(n), DeviceBuffer(n)
    views = {"a": a.view(), "b": b.view(), "y1": y1.view(), "y2": y2.view()}
    y1.poison(stream)
    y2.poison(stream)
    _run([ops.relu(device, views, "a", "y1"), ops.add(device, views, "a", "b", "y2")], stream)
    np.testing.assert_array_equal(y1.to_numpy(), np.maximum(ah, 0))
    np.testing.assert_array_equal(y2.to_numpy(), ah + bh)  # one fp32 add: exact match with NumPy


def test_relu_lets_nan_through(device, stream):
    a = DeviceBuffer.from_numpy(np.array([np.nan, -1.0, 2.0], np.float32))
    y = DeviceBuffer(3)
    _run([ops.relu(device, {"a": a.view(), "y": y.view()}, "a", "y")], stream)
    out = y.to_numpy()
    assert np.isnan(out[0]) and out[1] == 0 and out[2] == 2


def test_fill_uniform_is_deterministic_and_in_range(device, stream):
    a, b, c = DeviceBuffer(100_000), DeviceBuffer(100_000), DeviceBuffer(100_000)
    _run(
        [
            ops.fill_uniform(device, a.view(), 7, 0.5),
            ops.fill_uniform(device, b.view(), 7, 0.5),
            ops.fill_uniform(device, c.view(), 8, 0.5),
        ],
        stream,
    )
    av, bv, cv = a.to_numpy(), b.to_numpy(), c.to_numpy()
    np.testing.assert_array_equal(av, bv)
    assert not np.array_equal(av, cv)
    assert av.min() >= -0.5 and av.max() < 0.5
    assert abs(av.mean()) < 0.01 and abs(av.var() - 0.25 / 3) < 0.005


def test_spin_waits_on_the_device_and_empty_does_not(device, stream):
    from rawgraph import Event

    for launch, low, high in ((ops.spin(device, 20_000_000), 19.5, 200.0), (ops.empty(device), 0.0, 1.0)):
        launch(stream)  # warm
        start, end = Event(), Event()
        start.record(stream)
        launch(stream)
        end.record(stream)
        end.synchronize()
        ms = start.elapsed_ms(end)
        assert low <= ms < high, f"{launch.label}: {ms:.3f} ms"
