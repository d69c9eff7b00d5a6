"""The fp32-accurate tensor-core GEMM (``kernels/tf32x3.cu``) through ``ops.matmul(precision="tf32x3")``
on the GPU: every cut form (no split, cluster splits, in-CTA slices, every warp tile, both
accumulation forms) and every cut the dispatcher serves at M = 8..256, K = N = 1024 / 2048 / 4096,
with every epilogue, against a float64 NumPy reference on fresh random inputs into NaN-poisoned
outputs, bit-identical run to run; row tables, pointer slots and misaligned y / r; its error no
worse than the fp32 kernels' on the same inputs at K >= 256 (normal data and rows scaled over six
orders of magnitude); a PDL chain of two."""

import numpy as np
import pytest
from helpers import random_input, rel_err, row_table_run

from rawgraph import DeviceBuffer, LaunchPlan, ops
from rawgraph.ops import Tf32x3Cut, tf32x3_shape
from rawgraph.runtime.memory import POISON_BITS, DeviceArray

pytestmark = pytest.mark.gpu
F32 = np.dtype(np.float32)
# Relative Frobenius error allowed against float64: ~10x what tf32x3 shows at these sizes (fp32's
# own error, 1e-7 .. 6e-7); without one correction product the error is ~5e-5, TF32 alone ~3e-4.
TOL = 5e-6

# (M, K, N, cut): tails in M, K (not a multiple of BK) and N (not of BN)
CUTS = [
    (33, 1000, 996, Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32, flush=2)),  # no split: epilogue from registers
    (70, 1004, 260, Tf32x3Cut(128, 128, 32, 4, wm=64, wn=32, flush=2)),  # the 128 x 128 tile
    (256, 512, 512, Tf32x3Cut(128, 128, 32, 4, split=2, wm=64, wn=32, flush=4)),  # whole tiles, runs of 4
    (37, 1000, 996, Tf32x3Cut(96, 128, 32, 4, split=3, wm=48, wn=32, flush=2)),  # cluster split of 3
    (100, 1000, 132, Tf32x3Cut(32, 128, 16, 3, split=8, wm=32, wn=64, flush=1)),  # split of 8, 32 x 64 warps
    (70, 1000, 196, Tf32x3Cut(64, 64, 16, 3, slices=2, wm=32, wn=32, flush=2)),  # in-CTA K slices
    (65, 520, 260, Tf32x3Cut(32, 64, 8, 2, slices=4, wm=16, wn=32, flush=1)),  # 4 slices, BK 8
    (33, 1000, 996, Tf32x3Cut(64, 128, 32, 3, split=2, slices=2, wm=32, wn=32)),  # split and slices
    (5, 36, 68, Tf32x3Cut(16, 64, 8, 2, split=8, wm=16, wn=32, flush=1)),  # empty K parts
    (1, 4, 4, Tf32x3Cut(16, 32, 8, 2, wm=16, wn=32, flush=1)),  # the smallest product
    (64, 1000, 996, Tf32x3Cut(64, 128, 32, 4, split=4, wm=32, wn=32, flush=0)),  # two accumulators
    (20, 1000, 260, Tf32x3Cut(32, 128, 16, 3, wm=16, wn=64, flush=2)),  # 16 x 64 warps
    (130, 1000, 260, Tf32x3Cut(64, 64, 16, 3, minb=2, wm=32, wn=32, flush=1)),  # MINB 2
]
_IDS = [f"m{m}-k{k}-n{n}-" + "-".join(map(str, vars(c).values())) for m, k, n, c in CUTS]

# every cut the dispatcher launches at the serving grid (table entries and the default rule), run
# on a product with tails in M, K and N
GRID = [(m, w) for w in (1024, 2048, 4096) for m in range(8, 257, 8)]
SERVED = sorted(
    {ops.tf32x3_cut(ops.matmul_shape(m, w, w, 132, precision="tf32x3")) for m, w in GRID},
    key=lambda c: tuple(vars(c).values()),
)


def _reference(xh, wh, rh, epilogue):
    ref = xh.astype(np.float64) @ wh.astype(np.float64)
    if epilogue == "relu":
        ref = np.maximum(ref, 0)
    if epilogue == "add":
        ref = ref + rh
    return ref


