"""Streams and events (``cuStreamCreate``, ``cuEventCreate``), and streams borrowed from anywhere.

Every rawgraph API that takes a stream accepts a :class:`Stream` or anything
:meth:`Stream.from_external` understands: an object with ``__cuda_stream__`` (the CUDA stream
protocol of cuda.core and CuPy), a ``torch.cuda.Stream``, a CuPy stream, a
``cuda.bindings.driver.CUstream`` or a raw handle (``int``). A :class:`Stream` in turn implements
``__cuda_stream__``, so CuPy (``cupy.cuda.Stream.from_external``) and cuda.core take rawgraph's
streams.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Collection
from typing import Any

from cuda.bindings import driver

from . import _capturing
from .device import Device, get_device
from .errors import ClosedError, NotOnDeviceError, ReleaseWarning, call, check, cuda_error, error_name
from .resource import Resource, release, shutting_down

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY
_NONE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_CAPTURE_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_END_INVALIDATED = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED

# Handles with a fixed meaning: 0 and CU_STREAM_LEGACY (1) are the legacy default stream,
# CU_STREAM_PER_THREAD (2) the per-thread default stream. None of them can be captured.
LEGACY_HANDLES = (0, 1)
PER_THREAD_HANDLE = 2
SPECIAL_HANDLES = (0, 1, 2)


def discard_capture(handle: Any, abandoning: str | None = None, accept: Collection[Any] = ()) -> Any:
    """End the capture on ``handle`` and discard its graph: for captures being abandoned.

    ``cuStreamEndCapture`` on ``handle``, then ``cuGraphDestroy`` (a release) of the graph it
    returned, if any.

    Parameters
    ----------
    handle : CUstream
        The capturing stream (the capture's origin).
    abandoning : str, optional
        What the caller is doing, for the warning, e.g. ``"closing a capturing stream"``. With it,
        a result that is neither ``CUDA_SUCCESS`` nor in ``accept`` is reported as a
        :class:`~rawgraph.runtime.errors.ReleaseWarning` (``cuStreamEndCapture failed while
        <abandoning>: <error>``), quietly at interpreter exit like every release. Without it
        nothing is reported and the caller judges the result.
    accept : collection of CUresult, default ()
        Results that are no failure for this caller besides ``CUDA_SUCCESS`` (an invalidated
        capture still ends, and its graph is gone either way). Only read with ``abandoning``.

    Returns
    -------
    CUresult
        The result of ``cuStreamEndCapture``.

    See Also
    --------
    cuStreamEndCapture : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuGraphDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    err, graph = driver.cuStreamEndCapture(handle)
    if graph is not None and int(graph):
        release("cuGraphDestroy", driver.cuGraphDestroy, graph)
    if abandoning is not None and err != _SUCCESS and err not in accept and not shutting_down():
        # stacklevel 4 names the caller's caller's caller, the frame each caller named with its
        # own stacklevel=3 when the warning was theirs.
        warnings.warn(
            f"rawgraph: cuStreamEndCapture failed while {abandoning}: {error_name(err)}", ReleaseWarning, stacklevel=4
        )
    return err


def _destroy_stream(handle: Any) -> tuple[Any, ...]:
    """``cuStreamDestroy``, ending a capture still open on the stream first (its graph is
    discarded): a stream destroyed mid-capture would otherwise leave the capture dangling."""
    err, status = driver.cuStreamIsCapturing(handle)
    if err == _SUCCESS and status != _NONE:
        _capturing.abandon_stream(int(handle), "the stream was closed during the capture")
        discard_capture(handle, "closing a capturing stream", accept=(_END_INVALIDATED,))
    result: tuple[Any, ...] = driver.cuStreamDestroy(handle)
    return result


def _handle_of(obj: Any) -> int:
    """The raw ``CUstream`` value of any stream-like object (see the module docstring)."""
    proto = getattr(obj, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto  # early cuda.core had a property
        version, handle = value
        if int(version) != 0:
            raise TypeError(f"unsupported __cuda_stream__ protocol version {version}")
        return int(handle)
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream (older releases)
        value = getattr(obj, attr, None)
        if isinstance(value, int):
            return value
    if isinstance(obj, driver.CUstream):
        return int(obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    raise TypeError(
        f"{type(obj).__name__} is not a stream: pass a rawgraph.Stream, an object with __cuda_stream__, "
        "a torch.cuda.Stream, a CuPy stream, a CUstream or a raw handle"
    )


# Borrowed-stream wrappers by (handle, device ordinal), held weakly: while anything holds one (an
# exec's StreamSet, a Capture), wrapping the same handle again returns it. Nothing here keeps a
# lender's stream object alive.
_wrappers: weakref.WeakValueDictionary[tuple[int, int], Stream] = weakref.WeakValueDictionary()
# Handles already checked against the device's context (cuStreamGetCtx) and their non-blocking
# flag, so a fresh wrapper of a known handle makes no driver call. A handle the driver reused for
# a stream of another context after the first was destroyed would pass unchecked (the launch then
# fails in the driver instead); bounded, oldest dropped first.
_checked: dict[tuple[int, int], bool] = {}
_CHECKED_MAX = 64


class Stream(Resource):
    """A CUDA stream (``cuStreamCreate`` / ``cuStreamDestroy``), owned or borrowed.

    Non-blocking by default (``CU_STREAM_NON_BLOCKING``): it does not synchronise with the legacy
    NULL stream, which is also what stream capture needs. :meth:`legacy` and
    :meth:`from_external` give non-owning handles (``close()`` releases nothing).

    Closing a stream that is still capturing ends the capture first and discards its graph.

    Parameters
    ----------
    non_blocking : bool, default True
    device : Device, optional

    Attributes
    ----------
    handle : CUstream
    ptr : int
        The handle as an integer.
    owned : bool
        False for borrowed streams (legacy, external).

    See Also
    --------
    cuStreamCreate, cuStreamDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    """

    handle: Any  # driver.CUstream
    ptr: int
    owned: bool
    source: Any  # a borrowed stream's lender (kept alive), else None
    device: Device
    non_blocking: bool

    def __init__(self, non_blocking: bool = True, device: Device | None = None):
        self.device = (device or get_device()).activate()
        flags = (
            driver.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else driver.CUstream_flags.CU_STREAM_DEFAULT
        )
        self.handle = call(driver.cuStreamCreate, int(flags))
        self.ptr = int(self.handle)
        self.non_blocking = non_blocking
        self.owned = True
        self.source = None
        self._own(_destroy_stream, self.handle, name="cuStreamDestroy")

    @classmethod
    def _borrowed(cls, handle: int, device: Device, non_blocking: bool, source: Any) -> Stream:
        self = cls.__new__(cls)
        self.device = device
        self.handle = driver.CUstream(handle)
        self.ptr = int(handle)
        self.non_blocking = non_blocking
        self.owned = False
        self.source = source  # keeps the lender's object (and so its stream) alive
        self._own_nothing()
        return self

    @classmethod
    def legacy(cls, device: Device | None = None) -> Stream:
        """The legacy NULL stream (handle 0). Not owned; never capturable."""
        return cls._borrowed(0, device or get_device(), False, None)

    @classmethod
    def from_external(cls, obj: Any, device: Device | None = None) -> Stream:
        """Borrow a stream made by someone else; rawgraph never destroys it.

        Parameters
        ----------
        obj : object
            Anything with ``__cuda_stream__`` (cuda.core, CuPy >= 13, rawgraph), a
            ``torch.cuda.Stream`` (``cuda_stream``), a CuPy stream (``ptr``), a ``CUstream`` or a
            raw handle. A rawgraph :class:`Stream` is returned as it is.
        device : Device, optional
            The device the stream belongs to (default: device 0). For ordinary handles this is
            checked with ``cuStreamGetCtx``.

        Raises
        ------
        TypeError
            ``obj`` is not a stream.
        NotOnDeviceError
            The stream belongs to another context than ``device``'s primary context.
        ClosedError
            ``obj`` is a closed rawgraph stream.

        See Also
        --------
        cuStreamGetCtx : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        if isinstance(obj, Stream):
            obj._check_open()
            return obj
        handle = _handle_of(obj)
        dev = device or get_device()
        key = (handle, dev.ordinal)
        known = _wrappers.get(key)
        if known is not None and known._finalizer.alive:
            # Someone still holds the wrapper of this handle (an exec's stream registry, a
            # capture): its lender is alive, so the handle is still that stream. Reusing it
            # makes a launch on a torch or CuPy stream cost no driver call and no new finalizer.
            return known
        non_blocking = _checked.get(key)
        if non_blocking is None:
            non_blocking = False
            if handle not in SPECIAL_HANDLES:
                ctx = call(driver.cuStreamGetCtx, handle)
                if int(ctx) != int(dev.context):
                    raise NotOnDeviceError(
                        f"stream 0x{handle:x} belongs to another context than device {dev.ordinal}'s primary context"
                    )
                flags = int(call(driver.cuStreamGetFlags, handle))
                non_blocking = bool(flags & int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
            if len(_checked) >= _CHECKED_MAX:
                _checked.pop(next(iter(_checked)))
            _checked[key] = non_blocking
        wrapper = cls._borrowed(handle, dev, non_blocking, obj)
        _wrappers[key] = wrapper
        return wrapper

    # -- the CUDA stream protocol ---------------------------------------------------------
    def __cuda_stream__(self) -> tuple[int, int]:
        """``(0, handle)``: version 0 of the CUDA stream protocol (cuda.core, CuPy)."""
        self._check_open()
        return (0, self.ptr)

    @property
    def is_legacy(self) -> bool:
        """The legacy default stream (handle 0 or ``CU_STREAM_LEGACY``)."""
        return self.ptr in LEGACY_HANDLES

    @property
    def is_default(self) -> bool:
        """A default stream (legacy or per-thread): launchable, never capturable."""
        return self.ptr in SPECIAL_HANDLES

    # -- operations -----------------------------------------------------------------------
    def synchronize(self) -> None:
        """Block until all work on the stream is done (``cuStreamSynchronize``).

        See Also
        --------
        cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        self._check_open()
        call(driver.cuStreamSynchronize, self.handle)

    def query(self) -> bool:
        """True when all work on the stream is done (``cuStreamQuery``).

        See Also
        --------
        cuStreamQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        self._check_open()
        (err,) = driver.cuStreamQuery(self.handle)
        if err == _NOT_READY:
            return False
        if err != _SUCCESS:
            raise cuda_error(err, "cuStreamQuery")
        return True

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` (``cuStreamWaitEvent``).

        See Also
        --------
        cuStreamWaitEvent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        self._check_open()
        event._check_open()
        call(driver.cuStreamWaitEvent, self.handle, event.handle, 0)

    def capture_status(self) -> Any:
        """``cuStreamIsCapturing``: a ``CUstreamCaptureStatus`` (NONE, ACTIVE or INVALIDATED).

        See Also
        --------
        cuStreamIsCapturing : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        self._check_open()
        return call(driver.cuStreamIsCapturing, self.handle)

    def is_capturing(self) -> bool:
        """``cuStreamIsCapturing`` != NONE (an invalidated capture still counts until it ends).

        See Also
        --------
        cuStreamIsCapturing : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        return bool(self.capture_status() != _NONE)

    def close(self) -> None:
        """Release the stream (``cuStreamDestroy``; nothing for a borrowed one); safe twice.

        ``cuStreamDestroy`` returns at once and the driver finishes the work still queued. So that
        holders who launched on this stream (an exec's :class:`StreamSet`, ``StreamOrder``) can
        still wait for that work, an event is recorded first (``cuEventRecord``): :attr:`tail`.
        If that record fails the stream is synchronized instead (``cuStreamSynchronize``), and if
        that fails too the failure is reported as a :class:`~rawgraph.runtime.errors.ReleaseWarning`:
        closing never stops half-way.

        See Also
        --------
        cuStreamDestroy, cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        if self._finalizer.alive and self.tail is None and not _capturing.forbids_unsafe_calls():
            self.tail = _tail_event(self)
        self._finalizer()

    tail: Event | None = None
    """An event recorded by :meth:`close` after the work queued before it; None before the stream
    is closed, and when it was closed with nothing to wait for (the record failed and the stream was
    synchronized, or the stream was capturing)."""

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        if self.ptr == PER_THREAD_HANDLE:
            kind = "per-thread default"
        elif self.is_legacy:
            kind = "legacy"
        else:
            kind = "non-blocking" if self.non_blocking else "blocking"
        owner = "" if self.owned else " borrowed"
        return f"<Stream {kind}{owner} 0x{self.ptr:x}{' closed' if self.closed else ''}>"


def _tail_event(stream: Stream) -> Event | None:
    """The closing stream's tail event (see :meth:`Stream.close`), or None once its work is done."""
    try:
        err, status = driver.cuStreamIsCapturing(stream.handle)
        if err == _SUCCESS and status != _NONE:
            return None  # the capture is discarded with the stream: nothing of it will run
        ev = Event(timing=False, device=stream.device)
        try:
            call(driver.cuEventRecord, ev.handle, stream.handle)
        except Exception:
            ev.close()
            raise
        return ev
    except Exception as exc:  # no event: wait here instead, so holders have nothing to wait for
        (err,) = driver.cuStreamSynchronize(stream.handle)
        if err != _SUCCESS and not shutting_down():
            warnings.warn(
                f"rawgraph: closing {stream!r}: recording its tail event failed ({exc}) and so did "
                f"cuStreamSynchronize ({error_name(err)}); work it queued may still be running",
                ReleaseWarning,
                stacklevel=3,
            )
        return None


class StreamSet:
    """The streams something was launched on, and a way to wait for what they queued.

    An exec's replays run on whatever streams its launches named. Whoever holds memory a replay
    reads (a bound array that was just replaced) must wait for those replays to finish before
    letting it go. :class:`~rawgraph.graphs.graph.GraphExec` keeps one of these (``exec.streams``): every
    :meth:`~rawgraph.graphs.graph.GraphExec.launch` notes its stream, one dict lookup.

    A stream closed since its launch cannot take an event any more; its :attr:`Stream.tail` (the
    event :meth:`Stream.close` recorded) stands for it until that event has fired.
    """

    __slots__ = ("streams", "_closed")

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        # closed streams whose handle value a newer stream took over in ``streams``
        self._closed: list[Stream] = []

    def note(self, stream: Stream) -> None:
        """Remember ``stream`` (the hot path: one dict lookup when it is known)."""
        known = self.streams.get(stream.ptr)
        if known is not stream:
            if known is not None and known.closed and known.tail is not None:
                self._closed.append(known)  # its handle was reused: keep waiting for its tail
            self.streams[stream.ptr] = stream

    def __bool__(self) -> bool:
        return bool(self.streams) or bool(self._closed)

    def fence(self, pool: list[Event] | None = None, device: Device | None = None) -> Fence:
        """Events that fire once everything queued so far on these streams has run.

        Records an event (``cuEventRecord``) on each open stream, taken from ``pool`` when it holds
        one; a closed stream contributes its tail event until that has fired, then is forgotten.
        A failed record raises (:class:`~rawgraph.runtime.errors.CudaError`) after returning the events
        already taken to ``pool``: nothing is left half-covered.

        See Also
        --------
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        owned: list[Event] = []
        borrowed: list[Event] = []
        try:
            for ptr, s in list(self.streams.items()):
                if s.closed:
                    if s.tail is not None and not s.tail.query():
                        borrowed.append(s.tail)
                    else:
                        del self.streams[ptr]
                    continue
                ev = pool.pop() if pool else Event(timing=False, device=device or s.device)
                try:
                    ev.record(s)
                except BaseException:
                    if pool is not None:
                        pool.append(ev)
                    else:
                        ev.close()
                    raise
                owned.append(ev)
            keep = []
            for s in self._closed:
                if s.tail is not None and not s.tail.query():
                    borrowed.append(s.tail)
                    keep.append(s)
            self._closed = keep
        except BaseException:
            if pool is not None:
                pool.extend(owned)
            else:
                for ev in owned:
                    ev.close()
            raise
        return Fence(owned, borrowed)

    def synchronize(self) -> None:
        """Block until everything queued on these streams has run (``cuStreamSynchronize`` on the
        open ones, ``cuEventSynchronize`` on the tails of closed ones).

        See Also
        --------
        cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        for ptr, s in list(self.streams.items()):
            if s.closed:
                if s.tail is not None:
                    s.tail.synchronize()
                del self.streams[ptr]
            else:
                s.synchronize()
        for s in self._closed:
            if s.tail is not None:
                s.tail.synchronize()
        self._closed = []

    def clear(self) -> None:
        self.streams.clear()
        self._closed = []


class Fence:
    """Events covering the work queued on a :class:`StreamSet` when :meth:`StreamSet.fence` ran.

    ``owned`` events were recorded for this fence (the holder recycles them); ``borrowed`` are the
    tail events of closed streams (owned by those streams).
    """

    __slots__ = ("owned", "borrowed")

    owned: list[Event]
    borrowed: list[Event]

    def __init__(self, owned: list[Event], borrowed: list[Event]):
        self.owned, self.borrowed = owned, borrowed

    def done(self) -> bool:
        """True once every event has fired (``cuEventQuery``).

        See Also
        --------
        cuEventQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        return all(e.query() for e in self.owned) and all(e.closed or e.query() for e in self.borrowed)

    def synchronize(self) -> None:
        """``cuEventSynchronize`` on every event.

        See Also
        --------
        cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        for e in self.owned:
            e.synchronize()
        for e in self.borrowed:
            if not e.closed:
                e.synchronize()


def as_stream(obj: Any) -> Stream:
    """``obj`` as a :class:`Stream` (itself, or borrowed with :meth:`Stream.from_external`)."""
    if isinstance(obj, Stream):
        obj._check_open()
        return obj
    return Stream.from_external(obj)


def stream_handle(obj: Any) -> Any:
    """The handle to pass to the driver for a stream-like ``obj``, checked: the hot-path form of
    :func:`as_stream` (a rawgraph stream costs one liveness check; others are resolved)."""
    if isinstance(obj, Stream):
        if not obj._finalizer.alive:
            raise ClosedError("Stream is closed")
        return obj.handle
    return as_stream(obj).handle


class Event(Resource):
    """A CUDA event (``cuEventCreate`` / ``cuEventDestroy``); timing on unless ``timing=False``.

    See Also
    --------
    cuEventCreate, cuEventDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    """

    handle: Any  # driver.CUevent

    def __init__(self, timing: bool = True, device: Device | None = None):
        (device or get_device()).activate()
        flags = 0 if timing else int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.handle = call(driver.cuEventCreate, flags)
        self._own(driver.cuEventDestroy, self.handle)

    def record(self, stream: Any) -> Event:
        """``cuEventRecord`` on ``stream`` (any stream-like object).

        See Also
        --------
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        self._check_open()
        call(driver.cuEventRecord, self.handle, stream_handle(stream))
        return self

    def synchronize(self) -> None:
        """``cuEventSynchronize``: block until the work before the record has finished.

        See Also
        --------
        cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        self._check_open()
        call(driver.cuEventSynchronize, self.handle)

    def query(self) -> bool:
        """True once the work before the record has finished (``cuEventQuery``).

        See Also
        --------
        cuEventQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        self._check_open()
        (err,) = driver.cuEventQuery(self.handle)
        if err == _NOT_READY:
            return False
        if err != _SUCCESS:
            raise cuda_error(err, "cuEventQuery")
        return True

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (``cuEventElapsedTime``; both recorded, ~0.5 us resolution).

        See Also
        --------
        cuEventElapsedTime : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        self._check_open()
        end._check_open()
        return float(call(driver.cuEventElapsedTime, self.handle, end.handle))


def capture_info(handle: Any) -> tuple[Any, int, Any, tuple[int, ...]]:
    """``cuStreamGetCaptureInfo`` of a stream: ``(status, capture id, graph, dependencies)``.

    The dependencies are the node handles (as integers) the next node captured on the stream will
    depend on; the id and graph are meaningful only while the status is ACTIVE.

    See Also
    --------
    cuStreamGetCaptureInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    """
    status, cid, graph, deps, _edges, ndeps = check(driver.cuStreamGetCaptureInfo(handle), "cuStreamGetCaptureInfo")
    if status != _CAPTURE_ACTIVE:
        return status, 0, None, ()
    return status, int(cid), graph, tuple(int(d) for d in list(deps or [])[: int(ndeps)])
