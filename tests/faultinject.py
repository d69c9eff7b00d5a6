"""Fault injection: make the k-th driver call of an operation fail, for every k, and judge what the
library does about it (issue 21, section 3).

:class:`FaultHook` wraps every ``cu*`` function of ``cuda.bindings.driver`` (the real one on a GPU,
the functions :mod:`fakedriver` put there on the CPU) with a counter. Armed at ``k``, the k-th call
returns the chosen ``CUresult`` (default ``CUDA_ERROR_OUT_OF_MEMORY``) without reaching the driver,
as a driver that refused the call with no side effect would. The hook also counts creates against
destroys per handle kind (``cuMemAlloc``/``cuMemFree``, ``cuStreamCreate``/``cuStreamDestroy``, ...):
a handle a scenario created and never passed to its destroy call is a leak.

:func:`run_case` drives one (operation, k) case of a :class:`Case` and classifies it:

``recovered``
    a typed error naming the failing call (a :class:`~rawgraph.runtime.errors.CudaError` in the raised
    error's chain whose ``call`` is that function and whose ``name`` the injected code); the
    library's shadow state still matches the driver's; the next call succeeded and is right.
``closed``
    a typed error naming the call; then the object refused use with ``ClosedError`` before any
    driver call.
``absorbed``
    the failure never surfaced (a fallback such as synchronizing when an event cannot be
    recorded), no rawgraph warning said the result is degraded, and the result is right.
``warned``
    a release failed: no exception, a :class:`~rawgraph.runtime.errors.ReleaseWarning` naming the call,
    everything else released, and the object refuses further use.
``inconsistent``
    anything else: an untyped error, a wrong name, shadow parameters that differ from the
    driver's, a half-applied update, a later call that fails or gives a wrong result.
``leak``
    after closing everything, a handle created in the case was never destroyed (or one was
    destroyed twice).
"""

from __future__ import annotations

import gc
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver

from rawgraph.runtime.errors import ClosedError, CudaError, RawgraphError, RawgraphWarning, ReleaseWarning

OUTCOMES = ("recovered", "closed", "absorbed", "warned", "inconsistent", "leak")
GOOD = ("recovered", "closed", "absorbed", "warned")

# Handle kinds: the call that makes one (its first returned value is the handle) and the call that
# releases one (its first argument is the handle).
CREATES = {
    "cuMemAlloc": "memory",
    "cuMemHostAlloc": "host",
    "cuStreamCreate": "stream",
    "cuStreamCreateWithPriority": "stream",
    "cuEventCreate": "event",
    "cuGraphCreate": "graph",
    "cuGraphClone": "graph",
    "cuStreamEndCapture": "graph",
    "cuGraphInstantiate": "exec",
    "cuGraphInstantiateWithParams": "exec",
    "cuModuleLoadData": "module",
    "cuModuleLoadDataEx": "module",
    "cuLibraryLoadData": "library",
    "cuLinkCreate": "link",
}
DESTROYS = {
    "cuMemFree": "memory",
    "cuMemFreeHost": "host",
    "cuStreamDestroy": "stream",
    "cuEventDestroy": "event",
    "cuGraphDestroy": "graph",
    "cuGraphExecDestroy": "exec",
    "cuModuleUnload": "module",
    "cuLibraryUnload": "library",
    "cuLinkDestroy": "link",
}
# Diagnostics, not operations: building the message of an error must not count as a call to fail.
NOT_COUNTED = frozenset({"cuGetErrorString", "cuGetErrorName"})
# Calls that take effect even when they fail: cuStreamEndCapture ends the capture whatever it
# returns (the driver documents a null graph for an invalidated one; only a call on the wrong
# stream or thread leaves it open). A failed one is therefore made, its graph destroyed, and the
# error returned.
ENDS_ANYWAY = frozenset({"cuStreamEndCapture"})


