"""``check(graph)``: a static report of what makes a replay of a graph silently wrong.

A graph bakes addresses in: every kernel parameter, memcpy and memset holds the address it was
captured or built with, and a replay uses it whatever happened to the memory since. The doctor
reads back every node of any graph (:func:`rawgraph.graphs.nodes.read_graph`: rawgraph's own,
PyTorch's, CuPy's, a raw ``CUgraph``), asks the driver about each address (:mod:`.facts`) and
reports, per node, the classes below. Each class is decided from driver facts, never from names:

1. ``dangling``: a pointer into no live allocation (``cuPointerGetAttributes`` gives its null
   defaults), or an address whose allocation was freed and made again since a baseline report
   (another ``CU_POINTER_ATTRIBUTE_BUFFER_ID``);
2. ``stream-ordered-pool``: a pointer into memory of a stream-ordered pool
   (``CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`` set: ``cuMemAllocAsync`` / ``cudaMallocAsync``) outside
   the graph's own memory nodes: after its free the pool hands it to the next allocation;
3. ``host-memory``: a memcpy side in host memory, with its kind (pinned by ``cuMemHostAlloc``:
   ``cuMemHostGetFlags`` answers; registered: the driver knows it, ``cuMemHostGetFlags`` refuses;
   pageable or freed: the driver knows nothing) and whether its owner is alive;
4. ``allocator-freed``: a pointer into a block PyTorch's caching allocator no longer counts as
   active (``torch.cuda.memory_snapshot()``), outside graph private pools; the driver still has
   the memory, the allocator hands it to the next tensor. Against a baseline report: the block at
   the address changed since, or the address lies in an input named to the baseline
   (``inputs=``) whose owner has been collected since while the driver still has the memory (a
   weak reference the report keeps): the allocator gave it to another owner, possibly the whole
   block at the same address and size, which no allocator state tells apart;
5. ``unordered-overlap``: two nodes touching overlapping bytes, device or host memory alike, at
   least one writing, with no dependency path between them (``cuGraphGetEdges``); roles are known
   for rawgraph's launches (``Launch.uses``), memcpy and memset, "possible" for other kernels;
6. ``input-is-intermediate``: a graph input (what the caller rebinds or copies into) that a node of
   the graph writes, or that lies in a graph private pool of PyTorch's allocator where an
   intermediate freed earlier in the capture can have had the same address;
7. ``conditional-default``: a conditional node whose handle no kernel ordered before it sets and
   that has no default (``CU_GRAPH_COND_ASSIGN_DEFAULT``); also ``host-callback`` (host nodes and
   what keeps their callbacks alive) and ``closed-device-graph`` (a kernel launching a
   device-launched exec that has been closed).

The graph's own memory-node ranges (``cuGraphMemAllocNodeGetParams`` of its alloc nodes) are
the graph's: no class applies inside them.
"""

from __future__ import annotations

import numbers
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver

from ..graphs.graph import Graph, GraphExec, KernelNode
from ..graphs.nodes import (
    ChildGraphInfo,
    ConditionalInfo,
    HostInfo,
    KernelInfo,
    MemAllocInfo,
    MemcpyInfo,
    MemsetInfo,
    NodeInfo,
    read_graph,
)
from ..runtime.launch import KernelArgs
from ..runtime.memory import DeviceArray
from ._scan import as_range, scan_words
from .classify import classify_pointer, host_mappings
from .facts import PLAUSIBLE_HI, PLAUSIBLE_LO, PointerFacts, TorchView, pointer_facts
from .report import (
    _RANK,
    CLASS_NAMES,
    NAMES_7,
    SEVERITIES,
    DoctorError,
    Finding,
    InputRecord,  # noqa: F401
    Report,
)

UNKNOWN = object()  # a conditional handle's default the driver cannot say


# =========================================================================== the graph as read
@dataclass
class _Node:
    """A node of the graph tree with where it sits."""

    info: NodeInfo
    chain: tuple[tuple[int, int], ...]  # (graph handle, node handle) from the top graph down to it
    path: str
    kernel_node: KernelNode | None = None  # rawgraph's record of a kernel node, when it made it

    @property
    def label(self) -> str:
        if self.kernel_node is not None and self.kernel_node.launch.label:
            return self.kernel_node.launch.label
        return self.info.name if isinstance(self.info, KernelInfo) else ""


