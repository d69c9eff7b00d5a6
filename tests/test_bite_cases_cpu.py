"""The bite cases stay runnable as the code changes (``benchmarks/bite_check.py`` runs them).

The mutations of ``benchmarks/mutations/`` (every case is one): names unique; every target resolves
(its module imports, the attribute exists) and ``mutate`` turns the original into something that
can stand in its place; every listed test file defines the listed test. Nothing here reads the
source text of the code a mutation breaks, so a reformat or a move changes none of it: only a
renamed or deleted target (or test) fails here. The two text kinds (a scoped source edit, a
kernel-text edit) are only resolved: building them reads source text, and a stale one is
reported by ``bite_check.py`` as ``error`` (the plugin's usage error), never as a bite.

End to end, quick ones only: an unknown mutation is a usage error, and two cases whose CPU tests
take seconds bite (one in the test process, one in the child interpreter its test starts). The
14 fault-injection cases need about 13 s each: ``bite_check.py --cpu`` runs them.
"""

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_script

ROOT = Path(__file__).resolve().parent.parent
BITE = bench_script("bite_check")
CATALOGUE = BITE.load_catalogue()
MUTATIONS = CATALOGUE.all_mutations()


def test_names_are_unique_and_no_case_was_lost():
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert len(names) >= 51  # the 51 cases of the text-edit form, before the mutations
    assert not list((ROOT / "benchmarks").glob("bite_cases/*.py"))  # the text-edit form is gone


def test_every_catalogue_module_is_listed_and_has_cases():
    on_disk = {p.stem for p in (ROOT / "benchmarks" / "mutations").glob("*.py") if not p.name.startswith("_")}
    assert on_disk == set(CATALOGUE.MODULES)
    assert {CATALOGUE.module_of(m) for m in MUTATIONS} == on_disk


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_the_target_resolves_and_the_mutation_can_stand_in_for_it(mutation):
    target = CATALOGUE.resolve(mutation.target)
    assert mutation.target.startswith("rawgraph.") and mutation.why and mutation.tests
    if mutation.kind in CATALOGUE.TEXT_KINDS:
        assert callable(target.original)
        return
    broken = mutation.mutate(target.original)
    assert broken is not target.original
    assert CATALOGUE.compatible(target.original, broken), (type(target.original), type(broken))


@functools.cache
def _defined(path: str) -> frozenset:
    """Top-level functions and classes of a test file, and ``Class::method`` for their methods."""
    tree = ast.parse((ROOT / path).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return frozenset(names)


ALL_TESTS = sorted({t for m in MUTATIONS for t in m.tests})


@pytest.mark.parametrize("node_id", ALL_TESTS)
def test_every_listed_test_exists(node_id):
    path, _, name = node_id.partition("::")
    assert (ROOT / path).is_file(), f"no test file {path}"
    assert name.split("[")[0] in _defined(path), f"{path} defines no {name.split('[')[0]}"


def test_an_unknown_mutation_is_a_usage_error():
    env = dict(os.environ, RAWGRAPH_MUTATION="no-such-mutation", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "tests/test_philox_cpu.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert "no mutation named 'no-such-mutation'" in r.stdout + r.stderr


# exec_release_without_fence breaks the hold in this process; alloc_address_read_after_free is
# caught only in the child interpreter its test starts (the plugin's sitecustomize hook).
QUICK = ["exec_release_without_fence", "alloc_address_read_after_free"]


@pytest.mark.parametrize("name", QUICK)
def test_a_quick_cpu_case_bites(name):
    case = next(c for c in BITE.load_mutations() if c["name"] == name)
    rec = BITE.check_case(case, baseline=False, timeout=300, only_cpu=True)
    assert rec["outcome"] == "bites", rec
