"""Ownership of driver resources: one object owns one handle, released exactly once.

A :class:`Resource` registers its release call with ``weakref.finalize``: ``close()`` runs it
(and is safe to call twice), garbage collection runs it if ``close()`` never did, and so does
interpreter exit.

A release that fails is never dropped silently: the driver's ``(err,)`` result (or an exception
from a composite release) becomes a :class:`~rawgraph.runtime.errors.ReleaseWarning` naming the call and
the error. The one exception is interpreter exit, where the driver library may already be
unloaded and a failure says nothing about the program: then releases are quiet.
"""

from __future__ import annotations

import atexit
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from cuda.bindings import driver

from . import _capturing
from .errors import ClosedError, ReleaseWarning, error_name

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_R = TypeVar("_R", bound="Resource")
_exiting = False
_atexit_hooked = False
# How many release calls have run in this process (close, garbage collection or exit). A holder of
# strong references that checked its objects open when this read N knows none was closed since
# while it still reads N: one integer compare instead of a liveness check per object.
release_count: int = 0
# Releases held back while a capture forbade them: (name, fn, args), run by flush_deferred.
_deferred: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
_deferred_lock = threading.RLock()  # reentrant: a finalizer may release inside the with-block


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


def _hook_exit() -> None:
    # atexit runs handlers last-registered-first. weakref.finalize registers its own exit hook
    # when the process creates its first finalizer, so a hook registered after a finalizer exists
    # runs before the finalizers do, and they see the flag.
    global _atexit_hooked
    if not _atexit_hooked:
        _atexit_hooked = True
        atexit.register(_mark_exiting)


def _release_nothing() -> None:
    """What a borrowed handle's owner releases."""


def shutting_down() -> bool:
    """True once the interpreter is exiting (releases are quiet from then on)."""
    return _exiting or sys.is_finalizing()


def release(name: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run one release call; report a failure as a :class:`ReleaseWarning` (quiet at exit).

    ``fn`` is a ``cuda.bindings`` driver function returning ``(err, ...)`` or any callable that
    raises on failure; ``name`` is what the warning calls it.
    """
    global release_count
    release_count += 1
    if _capturing.forbids_unsafe_calls() and not shutting_down():
        # A release inside an open capture (garbage collection, or a close() in the capture body)
        # would fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture: run it
        # when the capture ends (flush_deferred, called by rawgraph.graphs.capture after cuStreamEndCapture).
        with _deferred_lock:
            _deferred.append((name, fn, args))
        return
    _run_release(name, fn, args)


def flush_deferred() -> int:
    """Run the releases deferred while a capture was open, if none forbids them now; returns how
    many ran."""
    if _capturing.forbids_unsafe_calls():
        return 0
    with _deferred_lock:
        todo = list(_deferred)
        _deferred.clear()
    for name, fn, args in todo:
        _run_release(name, fn, args)
    return len(todo)


def _run_release(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result = fn(*args)
    except Exception as exc:  # a composite release raised, or the driver library is gone
        if not shutting_down():
            warnings.warn(f"rawgraph: {name} failed while releasing a resource: {exc}", ReleaseWarning, stacklevel=2)
        return
    if isinstance(result, tuple) and result and result[0] != _SUCCESS and not shutting_down():
        warnings.warn(
            f"rawgraph: {name} failed while releasing a resource: {error_name(result[0])}", ReleaseWarning, stacklevel=2
        )


class Resource:
    """Base for rawgraph's owning wrappers (buffers, streams, events, graphs, execs, modules)."""

    _finalizer: weakref.finalize[..., Any]

    def _own(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        """Register ``fn(*args)`` as this object's one release call (``args`` must not refer to
        self); ``name`` defaults to ``fn``'s name (the driver call, e.g. ``cuMemFree``)."""
        label = name or str(getattr(fn, "__name__", repr(fn)))
        self._finalizer = weakref.finalize(self, release, label, fn, *args)
        _hook_exit()

    def _own_nothing(self) -> None:
        """For an object that borrows its handle (releases nothing): it can still be closed, but
        dropping it is no release, so ``release_count`` (which the hot paths compare to see that
        something may have been closed) does not move. A borrowed stream wrapped per launch must
        not send the next bind down its slow path."""
        self._finalizer = weakref.finalize(self, _release_nothing)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise ClosedError(f"{type(self).__name__} is closed")

    def close(self) -> None:
        """Release the resource now (the class docstring names the driver call); safe twice."""
        self._finalizer()

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
