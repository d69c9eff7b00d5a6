"""Device graph launch latency: a kernel launching a graph of n nodes against ``cuGraphLaunch`` from the host.

    python -m rawgraph.bench.device_launch --out DIR [--sizes 1,2,4,8,16,32,64] [--rounds 200]

For each n the target is a chain of n one-thread ``rg_bump`` kernels (``kernels/device_launch.cu``),
captured once and instantiated twice: plain, and for device launch (:class:`DeviceGraph`). Rows:

- ``host_plain``: ``cuGraphLaunch`` of the plain exec from the host;
- ``host_devexec``: ``cuGraphLaunch`` of the device-launch exec from the host;
- ``launcher_only``: a one-node host graph whose kernel launches nothing (the floor under the
  device-launch rows);
- ``tail``, ``fire_and_forget``, ``sibling``: that one-node graph launching the target from the
  device in each mode.

Two clocks, never mixed: device time between CUDA events recorded around each host launch
(:func:`~rawgraph.runtime.timing.device_us`), and end-to-end host time of launch + ``cuStreamSynchronize``
(:func:`~rawgraph.runtime.timing.synced_us`); warm-up rounds first, then medians with p10/p90. Every row
also checks that the target ran once per launch (its counter), so a launch that silently did
nothing cannot pass as fast. The JSON records the commit (:mod:`rawgraph.bench.provenance`).

Also (``rng`` in the JSON, ``--no-rng`` to skip): what graph-safe dropout adds to a replay of the
unfused TinyBlock (width 1024, batch 8, 4 layers: one ``philox_dropout`` node per layer and one
``philox_advance`` node), and a replay drawing 2^20 uniforms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..control.device_launch import DeviceGraph, launcher_graph
from ..control.rng import PhiloxGenerator, noisy_plan
from ..graphs.capture import capture_plan
from ..models.tinyblock import TinyBlock
from ..runtime.device import get_device
from ..runtime.launch import ArgUse, KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceBuffer
from ..runtime.module import get_kernel
from ..runtime.stream import Stream
from ..runtime.timing import device_us, stats, synced_us
from .provenance import environment

SIZES = (1, 2, 4, 8, 16, 32, 64)
ROWS = ("host_plain", "host_devexec", "launcher_only", "tail", "fire_and_forget", "sibling")


def bump_chain(counter: DeviceBuffer, n: int) -> LaunchPlan:
    """n one-thread kernels in stream order, each adding 1 to ``counter``."""
    kernel = get_kernel("device_launch", "rg_bump", counter.device)
    launches = []
    for i in range(n):
        args = KernelArgs([("counter", "ptr")])
        args["counter"] = counter.ptr
        launches.append(
            Launch(kernel, (1, 1, 1), (1, 1, 1), args, {"counter": ArgUse("counter", "write")}, 0, f"bump{i}")
        )
    return LaunchPlan(launches, {"counter": counter.view()}, (), ("counter",), [counter._finalizer], pdl=False)


def _launcher_of(exe: Any, stream: Stream) -> Callable[[], None]:
    return lambda: exe.launch(stream)


def measure(n: int, rounds: int, warmup: int, stream: Stream, counter: DeviceBuffer) -> dict[str, Any]:
    """Every row for a target of ``n`` nodes: both clocks and the ran-every-time check."""
    plan = bump_chain(counter, n)
    graph = capture_plan(plan, stream)
    owned: list[Any] = [graph]
    try:
        plain = graph.instantiate()
        target = DeviceGraph(graph, stream)
        owned += [plain, target]
        execs: dict[str, tuple[Callable[[], None], int]] = {
            "host_plain": (lambda: plain.launch(stream), n),
            "host_devexec": (lambda: target.launch(stream), n),
        }
        for row, mode in (
            ("launcher_only", None),
            ("tail", "tail"),
            ("fire_and_forget", "fire_and_forget"),
            ("sibling", "sibling"),
        ):
            outer = launcher_graph(target, stream, mode)
            exe = outer.instantiate()
            owned += [outer, exe]
            execs[row] = (_launcher_of(exe, stream), 0 if mode is None else n)
        out: dict[str, Any] = {"n": n}
        zero = np.zeros(1, np.uint32)
        for row, (fn, per_launch) in execs.items():
            counter.copy_from_host(zero, stream)
            dev = device_us(fn, stream, rounds=rounds, warmup=warmup)
            host = synced_us(fn, stream, rounds=rounds, warmup=warmup)
            got = int(counter.to_numpy(stream)[0])
            want = 2 * (rounds + warmup) * per_launch
            out[row] = {
                "device_us": stats(dev),
                "host_synced_us": stats(host),
                "ran_every_time": got == want,
                "counter": got,
                "expected": want,
            }
        return out
    finally:
        for obj in reversed(owned):
            obj.close()


def rng_costs(
    stream: Stream, rounds: int, warmup: int, width: int = 1024, batch: int = 8, layers: int = 4
) -> dict[str, Any]:
    """What graph-safe dropout costs a replay: the unfused TinyBlock's graph against the same
    graph with a ``philox_dropout`` node per layer and the ``philox_advance`` node (device events
    and host launch+sync), and one replay drawing 2^20 uniforms."""
    model = TinyBlock(width, batch, layers, seed=1, form="unfused")
    x, out = DeviceBuffer((batch, width)), DeviceBuffer((batch, width))
    draws = DeviceBuffer((1 << 20,), np.float32)
    gen = PhiloxGenerator(7, stream)
    owned: list[Any] = [model, x, out, draws, gen]
    try:
        x.copy_from_host(np.linspace(-1.0, 1.0, batch * width, dtype=np.float32).reshape(batch, width), stream)
        rows: dict[str, Any] = {
            "config": {
                "width": width,
                "batch": batch,
                "layers": layers,
                "p": 0.1,
                "pdl": model.pdl,
                "uniforms": draws.size,
            }
        }
        for name, plan in (
            ("plain", model.plan(x, out)),
            ("dropout", noisy_plan(model, x, out, gen, p=0.1)),
            ("draw_2^20_uniforms", gen.draw_plan(draws, kind="uniform")),
        ):
            graph = capture_plan(plan, stream)
            exe = graph.instantiate()
            owned += [graph, exe]
            fn = _launcher_of(exe, stream)
            rows[name] = {
                "device_us": stats(device_us(fn, stream, rounds=rounds, warmup=warmup)),
                "host_synced_us": stats(synced_us(fn, stream, rounds=rounds, warmup=warmup)),
                "nodes": graph.node_count(),
            }
        return rows
    finally:
        for obj in reversed(owned):
            obj.close()


def table(records: list[dict[str, Any]]) -> str:
    lines = [
        "device graph launch, median us (device events | host launch+sync); n = target nodes",
        "n     " + "".join(f"{r:>24}" for r in ROWS),
    ]
    for rec in records:
        cells = []
        for r in ROWS:
            row = rec[r]
            mark = "" if row["ran_every_time"] else "!"
            cells.append(f"{row['device_us']['median']:9.2f} | {row['host_synced_us']['median']:9.2f}{mark:1}")
        lines.append(f"{rec['n']:<6}" + "".join(f"{c:>24}" for c in cells))
    lines.append("'!': the target did not run once per launch (see the JSON's counter/expected)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.device_launch", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="target graph sizes (kernel nodes)")
    p.add_argument("--rounds", type=int, default=200, help="timed launches per row and clock")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="device_launch")
    p.add_argument("--no-rng", action="store_true", help="skip the graph-safe dropout cost rows")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise SystemExit("--sizes needs positive integers")
    get_device()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with Stream() as stream, DeviceBuffer((1,), np.uint32) as counter:
        records = [measure(n, args.rounds, args.warmup, stream, counter) for n in sizes]
        rng = None if args.no_rng else rng_costs(stream, args.rounds, args.warmup)
    ok = all(rec[r]["ran_every_time"] for rec in records for r in ROWS)
    result = {
        "env": environment(),
        "config": {"sizes": sizes, "rounds": args.rounds, "warmup": args.warmup, "target": "chain of rg_bump kernels"},
        "records": records,
        "all_ran_every_time": ok,
        "rng": rng,
        "wall_s": time.perf_counter() - t0,
    }
    path = out_dir / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1))
    print(table(records))
    if rng is not None:
        for name in ("plain", "dropout", "draw_2^20_uniforms"):
            r = rng[name]
            print(
                f"rng {name:>20} ({r['nodes']:2d} nodes): device {r['device_us']['median']:8.2f} us, "
                f"host launch+sync {r['host_synced_us']['median']:8.2f} us"
            )
    print(f"json: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
