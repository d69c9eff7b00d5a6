"""Put one known bug back in this pytest process: the mutation ``$RAWGRAPH_MUTATION`` names.

Registered by ``tests/conftest.py`` only when that variable is set (``benchmarks/bite_check.py``
sets it per case; by hand: ``RAWGRAPH_MUTATION=NAME python -m pytest -q TEST``). The mutations are
the records of ``benchmarks/mutations/``. At ``pytest_configure``, before any test module is
imported, the plugin resolves the target, sets the broken replacement on its owner (class or
module) and rebinds every attribute of a loaded ``rawgraph.*`` module that is the original (a
``from x import f`` made earlier); modules imported later are rebound again after collection and
before each test. One line at session start names the mutation applied. An unknown name, or a
target that does not resolve or cannot be mutated, is a usage error (exit 4): never a silent pass.

Tests that run rawgraph in a child interpreter (``subprocess`` with ``sys.executable``) must see
the same bug: the plugin puts ``benchmarks/mutations/_child`` (a ``sitecustomize`` that applies
the mutation once the child imports rawgraph) first on ``PYTHONPATH``, in this process's
environment and in every ``env=`` a test hands to ``subprocess.Popen`` (tests set their own
``PYTHONPATH=<checkout>``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = "RAWGRAPH_MUTATION"
CATALOGUE = ROOT / "benchmarks" / "mutations"
CHILD_HOOK = CATALOGUE / "_child"
PACKAGE = "rawgraph_mutations"  # the import name of benchmarks/mutations (not an installed package)

_state: dict[str, Any] = {}


def load_catalogue() -> Any:
    """``benchmarks/mutations`` imported as the package ``rawgraph_mutations`` (by path: the
    checkout's ``benchmarks`` folder is not importable)."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, CATALOGUE / "__init__.py", submodule_search_locations=[str(CATALOGUE)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def _with_hook(env: Mapping[str, str]) -> dict[str, str]:
    out = dict(env)
    out[ENV] = os.environ[ENV]
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(CHILD_HOOK) not in paths:
        out["PYTHONPATH"] = os.pathsep.join([str(CHILD_HOOK), *paths])
    return out


def _mutate_children_too() -> None:
    os.environ["PYTHONPATH"] = _with_hook(os.environ)["PYTHONPATH"]
    real_init = subprocess.Popen.__init__
    if getattr(real_init, "_rawgraph_mutation", False):
        return

    @functools.wraps(real_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # env is Popen's 11th parameter (after args); tests pass it by keyword
        if kwargs.get("env") is not None:
            kwargs["env"] = _with_hook(kwargs["env"])
        elif len(args) > 10 and args[10] is not None:
            args = (*args[:10], _with_hook(args[10]), *args[11:])
        real_init(self, *args, **kwargs)

    __init__._rawgraph_mutation = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get(ENV, "")
    try:
        catalogue = load_catalogue()
        mutation = catalogue.by_name(name)
    except LookupError as exc:
        raise pytest.UsageError(f"{ENV}={name!r}: {exc}") from None
    try:
        applied = catalogue.apply(mutation)
    except Exception as exc:  # an import error, a missing attribute, a stale text edit
        raise pytest.UsageError(
            f"{ENV}={name}: cannot apply the mutation to {mutation.target}: {type(exc).__name__}: {exc}"
        ) from None
    _state["applied"] = applied
    _state["modules"] = len(sys.modules)
    _mutate_children_too()


def _rebind_if_new_modules() -> None:
    applied = _state.get("applied")
    if applied is not None and len(sys.modules) != _state["modules"]:
        applied.rebind_aliases()
        _state["modules"] = len(sys.modules)


def pytest_sessionstart(session: pytest.Session) -> None:
    applied = _state["applied"]
    m = applied.mutation
    also = f"; also rebound {', '.join(applied.aliases)}" if applied.aliases else ""
    line = f"rawgraph mutation applied: {m.name} -> {m.target} ({m.kind}{also})"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line, yellow=True, bold=True)
    else:
        print(line, file=sys.stderr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _rebind_if_new_modules()


def pytest_runtest_setup(item: pytest.Item) -> None:
    _rebind_if_new_modules()
