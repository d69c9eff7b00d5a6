"""The latency model fitted from a trace, per path.

rawgraph's model of one step: ``T_eager ~ sum(T_launch + T_kernel) + T_framework`` against
``T_replay ~ T_graph_launch + sum(T_kernel)``. A trace measures each term where it happens:

- *host launch cost*: the time per step inside the driver calls that submit work (the
  ``launch``, ``graph``, ``update`` and ``copy`` groups of :mod:`rawgraph.trace.hooks`), and how many;
- *device time per kernel*: each kernel's device span, by name (CUPTI only);
- *the gap*: the device's idle time between consecutive spans of one step. Where the host's
  launches are on the critical path the device waits for each launch and the gaps are wide;
  a step is *launch-bound* when the device idles for more than :data:`LAUNCH_BOUND_IDLE` of the
  window from its first span's start to its last span's end.

Device spans belong to a step through their correlation id (the host call that launched them ran
inside the step); spans launched by calls the tracer does not wrap (PyTorch's, through the CUDA
runtime) belong to the step during which they began (up to the next step's start). With the CUDA-event fallback a step has one device span of its own, with no
gaps to read: the gap columns are empty there.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from .records import DeviceSpan, HostSpan

# A step whose device idles for more than this fraction of its busy window is launch-bound.
LAUNCH_BOUND_IDLE = 0.25
# The driver-call groups that submit work (their time is the host's launch cost).
SUBMIT_GROUPS = ("launch", "graph", "update", "copy")


@dataclass(frozen=True)
class PathModel:
    """One path's terms, medians over its steps (microseconds).

    Attributes
    ----------
    path : str
    steps : int
    host_step_us : float
        The step's wall time on the host.
    host_launch_us : float
        Inside the driver calls that submit work, per step.
    calls_per_step : float
        How many such calls a step makes.
    device_busy_us : float or None
        Time some device span of the step was running (the union of its spans).
    device_window_us : float or None
        From the step's first device span's start to its last span's end.
    gap_us : float or None
        The idle gap between consecutive device spans of a step (CUPTI only).
    idle_fraction : float or None
        ``1 - busy / window`` (CUPTI only).
    launch_bound : bool or None
        ``idle_fraction > LAUNCH_BOUND_IDLE`` (CUPTI only).
    kernels : dict of str -> float
        Device time per kernel (the launch's label where the node map names it, else the
        driver's name).
    """

    path: str
    steps: int
    host_step_us: float
    host_launch_us: float
    calls_per_step: float
    device_busy_us: float | None = None
    device_window_us: float | None = None
    gap_us: float | None = None
    idle_fraction: float | None = None
    launch_bound: bool | None = None
    kernels: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LatencyModel:
    """Every path's :class:`PathModel`, in the order the paths ran."""

    source: str
    paths: list[PathModel]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "launch_bound_idle": LAUNCH_BOUND_IDLE, "paths": [asdict(p) for p in self.paths]}

    def table(self) -> str:
        """The model as a text table: a row per path, then each path's kernels."""

        def f(v: float | None, digits: int = 2) -> str:
            return "-" if v is None else f"{v:.{digits}f}"

        head = (
            f"{'path':22s} {'steps':>5s} {'host/step':>10s} {'launch':>9s} {'calls':>6s} "
            f"{'dev busy':>9s} {'dev window':>10s} {'gap':>7s} {'idle':>5s}  bound"
        )
        lines = [f"latency model (device: {self.source}; microseconds, medians over steps)", head]
        for p in self.paths:
            bound = "-" if p.launch_bound is None else ("launch" if p.launch_bound else "device")
            lines.append(
                f"{p.path:22s} {p.steps:5d} {f(p.host_step_us):>10s} {f(p.host_launch_us):>9s} "
                f"{f(p.calls_per_step, 1):>6s} {f(p.device_busy_us):>9s} {f(p.device_window_us):>10s} "
                f"{f(p.gap_us):>7s} {f(p.idle_fraction):>5s}  {bound}"
            )
        for p in self.paths:
            if p.kernels:
                lines.append(f"{p.path}: " + ", ".join(f"{k} {v:.2f}" for k, v in p.kernels.items()))
        return "\n".join(lines)