class FaultHook:
    """Counts every driver call, fails the k-th when armed, and tracks creates and destroys.

    Use as a context manager (``with FaultHook() as hook:``); :meth:`install` wraps whatever
    ``cuda.bindings.driver`` holds now, so install a fake driver first. Wrappers keep working
    after :meth:`uninstall` (release calls captured by finalizers may still hold them): they
    then only pass calls through.

    Parameters
    ----------
    code : CUresult, default CUDA_ERROR_OUT_OF_MEMORY
        What the failed call returns.
    """

    def __init__(self, code: Any = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
        self.code = code
        self.active = False
        self.calls = 0
        self.fail_at: int | None = None
        self.fired: tuple[str, int] | None = None
        self.names: list[str] | None = None  # the calls made, when recording
        self.live: dict[tuple[str, int], str] = {}  # (kind, handle) -> the call that made it
        self.origins: dict[tuple[str, int], str] = {}  # (kind, handle) -> where it was made (file:line <- ...)
        self.problems: list[str] = []  # destroys of handles not alive (double or foreign)
        self.failed_releases: list[tuple[str, int]] = []
        self._to_graph: set[int] = set()  # streams capturing into an existing graph (no create)
        self._dead: set[tuple[str, int]] = set()  # handles whose destroy was called in this case
        self._saved: dict[str, Any] = {}
        # Handles alive by design past any case (the process-wide kernel cache's modules).
        self.exempt: Callable[[], set[tuple[str, int]]] = set
        # Run after every case: returns what it had to clean up (a capture left open, releases
        # still deferred), each a problem of that case.
        self.after_case: Callable[[], list[str]] = list

    def leaked(self) -> dict[tuple[str, int], str]:
        """Handles created since :meth:`reset` and not destroyed, the exempt ones left out."""
        keep = self.exempt()
        return {key: c for key, c in self.live.items() if key not in keep}

    # -- wrapping ---------------------------------------------------------------------------------
    def install(self) -> FaultHook:
        from fakedriver import output_count

        for name in dir(driver):
            if not name.startswith("cu") or name.startswith("cuuint") or name in self._saved:
                continue
            fn = getattr(driver, name)
            if isinstance(fn, type) or not callable(fn):
                continue
            self._saved[name] = fn
            setattr(driver, name, self._wrap(name, fn, output_count(name)))
        self.active = True
        return self

    def uninstall(self) -> None:
        self.active = False
        for name, fn in self._saved.items():
            setattr(driver, name, fn)
        self._saved.clear()

    def __enter__(self) -> FaultHook:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _wrap(self, name: str, fn: Callable[..., tuple], outputs: int) -> Callable[..., tuple]:
        hook = self
        create, destroy = CREATES.get(name), DESTROYS.get(name)

        def wrapper(*args: Any) -> tuple:
            if not hook.active or name in NOT_COUNTED:
                return fn(*args)
            hook.calls += 1
            if hook.names is not None:
                hook.names.append(name)
            if hook.fail_at is not None and hook.calls == hook.fail_at and hook.fired is None:
                hook.fired = (name, hook.calls)
                if destroy is not None and args:
                    # The release was asked for; the driver refused it. The library must not
                    # retry it (resources are released once), so it counts as attempted.
                    hook._destroyed(destroy, args[0], failed=True)
                if name in ENDS_ANYWAY:
                    result = fn(*args)
                    if result[0] == driver.CUresult.CUDA_SUCCESS and result[1] is not None and int(result[1]):
                        if int(args[0]) not in hook._to_graph:  # a body graph stays with its node
                            hook._saved["cuGraphDestroy"](result[1])
                    hook._to_graph.discard(int(args[0]))
                return (hook.code,) + (None,) * outputs
            result = fn(*args)
            ok = isinstance(result, tuple) and result and result[0] == driver.CUresult.CUDA_SUCCESS
            if name == "cuStreamBeginCaptureToGraph" and ok:
                hook._to_graph.add(int(args[0]))
            if create is not None and ok and len(result) > 1 and result[1] is not None:
                handle = int(result[1])
                stream = int(args[0]) if name == "cuStreamEndCapture" else None
                if stream is not None and stream in hook._to_graph:
                    hook._to_graph.discard(stream)  # the body graph belongs to its node
                elif handle:
                    hook.live[(create, handle)] = name
                    hook.origins[(create, handle)] = _origin()
                    hook._dead.discard((create, handle))  # addresses and handles are reused
            elif name == "cuStreamEndCapture" and args:
                hook._to_graph.discard(int(args[0]))
            if destroy is not None and args:
                hook._destroyed(destroy, args[0], failed=not ok)
            return result

        wrapper.__name__ = wrapper.__qualname__ = name
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def where(self, keys: Any) -> dict[tuple[str, int], str]:
        """Where each of ``keys`` (handles, e.g. :meth:`leaked`'s) was created, and which live
        rawgraph objects own it and who holds them: a leak's message."""
        from helpers import describe_holders

        from rawgraph.runtime.resource import Resource

        out = {}
        for key in keys:
            owners = [
                o for o in gc.get_objects() if isinstance(o, Resource) and _as_int(getattr(o, "handle", None)) == key[1]
            ]
            held = "; ".join(f"{o!r} held by:\n{describe_holders(o)}" for o in owners[:2]) or "no live owner"
            out[key] = f"{self.origins.get(key, '?')} | {held}"
        return out

    def _destroyed(self, kind: str, handle: Any, failed: bool) -> None:
        key = (kind, int(handle))
        if key in self._dead:  # rawgraph releases a handle once, even when the release failed
            self.problems.append(f"{kind} 0x{int(handle):x} destroyed twice")
        self._dead.add(key)
        if key in self.live:
            del self.live[key]
            if failed:
                self.failed_releases.append(key)

    # -- arming ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every count and tally (the start of a case)."""
        self.calls, self.fail_at, self.fired, self.names = 0, None, None, None
        self.live.clear()
        self.origins.clear()
        self.problems.clear()
        self.failed_releases.clear()
        self._to_graph.clear()
        self._dead.clear()

    def arm(self, k: int) -> None:
        """Fail the k-th call from now."""
        self.fail_at, self.fired, self.calls = k, None, 0

    def disarm(self) -> None:
        self.fail_at = None


def _as_int(handle: Any) -> int | None:
    try:
        return int(handle)
    except Exception:
        return None


def _origin(depth: int = 8) -> str:
    """The caller's frames, innermost first, as ``file:line`` (the hook's own left out): cheap
    enough for every create, and it names the owner of a handle that leaked."""
    frame = sys._getframe(2)
    parts = []
    while frame is not None and len(parts) < depth:
        name = frame.f_code.co_filename.rsplit("/", 1)[-1]
        parts.append(f"{name}:{frame.f_lineno}")
        frame = frame.f_back
    return " <- ".join(parts)


# ----------------------------------------------------------------------------------- cases
State = dict


@dataclass
class Case:
    """One public operation to inject into.

    Attributes
    ----------
    op : str
        The operation's name in the report.
    setup : callable () -> dict
        Builds what the operation needs (no fault is injected here).
    run : callable (state) -> object
        The operation; the k-th driver call it makes fails.
    check : callable (state) -> None
        After the operation succeeded (or its retry did): the driver state is what a fault-free
        run gives. Raises ``AssertionError`` otherwise.
    close : callable (state) -> None
        Closes everything ``setup`` and ``run`` made.
    consistent : callable (state) -> None, optional
        After a failure, before anything else: the library's shadow of the driver's state (node
        parameters, tables) equals what the driver holds, and nothing is half applied.
    again : callable (state) -> object, optional
        The next call after a failure (default ``run`` again); for a close, a use of the object
        that must raise ``ClosedError``.
    closes : bool
        A close operation: it must not raise, a failed release must warn, the object must then
        refuse use.
    """

    op: str
    setup: Callable[[], State]
    run: Callable[[State], Any]
    check: Callable[[State], None]
    close: Callable[[State], None]
    consistent: Callable[[State], None] | None = None
    again: Callable[[State], Any] | None = None
    closes: bool = False


@dataclass
class Result:
    op: str
    k: int
    call: str
    outcome: str
    detail: str = ""
    warnings: list[str] = field(default_factory=list)


def names_call(exc: BaseException, call: str, code_name: str) -> bool:
    """Whether ``exc`` or an error it was raised from (``__cause__``, or ``__context__`` unless
    suppressed with ``from None``) is a
    :class:`CudaError` for ``call`` (``"cuLaunchKernel(relu)"`` names ``cuLaunchKernel``) with the
    injected code."""
    seen = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CudaError) and e.call.split("(")[0] == call and e.name == code_name:
            return True
        todo += [e.__cause__, None if e.__suppress_context__ else e.__context__]
    return False


