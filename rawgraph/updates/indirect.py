"""The indirect launch path: kernels read their input and output pointers from a table.

A TinyBlock graph captured so that every kernel argument naming the block's input ``x`` or its
output ``out`` holds the address of an 8-byte slot instead, with the kernel's indirect flag set
(``kernels/rawgraph.cuh``: the kernel loads the real pointer from the slot with ``ld.global.cv``).
The slots are refreshed by the graph itself, so pointing a replay at new arrays costs the host two
stores into pinned memory: no copy of the data, no ``cuGraphExecKernelNodeSetParams``, no
re-capture. Two placements of the slots (``table=``):

- ``"device"`` (default): the slots live in device memory and the graph begins with a memcpy node
  that copies them from a pinned host table (:class:`~rawgraph.runtime.memory.HostBuffer`) at each replay;
- ``"mapped"``: the kernels read the pinned host table itself, over the bus
  (``cuMemHostGetDevicePointer``), and the graph has no extra node.

The host-memory rule: a replay reads the pinned table when it gets there (at its memcpy node, or
in its kernels for ``"mapped"``), which may be long after ``cuGraphLaunch`` returned, so the table
must not be rewritten before then. Each graph records an event once it has read the table (after
the memcpy node; after the last kernel for ``"mapped"``); :meth:`IndirectGraph.apply` waits for the
last replay's event before it stores (in a loop that synchronizes each step it has always fired,
and the check is one ``cuEventQuery``).
"""

from __future__ import annotations

import ctypes
import threading
import warnings
import weakref
from typing import Any

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..graphs.capture import Capture
from ..graphs.graph import Graph, GraphExec
from ..runtime import resource as _resource
from ..runtime.device import Device
from ..runtime.errors import ClosedError, LayoutError, ReleaseWarning, call
from ..runtime.launch import LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, HostBuffer, as_device_array, check_array
from ..runtime.stream import Event, as_stream
from .shadow import ExecShadow
from .validate import BaseBinding

TABLE_PLACES = ("device", "mapped")
SLOTS = ("x", "out")  # slot i of the table holds the pointer of SLOTS[i]


def make_indirect(plan: LaunchPlan, slots: dict[str, int]) -> int:
    """Point every argument that names a buffer in ``slots`` at that buffer's slot (in place).

    ``slots``: buffer name -> address of the 8-byte slot that will hold its pointer. Each such
    argument gets its kernel's indirect flag (``ops.INDIRECT_FLAGS``). Returns how many arguments
    were rewritten. Refuses (``LayoutError``, nothing changed) a plan whose kernels cannot read
    one of those arguments indirectly, e.g. the unfused form's elementwise ``add``.
    """
    todo = []
    for launch in plan.launches:
        names = launch.args.names()
        for arg, use in launch.uses.items():
            if use.buffer not in slots:
                continue
            if "flags" not in names or arg not in ops.INDIRECT_FLAGS:
                raise LayoutError(
                    f"kernel {launch.label!r} cannot read its argument {arg!r} ({use.buffer}) through a "
                    "pointer slot: only the matmul and block kernels can (forms fused and block)"
                )
            todo.append((launch, arg, use.buffer))
    for launch, arg, buffer in todo:
        launch.args[arg] = slots[buffer]
        launch.args["flags"] = int(launch.args["flags"]) | ops.INDIRECT_FLAGS[arg]
    return len(todo)


class IndirectBinding(BaseBinding):
    """An (x, out) pair validated once by :meth:`IndirectGraph.prepare`; it holds both arrays
    (``arrays``, its ``holds``) and is applied while both are open (the binding family's one
    liveness rule, :class:`~rawgraph.updates.validate.BaseBinding`)."""

    __slots__ = ("ptrs",)

    ptrs: tuple[int, int]  # the (x, out) addresses the table gets

    def __init__(self, graph: IndirectGraph, ptrs: tuple[int, int], arrays: tuple[Any, Any]):
        super().__init__(graph, arrays)
        self.ptrs = ptrs

    @property
    def graph(self) -> IndirectGraph:
        graph: IndirectGraph = self.owner
        return graph

    @property
    def arrays(self) -> tuple[Any, ...]:
        return self.holds

    @property
    def owners(self) -> tuple[weakref.finalize[..., Any] | None, ...]:
        """Finalizers of the DeviceBuffers among the arrays."""
        return self.alive


