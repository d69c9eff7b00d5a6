"""Continuous batching: requests in fixed slots, one step of the block for every live request,
rows picked through an index table, with no recapture and no rebinding per step.

Each request's state row (the activation that feeds its next step) lives in one slot of a
``(max_slots + 1, width)`` state buffer, at a stable address; the extra last row is the scratch
slot that padding points at. A step runs the bucket graph for the live count ``n``: gather the
rows ``state[table[i]]`` into the bucket's input, the block, scatter the results back to
``state[table[i]]``. Padding entries of the table name the scratch slot, so padding never
touches a live row.

The table (int32, ``table[:n]`` the live slots, the rest the scratch slot) reaches the device one
of three ways (``table=``):

- ``"graph"`` (default): every bucket graph begins with a memcpy node that copies the table from
  pinned host memory (:class:`~rawgraph.runtime.memory.HostBuffer`); the host keeps the pinned table
  current as requests join and leave, and a step is one ``cuGraphLaunch``.
- ``"copy"``: one ``cuMemcpyHtoDAsync`` of the table before the launch (vLLM's way: copy the
  indices, then replay), skipped when no request joined or left since the last copy.
- ``"params"``: the table is a by-value kernel parameter of separate gather and scatter kernels
  (``kernels/rows.cu``); a step after a join or leave pushes those two nodes with
  ``cuGraphExecKernelNodeSetParams`` (at most 1024 rows: 4 KB of parameters).

Where the rows are gathered and scattered (``gather=``):

- ``"fused"`` (default for the fused form): the first matmul loads its rows through the table and
  the last one stores through it (the matmul kernels' row flags, ``kernels/rawgraph.cuh``); the
  graph has no copy kernels.
- ``"kernels"``: a gather kernel into the bucket's input, the block, a scatter kernel back.

The host-memory rule (``"graph"``): a replay reads the pinned table when it reaches its memcpy
node, which may be long after ``cuGraphLaunch`` returned. The table must not be rewritten before
then. Each graph records an event right after its memcpy node; :meth:`SlotPool.join` and
:meth:`SlotPool.leave` wait for the last step's event before they touch the table (in a loop that
synchronizes each step, it has always fired).

The parts, each made and testable alone (:class:`SlotPool` composes them and reads their attributes
through): :class:`SlotOptions`, the choice of table, gather, shape and the device-shaped graph's
bands and select, checked before anything is allocated (pure); :class:`SlotTable`, the host table
and who holds which slot (pure); :class:`SlotState`, the state rows and the bucket buffers;
:class:`TableDelivery`, how the table reaches the device; :class:`RowGather`, where each bucket's
rows are gathered and scattered; :class:`SlotExecs`, the bucket graphs or the device-shaped graph;
:class:`LeaveRing`, the pinned rows of ``leave(wait=False)``. What needs releasing sits in one
:class:`~rawgraph.serving.lifecycle.Held`, closed in the order :meth:`SlotPool.close` names.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..graphs.capture import Capture
from ..graphs.graph import Graph, GraphExec
from ..runtime.errors import ClosedError, DTypeError, LayoutError, RawgraphError, ShapeError, call
from ..runtime.launch import Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array
from ..runtime.stream import Event, Stream, as_stream
from ..updates.shadow import ExecShadow
from .device_shaped import DeviceShapedGraph, check_bands
from .lifecycle import Held, WarmUp, instantiate_uploaded
from .protocol import RowwiseModel, check_model
from .sizes import check_sizes, pick_bucket, vllm_sizes

TABLE_MODES = ("graph", "copy", "params")
GATHER_MODES = ("fused", "kernels")


def _routable(plan: LaunchPlan) -> bool:
    """Whether every kernel of ``plan`` touching its input or output takes the row table."""
    names = set(plan.inputs) | set(plan.outputs)
    return all(
        ops.routes_rows(launch) and arg in ops.ROW_FLAGS
        for launch in plan.launches
        for arg, use in launch.uses.items()
        if use.buffer in names
    )


def _route_rows(plan: LaunchPlan, table: int, state: int) -> int:
    """Point the plan's input and output arguments at ``state`` with the matmul row flags, so row
    ``m`` of the batch is ``state[table[m]]`` (in place; returns the arguments rewritten).

    Refuses (``LayoutError``, nothing changed) a plan with a kernel that cannot route its rows:
    only the matmul kernels take the ``rows`` table.
    """
    names = set(plan.inputs) | set(plan.outputs)
    todo = []
    for launch in plan.launches:
        for arg, use in launch.uses.items():
            if use.buffer not in names:
                continue
            if not ops.routes_rows(launch) or arg not in ops.ROW_FLAGS:
                raise LayoutError(
                    f"kernel {launch.label!r} cannot pick the rows of its argument {arg!r} through a table"
                )
            todo.append((launch, arg))
    for launch, arg in todo:
        launch.args[arg] = state
        launch.args["rows"] = table
        launch.args["flags"] = int(launch.args["flags"]) | ops.ROW_FLAGS[arg]
    return len(todo)


class _Unsent(NamedTuple):
    """What a refused table push puts back: each node's by-value table and what it held."""

    tables: list[np.ndarray]
    olds: list[np.ndarray]


