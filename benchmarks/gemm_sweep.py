"""fp32 GEMM sweep (issue 23): every cut of ``kernels/sgemm.cu`` against rawgraph's current matmul
cut and cuBLAS (``torch.mm``, TF32 off), for y[M, N] = x[M, K] @ W[K, N] at serving shapes.

How to run (from the repository root):

    PYTHONPATH=. python3 benchmarks/gemm_sweep.py --out $OUT            # whole grid, ~2-3 min on an H200
    PYTHONPATH=. python3 benchmarks/gemm_sweep.py --out $OUT --quick    # 6 shapes, well under a minute
    PYTHONPATH=. python3 benchmarks/gemm_sweep.py --widths 4096 --rows 256 --max-cands 30
    PYTHONPATH=. python3 benchmarks/gemm_sweep.py --rows 256 --cut 64,128,32,3,2,1,1   # also time a named cut
    PYTHONPATH=. python3 benchmarks/gemm_sweep.py --compile-only        # NVRTC only (also what a machine
                                                                         # without a GPU does, exit 0)

Grid: M = 64..256 in steps of 8 (``--rows 64 72`` or ``--rows 64:256:8``), K = N = 1024 and 4096
(``--widths``). For each shape a cost model ranks every cut of sgemm.cu (tile BM x BN, K step BK,
pipeline stages, cluster split S, in-CTA K slices KS, __launch_bounds__ MINB) and the best
``--max-cands`` (diverse over tile structures) are timed.

Method, as ``rawgraph/bench/kernel_times.py``: one captured graph of 64 launches (a chain of
programmatic dependent launches, as rawgraph's plans run on sm_90), rotating over enough weight
matrices to fill the L2 cache three times, timed with events; the figure is the median over
``--repeats`` replays, divided by 64. cuBLAS is a graph of 64 ``torch.mm(x, W_i, out=y)`` over the
same rotation, in the same run. Before timing, every cut is run twice on fresh random inputs (seed
printed) into an output poisoned with NaN, checked element by element against a float64 NumPy
reference (|y - ref| <= (K + 64) 2^-24 (|x| @ |W|) + 2^-24 |ref|, a bound any fp32 summation order
meets, plus the repository's relative-error tolerance 1e-5) and the two runs compared bit for bit.
The best cut of each shape is then also checked and timed with the relu and add epilogues, with
the other PDL trigger point and without PDL.

Output: ``gemm_sweep.json`` in ``--out`` (commit from $RAWGRAPH_COMMIT or git, device, every
figure: us, % of fp32 peak, % of copy bandwidth, cuBLAS us, ratio) and a table of the best cut per
shape, flagging the issue's figures: REQUIRED <= 1.0x cuBLAS at every shape, TARGET <= 0.8x and
>= 70 % of fp32 peak at K = N = 4096, M = 256.

Robustness: the work runs in a child process. If a kernel faults (a sticky CUDA error) or hangs,
the parent records the cut that was running in ``excluded.txt``, and restarts the child, which
resumes after the shapes already written to ``partial.jsonl``. ``--budget-s`` (default 190) stops
starting new shapes after that many seconds; shapes are ordered so that a cut-off run still spans
the grid (key shapes first). ``--table FILE`` prints the table of a finished run's JSON, or of the
shapes a killed run left in ``partial.jsonl``.

rawgraph is used for its kernel sources (``rawgraph.runtime.module.kernel_source``), NVRTC
(``compile_source``) and its current cut (``rawgraph.ops``). Everything on the device goes through ``cuda.bindings.driver``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import re
import select
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REPS = 64  # launches per graph
WIDTHS = (1024, 4096)
ROWS = tuple(range(64, 257, 8))
QUICK = [(64, 1024), (136, 1024), (256, 1024), (64, 4096), (136, 4096), (256, 4096)]
KEY_SHAPES = [(256, 4096), (72, 1024), (256, 1024), (64, 4096), (128, 4096), (64, 1024)]
EARLY_MAX_W_BYTES = 8 << 20  # as ops: successor launched at the start for W <= 8 MB
EPIS = {"none": 0, "relu": 1, "add": 2}
TARGET_RATIO, REQUIRED_RATIO, TARGET_PEAK = 0.8, 1.0, 0.70
U = 2.0**-24
REL_TOL = 1e-5
NAN_BITS = 0x7FC00000
STICKY = {
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_ILLEGAL_STATE",
}
EXIT_STICKY = 3


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Cuts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cut:
    """One instantiation of kernels/sgemm.cu (see its header for the parameters)."""

    bm: int
    bn: int
    bk: int
    st: int
    s: int
    ks: int
    minb: int = 1
    tm: int = 8  # output rows per thread (8 or 4)
    file: str = "sgemm"

    @property
    def threads(self) -> int:
        return self.ks * (self.bm // self.tm) * (self.bn // 8)

    @property
    def smem(self) -> int:
        """Dynamic shared memory in bytes: sgemm.cu's SgemmCfg::SMEM_FLOATS * 4."""
        pipe = self.ks * self.st * (self.bm * (self.bk + 4) + self.bk * self.bn)
        part = self.ks * self.bm * (self.bn + 4) if self.s * self.ks > 1 else 0
        return 4 * max(pipe, part)

    def expr(self, epi: str) -> str:
        e = EPIS[epi]
        tm = "" if self.tm == 8 else f", {self.tm}"  # as rawgraph.ops.matmul_expr spells it
        if self.s == 1:
            return f"sgemm_kernel<{e}, {self.bm}, {self.bn}, {self.bk}, {self.st}, {self.ks}, {self.minb}{tm}>"
        return (
            f"sgemm_split_kernel<{e}, {self.bm}, {self.bn}, {self.bk}, {self.st}, {self.s}, {self.ks}, {self.minb}{tm}>"
        )

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (_cdiv(n, self.bn), self.s, _cdiv(m, self.bm))

    def early(self, k: int, n: int) -> int:
        return int(k * n * 4 <= EARLY_MAX_W_BYTES)

    @property
    def label(self) -> str:
        return (
            f"sgemm {self.bm}x{self.bn} k{self.bk} st{self.st} s{self.s} ks{self.ks}"
            + (f" mb{self.minb}" if self.minb > 1 else "")
            + (f" tm{self.tm}" if self.tm != 8 else "")
        )

    @property
    def record(self):
        """The ``rawgraph.ops.SgemmCut`` of this cut: a ``rawgraph.ops.SGEMM_CUTS`` entry."""
        from rawgraph import ops

        return ops.SgemmCut(self.bm, self.bn, self.bk, self.st, self.s, self.ks, self.minb, self.tm)

    @classmethod
    def of(cls, cut) -> Cut:
        """The sweep's cut of a ``rawgraph.ops.SgemmCut``."""
        return cls(cut.bm, cut.bn, cut.bk, cut.stages, cut.split, cut.slices, cut.minb, cut.tm)


@dataclass(frozen=True)
class OldCut:
    """A cut of kernels/matmul.cu: rawgraph's current choice for the shape."""

    kernel: str  # "gemm" or "matvec"
    exprs: tuple  # (none, relu, add) name expressions
    grid_: tuple
    threads: int
    smem: int
    early_: int
    label: str
    source: str  # where the cut came from ("rawgraph.ops")
    file: str = "matmul"

    def expr(self, epi: str) -> str:
        return self.exprs[EPIS[epi]]

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return self.grid_

    def early(self, k: int, n: int) -> int:
        return self.early_


def current_cut(m: int, k: int, n: int, sms: int) -> OldCut:
    """What ``rawgraph.ops.matmul_shape`` picks today (clusters on), asked of rawgraph itself so the
    column never drifts from the library's rule."""
    from rawgraph import ops
    from rawgraph.bench import kernel_times

    shape = ops.matmul_shape(m, k, n, sms, clusters=True)
    exprs = tuple(ops.matmul_expr(e, shape) for e in ("none", "relu", "add"))
    # the flag ops.matmul sets: matvec and sgemm launch their successor at the start for W <= 8 MB
    # (until 2026-12-06, session 19, this read `== "matvec"` and timed today's sgemm cut without it)
    early = int(shape.kernel in ("matvec", "sgemm") and k * n * 4 <= ops.EARLY_MAX_W_BYTES)
    label = kernel_times._label(shape)  # `rawgraph bench kernels`' label for the same cut
    if shape.per_sm:
        raise RuntimeError("current cut uses a residency cap; not replicated here")
    # once ops.SGEMM_CUTS has the shape, today's choice is an sgemm cut: compile it from its own file
    return OldCut(
        shape.kernel,
        exprs,
        tuple(shape.grid),
        shape.threads,
        int(ops.gemm_smem_bytes(shape)),
        early,
        label,
        "rawgraph.ops",
        ops.matmul_file(shape),
    )


