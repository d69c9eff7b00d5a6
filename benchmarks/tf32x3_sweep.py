"""tf32x3 sweep: the fp32-accurate tensor-core GEMM (``kernels/tf32x3.cu``) beside rawgraph's fp32
kernels, cuBLAS fp32 and TF32 (``torch.mm``) and Triton's tf32x3 (``tl.dot(input_precision=
"tf32x3")``), for y[M, N] = x[M, K] @ W[K, N] at serving shapes, in one process on the same inputs.

    PYTHONPATH=. python3 benchmarks/tf32x3_sweep.py --out $OUT --quick    # 8 shapes, < 2 min on an H100
    PYTHONPATH=. python3 benchmarks/tf32x3_sweep.py --out $OUT            # M = 64..256 step 8 x K = N 1024, 2048, 4096
    PYTHONPATH=. python3 benchmarks/tf32x3_sweep.py --rows 64:256:8 --widths 4096 --cut bm=128,bn=128,bk=32,stages=4,split=2

Rows per shape: ``tf32x3`` (the mma.sync cut ops.matmul launches at precision="tf32x3" where the
warpgroup table has no entry: the TF32X3_CUTS entry or the default rule) and up to ``--alternates`` other cuts (accumulation runs of 1 and 4
k8 steps and the two-accumulator form, other splits and column tiles) plus any ``--cut``;
``fp32`` (the cut ops.matmul launches at precision="fp32": sgemm's table cut or the matmul.cu
rule); ``cublas-fp32`` (TF32 off), ``cublas-tf32`` (TF32 on: faster, less accurate);
``triton-tf32x3`` (the fastest of a few block configurations; skipped with a message when triton
is missing); on compute capability 9.0, ``wgmma`` rows: the warpgroup kernel
(``kernels/tf32x3_wgmma.cu``) at the cut ops.matmul launches (its ``TF32X3_WGMMA_CUTS`` entry,
``launched`` in the JSON) where there is one, ``tf32x3_wgmma_default_cut``'s cut,
up to ``--wgmma-alternates`` other cuts of it, the two-run form's first guess (``runs=2``; left out by
``--no-wgmma-runs2``) and any ``--wgmma-cut`` (``--no-wgmma`` leaves them out). For each: device us (median and p10..p90), TFLOP/s, % of the TF32-derived ideal
(165 TFLOP/s: the dense TF32 tensor peak / 3) and of the fp32 peak (66.9), and the relative
Frobenius error against float64 on normal data and on rows of x scaled by 10^u, u uniform in
[-3, 3] (the worst row's error is in the JSON).

Method, as ``rawgraph/bench/kernel_times.py`` (whose helpers it uses): one captured graph of 64
launches (rawgraph's kernels as a chain of programmatic dependent launches, as its plans run),
rotating over enough weight copies to fill the L2 cache three times, replayed ``--repeats``
times after a warm-up replay, timed with CUDA events; the figure is the median over replays
divided by 64. torch and Triton run the same rotation as a PyTorch graph. Every tf32x3 cut is run
twice into a NaN-poisoned y and must agree bit for bit.

Verdicts per shape (the targets): tf32x3 at least 1.3x faster than cuBLAS fp32 (1.5x at K = N =
4096, M >= 128), faster than Triton tf32x3, with relative errors no worse than cuBLAS fp32's on
both data sets. ``best`` is the fastest mma.sync cut whose errors pass (the table ends with them as a
``rawgraph.ops.TF32X3_CUTS`` literal), ``best_wgmma`` the fastest such wgmma cut (the table then
prints ``rawgraph.ops.TF32X3_WGMMA_TABLE``: ``best_wgmma`` wherever it beat the mma.sync cut
launched there; ``--table JSON [JSON ...]`` prints it from runs' results, per shape the newest).

Output in ``--out``: ``tf32x3_sweep.json`` (``rawgraph.bench.provenance.environment()``: commit,
GPU; every figure) and ``tf32x3_sweep.txt`` (the table). ``--budget-s`` stops starting new shapes
after that many seconds (the shapes not run are listed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from itertools import product
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rawgraph.ops.gemm import (  # noqa: E402
    MAX_SPLIT,
    Tf32x3Cut,
    WgmmaCut,
    matmul_expr,
    tf32x3_cut,
    tf32x3_first_flush,
    tf32x3_shape,
    tf32x3_smem_bytes,
    tf32x3_wgmma_cut,
    tf32x3_wgmma_default_cut,
    tf32x3_wgmma_shape,
    tf32x3_wgmma_smem_bytes,
    wgmma_first_stages,
)

REPS = 64
WIDTHS = (1024, 2048, 4096)
ROWS = tuple(range(64, 257, 8))
QUICK = [(64, 1024), (128, 1024), (256, 1024), (64, 2048), (256, 2048), (64, 4096), (128, 4096), (256, 4096)]
# (fp32 FMA peak, dense TF32 tensor peak) in TFLOP/s by the device's name: the H100 SXM's, which
# the H200 shares (the same 132 SMs at the same clocks). Another GPU gets no percentages.
PEAKS_TFLOPS = {"NVIDIA H100 80GB HBM3": (66.9, 494.7), "NVIDIA H200": (66.9, 494.7)}


def peaks(gpu_name: str) -> tuple[float, float] | None:
    """(fp32 peak, tf32x3 ideal = dense TF32 peak / 3) for ``gpu_name``, or None where unknown."""
    found = PEAKS_TFLOPS.get(gpu_name)
    return None if found is None else (found[0], round(found[1] / 3, 1))


TARGET_VS_CUBLAS, TARGET_VS_CUBLAS_WIDE, WIDE = 1.3, 1.5, 4096  # the second from M >= 128 at K = N = WIDE
TRITON_CONFIGS = (
    (64, 64, 32, 4, 4),
    (64, 128, 32, 4, 3),
    (128, 128, 32, 8, 3),
    (32, 64, 32, 4, 4),
)  # BM BN BK warps stages


def log(msg: str) -> None:
    print(msg, flush=True)


# -- cuts ---------------------------------------------------------------------------------------


def _parse(text: str, record, rules):
    """``name=value,...`` as a ``record`` (a cut dataclass), checked by ``rules(bm, k, bn, cut)``."""
    fields = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in record.__dataclass_fields__:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected name=value with a name of {list(record.__dataclass_fields__)}"
            )
        fields[key.strip()] = int(value)
    try:
        cut = record(**fields)
        rules(cut.bm, 1024, cut.bn, cut)  # the kernel's rules
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return cut


def parse_cut(text: str) -> Tf32x3Cut:
    """``bm=128,bn=128,bk=32,stages=4[,split=..][,slices=..][,minb=..][,wm=..][,wn=..][,flush=..]``."""
    return _parse(text, Tf32x3Cut, tf32x3_shape)


def alternates(table: Tf32x3Cut, k: int, limit: int) -> list[Tf32x3Cut]:
    """Other cuts worth timing beside the table's: accumulation runs of 1 and 4 k8 steps and the
    two-accumulator form (accuracy against speed), half and twice the split, the other column
    tile; at most ``limit``, each one the kernel can be."""
    out: list[Tf32x3Cut] = []
    cands = [replace(table, flush=1), replace(table, flush=0)]
    if (table.bk // 8) % 4 == 0:
        cands.append(replace(table, flush=4))
    if table.split > 1:
        cands.append(replace(table, split=table.split // 2))
    if table.split < MAX_SPLIT and k // (2 * table.split) >= 4 * table.bk:
        cands.append(replace(table, split=table.split * 2))
    cands.append(replace(table, bn=64 if table.bn == 128 else 128))
    for c in cands:
        try:
            tf32x3_shape(c.bm, k, c.bn, c)
        except ValueError:
            continue
        if c != table and c not in out:
            out.append(c)
    return out[:limit]


def parse_wgmma_cut(text: str) -> WgmmaCut:
    """``bm=128,bn=128,bk=32,stages=4[,split=..][,minb=..][,flush=..]`` (a :class:`WgmmaCut`)."""
    return _parse(text, WgmmaCut, tf32x3_wgmma_shape)


def wgmma_alternates(cut: WgmmaCut, k: int, limit: int) -> list[WgmmaCut]:
    """Other warpgroup cuts worth timing beside the default rule's: the other row tile, BK 16 / 32,
    the other column tile, half and twice the split, runs of 1, 3 stages; at most ``limit``, each
    one the kernel can be."""
    out: list[WgmmaCut] = []
    cands = [
        replace(cut, bm=64 if cut.bm == 128 else 128),
        replace(cut, bk=16 if cut.bk == 32 else 32),
        replace(cut, bn=64 if cut.bn == 128 else 128),
    ]
    if cut.split > 1:
        cands.append(replace(cut, split=cut.split // 2))
    if cut.split < MAX_SPLIT and k // (2 * cut.split) >= 4 * cut.bk:
        cands.append(replace(cut, split=cut.split * 2))
    cands += [replace(cut, flush=1), replace(cut, stages=3)]
    for c in cands:
        try:
            tf32x3_wgmma_shape(c.bm, k, c.bn, c)
        except ValueError:
            continue
        if c != cut and c not in out:
            out.append(c)
    return out[:limit]


def wgmma_search(m: int, k: int, multiprocessors: int, smem_limit: int) -> list[WgmmaCut]:
    """Every one-run warpgroup cut of ``bm`` 64 or 128, ``bn`` 64, 96 or 128, ``bk`` 16 or 32 and a
    cluster split of 1, 2, 3, 4, 6 or 8 (stages and ``flush`` as the first-guess rule takes them)
    whose grid has between half and twice as many CTAs as SMs, each one the kernel can be (N = K, as
    in the grid). The sweep times those of them that take one wave: a grid of clusters of 4 CTAs of
    one an SM runs 30 at once on an H100 (each must fit one GPC), so 32 of them take two, and a
    cut's rank depends on that as much as on its tile. 96 columns and splits of 3 and 6 give grid
    sizes between the powers of two's (at K = N = 4096, M = 128: 96 CTAs in 32 clusters of 3)."""
    out: list[WgmmaCut] = []
    for bm, bn, bk, split in product((64, 128), (64, 96, 128), (16, 32), (1, 2, 3, 4, 6, 8)):
        ctas = -(-m // bm) * -(-k // bn) * split
        if not multiprocessors / 2 <= ctas <= 2 * multiprocessors:
            continue
        stages = wgmma_first_stages(bm, bn, bk, split, smem_limit)
        cut = WgmmaCut(bm=bm, bn=bn, bk=bk, stages=stages, split=split, slices=1, minb=1, flush=tf32x3_first_flush(k))
        try:
            tf32x3_wgmma_shape(m, k, k, cut)
        except ValueError:
            continue
        out.append(cut)
    return out


def wlabel(cut: WgmmaCut) -> str:
    return (
        f"wg {cut.bm}x{cut.bn}/k{cut.bk}/st{cut.stages}/s{cut.split}/f{cut.flush}"
        + (f"/mb{cut.minb}" if cut.minb > 1 else "")
        + (f"/r{cut.runs}" if cut.runs > 1 else "")
    )


def label(cut: Tf32x3Cut) -> str:
    return f"{cut.bm}x{cut.bn}/k{cut.bk}/st{cut.stages}/s{cut.split}/ks{cut.slices}/w{cut.wm}x{cut.wn}/f{cut.flush}" + (
        f"/mb{cut.minb}" if cut.minb > 1 else ""
    )


def _warm_one(args):
    """Worker: compile one name expression through rawgraph's compiler, filling its disk cache
    with exactly the entry get_kernel looks up."""
    file, name, arch = args
    from rawgraph.runtime.compiler import DEFAULT_OPTIONS, compile_source
    from rawgraph.runtime.module import kernel_source

    t0 = time.perf_counter()
    try:
        compile_source(kernel_source(file), f"{file}.cu", arch, [name], DEFAULT_OPTIONS)
        return name, time.perf_counter() - t0, None
    except Exception as exc:  # noqa: BLE001 - reported per name
        return name, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"


def warm_compile(jobs: list[tuple[str, str]], arch: str, workers: int) -> None:
    import multiprocessing

    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # never fork a process holding CUDA or torch threads
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=ctx) as ex:
        for name, _secs, err in ex.map(_warm_one, [(f, n, arch) for f, n in jobs]):
            if err:
                log(f"  compile FAILED {name}: {err}")
    log(f"compiled {len(jobs)} kernels for {arch} in {time.perf_counter() - t0:.1f} s ({workers} workers)")


