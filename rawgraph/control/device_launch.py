"""Device graph launch: a kernel inside one graph launches another graph (device ``cudaGraphLaunch``).

Two pieces:

- :class:`DeviceGraph`: a :class:`~rawgraph.graphs.graph.Graph` instantiated with
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

The launcher is never handed out as a plain :class:`~rawgraph.runtime.launch.Launch`: device launches are
allowed only from a kernel running inside a graph, so it exists only captured into a graph, and
only for a :class:`DeviceGraph`: device-launching an exec instantiated without the flag faults
with ``CUDA_ERROR_ILLEGAL_ADDRESS``, which destroys the context (measured with
``benchmarks/probes/device_launch.py``).

Ownership: the launcher kernel holds the target's ``CUgraphExec`` as a bare number, so the driver
knows nothing of the reference. rawgraph keeps the target's exec alive as long as anything can
still device-launch it: every :class:`LauncherGraph`, every :class:`LauncherExec` and, after a
launcher exec is destroyed with replays queued, those replays (a fence on the streams it was
launched on, :func:`rawgraph.graphs.builder.hold_for_replays`). Closing the :class:`DeviceGraph` marks
it closed at once (its own uses and new launcher graphs are refused, and a launcher exec refuses to
launch, :class:`~rawgraph.runtime.errors.ClosedError`, before any driver call); ``cuGraphExecDestroy``
runs when the last holder lets go, at once if there is none.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.builder import hold_for_replays
from ..graphs.capture import Capture
from ..graphs.graph import Graph, GraphExec
from ..runtime.device import Device
from ..runtime.errors import ClosedError, RawgraphError, call
from ..runtime.launch import ArgUse, KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceArray, as_device_array, check_array
from ..runtime.module import get_kernel
from ..runtime.resource import Resource, release
from ..runtime.stream import as_stream

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
                return (
                    f"its {side} is pageable host memory 0x{host:x} (device graphs copy device memory or "
                    "pinned, device-mapped host memory only)"
                )
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
    device or device-mapped memory. The driver refuses an empty graph, a graph of one empty node
    and a graph with a conditional IF node (``CUDA_ERROR_INVALID_VALUE``,
    ``CUDA_GRAPH_INSTANTIATE_ERROR`` / ``..._NODE_OPERATION_NOT_SUPPORTED``), so they are reported
    here, before the driver call.

    See Also
    --------
    cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphGetNodes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphNodeGetType : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphChildGraphNodeGetGraph : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphMemcpyNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
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
    The exec can also be launched from the host (:meth:`launch`).

    ``close()`` (safe twice) marks it closed: :attr:`exec`, :attr:`handle`, :meth:`launch` and new
    launcher graphs raise :class:`~rawgraph.runtime.errors.ClosedError`, and so does launching a
    :class:`LauncherExec` that names it, before any driver call. Its exec is destroyed
    (``cuGraphExecDestroy``) at once when no launcher graph was made for it; otherwise when the
    last launcher graph, launcher exec and queued launcher replay that could still device-launch
    it are gone (see the module docstring), so closing it with a launcher replay queued is safe.

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

    See Also
    --------
    cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphUpload : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuGraphExecDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    flags: int

    def __init__(self, graph: Graph, stream: Any, priority: bool = False, flags: int = 0):
        flags = int(flags)
        if flags & AUTO_FREE:
            raise DeviceLaunchError(
                "CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH cannot be combined with "
                "DEVICE_LAUNCH (cuGraphInstantiate documents it; the driver returns CUDA_ERROR_INVALID_VALUE)"
            )
        if flags & UPLOAD:
            raise DeviceLaunchError(
                "leave out CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: DeviceGraph uploads on the stream it is given"
            )
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
        exe = GraphExec(graph, self.flags)
        self._exec: GraphExec | None = exe
        # How many launcher graphs were made for it (a list: the release may not refer to self).
        self._launchers = [0]
        self._own(_release_target, exe, self._launchers, name="cuGraphExecDestroy (device graph)")
        exe.upload(s)
        s.synchronize()
        held = exe.driver_flags()
        if not held & DEVICE_LAUNCH:  # the launcher trusts this: a plain exec faults the context
            self.close()
            raise DeviceLaunchError(f"the driver holds flags 0x{held:x} for the exec, without DEVICE_LAUNCH")

    @property
    def exec(self) -> GraphExec:
        """The exec (``CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH``); :class:`ClosedError` once closed."""
        self._check_open()
        assert self._exec is not None
        return self._exec

    @property
    def handle(self) -> int:
        """The ``CUgraphExec`` as an integer (what the launcher kernel receives)."""
        return int(self.exec.handle)

    def launch(self, stream: Any) -> None:
        """``cuGraphLaunch`` from the host (device graphs may be launched from either side).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self.exec.launch(stream)

    def close(self) -> None:
        """Mark it closed and give up its hold on the exec (``cuGraphExecDestroy`` now if no
        launcher graph was made for it, else when the last launcher lets go); safe twice.

        See Also
        --------
        cuGraphExecDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._finalizer()
        self._exec = None

    def __repr__(self) -> str:
        return f"<DeviceGraph flags=0x{self.flags:x}{' closed' if self.closed else ''}>"


def _release_target(exe: GraphExec, launchers: list[int]) -> None:
    """A :class:`DeviceGraph`'s release: destroy its exec unless a launcher graph was made for it.

    A launcher graph, its execs and their queued replays hold ``exe`` themselves; it is destroyed
    (its own ``cuGraphExecDestroy`` finalizer) when the last of them lets go. Destroying it now
    would let a queued launcher replay device-launch a destroyed exec.
    """
    if not launchers[0]:
        exe.close()


class LauncherGraph(Graph):
    """The host graph :func:`launcher_graph` captures: its kernel device-launches :attr:`targets`.

    Keeps the targets' execs alive (:meth:`held_by_replays`), also when it is embedded as a child
    graph (:meth:`rawgraph.graphs.builder.GraphBuilder.child` keeps it). :meth:`instantiate` gives a
    :class:`LauncherExec`.

    Attributes
    ----------
    targets : tuple of DeviceGraph
    target_execs : tuple of GraphExec
        The execs the kernel device-launches (held even after their DeviceGraph is closed).
    device_launch_keep : tuple
        What the launching kernel's node names besides its arguments (the target, the plans'
        buffers), kept as long as the graph.
    """

    targets: tuple[DeviceGraph, ...] = ()
    target_execs: tuple[GraphExec, ...] = ()
    device_launch_keep: tuple[Any, ...] = ()

    def held_by_replays(self) -> list[Any]:
        """What a replay calls into that the driver does not own: the targets' execs."""
        return list(self.target_execs)

    def instantiate(self, flags: int = 0) -> LauncherExec:
        """``cuGraphInstantiate`` into a :class:`LauncherExec`.

        Raises
        ------
        ClosedError
            This graph or a target is closed (before the driver is called).

        See Also
        --------
        cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        _check_targets(self.targets)
        return LauncherExec(self, flags)


class LauncherExec(GraphExec):
    """An exec of a :class:`LauncherGraph`.

    :meth:`launch` refuses once a target :class:`DeviceGraph` is closed; its release holds the
    targets' execs until the replays it queued have run (:func:`rawgraph.graphs.builder.hold_for_replays`).
    """

    targets: tuple[DeviceGraph, ...]

    def __init__(self, graph: LauncherGraph, flags: int = 0):
        super().__init__(graph, flags)
        self.targets = graph.targets
        hold_for_replays(self, graph.held_by_replays())

    def launch(self, stream: Any) -> None:
        """``cuGraphLaunch``, after checking every target is open.

        Raises
        ------
        ClosedError
            This exec, the stream or a target :class:`DeviceGraph` is closed (checked before the
            driver is called: the kernel would device-launch an exec its owner gave up).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        _check_targets(self.targets)
        super().launch(stream)


