"""Continuous batching: requests in fixed slots, one step of the block for every live request,
rows picked through an index table, with no recapture and no rebinding per step.

Each request's state row (the activation that feeds its next step) lives in one slot of a
``(max_slots + 1, width)`` state buffer, at a stable address; the extra last row is the scratch
slot that padding points at. A step runs the bucket graph for the live count ``n``: gather the
rows ``state[table[i]]`` into the bucket's input, the block, scatter the results back to
``state[table[i]]``. Padding entries of the table name the scratch slot, so padding never
touches a live row.

The table (int32, ``table[:n]`` the live slots, the rest the scratch slot) reaches the device one
of two ways (``table=``):

- ``"graph"`` (default): every bucket graph begins with a memcpy node that copies the table from
  pinned host memory (:class:`~rawgraph.memory.HostBuffer`); the host keeps the pinned table
  current as requests join and leave, and a step is one ``cuGraphLaunch``.
- ``"copy"``: one ``cuMemcpyHtoDAsync`` of the table before each launch (vLLM's way: copy the
  indices, then replay).

The host-memory rule: a replay reads the pinned table when it reaches its memcpy node, which may
be long after ``cuGraphLaunch`` returned. The table must not be rewritten before then. Each graph
records an event right after its memcpy node; :meth:`SlotPool.join` and :meth:`SlotPool.leave`
wait for the last step's event before they touch the table (in a loop that synchronizes each
step, it has always fired).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..capture import Capture
from ..errors import DTypeError, RawgraphError, ShapeError, call
from ..graph import Graph, GraphExec
from ..memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array
from ..model import TinyBlock, Workspace
from ..stream import Event, Stream, as_stream
from .sizes import check_sizes, pick_bucket, vllm_sizes

TABLE_MODES = ("graph", "copy")


class SlotError(RawgraphError, ValueError):
    """A slot operation that does not fit the pool's state (full, free, occupied, unknown)."""


