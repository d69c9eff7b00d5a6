"""Continuous-batching benchmark: requests join and leave between steps; every step advances all
live requests through slots and an index table.

    rawgraph bench slots [--steps 10000] [--width 1024] [--layers 8] [--max-slots 256]

One decode-like trace (Poisson arrivals, geometric lengths, at most ``max_slots`` live) drives,
step by step in one process, each strategy's own pool (the strategies take turns within every
step, in a fresh random order, so drift hits all alike):

- ``graph_table``: :class:`~rawgraph.serving.SlotPool` with ``table="graph"``: the bucket graph
  copies the index table from pinned memory itself and its matmuls gather and scatter the rows
  (``gather="fused"``); a step is one ``cuGraphLaunch``;
- ``graph_table_kernels``: the same table, rows moved by separate gather and scatter kernels;
- ``copy_table``: ``table="copy"``: one ``cuMemcpyHtoDAsync`` of the table (when it changed),
  then the replay (fused gather);
- ``setparams``: ``table="params"``: the table is a by-value parameter of the gather and scatter
  kernels, pushed with ``cuGraphExecKernelNodeSetParams`` after a join or leave;
- ``device_shaped``: ``shape="device"``: one exec of ``max_slots`` rows whose grids and row counts
  a head kernel sets on the device to the live rows each step (gather kernels, copied table);
- ``device_bands``: the same with ``bands="plans"``: one plan per band of live counts, so each step
  runs the exact-size plan's kernels;
- ``switch_bands``: the same bands picked by a SWITCH node (``select="switch"``): each step runs its
  band's plan as captured, at the band top's rows;
- ``switch_sizes``: a SWITCH over the bucket sizes: the buckets' plans in one exec, picked on the
  device;
- ``torch_vllm``: PyTorch done the vLLM way: a persistent state tensor, bucket graphs captured
  with ``index_select`` / ``index_copy_`` over a static index tensor, and per step a ``copy_`` of
  the indices from pinned memory, then ``replay()``.

Per step: the synced latency (host clock from the call to the end of the step's work) and the
host time of the call alone; ``bare_launch`` is the host time of the same bucket's
``cuGraphLaunch`` called directly, interleaved. Joins and leaves happen between steps, outside
the step's figures; their own host time per step is reported beside them (``join_host_us``,
``leave_host_us``): rows join from the host (``--rows``), rawgraph's pools leave with
``leave(slot, wait=False)`` (the row is taken at the end), torch's with a ``.cpu()``. At the end,
the final rows of finished requests are compared: the rawgraph pools bit-equal, torch's relative
error over rows that are still finite (the block has no normalisation, so a row that lives for
dozens of steps overflows to inf/NaN at w1024 L8; timing does not depend on the values).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..models.tinyblock import TinyBlock
from ..runtime.memory import DeviceArray, DeviceBuffer
from ..runtime.stream import Stream
from ..runtime.timing import stats
from ..serving import SlotPool
from ..serving.sizes import pick_bucket, vllm_sizes
from . import command
from .provenance import environment

STRATEGIES = ("graph_table", "graph_table_kernels", "copy_table", "setparams", "torch_vllm")
POOL_OPTIONS = {
    "graph_table": {"table": "graph", "gather": "fused"},
    "graph_table_kernels": {"table": "graph", "gather": "kernels"},
    "copy_table": {"table": "copy", "gather": "fused"},
    "setparams": {"table": "params", "gather": "kernels"},
    # one exec shaped to the live rows on the device: no buckets, no padding
    "device_shaped": {"shape": "device"},
    # the same with one plan per band of live counts (each runs the exact-size kernels)
    "device_bands": {"shape": "device", "bands": "plans"},
    # a SWITCH node runs the band's plan as captured (padding rows to the band top)
    "switch_bands": {"shape": "device", "bands": "plans", "select": "switch"},
    # the same SWITCH over the bucket sizes ("sizes": the pools' list)
    "switch_sizes": {"shape": "device", "bands": "sizes", "select": "switch"},
}
RAWGRAPH = tuple(POOL_OPTIONS)


def join_leave_trace(
    steps: int, max_slots: int, rate: float, mean_len: float, seed: int
) -> list[tuple[int, list[int]]]:
    """Per step: (how many requests join before it, which request ids leave after it).

    Requests are numbered in joining order; each lives a geometric number of steps (mean
    ``mean_len``); arrivals are Poisson(``rate``) per step and wait while ``max_slots`` are live."""
    rng = np.random.default_rng(seed)
    left: dict[int, int] = {}
    waiting = next_id = 0
    out = []
    for _ in range(steps):
        waiting += int(rng.poisson(rate))
        admit = min(waiting, max_slots - len(left))
        if not left and admit == 0:
            admit, waiting = 1, waiting + 1
        waiting -= admit
        for _ in range(admit):
            left[next_id] = int(rng.geometric(1.0 / mean_len))
            next_id += 1
        leaving = [r for r, n in left.items() if n == 1]
        left = {r: n - 1 for r, n in left.items() if n > 1}
        out.append((admit, leaving))
    return out


class TorchSlots:
    """The vLLM way in PyTorch: state rows in a persistent tensor, one graph per bucket that
    gathers ``state[idx[:b]]``, runs the block and scatters back with ``index_copy_``; per step a
    ``copy_`` of the indices (pinned host -> static device tensor), then ``replay()``."""

    width: int
    ts: Any
    ws: list[tuple[Any, Any]]
    state: Any
    idx: Any
    host_idx: Any
    table: Any
    free: list[int]

    def __init__(self, torch: Any, model: TinyBlock, max_slots: int, sizes: list[int]):
        self.torch = torch
        self.sizes = sizes
        self.width = model.width
        self.scratch = max_slots
        self.ts = torch.cuda.Stream()
        self.ws = [(torch.as_tensor(w1, device="cuda"), torch.as_tensor(w2, device="cuda")) for w1, w2 in model.weights]
        top = sizes[-1]
        self.state = torch.zeros((max_slots + 1, model.width), device="cuda")
        self.idx = torch.full((top,), max_slots, dtype=torch.int64, device="cuda")
        self.host_idx = torch.full((top,), max_slots, dtype=torch.int64).pin_memory()
        self.table = self.host_idx.numpy()
        self.free = list(range(max_slots - 1, -1, -1))
        self.pos: dict[int, int] = {}
        self.graphs: dict[int, Any] = {}
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode(), torch.cuda.stream(self.ts):
            for b in reversed(sizes):
                for _ in range(2):
                    self._step_body(b)
                self.ts.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=self.ts):
                    self._step_body(b)
                self.graphs[b] = g
        self.ts.synchronize()
        self.last_copy: Any = None

    def _step_body(self, b: int) -> None:
        torch = self.torch
        ix = self.idx[:b]
        x = self.state.index_select(0, ix)
        for w1, w2 in self.ws:
            x = torch.relu(x @ w1) @ w2 + x
        self.state.index_copy_(0, ix, x)

    def join(self, row: Any) -> int:
        slot = self.free.pop()
        with self.torch.cuda.stream(self.ts):
            self.state[slot].copy_(row)
        self._table_free()
        n = len(self.pos)
        self.table[n] = slot
        self.pos[slot] = n
        return slot

    def _table_free(self) -> None:
        # the pinned-index rule, as for our pool: the last copy_ must have read the pinned table
        if self.last_copy is not None:
            self.last_copy.synchronize()

    def leave(self, slot: int) -> np.ndarray:
        with self.torch.cuda.stream(self.ts):
            row = self.state[slot].cpu().numpy()
        self._table_free()
        pos, last = self.pos.pop(slot), len(self.pos)
        if pos != last:
            moved = int(self.table[last])
            self.table[pos] = moved
            self.pos[moved] = pos
        self.table[last] = self.scratch
        self.free.append(slot)
        self.free.sort(reverse=True)
        return row

    def step(self) -> int:
        n = len(self.pos)
        b = pick_bucket(self.sizes, n)
        assert b is not None
        with self.torch.cuda.stream(self.ts):
            self.idx[:b].copy_(self.host_idx[:b], non_blocking=True)
            ev = self.torch.cuda.Event()
            ev.record(self.ts)
            self.last_copy = ev
            self.graphs[b].replay()
        return b

    def sync(self) -> None:
        self.ts.synchronize()


def run(
    steps: int,
    width: int,
    layers: int,
    max_slots: int,
    rate: float,
    mean_len: float,
    seed: int,
    torch_ok: bool = True,
    bare: bool = True,
    rows_from: str = "host",
) -> dict:
    """``rows_from``: where a joining request's row comes from, ``"host"`` (a NumPy row: rawgraph's
    pools copy it with no wait, torch's ``copy_`` from a CPU tensor) or ``"device"``."""
    if rows_from not in ("host", "device"):
        raise ValueError(f"rows_from must be 'host' or 'device', got {rows_from!r}")
    torch = None
    if torch_ok:
        try:
            import torch as _torch

            if _torch.cuda.is_available():
                torch = _torch
                torch.backends.cuda.matmul.allow_tf32 = False
        except ImportError:
            torch = None
    sizes = vllm_sizes(max_slots)
    model = TinyBlock(width, 1, layers, seed=11, form="fused")
    trace = join_leave_trace(steps, max_slots, rate, mean_len, seed)
    total_requests = sum(a for a, _ in trace)
    rng = np.random.default_rng(seed + 1)
    row_pool_n = 64
    rows_host = rng.standard_normal((row_pool_n, width), dtype=np.float32)
    s = Stream()
    rows = DeviceBuffer.from_numpy(rows_host, stream=s)
    pools: dict[str, Any] = {
        k: SlotPool(
            model, max_slots, sizes, stream=s, **({**opts, "bands": sizes} if opts.get("bands") == "sizes" else opts)
        )
        for k, opts in POOL_OPTIONS.items()
    }
    setup_s = {k: dict(p.setup) for k, p in pools.items()}
    # the bare cuGraphLaunch reference: the same bucket graphs in a pool with no live request (its
    # replays touch only its scratch slot)
    idle = SlotPool(model, max_slots, sizes, table="graph", stream=s) if bare else None
    if torch is not None:
        t0 = time.perf_counter()
        pools["torch_vllm"] = TorchSlots(torch, model, max_slots, sizes)
        setup_s["torch_vllm"] = {"total": time.perf_counter() - t0}
        torch_rows = torch.as_tensor(rows_host, device="cuda")
    names = list(pools)
    slot_of: dict[str, dict[int, int]] = {k: {} for k in names}
    finals: dict[str, dict[int, np.ndarray]] = {k: {} for k in names}
    lat: dict[str, list[tuple[int, float]]] = {k: [] for k in names}
    host: dict[str, list[float]] = {k: [] for k in names}
    # host time of the joins before a step and the leaves after it, per step that had any
    join_us: dict[str, list[float]] = {k: [] for k in names}
    leave_us: dict[str, list[float]] = {k: [] for k in names}
    torch_host_rows: Any = torch.from_numpy(rows_host) if torch is not None else None
    bare_us: list[float] = []
    clock = time.perf_counter
    f32 = np.dtype(np.float32)
    next_id = 0
    order_rng = np.random.default_rng(seed + 2)
    for step, (admit, leaving) in enumerate(trace):
        ids = list(range(next_id, next_id + admit))
        next_id += admit
        for k in order_rng.permutation(names):
            pool = pools[k]
            t0 = clock()
            for r in ids:
                i = r % row_pool_n
                if rows_from == "host":
                    row = torch_host_rows[i] if k == "torch_vllm" else rows_host[i]
                else:
                    row = (
                        torch_rows[i]
                        if k == "torch_vllm"
                        else DeviceArray(rows.ptr + i * width * 4, (width,), f32, rows)
                    )
                slot_of[k][r] = pool.join(row)
            if ids:
                join_us[k].append((clock() - t0) * 1e6)
            if k == "torch_vllm":
                pool.sync()
                t0 = clock()
                b = pool.step()
                t1 = clock()
                pool.sync()
                t2 = clock()
            else:
                s.synchronize()
                t0 = clock()
                b = pool.step()
                t1 = clock()
                s.synchronize()
                t2 = clock()
            lat[k].append((b, (t2 - t0) * 1e6))
            host[k].append((t1 - t0) * 1e6)
            t0 = clock()
            for r in leaving:  # rawgraph's pools hand the row back later (leave(wait=False)), torch's now
                finals[k][r] = pool.leave(slot_of[k].pop(r), **({} if k == "torch_vllm" else {"wait": False}))
            if leaving:
                leave_us[k].append((clock() - t0) * 1e6)
        if idle is not None and step % 4 == 0:  # a bare cuGraphLaunch of the same bucket, on an idle stream
            p = pools["graph_table"]
            b = pick_bucket(p.sizes, len(p)) if len(p) else p.sizes[0]
            assert b is not None
            exe = idle.execs[b]
            s.synchronize()
            t0 = clock()
            exe.launch(s)
            t1 = clock()
            s.synchronize()
            bare_us.append((t1 - t0) * 1e6)
    for k in names:  # what is still live at the end finishes here (not counted as finished)
        pool = pools[k]
        for slot in list(slot_of[k].values()):
            pool.leave(slot)
    finals = {k: {r: v if isinstance(v, np.ndarray) else v.result() for r, v in f.items()} for k, f in finals.items()}
    check = _cross_check(finals)
    out: dict[str, Any] = {
        "env": environment(torch=getattr(torch, "__version__", None)),
        "config": {
            "steps": steps,
            "width": width,
            "layers": layers,
            "max_slots": max_slots,
            "rate": rate,
            "mean_len": mean_len,
            "seed": seed,
            "sizes": sizes,
            "requests": total_requests,
            "rows_from": rows_from,
        },
        "setup_s": setup_s,
        "check": check,
        "bare_launch_us": stats(bare_us) if bare_us else {"median": float("nan")},
    }
    per: dict[str, Any] = {}
    for k in names:
        by_bucket: dict[int, list[float]] = {}
        for b, v in lat[k]:
            by_bucket.setdefault(b, []).append(v)
        wall = sum(v for _, v in lat[k]) / 1e6
        per[k] = {
            "step_us": stats([v for _, v in lat[k]]),
            "host_us": stats(host[k]),
            "join_host_us": stats(join_us[k]) if join_us[k] else None,
            "leave_host_us": stats(leave_us[k]) if leave_us[k] else None,
            "by_bucket": {
                str(b): {**stats(v), "p99": float(np.percentile(v, 99)), "steps": len(v)}
                for b, v in sorted(by_bucket.items())
            },
            "p99_us": float(np.percentile([v for _, v in lat[k]], 99)),
            "requests_per_s": len(finals[k]) / wall if wall else 0.0,
            "finished": len(finals[k]),
        }
    out["strategies"] = per
    out["targets"] = targets(out)
    for p in (*pools.values(), *([idle] if idle is not None else [])):
        if hasattr(p, "close"):
            p.close()
    model.close()
    rows.close()
    s.close()
    return out


