"""Owning wrappers for ``CUgraph`` and ``CUgraphExec``.

Node handles belong to the graph, and ``cuGraphExecKernelNodeSetParams`` names nodes of the graph
the exec was instantiated from, so a :class:`GraphExec` keeps its :class:`Graph` alive (and the
graph keeps the launch plan whose argument buffers its nodes were captured from).
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..runtime.device import Device
from ..runtime.errors import ClosedError, DeviceUpdatableError, GraphUpdateError, RawgraphError, call, cuda_error
from ..runtime.launch import ARG_DTYPES, KernelArgs, Launch, LaunchPlan, arg_dtype
from ..runtime.resource import Resource
from ..runtime.stream import Stream, StreamSet, as_stream, stream_handle

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_KERNEL = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL


@dataclass
class KernelNode:
    """A kernel node of a captured graph and the launch it came from.

    Attributes
    ----------
    handle : CUgraphNode
    index : int
        Position in capture order.
    launch : Launch
    captured_args : bytes
        The packed argument values at capture time (what the driver copied into the node).
    deps : tuple of int
        The node handles (as integers) this node depends on: the capturing stream's dependency
        set read with ``cuStreamGetCaptureInfo`` just before the launch (of any size in a
        fork/join capture). ``Graph.verify_edges`` checks them against ``cuGraphGetEdges``.

    See Also
    --------
    cuStreamGetCaptureInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    handle: Any
    index: int
    launch: Launch
    captured_args: bytes
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class ForeignNode:
    """A node of a captured graph that rawgraph did not record: work submitted to a capturing
    stream by someone else (a CuPy kernel, a ``cuMemsetD32Async``, a torch op).

    Attributes
    ----------
    handle : CUgraphNode
    type : str
        The ``cuGraphNodeGetType`` name without its prefix (``"KERNEL"``, ``"MEMSET"``, ...).
    deps : tuple of int
        The handles (as integers) of the nodes it depends on (``cuGraphGetEdges``).

    See Also
    --------
    cuMemsetD32Async : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuGraphNodeGetType, cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    handle: Any
    type: str
    deps: tuple[int, ...] = ()


def read_node_args(handle: Any, launch: Launch) -> dict[str, Any]:
    """The argument values the driver holds for a kernel node (``cuGraphKernelNodeGetParams``).

    Decoded with the launch's argument layout; used to check the node map points at the right
    buffers.

    See Also
    --------
    cuGraphKernelNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    params = call(driver.cuGraphKernelNodeGetParams, handle)
    table = int(params.kernelParams)
    values: dict[str, Any] = {}
    for i, (name, kind) in enumerate(launch.args.spec):
        slot = ctypes.c_void_p.from_address(table + i * ctypes.sizeof(ctypes.c_void_p)).value or 0
        dtype = arg_dtype(kind)
        # Copied out of the driver's memory (the node owns it); only read, never written.
        raw = np.frombuffer(ctypes.string_at(slot, dtype.itemsize), dtype=dtype.base)
        if kind in ARG_DTYPES:
            values[name] = raw[0].item()
        else:  # a by-value array ("i32[N]", "u8[N]")
            values[name] = tuple(int(v) for v in raw)
    return values


