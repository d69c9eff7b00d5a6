"""Ownership of driver resources: one object owns one handle, released exactly once.

A :class:`Resource` registers its release call with ``weakref.finalize``: ``close()`` runs it
(and is safe to call twice), garbage collection runs it if ``close()`` never did, and so does
interpreter exit, where a failing release (the driver already gone) is swallowed rather than
raised.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .errors import ClosedError


def _quiet(release: Callable[..., Any], *args: Any) -> None:
    try:
        release(*args)
    except Exception:  # interpreter exit after the driver unloaded: nothing left to release
        pass


class Resource:
    """Base for rawgraph's owning wrappers (buffers, streams, events, graphs, execs, modules)."""

    _finalizer: weakref.finalize

    def _own(self, release: Callable[..., Any], *args: Any) -> None:
        """Register ``release(*args)`` as this object's one release call (must not refer to self)."""
        self._finalizer = weakref.finalize(self, _quiet, release, *args)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise ClosedError(f"{type(self).__name__} is closed")

    def close(self) -> None:
        """Release the resource now (the class docstring names the driver call); safe twice."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
