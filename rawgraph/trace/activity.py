"""Device activity for a trace: CUPTI's activity API (through NVIDIA's ``cupti-python``), or CUDA
events around each step where CUPTI is not available.

CUPTI
-----
``cupti.activity_enable`` for ``CONCURRENT_KERNEL``, ``MEMCPY``, ``MEMSET``, ``DRIVER`` and
``EXTERNAL_CORRELATION``; CUPTI hands filled buffers to the callbacks registered with
``cupti.activity_register_callbacks``: ``buffer_requested()`` returns ``(size in bytes, max
records)`` and ``buffer_completed(activities)`` gets the buffer's records as a list of
``cupti-python`` record objects (``ActivityKernel10``, ``ActivityMemcpy6``, ``ActivityMemset4``,
``ActivityAPI``, ``ActivityExternalCorrelation``; ``kind`` a plain int), on a thread of CUPTI's own
when a buffer fills, or before ``cupti.activity_flush_all`` returns. Each record's fields are
copied out there. Joins:

- *host call -> device work*: around each traced driver call the wrapper pushes the host span's id
  as an external correlation id (``cupti.activity_push_external_correlation_id`` with
  ``ExternalCorrelationKind.CUSTOM0``) and pops it after. CUPTI writes an ``EXTERNAL_CORRELATION``
  record in front of each *API* record made inside the push, so the ``DRIVER`` kind must be on
  for any to appear (its own records are dropped here); the record pairs the span's id with the
  call's ``correlation_id``, the id every kernel, copy and memset that call launched carries (all
  the nodes of one ``cuGraphLaunch`` share it). It arrives as a record of its own, in any buffer.
- *device span -> graph node*: a kernel of a graph launch carries ``graph_id`` and
  ``graph_node_id``, the ids of the *exec*'s node. ``cuGraphInstantiate`` clones every node, and
  CUPTI's resource callback ``GRAPHNODE_CLONED`` (subscribed while the tracer is active,
  ``cupti.subscribe``; ``cupti-python`` calls it as ``callback(userdata, domain, cbid, data)``
  with ``data`` a ``ResourceData`` whose ``resource_descriptor`` points at a ``GraphData``) names
  the clone (``node``) and the node it was cloned from (``original_node``); so a node id is mapped
  back to the node of the graph the exec came from (``cupti.get_graph_node_id`` of its
  ``CUgraphNode``), which is what rawgraph's node map holds. An exec instantiated before the
  tracer started keeps its own node ids.

Clocks: CUPTI's timestamps are nanoseconds on CUPTI's own clock (``cupti.get_timestamp``, the clock
of the records' ``start`` and ``end``). Its relation to ``time.perf_counter_ns`` is read at the
start and at the end of the trace, each time as the middle of the tightest of a few
``perf_counter_ns``, ``get_timestamp``, ``perf_counter_ns`` brackets; a device time is moved onto
the host clock by the offset interpolated linearly between the two readings (so a difference in
rate between the clocks is taken out too). The error is at most half the wider of the two
tightest brackets, about a microsecond; the metadata keeps both offsets and the bracket.

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
    """How a device clock maps onto ``time.perf_counter_ns``: two readings ``(device ns, device ns -
    host ns)``, one at the start of the trace and one at its end."""

    start: int = 0  # offset at the start (device ns - host ns)
    end: int = 0  # offset at the end
    start_at: int = 0  # the device time of the start reading
    end_at: int = 0  # the device time of the end reading
    bracket_ns: int = 0  # the widest of the readings' tightest brackets

    @property
    def offset(self) -> int:
        """The mean offset (what a single number says about the two clocks)."""
        return (self.start + self.end) // 2

    def to_host(self, device_ns: int) -> int:
        """``device_ns`` on the host clock: the offset interpolated linearly between the two
        readings (held at the nearer reading outside them)."""
        if self.end_at <= self.start_at:
            return device_ns - self.start
        f = min(max((device_ns - self.start_at) / (self.end_at - self.start_at), 0.0), 1.0)
        return device_ns - (self.start + round(f * (self.end - self.start)))

    @staticmethod
    def sample(now: Callable[[], int], tries: int = 7) -> tuple[int, int, int]:
        """``(offset, device time, bracket width)`` of the tightest of ``tries`` host-device-host
        readings."""
        best = (0, 0, 1 << 62)
        clock = time.perf_counter_ns
        for _ in range(tries):
            a = clock()
            d = int(now())
            b = clock()
            if b - a < best[2]:
                best = (d - (a + b) // 2, d, b - a)
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
    def of(cls, kind: str, name: Any, r: Any, args: dict[str, Any]) -> _Raw:
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
    incomplete: int = 0

    def start(self) -> None:
        """Enable the activity kinds, subscribe to graph-node clones, read the clock. On failure
        everything started is undone before the error propagates."""
        global _registered
        c = self.cupti
        K = c.ActivityKind
        _sink[:] = [self._completed]
        try:
            if not _registered:
                c.activity_register_callbacks(_buffer_requested, _buffer_completed)
                _registered = True
            # DRIVER: CUPTI writes an EXTERNAL_CORRELATION record only in front of an API record
            for kind in (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.DRIVER, K.EXTERNAL_CORRELATION):
                c.activity_enable(kind)
                self._kinds.append(kind)
            self._subscribe()
            self.clock.start, self.clock.start_at, self.clock.bracket_ns = Clock.sample(c.get_timestamp)
        except BaseException:
            self._release()
            raise

    def _subscribe(self) -> None:
        c = self.cupti
        try:
            self._subscriber = c.subscribe(self._resource, None)
            c.enable_callback(1, self._subscriber, c.CallbackDomain.RESOURCE, c.CallbackIdResource.GRAPHNODE_CLONED)
        except Exception as exc:  # another subscriber (a profiler) holds CUPTI's one callback slot
            if self._subscriber is not None:
                try:
                    c.unsubscribe(self._subscriber)
                except Exception:
                    pass
            self._subscriber = None
            self.notes.append(
                f"graph nodes not mapped to the graph they were instantiated from (cupti.subscribe: {exc}); "
                "device spans carry the exec's node ids"
            )

    def _release(self) -> None:
        """Disable the kinds, unsubscribe, stop taking buffers (each step even if one fails)."""
        c = self.cupti
        try:
            for kind in self._kinds:
                try:
                    c.activity_disable(kind)
                except Exception as exc:
                    self.notes.append(f"cupti.activity_disable({kind!r}): {exc}")
            if self._subscriber is not None:
                c.unsubscribe(self._subscriber)
        finally:
            self._kinds.clear()
            self._subscriber = None
            _sink.clear()

    def around(self, span_id: int) -> Callable[[], None]:
        """Push ``span_id`` as the external correlation id of the driver call about to be made;
        returns the pop."""
        c = self.cupti
        kind = c.ExternalCorrelationKind.CUSTOM0
        c.activity_push_external_correlation_id(kind, span_id)
        return lambda: c.activity_pop_external_correlation_id(kind)

    def stop(self) -> None:
        """Flush every buffer (``cupti.activity_flush_all`` with ``ActivityFlag.FLUSH_FORCED``: the
        buffers not yet full too), disable the kinds, unsubscribe, read the clock again, and convert
        the records. The caller synchronizes first: a forced flush hands over records of work still
        running with no end time, which are dropped (and counted in the notes)."""
        c = self.cupti
        try:
            if self._kinds:
                c.activity_flush_all(int(c.ActivityFlag.FLUSH_FORCED))
        finally:
            self._release()
        self.clock.end, self.clock.end_at, bracket = Clock.sample(c.get_timestamp)
        self.clock.bracket_ns = max(self.clock.bracket_ns, bracket)
        self._convert()

    def _resource(self, _userdata: Any, domain: Any, cbid: Any, data: Any) -> None:
        # CUPTI's resource callback (instantiation's thread): a node cloned into an exec.
        c = self.cupti
        try:
            if int(domain) != int(c.CallbackDomain.RESOURCE) or int(cbid) != int(c.CallbackIdResource.GRAPHNODE_CLONED):
                return
            if not hasattr(data, "resource_descriptor"):  # a bare CUpti_ResourceData pointer
                data = c.ResourceData.from_ptr(int(data))
            graph = c.GraphData.from_ptr(int(data.resource_descriptor))
            self.clones[int(c.get_graph_node_id(graph.node))] = int(c.get_graph_node_id(graph.original_node))
        except Exception as exc:  # never raise into the driver's call
            if len(self.notes) < 8:
                self.notes.append(f"GRAPHNODE_CLONED callback: {type(exc).__name__}: {exc}")

    def _completed(self, activities: list[Any]) -> None:
        # CUPTI's thread: copy each record's fields now (the buffer is reused once its records
        # are gone). Never raise into CUPTI's thread.
        try:
            self._copy(activities)
        except Exception as exc:
            if len(self.notes) < 8:
                self.notes.append(f"activity buffer: {type(exc).__name__}: {exc}")

    def _copy(self, activities: list[Any]) -> None:
        c = self.cupti
        K = c.ActivityKind
        kernel = (int(K.CONCURRENT_KERNEL), int(K.KERNEL))
        custom0 = int(c.ExternalCorrelationKind.CUSTOM0)
        for a in activities:
            kind = int(a.kind)
            if kind == int(K.EXTERNAL_CORRELATION):
                if int(a.external_kind) == custom0:
                    self.correlations[int(a.external_id)] = int(a.correlation_id)
                continue
            if kind not in kernel and kind not in (int(K.MEMCPY), int(K.MEMSET)):
                continue  # DRIVER: on only for the external correlation records
            if not a.start or a.end < a.start:  # flushed before it ended: no times
                self.incomplete += 1
                continue
            if kind in kernel:
                args = {
                    "grid": [int(a.grid_x), int(a.grid_y), int(a.grid_z)],
                    "block": [int(a.block_x), int(a.block_y), int(a.block_z)],
                    "registers": int(a.registers_per_thread),
                    "smem": int(a.static_shared_memory) + int(a.dynamic_shared_memory),
                }
                self._raw.append(_Raw.of("kernel", a.name, a, args))
            elif kind == int(K.MEMCPY):
                try:
                    direction = c.ActivityMemcpyKind(int(a.copy_kind)).name
                except ValueError:
                    direction = str(int(a.copy_kind))
                self._raw.append(_Raw.of("memcpy", f"memcpy {direction}", a, {"bytes": int(a.bytes)}))
            else:
                self._raw.append(_Raw.of("memset", "memset", a, {"bytes": int(a.bytes), "value": int(a.value)}))

    def _convert(self) -> None:
        to_host = self.clock.to_host
        if self.incomplete:
            self.notes.append(f"{self.incomplete} device record(s) without an end time (flushed while running) dropped")
        for r in self._raw:
            node = self.clones.get(r.graph_node_id, r.graph_node_id)
            self.records.append(
                DeviceSpan(
                    r.kind,
                    r.name,
                    to_host(r.start),
                    to_host(r.end),
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
            "clock": "CUPTI timestamps moved onto time.perf_counter_ns by an offset interpolated between "
            "a reading at the start and one at the end",
            "clock_offset_ns": self.clock.offset,
            "clock_offset_start_ns": self.clock.start,
            "clock_offset_end_ns": self.clock.end,
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
