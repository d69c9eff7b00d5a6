"""Fork/join benchmark: a TwoBranchBlock captured fork/join (two concurrent chains) against the
same launches captured linearly (one chain), eager, and PyTorch's graphs of the same two blocks
(one stream, and forked onto a side stream inside the capture), in one process.

Every path is checked before it is timed (rawgraph's graphs equal eager to the bit; torch within
1e-4). Clocks: CUDA-event device time around each replay (:func:`~rawgraph.runtime.timing.device_us`)
and synced host end-to-end time (:func:`~rawgraph.runtime.timing.synced_us`), in ``--rounds`` rounds
whose path order is shuffled every round; the samples of all rounds give median, p10 and p90.
Capture and instantiation happen once per configuration, never inside a timed replay.

    python -m rawgraph.bench.forkjoin --out DIR
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .provenance import environment

PATHS = ("eager", "linear", "forkjoin", "torch_linear", "torch_forkjoin")


def _torch(enabled: bool) -> Any:
    """torch, imported before any rawgraph GPU work: imported after it, torch has failed on a device
    machine (its ``parse_schema`` error, cause unknown; see ``benchmarks/NOTES.md``)."""
    if not enabled:
        return None
    try:
        torch = importlib.import_module("torch")
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(ref))


def _torch_paths(torch: Any, model: Any, xh: np.ndarray) -> tuple[dict[str, Callable[[], None]], Any, dict]:
    """PyTorch graphs of both branches: linear (one stream) and fork/join (branch b on a side
    stream inside the capture). Returns the replays, torch's stream, and per-path outputs."""
    from ..models.branches import split

    wa = [
        (torch.as_tensor(w1, device="cuda"), torch.as_tensor(w2, device="cuda")) for w1, w2 in model.a.weights_numpy()
    ]
    wb = [
        (torch.as_tensor(w1, device="cuda"), torch.as_tensor(w2, device="cuda")) for w1, w2 in model.b.weights_numpy()
    ]
    ha, hb = split(xh)
    xa, xb = torch.as_tensor(ha, device="cuda"), torch.as_tensor(hb, device="cuda")

    def block(x: Any, ws: list) -> Any:
        for w1, w2 in ws:
            x = torch.relu(x @ w1) @ w2 + x
        return x

    ts, side = torch.cuda.Stream(), torch.cuda.Stream()
    replays: dict[str, Callable[[], None]] = {}
    outs: dict[str, tuple[Any, Any]] = {}
    with torch.inference_mode(), torch.cuda.stream(ts):
        for _ in range(3):
            block(xa, wa), block(xb, wb)
        ts.synchronize()
        g_lin = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_lin, stream=ts):
            outs["torch_linear"] = (block(xa, wa), block(xb, wb))
        g_fj = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_fj, stream=ts):
            side.wait_stream(ts)
            ya = block(xa, wa)
            with torch.cuda.stream(side):
                yb = block(xb, wb)
            ts.wait_stream(side)
            outs["torch_forkjoin"] = (ya, yb)
        replays["torch_linear"], replays["torch_forkjoin"] = g_lin.replay, g_fj.replay
        keep = (g_lin, g_fj, xa, xb, wa, wb, side)
    return replays, (ts, keep), outs


