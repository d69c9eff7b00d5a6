"""The warpgroup form of tf32x3 (``kernels/tf32x3_wgmma.cu``, compute capability 9.0 only) on the GPU,
through ``ops.matmul``, mostly with an explicit :class:`WgmmaCut` shape: every form (one and two
warpgroups, column tiles 32..128, cluster splits, runs of 1..4 k8 steps) and every cut the default
rule gives on the serving grid, with every epilogue, against a float64 NumPy reference on fresh
random inputs into NaN-poisoned outputs, bit-identical run to run; pointer slots, misaligned y / r
and row tables; its error no worse than the mma.sync kernel's (and cuBLAS fp32's, where torch is
installed) on the same inputs at M = 64, 128, 256 x K = N = 1024, 4096; the table cut
``ops.matmul`` launches at precision="tf32x3"; a PDL chain of two.
A failure names the rng seed (``RAWGRAPH_TEST_SEED`` replays it)."""

import numpy as np
import pytest
from helpers import random_input, rel_err, row_table_run
from test_tf32x3_gpu import TOL, _case, _check, _cublas_fp32_err, _reference

from rawgraph import DeviceBuffer, LaunchPlan, ops
from rawgraph.ops import WgmmaCut, tf32x3_wgmma_default_cut, tf32x3_wgmma_shape
from rawgraph.runtime.memory import POISON_BITS

pytestmark = pytest.mark.gpu
F32 = np.dtype(np.float32)

# (M, K, N, cut): tails in M, K (not a multiple of BK) and N (not of BN)
CUTS = [
    (33, 1000, 996, WgmmaCut(64, 64, 16, 3, flush=2)),  # one warpgroup, no split: epilogue from registers
    (70, 1004, 260, WgmmaCut(128, 128, 32, 4, flush=2)),  # two warpgroups, the 128 x 128 tile
    (256, 512, 512, WgmmaCut(128, 128, 32, 4, split=2, flush=4)),  # whole tiles, runs of 4
    (37, 1000, 996, WgmmaCut(64, 96, 32, 4, split=3, flush=2)),  # cluster split of 3, BN 96
    (100, 1000, 132, WgmmaCut(128, 32, 16, 3, split=8, flush=1)),  # split of 8, BN 32
    (65, 520, 260, WgmmaCut(64, 64, 8, 3, flush=1)),  # BK 8: one k8 step a stage
    (130, 1000, 260, WgmmaCut(128, 64, 64, 3, flush=2)),  # BK 64
    (5, 36, 68, WgmmaCut(64, 32, 8, 3, split=8, flush=1)),  # empty K parts
    (1, 4, 4, WgmmaCut(64, 32, 8, 3, flush=1)),  # the smallest product
    # the two-run form (runs=2: wait_group 1, a second run accumulator, three split buffers)
    (33, 1000, 996, WgmmaCut(64, 64, 32, 3, flush=2, runs=2)),
    (70, 1004, 260, WgmmaCut(128, 96, 32, 3, flush=2, runs=2)),
    (256, 512, 512, WgmmaCut(64, 64, 64, 3, flush=4, runs=2)),  # BK 64: one warpgroup (two need 251,904 B)
    (37, 1000, 996, WgmmaCut(64, 96, 32, 4, flush=2, runs=2)),
    (100, 1000, 132, WgmmaCut(128, 32, 32, 3, flush=2, runs=2)),
    (130, 1000, 260, WgmmaCut(64, 64, 64, 3, flush=2, runs=2)),
    (5, 36, 68, WgmmaCut(64, 32, 32, 3, flush=2, runs=2)),
    (1, 4, 4, WgmmaCut(64, 32, 32, 3, flush=2, runs=2)),
]
_IDS = [f"m{m}-k{k}-n{n}-" + "-".join(map(str, vars(c).values())) for m, k, n, c in CUTS]
GRID = [(m, w) for w in (1024, 2048, 4096) for m in range(64, 257, 8)]
SERVED = sorted(
    {tf32x3_wgmma_default_cut(m, w, w, 132, True, 232448, runs) for m, w in GRID for runs in (1, 2)},
    key=lambda c: tuple(vars(c).values()),
)


