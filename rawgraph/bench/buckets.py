"""Dynamic-batch benchmark: bucket strategies against exact-size graphs, eager and PyTorch's
bucket graphs, on one model, one set of weights, the same traces, in one process.

Strategies (record key ``strategy``): ``eager`` (a plan per size, launched eagerly), ``exact``
(a graph per size visited: capture on miss, setup paid once), ``pow2``, ``vllm`` and ``max``
(bucket graphs over one arena), ``vllm_graphmem`` (the vLLM list with scratch allocated inside
each graph: the driver's pool), ``rowcount`` (the vLLM list, kernels told the live row count),
``reshaped`` (one graph re-shaped per step), ``device`` (one exec whose grids and row counts a head
kernel sets on the device at each replay: :class:`~rawgraph.serving.DeviceShapedGraph`) and ``torch`` (PyTorch bucket graphs of the vLLM list
sharing one ``graph_pool_handle()``, captured largest first, the same weights).

Traces: ``uniform`` (every batch size 1..max, rounds interleaved across strategies) and
``decode`` (Poisson arrivals, geometric request lengths; each step's batch = the requests alive).
Each step is one synchronized host-clock sample: new rows copied into the strategy's input, the
replay (or launches), a stream synchronize. Capture and instantiation are never inside a step.
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

from ..models.tinyblock import TinyBlock
from ..runtime.device import get_device
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import Stream
from ..runtime.timing import stats
from ..serving import BucketGraphs, ReshapedGraph, RowCountBuckets, graph_memory, trim_graph_memory
from ..serving.device_shaped import DeviceShapedGraph
from ..serving.graphmem import reset_high_water
from ..serving.sizes import padding_waste, pick_bucket, powers_of_two, vllm_sizes
from . import command
from .progress import INSTALL_HINT
from .provenance import environment


def decode_trace(steps: int, max_batch: int, rate: float, mean_len: float, seed: int) -> tuple[list[int], int]:
    """Batch sizes of a decode-like run: Poisson(``rate``) new requests per step, each alive for a
    geometric number of steps (mean ``mean_len``); at most ``max_batch`` alive (the rest wait).
    Returns the sizes and how many requests finished within the trace."""
    rng = np.random.default_rng(seed)
    alive: list[int] = []
    waiting = finished = 0
    sizes = []
    for _ in range(steps):
        waiting += int(rng.poisson(rate))
        admit = min(waiting, max_batch - len(alive))
        waiting -= admit
        alive.extend(int(v) for v in rng.geometric(1.0 / mean_len, size=admit))
        if not alive:
            alive.append(int(rng.geometric(1.0 / mean_len)))
        sizes.append(len(alive))
        finished += sum(1 for left in alive if left == 1)
        alive = [left - 1 for left in alive if left > 1]
    return sizes, finished


class _Eager:
    """A plan per batch size over one arena, launched eagerly (no graph)."""

    def __init__(self, model: TinyBlock, max_batch: int, stream: Stream):
        from ..models.tinyblock import Workspace

        t0 = time.perf_counter()
        self.input = DeviceBuffer((max_batch, model.width))
        self.output = DeviceBuffer((max_batch, model.width))
        self.arena = Workspace(max_batch, model.width)
        self.models = {n: model.with_batch(n, workspace=self.arena) for n in range(1, max_batch + 1)}
        from ..runtime.memory import DeviceArray

        f32 = np.dtype(np.float32)
        self.plans = {
            n: m.plan(
                DeviceArray(self.input.ptr, (n, model.width), f32, self.input),
                DeviceArray(self.output.ptr, (n, model.width), f32, self.output),
            )
            for n, m in self.models.items()
        }
        self.setup = {"plans": time.perf_counter() - t0}
        self.stream = stream
        self.width = model.width

    def run(self, x: Any, n: int, stream: Any = None) -> Any:
        from cuda.bindings import driver

        from ..runtime.errors import call

        call(driver.cuMemcpyDtoDAsync, self.input.ptr, x.ptr, n * self.width * 4, self.stream.handle)
        self.plans[n].run(self.stream)
        return self.output

    def close(self) -> None:
        for m in self.models.values():
            m.close()
        for b in (self.input, self.output, self.arena):
            b.close()


class _TorchBuckets:
    """PyTorch bucket graphs: the vLLM list, captured largest first into one graph pool."""

    def __init__(self, torch: Any, model: TinyBlock, sizes: list[int], stream: Any):
        self.torch = torch
        self.sizes = sizes
        self.ts = stream
        dev_free0 = get_device().memory_info()[0]
        reserved0 = torch.cuda.memory_reserved()
        ws = [(torch.as_tensor(w1, device="cuda"), torch.as_tensor(w2, device="cuda")) for w1, w2 in model.weights]
        self.ws = ws
        top = sizes[-1]
        self.static_in = torch.zeros((top, model.width), device="cuda")
        self.graphs: dict[int, Any] = {}
        self.outs: dict[int, Any] = {}
        pool = torch.cuda.graph_pool_handle()
        self.setup = {"warmup": 0.0, "capture": 0.0}
        clock = time.perf_counter
        with torch.inference_mode(), torch.cuda.stream(stream):
            for b in reversed(sizes):
                t0 = clock()
                for _ in range(2):
                    self._block(self.static_in[:b])
                stream.synchronize()
                self.setup["warmup"] += clock() - t0
                g = torch.cuda.CUDAGraph()
                t0 = clock()
                with torch.cuda.graph(g, pool=pool, stream=stream):
                    self.outs[b] = self._block(self.static_in[:b])
                stream.synchronize()
                self.setup["capture"] += clock() - t0  # torch instantiates inside capture_end
                self.graphs[b] = g
        self.setup["instantiate"] = 0.0
        self.memory = {
            "reserved": torch.cuda.memory_reserved() - reserved0,
            "device": dev_free0 - get_device().memory_info()[0],
        }

    def _block(self, x: Any) -> Any:
        torch = self.torch
        for w1, w2 in self.ws:
            x = torch.relu(x @ w1) @ w2 + x
        return x

    def run(self, x: Any, n: int, stream: Any = None) -> Any:
        b = pick_bucket(self.sizes, n)
        assert b is not None, "no bucket holds n"
        with self.torch.cuda.stream(self.ts):
            self.static_in[:n].copy_(x[:n])
            if b > n:
                self.static_in[n:b].zero_()
            self.graphs[b].replay()
        return self.outs[b]

    def close(self) -> None:
        self.graphs.clear()
        self.outs.clear()


class _DeviceShaped:
    """:class:`DeviceShapedGraph` behind the ``run(x, n)`` of the other strategies."""

    def __init__(self, model: TinyBlock, max_batch: int, stream: Stream, bands: Any = None, select: str = "updates"):
        self.dsg = DeviceShapedGraph(model, max_batch=max_batch, stream=stream, bands=bands, select=select)
        self.setup = self.dsg.setup
        self.memory = {"buffers": self.dsg.nbytes}
        self.groups = {"one": list(range(1, max_batch + 1))}  # one exec

    def run(self, x: Any, n: int, stream: Any = None) -> Any:
        return self.dsg.run(n, stream, x=x)

    def close(self) -> None:
        self.dsg.close()


def update_costs(
    model: TinyBlock,
    dsg: DeviceShapedGraph,
    exact: Any,
    top: int,
    s: Stream,
    rounds: int = 200,
    banded: DeviceShapedGraph | None = None,
) -> dict:
    """The device-side update against the host's: device time of one replay of the device-shaped
    exec (head + updated nodes) and of the exact-size exec at ``top`` rows (event-timed), their
    difference per updated node; and the host's ``cuGraphExecKernelNodeSetParams`` per call (the
    exact exec's nodes pushed their own parameters, median of ``rounds`` passes).

    With ``banded`` (bands from the plans: at every n it runs the exact-size kernels), also its
    replay against the exact-size exec at n = 1, top / 2 and top: what the head, the updates and
    the disabled bands' nodes add, per node of the graph.

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    from cuda.bindings import driver

    from ..runtime.timing import device_us

    nodes = len(dsg.entries)
    dsg.set_rows(top, s)
    dev_shaped = stats(device_us(lambda: dsg.replay(s), s, rounds))
    exe = exact.execs[top]
    dev_exact = stats(device_us(lambda: exe.launch(s), s, rounds))
    graph = exact.graphs[top]
    params = [(node.handle, node.launch.node_params()) for node in graph.nodes]
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for h, p in params:
            driver.cuGraphExecKernelNodeSetParams(exe.handle, h, p)
        per_call.append((time.perf_counter() - t0) * 1e6 / max(1, len(params)))
    s.synchronize()
    out = {
        "nodes": nodes,
        "device_shaped_replay_us": dev_shaped,
        "exact_replay_us": dev_exact,
        "device_update_us_per_node": (dev_shaped["median"] - dev_exact["median"]) / max(1, nodes),
        "host_setparams_us_per_call": stats(per_call),
    }
    if banded is not None:
        per_n = {}
        for n in sorted({1, max(1, top // 2), top}):
            if n not in exact.execs:
                continue
            banded.set_rows(n, s)
            b = stats(device_us(lambda: banded.replay(s), s, rounds))
            e = stats(device_us(functools.partial(exact.execs[n].launch, s), s, rounds))
            per_n[str(n)] = {
                "banded_us": b,
                "exact_us": e,
                "added_us_per_node": (b["median"] - e["median"]) / max(1, len(banded.entries)),
            }
        out["banded"] = {"nodes": len(banded.entries), "bands": list(banded.bands), "by_n": per_n}
    return out


def _time_step(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the dynamic-batch benchmark; write the JSON and plots; the report (or, with ``--json``,
    the result) on stdout, progress on stderr. Returns the exit status (0)."""
    return command.run_suite(build_parser().parse_args(argv), collect, render)


def render(result: dict) -> str:
    """A buckets result as text: :func:`report`, then its findings."""
    return "\n".join([report(result), *(f"finding: {f}" for f in result["findings"])])


def collect(args: argparse.Namespace) -> dict:
    """Build every strategy, check it, time it on both traces; write the JSON and plots; return the result."""
    dev = get_device()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch_error: str | None = None
    torch: Any = None
    if not args.no_torch:
        command.optional("torch", "torch", "PyTorch's bucket graphs")
    try:
        import torch as _torch

        if _torch.cuda.is_available() and not args.no_torch:
            torch = _torch
    except Exception as exc:  # reported as a finding
        torch, torch_error = None, f"{type(exc).__name__}: {exc}"
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    s = Stream()
    top = args.max_batch
    model = TinyBlock(args.width, 1, args.layers, seed=1234, form=args.form)
    rng = np.random.default_rng(args.seed)
    src_host = rng.standard_normal((top, args.width), dtype=np.float32)
    src = DeviceBuffer.from_numpy(src_host, stream=s)
    uniform = list(range(1, top + 1))
    decode, requests = decode_trace(args.steps, top, args.rate, args.mean_len, args.seed)
    visited = sorted(set(uniform) | set(decode))
    vllm, pow2 = vllm_sizes(top), powers_of_two(top)
    findings: list[str] = [] if torch_error is None else [f"torch unavailable: {torch_error}"]
    strategies: dict[str, Any] = {}
    info: dict[str, dict] = {}
    builders: list[tuple[str, Callable[[], Any], int]] = [
        ("max", lambda: BucketGraphs(model, sizes=[top], stream=s), 1),
        ("vllm", lambda: BucketGraphs(model, sizes=vllm, stream=s), len(vllm)),
        ("pow2", lambda: BucketGraphs(model, sizes=pow2, stream=s), len(pow2)),
        ("vllm_graphmem", lambda: BucketGraphs(model, sizes=vllm, stream=s, scratch="graph"), len(vllm)),
        ("rowcount", lambda: RowCountBuckets(model, sizes=vllm, stream=s), len(vllm)),
        ("reshaped", lambda: ReshapedGraph(model, max_batch=top, stream=s), 1),
        ("device", lambda: _DeviceShaped(model, top, s), 1),
        ("device_bands", lambda: _DeviceShaped(model, top, s, bands="plans"), 1),
        ("switch_bands", lambda: _DeviceShaped(model, top, s, bands="plans", select="switch"), 1),
        ("switch_rows", lambda: _DeviceShaped(model, top, s, bands=uniform, select="switch"), 1),
        ("switch_vllm", lambda: _DeviceShaped(model, top, s, bands=vllm, select="switch"), 1),
        ("exact", lambda: BucketGraphs(model, sizes=visited, stream=s), len(visited)),
        ("eager", lambda: _Eager(model, top, s), 0),
    ]
    t_start = time.perf_counter()
    for name, build, nbuckets in builders:
        s.synchronize()
        trim_graph_memory()
        reset_high_water()
        free0 = dev.memory_info()[0]
        t0 = time.perf_counter()
        try:
            strategies[name] = build()
        except Exception as exc:
            findings.append(f"{name} could not be built: {type(exc).__name__}: {exc}")
            print(f"  {name}: FAILED to build: {exc}", flush=True)
            continue
        wall = time.perf_counter() - t0
        st = strategies[name]
        nbuckets = len(st.groups) if hasattr(st, "groups") else nbuckets
        if name == "vllm_graphmem":  # the pool fills on the first replay of each bucket
            for b in vllm:
                st.run(src, b)
            s.synchronize()
        mem = {"device_growth": free0 - dev.memory_info()[0], **getattr(st, "memory", {})}
        if name == "vllm_graphmem":
            mem["graph_pool"] = graph_memory()
        info[name] = {
            "buckets": nbuckets,
            "setup_s": dict(getattr(st, "setup", {})),
            "build_wall_s": wall,
            "memory": mem,
        }
        print(
            f"  built {name}: {nbuckets} graphs, {wall:.2f} s, device +{mem['device_growth'] / 2**20:.1f} MiB",
            flush=True,
        )
    tsrc = None
    if torch is not None:
        ts = torch.cuda.Stream()
        free0 = dev.memory_info()[0]
        t0 = time.perf_counter()
        try:
            strategies["torch"] = _TorchBuckets(torch, model, vllm, ts)
            tsrc = torch.as_tensor(src, device="cuda")
            st = strategies["torch"]
            info["torch"] = {
                "buckets": len(vllm),
                "setup_s": st.setup,
                "build_wall_s": time.perf_counter() - t0,
                "memory": {"device_growth": free0 - dev.memory_info()[0], **st.memory},
            }
            print(f"  built torch: {len(vllm)} graphs, {info['torch']['build_wall_s']:.2f} s", flush=True)
        except Exception as exc:
            findings.append(f"torch buckets could not be built: {type(exc).__name__}: {exc}")
            strategies.pop("torch", None)

    def stepper(name: str, n: int) -> tuple[Callable[[], Any], Callable[[], None]]:
        st = strategies[name]
        if name == "torch":
            return (lambda: st.run(tsrc, n)), st.ts.synchronize
        return (lambda: st.run(src, n)), s.synchronize

    # -- correct before timed: every strategy against the float64 reference at a few sizes
    ref_w = model.weights_numpy(s)
    from ..models.tinyblock import reference_forward

    for n in sorted({1, 7, 64, top} & set(uniform)):
        ref = reference_forward(src_host[:n], ref_w)
        for name in list(strategies):
            fn, sync = stepper(name, n)
            res = fn()
            sync()
            got = res[:n].cpu().numpy() if name == "torch" else _read(res, n, args.width, s)
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            if not err < 1e-4:
                findings.append(f"{name} wrong at n={n}: rel err {err:.2e}; dropped")
                strategies.pop(name)
    names = list(strategies)
    order_rng = np.random.default_rng(args.seed + 1)
    # -- uniform trace: per n, rounds interleaved across strategies
    lat: dict[str, dict[int, list[float]]] = {name: {n: [] for n in uniform} for name in names}
    for n in uniform:
        steps = {name: stepper(name, n) for name in names}
        for name in names:  # warm this size
            steps[name][0]()
            steps[name][1]()
        for _ in range(args.rounds):
            # a fresh order every round: a step right after another strategy's long step (max's
            # 256 rows) runs slower, and a fixed order would always hand that to the same one
            for i in order_rng.permutation(len(names)):
                lat[names[i]][n].append(_time_step(*steps[names[i]]))
    per_n = {name: {n: stats(v) for n, v in lat[name].items()} for name in names}
    # -- decode trace: the same step sequence through every strategy, interleaved per step
    dec: dict[str, list[float]] = {name: [] for name in names}
    for n in decode:
        for i in order_rng.permutation(len(names)):
            dec[names[i]].append(_time_step(*stepper(names[i], n)))
    decode_summary = {}
    for name in names:
        total_s = sum(dec[name]) / 1e6
        decode_summary[name] = {
            **stats(dec[name]),
            "p99": float(np.percentile(dec[name], 99)),
            "requests_per_s": requests / total_s,
            "rows_per_s": sum(decode) / total_s,
        }
    waste = {}
    for name, sizes in (
        ("vllm", vllm),
        ("pow2", pow2),
        ("max", [top]),
        ("exact", visited),
        ("torch", vllm),
        ("vllm_graphmem", vllm),
        ("switch_vllm", vllm),
    ):
        waste[name] = {"uniform": padding_waste(sizes, uniform), "decode": padding_waste(sizes, decode)}
    for name in ("eager", "reshaped", "rowcount", "device", "device_bands", "switch_rows"):
        waste[name] = {"uniform": 0.0, "decode": 0.0}
    if "switch_bands" in strategies:  # a band runs at its top's rows
        bands = strategies["switch_bands"].dsg.bands
        waste["switch_bands"] = {"uniform": padding_waste(bands, uniform), "decode": padding_waste(bands, decode)}
    device_update: dict = {}
    if "device" in strategies and "exact" in strategies:
        try:
            banded = strategies["device_bands"].dsg if "device_bands" in strategies else None
            device_update = update_costs(model, strategies["device"].dsg, strategies["exact"], top, s, banded=banded)
        except Exception as exc:  # reported as a finding
            findings.append(f"device update costs not measured: {type(exc).__name__}: {exc}")
    result = {
        "env": environment(torch=getattr(torch, "__version__", None)),
        "config": {
            "width": args.width,
            "layers": args.layers,
            "form": args.form,
            "max_batch": top,
            "rounds": args.rounds,
            "decode_steps": args.steps,
            "rate": args.rate,
            "mean_len": args.mean_len,
            "seed": args.seed,
        },
        "strategies": info,
        "uniform": {name: {str(n): v for n, v in per_n[name].items()} for name in names},
        "decode": decode_summary,
        "decode_trace": decode,
        "decode_requests_finished": requests,
        "padding_waste": waste,
        "device_update": device_update,
        "findings": findings,
        "weights_bytes": model.block_weights.nbytes,
        "wall_s": time.perf_counter() - t_start,
    }
    result["targets"] = targets(result)
    path = out_dir / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1))
    for png in plots(result, out_dir, args.name):
        print(f"plot: {png}")
    print(f"json: {path}")
    for st in strategies.values():
        st.close()
    model.close()
    return result


def _read(res: Any, n: int, width: int, s: Stream) -> np.ndarray:
    from cuda.bindings import driver

    from ..runtime.errors import call

    host = np.empty((n, width), np.float32)
    call(driver.cuMemcpyDtoHAsync, host.ctypes.data, res.ptr, host.nbytes, s.handle)
    s.synchronize()
    return host


def targets(result: dict) -> list[dict]:
    """The dynamic-batch issue's targets, each with the figures it compares."""
    out = []
    info, uni = result["strategies"], result["uniform"]
    w = result["weights_bytes"]

    def med(name: str, n: int) -> float:
        return uni[name][str(n)]["median"]

    if "vllm" in info and "max" in info:
        one = info["max"]["memory"]
        floor = w + one["workspace"] + one["io"] + one["graphs"]
        got = w + info["vllm"]["memory"]["device_growth"]
        out.append(
            {
                "target": "memory: all vLLM buckets <= 1.1x (weights + largest workspace + one exec)",
                "value": got / floor,
                "limit": 1.1,
                "met": got / floor <= 1.1,
            }
        )
        if "torch" in info:
            ratio = info["vllm"]["memory"]["device_growth"] / max(1, info["torch"]["memory"]["device_growth"])
            out.append(
                {
                    "target": "memory: vLLM buckets' growth <= 0.5x PyTorch's",
                    "value": ratio,
                    "limit": 0.5,
                    "met": ratio <= 0.5,
                }
            )
    if "vllm" in info and "torch" in info:
        ours = sum(info["vllm"]["setup_s"].get(k, 0.0) for k in ("capture", "instantiate", "warmup", "upload"))
        theirs = sum(info["torch"]["setup_s"].values())
        out.append(
            {
                "target": "setup: vLLM list capture+instantiate+warm-up <= 0.1x PyTorch's",
                "value": ours / theirs,
                "limit": 0.1,
                "met": ours / theirs <= 0.1,
            }
        )
    n_all = [int(n) for n in uni.get("vllm", {})]
    if "vllm" in uni and "exact" in uni:
        worst = max(n_all, key=lambda n: med("vllm", n) / med("exact", n))
        r = med("vllm", worst) / med("exact", worst)
        out.append(
            {
                "target": "latency: vLLM bucket step <= 1.15x exact-size graph at every n",
                "value": r,
                "limit": 1.15,
                "met": r <= 1.15,
                "worst_n": worst,
            }
        )
    if "vllm" in uni and "torch" in uni:
        small = [n for n in n_all if n <= 64]
        worst = max(small, key=lambda n: med("vllm", n) / med("torch", n))
        r = med("vllm", worst) / med("torch", worst)
        out.append(
            {
                "target": "latency: vLLM bucket step <= 0.75x PyTorch buckets at every n <= 64",
                "value": r,
                "limit": 0.75,
                "met": r <= 0.75,
                "worst_n": worst,
            }
        )
    for dev, what in (
        ("device", "device-shaped"),
        ("device_bands", "banded device-shaped"),
        ("switch_bands", "SWITCH over plan bands"),
        ("switch_rows", "SWITCH over every row count"),
        ("switch_vllm", "SWITCH over the vLLM sizes"),
    ):
        if dev in info and "vllm" in info:
            mem, vmem = info[dev]["memory"], info["vllm"]["memory"]
            ratio = mem["device_growth"] / max(1, vmem["device_growth"])
            out.append(
                {
                    "target": f"memory: {what} (1 exec) <= 0.1x the vLLM buckets ({info['vllm']['buckets']})",
                    "value": ratio,
                    "limit": 0.1,
                    "met": ratio <= 0.1,
                }
            )
            # the same without the buffers both keep (input, output, arena): what the graphs cost
            ours_g = max(0, mem["device_growth"] - mem.get("buffers", 0))
            ratio = ours_g / max(1, vmem.get("graphs", 0))
            out.append(
                {
                    "target": f"memory: {what}, beyond its buffers <= 0.1x vLLM graphs",
                    "value": ratio,
                    "limit": 0.1,
                    "met": ratio <= 0.1,
                }
            )
            keys = ("capture", "instantiate", "warmup", "upload", "attributes")
            # bands="plans" reads every row count's plan first: counted as set-up too
            ours = sum(info[dev]["setup_s"].get(k, 0.0) for k in keys + ("bands",))
            theirs = sum(info["vllm"]["setup_s"].get(k, 0.0) for k in keys)
            out.append(
                {
                    "target": f"setup: {what} <= 0.1x the vLLM buckets",
                    "value": ours / max(theirs, 1e-12),
                    "limit": 0.1,
                    "met": ours <= 0.1 * theirs,
                }
            )
        if dev in uni and "exact" in uni:
            ns = [int(n) for n in uni[dev] if n in uni["exact"]]
            worst = max(ns, key=lambda n: med(dev, n) / med("exact", n))
            r = med(dev, worst) / med("exact", worst)
            out.append(
                {
                    "target": f"latency: {what} <= 1.05x exact-size graph at every n",
                    "value": r,
                    "limit": 1.05,
                    "met": r <= 1.05,
                    "worst_n": worst,
                }
            )
    return out


def report(result: dict) -> str:
    """Tables within 100 columns: per strategy setup, memory, decode latency; targets."""
    lines = [
        f"{'strategy':14s} {'graphs':>6s} {'setup s':>8s} {'mem MiB':>8s} {'waste%':>7s} "
        f"{'p50 us':>8s} {'p99 us':>8s} {'req/s':>9s}"
    ]
    for name, inf in result["strategies"].items():
        d = result["decode"].get(name)
        setup = sum(v for k, v in inf["setup_s"].items())
        mem = inf["memory"]["device_growth"] / 2**20
        waste = result["padding_waste"].get(name, {}).get("decode", 0.0) * 100
        if d:
            lines.append(
                f"{name:14s} {inf['buckets']:6d} {setup:8.3f} {mem:8.1f} {waste:7.1f} {d['median']:8.1f} "
                f"{d['p99']:8.1f} {d['requests_per_s']:9.0f}"
            )
        else:
            lines.append(f"{name:14s} {inf['buckets']:6d} {setup:8.3f} {mem:8.1f} {waste:7.1f} {'(dropped)':>8s}")
    uni = result["uniform"]
    lines.append("")
    lines.append("uniform trace, median us at n = " + ", ".join(str(n) for n in (1, 9, 17, 64, 100, 129, 256)))
    for name in uni:
        vals = [uni[name].get(str(n), {}).get("median", float("nan")) for n in (1, 9, 17, 64, 100, 129, 256)]
        lines.append(f"  {name:14s} " + " ".join(f"{v:8.1f}" for v in vals))
    du = result.get("device_update") or {}
    if du:
        lines.append("")
        lines.append(
            f"device-side update: {du['nodes']} nodes, replay {du['device_shaped_replay_us']['median']:.1f} us "
            f"vs exact {du['exact_replay_us']['median']:.1f} us (device time)"
        )
        lines.append(
            f"  = {du['device_update_us_per_node']:.2f} us/node; host cuGraphExecKernelNodeSetParams "
            f"{du['host_setparams_us_per_call']['median']:.2f} us/call"
        )
        bd = du.get("banded")
        if bd:
            lines.append(f"banded ({len(bd['bands'])} bands, {bd['nodes']} nodes) against the exact-size exec:")
            for n, v in bd["by_n"].items():
                lines.append(
                    f"  n={n:>4s}: {v['banded_us']['median']:8.1f} vs {v['exact_us']['median']:8.1f} us "
                    f"({v['added_us_per_node']:+.3f} us per node)"
                )
    lines.append("")
    for t in result["targets"]:
        extra = f" (worst n={t['worst_n']})" if "worst_n" in t else ""
        lines.append(f"{t['target'][:70]:70s} {t['value']:6.3f} {'met' if t['met'] else 'MISSED'}{extra}")
    return "\n".join(lines)


def plots(result: dict, out_dir: Path, stem: str) -> list[Path]:
    """Step latency vs batch size per strategy (the padding sawtooth); memory and setup vs graphs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not installed: plots skipped ({INSTALL_HINT})")
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name, per in result["uniform"].items():
        ns = sorted(int(n) for n in per)
        ax.plot(ns, [per[str(n)]["median"] for n in ns], label=name, lw=1.2)
    c = result["config"]
    ax.set(
        xlabel="batch size n",
        ylabel="step latency, median us (synced)",
        title=f"w{c['width']} L{c['layers']} {c['form']}: step latency per strategy",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    p = out_dir / f"{stem}_latency.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, inf in result["strategies"].items():
        a1.scatter(inf["buckets"], inf["memory"]["device_growth"] / 2**20, label=name)
        a2.scatter(inf["buckets"], sum(inf["setup_s"].values()), label=name)
    a1.set(xlabel="graphs", ylabel="device memory growth, MiB", xscale="symlog")
    a2.set(xlabel="graphs", ylabel="setup s (capture, instantiate, warm-up)", xscale="symlog", yscale="log")
    a1.legend(fontsize=7)
    fig.tight_layout()
    p = out_dir / f"{stem}_memory_setup.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


DESCRIPTION = (
    "Dynamic-batch benchmark: bucket strategies (powers of two, vLLM's list, one max bucket, row "
    "counts, re-shaped and device-shaped graphs) against exact-size graphs, eager launches and "
    "PyTorch's bucket graphs, on one model and the same traces. Writes OUT/NAME.json and plots; "
    "prints the report."
)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``rawgraph bench buckets`` (parsing them needs no GPU)."""
    p = command.parser("rawgraph bench buckets", DESCRIPTION)
    command.add_model_options(p, width=1024, layers=8, form="fused")
    p.add_argument("--max-batch", type=command.positive_int, default=256, help="the largest batch (top bucket)")
    p.add_argument(
        "--rounds", type=command.positive_int, default=7, help="samples per strategy per batch size (uniform trace)"
    )
    p.add_argument("--steps", type=command.positive_int, default=3000, help="steps of the decode trace")
    command.add_trace_options(p, rate=6.0, mean_len=32.0, seed=7)
    p.add_argument("--no-torch", action="store_true", help="leave out PyTorch's bucket graphs")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON and the plots")
    p.add_argument("--name", default="buckets", help="file stem of the JSON and the plots")
    return p


if __name__ == "__main__":
    sys.exit(main())
