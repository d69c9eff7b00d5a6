"""Explicit graph construction: add nodes and edges one by one (``cuGraphCreate`` + ``cuGraphAdd*Node``).

Capture records what a stream *would* have run; a :class:`GraphBuilder` says what the graph *is*:
each node is added with its dependencies (``deps=``), so independent work needs no second stream,
and the graph's shape is written down rather than inferred. ``build()`` returns the same
:class:`~rawgraph.graphs.graph.Graph` a capture returns, with a node map of
:class:`~rawgraph.graphs.graph.KernelNode` for the kernel nodes, so ``verify_node_map`` and the
:class:`~rawgraph.updates.manager.ExecUpdateManager` work on it unchanged.

Ownership of node parameters
----------------------------
The driver copies every node's parameters when the node is added: a kernel node's argument
*values* (read through ``kernelParams``), a memcpy's addresses, a memset's value. Editing a
:class:`~rawgraph.runtime.launch.KernelArgs` after :meth:`GraphBuilder.kernel` does not change the node
(the node map keeps the bytes that were copied, as capture does). What the driver does *not*
copy, and the built graph therefore keeps alive: the device buffers the nodes point at (through
the launch plan or the launches), events of event nodes, and the Python callables of host nodes.

A host node's function pointer is a ctypes thunk, and the driver calls it when a replay reaches the
node, even a replay queued before its exec was destroyed (``cuGraphExecDestroy`` lets queued
launches finish). So an exec of a built graph holding host nodes keeps their callbacks past its
own destruction: its release first records a fence on every stream it was launched on
(``cuEventRecord``), and the callbacks are held until that fence has fired
(:func:`hold_for_replays`, :func:`collect_held`). Destroying the builder, the graph and the exec
with a replay queued is therefore safe, as it is for any exec.

Driver structs
--------------
Every struct handed to the driver is filled by one helper here (:func:`memcpy_params`,
:func:`memset_params`, :func:`host_params`, :func:`mem_alloc_params`, :func:`kernel_params`,
:func:`edge_data`) that sets every field the binding exposes, zero where unused; reserved bytes the
binding does not expose are zero because cuda-bindings allocates its structs zeroed
(tests/test_builder_cpu.py reads every byte back). Output structs are held while a field is read:
a cuda-bindings field such as ``CUDA_MEM_ALLOC_NODE_PARAMS.dptr`` is a view into its struct that
does not keep the struct alive (see :func:`allocation_address`).

Clone rules
-----------
``cuGraphClone`` refuses graphs holding memory allocation/free nodes (documented for
``cuGraphAddMemAllocNode``) and conditional nodes (``CUDA_ERROR_NOT_SUPPORTED``, driver 580:
``benchmarks/probes/conditional_nodes.py``); ``cuGraphAddChildGraphNode`` refuses the same
child graphs. Both are refused here first, with the reason.
"""

from __future__ import annotations

import ctypes
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver

from ..runtime.device import Device, get_device
from ..runtime.errors import RawgraphError, call
from ..runtime.launch import Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, HostBuffer
from ..runtime.stream import Event
from .graph import Graph, GraphExec, KernelNode

# Re-exported: the keep-alive of what queued replays call into is part of the builder's interface.
from .keepalive import collect_held as collect_held
from .keepalive import held_objects as held_objects
from .keepalive import hold_for_replays as hold_for_replays

# Re-exported: the node-parameter helpers and edge constants (the builder's own vocabulary).
from .params import DEP_DEFAULT as DEP_DEFAULT
from .params import DEP_PROGRAMMATIC as DEP_PROGRAMMATIC
from .params import EDGE_KINDS as EDGE_KINDS
from .params import PORT_DEFAULT as PORT_DEFAULT
from .params import PORT_LAUNCH_ORDER as PORT_LAUNCH_ORDER
from .params import PORT_PROGRAMMATIC as PORT_PROGRAMMATIC
from .params import allocation_address as allocation_address
from .params import edge_data as edge_data
from .params import host_params as host_params
from .params import kernel_params as kernel_params
from .params import mem_alloc_params as mem_alloc_params
from .params import memcpy_params as memcpy_params
from .params import memset_params as memset_params