def _cross_check(finals: dict[str, dict[int, np.ndarray]]) -> dict:
    """Final rows of the requests every pool finished: the rawgraph pools bit-equal to
    ``graph_table`` (NaN equal to NaN: rows that live long enough overflow, as the block has no
    normalisation), and torch's relative error over the rows that are finite in both."""
    out: dict[str, Any] = {}
    ref = finals.get("graph_table", {})
    others = [k for k in RAWGRAPH if k != "graph_table" and k in finals]
    common = sorted(set(ref).intersection(*(finals[k] for k in others)))
    out["rawgraph_requests_compared"] = len(common)
    out["rawgraph_bit_equal"] = {
        k: int(sum(np.array_equal(ref[r], finals[k][r], equal_nan=True) for r in common)) for k in others
    }
    out["rows_finite"] = int(sum(bool(np.isfinite(ref[r]).all()) for r in common))
    if "torch_vllm" in finals:
        tc = [
            r
            for r in sorted(set(ref) & set(finals["torch_vllm"]))
            if np.isfinite(ref[r]).all() and np.isfinite(finals["torch_vllm"][r]).all()
        ]
        errs = [
            float(np.max(np.abs(finals["torch_vllm"][r] - ref[r])) / max(1e-30, float(np.max(np.abs(ref[r])))))
            for r in tc
        ]
        out["torch_finite_requests_compared"] = len(tc)
        out["torch_max_rel_err"] = max(errs) if errs else None
    return out


