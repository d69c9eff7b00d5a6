"""The package is typed (no GPU needed): mypy over rawgraph/ finds no error, with the layers other
code stands on (runtime, graphs, updates, doctor) checked as ``mypy --strict`` checks them; the
public API is a static ``__all__`` type checkers read; pyright's ``--verifytypes`` finds those layers'
public symbols fully typed; and py.typed ships."""

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STRICT = ("runtime", "graphs", "updates", "doctor")
# pyright's --verifytypes completeness score the whole package reaches (the public API's types known).
COMPLETENESS_TARGET = 0.95


def _needs_mypy():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]' brings it)")


def _toml(path):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    return tomllib.loads(path.read_text())


def test_mypy_finds_no_error():
    _needs_mypy()
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "rawgraph"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert "Success: no issues found" in r.stdout


def test_the_strict_layers_are_strict_in_the_config():
    """Plain ``mypy rawgraph`` (the test above, CI) checks the four layers strictly: the override
    names every one of them and turns on the per-module flags of ``--strict``."""
    config = _toml(ROOT / "pyproject.toml")["tool"]["mypy"]
    strict = [o for o in config.get("overrides", []) if o.get("disallow_any_generics")]
    assert len(strict) == 1, strict
    modules = set(strict[0]["module"])
    assert modules == {f"rawgraph.{p}" for p in STRICT} | {f"rawgraph.{p}.*" for p in STRICT}
    flags = {k: v for k, v in strict[0].items() if k != "module"}
    assert flags == {
        "disallow_any_generics": True,
        "disallow_subclassing_any": True,
        "disallow_untyped_calls": True,
        "disallow_untyped_defs": True,
        "disallow_incomplete_defs": True,
        "check_untyped_defs": True,
        "disallow_untyped_decorators": True,
        "warn_unused_ignores": True,
        "warn_return_any": True,
        "implicit_reexport": False,
        "strict_equality": True,
        "extra_checks": True,
    }
    # `strict = true` in an override would switch strict mode on for the whole package.
    assert "strict" not in config and all("strict" not in o for o in config.get("overrides", []))


def test_mypy_strict_finds_no_error_in_the_strict_layers():
    """``mypy --strict`` itself (its own cache, so the run above keeps its own). Modules outside the
    four layers that they import are checked too and may have errors: only the layers' count."""
    _needs_mypy()
    paths = [f"rawgraph/{p}" for p in STRICT]
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", ".mypy_cache/strict", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1) and ("Found" in r.stdout or "Success" in r.stdout), (
        r.stdout[-3000:] + r.stderr[-2000:]
    )
    ours = [line for line in r.stdout.splitlines() if line.startswith(tuple(f"{p}/" for p in paths))]
    assert not ours, "\n".join(ours[:50])


def _static_all():
    """The names of the ``__all__ = [...]`` assignment in rawgraph/__init__.py (a literal list)."""
    tree = ast.parse((ROOT / "rawgraph" / "__init__.py").read_text())
    found = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
    ]
    assert len(found) == 1, "rawgraph/__init__.py assigns __all__ once"
    value = found[0].value
    assert isinstance(value, ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ), "__all__ is a literal list of strings, so type checkers read it"
    return [e.value for e in value.elts]


def test_all_is_static_and_names_every_public_name():
    """``__all__`` is written out, and it is exactly what the computed one was: every public name
    the package binds when imported alone (``[n for n in dir() if not n.startswith("_")]`` at the end
    of ``__init__``), so no public name is lost and none is added by accident."""
    names = _static_all()
    assert len(names) == len(set(names)), "no name twice"
    code = "import json, rawgraph; print(json.dumps(sorted(n for n in vars(rawgraph) if not n.startswith('_'))))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(names) == json.loads(r.stdout)
    import rawgraph

    assert rawgraph.__all__ == names
    assert all(hasattr(rawgraph, n) for n in names)


def test_mypy_sees_the_installed_rawgraph_from_outside_the_checkout(tmp_path):
    """A user's script type-checks against the installed package: an editable install is a .pth
    file naming the checkout (hatchling's), not an import hook mypy cannot follow (setuptools' with a
    package-dir mapping gave ``import-not-found``). Skips where rawgraph is not installed from here."""
    _needs_mypy()
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("rawgraph")
    except PackageNotFoundError:
        pytest.skip("rawgraph is not installed (pip install -e '.[dev]')")
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if not direct.get("dir_info", {}).get("editable") or Path(direct["url"].removeprefix("file://")).resolve() != ROOT:
        pytest.skip("rawgraph is not installed editable from this checkout")
    (tmp_path / "user.py").write_text("from rawgraph.runtime.module import kernel_dir\nreveal_type(kernel_dir)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'Revealed type is "def () -> pathlib.Path"' in r.stdout, r.stdout


@pytest.fixture(scope="module")
def verifytypes():
    """pyright's ``--verifytypes rawgraph --ignoreexternal`` report (JSON), run once."""
    exe = shutil.which("pyright")
    if exe is None:
        pytest.skip("pyright is not installed (pip install -e '.[dev]' brings it, with Node.js from PyPI)")
    # The checkout goes first on the path, so the report is of this tree whatever is installed.
    # --outputjson and IGNORE_WARNINGS: the wrapper then asks no server for a newer version.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    r = subprocess.run(
        [exe, "--pythonpath", sys.executable, "--verifytypes", "rawgraph", "--ignoreexternal", "--outputjson"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        report = json.loads(r.stdout)
    except ValueError:
        pytest.fail(f"pyright gave no JSON report (exit {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
    completeness = report["typeCompleteness"]
    assert Path(completeness["packageRootDirectory"]).resolve() == ROOT / "rawgraph", "pyright read another rawgraph"
    return completeness


def _incomplete(completeness, prefixes):
    return [
        s["name"]
        for s in completeness["symbols"]
        if s["isExported"] and not s["isTypeKnown"] and s["name"].startswith(prefixes)
    ]


def test_verifytypes_finds_the_strict_layers_complete(verifytypes):
    """Every public symbol of runtime, graphs, updates and doctor has a known type."""
    bad = _incomplete(verifytypes, tuple(f"rawgraph.{p}." for p in STRICT))
    assert not bad, bad


def test_verifytypes_completeness_reaches_the_target(verifytypes):
    score = verifytypes["completenessScore"]
    assert score >= COMPLETENESS_TARGET, (
        f"pyright --verifytypes: {score:.1%} complete; not yet known: {_incomplete(verifytypes, ('rawgraph',))[:40]}"
    )


def test_py_typed_marker_is_packaged():
    assert (ROOT / "rawgraph" / "py.typed").is_file()
    # the wheel takes the whole package folder, py.typed with it (test_wheel.py checks the built wheel)
    wheel = _toml(ROOT / "pyproject.toml")["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert "rawgraph" in wheel["only-include"] and "py.typed" not in str(wheel.get("exclude", []))
