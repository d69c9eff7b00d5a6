"""Conditional graph nodes: IF, IF/ELSE, SWITCH and WHILE decided on the device at every replay.

A conditional node holds one or more *body graphs* and a *condition handle*
(``cuGraphConditionalHandleCreate``). A kernel that runs earlier in the same replay sets the
condition with the device-runtime builtin ``cudaGraphSetConditional(handle, value)``
(``kernels/control.cu``, compiled by NVRTC without ``-rdc``); when the node is reached:

- ``IF`` (size 1): body 0 runs when the value is nonzero;
- ``IF/ELSE`` (``IF`` of size 2, CUDA >= 12.8): body 0 when nonzero, body 1 when zero;
- ``SWITCH`` (size n, CUDA >= 12.8): body ``value`` when ``value < n``, none otherwise;
- ``WHILE`` (size 1): body 0 runs again and again while the value is nonzero, checked before
  each iteration; a kernel in the body sets the value for the next check.

With ``default`` given, the handle is reset to it at the start of every launch
(``CU_GRAPH_COND_ASSIGN_DEFAULT``); without, it keeps no defined value until a kernel sets it.

Nodes are added two ways, with the same result: by a :class:`~rawgraph.graphs.builder.GraphBuilder`
(:func:`add_conditional`), or inside a :class:`~rawgraph.graphs.capture.Capture` (:func:`capture_conditional`:
``cuStreamGetCaptureInfo`` -> ``cuGraphAddNode`` on the capturing graph with the capture's current
dependencies -> ``cuStreamUpdateCaptureDependencies``), after which the capture goes on behind
the node. Bodies are filled with a body builder (:attr:`ConditionalNode.bodies`) or captured on a
second stream (:meth:`ConditionalNode.capture_body`, ``cuStreamBeginCaptureToGraph``; the
capturing stream itself is refused by the driver with ``CUDA_ERROR_ILLEGAL_STATE``).

Rules (checked here before the driver sees them): a body holds only kernel, empty, memcpy,
memset, child graph and conditional nodes; sizes are IF 1 or 2, WHILE 1, SWITCH >= 1; a handle
serves one node of the graph it was made for; a graph with a conditional node cannot be cloned
or embedded as a child graph (``CUDA_ERROR_NOT_SUPPORTED``). An exec's conditional node takes no
``cuGraphExecNodeSetParams`` (``CUDA_ERROR_NOT_SUPPORTED``, driver 580); the kernel nodes of
its bodies do take ``cuGraphExecKernelNodeSetParams``.

Worked examples over any row-wise model (:mod:`rawgraph.control.loops`): ``DepthLoop`` (a
model's depth read from device memory at every replay: one exec for every depth up to a maximum)
and ``NormGate`` (skip the model when a device-computed norm is under a threshold).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from cuda.bindings import driver

from ..runtime import _capturing
from ..runtime.device import Device, driver_cuda_version, get_device
from ..runtime.errors import CaptureError, CaptureRefusedError, RawgraphError, ShapeError, call, check, error_name
from ..runtime.launch import KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceArray, as_device_array
from ..runtime.module import Kernel, get_kernel
from ..runtime.resource import flush_deferred, shutting_down
from ..runtime.stream import Stream, capture_info, stream_handle
from .builder import DepSpec, GraphBuilder, Node
from .capture import DEFAULT_CAPTURE_MODE, Capture, CaptureMode, _not_active
from .graph import KernelNode

KINDS = ("if", "while", "switch")
_COND_T = {
    "if": driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF,
    "while": driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE,
    "switch": driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_SWITCH,
}
# Driver versions (cuDriverGetVersion): IF and WHILE came with CUDA 12.3; IF/ELSE (an IF of size
# 2) and SWITCH with 12.8.
MIN_DRIVER = 12030
MIN_DRIVER_ELSE_SWITCH = 12080
ASSIGN_DEFAULT = int(driver.CU_GRAPH_COND_ASSIGN_DEFAULT)
_SET_DEPS = driver.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_SUCCESS = driver.CUresult.CUDA_SUCCESS
THREADS = 256


class ConditionalUnsupportedError(RawgraphError):
    """The driver is too old for this conditional node (checked before calling it)."""


def check_kind(kind: str, size: int | None, version: int | None = None) -> int:
    """Validate a conditional node's type and body count against the rules and the driver.

    Returns the size to use (IF and WHILE default to 1; SWITCH needs one).

    Raises
    ------
    ValueError
        Unknown kind or a size the driver rejects (``CUDA_ERROR_INVALID_VALUE`` from driver 580
        for WHILE 2, IF 3 and SWITCH 0).
    ConditionalUnsupportedError
        IF/ELSE or SWITCH on a driver older than CUDA 12.8, any conditional before 12.3.
    """
    if kind not in KINDS:
        raise ValueError(f"conditional kind must be one of {KINDS}, got {kind!r}")
    if size is None:
        if kind == "switch":
            raise ValueError("a SWITCH node needs size= (its number of bodies)")
        size = 1
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    size = int(size)
    allowed = {"if": (1, 2), "while": (1,)}.get(kind)
    if allowed is not None and size not in allowed:
        raise ValueError(f"a {kind.upper()} node has {' or '.join(map(str, allowed))} bodies, not {size}")
    if kind == "switch" and size < 1:
        raise ValueError(f"a SWITCH node needs at least one body, got size {size}")
    v = driver_cuda_version() if version is None else int(version)
    if v < MIN_DRIVER:
        raise ConditionalUnsupportedError(f"conditional nodes need a CUDA 12.3 driver; this one is {_ver(v)}")
    if (kind == "switch" or (kind == "if" and size == 2)) and v < MIN_DRIVER_ELSE_SWITCH:
        what = "SWITCH" if kind == "switch" else "IF/ELSE (an IF node of size 2)"
        raise ConditionalUnsupportedError(f"{what} needs a CUDA 12.8 driver; this one is {_ver(v)}")
    return size


def _ver(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@dataclass
class ConditionalHandle:
    """A condition variable of one graph (``cuGraphConditionalHandleCreate``).

    Pass :attr:`value` (or ``int(handle)``) as the ``cudaGraphConditionalHandle`` (``u64``)
    argument of the kernel that sets it. Its lifetime is the graph's: nothing to release.

    Attributes
    ----------
    value : int
    graph : int
        The graph handle it was made for (as an integer).
    default : int or None
        Value assigned at the start of every launch, or None (not reset).

    See Also
    --------
    cuGraphConditionalHandleCreate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    value: int
    graph: int
    default: int | None
    raw: Any = None
    used_by: Any = None  # the conditional node that took it

    def __int__(self) -> int:
        return self.value