@pytest.fixture(scope="module", autouse=True)
def wgmma_device():
    """Skip the module off compute capability 9.0; compile every hand-picked cut in one program."""
    from rawgraph import get_device
    from rawgraph.runtime.module import get_kernels

    dev = get_device()
    if not ops.wgmma_available(dev):
        pytest.skip(f"wgmma needs compute capability 9.0, this device is {dev.info.compute_capability}")
    get_kernels(
        "tf32x3_wgmma",
        sorted({ops.matmul_expr(e, tf32x3_wgmma_shape(m, k, n, c)) for m, k, n, c in CUTS for e in ops.EPILOGUES}),
        dev,
    )


@pytest.mark.parametrize("epilogue", ["none", "relu", "add"])
@pytest.mark.parametrize("m,k,n,cut", CUTS, ids=_IDS)
def test_wgmma_cut_matches_float64(device, stream, rng, epilogue, m, k, n, cut):
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    outs, _ = _case(device, stream, xh, wh, rh, epilogue, tf32x3_wgmma_shape(m, k, n, cut), runs=3)
    ref = _reference(xh, wh, rh, epilogue)
    if not np.any(ref):  # a tiny relu product can be all zero
        assert not np.any(outs[0]) and np.all(np.isfinite(outs[0]))
        return
    _check(outs, ref, rng)


@pytest.mark.parametrize("epilogue", ["none", "relu", "add"])
@pytest.mark.parametrize("cut", SERVED, ids=lambda c: "-".join(map(str, vars(c).values())))
def test_default_rule_cut_matches_float64(device, stream, rng, epilogue, cut):
    m, k, n = cut.bm + 3, 1000, 2 * cut.bn + 4
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    outs, _ = _case(device, stream, xh, wh, rh, epilogue, tf32x3_wgmma_shape(m, k, n, cut))
    _check(outs, _reference(xh, wh, rh, epilogue), rng)


@pytest.mark.parametrize("indirect", [False, True])
@pytest.mark.parametrize("m,k,n,cut", [CUTS[i] for i in (0, 3, 7)], ids=[_IDS[i] for i in (0, 3, 7)])
def test_wgmma_misaligned_y_r_and_pointer_slots(device, stream, rng, indirect, m, k, n, cut):
    """y and r one float past a 16-byte boundary (the epilogue's scalar stores), x / y / r through
    pointer slots; the float before y keeps its poison."""
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    outs, before = _case(
        device, stream, xh, wh, rh, "add", tf32x3_wgmma_shape(m, k, n, cut), offset=1, indirect=indirect
    )
    _check(outs, _reference(xh, wh, rh, "add"), rng)
    assert np.all(before.view(np.uint32) == POISON_BITS)


@pytest.mark.parametrize(
    "m,k,cut", [(37, 264, WgmmaCut(64, 64, 16, 3, flush=2)), (100, 264, WgmmaCut(128, 128, 32, 4, split=2, flush=2))]
)
def test_wgmma_row_tables(device, stream, rng, m, k, cut):
    """Row m of x, r and y is row table[m] of a larger state; every other row of y keeps its poison."""
    run = row_table_run(device, stream, rng, m, k, shape=tf32x3_wgmma_shape(m, k, k, cut), precision="tf32x3")
    assert run.routes
    _check([o[run.table] for o in run.outs], run.ref, rng)
    assert np.all(run.outs[0][run.rest].view(np.uint32) == POISON_BITS), "rows outside the table were written"


@pytest.mark.parametrize(
    "m,k,n,cut", [c for c in CUTS if c[3].runs == 2], ids=[i for i, c in zip(_IDS, CUTS) if c[3].runs == 2]
)
def test_two_runs_give_the_bits_of_one_run(device, stream, rng, m, k, n, cut):
    """runs=2 adds the same runs into the fp32 sums in the same order as runs=1: the same bits."""
    from dataclasses import replace

    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    two, _ = _case(device, stream, xh, wh, rh, "add", tf32x3_wgmma_shape(m, k, n, cut))
    one, _ = _case(device, stream, xh, wh, rh, "add", tf32x3_wgmma_shape(m, k, n, replace(cut, runs=1)))
    assert np.array_equal(two[0].view(np.uint32), one[0].view(np.uint32)), f"seed {rng.seed_used}"


