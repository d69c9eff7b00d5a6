"""CPU check of kernels/tf32x3.cu: runs the kernel source on the host, one std::thread per CUDA thread.

No GPU needed. The .cu file is compiled with g++ (C++20, AddressSanitizer + UBSan) against
sgemm_emulate.py's shim of the CUDA features the GEMMs use (thread and block indices, barriers,
cluster barriers and distributed shared memory, cp.async groups, rawgraph.cuh's helpers) and this
file's additions for the tensor-core path:

* ``cvt.rna.tf32.f32``: round to nearest, ties away from zero, to 10 stored mantissa bits (the
  low 13 bits zero); inf and NaN stay inf and NaN.
* ``ldmatrix.sync.aligned.m8n8.x4.b16`` and ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``
  as warp-wide exchanges: every lane of the warp puts its row address or its fragments into the
  warp's staging area, waits for all 32 (a per-warp barrier), and takes its result by the PTX ISA
  fragment layouts (A: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); B: b0 (k = t,
  n = g), b1 (k = t + 4, n = g); C / D: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1);
  g = lane / 4, t = lane % 4). The mma reads its operands as tf32 (the low 13 bits ignored) and
  forms the 8 products exactly. ``--mma truncate`` (the default) then adds them as published
  measurements of V100 / A100 tensor cores describe: C and the products aligned to the largest
  of them with 3 guard bits (bits below cut off toward zero), the sum rounded toward zero to fp32.
  ``--mma exact`` sums in double and rounds once to nearest (a tensor core without truncation).
  The first model is what makes the accumulation runs of tf32x3.cu (FLUSH) necessary; both
  check the indexing and the 3xTF32 split. A lane that reaches a different collective than the
  others (divergence inside a .aligned instruction) is an error.

Each case launches a whole grid (a cluster's CTAs run together) on random inputs (normal, or rows
scaled over 8 orders of magnitude) and checks every output against a float64 product within the
3xTF32 bound |y - ref| <= (2^-20 + (K + 8 P + 64) 2^-24) (|x| @ |W|) + 2^-23 |ref| (operand
splitting leaves 2^-22 |x| |w| a product three times over; three truncating mma's per 8 steps of
k, each off by less than 2.3 ulp of its addends, and one rounding per run, partial and
epilogue), the whole output's relative Frobenius error against 1e-6 (the split working: TF32
alone gives ~1e-4, a missing correction term ~5e-5), that rows a row table leaves out keep their
NaN poison, that a NaN in x reaches every output of its row, and that the shared memory the kernel
uses is what ``rawgraph.ops.tf32x3_smem_bytes`` asks for.

cp.async copies are applied at issue (mode 0), at the cp.async.wait that covers them (mode 1: a
read before its wait sees stale data) or at random in between (mode 2), so pipeline-order
mistakes show up as wrong results. Races between real warps are not modelled: that is
compute-sanitizer's job (racecheck / synccheck) on the GPU.

    python3 benchmarks/tf32x3_emulate.py             # every case, a few minutes on 2 cores
    python3 benchmarks/tf32x3_emulate.py --quick     # one case of each form
    python3 benchmarks/tf32x3_emulate.py --mma exact # tensor cores that round to nearest
    python3 benchmarks/tf32x3_emulate.py --keep DIR  # keep the generated sources and binary

Exit status 0 when every case passes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sgemm_emulate import SHIM, write_tile_header  # noqa: E402  (the shared CUDA shim)

# Harness-only flag bits (above the kernel's): y and r one float off 16-byte alignment; x rows
# scaled by 10^u, u uniform in [-4, 4]; one NaN in x; the error no more than an FFMA loop's (fp32,
# k in order) on the same inputs; the error reported, not judged.
MISALIGNED, SCALED_ROWS, NAN_IN_X, VS_FFMA, REPORT_ONLY = 256, 512, 1024, 2048, 4096
KERNEL_FLAGS = 0xFF

TENSOR_SHIM = r"""
// ---- the tensor-core path: tf32 rounding, ldmatrix and mma.sync as warp-wide exchanges ----
#include <bit>
#include <string>
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline void tx_bar_sync(int id, int count) { sg_bar_sync(id, count); }