def make_handle(graph: Any, device: Device | None = None, default: int | None = None) -> ConditionalHandle:
    """``cuGraphConditionalHandleCreate`` for ``graph`` (a builder, a Graph or a raw CUgraph).

    ``default``: reset the condition to this value at the start of every launch
    (``CU_GRAPH_COND_ASSIGN_DEFAULT``); None leaves it unset until a kernel sets it.

    See Also
    --------
    cuGraphConditionalHandleCreate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    dev = (device or getattr(graph, "device", None) or get_device()).activate()
    handle = getattr(graph, "handle", graph)
    if default is not None and not 0 <= int(default) < (1 << 32):
        raise ValueError(f"a condition is an unsigned 32-bit value, got default {default}")
    flags = ASSIGN_DEFAULT if default is not None else 0
    raw = call(driver.cuGraphConditionalHandleCreate, handle, dev.context, int(default or 0), flags)
    return ConditionalHandle(int(raw), int(handle), None if default is None else int(default), raw)


@dataclass
class ConditionalNode:
    """A conditional node and its bodies.

    Attributes
    ----------
    node : Node
        The node in the parent graph (``kind == "conditional"``).
    kind : str
        ``if``, ``while`` or ``switch``.
    cond : ConditionalHandle
    bodies : list of GraphBuilder
        One builder per body graph (``CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out``), owned by the
        node: add the body's nodes through them, or capture them with :meth:`capture_body`.
    """

    node: Node
    kind: str
    cond: ConditionalHandle
    bodies: list[GraphBuilder]
    device: Device
    keep: list[Any] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.bodies)

    def body_kernel_nodes(self, i: int) -> list[KernelNode]:
        """The kernel nodes of body ``i`` (added by a body builder or captured into it)."""
        return self.bodies[i].kernel_nodes

    def capture_body(self, i: int, stream: Any, mode: CaptureMode = DEFAULT_CAPTURE_MODE) -> BodyCapture:
        """Capture body ``i`` on ``stream`` (``cuStreamBeginCaptureToGraph``): a context manager
        with ``launch(Launch)`` and ``run(LaunchPlan)``. ``stream`` must be a stream that is not
        capturing (not the one whose capture holds this node).

        See Also
        --------
        cuStreamBeginCaptureToGraph : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        if not 0 <= i < len(self.bodies):
            raise IndexError(f"body {i} of a {self.kind.upper()} node with {len(self.bodies)} bodies")
        return BodyCapture(self, self.bodies[i], stream, mode)


