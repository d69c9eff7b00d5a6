"""Issue 23's fp32 GEMM (``kernels/sgemm.cu``) in the launch builder, without a GPU: the ``"sgemm"``
cut of :class:`MatmulShape` (expression, grid, threads, shared memory, as ``benchmarks/gemm_sweep.py``
computes them), the refusals of hand-picked cuts, the ``SGEMM_CUTS`` table in ``matmul_shape``,
NVRTC compiles of every cut kind, and launches and TinyBlock plans built on the fake driver."""

from __future__ import annotations

import pytest

from rawgraph import LayoutError, ShapeError, as_device_array, ops
from rawgraph.ops import gemm
from rawgraph.ops.gemm import (
    SGEMM_CUTS,
    SGEMM_TABLE,
    SGEMM_TABLE_COLUMNS,
    MatmulShape,
    SgemmCut,
    _check_shape,
    format_sgemm_table,
    gemm_smem_bytes,
    matmul_expr,
    matmul_file,
    matmul_shape,
    parse_sgemm_table,
    sgemm_cut,
    sgemm_fits,
    sgemm_shape,
    sgemm_smem_bytes,
)
from rawgraph.runtime.compiler import compile_source
from rawgraph.runtime.module import kernel_source

OPTIN = 232448  # H100 / H200: most dynamic shared memory one CTA may ask for