def _unsend(log: _Unsent) -> None:
    """Undo of a refused table push: each node's by-value table gets what it held back."""
    for t, old in zip(log.tables, log.olds):
        t[: len(old)] = old


class SlotError(RawgraphError, ValueError):
    """A slot operation that does not fit the pool's state (full, free, occupied, unknown)."""


class _SlotRows:
    """A row-wise model seen through the slot table: its plan gathers ``state[table[i]]`` into the
    input, runs the model and scatters the output back (``rows`` kernels), so a
    :class:`~rawgraph.serving.device_shaped.DeviceShapedGraph` over it serves a slot pool with one
    exec. The gather and scatter are bounded by their ``rows`` argument (grid-stride kernels:
    the grid stays); every other launch is the model's own answer."""

    _EDGES = ("gather_rows", "scatter_rows")

    def __init__(self, model: Any, state: DeviceArray, table: DeviceArray):
        self._model, self._state, self._table = model, state, table
        self.width, self.batch, self.device = model.width, model.batch, model.device

    def plan(self, x: Any, out: Any, scratch: Any = None) -> LaunchPlan:
        inner = self._model.plan(x, out, scratch)
        b = self.batch
        # names of their own: the model's plan may call its buffers anything
        views = {
            "slot_state": self._state,
            "slot_table": self._table,
            "slot_x": as_device_array(x, "x"),
            "slot_y": as_device_array(out, "out"),
        }
        gather = ops.gather_rows(self.device, views, "slot_state", "slot_table", "slot_x", b, label=f"gather{b}")
        scatter = ops.scatter_rows(self.device, views, "slot_y", "slot_table", "slot_state", b, label=f"scatter{b}")
        buffers = {**inner.buffers, **views}
        # pdl=None: the model's launches keep their own PDL flags; the gather and scatter wait fully
        return LaunchPlan([gather, *inner.launches, scatter], buffers, inner.inputs, inner.outputs, pdl=None)

    def with_batch(self, batch: int, workspace: Any = None) -> _SlotRows:
        return _SlotRows(self._model.with_batch(batch, workspace=workspace), self._state, self._table)

    def make_workspace(self, rows: int) -> Any:
        return self._model.make_workspace(rows)

    def scratch_layout(self, batch: int) -> Any:
        return self._model.scratch_layout(batch)

    def reference(self, x: Any) -> Any:
        return self._model.reference(x)

    def row_count_arg(self, launch: Launch) -> tuple[str, int] | None:
        if launch.kernel.name in self._EDGES:
            return ("rows", 1)
        ask = getattr(self._model, "row_count_arg", None)
        return ask(launch) if ask is not None else None

    def row_grid(self, launch: Launch) -> tuple[int, int] | None:
        if launch.kernel.name in self._EDGES:
            return None
        ask = getattr(self._model, "row_grid", None)
        return ask(launch) if ask is not None else None

    def close(self) -> None:
        self._model.close()


class PendingRow:
    """The final row of a request that left with ``SlotPool.leave(slot, wait=False)``, on its way
    to the host: :meth:`result` waits for its own copy (an event after it), :meth:`done` asks."""

    __slots__ = ("_pool", "_slot", "_row")

    def __init__(self, pool: SlotPool, slot: int):
        self._pool, self._slot = pool, slot
        self._row: np.ndarray | None = None

    def done(self) -> bool:
        """True once the row is on the host (``cuEventQuery``).

        See Also
        --------
        cuEventQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        with self._pool._lock:
            if self._row is not None:
                return True
            ev = self._pool._ring.events[self._slot]
            return ev is not None and ev.query()

    def result(self) -> np.ndarray:
        """The row (``width`` float32), waiting for its copy only (``cuEventSynchronize``).

        See Also
        --------
        cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        with self._pool._lock:
            self._take()
            assert self._row is not None
            return self._row

    def _take(self) -> None:
        """Under the pool's lock: wait for the copy, keep the row, give the pinned row back."""
        if self._row is not None:
            return
        ring, slot = self._pool._ring, self._slot
        ev, host = ring.events[slot], ring.host
        assert ev is not None and host is not None
        ev.synchronize()
        self._row = host.array[slot].copy()
        if ring.owner[slot] is self:
            ring.owner[slot] = None


