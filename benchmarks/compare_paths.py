"""Before/after table of launch-path runs made on one machine (the no-regression check of a redesign).

Each argument is ``LABEL=path/to/launch_paths.json`` (``rawgraph bench paths`` output), in the
order the runs were made. Prints, per (path, form) at every grid point, the synced-host median of
each label (the median of its runs' medians) and the ratio of the last label to the first; then
the microcosts the same way. Writes the table as JSON with ``--json``.

The ratio is paired: whole runs on one machine drift by 10-20 % against each other (clocks, the
host's other work), far more than the few per cent a redesign may cost, so the k-th run of the
last label is divided by the k-th run of the first, and the ratio is the median of those paired
ratios, with their range. Runs made in the order old new new old old new ... put each pair side by
side and cancel a steady drift; with unequal run counts the ratio is of the labels' medians.

    python3 benchmarks/compare_paths.py old=o0/paths.json new=n0/paths.json new=n1/paths.json old=o1/paths.json
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
        first, last = rows[key].get(labels[0]), rows[key].get(labels[-1])
        if first and last and len(labels) > 1:
            if len(first) == len(last):  # paired: the k-th run of each label
                pairs = sorted(b / a for a, b in zip(first, last))
                entry["ratio"] = statistics.median(pairs)
                entry["ratio_range"] = [pairs[0], pairs[-1]]
            else:
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
    print(
        f"gpu {res['gpu']}, commits {res['commits']} (synced host µs, median of run medians; "
        f"ratio {labels[-1]}/{labels[0]}: median of paired runs, their range)"
    )
    print(
        f"{'path':<34}{'form':<9}{'L':>3}{'w':>6}{'b':>5}"
        + "".join(f"{lab:>10}" for lab in labels)
        + f"{'ratio':>8}{'range':>14}"
    )
    for r in res["rows"]:
        cells = "".join(f"{r['median_us'].get(lab, float('nan')):>10.2f}" for lab in labels)
        ratio = f"{r['ratio']:>8.3f}" if "ratio" in r else ""
        span = f"{r['ratio_range'][0]:>7.3f}-{r['ratio_range'][1]:.3f}" if "ratio_range" in r else ""
        print(
            f"{r['path']:<34}{str(r['form'] or ''):<9}{r['layers']:>3}{r['width']:>6}{r['batch']:>5}{cells}{ratio}{span}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
