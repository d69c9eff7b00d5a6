"""One exec for every batch size: the shape decided on the device (device-updatable kernel nodes,
or a SWITCH node).

:class:`DeviceShapedGraph` (``select="updates"``, the default) captures a row-wise model's plan once, at ``max_batch`` rows, behind a
head kernel (``rg_du_shape``, ``kernels/device_update.cu``). At every replay the head reads the
live row count ``n`` (an int32 in device memory) and, through ``cudaGraphKernelNodeUpdatesApply``
from the device, changes each node of the plan for this and later replays:

- the grid axis along the rows (the protocol's ``row_grid``) becomes ``ceil(n / rows_per_block)``
  blocks, so no block exists for padding rows;
- the row-count argument (the protocol's ``row_count_arg``: ``B`` of the matmul and block kernels,
  ``n = rows * width`` (int64) of relu and add) becomes ``n * factor``;
- the node is enabled iff ``n > 0`` (``n = 0`` runs nothing) and ``n`` lies in the node's band.

Bands (``bands=``): one ``max_batch``-row plan cannot change its kernels, and a cut made for 256
rows takes as long for 1 row as for 64 (one wave of the same blocks). So the graph may hold one
plan per band of row counts, captured one after another at each band's top; the head enables the
band holding ``n`` and disables the others. ``bands="plans"`` puts a band wherever the model's plan
changes, so every ``n`` runs the exact-size plan's kernels with its blocks, shared memory and grid
off the row axis (a kernel with no row grid, grid-stride, keeps its band top's grid).

Nothing is bucketed, nothing is padded, and the host makes one ``cuGraphLaunch`` per step (plus the
4-byte copy of ``n`` when the host knows it; a kernel earlier in the same graph may compute it
instead, see ``prologue`` and ``n_live``).

``select="switch"``: the head (``rg_set_band``, ``kernels/control.cu``) sets a SWITCH node that
holds one body per band, each body the band top's plan as captured (its PDL chain kept). Only the
body of the band holding ``n`` runs, at its top's rows: the rows from ``n`` to the top are computed
from whatever :attr:`input` holds there (bands of one row count each pad nothing). No node is
updated from the device, so the model need not name its row counts. When the host knows ``n``, the
head takes it as a kernel argument pushed with ``cuGraphExecKernelNodeSetParams`` (through the
exec's shadow, :mod:`rawgraph.updates.shadow`) instead of a copy. The exec belongs to this object:
update it only through it (an exec update behind its back would change the head's ``n`` unseen).

How it is built (probed by ``benchmarks/probes/device_updatable.py``): capture [prologue] -> head
-> the plan of each band in turn, each plan's first launch on a full edge (a plan whose first
launch is a PDL launch is refused when there is more than one band) and each plan's own PDL chain
kept; then ``cuGraphKernelNodeSetAttribute(
CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE)`` on each plan node and
``cuGraphKernelNodeGetAttribute`` for its device handle; the handle table is written to device
memory; ``cuGraphInstantiate`` once, ``cuGraphUpload``, replays.

What the driver forbids for a graph holding device-updatable nodes is refused before any driver
call: the captured graph is marked (:meth:`~rawgraph.graphs.graph.Graph.mark_device_updatable`),
so a second instantiate of it, an exec update (``cuGraphExecUpdate``) of or from it, and every
host update path of :mod:`rawgraph.updates` over its exec (``ExecUpdateManager``,
``AddressRebinder`` given the :class:`~rawgraph.GraphExec`: their ``cuGraphExecKernelNodeSetParams``
would silently override the device's updates) raise :class:`~rawgraph.DeviceUpdatableError`;
cloning raises :class:`DeviceShapedError` (a subclass). A tool handed only the raw
``CUgraphExec`` handle cannot know: do not point one at it.

The parts, each made and testable alone (:class:`DeviceShapedGraph` composes them and keeps their
names as its attributes): the bands and the head's table, pure (:mod:`rawgraph.serving.shape_table`);
:class:`ShapedIO`, the persistent buffers; :class:`BandPlans`, the model's plan at each band top;
the head and its capture, :class:`UpdatesHead` or :class:`SwitchHead`; :class:`LiveCount`, how the
host hands ``n`` to the head; :class:`ShapedRunner`, the replays. Everything that needs releasing
sits in one :class:`~rawgraph.serving.lifecycle.Held` with one finalizer, closed newest first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from cuda.bindings import driver

from ..graphs.capture import Capture
from ..graphs.graph import Graph, GraphExec
from ..runtime.errors import ClosedError, DeviceUpdatableError, LayoutError, RawgraphError, ShapeError, call
from ..runtime.launch import KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from ..runtime.module import get_kernel
from ..runtime.resource import Resource
from ..runtime.stream import Stream, as_stream
from ..updates.shadow import ExecShadow, KernelShadow
from .buckets import StreamOrder, check_rows
from .lifecycle import Held, WarmUp
from .protocol import RowwiseModel, check_model
from .shape_table import (
    ENTRY_DTYPE,
    Bands,
    ShapeEntry,
    check_bands,
    grid_for,
    pack_table,
    plan_bands,
    plan_signature,
    shape_entries,
)

__all__ = [
    "BandPlans",
    "DeviceShapedError",
    "DeviceShapedGraph",
    "ENTRY_DTYPE",
    "HeadStatus",
    "LiveCount",
    "RowViews",
    "ShapeEntry",
    "ShapedIO",
    "ShapedRunner",
    "SwitchHead",
    "UpdatesHead",
    "check_bands",
    "grid_for",
    "pack_table",
    "plan_bands",
    "plan_signature",
    "shape_entries",
]

_HEAD_THREADS = 256
_ATTR = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
# cuGraphKernelNode{Set,Get}Attribute take a CUkernelNodeAttrID (the launch attribute values under
# another enum in cuda-bindings 13.x); the launch attribute itself where a binding lacks it.
_NATTR = getattr(
    getattr(driver, "CUkernelNodeAttrID", driver.CUlaunchAttributeID),
    "CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE",
    _ATTR,
)
_SETUP_KEYS = ("bands", "plans", "warmup", "capture", "attributes", "instantiate", "upload")


class DeviceShapedError(DeviceUpdatableError):
    """Misuse of a :class:`DeviceShapedGraph` or an operation the driver forbids on its graph (a
    second instantiate, an exec update, a clone, host parameter pushes into device-updatable
    nodes), refused before any driver call."""


# ------------------------------------------------------------------------- build steps
def _record_prologue(cap: Capture, prologue: Any) -> None:
    """Record the caller's prologue into ``cap`` before the head: a plan through ``Capture.run``,
    a callable called with the capturing stream."""
    if prologue is None:
        return
    if isinstance(prologue, LaunchPlan):
        cap.run(prologue)
    else:
        prologue(cap.stream)


def _set_updatable(node: Any) -> int:
    """Opt one captured kernel node in; its device handle (``cuGraphKernelNodeGetAttribute``)."""
    v = driver.CUkernelNodeAttrValue()
    v.deviceUpdatableKernelNode.deviceUpdatable = 1
    call(driver.cuGraphKernelNodeSetAttribute, node, _NATTR, v)
    got = call(driver.cuGraphKernelNodeGetAttribute, node, _NATTR)
    handle = int(got.deviceUpdatableKernelNode.devNode) or int(v.deviceUpdatableKernelNode.devNode)
    if not handle or not int(got.deviceUpdatableKernelNode.deviceUpdatable):
        raise RawgraphError("cuGraphKernelNodeSetAttribute(DEVICE_UPDATABLE) returned no device node handle")
    return handle


def _check_offsets(entries: Sequence[ShapeEntry], launches: Sequence[Launch]) -> None:
    """The packed offsets against the function's own layout (``cuFuncGetParamInfo``), where the
    driver gives one: the head writes at these offsets on the device."""
    from ..graphs.nodes import read_layout

    for e in entries:
        launch = launches[e.index]
        layout, _why = read_layout(launch.kernel.handle)
        if not layout:
            continue
        i = launch.args.names().index(e.param)
        if i >= len(layout) or (layout[i].offset, layout[i].size) != (e.param_offset, e.param_size):
            raise ShapeError(
                f"{launch.kernel.name}: argument {e.param} packed at offset {e.param_offset} "
                f"({e.param_size} B), the function's layout says "
                f"{(layout[i].offset, layout[i].size) if i < len(layout) else 'no such parameter'}"
            )


# ------------------------------------------------------------------------------- parts
class RowViews(NamedTuple):
    """The first ``rows`` rows of the persistent input and output: what a plan is built over."""

    x: DeviceArray
    out: DeviceArray


class ShapedIO:
    """The persistent buffers every captured plan reads and writes: ``input`` and ``output``
    (``(max_batch, width)`` float32), the model's scratch ``arena`` for ``max_batch`` rows, and
    ``n_live``, the int32 the head reads ``n`` from: the caller's (``from_caller``), a buffer of
    this object (``n_buf``, ``select="updates"``), or None (a SWITCH head taking ``n`` as its
    argument). What it allocates is added to ``held``, in that order."""

    width: int
    input: DeviceBuffer
    output: DeviceBuffer
    from_caller: bool
    arena: Any

    def __init__(self, model: Any, max_batch: int, n_live: Any, select: str, held: Held):
        device = model.device
        self.width = int(model.width)
        self.input = held.add(DeviceBuffer((max_batch, self.width), np.float32, device))
        self.output = held.add(DeviceBuffer((max_batch, self.width), np.float32, device))
        self.from_caller = n_live is not None
        self.n_buf: DeviceBuffer | None = None
        self.n_live: DeviceArray | None = None
        if self.from_caller:
            self.n_live = check_array(as_device_array(n_live, "n_live"), (1,), np.int32, "n_live", device)
        elif select == "updates":
            self.n_buf = held.add(DeviceBuffer((1,), np.int32, device))
            self.n_live = self.n_buf.view()
        self.arena = model.make_workspace(max_batch)
        if self.arena is not None:
            held.add(self.arena)

    def views(self, rows: int) -> RowViews:
        """The first ``rows`` rows of :attr:`input` and :attr:`output`."""
        f32 = np.dtype(np.float32)
        return RowViews(
            DeviceArray(self.input.ptr, (rows, self.width), f32, self.input),
            DeviceArray(self.output.ptr, (rows, self.width), f32, self.output),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of input, output, arena and the own ``n`` (4 when there is one)."""
        arena = getattr(self.arena, "nbytes", 0) if self.arena is not None else 0
        own_n = 4 if self.n_buf is not None else 0
        return self.input.nbytes + self.output.nbytes + arena + own_n


