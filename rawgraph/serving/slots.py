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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

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
from .lifecycle import WarmUp, close_all, instantiate_uploaded
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


def _unsend(log: tuple) -> None:
    """Undo of a refused table push: each node's by-value table gets what it held back."""
    tables, olds = log
    for t, old in zip(tables, olds):
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
            ev = self._pool._ring_events[self._slot]
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
        pool, slot = self._pool, self._slot
        ev, ring = pool._ring_events[slot], pool._ring
        assert ev is not None and ring is not None
        ev.synchronize()
        self._row = ring.array[slot].copy()
        if pool._ring_owner[slot] is self:
            pool._ring_owner[slot] = None


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
    """

    sizes: list[int]
    width: int
    stream: Stream
    state: DeviceBuffer
    x: DeviceBuffer | None
    y: DeviceBuffer | None
    arena: Any | None
    table_dev: DeviceBuffer
    setup: dict[str, float]
    warm_up: WarmUp
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
        if shape not in ("buckets", "device"):
            raise ValueError(f"shape must be 'buckets' or 'device', got {shape!r}")
        if (bands is not None or select is not None) and shape != "device":
            raise ValueError("bands and select are the device-shaped graph's: they need shape='device'")
        if select not in (None, "updates", "switch"):
            raise ValueError(f"select must be 'updates' or 'switch', got {select!r}")
        # a SWITCH band reads table entries up to its top, past the live count: copy them all
        self._copy_whole_table = select == "switch"
        if shape == "device":
            if table not in (None, "copy") or gather not in (None, "kernels"):
                raise LayoutError(
                    "shape='device' runs one exec whose gather and scatter kernels read a device "
                    "table copied before each step: use table='copy', gather='kernels'"
                )
            table, gather = "copy", "kernels"
            sizes = [max_slots] if sizes is None else sizes  # one exec of max_slots rows (checked below)
        table = "graph" if table is None else table
        self.shape = shape
        self._shaped: Any = None
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
        self.max_slots = max_slots
        if bands is not None and not (isinstance(bands, str) and bands == "plans"):
            bands = check_bands(bands, max_slots)  # before anything is allocated
        self.sizes = check_sizes(vllm_sizes(max_slots) if sizes is None else sizes)
        if self.sizes[-1] < max_slots:
            raise ShapeError(f"the largest bucket ({self.sizes[-1]}) must hold max_slots = {max_slots}")
        if table == "params":
            ops.row_param_cap(self.sizes[-1])  # refuses buckets over the by-value capacity
        self.mode = table
        self.width = width = model.width
        self.device = model.device
        self._own_stream = stream is None
        self.stream = Stream(device=self.device) if stream is None else as_stream(stream)
        s = self.stream
        self.scratch_slot = max_slots
        self.state = DeviceBuffer((max_slots + 1, width), np.float32, self.device)
        self.state.poison(s)
        top = self.sizes[-1]
        # shape="device": the device-shaped graph holds its own input, output and workspace
        bucketed = shape != "device"
        self.x = DeviceBuffer((top, width), np.float32, self.device) if bucketed else None
        self.y = DeviceBuffer((top, width), np.float32, self.device) if bucketed else None
        self.arena = model.make_workspace(top) if bucketed else None
        self.table_dev = DeviceBuffer(top, np.int32, self.device)
        # The host table: pinned for the in-graph copy, pageable for the copy before launch (a
        # pageable cuMemcpyHtoDAsync has staged the bytes by the time it returns).
        self._pinned = HostBuffer(top, np.int32, self.device) if table == "graph" else None
        self.table = self._pinned.array if self._pinned is not None else np.empty(top, np.int32)
        self.table[:] = self.scratch_slot
        self._free = list(range(max_slots - 1, -1, -1))  # pop() gives the lowest free slot
        self._pos: dict[int, int] = {}  # live slot -> its position in table[:n]
        self._read = Event(timing=False, device=self.device)  # recorded after each replay read the table
        # leave(wait=False): one pinned row per slot, the event after its copy, the PendingRow
        # that still needs it (made at the first such leave)
        self._ring: HostBuffer | None = None
        self._ring_events: list[Event | None] = []
        self._ring_owner: list[PendingRow | None] = []
        self._models: dict[int, Any] = {}
        self.graphs: dict[int, Graph] = {}
        self.execs: dict[int, GraphExec] = {}
        self.setup = {"warmup": 0.0, "capture": 0.0, "instantiate": 0.0, "upload": 0.0}
        self.warm_up = WarmUp(self.setup)
        f32 = np.dtype(np.float32)
        views = {"state": self.state.view(), "table": self.table_dev.view()}
        if self.x is not None and self.y is not None:
            views.update(x=self.x.view(), y=self.y.view())
        clock = time.perf_counter
        self.table_dev.copy_from_host(self.table, s)
        # "params": per bucket, the shadow of its exec (rawgraph.updates.shadow) holding its gather
        # and scatter nodes, and their persistent by-value tables (what the shadow's
        # CUDA_KERNEL_NODE_PARAMS point at)
        self._pushes: dict[int, tuple[ExecShadow, list[np.ndarray]]] = {}
        self._version = 0  # bumped by every join and leave: which table a bucket last received
        self._sent: dict[int, int] = {}
        self._edges: dict[int, list[Any]] = {}
        self._closed = False  # close() may run on a half-built pool (below)
        try:
            if shape == "device":
                t0 = clock()
                self._shaped = DeviceShapedGraph(
                    _SlotRows(model, views["state"], views["table"]),
                    max_slots,
                    s,
                    bands=bands,
                    select=select or "updates",
                )
                self.setup["capture"] += clock() - t0
                self._sent[max_slots] = 0
            for b in reversed(self.sizes) if bucketed else ():
                x, y = self.x, self.y
                assert x is not None and y is not None  # bucketed
                m = self._models[b] = model.with_batch(b, workspace=self.arena)
                plan = m.plan(DeviceArray(x.ptr, (b, width), f32, x), DeviceArray(y.ptr, (b, width), f32, y))
                if gather is None:
                    # The largest bucket's plan decides: fused where every kernel touching x and out
                    # picks its rows through a table (rawgraph's matmuls), else gather kernels.
                    gather = "fused" if table != "params" and width % 4 == 0 and _routable(plan) else "kernels"
                edges: list[Any] = []  # the gather and scatter launches, when not fused
                if gather == "fused" and not _routable(plan):
                    raise LayoutError(
                        f"gather='fused' needs every kernel that reads x or writes out to take the row "
                        f"table (TinyBlock's fused form); {model!r} has others: use gather='kernels'"
                    )
                if gather == "fused":
                    _route_rows(plan, self.table_dev.ptr, self.state.ptr)
                elif table == "params":
                    edges = [
                        ops.gather_rows_param(self.device, views, "state", "x", b, label=f"gather{b}"),
                        ops.scatter_rows_param(self.device, views, "y", "state", b, label=f"scatter{b}"),
                    ]
                    for launch in edges:
                        launch.args.array("table")[:] = self.scratch_slot
                else:
                    edges = [
                        ops.gather_rows(self.device, views, "state", "table", "x", b, label=f"gather{b}"),
                        ops.scatter_rows(self.device, views, "y", "table", "state", b, label=f"scatter{b}"),
                    ]
                self._edges[b] = edges  # the pool owns their argument buffers (the by-value tables)
                self.warm_up((*edges[:1], *plan.launches, *edges[1:]), s)
                t0 = clock()
                with Capture(s) as cap:
                    if self._pinned is not None:
                        cap.memcpy_htod(self.table_dev.ptr, self._pinned.ptr, 4 * b)
                        cap.event_record(self._read)
                    nodes = [cap.launch(edges[0])] if edges else []
                    cap.run(plan)
                    if edges:
                        nodes.append(cap.launch(edges[1]))
                graph = cap.captured
                graph.plan = plan
                self.setup["capture"] += clock() - t0
                exe = instantiate_uploaded(graph, s, self.setup)
                self.graphs[b], self.execs[b] = graph, exe
                if table == "params":
                    shadow = ExecShadow(exe, self.device)
                    for node in nodes:
                        shadow.add(node.handle, node.launch.node_params(), node.launch.label)
                    self._pushes[b] = (shadow, [node.launch.args.array("table") for node in nodes])
                self._sent[b] = 0
        except BaseException:
            self.close()  # what was made so far: nothing stays allocated after a refusal
            raise
        self.gather = gather
        self.state.poison(s)
        self.steps = 0

    # -- requests --------------------------------------------------------------------------------
    @property
    def live(self) -> list[int]:
        """Live slots in batch order (``table[:n]``)."""
        return [int(v) for v in self.table[: len(self._pos)]]

    def __len__(self) -> int:
        return len(self._pos)

    def _table_free(self) -> None:
        """The host-memory rule: wait until the last step's replay has read the pinned table."""
        if self._pinned is not None and self.steps and not self._read.query():
            self._read.synchronize()

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
            if slot is None:
                if not self._free:
                    raise SlotError(f"the pool is full ({self.max_slots} slots)")
                chosen = self._free[-1]
            else:
                if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.max_slots:
                    raise SlotError(f"slot {slot!r} is not in 0..{self.max_slots - 1}")
                if slot in self._pos:
                    raise SlotError(f"slot {slot} is occupied")
                chosen = int(slot)
            dst = self.state.ptr + chosen * self.width * 4
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
                call(driver.cuMemcpyHtoDAsync, dst, staged.ctypes.data, staged.nbytes, self.stream.handle)
            else:
                dev = as_device_array(row, "row")
                if dev.dtype != np.float32:
                    raise DTypeError(f"row has dtype {dev.dtype}, the block runs float32")
                if dev.size != self.width:
                    raise ShapeError(f"row has shape {dev.shape}, expected {self.width} values")
                call(driver.cuMemcpyDtoDAsync, dst, dev.ptr, dev.nbytes, self.stream.handle)
            self._table_free()
            self._free.remove(chosen)
            n = len(self._pos)
            self.table[n] = chosen
            self._pos[chosen] = n
            self._version += 1
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
            if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or slot not in self._pos:
                raise SlotError(f"slot {slot!r} holds no request")
            src = self.state.ptr + int(slot) * self.width * 4
            out: np.ndarray | PendingRow
            if wait:
                host = np.empty(self.width, np.float32)
                call(driver.cuMemcpyDtoHAsync, host.ctypes.data, src, self.width * 4, self.stream.handle)
                self.stream.synchronize()
                out = host
            else:
                out = self._leave_pending(int(slot), src)
            self._table_free()
            # swap-remove: the last live slot takes the leaver's place in the batch
            pos, last = self._pos.pop(int(slot)), len(self._pos)
            if pos != last:
                moved = int(self.table[last])
                self.table[pos] = moved
                self._pos[moved] = pos
            self.table[last] = self.scratch_slot
            self._version += 1
            self._free.append(int(slot))
            self._free.sort(reverse=True)
            return out

    # -- steps -------------------------------------------------------------------------------------
    def step(self) -> int:
        """One block step for every live request, results written back into their slots; returns
        the bucket that ran (0 when no request is live). Asynchronous on :attr:`stream`."""
        with self._lock:
            self._check_open()
            n = len(self._pos)
            if n == 0:
                return 0
            if self._shaped is not None:  # one exec shaped to n on the device: no bucket, no padding
                if self._sent[self.max_slots] != self._version:
                    rows = self.max_slots if self._copy_whole_table else n
                    call(
                        driver.cuMemcpyHtoDAsync,
                        self.table_dev.ptr,
                        self.table.ctypes.data,
                        4 * rows,
                        self.stream.handle,
                    )
                    self._sent[self.max_slots] = self._version
                self._shaped.run(n, self.stream)
                self.steps += 1
                return n
            b = pick_bucket(self.sizes, n)
            assert b is not None
            if self._pinned is None and self._sent[b] != self._version:
                if self._pushes:
                    shadow, tables = self._pushes[b]
                    olds = [t[:b].copy() for t in tables]
                    for t in tables:
                        t[:b] = self.table[:b]
                    # a refused push puts the old tables back in both nodes (_unsend)
                    shadow.push(range(len(tables)), _unsend, (tables, olds))
                    self._sent[b] = self._version
                else:  # one device table serves every bucket
                    call(
                        driver.cuMemcpyHtoDAsync, self.table_dev.ptr, self.table.ctypes.data, 4 * b, self.stream.handle
                    )
                    for k in self._sent:
                        self._sent[k] = self._version if k <= b else -1
            self.execs[b].launch(self.stream)
            self.steps += 1
            return b

    def read(self, slot: int) -> np.ndarray:
        """The current state row of a live slot (a host copy after the queued steps)."""
        with self._lock:
            self._check_open()
            if slot not in self._pos:
                raise SlotError(f"slot {slot!r} holds no request")
            out = np.empty(self.width, np.float32)
            call(
                driver.cuMemcpyDtoHAsync,
                out.ctypes.data,
                self.state.ptr + int(slot) * self.width * 4,
                out.nbytes,
                self.stream.handle,
            )
            self.stream.synchronize()
            return out

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("SlotPool is closed")

    def _leave_pending(self, slot: int, src: int) -> PendingRow:
        if self._ring is None:
            self._ring = HostBuffer((self.max_slots, self.width), np.float32, self.device)
            self._ring_events = [None] * self.max_slots
            self._ring_owner = [None] * self.max_slots
        earlier = self._ring_owner[slot]
        if earlier is not None:
            earlier._take()  # its copy is older than anything queued since: only that one is waited for
        event = self._ring_events[slot]
        if event is None:
            event = self._ring_events[slot] = Event(timing=False, device=self.device)
        call(driver.cuMemcpyDtoHAsync, self._ring.ptr + slot * self.width * 4, src, self.width * 4, self.stream.handle)
        event.record(self.stream)
        row = self._ring_owner[slot] = PendingRow(self, slot)
        return row

    def close(self) -> None:
        """Destroy the graphs and free the state, tables and scratch; safe twice. Rows of
        ``leave(wait=False)`` not yet taken are taken first (their ``result()`` still works)."""
        with self._lock:
            if self._closed:
                return
            for row in self._ring_owner:
                if row is not None:
                    row._take()
            self._closed = True
            close_all(
                (self._shaped,),
                self.execs.values(),
                self.graphs.values(),
                self._models.values(),
                (self.state, self.x, self.y, self.arena, self.table_dev, self._pinned, self._read),
                [e for e in self._ring_events if e is not None],
                (self._ring,) if self._ring is not None else (),
            )
            if self._own_stream:
                self.stream.close()

    def __enter__(self) -> SlotPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
