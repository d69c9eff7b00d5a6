"""Do the tests bite? Put a known bug back and require the tests that guard against it to fail.

    PYTHONPATH=. python3 benchmarks/bite_check.py [--only NAME ...] [--module STEM ...] [--cpu | --gpu]
                                                  [--baseline] [--out DIR] [--list]

A *case* is a bug that was fixed (or a feature that a test claims to check), put back on purpose,
with the pytest node ids that must fail while it is in. A test that still passes with its feature
broken cannot fail, so guards nothing. Every case is a mutation (``benchmarks/mutations/*.py``):
a :class:`Mutation` record with ``name``, ``why``, ``tests``, a ``target``
(``"rawgraph.updates.manager:ExecUpdateManager.close"``) and a ``mutate`` callable that turns the
original object into the broken one. The case's tests run in the checkout as
``python -m pytest -q -x -p no:cacheprovider TESTS`` with ``RAWGRAPH_MUTATION=NAME``: the plugin
``tests/mutation_plugin.py`` (registered by ``tests/conftest.py`` only when that variable is set)
applies the mutation in the pytest process before the test modules are imported, and in the child
interpreters the tests start. Nothing is copied or edited, so a reformat or a move leaves the case
valid while the named function exists. The plugin prints ``rawgraph mutation applied: NAME``; a
run without that line is an ``error``, and so is a mutation that cannot be applied (the plugin
exits 4).

A case *bites* when pytest exits 1 (tests ran and one failed; ``-x`` stops there). Exit 0 is
``survived`` (the tests pass with the feature broken); any other exit (a usage error, a collection
error, a crash, a timeout) is ``error``. ``--baseline`` first runs every case's tests unmodified
(they must pass, else ``baseline-fails``). ``--cpu`` runs, of every case that has any, only the
tests in ``*_cpu.py`` files: what a machine without a GPU can check (the JSON records the tests
run); ``--gpu`` picks the cases with a test outside them (those need the device). Writes
``bite_check.json`` to ``--out`` with the commit (``$RAWGRAPH_COMMIT``, else git)
and the GPU, if any. The checkout is never modified.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = "RAWGRAPH_MUTATION"
APPLIED_LINE = "rawgraph mutation applied: "
PYTEST = ("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider")


# -- the cases, as records ----------------------------------------------------------------------
def load_catalogue() -> Any:
    """``benchmarks/mutations`` as the package ``rawgraph_mutations`` (the name the plugin uses)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from mutation_plugin import load_catalogue as load
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return load()


def load_mutations() -> list[dict[str, Any]]:
    catalogue = load_catalogue()
    return [
        dict(
            name=m.name,
            why=m.why,
            tests=list(m.tests),
            module=catalogue.module_of(m) + ".py",
            target=m.target,
            kind=m.kind,
        )
        for m in catalogue.all_mutations()
    ]


def load_cases() -> list[dict[str, Any]]:
    """Every case of the catalogue (its names are checked unique as it loads)."""
    return load_mutations()


def cpu_tests(tests: list[str]) -> list[str]:
    """The node ids in ``*_cpu.py`` files (those run without a GPU)."""
    return [t for t in tests if t.split("::")[0].endswith("_cpu.py")]


# -- running ---------------------------------------------------------------------------------
def run_tests(tests: list[str], timeout: float, mutation: str | None = None) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if k != ENV}  # unmutated unless asked
    env.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    if mutation is not None:
        env[ENV] = mutation
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, *PYTEST, *tests], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc, out = -9, f"timed out after {timeout} s\n{partial}"
    return rc, out, time.perf_counter() - t0


def _outcome(rec: dict[str, Any], rc: int, out: str, secs: float) -> dict[str, Any]:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    rec.update(
        rc=rc,
        seconds=round(secs, 1),
        summary=lines[-1] if lines else "",
        outcome="bites" if rc == 1 else ("survived" if rc == 0 else "error"),
    )
    if rc in (0, 1) and not any(ln.startswith(APPLIED_LINE) for ln in lines):
        rec.update(outcome="error", detail="the plugin's line is missing: was the mutation applied?")
    if rec["outcome"] == "bites":
        rec["failed"] = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:5]
    else:
        rec["tail"] = out[-1500:]
    return rec


def check_case(case: dict[str, Any], baseline: bool, timeout: float, only_cpu: bool = False) -> dict[str, Any]:
    keep = ("name", "why", "tests", "module", "target", "kind")
    rec = {k: case[k] for k in keep if k in case}
    tests = cpu_tests(case["tests"]) if only_cpu else list(case["tests"])
    if tests != case["tests"]:
        rec["tests_run"] = tests
    if baseline:
        rc, out, _ = run_tests(tests, timeout)
        rec["baseline_rc"] = rc
        if rc != 0:
            rec.update(outcome="baseline-fails", tail=out[-1500:])
            return rec
    return _outcome(rec, *run_tests(tests, timeout, mutation=case["name"]))


def _environment() -> dict[str, Any]:
    """Commit, GPU (None without one), driver and date, as every results JSON carries them."""
    sys.path.insert(0, str(ROOT))
    try:
        from rawgraph.bench.provenance import environment

        return environment()
    except Exception as exc:  # no driver library: still say which commit was checked
        from rawgraph.bench.provenance import commit

        return {"commit": commit(), "gpu": None, "date": time.strftime("%Y-%m-%d"), "environment_error": str(exc)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    ap.add_argument("--module", nargs="*", help="only the cases of these modules (file stems of mutations/)")
    ap.add_argument("--cpu", action="store_true", help="only the tests in *_cpu.py files, of the cases that have any")
    ap.add_argument("--gpu", action="store_true", help="only the cases with a test outside *_cpu.py files")
    ap.add_argument("--out", default="out")
    ap.add_argument("--baseline", action="store_true", help="first require the tests to pass unmodified")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per pytest run")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    cases = load_cases()
    if args.only:
        unknown = set(args.only) - {c["name"] for c in cases}
        if unknown:
            raise SystemExit(f"bite_check: no case named {sorted(unknown)}")
        cases = [c for c in cases if c["name"] in set(args.only)]
    if args.module:
        cases = [c for c in cases if c["module"].removesuffix(".py") in set(args.module)]
    if args.cpu:
        cases = [c for c in cases if cpu_tests(c["tests"])]
    if args.gpu:
        cases = [c for c in cases if len(cpu_tests(c["tests"])) < len(c["tests"])]
    if args.list:
        for c in cases:
            print(f"{c['name']:50s} {c['module']:20s} {c['target']}")
        return 0
    results = []
    for c in cases:
        rec = check_case(c, args.baseline, args.timeout, args.cpu)
        results.append(rec)
        print(f"{rec['outcome']:14s} {rec['name']:50s} {rec.get('summary', rec.get('detail', ''))}", flush=True)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    env = _environment()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "bite_check" + ("_" + "_".join(args.module) if args.module else "") + ".json"
    doc = {
        "commit": env["commit"],
        "date": env.get("date", time.strftime("%Y-%m-%d")),
        "gpu": env.get("gpu"),
        "environment": env,
        "cpu_tests_only": args.cpu,
        "counts": counts,
        "cases": results,
    }
    (Path(args.out) / name).write_text(json.dumps(doc, indent=1))
    print("bite_check:", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), f"of {len(results)}")
    return 0 if counts.get("bites", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
