"""``precision="auto"`` (no GPU): the rows where it runs tf32x3 are the ones the committed tf32x3
sweep measured faster than the fp32 path with an error no worse than cuBLAS fp32's, the cuts it
measured are still the ones launched, and the models take the choice, refusing a bad one before
anything is allocated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rawgraph import ops

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# The sweeps TF32X3_AUTO_ROWS and TF32X3_WGMMA_CUTS come from (benchmarks/tf32x3_sweep.py;
# docs/gemm.md quotes them), oldest first: the whole grid with the mma.sync cuts, eight shapes with
# wgmma cuts, the whole grid with wgmma cuts, then with every one-wave wgmma cut of a searched space,
# twice (the second space wider). Per shape the newest run that measured it decides.
SWEEPS = (
    RESULTS / "tf32x3_sweep_2026-12-07_39e1c3f_h100.json",
    RESULTS / "tf32x3_sweep_quick_2026-12-07_cf8187d_h100.json",
    RESULTS / "tf32x3_sweep_wgmma_2026-12-07_f7f5129_h100.json",
    RESULTS / "tf32x3_sweep_search_2026-12-07_2697335_h100.json",
    RESULTS / "tf32x3_sweep_search2_2026-12-07_fc951b7_h100.json",
)
SMS, OPTIN = 132, 232448  # the device of the sweeps (H100 SXM: 132 SMs, 227 KiB opt-in shared memory)


def _rows():
    """Per (M, K, N), the newest sweep's row."""
    out = {}
    for path in SWEEPS:
        for r in json.loads(path.read_text())["rows"]:
            out[(r["M"], r["K"], r["N"])] = r
    return out


def _launched(row):
    """The record of the cut matmul_shape launches at precision="tf32x3" on the sweep's device
    (compute capability 9.0: the warpgroup table's cut where it has one), found among the row's
    measured cuts; None where the row did not measure it."""
    m, k, n = row["M"], row["K"], row["N"]
    shape = ops.matmul_shape(m, k, n, SMS, smem_limit=OPTIN, precision="tf32x3", wgmma=True)
    if shape.kernel == "tf32x3_wgmma":
        values, recs = vars(ops.tf32x3_wgmma_cut(shape)), row.get("wgmma", [])
    else:
        values, recs = vars(ops.tf32x3_cut(shape)), row["tf32x3"]
    return next((rec for rec in recs if rec["values"] == values), None)


def test_the_auto_rows_are_where_the_sweep_measured_tf32x3_faster_and_accurate():
    rows = _rows()
    assert len(rows) == 75
    for (m, k, n), r in rows.items():
        launched = _launched(r)
        assert launched is not None, (m, k, n, "the launched cut was not measured")
        faster = launched["accurate"] and launched["us"] < r["fp32"]["us"]
        want = "tf32x3" if faster else "fp32"
        assert ops.auto_precision(m, k, n, (9, 0)) == want, (m, k, n, launched["cut"], launched["us"], r["fp32"]["us"])


def test_the_wgmma_table_holds_the_fastest_accurate_wgmma_cut_where_it_beat_the_mma_sync_one():
    """TF32X3_WGMMA_CUTS: at each shape whose newest sweep has wgmma rows, the fastest wgmma cut
    that passed the gate, where it was faster than the mma.sync cut launched there; nothing else."""
    want = {}
    for r in _rows().values():
        if "wgmma" not in r:
            continue
        best = r["best_wgmma"]
        mma = next(c for c in r["tf32x3"] if c["table"])
        if best is not None and best["accurate"] and best["us"] < mma["us"]:
            want[(r["M"], r["K"], r["N"])] = ops.WgmmaCut(**best["values"])
    assert ops.TF32X3_WGMMA_CUTS == want


def test_the_measured_cuts_are_still_the_launched_ones():
    """A changed cut rule makes a sweep a measurement of other kernels: re-run it and re-derive
    TF32X3_AUTO_ROWS."""
    for (m, k, n), r in _rows().items():
        tx = ops.matmul_shape(m, k, n, SMS, smem_limit=OPTIN, precision="tf32x3")
        launched = next(c for c in r["tf32x3"] if c["table"])
        assert vars(ops.tf32x3_cut(tx)) == launched["values"], (m, k, n)
        fp = ops.matmul_shape(m, k, n, SMS, smem_limit=OPTIN, precision="fp32")
        assert ops.matmul_expr("none", fp) == r["fp32"]["kernel"], (m, k, n)


@pytest.mark.parametrize(
    "batch,width,cc,want",
    [
        (56, 1024, (9, 0), "fp32"),  # below the grid
        (257, 4096, (9, 0), "fp32"),  # beyond the grid
        (8, 4096, (9, 0), "fp32"),  # below the grid
        (256, 3072, (9, 0), "fp32"),  # a width not measured
        (256, 4096, (8, 0), "fp32"),  # another device
        (256, 4096, (10, 0), "fp32"),
    ],
)
def test_auto_precision_off_the_measured_rows_is_fp32(batch, width, cc, want):
    assert ops.auto_precision(batch, width, width, cc) == want


def test_auto_precision_takes_the_next_measured_row_count():
    """A row count between two measured ones (multiples of 8) gets the larger one's choice."""
    for width in (1024, 2048, 4096):
        for rows in range(64, 257, 8):
            want = ops.auto_precision(rows, width, width, (9, 0))
            got = {ops.auto_precision(b, width, width, (9, 0)) for b in range(rows - 7, rows)}
            assert got == {want}, (width, rows)