def _err(device, stream, xh, wh, shape):
    """Relative Frobenius error against float64 of the product with the cut ``shape``."""
    m, k = xh.shape
    n = wh.shape[1]
    bufs = {"x": DeviceBuffer.from_numpy(xh), "W": DeviceBuffer.from_numpy(wh), "y": DeviceBuffer((m, n))}
    launch = ops.matmul(
        device, {key: b.view() for key, b in bufs.items()}, "x", "W", "y", shape=shape, precision="tf32x3"
    )
    bufs["y"].poison(stream)
    launch(stream)
    stream.synchronize()
    err = rel_err(bufs["y"].to_numpy(), xh.astype(np.float64) @ wh.astype(np.float64))
    for b in bufs.values():
        b.close()
    return err, launch.kernel.name


@pytest.mark.parametrize("data", ["normal", "scaled-rows"])
@pytest.mark.parametrize("m", [64, 128, 256])
@pytest.mark.parametrize("width", [1024, 4096])
def test_error_no_worse_than_the_mma_sync_kernel(device, stream, rng, data, m, width):
    """On the same inputs, the wgmma kernel's error (its default-rule cut, one run in flight)
    against float64 is no worse than the mma.sync kernel's (what ops.matmul runs at
    precision="tf32x3"), with 5 % for the two kernels' different K parts, and no worse than cuBLAS
    fp32's where torch is installed. The two-run form is not held to this: it has no cluster split,
    so each output sums all of K in one fp32 chain (test_the_two_run_form_without_a_split_is_less_accurate_than_the_split_one)."""
    runs = 1
    xh = random_input(rng, (m, width))
    if data == "scaled-rows":
        xh = (xh * 10.0 ** rng.uniform(-3, 3, size=(m, 1))).astype(np.float32)
    lim = np.float32(np.sqrt(3.0 / width))
    wh = rng.uniform(-lim, lim, size=(width, width)).astype(np.float32)
    sms = device.info.multiprocessors
    optin = device.info.smem_per_block_optin
    wg_cut = tf32x3_wgmma_default_cut(m, width, width, sms, True, optin, runs)
    err_wg, name_wg = _err(device, stream, xh, wh, tf32x3_wgmma_shape(m, width, width, wg_cut))
    mma = ops.matmul_shape(m, width, width, sms, clusters=True, smem_limit=optin, precision="tf32x3")
    err_mma, name_mma = _err(device, stream, xh, wh, mma)
    assert name_wg.startswith("tf32x3_wgmma_") and name_mma.startswith("tf32x3_")
    msg = f"{name_wg}: {err_wg:.3e}, {name_mma}: {err_mma:.3e}, seed {rng.seed_used}"
    assert err_wg <= 1.05 * err_mma, msg
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    err_cublas = _cublas_fp32_err(xh, wh)
    assert err_wg <= err_cublas, f"{msg}, cuBLAS fp32 {err_cublas:.3e}"


@pytest.mark.parametrize("m", [64, 256])
@pytest.mark.parametrize("width", [1024, 4096])
def test_the_two_run_form_without_a_split_is_less_accurate_than_the_split_one(device, stream, rng, m, width):
    """The two-run default cut (no cluster split: one fp32 chain over all of K) has a larger error
    against float64 than the one-run default cut of the same product (a cluster split of K, shorter
    chains): the reason no rule picks the two-run form where the gate applies. Both stay within
    the test tolerance."""
    xh = random_input(rng, (m, width))
    lim = np.float32(np.sqrt(3.0 / width))
    wh = rng.uniform(-lim, lim, size=(width, width)).astype(np.float32)
    sms, optin = device.info.multiprocessors, device.info.smem_per_block_optin
    one = tf32x3_wgmma_default_cut(m, width, width, sms, True, optin, 1)
    two = tf32x3_wgmma_default_cut(m, width, width, sms, True, optin, 2)
    assert one.split > 1 and two.split == 1 and two.runs == 2
    err_one, _ = _err(device, stream, xh, wh, tf32x3_wgmma_shape(m, width, width, one))
    err_two, _ = _err(device, stream, xh, wh, tf32x3_wgmma_shape(m, width, width, two))
    msg = f"one run {one}: {err_one:.3e}, two runs {two}: {err_two:.3e}, seed {rng.seed_used}"
    assert err_one < err_two < TOL, msg