// cvt.rna.tf32.f32: finite values round to nearest, ties away from zero (an add of half an ulp of
// the 10-bit mantissa to the magnitude bits, then truncation); inf and NaN stay inf and NaN.
inline unsigned tx_tf32(float v) {
    const unsigned u = __float_as_uint(v);
    if (std::isnan(v)) return (u & 0xffffe000u) | 0x00400000u;
    if (std::isinf(v)) return u;
    return (u + 0x1000u) & 0xffffe000u;
}

struct EmuWarp {
    std::barrier<> bar{32};
    struct Lane { int op; long seq; const float* row; unsigned a[4], b[2]; } slot[2][32];
};
extern thread_local EmuWarp* emu_warp;
extern thread_local int emu_lane;
extern thread_local int emu_slot;
extern thread_local long emu_seq;

// Stage this lane's part of collective `op`, wait for the whole warp, check that every lane is in
// the same collective. Two staging slots, used alternately: a lane writes slot s again only after
// the barrier of the next collective, which every lane reaches after reading slot s.
inline EmuWarp::Lane* emu_exchange(const EmuWarp::Lane& mine) {
    EmuWarp::Lane* s = emu_warp->slot[emu_slot];
    s[emu_lane] = mine;
    s[emu_lane].seq = emu_seq;
    emu_warp->bar.arrive_and_wait();
    for (int l = 0; l < 32; ++l)
        if (s[l].op != mine.op || s[l].seq != emu_seq) emu_fail("lanes of a warp in different collectives (divergence)");
    emu_slot ^= 1;
    emu_seq++;
    return s;
}

inline void tx_ldmatrix4(unsigned (&r)[4], const float* row) {
    const ptrdiff_t off = row - emu_cta->smem;
    if (off < 0 || (size_t)off + 4 > emu_cta->smem_floats) emu_fail("ldmatrix row outside shared memory");
    if (off % 4) emu_fail("ldmatrix row misaligned");
    EmuWarp::Lane mine{};
    mine.op = 1;
    mine.row = row;
    const EmuWarp::Lane* s = emu_exchange(mine);
    for (int i = 0; i < 4; ++i) r[i] = __float_as_uint(s[8 * i + emu_lane / 4].row[emu_lane % 4]);
}

inline double emu_tf32_value(unsigned u) { return (double)__uint_as_float(u & 0xffffe000u); }
extern bool emu_mma_truncates;

// C + the 8 products as a tensor core adds them (see the module docstring).
inline float emu_tc_sum(const double (&v)[9]) {
    double m = 0, exact = 0;
    for (double e : v) { m = std::max(m, std::fabs(e)); exact += e; }
    if (!emu_mma_truncates || !std::isfinite(exact) || m == 0) return (float)exact;
    const double q = std::ldexp(1.0, std::ilogb(m) - 26);  // 3 guard bits below the largest addend's ulp
    double sum = 0;
    for (double e : v) sum += std::trunc(e / q) * q;     // exact: few bits, one exponent range
    float f = (float)sum;
    if (std::fabs((double)f) > std::fabs(sum)) f = std::nextafter(f, 0.0f);  // toward zero
    return f;
}

inline void tx_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    EmuWarp::Lane mine{};
    mine.op = 2;
    for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
    mine.b[0] = b0;
    mine.b[1] = b1;
    const EmuWarp::Lane* s = emu_exchange(mine);
    const int g = emu_lane / 4, t = emu_lane % 4;
    for (int q = 0; q < 4; ++q) {
        const int row = g + 8 * (q / 2), col = 2 * t + (q % 2);
        double v[9];
        v[8] = d[q];
        for (int k = 0; k < 8; ++k) {
            const unsigned av = s[(row % 8) * 4 + k % 4].a[(row / 8) + 2 * (k / 4)];
            const unsigned bv = s[col * 4 + k % 4].b[k / 4];
            v[k] = emu_tf32_value(av) * emu_tf32_value(bv);
        }
        d[q] = emu_tc_sum(v);
    }
}

