"""The package is typed (no GPU needed): mypy over rawgraph/ finds no error, with the layers other
code stands on (runtime, graphs, updates, doctor) checked as ``mypy --strict`` checks them; the
public API is a static ``__all__`` type checkers read; pyright's ``--verifytypes`` finds those layers'
public symbols fully typed; and py.typed ships."""

import ast
import functools
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


@functools.lru_cache(maxsize=1)
def _mypy_strict() -> subprocess.CompletedProcess:
    """``mypy --strict rawgraph`` itself (its own cache, so the plain run keeps its own), run once
    for the tests that read it."""
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", ".mypy_cache/strict-all", "rawgraph"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1) and ("Found" in r.stdout or "Success" in r.stdout), (
        r.stdout[-3000:] + r.stderr[-2000:]
    )
    return r


def test_mypy_strict_finds_no_error_in_the_strict_layers():
    """``mypy --strict`` over the package: modules outside the four layers may have errors; only
    the layers' count."""
    _needs_mypy()
    paths = [f"rawgraph/{p}" for p in STRICT]
    r = _mypy_strict()
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


SUBPACKAGES = sorted(p.parent.name for p in (ROOT / "rawgraph").glob("*/__init__.py"))


def _bound_names(body):
    """Names a module's top-level statements bind (imports, defs, classes, assignments), looking
    into top-level ``try`` and ``if`` blocks (an optional import)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Try):
            names |= _bound_names(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                names |= _bound_names(handler.body)
        elif isinstance(node, ast.If):
            names |= _bound_names(node.body + node.orelse)
    return names


def test_subpackages_are_found():
    assert {"runtime", "graphs", "updates", "doctor", "ops", "serving", "models"} <= set(SUBPACKAGES)


@pytest.mark.parametrize("sub", SUBPACKAGES)
def test_every_subpackage_has_a_static_all_and_no_star_import(sub):
    """Each subpackage's ``__init__`` says what it re-exports the way ``mypy --strict`` and pyright
    read it: a literal ``__all__`` of names the ``__init__`` binds itself (imported by name, no
    ``import *``), each found on the imported package; private names (``ops._cdiv``, reached by
    other modules) may be re-exported with ``as`` but stay out of ``__all__``."""
    import importlib

    path = ROOT / "rawgraph" / sub / "__init__.py"
    tree = ast.parse(path.read_text())
    stars = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
    assert not stars, f"{path.relative_to(ROOT)}: star import on line(s) {stars}; name what is re-exported"
    found = [
        n
        for n in tree.body
        if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
        or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "__all__")
    ]
    assert len(found) == 1, f"{path.relative_to(ROOT)} assigns __all__ once, at the top level"
    value = found[0].value
    assert isinstance(value, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ), f"{path.relative_to(ROOT)}: __all__ is a literal list of strings, so type checkers read it"
    names = [e.value for e in value.elts]
    assert len(names) == len(set(names)), "no name twice"
    assert not [n for n in names if n.startswith("_")], "private names stay out of __all__"
    unbound = sorted(set(names) - _bound_names(tree.body))
    assert not unbound, f"{path.relative_to(ROOT)}: __all__ names what the __init__ does not bind: {unbound}"
    module = importlib.import_module(f"rawgraph.{sub}")
    assert list(module.__all__) == names
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, missing


def test_mypy_strict_sees_every_name_taken_from_a_subpackage():
    """No module of rawgraph takes a name from a package that does not export it (``Module
    "rawgraph.ops" does not explicitly export attribute "relu"``), under ``mypy --strict`` over the
    whole package (other errors outside the strict layers are not this test's business)."""
    _needs_mypy()
    r = _mypy_strict()
    hidden = [
        line for line in r.stdout.splitlines() if 'Module "rawgraph' in line and "does not explicitly export" in line
    ]
    assert not hidden, "\n".join(hidden[:50])


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