def _case(device, stream, xh, wh, rh, epilogue, shape, offset=0, indirect=False, runs=2):
    """y = epilogue(x @ W) with the cut ``shape``, y and r ``offset`` floats past a 16-byte
    boundary, x / y / r through pointer slots if ``indirect``; run ``runs`` times into a poisoned
    y. Returns the outputs of every run and the floats before y after the last."""
    m, n = xh.shape[0], wh.shape[1]
    x, w = DeviceBuffer.from_numpy(xh), DeviceBuffer.from_numpy(wh)
    rbuf = DeviceBuffer.from_numpy(np.concatenate([np.zeros(offset, F32), rh.ravel()]))
    ybuf = DeviceBuffer(m * n + offset)
    views = {
        "x": x.view(),
        "W": w.view(),
        "r": DeviceArray(rbuf.ptr + 4 * offset, (m, n), F32, rbuf),
        "y": DeviceArray(ybuf.ptr + 4 * offset, (m, n), F32, ybuf),
    }
    launch = ops.matmul(
        device, views, "x", "W", "y", epilogue, r="r" if epilogue == "add" else None, shape=shape, precision="tf32x3"
    )
    assert launch.kernel.name == ops.matmul_expr(epilogue, shape)
    assert launch.grid == shape.grid and launch.block == (shape.threads, 1, 1)
    assert launch.shared_mem == ops.gemm_smem_bytes(shape)
    slots = None
    if indirect:
        slots = DeviceBuffer.from_numpy(np.array([views[a].ptr for a in ("x", "y", "r")], np.uint64))
        for i, arg in enumerate(("x", "y", "r")):
            if arg in launch.uses:
                launch.args[arg] = slots.ptr + 8 * i
                launch.args["flags"] = int(launch.args["flags"]) | ops.INDIRECT_FLAGS[arg]
    outs = []
    for _ in range(runs):
        ybuf.poison(stream)
        launch(stream)
        stream.synchronize()
        got = ybuf.to_numpy()
        outs.append(got[offset:].reshape(m, n))
    before = got[:offset]
    for b in (x, w, rbuf, ybuf) + ((slots,) if slots is not None else ()):
        b.close()
    return outs, before


def _check(outs, ref, rng, tol=TOL):
    err = rel_err(outs[0], ref)
    assert err < tol, f"relative error {err:.2e}, seed {rng.seed_used}"
    for o in outs[1:]:
        assert np.array_equal(o.view(np.uint32), outs[0].view(np.uint32)), "not bit-identical run to run"


@pytest.fixture(scope="module")
def compiled_cuts():
    """Every hand-picked cut and epilogue in one NVRTC program."""
    from rawgraph import get_device
    from rawgraph.runtime.module import get_kernels

    get_kernels(
        "tf32x3",
        sorted({ops.matmul_expr(e, tf32x3_shape(m, k, n, c)) for m, k, n, c in CUTS for e in ops.EPILOGUES}),
        get_device(),
    )


@pytest.mark.parametrize("epilogue", ["none", "relu", "add"])
@pytest.mark.parametrize("m,k,n,cut", CUTS, ids=_IDS)
def test_tf32x3_cut_matches_float64(device, stream, rng, compiled_cuts, epilogue, m, k, n, cut):
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    outs, _ = _case(device, stream, xh, wh, rh, epilogue, tf32x3_shape(m, k, n, cut))
    ref = _reference(xh, wh, rh, epilogue)
    if not np.any(ref):  # a tiny relu product can be all zero
        assert not np.any(outs[0]) and np.all(np.isfinite(outs[0]))
        return
    _check(outs, ref, rng)


@pytest.mark.parametrize("epilogue", ["none", "relu", "add"])
@pytest.mark.parametrize("cut", SERVED, ids=lambda c: "-".join(map(str, vars(c).values())))
def test_served_cut_matches_float64(device, stream, rng, epilogue, cut):
    """Each cut ops.matmul launches at M = 8..256, K = N = 1024 / 2048 / 4096, on a product with
    tails (its row tile plus 6 rows, K = 1000, N = 996)."""
    m, k, n = cut.bm + 6, 1000, 996
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    outs, _ = _case(device, stream, xh, wh, rh, epilogue, tf32x3_shape(m, k, n, cut))
    _check(outs, _reference(xh, wh, rh, epilogue), rng)


@pytest.mark.parametrize("indirect", [False, True])
@pytest.mark.parametrize("m,k,n,cut", [CUTS[i] for i in (0, 3, 7, 8, 10)], ids=[_IDS[i] for i in (0, 3, 7, 8, 10)])
def test_tf32x3_misaligned_y_r_and_pointer_slots(device, stream, rng, compiled_cuts, indirect, m, k, n, cut):
    """y and r one float past 16-byte alignment (the epilogue's scalar stores), optionally read
    through pointer slots; the float before y keeps its poison."""
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    for offset in (1, 0) if indirect else (1,):
        outs, before = _case(device, stream, xh, wh, rh, "add", tf32x3_shape(m, k, n, cut), offset, indirect)
        _check(outs, _reference(xh, wh, rh, "add"), rng)
        assert np.all(before.view(np.uint32) == POISON_BITS), "wrote before y"