class _Order:
    """Happens-before between nodes anywhere in the tree, from each graph's edges."""

    def __init__(self) -> None:
        self._desc: dict[int, dict[int, int]] = {}  # graph -> node -> bitmask of descendants
        self._bit: dict[int, dict[int, int]] = {}
        self._rank: dict[int, dict[int, int]] = {}  # graph -> node -> topological rank

    def add_graph(self, graph: int, infos: list[NodeInfo]) -> None:
        ids = [i.id for i in infos]
        bit = {n: k for k, n in enumerate(ids)}
        succ: dict[int, list[int]] = {n: [] for n in ids}
        indeg = {n: 0 for n in ids}
        for i in infos:
            for d in i.dependencies:
                if d in succ:
                    succ[d].append(i.id)
                    indeg[i.id] += 1
        order, ready = [], [n for n in ids if indeg[n] == 0]
        while ready:
            n = ready.pop(0)
            order.append(n)
            for m in succ[n]:
                indeg[m] -= 1
                if indeg[m] == 0:
                    ready.append(m)
        desc: dict[int, int] = {}
        for n in reversed(order):
            mask = 0
            for m in succ[n]:
                mask |= (1 << bit[m]) | desc.get(m, 0)
            desc[n] = mask
        self._desc[graph], self._bit[graph] = desc, bit
        self._rank[graph] = {n: r for r, n in enumerate(order)}

    def before(self, a: _Node, b: _Node) -> bool:
        """``a`` finishes before ``b`` starts in every replay (a path of edges at the level where
        their places in the tree part; a node inside a child graph or body runs within its node)."""
        for (ga, na), (gb, nb) in zip(a.chain, b.chain):
            if na == nb:
                continue
            if ga != gb:  # bodies of one conditional node: never both in one pass
                return False
            return bool(self._desc[ga].get(na, 0) >> self._bit[ga][nb] & 1)
        return False  # one contains the other, or the same node

    def ordered(self, a: _Node, b: _Node) -> bool:
        """A path either way, or one node holds the other (a child graph node and its nodes)."""
        for (ga, na), (gb, nb) in zip(a.chain, b.chain):
            if na == nb:
                continue
            if ga != gb:
                return True  # different bodies of one conditional node never run in one pass
            return self.before(a, b) or self.before(b, a)
        return True

    def key(self, n: _Node) -> tuple[int, ...]:
        """A sort key in execution order (topological rank at each level)."""
        return tuple(self._rank.get(g, {}).get(h, 0) for g, h in n.chain)


@dataclass
class _Ref:
    """An address a node holds: a kernel parameter word, a memcpy side, a memset destination."""

    node: _Node
    address: int
    where: str
    known: bool  # certainly a pointer (memcpy/memset side, or a pointer argument rawgraph launched)
    whole: bool  # a whole 8-byte parameter (for a foreign kernel: the only words taken for pointers when nothing holds them)
    host: bool = False  # a memcpy side of host memory type
    nbytes: int = 0  # bytes touched from ``address`` (0: unknown)
    role: str = "unknown"  # "read", "write" or "unknown"


@dataclass
class _Conditional:
    handle: int | None
    default: Any = UNKNOWN  # int, None (made without a default), or UNKNOWN
    bodies: list[int] = field(default_factory=list)


# =========================================================================== front door
def _resolve(graph: Any) -> tuple[Any, Any, str]:
    """(the graph object or None, the CUgraph handle, a description).

    Takes a graph by type only: a rawgraph graph (or anything whose ``handle`` is a
    ``CUgraph``), a GraphExec or an object holding one as ``exec``, a ``CUgraph``, or an integer
    handle (``numbers.Integral``, never a bool). Anything else raises :class:`DoctorError`
    before any driver call: ``int()`` would turn a float into a truncated handle, a string into
    a parsed one, and another driver object (a ``CUstream``) into a handle of the wrong kind.
    """
    if isinstance(graph, GraphExec):
        graph = graph.graph
    exe = getattr(graph, "exec", None)
    if isinstance(exe, GraphExec) and not hasattr(graph, "handle"):
        graph = exe.graph
    if isinstance(graph, Graph) or isinstance(getattr(graph, "handle", None), driver.CUgraph):
        obj, handle = graph, graph.handle
    elif isinstance(graph, (driver.CUgraph, numbers.Integral)) and not isinstance(graph, bool):
        obj, handle = None, graph
    else:
        raise DoctorError(
            f"check() takes a Graph, a GraphExec, an adopted graph or a CUgraph, got {type(graph).__name__}"
        )
    value = int(handle)
    if not 0 <= value < 1 << 64:
        raise DoctorError(f"check() was given handle {value}, which is no 64-bit CUgraph")
    if not value:
        raise DoctorError("check() was given a null graph")
    if obj is None:
        return None, driver.CUgraph(value), f"CUgraph 0x{value:x}"
    if hasattr(obj, "_check_open"):
        obj._check_open()
    device = getattr(obj, "device", None)
    if device is not None:
        device.activate()
    kind = getattr(obj, "source", None)
    return obj, driver.CUgraph(value), f"{type(obj).__name__}{' from ' + kind if kind else ''} 0x{value:x}"


