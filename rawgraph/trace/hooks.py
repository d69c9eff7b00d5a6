"""Host spans of rawgraph's driver calls: the functions of ``cuda.bindings.driver`` swapped for
timing wrappers while a tracer is active, and put back after.

rawgraph calls the driver as ``driver.cuXxx(...)``, the module attribute looked up at each call
(the fake driver of :mod:`rawgraph.testing.fakedriver` is installed the same way), so a wrapper on
the attribute sees every call and nothing changes in the hot paths while no tracer is active: the
attributes are then the binding's own functions, the very objects they were before.

Installed over the fake driver, the wrappers time the fake's functions; a fake installed *over*
the wrappers saves them and puts them back when it is uninstalled, so nesting in either order
restores everything. Uninstalled while someone else's function sits on an attribute (the two
were not nested), a wrapper cannot be taken off: it stays, passing calls straight through, and
:meth:`DriverHooks.uninstall` names it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver

# Driver calls by group, for the default selection and each span's ``cat``. First match wins.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("launch", ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchHostFunc")),
    (
        "graph",
        (
            "cuGraphLaunch",
            "cuGraphUpload",
            "cuGraphInstantiate",
            "cuGraphInstantiateWithFlags",
            "cuGraphInstantiateWithParams",
            "cuGraphExecUpdate",
            "cuGraphExecDestroy",
        ),
    ),
    ("update", ("cuGraphExecKernelNodeSetParams", "cuGraphExecMemcpyNodeSetParams", "cuGraphExecMemsetNodeSetParams")),
    ("update", ("cuGraphExecNodeSetParams", "cuGraphNodeSetEnabled", "cuGraphExecChildGraphNodeSetParams")),
    (
        "sync",
        (
            "cuStreamSynchronize",
            "cuEventSynchronize",
            "cuCtxSynchronize",
            "cuStreamWaitEvent",
            "cuEventRecord",
            "cuEventRecordWithFlags",
            "cuStreamQuery",
            "cuEventQuery",
        ),
    ),
    ("capture", ("cuStreamBeginCapture", "cuStreamBeginCaptureToGraph", "cuStreamEndCapture")),
    ("memory", ("cuMemAlloc", "cuMemAllocAsync", "cuMemFree", "cuMemFreeAsync", "cuMemHostAlloc", "cuMemFreeHost")),
)
# Whole families: every copy and every memset, synchronous or not.
PREFIXES: tuple[tuple[str, str], ...] = (("cuMemcpy", "copy"), ("cuMemset", "copy"))


def group(name: str) -> str | None:
    """The group of a driver call (``"launch"``, ``"graph"``, ``"update"``, ``"copy"``, ``"sync"``,
    ``"capture"``, ``"memory"``), or None for one outside the default selection."""
    for g, names in GROUPS:
        if name in names:
            return g
    for prefix, g in PREFIXES:
        if name.startswith(prefix):
            return g
    return None


def selection(calls: str | Iterable[str]) -> dict[str, str]:
    """Driver call -> group for ``calls``: ``"default"`` (every call :func:`group` places),
    ``"all"`` (every ``cu*`` function of the binding; the rest as ``"driver"``), or names."""
    names = [n for n in dir(driver) if n.startswith("cu") and callable(getattr(driver, n))]
    if calls == "default":
        return {n: g for n in names if (g := group(n)) is not None}
    if calls == "all":
        return {n: group(n) or "driver" for n in names}
    if isinstance(calls, str):
        raise ValueError(f'calls must be "default", "all" or a list of driver call names, got {calls!r}')
    wanted = list(calls)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ValueError(f"not functions of cuda.bindings.driver: {', '.join(unknown)}")
    return {n: group(n) or "driver" for n in wanted}


def _hex(x: Any) -> str:
    try:
        return f"0x{int(x):x}"
    except (TypeError, ValueError):
        return type(x).__name__


def _int(x: Any) -> int | str:
    try:
        return int(x)
    except (TypeError, ValueError):
        return type(x).__name__


class KernelNames:
    """Kernel name by function handle, from the kernels rawgraph has loaded (its kernel cache and
    ``RawKernel``'s); a handle it did not load (a library's) reads as its hex value."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._missed: set[int] = set()

    def __call__(self, handle: Any) -> str:
        try:
            h = int(handle)
        except (TypeError, ValueError):
            return type(handle).__name__
        name = self._names.get(h)
        if name is None and h not in self._missed:
            from ..runtime import module, rawkernel

            for k in (*module._kernels.values(), *rawkernel._loaded.values()):
                self._names[int(k.handle)] = k.name
            name = self._names.get(h)
            if name is None:
                self._missed.add(h)
        return name if name is not None else f"0x{h:x}"