NODE_T: Any = driver.CUgraphNodeType

# Node types a graph may not hold to be cloned or embedded as a child graph.
_NO_CLONE = {
    NODE_T.CU_GRAPH_NODE_TYPE_MEM_ALLOC: "a memory allocation node",
    NODE_T.CU_GRAPH_NODE_TYPE_MEM_FREE: "a memory free node",
    NODE_T.CU_GRAPH_NODE_TYPE_CONDITIONAL: "a conditional node",
}
# Node types a conditional body may not hold (CUDA programming guide, "Conditional graph nodes":
# bodies may hold kernel, empty, memcpy, memset, child graph and conditional nodes only).
_NOT_IN_BODY = ("host", "event record", "event wait", "memory allocation", "memory free")

# A host node's function: void CUDA_CB fn(void* userData). ctypes takes the GIL when the driver's
# thread calls it.
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass(frozen=True)
class Node:
    """One node added by a :class:`GraphBuilder`.

    Attributes
    ----------
    handle : CUgraphNode
    kind : str
        ``kernel``, ``memcpy``, ``memset``, ``host``, ``event_record``, ``event_wait``, ``empty``,
        ``child``, ``mem_alloc``, ``mem_free`` or ``conditional``.
    index : int
        Position in add order (among the builder's nodes).
    """

    handle: Any
    kind: str
    index: int


Dep = Any  # a Node, or a raw CUgraphNode handle
DepSpec = Any  # a Dep, a (Dep, "default" | "programmatic") pair, or an iterable of those


class HostCallback:
    """A Python callable made into a host node's ``CUhostFn``.

    The driver calls it on one of its own threads when a replay reaches the node; the ctypes
    thunk takes the GIL first, so a replay waits for whatever Python is doing. It must make no CUDA
    call (the driver may return ``CUDA_ERROR_NOT_PERMITTED`` or deadlock) and must not wait for
    GPU work. An exception cannot cross into the driver: it is kept in :attr:`errors` (with its
    traceback text) and the replay goes on.

    Lifetime: the built graph keeps it (``graph.keep``), every exec keeps its graph, and an exec
    destroyed with replays queued keeps it until those replays have run (:func:`hold_for_replays`):
    the thunk's memory is what the driver calls.
    """

    fn: Callable[[], Any]
    address: int  # the CUhostFn a host node is given

    def __init__(self, fn: Callable[[], Any]):
        if not callable(fn):
            raise TypeError(f"a host node needs a callable, got {type(fn).__name__}")
        self.fn = fn
        # The thunk closes over a separate record, not over ``self``: a cycle through the thunk
        # would leave this object to the cyclic collector, holding the thunk (and whatever ``fn``
        # holds) past the moment the last replay that can call it has run.
        state = self._state = _CallbackRecord()

        def thunk(_user_data: Any) -> None:
            state.calls += 1
            try:
                fn()
            except BaseException:  # noqa: BLE001 - nothing may propagate into the driver's thread
                state.errors.append(traceback.format_exc())

        self._thunk = _HOST_FN(thunk)  # the function pointer lives as long as this object
        self.address = int(ctypes.cast(self._thunk, ctypes.c_void_p).value or 0)

    @property
    def calls(self) -> int:
        """How many times a replay called it."""
        return self._state.calls

    @property
    def errors(self) -> list[str]:
        """The traceback text of every exception ``fn`` raised."""
        return self._state.errors


class _CallbackRecord:
    __slots__ = ("calls", "errors")

    def __init__(self) -> None:
        self.calls = 0
        self.errors: list[str] = []


def _ptr(obj: Any, what: str) -> int:
    if isinstance(obj, (DeviceBuffer, HostBuffer, DeviceArray)):
        return int(obj.ptr)
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj <= 0:
            raise ValueError(f"{what}: address must be positive, got {obj}")
        return obj
    raise TypeError(f"{what}: expected a DeviceBuffer, HostBuffer, DeviceArray or an address, got {type(obj).__name__}")