# Tile structures (BM, BN, KS, MINB, TM) the generator draws from. Threads = KS * (BM / TM) * (BN / 8).
# TM = 4 (4 x 8 outputs per thread, about 128 registers: 2-4 CTAs per SM) is cuBLAS's small-M thread
# tile (cutlass_80_simt_sgemm_64x64_8x5, benchmarks/NOTES.md session 18).
STRUCTS = [
    (128, 128, 1, 1, 8),
    (128, 128, 1, 2, 8),
    (128, 128, 2, 1, 8),
    (256, 128, 1, 1, 8),
    (64, 128, 2, 1, 8),
    (64, 128, 2, 2, 8),
    (64, 128, 1, 1, 8),
    (64, 128, 1, 4, 8),
    (128, 64, 2, 1, 8),
    (128, 64, 1, 1, 8),
    (96, 128, 1, 1, 8),
    (96, 64, 2, 1, 8),
    (64, 64, 4, 1, 8),
    (64, 64, 2, 1, 8),
    (32, 128, 4, 1, 8),
    (32, 128, 2, 1, 8),
    (64, 64, 1, 1, 4),
    (64, 64, 2, 1, 4),
    (64, 128, 1, 1, 4),
    (64, 128, 1, 2, 4),
    (32, 128, 2, 1, 4),
    (128, 64, 1, 2, 4),
    (32, 64, 2, 1, 4),
    (128, 128, 1, 1, 4),
]
SPLITS = (1, 2, 3, 4, 6, 8)
SM_SMEM = 233472  # 228 KB per SM (H100 / H200)
SMEM_OPTIN = 232448  # 227 KB per CTA
SMEM_RESERVED = 1024  # per CTA
REGS_PER_SM = 65536
REGS_EST = {8: 168, 16: 168, 32: 240}  # registers of an 8 x 8 tile thread, MINB = 1 (NVRTC 13.x, by BK)
REGS_EST_TM4 = 128  # a 4 x 8 tile thread at any BK (NVRTC 13.5: 125-128)
FFMA_FRAC = {8: 0.84, 16: 0.88, 32: 0.89}  # FMA share of the K loop's SASS (BK 16: 1024 of 1152)


