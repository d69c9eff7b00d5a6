"""The package's layout: one import direction between subpackages, and the module sizes."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rawgraph"
# Lower layers never import higher ones: driver objects, launch builders, graphs, updates,
# serving and control (side by side, neither importing the other), models, benchmarks.
LAYERS = {
    "runtime": 0,
    "ops": 1,
    "graphs": 2,
    "updates": 3,
    "serving": 4,
    "control": 4,
    "models": 5,
    "bench": 6,
    "doctor": 4,
    "multi": 4,
    "testing": 5,
    "trace": 5,
}  # testing: the pytest plugin and the fake driver, over the doctor; trace: over the doctor (its
# findings go into a trace) and the layers it times, below the benchmarks that run it
TOP = 7  # rawgraph/__init__.py, cli.py, __main__.py


def _layer(path: Path) -> tuple[str, int]:
    rel = path.relative_to(PKG)
    if len(rel.parts) == 1:
        return "", TOP
    return rel.parts[0], LAYERS[rel.parts[0]]


def _imports(path: Path) -> list[tuple[str, int]]:
    """(target subpackage, line) of every rawgraph import in a file, relative or absolute."""
    tree = ast.parse(path.read_text())
    pkg_parts = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
            mod = base + (node.module.split(".") if node.module else [])
            targets = [mod + [a.name] for a in node.names] if not node.module else [mod]
        elif node.module and node.module.split(".")[0] == "rawgraph":
            targets = [node.module.split(".")]
        else:
            continue
        for t in targets:
            if len(t) >= 2 and t[0] == "rawgraph" and t[1] in LAYERS:
                found.append((t[1], node.lineno))
    return found


SOURCES = sorted(p for p in PKG.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_run_one_way(path):
    sub, rank = _layer(path)
    for target, line in _imports(path):
        if target == sub:
            continue
        assert LAYERS[target] < rank, (
            f"{path.relative_to(ROOT)}:{line} imports rawgraph.{target} (a layer not below {sub or 'the top'})"
        )


def test_read_back_sits_below_graph():
    # nodes.py reads any graph back (foreign ones too): it needs the errors and the driver's
    # layout of a loaded function (runtime.module), never Graph, Capture or the updaters built on it.
    tree = ast.parse((PKG / "graphs" / "nodes.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
    assert imported <= {"runtime.errors", "runtime.module"}, imported


def test_every_subpackage_ships_in_the_wheel():
    """The wheel takes the whole rawgraph folder (hatchling's only-include), so every layer ships
    as long as it is a package; tests/test_wheel.py builds one and imports from it."""
    text = (ROOT / "pyproject.toml").read_text()
    assert 'only-include = ["rawgraph", "kernels", "_rawgraph_pytestplugin.py"]' in text
    for sub in LAYERS:
        assert (PKG / sub / "__init__.py").is_file(), sub


def _code_lines(fn):
    """Lines of a function after its docstring."""
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if len(body) == 1:
            return 0
        body = body[1:]
    return fn.end_lineno - body[0].lineno + 1


def test_no_long_function_in_the_core_without_a_comment_saying_why():
    """runtime, graphs and updates read top to bottom: a function of more than about 60 lines of
    code says in a comment why it is kept whole."""
    long = []
    for layer in ("runtime", "graphs", "updates"):
        for path in sorted((PKG / layer).glob("*.py")):
            text = path.read_text()
            for fn in ast.walk(ast.parse(text)):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(fn) > 60:
                    src = "\n".join(text.splitlines()[fn.lineno - 1 : fn.end_lineno])
                    if "kept whole" not in src:
                        long.append(f"{path.relative_to(PKG)}:{fn.name} ({_code_lines(fn)} lines)")
    assert long == [], long


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """Names assigned as ``self.<name>`` in the class's own methods: the count the closing figures
    use (``benchmarks/code_figures.py``), so the test and the figures agree."""
    import importlib.util
    import sys

    figures = sys.modules.get("rawgraph_code_figures")
    if figures is None:
        path = ROOT / "benchmarks" / "code_figures.py"
        spec = importlib.util.spec_from_file_location("rawgraph_code_figures", path)
        figures = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = figures  # its dataclasses look their module up while being made
        spec.loader.exec_module(figures)
    return figures._attributes(cls)


def test_no_class_over_15_attributes_without_a_reason():
    """A class holding more than about 15 instance attributes says why in a ``State:`` paragraph
    of its docstring (cuda.core's habit: what needs releasing in one small holder), and a count it
    states is the count."""
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            n = len(_instance_attributes(cls))
            doc = ast.get_docstring(cls) or ""
            state = re.search(r"^State: (?:(\d+) instance attributes)?", doc, re.M)
            where = f"{path.relative_to(PKG)}:{cls.name} ({n} attributes)"
            if n > 15 and state is None:
                missing.append(where)
            elif state is not None and state.group(1) and int(state.group(1)) != n:
                missing.append(f"{where}: its docstring says {state.group(1)}")
    assert missing == [], missing


# What belongs in git and benchmarks/NOTES.md, not in the product's code and comments.
_HISTORY = [
    (re.compile(r"\b[Ii]ssues? #?\d+"), "an issue number"),
    (re.compile(r"\b[Ss]ession \d+|\bthis session\b"), "session history"),
    (re.compile(r"(?<![\w-])20\d\d-\d\d-\d\d(?![\w-])"), "a date"),
    (re.compile(r"\bour (?:H100|H200|GPU|device)s?\b", re.I), "'our' device"),
    (re.compile(r"\bcommit [0-9a-f]{7,40}\b|`[0-9a-f]{7,40}`"), "a commit hash"),
]


@pytest.mark.parametrize("folder", ["rawgraph", "kernels"])
def test_no_history_in_the_product(folder):
    """Comments state invariants and say why; issue numbers, sessions, dates, commit hashes and
    which GPU someone measured on are history, kept in git and benchmarks/NOTES.md."""
    found = []
    for path in sorted((ROOT / folder).rglob("*")):
        if path.suffix not in (".py", ".cu", ".cuh"):
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{no}: {what}" for rx, what in _HISTORY if rx.search(line)]
    assert found == [], found
