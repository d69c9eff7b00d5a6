"""The code is linted and formatted as ``pyproject.toml``'s ruff settings say (pyflakes, bugbear,
pyupgrade, isort; the formatter at the code's line length): ``ruff check`` and ``ruff format --check``
are clean over the checkout, as CI runs them."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args):
    """This interpreter's ruff (the dev extra's pin: its formatter's style changes between minor
    releases, so another ruff on the PATH could disagree with the tree)."""
    try:
        version = importlib.metadata.version("ruff")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("ruff is not installed (pip install -e '.[dev]' brings it)")
    if not version.startswith("0.17."):
        pytest.skip(f"ruff {version} is not the dev extra's 0.17 (its formatting may differ)")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_finds_nothing():
    r = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_would_change_nothing():
    r = _ruff("format", "--no-cache", "--check", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_lint_settings_select_what_ci_promises():
    """The rule families the package's lint promises are selected, and the line length is the code's."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads pyproject.toml with tomllib")
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert {"F", "B", "UP", "I"} <= set(ruff["lint"]["select"])
    assert ruff["line-length"] == 120
