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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.capture import Capture
from ..runtime.errors import ClosedError, DeviceUpdatableError, LayoutError, RawgraphError, ShapeError, call
from ..runtime.launch import KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from ..runtime.module import get_kernel
from ..runtime.resource import Resource
from .buckets import StreamOrder, check_rows
from .lifecycle import WarmUp
from .protocol import RowwiseModel, check_model, row_count_arg, row_grid

__all__ = [
    "DeviceShapedError",
    "DeviceShapedGraph",
    "ENTRY_DTYPE",
    "ShapeEntry",
    "shape_entries",
    "pack_table",
    "grid_for",
]

# One entry of the head kernel's table: kernels/device_update.cu's rg_du_shape_entry (48 bytes).
ENTRY_DTYPE = np.dtype(
    [
        ("node", "<u8"),
        ("grid", "<u4", (3,)),
        ("axis", "<i4"),
        ("rows_per_block", "<i4"),
        ("param_offset", "<i4"),
        ("param_size", "<i4"),
        ("factor", "<i4"),
        ("lo", "<i4"),
        ("hi", "<i4"),
    ]
)
assert ENTRY_DTYPE.itemsize == 48

_INT_KINDS = {"i32": 4, "u32": 4, "i64": 8, "u64": 8}
_HEAD_THREADS = 256
_ATTR = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
# cuGraphKernelNode{Set,Get}Attribute take a CUkernelNodeAttrID (the launch attribute values under
# another enum in cuda-bindings 13.x); the launch attribute itself where a binding lacks it.
_NATTR = getattr(
    getattr(driver, "CUkernelNodeAttrID", driver.CUlaunchAttributeID),
    "CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE",
    _ATTR,
)


class DeviceShapedError(DeviceUpdatableError):
    """Misuse of a :class:`DeviceShapedGraph` or an operation the driver forbids on its graph (a
    second instantiate, an exec update, a clone, host parameter pushes into device-updatable
    nodes), refused before any driver call."""


# ----------------------------------------------------------------------- the table (no GPU)
@dataclass(frozen=True)
class ShapeEntry:
    """What the head kernel does to one node of the plan.

    index: the launch's position in the captured plans; grid: its captured grid (at its band's top
    row count); axis: the grid axis along the rows (-1: grid untouched) and rows_per_block; param:
    the row-count argument's name, its byte offset and size in the parameter buffer, and the factor
    rows -> value; lo, hi: the band of row counts ``n`` for which the node runs (``lo <= n <= hi``).
    """

    index: int
    label: str
    kernel: str
    grid: tuple[int, int, int]
    axis: int
    rows_per_block: int
    param: str
    param_offset: int
    param_size: int
    factor: int
    lo: int = 1
    hi: int = 2**31 - 1

    def runs(self, n: int, max_rows: int | None = None) -> bool:
        """Whether the head enables this node for ``n`` live rows: what ``rg_du_shape`` decides,
        which first clamps ``n`` to ``0..max_rows`` (the graph's ``max_batch``) when given."""
        if max_rows is not None:
            n = max(0, min(int(n), int(max_rows)))
        return 0 < n and self.lo <= n <= self.hi


