"""A failing test that drew random inputs names its seed, and the seed replays the same inputs."""

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
ROOT = str(Path(__file__).resolve().parent.parent)


@pytest.fixture(autouse=True)
def _rawgraph_importable(monkeypatch):
    # pytester runs pytest in a temporary folder: make rawgraph importable there as it is here.
    # tests/ too: the copied conftest.py imports its helper module singletons from there.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    )


FAILING = """
def test_draws_then_fails(rng):
    print("draw", rng.integers(1 << 40))
    assert False
"""


def test_failure_reports_the_seed_and_the_seed_replays(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(FAILING)
    monkeypatch.delenv("RAWGRAPH_TEST_SEED", raising=False)
    first = pytester.runpytest_subprocess("-q")
    first.assert_outcomes(failed=1)
    text = first.stdout.str()
    seed_line = next(line for line in text.splitlines() if line.startswith("rng seed: "))
    seed = seed_line.split()[2]
    draw = next(line for line in text.splitlines() if line.startswith("draw "))
    monkeypatch.setenv("RAWGRAPH_TEST_SEED", seed)
    again = pytester.runpytest_subprocess("-q")
    again.assert_outcomes(failed=1)
    assert draw in again.stdout.str().splitlines()
    assert f"rng seed: {seed}" in again.stdout.str()


def test_passing_tests_report_nothing(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("def test_ok(rng):\n    assert rng.integers(10) < 10\n")
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(passed=1)
    assert "rng seed" not in result.stdout.str()
