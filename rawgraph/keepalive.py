"""Keeping replaced memory alive until the replays that may read it have run.

An exec reads its arrays where its node parameters point, when each replay reaches those nodes.
After an update moves a node to a new array, replays queued before the update still read the old
one: a caching allocator (PyTorch's, CuPy's pool) that got it back could hand it to someone else
under them. :class:`KeepAlive` holds each replaced object until an event recorded after those
replays (one per stream in the exec's :class:`~rawgraph.stream.StreamSet`) has fired.

One event per stream covers a whole batch of retired objects, so retiring costs no driver call on
most updates. Used by the exec-update manager, the address rebinder and the indirect graph.
"""

from __future__ import annotations

import warnings
from typing import Any

from .errors import ReleaseWarning
from .stream import Event, Fence, StreamSet


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

        A failed record raises with the pending objects still pending (nothing released early)."""
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
        freed under a running replay) and a :class:`~rawgraph.errors.ReleaseWarning` says so: this
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
            warnings.warn(f"rawgraph: waiting for the replays that read {len(self.retained)} retired array(s) failed "
                          f"({exc}); they stay referenced", ReleaseWarning, stacklevel=3)

    def close(self) -> None:
        """:meth:`drain`, then release the pooled events; safe twice."""
        self.drain()
        for e in self._events:
            e.close()
        self._events.clear()
