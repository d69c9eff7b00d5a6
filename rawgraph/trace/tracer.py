"""The tracer: a context manager around any code that calls the driver through rawgraph.

While active it times every selected driver call on the host (:mod:`rawgraph.trace.hooks`),
collects device activity (:mod:`rawgraph.trace.activity`), marks paths and steps (with NVTX
ranges, so the same run reads in Nsight Systems), and afterwards writes the Chrome trace and fits
the latency model (:mod:`rawgraph.trace.model`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from cuda.bindings import driver

from ..runtime.errors import RawgraphWarning
from ..runtime.stream import stream_handle
from .activity import CuptiCollector, EventCollector, TraceError, load_cupti
from .hooks import CallRecord, DriverHooks, KernelNames, selection, summarize
from .model import LatencyModel, fit
from .records import DeviceSpan, HostSpan, Instant, PathMark, chrome_trace

_SUCCESS = driver.CUresult.CUDA_SUCCESS
DEVICE_SOURCES = ("auto", "cupti", "events", "none")
# One tracer at a time: the driver's attributes hold one set of wrappers.
_LOCK = threading.Lock()
_active: list[Tracer] = []


class TraceActiveError(TraceError):
    """A second tracer was entered while one is active (rawgraph's driver calls go to one)."""


class TraceWarning(RawgraphWarning):
    """Something of the trace is partial (a wrapper left on, a mapping missing)."""


@dataclass(frozen=True)
class NodeLabel:
    """What rawgraph's node map says about one node of a labelled graph.

    Attributes
    ----------
    graph : str
        The name the graph was labelled with.
    index : int
        Its position in capture order.
    launch : str
        The launch's label (``"L0.matmul1"``), else the kernel's short name.
    kernel : str
    buffers : dict of str -> str
        Pointer argument -> the plan buffer it holds (``{"x": "x", "W": "W1[0]", "y": "h"}``).
    handle : int
        The ``CUgraphNode``.
    node_id : int
        CUPTI's id of the node (``cupti.get_graph_node_id``; 0 without CUPTI).
    """

    graph: str
    index: int
    launch: str
    kernel: str
    buffers: dict[str, str]
    handle: int
    node_id: int = 0


class _Nvtx:
    """NVTX ranges through the ``nvtx`` package, imported when the tracer starts; nothing without it."""

    def __init__(self, enabled: bool) -> None:
        self.mod: Any = None
        if enabled:
            try:
                import nvtx

                self.mod = nvtx
            except ImportError:
                pass

    def push(self, message: str) -> None:
        if self.mod is not None:
            self.mod.push_range(message=message, domain="rawgraph")

    def pop(self) -> None:
        if self.mod is not None:
            self.mod.pop_range(domain="rawgraph")


@dataclass
class _ThreadState:
    paths: list[PathMark] = field(default_factory=list)
    step: int = -1


def _fake_driver_installed() -> bool:
    """Whether rawgraph's CPU fake driver is on ``cuda.bindings.driver`` (looked up in sys.modules,
    not imported: the fake sits above this layer). CUPTI sees only the real driver's work."""
    fake = sys.modules.get("rawgraph.testing.fakedriver")
    return fake is not None and getattr(fake.FakeDriver, "installed", None) is not None


class Tracer:
    """Collects a trace of the code inside ``with Tracer() as t:``.

    Host spans: every selected driver call (``cuLaunchKernel``, ``cuLaunchKernelEx``,
    ``cuGraphLaunch``, ``cuGraphExecKernelNodeSetParams``, ``cuMemcpy*``, ``cuStreamSynchronize``,
    ...) timed with ``time.perf_counter_ns`` by a wrapper put on ``cuda.bindings.driver`` for the
    block and taken off after it (even when the block raises), with an argument summary. Device
    spans: CUPTI's activity records of kernels, copies and memsets, or CUDA events around each
    :meth:`step` (see :mod:`rawgraph.trace.activity`).

    Single use, and one active at a time in a process (:class:`TraceActiveError`). Spans are
    recorded from any thread, each with its thread's native id.

    Parameters
    ----------
    device : {"auto", "cupti", "events", "none"}, default "auto"
        Where device spans come from. ``"auto"``: CUPTI where ``cupti-python`` loads and starts
        (never over the CPU fake driver), else CUDA events; the trace's metadata says which
        (``device_source``) and why. ``"cupti"`` raises :class:`TraceError` where CUPTI is not
        available. ``"none"``: host spans only.
    calls : "default", "all" or list of str, default "default"
        The driver calls timed (:func:`rawgraph.trace.hooks.selection`).
    nvtx : bool, default True
        NVTX ranges around each path and step, where the ``nvtx`` package is installed.
    workload : dict, optional
        What was traced, in your words (``{"name": "my step", "batch": 8}``): the JSON's
        ``metadata.workload``, a copy. The attribute ``workload`` may still be filled in before
        the trace is written (``rawgraph trace`` adds the model it made).

    Notes
    -----
    State: 24 instance attributes in two groups that live exactly as long as each other: what the
    trace collected (host and device spans, instants, node labels, notes, the clock origin and end,
    where device spans came from and why, CUPTI's correlation ids, the workload's description) and
    the machinery of one active block (the collector, the driver hooks, the id counters, the
    per-thread span stack, NVTX). Nothing in it needs releasing after the block: ``__exit__`` takes
    the hooks off and closes the collector, the one thing that holds driver or CUPTI state.

    Examples
    --------
    >>> with Tracer() as t:                      # doctest: +SKIP
    ...     with t.path("graph"):
    ...         for _ in range(5):
    ...             with t.step(stream):
    ...                 exe.launch(stream)
    >>> t.write("trace.json")                    # doctest: +SKIP
    >>> print(t.latency_model().table())         # doctest: +SKIP
    """

    def __init__(
        self,
        device: str = "auto",
        calls: str | Iterable[str] = "default",
        nvtx: bool = True,
        workload: dict[str, Any] | None = None,
    ) -> None:
        if device not in DEVICE_SOURCES:
            raise ValueError(f"device must be one of {DEVICE_SOURCES}, got {device!r}")
        self.device = device
        self.calls = selection(calls)  # checked now, before anything is installed
        self.nvtx = nvtx
        self.workload: dict[str, Any] = dict(workload or {})
        self.host: list[HostSpan] = []
        self.device_spans: list[DeviceSpan] = []
        self.instants: list[Instant] = []
        self.labels: dict[str, list[NodeLabel]] = {}
        self.device_source = "none"
        self.device_source_reason = ""
        self.notes: list[str] = []
        self.origin_ns = 0
        self.end_ns = 0
        self._ids = itertools.count(1)
        self._paths = itertools.count(0)
        self._steps = itertools.count(0)
        self._local = threading.local()
        self._correlations: dict[int, int] = {}  # host span id -> CUPTI correlation id
        self._device_meta: dict[str, Any] = {}
        self._collector: CuptiCollector | EventCollector | None = None
        self._hooks: DriverHooks | None = None
        self._names = KernelNames()
        self._nv = _Nvtx(False)
        self._state = "new"  # new -> active -> done

    # -- the block ----------------------------------------------------------------------------
    def __enter__(self) -> Tracer:
        if self._state != "new":
            raise TraceError("a Tracer is single-use: make a new one")
        with _LOCK:
            if _active:
                raise TraceActiveError("another Tracer is active in this process; one collects at a time")
            _active.append(self)
        try:
            self._collector = self._open_device()
            around = self._collector.around if isinstance(self._collector, CuptiCollector) else None
            self._hooks = DriverHooks(self.calls, self._on_call, lambda: next(self._ids), around)
            self._nv = _Nvtx(self.nvtx)
            self.origin_ns = time.perf_counter_ns()
            self._hooks.install()
        except BaseException:
            self._close_device()
            with _LOCK:
                _active.remove(self)
            self._state = "done"
            raise
        self._state = "active"
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self.end_ns = time.perf_counter_ns()
        self._state = "done"
        try:
            assert self._hooks is not None
            left = self._hooks.uninstall()
            if left:
                self.notes.append(f"wrappers left on (passing calls through): {', '.join(left)}")
                warnings.warn(
                    f"rawgraph.trace: {len(left)} driver function(s) were replaced while the tracer was active "
                    f"and not put back before it ended ({', '.join(left[:4])}); its wrappers stay on them, "
                    "passing calls through",
                    TraceWarning,
                    stacklevel=2,
                )
        finally:
            try:
                self._close_device()
            finally:
                with _LOCK:
                    _active.remove(self)
        return False

    @property
    def active(self) -> bool:
        return self._state == "active"

    def _open_device(self) -> CuptiCollector | EventCollector | None:
        if self.device == "none":
            self.device_source, self.device_source_reason = "none", "asked for host spans only"
            return None
        if self.device in ("auto", "cupti"):
            why = (
                "the CPU fake driver is installed (CUPTI sees only the real driver)" if _fake_driver_installed() else ""
            )
            cupti = None
            if not why:
                cupti, why = load_cupti()
            if cupti is not None:
                collector = CuptiCollector(cupti)
                try:
                    collector.start()
                    self.device_source = "cupti"
                    return collector
                except Exception as exc:
                    why = f"CUPTI did not start: {type(exc).__name__}: {exc}"
            if self.device == "cupti":
                raise TraceError(f"device='cupti': {why}")
            self.device_source_reason = why
        self.device_source = "events"
        return EventCollector(self._real)

    def _close_device(self) -> None:
        c, self._collector = self._collector, None
        if c is None:
            return
        if isinstance(c, CuptiCollector):
            # Work still queued has no records yet: wait for it (the result is not checked; a
            # broken context must not keep the trace from closing).
            self._real("cuCtxSynchronize")()
        c.stop()
        self.device_spans.extend(c.records)
        self._correlations = dict(c.correlations)
        self.notes.extend(c.notes)
        self._device_meta = c.metadata()

    def _real(self, name: str) -> Any:
        return self._hooks.original(name) if self._hooks is not None else getattr(driver, name)

    def _thread(self) -> _ThreadState:
        st = getattr(self._local, "state", None)
        if st is None:
            st = self._local.state = _ThreadState()
        return st

    def _on_call(self, rec: CallRecord) -> None:
        st = self._thread()
        result = rec.result
        err = ""
        if isinstance(result, tuple) and result and result[0] != _SUCCESS:
            err = getattr(result[0], "name", str(result[0]))
        self.host.append(
            HostSpan(
                rec.id,
                rec.name,
                rec.group,
                rec.start_ns,
                rec.end_ns,
                rec.thread,
                summarize(rec.name, rec.args, self._names),
                err,
                st.paths[-1] if st.paths else None,
                st.step,
            )
        )

    # -- marks --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def path(self, name: str) -> Iterator[PathMark]:
        """Mark a path (a way of launching the same work): the steps inside belong to it. Yields
        the :class:`~rawgraph.trace.records.PathMark`, whose ``name`` may still be set inside."""
        self._check_active("path")
        st = self._thread()
        mark = PathMark(name, next(self._paths), time.perf_counter_ns(), thread=threading.get_native_id())
        span_id = next(self._ids)
        self._nv.push(f"path {name}")
        st.paths.append(mark)
        try:
            yield mark
        finally:
            st.paths.pop()
            mark.end_ns = time.perf_counter_ns()
            self._nv.pop()
            self.host.append(
                HostSpan(
                    span_id, name, "path", mark.start_ns, mark.end_ns, mark.thread, {"index": mark.index}, "", mark
                )
            )

    @contextlib.contextmanager
    def step(self, stream: Any = None, name: str = "step") -> Iterator[int]:
        """Mark one step (one forward pass, one replay). With CUDA events as the device source,
        events recorded on ``stream`` (any stream-like object) before and after the block give
        the step's device span. Yields the step's index."""
        self._check_active("step")
        st = self._thread()
        index = next(self._steps)
        span_id = next(self._ids)
        handle = stream_handle(stream) if stream is not None else None
        path = st.paths[-1] if st.paths else None
        label = f"{path.name if path else ''} {name} {index}".strip()
        self._nv.push(label)
        outer, st.step = st.step, index
        events = self._collector if isinstance(self._collector, EventCollector) and handle is not None else None
        t0 = time.perf_counter_ns()
        try:
            token = events.step_begin(handle, label, index) if events is not None else None
        except BaseException:  # the step is refused: nothing of it stays open
            st.step = outer
            self._nv.pop()
            raise
        try:
            yield index
        finally:
            if events is not None:
                events.step_end(token, handle)
            t1 = time.perf_counter_ns()
            st.step = outer
            self._nv.pop()
            args: dict[str, Any] = {"index": index}
            if handle is not None:
                args["stream"] = f"0x{int(handle):x}"
            self.host.append(HostSpan(span_id, name, "step", t0, t1, threading.get_native_id(), args, "", path, index))

    def _check_active(self, what: str) -> None:
        if self._state != "active":
            raise TraceError(f"Tracer.{what}() outside the tracer's with-block")

    # -- labels and instants ------------------------------------------------------------------
    def label_graph(self, graph: Any, name: str | None = None) -> list[NodeLabel]:
        """Join a rawgraph graph's node map to the trace: device spans of its kernel nodes get the
        launch's label, its node index and which plan buffer each pointer argument holds.

        Parameters
        ----------
        graph : Graph or GraphExec
            A graph rawgraph captured or built (its ``nodes``), or an exec of one.
        name : str, optional
            How the trace names it (default ``"graph N"``).

        Returns
        -------
        list of NodeLabel
        """
        g = graph.graph if not hasattr(graph, "nodes") and hasattr(graph, "graph") else graph
        key = name or f"graph {len(self.labels)}"
        collector = self._collector
        labels = []
        for n in g.nodes:
            launch = n.launch
            node_id = collector.node_id(n.handle) if isinstance(collector, CuptiCollector) else 0
            labels.append(
                NodeLabel(
                    key,
                    int(n.index),
                    launch.label or launch.kernel.short_name,
                    launch.kernel.name,
                    {arg: use.buffer for arg, use in launch.uses.items()},
                    int(n.handle),
                    node_id,
                )
            )
        self.labels[key] = labels
        return labels

    def instant(self, name: str, args: dict[str, Any] | None = None, cat: str = "note") -> Instant:
        """Add a point-in-time event (``ph: "i"``) on the calling thread's row, now."""
        ev = Instant(name, time.perf_counter_ns(), threading.get_native_id(), cat, dict(args or {}))
        self.instants.append(ev)
        return ev

    def add_findings(self, report: Any) -> list[Instant]:
        """Write a :func:`rawgraph.doctor.check` report's findings, or a :func:`rawgraph.doctor.verify`
        result, into the trace as instant events, each with the node it names (its index, path and
        handle, and the launch's label where the graph was labelled).

        Parameters
        ----------
        report : rawgraph.doctor.report.Report or rawgraph.doctor.verify.VerifyResult

        Returns
        -------
        list of Instant
            One per finding (none for a clean report), or one for the verify result.
        """
        from ..doctor.report import Report
        from ..doctor.verify import VerifyResult

        by_handle = {lab.handle: lab for labels in self.labels.values() for lab in labels}
        out = []
        if isinstance(report, Report):
            for f in report.findings:
                args = f.to_dict()
                lab = by_handle.get(int(f.node_id))
                if lab is not None:
                    args |= {"graph": lab.graph, "node": lab.index, "launch": lab.launch}
                where = f.path or f.node_index
                out.append(self.instant(f"{f.severity} {f.cls}/{f.name} at node {where}", args, "doctor"))
        elif isinstance(report, VerifyResult):
            text = "replay equals eager" if report.ok else f"first diverging node {report.node} ({report.node_label})"
            args = {"ok": report.ok, "node": report.node, "node_label": report.node_label, "text": str(report)}
            out.append(self.instant(f"verify: {text}", args, "verify"))
        else:
            raise TypeError(f"add_findings takes a doctor Report or a VerifyResult, got {type(report).__name__}")
        return out

    # -- results ------------------------------------------------------------------------------
    def _done(self, what: str) -> None:
        if self._state != "done" or not self.origin_ns:
            raise TraceError(f"Tracer.{what}() needs a finished trace (after the with-block)")

    @property
    def correlations(self) -> dict[int, int]:
        """Host span id -> CUPTI's correlation id of that driver call (what its device spans carry);
        empty without CUPTI."""
        return dict(self._correlations)

    def joined_device_spans(self) -> list[DeviceSpan]:
        """The device spans with the node map's labels (graph nodes) and the launching call's
        kernel name (eager launches) in their ``args``."""
        self._done("joined_device_spans")
        by_node = {lab.node_id: lab for labels in self.labels.values() for lab in labels if lab.node_id}
        corr = self._correlations
        host_by_corr = {corr[s.id]: s for s in self.host if s.id in corr}
        out = []
        for d in self.device_spans:
            extra: dict[str, Any] = {}
            lab = by_node.get(d.node_id) if d.graph_node_id else None
            if lab is not None:
                extra = {"graph": lab.graph, "node": lab.index, "launch": lab.launch, "buffers": lab.buffers}
            h = host_by_corr.get(d.correlation) if d.correlation else None
            if h is not None:
                extra["host_call"] = h.name
                if "kernel" in h.args and d.kind == "kernel" and not d.graph_node_id:
                    extra["launch"] = h.args["kernel"]
            out.append(replace(d, args={**d.args, **extra}) if extra else d)
        return out

    def latency_model(self) -> LatencyModel:
        """The model of every path with steps (:func:`rawgraph.trace.model.fit`)."""
        self._done("latency_model")
        return fit(self.host, self.joined_device_spans(), self._correlations, self.device_source)

    def metadata(self) -> dict[str, Any]:
        """What the trace's JSON carries besides its events."""
        self._done("metadata")
        from .. import __version__

        return {
            "rawgraph": __version__,
            "workload": dict(self.workload),
            "device_source": self.device_source,
            "device_source_reason": self.device_source_reason,
            "host_clock": "time.perf_counter_ns; ts are microseconds since the tracer started",
            "device_clock": self._device_meta,
            "calls_wrapped": len(self.calls),
            "host_spans": len(self.host),
            "device_spans": len(self.device_spans),
            "graphs": {k: [asdict(lab) for lab in v] for k, v in self.labels.items()},
            "latency_model": self.latency_model().to_dict(),
            "notes": list(self.notes),
        }

    def to_chrome(self) -> dict[str, Any]:
        """The trace as a Trace Event Format document (:func:`rawgraph.trace.records.chrome_trace`)."""
        self._done("to_chrome")
        corr = self._correlations
        host = [replace(s, args={**s.args, "correlation": corr[s.id]}) if s.id in corr else s for s in self.host]
        return chrome_trace(host, self.joined_device_spans(), self.instants, self.origin_ns, self.metadata(), corr)

    def write(self, path: str | Path, doc: dict[str, Any] | None = None) -> Path:
        """Write :meth:`to_chrome` as JSON to ``path`` (or ``doc``, such a document a caller added
        to, e.g. its ``metadata``); open it in Perfetto (ui.perfetto.dev, "Open trace file") or
        ``chrome://tracing``."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_chrome() if doc is None else doc))
        return p