def _signature_bands(model: Any, io: ShapedIO, max_batch: int, setup: dict[str, float]) -> Bands:
    """``bands="plans"``: the plan signature of every row count ``1..max_batch`` over ``io``
    (each model view closed at once), a band wherever it changes."""
    t0 = time.perf_counter()
    signatures = []
    for rows in range(1, max_batch + 1):
        m = model.with_batch(rows, workspace=io.arena)
        try:  # the protocol asks for close(), not for a context manager
            signatures.append(plan_signature(model, m.plan(*io.views(rows)).launches))
        finally:
            m.close()
    bands = Bands.from_signatures(signatures)
    setup["bands"] = time.perf_counter() - t0
    return bands


class BandPlans:
    """The model's plan at each band's top row count, over the persistent buffers: one model
    view per band (``models``, closed by the holder), its plan (``plans``), every plan's launches in
    capture order (``launches``), and with ``select="updates"`` the head's :class:`ShapeEntry`
    per launch (``entries``; empty with ``"switch"``, whose bodies run as captured)."""

    bands: Bands
    models: list[Any]
    plans: list[LaunchPlan]
    entries: list[ShapeEntry]
    launches: list[Launch]

    def __init__(self, bands: Bands, models: list[Any], plans: list[LaunchPlan], entries: list[ShapeEntry]):
        self.bands = bands
        self.models = models
        self.plans = plans
        self.entries = entries
        self.launches = [launch for plan in plans for launch in plan.launches]

    @classmethod
    def build(
        cls,
        model: Any,
        bands: Bands | None,
        io: ShapedIO,
        max_batch: int,
        select: str,
        held: Held,
        setup: dict[str, float],
    ) -> BandPlans:
        """Plan every band (``bands=None``: the bands from the plans, :func:`_signature_bands`).

        Raises
        ------
        DeviceShapedError
            With more than one band and ``select="updates"``, a plan whose first launch is a PDL
            launch (it would hang a programmatic edge off the previous band's last node).
        TypeError, ShapeError
            From :func:`shape_entries`: a row count the model cannot name or that a launch
            contradicts.
        """
        if bands is None:
            bands = _signature_bands(model, io, max_batch, setup)
        models: list[Any] = []
        plans: list[LaunchPlan] = []
        entries: list[ShapeEntry] = []
        for i, top in enumerate(bands.tops):
            m = held.add(model.with_batch(top, workspace=io.arena))
            models.append(m)
            plan = m.plan(*io.views(top))
            plans.append(plan)
            if select == "switch":  # each band is a body of its own: nothing to check or cut
                continue
            if len(bands) > 1 and plan.launches and plan.launches[0].pdl:
                raise DeviceShapedError(
                    f"the {top}-row plan starts with a PDL launch ({plan.launches[0].kernel.name}): "
                    "with bands, each plan must start on a full edge"
                )
            entries += shape_entries(model, plan.launches, top, lo=bands.lo(i), start=len(entries))
        return cls(bands, models, plans, entries)

    def plan_for(self, n: int) -> LaunchPlan:
        """The plan of the band holding ``n`` (the first band's for ``n = 0``)."""
        return self.plans[self.bands.index(n)]