class FakeCAI:
    def __init__(self, shape, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


def _arr(shape, ptr=0x7F0000000000):
    return as_device_array(FakeCAI(shape, ptr))


@pytest.fixture(scope="module")
def sweep():
    """benchmarks/gemm_sweep.py as a module (registered while it runs: its dataclasses need it)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gemm_sweep.py"
    name = "rawgraph_bench_gemm_sweep"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    return mod


# (M, K, N, cut): every kind -- no split, cluster split (also not a
# power of two), in-CTA slices, both, MINB 2 -- with tails in M, K and N.
CUTS = [
    (256, 4096, 4096, SgemmCut(128, 128, 16, 4)),
    (64, 4096, 4096, SgemmCut(64, 128, 8, 4, split=3)),
    (72, 1024, 1024, SgemmCut(32, 128, 16, 3, slices=4)),
    (100, 1000, 996, SgemmCut(64, 64, 32, 2, split=2, slices=2)),
    (33, 1000, 260, SgemmCut(128, 128, 8, 3, minb=2)),
    (5, 36, 68, SgemmCut(32, 64, 8, 2, split=8)),
    (104, 1024, 1024, SgemmCut(64, 128, 8, 3, split=6, slices=2, tm=4)),  # 4 x 8 outputs per thread
    (40, 1000, 260, SgemmCut(16, 64, 16, 3, slices=2, minb=2, tm=4)),
]


@pytest.mark.parametrize("m,k,n,cut", CUTS)
def test_sgemm_shape_matches_the_sweep(sweep, m, k, n, cut):
    """Expression, grid, threads and shared memory are the sweep's own (its Cut class), so a cut it
    timed is launched here exactly as it was timed."""
    shape = sgemm_shape(m, k, n, cut)
    ref = sweep.Cut.of(cut)
    assert shape.kernel == "sgemm" and matmul_file(shape) == "sgemm"
    assert (shape.bm, shape.bn, shape.bk, shape.stages, shape.split, shape.slices, shape.minb, shape.tm) == (
        cut.bm,
        cut.bn,
        cut.bk,
        cut.stages,
        cut.split,
        cut.slices,
        cut.minb,
        cut.tm,
    )
    assert sgemm_cut(shape) == cut and ref.record == cut
    assert shape.per_sm == 0 and shape.vec == 4
    for epi in ("none", "relu", "add"):
        assert matmul_expr(epi, shape) == ref.expr(epi)
    assert sweep._parse_cut(matmul_expr("none", shape)) == ref
    assert shape.grid == ref.grid(m, n) == (-(-n // cut.bn), cut.split, -(-m // cut.bm))
    assert shape.threads == ref.threads == cut.threads == cut.slices * (cut.bm // cut.tm) * (cut.bn // 8)
    assert (
        gemm_smem_bytes(shape)
        == sgemm_smem_bytes(cut.bm, cut.bn, cut.bk, cut.stages, cut.split, cut.slices)
        == ref.smem
    )
    assert shape.ctas == shape.grid[0] * shape.grid[1] * shape.grid[2]


def test_sgemm_numbers_by_hand():
    s = sgemm_shape(64, 4096, 4096, SgemmCut(64, 128, 16, 4, split=2, slices=2))
    assert matmul_expr("relu", s) == "sgemm_split_kernel<1, 64, 128, 16, 4, 2, 2, 1>"
    assert s.grid == (32, 2, 1) and s.threads == 256
    # max(2 slices x 4 stages x (64 x 20 + 16 x 128), 2 slices x 64 x 132 partials) floats
    assert gemm_smem_bytes(s) == 4 * max(2 * 4 * (64 * 20 + 16 * 128), 2 * 64 * 132) == 106496
    one = sgemm_shape(70, 1024, 1000, SgemmCut(128, 128, 8, 3))
    assert matmul_expr("add", one) == "sgemm_kernel<2, 128, 128, 8, 3, 1, 1>"
    assert one.grid == (8, 1, 1) and one.threads == 256
    assert gemm_smem_bytes(one) == 4 * 3 * (128 * 12 + 8 * 128)  # no partials without a K cut
    # the other kernels' expressions and shared memory are unchanged by the new fields
    g = ops.gemm_shape(64, 4096, 4096, 132, True)
    assert (g.bk, g.stages, g.minb) == (0, 0, 0) and matmul_file(g) == "matmul"
    assert matmul_expr("none", g).startswith("gemm_") and g.threads == 256 * g.slices
    # 4 x 8 outputs per thread: twice the threads of the same tile, TM named after MINB
    four = sgemm_shape(104, 1024, 1024, SgemmCut(64, 128, 8, 3, split=6, slices=2, tm=4))
    assert matmul_expr("none", four) == "sgemm_split_kernel<0, 64, 128, 8, 3, 6, 2, 1, 4>"
    assert four.threads == 2 * (64 // 4) * (128 // 8) == 512 and four.grid == (8, 6, 2)
    eight = sgemm_shape(104, 1024, 1024, SgemmCut(64, 128, 8, 3, split=6, slices=2))
    assert gemm_smem_bytes(four) == gemm_smem_bytes(eight)


@pytest.mark.parametrize(
    "cut,clusters,match",
    [
        (SgemmCut(48, 64, 16, 3), True, "BM % 32"),
        (SgemmCut(40, 64, 16, 3, tm=4), True, "BM % 16"),
        (SgemmCut(64, 64, 16, 3, tm=2), True, "TM must be 8 or 4"),
        (SgemmCut(128, 128, 16, 3, minb=5, tm=4), True, "MINB 5 x 512"),
        (SgemmCut(64, 96, 16, 3), True, "BN % 64"),
        (SgemmCut(64, 64, 6, 3), True, "multiple of 4"),
        (SgemmCut(64, 64, 0, 3), True, "multiple of 4"),
        (SgemmCut(64, 64, 16, 1), True, "2 pipeline stages"),
        (SgemmCut(64, 64, 16, 3, split=9), True, "split 9"),
        (SgemmCut(64, 64, 16, 3, split=0), True, "split 0"),
        (SgemmCut(64, 64, 16, 3, split=2), False, "clusters"),
        (SgemmCut(64, 64, 16, 3, slices=9), True, "slices"),
        (SgemmCut(256, 256, 16, 3, slices=2), True, "2048 threads"),
        (SgemmCut(128, 128, 16, 3, slices=5), True, "at most 1024"),
        (SgemmCut(128, 128, 16, 3, slices=2, minb=5), True, "MINB 5"),
        (SgemmCut(64, 64, 16, 3, minb=0), True, "MINB 0"),
    ],
)
def test_sgemm_shape_refuses_what_the_kernel_cannot_be(cut, clusters, match):
    with pytest.raises(ShapeError, match=match):
        sgemm_shape(64, 1024, 1024, cut, clusters=clusters)


def test_sgemm_shape_refuses_an_empty_product_and_a_huge_grid():
    with pytest.raises(ShapeError, match=">= 1"):
        sgemm_shape(0, 1024, 1024, SgemmCut(64, 64, 16, 3))
    with pytest.raises(ShapeError, match="grid z"):
        sgemm_shape(32 * 65536, 16, 64, SgemmCut(32, 64, 16, 3))
    with pytest.raises(TypeError, match="SgemmCut"):
        sgemm_shape(64, 1024, 1024, (64, 64, 16, 3))


def test_hand_picked_sgemm_cuts_are_checked():
    x, w = _arr((64, 1000)), _arr((1000, 1000))
    good = sgemm_shape(64, 1000, 1000, SgemmCut(64, 128, 16, 3, split=2, slices=2))
    _check_shape(good, 64, 1000, 1000, x, w, clusters=True, smem_limit=OPTIN)
    _check_shape(good, 64, 1000, 1000, x, w, clusters=True)  # no limit given: not checked
    with pytest.raises(ShapeError, match="clusters"):
        _check_shape(good, 64, 1000, 1000, x, w, clusters=False)
    with pytest.raises(ShapeError, match="does not fit"):
        _check_shape(good, 65, 1000, 1000, _arr((65, 1000)), w, clusters=True)  # grid for 64 rows
    with pytest.raises(LayoutError, match="16-byte"):
        _check_shape(good, 64, 1000, 1000, x, _arr((1000, 1000), 0x7F0000000004), clusters=True)
    with pytest.raises(LayoutError, match="16-byte"):
        _check_shape(good, 64, 1000, 1000, _arr((64, 1000), 0x7F0000000008), w, clusters=True)
    odd_k = sgemm_shape(64, 1001, 1000, SgemmCut(64, 128, 16, 3))
    with pytest.raises(LayoutError, match="K % 4"):
        _check_shape(odd_k, 64, 1001, 1000, _arr((64, 1001)), _arr((1001, 1000)), clusters=True)
    odd_n = sgemm_shape(64, 1000, 998, SgemmCut(64, 128, 16, 3))
    with pytest.raises(LayoutError, match="N % 4"):
        _check_shape(odd_n, 64, 1000, 998, x, _arr((1000, 998)), clusters=True)
    big = sgemm_shape(64, 1000, 1000, SgemmCut(128, 128, 32, 8))  # 8 x (128 x 36 + 32 x 128) x 4 B = 278528 B
    assert gemm_smem_bytes(big) > OPTIN
    with pytest.raises(ShapeError, match="shared memory"):
        _check_shape(big, 64, 1000, 1000, x, w, clusters=True, smem_limit=OPTIN)
    # a structurally impossible cut, built by hand: the kernel's rules, typed
    bad = MatmulShape("sgemm", 4, 96, 64, 1, (11, 1, 1), 0, 1, 16, 3, 1, 8)
    with pytest.raises(ShapeError, match="BN % 64"):
        _check_shape(bad, 64, 1000, 1000, x, w, clusters=True)
    # a residency cap is not an sgemm thing (MINB is); a wrong grid is refused
    for wrong in (
        MatmulShape("sgemm", 4, 128, 64, 2, good.grid, 2, 2, 16, 3, 1, 8),
        MatmulShape("sgemm", 4, 128, 64, 2, (8, 2, 2), 0, 2, 16, 3, 1, 8),
    ):
        with pytest.raises(ShapeError, match="does not fit"):
            _check_shape(wrong, 64, 1000, 1000, x, w, clusters=True)
    with pytest.raises(ShapeError, match="BM % 16"):  # TM 4: a warp covers 16 rows
        _check_shape(
            MatmulShape("sgemm", 4, 128, 40, 1, (8, 1, 2), 0, 1, 16, 3, 1, 4), 64, 1000, 1000, x, w, clusters=True
        )
    with pytest.raises(ShapeError, match="needs tm"):
        MatmulShape("sgemm", 4, 128, 64, 2, good.grid, 0, 2, 16, 3, 1)


def test_the_table_is_the_one_matmul_shape_reads():
    assert ops.SGEMM_CUTS is gemm.SGEMM_CUTS is SGEMM_CUTS
    assert SGEMM_CUTS == parse_sgemm_table(SGEMM_TABLE)
    for key, cut in SGEMM_CUTS.items():  # whatever a sweep pasted in: well-formed cuts that fit an H100 / H200
        assert len(key) == 3 and isinstance(cut, SgemmCut), (key, cut)
        shape = sgemm_shape(*key, cut)
        assert gemm_smem_bytes(shape) <= OPTIN, (key, cut)
        assert matmul_shape(*key, 132, smem_limit=OPTIN) == shape


def test_the_table_text_is_one_row_per_product_in_named_columns():
    """SGEMM_TABLE: the header names SgemmCut's fields; every row is one integer per column, parses
    to a cut sgemm_shape accepts at its own (M, K, N) and that fits a 132-SM sm_90 device (clusters,
    OPTIN bytes of shared memory); rows sorted by (K, N, M), no key twice; the sweep's formatter
    prints the same text back."""
    lines = [ln.split() for ln in SGEMM_TABLE.splitlines() if ln.strip()]
    assert tuple(lines[0]) == SGEMM_TABLE_COLUMNS == ("m", "k", "n", *SgemmCut.__dataclass_fields__)
    rows = lines[1:]
    assert rows and all(len(r) == len(SGEMM_TABLE_COLUMNS) and all(v.isdigit() for v in r) for r in rows)
    keys = [tuple(int(v) for v in r[:3]) for r in rows]
    assert keys == sorted(keys, key=lambda key: (key[1], key[2], key[0])), "rows not sorted by (K, N, M)"
    assert len(set(keys)) == len(keys) == len(SGEMM_CUTS), "a key twice"
    for key, cut in SGEMM_CUTS.items():
        assert sgemm_fits(sgemm_shape(*key, cut), clusters=True, smem_limit=OPTIN), (key, cut)
        assert key[0] % gemm.SGEMM_ROW_STEP == 0, key  # the row grid matmul_shape rounds up to
    assert format_sgemm_table(SGEMM_CUTS) == SGEMM_TABLE.strip("\n")
    assert parse_sgemm_table(format_sgemm_table(SGEMM_CUTS)) == SGEMM_CUTS


@pytest.mark.parametrize(
    "text,match",
    [
        ("m k n bm bn bk stages split slices minb\n64 64 64 64 64 16 3 1 1 1", "header"),
        ("m k n bm bn bk stages split slices minb tm\n64 64 64 64 64 16 3 1 1 1", "11 integers"),
        ("m k n bm bn bk stages split slices minb tm\n64 64 64 64 64 16 3 1 1 1 x", "11 integers"),
        (
            "m k n bm bn bk stages split slices minb tm\n64 64 64 64 64 16 3 1 1 1 8\n64 64 64 32 64 16 3 1 1 1 8",
            "second row",
        ),
    ],
)
def test_a_malformed_table_text_is_refused(text, match):
    with pytest.raises(ValueError, match=match):
        parse_sgemm_table(text)


SHAPES = [(1, 1, 1), (64, 4096, 4096), (72, 1024, 1024), (256, 4096, 4096), (8, 1024, 1024), (33, 1000, 996)]


def test_empty_table_keeps_todays_rule(monkeypatch):
    before = {s: matmul_shape(*s, 132) for s in SHAPES}
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {})
    for s in SHAPES:
        got = matmul_shape(*s, 132, smem_limit=OPTIN)
        assert got.kernel in ("matvec", "gemm") and (got.bk, got.stages, got.minb) == (0, 0, 0)
        if s not in SGEMM_CUTS:
            assert got == before[s]


def test_table_entry_is_used_for_its_shape_and_the_row_counts_just_below(monkeypatch):
    """An entry serves its (M, K, N) and the M - 7 .. M - 1 rows above the previous step of 8
    (the same row tiles), nothing else."""
    split2 = SgemmCut(64, 128, 16, 4, split=2)
    slices4 = SgemmCut(32, 128, 16, 3, slices=4)
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {(64, 4096, 4096): split2, (72, 1024, 1024): slices4})
    s = matmul_shape(64, 4096, 4096, 132)
    assert s == sgemm_shape(64, 4096, 4096, split2)
    assert matmul_shape(72, 1024, 1024, 132, clusters=False) == sgemm_shape(72, 1024, 1024, slices4)
    assert gemm.SGEMM_ROW_STEP == 8
    for m in range(57, 64):
        assert matmul_shape(m, 4096, 4096, 132) == sgemm_shape(m, 4096, 4096, split2), m
    for m in range(65, 72):
        assert matmul_shape(m, 1024, 1024, 132, clusters=False) == sgemm_shape(m, 1024, 1024, slices4)
    for other in (
        (65, 4096, 4096),
        (56, 4096, 4096),
        (64, 1024, 1024),
        (64, 4096, 4092),
        (64, 4092, 4096),
        (72, 1024, 4096),
        (256, 4096, 4096),
    ):
        assert matmul_shape(*other, 132).kernel != "sgemm", other
    # where the cut cannot run, today's rule: misaligned x or W, no clusters for a split, too
    # little shared memory
    for kw in ({"x_aligned16": False}, {"w_aligned16": False}, {"clusters": False}, {"smem_limit": 48 * 1024}):
        got = matmul_shape(64, 4096, 4096, 132, **kw)
        assert got.kernel != "sgemm", kw
        monkeypatch.setattr(gemm, "SGEMM_CUTS", {})
        assert got == matmul_shape(64, 4096, 4096, 132, **kw)
        monkeypatch.setattr(gemm, "SGEMM_CUTS", {(64, 4096, 4096): split2})
    assert matmul_shape(64, 4096, 4096, 132, smem_limit=OPTIN).kernel == "sgemm"


def test_a_malformed_table_entry_is_loud(monkeypatch):
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {(64, 4096, 4096): SgemmCut(64, 96, 16, 4, split=2)})
    with pytest.raises(ShapeError, match="BN % 64"):
        matmul_shape(64, 4096, 4096, 132)
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {(64, 4096, 4096): (64, 128, 16, 4, 2, 1, 1)})  # not a record
    with pytest.raises(ShapeError, match="expected SgemmCut, got"):
        matmul_shape(64, 4096, 4096, 132)


def _kinds():
    """A small set: every kind and epilogue once, the split and MINB forms."""
    shapes = [sgemm_shape(m, k, n, cut) for m, k, n, cut in CUTS]
    names = {matmul_expr(e, s) for s in shapes[:2] for e in ops.EPILOGUES}
    return sorted(names | {matmul_expr("add", s) for s in shapes})


def test_every_sgemm_kind_compiles_for_sm90():
    names = _kinds()
    assert any(n.startswith("sgemm_split_kernel<") for n in names) and any(n.startswith("sgemm_kernel<") for n in names)
    out = compile_source(kernel_source("sgemm"), "sgemm.cu", "sm_90", names, cache=False)
    assert out.image[:4] == b"\x7fELF" and set(out.lowered) == set(names)
    for sym in out.lowered.values():
        assert sym.startswith("_Z") and sym.encode() in out.image


def test_table_cuts_compile_for_sm90():
    names = sorted({matmul_expr(e, sgemm_shape(*key, cut)) for key, cut in SGEMM_CUTS.items() for e in ops.EPILOGUES})
    if not names:
        pytest.skip("SGEMM_CUTS is empty (no sweep pasted in yet)")
    out = compile_source(kernel_source("sgemm"), "sgemm.cu", "sm_90", names, cache=False)
    assert set(out.lowered) == set(names)


def test_tinyblock_row_grid_knows_sgemm():
    from types import SimpleNamespace

    from rawgraph import TinyBlock

    row_grid = TinyBlock.row_grid
    for m, k, n, cut in CUTS:
        launch = SimpleNamespace(kernel=SimpleNamespace(name=matmul_expr("add", sgemm_shape(m, k, n, cut))))
        assert row_grid(None, launch) == (2, cut.bm)


# -- launches and TinyBlock plans on the fake driver (tests/fakedriver.py): real NVRTC cubins ------


@pytest.fixture(scope="module")
def fake():
    from fault_cases import fake_session

    with fake_session() as (fake, hook):
        hook.active = False
        yield fake


def test_sgemm_launch_is_built_as_the_sweep_launches_it(fake, sweep):
    from rawgraph import DeviceBuffer, get_device

    dev = get_device()
    m, k, n = 70, 1000, 260
    with DeviceBuffer((m, k)) as x, DeviceBuffer((k, n)) as w, DeviceBuffer((m, n)) as y, DeviceBuffer((m, n)) as r:
        views = {"x": x.view(), "W": w.view(), "y": y.view(), "r": r.view()}
        for cut in (SgemmCut(64, 64, 32, 2, slices=4), SgemmCut(32, 128, 8, 3, split=3), SgemmCut(64, 64, 16, 3)):
            shape = sgemm_shape(m, k, n, cut)
            launch = ops.matmul(dev, views, "x", "W", "y", "add", r="r", shape=shape)
            ref = sweep.Cut.of(cut)
            assert launch.kernel.name == ref.expr("add")
            assert launch.grid == ref.grid(m, n) and launch.block == (ref.threads, 1, 1)
            assert launch.shared_mem == ref.smem
            if ref.smem > 48 * 1024:
                assert launch.kernel.max_dynamic_smem >= ref.smem
            assert launch.kernel.cluster_dims == ((1, cut.split, 1) if cut.split > 1 else (0, 0, 0))
            assert launch.args["flags"] == ref.early(k, n) == ops.FLAG_EARLY  # 1 MB of W: successor at the start
            assert ops.routes_rows(launch)
        with pytest.raises(ShapeError, match="shared memory"):
            ops.matmul(dev, views, "x", "W", "y", shape=sgemm_shape(m, k, n, SgemmCut(128, 128, 32, 8)))
        big_k = 4096
        with DeviceBuffer((m, big_k)) as xb, DeviceBuffer((big_k, 1024)) as wb, DeviceBuffer((m, 1024)) as yb:
            vb = {"x": xb.view(), "W": wb.view(), "y": yb.view()}
            late = ops.matmul(
                dev, vb, "x", "W", "y", shape=sgemm_shape(m, big_k, 1024, SgemmCut(64, 64, 16, 3, split=2))
            )
            assert late.args["flags"] == 0  # 16 MB of W: after the K loop


@pytest.mark.parametrize("form", ["unfused", "fused"])
def test_tinyblock_plan_uses_a_table_cut(fake, monkeypatch, form):
    from rawgraph import DeviceBuffer, TinyBlock
    from rawgraph.serving.device_shaped import grid_for, shape_entries

    width, batch = 256, 72
    cut = SgemmCut(32, 64, 16, 3, split=2)
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {(batch, width, width): cut})
    with (
        TinyBlock(width, batch, 2, seed=1, form=form) as model,
        DeviceBuffer((batch, width)) as x,
        DeviceBuffer((batch, width)) as out,
    ):
        plan = model.plan(x, out)
        mm = [l for l in plan.launches if "gemm" in l.kernel.name or "matvec" in l.kernel.name]
        assert mm and all(l.kernel.name.startswith("sgemm_split_kernel<") for l in mm)
        shape = sgemm_shape(batch, width, width, cut)
        for launch in mm:
            assert launch.grid == shape.grid and launch.block == (shape.threads, 1, 1)
            assert model.row_grid(launch) == (2, cut.bm) and ops.routes_rows(launch)
        entries = shape_entries(model, plan.launches, batch)
        for e, launch in zip(entries, plan.launches):
            if any(launch is l for l in mm):
                assert (e.axis, e.rows_per_block) == (2, cut.bm)
                assert grid_for(e, batch) == launch.grid
                assert grid_for(e, 1) == (shape.grid[0], shape.grid[1], 1)
    monkeypatch.setattr(gemm, "SGEMM_CUTS", {})
    with (
        TinyBlock(width, batch, 1, seed=1, form=form) as model,
        DeviceBuffer((batch, width)) as x,
        DeviceBuffer((batch, width)) as out,
    ):
        assert not any(l.kernel.name.startswith("sgemm") for l in model.plan(x, out).launches)


def test_routes_rows_is_false_for_a_lookalike(fake):
    """A user's kernel named like an sgemm instantiation is not rawgraph's (its rows argument is
    not a row table)."""
    from types import SimpleNamespace

    from rawgraph import DeviceBuffer, get_device

    dev = get_device()
    with DeviceBuffer((64, 256)) as x, DeviceBuffer((256, 256)) as w, DeviceBuffer((64, 256)) as y:
        launch = ops.matmul(
            dev,
            {"x": x.view(), "W": w.view(), "y": y.view()},
            "x",
            "W",
            "y",
            shape=sgemm_shape(64, 256, 256, SgemmCut(64, 64, 16, 3)),
        )
        other = SimpleNamespace(kernel=SimpleNamespace(name=launch.kernel.name, module=launch.kernel.module))
        assert ops.routes_rows(launch) and not ops.routes_rows(other)


def test_the_sweep_times_todays_cut_with_the_flag_ops_matmul_sets(sweep):
    """The sweep's "current" column launches the table's sgemm cut as ops.matmul does: successor
    at the start (FLAG_EARLY) for W up to 8 MB, after the K loop above; labelled with its cut."""
    small = sweep.current_cut(72, 1024, 1024, 132)
    assert small.kernel == "sgemm" and small.early(1024, 1024) == ops.FLAG_EARLY
    shape = ops.matmul_shape(72, 1024, 1024, 132)
    assert small.label.startswith(f"sgemm/{shape.bt}x{shape.tc}/k{shape.bk}/st{shape.stages}/s{shape.split}/")
    assert small.label.endswith(f"/tm{shape.tm}") == (shape.tm != 8)
    big = sweep.current_cut(256, 4096, 4096, 132)
    assert big.kernel == "sgemm" and big.early(4096, 4096) == 0


def test_a_named_cut_the_kernel_cannot_be_is_refused_when_parsed(sweep):
    import argparse

    assert sweep.parse_cut("48,64,16,4,1,1,1,4") == SgemmCut(48, 64, 16, 4, tm=4)
    assert sweep.parse_cut("64,128,32,3,2,1,1") == SgemmCut(64, 128, 32, 3, split=2)
    for bad, why in (("40,64,16,3,1,1,1,4", "BM % 16"), ("64,96,16,3,1,1,1", "BN % 64"), ("64,64,16,3,1,1,1,2", "TM")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            sweep.parse_cut(bad)


def test_the_sweep_table_judges_the_faster_of_best_and_current(sweep):
    """The flags judge what the library could serve: the best candidate or today's cut, whichever
    was faster; today's cut alone when no candidate passed."""

    def row(m, best, cur, cub=10.0):
        r = {"M": m, "K": 1024, "N": 1024, "cublas": {"us": cub}, "best_variants": {}}
        if best:
            r["best"] = {"cut": "sgemm a", "us": best, "pct_peak": 20.0, "pct_copy_bw": 10.0}
        if cur:
            r["current"] = {"cut": "sgemm b", "us": cur, "pct_peak": 20.0, "pct_copy_bw": 10.0}
        return r

    text = sweep.table(
        {"rows": [row(64, 10.5, 9.5), row(72, 9.0, 11.0), row(80, None, 9.9), row(88, 10.2, None), row(96, None, None)]}
    )
    assert "MISSED at [(88, 1024), (96, 1024)]" in text, text
    lines = {int(l.split()[0]): l for l in text.splitlines() if l[:4].strip().isdigit()}
    assert "(current)" in lines[80] and "REQUIRED-MISS" not in lines[64] + lines[72] + lines[80]


def test_the_sweep_times_named_cuts_once(sweep):
    """``--cut`` adds a cut to every shape's candidates, and a cut the model already chose is not
    timed twice."""
    cands = sweep.candidates(256, 4096, 4096, 132, 4)
    named = SgemmCut(128, 128, 8, 4, split=2)
    got = sweep.with_cuts(cands, [named, cands[0].record])
    assert got[: len(cands)] == cands and got[len(cands) :] == [sweep.Cut.of(named)]
    assert sweep.with_cuts(cands, []) == cands


def test_the_bank_conflict_screen_counts_register_file_reads_in_one_bank(monkeypatch):
    """benchmarks/probes/sgemm_bank_conflicts.py: an FFMA conflicts when two of the source registers
    it reads from the register file are equal mod 4. A source the previous instruction flagged
    ``.reuse`` in the same slot comes from the reuse cache; predicated FFMAs count; other
    instructions only count as SASS. A --cut needs seven or eight integers."""
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "probes" / "sgemm_bank_conflicts.py"
    monkeypatch.syspath_prepend(str(path.parent))  # the probes' _common (which takes parse_cut from the sweep)
    spec = importlib.util.spec_from_file_location("sgemm_bank_conflicts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sass = "\n".join(
        [
            "        /*0010*/                   FFMA R4, R8, R12, R16 ;        /* 0x0 */",  # 0, 0, 0: conflict
            "        /*0020*/                   FFMA R4, R8.reuse, R12, R17 ;  /* 0x0 */",  # R8 still read: 0, 0, 1
            "        /*0030*/                   FFMA R5, R8, R13, R20 ;        /* 0x0 */",  # R8 cached: 1, 0
            "        /*0040*/                @P0 FFMA R5, R9, R13, R6 ;        /* 0x0 */",  # 1, 1, 2: conflict
            "        /*0050*/                   LDS.128 R8, [R2] ;             /* 0x0 */",
        ]
    )
    assert mod.ffma_conflicts(sass) == (5, 4, 3)
    assert mod.parse_cut("64,128,32,3,2,1,1") == SgemmCut(64, 128, 32, 3, split=2)
    for bad in ("64,128", "64,128,32,3,2,1,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="seven or eight integers"):
            mod.parse_cut(bad)
