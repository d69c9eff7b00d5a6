"""Fault injection over every public operation on the CPU fake driver (issue 21, section 3).

For each operation (``tests/fault_cases.py``) the operation runs once with no fault to count its N
driver calls; then for k = 1..N a fresh set-up runs the operation with its k-th driver call failing
(``CUDA_ERROR_OUT_OF_MEMORY`` unless ``--code``), and the outcome is classified
(``tests/faultinject.py``: recovered, closed, absorbed, warned, inconsistent, leak).

    python3 benchmarks/fault_injection.py --out benchmarks/results
    python3 benchmarks/fault_injection.py --only "manager" --verbose

Writes ``fault_injection.json``: the commit (``$RAWGRAPH_COMMIT`` or ``git rev-parse --short
HEAD``, with ``+dirty`` for a modified tree), per operation the number of (operation, k) cases and
the count of each outcome class, the totals, and every case that is not consistent with its
detail. Exits 1 when any case is inconsistent or leaks. No GPU is used (or needed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from cuda.bindings import driver  # noqa: E402
from fault_cases import all_cases, fake_session  # noqa: E402
from faultinject import GOOD, OUTCOMES, Result, count_calls, run_case, summarize  # noqa: E402


def commit() -> str:
    """The commit measured, as every results JSON records it (``rawgraph.bench.provenance.commit``)."""
    from rawgraph.bench.provenance import commit as provenance_commit

    return provenance_commit()


def run_all(
    only: str | None = None,
    code: Any = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY,
    verbose: bool = False,
    max_k: int | None = None,
) -> tuple[list[Result], dict[str, list[str]]]:
    """Every (operation, k) case; returns the results and, per operation, the calls it makes."""
    results: list[Result] = []
    calls: dict[str, list[str]] = {}
    with fake_session() as (_fake, hook):
        hook.code = code
        cases = [c for c in all_cases() if only is None or only.lower() in c.op.lower()]
        for case in cases:  # warm-up: kernels load and caches fill before anything is counted
            count_calls(case, hook)
        for case in cases:
            t0 = time.perf_counter()
            n, names = count_calls(case, hook)
            calls[case.op] = names
            for k in range(1, (min(n, max_k) if max_k else n) + 1):
                r = run_case(case, k, hook)
                results.append(r)
                if verbose and r.outcome not in GOOD:
                    print(f"  {case.op} k={k} {r.call}: {r.outcome}: {r.detail}", flush=True)
            if verbose:
                print(f"{case.op}: {n} calls, {time.perf_counter() - t0:.2f} s", flush=True)
    return results, calls


def report(results: list[Result], calls: dict[str, list[str]], code: Any) -> dict[str, Any]:
    ops = summarize(results)
    for op, names in calls.items():
        ops.setdefault(op, {"cases": 0, "outcomes": {o: 0 for o in OUTCOMES}})
        ops[op]["driver_calls"] = sorted(set(names))
    totals = {o: sum(v["outcomes"][o] for v in ops.values()) for o in OUTCOMES}
    bad = [
        {"op": r.op, "k": r.k, "call": r.call, "outcome": r.outcome, "detail": r.detail}
        for r in results
        if r.outcome not in GOOD
    ]
    return {
        "what": "fault injection on the CPU fake driver: the k-th driver call of each operation fails, for every k",
        "commit": commit(),
        "code": driver.CUresult(int(code)).name,
        "python": sys.version.split()[0],
        "operations": ops,
        "cases": len(results),
        "totals": totals,
        "inconsistent": totals["inconsistent"],
        "leaks": totals["leak"],
        "problems": bad,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder for fault_injection.json")
    ap.add_argument("--only", default=None, help="run the operations whose name contains this text")
    ap.add_argument("--code", default="CUDA_ERROR_OUT_OF_MEMORY", help="the CUresult a failed call returns")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    code = getattr(driver.CUresult, args.code)
    t0 = time.perf_counter()
    results, calls = run_all(args.only, code, args.verbose)
    data = report(results, calls, code)
    data["seconds"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = (
        "fault_injection.json"
        if args.only is None and args.code == "CUDA_ERROR_OUT_OF_MEMORY"
        else "fault_injection_partial.json"
    )
    (out / name).write_text(json.dumps(data, indent=1) + "\n")
    width = max(len(op) for op in data["operations"])
    for op, v in data["operations"].items():
        counts = ", ".join(f"{k} {n}" for k, n in v["outcomes"].items() if n)
        print(f"{op:<{width}}  {v['cases']:4d} cases: {counts}")
    print(f"{data['cases']} cases in {data['seconds']} s: {data['totals']} -> {out / name}")
    return 0 if not data["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
