"""Where does the host time of capturing vLLM's 35 bucket graphs go? (issue 23's set-up target)

``rawgraph bench buckets`` puts the vLLM list's set-up (w1024, 8 layers, fused) at 18-21 ms on
the H100 (2026-12-06, ``c26807b``), about half of it capture: 35 captures of 16-18 launches. This
builds the same :class:`~rawgraph.BucketGraphs` twice (the first loads the kernels), the second
under ``cProfile``, and prints the set-up phases, the captured launches, the host time per
captured launch, and the functions that took the most time of their own.

    PYTHONPATH=. python3 benchmarks/probes/capture_cost.py [--width 1024] [--layers 8] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    from rawgraph import BucketGraphs, Stream, TinyBlock, gpu_available

    if not gpu_available():
        print("NO GPU: cuInit failed")
        return 2
    s = Stream()
    model = TinyBlock(a.width, 1, a.layers, seed=1, form="fused")
    BucketGraphs(model, max_batch=a.max_batch, stream=s).close()  # compiles and loads every cut
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    bg = BucketGraphs(model, max_batch=a.max_batch, stream=s)
    prof.disable()
    wall = time.perf_counter() - t0
    launches = sum(len(g.nodes) for g in bg.graphs.values())
    print(f"FACT sizes = {len(bg.sizes)}; captured kernel nodes = {launches}")
    print(
        "FACT setup ms = "
        + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in bg.setup.items())
        + f"; wall under cProfile {wall * 1e3:.1f}"
    )
    print(f"FACT warm-up runs = {bg.warm_up.runs}, skipped = {bg.warm_up.skipped}")
    print(
        f"FACT capture us per kernel node = {bg.setup['capture'] * 1e6 / max(launches, 1):.1f} "
        "(cProfile's own overhead included)"
    )
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(a.top)
        print(f"--- by {key}")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:12000])
    bg.close()
    model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
