"""benchmarks/compare_paths.py, the no-regression table of a redesign: the ratio is the later
tree over the earlier one, paired run by run, so a drift between whole runs cannot pass for a
difference between the trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "compare_paths.py"


def _run_file(tmp_path: Path, name: str, commit: str, graph_us: float, bind_us: float) -> str:
    doc = {
        "env": {"commit": commit, "gpu": "NVIDIA H200"},
        "records": [
            {"path": "graph", "form": "fused", "layers": 1, "width": 128, "batch": 1, "sync_us": {"median": graph_us}},
            {"path": "not_a_key_path", "form": None, "layers": 1, "width": 128, "batch": 1, "sync_us": {"median": 1.0}},
        ],
        "microcosts": {"manager_bind_1_node": {"median": bind_us}},
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _compare(tmp_path: Path, runs: list[tuple[str, float, float]]) -> tuple[dict, str]:
    specs = [f"{label}=" + _run_file(tmp_path, f"{label}{k}", label * 2, g, b) for k, (label, g, b) in enumerate(runs)]
    out = tmp_path / "cmp.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *specs, "--json", str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    return {r["path"]: r for r in res["rows"]} | {"_labels": res["labels"]}, proc.stdout


def test_the_ratio_is_the_later_tree_over_the_earlier_paired_run_by_run(tmp_path):
    # old new new old: the first pair on a fast machine, the second 20 % slower; the new tree 3 %
    # slower than the old in each pair. Unpaired medians would mix a fast run with a slow one.
    rows, text = _compare(
        tmp_path,
        [
            ("old", 10.0, 2.0),
            ("new", 10.3, 2.2),
            ("new", 12.36, 2.64),
            ("old", 12.0, 2.4),
            ("old", 11.0, 2.2),
            ("new", 11.33, 2.42),
        ],
    )
    assert rows["_labels"] == ["old", "new"]
    graph = rows["graph"]
    assert graph["ratio"] == pytest.approx(1.03)
    assert graph["ratio_range"] == pytest.approx([1.03, 1.03])
    assert graph["runs"] == {"old": [10.0, 12.0, 11.0], "new": [10.3, 12.36, 11.33]}
    assert rows["micro:manager_bind_1_node"]["ratio"] == pytest.approx(1.1)
    assert "not_a_key_path" not in rows
    assert "ratio new/old" in text


def test_a_drift_within_the_runs_shows_as_the_range(tmp_path):
    rows, _ = _compare(tmp_path, [("old", 10.0, 1.0), ("new", 10.0, 1.0), ("new", 11.0, 1.0), ("old", 10.0, 1.0)])
    assert rows["graph"]["ratio"] == pytest.approx(1.05)
    assert rows["graph"]["ratio_range"] == pytest.approx([1.0, 1.1])


def test_unequal_run_counts_fall_back_to_the_ratio_of_medians(tmp_path):
    rows, _ = _compare(tmp_path, [("old", 10.0, 1.0), ("new", 12.0, 1.0), ("new", 14.0, 1.0)])
    assert rows["graph"]["ratio"] == pytest.approx(1.3)
    assert "ratio_range" not in rows["graph"]
