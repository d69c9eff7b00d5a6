"""Measured-cost choice of a serving strategy.

:func:`choose_strategy` builds each candidate in turn (bucket graphs, row-count rebinding, one
re-shaped graph, a device-shaped graph with one band, one with bands from the plans, and one
picking the vLLM bucket size with a SWITCH node) over the
same model, reads the device memory it took from the object, skips it with the reason when it is
over the budget (or fails to build or run), times the rest replaying a sample of the batch-size
trace, closes it before building the next (so at most one candidate is resident), and returns the
fastest as a :class:`Choice` with every figure. :func:`regret` is the benchmark's measure of that
choice: the relative excess of the chosen strategy's time over the best fixed strategy on the
whole trace.

Timing is injectable (``timer``): CPU tests drive the logic with fake costs and stub
candidates (``candidates`` maps a name to a factory), no GPU needed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..runtime.errors import RawgraphError, ShapeError

#: ``factory(model, max_batch, stream) -> candidate``: an object with ``run``, ``close`` and
#: ``memory`` (dict of bytes) or ``nbytes``.
Factory = Callable[[Any, int, Any], Any]
#: ``timer(name, adapter, sample) -> seconds`` for one pass over the sample.
Timer = Callable[[str, "Adapter", Sequence[int]], float]


class ChooseError(RawgraphError, ValueError):
    """Bad input to :func:`choose_strategy` or :func:`regret`, or no candidate fits."""


def _buckets(model: Any, max_batch: int, stream: Any) -> Any:
    from .buckets import BucketGraphs

    return BucketGraphs(model, max_batch=max_batch, stream=stream)


def _rowcount(model: Any, max_batch: int, stream: Any) -> Any:
    from .reshape import RowCountBuckets

    return RowCountBuckets(model, max_batch=max_batch, stream=stream)


def _reshaped(model: Any, max_batch: int, stream: Any) -> Any:
    from .reshape import ReshapedGraph

    return ReshapedGraph(model, max_batch, stream)


def _device_shaped(model: Any, max_batch: int, stream: Any) -> Any:
    from .device_shaped import DeviceShapedGraph

    return DeviceShapedGraph(model, max_batch, stream)


def _device_bands(model: Any, max_batch: int, stream: Any) -> Any:
    from .device_shaped import DeviceShapedGraph

    return DeviceShapedGraph(model, max_batch, stream, bands="plans")


def _switch_sizes(model: Any, max_batch: int, stream: Any) -> Any:
    from .device_shaped import DeviceShapedGraph
    from .sizes import vllm_sizes

    return DeviceShapedGraph(model, max_batch, stream, bands=vllm_sizes(max_batch), select="switch")


#: The strategies, in the order they are tried: bucket graphs, row-count rebinding, one re-shaped
#: graph, one device-shaped graph (one band), one with a band wherever the plan changes, and one
#: whose SWITCH node runs the plan of the vLLM bucket size holding n, as captured.
DEFAULT_CANDIDATES: dict[str, Factory] = {
    "buckets": _buckets,
    "rowcount": _rowcount,
    "reshaped": _reshaped,
    "device_shaped": _device_shaped,
    "device_bands": _device_bands,
    "switch_sizes": _switch_sizes,
}


def footprint(obj: Any) -> int | None:
    """Device bytes a candidate holds, weights not counted (they are shared): from its
    ``memory`` dict (:class:`BucketGraphs`: the larger of ``allocated`` and ``io`` +
    ``workspace``, plus ``graphs``), else its ``nbytes`` (:class:`DeviceShapedGraph`), else its
    ``input``/``output``/``arena`` buffers (:class:`ReshapedGraph`, execs not counted); None when
    it exposes none of these."""
    mem = getattr(obj, "memory", None)
    if isinstance(mem, Mapping):
        io_ws = int(mem.get("io", 0)) + int(mem.get("workspace", 0))
        return max(int(mem.get("allocated", 0)), io_ws) + max(int(mem.get("graphs", 0)), 0)
    nb = getattr(obj, "nbytes", None)
    if isinstance(nb, (int, np.integer)) and not isinstance(nb, bool):
        return int(nb)
    parts = [getattr(obj, a, None) for a in ("input", "output", "arena")]
    sizes: list[Any] = [getattr(p, "nbytes", None) for p in parts if p is not None]
    if sizes and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in sizes):
        return int(sum(int(s) for s in sizes))
    return None


class Adapter:
    """One signature over every strategy: ``step(n)`` runs ``n`` rows of the persistent input
    (``run(n, stream)`` on a device-shaped graph, ``run(input, n, stream)`` on the others);
    ``sync()`` waits for the stream."""

    stream: Any | None

    def __init__(self, obj: Any, stream: Any = None):
        from .device_shaped import DeviceShapedGraph

        self.obj = obj
        self.stream = stream if stream is not None else getattr(obj, "stream", None)
        self._device_shaped = isinstance(obj, DeviceShapedGraph)
        self._x = getattr(obj, "input", None)

    def step(self, n: int) -> None:
        if self._device_shaped:
            self.obj.run(n, self.stream)
        else:
            self.obj.run(self._x, n, self.stream)

    def sync(self) -> None:
        sync = getattr(self.stream, "synchronize", None)
        if sync is not None:
            sync()


class SampleTimer:
    """The default timer: one warm-up pass over the sample, then passes until ``seconds`` have
    gone (at least one), the stream synchronized before and after; returns seconds per pass
    (host clock, ``time.perf_counter``)."""

    seconds: float
    warmup: int

    def __init__(self, seconds: float = 0.2, warmup: int = 1):
        self.seconds = float(seconds)
        self.warmup = int(warmup)

    def __call__(self, name: str, adapter: Adapter, sample: Sequence[int]) -> float:
        for _ in range(self.warmup):
            for n in sample:
                adapter.step(n)
        adapter.sync()
        clock = time.perf_counter
        passes = 0
        t0 = clock()
        while True:
            for n in sample:
                adapter.step(n)
            passes += 1
            adapter.sync()
            elapsed = clock() - t0
            if elapsed >= self.seconds:
                return elapsed / passes


@dataclass
class Choice:
    """What :func:`choose_strategy` found.

    Attributes
    ----------
    name : str
        The fastest candidate that fit.
    seconds : dict
        Name -> seconds per pass over the sample, for every candidate timed.
    per_step : dict
        Name -> mean seconds per step (``seconds / len(sample)``).
    memory : dict
        Name -> device bytes (None where the object exposes none), for every candidate built.
    skipped : dict
        Name -> why it was not timed (over the budget, failed to build or run).
    sample_len : int
    """

    name: str
    seconds: dict[str, float] = field(default_factory=dict)
    per_step: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int | None] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    sample_len: int = 0

    def speedup(self, other: str) -> float:
        """How many times faster the choice is than ``other`` on the sample."""
        return self.seconds[other] / self.seconds[self.name]


def _check_sample(trace_sample: Any, max_batch: int) -> list[int]:
    sample = list(trace_sample)
    if not sample:
        raise ChooseError("trace_sample is empty")
    for n in sample:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"trace_sample holds {type(n).__name__} {n!r}, not an int")
        if not 1 <= n <= max_batch:
            raise ShapeError(f"trace_sample holds n = {n}, outside 1..max_batch = {max_batch}")
    return [int(n) for n in sample]


def _resolve(candidates: Any) -> dict[str, Factory]:
    if candidates is None:
        return dict(DEFAULT_CANDIDATES)
    if isinstance(candidates, Mapping):
        out = dict(candidates)
        bad = [k for k, f in out.items() if not callable(f)]
        if bad:
            raise ChooseError(f"candidate factories must be callable: {bad}")
    else:
        names = [candidates] if isinstance(candidates, str) else list(candidates)
        unknown = [n for n in names if n not in DEFAULT_CANDIDATES]
        if unknown:
            raise ChooseError(f"unknown candidates {unknown}; known: {list(DEFAULT_CANDIDATES)}")
        out = {n: DEFAULT_CANDIDATES[n] for n in names}
    if not out:
        raise ChooseError("no candidates given")
    return out


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def choose_strategy(
    model: Any,
    trace_sample: Sequence[int],
    max_batch: int,
    memory_budget: int | None = None,
    candidates: Sequence[str] | Mapping[str, Factory] | None = None,
    stream: Any = None,
    seconds: float = 0.2,
    timer: Timer | None = None,
) -> Choice:
    """Measure the candidate strategies on a sample of the batch-size trace and return the
    fastest that fits ``memory_budget`` (device bytes, weights not counted; None: no limit).

    Parameters
    ----------
    model : RowwiseModel
        Shared by every candidate (weights are not copied).
    trace_sample : sequence of int
        Batch sizes, each in ``1..max_batch``, replayed in order.
    max_batch : int
    memory_budget : int, optional
    candidates : names or mapping, optional
        Names among :data:`DEFAULT_CANDIDATES`, or name -> ``factory(model, max_batch, stream)``
        (for stubs, or other settings). Default: all of them.
    stream : stream-like, optional
        Passed to each factory and synchronized by the default timer (else each candidate's own).
    seconds : float
        How long the default timer replays each candidate.
    timer : callable(name, adapter, sample) -> seconds, optional
        Default :class:`SampleTimer` ``(seconds)``.

    A candidate that raises (an :class:`Exception`) while building or being timed is skipped
    with the reason; every candidate built is closed before the next is built, whatever
    happens.

    Raises
    ------
    ChooseError
        Empty sample, negative budget, unknown candidate, or none fits.
    ShapeError, TypeError
        ``max_batch`` < 1, a sample entry outside ``1..max_batch`` or not an int.
    """
    if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)):
        raise TypeError(f"max_batch must be an int, got {type(max_batch).__name__}")
    if max_batch < 1:
        raise ShapeError(f"max_batch must be >= 1, got {max_batch}")
    max_batch = int(max_batch)
    sample = _check_sample(trace_sample, max_batch)
    if memory_budget is not None:
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer, float)):
            raise TypeError(f"memory_budget must be a number of bytes, got {type(memory_budget).__name__}")
        if not memory_budget >= 0:
            raise ChooseError(f"memory_budget must be >= 0 bytes, got {memory_budget}")
    if not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise ChooseError(f"seconds must be a positive finite number, got {seconds!r}")
    factories = _resolve(candidates)
    if stream is not None and not hasattr(stream, "synchronize"):
        from ..runtime.stream import as_stream

        stream = as_stream(stream)
    time_it: Timer = SampleTimer(seconds) if timer is None else timer

    figures: dict[str, float] = {}
    memory: dict[str, int | None] = {}
    skipped: dict[str, str] = {}
    for name, factory in factories.items():
        try:
            obj = factory(model, max_batch, stream)
        except Exception as exc:  # e.g. a model naming no row count for rowcount / device_shaped
            skipped[name] = f"failed to build: {_reason(exc)}"
            continue
        try:
            nbytes = footprint(obj)
            memory[name] = nbytes
            if memory_budget is not None and nbytes is None:
                skipped[name] = "memory unknown (the object exposes no memory or nbytes) under a budget"
                continue
            if memory_budget is not None and nbytes is not None and nbytes > memory_budget:
                skipped[name] = f"over budget: {nbytes} bytes > {int(memory_budget)}"
                continue
            try:
                t = float(time_it(name, Adapter(obj, stream), sample))
            except Exception as exc:
                skipped[name] = f"failed to run: {_reason(exc)}"
                continue
            if not (t > 0 and math.isfinite(t)):
                skipped[name] = f"timer gave {t!r} seconds"
                continue
            figures[name] = t
        finally:
            obj.close()
    if not figures:
        raise ChooseError(f"no candidate fits: {skipped}")
    best = min(figures, key=lambda k: figures[k])
    return Choice(
        name=best,
        seconds=figures,
        per_step={k: v / len(sample) for k, v in figures.items()},
        memory=memory,
        skipped=skipped,
        sample_len=len(sample),
    )


def regret(choice_name: str, per_strategy_trace_times: Mapping[str, float]) -> float:
    """``(t[choice] - min t) / min t`` over the whole trace: 0 when the choice is the best
    fixed strategy, 0.03 when it is 3 % slower."""
    times = dict(per_strategy_trace_times)
    if choice_name not in times:
        raise ChooseError(f"{choice_name!r} has no trace time (have {sorted(times)})")
    for k, v in times.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            raise TypeError(f"trace time of {k!r} is {type(v).__name__}, not a number")
        if not (v > 0 and math.isfinite(v)):
            raise ChooseError(f"trace time of {k!r} must be positive and finite, got {v!r}")
    best = min(times.values())
    return (float(times[choice_name]) - best) / best
