"""Kernel benchmark: device time per kernel, side by side with cuBLAS (``torch.mm``, TF32 off).

Each kernel is launched ``REPS`` times inside one captured graph, so launch gaps don't count;
the graph's replay is timed with CUDA events and divided by ``REPS``. Launches rotate over enough
weight matrices that together they exceed the L2 cache (as the layers of a deep model do), so a
figure is DRAM time, not cache time. Achieved bandwidth counts W once plus x and y, against a
device-to-device copy measured in the same run (bytes read + written).

Every matmul is timed twice: as a chain of programmatic dependent launches (how rawgraph's plans
run on sm_90: each launch's weight loads overlap the one before) and in plain stream order.
``--sweep`` also times every other cut (column tile, K split, kernel) of each shape, so the
choice ``ops.matmul_shape`` makes can be checked against the best one measured; from 32 rows on,
and below that where ``ops.SGEMM_CUTS`` has an entry for the shape (the only way sgemm runs there),
that includes a few cuts of the fp32 GEMM (``kernels/sgemm.cu``, :data:`SGEMM_SWEEP`) and
the table's entry, if any (:func:`sgemm_candidates`).

    rawgraph bench kernels [--out benchmarks/results] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..graphs.capture import Capture
from ..ops import FLAG_EARLY
from ..runtime.device import get_device
from ..runtime.errors import call
from ..runtime.launch import Launch, LaunchPlan
from ..runtime.memory import DeviceBuffer
from ..runtime.module import get_kernels
from ..runtime.stream import Event, Stream
from ..runtime.timing import stats
from . import command
from .progress import SweepProgress
from .provenance import environment

REPS = 64
WIDTHS = (128, 1024, 4096)
BATCHES = (1, 8, 64)
# The kernels issue's targets: matmul time over cuBLAS's at most this, per batch.
CUBLAS_RATIO_TARGET = {1: 1.0, 8: 1.0, 64: 1.5}
BANDWIDTH_TARGET = 0.8  # at width 4096, batch 1: share of the measured copy bandwidth


def _graph_time_us(launches, bufs: dict, stream: Stream, pdl: bool, repeats: int = 15) -> dict:
    """Per-launch device time of a graph holding ``launches`` (a PDL chain or plain order)."""
    plan = LaunchPlan(launches, bufs, (), (), pdl=pdl)
    with Capture(stream) as cap:
        cap.run(plan)
    exe = cap.captured.instantiate()
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
    cap.captured.close()
    return stats(samples)


def max_active_clusters(launch: Launch, cluster: int) -> int:
    """``cuOccupancyMaxActiveClusters`` for this launch's grid, block, shared memory and a cluster
    of ``cluster`` CTAs along grid y (how rawgraph's kernels split K)."""
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = launch.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = launch.block
    cfg.sharedMemBytes = launch.shared_mem
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 1, cluster, 1
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return int(call(driver.cuOccupancyMaxActiveClusters, launch.kernel.handle, cfg))


def launch_waves(launch: Launch, multiprocessors: int) -> dict[str, int | str]:
    """How many waves a launch's grid takes: its CTAs, or for a K split over a cluster along grid y
    its clusters, over how many run at once on the whole device (:func:`max_active_clusters`, or
    ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` x SMs). A cluster must fit one GPC, so a grid
    of clusters may need two waves where its CTAs alone would fit one. A figure beside a timing: a
    refused query is recorded (``waves_error``), not raised."""
    gx, gy, gz = launch.grid
    split = launch.kernel.cluster_dims[1]
    try:
        if split > 1:
            at_once = max_active_clusters(launch, split)
            if at_once == 0:
                return {"max_active_clusters": 0, "waves_error": "no cluster of this launch fits the device"}
            return {"max_active_clusters": at_once, "waves": -(-(gx * (gy // split) * gz) // at_once)}
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        fn = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor
        per_sm = int(call(fn, launch.kernel.handle, threads, launch.shared_mem))
        return {"ctas_per_sm": per_sm, "waves": -(-(gx * gy * gz) // max(per_sm * multiprocessors, 1))}
    except Exception as exc:  # noqa: BLE001 - see the docstring
        return {"waves_error": f"{type(exc).__name__}: {exc}"}


def copy_bandwidth(stream: Stream, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, GB/s counting bytes read plus written (``cuMemcpyDtoDAsync``).

    See Also
    --------
    cuMemcpyDtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """
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


# sgemm cut structures the sweep adds (BM, BN, KS, MINB; BK 16), each with every split that leaves
# every K part at least one stage: a few of benchmarks/gemm_sweep.py's STRUCTS (which times many
# more and prints ops.SGEMM_CUTS), for comparing them with the matmul.cu cuts in the same run.
SGEMM_SWEEP = ((128, 128, 1, 1), (64, 128, 2, 1), (128, 64, 2, 1), (64, 64, 4, 1), (32, 128, 4, 1))
SGEMM_SWEEP_BK = 16


def sgemm_candidates(batch: int, k: int, n: int, clusters: bool, smem_limit: int = 0) -> list[ops.MatmulShape]:
    """The sgemm cuts ``--sweep`` times for a (batch, K, N) product.

    The ``ops.SGEMM_CUTS`` cut ``ops.matmul_shape`` launches for the shape first
    (``ops.table_sgemm_shape``: the exact entry, else that of the next multiple of
    ``ops.SGEMM_ROW_STEP`` rows), if any, then
    :data:`SGEMM_SWEEP`'s structures. Below ``ops.GEMM_MIN_BATCH`` rows the dispatcher launches
    sgemm only through a table entry, so there the cuts come only where the table has one the
    device can run. None where
    K or N is not a multiple of 4 (no sgemm launch there). Cuts that split K over a cluster are
    left out without ``clusters``, and those over ``smem_limit`` bytes of dynamic shared memory
    when it is given. Stages of the sweep's cuts: up to 4, no more than a K part has plus one.

    Parameters
    ----------
    batch, k, n : int
        Rows of x, K and N of the product.
    clusters : bool
        Whether the device has thread block clusters (sm_90).
    smem_limit : int, default 0
        Most dynamic shared memory per CTA in bytes; 0 for no limit.

    Returns
    -------
    list of MatmulShape
        Each ``ops.sgemm_shape`` of a cut, the table's first; empty where sgemm is never launched.
    """
    if k % 4 or n % 4:
        return []
    first = ops.table_sgemm_shape(batch, k, n, clusters, smem_limit)
    if batch < ops.GEMM_MIN_BATCH and first is None:
        # Below GEMM_MIN_BATCH rows matmul_shape launches sgemm only through a table cut this
        # device can run: without one, every cut offered would be timed at a size that never runs it.
        return []
    out = [] if first is None else [first]
    for bm, bn, ks, minb in SGEMM_SWEEP:
        for split in (1, 2, 4, 8):
            parts = split * ks
            kc = ops._cdiv(ops._cdiv(k, parts), SGEMM_SWEEP_BK) * SGEMM_SWEEP_BK
            if kc * (parts - 1) >= k:  # an empty K part: wasted CTAs
                continue
            cut = ops.SgemmCut(bm, bn, SGEMM_SWEEP_BK, max(2, min(4, kc // SGEMM_SWEEP_BK + 1)), split, ks, minb)
            shape = ops.sgemm_shape(batch, k, n, cut)
            if ops.sgemm_fits(shape, clusters, smem_limit):
                out.append(shape)
    return out


def candidate_shapes(
    batch: int, width: int, multiprocessors: int, clusters: bool, smem_limit: int = 0
) -> list[ops.MatmulShape]:
    """Every cut of a (batch, width, width) product the kernels can run, the default first
    (sgemm cuts: :func:`sgemm_candidates`)."""
    default = ops.matmul_shape(batch, width, width, multiprocessors, clusters=clusters, smem_limit=smem_limit)
    out = [default]
    splits = (1, 2, 4, 8) if clusters else (1,)
    bt = 1
    while bt < min(batch, 8):
        bt *= 2
    for tc in ops.MATVEC_TILES[4]:
        for split in splits:
            if bt * tc <= 512 and width // split >= 8 * (32 // (tc // 4)):
                out.append(ops.matvec_shape(batch, width, width, multiprocessors, 4, clusters, tc, split))
    if batch >= ops.GEMM_MIN_BATCH:
        for tile_n in (64, 128):
            for split in splits:
                for slices, per_sm in ((2, 0), (1, 0), (1, 2)):
                    if width // split >= ops.GEMM_KC and (per_sm == 0 or split > 1):
                        out.append(
                            ops.gemm_shape(
                                batch, width, width, multiprocessors, clusters, split, tile_n, per_sm, slices
                            )
                        )
    out.extend(sgemm_candidates(batch, width, width, clusters, smem_limit))
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


def _label(s: ops.MatmulShape) -> str:
    if s.kernel == "sgemm":
        return (
            f"sgemm/{s.bt}x{s.tc}/k{s.bk}/st{s.stages}/s{s.split}/ks{s.slices}"
            + (f"/mb{s.minb}" if s.minb > 1 else "")
            + (f"/tm{s.tm}" if s.tm != 8 else "")
        )
    return (
        f"{s.kernel}/t{s.tc}/s{s.split}"
        + (f"/sl{s.slices}" if s.slices > 1 else "")
        + (f"/cap{s.per_sm}" if s.per_sm else "")
    )


def cublas_graph_samples(torch, tx, tws, ty, reps: int = REPS, repeats: int = 15) -> list[float]:
    """cuBLAS in a graph, as rawgraph's kernels are timed: a PyTorch graph of ``reps``
    ``torch.mm(tx, tws[i % len(tws)], out=ty)`` (rotating weights so the L2 cache does not hold
    them), replayed ``repeats`` times; device µs per ``mm`` per replay (CUDA events)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.mm(tx, tws[1 % len(tws)], out=ty)  # warm-up: cuBLAS handle and workspace
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for i in range(reps):
                torch.mm(tx, tws[i % len(tws)], out=ty)
        g.replay()
        s.synchronize()
        samples = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            g.replay()
            b.record(s)
            b.synchronize()
            samples.append(a.elapsed_time(b) * 1e3 / reps)
    del g
    return samples


def _torch_mm_us(torch, x, ws, batch: int, width: int) -> dict:
    tw = [torch.as_tensor(w, device="cuda") for w in ws]
    tx = torch.as_tensor(x, device="cuda")
    ty = torch.empty((batch, width), device="cuda")
    ref = (tx.double() @ tw[0].double()).float()
    torch.mm(tx, tw[0], out=ty)
    assert torch.linalg.norm(ty - ref) / torch.linalg.norm(ref) < 1e-5
    return stats(cublas_graph_samples(torch, tx, tw, ty))


def measure(widths=WIDTHS, batches=BATCHES, sweep: bool = False) -> dict:
    dev = get_device()
    stream = Stream()
    rng = np.random.default_rng()
    clusters = ops.has_clusters(dev)
    torch = None
    try:
        import torch as _torch

        if _torch.cuda.is_available():
            torch = _torch
            torch.backends.cuda.matmul.allow_tf32 = False
    except Exception:
        pass
    sms = dev.info.multiprocessors
    optin = dev.info.smem_per_block_optin
    # One NVRTC program per source for every instantiation the run needs, not one per shape.
    names: dict[str, set[str]] = {}
    for w in widths:
        for b in batches:
            default = ops.matmul_shape(b, w, w, sms, clusters=clusters, smem_limit=optin)
            for s in candidate_shapes(b, w, sms, clusters, optin) if sweep else [default]:
                for e in ("none", "relu", "add") if s == default or s.kernel != "sgemm" else ("none",):
                    names.setdefault(ops.matmul_file(s), set()).add(ops.matmul_expr(e, s))
    for file, exprs in sorted(names.items()):
        get_kernels(file, sorted(exprs), dev)
    bw = copy_bandwidth(stream)
    rows = []
    bar = SweepProgress(len(widths) * len(batches), "kernels")  # one step per row; --sweep names the cut
    for width in bar.over(widths):
        ws = _weights(width, dev.info.l2_bytes, stream)
        w0 = ws[0].to_numpy().astype(np.float64)
        for batch in batches:
            bar.step(f"width={width} batch={batch}")
            xh = rng.standard_normal((batch, width), dtype=np.float32)
            x = DeviceBuffer.from_numpy(xh)
            y = DeviceBuffer((batch, width))
            r = DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32))
            bufs = {"x": x.view(), "y": y.view(), "r": r.view()}
            bufs.update({f"W{i}": w.view() for i, w in enumerate(ws)})

            def chain(epi, shape=None, n=REPS, bufs=bufs, ws=ws):
                return [
                    ops.matmul(
                        dev, bufs, "x", f"W{i % len(ws)}", "y", epi, r="r" if epi == "add" else None, shape=shape
                    )
                    for i in range(n)
                ]

            # Correct before timed: the default cut against float64.
            y.poison(stream)
            chain("none", n=1)[0](stream)
            stream.synchronize()
            ref = xh.astype(np.float64) @ w0
            err = float(np.linalg.norm(y.to_numpy() - ref) / np.linalg.norm(ref))
            if not err < 1e-5:
                raise AssertionError(f"matmul w{width} b{batch}: relative error {err:.2e}")
            shape = ops.matmul_shape(batch, width, width, sms, clusters=clusters, smem_limit=optin)
            row = {
                "width": width,
                "batch": batch,
                "weights_rotated": len(ws),
                "rel_err": err,
                "shape": _label(shape),
                "ctas": shape.ctas,
            }
            for name, epi in (("matmul", "none"), ("matmul_relu", "relu"), ("matmul_add", "add")):
                launches = chain(epi)
                row[name] = _graph_time_us(launches, bufs, stream, pdl=clusters)
                row[name + "_kernel"] = launches[0].kernel.name
            row["early"] = int(launches[0].args["flags"]) & FLAG_EARLY
            if clusters:
                row["matmul_nopdl"] = _graph_time_us(chain("none"), bufs, stream, pdl=False)
                flipped = chain("none")
                for l in flipped:  # the successor launched at the other point: start vs after the K loop
                    l.args["flags"] = int(l.args["flags"]) ^ FLAG_EARLY
                row["matmul_other_trigger"] = _graph_time_us(flipped, bufs, stream, pdl=True)
            row["relu"] = _graph_time_us(
                [ops.relu(dev, bufs, "x", "y") for _ in range(REPS)], bufs, stream, pdl=clusters
            )
            row["add"] = _graph_time_us(
                [ops.add(dev, bufs, "x", "r", "y") for _ in range(REPS)], bufs, stream, pdl=clusters
            )
            if ops.block_fits(width, dev):
                pairs = [(f"W{(2 * i) % len(ws)}", f"W{(2 * i + 1) % len(ws)}") for i in range(REPS)]
                row["block"] = _graph_time_us(
                    [ops.block(dev, bufs, "x", a, b, "y") for a, b in pairs], bufs, stream, pdl=True
                )
                row["block_cluster4"] = _graph_time_us(
                    [ops.block(dev, bufs, "x", a, b, "y", cluster=4) for a, b in pairs], bufs, stream, pdl=True
                )
            if sweep:
                row["sweep"] = {}
                cands = candidate_shapes(batch, width, sms, clusters, optin)
                for j, cand in enumerate(cands, 1):
                    bar.detail(f"cut {j}/{len(cands)} {_label(cand)}")
                    row["sweep"][_label(cand)] = _graph_time_us(chain("none", cand), bufs, stream, pdl=clusters)[
                        "median"
                    ]
                row["sweep_best"] = min(row["sweep"], key=row["sweep"].get)
            nbytes = width * width * 4 + 2 * batch * width * 4
            t = row["matmul"]["median"]
            row["matmul_GBps"] = nbytes / (t * 1e-6) / 1e9
            row["matmul_frac_of_copy_bw"] = row["matmul_GBps"] / bw
            if torch is not None:
                row["torch_mm"] = _torch_mm_us(torch, x, ws, batch, width)
                row["matmul_vs_cublas"] = t / row["torch_mm"]["median"]
            rows.append(row)
            print(_line(row), flush=True)
            for b_ in (x, y, r):
                b_.close()
        for w in ws:
            w.close()
    return {"device": dev.info.name, "copy_GBps": bw, "reps_per_graph": REPS, "pdl": clusters, "rows": rows}


def _line(row: dict) -> str:
    t = row["matmul"]["median"]
    line = (
        f"w{row['width']:<5d} b{row['batch']:<3d} {row['shape']:15s} matmul {t:7.2f} us "
        f"({row['matmul_GBps']:6.0f} GB/s, {row['matmul_frac_of_copy_bw']:5.1%} of copy)"
    )
    if "matmul_nopdl" in row:
        line += (
            f" ({'early' if row['early'] else 'late'}; other {row['matmul_other_trigger']['median']:.2f},"
            f" nopdl {row['matmul_nopdl']['median']:.2f})"
        )
    if "torch_mm" in row:
        line += f"  torch.mm {row['torch_mm']['median']:7.2f} ratio {row['matmul_vs_cublas']:5.2f}"
    line += f"  relu {row['relu']['median']:.2f} add {row['add']['median']:.2f}"
    if "block" in row:
        pair = row["matmul_relu"]["median"] + row["matmul_add"]["median"]
        line += f"  block {row['block']['median']:.2f} (cluster 4: {row['block_cluster4']['median']:.2f}) vs fused pair {pair:.2f}"
    if "sweep" in row:
        best = row["sweep_best"]
        line += f"  best cut {best} {row['sweep'][best]:.2f}"
    return line


def targets(result: dict) -> str:
    """The kernels issue's matmul targets, met or missed, from one result."""
    lines = []
    for row in result["rows"]:
        limit = CUBLAS_RATIO_TARGET.get(row["batch"])
        if limit is not None and "matmul_vs_cublas" in row:
            ok = row["matmul_vs_cublas"] <= limit
            lines.append(
                f"matmul w{row['width']} b{row['batch']}: {row['matmul']['median']:.2f} / "
                f"{row['torch_mm']['median']:.2f} us = {row['matmul_vs_cublas']:.2f}x cuBLAS "
                f"(target <= {limit}x) {'met' if ok else 'MISSED'}"
            )
        if row["width"] == 4096 and row["batch"] == 1:
            ok = row["matmul_frac_of_copy_bw"] >= BANDWIDTH_TARGET
            lines.append(
                f"matmul w4096 b1: {row['matmul_frac_of_copy_bw']:.1%} of copy bandwidth "
                f"(target >= {BANDWIDTH_TARGET:.0%}) {'met' if ok else 'MISSED'}"
            )
    return "\n".join(lines)


DESCRIPTION = (
    "Kernel benchmark: device time per kernel (64 launches in one graph, weights rotated past L2), "
    "side by side with cuBLAS (torch.mm, TF32 off). Writes OUT/kernel_times.json; prints one "
    "row per shape and the targets."
)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``rawgraph bench kernels`` (parsing them needs no GPU)."""
    p = command.parser("rawgraph bench kernels", DESCRIPTION)
    p.add_argument("--out", default="benchmarks/results", help="folder for kernel_times.json")
    p.add_argument("--sweep", action="store_true", help="also time every other cut of each shape")
    p.add_argument(
        "--width", type=command.positive_int, nargs="+", help=f"widths to time (default: {' '.join(map(str, WIDTHS))})"
    )
    p.add_argument(
        "--batch",
        type=command.positive_int,
        nargs="+",
        help=f"batch sizes to time (default: {' '.join(map(str, BATCHES))})",
    )
    return p


def render(result: dict) -> str:
    """A kernel-times result as text: one line per shape, the copy bandwidth, the targets."""
    lines = [_line(row) for row in result["rows"]]
    lines.append(f"device-to-device copy: {result['copy_GBps']:.0f} GB/s (read + write)")
    lines.append(targets(result))
    return "\n".join(lines)


def collect(args: argparse.Namespace) -> dict:
    """Time every kernel (with ``--sweep`` every cut); write ``kernel_times.json``; return the result."""
    command.optional("torch", "torch", "the cuBLAS (torch.mm) columns")
    result = {
        "env": environment(),
        **measure(tuple(args.width or WIDTHS), tuple(args.batch or BATCHES), sweep=args.sweep),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_times.json").write_text(json.dumps(result, indent=1))
    print(f"json: {out / 'kernel_times.json'}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Time every kernel (with ``--sweep`` every cut), write ``kernel_times.json``; the rows and
    targets (or, with ``--json``, the result) on stdout, progress on stderr. Returns 0."""
    return command.run_suite(build_parser().parse_args(argv), collect, render)


if __name__ == "__main__":
    sys.exit(main())
