"""docs/semantics.md cites only tests that exist (no GPU needed)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITE = re.compile(r"`(tests/[A-Za-z0-9_]+\.py)::([A-Za-z0-9_]+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_cited_test_exists():
    text = (ROOT / "docs" / "semantics.md").read_text()
    cites = CITE.findall(text)
    assert len(cites) >= 40, f"only {len(cites)} citations found: is the format still `tests/file.py::test_name`?"
    missing = [f"{f}::{t}" for f, t in cites if not (ROOT / f).is_file() or t not in _tests_in(ROOT / f)]
    assert missing == [], missing


def test_every_claim_line_cites_a_test():
    """Each bullet of the reference text ends with at least one test id (claims without one are
    not allowed in; context paragraphs are not bullets)."""
    text = (ROOT / "docs" / "semantics.md").read_text()
    bullets = re.split(r"\n(?=- )", text)
    uncited = [b.splitlines()[0][:80] for b in bullets if b.startswith("- ") and not CITE.search(b)]
    assert uncited == [], uncited
