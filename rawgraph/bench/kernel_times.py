"""Kernel benchmark: device time per kernel, side by side with cuBLAS (``torch.mm``, TF32 off).

Each kernel is launched ``REPS`` times inside one captured graph, so launch gaps don't count;
the graph's replay is timed with CUDA events and divided by ``REPS``. Launches rotate over enough
weight matrices that together they exceed the L2 cache (as the layers of a deep model do), so a
figure is DRAM time, not cache time. Achieved bandwidth counts W once plus x and y, against a
device-to-device copy measured in the same run (bytes read + written).

    PYTHONPATH=. python3 -m rawgraph.bench.kernel_times [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..capture import Capture
from ..device import get_device
from ..errors import call
from ..memory import DeviceBuffer
from ..stream import Event, Stream
from ..timing import stats

REPS = 64
WIDTHS = (128, 1024, 4096)
BATCHES = (1, 8, 64)


def _graph_time_us(launches, stream: Stream, repeats: int = 15) -> dict:
    with Capture(stream) as cap:
        for l in launches:
            cap.launch(l)
    exe = cap.graph.instantiate()
    exe.launch(stream)
    stream.synchronize()
    samples = []
    a, b = Event(), Event()
    for _ in range(repeats):
        a.record(stream)
        exe.launch(stream)
        b.record(stream)
        b.synchronize()
        samples.append(a.elapsed_ms(b) * 1e3 / len(launches))
    exe.close()
    cap.graph.close()
    return stats(samples)


def copy_bandwidth(stream: Stream, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, GB/s counting bytes read plus written (``cuMemcpyDtoDAsync``)."""
    src, dst = DeviceBuffer(nbytes // 4), DeviceBuffer(nbytes // 4)
    src.poison(stream)
    a, b = Event(), Event()
    best = []
    for _ in range(5):
        a.record(stream)
        call(driver.cuMemcpyDtoDAsync, dst.ptr, src.ptr, nbytes, stream.handle)
        b.record(stream)
        b.synchronize()
        best.append(2 * nbytes / (a.elapsed_ms(b) * 1e-3) / 1e9)
    src.close()
    dst.close()
    return float(np.median(best))


def _weights(width: int, l2_bytes: int, stream: Stream) -> list[DeviceBuffer]:
    """Enough distinct matrices to fill the L2 cache three times over (at most REPS)."""
    dev = get_device()
    count = int(min(REPS, max(2, -(-3 * l2_bytes // (width * width * 4)))))
    ws = [DeviceBuffer((width, width)) for _ in range(count)]
    for i, w in enumerate(ws):
        ops.fill_uniform(dev, w.view(), 1000 + i, float(np.sqrt(3.0 / width)))(stream)
    stream.synchronize()
    return ws


def measure(widths=WIDTHS, batches=BATCHES) -> dict:
    dev = get_device()
    stream = Stream()
    rng = np.random.default_rng()
    torch = None
    try:
        import torch as _torch

        if _torch.cuda.is_available():
            torch = _torch
            torch.backends.cuda.matmul.allow_tf32 = False
    except Exception:
        pass
    bw = copy_bandwidth(stream)
    rows = []
    for width in widths:
        ws = _weights(width, dev.info.l2_bytes, stream)
        for batch in batches:
            x = DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32))
            y = DeviceBuffer((batch, width))
            r = DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32))
            bufs = {"x": x.view(), "y": y.view(), "r": r.view()}
            bufs.update({f"W{i}": w.view() for i, w in enumerate(ws)})
            row = {"width": width, "batch": batch, "weights_rotated": len(ws)}
            for name, epi in (("matmul", "none"), ("matmul_relu", "relu"), ("matmul_add", "add")):
                launches = [ops.matmul(dev, bufs, "x", f"W{i % len(ws)}", "y", epi, r="r" if epi == "add" else None)
                            for i in range(REPS)]
                row[name] = _graph_time_us(launches, stream)
                row[name + "_kernel"] = launches[0].kernel.name
            row["relu"] = _graph_time_us([ops.relu(dev, bufs, "x", "y")] * REPS, stream)
            row["add"] = _graph_time_us([ops.add(dev, bufs, "x", "r", "y")] * REPS, stream)
            if ops.block_fits(width):
                pairs = [(f"W{(2 * i) % len(ws)}", f"W{(2 * i + 1) % len(ws)}") for i in range(REPS)]
                row["block"] = _graph_time_us([ops.block(dev, bufs, "x", a, b, "y") for a, b in pairs], stream)
            nbytes = width * width * 4 + 2 * batch * width * 4
            t = row["matmul"]["median"]
            row["matmul_GBps"] = nbytes / (t * 1e-6) / 1e9
            row["matmul_frac_of_copy_bw"] = row["matmul_GBps"] / bw
            if torch is not None:
                tw = [torch.as_tensor(w, device="cuda") for w in ws]
                tx = torch.as_tensor(x, device="cuda")
                ty = torch.empty((batch, width), device="cuda")
                ref = (tx.double() @ tw[0].double()).float()
                torch.mm(tx, tw[0], out=ty)
                assert torch.linalg.norm(ty - ref) / torch.linalg.norm(ref) < 1e-5
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    torch.mm(tx, tw[1 % len(tw)], out=ty)  # warm-up: cuBLAS handle and workspace
                    s.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=s):
                        for i in range(REPS):
                            torch.mm(tx, tw[i % len(tw)], out=ty)
                    g.replay()
                    s.synchronize()
                    samples = []
                    for _ in range(15):
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record(s)
                        g.replay()
                        b.record(s)
                        b.synchronize()
                        samples.append(a.elapsed_time(b) * 1e3 / REPS)
                row["torch_mm"] = stats(samples)
                row["matmul_vs_cublas"] = t / row["torch_mm"]["median"]
                del g
            rows.append(row)
            line = f"w{width:<5d} b{batch:<3d} matmul {t:8.2f} us ({row['matmul_GBps']:7.0f} GB/s, {row['matmul_frac_of_copy_bw']:5.1%} of copy)"
            if "torch_mm" in row:
                line += f"  torch.mm {row['torch_mm']['median']:8.2f} us  ratio {row['matmul_vs_cublas']:5.2f}"
            line += f"  relu {row['relu']['median']:.2f}  add {row['add']['median']:.2f}"
            if "block" in row:
                line += f"  block {row['block']['median']:.2f} vs fused pair {row['matmul_relu']['median'] + row['matmul_add']['median']:.2f}"
            print(line, flush=True)
            for b_ in (x, y, r):
                b_.close()
        for w in ws:
            w.close()
    return {"device": dev.info.name, "copy_GBps": bw, "reps_per_graph": REPS, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.kernel_times")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    result = measure()
    print(f"device-to-device copy: {result['copy_GBps']:.0f} GB/s (read + write)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_times.json").write_text(json.dumps(result, indent=1))
    print(f"json: {out / 'kernel_times.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
