"""Device graph launch: a kernel inside one graph launches another graph (device ``cudaGraphLaunch``).

Two pieces:

- :class:`DeviceGraph`: a :class:`~rawgraph.graph.Graph` instantiated with
  ``CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`` (``cuGraphInstantiate``) and uploaded
  (``cuGraphUpload``), after checking in Python the restrictions the driver documents for such
  graphs (only kernel, memcpy, memset and child-graph nodes; not empty; no
  ``AUTO_FREE_ON_LAUNCH``), so a refusal names the node and the reason instead of the driver's
  bare ``CUDA_ERROR_INVALID_VALUE``.
- :func:`launcher_graph`: a host graph whose kernel node (``rg_graph_launch`` in
  ``kernels/device_launch.cu``) calls ``cudaGraphLaunch(target, mode)`` on the device, with
  ``mode`` one of :data:`MODES`:

  * ``"tail"`` (``cudaStreamGraphTailLaunch``): the target runs after the launching graph has
    finished, before the stream's next work;
  * ``"fire_and_forget"`` (``cudaStreamGraphFireAndForget``): the target starts at once, beside
    the rest of the launching graph; the launching graph completes only once it has;
  * ``"sibling"`` (``cudaStreamGraphFireAndForgetAsSibling``): fire-and-forget as a sibling of
    the launching graph (a child of its parent, here the host launch).

The launcher is never handed out as a plain :class:`~rawgraph.launch.Launch`: device launches are
allowed only from a kernel running inside a graph, so it exists only captured into a graph, and
only for a :class:`DeviceGraph` (the H200 probe's device launch of an exec instantiated without the
flag ended in ``CUDA_ERROR_ILLEGAL_ADDRESS``, which destroys the context: see
``benchmarks/results/probe_device_launch.txt``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import driver

from ..capture import Capture
from ..device import Device
from ..errors import RawgraphError, call
from ..graph import Graph, GraphExec
from ..kernels import get_kernel
from ..launch import ArgUse, KernelArgs, Launch, LaunchPlan
from ..memory import DeviceArray, as_device_array, check_array
from ..resource import Resource
from ..stream import as_stream

# The special cudaStream_t values of cuda_device_runtime_api.h (CUDA 13.0, same in 12.x).
TAIL = 0x0100000000000000
FIRE_AND_FORGET = 0x0200000000000000
SIBLING = 0x0300000000000000
MODES: dict[str, int] = {"tail": TAIL, "fire_and_forget": FIRE_AND_FORGET, "sibling": SIBLING}

_FLAGS = driver.CUgraphInstantiate_flags
DEVICE_LAUNCH = int(_FLAGS.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
UPLOAD = int(_FLAGS.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
AUTO_FREE = int(_FLAGS.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
USE_NODE_PRIORITY = int(_FLAGS.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)

_T = driver.CUgraphNodeType
_WORK = {int(_T.CU_GRAPH_NODE_TYPE_KERNEL), int(_T.CU_GRAPH_NODE_TYPE_MEMCPY), int(_T.CU_GRAPH_NODE_TYPE_MEMSET)}
_CHILD = int(_T.CU_GRAPH_NODE_TYPE_GRAPH)
_MEMCPY = int(_T.CU_GRAPH_NODE_TYPE_MEMCPY)
_ARRAY = int(driver.CUmemorytype.CU_MEMORYTYPE_ARRAY)
_HOST = int(driver.CUmemorytype.CU_MEMORYTYPE_HOST)
_SUCCESS = driver.CUresult.CUDA_SUCCESS


class DeviceLaunchError(RawgraphError, ValueError):
    """A graph, flag or launcher the driver would refuse for device launch (refused before calling it)."""


def _type_name(t: int) -> str:
    try:
        return driver.CUgraphNodeType(t).name.replace("CU_GRAPH_NODE_TYPE_", "")
    except ValueError:
        return str(t)


def _host_pointer_registered(ptr: int) -> bool:
    """Whether the driver knows host address ``ptr`` (pinned or registered, so device-mapped under
    unified addressing); pageable memory is unknown to it (``cuPointerGetAttribute`` fails)."""
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    err, _value = driver.cuPointerGetAttribute(attr, int(ptr))
    return err == _SUCCESS


def _memcpy_problem(node: Any) -> str | None:
    p = call(driver.cuGraphMemcpyNodeGetParams, node)
    for side in ("src", "dst"):
        mtype = int(getattr(p, f"{side}MemoryType"))
        if mtype == _ARRAY:
            return f"its {side} is a CUDA array (device graphs copy device or device-mapped memory only)"
        if mtype == _HOST:
            host = int(getattr(p, f"{side}Host"))
            if not _host_pointer_registered(host):
                return (f"its {side} is pageable host memory 0x{host:x} (device graphs copy device memory or "
                        "pinned, device-mapped host memory only)")
    return None


def _walk(graph_handle: Any, path: str, problems: list[str]) -> int:
    """Append a reason for every node a device graph may not hold; return the count of work nodes."""
    _nodes, count = call(driver.cuGraphGetNodes, graph_handle, 0)
    if not count:
        return 0
    nodes, _ = call(driver.cuGraphGetNodes, graph_handle, count)
    work = 0
    for i, node in enumerate(nodes):
        t = int(call(driver.cuGraphNodeGetType, node))
        where = f"{path}node {i} ({_type_name(t)})"
        if t in _WORK:
            work += 1
            if t == _MEMCPY:
                why = _memcpy_problem(node)
                if why:
                    problems.append(f"{where}: {why}")
        elif t == _CHILD:
            work += _walk(call(driver.cuGraphChildGraphNodeGetGraph, node), f"{where} > ", problems)
        else:
            problems.append(f"{where}: a device graph holds only kernel, memcpy, memset and child-graph nodes")
    return work


def device_launch_problems(graph: Graph) -> list[str]:
    """Why ``graph`` cannot be instantiated for device launch (empty when it can).

    Checks the restrictions ``cuGraphInstantiate`` documents for
    ``CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH``, walking child graphs (``cuGraphGetNodes``,
    ``cuGraphNodeGetType``, ``cuGraphChildGraphNodeGetGraph``, ``cuGraphMemcpyNodeGetParams``):
    only kernel, memcpy, memset and child-graph nodes (so no conditional, memory alloc/free, empty,
    host, event or wait nodes), at least one kernel, memcpy or memset node, memcpy operands in
    device or device-mapped memory. On the H200 the driver refused an empty graph, a graph of one
    empty node and a graph with a conditional IF node (``CUDA_ERROR_INVALID_VALUE``,
    ``CUDA_GRAPH_INSTANTIATE_ERROR`` / ``..._NODE_OPERATION_NOT_SUPPORTED``).
    """
    graph._check_open()
    problems: list[str] = []
    work = _walk(graph.handle, "", problems)
    if not work:
        problems.insert(0, "the graph has no kernel, memcpy or memset node (the driver refuses an empty device graph)")
    return problems


class DeviceGraph(Resource):
    """An exec that kernels may launch: instantiated for device launch and uploaded.

    ``cuGraphInstantiate`` with ``CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`` (plus
    ``USE_NODE_PRIORITY`` if asked), then ``cuGraphUpload`` on ``stream`` and
    ``cuStreamSynchronize``: a device graph must be on the device before a kernel launches it.
    The exec can also be launched from the host (:meth:`launch`). Destroyed on ``close()``
    (``cuGraphExecDestroy``); a launcher graph naming it must not be launched after that.

    Parameters
    ----------
    graph : Graph
        Kernel, memcpy, memset and child-graph nodes only (see :func:`device_launch_problems`).
    stream : stream-like
        Where the upload runs.
    priority : bool, default False
        ``CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`` (the probe instantiated it with the
        device-launch flag).
    flags : int, default 0
        Other ``CUgraphInstantiate_flags``; ``AUTO_FREE_ON_LAUNCH`` (invalid with device launch)
        and ``UPLOAD`` (the upload is done here) are refused.

    Raises
    ------
    DeviceLaunchError
        A flag or a node the driver refuses for device launch, with the reasons.
    """

    def __init__(self, graph: Graph, stream: Any, priority: bool = False, flags: int = 0):
        flags = int(flags)
        if flags & AUTO_FREE:
            raise DeviceLaunchError("CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH cannot be combined with "
                                    "DEVICE_LAUNCH (cuGraphInstantiate documents it; the H200 returned CUDA_ERROR_INVALID_VALUE)")
        if flags & UPLOAD:
            raise DeviceLaunchError("leave out CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: DeviceGraph uploads on the stream it is given")
        known = DEVICE_LAUNCH | USE_NODE_PRIORITY
        if flags & ~known:
            raise DeviceLaunchError(f"unknown instantiate flags 0x{flags & ~known:x} for a device graph")
        problems = device_launch_problems(graph)
        if problems:
            raise DeviceLaunchError("this graph cannot be launched from the device:\n  " + "\n  ".join(problems))
        s = as_stream(stream)
        s._check_open()
        self.graph = graph
        self.device: Device = graph.device
        self.flags = DEVICE_LAUNCH | flags | (USE_NODE_PRIORITY if priority else 0)
        self.exec = GraphExec(graph, self.flags)
        self._own(self.exec.close, name="cuGraphExecDestroy (device graph)")
        self.exec.upload(s)
        s.synchronize()
        held = self.exec.driver_flags()
        if not held & DEVICE_LAUNCH:  # the launcher trusts this: a plain exec faults the context
            self.close()
            raise DeviceLaunchError(f"the driver holds flags 0x{held:x} for the exec, without DEVICE_LAUNCH")

    @property
    def handle(self) -> int:
        """The ``CUgraphExec`` as an integer (what the launcher kernel receives)."""
        self._check_open()
        return int(self.exec.handle)

    def launch(self, stream: Any) -> None:
        """``cuGraphLaunch`` from the host (device graphs may be launched from either side)."""
        self._check_open()
        self.exec.launch(stream)

    def __repr__(self) -> str:
        return f"<DeviceGraph flags=0x{self.flags:x}{' closed' if self.closed else ''}>"


def _launcher(target: DeviceGraph, mode: str | None, rc: DeviceArray | None, device: Device) -> Launch:
    args = KernelArgs([("graph", "u64"), ("mode", "u64"), ("rc", "ptr")])
    args.update({"graph": target.handle, "mode": 0 if mode is None else MODES[mode], "rc": rc.ptr if rc is not None else 0})
    uses = {"rc": ArgUse("rc", "write")} if rc is not None else {}
    return Launch(get_kernel("device_launch", "rg_graph_launch", device), (1, 1, 1), (1, 1, 1), args, uses, 0,
                  f"graph_launch[{mode or 'none'}]")


def launcher_graph(target: DeviceGraph, stream: Any, mode: str | None = "tail", before: LaunchPlan | None = None,
                   after: LaunchPlan | None = None, rc: Any = None) -> Graph:
    """Capture a host graph: ``before``'s launches, one kernel that device-launches ``target``, ``after``'s.

    The launcher kernel calls the device runtime's ``cudaGraphLaunch(target, mode)``; it is
    captured without a warm-up run, because outside a graph a device launch is not allowed. The
    returned graph keeps ``target`` and the plans alive; instantiate it normally
    (``graph.instantiate()``) and launch it from the host.

    Parameters
    ----------
    target : DeviceGraph
    stream : Stream
        The capture stream (not capturing already).
    mode : {"tail", "fire_and_forget", "sibling"} or None
        None captures the same kernel launching nothing (the latency benchmark's baseline).
    before, after : LaunchPlan, optional
        Work captured before / after the launcher node, in stream order with it.
    rc : device array of one int32, optional
        Receives ``cudaGraphLaunch``'s ``cudaError_t`` (0 = ``cudaSuccess``) at every replay.

    Raises
    ------
    DeviceLaunchError
        ``target`` is not a :class:`DeviceGraph` (a plain exec launched from the device faulted
        the H200 probe's context), is closed, or ``mode`` is unknown.
    """
    if not isinstance(target, DeviceGraph):
        raise DeviceLaunchError(
            f"the target must be a DeviceGraph (instantiated with DEVICE_LAUNCH and uploaded), got {type(target).__name__}: "
            "device-launching any other exec faults the context (CUDA_ERROR_ILLEGAL_ADDRESS on the H200)")
    if target.closed:
        raise DeviceLaunchError("the target DeviceGraph is closed")
    if mode is not None and mode not in MODES:
        raise DeviceLaunchError(f"mode must be one of {sorted(MODES)} or None, got {mode!r}")
    s = as_stream(stream)
    device = target.device
    rc_arr = None
    if rc is not None:
        rc_arr = check_array(as_device_array(rc, "rc"), (1,), np.int32, "rc", device)
    plans = [p for p in (before, after) if p is not None]
    for p in plans:
        p.check_open()
    launcher = _launcher(target, mode, rc_arr, device)
    # Each launch is captured as its own plan made it (PDL flags included); the launcher itself is
    # a plain launch, so it starts after everything before it and what follows starts after it.
    launches = (list(before.launches) if before else []) + [launcher] + (list(after.launches) if after else [])
    cap = Capture(s)
    with cap:
        for launch in launches:
            cap.launch(launch)
    graph = cap.captured
    # The node map (graph.nodes) holds every Launch and so its arguments; the node also names
    # target's exec and the plans' buffers, so keep those alive as long as the graph.
    setattr(graph, "device_launch_keep", (target, before, after, rc_arr))
    return graph