def check(
    graph: Any,
    *,
    inputs: Iterable[Any] = (),
    baseline: Report | None = None,
    conditions: Any = None,
    include_info: bool = False,
    facts: Callable[[int], PointerFacts] | None = None,
    torch: Any = None,
) -> Report:
    """Examine every node of ``graph`` for addresses and orderings a replay silently depends on.

    Parameters
    ----------
    graph : Graph, GraphExec, AdoptedGraph (``from_torch``, ``from_cupy``, ``adopt``) or CUgraph
        A rawgraph graph also brings its node map (which arguments are pointers, read or written,
        and into which plan buffer) and its records of conditional and host nodes.
    inputs : iterable of range-like
        The graph's inputs (what the caller copies into or rebinds): torch tensors, CuPy arrays,
        rawgraph buffers, ``(ptr, nbytes)``. A rawgraph plan's ``inputs`` are added (class 6).
        The report records each one (:attr:`Report.inputs`) with a weak reference to the object
        that owns its memory (a torch tensor's storage, shared by its views and ``detach()``; a
        CuPy array's root ``base``; a rawgraph view's ``owner``; else the object); a
        ``(ptr, nbytes)`` tuple or an object that refuses weak references has no identity. The
        report never keeps an input alive. Name an object that lives as long as the memory: a
        temporary foreign wrapper (``cupy.asarray(t)`` of a torch tensor) dies at once and later
        reads as freed.
    baseline : Report, optional
        An earlier report of the same graph (taken right after capture): an address whose
        allocation has another buffer id, another range, or another PyTorch block now was freed
        and made again since (class 1, 3 or 4); a node holding memory of an input named to the
        baseline whose owner has been collected since, while the driver still has the memory, is
        a class 4 error (the allocator gave it to someone else, whole block or not).
    conditions : dict or iterable, optional
        What the driver cannot say about conditional handles: ``{handle: default or None}``, or
        objects with ``value`` and ``default`` (``ConditionalHandle``) or ``cond``
        (``ConditionalNode``). rawgraph's captured conditional nodes are known without it.
    include_info : bool
        Keep findings of severity ``info`` (live pinned host copies, host callbacks, overlaps
        of two foreign kernels whose roles are unknown).
    facts : callable, optional
        ``address -> PointerFacts`` (default :func:`~rawgraph.doctor.facts.pointer_facts`, the
        driver); tests give made-up facts.
    torch : TorchView, False or None
        PyTorch's allocator view; None reads it when torch is already imported (never imports
        it), False skips it.

    Returns
    -------
    Report

    Raises
    ------
    DoctorError
        Not a graph, or a null one.
    ClosedError
        A rawgraph graph that has been closed.
    """
    t0 = time.perf_counter()
    obj, handle, desc = _resolve(graph)
    get_facts = facts or pointer_facts
    view = TorchView.current() if torch is None else (torch or None)
    named = _input_records(list(inputs or ()))
    report = Report(graph=desc)
    ranges = {(r.lo, r.hi) for r in named}
    # The baseline's inputs not named again carry on: a chain of reports keeps their identity.
    report.inputs = named + [r for r in (baseline.inputs if baseline is not None else ()) if (r.lo, r.hi) not in ranges]
    kmap: dict[int, KernelNode] = {
        int(k.handle): k for k in getattr(obj, "nodes", ()) or () if isinstance(k, KernelNode)
    }
    conds = _conditional_records(obj)
    said = _said_defaults(conditions)
    order = _Order()
    nodes = _flatten(read_graph(handle), int(handle), (), "", order, kmap, conds, report.notes)
    report.nodes = len(nodes)
    owned = [(n.info.dptr, n.info.dptr + n.info.bytesize) for n in nodes if isinstance(n.info, MemAllocInfo)]

    cond_values = {c.handle for c in conds.values() if c.handle is not None}
    cond_values |= {n.info.cond_handle for n in nodes if isinstance(n.info, ConditionalInfo) and not n.info.error}
    exec_values = _device_execs(obj)
    plan = getattr(obj, "plan", None)
    refs = _refs(nodes, plan, cond_values | set(exec_values), report.notes)

    cache: dict[int, PointerFacts] = {}

    def fact(addr: int) -> PointerFacts:
        got = cache.get(addr)
        if got is None:
            got = cache[addr] = get_facts(addr)
        return got

    found: list[Finding] = []
    seen: set[tuple[int, int, int]] = set()  # (node id, address, class): each said once
    host_spans: list[tuple[int, int]] | None = None
    for ref in refs:
        if _inside(ref.address, owned):
            continue
        if not ref.known and not ref.host:  # a foreign word: plain host memory is no device pointer
            if host_spans is None:
                host_spans = host_mappings()
            if _inside(ref.address, host_spans):
                continue
        f = fact(ref.address)
        block = view.block_of(ref.address) if view is not None and not ref.host else None
        if block is not None:
            report.torch_blocks[ref.address] = block
        old = baseline.facts.get(ref.address) if baseline is not None else None
        old_block = baseline.torch_blocks.get(ref.address) if baseline is not None else None
        for cls, sev, owner, advice in classify_pointer(ref.known, ref.whole, ref.host, f, block, old, old_block):
            key = (ref.node.info.id, ref.address, cls)
            if key in seen:
                continue
            seen.add(key)
            found.append(_finding(ref.node, cls, CLASS_NAMES[cls], sev, ref.address, owner, advice, ref.where))
    report.facts = cache
    if baseline is not None:
        found += _freed_inputs(baseline.inputs, refs, order, cache, view, seen)

    # A foreign word gives a start, never a length: it overlaps a known range when it lies in it.
    found += _overlaps(
        [r for r in refs if r.known or _inside(r.address, owned) or (r.address in cache and cache[r.address].live)],
        order,
    )
    found += _inputs(obj, refs, order, named, plan, view)
    found += _conditionals(nodes, order, conds, said)
    found += _host_nodes(nodes, obj)
    found += _closed_execs(nodes, exec_values)
    if not include_info:
        found = [f for f in found if f.severity != "info"]
    where = {n.info.id: order.key(n) for n in nodes}
    found.sort(key=lambda f: (_RANK[f.severity], where.get(f.node_id, ()), f.cls))
    report.findings = found
    report.seconds = time.perf_counter() - t0
    return report