class Graph(Resource):
    """A ``CUgraph`` with the node map from capture. Destroyed on ``close()`` (``cuGraphDestroy``).

    See Also
    --------
    cuGraphDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    def __init__(self, handle: Any, nodes: list[KernelNode], device: Device):
        self.handle: Any = handle  # driver.CUgraph
        self.nodes: list[KernelNode] = list(nodes)
        self.device: Device = device
        self.plan: LaunchPlan | None = None  # set by capture_plan; keeps argument buffers alive
        # The arrays the recorded nodes point at, held while the graph lives (set by Capture).
        self.arrays: list[Any] = []
        # nodes recorded other than kernels: (node, "alloc" | "free" | "memcpy" | "event", detail)
        self.other_nodes: list[tuple[Any, str, Any]] = []
        # nodes a capture found but did not record (set by Capture; see ForeignNode)
        self.foreign_nodes: list[ForeignNode] = []
        # Set by mark_device_updatable: some nodes are updated by kernels on the device.
        self.device_updatable: bool = False
        self._live_exec: weakref.ref[GraphExec] | None = None
        self._own(driver.cuGraphDestroy, handle)

    def mark_device_updatable(self) -> None:
        """Record that kernel nodes of this graph were opted in to device-side updates
        (``CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE``), before it is instantiated.

        From then on the graph follows the driver's rules for such graphs, refused here before
        any driver call (:class:`~rawgraph.DeviceUpdatableError`): one live exec at a time
        (``cuGraphInstantiate`` answers ``CUDA_ERROR_NOT_SUPPORTED`` while one lives), no
        ``cuGraphExecUpdate`` of its exec, and no host parameter pushes through the update paths
        of :mod:`rawgraph.updates` (they would override what the device wrote).

        See Also
        --------
        cuGraphInstantiate, cuGraphExecUpdate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        if self._exec_alive():
            raise DeviceUpdatableError("mark the graph device-updatable before instantiating it")
        self.device_updatable = True

    def _exec_alive(self) -> bool:
        """Whether the exec last instantiated from this graph is still open."""
        live = self._live_exec() if self._live_exec is not None else None
        return live is not None and not live.closed

    def node_count(self) -> int:
        """Number of nodes the driver holds (``cuGraphGetNodes``).

        See Also
        --------
        cuGraphGetNodes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        _nodes, count = call(driver.cuGraphGetNodes, self.handle, 0)
        return int(count)

    def edges(self) -> list[tuple[int, int]]:
        """``(from, to)`` node handles as integers (``cuGraphGetEdges``).

        See Also
        --------
        cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        return [(a, b) for a, b, _ in self.edge_types()]

    def edge_types(self) -> list[tuple[int, int, str]]:
        """``(from, to, type)`` for every edge: type ``"default"`` (the consumer starts after the
        producer finished) or ``"programmatic"`` (a PDL edge: it may start earlier and waits
        inside the kernel), from the edge data of ``cuGraphGetEdges``.

        See Also
        --------
        cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        _f, _t, _d, n = call(driver.cuGraphGetEdges, self.handle, 0)
        if not n:
            return []
        frm, to, data, _n = call(driver.cuGraphGetEdges, self.handle, n)
        kinds = {
            int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT): "default",
            int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC): "programmatic",
        }
        return [(int(a), int(b), kinds.get(int(d.type), str(int(d.type)))) for a, b, d in zip(frm, to, data)]

    def all_nodes(self) -> list[Any]:
        self._check_open()
        _nodes, count = call(driver.cuGraphGetNodes, self.handle, 0)
        nodes, _ = call(driver.cuGraphGetNodes, self.handle, count)
        return list(nodes)

    def read_nodes(self) -> list[Any]:
        """Every node decoded by type, child graphs and conditional bodies included
        (:func:`rawgraph.graphs.nodes.read_graph`: ``cuGraphGetNodes``, ``cuGraphNodeGetType``, the
        per-type getters, ``cuFuncGetParamInfo`` for kernel parameter layouts).

        See Also
        --------
        cuGraphGetNodes, cuGraphNodeGetType : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
        """
        from .nodes import read_graph  # nodes.py sits below graph.py and never imports it

        self._check_open()
        self.device.activate()
        return read_graph(self.handle)

    def verify_node_map(self) -> None:
        """Check every recorded node against the driver: type, function, grid, block and argument values.

        Raises
        ------
        RawgraphError
            Naming the first node that does not match its launch.
        """
        self._check_open()
        for node in self.nodes:
            ntype = call(driver.cuGraphNodeGetType, node.handle)
            if ntype != _KERNEL:
                raise RawgraphError(f"node {node.index} is a {ntype.name}, not a kernel node")
            p = call(driver.cuGraphKernelNodeGetParams, node.handle)
            launch = node.launch
            if int(p.func) and int(p.func) != int(launch.kernel.handle):
                raise RawgraphError(f"node {node.index} runs another function than {launch.kernel.name}")
            if (p.gridDimX, p.gridDimY, p.gridDimZ) != launch.grid or (
                p.blockDimX,
                p.blockDimY,
                p.blockDimZ,
            ) != launch.block:
                raise RawgraphError(f"node {node.index} launch shape differs from {launch.describe()}")
            held = read_node_args(node.handle, launch)
            # Against the bytes captured, not launch.args: those may have been edited since.
            captured = KernelArgs.from_bytes(launch.args.spec, node.captured_args)
            expected = {n: captured[n] for n in captured.names()}
            if held != expected:
                raise RawgraphError(
                    f"node {node.index} ({launch.kernel.name}) holds arguments {held}, captured {expected}"
                )

    def verify_edges(self) -> None:
        """Check the recorded dependencies against the driver's edges (``cuGraphGetEdges``).

        For every recorded kernel node the edges *into* it must be exactly the ``deps`` read at
        capture time (whatever node they come from: recorded, another recorded operation, or
        foreign), and every edge between two recorded kernel nodes must have been recorded.

        Raises
        ------
        RawgraphError
            Naming the first node whose incoming edges differ from its recorded dependencies.

        See Also
        --------
        cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        into: dict[int, set[int]] = {}
        for a, b in self.edges():
            into.setdefault(b, set()).add(a)
        for node in self.nodes:
            held = into.get(int(node.handle), set())
            if held != set(node.deps) or len(set(node.deps)) != len(node.deps):
                raise RawgraphError(
                    f"node {node.index} ({node.launch.kernel.name}) depends on {sorted(map(hex, held))} in the "
                    f"driver's graph, recorded {sorted(map(hex, node.deps))}"
                )

    def instantiate(self, flags: int = 0) -> GraphExec:
        """``cuGraphInstantiate`` with ``flags`` (``CUgraphInstantiate_flags``, e.g. ``CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD``).

        See Also
        --------
        cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        return GraphExec(self, flags)

    def debug_dot_print(self, path: str, flags: int = 1) -> None:
        """The driver's own DOT dump (``cuGraphDebugDotPrint``; flags default VERBOSE).

        See Also
        --------
        cuGraphDebugDotPrint : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        call(driver.cuGraphDebugDotPrint, self.handle, str(path).encode(), flags)

    def __repr__(self) -> str:
        return f"<Graph {len(self.nodes)} kernel nodes{' closed' if self.closed else ''}>"

    def _repr_svg_(self) -> str | None:
        """The graph as SVG, for notebooks: its DOT export (:func:`rawgraph.graphs.dot.to_dot`)
        rendered by Graphviz's ``dot``.

        Returns None, and the notebook shows the text repr instead, where Graphviz's ``dot`` is
        not on PATH, the graph is closed (checked before any driver call), or the export or the
        rendering fails: a repr never raises. No driver call beyond what ``to_dot`` makes.
        """
        import shutil
        import subprocess

        try:
            if self.closed:
                return None
            exe = shutil.which("dot")
            if exe is None:
                return None
            from .dot import to_dot  # dot.py sits beside graph.py and never imports it

            text = to_dot(self)
            r = subprocess.run([exe, "-Tsvg"], input=text, capture_output=True, text=True, timeout=60, check=False)
        except Exception:
            return None
        return r.stdout if r.returncode == 0 and "<svg" in r.stdout else None