def test_auto_precision_needs_a_square_product():
    assert ops.auto_precision(256, 4096, 4096, (9, 0)) == "tf32x3"
    assert ops.auto_precision(256, 4096, 2048, (9, 0)) == "fp32"


def test_resolve_precision_refuses_an_unknown_name(fake_driver, device):
    assert device.info.compute_capability == (9, 0)
    assert ops.resolve_precision("auto", 256, 4096, 4096, device) == "tf32x3"
    assert ops.resolve_precision("fp32", 256, 4096, 4096, device) == "fp32"
    assert ops.resolve_precision("tf32x3", 8, 8, 8, device) == "tf32x3"
    with pytest.raises(ValueError, match="precision must be one of"):
        ops.resolve_precision("tf32", 8, 8, 8, device)


def _matmul_kernels(plan):
    return [launch.kernel.name for launch in plan.launches if "matmul" in launch.label]


def _auto_pair():
    """A width of the grid and two row counts from 8 to 256 where precision="auto" runs tf32x3 and
    fp32 (the smallest of each)."""
    for width in (1024, 2048, 4096):
        picks = {ops.auto_precision(b, width, width, (9, 0)): b for b in range(256, 7, -8)}
        if len(picks) == 2:
            return width, picks["tf32x3"], picks["fp32"]
    raise AssertionError("TF32X3_AUTO_ROWS covers the whole grid or none of it")


@pytest.mark.parametrize("form", ["fused", "unfused"])
def test_tinyblock_runs_what_auto_picks_per_batch(fake_driver, device, form):
    """A tf32x3 product and an fp32 one of the same width (TF32X3_AUTO_ROWS); an explicit
    precision holds at both, and with_batch keeps it."""
    from rawgraph import DeviceBuffer, TinyBlock

    width, tb, fb = _auto_pair()
    with TinyBlock(width, tb, form=form) as model:
        assert model.precision == "auto"
        with DeviceBuffer((tb, width)) as x, DeviceBuffer((tb, width)) as y:
            assert all(k.startswith("tf32x3_") for k in _matmul_kernels(model.plan(x, y)))
        with model.with_batch(fb) as mf, DeviceBuffer((fb, width)) as x, DeviceBuffer((fb, width)) as y:
            assert mf.precision == "auto"
            kernels = _matmul_kernels(mf.plan(x, y))
            assert kernels and not any(k.startswith("tf32x3_") for k in kernels), kernels
    for precision, batch in (("fp32", tb), ("tf32x3", fb)):
        with TinyBlock(width, batch, form=form, precision=precision) as model:
            with model.with_batch(batch) as again, DeviceBuffer((batch, width)) as x, DeviceBuffer((batch, width)) as y:
                assert again.precision == precision
                kernels = _matmul_kernels(again.plan(x, y))
                assert kernels and all(k.startswith("tf32x3_") == (precision == "tf32x3") for k in kernels), kernels


def test_tinyblock_row_grid_follows_the_tf32x3_row_tiles(fake_driver, device):
    """The serving layer shrinks a tf32x3 launch's grid by its BM-row tiles (axis 2), as an
    sgemm's: the mma.sync kernel's (72 rows at w512, a width the warpgroup table has no entry for)
    and the warpgroup kernel's (64 and 128 rows at w1024, cuts of TF32X3_WGMMA_CUTS on the fake
    driver's 9.0 device)."""
    from rawgraph import DeviceBuffer, TinyBlock

    for batch, width, kernel in (
        (72, 512, "tf32x3_split_kernel"),
        (64, 1024, "tf32x3_wgmma"),
        (128, 1024, "tf32x3_wgmma"),
    ):
        shape = ops.matmul_shape(batch, width, width, SMS, smem_limit=OPTIN, precision="tf32x3", wgmma=True)
        with TinyBlock(width, batch, form="fused", precision="tf32x3") as model:
            with DeviceBuffer((batch, width)) as x, DeviceBuffer((batch, width)) as y:
                for launch in model.plan(x, y).launches:
                    assert launch.kernel.name.startswith(kernel), (batch, launch.kernel.name)
                    assert launch.grid == shape.grid
                    assert model.row_grid(launch) == (2, shape.bt)
                    assert launch.grid[2] == -(-batch // shape.bt)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"precision": "tf32"}, "precision must be one of"),
        ({"precision": None}, "precision must be one of"),
        ({"precision": "tf32x3", "form": "block"}, "form 'block' is one fp32 kernel"),
    ],
)
def test_a_bad_precision_is_refused_before_anything_is_allocated(fake_driver, device, kwargs, match):
    from rawgraph import TinyBlock, TwoBranchBlock

    before = fake_driver.live()
    for cls, width in ((TinyBlock, 128), (TwoBranchBlock, 256)):
        with pytest.raises(ValueError, match=match):
            cls(width, 4, **kwargs)
        assert fake_driver.live() == before


def test_two_branch_block_passes_its_precision_to_both_branches(fake_driver, device):
    from rawgraph import TwoBranchBlock

    with TwoBranchBlock(256, 4, precision="tf32x3") as model:
        assert model.a.precision == model.b.precision == "tf32x3"