def _inside(addr: int, ranges: list[tuple[int, int]]) -> bool:
    return any(lo <= addr < hi for lo, hi in ranges)


def _finding(
    node: _Node,
    cls: int,
    name: str,
    severity: str,
    address: int,
    owner: str,
    advice: str,
    where: str = "",
    related: tuple[str, ...] = (),
) -> Finding:
    info = node.info
    return Finding(
        cls,
        name,
        severity,
        info.index,
        info.kind,
        node.label,
        int(address),
        owner,
        advice,
        node.path,
        info.id,
        where,
        related,
    )


# =========================================================================== pure classification
# =========================================================================== reading the tree
def _conditional_records(obj: Any) -> dict[int, _Conditional]:
    """What rawgraph recorded of conditional nodes (their handle, default and bodies), by node
    handle: the driver gives a conditional node's parameters back only through
    ``cuGraphNodeGetParams`` (exported from CUDA 13.2 drivers on), and never says whether a
    handle has a default."""
    out: dict[int, _Conditional] = {}
    for h, kind, detail in getattr(obj, "other_nodes", ()) or ():
        cond = getattr(detail, "cond", None)
        if kind == "conditional" and cond is not None:
            out[int(h)] = _Conditional(
                int(cond.value), cond.default, [int(b.handle) for b in getattr(detail, "bodies", ())]
            )
    # A built graph keeps the CUgraphNodeParams it gave cuGraphAddNode, in the order its
    # conditional nodes were added (the driver wrote each node's body graphs into them).
    built = [n for n in getattr(obj, "built_nodes", ()) or () if getattr(n, "kind", "") == "conditional"]
    params = [
        p
        for p in getattr(obj, "keep", ()) or ()
        if isinstance(p, driver.CUgraphNodeParams) and p.type == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    ]
    if len(built) == len(params):
        for n, p in zip(built, params):
            c = p.conditional
            size = int(c.size)
            out.setdefault(
                int(n.handle), _Conditional(int(c.handle), UNKNOWN, [int(b) for b in list(c.phGraph_out)[:size]])
            )
    return out


def _said_defaults(conditions: Any) -> dict[int, Any]:
    if not conditions:
        return {}
    if isinstance(conditions, dict):
        return {int(k): v for k, v in conditions.items()}
    out: dict[int, Any] = {}
    for c in conditions:
        c = getattr(c, "cond", c)
        out[int(getattr(c, "value", c))] = getattr(c, "default", None)
    return out


