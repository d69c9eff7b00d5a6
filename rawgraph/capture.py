"""Stream capture (``cuStreamBeginCapture`` / ``cuStreamEndCapture``) with a node map.

Each launch made through :meth:`Capture.launch` is followed by ``cuStreamGetCaptureInfo``: in a
linear capture the stream's dependency set is then exactly the node the launch became. That is how
rawgraph knows which graph node holds which launch (and so which node argument reads which named
buffer) without guessing from node order afterwards. At the end, the graph's node count must equal
the number of launches recorded.

Capture mode
------------
The default is ``GLOBAL`` (PyTorch's default too): while any thread captures in global mode, every
thread's potentially unsafe calls (``cuMemAlloc``, synchronisation, legacy-stream work) fail loudly
instead of silently racing with the capture. ``THREAD_LOCAL`` restricts only the capturing thread,
for programs whose other threads must keep allocating while a graph is captured. ``RELAXED`` lifts
the checks; use it only when you know the unsafe calls cannot touch the captured work.
"""

from __future__ import annotations

import enum
import warnings
import weakref
from typing import Any, Literal

from cuda.bindings import driver

from . import _capturing
from .errors import (CaptureError, CaptureRefusedError, ClosedError, EmptyCaptureWarning, RawgraphError, call, check,
                     error_name)
from .graph import Graph, KernelNode
from .launch import Launch, LaunchPlan
from .resource import release, shutting_down
from .stream import SPECIAL_HANDLES, Stream, _handle_of, as_stream


class CaptureMode(enum.Enum):
    """``CUstreamCaptureMode``."""

    GLOBAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    THREAD_LOCAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    RELAXED = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


DEFAULT_CAPTURE_MODE = CaptureMode.GLOBAL
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_SUCCESS = driver.CUresult.CUDA_SUCCESS