# ------------------------------------------------------------------------------------ parts
@dataclass(frozen=True)
class SlotOptions:
    """How a pool is built, checked before anything is allocated: ``table`` (how the table
    reaches the device), ``gather`` (None: the largest bucket's plan decides), ``shape``,
    ``sizes`` (the bucket sizes, the largest holding ``max_slots``), and the device-shaped
    graph's ``bands`` and ``select`` (``shape="device"`` only). ``copy_whole_table``: a SWITCH
    band reads table entries up to its top, past the live count, so every copy is whole.

    Build it with :meth:`check` (the :class:`SlotPool` arguments, same errors).
    """

    max_slots: int
    sizes: list[int]
    table: str
    gather: str | None
    shape: str
    bands: Any
    select: str | None
    copy_whole_table: bool

    @classmethod
    def check(
        cls,
        model: Any,
        max_slots: Any,
        sizes: Sequence[int] | None = None,
        table: str | None = None,
        gather: str | None = None,
        shape: str = "buckets",
        bands: Any = None,
        select: str | None = None,
    ) -> SlotOptions:
        """The options of ``SlotPool(model, max_slots, sizes, table, ..., gather, shape, bands,
        select)``, checked in the pool's order; see :class:`SlotPool` for what each refusal means."""
        if shape not in ("buckets", "device"):
            raise ValueError(f"shape must be 'buckets' or 'device', got {shape!r}")
        if (bands is not None or select is not None) and shape != "device":
            raise ValueError("bands and select are the device-shaped graph's: they need shape='device'")
        if select not in (None, "updates", "switch"):
            raise ValueError(f"select must be 'updates' or 'switch', got {select!r}")
        if shape == "device":
            if table not in (None, "copy") or gather not in (None, "kernels"):
                raise LayoutError(
                    "shape='device' runs one exec whose gather and scatter kernels read a device "
                    "table copied before each step: use table='copy', gather='kernels'"
                )
            table, gather = "copy", "kernels"
            sizes = [max_slots] if sizes is None else sizes  # one exec of max_slots rows (checked below)
        table = "graph" if table is None else table
        if table not in TABLE_MODES:
            raise ValueError(f"table must be one of {TABLE_MODES}, got {table!r}")
        check_model(model)
        if gather is not None and gather not in GATHER_MODES:
            raise ValueError(f"gather must be one of {GATHER_MODES}, got {gather!r}")
        if gather == "fused" and table == "params":
            raise LayoutError(
                "table='params' passes the table by value to the gather and scatter kernels: use gather='kernels'"
            )
        if isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots < 1:
            raise ShapeError(f"max_slots must be a positive int, got {max_slots!r}")
        if bands is not None and not (isinstance(bands, str) and bands == "plans"):
            bands = check_bands(bands, max_slots)  # before anything is allocated
        checked = check_sizes(vllm_sizes(max_slots) if sizes is None else sizes)
        if checked[-1] < max_slots:
            raise ShapeError(f"the largest bucket ({checked[-1]}) must hold max_slots = {max_slots}")
        if table == "params":
            ops.row_param_cap(checked[-1])  # refuses buckets over the by-value capacity
        return cls(max_slots, checked, table, gather, shape, bands, select, select == "switch")


class SlotTable:
    """The host side of the index table: ``table[:n]`` the live slots in batch order, the rest
    the scratch slot (``scratch_slot = max_slots``, the state's extra row that padding points at,
    so padding never touches a live row); ``free`` the free slots, highest first (``pop()`` gives
    the lowest); ``pos`` live slot -> its position; ``version`` bumped by every join and leave.
    Pure: ``table`` is any int32 array of at least ``max_slots`` entries (the pool's is pinned
    host memory with ``table="graph"``), filled here."""

    table: np.ndarray
    scratch_slot: int
    free: list[int]
    version: int

    def __init__(self, table: np.ndarray, max_slots: int):
        self.table = table
        self.scratch_slot = max_slots
        self.table[:] = self.scratch_slot
        self.free = list(range(max_slots - 1, -1, -1))
        self.pos: dict[int, int] = {}
        self.version = 0

    def __len__(self) -> int:
        return len(self.pos)

    @property
    def live(self) -> list[int]:
        """Live slots in batch order (``table[:n]``)."""
        return [int(v) for v in self.table[: len(self.pos)]]

    def choose(self, slot: Any = None) -> int:
        """The slot a join takes: the lowest free one, or ``slot``; :class:`SlotError` when the
        pool is full, or ``slot`` is occupied or out of range. Changes nothing."""
        if slot is None:
            if not self.free:
                raise SlotError(f"the pool is full ({self.scratch_slot} slots)")
            return self.free[-1]
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.scratch_slot:
            raise SlotError(f"slot {slot!r} is not in 0..{self.scratch_slot - 1}")
        if slot in self.pos:
            raise SlotError(f"slot {slot} is occupied")
        chosen = int(slot)
        return chosen

    def admit(self, chosen: int) -> None:
        """``chosen`` (from :meth:`choose`) joins at the end of the batch."""
        self.free.remove(chosen)
        n = len(self.pos)
        self.table[n] = chosen
        self.pos[chosen] = n
        self.version += 1

    def retire(self, slot: int) -> None:
        """``slot`` (live) leaves: the last live slot takes its place in the batch (swap-remove)."""
        pos, last = self.pos.pop(slot), len(self.pos)
        if pos != last:
            moved = int(self.table[last])
            self.table[pos] = moved
            self.pos[moved] = pos
        self.table[last] = self.scratch_slot
        self.version += 1
        self.free.append(slot)
        self.free.sort(reverse=True)