def node_types(graph_handle: Any) -> list[Any]:
    """The ``CUgraphNodeType`` of every node of a graph (``cuGraphGetNodes`` + ``cuGraphNodeGetType``).

    See Also
    --------
    cuGraphGetNodes, cuGraphNodeGetType : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    _n, count = call(driver.cuGraphGetNodes, graph_handle, 0)
    if not count:
        return []
    nodes, count = call(driver.cuGraphGetNodes, graph_handle, count)
    return [call(driver.cuGraphNodeGetType, n) for n in list(nodes)[:count]]


def clone_refusal(graph_handle: Any) -> str | None:
    """Why ``cuGraphClone`` / ``cuGraphAddChildGraphNode`` would refuse this graph, or None.

    Looks into child graphs too (a clone copies them recursively).

    See Also
    --------
    cuGraphClone, cuGraphAddChildGraphNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    _n, count = call(driver.cuGraphGetNodes, graph_handle, 0)
    if not count:
        return None
    nodes, count = call(driver.cuGraphGetNodes, graph_handle, count)
    for n in list(nodes)[:count]:
        t = call(driver.cuGraphNodeGetType, n)
        if t in _NO_CLONE:
            return (
                f"the graph holds {_NO_CLONE[t]}; the driver refuses to clone such graphs or embed them as "
                f"child graphs (CUDA_ERROR_NOT_SUPPORTED / documented for cuGraphAddMemAllocNode): "
                f"build or capture it again instead"
            )
        if t == NODE_T.CU_GRAPH_NODE_TYPE_GRAPH:
            inner = clone_refusal(call(driver.cuGraphChildGraphNodeGetGraph, n))
            if inner:
                return "a child graph: " + inner
    return None


class BuiltGraph(Graph):
    """A :class:`~rawgraph.graphs.graph.Graph` made by a :class:`GraphBuilder`.

    Same API as a captured graph; additionally keeps alive what its nodes refer to but the driver
    did not copy (``keep``: launches, events, host callbacks), and records every node it holds
    (``built_nodes``). Its kernel nodes record their dependencies (``KernelNode.deps``), so
    :meth:`~rawgraph.graphs.graph.Graph.verify_edges` checks a built graph as it checks a captured one.
    """

    def __init__(self, handle: Any, nodes: list[KernelNode], device: Device):
        super().__init__(handle, nodes, device)
        self.keep: list[Any] = []
        self.built_nodes: list[Node] = []

    def held_by_replays(self) -> list[Any]:
        """What a replay of an exec of this graph calls into that the driver does not own: the
        host callbacks, and what embedded child graphs hold (a launcher graph's device-launched
        exec). An exec of this graph keeps them until its queued replays have run
        (:func:`hold_for_replays`)."""
        return _held_by(self.keep)

    def instantiate(self, flags: int = 0) -> GraphExec:
        """``cuGraphInstantiate``, the exec holding :meth:`held_by_replays` past its own
        destruction until the replays it queued have run (see :func:`hold_for_replays`).

        See Also
        --------
        cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        exe = super().instantiate(flags)
        held = self.held_by_replays()
        if held:
            hold_for_replays(exe, held)
        return exe

    def clone(self) -> BuiltGraph:
        """A copy of this graph (``cuGraphClone``) with the node map re-pointed at the copy's nodes.

        Raises
        ------
        RawgraphError
            The graph holds a memory allocation/free or a conditional node (the driver refuses
            those; checked before calling it).

        See Also
        --------
        cuGraphClone : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        why = clone_refusal(self.handle)
        if why:
            raise RawgraphError(f"cuGraphClone refused before calling the driver: {why}")
        handle = call(driver.cuGraphClone, self.handle)
        try:
            # Every node's counterpart, so the kernel nodes' dependencies move to the copy too.
            twin = {int(n): call(driver.cuGraphNodeFindInClone, n, handle) for n in self.all_nodes()}
            kernels = [
                KernelNode(twin[int(n.handle)], n.index, n.launch, n.captured_args, tuple(int(twin[d]) for d in n.deps))
                for n in self.nodes
            ]
            built = [Node(twin[int(n.handle)], n.kind, n.index) for n in self.built_nodes]
        except BaseException:
            call(driver.cuGraphDestroy, handle)
            raise
        copy = BuiltGraph(handle, kernels, self.device)
        copy.keep = list(self.keep)
        copy.built_nodes = built
        copy.plan = self.plan
        copy.other_nodes = [(n.handle, n.kind, None) for n in built if n.kind != "kernel"]
        return copy


