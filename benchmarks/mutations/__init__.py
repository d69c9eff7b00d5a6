"""Known bugs put back by replacing named functions: the bite cases in a form a refactor keeps.

Each module here (one per feature area) defines ``MUTATIONS``, a list of :class:`Mutation`
records. A mutation names its target as ``"module:Qualified.name"`` and a ``mutate`` callable
that turns the original object into the broken one (a check that does nothing, a keep-alive that
keeps nothing, a rollback that puts nothing back, two modes swapped). ``tests/mutation_plugin.py``
applies one in the pytest process when ``RAWGRAPH_MUTATION`` names it; ``benchmarks/bite_check.py``
runs each case's tests that way and requires them to fail. No product source is edited or copied:
reformatting or moving code leaves a mutation valid as long as the named function still exists
and still does the job the mutation removes.

Not shipped: ``benchmarks/`` is outside the wheel.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any

from ._base import KINDS, TEXT_KINDS, Mutation

__all__ = ["KINDS", "MODULES", "TEXT_KINDS", "Applied", "Mutation", "all_mutations", "apply", "by_name", "resolve"]

MODULES = ("updates", "graphs", "runtime", "control", "models_kernels", "serving")
ENV = "RAWGRAPH_MUTATION"

# Values that may be shared by identity with unrelated names (small ints, interned strings):
# a constant of these types is replaced on its owner only, never by identity elsewhere.
_SCALARS = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)


def all_mutations() -> list[Mutation]:
    """Every mutation of every module, in catalogue order; names are checked unique."""
    found: list[Mutation] = []
    for stem in MODULES:
        module = importlib.import_module(f"{__name__}.{stem}")
        found += module.MUTATIONS
    names = [m.name for m in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate mutation names {dup}")
    return found


def module_of(mutation: Mutation) -> str:
    """The catalogue module (its stem) a mutation is defined in."""
    for stem in MODULES:
        if any(m is mutation for m in importlib.import_module(f"{__name__}.{stem}").MUTATIONS):
            return stem
    raise LookupError(mutation.name)


def by_name(name: str) -> Mutation:
    for m in all_mutations():
        if m.name == name:
            return m
    raise LookupError(f"no mutation named {name!r} in benchmarks/mutations ({len(all_mutations())} known)")


@dataclass(frozen=True)
class Target:
    """Where a target lives: ``owner.<attr>`` (a class or a module), the object stored there
    (``raw``: a classmethod as the descriptor) and what ``mutate`` is given (``original``)."""

    owner: Any
    attr: str
    raw: Any
    original: Any


def resolve(target: str) -> Target:
    """Import the module of ``"module:Qualified.name"`` and find the named object.

    Raises ImportError or AttributeError (with the target named) when it does not resolve."""
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    if isinstance(owner, type):
        raw = inspect.getattr_static(owner, attr)  # the descriptor itself, inherited or not
    elif hasattr(owner, attr):
        raw = getattr(owner, attr)
    else:
        raise AttributeError(f"{target}: {module_name} has no attribute {qualname!r}")
    original = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    return Target(owner, attr, raw, original)


@dataclass
class Applied:
    """A mutation in effect: what was replaced, by what, and where else it was rebound."""

    mutation: Mutation
    target: Target
    replacement: Any
    aliases: list[str]

    def rebind_aliases(self) -> list[str]:
        """Replace, in every loaded ``rawgraph.*`` module, each attribute that *is* the original
        (a ``from x import f`` made before the mutation was applied); returns the new ones."""
        if not self.mutation.everywhere or isinstance(self.target.original, _SCALARS):
            return []
        new = []
        original = self.target.raw
        for mod_name, module in list(sys.modules.items()):
            if not (mod_name == "rawgraph" or mod_name.startswith("rawgraph.")) or module is None:
                continue
            for key, value in list(vars(module).items()):
                if value is original and module is not self.target.owner:
                    setattr(module, key, self.replacement)
                    new.append(f"{mod_name}.{key}")
        self.aliases += new
        return new


# The mutations applied in this process, by name: applying one twice (the child hook, then a
# pytest started in that child) would wrap the broken object again.
APPLIED: dict[str, Applied] = {}


def apply(mutation: Mutation) -> Applied:
    """Resolve the target, build the replacement, set it on the owner and rebind the aliases
    (once per process: a second call returns the first one's record)."""
    if mutation.name in APPLIED:
        return APPLIED[mutation.name]
    target = resolve(mutation.target)
    broken = mutation.mutate(target.original)
    if broken is target.original or broken is None:
        raise ValueError(f"{mutation.name}: mutate returned the original (or None): nothing would change")
    if isinstance(target.raw, (classmethod, staticmethod)):
        broken = type(target.raw)(broken)
    setattr(target.owner, target.attr, broken)
    applied = APPLIED[mutation.name] = Applied(mutation, target, broken, [])
    applied.rebind_aliases()
    return applied


def compatible(original: Any, replacement: Any) -> bool:
    """Whether a replacement can stand where the original stood: a callable for a callable, a
    property for a property, a module (or the same type) for a module or a value."""
    if isinstance(original, property):
        return isinstance(replacement, property)
    if isinstance(original, types.ModuleType):
        return isinstance(replacement, types.ModuleType)
    if callable(original):
        return callable(replacement)
    return isinstance(replacement, type(original))