@dataclass(frozen=True)
class SlotState:
    """The device rows: ``state`` (``(max_slots + 1, width)``, slot ``i``'s row then the scratch
    slot), and for bucket graphs their persistent input ``x``, output ``y`` and scratch ``arena``
    sized for the largest bucket (None with ``shape="device"``: the device-shaped graph holds its
    own)."""

    width: int
    state: DeviceBuffer
    x: DeviceBuffer | None
    y: DeviceBuffer | None
    arena: Any

    @classmethod
    def allocate(cls, model: Any, opts: SlotOptions, stream: Stream) -> SlotState:
        width, device, top = model.width, model.device, opts.sizes[-1]
        state = DeviceBuffer((opts.max_slots + 1, width), np.float32, device)
        state.poison(stream)
        bucketed = opts.shape != "device"
        x = DeviceBuffer((top, width), np.float32, device) if bucketed else None
        y = DeviceBuffer((top, width), np.float32, device) if bucketed else None
        arena = model.make_workspace(top) if bucketed else None
        return cls(width, state, x, y, arena)

    def row_ptr(self, slot: int) -> int:
        return self.state.ptr + slot * self.width * 4

    def write_row(self, slot: int, row: Any, stream: Stream) -> None:
        """Copy ``row`` (host ``(width,)`` float32, or a device array of ``width`` float32) into
        ``slot``'s row, ordered on ``stream``; refused before any copy otherwise."""
        dst = self.row_ptr(slot)
        if isinstance(row, np.ndarray):
            if row.dtype != np.float32:
                raise DTypeError(f"row has dtype {row.dtype}, the block runs float32")
            if row.shape != (self.width,):
                raise ShapeError(f"row has shape {row.shape}, expected ({self.width},)")
            # The caller may reuse the row once join returns. A copy of it in fresh (pageable)
            # host memory is staged by cuMemcpyHtoDAsync before the call returns (CUDA's API
            # synchronization rules for pageable sources), so nothing waits for the stream;
            # copying the caller's row straight from pinned memory would be a DMA that reads it
            # later, after join returned.
            staged = np.array(row, dtype=np.float32, order="C", copy=True)
            call(driver.cuMemcpyHtoDAsync, dst, staged.ctypes.data, staged.nbytes, stream.handle)
        else:
            dev = as_device_array(row, "row")
            if dev.dtype != np.float32:
                raise DTypeError(f"row has dtype {dev.dtype}, the block runs float32")
            if dev.size != self.width:
                raise ShapeError(f"row has shape {dev.shape}, expected {self.width} values")
            call(driver.cuMemcpyDtoDAsync, dst, dev.ptr, dev.nbytes, stream.handle)

    def read_row(self, slot: int, stream: Stream) -> np.ndarray:
        """A host copy of ``slot``'s row after the work queued on ``stream`` (which it waits for)."""
        out = np.empty(self.width, np.float32)
        call(driver.cuMemcpyDtoHAsync, out.ctypes.data, self.row_ptr(slot), out.nbytes, stream.handle)
        stream.synchronize()
        return out


class TablePush(NamedTuple):
    """``table="params"``, per bucket: the shadow of its exec holding its gather and scatter
    nodes, and their persistent by-value tables (what the shadow's ``CUDA_KERNEL_NODE_PARAMS``
    point at)."""

    shadow: ExecShadow
    tables: list[np.ndarray]


class TableDelivery:
    """How the table reaches the device (``mode``, the module docstring): ``table_dev`` (what
    the kernels read), the host table ``host`` (pinned, ``pinned``, for the in-graph copy;
    pageable for a copy before the launch, staged by the time ``cuMemcpyHtoDAsync`` returns), the
    event ``read`` recorded after each graph's copy node, and which table version each bucket
    last received (``sent``); ``pushes`` per bucket with ``"params"``."""

    mode: str
    device: Any
    max_slots: int
    copy_whole: bool
    table_dev: DeviceBuffer
    pinned: HostBuffer | None
    read: Event

    def __init__(self, opts: SlotOptions, device: Any):
        top = opts.sizes[-1]
        self.mode = opts.table
        self.device = device
        self.max_slots = opts.max_slots
        self.copy_whole = opts.copy_whole_table
        self.table_dev = DeviceBuffer(top, np.int32, device)
        self.pinned = HostBuffer(top, np.int32, device) if opts.table == "graph" else None
        self.host: np.ndarray = self.pinned.array if self.pinned is not None else np.empty(top, np.int32)
        self.read = Event(timing=False, device=device)  # recorded after each replay read the table
        self.pushes: dict[int, TablePush] = {}
        self.sent: dict[int, int] = {}

    def record_read(self, cap: Capture, b: int) -> None:
        """``table="graph"``: the graph's copy node of the pinned table, and the event after it."""
        if self.pinned is not None:
            cap.memcpy_htod(self.table_dev.ptr, self.pinned.ptr, 4 * b)
            cap.event_record(self.read)

    def track(self, b: int, exe: GraphExec | None = None, nodes: Sequence[Any] = ()) -> None:
        """Bucket ``b`` (its exec and gather/scatter nodes) holds the initial table; with
        ``"params"``, a shadow of its by-value tables."""
        if self.mode == "params" and exe is not None:
            shadow = ExecShadow(exe, self.device)
            for node in nodes:
                shadow.add(node.handle, node.launch.node_params(), node.launch.label)
            self.pushes[b] = TablePush(shadow, [node.launch.args.array("table") for node in nodes])
        self.sent[b] = 0

    def table_free(self, steps: int) -> None:
        """The host-memory rule: wait until the last step's replay has read the pinned table."""
        if self.pinned is not None and steps and not self.read.query():
            self.read.synchronize()

    def send(self, b: int, version: int, stream: Stream) -> None:
        """Before bucket ``b``'s launch: the table of ``version``, unless the graph copies it
        itself or ``b`` has it already (one device table serves every bucket up to ``b``)."""
        if self.pinned is not None or self.sent[b] == version:
            return
        if self.pushes:
            push = self.pushes[b]
            olds = [t[:b].copy() for t in push.tables]
            for t in push.tables:
                t[:b] = self.host[:b]
            # a refused push puts the old tables back in both nodes (_unsend)
            push.shadow.push(range(len(push.tables)), _unsend, _Unsent(push.tables, olds))
            self.sent[b] = version
        else:
            call(driver.cuMemcpyHtoDAsync, self.table_dev.ptr, self.host.ctypes.data, 4 * b, stream.handle)
            for k in self.sent:
                self.sent[k] = version if k <= b else -1

    def send_shaped(self, n: int, version: int, stream: Stream) -> None:
        """Before a device-shaped step of ``n`` live rows: the table of ``version`` (whole with
        ``copy_whole``), unless sent already."""
        if self.sent[self.max_slots] != version:
            rows = self.max_slots if self.copy_whole else n
            call(driver.cuMemcpyHtoDAsync, self.table_dev.ptr, self.host.ctypes.data, 4 * rows, stream.handle)
            self.sent[self.max_slots] = version