class SlotPool:
    """``max_slots`` request slots over one model; :meth:`step` advances every live request.

    Parameters
    ----------
    model : TinyBlock
        Weights, form and PDL choice (shared, not copied).
    max_slots : int, default 256
    sizes : sequence of int, optional
        Bucket sizes (default the vLLM-style list up to ``max_slots``).
    table : {"graph", "copy"}
        How the index table reaches the device (module docstring).
    stream : stream-like, optional
        Where capture, joins, leaves and steps run (default: a new stream).

    Attributes
    ----------
    state : DeviceBuffer
        ``(max_slots + 1, width)``: slot ``i``'s row, then the scratch slot.
    setup : dict
        Seconds of ``capture``, ``instantiate``, ``upload``, ``warmup`` over all buckets.
    steps : int
    """

    def __init__(self, model: TinyBlock, max_slots: int = 256, sizes: Sequence[int] | None = None,
                 table: str = "graph", stream: Any = None):
        if table not in TABLE_MODES:
            raise ValueError(f"table must be one of {TABLE_MODES}, got {table!r}")
        model._check_open()
        if isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots < 1:
            raise ShapeError(f"max_slots must be a positive int, got {max_slots!r}")
        self.max_slots = max_slots
        self.sizes = check_sizes(vllm_sizes(max_slots) if sizes is None else sizes)
        if self.sizes[-1] < max_slots:
            raise ShapeError(f"the largest bucket ({self.sizes[-1]}) must hold max_slots = {max_slots}")
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
        self.x = DeviceBuffer((top, width), np.float32, self.device)
        self.y = DeviceBuffer((top, width), np.float32, self.device)
        self.arena = Workspace(top, width, self.device)
        self.table_dev = DeviceBuffer(top, np.int32, self.device)
        # The host table: pinned for the in-graph copy, pageable for the copy before launch (a
        # pageable cuMemcpyHtoDAsync has staged the bytes by the time it returns).
        self._pinned = HostBuffer(top, np.int32, self.device) if table == "graph" else None
        self.table = self._pinned.array if self._pinned is not None else np.empty(top, np.int32)
        self.table[:] = self.scratch_slot
        self._free = list(range(max_slots - 1, -1, -1))  # pop() gives the lowest free slot
        self._pos: dict[int, int] = {}  # live slot -> its position in table[:n]
        self._read = Event(timing=False, device=self.device)  # recorded after each replay read the table
        self._models: dict[int, TinyBlock] = {}
        self.graphs: dict[int, Graph] = {}
        self.execs: dict[int, GraphExec] = {}
        self.setup = {"warmup": 0.0, "capture": 0.0, "instantiate": 0.0, "upload": 0.0}
        f32 = np.dtype(np.float32)
        views = {"state": self.state.view(), "table": self.table_dev.view(),
                 "x": self.x.view(), "y": self.y.view()}
        clock = time.perf_counter
        self.table_dev.copy_from_host(self.table, s)
        for b in reversed(self.sizes):
            m = self._models[b] = model.with_batch(b, workspace=self.arena)
            plan = m.plan(DeviceArray(self.x.ptr, (b, width), f32, self.x), DeviceArray(self.y.ptr, (b, width), f32, self.y))
            gather = ops.gather_rows(self.device, views, "state", "table", "x", b, label=f"gather{b}")
            scatter = ops.scatter_rows(self.device, views, "y", "table", "state", b, label=f"scatter{b}")
            t0 = clock()
            for launch in (gather, *plan.launches, scatter):
                launch(s)
            s.synchronize()
            self.setup["warmup"] += clock() - t0
            t0 = clock()
            with Capture(s) as cap:
                if self._pinned is not None:
                    cap.memcpy_htod(self.table_dev.ptr, self._pinned.ptr, 4 * b)
                    cap.event_record(self._read)
                cap.launch(gather)
                cap.run(plan)
                cap.launch(scatter)
            graph = cap.captured
            graph.plan = plan
            self.setup["capture"] += clock() - t0
            t0 = clock()
            exe = graph.instantiate()
            self.setup["instantiate"] += clock() - t0
            t0 = clock()
            exe.upload(s)
            s.synchronize()
            self.setup["upload"] += clock() - t0
            self.graphs[b], self.execs[b] = graph, exe
        self.state.poison(s)
        self.steps = 0
        self._closed = False

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
            host = np.ascontiguousarray(row)
            if host.dtype != np.float32:
                raise DTypeError(f"row has dtype {host.dtype}, the block runs float32")
            if host.shape != (self.width,):
                raise ShapeError(f"row has shape {host.shape}, expected ({self.width},)")
            call(driver.cuMemcpyHtoDAsync, dst, host.ctypes.data, host.nbytes, self.stream.handle)
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
        if isinstance(row, np.ndarray):
            self.stream.synchronize()  # the host row may be freed once join returns
        return chosen

    def leave(self, slot: int) -> np.ndarray:
        """Retire the request in ``slot``; returns its final state row (a host copy, after every
        step queued so far).

        Raises
        ------
        SlotError
            ``slot`` is free or out of range.
        """
        self._check_open()
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or slot not in self._pos:
            raise SlotError(f"slot {slot!r} holds no request")
        out = np.empty(self.width, np.float32)
        call(driver.cuMemcpyDtoHAsync, out.ctypes.data, self.state.ptr + int(slot) * self.width * 4, out.nbytes,
             self.stream.handle)
        self.stream.synchronize()
        self._table_free()
        # swap-remove: the last live slot takes the leaver's place in the batch
        pos, last = self._pos.pop(int(slot)), len(self._pos)
        if pos != last:
            moved = int(self.table[last])
            self.table[pos] = moved
            self._pos[moved] = pos
        self.table[last] = self.scratch_slot
        self._free.append(int(slot))
        self._free.sort(reverse=True)
        return out

    # -- steps -------------------------------------------------------------------------------------
    def step(self) -> int:
        """One block step for every live request, results written back into their slots; returns
        the bucket that ran (0 when no request is live). Asynchronous on :attr:`stream`."""
        n = len(self._pos)
        if n == 0:
            return 0
        b = pick_bucket(self.sizes, n)
        assert b is not None
        if self._pinned is None:
            call(driver.cuMemcpyHtoDAsync, self.table_dev.ptr, self.table.ctypes.data, 4 * b, self.stream.handle)
        self.execs[b].launch(self.stream)
        self.steps += 1
        return b

    def read(self, slot: int) -> np.ndarray:
        """The current state row of a live slot (a host copy after the queued steps)."""
        if slot not in self._pos:
            raise SlotError(f"slot {slot!r} holds no request")
        out = np.empty(self.width, np.float32)
        call(driver.cuMemcpyDtoHAsync, out.ctypes.data, self.state.ptr + int(slot) * self.width * 4, out.nbytes,
             self.stream.handle)
        self.stream.synchronize()
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RawgraphError("SlotPool is closed")

    def close(self) -> None:
        """Destroy the graphs and free the state, tables and scratch; safe twice."""
        if self._closed:
            return
        self._closed = True
        for exe in self.execs.values():
            exe.close()
        for g in self.graphs.values():
            g.close()
        for m in self._models.values():
            m.close()
        for obj in (self.state, self.x, self.y, self.arena, self.table_dev, self._pinned, self._read):
            if obj is not None:
                obj.close()
        if self._own_stream:
            self.stream.close()

    def __enter__(self) -> "SlotPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