def _node_params(cond: ConditionalHandle, kind: str, size: int, device: Device) -> Any:
    """The ``CUgraphNodeParams`` of a conditional node (``cuGraphAddNode``).

    Every input field of ``CUDA_CONDITIONAL_NODE_PARAMS`` is set (handle, type, size, context);
    ``phGraph_out`` is the driver's output (it writes a pointer to its array of body graphs) and
    stays null until then. The struct's reserved words and the rest of its union are zero as
    cuda-bindings allocates them (tests/test_builder_cpu.py reads every byte back).
    """
    p = driver.CUgraphNodeParams()
    p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    c = p.conditional  # a view into p (p stays alive: it is returned)
    c.handle = cond.raw if cond.raw is not None else driver.CUgraphConditionalHandle(cond.value)
    c.type = _COND_T[kind]
    c.size = size
    c.ctx = device.context
    return p


def _take_handle(cond: ConditionalHandle, graphs: list[int]) -> None:
    if not isinstance(cond, ConditionalHandle):
        raise TypeError(f"expected a ConditionalHandle (make_handle), got {type(cond).__name__}")
    if cond.used_by is not None:
        raise RawgraphError("this condition handle already drives a conditional node; make one handle per node")
    if cond.graph not in graphs:
        raise RawgraphError(
            "this condition handle was made for another graph (make it on the graph, or a parent "
            "graph, that holds the node)"
        )


