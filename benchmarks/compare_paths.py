"""Before/after table of launch-path runs made on one machine (the no-regression check of a redesign).

Each argument is ``LABEL=path/to/launch_paths.json`` (``rawgraph bench paths`` output); runs with
one label are pooled (the median of their medians), so alternating old/new runs on one warm
machine shows drift. Prints, per (path, form) at every grid point, the synced-host median of each
label and the ratio of the last label to the first; then the microcosts the same way. Writes the
table as JSON with ``--json``.

    python3 benchmarks/compare_paths.py old=o1/paths.json new=n1/paths.json old=o2/paths.json new=n2/paths.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

KEY_PATHS = (
    "graph",
    "graph_update",
    "graph_update2",
    "graph_indirect",
    "graph_copy",
    "stream",
    "torch_graph",
    "torch_graph_copy",
    "floor_empty_graph",
)
MICRO = ("cuLaunchKernel", "cuLaunchKernelEx_pdl", "manager_bind_1_node", "manager_bind_same")


def _load(specs: list[str]) -> tuple[list[str], dict[str, list[dict]]]:
    runs: dict[str, list[dict]] = defaultdict(list)
    labels: list[str] = []
    for spec in specs:
        label, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"give LABEL=path, got {spec!r}")
        runs[label].append(json.loads(Path(path).read_text()))
        if label not in labels:
            labels.append(label)
    return labels, runs


def compare(specs: list[str]) -> dict:
    labels, runs = _load(specs)
    rows: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for label, docs in runs.items():
        for doc in docs:
            for r in doc["records"]:
                if r["path"] in KEY_PATHS:
                    rows[(r["path"], r["form"], r["layers"], r["width"], r["batch"])][label].append(
                        r["sync_us"]["median"]
                    )
            for name in MICRO:
                m = (doc.get("microcosts") or {}).get(name)
                if isinstance(m, dict) and "median" in m:
                    rows[("micro:" + name, None, 0, 0, 0)][label].append(m["median"])
    out = []
    for key in sorted(rows, key=lambda k: tuple(str(x) for x in k)):
        med = {lab: statistics.median(v) for lab, v in rows[key].items()}
        entry = {
            "path": key[0],
            "form": key[1],
            "layers": key[2],
            "width": key[3],
            "batch": key[4],
            "median_us": med,
            "runs": {lab: v for lab, v in rows[key].items()},
        }
        if labels[0] in med and labels[-1] in med:
            entry["ratio"] = med[labels[-1]] / med[labels[0]]
        out.append(entry)
    commits = {lab: sorted({d["env"].get("commit", "?") for d in docs}) for lab, docs in runs.items()}
    gpus = sorted({d["env"].get("gpu", "?") for docs in runs.values() for d in docs})
    return {"labels": labels, "commits": commits, "gpu": gpus, "rows": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="LABEL=launch_paths.json")
    p.add_argument("--json", help="write the comparison here")
    args = p.parse_args(argv)
    res = compare(args.runs)
    labels = res["labels"]
    print(f"gpu {res['gpu']}, commits {res['commits']} (synced host µs, median of run medians)")
    print(
        f"{'path':<34}{'form':<9}{'L':>3}{'w':>6}{'b':>5}" + "".join(f"{lab:>10}" for lab in labels) + f"{'ratio':>8}"
    )
    for r in res["rows"]:
        cells = "".join(f"{r['median_us'].get(lab, float('nan')):>10.2f}" for lab in labels)
        ratio = f"{r['ratio']:>8.3f}" if "ratio" in r else ""
        print(f"{r['path']:<34}{str(r['form'] or ''):<9}{r['layers']:>3}{r['width']:>6}{r['batch']:>5}{cells}{ratio}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
