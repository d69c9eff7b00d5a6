"""The graph doctor's cost: ``check`` per node, ``verify`` per verified replay, and a replay with
verification off (``watch(exe, every=0)`` is the exec itself) against a plain replay.

Graphs: TinyBlock plans captured with rawgraph (``--layers`` sets the node count), and, unless
``--no-torch``, a PyTorch MLP adopted with ``from_torch``. Writes ``<out>/<name>.json`` with the
commit measured (:func:`rawgraph.bench.provenance.environment`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .provenance import environment


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _replay_cost(launch: Callable[[], Any], sync: Callable[[], Any], n: int, rounds: int) -> float:
    """Median seconds per replay: ``n`` launches then one sync, ``rounds`` times."""

    def block() -> None:
        for _ in range(n):
            launch()
        sync()

    block()
    return _median_seconds(block, rounds) / n


def run_tinyblock(width: int, batch: int, layers: int, repeats: int) -> dict[str, Any]:
    from ..doctor import check, verify, watch
    from ..graphs.capture import capture_plan
    from ..models.tinyblock import TinyBlock
    from ..runtime.memory import DeviceBuffer
    from ..runtime.stream import Stream

    with (
        Stream() as s,
        TinyBlock(width, batch, layers) as model,
        DeviceBuffer((batch, width)) as x,
        DeviceBuffer((batch, width)) as out,
    ):
        x.poison(s)
        g = capture_plan(model.plan(x, out), s)
        exe = g.instantiate()
        nodes = g.node_count()
        report = check(g)
        t_check = _median_seconds(lambda: check(g), repeats)
        t_verify = _median_seconds(lambda: verify(exe, s, locate=False), max(3, repeats // 4))
        off = watch(exe, every=0)
        plain = _replay_cost(lambda: exe.launch(s), s.synchronize, 50, repeats)
        watched = _replay_cost(lambda: off.launch(s), s.synchronize, 50, repeats)
        exe.close()
        g.close()
    return {
        "graph": "tinyblock",
        "width": width,
        "batch": batch,
        "layers": layers,
        "nodes": nodes,
        "findings": len(report.findings),
        "check_s": t_check,
        "check_per_node_us": t_check / nodes * 1e6,
        "verify_s": t_verify,
        "replay_s": plain,
        "replay_verify_off_s": watched,
    }


def run_torch(repeats: int) -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from ..doctor import check
    from ..updates.adopt import from_torch

    mlp = (
        torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256)
        )
        .cuda()
        .eval()
    )
    x = torch.randn(16, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        mlp(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g), torch.no_grad():
        out = mlp(x)
    a = from_torch(g)
    nodes = a.node_count()
    report = check(a, inputs=[x])
    t_check = _median_seconds(lambda: check(a, inputs=[x]), repeats)
    a.close()
    del out
    return {
        "graph": "torch-mlp",
        "nodes": nodes,
        "findings": len(report.findings),
        "check_s": t_check,
        "check_per_node_us": t_check / nodes * 1e6,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.doctor", description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--layers", type=int, nargs="*", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="doctor")
    return p


def main(argv: list[str] | None = None) -> int:
    """Measure; write ``<out>/<name>.json`` and print one line per graph."""
    args = build_parser().parse_args(argv)
    if not args.no_torch:
        try:
            import torch  # noqa: F401 - before rawgraph touches the GPU (see tests/conftest.py)
        except ImportError:
            pass
    records = []
    for layers in args.layers:
        rec = run_tinyblock(args.width, args.batch, layers, args.repeats)
        records.append(rec)
        print(
            f"tinyblock layers={layers}: {rec['nodes']} nodes, check {rec['check_s'] * 1e3:.2f} ms "
            f"({rec['check_per_node_us']:.1f} us/node), verify {rec['verify_s'] * 1e3:.2f} ms, replay "
            f"{rec['replay_s'] * 1e6:.1f} us, with verify off {rec['replay_verify_off_s'] * 1e6:.1f} us",
            flush=True,
        )
    if not args.no_torch:
        rec_t = run_torch(args.repeats)
        if rec_t is not None:
            records.append(rec_t)
            print(
                f"torch mlp: {rec_t['nodes']} nodes, check {rec_t['check_s'] * 1e3:.2f} ms "
                f"({rec_t['check_per_node_us']:.1f} us/node), {rec_t['findings']} findings",
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.json"
    path.write_text(
        json.dumps({"benchmark": "doctor", "env": environment(), "args": vars(args), "records": records}, indent=1)
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