def add_conditional(
    builder: GraphBuilder, kind: str, cond: ConditionalHandle, size: int | None = None, deps: DepSpec = ()
) -> ConditionalNode:
    """Add a conditional node to ``builder``'s graph (``cuGraphAddNode`` with
    ``CU_GRAPH_NODE_TYPE_CONDITIONAL``); returns it with one body builder per body.

    ``cond`` must come from :func:`make_handle` on this graph or one it is a body of, and drive
    no other node.

    See Also
    --------
    cuGraphAddNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    size = check_kind(kind, size)
    _take_handle(cond, _ancestry(builder))
    params = _node_params(cond, kind, size, builder.device)
    node, params = builder.node(params, "conditional", deps)
    cond.used_by = node
    cn = _wrap(node, kind, cond, size, builder.device, params, builder)
    builder.details[node.index] = cn  # the built graph's other_nodes carry it (the doctor reads the default)
    return cn


def _ancestry(builder: GraphBuilder) -> list[int]:
    out: list[int] = []
    b: GraphBuilder | None = builder
    while b is not None:
        out.append(int(b.handle))
        parent = b._body_of
        b = parent if isinstance(parent, GraphBuilder) else None
    return out


def _wrap(
    node: Node, kind: str, cond: ConditionalHandle, size: int, device: Device, params: Any, parent: GraphBuilder | None
) -> ConditionalNode:
    graphs = list(params.conditional.phGraph_out)[:size]  # driver-owned array of `size` entries
    if len(graphs) != size or not all(int(g) for g in graphs):
        raise RawgraphError(f"cuGraphAddNode returned {len(graphs)} body graphs for a node of size {size}")
    bodies = [GraphBuilder(device, _body_of=parent if parent is not None else node, _handle=g) for g in graphs]
    return ConditionalNode(node, kind, cond, bodies, device, [params])


# ------------------------------------------------------------------------------- capture side
def _capture_info(cap: Capture) -> tuple[Any, list[Any], list[Any] | None]:
    """(capturing graph, current dependencies, their edge data) of an open capture."""
    status, _id, graph, deps, edges, n = check(
        driver.cuStreamGetCaptureInfo(cap.stream.handle), "cuStreamGetCaptureInfo"
    )
    if status != _ACTIVE:
        raise CaptureError(0, "CAPTURE_NOT_ACTIVE", f"capture status is {status.name}", "cuStreamGetCaptureInfo")
    n = int(n)
    # The arrays may be longer than the count: trim (cuda.core does the same).
    deps = list(deps or [])[:n]
    edge_list = list(edges)[:n] if edges else None
    return graph, deps, edge_list


def _check_capturing(cap: Capture, what: str) -> None:
    if not isinstance(cap, Capture):
        raise TypeError(f"{what} needs a rawgraph Capture, got {type(cap).__name__}")
    if not cap._open:
        raise RawgraphError(f"{what} outside the Capture's with-block")


def capture_handle(cap: Capture, default: int | None = None) -> ConditionalHandle:
    """A condition handle on the graph ``cap`` is capturing into (see :func:`make_handle`)."""
    _check_capturing(cap, "capture_handle")
    graph, _deps, _edges = _capture_info(cap)
    return make_handle(graph, cap.stream.device, default)


def capture_conditional(cap: Capture, kind: str, cond: ConditionalHandle, size: int | None = None) -> ConditionalNode:
    """Insert a conditional node at the current point of a capture.

    ``cuStreamGetCaptureInfo`` gives the capturing graph and the stream's current dependencies;
    ``cuGraphAddNode`` adds the node after them; ``cuStreamUpdateCaptureDependencies`` (SET) makes
    it the one dependency of whatever is captured next. The node is recorded in
    ``cap.other_nodes`` as ``(node, "conditional", ConditionalNode)``, so the capture's node
    count check holds. Fill the bodies with :meth:`ConditionalNode.capture_body` (on another
    stream) or the body builders.

    See Also
    --------
    cuStreamGetCaptureInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuStreamUpdateCaptureDependencies : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuGraphAddNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    _check_capturing(cap, "capture_conditional")
    size = check_kind(kind, size)
    graph, deps, edges = _capture_info(cap)
    _take_handle(cond, [int(graph)])
    dev = cap.stream.device
    params = _node_params(cond, kind, size, dev)
    handle = call(driver.cuGraphAddNode, graph, deps, edges, len(deps), params)
    call(driver.cuStreamUpdateCaptureDependencies, cap.stream.handle, [handle], None, 1, _SET_DEPS)
    node = Node(handle, "conditional", len(cap.nodes) + len(cap.other_nodes))
    cond.used_by = node
    cn = _wrap(node, kind, cond, size, dev, params, None)
    cap.other_nodes.append((handle, "conditional", cn))
    return cn


