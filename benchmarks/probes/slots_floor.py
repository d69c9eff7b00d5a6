"""Probe: what the slots trace's worst buckets are made of (issue 23's slots target, 0.75x PyTorch).

    PYTHONPATH=. python3 benchmarks/probes/slots_floor.py [--buckets 104 112 120 128] [--steps 30]

``rawgraph bench slots`` (w1024, 8 fused layers) finds graph_table's step at most 0.80x PyTorch's
vLLM-style step at p50 (`slots_2026-12-06_847ed0a_h100.log`), the worst at 104-128 rows. For each
bucket here, one ``SlotPool`` (``table="graph"``, ``gather="fused"``, as graph_table) and one
``TorchSlots`` (the bench's PyTorch strategy), each holding exactly ``b`` live rows, replay their
bucket-``b`` step ``--steps`` times under the PyTorch profiler (CUPTI sees the kernels inside both
graphs). Per strategy and bucket: the step's median device span (first kernel start to last kernel
end), the sum of its GEMM kernels (ours: ``sgemm``/``matmul``; PyTorch's: cuBLAS's GEMM and split-K
reduction kernels) and of everything else, kernel names with their count and median time. Then the
synced host-clock step (the bench's measure: launch + sync), medians over interleaved rounds.

Busy times are unions of kernel intervals (our PDL kernels overlap their predecessors). The line to
read: ``FLOOR b=..``: our GEMMs' busy time over PyTorch's synced step (above 0.75, the target needs
faster GEMMs even with the launch and sync free), the same for cuBLAS's GEMMs (what GEMMs at cuBLAS's
speed would allow), and what our launch and sync add beyond our device span.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import torch  # before any rawgraph GPU work
except ImportError:  # pragma: no cover - the probe needs torch
    torch = None

import _common as C  # noqa: E402,F401  (puts the repository on sys.path)
import numpy as np  # noqa: E402

GEMM_WORDS = ("sgemm", "matmul", "gemm", "splitKreduce", "cutlass")


def is_gemm(name: str) -> bool:
    """A GEMM kernel or its split-K reduction, ours or cuBLAS's."""
    return any(w in name for w in GEMM_WORDS)


def kernel_events(prof_trace: str) -> list[dict]:
    """Kernel events of an exported chrome trace, sorted by start."""
    with open(prof_trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    return sorted(events, key=lambda e: e["ts"])


def busy(events: list[dict]) -> float:
    """Time covered by at least one of ``events`` (µs): the union of their intervals. Not the sum:
    under PDL each of our kernels starts while the one before it runs and waits for it on the
    device, so the sum of their durations counts the overlap twice."""
    total, end = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e["ts"]):
        start, stop = e["ts"], e["ts"] + e["dur"]
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def split_steps(events: list[dict], per_step: int) -> list[list[dict]]:
    """Consecutive groups of ``per_step`` kernels (one graph replay each)."""
    return [events[i : i + per_step] for i in range(0, len(events) - per_step + 1, per_step)]