def _union_and_gaps(spans: list[DeviceSpan]) -> tuple[int, int, list[int]]:
    """(busy ns, window ns, idle gaps ns) of spans that may overlap."""
    spans = sorted(spans, key=lambda s: s.start_ns)
    busy, gaps = 0, []
    cur_start, cur_end = spans[0].start_ns, spans[0].end_ns
    for s in spans[1:]:
        if s.start_ns > cur_end:
            busy += cur_end - cur_start
            gaps.append(s.start_ns - cur_end)
            cur_start, cur_end = s.start_ns, s.end_ns
        else:
            cur_end = max(cur_end, s.end_ns)
        # a span that starts before the previous one ends (a PDL launch, another stream): no gap
    busy += cur_end - cur_start
    return busy, max(s.end_ns for s in spans) - spans[0].start_ns, gaps


def fit(
    host: Iterable[HostSpan], device: Iterable[DeviceSpan], correlations: dict[int, int], source: str
) -> LatencyModel:
    """The model of every path that has steps (see the module docstring)."""
    host = list(host)
    steps = [s for s in host if s.cat == "step" and s.path is not None]
    calls_in: dict[tuple[int, int], list[HostSpan]] = {}
    for s in host:
        if s.step >= 0 and s.cat not in ("step", "path"):
            calls_in.setdefault((s.thread, s.step), []).append(s)
    by_corr: dict[int, list[DeviceSpan]] = {}
    by_step: dict[int, list[DeviceSpan]] = {}
    seen = set(correlations.values())
    loose: list[DeviceSpan] = []  # launched by calls the tracer did not wrap (the CUDA runtime's)
    for d in device:
        if d.kind == "step":
            by_step.setdefault(int(d.args.get("step", -1)), []).append(d)
        elif d.correlation in seen:
            by_corr.setdefault(d.correlation, []).append(d)
        else:
            loose.append(d)
    loose.sort(key=lambda d: d.start_ns)
    starts = [d.start_ns for d in loose]
    paths: dict[int, list[HostSpan]] = {}
    names: dict[int, str] = {}
    for s in steps:
        assert s.path is not None
        paths.setdefault(id(s.path), []).append(s)
        names[id(s.path)] = s.path.name
    out = []
    for key, path_steps in paths.items():
        host_us, launch_us, ncalls = [], [], []
        busy_us: list[float] = []
        window_us: list[float] = []
        idle: list[float] = []
        gaps_us: list[float] = []
        kernels: dict[str, list[float]] = {}
        path_steps.sort(key=lambda st: st.start_ns)
        mark = path_steps[-1].path
        ends = [st.start_ns for st in path_steps[1:]] + [mark.end_ns if mark is not None and mark.end_ns else 1 << 62]
        for st, until in zip(path_steps, ends):
            step_index = int(st.args.get("index", st.step))
            calls = calls_in.get((st.thread, step_index), [])
            submit = [c for c in calls if c.cat in SUBMIT_GROUPS]
            host_us.append((st.end_ns - st.start_ns) / 1e3)
            launch_us.append(sum(c.end_ns - c.start_ns for c in submit) / 1e3)
            ncalls.append(float(len(submit)))
            dev = [d for c in calls for d in by_corr.get(correlations.get(c.id, -1), [])]
            if not dev:
                dev = by_step.get(step_index, [])
            if not dev:  # no call of the step launched them: the spans that began during the step
                dev = loose[bisect.bisect_left(starts, st.start_ns) : bisect.bisect_left(starts, until)]
            if not dev:
                continue
            busy, window, gaps = _union_and_gaps(dev)
            busy_us.append(busy / 1e3)
            window_us.append(window / 1e3)
            if any(d.kind != "step" for d in dev):
                idle.append(1.0 - busy / window if window else 0.0)
                gaps_us.extend(g / 1e3 for g in gaps)
                for d in dev:
                    label = str(d.args.get("launch") or d.name)
                    kernels.setdefault(label, []).append((d.end_ns - d.start_ns) / 1e3)
        idle_med = median(idle) if idle else None
        out.append(
            PathModel(
                names[key],
                len(path_steps),
                median(host_us),
                median(launch_us),
                median(ncalls),
                median(busy_us) if busy_us else None,
                median(window_us) if window_us else None,
                (median(gaps_us) if gaps_us else 0.0) if idle else None,
                idle_med,
                None if idle_med is None else idle_med > LAUNCH_BOUND_IDLE,
                {k: round(median(v), 3) for k, v in kernels.items()},
            )
        )
    return LatencyModel(source, out)
