"""Stream capture (``cuStreamBeginCapture`` / ``cuStreamEndCapture``) with a node map.

Each launch made through :meth:`Capture.launch` reads the launching stream's capture dependency
set with ``cuStreamGetCaptureInfo`` before the launch (the nodes the new node will depend on, of
any size) and after it (exactly the node the launch became). That is how rawgraph knows which
graph node holds which launch, and which edges lead into it, without guessing from node order
afterwards (:meth:`~rawgraph.graphs.graph.Graph.verify_edges` checks the edges against the driver's).

Fork/join
---------
Work on several streams joins one capture through events: :meth:`Capture.fork` records an event
on the capturing stream and makes each side stream wait on it (the side stream is then captured
into the same graph), :meth:`Capture.join` records an event on each side stream and makes the
origin wait on it. Neither makes a node: a captured event is a set of nodes, and waiting on it
only moves the waiting stream's dependency set. Every side stream must be joined back before the
end, else the driver ends the capture with ``CUDA_ERROR_STREAM_CAPTURE_UNJOINED``; rawgraph
raises it as a :class:`~rawgraph.runtime.errors.CaptureError` naming the streams left unjoined.

Foreign work
------------
Work that reaches a capturing stream without going through :class:`Capture` (a CuPy kernel, a
``cuMemsetD32Async``, a torch op) becomes nodes rawgraph did not record. They are mapped, not
rejected: :attr:`Graph.foreign_nodes <rawgraph.graphs.graph.Graph.foreign_nodes>` lists each with its
node type and dependencies (``foreign="refuse"`` restores the old refusal).

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
from collections.abc import Sequence
from typing import Any, Literal, cast

from cuda.bindings import driver

from ..runtime import _capturing
from ..runtime.errors import (
    CaptureError,
    CaptureRefusedError,
    ClosedError,
    EmptyCaptureWarning,
    RawgraphError,
    call,
    check,
    error_name,
)
from ..runtime.launch import Launch, LaunchPlan
from ..runtime.memory import DeviceArray
from ..runtime.resource import flush_deferred, release, shutting_down
from ..runtime.stream import SPECIAL_HANDLES, Event, Stream, _handle_of, as_stream, capture_info, discard_capture
from .graph import ForeignNode, Graph, KernelNode


class CaptureMode(enum.Enum):
    """``CUstreamCaptureMode``."""

    # Each value is the driver's CUstreamCaptureMode member (cast: the bindings carry no types).
    GLOBAL = cast(Any, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    THREAD_LOCAL = cast(Any, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    RELAXED = cast(Any, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)


DEFAULT_CAPTURE_MODE = CaptureMode.GLOBAL
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_NONE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_UNJOINED = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED
FOREIGN_POLICIES = ("map", "refuse")


class Capture:
    """Context manager that captures work on ``stream`` into a :class:`~rawgraph.graphs.graph.Graph`.

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
        The origin stream. Not a default stream (legacy, NULL or per-thread): those cannot be
        captured, which is refused here, before the driver is called.
    mode : CaptureMode, default GLOBAL
    side_streams : int, default 0
        Side streams to make now, before the capture (``cuStreamCreate``), for :meth:`fork` to
        hand out by count; owned by the capture and closed when it ends.
    foreign : {"map", "refuse"}, default "map"
        What to do with nodes the capture did not record (work submitted to a capturing stream
        outside this object): list them in ``graph.foreign_nodes``, or refuse the graph.

    Attributes
    ----------
    graph : Graph or None
    nodes : list of KernelNode
        Every launch recorded, in capture order, with its dependencies.
    streams : list of Stream
        The side streams known to be in this capture (forked, or launched on), origin excluded.
    end_result : str or None
        The ``CUresult`` name ``cuStreamEndCapture`` returned (e.g.
        ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`` after a forbidden call).

    See Also
    --------
    cuStreamSynchronize, cuStreamCreate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuStreamEndCapture : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuMemAlloc : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html

    Notes
    -----
    State: 20 instance attributes, the record of one capture while it is open (the stream and its
    mode, the side streams joined and the events that joined them, the node map, the plans and
    arrays it keeps alive, the foreign and other nodes it saw) and what it hands over at the end (the
    graph, the end result). A capture object is single-use, so they live for one capture; what needs
    releasing (the side streams' events) goes back in one place, ``__exit__``'s ``finally``.
    """

    def __init__(
        self, stream: Any, mode: CaptureMode = DEFAULT_CAPTURE_MODE, side_streams: int = 0, foreign: str = "map"
    ):
        if not isinstance(mode, CaptureMode):
            raise TypeError(f"mode must be a CaptureMode, got {mode!r}")
        if foreign not in FOREIGN_POLICIES:
            raise ValueError(f"foreign must be one of {FOREIGN_POLICIES}, got {foreign!r}")
        if isinstance(side_streams, bool) or not isinstance(side_streams, int) or side_streams < 0:
            raise ValueError(f"side_streams must be an int >= 0, got {side_streams!r}")
        handle = stream.ptr if isinstance(stream, Stream) else _handle_of(stream)
        if handle in SPECIAL_HANDLES:
            raise CaptureRefusedError(
                "cannot capture the legacy/NULL (or per-thread default) stream; capture on a rawgraph.Stream()"
            )
        self.stream: Stream = as_stream(stream)
        self.mode = mode
        self.foreign = foreign
        self.nodes: list[KernelNode] = []
        self.other_nodes: list[tuple[Any, str, Any]] = []
        self.graph: Graph | None = None
        self.end_result: str | None = None
        self._open = False
        self._used = False
        self._record: _capturing.CaptureRecord | None = None
        self._abandon: weakref.finalize[..., Any] | None = None
        self._id = 0
        # Side streams made here (before any capture: stream creation is no capture operation)
        # and how many fork() has handed out; side streams of the capture by handle.
        self._pool: list[Stream] = [Stream(device=self.stream.device) for _ in range(side_streams)]
        self._handed = 0
        self._side: dict[int, Stream] = {}
        # Fork/join events: the waits copy an event's node set when they are made, but the
        # events stay alive until the capture ends and are destroyed after it.
        self._events: list[Event] = []
        # The arrays the recorded launches point at, by name (plans run, RawKernel calls), and
        # whether the names stayed unambiguous: then the graph gets a plan of its own at the end.
        self.buffers: dict[str, DeviceArray] = {}
        self._names_ok = True
        self._plans: list[LaunchPlan] = []  # the plans run() recorded
        self._arrays: list[DeviceArray] = []  # every array named to this capture, clashing or not

    @property
    def streams(self) -> list[Stream]:
        return list(self._side.values())

    def __enter__(self) -> Capture:
        if self._used:
            raise CaptureRefusedError("a Capture is single-use: make a new Capture for another capture")
        self.stream._check_open()
        if self.stream.is_capturing():
            raise CaptureRefusedError("this stream is already capturing")
        # The record is open before the driver's capture is and closes after it (cuStreamEndCapture
        # in _end): garbage collection may run a finalizer at any allocation, and one that ran
        # between cuStreamBeginCapture and begin() would call cuMemFree into the capture and
        # invalidate it (measured: a cyclic buffer freed as this record was allocated).
        self._record = _capturing.CaptureRecord(self.stream.ptr, self.mode.name)
        _capturing.begin(self._record)
        try:
            call(driver.cuStreamBeginCapture, self.stream.handle, self.mode.value)
        except BaseException:
            _capturing.end(self._record)
            flush_deferred()
            raise
        self._used = True
        self._open = True
        try:
            self._id = capture_info(self.stream.handle)[1]
        except BaseException:
            # No __exit__ runs for a failed __enter__: end the capture here (discarding its graph),
            # or the stream stays capturing and every release stays deferred.
            self._open = False
            try:
                discard_capture(self.stream.handle)
            finally:
                _capturing.end(self._record)
            _release_side(self._pool, self._events)
            flush_deferred()
            raise
        self._record.capture_id = self._id  # RawKernel calls on this stream find this object
        self._record.owner = weakref.ref(self)
        # Ends the capture if this object is collected mid-capture (refers to the stream, not self).
        self._abandon = weakref.finalize(self, _abandon_capture, self.stream, self._record, self._pool, self._events)
        return self

    # -- streams of the capture -----------------------------------------------------------
    def _in_capture(self, stream: Any, what: str) -> Stream:
        """``stream`` as a Stream that is the origin or captures into this capture (else refused:
        work on it would run now instead of being captured, or merge another capture)."""
        s = as_stream(stream)
        if s.ptr == self.stream.ptr:
            return self.stream
        status, cid, _g, _d = capture_info(s.handle)
        if status != _ACTIVE or cid != self._id:
            state = (
                "is not capturing"
                if status == _NONE
                else ("captures into another capture" if status == _ACTIVE else f"is {status.name}")
            )
            raise CaptureRefusedError(f"{what}: {s!r} {state}; fork it into this capture first (Capture.fork)")
        self._side.setdefault(s.ptr, s)  # a stream the caller joined by its own event wait
        return s

    def _event(self) -> Event:
        event = Event(timing=False, device=self.stream.device)
        self._events.append(event)
        return event

    def fork(self, streams: int | Sequence[Any] | Any, after: Any = None) -> list[Stream]:
        """Join side streams into the capture after everything captured so far on ``after``.

        ``cuEventRecord`` on ``after`` (default: the origin stream), then ``cuStreamWaitEvent``
        on each side stream: a side stream not capturing yet is then captured into this graph, and
        the next work on it depends on the nodes the event holds. No node is added.

        Parameters
        ----------
        streams : int, Stream or sequence of streams
            An int takes that many of the streams made by ``Capture(side_streams=...)``.
        after : Stream, optional
            A stream of this capture to fork from (default the origin).

        Returns
        -------
        list of Stream

        Raises
        ------
        CaptureRefusedError
            A default stream, the stream forked from, a stream of another capture, or more
            streams than were made in advance (all refused before the driver is called).

        See Also
        --------
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        cuStreamWaitEvent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        if not self._open:
            raise RawgraphError("Capture.fork outside the with-block")
        source = self._in_capture(self.stream if after is None else after, "fork after")
        if isinstance(streams, bool):
            raise TypeError("streams must be a count or streams")
        if isinstance(streams, int):
            if streams < 1 or self._handed + streams > len(self._pool):
                raise CaptureRefusedError(
                    f"fork({streams}): {len(self._pool) - self._handed} of the capture's own side streams are left; "
                    "make them before the capture (Capture(stream, side_streams=n)) or pass your own streams"
                )
            targets = self._pool[self._handed : self._handed + streams]
            self._handed += streams
        else:
            seq = list(streams) if isinstance(streams, (list, tuple)) else [streams]
            targets = [as_stream(s) for s in seq]
        seen: set[int] = set()
        for t in targets:
            if t.is_default:
                raise CaptureRefusedError(f"fork: {t!r} is a default stream; side streams must be rawgraph.Stream()s")
            if t.ptr == source.ptr or t.ptr in seen:
                raise CaptureRefusedError(f"fork: {t!r} is named twice or is the stream forked from")
            if int(t.device.context) != int(self.stream.device.context):
                raise CaptureRefusedError(f"fork: {t!r} belongs to another context than the capturing stream")
            status, cid, _g, _d = capture_info(t.handle)
            if status != _NONE and not (status == _ACTIVE and cid == self._id):
                raise CaptureRefusedError(
                    f"fork: {t!r} is part of another capture ({status.name}); the driver would merge or reject the two"
                )
            seen.add(t.ptr)
        event = self._event()
        call(driver.cuEventRecord, event.handle, source.handle)
        for t in targets:
            call(driver.cuStreamWaitEvent, t.handle, event.handle, 0)
            self._side.setdefault(t.ptr, t)
        return targets

    def join(self, streams: Sequence[Any] | Any | None = None, into: Any = None) -> None:
        """Join side streams back: ``cuEventRecord`` on each, ``cuStreamWaitEvent`` on ``into``
        (default the origin), so the next work there (and the end of the capture) depends on
        everything they captured. No node is added. ``streams`` defaults to every side stream
        known to this capture.

        See Also
        --------
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        cuStreamWaitEvent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        if not self._open:
            raise RawgraphError("Capture.join outside the with-block")
        target = self._in_capture(self.stream if into is None else into, "join into")
        if streams is None:
            sources = [s for s in self._side.values() if s.ptr != target.ptr]
        else:
            seq = list(streams) if isinstance(streams, (list, tuple)) else [streams]
            sources = [self._in_capture(s, "join") for s in seq]
        for s in sources:
            if s.ptr == target.ptr:
                raise CaptureRefusedError(f"join: {s!r} is the stream joined into")
            event = self._event()
            call(driver.cuEventRecord, event.handle, s.handle)
            call(driver.cuStreamWaitEvent, target.handle, event.handle, 0)

    # -- recorded operations --------------------------------------------------------------
    def launch(self, launch: Launch, stream: Any = None, buffers: dict[str, DeviceArray] | None = None) -> KernelNode:
        """Launch into the capture on ``stream`` (default the origin; else a stream of this
        capture) and record the node it became and its dependencies (``cuStreamGetCaptureInfo``
        before and after the launch).

        ``buffers`` names the arrays ``launch.uses`` points at (a plan's buffers, or what a
        :class:`~rawgraph.RawKernel` call was given): when every recorded launch's arrays are
        named, and no name stands for two arrays, the graph gets a plan of its own
        (``graph.plan``), so :class:`~rawgraph.ExecUpdateManager` binds it with no plan given.

        See Also
        --------
        cuStreamGetCaptureInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        if not self._open:
            raise RawgraphError("Capture.launch outside the with-block")
        if buffers:
            self.name_buffers(buffers)
        s = self.stream if stream is None else self._in_capture(stream, f"launching {launch.kernel.name}")
        deps = self._deps(s, f"launching {launch.kernel.name}")
        launch(s)
        handle = self._last_node(f"launching {launch.kernel.name}", s)
        node = KernelNode(handle, len(self.nodes), launch, launch.args.snapshot(), deps)
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

    def _deps(self, stream: Stream, what: str) -> tuple[int, ...]:
        status, _cid, _g, deps = capture_info(stream.handle)
        if status != _ACTIVE:
            raise _not_active(status, f"before {what}")
        return deps

    def _last_node(self, what: str, stream: Stream | None = None) -> Any:
        s = self.stream if stream is None else stream
        status, _id, _graph, deps, _edges, ndeps = check(
            driver.cuStreamGetCaptureInfo(s.handle), "cuStreamGetCaptureInfo"
        )
        if status != _ACTIVE:
            raise _not_active(status, f"after {what}")
        if ndeps != 1:
            # After one stream operation the stream depends on exactly the node it made.
            raise RawgraphError(f"expected one dependency after {what}, found {ndeps}")
        return deps[0]

    def mem_alloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` inside the graph: ``cuMemAllocAsync`` on the capturing stream becomes
        a memory allocation node, and the address it returns is fixed for the graph's lifetime.

        Graph memory is physical only while a replay runs between this node and its free; the
        driver reuses it across graphs launched into the same stream (see
        :mod:`rawgraph.serving.graphmem`).

        See Also
        --------
        cuMemAllocAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC_ASYNC.html
        """
        if not self._open:
            raise RawgraphError("Capture.mem_alloc outside the with-block")
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes}")
        ptr = int(call(driver.cuMemAllocAsync, int(nbytes), self.stream.handle))
        self.other_nodes.append((self._last_node("cuMemAllocAsync"), "alloc", ptr))
        return ptr

    def mem_free(self, ptr: int) -> None:
        """Free graph memory inside the graph (``cuMemFreeAsync`` becomes a memory free node).

        See Also
        --------
        cuMemFreeAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC_ASYNC.html
        """
        if not self._open:
            raise RawgraphError("Capture.mem_free outside the with-block")
        call(driver.cuMemFreeAsync, int(ptr), self.stream.handle)
        self.other_nodes.append((self._last_node("cuMemFreeAsync"), "free", int(ptr)))

    def memcpy_htod(self, dst: int, src: int, nbytes: int) -> None:
        """Record a host-to-device copy (``cuMemcpyHtoDAsync`` becomes a memcpy node). From pinned
        host memory (:class:`~rawgraph.runtime.memory.HostBuffer`) the node reads the host bytes when each
        replay reaches it, not at capture.

        See Also
        --------
        cuMemcpyHtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        if not self._open:
            raise RawgraphError("Capture.memcpy_htod outside the with-block")
        call(driver.cuMemcpyHtoDAsync, int(dst), int(src), int(nbytes), self.stream.handle)
        self.other_nodes.append((self._last_node("cuMemcpyHtoDAsync"), "memcpy", (int(dst), int(src), int(nbytes))))

    def event_record(self, event: Any) -> None:
        """Record ``event`` inside the graph (``cuEventRecordWithFlags`` with
        ``CU_EVENT_RECORD_EXTERNAL`` becomes an event record node): each replay records it when it
        reaches this point, so the host can tell how far a queued replay has got.

        See Also
        --------
        cuEventRecordWithFlags : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        if not self._open:
            raise RawgraphError("Capture.event_record outside the with-block")
        event._check_open()
        call(
            driver.cuEventRecordWithFlags,
            event.handle,
            self.stream.handle,
            int(driver.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL),
        )
        self.other_nodes.append((self._last_node("cuEventRecordWithFlags"), "event", event))

    def run(self, plan: LaunchPlan, stream: Any = None) -> list[KernelNode]:
        """Record every launch of ``plan`` in order on ``stream`` (default the origin; else a
        stream of this capture, see :meth:`fork`)."""
        plan.check_open()
        s = None if stream is None else self._in_capture(stream, "running a plan")
        self.name_buffers(plan.buffers)
        self._plans.append(plan)
        return [self.launch(launch, s) for launch in plan.launches]

    def name_buffers(self, buffers: dict[str, DeviceArray]) -> None:
        """Record names for arrays the recorded launches use (see :meth:`launch`). A name
        already given to another array makes the names ambiguous: the graph then gets no plan."""
        for name, view in buffers.items():
            self._arrays.append(view)  # held by the graph, named or not
            have = self.buffers.get(name)
            if have is None:
                self.buffers[name] = view
            elif (have.ptr, have.nbytes) != (view.ptr, view.nbytes):
                self._names_ok = False

    def buffer_name(self, view: DeviceArray, wanted: str) -> str:
        """The name of ``view`` in this capture: the one it already has (the same address and
        size), else ``wanted``, else ``wanted`` with a number (``y_2``) if another array has it."""
        for name, have in self.buffers.items():
            if (have.ptr, have.nbytes) == (view.ptr, view.nbytes):
                return name
        name, k = wanted, 1
        while name in self.buffers:
            k += 1
            name = f"{wanted}_{k}"
        return name

    def _own_plan(self) -> LaunchPlan | None:
        """A plan describing the recorded launches, when each argument they use is named.

        The plan :meth:`run` recorded, when it is the only thing recorded; else one derived from
        the recorded launches, provided every name stands for one array and each node's captured
        pointer is the address of the array its argument is named for (a launch whose ``uses``
        names the wrong buffer would otherwise be rebound in the wrong place). None otherwise."""
        if not self._names_ok or not self.nodes:
            return None
        launches = [n.launch for n in self.nodes]
        if (
            len(self._plans) == 1
            and len(self._plans[0].launches) == len(launches)
            and all(a is b for a, b in zip(self._plans[0].launches, launches))
        ):
            return self._plans[0]
        used: dict[str, set[str]] = {}
        for node in self.nodes:
            offsets = node.launch.args.offsets
            for arg, use in node.launch.uses.items():
                view = self.buffers.get(use.buffer)
                if view is None:
                    return None
                captured = int.from_bytes(node.captured_args[offsets[arg] : offsets[arg] + 8], "little")
                if captured != view.ptr:
                    return None
                used.setdefault(use.buffer, set()).add(use.role)
        bufs = {n: self.buffers[n] for n in used}
        # An input is memory only read: a name read by every launch is no input when another
        # name for the same bytes is written (two plans recorded in one capture each name a
        # buffer their own way: a gather writes "slot_x", the model reads it as "x").
        written = [(bufs[n].ptr, bufs[n].ptr + bufs[n].nbytes) for n, roles in used.items() if roles != {"read"}]
        inputs = tuple(
            n
            for n, roles in used.items()
            if roles == {"read"}
            and not any(lo < bufs[n].ptr + bufs[n].nbytes and bufs[n].ptr < hi for lo, hi in written)
        )
        outputs = tuple(n for n in used if n not in inputs)
        return LaunchPlan(launches, bufs, inputs, outputs, pdl=None)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self._open = False
        record = self._record
        assert record is not None and self._abandon is not None
        self._abandon.detach()
        try:
            return self._end(exc_type, exc, record)
        finally:
            # _end ended the driver's capture (every stream of it has left capture mode) and then
            # the record; ending the record again here covers a driver call that raised.
            _capturing.end(record)
            _release_side(self._pool, self._events)
            flush_deferred()  # releases garbage collection ran while the capture was open

    def _end(self, exc_type: Any, exc: Any, record: _capturing.CaptureRecord) -> Literal[False]:
        if record.aborted is not None or self.stream.closed:
            reason = record.aborted or "the stream was closed during the capture"
            if record.aborted is None:
                _end_live_capture(self.stream)
            _capturing.end(record)
            if exc_type is not None:
                _add_note(exc, f"rawgraph: {reason}; the capture was ended and its graph discarded")
                return False
            raise ClosedError(f"{reason}; the capture was ended and its graph discarded")
        unjoined: list[Stream] = []
        failed: Exception | None = None
        if exc_type is None and not record.errors and self._side:
            try:
                unjoined = self._unjoined()
            except Exception as e:  # a query failed: the capture must still end, then fail with it
                failed = e
        err, handle = driver.cuStreamEndCapture(self.stream.handle)
        _capturing.end(record)  # not before: see __enter__
        self.end_result = error_name(err)
        if exc_type is not None or record.errors or err != _SUCCESS or failed is not None:
            if handle is not None and int(handle):
                release("cuGraphDestroy", driver.cuGraphDestroy, handle)
        if exc_type is not None:
            _add_note(
                exc,
                f"rawgraph: the capture on {self.stream!r} was ended ({self.end_result}) "
                "and its graph discarded; the stream is usable again",
            )
            return False
        if failed is not None:
            _add_note(failed, f"rawgraph: the capture on {self.stream!r} was ended and its graph discarded")
            raise failed
        if record.errors:
            first = record.errors[0]
            raise CaptureError(
                int(err) if err != _SUCCESS else getattr(first, "code", 0),
                self.end_result if err != _SUCCESS else getattr(first, "name", type(first).__name__),
                f"the capture body caught {len(record.errors)} driver error(s) and went on; the first was: "
                f"{first}. The capture was ended and its graph discarded; the stream is usable again",
                "cuStreamEndCapture",
            ) from first
        if err == _UNJOINED:
            raise self._unjoined_error(int(err), unjoined)
        if err != _SUCCESS:
            check((err,), "cuStreamEndCapture")
        self.graph = self._graph(handle)
        return False

    def _graph(self, handle: Any) -> Graph:
        """The :class:`Graph` of a capture that ended cleanly: the handle with the node map, the
        plan and the arrays the nodes point at; closed again if reading its foreign nodes fails."""
        graph = Graph(handle, self.nodes, self.stream.device)
        graph.plan = self._own_plan()
        # The arrays the nodes point at live as long as the graph, plan or not: a replay reads them.
        graph.arrays = list({id(a): a for a in self._arrays}.values())
        graph.other_nodes = list(self.other_nodes)
        try:
            graph.foreign_nodes = self._foreign(graph)
        except BaseException:
            graph.close()
            raise
        if not graph.nodes and not graph.other_nodes and not graph.foreign_nodes:
            warnings.warn(
                f"the capture on {self.stream!r} recorded no work: the graph is empty",
                EmptyCaptureWarning,
                stacklevel=4,
            )
        return graph

    def _unjoined(self) -> list[Stream]:
        """The side streams whose last captured work the origin does not depend on (yet).

        A side stream is joined when every node of its dependency set is the origin's dependency
        set or an ancestor of it: that is what ``cuStreamEndCapture`` needs (nodes unreachable
        from the origin make it fail with UNJOINED). Read on the graph being captured, which the
        driver lets us read during the capture (``cuStreamGetCaptureInfo``'s ``graph_out``).
        """
        _status, _cid, graph, origin = capture_info(self.stream.handle)
        tails = {}
        for s in self._side.values():
            if s.closed:
                continue
            status, cid, _g, deps = capture_info(s.handle)
            if status == _ACTIVE and cid == self._id:
                tails[s.ptr] = deps
        if not tails or graph is None:
            return []
        _f, _t, _d, n = call(driver.cuGraphGetEdges, graph, 0)
        into: dict[int, list[int]] = {}
        if n:
            frm, to, _data, _n = call(driver.cuGraphGetEdges, graph, n)
            for a, b in zip(frm, to):
                into.setdefault(int(b), []).append(int(a))
        reached, todo = set(origin), list(origin)
        while todo:
            for a in into.get(todo.pop(), ()):
                if a not in reached:
                    reached.add(a)
                    todo.append(a)
        return [self._side[p] for p, deps in tails.items() if not set(deps) <= reached]

    def _unjoined_error(self, code: int, unjoined: list[Stream]) -> CaptureError:
        if unjoined:
            names = ", ".join(repr(s) for s in unjoined)
            what = (
                f"{names} {'was' if len(unjoined) == 1 else 'were'} not joined back into the origin "
                f"stream {self.stream!r}: call Capture.join({'those streams' if len(unjoined) > 1 else 'it'}) "
                "after its last work, before the capture ends"
            )
        else:
            known = ", ".join(repr(s) for s in self._side.values()) or "none"
            what = (
                f"a stream rawgraph did not see was left unjoined (side streams it knows of, all joined: "
                f"{known}); join every stream that waited on an event of this capture"
            )
        still = [s for s in [self.stream, *self._side.values()] if not s.closed and s.is_capturing()]
        if still:
            what += f"; still capturing after the end: {', '.join(map(repr, still))}"
        else:
            what += "; the capture was ended, its graph discarded, and every stream is usable again"
        exc = CaptureError(code, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", what, "cuStreamEndCapture")
        exc.unjoined = unjoined  # type: ignore[attr-defined]  # set on this error only: the streams left unjoined
        return exc

    def _foreign(self, graph: Graph) -> list[ForeignNode]:
        """The graph's nodes this capture did not record, with their types and dependencies."""
        held = graph.all_nodes()
        recorded = {int(n.handle) for n in self.nodes} | {int(h) for h, _k, _d in self.other_nodes}
        ids = {int(h) for h in held}
        if not recorded <= ids:
            raise RawgraphError(
                f"{len(recorded - ids)} recorded node(s) are not in the captured graph: "
                "the node map does not describe this graph"
            )
        rest = [h for h in held if int(h) not in recorded]
        if not rest:
            return []
        types = [call(driver.cuGraphNodeGetType, h).name.replace("CU_GRAPH_NODE_TYPE_", "") for h in rest]
        if self.foreign == "refuse":
            raise RawgraphError(
                f"the captured graph has {len(held)} nodes but {len(recorded)} operations were recorded: "
                f"work was submitted to the stream outside Capture.launch ({', '.join(types)}); "
                "foreign='map' keeps such nodes as graph.foreign_nodes"
            )
        into: dict[int, list[int]] = {}
        for a, b in graph.edges():
            into.setdefault(b, []).append(a)
        return [ForeignNode(h, t, tuple(into.get(int(h), ()))) for h, t in zip(rest, types)]


def _release_side(pool: list[Stream], events: list[Event]) -> None:
    for e in events:
        e.close()
    events.clear()
    for s in pool:
        s.close()


_INVALIDATED = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED


def _not_active(status: Any, where: str) -> CaptureError:
    """The capture is no longer active: invalidated (by an unsafe call anywhere the mode forbids
    it, named like the driver's own error for the next call) or ended."""
    if status == _INVALIDATED:
        err = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        return CaptureError(
            int(err),
            err.name,
            f"the capture was invalidated {where} (an earlier unsafe call, possibly on another thread, broke it)",
            "cuStreamGetCaptureInfo",
        )
    return CaptureError(0, "CAPTURE_NOT_ACTIVE", f"capture status is {status.name} {where}", "cuStreamGetCaptureInfo")


def _add_note(exc: Any, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def _end_live_capture(stream: Stream) -> None:
    """End the driver's capture on a stream closed while it captured and discard its graph.

    A stream closed inside its own capture (global mode, or on the capturing thread) has its
    ``cuStreamDestroy`` deferred like every other release there, and a borrowed stream destroys
    nothing: either way the handle is still valid and still capturing. Ended here, before the
    record closes, so the deferred releases run after the capture rather than into it."""
    # ILLEGAL_STATE too: the stream is no longer capturing (its capture was ended elsewhere, e.g.
    # by the lender of a borrowed stream), so there is nothing left to end or report.
    discard_capture(
        stream.handle,
        "ending the capture of a closed stream",
        accept=(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, driver.CUresult.CUDA_ERROR_ILLEGAL_STATE),
    )


def _abandon_capture(stream: Stream, record: _capturing.CaptureRecord, pool: list[Stream], events: list[Event]) -> None:
    """A Capture collected mid-capture: end its capture and discard the graph (a warning says so)."""
    if shutting_down():
        _capturing.end(record)
        return
    ended_here = record.aborted is None  # else the stream's cuStreamDestroy ended the capture already
    try:
        err = discard_capture(stream.handle) if ended_here else None
    finally:
        _capturing.end(record)
    _release_side(pool, events)
    flush_deferred()
    if ended_here:
        warnings.warn(
            f"a Capture was garbage-collected while capturing on {stream!r}; the capture was ended "
            f"({error_name(err)}) and its graph discarded",
            ResourceWarning,
            stacklevel=2,
        )


def capture_plan(plan: LaunchPlan, stream: Any, mode: CaptureMode = DEFAULT_CAPTURE_MODE, warmup: bool = True) -> Graph:
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


def capture_branches(
    plans: Sequence[LaunchPlan],
    stream: Any,
    fork: bool = True,
    mode: CaptureMode = DEFAULT_CAPTURE_MODE,
    warmup: bool = True,
) -> Graph:
    """Capture independent plans as branches of one graph.

    With ``fork`` plan 0 is captured on ``stream`` and plan ``i`` on a side stream forked from it
    at the start and joined back at the end: the graph holds one independent chain per plan,
    which a replay may run concurrently. Without, every plan is captured on ``stream`` one after
    the other (the linear form: the same launches in one chain). The plans must not write what
    another plan reads or writes.

    The graph holds the plans' buffers (``graph.arrays``). ``graph.plan`` is the plans' union (one
    plan over every launch, binding each name everywhere it is used) when no name stands for two
    arrays, else None; the guards of the plans are not in it, so keep the plans' owners open.
    With ``warmup`` every plan first runs once eagerly on ``stream``, which is then synchronised.
    """
    plans = list(plans)
    if not plans:
        raise ValueError("capture_branches needs at least one plan")
    cap = Capture(stream, mode, side_streams=len(plans) - 1 if fork else 0)
    if warmup:
        for plan in plans:
            plan.run(cap.stream)
        cap.stream.synchronize()
    with cap:
        sides = cap.fork(len(plans) - 1) if fork and len(plans) > 1 else []
        cap.run(plans[0])
        for i, plan in enumerate(plans[1:]):
            cap.run(plan, sides[i] if sides else None)
        if sides:
            cap.join(sides)
    return cap.captured
