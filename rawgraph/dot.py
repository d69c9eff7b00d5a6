"""DOT export of graphs with readable labels, and a picture when Graphviz is installed.

The driver's own dump (``cuGraphDebugDotPrint``) is written as well: it shows what the driver
holds, while the labelled version names each kernel node by its launch (kernel, grid, and the plan
buffers its arguments are bound to) and draws programmatic (PDL) edges dashed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from cuda.bindings import driver

from .errors import call
from .graph import Graph


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: Graph, name: str = "rawgraph") -> str:
    """DOT text for any graph: known kernel nodes labelled from the node map, others by type."""
    known = {int(n.handle): n for n in graph.nodes}
    lines = [f"digraph {_quote(name)} {{", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for handle in graph.all_nodes():
        h = int(handle)
        node = known.get(h)
        if node is not None:
            l = node.launch
            bound = "\\n".join(f"{arg} -> {use.buffer}" for arg, use in l.uses.items())
            label = f"#{node.index} {l.label or l.kernel.short_name}\\n{l.kernel.name}\\ngrid {l.grid} block {l.block}"
            if bound:
                label += "\\n" + bound
            lines.append(f'  n{h:x} [label="{label}", kind="kernel"];')
        else:
            ntype = call(driver.cuGraphNodeGetType, handle)
            lines.append(f"  n{h:x} [label={_quote(ntype.name)}, kind={_quote(ntype.name)}];")
    for a, b, kind in graph.edge_types():
        style = ' [style=dashed, label="PDL"]' if kind == "programmatic" else ""
        lines.append(f"  n{a:x} -> n{b:x}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export(graph: Graph, path: str | Path, picture: bool = True) -> dict[str, Path]:
    """Write ``<path>.dot`` (labelled), ``<path>.driver.dot`` (``cuGraphDebugDotPrint``) and,
    when Graphviz's ``dot`` is on PATH and ``picture`` is set, ``<path>.png``.

    Returns the paths written.
    """
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    out = {"dot": base.with_suffix(".dot"), "driver_dot": base.with_suffix(".driver.dot")}
    out["dot"].write_text(to_dot(graph, base.stem))
    graph.debug_dot_print(str(out["driver_dot"]), int(driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE))
    exe = shutil.which("dot")
    if picture and exe:
        png = base.with_suffix(".png")
        subprocess.run([exe, "-Tpng", str(out["dot"]), "-o", str(png)], check=True, capture_output=True, timeout=120)
        out["png"] = png
    return out