@pytest.mark.parametrize(
    "m,k,cut",
    [
        (37, 264, Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32, flush=2)),
        (70, 264, Tf32x3Cut(32, 128, 8, 3, split=3, slices=2, wm=32, wn=32, flush=1)),
        (5, 1000, Tf32x3Cut(16, 64, 16, 3, split=2, slices=2, wm=16, wn=32, flush=2)),
        (100, 264, Tf32x3Cut(128, 128, 32, 4, split=2, wm=64, wn=32, flush=2)),
    ],
)
def test_tf32x3_row_tables(device, stream, rng, m, k, cut):
    """Row m of x, r and y is row table[m] of a larger state (the slot pool's fused gather and
    scatter); every other row of y keeps its poison; two runs agree bit for bit."""
    run = row_table_run(device, stream, rng, m, k, shape=tf32x3_shape(m, k, k, cut), precision="tf32x3")
    assert run.routes
    _check([o[run.table] for o in run.outs], run.ref, rng)
    assert np.all(run.outs[0][run.rest].view(np.uint32) == POISON_BITS), "rows outside the table were written"


def _product_err(device, stream, xh, wh, precision):
    """Relative Frobenius error against float64 of ops.matmul's automatic cut at ``precision``,
    and the kernel it ran."""
    m, k = xh.shape
    n = wh.shape[1]
    bufs = {"x": DeviceBuffer.from_numpy(xh), "W": DeviceBuffer.from_numpy(wh), "y": DeviceBuffer((m, n))}
    launch = ops.matmul(device, {key: b.view() for key, b in bufs.items()}, "x", "W", "y", precision=precision)
    bufs["y"].poison(stream)
    launch(stream)
    stream.synchronize()
    err = rel_err(bufs["y"].to_numpy(), xh.astype(np.float64) @ wh.astype(np.float64))
    for b in bufs.values():
        b.close()
    return err, launch.kernel.name


def _cublas_fp32_err(xh, wh):
    """cuBLAS's fp32 SGEMM (``torch.mm`` with TF32 off) on the same inputs: its relative error."""
    torch = pytest.importorskip("torch", reason="the accuracy gate compares with cuBLAS fp32 through torch.mm")
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        y = (torch.from_numpy(xh).cuda() @ torch.from_numpy(wh).cuda()).cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return rel_err(y, xh.astype(np.float64) @ wh.astype(np.float64))


@pytest.mark.parametrize("data", ["normal", "scaled-rows"])
@pytest.mark.parametrize("m,width", [(64, 256), (128, 1024), (72, 2048), (200, 2048), (72, 4096)])
def test_error_no_worse_than_cublas_fp32(device, stream, rng, data, m, width):
    """The gate of precision="tf32x3": on the same inputs, its error against float64 is no worse
    than cuBLAS's fp32 SGEMM's (TF32 off), at K >= 256; with rows of x scaled by 10^u, u uniform
    in [-3, 3], as well. The fp32 kernel ops.matmul chooses is reported beside them (a split-K
    kernel sums shorter runs and can beat both at small K)."""
    xh = random_input(rng, (m, width))
    if data == "scaled-rows":
        xh = (xh * 10.0 ** rng.uniform(-3, 3, size=(m, 1))).astype(np.float32)
    lim = np.float32(np.sqrt(3.0 / width))
    wh = rng.uniform(-lim, lim, size=(width, width)).astype(np.float32)
    err_tx, name_tx = _product_err(device, stream, xh, wh, "tf32x3")
    err_fp32, name_fp32 = _product_err(device, stream, xh, wh, "fp32")
    err_cublas = _cublas_fp32_err(xh, wh)
    assert name_tx.startswith("tf32x3_") and not name_fp32.startswith("tf32x3_")
    assert err_tx <= err_cublas, (
        f"{name_tx}: {err_tx:.3e} against cuBLAS fp32 {err_cublas:.3e} ({name_fp32}: {err_fp32:.3e}), "
        f"seed {rng.seed_used}"
    )


def test_pdl_chain_of_two(device, stream, rng):
    """A writer of x, then two tf32x3 matmuls (h = x @ W1, y = h @ W2) as programmatic dependent
    launches: each may start early (its W prefetch) but reads its input only once the kernel before
    it is done (poisoned x or h would show as NaN)."""
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
    launches = [
        ops.add(device, views, "xsrc", "zero", "x"),
        ops.matmul(device, views, "x", "W1", "h", precision="tf32x3"),
        ops.matmul(device, views, "h", "W2", "y", precision="tf32x3"),
    ]
    assert all(l.kernel.name.startswith("tf32x3_") for l in launches[1:])
    assert launches[1].args["flags"] == ops.FLAG_EARLY  # 4 MB of W: successor launched at the start
    plan = LaunchPlan(launches, views, pdl=True)
    plan.run(stream)
    stream.synchronize()
    assert launches[1].pdl and launches[2].pdl
    h64 = xh.astype(np.float64) @ w1h
    assert rel_err(bufs["h"].to_numpy(), h64) < TOL, f"seed {rng.seed_used}"
    # y from the float32 h the kernel wrote (what the second matmul read), in float64
    assert rel_err(bufs["y"].to_numpy(), bufs["h"].to_numpy().astype(np.float64) @ w2h) < TOL, f"seed {rng.seed_used}"
    for b in bufs.values():
        b.close()
