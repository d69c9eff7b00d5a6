"""Timing helpers shared by the seed experiment and the benchmarks (three clocks, never mixed).

- :func:`synced_us`: per-iteration wall time with a stream synchronize inside (the seed's method:
  end-to-end latency of one step);
- :func:`pipelined_us`: N steps then one synchronize, per step (host throughput);
- :func:`device_us`: CUDA events around each step (device time).
Each returns samples in microseconds; :func:`stats` gives median, p10 and p90.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .stream import Event, Stream


def stats(samples: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(samples, dtype=np.float64)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90))}


def synced_us(fn: Callable[[], None], stream: Stream, rounds: int = 200, warmup: int = 20) -> list[float]:
    """Wall time of ``fn(); stream.synchronize()`` per round, after ``warmup`` rounds."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    out = []
    clock = time.perf_counter
    sync = stream.synchronize
    for _ in range(rounds):
        t0 = clock()
        fn()
        sync()
        out.append((clock() - t0) * 1e6)
    return out


def pipelined_us(
    fn: Callable[[], None], stream: Stream, steps: int = 200, repeats: int = 7, warmup: int = 20
) -> list[float]:
    """Per-step wall time of ``steps`` back-to-back calls and one synchronize, ``repeats`` times."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    out = []
    clock = time.perf_counter
    for _ in range(repeats):
        t0 = clock()
        for _ in range(steps):
            fn()
        stream.synchronize()
        out.append((clock() - t0) * 1e6 / steps)
    return out


def device_us(fn: Callable[[], None], stream: Stream, rounds: int = 100, warmup: int = 10) -> list[float]:
    """Device time between events recorded before and after each ``fn()``."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    pairs = [(Event(), Event()) for _ in range(rounds)]
    for a, b in pairs:
        a.record(stream)
        fn()
        b.record(stream)
    stream.synchronize()
    out = [a.elapsed_ms(b) * 1e3 for a, b in pairs]
    for a, b in pairs:
        a.close()
        b.close()
    return out