class GraphBuilder:
    """Builds one graph node by node; :meth:`build` hands it over as a :class:`BuiltGraph`.

    Every ``add`` method takes ``deps``: the nodes it runs after (a :class:`Node`, a raw
    ``CUgraphNode``, a ``(node, "programmatic")`` pair for a PDL edge, or an iterable of those;
    empty: a root node). Each returns the new :class:`Node`.

    Parameters
    ----------
    device : Device, optional
        Defaults to device 0.

    Notes
    -----
    A builder can also fill a graph it does not own (a conditional node's body, see
    :mod:`rawgraph.graphs.conditional`): then :meth:`build` is refused and host, event and memory nodes,
    which bodies may not hold, are refused too.
    """

    device: Device
    handle: Any  # driver.CUgraph

    def __init__(self, device: Device | None = None, *, _body_of: Any = None, _handle: Any = None):
        self.device = (device or get_device()).activate()
        self.nodes: list[Node] = []
        self.kernel_nodes: list[KernelNode] = []
        self.keep: list[Any] = []
        # Node.index -> what the layer that added the node knows of it (a conditional node's
        # ConditionalNode: its handle's default, its bodies), passed on in the graph's other_nodes.
        self.details: dict[int, Any] = {}
        self.plan: LaunchPlan | None = None
        self._body_of = _body_of
        if _handle is not None:
            self.handle = _handle
            self._graph: BuiltGraph | None = None
        else:
            self.handle = call(driver.cuGraphCreate, 0)
            # Owned from here on: a builder dropped before build() still destroys its graph.
            self._graph = BuiltGraph(self.handle, [], self.device)
        self._built = False

    # -- bookkeeping ------------------------------------------------------------------------
    @property
    def is_body(self) -> bool:
        """True for a builder filling a conditional node's body graph."""
        return self._body_of is not None

    def _check(self, what: str) -> None:
        if self._built:
            raise RawgraphError(f"GraphBuilder.{what} after build(): the graph belongs to the Graph it returned")
        if self._graph is not None:
            self._graph._check_open()

    def _no_body(self, what: str) -> None:
        if self.is_body:
            raise RawgraphError(
                f"a conditional node's body may not hold {what} nodes (kernel, empty, memcpy, memset, "
                "child graph and conditional nodes only); the driver would refuse the graph"
            )

    def _deps(self, deps: DepSpec) -> tuple[list[Any], list[tuple[Any, str]]]:
        """``deps`` as (plain handles, [(handle, kind)] of every edge), duplicates refused."""
        if deps is None:
            items: list[Any] = []
        elif isinstance(deps, Node) or _is_edge(deps) or not isinstance(deps, (list, tuple)):
            items = [deps]
        else:
            items = list(deps)
        edges: list[tuple[Any, str]] = []
        for item in items:
            kind = "default"
            if isinstance(item, tuple):
                if len(item) != 2 or item[1] not in EDGE_KINDS:
                    raise ValueError(f"an edge is (node, kind) with kind in {EDGE_KINDS}, got {item!r}")
                item, kind = item
            handle = item.handle if isinstance(item, Node) else item
            if handle is None or not int(handle):
                raise ValueError("a dependency is a null node handle")
            edges.append((handle, kind))
        seen = [int(h) for h, _ in edges]
        if len(set(seen)) != len(seen):
            raise ValueError("deps names a node twice (the driver refuses duplicate dependencies)")
        return [h for h, _ in edges], edges

    def _record(self, handle: Any, kind: str) -> Node:
        node = Node(handle, kind, len(self.nodes))
        self.nodes.append(node)
        return node

    def _add_with_edges(
        self, kind: str, edges: list[tuple[Any, str]], add: Callable[[list[Any]], Any], programmatic_ok: bool = False
    ) -> Node:
        """Add a node with its default edges in the add call, then its programmatic ones
        (``cuGraphAddDependencies`` with edge data)."""
        plain = [h for h, k in edges if k == "default"]
        pdl = [h for h, k in edges if k == "programmatic"]
        if pdl and not programmatic_ok:
            raise ValueError(f"a programmatic edge must end at a kernel node, not a {kind} node")
        handle = add(plain)
        try:
            for src in pdl:
                self._programmatic_edge(src, handle)
        except BaseException:
            # Not left in the graph without its programmatic edges: a builder used on would build
            # a graph holding a node outside its node map, unordered after its producer. (Should
            # the destroy fail too, the node stays, as it did before this was undone.)
            driver.cuGraphDestroyNode(handle)
            raise
        return self._record(handle, kind)

    def _programmatic_edge(self, src: Any, dst: Any) -> None:
        if call(driver.cuGraphNodeGetType, src) != NODE_T.CU_GRAPH_NODE_TYPE_KERNEL:
            raise ValueError("a programmatic edge must start at a kernel node")
        call(driver.cuGraphAddDependencies, self.handle, [src], [dst], [edge_data("programmatic")], 1)

    def _note_dep(self, src: Any, dst: Any) -> None:
        """Record an edge added after its node: ``verify_edges`` compares kernel nodes' deps."""
        for kn in self.kernel_nodes:
            if int(kn.handle) == int(dst):
                if int(src) not in kn.deps:
                    kn.deps = kn.deps + (int(src),)
                return

    # -- nodes ------------------------------------------------------------------------------
    def kernel(self, launch: Launch, deps: DepSpec = ()) -> Node:
        """A kernel node running ``launch`` (``cuGraphAddKernelNode``) with its packed arguments.

        The driver copies the argument values now; the node map records those bytes. Clusters
        compiled in (``__cluster_dims__``) apply as they do to a launch. ``launch.pdl`` is not
        read here: say ``(prev, "programmatic")`` in ``deps`` for a PDL edge (:meth:`plan` does).

        See Also
        --------
        cuGraphAddKernelNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("kernel")
        if not isinstance(launch, Launch):
            raise TypeError(f"kernel() takes a rawgraph Launch, got {type(launch).__name__}")
        _h, edges = self._deps(deps)
        p = kernel_params(launch)
        snapshot = launch.args.snapshot()  # what the driver copies in the call below
        # Every edge into the node, default and programmatic (``verify_edges`` compares them).
        kn = KernelNode(None, len(self.kernel_nodes), launch, snapshot, tuple(int(h) for h, _k in edges))
        node = self._add_with_edges(
            "kernel",
            edges,
            lambda plain: call(driver.cuGraphAddKernelNode, self.handle, plain, len(plain), p),
            programmatic_ok=True,
        )
        kn.handle = node.handle
        self.kernel_nodes.append(kn)
        self.keep.append(launch)
        return node

    def run(self, plan: LaunchPlan, deps: DepSpec = (), pdl: bool | None = None) -> list[Node]:
        """Add every launch of ``plan`` as a chain of kernel nodes, as capturing it would.

        The first node depends on ``deps``; each next one on the node before it, through a
        programmatic edge when its launch is a PDL launch (``Launch.pdl``, set by a PDL plan),
        else a default edge. ``pdl=False`` makes every edge a default one (rawgraph's kernels
        are correct either way: their ``griddepcontrol.wait`` returns at once without PDL).
        The built graph keeps the plan (its argument buffers) alive.
        """
        self._check("run")
        plan.check_open()
        out: list[Node] = []
        for launch in plan.launches:
            if out:
                prev = out[-1]
                chained = launch.pdl if pdl is None else (bool(pdl) and launch.pdl)
                d: DepSpec = [(prev, "programmatic")] if chained else [prev]
            else:
                d = deps
            out.append(self.kernel(launch, d))
        if self.plan is None:
            self.plan = plan
        else:
            self.keep.append(plan)
        return out

    def memcpy(self, dst: Any, src: Any, nbytes: int, deps: DepSpec = ()) -> Node:
        """A 1D copy of ``nbytes`` (``cuGraphAddMemcpyNode``); each side a DeviceBuffer /
        DeviceArray (device memory) or a HostBuffer (pinned host memory, read or written when a
        replay reaches the node). Raw integer addresses count as device memory.

        See Also
        --------
        cuGraphAddMemcpyNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("memcpy")
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"memcpy size must be positive, got {nbytes}")
        for obj, what in ((dst, "dst"), (src, "src")):
            have = getattr(obj, "nbytes", None)
            if have is not None and nbytes > int(have):
                raise ValueError(f"memcpy of {nbytes} bytes overruns {what} ({have} bytes)")
        _h, edges = self._deps(deps)
        p = memcpy_params(
            _ptr(dst, "dst"), isinstance(dst, HostBuffer), _ptr(src, "src"), isinstance(src, HostBuffer), nbytes
        )
        ctx = self.device.context
        self.keep.extend(o for o in (dst, src) if not isinstance(o, int))
        return self._add_with_edges(
            "memcpy", edges, lambda plain: call(driver.cuGraphAddMemcpyNode, self.handle, plain, len(plain), p, ctx)
        )

    def memset(self, dst: Any, value: int, count: int, element_size: int = 4, deps: DepSpec = ()) -> Node:
        """Fill ``count`` elements of ``element_size`` (1, 2 or 4) bytes with ``value``
        (``cuGraphAddMemsetNode``; device memory only).

        See Also
        --------
        cuGraphAddMemsetNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("memset")
        if element_size not in (1, 2, 4):
            raise ValueError(f"memset element size must be 1, 2 or 4 bytes, got {element_size}")
        count = int(count)
        if count <= 0:
            raise ValueError(f"memset count must be positive, got {count}")
        if not 0 <= int(value) < (1 << (8 * element_size)):
            raise ValueError(f"memset value {value} does not fit {element_size} byte(s)")
        if isinstance(dst, HostBuffer):
            raise TypeError("memset nodes write device memory; got a HostBuffer")
        have = getattr(dst, "nbytes", None)
        if have is not None and count * element_size > int(have):
            raise ValueError(f"memset of {count * element_size} bytes overruns dst ({have} bytes)")
        _h, edges = self._deps(deps)
        p = memset_params(_ptr(dst, "dst"), int(value), element_size, count)
        ctx = self.device.context
        if not isinstance(dst, int):
            self.keep.append(dst)
        return self._add_with_edges(
            "memset", edges, lambda plain: call(driver.cuGraphAddMemsetNode, self.handle, plain, len(plain), p, ctx)
        )

    def host(self, fn: Callable[[], Any] | HostCallback, deps: DepSpec = ()) -> Node:
        """A host node calling ``fn()`` when a replay reaches it (``cuGraphAddHostNode``).

        Limits: ``fn`` runs on a driver thread, takes the GIL (a replay waits for Python), must
        make no CUDA call and must not wait for GPU work; later nodes wait for it to return. The
        graph (and every exec of it, which keeps the graph) keeps ``fn`` alive, and an exec
        destroyed with replays queued keeps it until they have run (:func:`hold_for_replays`).
        Exceptions are kept in the returned node's callback (``graph.keep``), see
        :class:`HostCallback`.

        See Also
        --------
        cuGraphAddHostNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("host")
        self._no_body("host")
        cb = fn if isinstance(fn, HostCallback) else HostCallback(fn)
        _h, edges = self._deps(deps)
        p = host_params(cb.address)
        self.keep.append(cb)
        return self._add_with_edges(
            "host", edges, lambda plain: call(driver.cuGraphAddHostNode, self.handle, plain, len(plain), p)
        )

    def event_record(self, event: Event, deps: DepSpec = ()) -> Node:
        """Record ``event`` when a replay reaches this node (``cuGraphAddEventRecordNode``).

        See Also
        --------
        cuGraphAddEventRecordNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("event_record")
        self._no_body("event record")
        event._check_open()
        _h, edges = self._deps(deps)
        self.keep.append(event)
        return self._add_with_edges(
            "event_record",
            edges,
            lambda plain: call(driver.cuGraphAddEventRecordNode, self.handle, plain, len(plain), event.handle),
        )

    def event_wait(self, event: Event, deps: DepSpec = ()) -> Node:
        """Wait for ``event``'s latest record before later nodes run (``cuGraphAddEventWaitNode``).

        See Also
        --------
        cuGraphAddEventWaitNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("event_wait")
        self._no_body("event wait")
        event._check_open()
        _h, edges = self._deps(deps)
        self.keep.append(event)
        return self._add_with_edges(
            "event_wait",
            edges,
            lambda plain: call(driver.cuGraphAddEventWaitNode, self.handle, plain, len(plain), event.handle),
        )

    def empty(self, deps: DepSpec = ()) -> Node:
        """A node that does nothing: a join point for many edges (``cuGraphAddEmptyNode``).

        See Also
        --------
        cuGraphAddEmptyNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("empty")
        _h, edges = self._deps(deps)
        return self._add_with_edges(
            "empty", edges, lambda plain: call(driver.cuGraphAddEmptyNode, self.handle, plain, len(plain))
        )

    def child(self, graph: Graph | Any, deps: DepSpec = ()) -> Node:
        """Embed a copy of ``graph`` (``cuGraphAddChildGraphNode`` clones it now).

        Refused first when ``graph`` holds memory allocation/free or conditional nodes (the
        driver refuses those child graphs). Later edits to ``graph`` do not reach the node; the
        built graph keeps ``graph`` alive for the buffers its nodes point at.

        See Also
        --------
        cuGraphAddChildGraphNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("child")
        handle = graph.handle if isinstance(graph, Graph) else graph
        if isinstance(graph, Graph):
            graph._check_open()
        why = clone_refusal(handle)
        if why:
            raise RawgraphError(f"cuGraphAddChildGraphNode refused before calling the driver: {why}")
        _h, edges = self._deps(deps)
        self.keep.append(graph)
        return self._add_with_edges(
            "child", edges, lambda plain: call(driver.cuGraphAddChildGraphNode, self.handle, plain, len(plain), handle)
        )

    def mem_alloc(self, nbytes: int, deps: DepSpec = ()) -> tuple[Node, int]:
        """Allocate ``nbytes`` of device memory inside the graph (``cuGraphAddMemAllocNode``).

        Returns the node and the address, fixed for the graph's lifetime. The graph can then not
        be cloned and only one exec of it may exist at a time (driver rules).

        See Also
        --------
        cuGraphAddMemAllocNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("mem_alloc")
        self._no_body("memory allocation")
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes}")
        _h, edges = self._deps(deps)
        p = mem_alloc_params(nbytes, self.device.ordinal)
        node = self._add_with_edges(
            "mem_alloc", edges, lambda plain: call(driver.cuGraphAddMemAllocNode, self.handle, plain, len(plain), p)
        )
        return node, allocation_address(node.handle)

    def mem_free(self, ptr: int, deps: DepSpec = ()) -> Node:
        """Free graph memory allocated by :meth:`mem_alloc` (``cuGraphAddMemFreeNode``).

        See Also
        --------
        cuGraphAddMemFreeNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("mem_free")
        self._no_body("memory free")
        _h, edges = self._deps(deps)
        return self._add_with_edges(
            "mem_free",
            edges,
            lambda plain: call(driver.cuGraphAddMemFreeNode, self.handle, plain, len(plain), int(ptr)),
        )

    def node(self, params: Any, kind: str, deps: DepSpec = ()) -> tuple[Node, Any]:
        """Any node from a filled ``CUgraphNodeParams`` (``cuGraphAddNode``); returns the node and
        the params, which the driver may have written outputs into (a conditional node's bodies).

        See Also
        --------
        cuGraphAddNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("node")
        plain, edges = self._deps(deps)
        data = [self._edge_data(k) for _h, k in edges]
        handle = call(driver.cuGraphAddNode, self.handle, plain, data or None, len(plain), params)
        self.keep.append(params)
        return self._record(handle, kind), params

    @staticmethod
    def _edge_data(kind: str) -> Any:
        return edge_data(kind)

    # -- edges ------------------------------------------------------------------------------
    def depend(self, before: Dep, after: Dep, kind: str = "default") -> None:
        """Add one edge ``before -> after`` (``cuGraphAddDependencies`` with edge data); a kernel
        node ``after`` records it among its dependencies.

        See Also
        --------
        cuGraphAddDependencies : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check("depend")
        if kind not in EDGE_KINDS:
            raise ValueError(f"edge kind must be one of {EDGE_KINDS}, got {kind!r}")
        src = before.handle if isinstance(before, Node) else before
        dst = after.handle if isinstance(after, Node) else after
        if kind == "programmatic":
            if call(driver.cuGraphNodeGetType, dst) != NODE_T.CU_GRAPH_NODE_TYPE_KERNEL:
                raise ValueError("a programmatic edge must end at a kernel node")
            self._programmatic_edge(src, dst)
        else:
            call(driver.cuGraphAddDependencies, self.handle, [src], [dst], [edge_data("default")], 1)
        self._note_dep(src, dst)

    # -- result -----------------------------------------------------------------------------
    def build(self) -> BuiltGraph:
        """Hand the graph over: a :class:`BuiltGraph` with the kernel node map. Single use."""
        self._check("build")
        if self._graph is None:
            raise RawgraphError("this builder fills a conditional node's body; the parent graph owns it")
        g = self._graph
        g.nodes = list(self.kernel_nodes)
        g.built_nodes = list(self.nodes)
        g.keep = list(self.keep)
        g.plan = self.plan
        g.other_nodes = [(n.handle, n.kind, self.details.get(n.index)) for n in self.nodes if n.kind != "kernel"]
        self._built = True
        return g

    def instantiate(self, flags: int = 0) -> GraphExec:
        """``build()`` then ``cuGraphInstantiate`` (the exec keeps the graph alive).

        See Also
        --------
        cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        return self.build().instantiate(flags)

    def close(self) -> None:
        """Destroy the graph if it was never built (``cuGraphDestroy``); safe twice.

        See Also
        --------
        cuGraphDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if not self._built and self._graph is not None:
            self._graph.close()

    def __enter__(self) -> GraphBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.close()