def _flatten(
    infos: list[NodeInfo],
    graph: int,
    chain: tuple[tuple[int, int], ...],
    prefix: str,
    order: _Order,
    kmap: dict[int, KernelNode],
    conds: dict[int, _Conditional],
    notes: list[str],
) -> list[_Node]:
    order.add_graph(graph, infos)
    out: list[_Node] = []
    for info in infos:
        here = chain + ((graph, info.id),)
        path = f"{prefix}{info.index}"
        node = _Node(info, here, path, kmap.get(info.id))
        out.append(node)
        if isinstance(info, ChildGraphInfo):
            out += _flatten(info.nodes, info.child, here, f"{path}/", order, kmap, conds, notes)
        elif isinstance(info, ConditionalInfo):
            bodies, body_nodes = info.bodies, info.body_nodes
            rec = conds.get(info.id)
            if info.error:
                if rec is not None and rec.bodies:
                    # The driver cannot give the node back; rawgraph's record of it can.
                    info.cond_handle = rec.handle if rec.handle is not None else 0
                    bodies = rec.bodies
                    body_nodes = [read_graph(driver.CUgraph(b)) for b in bodies]
                else:
                    notes.append(f"conditional node {path}: {info.error}; its bodies were not examined")
            for i, (b, body) in enumerate(zip(bodies, body_nodes)):
                out += _flatten(body, int(b), here, f"{path}/{i}.", order, kmap, conds, notes)
    return out


def _device_execs(obj: Any) -> dict[int, GraphExec]:
    """Execs a rawgraph graph keeps for device launches (a launcher graph's target), by handle."""
    out: dict[int, GraphExec] = {}
    pending = list(getattr(obj, "keep", ()) or ()) + list(getattr(obj, "device_launch_keep", ()) or ())
    seen: set[int] = set()
    while pending:
        o = pending.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        exe = o if isinstance(o, GraphExec) else getattr(o, "_exec", None)
        if isinstance(exe, GraphExec):
            out[int(exe.handle)] = exe
        pending += list(getattr(o, "device_launch_keep", ()) or ())
        if not isinstance(o, GraphExec):
            pending += list(getattr(o, "keep", ()) or ())
    return out


def _refs(nodes: list[_Node], plan: Any, skip: set[int], notes: list[str]) -> list[_Ref]:
    """Every address every node holds."""
    refs: list[_Ref] = []
    extents = {}
    if plan is not None:
        extents = {int(v.ptr): int(v.nbytes) for v in getattr(plan, "buffers", {}).values()}
    for n in nodes:
        info = n.info
        if isinstance(info, KernelInfo):
            if n.kernel_node is not None:
                launch = n.kernel_node.launch
                args = KernelArgs.from_bytes(launch.args.spec, n.kernel_node.captured_args)
                for arg, use in launch.uses.items():
                    value = int(args[arg])
                    if value:
                        refs.append(
                            _Ref(n, value, f"arg {arg}", True, True, nbytes=extents.get(value, 0), role=use.role)
                        )
                continue
            if info.params is None:
                notes.append(f"kernel node {n.path} ({info.name or '?'}): parameters unreadable ({info.layout_error})")
                continue
            for hit in scan_words(info.params, info.layout, PLAUSIBLE_LO, PLAUSIBLE_HI):
                if hit.value in skip:
                    continue
                p = None if hit.param is None or info.layout is None else info.layout[hit.param]
                whole = p is not None and p.size == 8 and hit.offset == 0
                where = f"param {hit.param} +{hit.offset}" if hit.param is not None else f"bytes +{hit.layout_offset}"
                refs.append(_Ref(n, hit.value, where, False, whole))
        elif isinstance(info, MemcpyInfo):
            for side, addr, kind, pitch, rows in (
                ("src", info.src, info.src_type, info.src_pitch, info.src_height),
                ("dst", info.dst, info.dst_type, info.dst_pitch, info.dst_height),
            ):
                if not addr or kind == "array":
                    continue
                span = _span(info.width, info.height, info.planes, pitch, rows)
                refs.append(
                    _Ref(
                        n,
                        addr,
                        f"memcpy.{side}",
                        True,
                        True,
                        host=(kind == "host"),
                        nbytes=span,
                        role="read" if side == "src" else "write",
                    )
                )
        elif isinstance(info, MemsetInfo) and info.dst:
            width = info.width * max(info.element_size, 1)
            refs.append(
                _Ref(
                    n,
                    info.dst,
                    "memset.dst",
                    True,
                    True,
                    nbytes=_span(width, info.height, 1, info.pitch, 0),
                    role="write",
                )
            )
    return refs


