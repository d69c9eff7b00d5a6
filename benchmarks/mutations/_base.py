"""The record of one mutation, and the few ways of building a broken replacement.

Nothing here imports rawgraph at module level: the catalogue is read by ``bite_check.py --list``
and by the child-interpreter hook before rawgraph is importable. The ``mutate`` callables import
what they need when they run, in the test process.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# How the replacement is made, for reports and for the CPU test: the text kinds are the only
# ones that read source text, and are the ones a reformat can make stale (applying them then
# fails loudly: a usage error, reported by bite_check.py as ``error``, never as a bite).
KINDS = {
    "replace": "the target is replaced by a broken function (a check that does nothing, a probe that swallows)",
    "wrap": "the original still runs, wrapped so that one step of it is skipped, undone or changed",
    "constant": "a module-level value is replaced by a wrong one",
    "source-edit": "one function recompiled from its own source with one edit (the last resort)",
    "kernel-text": "the source text of one kernel file is edited as rawgraph reads it for NVRTC",
}
TEXT_KINDS = frozenset({"source-edit", "kernel-text"})


@dataclass(frozen=True)
class Mutation:
    """One known bug, put back by replacing one named object in the test process.

    Attributes
    ----------
    name : str
        Unique over the catalogue.
    why : str
        Which feature the mutation breaks, in one line.
    tests : tuple of str
        pytest node ids that must fail with the mutation applied (at least one of them: the run
        stops at the first failure).
    target : str
        ``"package.module:Qualified.name"``: a function, method, classmethod, property or module
        attribute.
    mutate : callable
        Takes the original object (for a classmethod or staticmethod: its function) and returns
        the broken replacement.
    kind : str
        One of :data:`KINDS`.
    everywhere : bool
        Also replace every attribute of a loaded ``rawgraph.*`` module that *is* the original (a
        ``from x import f`` binding). False where the target names one module's import of a
        shared object and only that module's use is to break.
    """

    name: str
    why: str
    tests: tuple[str, ...]
    target: str
    mutate: Callable[[Any], Any]
    kind: str
    everywhere: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if ":" not in self.target:
            raise ValueError(f"{self.name}: target must read 'module:qualname', got {self.target!r}")
        if isinstance(self.tests, str) or not self.tests:
            raise ValueError(f"{self.name}: tests must be a non-empty tuple of node ids")

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]


# -- builders of replacements ---------------------------------------------------------------------
def does_nothing(returning: Any = None) -> Callable[[Any], Any]:
    """A mutate: the target becomes a function that ignores its arguments and returns ``returning``."""

    def mutate(original: Any) -> Any:
        @functools.wraps(original)
        def nothing(*_args: Any, **_kwargs: Any) -> Any:
            return returning

        return nothing

    return mutate


def during_call(attr: str, make: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """A mutate for a method: while it runs, the instance's ``attr`` is ``make(self, current)``
    (an instance attribute shadowing a method or replacing a helper object), restored after.

    This breaks one step of one method (its ``self._check_usable()``, its ``self._keep.retire_all``)
    without touching the other methods that use the same helper."""

    def mutate(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            had = attr in vars(self)
            current = getattr(self, attr)
            setattr(self, attr, make(self, current))
            try:
                return original(self, *args, **kwargs)
            finally:
                if had:
                    setattr(self, attr, current)
                else:
                    delattr(self, attr)

        return wrapper

    return mutate


def unlocked_after_init(original: Any) -> Any:
    """A mutate of ``__init__``: the original runs, then the object's ``_lock`` is replaced by a
    context that locks nothing (two threads then run inside the object at once)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._lock = contextlib.nullcontext()

    return __init__


def edit_source(old: str, new: str, after: str = "") -> Callable[[Any], Any]:
    """A mutate of last resort: the function recompiled from its own source with one edit, in its
    module's globals. The edit replaces the first ``old`` that follows ``after`` (a fragment that
    must occur exactly once in the function), or, without ``after``, the one ``old``. Fragments,
    not lines: re-indenting or re-wrapping the function keeps the edit valid. Used only where the
    step to break sits inside a long function with no helper of its own; a stale fragment makes
    applying the mutation fail (a usage error), never a silent pass."""

    def mutate(original: Any) -> Any:
        source = textwrap.dedent(inspect.getsource(original))
        anchor = after or old
        count = source.count(anchor)
        if count != 1:
            raise ValueError(f"{original.__qualname__}: {anchor[:70]!r} occurs {count} times (expected once)")
        at = source.find(old, source.index(anchor))
        if at < 0:
            raise ValueError(f"{original.__qualname__}: no {old!r} after {anchor[:70]!r}")
        edited_source = source[:at] + new + source[at + len(old) :]
        # compile() inherits this file's `from __future__ import annotations`: the annotations stay
        # unevaluated, as in the product module, so names imported only for typing need not exist.
        code = compile(edited_source, f"<mutated {original.__qualname__}>", "exec")
        namespace: dict[str, Any] = {}
        exec(code, original.__globals__, namespace)
        edited = namespace[original.__name__]
        edited.__qualname__ = original.__qualname__
        return edited

    return mutate


def edit_kernel(file: str, old: str, new: str) -> Callable[[Any], Any]:
    """A mutate of ``rawgraph.runtime.module:kernel_source``: the text it returns for
    ``kernels/<file>.cu`` has ``old`` (exactly once) replaced by ``new``.

    The compiled-image cache is keyed by the SHA-256 of the source text (``KernelCache.key``), so
    the edited source compiles afresh and its image never stands in for the real one; kernels are
    cached per process only after this point. Checked when applied: a stale ``old`` is an error."""

    def mutate(original: Any) -> Any:
        text = original(file)
        count = text.count(old)
        if count != 1:
            raise ValueError(f"kernels/{file}.cu: the text to edit occurs {count} times: {old[:70]!r}")

        @functools.wraps(original)
        def kernel_source(name: str) -> str:
            source = original(name)
            return source.replace(old, new) if name == file else source

        return kernel_source

    return mutate