def run_config(
    torch: Any, width: int, batch: int, layers: int, form: str, rounds: int, per_round: int, rng: np.random.Generator
) -> list[dict]:
    """Check and time every path at one size; one record per path."""
    from ..graphs.graph import GraphExec
    from ..models.branches import TwoBranchBlock, concat, split
    from ..runtime.memory import DeviceBuffer
    from ..runtime.stream import Stream
    from ..runtime.timing import device_us, stats, synced_us

    s = Stream()
    model = TwoBranchBlock(width, batch, layers, seed=int(rng.integers(1 << 30)), form=form)
    xh = rng.standard_normal((batch, width), dtype=np.float32)
    xa, xb = (DeviceBuffer.from_numpy(h, stream=s) for h in split(xh))
    ya, yb = DeviceBuffer((batch, model.half)), DeviceBuffer((batch, model.half))
    plans = model.plans(xa, xb, ya, yb)
    ref = model.reference(xh, s)

    def read() -> np.ndarray:
        return concat(ya.to_numpy(s), yb.to_numpy(s))

    ya.poison(s)
    yb.poison(s)
    model.forward(xa, xb, ya, yb, s)
    eager = read()
    err = _rel(eager, ref)
    if not err < 1e-4:
        raise AssertionError(f"eager differs from the float64 reference by {err:.2e}")
    meta: dict[str, dict] = {"eager": {"rel_err": err}}
    fns: dict[str, Callable[[], None]] = {"eager": lambda: model.forward(xa, xb, ya, yb, s)}
    execs: list[GraphExec] = []
    for name, fork in (("linear", False), ("forkjoin", True)):
        t0 = time.perf_counter()
        graph = model.capture(plans, s, fork=fork)
        cap_ms = (time.perf_counter() - t0) * 1e3
        graph.verify_edges()
        exe = graph.instantiate()
        exe.upload(s)
        execs.append(exe)
        ya.poison(s)
        yb.poison(s)
        exe.launch(s)
        if not np.array_equal(read(), eager):
            raise AssertionError(f"{name} replay differs from eager")
        meta[name] = {"capture_ms": cap_ms, "nodes": graph.node_count(), "edges": len(graph.edges())}
        fns[name] = (lambda e: lambda: e.launch(s))(exe)
    streams = {name: s for name in fns}
    keep: Any = None
    if torch is not None:
        replays, (ts, keep), outs = _torch_paths(torch, model, xh)
        rs = Stream.from_external(ts)  # rawgraph's clocks on torch's stream
        # CUDAGraph.replay() launches on torch's *current* stream: make that ts, or the clocks on
        # ts would time nothing (the first run of this benchmark did: 7 us at every size).
        prev_stream = torch.cuda.current_stream()
        torch.cuda.set_stream(ts)
        for name, replay in replays.items():
            replay()
            rs.synchronize()
            got = np.concatenate([o.cpu().numpy() for o in outs[name]], axis=1)
            terr = _rel(got, ref)
            if not terr < 1e-4:
                raise AssertionError(f"{name} differs from the float64 reference by {terr:.2e}")
            meta[name] = {"rel_err": terr}
            fns[name], streams[name] = replay, rs
    dev: dict[str, list[float]] = {n: [] for n in fns}
    sync: dict[str, list[float]] = {n: [] for n in fns}
    order = list(fns)
    for _ in range(rounds):
        rng.shuffle(order)  # no path always runs right after the same other one
        for name in order:
            dev[name] += device_us(fns[name], streams[name], rounds=per_round, warmup=3)
            sync[name] += synced_us(fns[name], streams[name], rounds=per_round, warmup=3)
    records = [
        {
            "width": width,
            "batch": batch,
            "layers": layers,
            "form": form,
            "path": n,
            "device_us": stats(dev[n]),
            "sync_us": stats(sync[n]),
            "samples": len(dev[n]),
            **meta.get(n, {}),
        }
        for n in fns
    ]
    if torch is not None:
        torch.cuda.set_stream(prev_stream)
    del keep
    for exe in execs:
        exe.close()
    model.close()
    s.close()
    return records


def report(records: list[dict]) -> str:
    """One line per size: device and synced medians (p10-p90) of each path, and fork/linear."""
    lines = []
    by: dict[tuple, dict[str, dict]] = {}
    for r in records:
        by.setdefault((r["form"], r["layers"], r["width"], r["batch"]), {})[r["path"]] = r
    for (form, layers, width, batch), paths in by.items():
        cells = []
        for name in PATHS:
            if name in paths:
                d, q = paths[name]["device_us"], paths[name]["sync_us"]
                cells.append(
                    f"{name} dev {d['median']:.2f} ({d['p10']:.2f}-{d['p90']:.2f}) "
                    f"sync {q['median']:.2f} ({q['p10']:.2f}-{q['p90']:.2f})"
                )
        ratio = ""
        if "linear" in paths and "forkjoin" in paths:
            ratio = (
                f" | forkjoin/linear dev {paths['forkjoin']['device_us']['median'] / paths['linear']['device_us']['median']:.3f}"
                f" sync {paths['forkjoin']['sync_us']['median'] / paths['linear']['sync_us']['median']:.3f}"
            )
        lines.append(f"{form} L{layers} w{width} b{batch}: " + "; ".join(cells) + ratio)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.forkjoin", description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, nargs="*", default=[256, 1024, 4096], help="full widths (two halves each)")
    p.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    p.add_argument("--layers", type=int, nargs="*", default=[1, 8])
    p.add_argument("--form", choices=("unfused", "fused", "block"), default="fused")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (path order shuffled each)")
    p.add_argument("--per-round", type=int, default=20, help="samples per clock per path per round")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="forkjoin")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; write ``<out>/<name>.json`` (with the commit measured) and print the table."""
    args = build_parser().parse_args(argv)
    torch = _torch(not args.no_torch)  # before rawgraph touches the GPU
    from .. import ops
    from ..runtime.device import get_device

    dev = get_device()
    rng = np.random.default_rng(args.seed)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    skipped: list[str] = []
    t0 = time.perf_counter()
    for layers in args.layers:
        for width in args.width:
            for batch in args.batch:
                if args.form == "block" and not ops.block_fits(width // 2, dev):
                    skipped.append(f"w{width}: block form needs half-width <= {ops.BLOCK_MAX_WIDTH}")
                    continue
                recs = run_config(torch, width, batch, layers, args.form, args.rounds, args.per_round, rng)
                records += recs
                print(report(recs), flush=True)
    result = {
        "benchmark": "forkjoin",
        "env": environment(torch=getattr(torch, "__version__", None)),
        "args": vars(args),
        "records": records,
        "skipped": skipped,
        "seconds": time.perf_counter() - t0,
    }
    path = out_dir / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path} ({len(records)} records, {result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