def _span(width: int, height: int, planes: int, pitch: int, slice_height: int) -> int:
    """Bytes from the first to one past the last byte a pitched copy or memset touches."""
    height, planes = max(height, 1), max(planes, 1)
    if pitch <= 0 or (height == 1 and planes == 1):
        return max(width, 1)
    rows = (planes - 1) * max(slice_height, height) + (height - 1)
    return rows * pitch + max(width, 1)


# =========================================================================== classes 5, 6, 7
def _overlaps(refs: list[_Ref], order: _Order) -> list[Finding]:
    """Class 5: two nodes touching overlapping bytes, one writing, with no path between them.

    Host memory counts as device memory does: two unordered copies into one pinned buffer race
    in every replay just the same. (With unified addressing no host range overlaps a device
    allocation, so a host side only ever meets other references to the same host memory.)"""
    spans = sorted(refs, key=lambda r: r.address)
    out: list[Finding] = []
    done: set[tuple[int, int]] = set()
    active: list[_Ref] = []
    for r in spans:
        lo = r.address
        active = [a for a in active if a.address + max(a.nbytes, 1) > lo]
        for a in active:
            if a.node.info.id == r.node.info.id:
                continue
            pair = (min(a.node.info.id, r.node.info.id), max(a.node.info.id, r.node.info.id))
            if pair in done:
                continue
            roles = {a.role, r.role}
            if "write" not in roles and "unknown" not in roles:
                continue  # two readers
            if order.ordered(a.node, r.node):
                continue
            done.add(pair)
            known = a.role != "unknown" and r.role != "unknown"
            if known:
                sev, why = "error", f"{a.node.path} {a.role}s and {r.node.path} {r.role}s these bytes"
            elif "write" in roles:
                sev, why = (
                    "warning",
                    (
                        "one side writes (its role is known); the other is a kernel whose role the "
                        "driver cannot say: possible"
                    ),
                )
            else:
                sev, why = "info", "both are kernels whose roles the driver cannot say: possible, if one writes"
            first, second = sorted((a, r), key=lambda x: order.key(x.node))
            out.append(
                _finding(
                    second.node,
                    5,
                    CLASS_NAMES[5],
                    sev,
                    second.address,
                    f"overlaps node {first.node.path} ({first.where}) with no dependency path between them: {why}",
                    "add the missing edge (cuGraphAddDependencies, or capture both on one stream / join "
                    "the streams) so the reader runs after the writer",
                    second.where,
                    (first.node.path,),
                )
            )
        active.append(r)
    return out


def _inputs(
    obj: Any, refs: list[_Ref], order: _Order, named: list[InputRecord], plan: Any, view: TorchView | None
) -> list[Finding]:
    """Class 6: an input written inside the graph, or sitting where an intermediate was."""
    # (label, lo, hi, the plan's own launches or None): for a plan input, only a write by one of
    # the plan's launches makes it an intermediate; a node outside the plan that writes it (a
    # slot pool's gather, a loop's copy in) is how the graph feeds its plan, not aliasing.
    ranges: list[tuple[str, int, int, Any]] = [(r.label, r.lo, r.hi, None) for r in named]
    if plan is not None and obj is not None:
        own = {id(launch) for launch in getattr(plan, "launches", ())}
        for name in getattr(plan, "inputs", ()):
            buf = plan.buffers.get(name)
            if buf is not None:
                ranges.append((f"plan input {name!r}", int(buf.ptr), int(buf.ptr) + int(buf.nbytes), own))
    out: list[Finding] = []
    for label, lo, hi, own in ranges:
        touching = _touching(refs, lo, hi, order)
        if not touching:
            continue
        writers = [
            r
            for r in touching
            if r.role == "write"
            and (own is None or (r.node.kernel_node is not None and id(r.node.kernel_node.launch) in own))
        ]
        primary = (writers or touching)[0].node
        related = tuple(dict.fromkeys(r.node.path for r in touching if r.node is not primary))
        if writers:
            w = writers[0]
            out.append(
                _finding(
                    w.node,
                    6,
                    CLASS_NAMES[6],
                    "error",
                    w.address,
                    f"{label} [0x{lo:x}, +{hi - lo}) is written by this node inside the graph",
                    "the input is also an intermediate: a copy into it before a replay is overwritten, "
                    "and rebinding it by address moves the intermediate too; give the input its own "
                    "buffer (allocate it before capture, outside the graph's pool)",
                    w.where,
                    related,
                )
            )
            continue
        block = view.block_of(lo) if view is not None else None
        if block is not None and block.private:
            first = touching[0]
            out.append(
                _finding(
                    first.node,
                    6,
                    CLASS_NAMES[6],
                    "warning",
                    first.address,
                    f"{label} [0x{lo:x}, +{hi - lo}) lies in a PyTorch graph private pool (segment "
                    f"0x{block.segment:x}, pool {block.pool}): an intermediate freed earlier in the capture "
                    f"can have had this address; this is the first node holding it",
                    "allocate static inputs before capture (outside torch.cuda.graph), so the private pool "
                    "cannot alias them with intermediates",
                    first.where,
                    related,
                )
            )
    return out


