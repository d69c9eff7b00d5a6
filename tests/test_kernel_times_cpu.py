"""``rawgraph bench kernels --sweep``'s sgemm candidates (``rawgraph/bench/kernel_times.py``), no
GPU: below ``ops.GEMM_MIN_BATCH`` rows the sweep offers sgemm cuts exactly where
``ops.matmul_shape`` launches one (through an ``ops.SGEMM_CUTS`` entry), the table's cut first."""

from __future__ import annotations

import pytest

from rawgraph import ops
from rawgraph.bench.kernel_times import SGEMM_SWEEP, SGEMM_SWEEP_BK, candidate_shapes, sgemm_candidates
from rawgraph.ops import gemm

OPTIN = 232448  # H100 / H200: most dynamic shared memory one CTA may ask for
SMS = 132
# A made-up table: a cluster-split cut at 16 rows (serves 9-16), a cut without a split at 24 rows
# (serves 17-24), nothing for 25-32, and a 40-row entry (serves 33-40) above GEMM_MIN_BATCH.
TABLE = {
    (16, 1024, 1024): ops.SgemmCut(16, 64, 32, 3, split=8, slices=2, tm=4),
    (24, 1024, 1024): ops.SgemmCut(32, 64, 32, 3, slices=2, tm=4),
    (40, 1024, 1024): ops.SgemmCut(16, 64, 16, 3, split=8, slices=2, tm=4),
}


@pytest.fixture
def table(monkeypatch):
    """TABLE as the one table both ops.matmul_shape and the sweep read."""
    monkeypatch.setattr(gemm, "SGEMM_CUTS", TABLE)
    monkeypatch.setattr(ops, "SGEMM_CUTS", TABLE)
    return TABLE


def _structure(s: ops.MatmulShape) -> tuple[int, ...]:
    return (s.bm, s.bn, s.bk, s.stages, s.split, s.slices, s.minb, s.tm)