def reg_cap(threads: int, minb: int) -> int:
    cap = min(255, REGS_PER_SM // (threads * minb))
    return cap // 8 * 8


def model_cycles(cut: Cut, m: int, k: int, n: int, sms: int, min_ctas: float = 0.5) -> float | None:
    """A crude time model (SM cycles) used only to choose which cuts to time; None = not a valid cut."""
    th = cut.threads
    if th > 1024 or th % 32 or cut.minb * th > 2048:
        return None
    smem = cut.smem
    if smem > SMEM_OPTIN:
        return None
    p = cut.s * cut.ks
    kc = _cdiv(_cdiv(k, p), cut.bk) * cut.bk
    if kc * (p - 1) >= k:  # an empty K part: wasted CTAs
        return None
    nst = kc // cut.bk
    if cut.st > nst + 1:  # more stages than the K range has
        return None
    regs = min(REGS_EST[cut.bk] if cut.tm == 8 else REGS_EST_TM4, reg_cap(th, cut.minb))
    if regs < (128 if cut.tm == 8 else 96):
        return None
    warps = th // 32
    regs_warp = _cdiv(regs * 32, 256) * 256
    cap = min(REGS_PER_SM // (warps * regs_warp), SM_SMEM // (smem + SMEM_RESERVED), 2048 // th, 32)
    if cap < 1:
        return None
    ctas = _cdiv(n, cut.bn) * _cdiv(m, cut.bm) * cut.s
    if ctas < min_ctas * sms:
        return None
    waves = _cdiv(ctas, cap * sms)
    per_sm = _cdiv(ctas, sms * waves)  # CTAs on the busiest SM in a wave
    busy_warps = per_sm * warps
    hide = min(1.0, 0.55 + 0.06 * busy_warps)  # latency hiding: 8 warps ~ full issue
    spill = 0.85 if (regs <= 128 and cut.bk >= 16 and cut.tm == 8) else 1.0
    # half the outputs per shared-memory load: 12 loads per 128 FMAs against 16 per 256
    eff = FFMA_FRAC[cut.bk] * hide * spill * (1.0 if cut.tm == 8 else 0.96)
    fma_cta = cut.bm * cut.bn * kc * cut.ks
    t_compute = waves * per_sm * fma_cta / (128 * eff)
    # Prologue: DRAM latency plus the stages a CTA must land before its K loop runs ahead.
    t_fill = 1500 + 200 * min(cut.st - 1, nst)
    rs = _cdiv(cut.bm, cut.s)
    t_reduce = 0.0
    if p > 1:
        t_reduce = waves * per_sm * rs * cut.bn * p * 4 / 48 + (900 if cut.s > 1 else 100)
    return t_fill + t_compute + t_reduce


def fitted_structs(m: int) -> list[tuple[int, int, int, int, int]]:
    """Row tiles fitted to M: M over t tiles (t = 1..4) rounded up to a warp's rows (16 at TM = 4,
    32 at TM = 8), so that, e.g., 72 rows compute 80 (cuBLAS's time is flat from 65 to 128 rows at
    w4096: it computes whole 128-row tiles; benchmarks/results/gemm_sweep_2026-12-06_ba6b8b2_h200.log)."""
    out = []
    for tm in (4, 8):
        for t in range(1, 5):
            bm = _cdiv(_cdiv(m, t), 4 * tm) * 4 * tm
            if bm > (128 if tm == 4 else 256):
                continue
            for bn in (64, 128):
                for ks in (1, 2):
                    # registers: about 240 a thread at TM = 8, 128 at TM = 4 (no spills within 64 K)
                    if ks * (bm // tm) * (bn // 8) <= (512 if tm == 4 else 256):
                        out.append((bm, bn, ks, 1, tm))
    return out


def candidates(m: int, k: int, n: int, sms: int, limit: int) -> list[Cut]:
    """``limit`` cuts to time, chosen by the model with diversity: first the best cut of each tile
    structure (BM, BN, KS, MINB, TM; :data:`STRUCTS` and :func:`fitted_structs`), best structures
    first, for two thirds of the slots; then the next best cuts that differ from every chosen one
    in split or K step (not only in stages)."""
    scored = []
    for bm, bn, ks, minb, tm in dict.fromkeys(STRUCTS + fitted_structs(m)):
        for s in SPLITS:
            for bk in (8, 16, 32):
                if tm == 8 and reg_cap(ks * bm * bn // 64, minb) <= 128 and bk == 32:
                    continue
                p = s * ks
                kc = _cdiv(_cdiv(k, p), bk) * bk
                nst = kc // bk
                for st in sorted({3, 4, min(8, nst + 1), min(6, nst + 1)}):
                    if st < 2:
                        continue
                    cut = Cut(bm, bn, bk, st, s, ks, minb, tm)
                    t = model_cycles(cut, m, k, n, sms)
                    if t is None:  # small products: keep the cuts that fill fewer SMs, ranked last
                        t2 = model_cycles(cut, m, k, n, sms, 0.0)
                        t = None if t2 is None else 1e12 + t2
                    if t is not None:
                        scored.append((t, cut))
    scored.sort(key=lambda tc: (tc[0], tc[1].label))
    out, structs, near = [], set(), set()
    for _t, cut in scored:
        key = (cut.bm, cut.bn, cut.ks, cut.minb, cut.tm)
        if key not in structs and len(out) < max(1, (2 * limit) // 3):
            structs.add(key)
            near.add(key + (cut.s, cut.bk))
            out.append(cut)
    # Other K steps of the chosen (structure, split) pairs first (up to half the remaining slots),
    # then other splits.
    chosen = {(c.bm, c.bn, c.ks, c.minb, c.tm, c.s) for c in out}
    room = (limit - len(out) + 1) // 2
    for _t, cut in scored:
        nk = (cut.bm, cut.bn, cut.ks, cut.minb, cut.tm, cut.s, cut.bk)
        if room > 0 and nk[:6] in chosen and nk not in near:
            near.add(nk)
            out.append(cut)
            room -= 1
    for _t, cut in scored:
        if len(out) >= limit:
            break
        nk = (cut.bm, cut.bn, cut.ks, cut.minb, cut.tm, cut.s, cut.bk)
        if nk not in near:
            near.add(nk)
            out.append(cut)
    return out


def parse_cut(text: str):
    """``BM,BN,BK,STAGES,S,KS,MINB[,TM]`` (seven or eight integers) -> a ``rawgraph.ops.SgemmCut``
    (the type of ``--cut``)."""
    try:
        values = tuple(int(t) for t in text.split(","))
    except ValueError:
        values = ()
    if len(values) not in (7, 8):
        raise argparse.ArgumentTypeError(
            f"expected BM,BN,BK,STAGES,S,KS,MINB[,TM] (seven or eight integers), got {text!r}"
        )
    from rawgraph import ShapeError, ops  # the kernel's rules, checked here rather than by NVRTC or the launch

    cut = ops.SgemmCut(*values)
    try:
        ops.sgemm_shape(cut.bm, 1024, 1024, cut)
    except ShapeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is no sgemm cut: {exc}") from None
    return cut


def with_cuts(cands: list[Cut], extra: list) -> list[Cut]:
    """The model's candidates and the cuts named with ``--cut`` (``rawgraph.ops.SgemmCut``s; each once)."""
    out = list(cands)
    for t in extra:
        cut = Cut.of(t)
        if cut not in out:
            out.append(cut)
    return out


# ---------------------------------------------------------------------------------------------
# Compilation (NVRTC, one program per chunk of name expressions, chunks in parallel processes)
# ---------------------------------------------------------------------------------------------


def kernel_source(name: str) -> str:
    """kernels/<name>.cu with its local .cuh includes spliced in: rawgraph's own loader, so the
    sweep compiles exactly the text rawgraph would ($RAWGRAPH_KERNEL_DIR honoured there too)."""
    from rawgraph.runtime.module import kernel_source as splice_source

    return splice_source(name)


OPTIONS = ("-std=c++17", "--ptxas-options=-v")


def _nvrtc_compile(source: str, source_name: str, arch: str, names, options):
    """Direct NVRTC (used when rawgraph.compile_source is unavailable): (image, lowered, log)."""
    from cuda.bindings import nvrtc

    def chk(res, what):
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{what}: {res[0]}")
        return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)

    prog = chk(nvrtc.nvrtcCreateProgram(source.encode(), source_name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for e in names:
            chk(nvrtc.nvrtcAddNameExpression(prog, e.encode()), "nvrtcAddNameExpression")
        opts = [o.encode() for o in options] + [f"--gpu-architecture={arch}".encode()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = chk(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        buf = bytearray(max(int(size), 1))
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text = bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC failed:\n{text}")
        size = chk(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        img = bytearray(int(size))
        nvrtc.nvrtcGetCUBIN(prog, img)
        lowered = {}
        for e in names:
            sym = chk(nvrtc.nvrtcGetLoweredName(prog, e.encode()), "lowered name")
            lowered[e] = sym.decode() if isinstance(sym, bytes) else str(sym)
        return bytes(img), lowered, text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_chunk(args):
    """Worker: compile one chunk. Returns (file, names, image, lowered, log, seconds, error)."""
    file, names, arch = args
    t0 = time.perf_counter()
    try:
        src = kernel_source(file)
        try:  # rawgraph's compiler (with its on-disk cache) when the package imports, else NVRTC here
            import rawgraph

            compile_source = rawgraph.compile_source
        except Exception:  # noqa: BLE001 - a package mid-move must not stop the sweep
            compile_source = None
        if compile_source is not None:
            entry = compile_source(src, f"{file}.cu", arch, list(names), OPTIONS)
            image, lowered, text = entry.image, dict(entry.lowered), entry.log
        else:
            image, lowered, text = _nvrtc_compile(src, f"{file}.cu", arch, list(names), OPTIONS)
        return file, tuple(names), image, lowered, text, time.perf_counter() - t0, None
    except Exception as exc:  # noqa: BLE001 - reported per chunk
        return (
            file,
            tuple(names),
            None,
            {},
            getattr(exc, "log", "") or "",
            time.perf_counter() - t0,
            f"{type(exc).__name__}: {exc}",
        )


def parse_ptxas(text: str) -> dict[str, dict]:
    """ptxas -v lines -> {mangled name: {registers, spill_stores, spill_loads, stack}}."""
    info: dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        mt = re.search(r"(?:Compiling entry function|Function properties for) '?([_A-Za-z0-9]+)'?", line)
        if mt:
            cur = mt.group(1)
            info.setdefault(cur, {})
            continue
        if cur is None:
            continue
        mt = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if mt:
            info[cur].update(stack=int(mt.group(1)), spill_stores=int(mt.group(2)), spill_loads=int(mt.group(3)))
        mt = re.search(r"Used (\d+) registers", line)
        if mt:
            info[cur]["registers"] = int(mt.group(1))
    return info


def compile_all(jobs: dict[str, list[str]], arch: str, workers: int, chunk: int = 3) -> dict:
    """{file: [exprs]} -> {(file, expr): {"image", "lowered", "ptxas"}} (failed exprs are missing)."""
    tasks = []
    for file, names in jobs.items():
        names = sorted(set(names))
        for i in range(0, len(names), chunk):
            tasks.append((file, tuple(names[i : i + chunk]), arch))
    out: dict = {}
    if not tasks:
        return out
    t0 = time.perf_counter()
    results = []
    if workers > 1 and len(tasks) > 1:
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding CUDA and torch threads
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as ex:
            results = list(ex.map(_compile_chunk, tasks))
    else:
        results = [_compile_chunk(t) for t in tasks]
    retry = []
    for file, names, image, lowered, text, _secs, err in results:
        if err:
            if len(names) > 1:
                retry.extend((file, (n,), arch) for n in names)
            else:
                log(f"  compile FAILED {file}: {names[0]}: {err}\n{text[-2000:]}")
            continue
        ptx = parse_ptxas(text)
        for n in names:
            sym = lowered.get(n, n)
            out[(file, n)] = {"image": image, "lowered": sym, "ptxas": ptx.get(sym, {})}
    for file, names, image, lowered, text, _secs, err in map(_compile_chunk, retry) if retry else []:
        if err:
            log(f"  compile FAILED {file}: {names[0]}: {err}\n{text[-2000:]}")
            continue
        sym = lowered.get(names[0], names[0])
        out[(file, names[0])] = {"image": image, "lowered": sym, "ptxas": parse_ptxas(text).get(sym, {})}
    log(f"compiled {len(out)} kernels for {arch} in {time.perf_counter() - t0:.1f} s ({len(tasks)} NVRTC programs)")
    return out


# ---------------------------------------------------------------------------------------------
# Device backend (cuda.bindings.driver)
# ---------------------------------------------------------------------------------------------


class StickyError(RuntimeError):
    """The context is lost (a kernel faulted): nothing more can run in this process."""


class LaunchError(RuntimeError):
    """A launch was refused (resources, configuration): skip this cut, carry on."""


class Cuda:
    def __init__(self):
        from cuda.bindings import driver

        self.d = driver
        self._check(driver.cuInit(0), "cuInit")
        self.dev = self._check(driver.cuDeviceGet(0), "cuDeviceGet")
        self.ctx = self._check(driver.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self._check(driver.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        A = driver.CUdevice_attribute
        attr = lambda a: int(self._check(driver.cuDeviceGetAttribute(a, self.dev), "cuDeviceGetAttribute"))  # noqa: E731
        self.sms = attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.cc = (
            attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        )
        self.l2 = attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        self.smem_optin = attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        try:
            self.clock_khz = attr(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        except Exception:  # noqa: BLE001 - removed in some CUDA versions
            self.clock_khz = 0
        name = self._check(driver.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        self.name = (name.decode() if isinstance(name, bytes) else str(name)).split("\0")[0].strip()
        self.stream = self._check(driver.cuStreamCreate(1), "cuStreamCreate")  # non-blocking
        self.ev = [self._check(driver.cuEventCreate(0), "cuEventCreate") for _ in range(2)]
        self.modules = []
        self._keep = []

    def _check(self, res, what):
        err = res[0]
        if int(err) != 0:
            try:
                name = self.d.CUresult(int(err)).name
            except Exception:  # noqa: BLE001
                name = str(err)
            if name in STICKY:
                raise StickyError(f"{what}: {name}")
            raise LaunchError(f"{what}: {name}")
        if len(res) == 1:
            return None
        return res[1] if len(res) == 2 else res[1:]

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    def alloc(self, nfloats: int) -> int:
        return int(self._check(self.d.cuMemAlloc(max(4, 4 * nfloats)), "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        self._check(self.d.cuMemFree(ptr), "cuMemFree")

    def upload(self, ptr: int, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr, dtype=np.float32)
        self._check(self.d.cuMemcpyHtoDAsync(ptr, a.ctypes.data, a.nbytes, self.stream), "cuMemcpyHtoDAsync")
        self.sync()

    def download(self, ptr: int, shape) -> np.ndarray:
        out = np.empty(shape, dtype=np.float32)
        self._check(self.d.cuMemcpyDtoHAsync(out.ctypes.data, ptr, out.nbytes, self.stream), "cuMemcpyDtoHAsync")
        self.sync()
        return out

    def poison(self, ptr: int, nfloats: int) -> None:
        self._check(self.d.cuMemsetD32Async(ptr, NAN_BITS, nfloats, self.stream), "cuMemsetD32Async")

    def sync(self) -> None:
        self._check(self.d.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def load(self, image: bytes):
        buf = np.frombuffer(image, dtype=np.uint8)
        mod = self._check(self.d.cuModuleLoadData(buf.ctypes.data), "cuModuleLoadData")
        self.modules.append(mod)
        return mod

    def function(self, mod, symbol: str, smem: int):
        fn = self._check(self.d.cuModuleGetFunction(mod, symbol.encode()), "cuModuleGetFunction")
        FA = self.d.CUfunction_attribute
        if smem > 48 * 1024:
            self._check(
                self.d.cuFuncSetAttribute(fn, FA.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(smem)),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )
        return fn

    def func_info(self, fn, threads: int, smem: int, cluster: int, grid) -> dict:
        FA = self.d.CUfunction_attribute
        info = {}
        try:
            info["registers"] = int(self._check(self.d.cuFuncGetAttribute(FA.CU_FUNC_ATTRIBUTE_NUM_REGS, fn), "attr"))
            info["local_bytes"] = int(
                self._check(self.d.cuFuncGetAttribute(FA.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn), "attr")
            )
            info["ctas_per_sm"] = int(
                self._check(self.d.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, smem), "occupancy")
            )
            if cluster > 1:
                cfg = self._config(fn, grid, threads, smem, pdl=False)
                info["max_active_clusters"] = int(self._check(self.d.cuOccupancyMaxActiveClusters(fn, cfg), "clusters"))
        except LaunchError as exc:
            info["error"] = str(exc)
        return info

    def _config(self, fn, grid, threads, smem, pdl):
        cfg = self.d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(g) for g in grid)
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = int(threads), 1, 1
        cfg.sharedMemBytes = int(smem)
        cfg.hStream = self.stream
        if pdl:
            attr = self.d.CUlaunchAttribute()
            attr.id = self.d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            self._keep.append(attr)  # the config may point at it: keep it alive
        else:
            cfg.numAttrs = 0
        return cfg

    def configs(self, fn, grid, threads, smem) -> dict:
        """The launch configurations of one kernel and shape, without and with PDL."""
        return {p: self._config(fn, grid, threads, smem, p) for p in (False, True)}

    def launch_obj(self, cfgs, fn, x, w, y, r, m, k, n, flags):
        """Persistent arguments (x, W, y, r, B, K, N, flags, rows) for ``cfgs`` (see :meth:`configs`)."""
        store = np.zeros(9, dtype=np.uint64)
        store[0], store[1], store[2], store[3], store[8] = x, w, y, r, 0
        iv = store.view(np.int32)
        iv[8], iv[10], iv[12], iv[14] = m, k, n, flags
        ptrs = np.array([store.ctypes.data + 8 * i for i in range(9)], dtype=np.uint64)
        return {"fn": fn, "store": store, "ptrs": ptrs, "params": int(ptrs.ctypes.data), "cfg": cfgs}

    def launch(self, L, pdl: bool = False) -> None:
        cfg = L["cfg"][pdl]
        cfg.hStream = self.stream
        self._check(self.d.cuLaunchKernelEx(cfg, L["fn"], L["params"], 0), "cuLaunchKernelEx")

    def time_chain(self, launches, pdl: bool, repeats: int) -> list[float]:
        """Per-launch us of one graph holding ``launches`` (PDL on every launch but the first)."""
        d = self.d
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check(d.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            for i, L in enumerate(launches):
                self.launch(L, pdl and i > 0)
        except Exception:
            res = d.cuStreamEndCapture(self.stream)  # end the (possibly invalidated) capture
            if len(res) > 1 and res[1] is not None and int(res[1]):
                d.cuGraphDestroy(res[1])
            raise
        graph = self._check(d.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        try:
            exe = self._check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except Exception:
            d.cuGraphDestroy(graph)
            raise
        try:
            self._check(d.cuGraphLaunch(exe, self.stream), "cuGraphLaunch")
            self.sync()
            samples = []
            a, b = self.ev
            for _ in range(repeats):
                self._check(d.cuEventRecord(a, self.stream), "cuEventRecord")
                self._check(d.cuGraphLaunch(exe, self.stream), "cuGraphLaunch")
                self._check(d.cuEventRecord(b, self.stream), "cuEventRecord")
                self._check(d.cuEventSynchronize(b), "cuEventSynchronize")
                samples.append(
                    float(self._check(d.cuEventElapsedTime(a, b), "cuEventElapsedTime")) * 1e3 / len(launches)
                )
            return samples
        finally:
            d.cuGraphExecDestroy(exe)
            d.cuGraphDestroy(graph)

    def copy_bandwidth(self, nbytes: int = 1 << 30) -> float:
        """Device-to-device copy, GB/s counting bytes read plus written (as kernel_times)."""
        d = self.d
        src, dst = self.alloc(nbytes // 4), self.alloc(nbytes // 4)
        try:
            self.poison(src, nbytes // 4)
            a, b = self.ev
            best = []
            for _ in range(5):
                self._check(d.cuEventRecord(a, self.stream), "cuEventRecord")
                self._check(d.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream), "cuMemcpyDtoDAsync")
                self._check(d.cuEventRecord(b, self.stream), "cuEventRecord")
                self._check(d.cuEventSynchronize(b), "cuEventSynchronize")
                best.append(2 * nbytes / (float(self._check(d.cuEventElapsedTime(a, b), "t")) * 1e-3) / 1e9)
            return float(np.median(best))
        finally:
            self.free(src)
            self.free(dst)


class FakeCuda:
    """A stand-in device for testing this script without a GPU (--fake): kernels run as NumPy
    float32 products, times come from the cost model. Nothing it reports is a measurement."""

    def __init__(self):
        self.sms, self.cc, self.l2, self.smem_optin, self.clock_khz = 132, (9, 0), 50 << 20, SMEM_OPTIN, 1980000
        self.name = "FAKE (no GPU; numbers are not measurements)"
        self.mem: dict[int, np.ndarray] = {}
        self.next = 1 << 20
        self.crash_expr = os.environ.get("GEMM_SWEEP_FAKE_CRASH", "")

    arch = property(lambda self: "sm_90")

    def alloc(self, nfloats):
        p = self.next
        self.next += 16 * _cdiv(4 * max(nfloats, 1), 16) + 256
        self.mem[p] = np.zeros(max(nfloats, 1), dtype=np.float32)
        return p

    def free(self, ptr):
        self.mem.pop(ptr, None)

    def upload(self, ptr, arr):
        self.mem[ptr][: arr.size] = np.asarray(arr, dtype=np.float32).ravel()

    def download(self, ptr, shape):
        return self.mem[ptr][: int(np.prod(shape))].reshape(shape).copy()

    def poison(self, ptr, nfloats):
        self.mem[ptr][:nfloats] = np.nan

    def sync(self):
        pass

    def load(self, image):
        return object()

    def function(self, mod, symbol, smem):
        return symbol

    def func_info(self, fn, threads, smem, cluster, grid):
        return {"registers": 0, "fake": True}

    def configs(self, fn, grid, threads, smem):
        return {}

    def launch_obj(self, cfgs, fn, x, w, y, r, m, k, n, flags):
        return {"fn": fn, "args": (x, w, y, r, m, k, n, flags), "t": None}

    def launch(self, L, pdl=False):
        if self.crash_expr and self.crash_expr in str(L.get("expr", "")):
            raise StickyError("fake sticky error (GEMM_SWEEP_FAKE_CRASH)")
        x, w, y, r, m, k, n, flags = L["args"]
        epi = L.get("epi", 0)
        xs = self.mem[x][: m * k].reshape(m, k)
        ws = self.mem[w][: k * n].reshape(k, n)
        out = xs @ ws
        if epi == 1:
            out = np.where(out < 0, 0, out)
        elif epi == 2:
            out = out + self.mem[r][: m * n].reshape(m, n)
        self.mem[y][: m * n] = out.ravel()

    def time_chain(self, launches, pdl, repeats):
        t = launches[0].get("t") or 10.0
        rng = np.random.default_rng(len(launches) + repeats)
        return list(t * (1 + 0.01 * rng.standard_normal(repeats)))

    def copy_bandwidth(self, nbytes=1 << 30):
        return 4190.0


# ---------------------------------------------------------------------------------------------
# The sweep (child process)
# ---------------------------------------------------------------------------------------------


def shape_order(shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Key shapes first, then the rest spread over the grid (so a cut-off run still spans it)."""
    first = [s for s in KEY_SHAPES if s in shapes]
    rest = [s for s in shapes if s not in first]
    order, step = [], 8
    while rest:
        take = rest[::step] if step > 1 else rest
        order += take
        rest = [s for s in rest if s not in take]
        step = max(1, step // 2)
    return first + order


def ref_and_bound(base: np.ndarray, absprod: np.ndarray, k: int, epi: str, r: np.ndarray | None):
    """Reference (float64) and per-element error bound of epi(x @ W) (+ r); base = x @ W in float64."""
    ref = base
    bound = (k + 64) * U * 1.001 * absprod + U * np.abs(ref) + 1e-30  # K terms + up to 64 partials
    if epi == "relu":
        ref = np.where(ref < 0, 0.0, ref)
    elif epi == "add":
        ref = ref + r.astype(np.float64)
        bound = bound * 1.001 + U * np.abs(ref) + U * bound
    return ref, bound


def judge(y: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> dict:
    err = np.abs(y.astype(np.float64) - ref)
    finite = bool(np.isfinite(y).all())
    worst = float(np.nanmax(err / bound)) if finite else float("inf")
    rel = float(np.linalg.norm(np.nan_to_num(y.astype(np.float64) - ref, nan=1e30)) / max(np.linalg.norm(ref), 1e-300))
    ok = finite and worst <= 1.0 and rel < REL_TOL
    return {"ok": ok, "finite": finite, "max_err_over_bound": worst, "rel_err": rel}


class ShapeRun:
    """Checks and timings of cuts at one shape, on the inputs of ``data`` (one width)."""

    def __init__(self, sweep: Sweep, m: int, width: int, data: dict):
        self.sw, self.dev, self.m, self.k, self.n, self.data = sweep, sweep.dev, m, width, width, data
        self.x, self.y, self.r, self.ws = data["x"], data["y"], data["r"], data["ws"]
        rh = data["rh"][:m]
        self.dev.upload(self.x, data["xh"][:m])
        self.dev.upload(self.r, rh)
        self.refs = {
            e: ref_and_bound(data["ref"][:m], data["absprod"][:m], width, e, rh if e == "add" else None) for e in EPIS
        }
        self.flop = 2.0 * m * width * width
        self.nbytes = 4.0 * (width * width + 2 * m * width)

    def figures(self, us: float, epi: str = "none") -> dict:
        b = self.nbytes + (4.0 * self.m * self.n if epi == "add" else 0.0)
        tf = self.flop / us / 1e6
        return {
            "us": us,
            "tflops": tf,
            "pct_peak": 100 * tf / self.sw.peak_tflops,
            "pct_copy_bw": 100 * (b / (us * 1e-6) / 1e9) / self.sw.copy_gbps,
        }

    def launches(self, cut, epi, fn, flags, count=REPS):
        m, k, n, dev = self.m, self.k, self.n, self.dev
        cfgs = dev.configs(fn, cut.grid(m, n), cut.threads, cut.smem)
        out = []
        for i in range(count):
            L = dev.launch_obj(
                cfgs, fn, self.x, self.ws[i % len(self.ws)], self.y, self.r if epi == "add" else 0, m, k, n, flags
            )
            L["expr"], L["epi"] = cut.expr(epi), EPIS[epi]
            if isinstance(dev, FakeCuda):
                L["t"] = (
                    (model_cycles(cut, m, k, n, self.sw.sms, 0.0) or 0) / (self.sw.clock_ghz * 1e3) + 1.5
                    if isinstance(cut, Cut)
                    else self.flop / 1e6 / 25.0 + 3
                )
            out.append(L)
        return out

    def check(self, cut, epi, fn, flags) -> dict:
        """Two runs into a NaN-poisoned y: within the bound of the float64 reference, same bits."""
        dev, m, n = self.dev, self.m, self.n
        self.sw.inflight.write_text(cut.expr(epi) + "\n")
        L = self.launches(cut, epi, fn, flags, 1)[0]
        res = []
        for _ in range(2):
            dev.poison(self.y, m * n)
            dev.launch(L)
            dev.sync()
            res.append(dev.download(self.y, (m, n)))
        self.sw.inflight.write_text("")
        out = judge(res[0], *self.refs[epi])
        out["deterministic"] = bool(np.array_equal(res[0].view(np.uint32), res[1].view(np.uint32)))
        out["ok"] = out["ok"] and out["deterministic"]
        return out

    def timed(self, cut, epi, fn, flags, pdl) -> float:
        self.sw.inflight.write_text(cut.expr(epi) + "\n")
        samples = self.dev.time_chain(self.launches(cut, epi, fn, flags), pdl, self.sw.a.repeats)
        self.sw.inflight.write_text("")
        return float(np.median(samples))

    def try_cut(self, cut, epi="none", flags=None, pdl=True, do_check=True) -> dict:
        m, k, n = self.m, self.k, self.n
        rec = {
            "cut": cut.label,
            "expr": cut.expr(epi),
            "threads": cut.threads,
            "smem": cut.smem,
            "grid": list(cut.grid(m, n)),
        }
        if isinstance(cut, Cut):
            t = model_cycles(cut, m, k, n, self.sw.sms, 0.0)
            rec["model_us"] = t / (self.sw.clock_ghz * 1e3) if t else None
        flags = cut.early(k, n) if flags is None else flags
        rec["early"] = flags & 1
        rec["pdl"] = pdl
        try:
            fn = self.sw.fn(cut, epi)
            if fn is None:
                rec["error"] = "not compiled or excluded"
                return rec
            if do_check:
                rec.update(self.dev.func_info(fn, cut.threads, cut.smem, cut.grid(m, n)[1], cut.grid(m, n)))
                rec.update(self.check(cut, epi, fn, flags))
                if not rec["ok"]:
                    return rec
            rec.update(self.figures(self.timed(cut, epi, fn, flags, pdl), epi))
        except LaunchError as exc:
            rec["error"] = str(exc)
            rec["ok"] = False
        finally:
            self.sw.inflight.write_text("")
        return rec


class Sweep:
    def __init__(self, args, dev, out: Path):
        self.a, self.dev, self.out = args, dev, out
        self.sms = dev.sms
        self.clock_ghz = (dev.clock_khz / 1e6) if dev.clock_khz else 1.98
        self.peak_tflops = self.sms * 128 * 2 * self.clock_ghz / 1e3
        self.excluded = set()
        ex = out / "excluded.txt"
        if ex.exists():
            self.excluded = {ln.strip() for ln in ex.read_text().splitlines() if ln.strip()}
        self.inflight = out / "inflight.txt"
        self.kernels: dict = {}  # (file, expr) -> (module, symbol)
        self.compiled: dict = {}  # (file, expr) -> compile record
        self.torch = None
        self.copy_gbps = 0.0
        self.t_start = time.perf_counter()

    # -- compilation and loading --------------------------------------------------------------
    def ensure(self, jobs: dict[str, list[str]]) -> None:
        need = {
            f: [e for e in names if (f, e) not in self.compiled and e not in self.excluded] for f, names in jobs.items()
        }
        need = {f: v for f, v in need.items() if v}
        if not need:
            return
        got = compile_all(need, self.dev.arch, self.a.jobs)
        self.compiled.update(got)
        images = {}
        for key, rec in got.items():
            images.setdefault(id(rec["image"]), (rec["image"], []))[1].append(key)
        for image, keys in images.values():
            try:
                mod = self.dev.load(image)
            except LaunchError as exc:
                log(f"  module load FAILED ({exc}) for {[k for _, k in keys]}")
                continue
            for key in keys:
                self.kernels[key] = (mod, self.compiled[key]["lowered"])

    def fn(self, cut, epi: str):
        key = (cut.file, cut.expr(epi))
        if key not in self.kernels or key[1] in self.excluded:
            return None
        mod, sym = self.kernels[key]
        return self.dev.function(mod, sym, cut.smem)

    def over_budget(self) -> bool:
        return time.perf_counter() - self.t_start > self.a.budget_s

    # -- inputs of one width ---------------------------------------------------------------------
    def make_data(self, width: int, mmax: int, seed: int) -> dict:
        dev = self.dev
        k = n = width
        rng = np.random.default_rng(seed + width)
        xh = rng.standard_normal((mmax, k), dtype=np.float32)
        rh = rng.standard_normal((mmax, n), dtype=np.float32)
        lim = math.sqrt(3.0 / k)
        wh = rng.uniform(-lim, lim, size=(k, n)).astype(np.float32)
        count = int(min(REPS, max(2, _cdiv(3 * dev.l2, k * n * 4))))
        data = {
            "xh": xh,
            "rh": rh,
            "ref": xh.astype(np.float64) @ wh.astype(np.float64),
            "absprod": (np.abs(xh) @ np.abs(wh)).astype(np.float64) * 1.001,
            "x": dev.alloc(mmax * k),
            "y": dev.alloc(mmax * n),
            "r": dev.alloc(mmax * n),
            "ws": [dev.alloc(k * n) for _ in range(count)],
            "wh": wh,
        }
        for p in data["ws"]:
            dev.upload(p, wh)
        if self.torch is not None:
            tw0 = self.torch.from_numpy(wh).cuda()
            data["torch_ws"] = [tw0] + [tw0.clone() for _ in range(count - 1)]
        return data

    def free_data(self, data: dict) -> None:
        for p in [data["x"], data["y"], data["r"]] + data["ws"]:
            self.dev.free(p)
        data.clear()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    # -- pass 1: every cut (no epilogue), the current cut, cuBLAS ----------------------------------
    def sweep_shape(self, m: int, width: int, data: dict, cands: list, cur) -> dict:
        k = n = width
        sr = ShapeRun(self, m, width, data)
        row = {"M": m, "K": k, "N": n, "flop": sr.flop, "weights_rotated": len(data["ws"])}
        if self.torch is not None:
            row["cublas"] = self.torch_mm(m, k, n, data, sr.refs["none"])
        cub = row.get("cublas", {}).get("us")
        if cur is not None:
            rec = sr.try_cut(cur)
            rec["source"] = cur.source
            if cub and "us" in rec:
                rec["ratio_cublas"] = rec["us"] / cub
            row["current"] = rec
        row["candidates"] = []
        for cut in cands:
            rec = sr.try_cut(cut)
            if cub and "us" in rec:
                rec["ratio_cublas"] = rec["us"] / cub
            row["candidates"].append(rec)
        good = [c for c in row["candidates"] if c.get("ok") and "us" in c]
        row["best"] = None
        if not good:
            return row
        best = min(good, key=lambda c: c["us"])
        row["best"] = dict(best)
        bcut = next(c for c in cands if c.label == best["cut"])
        row["best_cut"] = {
            "bm": bcut.bm,
            "bn": bcut.bn,
            "bk": bcut.bk,
            "st": bcut.st,
            "s": bcut.s,
            "ks": bcut.ks,
            "minb": bcut.minb,
            "tm": bcut.tm,
        }
        if "us" in row.get("current", {}):
            row["best"]["speedup_vs_current"] = row["current"]["us"] / best["us"]
        early = bcut.early(k, n)
        row["best_variants"] = {
            "other_trigger": sr.try_cut(bcut, flags=early ^ 1, do_check=False),
            "no_pdl": sr.try_cut(bcut, pdl=False, do_check=False),
        }
        return row

    # -- pass 2: the best cut with the relu and add epilogues --------------------------------------
    def epilogues(self, row: dict, data: dict) -> None:
        m, width = row["M"], row["K"]
        sr = ShapeRun(self, m, width, data)
        bcut = Cut(**row["best_cut"])
        cub = row.get("cublas", {}).get("us")
        for epi in ("relu", "add"):
            rec = sr.try_cut(bcut, epi)
            if cub and "us" in rec:
                rec["ratio_cublas"] = rec["us"] / cub
            row["best_variants"][epi] = rec

    def torch_mm(self, m, k, n, data, refb) -> dict:
        torch = self.torch
        tw = data["torch_ws"]
        tx = torch.from_numpy(data["xh"][:m].copy()).cuda()
        ty = torch.empty((m, n), device="cuda", dtype=torch.float32)
        torch.mm(tx, tw[0], out=ty)
        torch.cuda.synchronize()
        out = judge(ty.cpu().numpy(), *refb)
        from rawgraph.bench.kernel_times import cublas_graph_samples

        samples = cublas_graph_samples(torch, tx, tw, ty, REPS, self.a.repeats)
        us = float(np.median(samples))
        flop = 2.0 * m * k * n
        out.update({"us": us, "tflops": flop / us / 1e6, "pct_peak": 100 * flop / us / 1e6 / self.peak_tflops})
        return out

    # -- whole run ------------------------------------------------------------------------------
    def run(self, shapes: list[tuple[int, int]]) -> dict:
        a, dev = self.a, self.dev
        partial = self.out / "partial.jsonl"
        rows: dict = {}
        if partial.exists():  # a restarted child: keep what the last one finished
            for ln in partial.read_text().splitlines():
                if ln.strip():
                    rd = json.loads(ln)
                    rows[(rd["M"], rd["K"])] = rd

        def save(row):
            rows[(row["M"], row["K"])] = row
            with open(partial, "a") as f:
                f.write(json.dumps(row) + "\n")

        todo = [s for s in shape_order(shapes) if s not in rows]
        cands = {s: with_cuts(candidates(s[0], s[1], s[1], self.sms, a.max_cands), a.cut) for s in todo}
        currents = {}
        if not a.no_current:
            for s in todo:
                try:
                    currents[s] = current_cut(s[0], s[1], s[1], self.sms)
                except Exception as exc:  # noqa: BLE001
                    log(f"current cut for M={s[0]} w{s[1]}: {exc}")
        # Compile before torch starts its threads (the NVRTC workers are spawned, not forked, anyway).
        jobs: dict[str, list[str]] = {"sgemm": [c.expr("none") for v in cands.values() for c in v], "matmul": []}
        for c in currents.values():  # today's cut: a table entry (sgemm.cu) or a matmul.cu cut
            jobs[c.file].append(c.expr("none"))
        self.ensure(jobs)
        if not isinstance(dev, FakeCuda):
            try:
                import torch

                if torch.cuda.is_available():
                    torch.backends.cuda.matmul.allow_tf32 = False
                    torch.set_float32_matmul_precision("highest")
                    self.torch = torch
            except Exception as exc:  # noqa: BLE001
                log(f"torch unavailable ({exc}): no cuBLAS column")
        self.copy_gbps = dev.copy_bandwidth()
        seed = (
            a.seed if a.seed is not None else (next(iter(rows.values()))["seed"] if rows else int(time.time()) % 100000)
        )
        log(
            f"{dev.name}: {self.sms} SMs, fp32 peak {self.peak_tflops:.1f} TFLOP/s at {self.clock_ghz:.2f} GHz, "
            f"copy {self.copy_gbps:.0f} GB/s; seed {seed}; excluded: {sorted(self.excluded) or 'none'}"
            + (f"; resuming after {len(rows)} shapes" if rows else "")
            + f"; torch {'yes' if self.torch else 'no'}"
        )
        mmax = max(m for m, _ in shapes)
        # Pass 1, width by width (the key shapes' widths first).
        widths = list(dict.fromkeys(w for _, w in todo))
        for width in widths:
            if self.over_budget():
                break
            data = self.make_data(width, mmax, seed)
            for m, w in [s for s in todo if s[1] == width]:
                if self.over_budget():
                    log(f"budget of {a.budget_s:.0f} s spent: M={m} w{w} and later shapes not run")
                    break
                t0 = time.perf_counter()
                row = self.sweep_shape(m, w, data, cands[(m, w)], currents.get((m, w)))
                row["seed"] = seed
                row["seconds"] = time.perf_counter() - t0
                save(row)
                log(line(row) + f"  [{row['seconds']:.1f} s]")
            self.free_data(data)
        # Pass 2: the fused epilogues of each shape's best cut, compiled in one batch.
        todo2 = [
            s for s in shape_order(shapes) if rows.get(s, {}).get("best") and "relu" not in rows[s]["best_variants"]
        ]
        if todo2 and not self.over_budget():
            self.ensure({"sgemm": [Cut(**rows[s]["best_cut"]).expr(e) for s in todo2 for e in ("relu", "add")]})
            for width in list(dict.fromkeys(w for _, w in todo2)):
                if self.over_budget():
                    break
                data = self.make_data(width, mmax, seed)
                for s in [s for s in todo2 if s[1] == width]:
                    if self.over_budget():
                        log(f"budget of {a.budget_s:.0f} s spent: epilogues from M={s[0]} w{s[1]} on not run")
                        break
                    row = rows[s]
                    self.epilogues(row, data)
                    save(row)
                    v = row["best_variants"]
                    log(
                        f"M={s[0]:<4d} K=N={s[1]:<5d} epilogues of {row['best']['cut']}: "
                        + ", ".join(
                            f"{e} {v[e]['us']:.2f} us" if "us" in v[e] else f"{e} FAILED {v[e]}"
                            for e in ("relu", "add")
                        )
                    )
                self.free_data(data)
        info = {e: dict(rec["ptxas"]) for (f, e), rec in self.compiled.items()}
        return {
            "commit": commit(),
            "device": dev.name,
            "sms": self.sms,
            "clock_ghz": self.clock_ghz,
            "fp32_peak_tflops": self.peak_tflops,
            "copy_GBps": self.copy_gbps,
            "reps_per_graph": REPS,
            "repeats": a.repeats,
            "seed": seed,
            "tf32": False,
            "sources": source_hashes(),
            "excluded": sorted(self.excluded),
            "compile": info,
            "fake": isinstance(dev, FakeCuda),
            "not_run": [list(s) for s in shapes if s not in rows],
            "rows": [rows[s] for s in sorted(rows, key=lambda s: (s[1], s[0]))],
            "seconds": time.perf_counter() - self.t_start,
        }


def line(row: dict) -> str:
    m, k = row["M"], row["K"]
    s = f"M={m:<4d} K=N={k:<5d}"
    b = row.get("best")
    if not b:
        return s + " no candidate passed"
    s += f" best {b['cut']:<36s} {b['us']:8.2f} us {b['pct_peak']:5.1f}% peak {b['pct_copy_bw']:5.1f}% copy"
    if "cublas" in row:
        s += f" | cuBLAS {row['cublas']['us']:8.2f} ratio {b.get('ratio_cublas', float('nan')):5.2f}"
    if "current" in row and "us" in row["current"]:
        s += f" | current {row['current']['us']:8.2f}"
    bad = [c["cut"] for c in row["candidates"] if not c.get("ok", False)]
    if bad:
        s += f" | {len(bad)} cut(s) failed"
    return s


def commit() -> str:
    """The commit measured, as every results JSON records it (``rawgraph.bench.provenance.commit``)."""
    from rawgraph.bench.provenance import commit as provenance_commit

    return provenance_commit()


def source_hashes() -> dict:
    from rawgraph import kernel_dir

    out = {}
    for f in ("sgemm.cu", "matmul.cu", "rawgraph.cuh", "gemm_tile.cuh"):
        p = kernel_dir() / f
        if p.exists():
            out[f] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return out


def table(result: dict) -> str:
    """Best cut per shape with cuBLAS beside it; flags the issue's required and target figures,
    judged on the faster of the best cut timed and today's cut (``current``: what rawgraph serves
    now, e.g. the committed table's entry), since either is what the library can serve."""
    hdr = (
        f"{'M':>4s} {'K=N':>5s}  {'best sgemm cut':<36s} {'us':>8s} {'%peak':>6s} {'%copy':>6s} "
        f"{'cuBLAS':>8s} {'ratio':>6s} {'current':>8s} {'cur/cub':>7s}  relu/add us  flags"
    )
    out = [hdr, "-" * len(hdr)]
    misses = {"required": [], "target": [], "peak": []}
    for row in result["rows"]:
        b = row.get("best")
        if not b and "us" in row.get("current", {}):  # no candidate passed, today's cut did: judge that
            b = dict(row["current"], cut="(current) " + str(row["current"].get("cut", "")))
        if not b:
            out.append(f"{row['M']:4d} {row['K']:5d}  (no cut passed the checks)")
            misses["required"].append((row["M"], row["K"]))
            continue
        cub = row.get("cublas", {}).get("us")
        ratio = b["us"] / cub if cub else float("nan")
        cur = row.get("current", {}).get("us")
        served = min(b["us"], cur) if cur else b["us"]
        judged = served / cub if cub else float("nan")
        served_peak = b["pct_peak"] * b["us"] / served
        flags = []
        if cub and judged > REQUIRED_RATIO:
            flags.append("REQUIRED-MISS")
            misses["required"].append((row["M"], row["K"]))
        elif cub and judged > TARGET_RATIO:
            flags.append("target-miss")
            misses["target"].append((row["M"], row["K"]))
        if row["M"] == 256 and row["K"] == 4096 and served_peak < 100 * TARGET_PEAK:
            flags.append(f"peak<{100 * TARGET_PEAK:.0f}%")
            misses["peak"].append((row["M"], row["K"]))
        v = row.get("best_variants", {})
        ra = "/".join(
            f"{v[e]['us']:.1f}" if "us" in v.get(e, {}) else ("FAIL" if e in v else "-") for e in ("relu", "add")
        )
        out.append(
            f"{row['M']:4d} {row['K']:5d}  {b['cut']:<36s} {b['us']:8.2f} {b['pct_peak']:6.1f} {b['pct_copy_bw']:6.1f} "
            f"{cub if cub else float('nan'):8.2f} {ratio:6.2f} {cur if cur else float('nan'):8.2f} "
            f"{(cur / cub) if (cur and cub) else float('nan'):7.2f}  {ra:<11s}  {' '.join(flags)}"
        )
    n = len(result["rows"])
    out.append("")
    if result.get("not_run"):
        out.append(f"NOT RUN (budget or failures): {result['not_run']}")
    out.append(
        f"REQUIRED (<= {REQUIRED_RATIO}x cuBLAS at every shape): "
        + (f"met at all {n} shapes" if not misses["required"] else f"MISSED at {misses['required']}")
    )
    out.append(
        f"TARGET (<= {TARGET_RATIO}x cuBLAS at every shape): "
        + (
            "met"
            if not misses["target"] and not misses["required"]
            else f"missed at {len(misses['target']) + len(misses['required'])} of {n} shapes"
        )
    )
    if not any("cublas" in r for r in result["rows"]):
        out.append("(no cuBLAS figures in this run: the ratios above are not judged)")
    key = [r for r in result["rows"] if r["M"] == 256 and r["K"] == 4096 and r.get("best")]
    if key:
        b, cur = key[0]["best"], key[0].get("current", {}).get("us")
        peak = b["pct_peak"] * b["us"] / (min(b["us"], cur) if cur else b["us"])
        out.append(
            f"TARGET (>= {100 * TARGET_PEAK:.0f}% fp32 peak at w4096 M=256): {peak:.1f}% "
            + ("met" if peak >= 100 * TARGET_PEAK else "MISSED")
        )
    out.append("(flags judge the faster of the best cut and the current one)")
    failed = [
        (r["M"], r["K"], c["cut"]) for r in result["rows"] for c in r.get("candidates", []) if not c.get("ok", False)
    ]
    bad_epi = [
        (r["M"], r["K"], e)
        for r in result["rows"]
        for e in ("relu", "add")
        if e in r.get("best_variants", {}) and not r["best_variants"][e].get("ok", False)
    ]
    out.append(
        f"checks: {sum(len(r.get('candidates', [])) for r in result['rows'])} cut runs, {len(failed)} failed"
        + (f": {failed[:8]}" if failed else "")
        + f"; epilogue checks failed: {bad_epi or 'none'}"
    )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def parse_rows(items) -> list[int]:
    out = []
    for it in items:
        if ":" in it:
            a, b, *c = (int(v) for v in it.split(":"))
            out += list(range(a, b + 1, c[0] if c else 8))
        else:
            out.append(int(it))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--quick", action="store_true", help="6 shapes: M in 64, 136, 256 at K=N 1024 and 4096")
    p.add_argument("--widths", type=int, nargs="*", help="K = N values (default 1024 4096)")
    p.add_argument("--rows", nargs="*", help="M values or ranges a:b:step (default 64:256:8)")
    p.add_argument("--max-cands", type=int, default=20, help="sgemm cuts timed per shape")
    p.add_argument(
        "--cut",
        action="append",
        default=[],
        type=parse_cut,
        help="also time this cut at every shape: BM,BN,BK,STAGES,S,KS,MINB[,TM] (repeatable)",
    )
    p.add_argument("--repeats", type=int, default=9, help="graph replays per figure (median)")
    p.add_argument("--seed", type=int)
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="parallel NVRTC processes")
    p.add_argument("--budget-s", type=float, default=190.0, help="start no new shape after this many seconds")
    p.add_argument("--stall-s", type=float, default=60.0, help="kill a child silent for this long (a hung kernel)")
    p.add_argument("--no-current", action="store_true", help="skip rawgraph's current matmul cut")
    p.add_argument("--compile-only", action="store_true", help="compile every candidate for sm_90 and stop")
    p.add_argument("--fake", action="store_true", help="no device: NumPy stand-in (tests this script only)")
    p.add_argument(
        "--table",
        metavar="FILE",
        help="print the table (and its rows for rawgraph.ops.SGEMM_TABLE) of "
        "gemm_sweep.json or partial.jsonl from an earlier run, and stop",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def grid_shapes(a) -> list[tuple[int, int]]:
    if a.quick and not a.rows and not a.widths:
        return list(QUICK)
    widths = a.widths or list(WIDTHS)
    rows = parse_rows(a.rows) if a.rows else list(ROWS)
    if a.quick:
        rows = [r for r in rows if r in (64, 136, 256)] or rows[:3]
    bad = [(m, w) for w in widths for m in rows if w % 4 or m < 1]
    if bad:
        raise SystemExit(f"K = N must be a multiple of 4 and M >= 1: {bad}")
    return [(m, w) for w in widths for m in rows]


def gpu_status() -> tuple[bool, str]:
    try:
        import rawgraph

        return rawgraph.driver_status()
    except Exception:  # noqa: BLE001 - rawgraph moved or absent: ask the driver directly
        pass
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return False, f"cuInit failed: {err}"
        err, count = driver.cuDeviceGetCount()
        return (int(err) == 0 and count > 0), f"{count} GPU(s)"
    except Exception as exc:  # noqa: BLE001
        return False, f"no CUDA driver ({type(exc).__name__}: {exc})"


def compile_only(a, shapes, reason: str) -> int:
    sms = 132
    names = sorted({c.expr("none") for m, w in shapes for c in with_cuts(candidates(m, w, w, sms, a.max_cands), a.cut)})
    cur_cuts = [current_cut(m, w, w, sms) for m, w in shapes] if not a.no_current else []
    jobs: dict[str, set] = {"sgemm": set(names), "matmul": set()}
    for c in cur_cuts:  # today's cut: an sgemm table entry or a matmul.cu cut, each from its own file
        jobs[c.file].add(c.expr("none"))
    cur = [(f, n) for f in jobs for n in jobs[f] if not (f == "sgemm" and n in names)]
    log(f"{len(shapes)} shapes: {len(names)} sgemm cuts and {len(cur)} current cuts to compile for sm_90")
    got = compile_all({f: sorted(v) for f, v in jobs.items()}, "sm_90", a.jobs)
    failed = [n for n in names if ("sgemm", n) not in got] + [n for f, n in cur if (f, n) not in got]
    log(f"{'expression':<62s} {'regs':>4s} {'spill st/ld':>11s} {'smem KB':>7s}")
    for (_f, n), rec in sorted(got.items()):
        p = rec["ptxas"]
        cut = _parse_cut(n)
        smem = f"{cut.smem / 1024:7.1f}" if cut else "      -"
        log(
            f"{n:<62s} {p.get('registers', -1):4d} {p.get('spill_stores', -1):5d}/{p.get('spill_loads', -1):<5d} {smem}"
        )
    spills = [n for (f, n), rec in got.items() if rec["ptxas"].get("spill_stores", 0) > 0]
    log(
        f"{len(got)} compiled, {len(failed)} failed{': ' + str(failed) if failed else ''}; "
        f"{len(spills)} with spills{': ' + ', '.join(spills) if spills else ''}"
    )
    log(f"no GPU: {reason}; compiled only, nothing timed" if reason else "compiled only, nothing timed")
    return 1 if failed else 0


def _parse_cut(expr: str) -> Cut | None:
    mt = re.match(r"sgemm(_split)?_kernel<(.*)>", expr)
    if not mt:
        return None
    v = [int(t) for t in mt.group(2).split(",")]
    if not mt.group(1):
        v.insert(5, 1)  # S = 1
    tm = v[8] if len(v) > 8 else 8
    _, bm, bn, bk, st, s, ks, mb = v[:8]
    return Cut(bm, bn, bk, st, s, ks, mb, tm)


def child_main(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = grid_shapes(a)
    dev = FakeCuda() if a.fake else Cuda()
    sweep = Sweep(a, dev, out)
    try:
        result = sweep.run(shapes)
    except StickyError as exc:
        log(
            f"STICKY CUDA ERROR: {exc} (running: {sweep.inflight.read_text().strip() if sweep.inflight.exists() else '?'})"
        )
        return EXIT_STICKY
    result["best_cuts"] = best_cuts(result)
    (out / "gemm_sweep.json").write_text(json.dumps(result, indent=1))
    log("")
    log(table(result))
    log(cuts_literal(result))
    log(f"json: {out / 'gemm_sweep.json'}  ({result['seconds']:.0f} s in the sweep)")
    return 0


def parent_main(a, argv) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("partial.jsonl", "excluded.txt", "inflight.txt"):
        (out / f).unlink(missing_ok=True)
    t0 = time.perf_counter()
    for attempt in range(4):
        child_argv = [sys.executable, str(Path(__file__).resolve()), "--child", *argv]
        if attempt:
            spent = time.perf_counter() - t0
            child_argv += ["--budget-s", str(max(10.0, a.budget_s - spent))]
        proc = subprocess.Popen(
            child_argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        last = time.perf_counter()
        stalled = False
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 5.0)
            if ready:
                ln = proc.stdout.readline()
                if not ln:
                    break
                sys.stdout.write(ln)
                sys.stdout.flush()
                last = time.perf_counter()
            elif proc.poll() is not None:
                break
            elif time.perf_counter() - last > a.stall_s:
                log(f"child silent for {a.stall_s:.0f} s: killing it (a hung kernel?)")
                proc.kill()
                stalled = True
                break
        rc = proc.wait()
        if rc == 0 and not stalled:
            return 0
        inflight = (out / "inflight.txt").read_text().strip() if (out / "inflight.txt").exists() else ""
        if not inflight:
            log(f"child exited with {rc} and no cut in flight: giving up")
            return rc or 1
        with open(out / "excluded.txt", "a") as f:
            f.write(inflight + "\n")
        (out / "inflight.txt").unlink(missing_ok=True)
        log(f"child exited with {rc} while running {inflight}: excluded, resuming")
    return 1


def best_cuts(result: dict) -> dict:
    """ "M,K,N" -> the best cut's parameters (what ops.matmul_shape would look up)."""
    return {f"{r['M']},{r['K']},{r['N']}": r["best_cut"] for r in result["rows"] if r.get("best")}


def cuts_literal(result: dict) -> str:
    """The best cuts as ``rawgraph.ops.SGEMM_TABLE`` holds them (``ops.format_sgemm_table``: a header
    row of named columns, one row per shape), ready to paste; the timings stay in the table above
    (they go to benchmarks/NOTES.md, not into the library)."""
    from rawgraph import ops

    cuts = {(r["M"], r["K"], r["N"]): Cut(**r["best_cut"]).record for r in result["rows"] if r.get("best")}
    return 'SGEMM_TABLE = """\n' + ops.format_sgemm_table(cuts) + '\n"""'


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.table:
        text = Path(a.table).read_text()
        if a.table.endswith(".jsonl"):  # a run cut off before its JSON: the shapes it finished
            rows = {}
            for ln in text.splitlines():
                if ln.strip():
                    rd = json.loads(ln)
                    rows[(rd["M"], rd["K"])] = rd
            result = {"rows": [rows[s] for s in sorted(rows, key=lambda s: (s[1], s[0]))]}
        else:
            result = json.loads(text)
        log(table(result))
        log(cuts_literal(result))
        return 0
    shapes = grid_shapes(a)
    if a.child:
        return child_main(a)
    if a.fake:
        return parent_main(a, argv)
    ok, reason = gpu_status()
    if a.compile_only or not ok:
        return compile_only(a, shapes, "" if ok else reason)
    return parent_main(a, argv)


if __name__ == "__main__":
    sys.exit(main())