def _touching(refs: list[_Ref], lo: int, hi: int, order: _Order) -> list[_Ref]:
    """The device references into ``[lo, hi)``, in execution order."""
    return sorted(
        (r for r in refs if not r.host and r.address < hi and lo < r.address + max(r.nbytes, 1)),
        key=lambda r: order.key(r.node),
    )


def _memory_owner(x: Any) -> Any:
    """The object whose life is that of the memory ``x`` views: a torch tensor's storage
    (``untyped_storage()``: torch keeps one Python object per storage, alive exactly as long as
    the storage, shared by every view and ``detach()``), a CuPy array's ``base`` walked to its
    root, a rawgraph ``DeviceArray``'s ``owner``; else ``x``."""
    storage = getattr(x, "untyped_storage", None)
    if storage is not None and hasattr(x, "data_ptr"):
        try:
            return storage()
        except Exception:  # a tensor without storage (a subclass, a meta tensor): its _base below
            pass
    for _ in range(64):  # a chain of views, never a cycle; bounded all the same
        if hasattr(x, "data_ptr") and hasattr(x, "element_size"):  # torch.Tensor
            up = getattr(x, "_base", None)
        elif isinstance(x, DeviceArray):
            up = x.owner
        elif hasattr(getattr(x, "data", None), "ptr") and hasattr(x, "nbytes"):  # CuPy
            up = getattr(x, "base", None)
        else:
            up = None
        if up is None:  # never `or`: a tensor's truth value is refused
            return x
        x = up
    return x


def _input_records(inputs: list[Any]) -> list[InputRecord]:
    """Each input's range, and a weak reference to the owner of its memory (None for a
    ``(ptr, nbytes)`` tuple or an object that refuses weak references)."""
    out: list[InputRecord] = []
    for i, x in enumerate(inputs):
        lo, n = as_range(x)
        ref = None
        if not isinstance(x, tuple):
            try:
                ref = weakref.ref(_memory_owner(x))
            except TypeError:
                ref = None
        out.append(InputRecord(f"input {i}", lo, lo + n, ref))
    return out


def _freed_inputs(
    named: Iterable[InputRecord],
    refs: list[_Ref],
    order: _Order,
    facts: dict[int, PointerFacts],
    view: TorchView | None,
    seen: set[tuple[int, int, int]] | None = None,
) -> list[Finding]:
    """Class 4 against a baseline: a node holding memory of an input named to the baseline whose
    owner has been collected since, while the driver still has the memory (``facts``: the facts
    of the addresses examined; an address the driver no longer knows is class 1's). One finding
    per node (its first address in the input's range, in execution order); ``seen`` holds the
    ``(node id, address, class)`` already reported (a class 4 or class 1 there says it already),
    and takes the new ones."""
    seen = set() if seen is None else seen
    out: list[Finding] = []
    for rec in named:
        if rec.ref is None or rec.ref() is not None:
            continue
        touching = _touching(refs, rec.lo, rec.hi, order)
        done: set[int] = set()
        for r in touching:
            node_id = r.node.info.id
            f = facts.get(r.address)
            if node_id in done or f is None or not f.live:
                continue
            done.add(node_id)
            key = (node_id, r.address, 4)
            if key in seen or (node_id, r.address, 1) in seen:  # said already (class 1: allocated again)
                continue
            seen.add(key)
            block = view.block_of(r.address) if view is not None else None
            now = (
                f"; PyTorch block [0x{block.address:x}, +{block.size}) is {block.state} now (segment "
                f"0x{block.segment:x})"
                if block is not None
                else ""
            )
            out.append(
                _finding(
                    r.node,
                    4,
                    CLASS_NAMES[4],
                    "error",
                    r.address,
                    f"{rec.label} [0x{rec.lo:x}, +{rec.nbytes}) named at the baseline has been freed since "
                    f"(its owner was collected) while the driver still has the memory{now}: it belongs to "
                    f"whoever the allocator gave it to",
                    "keep the input alive as long as the graph is replayed (the graph holds only its "
                    "address), or rebind the node to a live buffer",
                    r.where,
                )
            )
    return out