def _held_by(keep: Iterable[Any]) -> list[Any]:
    """The host callbacks in ``keep``, and what the graphs in it hold for replays."""
    out: list[Any] = []
    for obj in keep:
        if isinstance(obj, HostCallback):
            out.append(obj)
            continue
        more = getattr(obj, "held_by_replays", None)
        if callable(more):
            out.extend(more())
    return out


def _is_edge(t: Any) -> bool:
    """One ``(node, kind)`` edge rather than a sequence of deps."""
    return isinstance(t, tuple) and len(t) == 2 and isinstance(t[1], str)


def build_plan(plan: LaunchPlan, device: Device | None = None) -> BuiltGraph:
    """The graph of ``plan`` built explicitly: what :func:`~rawgraph.graphs.capture.capture_plan` gives,
    without a stream or a warm-up run."""
    b = GraphBuilder(device)
    try:
        b.run(plan)
    except BaseException:
        b.close()
        raise
    return b.build()


def edge_list(graph_handle: Any) -> list[tuple[Any, Any, tuple[int, int, int]]]:
    """``(from, to, (type, from_port, to_port))`` of every edge (``cuGraphGetEdges``).

    See Also
    --------
    cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    _f, _t, _d, n = call(driver.cuGraphGetEdges, graph_handle, 0)
    if not n:
        return []
    frm, to, data, n = call(driver.cuGraphGetEdges, graph_handle, n)
    out = []
    for i in range(n):
        d = data[i] if data is not None else None
        info = (int(d.type), int(d.from_port), int(d.to_port)) if d is not None else (0, 0, 0)
        out.append((frm[i], to[i], info))
    return out
