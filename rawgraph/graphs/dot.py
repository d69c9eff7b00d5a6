"""DOT export of graphs with readable labels, and a picture when Graphviz is installed.

The driver's own dump (``cuGraphDebugDotPrint``) is written as well: it shows what the driver
holds, while the labelled version names each kernel node by its launch (kernel, grid, and the plan
buffers its arguments are bound to), labels every other node from what :mod:`rawgraph.graphs.nodes`
reads back (a foreign kernel's name and grid, memcpy/memset addresses and sizes, events,
allocations, conditionals), draws child graphs and conditional bodies as clusters, and draws
programmatic (PDL) edges dashed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from cuda.bindings import driver

from .nodes import (
    ChildGraphInfo,
    ConditionalInfo,
    EventInfo,
    KernelInfo,
    MemAllocInfo,
    MemcpyInfo,
    MemFreeInfo,
    MemsetInfo,
    NodeInfo,
    graph_edges,
    read_graph,
)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def node_label(info: NodeInfo) -> str:
    """A node's label text (lines joined by ``\\n``), for nodes without a rawgraph launch."""
    if isinstance(info, KernelInfo):
        layout = "?" if info.layout is None else str(len(info.layout))
        return (
            f"kernel {_short(info.name or '?')}\\ngrid {info.grid} block {info.block}"
            f"\\nsmem {info.shared_mem} params {layout}"
        )
    if isinstance(info, MemcpyInfo):
        return f"memcpy {info.direction} {info.nbytes} B\\n0x{info.src:x} -> 0x{info.dst:x}"
    if isinstance(info, MemsetInfo):
        return (
            f"memset {info.nbytes} B at 0x{info.dst:x}\\nvalue 0x{info.value:x} "
            f"({info.element_size} B x {info.width} x {info.height})"
        )
    if isinstance(info, EventInfo):
        return f"{info.kind}\\nevent 0x{info.event:x}"
    if isinstance(info, MemAllocInfo):
        return f"mem_alloc {info.bytesize} B\\n0x{info.dptr:x}"
    if isinstance(info, MemFreeInfo):
        return f"mem_free\\n0x{info.dptr:x}"
    if isinstance(info, ChildGraphInfo):
        return f"child graph 0x{info.child:x}\\n{len(info.nodes)} nodes"
    if isinstance(info, ConditionalInfo):
        if info.error:
            return f"conditional\\n({info.error})"
        return f"conditional {info.cond_type}\\nhandle 0x{info.cond_handle:x}\\n{info.size} bodies"
    return info.kind if info.kind != "host" else "host"


# Fill colour of a node carrying a finding of each severity (the worst one wins).
SEVERITY_COLOURS = {"error": "#ff9999", "warning": "#ffd27f", "info": "#cfe8ff"}
_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def finding_marks(findings: Any) -> dict[int, tuple[str, list[str]]]:
    """Per node handle: (fill colour, label lines) for the findings on it.

    ``findings`` is anything iterable of objects with ``node_id``, ``severity``, ``cls`` and
    ``name`` (``rawgraph.doctor.Finding``; a ``Report`` gives its ``findings``): the graph layer
    never imports the doctor, it only reads those fields."""
    items = getattr(findings, "findings", findings) or ()
    worst: dict[int, str] = {}
    lines: dict[int, list[str]] = {}
    for f in items:
        h = int(f.node_id)
        sev = str(f.severity)
        if h not in worst or _SEVERITY_RANK.get(sev, 3) < _SEVERITY_RANK.get(worst[h], 3):
            worst[h] = sev
        text = f"! {sev}: {f.cls} {f.name}"
        if text not in lines.setdefault(h, []):
            lines[h].append(text)
    return {h: (SEVERITY_COLOURS.get(worst[h], "#dddddd"), lines[h]) for h in worst}


def _style(h: int, marks: dict[int, tuple[str, list[str]]]) -> tuple[list[str], str]:
    """The label lines and the extra attributes (fill) of node ``h``'s findings."""
    got = marks.get(h)
    if got is None:
        return [], ""
    colour, extra = got
    return extra, f', style=filled, fillcolor="{colour}"'


