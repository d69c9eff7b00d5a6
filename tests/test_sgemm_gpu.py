"""Issue 23's fp32 GEMM (``kernels/sgemm.cu``) through ``ops.matmul`` on the GPU: every cut kind and
epilogue, row tables, pointer slots and misaligned y / r against a float64 NumPy reference on
fresh random inputs into poisoned outputs, bit-identical run to run; a PDL launch after a writer
of x; and a TinyBlock plan whose matmuls come from a (monkeypatched) ``SGEMM_CUTS`` entry."""

from dataclasses import astuple

import numpy as np
import pytest
from helpers import random_input, rel_err, row_table_run

from rawgraph import DeviceBuffer, LaunchPlan, TinyBlock, capture_plan, ops
from rawgraph.ops import SgemmCut, gemm, sgemm_shape
from rawgraph.runtime.memory import POISON_BITS, DeviceArray

pytestmark = pytest.mark.gpu
F32 = np.dtype(np.float32)

# (M, K, N, cut), tails in M, K (not a multiple of BK) and N (not of BN)
CUTS = [
    (33, 1000, 996, SgemmCut(64, 64, 16, 3)),  # no split: epilogue from registers
    (70, 1004, 260, SgemmCut(128, 128, 8, 2, minb=2)),  # MINB 2 (128 registers)
    (256, 512, 512, SgemmCut(128, 128, 16, 4)),  # whole tiles
    (37, 1000, 996, SgemmCut(64, 128, 8, 4, split=3)),  # cluster split of 3 (not a power of two)
    (100, 1000, 132, SgemmCut(32, 128, 16, 3, split=8)),  # cluster split of 8: 4 rows per rank
    (70, 1000, 196, SgemmCut(32, 128, 16, 3, slices=2)),  # in-CTA K slices
    (65, 520, 260, SgemmCut(64, 64, 32, 2, slices=4)),  # 4 slices, 136 KB of shared memory
    (33, 1000, 996, SgemmCut(64, 128, 16, 3, split=2, slices=2)),  # split and slices
    (5, 36, 68, SgemmCut(32, 64, 8, 2, split=8)),  # K shorter than the parts: empty K parts
    (1, 4, 4, SgemmCut(32, 64, 4, 2)),  # the smallest product
    (40, 1000, 996, SgemmCut(64, 64, 8, 5, split=8, tm=4)),  # 4 x 8 outputs per thread, cluster split of 8
    (70, 1004, 260, SgemmCut(16, 128, 16, 3, slices=2, minb=2, tm=4)),  # TM 4: K slices, MINB 2, epilogue from partials
    (33, 1000, 196, SgemmCut(48, 64, 16, 4, tm=4)),  # TM 4, no split: epilogue from registers
]
_IDS = [f"m{m}-k{k}-n{n}-" + "-".join(map(str, astuple(c)[:7] if c.tm == 8 else astuple(c))) for m, k, n, c in CUTS]


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
    y. Returns the outputs of every run and the float before y after the last."""
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
    launch = ops.matmul(device, views, "x", "W", "y", epilogue, r="r" if epilogue == "add" else None, shape=shape)
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


def _check(outs, ref, rng):
    assert rel_err(outs[0], ref) < 1e-5, f"seed {rng.seed_used}"
    for o in outs[1:]:
        assert np.array_equal(o.view(np.uint32), outs[0].view(np.uint32)), "not bit-identical run to run"


@pytest.fixture(scope="module")
def compiled_cuts():
    """Every cut and epilogue in one NVRTC program."""
    from rawgraph import get_device
    from rawgraph.runtime.module import get_kernels

    get_kernels(
        "sgemm",
        sorted({ops.matmul_expr(e, sgemm_shape(m, k, n, c)) for m, k, n, c in CUTS for e in ops.EPILOGUES}),
        get_device(),
    )


@pytest.mark.parametrize("epilogue", ["none", "relu", "add"])
@pytest.mark.parametrize("m,k,n,cut", CUTS, ids=_IDS)
def test_sgemm_cut_matches_float64(device, stream, rng, compiled_cuts, epilogue, m, k, n, cut):
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    outs, _ = _case(device, stream, xh, wh, rh, epilogue, sgemm_shape(m, k, n, cut))
    ref = _reference(xh, wh, rh, epilogue)
    if not np.any(ref):  # a tiny relu product can be all zero
        assert not np.any(outs[0]) and np.all(np.isfinite(outs[0]))
        return
    _check(outs, ref, rng)


@pytest.mark.parametrize("indirect", [False, True])
@pytest.mark.parametrize(
    "m,k,n,cut", [CUTS[i] for i in (0, 3, 7, 8, 10, 12)], ids=[_IDS[i] for i in (0, 3, 7, 8, 10, 12)]
)
def test_sgemm_misaligned_y_r_and_pointer_slots(device, stream, rng, compiled_cuts, indirect, m, k, n, cut):
    """y and r one float past 16-byte alignment (the epilogue's scalar stores), optionally read
    through pointer slots; the float before y keeps its poison."""
    xh, wh, rh = random_input(rng, (m, k)), random_input(rng, (k, n)), random_input(rng, (m, n))
    for offset in (1, 0) if indirect else (1,):
        outs, before = _case(device, stream, xh, wh, rh, "add", sgemm_shape(m, k, n, cut), offset, indirect)
        _check(outs, _reference(xh, wh, rh, "add"), rng)
        assert np.all(before.view(np.uint32) == POISON_BITS), "wrote before y"


@pytest.mark.parametrize(
    "m,k,cut",
    [
        (37, 264, SgemmCut(64, 64, 16, 3)),
        (70, 264, SgemmCut(32, 128, 8, 3, split=3, slices=2)),
        (5, 1000, SgemmCut(32, 64, 16, 3, split=2, slices=2)),
        (37, 264, SgemmCut(32, 64, 8, 3, split=3, tm=4)),
    ],
)
def test_sgemm_row_tables(device, stream, rng, m, k, cut):
    """Row m of x, r and y is row table[m] of a larger state (the slot pool's fused gather and
    scatter); every other row of y keeps its poison; two runs agree bit for bit."""
    run = row_table_run(device, stream, rng, m, k, shape=sgemm_shape(m, k, k, cut))
    assert run.routes
    _check([o[run.table] for o in run.outs], run.ref, rng)
    assert np.all(run.outs[0][run.rest].view(np.uint32) == POISON_BITS), "rows outside the table were written"


@pytest.mark.parametrize("m,k,n,cut", [CUTS[i] for i in (0, 4, 7, 10)], ids=[_IDS[i] for i in (0, 4, 7, 10)])
def test_sgemm_after_a_writer_with_pdl(device, stream, rng, compiled_cuts, m, k, n, cut):
    """A PDL launch after the kernel that writes its x: it may start early (its W prefetch), but
    reads x only once that kernel is done (poisoned x would show as NaN)."""
    xh, wh = random_input(rng, (m, k)), random_input(rng, (k, n))
    bufs = {
        "xsrc": DeviceBuffer.from_numpy(xh),
        "zero": DeviceBuffer.from_numpy(np.zeros_like(xh)),
        "x": DeviceBuffer((m, k)),
        "W": DeviceBuffer.from_numpy(wh),
        "y": DeviceBuffer((m, n)),
    }
    views = {key: b.view() for key, b in bufs.items()}
    bufs["x"].poison(stream)
    bufs["y"].poison(stream)
    launches = [
        ops.add(device, views, "xsrc", "zero", "x"),
        ops.matmul(device, views, "x", "W", "y", shape=sgemm_shape(m, k, n, cut)),
    ]
    plan = LaunchPlan(launches, views, pdl=True)
    plan.run(stream)
    stream.synchronize()
    assert launches[-1].pdl
    assert rel_err(bufs["y"].to_numpy(), xh.astype(np.float64) @ wh) < 1e-5, f"seed {rng.seed_used}"
    for b in bufs.values():
        b.close()


@pytest.mark.parametrize("form", ["unfused", "fused"])
@pytest.mark.parametrize(
    "width,batch,cut",
    [
        (256, 72, SgemmCut(32, 64, 16, 3, split=2)),
        (1024, 64, SgemmCut(64, 128, 16, 4, split=2, slices=2)),
        (1024, 104, SgemmCut(64, 128, 8, 3, split=6, slices=2, tm=4)),
    ],
)
def test_tinyblock_with_a_table_cut_matches_float64(monkeypatch, stream, rng, form, width, batch, cut):
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {(batch, width, width): cut})
    # fp32: the table's cut is what this is about ("auto" runs tf32x3 at some of these shapes)
    model = TinyBlock(width, batch, 2, seed=int(rng.integers(1 << 30)), form=form, precision="fp32")
    xh = random_input(rng, (batch, width))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((batch, width))
    plan = model.plan(x, out)
    names = [l.kernel.name for l in plan.launches]
    assert sum(n.startswith("sgemm_split_kernel<") for n in names) == 4, names
    ref = model.reference(xh)
    out.poison(stream)
    model.forward(x, out, stream)
    stream.synchronize()
    assert rel_err(out.to_numpy(), ref) < 1e-5, f"seed {rng.seed_used}"
    eager = out.to_numpy()
    exe = capture_plan(plan, stream).instantiate()  # the same plan as a graph: the same sums, bit for bit
    out.poison(stream)
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), eager)
    exe.close()
    for b in (x, out):
        b.close()
    model.close()