class IndirectGraph:
    """A TinyBlock graph whose kernels find ``x`` and ``out`` through a pointer table.

    Parameters
    ----------
    model : row-wise model
        One whose kernels take rawgraph's indirect flags (``kernels/rawgraph.cuh``): a
        :class:`~rawgraph.TinyBlock` of form ``fused`` or ``block``.
    x, out : array-like
        The first input and output, ``(batch, width)`` float32 on the model's device, 16-byte
        aligned (the kernels' vector loads were chosen for aligned operands).
    stream : stream-like
        Where it captures, warms up and uploads.
    table : {"device", "mapped"}
        Where the kernels read the slots (module docstring).

    Attributes
    ----------
    graph : Graph
    exec : GraphExec

    Notes
    -----
    State: 19 instance attributes: the model, plan, graph and exec it built; the pointer table on
    the device and its host copy, the views and shapes it checks a bind against, the arrays bound now
    and the keep-alive over replays that read them, the lock and the launch record. What needs
    releasing is released in one place, :meth:`close`, after the queued replays.
    """

    model: Any  # a row-wise model (rawgraph.serving.protocol)
    table_place: str
    device: Device

    def __init__(self, model: Any, x: Any, out: Any, stream: Any, table: str = "device"):
        if table not in TABLE_PLACES:
            raise ValueError(f"table must be one of {TABLE_PLACES}, got {table!r}")
        self.model, self.table_place = model, table
        self.device = model.device
        s = as_stream(stream)
        self._shape = (model.batch, model.width)
        xa, oa = self._check("x", x), self._check("out", out)
        self._check_overlap(xa.ptr, oa.ptr)
        self._host = HostBuffer(len(SLOTS), np.uint64, self.device)
        self._table = self._host.array
        self._table[:] = (xa.ptr, oa.ptr)
        self._views = [ctypes.c_uint64.from_address(self._host.ptr + 8 * i) for i in range(len(SLOTS))]
        self._dev: DeviceBuffer | None = None
        if table == "device":
            self._dev = DeviceBuffer((len(SLOTS),), np.uint64, device=self.device)
            self._dev.copy_from_host(self._table, s)
            base = self._dev.ptr
        else:
            base = int(call(driver.cuMemHostGetDevicePointer, self._host.ptr, 0))
        plan = model.plan(xa, oa)
        make_indirect(plan, {name: base + 8 * i for i, name in enumerate(SLOTS)})
        self.plan = plan
        self._read = Event(timing=False, device=self.device)  # recorded once a replay has read the table
        plan.run(s)  # eager warm-up through the slots (loads the kernels outside the capture)
        s.synchronize()
        with Capture(s) as cap:
            if self._dev is not None:
                cap.memcpy_htod(self._dev.ptr, self._host.ptr, self._host.nbytes)
                cap.event_record(self._read)
            cap.run(plan)
            if self._dev is None:
                cap.event_record(self._read)
        self.graph: Graph = cap.captured
        self.graph.plan = plan
        self.exec: GraphExec = self.graph.instantiate()
        self.exec.upload(s)
        s.synchronize()
        self._bound: tuple[Any, Any] = (x, out)
        # The exec's shadow (rawgraph.updates.shadow) for its keep-alive: replaced pairs a queued
        # replay may still read, held until the streams the exec was launched on (exec.streams,
        # whoever launched) have run past those replays. No node is pushed: the table moves.
        self._shadow = ExecShadow(self.exec, self.device, batch=64)
        self._keep = self._shadow.keep
        self._launched = False
        self._closed = False
        self._checked_at = -1
        self._lock = threading.Lock()  # apply: the wait, the two stores and the keep-alive together

    # -- binding ---------------------------------------------------------------------------------
    def _check(self, name: str, array: Any) -> DeviceArray:
        view = check_array(as_device_array(array, name), self._shape, np.float32, name, self.device)
        if view.ptr % 16:
            raise LayoutError(
                f"{name} must be 16-byte aligned for the indirect kernels' vector loads (address {view.ptr:#x})"
            )
        return view

    def _check_overlap(self, xp: int, op: int) -> None:
        nbytes = self._shape[0] * self._shape[1] * 4
        if xp < op + nbytes and op < xp + nbytes:
            raise LayoutError("out (written) overlaps x (read)")

    def prepare(self, x: Any, out: Any) -> IndirectBinding:
        """Validate an (x, out) pair once (shape, dtype, device, alignment, no overlap)."""
        self._check_usable()
        xa, oa = self._check("x", x), self._check("out", out)
        self._check_overlap(xa.ptr, oa.ptr)
        return IndirectBinding(self, (xa.ptr, oa.ptr), (x, out))

    def apply(self, binding: IndirectBinding) -> None:
        """Point the next replays at a prepared pair: two stores into the pinned table, once the
        last replay has read it (``cuEventQuery``, ``cuEventSynchronize`` if it has not).

        See Also
        --------
        cuEventQuery, cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        if binding.owner is not self:
            raise ValueError("this binding was prepared by another IndirectGraph")
        if self._closed or binding.checked_at != _resource.release_count:
            self._check_usable()
            if not binding.is_open():
                raise ClosedError("an array of this binding was closed after it was prepared")
        with self._lock:
            if self._closed:
                raise ClosedError("IndirectGraph is closed")
            if self._launched and not self._read.query():
                self._read.synchronize()  # the host-memory rule: a queued replay has not read it yet
            vx, vo = self._views
            vx.value, vo.value = binding.ptrs
            if self._bound is not binding.holds:
                # The table holds the new pair now: say so before retiring the old one, which
                # may fail (a fence not recorded) and keeps it held either way.
                old, self._bound = self._bound, binding.holds
                self._keep.retire(old)

    def bind(self, x: Any, out: Any) -> None:
        """:meth:`prepare` + :meth:`apply` in one call (validates every time)."""
        self.apply(self.prepare(x, out))

    @property
    def retained(self) -> list[Any]:
        """Replaced (x, out) pairs held for replays that may still read them."""
        return self._keep.retained

    # -- replay ----------------------------------------------------------------------------------
    def launch(self, stream: Any) -> None:
        """Replay (``cuGraphLaunch``) with the pair applied last.

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if self._closed or self._checked_at != _resource.release_count:
            self._check_usable()
            self._checked_at = _resource.release_count
        self.exec.launch(stream)  # notes the stream in exec.streams
        self._launched = True

    replay = launch

    @property
    def bound(self) -> tuple[Any, Any]:
        """The (x, out) objects the next replay reads and writes."""
        return self._bound

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("IndirectGraph is closed")
        if self.exec.closed or self.graph.closed:
            raise ClosedError("the graph or exec of this IndirectGraph is closed")

    def close(self) -> None:
        """Wait for queued replays (every stream the exec was launched on, a closed one through its
        tail event), then release the exec, graph, tables and event; safe twice.

        Never stops half-way: if a wait fails, the failure is reported as a
        :class:`~rawgraph.runtime.errors.ReleaseWarning` and everything is still released."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._launched:
            try:
                self.exec.streams.synchronize()
            except Exception as exc:
                warnings.warn(
                    f"rawgraph: IndirectGraph.close: waiting for queued replays failed ({exc})",
                    ReleaseWarning,
                    stacklevel=2,
                )
        self._keep.close()
        for obj in (self.exec, self.graph, self._read, self._dev, self._host):
            if obj is not None:
                obj.close()

    def __enter__(self) -> IndirectGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