def _emit(
    infos: list[NodeInfo],
    known: dict[int, Any],
    lines: list[str],
    indent: str,
    graph: Any,
    marks: dict[int, tuple[str, list[str]]] | None = None,
) -> None:
    marks = marks or {}
    for info in infos:
        h = info.id
        node = known.get(h)
        if node is not None:
            l = node.launch
            bound = "\\n".join(f"{arg} -> {use.buffer}" for arg, use in l.uses.items())
            label = f"#{node.index} {l.label or l.kernel.short_name}\\n{l.kernel.name}\\ngrid {l.grid} block {l.block}"
            if bound:
                label += "\\n" + bound
            extra, fill = _style(h, marks)
            label += "".join("\\n" + _quote(t)[1:-1] for t in extra)
            lines.append(f'{indent}n{h:x} [label="{label}", kind="kernel"{fill}];')
            continue
        kind = "foreign_kernel" if info.kind == "kernel" else info.kind
        extra, fill = _style(h, marks)
        text = "\\n".join([node_label(info)] + extra)
        lines.append(f"{indent}n{h:x} [label={_quote(text)}, kind={_quote(kind)}{fill}];")
        bodies: list[tuple[str, list[NodeInfo], int]] = []
        if isinstance(info, ChildGraphInfo):
            bodies.append((f"child graph of n{h:x}", info.nodes, info.child))
        elif isinstance(info, ConditionalInfo):
            bodies += [
                (f"{info.cond_type} body {i} of n{h:x}", b, g)
                for i, (b, g) in enumerate(zip(info.body_nodes, info.bodies))
            ]
        for i, (title, body, handle) in enumerate(bodies):
            lines.append(f"{indent}subgraph cluster_{h:x}_{i} {{")
            lines.append(f"{indent}  label={_quote(title)}; style=dashed;")
            _emit(body, known, lines, indent + "  ", handle, marks)
            for a, b, _kind in graph_edges(driver.CUgraph(handle)):
                lines.append(f"{indent}  n{a:x} -> n{b:x};")
            if body:  # the node "contains" its body: a dotted edge to the body's first node
                lines.append(f'{indent}  n{h:x} -> n{body[0].id:x} [style=dotted, arrowhead=none, kind="contains"];')
            lines.append(f"{indent}}}")


def to_dot(graph: Any, name: str = "rawgraph", findings: Any = None) -> str:
    """DOT text for any graph (a rawgraph Graph, an adopted graph, or a raw ``CUgraph``): kernel
    nodes of rawgraph's node map labelled from their launch, every other node from what the
    driver returns for it (:func:`rawgraph.graphs.nodes.read_graph`).

    ``findings`` (a ``rawgraph.doctor`` ``Report`` or its findings) colours each node carrying one
    by its worst severity and adds a line per finding to its label (see :func:`finding_marks`)."""
    known = {int(n.handle): n for n in getattr(graph, "nodes", [])}
    if hasattr(graph, "_check_open"):
        graph._check_open()
    if hasattr(graph, "device"):
        graph.device.activate()
    handle = getattr(graph, "handle", graph)
    lines = [f"digraph {_quote(name)} {{", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    _emit(read_graph(handle), known, lines, "  ", handle, finding_marks(findings) if findings is not None else None)
    for a, b, kind in graph_edges(handle):
        style = ' [style=dashed, label="PDL"]' if kind == "programmatic" else ""
        lines.append(f"  n{a:x} -> n{b:x}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export(graph: Any, path: str | Path, picture: bool = True, findings: Any = None) -> dict[str, Path]:
    """Write ``<path>.dot`` (labelled), ``<path>.driver.dot`` (``cuGraphDebugDotPrint``) and,
    when Graphviz's ``dot`` is on PATH and ``picture`` is set, ``<path>.png``; ``findings`` as
    for :func:`to_dot`.

    Returns the paths written.

    See Also
    --------
    cuGraphDebugDotPrint : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    out = {"dot": base.with_suffix(".dot"), "driver_dot": base.with_suffix(".driver.dot")}
    out["dot"].write_text(to_dot(graph, base.stem, findings))
    flags = int(driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)
    if hasattr(graph, "debug_dot_print"):
        graph.debug_dot_print(str(out["driver_dot"]), flags)
    else:
        from ..runtime.errors import call

        call(driver.cuGraphDebugDotPrint, getattr(graph, "handle", graph), str(out["driver_dot"]).encode(), flags)
    exe = shutil.which("dot")
    if picture and exe:
        png = base.with_suffix(".png")
        subprocess.run([exe, "-Tpng", str(out["dot"]), "-o", str(png)], check=True, capture_output=True, timeout=120)
        out["png"] = png
    return out
