"""The readability figures of a tree of rawgraph (issue 44's before and after), from its source alone.

    python3 benchmarks/code_figures.py [TREE ...] [--json FILE]

For each TREE (a checkout or an unpacked ``git archive``; default this checkout): lines and files
in ``rawgraph/`` and in its core (``runtime``, ``graphs``, ``updates``), functions and how many
run over 50, 60 and 100 lines (a function's lines: its ``def`` line to its last line, decorators
and docstring included, as the issue counted them), the longest five, and the classes with more
than 15 instance attributes (distinct ``self.NAME = ...`` targets in the class's own methods).
Type-checker and duplicate figures come from their own tools (``mypy``, ``pyright
--verifytypes``, ``duplicates``), not from here.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

CORE = ("runtime", "graphs", "updates")


@dataclass
class Figures:
    tree: str
    files: int = 0
    lines: int = 0
    core_files: int = 0
    core_lines: int = 0
    functions: int = 0
    over_50: int = 0
    over_60: int = 0
    over_100: int = 0
    core_over_60: list[str] = field(default_factory=list)
    longest: list[str] = field(default_factory=list)
    big_classes: dict[str, int] = field(default_factory=dict)


def _attributes(cls: ast.ClassDef) -> set[str]:
    names = set()
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                        names.add(e.attr)
    return names


def measure(tree: Path) -> Figures:
    pkg = tree / "rawgraph"
    fig = Figures(str(tree))
    sizes: list[tuple[int, str]] = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        text = path.read_text()
        n = len(text.splitlines())
        core = rel.parts[0] in CORE
        fig.files += 1
        fig.lines += n
        fig.core_files += core
        fig.core_lines += n if core else 0
        module = ast.parse(text)
        for node in ast.walk(module):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                fig.functions += 1
                fig.over_50 += length > 50
                fig.over_60 += length > 60
                fig.over_100 += length > 100
                sizes.append((length, f"{rel}:{node.name}"))
                if core and length > 60:
                    fig.core_over_60.append(f"{rel}:{node.name} {length}")
            elif isinstance(node, ast.ClassDef):
                count = len(_attributes(node))
                if count > 15:
                    fig.big_classes[f"{rel}:{node.name}"] = count
    fig.longest = [f"{name} {n}" for n, name in sorted(sizes, reverse=True)[:5]]
    fig.big_classes = dict(sorted(fig.big_classes.items(), key=lambda kv: -kv[1]))
    return fig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="*", default=[str(Path(__file__).resolve().parent.parent)])
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    out = [measure(Path(t)) for t in args.trees]
    for fig in out:
        print(
            f"{fig.tree}: {fig.lines} lines in {fig.files} files (core {fig.core_lines} in {fig.core_files}); "
            f"{fig.functions} functions, {fig.over_50} over 50 lines, {fig.over_60} over 60, {fig.over_100} over 100"
        )
        print(f"  longest: {', '.join(fig.longest)}")
        print(f"  core functions over 60: {', '.join(fig.core_over_60) or 'none'}")
        print(f"  classes over 15 attributes: {fig.big_classes}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(f) for f in out], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