class RowEdges(NamedTuple):
    """The launches around a bucket's plan when the rows are not fused into it."""

    gather: Launch
    scatter: Launch


class RowGather:
    """Where each bucket's rows are gathered from and scattered to the state (``gather``; None
    until the largest bucket's plan decides: ``"fused"`` where every kernel touching its input or
    output picks its rows through a table, else ``"kernels"``). :meth:`edges` rewrites a fused plan
    in place, or makes its gather and scatter kernels (by-value tables with ``table="params"``,
    each filled with the scratch slot)."""

    gather: str | None
    mode: str
    model: Any
    views: dict[str, DeviceArray]
    scratch_slot: int

    def __init__(self, gather: str | None, mode: str, model: Any, views: dict[str, DeviceArray], scratch_slot: int):
        self.gather = gather
        self.mode = mode
        self.model = model
        self.views = views
        self.scratch_slot = scratch_slot

    def edges(self, b: int, plan: LaunchPlan) -> RowEdges | None:
        """Route bucket ``b``'s ``plan``; its gather and scatter launches, None when fused."""
        if self.gather is None:
            # The largest bucket's plan decides: fused where every kernel touching x and out
            # picks its rows through a table (rawgraph's matmuls), else gather kernels.
            routable = self.mode != "params" and self.model.width % 4 == 0 and _routable(plan)
            self.gather = "fused" if routable else "kernels"
        if self.gather == "fused" and not _routable(plan):
            raise LayoutError(
                f"gather='fused' needs every kernel that reads x or writes out to take the row "
                f"table (TinyBlock's fused form); {self.model!r} has others: use gather='kernels'"
            )
        device, views = self.model.device, self.views
        if self.gather == "fused":
            _route_rows(plan, views["table"].ptr, views["state"].ptr)
            return None
        if self.mode == "params":
            edges = RowEdges(
                ops.gather_rows_param(device, views, "state", "x", b, label=f"gather{b}"),
                ops.scatter_rows_param(device, views, "y", "state", b, label=f"scatter{b}"),
            )
            for launch in edges:
                launch.args.array("table")[:] = self.scratch_slot
            return edges
        return RowEdges(
            ops.gather_rows(device, views, "state", "table", "x", b, label=f"gather{b}"),
            ops.scatter_rows(device, views, "y", "table", "state", b, label=f"scatter{b}"),
        )


# The pool's Held groups, closed in this order.
_SHAPED, _EXECS, _GRAPHS, _MODELS, _BUFFERS, _RING_EVENTS, _RING, _STREAM = range(8)