def _conditionals(
    nodes: list[_Node], order: _Order, conds: dict[int, _Conditional], said: dict[int, Any]
) -> list[Finding]:
    """Class 7: a conditional handle nobody sets before its node and that has no default."""
    out: list[Finding] = []
    kernels = [n for n in nodes if isinstance(n.info, KernelInfo)]
    for n in nodes:
        info = n.info
        if not isinstance(info, ConditionalInfo):
            continue
        rec = conds.get(info.id)
        # A handle may be any 64-bit value, 0 included: unknown only when neither the driver nor a
        # record of rawgraph gives it.
        handle = (
            rec.handle if rec is not None and rec.handle is not None else (None if info.error else info.cond_handle)
        )
        if handle is None:
            continue
        setters = [k for k in kernels if _holds(k, handle)]
        if any(order.before(s, n) for s in setters):
            continue
        default = rec.default if rec is not None else UNKNOWN
        if default is UNKNOWN:
            default = said.get(handle, UNKNOWN)
        if default is not UNKNOWN and default is not None:
            continue
        sev = "error" if default is None else "warning"
        how = (
            "made without CU_GRAPH_COND_ASSIGN_DEFAULT"
            if default is None
            else "the driver cannot say whether it was made with CU_GRAPH_COND_ASSIGN_DEFAULT (pass conditions=)"
        )
        late = "; set only by node(s) not ordered before it" if setters else ""
        out.append(
            _finding(
                n,
                7,
                "conditional-default",
                sev,
                0,
                f"{info.cond_type or '?'} handle 0x{handle:x}: no kernel ordered before the node sets it, "
                f"and it is {how}{late}",
                "give the handle a default (cuGraphConditionalHandleCreate with "
                "CU_GRAPH_COND_ASSIGN_DEFAULT) or set it (cudaGraphSetConditional) in a kernel the node "
                "depends on",
                "handle",
                tuple(s.path for s in setters),
            )
        )
    return out


def _holds(k: _Node, value: int) -> bool:
    info = k.info
    if k.kernel_node is not None:
        blob = k.kernel_node.captured_args
        return bool(scan_words(blob, None, value, value + 1))
    return (
        isinstance(info, KernelInfo)
        and info.params is not None
        and bool(scan_words(info.params, None, value, value + 1))
    )


def _host_nodes(nodes: list[_Node], obj: Any) -> list[Finding]:
    """Class 7 (info): host nodes, and whether rawgraph keeps their callbacks alive."""
    out: list[Finding] = []
    kept = [o for o in getattr(obj, "keep", ()) or () if type(o).__name__ == "HostCallback"]
    for n in nodes:
        if isinstance(n.info, HostInfo):
            owner = f"host function 0x{n.info.fn:x}, user data 0x{n.info.user_data:x}; " + (
                f"the graph keeps {len(kept)} HostCallback(s) alive (and an exec holds them past its "
                f"destruction until queued replays ran)"
                if kept
                else "nothing rawgraph knows keeps the function or its user data alive"
            )
            out.append(
                _finding(
                    n,
                    7,
                    "host-callback",
                    "info",
                    n.info.user_data,
                    owner,
                    "the callback and everything its user data points at must outlive every replay, "
                    "queued ones too; it must make no CUDA call",
                )
            )
    return out


def _closed_execs(nodes: list[_Node], execs: dict[int, GraphExec]) -> list[Finding]:
    """Class 7: a kernel holding the handle of a device-launched exec that has been closed."""
    out: list[Finding] = []
    closed = {h: e for h, e in execs.items() if e.closed}
    if not closed:
        return out
    for n in nodes:
        for h in closed:
            if isinstance(n.info, KernelInfo) and _holds(n, h):
                out.append(
                    _finding(
                        n,
                        7,
                        "closed-device-graph",
                        "error",
                        h,
                        f"device-launched exec 0x{h:x} has been closed (cuGraphExecDestroy)",
                        "a replay launches a destroyed exec from the device: keep the DeviceGraph open "
                        "as long as any graph that launches it",
                        "exec handle",
                    )
                )
    return out


__all__ = ["CLASS_NAMES", "DoctorError", "Finding", "NAMES_7", "Report", "SEVERITIES", "check", "classify_pointer"]