inline void tx_mma_z(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    for (float& e : d) e = 0.0f;
    tx_mma(d, a, b0, b1);
}
"""

RUNNER = r"""#include "shim.h"
#include <atomic>
#include <pthread.h>
thread_local emu_uint3 threadIdx, blockIdx;
thread_local EmuCta* emu_cta;
thread_local EmuCluster* emu_cluster;
thread_local unsigned emu_rank;
thread_local std::optional<std::barrier<>::arrival_token> emu_token;
thread_local std::vector<EmuCopy> emu_open;
thread_local std::vector<std::vector<EmuCopy>> emu_groups;
thread_local std::mt19937 emu_rng;
thread_local EmuWarp* emu_warp;
thread_local int emu_lane;
thread_local int emu_slot;
thread_local long emu_seq;
int emu_mode = 0;
bool emu_mma_truncates = true;
std::atomic<long> emu_errors{0};

#include "tf32x3_emu.cu"

typedef void (*KernelFn)(const float*, const float*, float*, const float*, int, int, int, int, const int*);

struct ThreadArg { KernelFn fn; EmuCluster* cl; EmuCta* cta; EmuWarp* warp; unsigned rank; unsigned tid; emu_uint3 bid;
                   const float* x; const float* W; float* y; const float* r; int M, K, N, flags; const int* rows; };
static void* thread_main(void* p) {
    ThreadArg* a = static_cast<ThreadArg*>(p);
    threadIdx = {a->tid, 0, 0};
    blockIdx = a->bid;
    emu_cta = a->cta; emu_cluster = a->cl; emu_rank = a->rank;
    emu_warp = a->warp; emu_lane = (int)(a->tid % 32); emu_slot = 0; emu_seq = 0;
    emu_rng.seed(a->tid * 7919u + a->bid.x * 131u + a->bid.y * 17u + a->bid.z);
    emu_open.clear(); emu_groups.clear();
    a->fn(a->x, a->W, a->y, a->r, a->M, a->K, a->N, a->flags, a->rows);
    if (!emu_open.empty()) emu_fail("uncommitted cp.async at exit");
    return nullptr;
}

static void launch(KernelFn fn, int S, int threads, long smem_floats, int gx, int gz,
                   const float* x, const float* W, float* y, const float* r, int M, int K, int N, int flags, const int* rows) {
    if (threads % 32) { fprintf(stderr, "threads not whole warps\n"); abort(); }
    for (int bz = 0; bz < gz; ++bz)
        for (int bx = 0; bx < gx; ++bx) {
            EmuCluster cl;
            std::vector<std::unique_ptr<EmuCta>> ctas;
            std::vector<std::unique_ptr<EmuWarp[]>> warps;
            for (int q = 0; q < S; ++q) {
                ctas.emplace_back(new EmuCta);
                ctas.back()->smem = static_cast<float*>(aligned_alloc(16, ((smem_floats * 4 + 15) / 16) * 16));
                for (long i = 0; i < smem_floats; ++i) ctas.back()->smem[i] = NAN;  // garbage
                ctas.back()->smem_floats = smem_floats;
                ctas.back()->bar0.reset(new std::barrier<>(threads));
                cl.ctas.push_back(ctas.back().get());
                warps.emplace_back(new EmuWarp[threads / 32]);
            }
            cl.cbar.reset(new std::barrier<>(S * threads));
            std::vector<ThreadArg> args(S * threads);
            std::vector<pthread_t> th(S * threads);
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setstacksize(&attr, 1 << 20);
            for (int q = 0; q < S; ++q)
                for (int t = 0; t < threads; ++t) {
                    ThreadArg& a = args[q * threads + t];
                    a = ThreadArg{fn, &cl, ctas[q].get(), &warps[q][t / 32], (unsigned)q, (unsigned)t,
                                  {(unsigned)bx, (unsigned)q, (unsigned)bz}, x, W, y, r, M, K, N, flags, rows};
                    if (pthread_create(&th[q * threads + t], &attr, thread_main, &a)) { perror("pthread_create"); abort(); }
                }
            for (auto& t : th) pthread_join(t, nullptr);
            for (auto& c : ctas) free(c->smem);
        }
}