def summarize(name: str, args: tuple[Any, ...], kernel_name: Callable[[Any], str]) -> dict[str, Any]:
    """A short argument summary of a driver call: handles in hex, dimensions, byte counts, the
    kernel's name; never the binding's structs whole (their reprs run to pages)."""
    try:
        if name == "cuLaunchKernel" and len(args) >= 9:
            return {
                "kernel": kernel_name(args[0]),
                "grid": [_int(a) for a in args[1:4]],
                "block": [_int(a) for a in args[4:7]],
                "smem": _int(args[7]),
                "stream": _hex(args[8]),
            }
        if name == "cuLaunchKernelEx" and len(args) >= 2:
            cfg = args[0]
            return {
                "kernel": kernel_name(args[1]),
                "grid": [int(cfg.gridDimX), int(cfg.gridDimY), int(cfg.gridDimZ)],
                "block": [int(cfg.blockDimX), int(cfg.blockDimY), int(cfg.blockDimZ)],
                "smem": int(cfg.sharedMemBytes),
                "stream": _hex(cfg.hStream),
                "attrs": int(cfg.numAttrs),
            }
        if name in ("cuGraphLaunch", "cuGraphUpload") and len(args) >= 2:
            return {"exec": _hex(args[0]), "stream": _hex(args[1])}
        if name == "cuGraphExecKernelNodeSetParams" and len(args) >= 3:
            return {"exec": _hex(args[0]), "node": _hex(args[1]), "kernel": kernel_name(args[2].func)}
        if name.startswith("cuGraphExec") and len(args) >= 2:
            return {"exec": _hex(args[0]), "node": _hex(args[1])}
        if name.startswith("cuMemcpy") and name.endswith("Async") and len(args) == 4:
            return {"dst": _hex(args[0]), "src": _hex(args[1]), "bytes": _int(args[2]), "stream": _hex(args[3])}
        if name.startswith("cuMemset") and name.endswith("Async") and len(args) == 4:
            return {"dst": _hex(args[0]), "value": _int(args[1]), "count": _int(args[2]), "stream": _hex(args[3])}
        if name in ("cuStreamSynchronize", "cuStreamQuery", "cuStreamBeginCapture", "cuStreamEndCapture"):
            return {"stream": _hex(args[0])} if args else {}
        if name in ("cuEventRecord", "cuEventRecordWithFlags") and len(args) >= 2:
            return {"event": _hex(args[0]), "stream": _hex(args[1])}
        if name == "cuStreamWaitEvent" and len(args) >= 2:
            return {"stream": _hex(args[0]), "event": _hex(args[1])}
    except Exception:  # a summary never fails a call: fall through to the plain one
        pass
    return {"args": [_hex(a) if not isinstance(a, (int, float)) else a for a in args[:4]]}


@dataclass(frozen=True)
class CallRecord:
    """One finished driver call, handed to the tracer."""

    id: int
    name: str
    group: str
    start_ns: int
    end_ns: int
    thread: int
    args: tuple[Any, ...]
    result: Any


class DriverHooks:
    """The timing wrappers over a selection of ``cuda.bindings.driver``'s functions.

    Parameters
    ----------
    calls : dict of str -> str
        Driver call -> group (:func:`selection`).
    on_call : callable
        Given each :class:`CallRecord`, on the calling thread, after the call returned.
    new_id : callable
        A fresh span id for each call, taken before it is made.
    around : callable, optional
        ``around(span_id)`` before each call returns a function called right after it (CUPTI's
        external correlation id is pushed and popped there); None for nothing.
    """

    def __init__(
        self,
        calls: dict[str, str],
        on_call: Callable[[CallRecord], None],
        new_id: Callable[[], int],
        around: Callable[[int], Callable[[], None]] | None = None,
    ) -> None:
        self.calls = dict(calls)
        self._on_call = on_call
        self._new_id = new_id
        self._around = around
        self._saved: dict[str, tuple[Any, Any]] = {}  # name -> (what was there, our wrapper)
        self.live = False
        self.left_on: list[str] = []  # wrappers that could not be taken off (see the module docstring)

    def original(self, name: str) -> Any:
        """The function under the wrapper of ``name`` (the driver's, or the fake's); the attribute
        itself where ``name`` is not wrapped. The tracer's own driver calls go through this, so
        they never appear in the trace."""
        saved = self._saved.get(name)
        return saved[0] if saved is not None else getattr(driver, name)

    def install(self) -> None:
        """Put a wrapper on every selected attribute."""
        self.live = True
        for name, grp in self.calls.items():
            fn = getattr(driver, name)
            wrapper = self._wrap(name, grp, fn)
            self._saved[name] = (fn, wrapper)
            setattr(driver, name, wrapper)

    def uninstall(self) -> list[str]:
        """Put back what was there before :meth:`install`; returns the names whose attribute holds
        another function now (left on, passing calls through)."""
        self.live = False
        left = []
        for name, (fn, wrapper) in self._saved.items():
            if getattr(driver, name) is wrapper:
                setattr(driver, name, fn)
            else:
                left.append(name)
        self._saved.clear()
        self.left_on = left
        return left

    def _wrap(self, name: str, grp: str, fn: Any) -> Callable[..., Any]:
        hooks = self
        clock = time.perf_counter_ns
        thread_id = threading.get_native_id

        def traced(*args: Any) -> Any:
            if not hooks.live:
                return fn(*args)
            span_id = hooks._new_id()
            after = hooks._around(span_id) if hooks._around is not None else None
            t0 = clock()
            try:
                result = fn(*args)
            finally:
                t1 = clock()
                if after is not None:
                    after()
            hooks._on_call(CallRecord(span_id, name, grp, t0, t1, thread_id(), args, result))
            return result

        traced.__name__ = traced.__qualname__ = name
        traced.__doc__ = getattr(fn, "__doc__", None)
        traced.__wrapped__ = fn  # type: ignore[attr-defined]
        return traced
