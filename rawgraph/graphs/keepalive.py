"""Keeping replaced memory alive until the replays that may read it have run.

An exec reads its arrays where its node parameters point, when each replay reaches those nodes.
After an update moves a node to a new array, replays queued before the update still read the old
one: a caching allocator (PyTorch's, CuPy's pool) that got it back could hand it to someone else
under them. :class:`KeepAlive` holds each replaced object until an event recorded after those
replays (one per stream in the exec's :class:`~rawgraph.runtime.stream.StreamSet`) has fired.

One event per stream covers a whole batch of retired objects, so retiring costs no driver call on
most updates. Used by the exec-update manager, the address rebinder and the indirect graph.

The same rule holds past an exec's own destruction: :func:`hold_for_replays` makes an exec's
release keep what its queued replays call into (a host node's thunk, a device-launched exec)
until a fence after them has fired. Used by the builder and device graph launch.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..runtime import _capturing
from ..runtime.device import Device
from ..runtime.errors import ClosedError, ReleaseWarning
from ..runtime.resource import release, shutting_down
from ..runtime.stream import Event, Fence, StreamSet

if TYPE_CHECKING:  # GraphExec sits above this module
    from .graph import GraphExec


class KeepAlive:
    """Objects no longer bound, held until the replays that may still read them have finished.

    Parameters
    ----------
    streams : StreamSet
        The streams the exec was launched on (``GraphExec.streams``).
    device : Device
        Where the covering events are made.
    batch : int, default 32
        Retired objects collected before a fence is recorded.
    """

    def __init__(self, streams: StreamSet, device: Any, batch: int = 32):
        self.streams = streams
        self.device = device
        self.batch = batch
        self._pending: list[Any] = []
        self._retired: list[tuple[Fence, list[Any]]] = []
        self._events: list[Event] = []  # recycled fence events

    def retire(self, obj: Any) -> None:
        """Hold ``obj`` until the replays queued so far have run (nothing to hold when the exec
        was never launched)."""
        if not self.streams:
            return
        self._pending.append(obj)
        if len(self._pending) >= self.batch:
            self.collect()

    def retire_all(self, objs: Any) -> None:
        """:meth:`retire` each object, even when covering one with a fence fails (it stays
        pending then); the first failure is raised once all are held: none is let go early."""
        error: Exception | None = None
        for obj in objs:
            try:
                self.retire(obj)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def collect(self) -> int:
        """Cover pending objects with a fence (``cuEventRecord`` per stream), release those whose
        fences have fired (``cuEventQuery``); returns how many objects are still held.

        A failed record raises with the pending objects still pending (nothing released early).

        See Also
        --------
        cuEventRecord, cuEventQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        if self._pending:
            fence = self.streams.fence(self._events, self.device)
            self._retired.append((fence, self._pending))
            self._pending = []
        keep = []
        for fence, objs in self._retired:
            if fence.done():
                self._events.extend(fence.owned)
            else:
                keep.append((fence, objs))
        self._retired = keep
        return len(self.retained)

    @property
    def retained(self) -> list[Any]:
        """Every object held now."""
        return [o for _, objs in self._retired for o in objs] + list(self._pending)

    def drain(self) -> None:
        """Wait for every replay that may read a held object, then drop them all.

        The pending ones are covered first (a fence, or, if recording one fails, a synchronize of
        every stream). If waiting fails as well, the objects are kept (a leak is safer than memory
        freed under a running replay) and a :class:`~rawgraph.runtime.errors.ReleaseWarning` says so: this
        never raises half-way.
        """
        try:
            if self._pending:
                try:
                    self.collect()
                except Exception:
                    self.streams.synchronize()
                    self._pending.clear()
            for fence, _ in self._retired:
                fence.synchronize()
                self._events.extend(fence.owned)
            self._retired.clear()
        except Exception as exc:
            warnings.warn(
                f"rawgraph: waiting for the replays that read {len(self.retained)} retired array(s) failed "
                f"({exc}); they stay referenced",
                ReleaseWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        """:meth:`drain`, then release the pooled events; safe twice."""
        self.drain()
        for e in self._events:
            e.close()
        self._events.clear()


# -- objects a queued replay calls into, held past its exec --------------------------------------
# (fence, objects): released by collect_held once the fence has fired.
_held: list[tuple[Fence | None, tuple[Any, ...]]] = []
_held_lock = threading.Lock()


def hold_for_replays(exe: GraphExec, objs: Iterable[Any]) -> None:
    """Make ``exe``'s release keep ``objs`` alive until the replays it queued have run.

    ``cuGraphExecDestroy`` returns at once and the driver still runs the launches queued before
    it; those replays call into memory the driver does not own (a host node's ctypes thunk, an exec
    a kernel device-launches). So ``exe``'s one release (``close()``, garbage collection or exit)
    becomes: record a fence on every stream ``exe`` was launched on (``exe.streams``,
    ``cuEventRecord``), ``cuGraphExecDestroy``, then hold ``objs`` until the fence has fired
    (:func:`collect_held` lets them go; it runs on every later hold and every built-graph
    instantiate). If recording the fence fails the streams are synchronized instead
    (``cuStreamSynchronize``); if that fails too the objects are kept for good and a
    :class:`~rawgraph.runtime.errors.ReleaseWarning` says so: a leak is safer than a call into freed
    memory. Inside a capture the whole release waits for the capture's end, like every release.
    At interpreter exit the streams are synchronized, so no queued replay outlives the callbacks.

    Launches made around :meth:`GraphExec.launch` (a raw ``cuGraphLaunch`` on the handle) are not
    seen and not covered.

    Raises
    ------
    ClosedError
        ``exe`` is closed (checked before anything changes).

    See Also
    --------
    cuGraphExecDestroy, cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    """
    objs = tuple(objs)
    info = exe._finalizer.peek()
    if info is None:
        raise ClosedError("GraphExec is closed")
    if not objs:
        return
    _obj, func, args, kwargs = info
    if func is release and not kwargs:
        name, fn, fnargs = args[0], args[1], tuple(args[2:])
    else:  # not a resource.release finalizer: run it as the inner release
        name, fn, fnargs = "GraphExec release", _call_kwargs, (func, args, kwargs)
    exe._finalizer.detach()
    exe._finalizer = weakref.finalize(
        exe, release, name, _destroy_then_hold, fn, fnargs, exe.streams, exe.graph.device, objs
    )
    collect_held()


def _call_kwargs(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


def _destroy_then_hold(
    fn: Callable[..., Any], fnargs: tuple[Any, ...], streams: StreamSet, device: Device, objs: tuple[Any, ...]
) -> Any:
    """The release :func:`hold_for_replays` installs: fence, destroy, hold (never raises half-way)."""
    _hold(streams, device, objs)  # first: the fence must follow every launch that was queued
    return fn(*fnargs)


def _hold(streams: StreamSet, device: Device, objs: tuple[Any, ...]) -> None:
    if not streams:
        return  # never launched: no replay can call into them
    if shutting_down():
        # Nothing will collect later; let the queued replays run while the objects still exist.
        try:
            streams.synchronize()
        except Exception:  # the driver may be gone at exit: nothing more to do
            pass
        return
    try:
        fence = streams.fence(None, device)
    except Exception as exc:
        try:
            streams.synchronize()
            return
        except Exception as exc2:
            warnings.warn(
                f"rawgraph: destroying an exec: recording a fence after its replays failed ({exc}) and so "
                f"did waiting for them ({exc2}); {len(objs)} object(s) its replays may call stay referenced",
                ReleaseWarning,
                stacklevel=3,
            )
            with _held_lock:
                _held.append((None, objs))  # never released
            return
    with _held_lock:
        _held.append((fence, objs))
    collect_held()


def collect_held() -> int:
    """Let go of the objects held for replays that have finished (``cuEventQuery`` on their
    fences, ``cuEventDestroy`` of the fence events); returns how many objects are still held.

    Does nothing while a capture forbids driver calls on this thread (the next call after it does
    the work). Safe from any thread.

    See Also
    --------
    cuEventQuery, cuEventDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    """
    if _capturing.forbids_unsafe_calls():
        with _held_lock:
            return sum(len(o) for _f, o in _held)
    done: list[tuple[Fence, tuple[Any, ...]]] = []
    keep: list[tuple[Fence | None, tuple[Any, ...]]] = []
    with _held_lock:
        for fence, objs in _held:
            try:
                finished = fence is not None and bool(fence.done())
            except Exception:  # a query failed (a sticky context error): keep them
                finished = False
            if finished and fence is not None:  # (never without a fence: those stay for good)
                done.append((fence, objs))
            else:
                keep.append((fence, objs))
        _held[:] = keep
        still = sum(len(o) for _f, o in keep)
    # Outside the lock: dropping the objects may run other releases (an exec this one held).
    for fence, _objs in done:
        for ev in fence.owned:
            ev.close()
    done.clear()
    return still


def held_objects() -> list[Any]:
    """Every object held now for replays of destroyed execs (for tests and reports)."""
    with _held_lock:
        return [o for _f, objs in _held for o in objs]