# -- Triton ---------------------------------------------------------------------------------------


def triton_kernel():
    """A plain Triton matmul with tl.dot(input_precision="tf32x3"), or None without triton."""
    try:
        import triton
        import triton.language as tl
    except Exception as exc:  # noqa: BLE001
        log(f"triton unavailable ({exc}): no Triton row")
        return None

    @triton.jit
    def mm_tf32x3(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_bk,
        stride_cm,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BM)
        num_n = tl.cdiv(N, BN)
        group = GROUP_M * num_n
        first_m = (pid // group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % group) % size_m
        pid_n = (pid % group) // size_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        a = a_ptr + rm[:, None] * stride_am + rk[None, :]
        b = b_ptr + rk[:, None] * stride_bk + rn[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            av = tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0.0)
            bv = tl.load(b, mask=(rk[:, None] + k0 < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(av, bv, acc, input_precision="tf32x3")
            a += BK
            b += BK * stride_bk
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    return mm_tf32x3


class MmAs:
    """torch's namespace with ``mm`` computed by another function: lets
    ``kernel_times.cublas_graph_samples`` time it exactly as it times cuBLAS."""

    def __init__(self, torch, fn):
        self.cuda = torch.cuda
        self._fn = fn

    def mm(self, a, b, out):
        self._fn(a, b, out)


# -- the sweep ------------------------------------------------------------------------------------


def rel_errs(y: np.ndarray, ref: np.ndarray) -> dict:
    d = y.astype(np.float64) - ref
    rows = np.linalg.norm(d, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-300)
    finite = bool(np.all(np.isfinite(y)))
    return {
        "fro": float(np.linalg.norm(d) / np.linalg.norm(ref)) if finite else float("inf"),
        "worst_row": float(rows.max()) if finite else float("inf"),
    }


class Sweep:
    def __init__(self, a):
        from rawgraph import Stream, get_device
        from rawgraph.bench.kernel_times import _graph_time_us, cublas_graph_samples, launch_waves

        self.a = a
        self.dev = get_device()
        self.stream = Stream()
        self.sms = self.dev.info.multiprocessors
        self.peaks = peaks(self.dev.info.name)
        self.graph_time_us = _graph_time_us
        self.launch_waves = launch_waves
        self.cublas_graph_samples = cublas_graph_samples
        self.t0 = time.perf_counter()
        self.torch = None
        try:
            import torch

            if torch.cuda.is_available():
                self.torch = torch
        except Exception as exc:  # noqa: BLE001
            log(f"torch unavailable ({exc}): no cuBLAS or Triton rows")
        self.triton = triton_kernel() if self.torch is not None else None
        self.kernel_info: dict[str, dict] = {}
        from rawgraph import ops

        self.wgmma = ops.wgmma_available(self.dev) and not a.no_wgmma

    def over_budget(self) -> bool:
        return time.perf_counter() - self.t0 > self.a.budget_s

    # -- inputs of one width -------------------------------------------------------------------
    def make_data(self, width: int, mmax: int) -> dict:
        from rawgraph import DeviceBuffer

        rng = np.random.default_rng(self.a.seed + width)
        xn = rng.standard_normal((mmax, width), dtype=np.float32)
        xs = (xn * 10.0 ** rng.uniform(-3, 3, size=(mmax, 1))).astype(np.float32)
        lim = math.sqrt(3.0 / width)
        wh = rng.uniform(-lim, lim, size=(width, width)).astype(np.float32)
        count = int(min(REPS, max(2, -(-3 * self.dev.info.l2_bytes // (width * width * 4)))))
        d = {
            "xh": {"normal": xn, "scaled": xs},
            "wh": wh,
            "count": count,
            "x": {"normal": DeviceBuffer.from_numpy(xn), "scaled": DeviceBuffer.from_numpy(xs)},
            "ws": [DeviceBuffer.from_numpy(wh) for _ in range(count)],
            "y": DeviceBuffer((mmax, width)),
        }
        if self.torch is not None:
            t = self.torch
            tw = t.from_numpy(wh).cuda()
            d["tws"] = [tw] + [tw.clone() for _ in range(count - 1)]
            d["tx"] = {kind: t.from_numpy(v).cuda() for kind, v in d["xh"].items()}
            d["ref"] = {kind: (v.double() @ tw.double()).cpu().numpy() for kind, v in d["tx"].items()}
        else:
            d["ref"] = {kind: v.astype(np.float64) @ wh.astype(np.float64) for kind, v in d["xh"].items()}
        return d

    def free_data(self, d: dict) -> None:
        for b in [*d["x"].values(), *d["ws"], d["y"]]:
            b.close()
        d.clear()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    # -- one implementation ----------------------------------------------------------------------
    def figures(self, m: int, w: int, st: dict) -> dict:
        flop = 2.0 * m * w * w
        tflops = flop / st["median"] / 1e6
        return {
            "us": st["median"],
            "p10": st["p10"],
            "p90": st["p90"],
            "tflops": tflops,
            "pct_tf32x3_ideal": None if self.peaks is None else 100 * tflops / self.peaks[1],
            "pct_fp32_peak": None if self.peaks is None else 100 * tflops / self.peaks[0],
        }

    def ours(self, m: int, w: int, d: dict, precision: str, shape=None, max_waves: int | None = None) -> dict:
        """A rawgraph cut (``shape``, or ops.matmul's own at ``precision``): errors on both data
        sets, two runs bit for bit (tf32x3), then the timed PDL chain. With ``max_waves``, a cut
        whose grid takes more waves is not run: its record has ``skipped`` and the waves."""
        from cuda.bindings import driver

        from rawgraph import ops
        from rawgraph.runtime.errors import call
        from rawgraph.runtime.memory import DeviceArray

        f32 = np.dtype(np.float32)
        views = {f"W{i}": b.view() for i, b in enumerate(d["ws"])}
        views["y"] = DeviceArray(d["y"].ptr, (m, w), f32, d["y"])
        rec: dict = {}
        try:
            for kind in ("normal", "scaled"):
                views["x"] = DeviceArray(d["x"][kind].ptr, (m, w), f32, d["x"][kind])
                launch = ops.matmul(self.dev, views, "x", "W0", "y", shape=shape, precision=precision)
                if kind == "normal":  # one grid for both data sets: its waves, once
                    rec.update(self.launch_waves(launch, self.sms))
                    if max_waves is not None and rec.get("waves", max_waves + 1) > max_waves:
                        rec["skipped"] = f"{rec['waves']} waves" if "waves" in rec else rec["waves_error"]
                        return rec
                outs = []
                for _ in range(2 if precision == "tf32x3" else 1):
                    d["y"].poison(self.stream)
                    launch(self.stream)
                    outs.append(d["y"].to_numpy(self.stream)[:m])
                rec[f"err_{kind}"] = rel_errs(outs[0], d["ref"][kind][:m])
                if len(outs) > 1 and not np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)):
                    rec["deterministic"] = False
            rec.setdefault("deterministic", True)
            k = launch.kernel
            rec["kernel"] = k.name
            if k.name not in self.kernel_info:
                attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
                self.kernel_info[k.name] = {
                    "registers": k.registers,
                    "local_bytes": int(call(driver.cuFuncGetAttribute, attr, k.handle)),
                }
            rec.update(self.kernel_info[k.name])
            views["x"] = DeviceArray(d["x"]["normal"].ptr, (m, w), f32, d["x"]["normal"])
            launches = [
                ops.matmul(self.dev, views, "x", f"W{i % d['count']}", "y", shape=shape, precision=precision)
                for i in range(REPS)
            ]
            rec.update(self.figures(m, w, self.graph_time_us(launches, views, self.stream, True, self.a.repeats)))
        except Exception as exc:  # noqa: BLE001 - one cut's failure is a finding, not the end of the sweep
            rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec

    def torch_row(self, m: int, w: int, d: dict, mm, name: str, repeats: int | None = None) -> dict:
        """``mm(a, b, out)`` (torch.mm or the Triton kernel): errors on both data sets, the timed graph."""
        t = self.torch
        rec: dict = {"kernel": name}
        try:
            ty = t.empty((m, w), device="cuda", dtype=t.float32)
            for kind in ("normal", "scaled"):
                ty.fill_(float("nan"))
                mm.mm(d["tx"][kind][:m], d["tws"][0], out=ty)
                t.cuda.synchronize()
                rec[f"err_{kind}"] = rel_errs(ty.cpu().numpy(), d["ref"][kind][:m])
            samples = self.cublas_graph_samples(
                mm, d["tx"]["normal"][:m], d["tws"], ty, REPS, repeats or self.a.repeats
            )
            a = np.asarray(samples)
            rec.update(
                self.figures(
                    m,
                    w,
                    {
                        "median": float(np.median(a)),
                        "p10": float(np.percentile(a, 10)),
                        "p90": float(np.percentile(a, 90)),
                    },
                )
            )
        except Exception as exc:  # noqa: BLE001
            rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec

    def triton_rows(self, m: int, w: int, d: dict) -> dict | None:
        """The fastest of TRITON_CONFIGS (each timed with 3 replays, the winner again with --repeats)."""
        if self.triton is None:
            return None
        kern, best = self.triton, None
        for bm, bn, bk, warps, stages in TRITON_CONFIGS:

            def run(a, b, out, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages):
                grid = (-(-a.shape[0] // bm) * -(-b.shape[1] // bn),)
                kern[grid](
                    a,
                    b,
                    out,
                    a.shape[0],
                    b.shape[1],
                    a.shape[1],
                    a.stride(0),
                    b.stride(0),
                    out.stride(0),
                    BM=bm,
                    BN=bn,
                    BK=bk,
                    GROUP_M=8,
                    num_warps=warps,
                    num_stages=stages,
                )

            mm = MmAs(self.torch, run)
            rec = self.torch_row(m, w, d, mm, f"triton tf32x3 {bm}x{bn}x{bk} w{warps} s{stages}", repeats=3)
            if "us" in rec and (best is None or rec["us"] < best[0]["us"]):
                best = (rec, mm)
        if best is None:
            return rec
        return self.torch_row(m, w, d, best[1], best[0]["kernel"])

    def shape_row(self, m: int, w: int, d: dict) -> dict:
        from rawgraph import ops

        row: dict = {"M": m, "K": w, "N": w, "flop": 2.0 * m * w * w, "weights_rotated": d["count"]}
        table = tf32x3_cut(
            ops.matmul_shape(m, w, w, self.sms, precision="tf32x3", smem_limit=self.dev.info.smem_per_block_optin)
        )
        cuts = [table] + alternates(table, w, self.a.alternates) + [c for c in self.a.cut if c != table]
        row["tf32x3"] = []
        for i, cut in enumerate(cuts):
            rec = {
                "cut": label(cut),
                "values": asdict(cut),
                "table": i == 0,
                "smem": tf32x3_smem_bytes(cut.bm, cut.bn, cut.bk, cut.stages, cut.split, cut.slices),
            }
            rec.update(self.ours(m, w, d, "tf32x3", tf32x3_shape(m, w, w, cut)))
            row["tf32x3"].append(rec)
        if self.wgmma:
            row["wgmma"] = []
            launched = self.wgmma_launched(m, w)
            listed = self.wgmma_cuts(m, w)
            extras = self.wgmma_extras(m, w, listed)
            row["wgmma_skipped"] = []
            for i, cut in enumerate(listed + extras):
                rec = {
                    "cut": wlabel(cut),
                    "values": asdict(cut),
                    "table": i == 0,
                    "launched": cut == launched,
                    "smem": tf32x3_wgmma_smem_bytes(cut.bm, cut.bn, cut.bk, cut.stages, cut.split, cut.runs),
                }
                max_waves = 1 if i >= len(listed) else None
                rec.update(self.ours(m, w, d, "tf32x3", tf32x3_wgmma_shape(m, w, w, cut), max_waves))
                (row["wgmma_skipped"] if "skipped" in rec else row["wgmma"]).append(rec)
        row["fp32"] = self.ours(m, w, d, "fp32")
        if self.torch is not None:
            t = self.torch
            t.backends.cuda.matmul.allow_tf32 = False
            row["cublas_fp32"] = self.torch_row(m, w, d, t, "cublas fp32")
            t.backends.cuda.matmul.allow_tf32 = True
            row["cublas_tf32"] = self.torch_row(m, w, d, t, "cublas tf32")
            t.backends.cuda.matmul.allow_tf32 = False
            tri = self.triton_rows(m, w, d)
            if tri is not None:
                row["triton_tf32x3"] = tri
        judge(row)
        return row

    def wgmma_cuts(self, m: int, w: int) -> list[WgmmaCut]:
        """The warpgroup cuts timed at (m, w): the one ops.matmul launches there (its
        TF32X3_WGMMA_CUTS entry) or, without one, the default rule's; then the default rule's cut
        and its alternates, the two-run form's first guess (``runs=2``, unless --no-wgmma-runs2)
        and --wgmma-cut, each timed whatever its waves."""
        optin = self.dev.info.smem_per_block_optin
        first = tf32x3_wgmma_default_cut(m, w, w, self.sms, True, optin)
        rest = [first, *wgmma_alternates(first, w, self.a.wgmma_alternates)]
        if not self.a.no_wgmma_runs2:
            rest.append(tf32x3_wgmma_default_cut(m, w, w, self.sms, True, optin, runs=2))
        rest += list(self.a.wgmma_cut)
        lead = self.wgmma_launched(m, w) or first
        return [lead] + [c for c in dict.fromkeys(rest) if c != lead]

    def wgmma_extras(self, m: int, w: int, listed: list[WgmmaCut]) -> list[WgmmaCut]:
        """With --wgmma-search, the :func:`wgmma_search` cuts not in ``listed``: each timed only
        where its grid takes one wave."""
        if not self.a.wgmma_search:
            return []
        return [c for c in wgmma_search(m, w, self.sms, self.dev.info.smem_per_block_optin) if c not in listed]

    def wgmma_launched(self, m: int, w: int) -> WgmmaCut | None:
        """The warpgroup cut ops.matmul launches at (m, w) with precision="tf32x3", if any."""
        from rawgraph import ops

        optin = self.dev.info.smem_per_block_optin
        shape = ops.matmul_shape(m, w, w, self.sms, precision="tf32x3", smem_limit=optin, wgmma=True)
        return tf32x3_wgmma_cut(shape) if shape.kernel == "tf32x3_wgmma" else None

    def run(self, shapes: list[tuple[int, int]]) -> dict:
        from rawgraph import ops
        from rawgraph.bench.provenance import environment

        optin = self.dev.info.smem_per_block_optin
        jobs = set()
        for m, w in shapes:
            table = tf32x3_cut(ops.matmul_shape(m, w, w, self.sms, precision="tf32x3", smem_limit=optin))
            for cut in [table] + alternates(table, w, self.a.alternates) + list(self.a.cut):
                jobs.add(("tf32x3", matmul_expr("none", tf32x3_shape(m, w, w, cut))))
            fp = ops.matmul_shape(m, w, w, self.sms, smem_limit=optin)
            jobs.add((ops.matmul_file(fp), matmul_expr("none", fp)))
            if self.wgmma:
                listed = self.wgmma_cuts(m, w)
                for cut in listed + self.wgmma_extras(m, w, listed):
                    jobs.add(("tf32x3_wgmma", matmul_expr("none", tf32x3_wgmma_shape(m, w, w, cut))))
        warm_compile(sorted(jobs), self.dev.arch, self.a.jobs)
        log(
            f"{self.dev.info.name}: {self.sms} SMs; seed {self.a.seed}; torch {'yes' if self.torch else 'no'}; "
            f"triton {'yes' if self.triton else 'no'}; wgmma {'yes' if self.wgmma else 'no'}; {len(shapes)} shapes"
        )
        rows, not_run = [], []
        mmax = max(m for m, _ in shapes)
        for width in dict.fromkeys(w for _, w in shapes):
            if self.over_budget():
                not_run += [s for s in shapes if s[1] == width]
                continue
            d = self.make_data(width, mmax)
            for m, w in [s for s in shapes if s[1] == width]:
                if self.over_budget():
                    not_run.append((m, w))
                    continue
                t0 = time.perf_counter()
                row = self.shape_row(m, w, d)
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                log(line(row) + f"  [{row['seconds']:.1f} s]")
            self.free_data(d)
        if not_run:
            log(f"budget of {self.a.budget_s:.0f} s spent: {len(not_run)} shapes not run")
        env = environment(gpu_name=self.dev.info.name, sms=self.sms)
        return {
            "environment": env,
            "commit": env["commit"],
            "gpu": self.dev.info.name,
            "seed": self.a.seed,
            "reps_per_graph": REPS,
            "repeats": self.a.repeats,
            "tf32x3_ideal_tflops": None if self.peaks is None else self.peaks[1],
            "fp32_peak_tflops": None if self.peaks is None else self.peaks[0],
            "kernels": self.kernel_info,
            "rows": rows,
            "not_run": [list(s) for s in not_run],
            "seconds": time.perf_counter() - self.t0,
        }


# -- verdicts and the table ---------------------------------------------------------------------


def _errs_ok(rec: dict, ref: dict | None) -> bool:
    """Both errors no worse than ``ref``'s (cuBLAS fp32, else rawgraph's fp32 kernel)."""
    if "err_normal" not in rec or ref is None or "err_normal" not in ref:
        return False
    return all(rec[f"err_{k}"]["fro"] <= ref[f"err_{k}"]["fro"] for k in ("normal", "scaled"))


def judge(row: dict) -> None:
    """Per shape: which tf32x3 cuts pass the accuracy gate, the fastest of them (``best``), and the
    targets for the table's cut and for ``best``."""
    ref = row.get("cublas_fp32") if "err_normal" in row.get("cublas_fp32", {}) else row.get("fp32")
    for rec in row["tf32x3"]:
        rec["accurate"] = _errs_ok(rec, ref) and rec.get("deterministic", False)
    good = [r for r in row["tf32x3"] if r["accurate"] and "us" in r]
    row["best"] = min(good, key=lambda r: r["us"]) if good else None
    for rec in row.get("wgmma", []):
        rec["accurate"] = _errs_ok(rec, ref) and rec.get("deterministic", False)
    wgood = [r for r in row.get("wgmma", []) if r["accurate"] and "us" in r]
    row["best_wgmma"] = min(wgood, key=lambda r: r["us"]) if wgood else None
    cub = row.get("cublas_fp32", {}).get("us")
    tri = row.get("triton_tf32x3", {}).get("us")
    need = TARGET_VS_CUBLAS_WIDE if (row["K"] == WIDE and row["M"] >= 128) else TARGET_VS_CUBLAS
    verdicts = [("table", row["tf32x3"][0]), ("best", row["best"])]
    if "wgmma" in row:
        verdicts.append(("best_wgmma", row["best_wgmma"]))
    for key, rec in verdicts:
        if not rec or "us" not in rec:
            row[f"verdict_{key}"] = "no result"
            continue
        v = {
            "accurate": rec["accurate"],
            "speedup_vs_cublas_fp32": cub / rec["us"] if cub else None,
            "needed_vs_cublas_fp32": need,
            "faster_than_triton": (rec["us"] < tri) if tri else None,
        }
        v["meets_targets"] = bool(
            v["accurate"]
            and v["speedup_vs_cublas_fp32"]
            and v["speedup_vs_cublas_fp32"] >= need
            and v["faster_than_triton"] is not False
        )
        row[f"verdict_{key}"] = v


def _cell(rec: dict | None) -> str:
    if not rec:
        return "-"
    if "us" not in rec:
        return f"FAILED ({rec.get('error', 'no time')[:60]})"
    en, es = rec.get("err_normal", {}).get("fro", float("nan")), rec.get("err_scaled", {}).get("fro", float("nan"))
    return (
        f"{rec['us']:8.2f} us [{rec['p10']:7.2f}..{rec['p90']:7.2f}] {rec['tflops']:6.1f} TF/s "
        f"{_pct(rec['pct_tf32x3_ideal'])} {_pct(rec['pct_fp32_peak'])}  err {en:.2e} {es:.2e}"
    )


def _waves(rec: dict) -> str:
    return f"  {rec['waves']} waves" if rec.get("waves", 1) > 1 else ""


def line(row: dict) -> str:
    s = f"M={row['M']:<4d} K=N={row['K']:<5d}"
    b, t = row.get("best"), row["tf32x3"][0]
    s += f" tf32x3 {t.get('us', float('nan')):8.2f} us"
    if b:
        s += f" best {b['us']:8.2f} ({b['cut']})"
    bw = row.get("best_wgmma")
    if bw:
        s += f" wgmma {bw['us']:8.2f} ({bw['cut']})"
    for key in ("fp32", "cublas_fp32", "cublas_tf32", "triton_tf32x3"):
        if "us" in row.get(key, {}):
            s += f" | {key} {row[key]['us']:.2f}"
    v = row.get("verdict_best")
    if isinstance(v, dict) and v["speedup_vs_cublas_fp32"]:
        s += f" | x{v['speedup_vs_cublas_fp32']:.2f} vs cuBLAS fp32 {'ok' if v['meets_targets'] else 'MISSED'}"
    return s


def _pct(v: float | None) -> str:
    return "    --" if v is None else f"{v:5.1f}%"


def table(result: dict) -> str:
    out = [
        f"tf32x3 sweep, {result['gpu']}, commit {result['commit']}; us median [p10..p90], TFLOP/s, % of "
        f"{result.get('tf32x3_ideal_tflops') or '(unknown)'} (TF32 peak / 3), % of fp32 peak "
        f"{result.get('fp32_peak_tflops') or '(unknown)'}, relative Frobenius error vs float64 (normal, scaled rows)",
        "",
    ]
    missed = []
    for row in result["rows"]:
        out.append(f"M={row['M']} K=N={row['K']}")
        for rec in row["tf32x3"]:
            tag = "tf32x3 table" if rec["table"] else "tf32x3 alt"
            mark = "" if rec.get("accurate") else "  (error above cuBLAS fp32's or not deterministic)"
            regs = (
                f" r{rec['registers']}" + (f" spill {rec['local_bytes']}B" if rec.get("local_bytes") else "")
                if "registers" in rec
                else ""
            )
            out.append(f"  {tag:<14s} {rec['cut']:<40s}{regs:<14s} {_cell(rec)}{_waves(rec)}{mark}")
        for rec in row.get("wgmma", []):
            tag = "wgmma table" if rec.get("launched") else "wgmma default" if rec["table"] else "wgmma alt"
            mark = "" if rec.get("accurate") else "  (error above cuBLAS fp32's or not deterministic)"
            regs = (
                f" r{rec['registers']}" + (f" spill {rec['local_bytes']}B" if rec.get("local_bytes") else "")
                if "registers" in rec
                else ""
            )
            out.append(f"  {tag:<14s} {rec['cut']:<40s}{regs:<14s} {_cell(rec)}{_waves(rec)}{mark}")
        for key in ("fp32", "cublas_fp32", "cublas_tf32", "triton_tf32x3"):
            if key in row:
                out.append(f"  {key:<14s} {row[key].get('kernel', '')[:40]:<40s}{'':<14s} {_cell(row[key])}")
        for key in ("table", "best", "best_wgmma"):
            v = row.get(f"verdict_{key}")
            if isinstance(v, dict):
                sp = v["speedup_vs_cublas_fp32"]
                out.append(
                    f"  verdict {key}: "
                    + (f"{sp:.2f}x cuBLAS fp32 (need {v['needed_vs_cublas_fp32']}x)" if sp else "no cuBLAS")
                    + f", faster than Triton: {v['faster_than_triton']}, accurate: {v['accurate']}"
                    + ("" if v["meets_targets"] else "  MISSED")
                )
                if key == "best" and not v["meets_targets"]:
                    missed.append((row["M"], row["K"]))
            elif key == "best":
                missed.append((row["M"], row["K"]))
        out.append("")
    out.append(f"targets missed by the best accurate cut at {missed}" if missed else "every shape met its targets")
    has_wgmma = any("wgmma" in row for row in result["rows"])
    if has_wgmma:
        met = [row for row in result["rows"] if (row.get("verdict_best_wgmma") or {}).get("meets_targets")]
        skipped = sum(len(row.get("wgmma_skipped", [])) for row in result["rows"])
        timed = sum(len(row.get("wgmma", [])) for row in result["rows"])
        out.append(
            f"best accurate wgmma cut: targets met at {len(met)} of {len(result['rows'])} shapes; "
            f"{timed} wgmma cuts timed, {skipped} skipped for taking more than one wave"
        )
    if result.get("not_run"):
        out.append(f"not run (budget): {result['not_run']}")
    out.append("")
    out.append(cuts_literal(result))
    if has_wgmma:
        out.append(wgmma_table(result))
    return "\n".join(out)


def cuts_literal(result: dict) -> str:
    """The best accurate cut per shape as a ``rawgraph.ops.TF32X3_CUTS`` literal."""
    lines = ["TF32X3_CUTS: dict[tuple[int, int, int], Tf32x3Cut] = {"]
    for row in sorted(result["rows"], key=lambda r: (r["K"], r["M"])):
        b = row.get("best")
        if b:
            args = ", ".join(f"{k}={v}" for k, v in b["values"].items())
            lines.append(f"    ({row['M']}, {row['K']}, {row['N']}): Tf32x3Cut({args}),  # {b['us']:.2f} us")
    lines.append("}")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------


def parse_rows(items: list[str]) -> list[int]:
    out: list[int] = []
    for it in items:
        if ":" in it:
            lo, hi, step = (int(v) for v in it.split(":"))
            out.extend(range(lo, hi + 1, step))
        else:
            out.append(int(it))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results", help="folder for tf32x3_sweep.json and .txt")
    p.add_argument("--quick", action="store_true", help=f"the shapes {QUICK}")
    p.add_argument("--rows", nargs="+", default=None, help="M values or lo:hi:step (default 64:256:8)")
    p.add_argument("--widths", nargs="+", type=int, default=None, help="K = N values (default 1024 2048 4096)")
    p.add_argument("--cut", type=parse_cut, action="append", default=[], help="also time this cut at every shape")
    p.add_argument("--alternates", type=int, default=None, help="other tf32x3 cuts per shape (default 4, quick 5)")
    p.add_argument("--repeats", type=int, default=None, help="graph replays per figure (default 5, quick 7)")
    p.add_argument(
        "--budget-s", type=float, default=None, help="start no new shape after this (default 440, quick 100)"
    )
    p.add_argument("--wgmma-cut", type=parse_wgmma_cut, action="append", default=[], help="also time this wgmma cut")
    p.add_argument("--wgmma-alternates", type=int, default=None, help="other wgmma cuts per shape (default 3, quick 3)")
    p.add_argument("--wgmma-search", action="store_true", help="also time every wgmma_search cut that takes one wave")
    p.add_argument("--no-wgmma", action="store_true", help="leave out the warpgroup kernel's rows")
    p.add_argument("--no-wgmma-runs2", action="store_true", help="leave out the two-runs-in-flight wgmma row (runs=2)")
    p.add_argument("--jobs", type=int, default=8, help="NVRTC compile processes")
    p.add_argument("--seed", type=int, default=20261207)
    p.add_argument(
        "--table",
        metavar="JSON",
        nargs="+",
        default=None,
        help="print TF32X3_WGMMA_TABLE from sweeps' results (oldest first: per shape the newest row) and stop",
    )
    return p


def wgmma_table(result: dict) -> str:
    """``rawgraph.ops.TF32X3_WGMMA_TABLE`` from a sweep's results: at each shape, the fastest wgmma
    cut that passed the accuracy gate, where it beat the mma.sync cut launched there."""
    from rawgraph import ops

    cuts = {}
    for row in result["rows"]:
        best = row.get("best_wgmma")
        mma = next((c for c in row["tf32x3"] if c["table"]), None)
        if best and best.get("accurate") and mma and "us" in mma and best["us"] < mma["us"]:
            cuts[(row["M"], row["K"], row["N"])] = WgmmaCut(**best["values"])
    return 'TF32X3_WGMMA_TABLE = """\n' + ops.format_cut_table(cuts, WgmmaCut) + '\n"""'


def grid_shapes(a) -> list[tuple[int, int]]:
    if a.quick and a.rows is None and a.widths is None:
        return list(QUICK)
    rows = parse_rows(a.rows) if a.rows else list(ROWS)
    widths = a.widths or list(WIDTHS)
    return [(m, w) for w in widths for m in rows]


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.table:
        rows: dict = {}
        for path in a.table:
            rows.update({(r["M"], r["K"], r["N"]): r for r in json.loads(Path(path).read_text())["rows"]})
        print(wgmma_table({"rows": list(rows.values())}))
        return 0
    a.alternates = a.alternates if a.alternates is not None else (5 if a.quick else 4)
    a.repeats = a.repeats or (7 if a.quick else 5)
    a.wgmma_alternates = a.wgmma_alternates if a.wgmma_alternates is not None else 3
    a.budget_s = a.budget_s or (100.0 if a.quick else 440.0)
    from rawgraph.runtime.device import gpu_available

    if not gpu_available():
        log("tf32x3_sweep: no GPU here; nothing measured")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = Sweep(a).run(grid_shapes(a))
    (out / "tf32x3_sweep.json").write_text(json.dumps(result, indent=1, default=str))
    text = table(result)
    (out / "tf32x3_sweep.txt").write_text(text + "\n")
    log(text)
    log(f"wrote {out / 'tf32x3_sweep.json'} and {out / 'tf32x3_sweep.txt'} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