def grid_for(entry: ShapeEntry, n: int) -> tuple[int, int, int]:
    """The grid the head gives ``entry``'s node for ``n`` live rows (what ``rg_du_shape``
    computes; ``n = 0`` keeps one block on the axis, the node being disabled then)."""
    g = list(entry.grid)
    if entry.axis >= 0:
        g[entry.axis] = max(1, min(-(-int(n) // entry.rows_per_block), entry.grid[entry.axis]))
    return (g[0], g[1], g[2])


def shape_entries(
    model: Any, launches: Sequence[Launch], max_batch: int, lo: int = 1, start: int = 0
) -> list[ShapeEntry]:
    """One :class:`ShapeEntry` per launch of ``model``'s ``max_batch``-row plan (a band's top), checked against
    the launches: a row-grid axis must hold ``ceil(max_batch / rows_per_block)`` blocks and carry
    no compiled-in cluster dimension above 1, every launch must name an integer row-count
    argument (4 or 8 bytes) holding ``max_batch * factor``. The entries' band is
    ``lo..max_batch``; their indices start at ``start`` (the plan's place among the captured ones).

    Raises
    ------
    TypeError
        A launch whose row count the model cannot name, or an answer of the wrong form.
    ShapeError
        An answer the launch contradicts.
    """
    entries = []
    for i, launch in enumerate(launches):
        name, factor = row_count_arg(model, launch)
        kind = dict(launch.args.spec)[name]
        if kind not in _INT_KINDS:
            raise TypeError(f"{launch.kernel.name}: row-count argument {name} is a {kind}, not a 4- or 8-byte int")
        if factor < 1:
            raise ShapeError(f"{launch.kernel.name}: row-count factor {factor} must be >= 1")
        held = launch.args[name]
        if held != max_batch * factor:
            raise ShapeError(
                f"{launch.kernel.name}: row-count argument {name} holds {held}, expected "
                f"max_batch * factor = {max_batch} * {factor}"
            )
        if kind in ("i32", "u32") and max_batch * factor >= 2**31:
            raise ShapeError(f"{launch.kernel.name}: {max_batch} * {factor} does not fit its int32 {name}")
        rg = row_grid(model, launch)
        axis, rpb = (-1, 0) if rg is None else rg
        if rg is not None:
            want = -(-max_batch // rpb)
            if launch.grid[axis] != want:
                raise ShapeError(
                    f"{launch.kernel.name}: row_grid says axis {axis} with {rpb} rows per block, so "
                    f"{want} blocks for {max_batch} rows, but the launch has grid {launch.grid}"
                )
            cluster = getattr(launch.kernel, "cluster_dims", (0, 0, 0))
            if cluster[axis] > 1:
                raise ShapeError(
                    f"{launch.kernel.name}: its grid axis {axis} carries cluster dimension "
                    f"{cluster[axis]}; a row count would not stay a multiple of it"
                )
        entries.append(
            ShapeEntry(
                start + i,
                launch.label,
                launch.kernel.name,
                tuple(launch.grid),  # type: ignore[arg-type]
                axis,
                rpb,  # type: ignore[arg-type]
                name,
                int(launch.args.offsets[name]),
                _INT_KINDS[kind],
                int(factor),
                int(lo),
                int(max_batch),
            )
        )
    return entries


def plan_signature(model: Any, launches: Sequence[Launch]) -> tuple:
    """What must match for one captured plan to serve another row count bit for bit: per launch
    the kernel, block, dynamic shared memory, PDL, and the grid on every axis but the rows (the
    whole grid is left out of a kernel with no row grid: the head never changes it, so such a
    kernel must compute the same at any grid, as grid-stride kernels do)."""
    sig = []
    for launch in launches:
        rg = row_grid(model, launch)
        grid: tuple | None = None
        if rg is not None:
            g = list(launch.grid)
            g[rg[0]] = 0
            grid = tuple(g)
        sig.append((launch.kernel.name, tuple(launch.block), int(launch.shared_mem), bool(launch.pdl), grid))
    return tuple(sig)


def plan_bands(signatures: Sequence[tuple]) -> list[int]:
    """Band tops from the plan signatures of row counts 1, 2, ... (``signatures[n - 1]``): a new
    band starts wherever the signature changes; each band is served by the plan of its top."""
    if not signatures:
        raise ValueError("no signatures")
    tops = [n for n in range(1, len(signatures)) if signatures[n] != signatures[n - 1]]
    return tops + [len(signatures)]


def check_bands(bands: Any, max_batch: int) -> list[int]:
    """``bands`` (None: one band; a sequence of row counts) as sorted band tops ending at
    ``max_batch``; :class:`ShapeError` / :class:`TypeError` on anything else."""
    if bands is None:
        return [max_batch]
    if isinstance(bands, (str, bytes)) or not hasattr(bands, "__iter__"):
        raise TypeError(f"bands must be None, 'plans' or a sequence of row counts, got {bands!r}")
    tops = []
    for b in bands:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            raise TypeError(f"band tops must be ints, got {b!r}")
        if not 1 <= b <= max_batch:
            raise ShapeError(f"band top {b} is outside 1..max_batch = {max_batch}")
        tops.append(int(b))
    tops = sorted(set(tops))
    if not tops or tops[-1] != max_batch:
        tops.append(max_batch)
    return tops


def pack_table(entries: Sequence[ShapeEntry], handles: Sequence[int]) -> np.ndarray:
    """The head kernel's table: ``entries`` with each node's device handle."""
    if len(handles) != len(entries):
        raise ValueError(f"{len(entries)} entries, {len(handles)} device node handles")
    table = np.zeros(len(entries), ENTRY_DTYPE)
    for row, e, h in zip(table, entries, handles):
        row["node"] = int(h)
        row["grid"] = e.grid
        row["axis"], row["rows_per_block"] = e.axis, e.rows_per_block
        row["param_offset"], row["param_size"], row["factor"] = e.param_offset, e.param_size, e.factor
        row["lo"], row["hi"] = e.lo, e.hi
    return table


def _record_prologue(cap: Capture, prologue: Any) -> None:
    """Record the caller's prologue into ``cap`` before the head: a plan through ``Capture.run``,
    a callable called with the capturing stream."""
    if prologue is None:
        return
    if isinstance(prologue, LaunchPlan):
        cap.run(prologue)
    else:
        prologue(cap.stream)


def _close_reversed(owned: list) -> None:
    for obj in reversed(owned):
        obj.close()


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
    """

    max_batch: int
    width: int
    stream: Any
    input: DeviceBuffer
    output: DeviceBuffer
    arena: Any
    bands: list[int]
    model: Any
    plan: LaunchPlan
    warm_up: WarmUp
    replays: int
    head: Launch

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
        from ..runtime.stream import Stream, as_stream

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
        # checked once, before anything is allocated (an iterator is read once)
        self._from_plans = isinstance(bands, str) and bands == "plans"
        if not self._from_plans:
            bands = check_bands(bands, self.max_batch)
        self.width = int(model.width)
        self.device = model.device
        self._closed = False
        owned: list[Any] = []
        self._own(_close_reversed, owned, name="DeviceShapedGraph.close")
        self._owned = owned
        try:
            self._build(model, stream, n_live, prologue, bands, owned, Stream, as_stream)
        except BaseException:
            self.close()
            raise

    def _build(
        self, model: Any, stream: Any, n_live: Any, prologue: Any, bands: Any, owned: list, Stream: Any, as_stream: Any
    ) -> None:
        clock = time.perf_counter
        self.setup: dict[str, float] = {
            k: 0.0 for k in ("bands", "plans", "warmup", "capture", "attributes", "instantiate", "upload")
        }
        if stream is None:
            self.stream = Stream(device=self.device)
            owned.append(self.stream)
        else:
            self.stream = as_stream(stream)
        s = self.stream
        self._order = StreamOrder(self.device)
        owned.append(self._order)
        t0 = clock()
        f32 = np.dtype(np.float32)
        self.input = DeviceBuffer((self.max_batch, self.width), np.float32, self.device)
        owned.append(self.input)
        self.output = DeviceBuffer((self.max_batch, self.width), np.float32, self.device)
        owned.append(self.output)
        self._n_host = np.zeros(1, np.int32)  # pageable: cuMemcpyHtoDAsync stages it before returning
        self._n_from_caller = n_live is not None
        # A SWITCH head whose n the host knows takes it as a kernel argument: a SetParams on one
        # node (0.5 us of host time) instead of a 4-byte copy queued before every replay.
        self._n_arg: Any = None
        # n and the launch that reads it go together: two threads may not interleave them (a
        # pushed n_arg is read by the next launch on any stream; a copied n by the next on that stream)
        self._n_lock = threading.Lock()
        self._shadow: Any = None  # the head's ExecShadow, where n is its argument
        self._n_node = 0  # the head's index in that shadow
        self._n_buf: DeviceBuffer | None = None
        self.n_live: DeviceArray | None = None
        if self._n_from_caller:
            self.n_live = check_array(as_device_array(n_live, "n_live"), (1,), np.int32, "n_live", self.device)
        elif self.select == "updates":
            self._n_buf = DeviceBuffer((1,), np.int32, self.device)
            owned.append(self._n_buf)
            self.n_live = self._n_buf.view()
        self.arena = model.make_workspace(self.max_batch)
        if self.arena is not None:
            owned.append(self.arena)

        def views(rows: int) -> tuple[DeviceArray, DeviceArray]:
            return (
                DeviceArray(self.input.ptr, (rows, self.width), f32, self.input),
                DeviceArray(self.output.ptr, (rows, self.width), f32, self.output),
            )

        if self._from_plans:
            t1 = clock()
            signatures = []
            for rows in range(1, self.max_batch + 1):
                m = model.with_batch(rows, workspace=self.arena)
                try:  # the protocol asks for close(), not for a context manager
                    signatures.append(plan_signature(model, m.plan(*views(rows)).launches))
                finally:
                    m.close()
            self.bands = plan_bands(signatures)
            self.setup["bands"] = clock() - t1
            t0 = clock()  # "plans" counts what follows, not the signatures
        else:
            self.bands = list(bands)
        self.models: list[Any] = []
        self.plans: list[LaunchPlan] = []
        self.entries: list[ShapeEntry] = []
        lo = 1
        for top in self.bands:
            m = model.with_batch(top, workspace=self.arena)
            owned.append(m)
            self.models.append(m)
            plan = m.plan(*views(top))
            self.plans.append(plan)
            if self.select == "switch":  # each band is a body of its own: nothing to check or cut
                continue
            if len(self.bands) > 1 and plan.launches and plan.launches[0].pdl:
                raise DeviceShapedError(
                    f"the {top}-row plan starts with a PDL launch ({plan.launches[0].kernel.name}): "
                    "with bands, each plan must start on a full edge"
                )
            self.entries += shape_entries(model, plan.launches, top, lo=lo, start=len(self.entries))
            lo = top + 1
        self.model, self.plan = self.models[-1], self.plans[-1]
        self._launches = [launch for plan in self.plans for launch in plan.launches]
        self.switch: Any = None
        if self.select == "switch":
            # the band tops the head searches, and the n it used
            self._table = DeviceBuffer((len(self.bands),), np.int32, self.device)
            owned.append(self._table)
            self._table.copy_from_host(np.asarray(self.bands, np.int32), s)
            self._rc = DeviceBuffer((1,), np.int32, self.device)
            owned.append(self._rc)
        else:
            self._head_for_updates(owned)
        self.setup["plans"] = clock() - t0
        # Warm-up: each plan once eagerly (module loading and first touch outside the capture)
        # while it brings a kernel function no earlier plan ran (lifecycle.WarmUp, as the buckets
        # do); never the head, whose table holds no handles yet.
        t0 = clock()
        self.input.poison(s)
        if self._n_buf is not None:
            self.set_rows(self.max_batch, s)
        s.synchronize()
        self.setup["warmup"] = clock() - t0
        self.warm_up = WarmUp(self.setup)
        for plan in self.plans:
            self.warm_up(plan.launches, s)
        self._prologue = prologue  # held as long as the exec that replays it
        if self.select == "switch":
            self._capture_switch(prologue, owned)
        else:
            self._capture_updates(prologue, owned)
        t0 = clock()
        self.exec = self.graph.instantiate()
        owned.append(self.exec)
        if self.switch is not None and not self._n_from_caller:
            from ..updates.shadow import ExecShadow, KernelShadow

            self._shadow = ExecShadow(self.exec, self.device)
            owned.append(self._shadow)
            self._n_arg = KernelShadow.of_launch(self._head_node.handle, self.head, self._head_node.captured_args)
            self._n_node = self._shadow.add_kernel(self._n_arg, "rg_set_band")
        self.setup["instantiate"] = clock() - t0
        t0 = clock()
        # An exec whose own kernels update its nodes must be uploaded before its first launch.
        self.exec.upload(s)
        s.synchronize()
        self.setup["upload"] = clock() - t0
        self._row_bytes = self.width * 4
        self.replays = 0

    def _head_for_updates(self, owned: list) -> None:
        """``rg_du_shape`` over a table of every band's entries (``select="updates"``)."""
        _check_offsets(self.entries, self._launches)
        count = len(self.entries)
        self._table = DeviceBuffer((count * ENTRY_DTYPE.itemsize // 8,), np.uint64, self.device)
        owned.append(self._table)
        self._rc = DeviceBuffer((count + 1,), np.int32, self.device)
        owned.append(self._rc)
        head_args = KernelArgs(
            [("table", "ptr"), ("count", "i32"), ("n_live", "ptr"), ("max_rows", "i32"), ("rc", "ptr")]
        )
        assert self.n_live is not None  # the updates head always reads device memory
        head_args.update(
            {
                "table": self._table.ptr,
                "count": count,
                "n_live": self.n_live.ptr,
                "max_rows": self.max_batch,
                "rc": self._rc.ptr,
            }
        )
        threads = min(_HEAD_THREADS, max(32, -(-count // 32) * 32))
        self.head = Launch(
            get_kernel("device_update", "rg_du_shape", self.device),
            (-(-count // threads), 1, 1),
            (threads, 1, 1),
            head_args,
            {},
            0,
            "device_shape",
        )

    def _capture_switch(self, prologue: Any, owned: list) -> None:
        """[prologue] -> ``rg_set_band`` -> SWITCH, body ``i`` captured from band ``i``'s plan on a
        second stream (``cuStreamBeginCaptureToGraph``), its PDL chain kept."""
        from ..graphs.conditional import capture_conditional, capture_handle, select_band
        from ..runtime.stream import Stream

        clock = time.perf_counter
        t0 = clock()
        body_stream = Stream(device=self.device)
        try:
            cap = Capture(self.stream)
            with cap:
                _record_prologue(cap, prologue)
                cond = capture_handle(cap)
                self.head = select_band(self.device, cond, self.n_live, self._table, self._rc, n=self.max_batch)
                cap.launch(self.head)
                self._head_node = cap.nodes[-1]
                self.switch = capture_conditional(cap, "switch", cond, size=len(self.plans))
                for i, plan in enumerate(self.plans):
                    with self.switch.capture_body(i, body_stream) as body:
                        body.run(plan)
        finally:
            body_stream.close()
        self.graph = cap.captured
        owned.append(self.graph)
        self.handles: list[int] = []
        self.setup["capture"] = clock() - t0

    def _capture_updates(self, prologue: Any, owned: list) -> None:
        """[prologue] -> ``rg_du_shape`` -> every band's plan, each node opted in to device updates."""
        clock = time.perf_counter
        s = self.stream
        count = len(self.entries)
        t0 = clock()
        cap = Capture(s)
        with cap:
            _record_prologue(cap, prologue)
            cap.launch(self.head)
            first = len(cap.nodes)
            for plan in self.plans:  # one after another: a disabled node passes its dependency on
                cap.run(plan)
        graph = cap.captured
        graph.mark_device_updatable()  # before anything may instantiate it: the driver's rules, see Graph
        self.graph = graph
        owned.append(graph)
        self._nodes = cap.nodes[first:]
        self.setup["capture"] = clock() - t0
        if len(self._nodes) != count or not all(n.launch is l for n, l in zip(self._nodes, self._launches)):
            raise RawgraphError("the capture's node map does not follow the plan's launch order")
        t0 = clock()
        self.device.activate()
        self.handles = [_set_updatable(node.handle) for node in self._nodes]
        self._table.copy_from_host(pack_table(self.entries, self.handles).view(np.uint64), s)
        self.setup["attributes"] = clock() - t0

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
        with self._n_lock:
            self._write_n(n, self._order.enter(self.stream if stream is None else stream))

    def _write_n(self, n: int, s: Any) -> None:
        if self._n_arg is not None:
            args = self._n_arg.args
            old = args["n_arg"]
            if old != n:
                args["n_arg"] = n
                # a refused push puts the old n back in the shadow (the exec never took the new one)
                self._shadow.push([self._n_node], lambda prev: args.__setitem__("n_arg", prev), old)
            return
        # a pageable source is staged by the time the call returns, so the next n may reuse it
        self._n_host[0] = n
        assert self.n_live is not None  # every mode without an argument has one
        call(driver.cuMemcpyHtoDAsync, self.n_live.ptr, self._n_host.ctypes.data, 4, s.handle)

    def plan_for(self, n: int) -> LaunchPlan:
        """The captured plan that runs for ``n`` live rows (its band's; with ``select="updates"``
        cut to ``n`` rows, with ``"switch"`` at its band top's); for ``n = 0``, when nothing runs,
        the first band's."""
        self._check()
        self._check_n(n)
        for top, plan in zip(self.bands, self.plans):
            if n <= top:
                return plan
        return self.plans[-1]

    def replay(self, stream: Any = None) -> None:
        """One ``cuGraphLaunch``: the head reads whatever ``n_live`` holds when it runs (a SWITCH
        head with no ``n_live``: the ``n`` last set).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check()
        with self._n_lock:
            s = self._order.enter(self.stream if stream is None else stream)
            self.exec.launch(s)
            self.replays += 1

    def run(self, n: int, stream: Any = None, x: Any = None) -> DeviceArray:
        """Run the model on the first ``n`` rows of :attr:`input` (or of ``x``, copied in first):
        :meth:`set_rows` then :meth:`replay`; returns the ``n`` result rows, a view of
        :attr:`output` valid until the next run (``n = 0`` runs nothing and returns a 0-row view)."""
        self._check()
        self._check_n(n)
        if self._n_from_caller:
            raise DeviceShapedError("this graph reads n from the caller's n_live: write it there and call replay()")
        xa = check_rows(x, n, self.width) if x is not None and n > 0 else None
        with self._n_lock:
            s = self._order.enter(self.stream if stream is None else stream)
            if xa is not None:
                src, dst, nbytes = xa.ptr, self.input.ptr, n * self._row_bytes
                if src != dst and src < dst + self.input.nbytes and dst < src + nbytes:
                    raise LayoutError("x overlaps the persistent input without being it")
                if src != dst:
                    call(driver.cuMemcpyDtoDAsync, dst, src, nbytes, s.handle)
            self._write_n(n, s)  # n and the stream are checked above
            self.exec.launch(s)
            self.replays += 1
        return DeviceArray(self.output.ptr, (int(n), self.width), np.dtype(np.float32), self.output)

    # -- what the head did ------------------------------------------------------------------
    def status(self, stream: Any = None) -> tuple[int, list[int]]:
        """``(n, codes)`` of the last replay that finished on ``stream``: the ``n`` the head used
        (clamped) and each node's ``cudaError_t`` from ``cudaGraphKernelNodeUpdatesApply``
        (none with ``select="switch"``; waits for ``stream``)."""
        self._check()
        rc = self._rc.to_numpy(self.stream if stream is None else stream)
        return int(rc[-1]), [int(c) for c in rc[:-1]]

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
        arena = getattr(self.arena, "nbytes", 0) if self.arena is not None else 0
        own_n = 4 if self._n_buf is not None else 0
        return self.input.nbytes + self.output.nbytes + arena + self._table.nbytes + self._rc.nbytes + own_n

    def _check_n(self, n: Any) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if not 0 <= n <= self.max_batch:
            raise ShapeError(f"n = {n} is outside 0..max_batch = {self.max_batch}")

    def _check(self) -> None:
        if not self._finalizer.alive:
            raise ClosedError("DeviceShapedGraph is closed")

    def close(self) -> None:
        """Free the head's shadow (``select="switch"``), the exec, the graph, the model views (one
        per band), the arena and the buffers (in that order); safe twice."""
        self._finalizer()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return (
            f"<DeviceShapedGraph width={self.width} max_batch={self.max_batch} select={self.select} "
            f"bands={len(getattr(self, 'bands', []))} nodes={len(getattr(self, '_launches', []))}{state}>"
        )
