"""Device activity for a trace: CUPTI's activity API (through NVIDIA's ``cupti-python``), or CUDA
events around each step where CUPTI is not available.

CUPTI
-----
``cupti.activity_enable`` for ``CONCURRENT_KERNEL``, ``MEMCPY``, ``MEMSET`` and
``EXTERNAL_CORRELATION``; CUPTI hands filled buffers to the callback registered with
``cupti.activity_register_callbacks`` (on a thread of its own, when a buffer fills or at
``cupti.activity_flush_all``), and each record is copied out there (the buffer is reused after the
callback returns). Joins:

- *host call -> device work*: around each traced driver call the wrapper pushes the host span's id
  as an external correlation id (``cupti.activity_push_external_correlation_id`` with
  ``ExternalCorrelationKind.CUSTOM0``) and pops it after; CUPTI answers with one
  ``EXTERNAL_CORRELATION`` record pairing it with the call's ``correlationId``, the id every kernel,
  copy and memset that call launched carries (all the nodes of one ``cuGraphLaunch`` share it).
- *device span -> graph node*: a kernel of a graph launch carries ``graphId`` and ``graphNodeId``,
  the ids of the *exec*'s node. ``cuGraphInstantiate`` clones every node, and CUPTI's resource
  callback ``GRAPHNODE_CLONED`` (subscribed while the tracer is active, ``cupti.subscribe``) names
  the clone and the node it was cloned from; so a node id is mapped back to the node of the graph
  the exec came from (``cupti.get_graph_node_id`` of its ``CUgraphNode``), which is what rawgraph's
  node map holds. An exec instantiated before the tracer started keeps its own node ids.

Clocks: CUPTI's timestamps are its own nanoseconds (``cupti.get_timestamp``). The offset to
``time.perf_counter_ns`` is read as the middle of the tightest of a few ``perf_counter_ns``,
``get_timestamp``, ``perf_counter_ns`` brackets, at the start and at the end; device times are
converted with the mean of the two offsets, and their difference (the drift over the trace) is
kept in the metadata. The error is at most half the tightest bracket, about a microsecond.

CUDA events (the fallback)
--------------------------
Without CUPTI a step is timed by two events recorded around it on its stream (``cuEventRecord``),
placed on the host clock through a reference event recorded on that stream right after a
``cuStreamSynchronize`` at the stream's first step (the event's device time is then the host time
of its record, within the launch latency). One device span per step, no per-kernel rows; the
trace's metadata says ``"device_source": "events"``. A step on a capturing stream gets no events
(they would become nodes of the graph).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver

from ..runtime.errors import RawgraphError
from .records import DeviceSpan

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_BUFFER_BYTES = 8 << 20


class TraceError(RawgraphError):
    """A tracer was used wrongly, or the device source asked for is not available."""


def load_cupti() -> tuple[Any, str]:
    """``(cupti module, "")``, or ``(None, why not)``: ``cupti-python`` missing, or its library
    failing to load (it is imported only here, when a tracer starts)."""
    try:
        from cupti import cupti
    except ImportError as exc:
        return None, f"cupti-python is not installed ({exc}); pip install 'rawgraph[trace]'"
    except Exception as exc:  # the wheel is there but libcupti is not loadable
        return None, f"cupti-python failed to load: {type(exc).__name__}: {exc}"
    return cupti, ""


@dataclass
class Clock:
    """The offset from a device clock to ``time.perf_counter_ns`` (device ns - host ns)."""

    start: int = 0
    end: int = 0
    bracket_ns: int = 0

    @property
    def offset(self) -> int:
        return (self.start + self.end) // 2

    @staticmethod
    def sample(now: Callable[[], int], tries: int = 7) -> tuple[int, int]:
        """``(offset, bracket width)`` of the tightest of ``tries`` host-device-host readings."""
        best = (0, 1 << 62)
        clock = time.perf_counter_ns
        for _ in range(tries):
            a = clock()
            d = now()
            b = clock()
            if b - a < best[1]:
                best = (d - (a + b) // 2, b - a)
        return best


# cupti.activity_register_callbacks is process-wide and registered once; the buffers go to the
# collector active at the time (one tracer at a time), else nowhere.
_sink: list[Callable[[list[Any]], None]] = []
_registered = False


def _buffer_requested() -> tuple[int, int]:
    return _BUFFER_BYTES, 0  # 0: as many records as fit


def _buffer_completed(activities: list[Any]) -> None:
    if _sink:
        _sink[0](activities)


@dataclass(frozen=True)
class _Raw:
    """The fields of one CUPTI kernel, memcpy or memset record, copied out of CUPTI's buffer, on
    CUPTI's clock."""

    kind: str
    name: str
    start: int
    end: int
    device: int
    stream: int
    correlation: int
    graph_id: int
    graph_node_id: int
    args: dict[str, Any]

    @classmethod
    def of(cls, kind: str, name: str, r: Any, args: dict[str, Any]) -> _Raw:
        """The fields of CUPTI record ``r``."""
        return cls(
            kind,
            str(name),
            int(r.start),
            int(r.end),
            int(r.device_id),
            int(r.stream_id),
            int(r.correlation_id),
            int(r.graph_id),
            int(r.graph_node_id),
            args,
        )