def test_below_gemm_min_batch_the_tables_cut_comes_first_then_the_sweeps(table):
    assert ops.GEMM_MIN_BATCH == 32 and ops.SGEMM_ROW_STEP == 8
    # the sweep's structures at 32 rows (no table entry serves 25-32 here), to compare against
    sweep32 = [_structure(s) for s in sgemm_candidates(32, 1024, 1024, True, OPTIN)]
    assert {(b[0], b[1], b[5], b[6]) for b in sweep32} == set(SGEMM_SWEEP)
    assert {b[2] for b in sweep32} == {SGEMM_SWEEP_BK}
    for m, key in [(m, 16) for m in range(9, 17)] + [(m, 24) for m in range(17, 25)]:
        cands = sgemm_candidates(m, 1024, 1024, True, OPTIN)
        today = ops.matmul_shape(m, 1024, 1024, SMS, clusters=True, smem_limit=OPTIN)
        assert cands, f"{m} rows: no sgemm candidate though the table serves them"
        assert cands[0] == today == ops.sgemm_shape(m, 1024, 1024, table[(key, 1024, 1024)]), m
        assert [_structure(s) for s in cands[1:]] == sweep32, m
        assert all(s.kernel == "sgemm" and s.grid[2] == -(-m // s.bm) for s in cands), m
        # and --sweep times them: every one is among the shape's candidates
        assert set(cands) <= set(candidate_shapes(m, 1024, SMS, True, OPTIN)), m


def test_below_gemm_min_batch_no_usable_table_cut_means_no_sgemm_candidates(table):
    for m in list(range(1, 9)) + list(range(25, 32)):  # no entry at 8 or 32 rows
        assert sgemm_candidates(m, 1024, 1024, True, OPTIN) == [], m
        assert ops.matmul_shape(m, 1024, 1024, SMS, smem_limit=OPTIN).kernel != "sgemm", m
    assert sgemm_candidates(16, 4096, 4096, True, OPTIN) == []  # the table has no w4096 entry that low
    # the 16-row entry splits K over a cluster: without clusters matmul_shape passes over it, and so
    # does the sweep (it would otherwise time cuts that never run at 9-16 rows)
    assert ops.matmul_shape(16, 1024, 1024, SMS, clusters=False).kernel != "sgemm"
    assert sgemm_candidates(16, 1024, 1024, False) == []
    # the 24-row entry does not split: it runs without clusters, the sweep's split cuts do not
    cands = sgemm_candidates(20, 1024, 1024, False)
    want = ops.sgemm_shape(20, 1024, 1024, table[(24, 1024, 1024)])
    assert cands[0] == ops.matmul_shape(20, 1024, 1024, SMS, clusters=False) == want
    assert len(cands) > 1 and all(s.split == 1 for s in cands)
    # a table cut over the shared-memory limit is passed over too
    limit = ops.gemm_smem_bytes(cands[0]) - 4
    assert ops.matmul_shape(20, 1024, 1024, SMS, smem_limit=limit).kernel != "sgemm"
    assert sgemm_candidates(20, 1024, 1024, True, limit) == []
    # from GEMM_MIN_BATCH on the sweep's own cuts come without a table entry, as before
    assert sgemm_candidates(32, 1024, 1024, True, limit) and sgemm_candidates(32, 1024, 1024, False)


def test_sgemm_candidates_lead_with_the_cut_matmul_shape_picks(table):
    """Wherever matmul_shape launches sgemm, the sweep's first sgemm candidate is that cut (a row
    count between two entries included: 33 rows take the 40-row entry); below GEMM_MIN_BATCH
    nothing is offered where it does not."""
    for clusters in (True, False):
        for m in range(1, 65):
            cands = sgemm_candidates(m, 1024, 1024, clusters, OPTIN)
            today = ops.matmul_shape(m, 1024, 1024, SMS, clusters=clusters, smem_limit=OPTIN)
            if today.kernel == "sgemm":
                assert cands and cands[0] == today, (m, clusters)
            elif m < ops.GEMM_MIN_BATCH:
                assert cands == [], (m, clusters)


def test_the_real_tables_cuts_lead_the_sweep_at_every_row_count_they_serve():
    """Against ops.SGEMM_CUTS as shipped (16-24-row w1024 entries among them): each entry's cut is
    the first sgemm candidate at its own row count and the row counts just below it that it serves."""
    assert ops.SGEMM_CUTS is gemm.SGEMM_CUTS
    for (m, k, n), cut in ops.SGEMM_CUTS.items():
        for rows in range(m - ops.SGEMM_ROW_STEP + 1, m + 1):
            if rows < 1 or (rows != m and (rows, k, n) in ops.SGEMM_CUTS):
                continue
            cands = sgemm_candidates(rows, k, n, True, OPTIN)
            assert cands and cands[0] == ops.sgemm_shape(rows, k, n, cut), (rows, k, n)
            assert cands[0] == ops.matmul_shape(rows, k, n, SMS, smem_limit=OPTIN), (rows, k, n)


def test_kernel_times_json_records_the_commit_and_machine(tmp_path, monkeypatch):
    """``kernel_times.json`` carries ``rawgraph.bench.provenance.environment()`` (commit, GPU,
    versions), as every results JSON does; the measurement itself is stubbed (no GPU here)."""
    import json

    from rawgraph.bench import kernel_times

    monkeypatch.setenv("RAWGRAPH_COMMIT", "feedbee")
    monkeypatch.setattr(
        kernel_times,
        "measure",
        lambda widths, batches, sweep=False: {
            "device": "stub",
            "copy_GBps": 1.0,
            "reps_per_graph": 1,
            "pdl": False,
            "rows": [],
        },
    )
    monkeypatch.setattr(kernel_times, "targets", lambda result: "")
    assert kernel_times.main(["--out", str(tmp_path), "--width", "128", "--batch", "1"]) == 0
    written = json.loads((tmp_path / "kernel_times.json").read_text())
    assert written["env"]["commit"] == "feedbee"
    assert {"gpu", "driver", "nvrtc", "date"} <= set(written["env"])
    assert written["device"] == "stub" and written["rows"] == []