@pytest.mark.parametrize("m,width", [(64, 1024), (57, 1024), (128, 1024), (250, 2048), (256, 4096)])
def test_precision_tf32x3_launches_the_table_cut_and_matches_float64(device, stream, rng, m, width):
    """On compute capability 9.0, ``ops.matmul(precision="tf32x3")`` with no shape launches the
    ``TF32X3_WGMMA_CUTS`` entry of the product (rows rounded up to the table's row step); its
    output with the residual epilogue matches float64, the same bits run to run."""
    step = ops.TF32X3_ROW_STEP
    cut = ops.TF32X3_WGMMA_CUTS[(-(-m // step) * step, width, width)]
    shape = tf32x3_wgmma_shape(m, width, width, cut)
    xh, wh, rh = random_input(rng, (m, width)), random_input(rng, (width, width)), random_input(rng, (m, width))
    bufs = {"x": DeviceBuffer.from_numpy(xh), "W": DeviceBuffer.from_numpy(wh), "r": DeviceBuffer.from_numpy(rh)}
    bufs["y"] = DeviceBuffer((m, width))
    launch = ops.matmul(
        device, {key: b.view() for key, b in bufs.items()}, "x", "W", "y", "add", r="r", precision="tf32x3"
    )
    assert launch.kernel.name == ops.matmul_expr("add", shape) and launch.grid == shape.grid
    for b in bufs.values():
        b.close()
    outs, _ = _case(device, stream, xh, wh, rh, "add", shape, runs=2)
    _check(outs, _reference(xh, wh, rh, "add"), rng)


def test_wgmma_pdl_chain_of_two(device, stream, rng):
    """A writer of x, then two wgmma matmuls (h = x @ W1, y = h @ W2) as programmatic dependent
    launches: poisoned x or h read too early would show as NaN."""
    m, k = 72, 1024
    xh, w1h, w2h = random_input(rng, (m, k)), random_input(rng, (k, k)), random_input(rng, (k, k))
    bufs = {
        "xsrc": DeviceBuffer.from_numpy(xh),
        "zero": DeviceBuffer.from_numpy(np.zeros_like(xh)),
        "x": DeviceBuffer((m, k)),
        "W1": DeviceBuffer.from_numpy(w1h),
        "W2": DeviceBuffer.from_numpy(w2h),
        "h": DeviceBuffer((m, k)),
        "y": DeviceBuffer((m, k)),
    }
    views = {key: b.view() for key, b in bufs.items()}
    for key in ("x", "h", "y"):
        bufs[key].poison(stream)
    shape = tf32x3_wgmma_shape(m, k, k, WgmmaCut(128, 64, 32, 4, split=4, flush=2))
    launches = [
        ops.add(device, views, "xsrc", "zero", "x"),
        ops.matmul(device, views, "x", "W1", "h", shape=shape, precision="tf32x3"),
        ops.matmul(device, views, "h", "W2", "y", shape=shape, precision="tf32x3"),
    ]
    assert launches[1].args["flags"] == ops.FLAG_EARLY  # 4 MB of W: successor launched at the start
    plan = LaunchPlan(launches, views, pdl=True)
    plan.run(stream)
    stream.synchronize()
    assert launches[1].pdl and launches[2].pdl
    assert rel_err(bufs["h"].to_numpy(), xh.astype(np.float64) @ w1h) < TOL, f"seed {rng.seed_used}"
    assert rel_err(bufs["y"].to_numpy(), bufs["h"].to_numpy().astype(np.float64) @ w2h) < TOL, f"seed {rng.seed_used}"
    for b in bufs.values():
        b.close()