@dataclass
class CuptiCollector:
    """CUPTI's activity records of one tracer (see the module docstring)."""

    cupti: Any
    source: str = "cupti"
    records: list[DeviceSpan] = field(default_factory=list)
    correlations: dict[int, int] = field(default_factory=dict)  # host span id -> correlationId
    clones: dict[int, int] = field(default_factory=dict)  # exec node id -> node id it was cloned from
    clock: Clock = field(default_factory=Clock)
    notes: list[str] = field(default_factory=list)
    _raw: list[_Raw] = field(default_factory=list)
    _subscriber: Any = None
    _kinds: list[Any] = field(default_factory=list)

    def start(self) -> None:
        """Enable the activity kinds, subscribe to graph-node clones, read the clock."""
        global _registered
        c = self.cupti
        K = c.ActivityKind
        _sink[:] = [self._completed]
        if not _registered:
            c.activity_register_callbacks(_buffer_requested, _buffer_completed)
            _registered = True
        try:
            for kind in (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.EXTERNAL_CORRELATION):
                c.activity_enable(kind)
                self._kinds.append(kind)
        except Exception:
            self.stop()
            raise
        try:
            self._subscriber = c.subscribe(self._resource, None)
            c.enable_callback(1, self._subscriber, c.CallbackDomain.RESOURCE, c.CallbackIdResource.GRAPHNODE_CLONED)
        except Exception as exc:  # another subscriber (a profiler) holds CUPTI's one callback slot
            self._subscriber = None
            self.notes.append(
                f"graph nodes not mapped to the graph they were instantiated from (cupti.subscribe: {exc}); "
                "device spans carry the exec's node ids"
            )
        self.clock.start, self.clock.bracket_ns = Clock.sample(c.get_timestamp)

    def around(self, span_id: int) -> Callable[[], None]:
        """Push ``span_id`` as the external correlation id of the driver call about to be made;
        returns the pop."""
        c = self.cupti
        kind = c.ExternalCorrelationKind.CUSTOM0
        c.activity_push_external_correlation_id(kind, span_id)
        return lambda: c.activity_pop_external_correlation_id(kind)

    def stop(self) -> None:
        """Flush every buffer (``cupti.activity_flush_all(1)``, forced), disable the kinds,
        unsubscribe, read the clock again, and convert the records."""
        c = self.cupti
        try:
            if self._kinds:
                c.activity_flush_all(1)
        finally:
            for kind in self._kinds:
                c.activity_disable(kind)
            self._kinds.clear()
            if self._subscriber is not None:
                c.unsubscribe(self._subscriber)
                self._subscriber = None
            _sink.clear()
        self.clock.end, bracket = Clock.sample(c.get_timestamp)
        self.clock.bracket_ns = max(self.clock.bracket_ns, bracket)
        self._convert()

    def _resource(self, _userdata: Any, domain: Any, cbid: Any, data: Any) -> None:
        # CUPTI's resource callback (instantiation's thread): a node cloned into an exec.
        c = self.cupti
        try:
            if int(cbid) != int(c.CallbackIdResource.GRAPHNODE_CLONED):
                return
            if isinstance(data, int):  # a pointer to the CUpti_ResourceData, not its wrapper
                data = c.ResourceData.from_ptr(data)
            graph = c.GraphData.from_ptr(int(data.resource_descriptor))
            self.clones[int(c.get_graph_node_id(graph.node))] = int(c.get_graph_node_id(graph.original_node))
        except Exception as exc:  # never raise into the driver's call
            if len(self.notes) < 8:
                self.notes.append(f"GRAPHNODE_CLONED callback: {type(exc).__name__}: {exc}")

    def _completed(self, activities: list[Any]) -> None:
        # CUPTI's thread: copy each record's fields now (the buffer is reused after this returns).
        K = self.cupti.ActivityKind
        kernel = (int(K.CONCURRENT_KERNEL), int(K.KERNEL))
        for a in activities:
            kind = int(a.kind)
            if kind in kernel:
                args = {
                    "grid": [a.grid_x, a.grid_y, a.grid_z],
                    "block": [a.block_x, a.block_y, a.block_z],
                    "registers": a.registers_per_thread,
                    "smem": a.static_shared_memory + a.dynamic_shared_memory,
                }
                self._raw.append(_Raw.of("kernel", a.name, a, args))
            elif kind == int(K.MEMCPY):
                name = f"memcpy {self.cupti.ActivityMemcpyKind(a.copy_kind).name}"
                self._raw.append(_Raw.of("memcpy", name, a, {"bytes": a.bytes}))
            elif kind == int(K.MEMSET):
                self._raw.append(_Raw.of("memset", "memset", a, {"bytes": a.bytes, "value": a.value}))
            elif kind == int(K.EXTERNAL_CORRELATION):
                if int(a.external_kind) == int(self.cupti.ExternalCorrelationKind.CUSTOM0):
                    self.correlations[int(a.external_id)] = int(a.correlation_id)

    def _convert(self) -> None:
        off = self.clock.offset
        for r in self._raw:
            node = self.clones.get(r.graph_node_id, r.graph_node_id)
            self.records.append(
                DeviceSpan(
                    r.kind,
                    r.name,
                    r.start - off,
                    r.end - off,
                    r.device,
                    r.stream,
                    r.correlation,
                    r.graph_id,
                    r.graph_node_id,
                    node,
                    r.args,
                )
            )
        self._raw.clear()

    def node_id(self, handle: Any) -> int:
        """CUPTI's id of a ``CUgraphNode`` (``cupti.get_graph_node_id``)."""
        return int(self.cupti.get_graph_node_id(int(handle)))

    def metadata(self) -> dict[str, Any]:
        return {
            "clock": "CUPTI timestamps shifted onto time.perf_counter_ns",
            "clock_offset_ns": self.clock.offset,
            "clock_drift_ns": self.clock.end - self.clock.start,
            "clock_bracket_ns": self.clock.bracket_ns,
            "clone_map_entries": len(self.clones),
        }


