"""Conditional nodes on the device: the WHILE depth loop against plain graphs, and the cost per node.

    python -m rawgraph.bench.control --out benchmarks/results [--rounds 200] [--max-depth 8]

Two parts, written to ``<out>/control.json`` (with :func:`~rawgraph.bench.provenance.environment`:
the commit measured) and printed as a table:

1. **Depth.** For width 128 and 1024, batch 1, fused form, depths 1..max: device time (CUDA
   events around each replay, after warm-up; median, p10, p90) of

   - ``plain``: a captured graph of exactly depth d (one exec per depth, instantiated beforehand);
   - ``while``: one :class:`~rawgraph.control.loops.DepthLoop` exec of max depth with d in device
     memory (written once before the timed replays);

   and the host cost of *changing* depth (wall clock, each followed by a replay and a sync):
   ``set_depth`` (a 4-byte copy into the depth word) for the WHILE exec; ``cuGraphInstantiate`` of
   the pre-captured depth-d graph for plain graphs; ``cuGraphExecUpdate`` of a max-depth exec from
   a depth-d graph is refused by the driver for d < max (the topology differs): its result is
   recorded, not timed. Capture and instantiation never fall inside the per-replay figures.
2. **Node cost.** Device time of small graphs of no-op kernels: 1 kernel, 2 kernels,
   ``set_cond + IF{noop}`` with the condition 0 (body skipped) and 1 (body runs), and
   ``memcpy + set_cond + WHILE{countdown}`` for 1, 16 and 64 iterations; the IF cost is the
   difference against the kernel-only graphs, the WHILE iteration cost the slope.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..control.loops import DepthLoop
from ..graphs import conditional as cn
from ..graphs.builder import GraphBuilder
from ..graphs.capture import capture_plan
from ..models.tinyblock import BlockWeights, TinyBlock
from ..runtime.device import get_device
from ..runtime.errors import GraphUpdateError
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import Stream
from ..runtime.timing import device_us, stats
from .provenance import environment


def _wall_us(fn: Callable[[], Any], stream: Stream, rounds: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
        stream.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def depth_part(width: int, max_depth: int, rounds: int, form: str, s: Stream) -> list[dict]:
    batch = 1
    weights = BlockWeights(width, max_depth, seed=1234)
    rng = np.random.default_rng(width)
    x = DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32), stream=s)
    out = DeviceBuffer((batch, width))
    layered = TinyBlock(width, batch, form=form, weights=weights)
    loop = DepthLoop(layered, x, out, stream=s)
    rows = []
    top = TinyBlock(width, batch, max_depth, seed=1234, form=form)
    top_graph = capture_plan(top.plan(x, out), s)
    top_exec = top_graph.instantiate()
    for d in range(1, max_depth + 1):
        plain = TinyBlock(width, batch, d, seed=1234, form=form)
        graph = capture_plan(plain.plan(x, out), s)
        exe = graph.instantiate()
        t_plain = device_us(functools.partial(exe.launch, s), s, rounds=rounds, warmup=20)
        plain_bits = out.to_numpy(s)
        loop.set_depth(d, s)
        t_while = device_us(lambda: loop.launch(s), s, rounds=rounds, warmup=20)
        same = bool(np.array_equal(out.to_numpy(s), plain_bits))

        def switch_while(d: int = d) -> None:
            loop.set_depth(d, s)
            loop.launch(s)

        def reinstantiate(graph: Any = graph) -> None:
            e = graph.instantiate()
            e.launch(s)
            s.synchronize()
            e.close()

        h_while = _wall_us(switch_while, s, max(5, rounds // 10))
        h_inst = _wall_us(reinstantiate, s, max(5, rounds // 10))
        try:
            top_exec.update(graph)
            update = "accepted"
        except GraphUpdateError as exc:
            update = exc.result
        rows.append(
            {
                "width": width,
                "batch": batch,
                "depth": d,
                "form": form,
                "bit_equal": same,
                "plain_us": stats(t_plain),
                "while_us": stats(t_while),
                "switch_host_us": {"while_set_depth": stats(h_while), "reinstantiate": stats(h_inst)},
                "exec_update_from_depth_graph": update,
            }
        )
        exe.close()
        graph.close()
    loop.close()
    return rows


def node_cost_part(rounds: int, s: Stream) -> dict:
    dev = get_device()
    value = DeviceBuffer(1, np.uint32)
    seed = DeviceBuffer(1, np.uint32)
    remaining = DeviceBuffer(1, np.uint32)

    def kernels(n: int):
        g = GraphBuilder(dev)
        prev = None
        for _ in range(n):
            prev = g.kernel(cn.noop(dev), deps=prev if prev is not None else ())
        return g.instantiate()

    def if_graph():
        g = GraphBuilder(dev)
        h = cn.make_handle(g)
        k = g.kernel(cn.set_condition(dev, h, value))
        node = cn.add_conditional(g, "if", h, deps=k)
        node.bodies[0].kernel(cn.noop(dev))
        return g.instantiate()

    def while_graph():
        g = GraphBuilder(dev)
        h = cn.make_handle(g)
        c = g.memcpy(remaining, seed, 4)
        k = g.kernel(cn.set_condition(dev, h, remaining), deps=c)
        node = cn.add_conditional(g, "while", h, deps=k)
        node.bodies[0].kernel(cn.countdown(dev, h, remaining))
        return g.instantiate()

    def timed(exe) -> dict:
        return stats(device_us(lambda: exe.launch(s), s, rounds=rounds, warmup=20))

    res: dict[str, Any] = {"one_kernel": timed(kernels(1)), "two_kernels": timed(kernels(2))}
    ife = if_graph()
    for v in (0, 1):
        value.copy_from_host(np.array([v], np.uint32), s)
        res[f"if_cond{v}"] = timed(ife)
    we = while_graph()
    for n in (1, 16, 64):
        seed.copy_from_host(np.array([n], np.uint32), s)
        res[f"while_x{n}"] = timed(we)
    res["cost_if_not_taken_us"] = res["if_cond0"]["median"] - res["one_kernel"]["median"]
    res["cost_if_taken_with_noop_body_us"] = res["if_cond1"]["median"] - res["two_kernels"]["median"]
    res["cost_while_iteration_us"] = (res["while_x64"]["median"] - res["while_x1"]["median"]) / 63
    return res


def report(result: dict) -> str:
    lines = [
        "depth  width   plain us (p10-p90)      while us (p10-p90)      set_depth us  reinstantiate us  bits  update"
    ]
    for r in result["depth"]:
        p, w, sw = r["plain_us"], r["while_us"], r["switch_host_us"]
        lines.append(
            f"{r['depth']:5d} {r['width']:6d}  {p['median']:8.2f} ({p['p10']:.2f}-{p['p90']:.2f})"
            f"  {w['median']:8.2f} ({w['p10']:.2f}-{w['p90']:.2f})"
            f"  {sw['while_set_depth']['median']:12.1f}  {sw['reinstantiate']['median']:16.1f}"
            f"  {'same' if r['bit_equal'] else 'DIFF'}  {r['exec_update_from_depth_graph']}"
        )
    c = result["node_cost"]
    lines.append("")
    for k in ("one_kernel", "two_kernels", "if_cond0", "if_cond1", "while_x1", "while_x16", "while_x64"):
        s = c[k]
        lines.append(f"{k:12s} {s['median']:8.3f} us (p10 {s['p10']:.3f}, p90 {s['p90']:.3f})")
    lines.append(
        f"IF not taken: {c['cost_if_not_taken_us']:.3f} us; IF taken + noop body: "
        f"{c['cost_if_taken_with_noop_body_us']:.3f} us; WHILE iteration: {c['cost_while_iteration_us']:.3f} us"
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.control", description=__doc__.split("\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=[128, 1024])
    p.add_argument("--max-depth", type=int, default=8)
    p.add_argument("--form", choices=("unfused", "fused", "block"), default="fused")
    p.add_argument("--rounds", type=int, default=200, help="timed replays per figure")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="control")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    get_device()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    s = Stream()
    version = int(driver.cuDriverGetVersion()[1])
    rows = []
    for w in args.widths:
        rows += depth_part(w, args.max_depth, args.rounds, args.form, s)
    result = {
        "env": environment(driver_version_int=version),
        "config": {
            "widths": args.widths,
            "max_depth": args.max_depth,
            "form": args.form,
            "rounds": args.rounds,
            "batch": 1,
        },
        "depth": rows,
        "node_cost": node_cost_part(args.rounds, s),
        "wall_s": time.perf_counter() - t0,
    }
    path = out_dir / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1))
    print(report(result))
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