class SlotExecs:
    """What a step launches: one graph per bucket (``models``, ``graphs``, ``execs`` by bucket
    size, ``edges`` their gather and scatter launches) or one device-shaped graph (``shaped``),
    with the set-up seconds (``setup``) and the eager runs before the captures (``warm_up``)."""

    setup: dict[str, float]
    warm_up: WarmUp
    gather: str

    def __init__(self) -> None:
        self.setup = {"warmup": 0.0, "capture": 0.0, "instantiate": 0.0, "upload": 0.0}
        self.warm_up = WarmUp(self.setup)
        self.models: dict[int, Any] = {}
        self.graphs: dict[int, Graph] = {}
        self.execs: dict[int, GraphExec] = {}
        self.edges: dict[int, RowEdges | None] = {}
        self.shaped: DeviceShapedGraph | None = None
        self.gather = ""

    def build_shaped(
        self, model: Any, opts: SlotOptions, views: dict[str, DeviceArray], stream: Stream, held: Held
    ) -> None:
        """``shape="device"``: one device-shaped graph over the model seen through the table."""
        t0 = time.perf_counter()
        self.shaped = held.add(
            DeviceShapedGraph(
                _SlotRows(model, views["state"], views["table"]),
                opts.max_slots,
                stream,
                bands=opts.bands,
                select=opts.select or "updates",
            ),
            _SHAPED,
        )
        self.setup["capture"] += time.perf_counter() - t0
        self.gather = "kernels"

    def build_buckets(
        self, model: Any, opts: SlotOptions, state: SlotState, tables: TableDelivery, stream: Stream, held: Held
    ) -> None:
        """One graph per bucket, largest first: [table copy node, event] -> [gather] -> plan -> [scatter]."""
        views = _views(state, tables)
        route = RowGather(opts.gather, opts.table, model, views, opts.max_slots)
        for b in reversed(opts.sizes):
            self._bucket(b, model, state, route, tables, stream, held)
        assert route.gather is not None
        self.gather = route.gather

    def _bucket(
        self, b: int, model: Any, state: SlotState, route: RowGather, tables: TableDelivery, stream: Stream, held: Held
    ) -> None:
        x, y, f32 = state.x, state.y, np.dtype(np.float32)
        assert x is not None and y is not None  # bucketed
        m = self.models[b] = held.add(model.with_batch(b, workspace=state.arena), _MODELS)
        plan = m.plan(DeviceArray(x.ptr, (b, state.width), f32, x), DeviceArray(y.ptr, (b, state.width), f32, y))
        edges = self.edges[b] = route.edges(b, plan)  # the pool owns their by-value tables
        self.warm_up(plan.launches if edges is None else (edges.gather, *plan.launches, edges.scatter), stream)
        t0 = time.perf_counter()
        with Capture(stream) as cap:
            tables.record_read(cap, b)
            nodes = [cap.launch(edges.gather)] if edges is not None else []
            cap.run(plan)
            if edges is not None:
                nodes.append(cap.launch(edges.scatter))
        graph = cap.captured
        graph.plan = plan
        self.setup["capture"] += time.perf_counter() - t0
        exe = instantiate_uploaded(graph, stream, self.setup)
        self.graphs[b], self.execs[b] = held.add(graph, _GRAPHS), held.add(exe, _EXECS)
        tables.track(b, exe, nodes)


def _views(state: SlotState, tables: TableDelivery) -> dict[str, DeviceArray]:
    """The arrays the gather and scatter kernels name: the state and the device table, and the
    bucket input and output where there are some."""
    views = {"state": state.state.view(), "table": tables.table_dev.view()}
    if state.x is not None and state.y is not None:
        views.update(x=state.x.view(), y=state.y.view())
    return views


class LeaveRing:
    """The pinned rows of ``leave(wait=False)``, made at the first such leave: one row per slot
    (``host``), the event after its copy (``events``), and the :class:`PendingRow` still holding
    it (``owner``). ``events`` and ``buffers`` are filled in place: the pool's holder closes them."""

    max_slots: int
    width: int
    device: Any

    def __init__(self, max_slots: int, width: int, device: Any):
        self.max_slots = max_slots
        self.width = width
        self.device = device
        self.buffers: list[HostBuffer] = []
        self.events: list[Event | None] = []
        self.owner: list[PendingRow | None] = []

    @property
    def host(self) -> HostBuffer | None:
        return self.buffers[0] if self.buffers else None

    def pending(self, pool: SlotPool, slot: int, src: int, stream: Stream) -> PendingRow:
        """Copy the row at ``src`` (``cuMemcpyDtoHAsync``) into ``slot``'s pinned row behind the
        work queued on ``stream``, an event after it."""
        if not self.buffers:
            self.buffers.append(HostBuffer((self.max_slots, self.width), np.float32, self.device))
            self.events.extend([None] * self.max_slots)
            self.owner.extend([None] * self.max_slots)
        host = self.buffers[0]
        host._check_open()  # released by the pool's holder: refuse before any driver call
        earlier = self.owner[slot]
        if earlier is not None:
            earlier._take()  # its copy is older than anything queued since: only that one is waited for
        event = self.events[slot]
        if event is None:
            event = self.events[slot] = Event(timing=False, device=self.device)
        call(driver.cuMemcpyDtoHAsync, host.ptr + slot * self.width * 4, src, self.width * 4, stream.handle)
        event.record(stream)
        row = self.owner[slot] = PendingRow(pool, slot)
        return row

    def take_all(self) -> None:
        """Take every row still on its way (their ``result()`` keeps working)."""
        for row in self.owner:
            if row is not None:
                row._take()