class Capture:
    """Context manager that captures work on ``stream`` into a :class:`~rawgraph.graph.Graph`.

    On a clean exit the graph is in :attr:`graph`. If the body raises (for example a forbidden
    ``cuStreamSynchronize`` or ``cuMemAlloc`` during a global-mode capture), the capture is ended,
    whatever graph the driver returns is destroyed, and the original error propagates: the stream
    is usable again afterwards. The same happens when the body *catches* a driver error and
    carries on: the capture still fails at its end (:class:`CaptureError`, caused by the first
    error), never with a half-built graph.

    A ``Capture`` is single-use. If it is garbage-collected while capturing, or its stream is
    closed while capturing, the capture is ended and its graph discarded.

    Parameters
    ----------
    stream : Stream or stream-like
        Not a default stream (legacy, NULL or per-thread): those cannot be captured, which is
        refused here, before the driver is called.
    mode : CaptureMode, default GLOBAL

    Attributes
    ----------
    graph : Graph or None
    nodes : list of KernelNode
    end_result : str or None
        The ``CUresult`` name ``cuStreamEndCapture`` returned (e.g.
        ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`` after a forbidden call).
    """

    def __init__(self, stream: Any, mode: CaptureMode = DEFAULT_CAPTURE_MODE):
        if not isinstance(mode, CaptureMode):
            raise TypeError(f"mode must be a CaptureMode, got {mode!r}")
        handle = stream.ptr if isinstance(stream, Stream) else _handle_of(stream)
        if handle in SPECIAL_HANDLES:
            raise CaptureRefusedError(
                "cannot capture the legacy/NULL (or per-thread default) stream; capture on a rawgraph.Stream()"
            )
        self.stream: Stream = as_stream(stream)
        self.mode = mode
        self.nodes: list[KernelNode] = []
        self.other_nodes: list[tuple[Any, str, Any]] = []
        self.graph: Graph | None = None
        self.end_result: str | None = None
        self._open = False
        self._used = False
        self._record: _capturing.CaptureRecord | None = None
        self._abandon: weakref.finalize | None = None

    def __enter__(self) -> "Capture":
        if self._used:
            raise CaptureRefusedError("a Capture is single-use: make a new Capture for another capture")
        self.stream._check_open()
        if self.stream.is_capturing():
            raise CaptureRefusedError("this stream is already capturing")
        call(driver.cuStreamBeginCapture, self.stream.handle, self.mode.value)
        self._used = True
        self._open = True
        self._record = _capturing.CaptureRecord(self.stream.ptr, self.mode.name)
        _capturing.begin(self._record)
        # Ends the capture if this object is collected mid-capture (refers to the stream, not self).
        self._abandon = weakref.finalize(self, _abandon_capture, self.stream, self._record)
        return self

    def launch(self, launch: Launch) -> KernelNode:
        """Launch into the capture and record the node it became (``cuStreamGetCaptureInfo``)."""
        if not self._open:
            raise RawgraphError("Capture.launch outside the with-block")
        launch(self.stream)
        node = KernelNode(self._last_node(f"launching {launch.kernel.name}"), len(self.nodes), launch, launch.args.snapshot())
        self.nodes.append(node)
        return node

    @property
    def captured(self) -> Graph:
        """The graph of a capture that ended cleanly (:attr:`graph`, never None).

        Raises
        ------
        RawgraphError
            The capture has not ended, or it failed.
        """
        if self.graph is None:
            raise RawgraphError("this capture has no graph: it has not ended, or it failed")
        return self.graph

    def _last_node(self, what: str) -> Any:
        status, _id, _graph, deps, _edges, ndeps = check(
            driver.cuStreamGetCaptureInfo(self.stream.handle), "cuStreamGetCaptureInfo"
        )
        if status != _ACTIVE:
            raise CaptureError(0, "CAPTURE_NOT_ACTIVE", f"capture status is {status.name}", "cuStreamGetCaptureInfo")
        if ndeps != 1:
            raise RawgraphError(f"expected one dependency after {what} (a linear capture), found {ndeps}")
        return deps[0]

    def mem_alloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` inside the graph: ``cuMemAllocAsync`` on the capturing stream becomes
        a memory allocation node, and the address it returns is fixed for the graph's lifetime.

        Graph memory is physical only while a replay runs between this node and its free; the
        driver reuses it across graphs launched into the same stream (see
        :mod:`rawgraph.serving.graphmem`).
        """
        if not self._open:
            raise RawgraphError("Capture.mem_alloc outside the with-block")
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes}")
        ptr = int(call(driver.cuMemAllocAsync, int(nbytes), self.stream.handle))
        self.other_nodes.append((self._last_node("cuMemAllocAsync"), "alloc", ptr))
        return ptr

    def mem_free(self, ptr: int) -> None:
        """Free graph memory inside the graph (``cuMemFreeAsync`` becomes a memory free node)."""
        if not self._open:
            raise RawgraphError("Capture.mem_free outside the with-block")
        call(driver.cuMemFreeAsync, int(ptr), self.stream.handle)
        self.other_nodes.append((self._last_node("cuMemFreeAsync"), "free", int(ptr)))

    def memcpy_htod(self, dst: int, src: int, nbytes: int) -> None:
        """Record a host-to-device copy (``cuMemcpyHtoDAsync`` becomes a memcpy node). From pinned
        host memory (:class:`~rawgraph.memory.HostBuffer`) the node reads the host bytes when each
        replay reaches it, not at capture."""
        if not self._open:
            raise RawgraphError("Capture.memcpy_htod outside the with-block")
        call(driver.cuMemcpyHtoDAsync, int(dst), int(src), int(nbytes), self.stream.handle)
        self.other_nodes.append((self._last_node("cuMemcpyHtoDAsync"), "memcpy", (int(dst), int(src), int(nbytes))))

    def event_record(self, event: Any) -> None:
        """Record ``event`` inside the graph (``cuEventRecordWithFlags`` with
        ``CU_EVENT_RECORD_EXTERNAL`` becomes an event record node): each replay records it when it
        reaches this point, so the host can tell how far a queued replay has got."""
        if not self._open:
            raise RawgraphError("Capture.event_record outside the with-block")
        event._check_open()
        call(driver.cuEventRecordWithFlags, event.handle, self.stream.handle,
             int(driver.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL))
        self.other_nodes.append((self._last_node("cuEventRecordWithFlags"), "event", event))

    def run(self, plan: LaunchPlan) -> None:
        """Record every launch of ``plan`` in order."""
        plan.check_open()
        for launch in plan.launches:
            self.launch(launch)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self._open = False
        record = self._record
        assert record is not None and self._abandon is not None
        self._abandon.detach()
        _capturing.end(record)
        if record.aborted is not None or self.stream.closed:
            reason = record.aborted or "the stream was closed during the capture"
            if exc_type is not None:
                _add_note(exc, f"rawgraph: {reason}; the capture was ended and its graph discarded")
                return False
            raise ClosedError(f"{reason}; the capture was ended and its graph discarded")
        err, handle = driver.cuStreamEndCapture(self.stream.handle)
        self.end_result = error_name(err)
        if exc_type is not None or record.errors or err != _SUCCESS:
            if handle is not None and int(handle):
                release("cuGraphDestroy", driver.cuGraphDestroy, handle)
        if exc_type is not None:
            _add_note(exc, f"rawgraph: the capture on {self.stream!r} was ended ({self.end_result}) "
                           "and its graph discarded; the stream is usable again")
            return False
        if record.errors:
            first = record.errors[0]
            raise CaptureError(
                int(err) if err != _SUCCESS else getattr(first, "code", 0),
                self.end_result if err != _SUCCESS else getattr(first, "name", type(first).__name__),
                f"the capture body caught {len(record.errors)} driver error(s) and went on; the first was: "
                f"{first}. The capture was ended and its graph discarded; the stream is usable again",
                "cuStreamEndCapture",
            ) from first
        if err != _SUCCESS:
            check((err,), "cuStreamEndCapture")
        graph = Graph(handle, self.nodes, self.stream.device)
        graph.other_nodes = list(self.other_nodes)
        count = graph.node_count()
        recorded = len(self.nodes) + len(self.other_nodes)
        if count != recorded:
            graph.close()
            raise RawgraphError(
                f"the captured graph has {count} nodes but {recorded} operations were recorded: "
                "work was submitted to the stream outside Capture.launch"
            )
        if count == 0:
            warnings.warn(f"the capture on {self.stream!r} recorded no work: the graph is empty",
                          EmptyCaptureWarning, stacklevel=2)
        self.graph = graph
        return False


def _add_note(exc: Any, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def _abandon_capture(stream: Stream, record: _capturing.CaptureRecord) -> None:
    """A Capture collected mid-capture: end its capture and discard the graph (a warning says so)."""
    _capturing.end(record)
    if stream.closed or shutting_down():
        return
    err, handle = driver.cuStreamEndCapture(stream.handle)
    if handle is not None and int(handle):
        release("cuGraphDestroy", driver.cuGraphDestroy, handle)
    warnings.warn(
        f"a Capture was garbage-collected while capturing on {stream!r}; the capture was ended "
        f"({error_name(err)}) and its graph discarded", ResourceWarning, stacklevel=2,
    )


def capture_plan(
    plan: LaunchPlan,
    stream: Any,
    mode: CaptureMode = DEFAULT_CAPTURE_MODE,
    warmup: bool = True,
) -> Graph:
    """Capture ``plan`` on ``stream`` and return the graph with its node map.

    With ``warmup`` (the default) the plan first runs once eagerly and the stream is synchronised,
    so module loading, lazy function loading and first-touch costs happen before capture, not in it.
    """
    cap = Capture(stream, mode)  # refuses a default stream before the warm-up runs on it
    if warmup:
        plan.run(cap.stream)
        cap.stream.synchronize()
    with cap:
        cap.run(plan)
    assert cap.graph is not None
    cap.graph.plan = plan  # the plan owns the argument buffers the nodes were captured from
    return cap.graph