def _drop(exc: BaseException | None) -> None:
    """Let go of a caught error's frames, so objects a failed constructor made are collected now."""
    while exc is not None:
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _fmt(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def count_calls(case: Case, hook: FaultHook) -> tuple[int, list[str]]:
    """Run ``case`` once with no fault: how many driver calls its operation makes, and which."""
    hook.reset()
    st = case.setup()
    hook.calls, hook.names = 0, []
    try:
        case.run(st)
        names = list(hook.names)
        hook.names = None
        case.check(st)
    finally:
        hook.names = None
        case.close(st)
        st.clear()
        gc.collect()
    if hook.leaked() or hook.problems:
        leaked = ", ".join(f"{k} 0x{h:x} ({c})" for (k, h), c in list(hook.leaked().items())[:6])
        raise AssertionError(f"{case.op}: the fault-free run leaks or double-frees: {leaked} {hook.problems[:3]}")
    return len(names), names


def run_case(case: Case, k: int, hook: FaultHook) -> Result:
    """Inject at the k-th driver call of ``case.run`` and classify what happens (module docstring)."""
    code_name = driver.CUresult(int(hook.code)).name
    hook.reset()
    st = case.setup()
    outcome, detail, exc = "", "", None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hook.arm(k)
        try:
            case.run(st)
        except BaseException as e:  # noqa: BLE001 - every error is judged below
            exc = e
        fired = hook.fired
        hook.disarm()
        call = fired[0] if fired else "(not reached)"
        released = [str(w.message) for w in caught if issubclass(w.category, ReleaseWarning)]
        try:
            if fired is None:
                outcome, detail = "inconsistent", f"call {k} was never made (the operation is not deterministic)"
                if exc is not None:
                    detail += f"; it raised {_fmt(exc)}"
            elif exc is not None and not isinstance(exc, Exception):
                raise exc
            elif exc is not None:
                outcome, detail = _judge_failure(case, st, exc, call, code_name, hook)
            else:
                degraded = [
                    str(w.message)
                    for w in caught
                    if issubclass(w.category, RawgraphWarning) and not issubclass(w.category, ReleaseWarning)
                ]
                if degraded:  # the failure was taken for an answer: the result is not what it should be
                    outcome, detail = "inconsistent", f"{call} failed, no error, and a warning: {degraded[0][:300]}"
                else:
                    outcome, detail = _judge_success(case, st, call, released, hook)
        except AssertionError as e:
            outcome, detail = "inconsistent", f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001
            outcome, detail = "inconsistent", f"while checking: {_fmt(e)}"
        _drop(exc)
        exc = None
        try:
            case.close(st)
        except Exception as e:  # noqa: BLE001
            if outcome in GOOD:
                outcome, detail = "inconsistent", f"closing after the case raised {_fmt(e)}"
        st.clear()
        gc.collect()
        left = hook.after_case()
        notes = [str(w.message)[:200] for w in caught if issubclass(w.category, Warning)]
    if left:
        outcome = "inconsistent"
        detail = (detail + "; " if detail else "") + "; ".join(left)
    if hook.leaked() or hook.problems:
        what = ", ".join(f"{kind} 0x{h:x} (from {c})" for (kind, h), c in list(hook.leaked().items())[:6])
        if outcome in GOOD or outcome == "":
            outcome = "leak"
        detail = (
            (detail + "; " if detail else "") + f"leaked: {what}" + (f"; {hook.problems[:3]}" if hook.problems else "")
        )
    return Result(case.op, k, call, outcome, detail, notes)


def _count_during(hook: FaultHook, fn: Callable[[], Any]) -> tuple[int, Any, BaseException | None]:
    before = hook.calls
    try:
        out = fn()
        return hook.calls - before, out, None
    except BaseException as e:  # noqa: BLE001
        return hook.calls - before, None, e


def _judge_failure(
    case: Case, st: State, exc: Exception, call: str, code_name: str, hook: FaultHook
) -> tuple[str, str]:
    if not isinstance(exc, RawgraphError):
        return "inconsistent", f"untyped error (not a RawgraphError): {_fmt(exc)}"
    if not names_call(exc, call, code_name):
        return "inconsistent", f"typed error that does not name {call} ({code_name}): {_fmt(exc)}"
    if case.consistent is not None:
        case.consistent(st)
    again = case.again or case.run
    n, _out, err = _count_during(hook, lambda: again(st))
    if err is not None:
        if isinstance(err, ClosedError):
            _drop(err)
            if n:
                return "inconsistent", f"refused with ClosedError only after {n} driver call(s)"
            return "closed", ""
        detail = f"the next call failed: {_fmt(err)}"
        _drop(err)
        return "inconsistent", detail
    case.check(st)
    return "recovered", ""


def _judge_success(case: Case, st: State, call: str, released: list[str], hook: FaultHook) -> tuple[str, str]:
    failed_release = call in DESTROYS or any(call in m for m in released)
    if failed_release and not any(call in m for m in released):
        return "inconsistent", f"{call} failed in a release and no ReleaseWarning named it"
    if case.closes:
        n, _out, err = _count_during(hook, lambda: (case.again or (lambda s: None))(st))
        if case.again is not None:
            if not isinstance(err, ClosedError):
                return (
                    "inconsistent",
                    f"after close, a use did not raise ClosedError ({_fmt(err) if err else 'it worked'})",
                )
            if n:
                return "inconsistent", f"a closed object made {n} driver call(s) before refusing"
        if err is not None:
            _drop(err)
    case.check(st)
    return ("warned" if failed_release else "absorbed"), ""


def summarize(results: list[Result]) -> dict[str, Any]:
    """Per operation: the number of (operation, k) cases and how many fell in each outcome class."""
    ops: dict[str, Any] = {}
    for r in results:
        o = ops.setdefault(r.op, {"cases": 0, "outcomes": {name: 0 for name in OUTCOMES}})
        o["cases"] += 1
        o["outcomes"][r.outcome] += 1
    return ops


def python_version() -> str:
    return sys.version.split()[0]