# ------------------------------------------------------------------------------------ the pool
class SlotPool:
    """``max_slots`` request slots over one model; :meth:`step` advances every live request.

    Parameters
    ----------
    model : RowwiseModel
        Any model keeping the row-wise protocol (:mod:`rawgraph.serving.protocol`); its
        weights are shared, not copied.
    max_slots : int, default 256
    sizes : sequence of int, optional
        Bucket sizes (default the vLLM-style list up to ``max_slots``).
    table : {"graph", "copy", "params"}
        How the index table reaches the device (module docstring).
    gather : {"fused", "kernels"}, optional
        Where rows are gathered and scattered (module docstring); default ``"fused"`` when the
        table is on the device and every kernel touching the input or output takes the row
        table (TinyBlock's fused form), ``"kernels"`` otherwise.
    stream : stream-like, optional
        Where capture, joins, leaves and steps run (default: a new stream).
    shape : {"buckets", "device"}
        ``"buckets"``: a graph per bucket size, the live rows padded up to the bucket.
        ``"device"``: one exec of ``max_slots`` rows whose grids and row counts are set on the
        device at each step to exactly the live rows (a
        :class:`~rawgraph.serving.device_shaped.DeviceShapedGraph` over the model seen through
        the table: gather, model, scatter); needs ``table="copy"`` and ``gather="kernels"``
        (chosen when not given); ``sizes`` is not used.
    bands : None, "plans" or sequence of int
        ``shape="device"`` only: the device-shaped graph's bands (one plan per band of row
        counts; ``"plans"``: every live count runs the exact-size plan's kernels; see
        :class:`~rawgraph.serving.device_shaped.DeviceShapedGraph`).
    select : {"updates", "switch"}, optional
        ``shape="device"`` only: how the device-shaped graph fits a band to the live count
        (:class:`~rawgraph.serving.device_shaped.DeviceShapedGraph`). With ``"switch"`` a band
        runs at its top's rows, the rows past the live count gathered from and scattered to the
        scratch slot (the whole table is copied when it changes, so no stale entry is read).

    Attributes
    ----------
    state : DeviceBuffer
        ``(max_slots + 1, width)``: slot ``i``'s row, then the scratch slot.
    setup : dict
        Seconds of ``capture``, ``instantiate``, ``upload``, ``warmup`` over all buckets.
    warm_up : WarmUp
        The eager runs before the bucket captures (skipped for a bucket whose kernel functions
        had all run already).
    steps : int

    Notes
    -----
    The attributes above (and ``table``, ``table_dev``, ``scratch_slot``, ``x``, ``y``, ``arena``,
    ``graphs``, ``execs``, ``mode``, ``gather``, ``shape``) are the parts' (module docstring), read
    through.
    """

    max_slots: int
    width: int
    device: Any
    stream: Stream
    sizes: list[int]
    steps: int

    def __init__(
        self,
        model: RowwiseModel,
        max_slots: int = 256,
        sizes: Sequence[int] | None = None,
        table: str | None = None,
        stream: Any = None,
        gather: str | None = None,
        shape: str = "buckets",
        bands: Any = None,
        select: str | None = None,
    ):
        # One thread at a time: two joins must not pick one slot, and the table, the positions and
        # the pinned/device tables change together (a lock, not an owning thread: a server may
        # admit requests on one thread and step on another).
        self._lock = threading.Lock()
        opts = SlotOptions.check(model, max_slots, sizes, table, gather, shape, bands, select)
        self.max_slots = max_slots
        self.sizes = opts.sizes
        self.width = model.width
        self.device = model.device
        own_stream = stream is None
        self.stream = Stream(device=self.device) if stream is None else as_stream(stream)
        self._bufs = SlotState.allocate(model, opts, self.stream)
        self._tables = TableDelivery(opts, self.device)
        self._rows = SlotTable(self._tables.host, max_slots)
        self._ring = LeaveRing(max_slots, self.width, self.device)
        self._execs = SlotExecs()
        bufs, tables = self._bufs, self._tables
        self._held = Held(
            "SlotPool.close",
            [[], [], [], [], [], self._ring.events, self._ring.buffers, [self.stream] if own_stream else []],
        )
        for buf in (bufs.state, bufs.x, bufs.y, bufs.arena, tables.table_dev, tables.pinned, tables.read):
            self._held.add(buf, _BUFFERS)
        tables.table_dev.copy_from_host(self._rows.table, self.stream)
        try:
            if opts.shape == "device":
                self._execs.build_shaped(model, opts, _views(bufs, tables), self.stream, self._held)
                tables.track(max_slots)
            else:
                self._execs.build_buckets(model, opts, bufs, tables, self.stream, self._held)
        except BaseException:
            self.close()  # what was made so far: nothing stays allocated after a refusal
            raise
        bufs.state.poison(self.stream)
        self.steps = 0

    # -- the parts' attributes, read through -----------------------------------------------------
    @property
    def state(self) -> DeviceBuffer:
        return self._bufs.state

    @property
    def x(self) -> DeviceBuffer | None:
        return self._bufs.x

    @property
    def y(self) -> DeviceBuffer | None:
        return self._bufs.y

    @property
    def arena(self) -> Any:
        return self._bufs.arena

    @property
    def table(self) -> np.ndarray:
        """The host table: ``table[:n]`` the live slots, the rest the scratch slot."""
        return self._rows.table

    @property
    def scratch_slot(self) -> int:
        return self._rows.scratch_slot

    @property
    def table_dev(self) -> DeviceBuffer:
        return self._tables.table_dev

    @property
    def mode(self) -> str:
        """How the table reaches the device: ``"graph"``, ``"copy"`` or ``"params"``."""
        return self._tables.mode

    @property
    def gather(self) -> str:
        """Where rows are gathered and scattered: ``"fused"`` or ``"kernels"``."""
        return self._execs.gather

    @property
    def shape(self) -> str:
        return "buckets" if self._execs.shaped is None else "device"

    @property
    def graphs(self) -> dict[int, Graph]:
        return self._execs.graphs

    @property
    def execs(self) -> dict[int, GraphExec]:
        return self._execs.execs

    @property
    def setup(self) -> dict[str, float]:
        return self._execs.setup

    @property
    def warm_up(self) -> WarmUp:
        return self._execs.warm_up

    @property
    def _shaped(self) -> DeviceShapedGraph | None:
        return self._execs.shaped

    @property
    def _edges(self) -> dict[int, RowEdges | None]:
        return self._execs.edges

    @property
    def _models(self) -> dict[int, Any]:
        return self._execs.models

    @property
    def _pushes(self) -> dict[int, TablePush]:
        return self._tables.pushes

    @property
    def _read(self) -> Event:
        return self._tables.read

    @property
    def _pos(self) -> dict[int, int]:
        return self._rows.pos

    @property
    def _free(self) -> list[int]:
        return self._rows.free

    # -- requests --------------------------------------------------------------------------------
    @property
    def live(self) -> list[int]:
        """Live slots in batch order (``table[:n]``)."""
        return self._rows.live

    def __len__(self) -> int:
        return len(self._rows)

    def _table_free(self) -> None:
        """The host-memory rule: wait until the last step's replay has read the pinned table."""
        self._tables.table_free(self.steps)

    def join(self, row: Any, slot: int | None = None) -> int:
        """Admit a request whose state row is ``row`` (a host ``(width,)`` float32 array or a
        device array of ``width`` float32); returns its slot (the lowest free one, or ``slot``).

        Raises
        ------
        SlotError
            The pool is full, or ``slot`` is occupied or out of range.
        ShapeError, DTypeError
            ``row`` is not ``width`` float32 values.
        """
        with self._lock:
            self._check_open()
            chosen = self._rows.choose(slot)
            self._bufs.write_row(chosen, row, self.stream)
            self._table_free()
            self._rows.admit(chosen)
            return chosen

    def leave(self, slot: int, wait: bool = True) -> np.ndarray | PendingRow:
        """Retire the request in ``slot``; returns its final state row (a host copy, after every
        step queued so far).

        ``wait=False`` returns a :class:`PendingRow` at once instead: the row is copied
        (``cuMemcpyDtoHAsync``) into a pinned row of the pool behind the queued steps, and
        ``result()`` waits for that copy only (its event), not for the stream. The slot is free
        again at once; a later leave of the same slot first takes the earlier row out of the way.

        Raises
        ------
        SlotError
            ``slot`` is free or out of range.

        See Also
        --------
        cuMemcpyDtoHAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        with self._lock:
            self._check_open()
            if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or slot not in self._rows.pos:
                raise SlotError(f"slot {slot!r} holds no request")
            out: np.ndarray | PendingRow
            if wait:
                out = self._bufs.read_row(int(slot), self.stream)
            else:
                out = self._ring.pending(self, int(slot), self._bufs.row_ptr(int(slot)), self.stream)
            self._table_free()
            self._rows.retire(int(slot))
            return out

    # -- steps -------------------------------------------------------------------------------------
    def step(self) -> int:
        """One block step for every live request, results written back into their slots; returns
        the bucket that ran (0 when no request is live). Asynchronous on :attr:`stream`."""
        with self._lock:
            self._check_open()
            n = len(self._rows)
            if n == 0:
                return 0
            shaped = self._execs.shaped
            if shaped is not None:  # one exec shaped to n on the device: no bucket, no padding
                self._tables.send_shaped(n, self._rows.version, self.stream)
                shaped.run(n, self.stream)
                self.steps += 1
                return n
            b = pick_bucket(self.sizes, n)
            assert b is not None
            self._tables.send(b, self._rows.version, self.stream)
            self._execs.execs[b].launch(self.stream)
            self.steps += 1
            return b

    def read(self, slot: int) -> np.ndarray:
        """The current state row of a live slot (a host copy after the queued steps)."""
        with self._lock:
            self._check_open()
            if slot not in self._rows.pos:
                raise SlotError(f"slot {slot!r} holds no request")
            return self._bufs.read_row(int(slot), self.stream)

    def _check_open(self) -> None:
        if self._held.closed:
            raise ClosedError("SlotPool is closed")

    @property
    def closed(self) -> bool:
        return self._held.closed

    def close(self) -> None:
        """Destroy the device-shaped graph or the bucket execs, graphs and model views, then free
        the state, the bucket buffers, the tables and the event, the pinned leave rows, and the
        stream the pool made (in that order); safe twice. Rows of ``leave(wait=False)`` not yet
        taken are taken first (their ``result()`` still works)."""
        with self._lock:
            if self._held.closed:
                return
            self._ring.take_all()
            self._held.close()

    def __enter__(self) -> SlotPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