def targets(result: dict) -> list[dict]:
    """The slots issue's targets: step p50 and p99 <= 0.7x torch per bucket visited; host time per
    step <= 1.3x one bare cuGraphLaunch."""
    per = result["strategies"]
    rows = []
    if "torch_vllm" in per:
        for k in RAWGRAPH:
            worst50 = worst99 = 0.0
            for b, t in per["torch_vllm"]["by_bucket"].items():
                mine = per[k]["by_bucket"].get(b) if k in per else None
                if mine is None or t["steps"] < 5:
                    continue
                worst50 = max(worst50, mine["median"] / t["median"])
                worst99 = max(worst99, mine["p99"] / t["p99"])
            rows.append(
                {"target": f"{k}: step p50 <= 0.7x torch_vllm at every bucket", "worst": worst50, "met": worst50 <= 0.7}
            )
            rows.append(
                {"target": f"{k}: step p99 <= 0.7x torch_vllm at every bucket", "worst": worst99, "met": worst99 <= 0.7}
            )
    bare = result["bare_launch_us"]["median"]
    for k in RAWGRAPH:
        if k not in per:
            continue
        ratio = per[k]["host_us"]["median"] / bare
        rows.append(
            {"target": f"{k}: host time per step <= 1.3x bare cuGraphLaunch", "worst": ratio, "met": ratio <= 1.3}
        )
    return rows