def _end_quietly(handle: Any, record: _capturing.CaptureRecord) -> None:
    if shutting_down():
        _capturing.end(record)
        return
    try:
        driver.cuStreamEndCapture(handle)
    finally:
        _capturing.end(record)  # after the driver's end: see Capture.__enter__
    flush_deferred()  # what garbage collection released while the body capture was open


class BodyCapture:
    """Captures one conditional body on a second stream (``cuStreamBeginCaptureToGraph``).

    Made by :meth:`ConditionalNode.capture_body`. Inside the with-block, :meth:`launch` and
    :meth:`run` record kernel nodes into the body (the node map: the body builder's
    ``kernel_nodes``, each with its dependencies read with ``cuStreamGetCaptureInfo`` before its
    launch). On exit the capture ends (``cuStreamEndCapture``, which returns the body graph
    itself); if the block raised, the capture is still ended and the error propagates. Either way
    the releases held back while it was open (``cuMemFree`` and friends that garbage collection
    ran inside it, see :mod:`rawgraph.runtime.resource`) run then, unless another capture still forbids
    them (that capture runs them at its own end).

    See Also
    --------
    cuStreamBeginCaptureToGraph : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuStreamGetCaptureInfo, cuStreamEndCapture : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """

    def __init__(self, node: ConditionalNode, body: GraphBuilder, stream: Any, mode: CaptureMode):
        if not isinstance(stream, Stream):
            raise TypeError(f"a body is captured on a rawgraph Stream, got {type(stream).__name__}")
        if stream.is_default:
            raise CaptureRefusedError("cannot capture on a default stream; use a rawgraph.Stream()")
        self.node = node
        self.body = body
        self.stream = stream
        self.mode = mode
        self._open = False
        self._record: _capturing.CaptureRecord | None = None
        self._abandon: weakref.finalize[..., Any] | None = None
        self.buffers: dict[str, DeviceArray] = {}  # no names kept in a body (see buffer_name)

    def __enter__(self) -> BodyCapture:
        self.stream._check_open()
        if self.stream.is_capturing():
            raise CaptureRefusedError(
                "this stream is already capturing; a body is captured on another stream than the capture that "
                "holds its node (the driver answers CUDA_ERROR_ILLEGAL_STATE)"
            )
        # Open the record before the driver's capture and close it after (see Capture.__enter__):
        # a finalizer run by garbage collection in between would free into the capture.
        self._record = _capturing.CaptureRecord(self.stream.ptr, self.mode.name)
        _capturing.begin(self._record)
        try:
            call(
                driver.cuStreamBeginCaptureToGraph, self.stream.handle, self.body.handle, None, None, 0, self.mode.value
            )
        except BaseException:
            _capturing.end(self._record)
            flush_deferred()
            raise
        self._open = True
        self._abandon = weakref.finalize(self, _end_quietly, self.stream.handle, self._record)
        # A RawKernel call on this stream is recorded through launch() (found by capture id).
        try:
            self._record.capture_id = capture_info(self.stream.handle)[1]
        except BaseException:
            self.__exit__(*sys.exc_info())  # no __exit__ runs for a failed __enter__: end it here
            raise
        self._record.owner = weakref.ref(self)
        return self

    def buffer_name(self, view: Any, wanted: str) -> str:
        """The name a RawKernel call's array gets in the body: ``wanted`` (a body has no plan
        to bind by; the array is held as long as the body's graph)."""
        return wanted

    def launch(
        self, launch: Launch, stream: Any = None, buffers: dict[str, DeviceArray] | None = None, pdl: bool | None = None
    ) -> KernelNode:
        """Launch into the body and record the node it became (``cuStreamGetCaptureInfo``).
        ``buffers`` (what a RawKernel call was given) are held by the body's builder. ``pdl=False``
        launches a PDL launch plainly (``cuLaunchKernel``: a default edge, not a programmatic one).

        See Also
        --------
        cuStreamGetCaptureInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        cuLaunchKernel : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
        """
        if not self._open:
            raise RawgraphError("BodyCapture.launch outside the with-block")
        if stream is not None and int(stream_handle(stream)) != self.stream.ptr:
            raise CaptureRefusedError("BodyCapture.launch: a body is captured on its own stream only")
        if buffers:
            self.body.keep.extend(buffers.values())
        status, _cid, _g, before = capture_info(self.stream.handle)  # the node's dependencies
        if status != _ACTIVE:
            raise _not_active(status, f"before launching {launch.kernel.name} into a body")
        if pdl is False and launch.pdl:
            f, gx, gy, gz, bx, by, bz, sm, a = launch.packed()
            check(
                driver.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sm, self.stream.handle, a, 0),
                f"cuLaunchKernel({launch.kernel.name})",
            )
        else:
            launch(self.stream)
        status, _id, _g, deps, _e, n = check(
            driver.cuStreamGetCaptureInfo(self.stream.handle), "cuStreamGetCaptureInfo"
        )
        if status != _ACTIVE or int(n) != 1:
            raise RawgraphError(f"expected one dependency after launching {launch.kernel.name} into a body, found {n}")
        kn = KernelNode(deps[0], len(self.body.kernel_nodes), launch, launch.args.snapshot(), before)
        self.body.kernel_nodes.append(kn)
        self.body.nodes.append(Node(deps[0], "kernel", len(self.body.nodes)))
        self.body.keep.append(launch)
        return kn

    def run(self, plan: LaunchPlan, pdl: bool | None = None) -> None:
        """Record every launch of ``plan`` in order (PDL launches become programmatic edges;
        ``pdl=False``: default edges throughout, as :meth:`GraphBuilder.run` does)."""
        plan.check_open()
        for launch in plan.launches:
            self.launch(launch, pdl=pdl)
        self.body.keep.append(plan)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self._open = False
        assert self._record is not None and self._abandon is not None
        self._abandon.detach()
        try:
            err, graph = driver.cuStreamEndCapture(self.stream.handle)
        finally:
            _capturing.end(self._record)  # after the driver's end: see Capture.__enter__
            # The stream has left capture mode: run what garbage collection released inside the
            # body (a no-op while an enclosing capture still forbids it; that one flushes at its end).
            flush_deferred()
        if exc_type is not None:
            return False
        if self._record.errors:
            raise CaptureError(
                0,
                "CAPTURE_BODY_ERROR",
                f"the body capture caught {len(self._record.errors)} "
                f"driver error(s) and went on; the first: {self._record.errors[0]}",
                "cuStreamEndCapture",
            ) from self._record.errors[0]
        if err != _SUCCESS:
            check((err,), "cuStreamEndCapture")
        if graph is not None and int(graph) != int(self.body.handle):
            raise RawgraphError(
                f"cuStreamEndCapture returned graph 0x{int(graph):x}, not the body "
                f"0x{int(self.body.handle):x} ({error_name(err)})"
            )
        return False


