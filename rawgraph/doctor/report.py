"""What the graph doctor reports: :class:`Finding` (one thing in a graph that can make a replay
silently wrong: class, severity, node, address, owner, advice) and :class:`Report` (the findings of
one :func:`~rawgraph.doctor.check.check`, the driver facts they were decided from, text and rich
tables, JSON). The classes are listed in :mod:`rawgraph.doctor.check`.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

from ..runtime.errors import RawgraphError
from .facts import PointerFacts, TorchBlock

CLASS_NAMES: dict[int, str] = {
    1: "dangling",
    2: "stream-ordered-pool",
    3: "host-memory",
    4: "allocator-freed",
    5: "unordered-overlap",
    6: "input-is-intermediate",
    7: "conditional-default",
}
# Class 7 covers three things a replay depends on beyond addresses; each has its own short name.
NAMES_7 = ("conditional-default", "host-callback", "closed-device-graph")
SEVERITIES = ("error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


class DoctorError(RawgraphError, ValueError):
    """``check`` or ``verify`` was given something it cannot examine."""


@dataclass(frozen=True)
class Finding:
    """One thing in a graph that can make a replay silently wrong.

    Attributes
    ----------
    cls : int
        The class, 1 to 7 (see :mod:`rawgraph.doctor.check`).
    name : str
        Its short name (``"dangling"``, ``"stream-ordered-pool"``, ``"host-memory"``,
        ``"allocator-freed"``, ``"unordered-overlap"``, ``"input-is-intermediate"``,
        ``"conditional-default"``, ``"host-callback"``, ``"closed-device-graph"``).
    severity : str
        ``"error"`` (a replay is wrong now, or the graph says it will be), ``"warning"`` (it is
        right only while an owner outside the graph keeps its promise) or ``"info"``.
    node_index : int
        The node's position in ``cuGraphGetNodes`` order within its graph.
    node_type : str
        ``"kernel"``, ``"memcpy"``, ...
    kernel : str
        The kernel's name (``cuFuncGetName``; a rawgraph launch's label where it has one).
    address : int
        The address concerned (0 where none).
    owner : str
        What owns that address, as the driver and the allocators describe it.
    advice : str
    path : str
        Where the node sits: ``"3"`` for top-level node 3, ``"3/0.1"`` for node 1 of body 0 of node 3.
    node_id : int
        The ``CUgraphNode`` handle (DOT annotation uses it).
    where : str
        Which part of the node holds the address (``"param 2 +0"``, ``"memcpy.src"``, ...).
    related : tuple of str
        Paths of the other nodes involved (the other side of an overlap, the setters of a handle).

    See Also
    --------
    cuGraphGetNodes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuFuncGetName : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    cls: int
    name: str
    severity: str
    node_index: int
    node_type: str
    kernel: str
    address: int
    owner: str
    advice: str
    path: str = ""
    node_id: int = 0
    where: str = ""
    related: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["address"] = f"0x{self.address:x}"
        d["node_id"] = f"0x{self.node_id:x}"
        d["related"] = list(self.related)
        return d

    def __str__(self) -> str:
        who = f"{self.node_type} {self.kernel}".strip()
        at = f" at 0x{self.address:x}" if self.address else ""
        return (
            f"[{self.severity}] {self.cls}/{self.name}: node {self.path or self.node_index} ({who}){at}: {self.owner}"
        )


@dataclass(frozen=True)
class InputRecord:
    """An input named to :func:`~rawgraph.doctor.check.check` (``inputs=``): its address range and
    who owned the memory, so a later check against this report tells the same memory given to
    another owner (same address, same size, same allocator state) from the input.

    Attributes
    ----------
    label : str
        ``"input 0"``, ``"input 1"``, ... in the order the inputs were given.
    lo, hi : int
        The address range ``[lo, hi)`` at the time of the check.
    ref : weakref.ref or None
        A weak reference to the object that owns the memory: a torch tensor's storage
        (``untyped_storage()``, shared by its views), a CuPy array's root ``base``, a rawgraph
        view's ``owner``, else the object itself. None where there is no identity: a ``(ptr, nbytes)``
        tuple, or an object that refuses weak references. Never a strong reference: a report does
        not keep an input alive.
    """

    label: str
    lo: int
    hi: int
    ref: weakref.ref[Any] | None = field(default=None, compare=False)

    @property
    def nbytes(self) -> int:
        return self.hi - self.lo

    @property
    def alive(self) -> bool | None:
        """Whether the owner is alive now; None when unknown (no identity was recorded)."""
        return None if self.ref is None else self.ref() is not None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "lo": f"0x{self.lo:x}", "nbytes": self.nbytes, "alive": self.alive}


