"""The rendered documentation (issue 45, section 5), no GPU needed: ``mkdocs build --strict``
(warnings are errors) over ``mkdocs.yml`` into a temporary folder, so the README's test command
builds it; and every example and every public subpackage has its page."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "mkdocs.yml"
# Public subpackages without an API page, and why.
NO_PAGE = {"bench": "benchmark drivers behind `rawgraph bench`, not a library API"}


def _config_text() -> str:
    if not CONFIG.is_file():
        pytest.skip("mkdocs.yml is not in this tree (the sdist does not carry the docs site configuration)")
    return CONFIG.read_text(encoding="utf-8")


def _subpackages() -> list[str]:
    return sorted(
        p.parent.name
        for p in (ROOT / "rawgraph").glob("*/__init__.py")
        if not p.parent.name.startswith("_") and p.parent.name not in NO_PAGE
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def test_every_public_subpackage_has_an_api_page():
    nav = _config_text()
    names = _subpackages()
    assert {"runtime", "graphs", "doctor", "testing"} <= set(names), names
    for name in names:
        page = ROOT / "docs" / "api" / f"{name}.md"
        assert page.is_file(), f"no API page for rawgraph.{name}: add {page.relative_to(ROOT)} and its nav entry"
        assert re.search(rf"^::: rawgraph\.{name}$", page.read_text(encoding="utf-8"), re.M), page
        assert f"api/{name}.md" in nav, f"api/{name}.md is not in the nav of mkdocs.yml"


def test_every_example_has_a_page_that_includes_it():
    nav = _config_text()
    examples = sorted((ROOT / "examples").glob("*.py"))
    assert examples
    for ex in examples:
        page = ROOT / "docs" / "examples" / f"{ex.stem}.md"
        assert page.is_file(), (
            f"no page for {ex.name}: add {page.relative_to(ROOT)} (a snippet include) and its nav entry"
        )
        assert f'--8<-- "examples/{ex.name}"' in page.read_text(encoding="utf-8"), page
        assert f"examples/{ex.stem}.md" in nav, f"examples/{ex.stem}.md is not in the nav of mkdocs.yml"


def test_mkdocs_build_strict(tmp_path):
    _config_text()
    missing = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python") if not _installed(m)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the docs extra: pip install -e '.[dev]' brings it)")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about its successor
    # From a scratch folder: every path in mkdocs.yml is relative to the file, none to the caller.
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(CONFIG), "-d", str(site)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "WARNING" not in r.stderr, r.stderr[-5000:]
    graphs = (site / "api" / "graphs" / "index.html").read_text(encoding="utf-8")
    assert 'id="rawgraph.graphs.graph.Graph"' in graphs and "_repr_svg_" not in graphs  # members, privates left out
    # the docstrings' Sphinx roles are code, linked where the target has a heading (docs/hooks/docstrings.py)
    assert ":class:<code>" not in graphs and ":meth:<code>" not in graphs
    # :class:`~rawgraph.RawKernel` (a re-export) links to where the class is defined
    assert 'href="../runtime/#rawgraph.runtime.rawkernel.RawKernel"><code>RawKernel</code></a>' in graphs
    # the README's images are in the site at the path the README links (docs/hooks/readme_images.py)
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert all((site / rel).is_file() for rel in images), images
    example = (site / "examples" / "own_kernel" / "index.html").read_text(encoding="utf-8")
    assert "--8&lt;--" not in example and "axpb" in example  # the file itself, not the include line
    assert "Set up on a fresh machine" in (site / "readme" / "index.html").read_text(encoding="utf-8")
    assert (site / "semantics" / "index.html").is_file() and (site / "testing" / "index.html").is_file()