def _check_targets(targets: tuple[DeviceGraph, ...]) -> None:
    for t in targets:
        if not t._finalizer.alive:
            raise ClosedError(
                "the DeviceGraph this launcher graph device-launches is closed; the launcher is refused "
                "before the driver is called"
            )


def _launcher(target: DeviceGraph, mode: str | None, rc: DeviceArray | None, device: Device) -> Launch:
    args = KernelArgs([("graph", "u64"), ("mode", "u64"), ("rc", "ptr")])
    args.update(
        {"graph": target.handle, "mode": 0 if mode is None else MODES[mode], "rc": rc.ptr if rc is not None else 0}
    )
    uses = {"rc": ArgUse("rc", "write")} if rc is not None else {}
    return Launch(
        get_kernel("device_launch", "rg_graph_launch", device),
        (1, 1, 1),
        (1, 1, 1),
        args,
        uses,
        0,
        f"graph_launch[{mode or 'none'}]",
    )


def launcher_graph(
    target: DeviceGraph,
    stream: Any,
    mode: str | None = "tail",
    before: LaunchPlan | None = None,
    after: LaunchPlan | None = None,
    rc: Any = None,
) -> LauncherGraph:
    """Capture a host graph: ``before``'s launches, one kernel that device-launches ``target``, ``after``'s.

    The launcher kernel calls the device runtime's ``cudaGraphLaunch(target, mode)``; it is
    captured without a warm-up run, because outside a graph a device launch is not allowed. The
    returned graph keeps ``target``, its exec and the plans alive; instantiate it normally
    (``graph.instantiate()``, a :class:`LauncherExec`) and launch it from the host.

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

    Returns
    -------
    LauncherGraph
        Owns the captured ``CUgraph``; holds ``target``'s exec (see the module docstring).

    Raises
    ------
    DeviceLaunchError
        ``target`` is not a :class:`DeviceGraph` (a plain exec launched from the device faults the
        context), is closed, or ``mode`` is unknown.
    """
    if not isinstance(target, DeviceGraph):
        raise DeviceLaunchError(
            f"the target must be a DeviceGraph (instantiated with DEVICE_LAUNCH and uploaded), got {type(target).__name__}: "
            "device-launching any other exec faults the context (CUDA_ERROR_ILLEGAL_ADDRESS)"
        )
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
    captured = cap.captured
    graph = _as_launcher_graph(captured)
    graph.targets = (target,)
    graph.target_execs = (target.exec,)
    target._launchers[0] += 1
    # The node map (graph.nodes) holds every Launch and so its arguments; the node also names
    # target's exec and the plans' buffers, so keep those alive as long as the graph.
    graph.device_launch_keep = target, before, after, rc_arr
    return graph


def _as_launcher_graph(captured: Graph) -> LauncherGraph:
    """Move the ``CUgraph`` a capture made into a :class:`LauncherGraph` (the one owner from here on)."""
    handle = captured.handle
    captured._finalizer.detach()  # first: never two owners of one handle (a leak beats a double destroy)
    try:
        graph = LauncherGraph(handle, captured.nodes, captured.device)
    except BaseException:
        release("cuGraphDestroy", driver.cuGraphDestroy, handle)
        raise
    for key, value in vars(captured).items():
        if key not in ("_finalizer", "handle", "nodes", "device"):
            setattr(graph, key, value)
    return graph