@dataclass
class Report:
    """What :func:`check` found.

    Attributes
    ----------
    findings : list of Finding
        Most severe first, then in node order.
    graph : str
        The graph examined (its kind and handle).
    nodes : int
        How many nodes were read (child graphs and bodies included).
    seconds : float
        Wall time of the check.
    facts : dict of int -> PointerFacts
        The driver facts of every address examined: a later ``check(graph, baseline=report)``
        compares with them (an allocation freed and made again at the same address).
    torch_blocks : dict of int -> TorchBlock
        PyTorch's block of each address, when its allocator was seen.
    notes : list of str
        What could not be examined, and why.
    inputs : list of InputRecord
        The inputs named to the check (``inputs=``), each with a weak reference to the object that
        owned its memory, then those of the baseline report not named again: a later
        ``check(graph, baseline=report)`` reports a node that still holds memory of an input whose
        owner has been collected since (class 4), even where the allocator gave the same block,
        at the same address and size, to another owner.
    """

    findings: list[Finding] = field(default_factory=list)
    graph: str = ""
    nodes: int = 0
    seconds: float = 0.0
    facts: dict[int, PointerFacts] = field(default_factory=dict)
    torch_blocks: dict[int, TorchBlock] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    inputs: list[InputRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No finding of severity error or warning."""
        return not any(f.severity in ("error", "warning") for f in self.findings)

    def of_class(self, cls: int | str) -> list[Finding]:
        """The findings of one class (by number or short name)."""
        return [f for f in self.findings if (f.cls == cls if isinstance(cls, int) else f.name == cls)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the findings, counts by class and severity, the notes, and the inputs named
        (label, ``lo`` in hex, ``nbytes``, ``alive``: whether their owner is alive, null when
        unknown)."""
        by_class: dict[str, int] = {}
        by_sev: dict[str, int] = {}
        for f in self.findings:
            by_class[f.name] = by_class.get(f.name, 0) + 1
            by_sev[f.severity] = by_sev.get(f.severity, 0) + 1
        return {
            "graph": self.graph,
            "nodes": self.nodes,
            "seconds": self.seconds,
            "ok": self.ok,
            "by_class": by_class,
            "by_severity": by_sev,
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "inputs": [r.to_dict() for r in self.inputs],
        }

    def rows(self) -> list[tuple[str, ...]]:
        """One row of text per finding: severity, class, node, type/kernel, address, owner, advice."""
        return [
            (
                f.severity,
                f"{f.cls} {f.name}",
                f.path or str(f.node_index),
                f"{f.node_type} {_short(f.kernel)}".strip(),
                f"0x{f.address:x}" if f.address else "-",
                f.owner,
                f.advice,
            )
            for f in self.findings
        ]

    HEADERS = ("severity", "class", "node", "node type / kernel", "address", "owner", "advice")

    def __str__(self) -> str:
        head = f"rawgraph doctor: {self.graph}: {self.nodes} nodes, {len(self.findings)} finding(s)"
        if not self.findings:
            return head + " -- clean" + "".join(f"\n  note: {n}" for n in self.notes)
        lines = [head]
        for f in self.findings:
            lines.append(f"  {f}")
            if f.related:
                lines.append(f"      with node(s) {', '.join(f.related)}")
            lines.append(f"      -> {f.advice}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def rich_table(self) -> Any:
        """The findings as a ``rich.table.Table`` (needs rich; imported here only)."""
        from rich.table import Table

        table = Table(title=f"rawgraph doctor: {self.graph} ({self.nodes} nodes)", show_lines=True)
        for h in self.HEADERS:
            table.add_column(h, overflow="fold")
        colour = {"error": "bold red", "warning": "yellow", "info": "cyan"}
        for row, f in zip(self.rows(), self.findings):
            table.add_row(*row, style=colour.get(f.severity))
        return table

    def __rich__(self) -> Any:
        return self.rich_table()

    def _repr_html_(self) -> str:
        """The report as HTML, for notebooks: the summary line of ``str(report)``, a table of the
        findings (the columns of :meth:`rows`, each row tinted by its severity as the DOT export
        colours the node, the other nodes involved under the node), and the notes. Every text
        is escaped (``html.escape``)."""
        from html import escape

        from ..graphs.dot import SEVERITY_COLOURS

        head = f"rawgraph doctor: {self.graph}: {self.nodes} nodes, {len(self.findings)} finding(s)"
        if not self.findings:
            head += " -- clean"
        out = ['<div class="rawgraph-doctor-report">', f"<p><strong>{escape(head)}</strong></p>"]
        if self.findings:
            out.append('<table class="rawgraph-doctor-findings">')
            out.append("<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in self.HEADERS) + "</tr></thead>")
            out.append("<tbody>")
            for row, f in zip(self.rows(), self.findings):
                cells = [escape(c) for c in row]
                if f.related:
                    cells[2] += f"<br>with {escape(', '.join(f.related))}"
                colour = SEVERITY_COLOURS.get(f.severity)
                style = f' style="background-color: {escape(colour)}; color: black"' if colour else ""
                out.append(
                    f'<tr class="{escape(f.severity)}"{style}>'
                    + "".join(f'<td style="text-align: left">{c}</td>' for c in cells)
                    + "</tr>"
                )
            out.append("</tbody></table>")
        if self.notes:
            out.append("<ul>" + "".join(f"<li>note: {escape(n)}</li>" for n in self.notes) + "</ul>")
        out.append("</div>")
        return "\n".join(out)


def _short(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."