@dataclass
class _Step:
    stream: int
    start: Any
    name: str
    index: int
    end: Any = None


@dataclass
class EventCollector:
    """CUDA events around each step (see the module docstring).

    Parameters
    ----------
    real : callable
        ``real(name)`` is the driver function under the tracer's wrappers, so the collector's own
        calls stay out of the trace.
    """

    real: Callable[[str], Any]
    source: str = "events"
    records: list[DeviceSpan] = field(default_factory=list)
    correlations: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _refs: dict[int, tuple[Any, int]] = field(default_factory=dict)  # stream -> (reference event, host ns)
    _steps: list[_Step] = field(default_factory=list)
    _events: list[Any] = field(default_factory=list)

    def start(self) -> None:
        """Nothing to start: events are made at each step."""

    def _call(self, name: str, *args: Any) -> Any:
        result = self.real(name)(*args)
        if result[0] != _SUCCESS:
            raise TraceError(f"{name} failed: {result[0]!r} (timing a step with CUDA events)")
        return result[1] if len(result) > 1 else None

    def _event(self) -> Any:
        ev = self._call("cuEventCreate", 0)
        self._events.append(ev)
        return ev

    def step_begin(self, stream: Any, name: str, index: int) -> _Step | None:
        """Record the step's start event on ``stream`` (a handle); None (and no events) while the
        stream is capturing."""
        h = int(stream)
        if self._call("cuStreamIsCapturing", stream) != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
            return None
        if h not in self._refs:
            self._call("cuStreamSynchronize", stream)
            ref = self._event()
            t = time.perf_counter_ns()
            self._call("cuEventRecord", ref, stream)
            self._refs[h] = (ref, t)
        step = _Step(h, self._event(), name, index)
        self._call("cuEventRecord", step.start, stream)
        self._steps.append(step)
        return step

    def step_end(self, step: _Step | None, stream: Any) -> None:
        if step is None:
            return
        step.end = self._event()
        self._call("cuEventRecord", step.end, stream)

    def around(self, span_id: int) -> Callable[[], None]:
        raise AssertionError("no external correlation without CUPTI")  # never installed (tracer)

    def stop(self) -> None:
        """Wait for every step's end event and place the steps on the host clock."""
        try:
            for step in self._steps:
                if step.end is None:
                    continue
                self._call("cuEventSynchronize", step.end)
                ref, t_ref = self._refs[step.stream]
                a = float(self._call("cuEventElapsedTime", ref, step.start))
                b = float(self._call("cuEventElapsedTime", ref, step.end))
                start = t_ref + int(a * 1e6)
                end = max(start, t_ref + int(b * 1e6))
                self.records.append(
                    DeviceSpan("step", step.name, start, end, 0, step.stream, args={"step": step.index})
                )
        finally:
            for ev in self._events:
                self.real("cuEventDestroy")(ev)
            self._events.clear()
            self._steps.clear()

    def node_id(self, handle: Any) -> int:
        return 0

    def metadata(self) -> dict[str, Any]:
        return {
            "clock": "CUDA events placed on time.perf_counter_ns through one reference event per stream, "
            "recorded right after a cuStreamSynchronize",
            "streams": len(self._refs),
        }
