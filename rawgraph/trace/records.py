"""What a trace holds (host spans, device spans, instants, the step and path marks) and its Chrome
Trace Event Format export.

Every time here is on the host clock, ``time.perf_counter_ns``: the device sources convert theirs
before a :class:`DeviceSpan` is made (:mod:`rawgraph.trace.activity` says how). The export writes
microseconds since the tracer started (``ts``, ``dur``), the unit of the Trace Event Format, rounded
to the nanosecond; a span's ``dur`` is taken between its *rounded* ends, so a span inside another
stays inside it after rounding (viewers stack spans of one row by containment).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# The device rows' process ids: one "process" per device, after any real pid. Chrome's viewer and
# Perfetto only need them distinct from the host's pid.
DEVICE_PID_BASE = 1 << 30


@dataclass
class PathMark:
    """A path (a launch method under test: ``"stream"``, ``"graph"``, ...) the steps inside it belong
    to. Mutable on purpose: a caller may name the path only once its steps have run."""

    name: str
    index: int
    start_ns: int
    end_ns: int = 0
    thread: int = 0


@dataclass(frozen=True)
class HostSpan:
    """One span on a host thread: a driver call, a step or a path.

    Attributes
    ----------
    id : int
        Unique in the trace (``args.span_id`` in the export).
    name : str
        The driver call (``"cuLaunchKernel"``) or the mark (``"step"``, the path's name).
    cat : str
        ``"launch"``, ``"graph"``, ``"update"``, ``"copy"``, ``"sync"``, ``"capture"``, ``"memory"``,
        ``"driver"`` (a driver call of no other group), ``"step"`` or ``"path"``.
    start_ns, end_ns : int
        ``time.perf_counter_ns`` before and after.
    thread : int
        ``threading.get_native_id()`` of the calling thread.
    args : dict
        The argument summary (handles in hex, grid and block, bytes, the kernel's name).
    error : str
        The ``CUresult`` name when the call did not return ``CUDA_SUCCESS``, else empty.
    path : PathMark or None
        The path the span ran in.
    step : int
        The step it ran in (-1 outside any step).
    """

    id: int
    name: str
    cat: str
    start_ns: int
    end_ns: int
    thread: int
    args: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    path: PathMark | None = None
    step: int = -1


@dataclass(frozen=True)
class DeviceSpan:
    """One thing that ran on a device: a kernel, a copy, a memset, or (without CUPTI) a whole step.

    Attributes
    ----------
    kind : str
        ``"kernel"``, ``"memcpy"``, ``"memset"`` or ``"step"`` (the CUDA-event fallback).
    name : str
        The kernel's name as the driver reports it (mangled for C++ kernels), the copy's direction,
        or the step's.
    start_ns, end_ns : int
        On the host clock (converted).
    device : int
    stream : int
        CUPTI's stream id (a small integer per stream), or the stream handle with events.
    correlation : int
        CUPTI's correlation id of the API call that launched it (0 when unknown).
    graph_id, graph_node_id : int
        CUPTI's ``graphId`` and ``graphNodeId`` (0 outside a graph launch): the node of the *exec*.
    node_id : int
        The node of the graph the exec was instantiated from (the clone's source, when the
        instantiation was seen), else ``graph_node_id``.
    args : dict
        What else the record says (grid, block, registers, bytes) and the labels joined to it.
    """

    kind: str
    name: str
    start_ns: int
    end_ns: int
    device: int
    stream: int
    correlation: int = 0
    graph_id: int = 0
    graph_node_id: int = 0
    node_id: int = 0
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Instant:
    """A point in time on a host thread: a doctor finding, a verify result, a note."""

    name: str
    ts_ns: int
    thread: int
    cat: str = "note"
    args: dict[str, Any] = field(default_factory=dict)


def _us(ns: int, origin: int) -> float:
    return round((ns - origin) / 1e3, 3)


def _lanes(spans: list[DeviceSpan]) -> list[tuple[DeviceSpan, int]]:
    """Each device span with a lane of its stream: the first whose last span ended before it
    starts. Spans of one stream overlap (a programmatic dependent launch starts before the kernel
    it follows ends), and one row of a trace viewer only nests, so an overlapping span goes one
    lane down."""
    ends: dict[tuple[int, int], list[int]] = {}
    out = []
    for s in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns)):
        lanes = ends.setdefault((s.device, s.stream), [])
        for i, end in enumerate(lanes):
            if end <= s.start_ns:
                lanes[i] = s.end_ns
                break
        else:
            i = len(lanes)
            lanes.append(s.end_ns)
        out.append((s, i))
    return out


def chrome_trace(
    host: Iterable[HostSpan],
    device: Iterable[DeviceSpan],
    instants: Iterable[Instant],
    origin_ns: int,
    metadata: dict[str, Any],
    correlations: dict[int, int] | None = None,
) -> dict[str, Any]:
    """The Trace Event Format document (``{"traceEvents": [...], "metadata": {...}}``).

    Rows: the host process (its pid) with one row per thread, above one process per device with
    a row per stream (and a lane per overlap, see :func:`_lanes`). Host spans and device spans
    are complete events (``ph: "X"``); instants ``ph: "i"``; names and order of the rows ``ph:
    "M"``; a flow arrow (``ph: "s"`` then ``"f"``) from each host call to the first device span it
    launched, by correlation id (``correlations``: host span id -> CUPTI correlation id).

    Every event has ``ph``, ``ts``, ``pid`` and ``tid``; every span ``dur`` >= 0 and a unique
    ``args.span_id``; each flow id appears once as ``s`` and once as ``f``.
    """
    pid = os.getpid()
    events: list[dict[str, Any]] = []

    def meta(name: str, p: int, t: int, value: Any) -> None:
        key = "sort_index" if name.endswith("sort_index") else "name"
        events.append({"ph": "M", "name": name, "ts": 0, "pid": p, "tid": t, "args": {key: value}})

    meta("process_name", pid, 0, f"host (pid {pid})")
    meta("process_sort_index", pid, 0, 0)
    host = list(host)
    threads = sorted({s.thread for s in host} | {i.thread for i in instants})
    for t in threads:
        meta("thread_name", pid, t, f"thread {t}")
    next_id = max((s.id for s in host), default=0) + 1
    for s in host:
        ts, end = _us(s.start_ns, origin_ns), _us(s.end_ns, origin_ns)
        args = {"span_id": s.id, **s.args}
        if s.error:
            args["error"] = s.error
        if s.path is not None and s.cat != "path":
            args["path"] = s.path.name
        if s.step >= 0:
            args["step"] = s.step
        name = s.path.name if s.cat == "path" and s.path is not None else s.name
        events.append(
            {"ph": "X", "name": name, "cat": s.cat, "ts": ts, "dur": round(end - ts, 3), "pid": pid, "tid": s.thread}
            | {"args": args}
        )
    for i in instants:
        events.append(
            {
                "ph": "i",
                "s": "t",
                "name": i.name,
                "cat": i.cat,
                "ts": _us(i.ts_ns, origin_ns),
                "pid": pid,
                "tid": i.thread,
                "args": {"span_id": (next_id := next_id + 1), **i.args},
            }
        )
    # Device rows: (device, stream, lane) -> tid, numbered in order of first use.
    rows: dict[tuple[int, int, int], int] = {}
    first: dict[int, tuple[DeviceSpan, int, int]] = {}  # correlation -> its first device span
    for d, lane in _lanes(list(device)):
        dpid = DEVICE_PID_BASE + d.device
        if (d.device, d.stream, lane) not in rows:
            if not any(k[0] == d.device for k in rows):
                meta("process_name", dpid, 0, f"GPU {d.device} (device)")
                meta("process_sort_index", dpid, 0, 1 + d.device)
            tid = rows[(d.device, d.stream, lane)] = len(rows) + 1
            meta("thread_name", dpid, tid, f"stream {d.stream}" + (f" (overlap {lane})" if lane else ""))
            meta("thread_sort_index", dpid, tid, tid)
        tid = rows[(d.device, d.stream, lane)]
        ts, end = _us(d.start_ns, origin_ns), _us(d.end_ns, origin_ns)
        args = {"span_id": (next_id := next_id + 1), **d.args}
        for k in ("correlation", "graph_id", "graph_node_id", "node_id"):
            if getattr(d, k):
                args[k] = getattr(d, k)
        events.append(
            {
                "ph": "X",
                "name": d.name,
                "cat": d.kind,
                "ts": ts,
                "dur": round(end - ts, 3),
                "pid": dpid,
                "tid": tid,
                "args": args,
            }
        )
        if d.correlation and d.correlation not in first:
            first[d.correlation] = (d, dpid, tid)
    by_span = {c: h for h, c in (correlations or {}).items()}
    spans = {s.id: s for s in host}
    flow = 0
    for corr, (dev, dpid, tid) in sorted(first.items()):
        h = spans.get(by_span.get(corr, -1))
        if h is None:
            continue
        flow += 1
        common = {"name": "launch", "cat": "flow", "id": flow}
        events.append({"ph": "s", "ts": _us(h.start_ns, origin_ns), "pid": pid, "tid": h.thread} | common)
        events.append({"ph": "f", "bp": "e", "ts": _us(dev.start_ns, origin_ns), "pid": dpid, "tid": tid} | common)
    return {"traceEvents": events, "displayTimeUnit": "ns", "metadata": metadata}
