"""Soak: long runs that must show no wrong output, no growth and no failed capture.

1. ``replays``: 1,000,000 replays of one exec, each with its input and output re-bound at random
   among 9 inputs (DeviceBuffer, CuPy, torch) and 4 outputs (two DeviceBuffers, CuPy, torch),
   the output poisoned before and checked after every replay, on the device and in stream order
   (``count_mismatch`` against that input's expected output, bit for bit). The expected outputs
   (eager runs of the same kernels) and each output's last replay are checked against float64
   NumPy, and the mismatch counter is first seen to count a known number of changed elements.
2. ``cycles``: 10,000 capture / instantiate / launch / destroy cycles; device memory
   (``cuMemGetInfo``) and resident set size before and after.
3. ``threads``: 8 threads capturing in thread-local mode at once, over and over, while 2 other
   threads allocate and free; every captured graph replayed and checked.

Writes ``soak.json`` (with the commit measured) into ``--out``; exit status 1 on any mismatch,
growth over the limits or error.

    PYTHONPATH=. python3 benchmarks/soak.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
from cuda.bindings import driver

# torch before CuPy: the order the interop tests use too.
try:
    import torch
except Exception as exc:  # reported in the JSON
    torch, TORCH_ERROR = None, f"{type(exc).__name__}: {exc}"
else:
    TORCH_ERROR = None
import cupy as cp

from rawgraph import (
    CaptureMode,
    DeviceBuffer,
    ExecUpdateManager,
    Stream,
    TinyBlock,
    as_device_array,
    capture_plan,
    get_device,
    ops,
)
from rawgraph.bench.provenance import environment
from rawgraph.graphs.capture import Capture
from rawgraph.models.tinyblock import reference_forward


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


FLOAT64_TOL = 1e-5


def rel_err64(got: np.ndarray, ref: np.ndarray) -> float:
    """Relative error against a float64 reference (inf for a non-finite output)."""
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def host_copy(array, s: Stream) -> np.ndarray:
    """A host copy of a DeviceBuffer, CuPy array or torch tensor written by work on ``s``."""
    if isinstance(array, DeviceBuffer):
        return array.to_numpy(s)
    s.synchronize()
    if isinstance(array, cp.ndarray):
        return cp.asnumpy(array)
    return array.detach().cpu().numpy()


def checker_counts(dev, s: Stream, rng: np.random.Generator, expected: DeviceBuffer) -> dict:
    """The replays' verdict rests on ``count_mismatch``: before relying on it, make it compare a copy
    of ``expected`` with a random subset of its elements changed by one bit, and require exactly that
    many (a counter that counts every element, or none, fails here)."""
    good = expected.to_numpy(s)
    bits = good.view(np.uint32).copy()
    changed = rng.choice(bits.size, size=int(rng.integers(1, bits.size // 2)), replace=False)
    flat = bits.reshape(-1)
    flat[changed] ^= np.uint32(1) << rng.integers(0, 23, size=changed.size).astype(np.uint32)
    probe = DeviceBuffer.from_numpy(bits.view(np.float32), stream=s)
    count = DeviceBuffer.from_numpy(np.zeros(1, np.uint64), stream=s)
    ops.count_mismatch(dev, {"a": probe.view(), "b": expected.view(), "count": count.view()}, "a", "b", "count")(s)
    ops.count_mismatch(dev, {"a": expected.view(), "b": expected.view(), "count": count.view()}, "a", "b", "count")(s)
    counted = int(count.to_numpy(s)[0])
    probe.close()
    count.close()
    return {"counted": counted, "expected": int(changed.size)}


def replays(steps: int, seed: int) -> dict:
    dev = get_device()
    s = Stream()
    rng = np.random.default_rng(seed)
    width, batch = 64, 2
    model = TinyBlock(width, batch, 2, seed=seed & 0xFFFF, form="fused")
    shape = (batch, width)
    hosts = [rng.standard_normal(shape, dtype=np.float32) for _ in range(9)]
    xs: list = [DeviceBuffer.from_numpy(h, stream=s) for h in hosts[:3]]
    xs += [cp.asarray(h) for h in hosts[3:6]]
    kinds_in = ["DeviceBuffer"] * 3 + ["cupy"] * 3
    if torch is not None and torch.cuda.is_available():
        xs += [torch.from_numpy(h).cuda() for h in hosts[6:]]
        kinds_in += ["torch"] * 3
    else:
        xs += [DeviceBuffer.from_numpy(h, stream=s) for h in hosts[6:]]
        kinds_in += ["DeviceBuffer (torch unavailable)"] * 3
    outs: list = [DeviceBuffer(shape), DeviceBuffer(shape), cp.empty(shape, cp.float32)]
    kinds_out = ["DeviceBuffer", "DeviceBuffer", "cupy"]
    if torch is not None and torch.cuda.is_available():
        outs.append(torch.empty(shape, device="cuda"))
        kinds_out.append("torch")
    else:
        outs.append(DeviceBuffer(shape))
        kinds_out.append("DeviceBuffer (torch unavailable)")
    cp.cuda.Device().synchronize()
    if torch is not None:
        torch.cuda.synchronize()
    # expected outputs from eager runs of the same kernels, each checked against float64 NumPy
    # (a kernel wrong in eager and replay alike would otherwise give zero mismatches)
    weights = model.weights_numpy(s)
    refs = [reference_forward(h, weights) for h in hosts]
    expected = []
    for h in hosts:
        e = DeviceBuffer(shape)
        e.poison(s)
        model.forward(DeviceBuffer.from_numpy(h, stream=s), e, s)
        expected.append(e)
    s.synchronize()
    eager_err = max(rel_err64(e.to_numpy(s), r) for e, r in zip(expected, refs))
    checker = checker_counts(dev, s, rng, expected[0])
    count = DeviceBuffer.from_numpy(np.zeros(1, np.uint64), stream=s)
    graph = capture_plan(model.plan(DeviceBuffer(shape), DeviceBuffer(shape)), s)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    # one checker launch per (output, input) pair, and the poison fill per output
    compare = {}
    for j, o in enumerate(outs):
        for i, e in enumerate(expected):
            views = {"out": as_device_array(o), "exp": e.view(), "count": count.view()}
            compare[(j, i)] = ops.count_mismatch(dev, views, "out", "exp", "count")
    out_ptrs = [as_device_array(o).ptr for o in outs]
    memset = driver.cuMemsetD32Async
    n_elems = batch * width
    ins = rng.integers(0, len(xs), size=steps)
    ots = rng.integers(0, len(outs), size=steps)
    t0 = time.perf_counter()
    for k in range(steps):
        i, j = int(ins[k]), int(ots[k])
        memset(out_ptrs[j], 0x7FC0DEAD, n_elems, s.handle)
        mgr.bind_many({"x": xs[i], "out": outs[j]})
        mgr.launch(s)
        compare[(j, i)](s)
        if k % 20000 == 19999:
            s.synchronize()
            mgr.collect()
    s.synchronize()
    wall = time.perf_counter() - t0
    mismatches = int(count.to_numpy(s)[0])
    # and each output's last replay, read back, against float64 NumPy of the input it was given
    last_in = {int(j): int(i) for i, j in zip(ins, ots)}
    replay_err = max(rel_err64(host_copy(outs[j], s), refs[i]) for j, i in last_in.items())
    mgr.close()
    return {
        "steps": steps,
        "inputs": kinds_in,
        "outputs": kinds_out,
        "mismatched_elements": mismatches,
        "eager_vs_float64": eager_err,
        "replays_vs_float64": replay_err,
        "float64_tol": FLOAT64_TOL,
        "checker": checker,
        "driver_updates": mgr.update_calls,
        "wall_s": wall,
        "us_per_step": wall / steps * 1e6,
        "seed": seed,
    }


def replays_ok(r: dict) -> bool:
    """The replays verdict: no mismatched element, eager and the last replays within the float64
    tolerance, and a mismatch counter seen to count exactly."""
    return (
        r.get("mismatched_elements") == 0
        and r.get("eager_vs_float64", 1.0) < FLOAT64_TOL
        and r.get("replays_vs_float64", 1.0) < FLOAT64_TOL
        and bool(r.get("checker"))
        and r["checker"]["counted"] == r["checker"]["expected"]
    )


def cycles(n: int) -> dict:
    dev = get_device()
    s = Stream()
    model = TinyBlock(64, 2, 2, form="fused")
    x, out = DeviceBuffer((2, 64)), DeviceBuffer((2, 64))
    x.poison(s)
    plan = model.plan(x, out)

    def one():
        g = capture_plan(plan, s, warmup=False)
        e = g.instantiate()
        e.launch(s)
        e.close()
        g.close()

    for _ in range(200):  # warm: the driver's own pools reach their working size
        one()
    s.synchronize()
    free0, _total = dev.memory_info()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    for _ in range(n):
        one()
    s.synchronize()
    wall = time.perf_counter() - t0
    free1, _ = dev.memory_info()
    rss1 = rss_bytes()
    return {
        "cycles": n,
        "device_growth_bytes": free0 - free1,
        "rss_growth_bytes": rss1 - rss0,
        "ms_per_cycle": wall / n * 1e3,
    }


def threads(n_capture: int, rounds: int, seed: int) -> dict:
    models = [TinyBlock(64, 2, 2, seed=seed + i, form="fused") for i in range(n_capture)]
    stop = threading.Event()
    errors: list[str] = []
    mismatches = [0]
    allocations = [0]
    lock = threading.Lock()

    def capture_loop(i: int) -> None:
        try:
            s = Stream()
            rng = np.random.default_rng(seed * 31 + i)
            xh = rng.standard_normal((2, 64), dtype=np.float32)
            x, out = DeviceBuffer.from_numpy(xh, stream=s), DeviceBuffer((2, 64))
            ref = DeviceBuffer((2, 64))
            ref.poison(s)
            models[i].forward(x, ref, s)
            want = ref.to_numpy(s)
            err = rel_err64(want, models[i].reference(xh, s))
            if not err < FLOAT64_TOL:  # the bits every replay must equal are checked in float64 first
                raise AssertionError(f"eager result off the float64 reference by {err:.2e}")
            plan = models[i].plan(x, out)
            for _ in range(rounds):
                with Capture(s, CaptureMode.THREAD_LOCAL) as cap:
                    cap.run(plan)
                exe = cap.graph.instantiate()
                out.poison(s)
                exe.launch(s)
                got = out.to_numpy(s)
                exe.close()
                cap.graph.close()
                if not np.array_equal(got, want):
                    with lock:
                        mismatches[0] += 1
        except Exception as exc:
            with lock:
                errors.append(f"capture thread {i}: {type(exc).__name__}: {exc}")

    def alloc_loop() -> None:
        try:
            get_device()
            while not stop.is_set():
                b = DeviceBuffer(1 << 20)
                b.close()
                with lock:
                    allocations[0] += 1
        except Exception as exc:
            with lock:
                errors.append(f"allocating thread: {type(exc).__name__}: {exc}")

    allocators = [threading.Thread(target=alloc_loop) for _ in range(2)]
    capturers = [threading.Thread(target=capture_loop, args=(i,)) for i in range(n_capture)]
    t0 = time.perf_counter()
    for t in allocators + capturers:
        t.start()
    for t in capturers:
        t.join()
    stop.set()
    for t in allocators:
        t.join()
    return {
        "capture_threads": n_capture,
        "captures_per_thread": rounds,
        "allocating_threads": 2,
        "allocations": allocations[0],
        "mismatched_replays": mismatches[0],
        "errors": errors,
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--replays", type=int, default=1_000_000)
    p.add_argument("--cycles", type=int, default=10_000)
    p.add_argument("--thread-rounds", type=int, default=200)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % (1 << 31))
    result: dict = {"env": environment(), "seed": seed, "torch_import_error": TORCH_ERROR}
    for name, fn in (
        ("replays", lambda: replays(args.replays, seed)),
        ("cycles", lambda: cycles(args.cycles)),
        ("threads", lambda: threads(8, args.thread_rounds, seed)),
    ):
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {json.dumps(result[name])} ({time.perf_counter() - t0:.0f} s)", flush=True)
    r, c, t = result["replays"], result["cycles"], result["threads"]
    ok = (
        replays_ok(r)
        and c.get("device_growth_bytes") == 0
        and c.get("rss_growth_bytes", 1 << 40) < 10 << 20
        and t.get("mismatched_replays") == 0
        and not t.get("errors")
    )
    result["passed"] = bool(ok)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    print(f"soak: {'PASSED' if ok else 'FAILED'} (seed {seed}); json: {out / 'soak.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
