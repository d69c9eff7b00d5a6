"""Benchmark of the tensor-parallel block's step: eager vs graph (NCCL or the one-shot
all-reduce) vs the one-GPU graph, and the all-reduce's own cost per message size.

Run one process per GPU through the launcher (rank 0 writes the JSON, with the commit):

    python -m rawgraph.multi --nproc 2 --timeout 580 -m rawgraph.bench.multi --out benchmarks/results/multi.json

``--nproc 1`` runs the same on one GPU (a one-rank communicator; NCCL then copies). Each step is
timed with events over ``--iters`` launches after ``--warmup``, the median of ``--repeats``; a
barrier of one small all-reduce aligns the ranks before each measurement. Per width and batch it
also records set-up (ms) and device memory (bytes, ``cuMemGetInfo``) of the block (weights, and
NCCL's registered buffers) and of capture + instantiate + upload, for each kind and the one-GPU graph.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ..graphs.capture import capture_plan
from ..models.tinyblock import TinyBlock
from ..models.tp_block import TPBlock
from ..multi import RankEnv, heartbeat
from ..multi.allreduce import PeerAllReduce
from ..multi.comm import NcclBuffer, NcclComm, nccl_available
from ..runtime.device import get_device
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import Event, Stream
from .provenance import environment

WIDTHS = (1024, 4096)
BATCHES = (1, 8, 64, 256)
MESSAGE_FLOATS = tuple(2**k for k in range(8, 23, 2))  # 1 KiB .. 16 MiB


def _time(step, stream: Stream, iters: int, warmup: int, repeats: int, sync=None) -> float:
    """Median microseconds per call of ``step(stream)``."""
    for _ in range(warmup):
        step(stream)
    stream.synchronize()
    out = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        a, b = Event(), Event()
        a.record(stream)
        for _ in range(iters):
            step(stream)
        b.record(stream)
        b.synchronize()
        out.append(a.elapsed_ms(b) * 1000.0 / iters)
        a.close()
        b.close()
    return float(np.median(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.multi")
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON path (rank 0 writes it)")
    ns = p.parse_args(argv)
    ok, why = nccl_available()
    if not ok:
        print(f"rawgraph.bench.multi: {why}", file=sys.stderr)
        return 2
    env = RankEnv.from_environ()
    device = get_device(env.device)
    rdzv = env.rendezvous_for() if env.world > 1 else None
    comm = NcclComm.from_env(env, device, rdzv)
    stream = Stream()
    widths = [int(w) for w in ns.widths.split(",")]
    batches = [int(b) for b in ns.batches.split(",")]
    cap = max(max(widths) * max(batches), max(MESSAGE_FLOATS))
    peer = PeerAllReduce(env.rank, env.world, cap, rdzv, device)
    tiny = DeviceBuffer((1,), np.float32, device)

    def align():  # every rank enters the measurement together
        stream.synchronize()
        comm.all_reduce(tiny, tiny, stream)
        stream.synchronize()

    rows = []
    t0 = time.time()
    for width in widths:
        for batch in batches:
            x = DeviceBuffer.from_numpy(
                np.random.default_rng(0).standard_normal((batch, width), dtype=np.float32), device
            )
            out = DeviceBuffer((batch, width), np.float32, device)
            row: dict[str, float] = {"width": width, "batch": batch, "world": env.world}
            for kind, kw in (("nccl", {"comm": comm}), ("custom", {"peer": peer})):
                # set-up and device memory: the block (its weights and, for NCCL, its registered
                # buffers: ncclMemAlloc + ncclCommRegister), then capture + instantiate + upload
                stream.synchronize()
                free0, c0 = device.memory_info()[0], time.perf_counter()
                block = TPBlock(width, batch, env.rank, env.world, kind, seed=1, device=device, **kw)
                stream.synchronize()
                row[f"block_{kind}_ms"] = (time.perf_counter() - c0) * 1e3
                row[f"block_{kind}_bytes"] = free0 - device.memory_info()[0]
                if kind == "nccl":
                    row["eager_us"] = _time(
                        lambda s, block=block, x=x, out=out: block.forward(x, out, s),
                        stream,
                        ns.iters,
                        ns.warmup,
                        ns.repeats,
                        align,
                    )
                stream.synchronize()
                free0, c0 = device.memory_info()[0], time.perf_counter()
                graph = block.capture(x, out, stream)
                ex = graph.instantiate()
                ex.upload(stream)
                stream.synchronize()
                row[f"setup_{kind}_ms"] = (time.perf_counter() - c0) * 1e3
                row[f"exec_{kind}_bytes"] = free0 - device.memory_info()[0]
                row[f"graph_{kind}_us"] = _time(ex.launch, stream, ns.iters, ns.warmup, ns.repeats, align)
                ex.close()
                graph.close()
                block.close()
                heartbeat(env)
            one = TinyBlock(width, batch, form="fused", device=device, pdl=False)
            stream.synchronize()
            free0, c0 = device.memory_info()[0], time.perf_counter()
            g1 = capture_plan(one.plan(x, out), stream)
            e1 = g1.instantiate()
            e1.upload(stream)
            stream.synchronize()
            row["setup_one_gpu_ms"] = (time.perf_counter() - c0) * 1e3
            row["exec_one_gpu_bytes"] = free0 - device.memory_info()[0]
            row["one_gpu_graph_us"] = _time(e1.launch, stream, ns.iters, ns.warmup, ns.repeats)
            e1.close()
            g1.close()
            one.close()
            row["graph_over_eager"] = row["graph_nccl_us"] / row["eager_us"]
            rows.append(row)
            x.close()
            out.close()
            if env.rank == 0:
                print(json.dumps(row), flush=True)
    messages = []
    for n in MESSAGE_FLOATS:
        src, dst = NcclBuffer(comm, n), NcclBuffer(comm, n)
        red = DeviceBuffer((n,), np.float32, device)
        m = {
            "floats": n,
            "bytes": 4 * n,
            "nccl_us": _time(
                lambda s, src=src, dst=dst: comm.all_reduce(src, dst, s), stream, ns.iters, ns.warmup, ns.repeats, align
            ),
            "custom_us": _time(lambda s, n=n, red=red: peer(n, red, s), stream, ns.iters, ns.warmup, ns.repeats, align),
        }
        m["custom_over_nccl"] = m["custom_us"] / m["nccl_us"]
        messages.append(m)
        for b in (src, dst, red):
            b.close()
        heartbeat(env)
        if env.rank == 0:
            print(json.dumps(m), flush=True)
    result = {
        "environment": environment(world=env.world, seconds=round(time.time() - t0, 1)),
        "steps": rows,
        "all_reduce": messages,
    }
    if env.rank == 0 and ns.out:
        with open(ns.out, "w") as f:
            json.dump(result, f, indent=1)
    tiny.close()
    peer.close()
    stream.close()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
