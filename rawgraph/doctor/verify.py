"""``verify``: replays against eager, and where they diverge.

A static report (:func:`rawgraph.doctor.check.check`) sees addresses; it cannot see a wrong value
pushed into an exec (``cuGraphExecKernelNodeSetParams`` leaves nothing to read back: the driver
has no getter for an exec's parameters). Running both ways can:

* :func:`verify` takes a rawgraph exec whose graph has a launch plan: it gives the plan's float
  inputs fresh values, replays the exec and runs the plan eagerly (its launches, one
  ``cuLaunchKernel`` each) from the same starting state of every plan buffer, and compares the
  plan's outputs with a tolerance. On a mismatch it locates the **first diverging node**: the eager
  twin runs launch by launch, the output buffers of each launch (``Launch.uses`` with role
  ``write``) read after it, and the exec is replayed with every kernel node after node ``k``
  disabled (``cuGraphNodeSetEnabled``, so it is the exec itself, edited parameters included, that
  runs), ``k = 0, 1, ...``; the first ``k`` whose outputs differ is the node. Every plan buffer is
  put back as it was before the call.
* :class:`Verifier` does the same for any callable with an eager twin: every ``every``-th call
  compares replay and eager on the same fresh inputs and raises or warns with the first
  mismatching output. :func:`watch` and :func:`verified` return the exec / the replay callable
  itself when ``every`` is 0, so verification that is off costs nothing.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.graph import GraphExec, KernelNode
from ..runtime.errors import RawgraphWarning, call
from ..runtime.stream import as_stream
from .check import DoctorError


class ReplayMismatchWarning(RawgraphWarning):
    """A verified replay gave other outputs than its eager twin (``action="warn"``)."""


@dataclass(frozen=True)
class Mismatch:
    """The first output that differs: its name, the first differing element, and how many do."""

    output: str
    index: tuple[int, ...]
    got: float
    want: float
    count: int
    max_abs: float

    def __str__(self) -> str:
        return (
            f"output {self.output!r} differs at {self.index}: replay {self.got!r}, eager {self.want!r} "
            f"({self.count} element(s), max |diff| {self.max_abs:.3g})"
        )


@dataclass
class VerifyResult:
    """What one verification found.

    Attributes
    ----------
    ok : bool
    mismatch : Mismatch or None
        The first mismatching output of the whole replay.
    node : int or None
        Index (node-map order, the plan's launch order) of the first diverging node.
    node_label : str
        That node's launch (label, kernel name).
    node_mismatch : Mismatch or None
        How that node's output differs.
    seconds : float
    replays : int
        Replays the verification ran (1 + the prefix replays of the search).
    """

    ok: bool
    mismatch: Mismatch | None = None
    node: int | None = None
    node_label: str = ""
    node_mismatch: Mismatch | None = None
    seconds: float = 0.0
    replays: int = 0

    def __str__(self) -> str:
        if self.ok:
            return f"replay equals eager ({self.replays} replay(s), {self.seconds * 1e3:.2f} ms)"
        where = (
            f"; first diverging node {self.node} ({self.node_label}): {self.node_mismatch}"
            if self.node is not None
            else ""
        )
        return f"replay differs from eager: {self.mismatch}{where}"


class VerifyError(DoctorError):
    """A verified replay differs from its eager twin (``action="raise"``); ``result`` says where."""

    def __init__(self, result: VerifyResult):
        super().__init__(str(result))
        self.result = result


# --------------------------------------------------------------------------- comparing
def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> Mismatch | None:
    """The first element where ``got`` and ``want`` differ beyond ``atol + rtol * |want|`` (NaN
    equals NaN), or None; integers and bytes compare exactly."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Mismatch(name, (), float("nan"), float("nan"), max(got.size, want.size), float("inf"))
    if got.dtype.kind in "fc":
        g, w = got.astype(np.float64), want.astype(np.float64)
        bad = ~(np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    else:
        bad = got != want
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) if got.dtype.kind in "fciub" else np.zeros(1)
    finite = diff[np.isfinite(diff)]
    return Mismatch(
        name,
        idx,
        got[idx].item(),
        want[idx].item(),
        int(bad.sum()),
        float(finite.max()) if finite.size else float("inf"),
    )


def _read(view: Any) -> np.ndarray:
    """A device array's bytes as NumPy (``cuMemcpyDtoH``; the device is synchronized first)."""
    host: np.ndarray
    if hasattr(view, "detach") and hasattr(view, "cpu"):  # torch
        host = view.detach().cpu().numpy()
        return host
    if hasattr(view, "get") and hasattr(view, "data") and hasattr(view.data, "ptr"):  # CuPy
        host = view.get()
        return host
    out = np.empty(tuple(view.shape), dtype=view.dtype)
    if out.nbytes:
        call(driver.cuMemcpyDtoH, out.ctypes.data, int(view.ptr), out.nbytes)
    return out


def _write(view: Any, data: np.ndarray) -> None:
    data = np.ascontiguousarray(data)
    if data.nbytes:
        call(driver.cuMemcpyHtoD, int(view.ptr), data.ctypes.data, data.nbytes)


def _sync() -> None:
    call(driver.cuCtxSynchronize)


# --------------------------------------------------------------------------- rawgraph execs
def verify(
    exe: GraphExec,
    stream: Any,
    *,
    fresh_inputs: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    locate: bool = True,
    seed: int | None = None,
    action: str = "return",
) -> VerifyResult:
    """Replay ``exe`` and run its plan eagerly from the same state; compare the outputs, and on a
    mismatch name the first diverging node.

    Parameters
    ----------
    exe : GraphExec
        An exec of a rawgraph graph with a launch plan (``graph.plan``: :func:`capture_plan`,
        a :class:`Capture` of a plan or of RawKernel calls, ``GraphBuilder.run``).
    stream : stream-like
    fresh_inputs : bool
        Give the plan's float inputs new standard-normal values first (put back afterwards).
    rtol, atol : float
        Tolerance (``|replay - eager| <= atol + rtol * |eager|``).
    locate : bool
        Search for the first diverging node on a mismatch (one prefix replay per node up to it,
        each with the later kernel nodes disabled by ``cuGraphNodeSetEnabled``).
    seed : int, optional
        For the fresh inputs.
    action : ``"return"``, ``"raise"`` or ``"warn"``
        What a mismatch does besides being returned: raise :class:`VerifyError`, or warn
        :class:`ReplayMismatchWarning`.

    Returns
    -------
    VerifyResult

    Raises
    ------
    DoctorError
        The exec's graph has no plan (a foreign graph: use :class:`Verifier`), or ``action`` is
        unknown.
    VerifyError
        With ``action="raise"``, on a mismatch.

    See Also
    --------
    cuGraphNodeSetEnabled : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    if action not in ("return", "raise", "warn"):
        raise DoctorError(f"action is 'return', 'raise' or 'warn', got {action!r}")
    t0 = time.perf_counter()
    graph = exe.graph
    plan = getattr(graph, "plan", None)
    if plan is None:
        raise DoctorError(
            "verify() needs a rawgraph graph with a launch plan (its eager twin); for any other "
            "graph give the replay and its eager twin to Verifier"
        )
    exe._check_open()
    plan.check_open()
    s = as_stream(stream)
    graph.device.activate()
    _sync()
    buffers = dict(plan.buffers)
    saved = {name: _read(v) for name, v in buffers.items()}
    try:
        start = dict(saved)
        if fresh_inputs:
            rng = np.random.default_rng(seed)
            for name in plan.inputs:
                v = buffers.get(name)
                if v is not None and np.dtype(v.dtype).kind == "f":
                    start[name] = rng.standard_normal(tuple(v.shape)).astype(v.dtype)

        def restore() -> None:
            for name, v in buffers.items():
                _write(v, start[name])

        restore()
        exe.launch(s)
        s.synchronize()
        got = {name: _read(buffers[name]) for name in plan.outputs}
        restore()
        plan.run(s)
        s.synchronize()
        mismatch = None
        for name in plan.outputs:
            mismatch = compare(name, got[name], _read(buffers[name]), rtol, atol)
            if mismatch is not None:
                break
        result = VerifyResult(mismatch is None, mismatch, replays=1)
        if mismatch is not None and locate:
            _locate(exe, graph.nodes, buffers, restore, s, rtol, atol, result)
    finally:
        _sync()
        for name, v in buffers.items():
            _write(v, saved[name])
    result.seconds = time.perf_counter() - t0
    if not result.ok:
        if action == "raise":
            raise VerifyError(result)
        if action == "warn":
            warnings.warn(str(result), ReplayMismatchWarning, stacklevel=2)
    return result


def _written(node: KernelNode) -> list[str]:
    return [u.buffer for u in node.launch.uses.values() if u.role == "write"]


def _set_enabled(exe: GraphExec, nodes: Sequence[KernelNode], upto: int) -> None:
    for kn in nodes:
        call(driver.cuGraphNodeSetEnabled, exe.handle, kn.handle, 1 if kn.index <= upto else 0)


def _locate(
    exe: GraphExec,
    nodes: Sequence[KernelNode],
    buffers: dict[str, Any],
    restore: Callable[[], None],
    s: Any,
    rtol: float,
    atol: float,
    result: VerifyResult,
) -> None:
    """The first node whose outputs differ between a prefix replay and the eager twin."""
    knodes = sorted(nodes, key=lambda k: k.index)
    # The eager twin, launch by launch: each launch's written buffers right after it.
    restore()
    want: list[dict[str, np.ndarray]] = []
    for kn in knodes:
        kn.launch(s)
        s.synchronize()
        want.append({b: _read(buffers[b]) for b in _written(kn) if b in buffers})
    try:
        for k, kn in enumerate(knodes):
            _set_enabled(exe, knodes, kn.index)
            restore()
            exe.launch(s)
            s.synchronize()
            result.replays += 1
            for b, ref in want[k].items():
                m = compare(b, _read(buffers[b]), ref, rtol, atol)
                if m is not None:
                    result.node, result.node_mismatch = kn.index, m
                    result.node_label = f"{kn.launch.label or kn.launch.kernel.short_name} ({kn.launch.kernel.name})"
                    return
    finally:
        _set_enabled(exe, knodes, max((k.index for k in knodes), default=0))


class VerifiedExec:
    """An exec whose every ``every``-th :meth:`launch` is verified (:func:`verify`); the other
    launches are one ``cuGraphLaunch``. Made by :func:`watch`.

    See Also
    --------
    cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    exec: GraphExec
    every: int
    options: dict[str, Any]
    count: int

    def __init__(self, exe: GraphExec, every: int, **options: Any):
        self.exec = exe
        self.every = int(every)
        self.options = options
        self.count = 0
        self.results: list[VerifyResult] = []

    def launch(self, stream: Any) -> None:
        self.count += 1
        if self.count % self.every == 0:
            self.results.append(verify(self.exec, stream, **{"action": "raise", **self.options}))
            # verify left every buffer as it was: the launch asked for still runs
        self.exec.launch(stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.exec, name)


def watch(exe: GraphExec, every: int = 0, **options: Any) -> GraphExec | VerifiedExec:
    """``exe`` itself when ``every`` is 0 (verification off costs nothing), else a
    :class:`VerifiedExec` verifying every ``every``-th launch (``options`` go to :func:`verify`;
    ``action`` defaults to ``"raise"``)."""
    if every < 0:
        raise DoctorError(f"every must be >= 0, got {every}")
    return exe if every == 0 else VerifiedExec(exe, every, **options)


# --------------------------------------------------------------------------- any callable
class Verifier:
    """Replay with an eager twin, compared every ``every``-th call.

    Parameters
    ----------
    replay, eager : callable
        Each computes the outputs from the inputs (a graph replay, and the same work run eagerly).
    outputs : sequence
        The output arrays both write (torch tensors, CuPy arrays, rawgraph buffers).
    every : int
        Compare on every ``every``-th call (0: never; use :func:`verified` to skip the wrapper).
    fill : callable, optional
        Gives the inputs fresh values before a verified call.
    rtol, atol : float
    action : ``"raise"`` or ``"warn"``
    sync : callable, optional
        Waits for the work (default ``cuCtxSynchronize``).

    See Also
    --------
    cuCtxSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html
    """

    replay: Callable[[], Any]
    eager: Callable[[], Any]
    outputs: list[Any]
    every: int
    fill: Callable[[], Any] | None
    rtol: float
    atol: float
    action: str
    sync: Callable[[], Any]
    count: int

    def __init__(
        self,
        replay: Callable[[], Any],
        eager: Callable[[], Any],
        outputs: Sequence[Any],
        every: int = 1,
        fill: Callable[[], Any] | None = None,
        rtol: float = 1e-5,
        atol: float = 1e-6,
        action: str = "raise",
        sync: Callable[[], Any] | None = None,
    ):
        if action not in ("raise", "warn"):
            raise DoctorError(f"action is 'raise' or 'warn', got {action!r}")
        self.replay, self.eager, self.outputs = replay, eager, list(outputs)
        self.every, self.fill, self.rtol, self.atol, self.action = int(every), fill, rtol, atol, action
        self.sync = sync or _sync
        self.count = 0
        self.results: list[VerifyResult] = []

    def check_now(self) -> VerifyResult:
        """Fresh inputs, replay, copy the outputs, eager, compare."""
        t0 = time.perf_counter()
        if self.fill is not None:
            self.fill()
        self.replay()
        self.sync()
        got = [_read(o) for o in self.outputs]
        self.eager()
        self.sync()
        mismatch = None
        for i, (o, g) in enumerate(zip(self.outputs, got)):
            mismatch = compare(f"output {i}", g, _read(o), self.rtol, self.atol)
            if mismatch is not None:
                break
        result = VerifyResult(mismatch is None, mismatch, seconds=time.perf_counter() - t0, replays=1)
        self.results.append(result)
        if not result.ok:
            if self.action == "raise":
                raise VerifyError(result)
            warnings.warn(str(result), ReplayMismatchWarning, stacklevel=3)
        return result

    def __call__(self) -> Any:
        self.count += 1
        if self.every and self.count % self.every == 0:
            self.check_now()
            return None
        return self.replay()


def verified(
    replay: Callable[[], Any], eager: Callable[[], Any], outputs: Sequence[Any], every: int = 0, **options: Any
) -> Callable[[], Any]:
    """``replay`` itself when ``every`` is 0, else a :class:`Verifier` around it."""
    if every < 0:
        raise DoctorError(f"every must be >= 0, got {every}")
    return replay if every == 0 else Verifier(replay, eager, outputs, every, **options)


__all__ = [
    "Mismatch",
    "ReplayMismatchWarning",
    "VerifiedExec",
    "VerifyError",
    "VerifyResult",
    "Verifier",
    "compare",
    "verified",
    "verify",
    "watch",
]
