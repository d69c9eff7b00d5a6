"""Do the tests bite? Put a known bug back into a copy of the tree and require its test to fail.

    PYTHONPATH=. python3 benchmarks/bite_check.py [--only NAME ...] [--module STEM ...] [--out DIR] [--list]

Each module in ``benchmarks/bite_cases/`` defines ``CASES``: a list of dicts with

``name``
    short id of the case (unique over all modules);
``why``
    one line: which feature the edits break (a fixed hole put back, a feature removed);
``tests``
    pytest node ids (``tests/test_x.py::test_y``) that must fail with the edits in place;
``edits``
    ``(path, old, new)`` triples applied in order to a fresh copy of the checkout; ``old`` must
    occur exactly once in the file (a stale case is reported as such, never silently skipped).

For each case the tree (``rawgraph``, ``kernels``, ``tests``, ``benchmarks``, ``pyproject.toml``)
is copied to a temporary folder, the edits are applied there, and pytest runs the case's tests
from that folder. The case *bites* when pytest exits 1 (tests ran and failed); exit 0 means the
tests pass with the feature broken (a test that cannot fail), any other exit (collection error,
a crash) is reported as ``error``. The unmodified tree is checked by the ordinary suite; run with
``--baseline`` to also run every case's tests once on the unmodified copy (they must pass).
Writes ``bite_check.json`` (with the commit) to ``--out``. The checkout is never modified.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPY = ("rawgraph", "kernels", "tests", "benchmarks", "pyproject.toml")


def load_cases() -> list[dict]:
    cases: list[dict] = []
    for path in sorted((ROOT / "benchmarks" / "bite_cases").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"bite_cases_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        for case in mod.CASES:
            case = dict(case, module=path.name)
            cases.append(case)
    names = [c["name"] for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"bite_check: duplicate case names {sorted(dup)}")
    return cases


def _copy_tree(dst: Path) -> None:
    for item in COPY:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, dst / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
        elif src.exists():
            shutil.copy2(src, dst / item)


def edited_texts(tree: Path, edits) -> dict[str, str] | str:
    """The files of ``tree`` the edits touch, as they read after all of them (nothing is
    written); a string saying why not when an edit does not apply (a missing file, a stale case)."""
    texts: dict[str, str] = {}
    for path, old, new in edits:
        if path not in texts:
            f = tree / path
            if not f.exists():
                return f"{path}: no such file"
            texts[path] = f.read_text()
        n = texts[path].count(old)
        if n != 1:
            return f"{path}: the text to replace occurs {n} times (stale case?): {old[:60]!r}"
        texts[path] = texts[path].replace(old, new)
    return texts


def apply_edits(tree: Path, edits) -> str | None:
    """Apply the edits in ``tree``; None when all applied, else why not."""
    texts = edited_texts(tree, edits)
    if isinstance(texts, str):
        return texts
    for path, text in texts.items():
        (tree / path).write_text(text)
    return None


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -9, f"timed out after {timeout} s\n{exc.stdout or ''}"
    return rc, out, time.perf_counter() - t0


def check_case(case: dict, baseline: bool, timeout: float) -> dict:
    rec = {k: case[k] for k in ("name", "why", "tests", "module")}
    with tempfile.TemporaryDirectory(prefix="bite_") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        if baseline:
            rc, out, _ = run_tests(tree, case["tests"], timeout)
            rec["baseline_rc"] = rc
            if rc != 0:
                rec.update(outcome="baseline-fails", tail=out[-1500:])
                return rec
        why_not = apply_edits(tree, case["edits"])
        if why_not:
            rec.update(outcome="stale", detail=why_not)
            return rec
        rc, out, secs = run_tests(tree, case["tests"], timeout)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    rec.update(
        rc=rc,
        seconds=round(secs, 1),
        summary=lines[-1] if lines else "",
        outcome="bites" if rc == 1 else ("passes-broken" if rc == 0 else "error"),
    )
    if rc != 1:
        rec["tail"] = out[-1500:]
    else:
        rec["failed"] = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:5]
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    ap.add_argument("--module", nargs="*", help="only the cases of these bite_cases modules (file stems)")
    ap.add_argument("--out", default="out")
    ap.add_argument("--baseline", action="store_true", help="first require the tests to pass unmodified")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per pytest run")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    cases = load_cases()
    if args.only:
        cases = [c for c in cases if c["name"] in set(args.only)]
    if args.module:
        cases = [c for c in cases if c["module"].removesuffix(".py") in set(args.module)]
    if args.list:
        for c in cases:
            print(f"{c['name']:40s} {c['module']:22s} {c['why']}")
        return 0
    results = []
    for c in cases:
        rec = check_case(c, args.baseline, args.timeout)
        results.append(rec)
        print(f"{rec['outcome']:14s} {rec['name']:40s} {rec.get('summary', rec.get('detail', ''))}", flush=True)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    sys.path.insert(0, str(ROOT))
    from rawgraph.bench.provenance import commit as provenance_commit  # the one every results JSON uses

    commit = provenance_commit()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "bite_check" + ("_" + "_".join(args.module) if args.module else "") + ".json"
    (Path(args.out) / name).write_text(
        json.dumps({"commit": commit, "date": time.strftime("%Y-%m-%d"), "counts": counts, "cases": results}, indent=1)
    )
    print("bite_check:", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), f"of {len(results)}")
    return 0 if counts.get("bites", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
