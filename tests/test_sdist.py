"""The source distribution carries what its own tests need: built from this checkout, unpacked
elsewhere, every test in it is collected with no error (no module the tests import is missing)."""

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the tests import or read besides the test files themselves.
SUPPORT = [
    "tests/conftest.py",
    "tests/fakedriver.py",
    "tests/helpers.py",
    "tests/fault_cases.py",
    "tests/faultinject.py",
    "tests/singletons.py",
    "_rawgraph_pytestplugin.py",
    "rawgraph/testing/fakedriver.py",
    "LICENSE",
    "README.md",
    "docs/semantics.md",
    "docs/testing/test_my_graph.py",
    "examples/own_kernel.py",
    "benchmarks/gemm_sweep.py",
    "kernels/matmul.cu",
]


@pytest.mark.slow
def test_the_sdists_tests_collect(tmp_path):
    # build.__main__, not build: a checkout's build/ output folder is importable as a namespace "build"
    if importlib.util.find_spec("build.__main__") is None:
        pytest.skip("the build package is not installed (pip install -e '.[dev]' brings it)")
    r = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path / "dist"), str(ROOT)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0 and (
        "No matching distribution" in r.stdout + r.stderr or "NewConnectionError" in r.stdout + r.stderr
    ):
        pytest.skip("cannot build an sdist here: no package index reachable for its build requirements")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("rawgraph-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (src,) = (tmp_path / "src").iterdir()
    missing = [f for f in SUPPORT if not (src / f).is_file()]
    assert missing == [], missing
    assert not (src / "benchmarks" / "results").exists()  # recorded results stay in the repository
    # Its own code first on the path (not this checkout's), as a user who unpacked it runs it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS",)}
    env["PYTHONPATH"] = str(src)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert "tests collected" in last and "error" not in last, r.stdout[-2000:]
    n_files = len(list((src / "tests").glob("test_*.py")))
    assert n_files == len(list((ROOT / "tests").glob("test_*.py")))
