"""Which rawgraph captures are active: process-wide and per thread. Imports nothing of rawgraph.

Three rules need this knowledge below the capture module:

- the context-wide fence (``cuCtxSynchronize``) fails inside *any* thread's capture and
  invalidates that capture, whatever its mode (measured, driver 580), so rawgraph refuses it while
  one of its captures is active anywhere in the process (:func:`active`);
- a release that garbage collection runs while a capture is open (a finalizer can fire between
  any two bytecodes) must not call ``cuMemFree`` and friends into it: that fails and invalidates
  the capture, so :mod:`rawgraph.runtime.resource` defers it until the capture ends
  (:func:`forbids_unsafe_calls`);
- a capture body that catches a driver error and carries on must not end with a half-built
  graph, so every rawgraph error raised on a capturing thread is noted on that thread's open
  captures (:func:`note_error`), and the capture fails at its end.

Captures made by other libraries (PyTorch, CuPy) are not seen here.
"""

from __future__ import annotations

import threading
from typing import Any

# Reentrant: garbage collection can start inside ``with _lock`` (at any allocation) and run a
# finalizer whose release asks forbids_unsafe_calls() on the same thread.
_lock = threading.RLock()
_active: dict[int, CaptureRecord] = {}
_local = threading.local()


class CaptureRecord:
    """One open capture: where, how, and what went wrong inside it.

    Attributes
    ----------
    stream : int
        The capturing stream's handle.
    mode : str
        The capture mode's name.
    thread : str
        Name of the thread that began it.
    errors : list of Exception
        rawgraph errors raised on that thread while the capture was open.
    aborted : str or None
        Why the capture was ended by someone else (the stream was closed), if it was.
    """

    __slots__ = ("stream", "mode", "thread", "ident", "errors", "aborted", "capture_id", "owner")

    def __init__(self, stream: int, mode: str, capture_id: int = 0, owner: Any = None):
        self.stream = int(stream)
        self.mode = mode
        self.thread = threading.current_thread().name
        self.ident = threading.get_ident()
        self.errors: list[BaseException] = []
        self.aborted: str | None = None
        # The driver's id of this capture and a weak reference to the object recording it (weak:
        # a capture collected mid-capture must still be collectable, see Capture's finalizer).
        self.capture_id = int(capture_id)
        self.owner = owner

    def describe(self) -> str:
        return f"stream 0x{self.stream:x} ({self.mode} mode, thread {self.thread!r})"


def begin(record: CaptureRecord) -> None:
    """Register ``record`` as open on this thread and in the process."""
    with _lock:
        _active[id(record)] = record
    stack = getattr(_local, "records", None)
    if stack is None:
        stack = _local.records = []
    stack.append(record)


def end(record: CaptureRecord) -> None:
    """Forget ``record`` (safe twice, and from another thread than the one that began it)."""
    with _lock:
        _active.pop(id(record), None)
    stack = getattr(_local, "records", None)
    if stack and record in stack:
        stack.remove(record)


def active() -> list[CaptureRecord]:
    """Every open rawgraph capture in the process."""
    with _lock:
        return list(_active.values())


def record_of(capture_id: int) -> CaptureRecord | None:
    """The open rawgraph capture with the driver's capture id ``capture_id`` that records launches
    (its ``owner``, a weak reference to the capture object, is set), or None (another library's
    capture, or none). Lets a launch made on a capturing stream outside ``Capture.launch`` (a
    :class:`~rawgraph.RawKernel` call) be recorded in the node map, by the capturing thread."""
    with _lock:
        for rec in _active.values():
            if rec.capture_id == capture_id and rec.owner is not None:
                return rec
    return None


def forbids_unsafe_calls() -> bool:
    """Whether an unsafe call (``cuMemFree``, ``cuGraphExecDestroy``, ...) made on this thread now
    would fail and invalidate a rawgraph capture: one is open in global mode anywhere, or in any
    mode on this thread. Cheap when nothing captures (no lock).

    See Also
    --------
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuGraphExecDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    if not _active:
        return False
    me = threading.get_ident()
    return any(r.mode == "GLOBAL" or r.ident == me for r in active())


def abandon_stream(stream: int, reason: str) -> None:
    """Mark the captures on ``stream`` as ended by someone else (the stream is being destroyed)."""
    with _lock:
        for rec in _active.values():
            if rec.stream == int(stream):
                rec.aborted = reason


def note_error(exc: Any) -> None:
    """Record ``exc`` on every capture open on this thread (called as rawgraph builds an error)."""
    stack = getattr(_local, "records", None)
    if stack:
        for rec in stack:
            rec.errors.append(exc)
