"""The package is typed: mypy over rawgraph/ finds no error, and py.typed ships (no GPU needed)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]' brings it)")
    r = subprocess.run([sys.executable, "-m", "mypy", "rawgraph"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert "Success: no issues found" in r.stdout


def test_py_typed_marker_is_packaged():
    assert (ROOT / "rawgraph" / "py.typed").is_file()
    assert '"rawgraph" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()