# --------------------------------------------------------------------------- launch builders
def control_kernel(name: str, device: Device | None = None) -> Kernel:
    """One kernel of ``kernels/control.cu``."""
    return get_kernel("control", name, device)


def _grid(n: int, device: Device) -> tuple[int, int, int]:
    return (max(1, min(-(-n // THREADS), 2 * device.info.multiprocessors)), 1, 1)


def _launch(
    device: Device,
    name: str,
    spec: list[tuple[str, str]],
    values: dict[str, Any],
    grid: tuple[int, int, int] = (1, 1, 1),
    block: int = 1,
) -> Launch:
    args = KernelArgs(spec)
    args.update(values)
    return Launch(control_kernel(name, device), grid, (block, 1, 1), args, {}, 0, name)


def set_condition(device: Device, cond: ConditionalHandle, value: Any) -> Launch:
    """``rg_set_cond``: condition = the ``uint32`` at ``value`` (device memory), read each replay."""
    return _launch(
        device, "rg_set_cond", [("h", "u64"), ("value", "ptr")], {"h": int(cond), "value": _u32_ptr(value, "value")}
    )


def select_band(device: Device, cond: ConditionalHandle, value: Any, tops: Any, used: Any, n: int = 0) -> Launch:
    """``rg_set_band``: a SWITCH over bands of a row count. ``n`` = the ``int32`` at ``value``
    (device memory, read each replay), or with ``value=None`` the launch's ``n_arg`` argument
    (``n``, changed in an exec by ``cuGraphExecKernelNodeSetParams``), clamped to
    ``0..tops[-1]``; condition = the index of the first of the ascending ``int32`` band ``tops``
    (device memory) ``>= n``, or ``len(tops)`` (no body) when ``n`` is 0; ``used[0] = n``. The
    SWITCH it sets should have ``len(tops)`` bodies (an index past its last body runs none), and
    ``tops`` must be ascending (the head searches it by bisection).

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    t = _words(tops, "tops", np.int32)
    ptr = 0 if value is None else _words(value, "value", np.int32).ptr
    return _launch(
        device,
        "rg_set_band",
        [("h", "u64"), ("value", "ptr"), ("n_arg", "i32"), ("tops", "ptr"), ("count", "i32"), ("used", "ptr")],
        {
            "h": int(cond),
            "value": ptr,
            "n_arg": int(n),
            "tops": t.ptr,
            "count": t.size,
            "used": _words(used, "used", np.int32).ptr,
        },
    )


def countdown(device: Device, cond: ConditionalHandle, remaining: Any) -> Launch:
    """``rg_countdown``: ``remaining -= 1`` (saturating), condition = ``remaining > 0``: the last
    kernel of a WHILE body that runs ``remaining`` times (set the first check with
    :func:`set_condition` on the same buffer)."""
    return _launch(
        device,
        "rg_countdown",
        [("h", "u64"), ("remaining", "ptr")],
        {"h": int(cond), "remaining": _u32_ptr(remaining, "remaining")},
    )


def axpb(device: Device, x: Any, y: Any, a: float, b: float) -> Launch:
    """``rg_axpb``: ``y = x * a + b`` elementwise over float32 (``x`` may be ``y``)."""
    xa, ya = as_device_array(x, "x"), as_device_array(y, "y")
    if xa.size != ya.size or xa.dtype != np.float32 or ya.dtype != np.float32:
        raise ShapeError(f"axpb needs two float32 arrays of one size, got {xa.size} and {ya.size}")
    return _launch(
        device,
        "rg_axpb",
        [("x", "ptr"), ("y", "ptr"), ("n", "i32"), ("a", "f32"), ("b", "f32")],
        {"x": xa.ptr, "y": ya.ptr, "n": xa.size, "a": a, "b": b},
        _grid(xa.size, device),
        THREADS,
    )


def noop(device: Device) -> Launch:
    """``rg_noop``: one thread doing nothing (for cost measurements)."""
    return _launch(device, "rg_noop", [], {})


def _words(obj: Any, what: str, dtype: Any) -> DeviceArray:
    """``obj`` as device memory holding at least one ``dtype`` word; :class:`ShapeError` otherwise."""
    arr = as_device_array(obj, what)
    if arr.dtype != dtype or arr.size < 1:
        raise ShapeError(f"{what} must be device memory holding {np.dtype(dtype).name}, got {arr.dtype} x {arr.size}")
    return arr


def _u32_ptr(obj: Any, what: str) -> int:
    return _words(obj, what, np.uint32).ptr


__all__ = [
    "ConditionalHandle",
    "ConditionalNode",
    "ConditionalUnsupportedError",
    "BodyCapture",
    "add_conditional",
    "axpb",
    "capture_conditional",
    "capture_handle",
    "check_kind",
    "control_kernel",
    "countdown",
    "driver_cuda_version",
    "make_handle",
    "noop",
    "select_band",
    "set_condition",
]