class UpdatesHead:
    """``select="updates"``: ``rg_du_shape`` over a table of every band's entries. Made before
    the capture (the table and the status words allocated, the head launch built); :meth:`capture`
    records [prologue] -> head -> every band's plan, marks the graph device-updatable, opts each
    plan node in and writes the table with their device handles (``handles``)."""

    switch: Any = None  # no SWITCH node: the head updates the plan's nodes instead
    head_node: Any = None
    device: Any
    table: DeviceBuffer
    rc: DeviceBuffer
    head: Launch

    def __init__(self, plans: BandPlans, n_live: DeviceArray, max_batch: int, device: Any, held: Held):
        _check_offsets(plans.entries, plans.launches)
        count = len(plans.entries)
        self.device = device
        self.table = held.add(DeviceBuffer((count * ENTRY_DTYPE.itemsize // 8,), np.uint64, device))
        self.rc = held.add(DeviceBuffer((count + 1,), np.int32, device))
        head_args = KernelArgs(
            [("table", "ptr"), ("count", "i32"), ("n_live", "ptr"), ("max_rows", "i32"), ("rc", "ptr")]
        )
        head_args.update(
            {"table": self.table.ptr, "count": count, "n_live": n_live.ptr, "max_rows": max_batch, "rc": self.rc.ptr}
        )
        threads = min(_HEAD_THREADS, max(32, -(-count // 32) * 32))
        self.head = Launch(
            get_kernel("device_update", "rg_du_shape", device),
            (-(-count // threads), 1, 1),
            (threads, 1, 1),
            head_args,
            {},
            0,
            "device_shape",
        )
        self.graph: Graph | None = None
        self.nodes: list[Any] = []
        self.handles: list[int] = []

    def capture(self, stream: Stream, prologue: Any, plans: BandPlans, setup: dict[str, float], held: Held) -> Graph:
        """[prologue] -> ``rg_du_shape`` -> every band's plan, each node opted in to device updates."""
        clock = time.perf_counter
        t0 = clock()
        cap = Capture(stream)
        with cap:
            _record_prologue(cap, prologue)
            cap.launch(self.head)
            first = len(cap.nodes)
            for plan in plans.plans:  # one after another: a disabled node passes its dependency on
                cap.run(plan)
        graph = cap.captured
        graph.mark_device_updatable()  # before anything may instantiate it: the driver's rules, see Graph
        self.graph = held.add(graph)
        self.nodes = cap.nodes[first:]
        setup["capture"] = clock() - t0
        if len(self.nodes) != len(plans.entries) or not all(n.launch is l for n, l in zip(self.nodes, plans.launches)):
            raise RawgraphError("the capture's node map does not follow the plan's launch order")
        t0 = clock()
        self.device.activate()
        self.handles = [_set_updatable(node.handle) for node in self.nodes]
        self.table.copy_from_host(pack_table(plans.entries, self.handles).view(np.uint64), stream)
        setup["attributes"] = clock() - t0
        return graph


class SwitchHead:
    """``select="switch"``: ``rg_set_band`` sets a SWITCH node holding one body per band. Made
    before the capture (the band tops written to device memory, the word for the ``n`` used);
    :meth:`capture` records [prologue] -> head -> SWITCH, body ``i`` band ``i``'s plan. No node is
    opted in to device updates (``handles`` stays empty)."""

    n_live: DeviceArray | None
    max_batch: int
    device: Any
    table: DeviceBuffer
    rc: DeviceBuffer

    def __init__(
        self, bands: Bands, n_live: DeviceArray | None, max_batch: int, device: Any, stream: Stream, held: Held
    ):
        self.n_live = n_live
        self.max_batch = max_batch
        self.device = device
        # the band tops the head searches, and the n it used
        self.table = held.add(DeviceBuffer((len(bands),), np.int32, self.device))
        self.table.copy_from_host(np.asarray(bands.tops, np.int32), stream)
        self.rc = held.add(DeviceBuffer((1,), np.int32, self.device))
        self.head: Launch | None = None  # made inside the capture, with the condition handle
        self.head_node: Any = None
        self.switch: Any = None
        self.graph: Graph | None = None
        self.nodes: list[Any] = []
        self.handles: list[int] = []

    def capture(self, stream: Stream, prologue: Any, plans: BandPlans, setup: dict[str, float], held: Held) -> Graph:
        """[prologue] -> ``rg_set_band`` -> SWITCH, body ``i`` captured from band ``i``'s plan on a
        second stream (``cuStreamBeginCaptureToGraph``), its PDL chain kept."""
        from ..graphs.conditional import capture_conditional, capture_handle, select_band

        t0 = time.perf_counter()
        body_stream = Stream(device=self.device)
        try:
            cap = Capture(stream)
            with cap:
                _record_prologue(cap, prologue)
                cond = capture_handle(cap)
                self.head = select_band(self.device, cond, self.n_live, self.table, self.rc, n=self.max_batch)
                cap.launch(self.head)
                self.head_node = cap.nodes[-1]
                self.switch = capture_conditional(cap, "switch", cond, size=len(plans.plans))
                for i, plan in enumerate(plans.plans):
                    with self.switch.capture_body(i, body_stream) as body:
                        body.run(plan)
        finally:
            body_stream.close()
        self.graph = held.add(cap.captured)
        setup["capture"] = time.perf_counter() - t0
        return self.graph


class LiveCount:
    """How the host hands ``n`` to the head: a 4-byte ``cuMemcpyHtoDAsync`` into ``n_live`` from
    pageable memory (staged before the call returns, so the next ``n`` may reuse it), or, for a
    SWITCH head with no ``n_live``, the head's own ``n_arg`` pushed with
    ``cuGraphExecKernelNodeSetParams`` through the exec's shadow (:meth:`push_through`): a SetParams
    on one node (0.5 us of host time) instead of a copy queued before every replay.

    See Also
    --------
    cuMemcpyHtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    n_live: DeviceArray | None

    def __init__(self, n_live: DeviceArray | None):
        self.n_live = n_live
        self._host = np.zeros(1, np.int32)  # pageable: cuMemcpyHtoDAsync stages it before returning
        self.arg: KernelShadow | None = None  # the head's arguments, where n is one of them
        self._shadow: ExecShadow | None = None
        self._node = 0  # the head's index in that shadow

    def push_through(self, exe: GraphExec, head: SwitchHead, device: Any, held: Held) -> None:
        """From now on ``n`` is the SWITCH head's argument in ``exe`` (its shadow added to ``held``)."""
        self._shadow = held.add(ExecShadow(exe, device))
        node = head.head_node
        self.arg = KernelShadow.of_launch(node.handle, head.head, node.captured_args)
        self._node = self._shadow.add_kernel(self.arg, "rg_set_band")

    def write(self, n: int, stream: Stream) -> None:
        """Hand ``n`` (checked by the caller) to the head, ordered on ``stream`` before the next
        replay there (a pushed argument: before every later replay, on any stream)."""
        if self.arg is not None:
            args = self.arg.args
            assert args is not None  # a shadow made from the head's launch names its arguments
            old = args["n_arg"]
            if old != n:
                args["n_arg"] = n
                # a refused push puts the old n back in the shadow (the exec never took the new one)
                assert self._shadow is not None
                self._shadow.push([self._node], lambda prev: args.__setitem__("n_arg", prev), old)
            return
        # a pageable source is staged by the time the call returns, so the next n may reuse it
        self._host[0] = n
        assert self.n_live is not None  # every mode without an argument has one
        call(driver.cuMemcpyHtoDAsync, self.n_live.ptr, self._host.ctypes.data, 4, stream.handle)


class ShapedRunner:
    """The replays of the one exec. ``n`` and the launch that reads it go together: two threads
    may not interleave them (a pushed ``n_arg`` is read by the next launch on any stream; a copied
    ``n`` by the next on that stream), so each write and its launch run under one lock; a run on
    another stream than the last waits for it first (:class:`~rawgraph.serving.buckets.StreamOrder`)."""

    exec: GraphExec
    count: LiveCount
    order: StreamOrder
    stream: Stream
    io: ShapedIO
    replays: int

    def __init__(self, exe: GraphExec, count: LiveCount, order: StreamOrder, stream: Stream, io: ShapedIO):
        self.exec = exe
        self.count = count
        self.order = order
        self.stream = stream
        self.io = io
        self._lock = threading.Lock()
        self.replays = 0

    def _enter(self, stream: Any) -> Stream:
        return self.order.enter(self.stream if stream is None else stream)

    def set_rows(self, n: int, stream: Any = None) -> None:
        with self._lock:
            self.count.write(n, self._enter(stream))

    def replay(self, stream: Any = None) -> None:
        with self._lock:
            s = self._enter(stream)
            self.exec.launch(s)
            self.replays += 1

    def run(self, n: int, xa: DeviceArray | None, stream: Any = None) -> None:
        """Copy ``n`` rows of ``xa`` into the input (unless it is the input), hand ``n`` over,
        launch; ``n`` and ``xa`` checked by the caller."""
        with self._lock:
            s = self._enter(stream)
            if xa is not None:
                src, dst, nbytes = xa.ptr, self.io.input.ptr, n * self.io.width * 4
                if src != dst and src < dst + self.io.input.nbytes and dst < src + nbytes:
                    raise LayoutError("x overlaps the persistent input without being it")
                if src != dst:
                    call(driver.cuMemcpyDtoDAsync, dst, src, nbytes, s.handle)
            self.count.write(n, s)
            self.exec.launch(s)
            self.replays += 1


class HeadStatus(NamedTuple):
    """What the head did at the last replay: the ``n`` it used (clamped) and, per node, the
    ``cudaError_t`` of its device-side update (none with ``select="switch"``)."""

    n: int
    codes: list[int]


# ---------------------------------------------------------------------------- the graph
class DeviceShapedGraph(Resource):
    """One exec that serves every batch size from 0 to ``max_batch``: the grids and row counts
    are set on the device at each replay, or a SWITCH node picks the band's plan (see the module
    docstring).

    Parameters
    ----------
    model : RowwiseModel
        Any row-wise model (:mod:`rawgraph.serving.protocol`). With ``select="updates"`` it must
        name a row-count argument of every launch (``row_count_arg``); ``row_grid`` (optional)
        lets the grids shrink too. Its weights are shared, not copied.
    max_batch : int, default 256
    stream : stream-like, optional
        Default stream for set-up and runs (a private one if None).
    n_live : device int32 array of shape (1,), optional
        Where the head reads ``n``; default a buffer of this object, written by :meth:`set_rows`
        (a SWITCH head with no ``n_live`` takes ``n`` as its argument instead).
        Given, its writer (a kernel before the replay, or ``prologue`` inside it) decides ``n``.
        Values outside ``0..max_batch`` are clamped on the device.
    prologue : LaunchPlan or callable(stream), optional
        Work captured into the graph before the head (e.g. a kernel computing ``n_live`` from a
        slot table): a plan is recorded with ``Capture.run``, a callable is called with the
        capturing stream.
    bands : None, "plans" or sequence of int
        Row counts at which a plan is captured; each ``n`` runs the plan of the smallest band
        top ``>= n``. None: one band, ``max_batch`` (every ``n`` runs the ``max_batch``-row plan's
        kernels). ``"plans"``: a band wherever the model's plan changes (:func:`plan_signature`
        over every row count), so every ``n`` runs the kernels the exact-size plan runs. A
        sequence: those tops (``max_batch`` is added); ``range(1, max_batch + 1)`` with
        ``select="switch"`` runs the exact-size plan itself at every ``n``.
    select : "updates" or "switch", default "updates"
        How the band's plan is picked and fitted to ``n``. ``"updates"``: the head's device-side
        node updates cut its grids and row counts to ``n`` and disable every other band's nodes
        (the model must name its row counts: ``row_count_arg``). ``"switch"``: the head
        (``rg_set_band``) sets a SWITCH node holding one body per band, and the body runs as
        captured, at its band top's rows (rows ``n`` up to the top are computed from whatever
        :attr:`input` holds there); no node is updated, any row-wise model serves.

    Attributes
    ----------
    input, output : DeviceBuffer
        Persistent ``(max_batch, width)`` buffers the plan reads and writes.
    n_live : DeviceArray or None
        The int32 the head reads; None for a SWITCH head that takes ``n`` as its argument
        (``select="switch"`` with no ``n_live`` given).
    bands : list of int
        The band tops, ascending; the last is ``max_batch``.
    plans : list of LaunchPlan
        One per band (``plan`` is the last, the ``max_batch``-row plan).
    entries : list of ShapeEntry
        What the head does to each node, over every band's plan in capture order (``select="updates"``;
        empty with ``"switch"``).
    switch : ConditionalNode or None
        The SWITCH node (``select="switch"``): body ``i`` is band ``i``'s plan.
    graph, exec : the captured graph and its one exec (guarded: see the module docstring).
    setup : dict
        Seconds: ``bands`` (the signatures of ``bands="plans"``), ``plans``, ``warmup``,
        ``capture``, ``attributes`` (opting the nodes in), ``instantiate``, ``upload``.
    warm_up : WarmUp
        The eager runs before the capture: a band's plan runs only while it brings a kernel
        function no earlier band ran (``warm_up.runs``, ``warm_up.skipped``).

    Notes
    -----
    Built from the parts of this module in this order: the buffers (:class:`ShapedIO`), the band
    plans (:class:`BandPlans`), the head (:class:`UpdatesHead` or :class:`SwitchHead`), an eager
    warm-up, the head's capture, one instantiate and upload, the replays (:class:`ShapedRunner`,
    handing ``n`` over through :class:`LiveCount`). The attributes above are theirs, read through.
    """

    max_batch: int
    width: int
    device: Any
    select: str
    stream: Any
    setup: dict[str, float]
    warm_up: WarmUp

    def __init__(
        self,
        model: RowwiseModel,
        max_batch: int = 256,
        stream: Any = None,
        n_live: Any = None,
        prologue: LaunchPlan | Callable[[Any], None] | None = None,
        bands: str | Sequence[int] | None = None,
        select: str = "updates",
    ):
        check_model(model)
        if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) or max_batch < 1:
            raise ShapeError(f"max_batch must be an int >= 1, got {max_batch!r}")
        self.max_batch = int(max_batch)
        if select not in ("updates", "switch"):
            raise ValueError(f"select must be 'updates' or 'switch', got {select!r}")
        self.select = select
        if select == "switch":  # a SWITCH needs a CUDA 12.8 driver: refused before anything is built
            from ..graphs.conditional import check_kind

            check_kind("switch", 1)
        # checked once, before anything is allocated (an iterator is read once); None: from the plans
        tops = None if isinstance(bands, str) and bands == "plans" else Bands.of(bands, self.max_batch)
        self.width = int(model.width)
        self.device = model.device
        self._held = Held("DeviceShapedGraph.close", newest_first=True)
        try:
            self._build(model, stream, n_live, prologue, tops)
        except BaseException:
            self.close()
            raise

    def _build(self, model: Any, stream: Any, n_live: Any, prologue: Any, bands: Bands | None) -> None:
        clock = time.perf_counter
        held = self._held
        self.setup = dict.fromkeys(_SETUP_KEYS, 0.0)
        self.stream = held.add(Stream(device=self.device)) if stream is None else as_stream(stream)
        order = held.add(StreamOrder(self.device))
        t0 = clock()
        self._io = ShapedIO(model, self.max_batch, n_live, self.select, held)
        self._plans = BandPlans.build(model, bands, self._io, self.max_batch, self.select, held, self.setup)
        self._head: UpdatesHead | SwitchHead
        if self.select == "switch":
            self._head = SwitchHead(self._plans.bands, self._io.n_live, self.max_batch, self.device, self.stream, held)
        else:
            assert self._io.n_live is not None  # the updates head always reads device memory
            self._head = UpdatesHead(self._plans, self._io.n_live, self.max_batch, self.device, held)
        self.setup["plans"] = clock() - t0 - self.setup["bands"]  # the signatures counted apart
        count = LiveCount(self._io.n_live)
        self._warm(count, order)
        self._prologue = prologue  # held as long as the exec that replays it
        graph = self._head.capture(self.stream, prologue, self._plans, self.setup, held)
        exe = self._instantiate(graph, count)
        self._runner = ShapedRunner(exe, count, order, self.stream, self._io)

    def _warm(self, count: LiveCount, order: StreamOrder) -> None:
        """Warm-up: each plan once eagerly (module loading and first touch outside the capture)
        while it brings a kernel function no earlier plan ran (lifecycle.WarmUp, as the buckets
        do); never the head, whose table holds no handles yet."""
        t0 = time.perf_counter()
        s = self.stream
        self._io.input.poison(s)
        if self._io.n_buf is not None:
            count.write(self.max_batch, order.enter(s))
        s.synchronize()
        self.setup["warmup"] = time.perf_counter() - t0
        self.warm_up = WarmUp(self.setup)
        for plan in self._plans.plans:
            self.warm_up(plan.launches, s)

    def _instantiate(self, graph: Graph, count: LiveCount) -> GraphExec:
        """``cuGraphInstantiate`` once (and, for a SWITCH head whose ``n`` the host knows, the
        exec's shadow of the head), then ``cuGraphUpload``: an exec whose own kernels update its
        nodes must be uploaded before its first launch."""
        clock = time.perf_counter
        t0 = clock()
        exe = self._held.add(graph.instantiate())
        if isinstance(self._head, SwitchHead) and not self._io.from_caller:
            count.push_through(exe, self._head, self.device, self._held)
        self.setup["instantiate"] = clock() - t0
        t0 = clock()
        exe.upload(self.stream)
        self.stream.synchronize()
        self.setup["upload"] = clock() - t0
        return exe

    # -- the parts' attributes, read through -------------------------------------------------
    @property
    def input(self) -> DeviceBuffer:
        return self._io.input

    @property
    def output(self) -> DeviceBuffer:
        return self._io.output

    @property
    def arena(self) -> Any:
        return self._io.arena

    @property
    def n_live(self) -> DeviceArray | None:
        return self._io.n_live

    @property
    def bands(self) -> list[int]:
        return list(self._plans.bands.tops)

    @property
    def models(self) -> list[Any]:
        return self._plans.models

    @property
    def plans(self) -> list[LaunchPlan]:
        return self._plans.plans

    @property
    def model(self) -> Any:
        return self._plans.models[-1]

    @property
    def plan(self) -> LaunchPlan:
        return self._plans.plans[-1]

    @property
    def entries(self) -> list[ShapeEntry]:
        return self._plans.entries

    @property
    def head(self) -> Launch:
        assert self._head.head is not None  # made by the time the graph exists
        return self._head.head

    @property
    def switch(self) -> Any:
        return self._head.switch

    @property
    def handles(self) -> list[int]:
        return self._head.handles

    @property
    def graph(self) -> Graph:
        assert self._head.graph is not None
        return self._head.graph

    @property
    def exec(self) -> GraphExec:
        return self._runner.exec

    @property
    def replays(self) -> int:
        return self._runner.replays

    @property
    def _table(self) -> DeviceBuffer:
        return self._head.table

    @property
    def _rc(self) -> DeviceBuffer:
        return self._head.rc

    @property
    def _nodes(self) -> list[Any]:
        return self._head.nodes

    @property
    def _head_node(self) -> Any:
        return self._head.head_node

    @property
    def _n_arg(self) -> KernelShadow | None:
        return self._runner.count.arg

    # -- n ----------------------------------------------------------------------------------
    def set_rows(self, n: int, stream: Any = None) -> None:
        """Write ``n`` (``0..max_batch``) where the head reads it, ordered on ``stream`` before
        the next replay there (``cuMemcpyHtoDAsync`` from pageable memory: staged before it
        returns, so nothing waits). A SWITCH head with no ``n_live`` takes ``n`` as its argument
        instead (``cuGraphExecKernelNodeSetParams``): every later replay, on any stream, reads it.

        See Also
        --------
        cuMemcpyHtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check()
        self._check_n(n)
        self._runner.set_rows(n, stream)

    def plan_for(self, n: int) -> LaunchPlan:
        """The captured plan that runs for ``n`` live rows (its band's; with ``select="updates"``
        cut to ``n`` rows, with ``"switch"`` at its band top's); for ``n = 0``, when nothing runs,
        the first band's."""
        self._check()
        self._check_n(n)
        return self._plans.plan_for(n)

    def replay(self, stream: Any = None) -> None:
        """One ``cuGraphLaunch``: the head reads whatever ``n_live`` holds when it runs (a SWITCH
        head with no ``n_live``: the ``n`` last set).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check()
        self._runner.replay(stream)

    def run(self, n: int, stream: Any = None, x: Any = None) -> DeviceArray:
        """Run the model on the first ``n`` rows of :attr:`input` (or of ``x``, copied in first):
        :meth:`set_rows` then :meth:`replay`; returns the ``n`` result rows, a view of
        :attr:`output` valid until the next run (``n = 0`` runs nothing and returns a 0-row view)."""
        self._check()
        self._check_n(n)
        if self._io.from_caller:
            raise DeviceShapedError("this graph reads n from the caller's n_live: write it there and call replay()")
        xa = check_rows(x, n, self.width) if x is not None and n > 0 else None
        self._runner.run(int(n), xa, stream)
        return DeviceArray(self.output.ptr, (int(n), self.width), np.dtype(np.float32), self.output)

    # -- what the head did ------------------------------------------------------------------
    def status(self, stream: Any = None) -> HeadStatus:
        """``(n, codes)`` of the last replay that finished on ``stream``: the ``n`` the head used
        (clamped) and each node's ``cudaError_t`` from ``cudaGraphKernelNodeUpdatesApply``
        (none with ``select="switch"``; waits for ``stream``)."""
        self._check()
        rc = self._head.rc.to_numpy(self.stream if stream is None else stream)
        return HeadStatus(int(rc[-1]), [int(c) for c in rc[:-1]])

    def check_status(self, stream: Any = None) -> int:
        """The ``n`` the last replay used; raises :class:`RawgraphError` naming every node whose
        device-side update failed."""
        n, codes = self.status(stream)
        bad = [(e.label or e.kernel, c) for e, c in zip(self.entries, codes) if c != 0]
        if bad:
            raise RawgraphError(f"device-side node updates failed (cudaError_t per node): {bad}")
        return n

    # -- refused ----------------------------------------------------------------------------
    def clone(self) -> Any:
        """Refused: the driver cannot clone a graph holding device-updatable nodes or a
        conditional node (``cuGraphClone`` answers ``CUDA_ERROR_NOT_SUPPORTED``).

        See Also
        --------
        cuGraphClone : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        what = "a conditional node" if self.select == "switch" else "device-updatable kernel nodes"
        raise DeviceShapedError(f"a graph with {what} cannot be cloned (cuGraphClone answers CUDA_ERROR_NOT_SUPPORTED)")

    def update(self, graph: Any) -> None:
        """Refused: ``cuGraphExecUpdate`` is not allowed on an exec with device-updatable nodes;
        a SWITCH-selected exec keeps the plans it was built with (build another for others).

        See Also
        --------
        cuGraphExecUpdate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check()
        if self.select == "switch":
            raise DeviceShapedError(
                "a SWITCH-selected DeviceShapedGraph keeps its captured plans: build a new one "
                "instead of cuGraphExecUpdate"
            )
        self.exec.update(graph)

    # -- accounting and lifetime ------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Device bytes this object allocated (input, output, arena, table, status; weights not
        counted)."""
        return self._io.nbytes + self._head.table.nbytes + self._head.rc.nbytes

    def _check_n(self, n: Any) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if not 0 <= n <= self.max_batch:
            raise ShapeError(f"n = {n} is outside 0..max_batch = {self.max_batch}")

    def _check(self) -> None:
        if self._held.closed:
            raise ClosedError("DeviceShapedGraph is closed")

    def _check_open(self) -> None:
        self._check()

    @property
    def closed(self) -> bool:
        return self._held.closed

    def close(self) -> None:
        """Free the head's shadow (``select="switch"``), the exec, the graph, the model views (one
        per band), the arena and the buffers (in that order); safe twice."""
        self._held.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        plans = getattr(self, "_plans", None)
        bands, nodes = (len(plans.bands), len(plans.launches)) if plans is not None else (0, 0)
        return (
            f"<DeviceShapedGraph width={self.width} max_batch={self.max_batch} select={self.select} "
            f"bands={bands} nodes={nodes}{state}>"
        )