def main() -> int:
    """Build both strategies per bucket, profile their steps, print FACT / TIME / FLOOR lines."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--buckets", type=int, nargs="+", default=[104, 112, 120, 128])
    p.add_argument("--steps", type=int, default=30, help="profiled replays per strategy and bucket")
    p.add_argument("--rounds", type=int, default=200, help="synced host-clock steps per strategy and bucket")
    a = p.parse_args()
    if torch is None or not torch.cuda.is_available():
        print("NO GPU: torch with CUDA is needed")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    from torch.profiler import ProfilerActivity, profile

    from rawgraph.bench.slots import TorchSlots
    from rawgraph.models.tinyblock import TinyBlock
    from rawgraph.runtime.stream import Stream
    from rawgraph.serving import SlotPool

    width, layers = 1024, 8
    model = TinyBlock(width, 1, layers, seed=11, form="fused")
    rng = np.random.default_rng(5)
    print(f"FACT device = {torch.cuda.get_device_name()}")
    for b in a.buckets:
        max_slots = b  # a pool's largest bucket must hold every slot
        s = Stream()
        ours = SlotPool(model, max_slots, [b], stream=s, table="graph", gather="fused")
        theirs = TorchSlots(torch, model, max_slots, [b])
        for _ in range(b):
            row = rng.standard_normal(width, dtype=np.float32)
            ours.join(row)
            theirs.join(torch.from_numpy(row))
        for _ in range(5):
            ours.step()
            s.synchronize()
            theirs.step()
            theirs.sync()
        # kernels per step: count one replay's kernels
        spans: dict[str, list[float]] = {}
        gemm: dict[str, list[float]] = {}
        other: dict[str, list[float]] = {}
        names: dict[str, dict[str, list[float]]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for label, step, sync in (("rawgraph", ours.step, s.synchronize), ("torch", theirs.step, theirs.sync)):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    sync()
                path = os.path.join(tmp, f"{label}1.json")
                prof.export_chrome_trace(path)
                per_step = len(kernel_events(path))
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(a.steps):
                        step()
                        sync()
                path = os.path.join(tmp, f"{label}.json")
                prof.export_chrome_trace(path)
                events = kernel_events(path)
                if len(events) != per_step * a.steps:  # the groups below would straddle replays
                    print(f"FAIL b={b} {label}: {len(events)} kernels in {a.steps} replays of {per_step}")
                    return 1
                steps = split_steps(events, per_step)
                spans[label] = [g[-1]["ts"] + g[-1]["dur"] - g[0]["ts"] for g in steps]
                gemm[label] = [busy([e for e in g if is_gemm(e["name"])]) for g in steps]
                other[label] = [busy([e for e in g if not is_gemm(e["name"])]) for g in steps]
                by: dict[str, list[float]] = {}
                for g in steps:
                    for e in g:
                        by.setdefault(e["name"][:90], []).append(e["dur"])
                names[label] = by
                print(f"FACT b={b} {label}: {per_step} kernels a step, {len(steps)} steps profiled")
        for label in ("rawgraph", "torch"):
            print(
                f"TIME b={b} {label}: device span median={statistics.median(spans[label]):.1f} us, GEMM kernels "
                f"busy {statistics.median(gemm[label]):.1f} us, other kernels busy {statistics.median(other[label]):.1f} us"
            )
            for name, durs in sorted(names[label].items(), key=lambda kv: -sum(kv[1])):
                print(
                    f"FACT b={b} {label} kernel x{len(durs) // max(1, len(spans[label]))}: "
                    f"median {statistics.median(durs):.2f} us  {name}"
                )
        # the bench's own measure: synced host clock around one step, rounds interleaved
        host: dict[str, list[float]] = {"rawgraph": [], "torch": []}
        clock = time.perf_counter
        for _ in range(a.rounds):
            s.synchronize()
            t0 = clock()
            ours.step()
            s.synchronize()
            host["rawgraph"].append((clock() - t0) * 1e6)
            theirs.sync()
            t0 = clock()
            theirs.step()
            theirs.sync()
            host["torch"].append((clock() - t0) * 1e6)
        h_ours, h_torch = statistics.median(host["rawgraph"]), statistics.median(host["torch"])
        print(
            f"TIME b={b} synced step: rawgraph median={h_ours:.1f} us, torch median={h_torch:.1f} us, "
            f"ratio {h_ours / h_torch:.3f}"
        )
        g_ours, g_torch = statistics.median(gemm["rawgraph"]), statistics.median(gemm["torch"])
        print(
            f"FLOOR b={b}: ours GEMMs busy / torch synced step = {g_ours / h_torch:.3f}; cuBLAS's GEMMs busy / "
            f"torch synced step = {g_torch / h_torch:.3f}; ours synced - ours device span = "
            f"{h_ours - statistics.median(spans['rawgraph']):.1f} us (launch and sync)"
        )
        ours.close()
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