static int failures = 0;

template <int EPI, int BM, int BN, int BK, int ST, int S, int KS, int WM, int WN, int FLUSH>
static void test(int M, int K, int N, int flags, unsigned seed, long py_smem_floats) {
    typedef Tf32x3Cfg<BM, BN, BK, ST, S, KS, WM, WN, FLUSH> C;
    const long smem = tf32x3_smem_floats<BM, BN, BK, ST, S, KS, WM, WN>();
    bool ok = smem == py_smem_floats;
    if (!ok) printf("SMEM MISMATCH: kernel %ld floats, rawgraph.ops %ld\n", smem, py_smem_floats);
    std::mt19937 g(seed);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(-4.0f, 4.0f);
    const bool rx = flags & RG_FLAG_ROWS_X, ry = flags & RG_FLAG_ROWS_Y, rr = flags & RG_FLAG_ROWS_R;
    const int cap = M + 5;   // slots when rows are routed
    std::vector<int> rows(M);
    {
        std::vector<int> perm(cap);
        for (int i = 0; i < cap; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), g);
        for (int i = 0; i < M; ++i) rows[i] = perm[i];
    }
    const int xrows = rx ? cap : M, yrows = ry ? cap : M, rrows = rr ? cap : M;
    std::vector<float> x((size_t)xrows * K), W((size_t)K * N), r((size_t)rrows * N + 1), y((size_t)yrows * N + 1, NAN);
    for (auto& v : x) v = nd(g);
    for (auto& v : W) v = nd(g);
    for (auto& v : r) v = nd(g);
    if (flags & 512)
        for (int m = 0; m < xrows; ++m) {
            const float s = std::pow(10.0f, ud(g));
            for (int k = 0; k < K; ++k) x[(size_t)m * K + k] *= s;
        }
    const int nan_m = (flags & 1024) ? M / 2 : -1;   // batch row whose x row holds a NaN
    if (nan_m >= 0) x[(size_t)(rx ? rows[nan_m] : nan_m) * K + K / 3] = NAN;
    // misaligned y / r (the epilogue's scalar stores) when harness bit 256 is set
    float* yp = y.data() + ((flags & 256) ? 1 : 0);
    const float* rp = r.data() + ((flags & 256) ? 1 : 0);
    const int kflags = flags & 0xff;
    KernelFn fn;
    if constexpr (S == 1) fn = &tf32x3_kernel<EPI, BM, BN, BK, ST, KS, 1, WM, WN, FLUSH>;
    else fn = &tf32x3_split_kernel<EPI, BM, BN, BK, ST, S, KS, 1, WM, WN, FLUSH>;
    const float* xarg = x.data(); float* yarg = yp; const float* rarg = EPI == 2 ? rp : nullptr;
    static unsigned long long slots[3];
    slots[0] = (unsigned long long)xarg; slots[1] = (unsigned long long)yarg; slots[2] = (unsigned long long)rarg;
    if (kflags & RG_FLAG_IND_X) xarg = reinterpret_cast<const float*>(&slots[0]);
    if (kflags & RG_FLAG_IND_Y) yarg = reinterpret_cast<float*>(&slots[1]);
    if (kflags & RG_FLAG_IND_R) rarg = reinterpret_cast<const float*>(&slots[2]);
    launch(fn, S, C::THREADS, smem, (N + BN - 1) / BN, (M + BM - 1) / BM, xarg, W.data(), yarg, rarg,
           M, K, N, kflags, rows.data());
    // every output against float64, within the 3xTF32 bound; the Frobenius norm of the error
    const int P = S * KS;
    const double u = std::ldexp(1.0, -24);
    long bad = 0, nan_left = 0, nan_lost = 0, overwritten = 0;
    double maxrel = 0, e2 = 0, r2 = 0, f2 = 0;
    std::vector<char> written(yrows, 0);
    for (int m = 0; m < M; ++m) {
        const int xm = rx ? rows[m] : m, ym = ry ? rows[m] : m, rm = rr ? rows[m] : m;
        written[ym] = 1;
        for (int n = 0; n < N; ++n) {
            const float got = yp[(size_t)ym * N + n];
            if (m == nan_m) { if (!std::isnan(got)) nan_lost++; continue; }
            double s = 0, sa = 0;
            float ffma = 0.0f;  // an fp32 FMA loop, k in order
            for (int k = 0; k < K; ++k) {
                const double p = (double)x[(size_t)xm * K + k] * W[(size_t)k * N + n];
                s += p;
                sa += fabs(p);
                ffma = std::fmaf(x[(size_t)xm * K + k], W[(size_t)k * N + n], ffma);
            }
            double ref = s;
            if (EPI == 1) ref = ref < 0 ? 0 : ref;
            if (EPI == 2) ref += rp[(size_t)rm * N + n];
            const double bound = (16 * u + (K + 8 * P + 64) * u) * sa + 2 * u * fabs(ref) + 1e-37;
            if (std::isnan(got)) { nan_left++; continue; }
            const double err = fabs(got - ref);
            if (!(err <= bound)) bad++;
            maxrel = std::max(maxrel, err / (sa + 1e-30));
            e2 += err * err;
            r2 += ref * ref;
            f2 += (ffma - s) * (ffma - s);
        }
    }
    for (int m = 0; m < yrows; ++m)
        if (!written[m])
            for (int n = 0; n < N; ++n) if (!std::isnan(yp[(size_t)m * N + n])) overwritten++;
    const double fro = std::sqrt(e2 / (r2 + 1e-300)), ffma_fro = std::sqrt(f2 / (r2 + 1e-300));
    const bool judged = !(flags & 4096);
    ok = ok && (bad == 0 || !judged) && nan_left == 0 && nan_lost == 0 && overwritten == 0 && (fro < 1e-6 || !judged)
         && (!(flags & 2048) || fro <= ffma_fro) && emu_errors == 0;
    if (!ok) failures++;
    printf("%s EPI%d BM%d BN%d BK%d ST%d S%d KS%d WM%d WN%d FL%d  M=%d K=%d N=%d flags=%d mode=%d: bad=%ld nan=%ld "
           "nan_lost=%ld overwritten=%ld maxrel=%.2e fro=%.2e (ffma loop %.2e)%s\n",
           ok ? "ok  " : "FAIL", EPI, BM, BN, BK, ST, S, KS, WM, WN, FLUSH, M, K, N, flags, emu_mode, bad, nan_left,
           nan_lost, overwritten, maxrel, fro, ffma_fro, judged ? "" : " [reported, not judged]");
    fflush(stdout);
}