def report(result: dict) -> str:
    lines = [
        f"continuous batching, w{result['config']['width']} L{result['config']['layers']} fused, "
        f"{result['config']['steps']} steps, {result['config']['requests']} requests, up to "
        f"{result['config']['max_slots']} slots (us)"
    ]
    lines.append(
        f"{'strategy':20s} {'p50':>8s} {'p99':>8s} {'host p50':>9s} {'join p50':>9s} {'leave p50':>9s} "
        f"{'req/s':>9s}   (join/leave: host us per step that had any, rows from "
        f"{result['config'].get('rows_from', 'device')})"
    )
    for k, v in result["strategies"].items():
        j, lv = v.get("join_host_us"), v.get("leave_host_us")
        lines.append(
            f"{k:20s} {v['step_us']['median']:8.1f} {v['p99_us']:8.1f} {v['host_us']['median']:9.2f} "
            f"{(j or {}).get('median', float('nan')):9.2f} {(lv or {}).get('median', float('nan')):9.2f} "
            f"{v['requests_per_s']:9.0f}"
        )
    lines.append(f"bare cuGraphLaunch host {result['bare_launch_us']['median']:.2f} us")
    c = result["check"]
    lines.append(
        f"check: {c['rawgraph_requests_compared']} requests, bit-equal to graph_table: "
        + ", ".join(f"{k} {v}" for k, v in c["rawgraph_bit_equal"].items())
        + f"; finite rows {c['rows_finite']}"
    )
    if "torch_max_rel_err" in c:
        lines.append(
            f"check: torch max rel err {c['torch_max_rel_err']} over {c['torch_finite_requests_compared']} "
            "finite requests"
        )
    buckets = sorted({int(b) for v in result["strategies"].values() for b in v["by_bucket"]})
    lines.append(
        "p50 by bucket: "
        + "  ".join(
            f"{b}:"
            + "/".join(
                f"{result['strategies'][k]['by_bucket'][str(b)]['median']:.0f}"
                for k in result["strategies"]
                if str(b) in result["strategies"][k]["by_bucket"]
            )
            for b in buckets
        )
    )
    for t in result["targets"]:
        lines.append(f"{t['target']:62s} {t['worst']:6.2f}  {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


DESCRIPTION = (
    "Continuous-batching benchmark: requests join and leave between steps, and every step advances "
    "all live requests through slots and an index table; rawgraph's slot pools against PyTorch the "
    "vLLM way, on one trace. Writes OUT/slots.json and OUT/slots_table.txt; prints the table."
)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``rawgraph bench slots`` (parsing them needs no GPU)."""
    p = command.parser("rawgraph bench slots", DESCRIPTION)
    p.add_argument("--steps", type=command.positive_int, default=10000, help="steps of the join-leave trace")
    command.add_model_options(p, width=1024, layers=8)
    p.add_argument("--max-slots", type=command.positive_int, default=256, help="slots (live requests at most)")
    command.add_trace_options(p, rate=2.0, mean_len=48.0, seed=0)
    p.add_argument("--no-torch", action="store_true", help="leave out PyTorch the vLLM way")
    p.add_argument("--no-bare", action="store_true", help="skip the bare cuGraphLaunch reference (and its idle pool)")
    p.add_argument(
        "--rows",
        choices=("host", "device"),
        default="host",
        help="a joining request's row: a host NumPy row or a device row",
    )
    p.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="folder for slots.json and slots_table.txt"
    )
    return p


def collect(args: argparse.Namespace) -> dict:
    """Run the trace through every strategy; write ``slots.json`` and ``slots_table.txt``; return the result."""
    if not args.no_torch:
        command.optional("torch", "torch", "PyTorch the vLLM way")
    result = run(
        args.steps,
        args.width,
        args.layers,
        args.max_slots,
        args.rate,
        args.mean_len,
        args.seed,
        not args.no_torch,
        not args.no_bare,
        args.rows,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slots.json").write_text(json.dumps(result, indent=1))
    (args.out / "slots_table.txt").write_text(report(result) + "\n")
    print(f"json: {args.out / 'slots.json'}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the continuous-batching benchmark; the table (or, with ``--json``, the result) on
    stdout, progress on stderr. Returns the exit status (0)."""
    return command.run_suite(build_parser().parse_args(argv), collect, report)


if __name__ == "__main__":
    sys.exit(main())