class _UpdateResultInfo(ctypes.Structure):
    # CUgraphExecUpdateResultInfo: {CUgraphExecUpdateResult result; CUgraphNode errorNode, errorFromNode}
    _fields_ = [("result", ctypes.c_int), ("errorNode", ctypes.c_void_p), ("errorFromNode", ctypes.c_void_p)]


def _update_result_info(exec_handle: Any, graph_handle: Any) -> tuple[int, int, int]:
    """``cuGraphExecUpdate_v2`` called through ctypes, to read the result info the binding drops."""
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuGraphExecUpdate_v2
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_UpdateResultInfo)]
    info = _UpdateResultInfo()
    fn(int(exec_handle), int(graph_handle), ctypes.byref(info))
    return int(info.result), int(info.errorNode or 0), int(info.errorFromNode or 0)


class GraphExec(Resource):
    """An executable graph (``cuGraphInstantiate``); keeps its :class:`Graph` alive.

    See Also
    --------
    cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    def __init__(self, graph: Graph, flags: int = 0):
        self.graph: Graph = graph
        self.flags: int = int(flags)
        upload = int(driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
        if self.flags & upload:
            # The driver rejects it here (CUDA_ERROR_INVALID_VALUE): it needs an upload stream.
            raise ValueError(
                "CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD needs cuGraphInstantiateWithParams and an upload "
                "stream; instantiate without it and call GraphExec.upload(stream)"
            )
        if graph.device_updatable and graph._exec_alive():
            raise DeviceUpdatableError(
                "a graph with device-updatable kernel nodes can be instantiated only once at a time "
                "(the driver answers CUDA_ERROR_NOT_SUPPORTED while its exec lives); close that exec first"
            )
        graph.device.activate()
        self.handle: Any = call(driver.cuGraphInstantiate, graph.handle, self.flags)  # driver.CUgraphExec
        graph._live_exec = weakref.ref(self)
        self._own(driver.cuGraphExecDestroy, self.handle)
        # Every stream a launch named: what holders of memory its replays read wait for.
        self.streams: StreamSet = StreamSet()

    def launch(self, stream: Any) -> None:
        """``cuGraphLaunch`` on any stream of the graph's context (any stream-like object).

        The exec may be closed while launches are queued: the driver finishes them first. The
        stream is noted in :attr:`streams`, so an update manager or rebinder over this exec keeps
        the arrays a queued replay reads alive until it has run, whoever launched it.

        Raises
        ------
        ClosedError
            The exec or the stream is closed (checked before the driver is called).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if not self._finalizer.alive:
            raise ClosedError("GraphExec is closed")
        s = stream if isinstance(stream, Stream) else as_stream(stream)
        if not s._finalizer.alive:
            raise ClosedError("Stream is closed")
        (err,) = driver.cuGraphLaunch(self.handle, s.handle)
        if err != _SUCCESS:
            raise cuda_error(err, "cuGraphLaunch")
        self.streams.note(s)

    def upload(self, stream: Any) -> None:
        """``cuGraphUpload``: move the exec's launch setup to the device ahead of the first launch.

        See Also
        --------
        cuGraphUpload : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        call(driver.cuGraphUpload, self.handle, stream_handle(stream))

    def driver_flags(self) -> int:
        """The flags the driver holds for this exec (``cuGraphExecGetFlags``).

        See Also
        --------
        cuGraphExecGetFlags : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        return int(call(driver.cuGraphExecGetFlags, self.handle))

    def update(self, graph: Graph) -> None:
        """Update this exec from ``graph`` in place (``cuGraphExecUpdate``).

        The update result is read before raising, so the error names what failed and the node.

        Raises
        ------
        GraphUpdateError
            The update was refused (e.g. ``CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED``); the exec
            is unchanged and still runs its old parameters. Re-instantiate to fall back.

        See Also
        --------
        cuGraphExecUpdate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        graph._check_open()
        if self.graph.device_updatable or graph.device_updatable:
            raise DeviceUpdatableError(
                "an exec with device-updatable kernel nodes cannot go through cuGraphExecUpdate (the driver refuses it)"
            )
        self.graph.device.ensure_current()
        err, info = driver.cuGraphExecUpdate(self.handle, graph.handle)
        if err == _SUCCESS:
            return
        if err == driver.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            if info is not None:
                result, node, from_node = int(info.result), int(info.errorNode), int(info.errorFromNode)
            else:
                # cuda-bindings 13.3 returns None for resultInfo on failure. A refused update
                # leaves the exec unchanged, so asking again through libcuda is harmless.
                result, node, from_node = _update_result_info(self.handle, graph.handle)
            raise GraphUpdateError(driver.CUgraphExecUpdateResult(result).name, node, from_node)
        raise cuda_error(err, "cuGraphExecUpdate")