int main(int argc, char** argv) {
    emu_mma_truncates = !(argc > 1 && std::string(argv[1]) == "exact");
#include "cases.inc"
    printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
"""


@dataclass(frozen=True)
class Case:
    """One emulated launch: a cut of tf32x3.cu (template arguments) and the product it runs."""

    epi: int
    bm: int
    bn: int
    bk: int
    stages: int
    split: int
    slices: int
    wm: int
    wn: int
    flush: int
    m: int
    k: int
    n: int
    flags: int = 0
    mode: int = 2
    seed: int = 1
    quick: bool = False  # one of the --quick subset
    why: str = ""

    def line(self) -> str:
        from rawgraph.ops.gemm import tf32x3_smem_bytes

        smem = tf32x3_smem_bytes(self.bm, self.bn, self.bk, self.stages, self.split, self.slices) // 4
        args = (self.epi, self.bm, self.bn, self.bk, self.stages, self.split, self.slices, self.wm, self.wn, self.flush)
        return (
            f"emu_mode = {self.mode}; test<{', '.join(map(str, args))}>({self.m}, {self.k}, {self.n}, {self.flags}, "
            f"{self.seed}, {smem});  // {self.why}"
        )


ROWS = 16 | 32 | 64
IND = 2 | 4 | 8
# (EPI, BM, BN, BK, STAGES, S, KS, WM, WN, FLUSH, M, K, N): FLUSH 0 (the two-accumulator form, which
# the truncating model makes lose accuracy with K) only where K is short.
CASES = [
    # every warp tile (16..64 x 32 and 16, 32 x 64) and run length, no split: the epilogue from registers
    Case(0, 64, 64, 16, 3, 1, 1, 32, 32, 2, 70, 96, 132, mode=0, seed=11, quick=True, why="no split, tails in M and N"),
    Case(1, 128, 64, 32, 4, 1, 1, 64, 32, 4, 130, 128, 68, mode=1, seed=12, why="64 x 32 warps, relu, runs of 4"),
    Case(2, 32, 128, 8, 2, 1, 1, 32, 64, 1, 33, 88, 256, mode=1, seed=13, quick=True, why="32 x 64 warps, BK 8, add"),
    Case(0, 48, 64, 16, 3, 1, 1, 48, 32, 0, 50, 64, 100, mode=0, seed=14, why="48-row warps, two accumulators"),
    Case(2, 16, 64, 8, 2, 1, 1, 16, 32, 1, 7, 40, 64, seed=15, why="16-row warp tile, M < tile"),
    Case(1, 32, 128, 16, 3, 1, 1, 16, 64, 2, 20, 64, 132, seed=16, why="16 x 64 warps"),
    Case(0, 128, 128, 32, 4, 1, 1, 64, 32, 2, 130, 96, 132, mode=1, seed=17, why="the 128 x 128 tile of the table"),
    # cluster splits (also not a power of two) and in-CTA slices, every epilogue
    Case(2, 64, 64, 16, 3, 2, 1, 32, 32, 2, 72, 200, 132, mode=0, seed=21, quick=True, why="cluster split 2, K tail"),
    Case(0, 32, 64, 8, 4, 3, 1, 16, 32, 1, 40, 264, 64, mode=1, seed=22, why="cluster split 3"),
    Case(
        1,
        64,
        64,
        8,
        3,
        1,
        2,
        32,
        32,
        0,
        64,
        128,
        64,
        mode=2,
        seed=23,
        quick=True,
        why="2 in-CTA slices, two accumulators",
    ),
    Case(2, 32, 64, 16, 2, 2, 2, 16, 32, 2, 33, 256, 68, mode=1, seed=24, why="split and slices"),
    Case(0, 16, 32, 8, 2, 8, 1, 16, 32, 1, 9, 160, 36, mode=2, seed=25, why="cluster split 8: 2 rows per rank"),
    Case(2, 32, 32, 8, 3, 2, 4, 32, 32, 1, 24, 64, 64, mode=0, seed=26, why="4 slices (named barriers 1..4)"),
    # row tables, pointer slots, misaligned y / r, empty K parts, tiny M, NaN in x, scaled rows
    Case(2, 64, 64, 16, 3, 2, 1, 32, 32, 2, 50, 96, 64, ROWS, seed=31, quick=True, why="row tables, split"),
    Case(
        2,
        32,
        64,
        8,
        3,
        1,
        1,
        16,
        32,
        1,
        37,
        64,
        132,
        ROWS | IND | 1 | MISALIGNED,
        seed=32,
        quick=True,
        why="row tables, pointer slots, misaligned y / r, no split",
    ),
    Case(
        2,
        32,
        64,
        16,
        3,
        2,
        2,
        32,
        32,
        1,
        30,
        64,
        68,
        MISALIGNED | 64,
        seed=33,
        why="misaligned y / r, scattered y, split and slices",
    ),
    Case(0, 32, 64, 8, 2, 8, 1, 16, 32, 1, 5, 40, 64, seed=34, why="K shorter than the parts: empty K parts"),
    Case(1, 16, 32, 8, 2, 1, 1, 16, 32, 1, 1, 8, 4, seed=35, quick=True, why="the smallest product"),
    Case(2, 64, 64, 8, 3, 2, 1, 32, 32, 1, 40, 96, 64, NAN_IN_X | ROWS, seed=36, quick=True, why="a NaN in x, routed"),
    Case(
        0,
        32,
        64,
        16,
        3,
        1,
        1,
        32,
        32,
        2,
        48,
        512,
        64,
        SCALED_ROWS | VS_FFMA,
        seed=37,
        quick=True,
        why="rows scaled over 8 orders of magnitude, K 512",
    ),
    Case(
        2,
        64,
        64,
        32,
        3,
        2,
        2,
        32,
        32,
        2,
        64,
        1024,
        64,
        SCALED_ROWS | VS_FFMA,
        seed=38,
        why="scaled rows, K 1024, split and slices",
    ),
    # the accuracy of the accumulation against an FFMA loop at K = 1024 (no split: one long sum)
    Case(0, 64, 64, 32, 3, 1, 1, 64, 32, 2, 64, 1024, 64, VS_FFMA, seed=40, quick=True, why="runs of 2 k8 steps"),
    Case(0, 64, 64, 32, 3, 1, 1, 64, 32, 4, 64, 1024, 64, VS_FFMA, seed=40, why="runs of 4 k8 steps"),
    Case(
        0,
        64,
        64,
        32,
        3,
        1,
        1,
        64,
        32,
        0,
        64,
        1024,
        64,
        REPORT_ONLY,
        seed=40,
        why="two accumulators over all K: reported only (the truncating model makes it worse than FFMA)",
    ),
    Case(0, 64, 128, 32, 4, 1, 1, 64, 32, 4, 64, 32, 128, mode=1, seed=39, why="128 x 64 warp grid: 4 warps along N"),
]


def prepare_source(text: str) -> str:
    """tf32x3.cu for the host: rawgraph.cuh and the dynamic shared memory come from the shim."""
    text = text.replace('#include "rawgraph.cuh"', "// rawgraph.cuh: replaced by shim.h")
    text, n = re.subn(r"extern __shared__ __align__\(16\) float smem\[\];", "float* const smem = emu_cta->smem;", text)
    if n != 1:
        raise SystemExit("tf32x3_emulate: the dynamic shared memory declaration was not found")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one case of each form (the CPU test's subset)")
    p.add_argument(
        "--mma",
        choices=("truncate", "exact"),
        default="truncate",
        help="how the emulated tensor core adds into its accumulator",
    )
    p.add_argument("--keep", help="write the generated files here and keep them")
    p.add_argument("--source", default=str(ROOT / "kernels" / "tf32x3.cu"))
    p.add_argument("--cxx", default=shutil.which("g++") or "g++")
    a = p.parse_args(argv)
    cases = [c for c in CASES if c.quick or not a.quick]
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="tf32x3_emu_"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "shim.h").write_text(SHIM + TENSOR_SHIM)
    write_tile_header(Path(a.source).parent, work)
    (work / "runner.cpp").write_text(RUNNER)
    (work / "cases.inc").write_text("\n".join(c.line() for c in cases) + "\n")
    (work / "tf32x3_emu.cu").write_text(prepare_source(Path(a.source).read_text()))
    cmd = [
        a.cxx,
        "-std=c++20",
        "-O1",
        "-g",
        "-fno-strict-aliasing",
        "-fsanitize=address,undefined",
        "-pthread",
        "runner.cpp",
        "-o",
        "runner",
    ]
    print("building:", " ".join(cmd), f"({len(cases)} cases)", flush=True)
    if subprocess.run(cmd, cwd=work).returncode:
        return 2
    rc = subprocess.run([str(work / "runner"), a.mma], cwd=work).returncode
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
