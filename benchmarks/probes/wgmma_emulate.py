"""CPU check of kernels/tf32x3_wgmma.cu: runs the kernel source on the host, one std::thread per CUDA thread.

No GPU needed. The .cu file is compiled with g++ (C++20, AddressSanitizer + UBSan) against the
shim of ``benchmarks/sgemm_emulate.py`` and ``benchmarks/tf32x3_emulate.py`` (thread and block
indices, barriers, clusters and distributed shared memory, cp.async groups, tf32 rounding,
ldmatrix as a warp-wide exchange, the tensor core's truncating addition) and this file's
additions for the warpgroup instructions, written from the PTX ISA and CUTLASS's layouts, not from
the kernel:

* ``wgmma.mma_async.sync.aligned.m64nNk8.f32.tf32.tf32 d, a, b-desc, scale-d, 1, 1`` as a
  warpgroup-wide exchange: every lane of the 128 puts its A registers, descriptor and scale-d into
  the warpgroup's staging area and waits for all; lanes that disagree on the descriptor, scale-d
  or N, or reach a different collective, are an error. A register fragment (ALayout_64x8): lane
  4g + t of warp w holds a0 (16w + g, t), a1 (16w + g + 8, t), a2 (16w + g, t + 4),
  a3 (16w + g + 8, t + 4). D (CLayout_64xN): register i is row 16w + g + 8 ((i >> 1) & 1), column
  8 (i >> 2) + 2t + (i & 1). B is read through the descriptor as the canonical K-major
  unswizzled layout: start address bits 0-13, LBO bits 16-29, SBO bits 32-45 (each >> 4), base
  offset bits 49-51 and layout type bits 62-63 required 0; element (n, k) at byte
  start + (n / 8) SBO + 16 (n % 8) + (k / 4) LBO + 4 (k % 4) of shared memory (bounds checked).
  Each output is C (or 0 when scale-d is false) plus the 8 exact tf32 products, added as the
  tensor core does (``--mma``, as tf32x3_emulate.py).
* Asynchrony: a wgmma is executed at issue (mode 0) or at the ``wgmma.wait_group 0`` that
  completes it (modes 1 and 2: shared memory read then, D written then), so a split buffer
  rewritten, or an accumulator read, before the wait shows as a wrong result. A commit_group
  left open at the wait, or a wgmma never waited for, is an error.
* ``wgmma.fence``, ``wgmma.commit_group``, ``wgmma.wait_group`` as warpgroup collectives (a lane
  that skips one is an error); ``fence.proxy.async`` a no-op (proxies are not modelled: that and
  races between real warps are compute-sanitizer's job on the GPU).

Each case launches a whole grid on random inputs and checks every output against float64 within
tf32x3_emulate.py's 3xTF32 bound, the relative Frobenius error against 1e-6, NaN propagation,
row tables and pointer slots, untouched rows, and that the kernel's shared-memory size is what
``rawgraph.ops.tf32x3_wgmma_smem_bytes`` asks for.

    python3 benchmarks/probes/wgmma_emulate.py            # every case, a few minutes on 2 cores
    python3 benchmarks/probes/wgmma_emulate.py --quick    # the CPU test's subset
    python3 benchmarks/probes/wgmma_emulate.py --keep DIR # keep the generated sources and binary

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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sgemm_emulate import SHIM, write_tile_header  # noqa: E402
from tf32x3_emulate import RUNNER as TF32X3_RUNNER  # noqa: E402
from tf32x3_emulate import TENSOR_SHIM  # noqa: E402

WGMMA_SHIM = r"""
// ---- the warpgroup path: wgmma as a warpgroup-wide exchange, descriptors decoded ----
#include <functional>
#include <mutex>
inline unsigned wx_tf32(float v) { return tx_tf32(v); }
inline void wx_ldmatrix4(unsigned (&r)[4], const float* row) { tx_ldmatrix4(r, row); }
inline unsigned wx_smem_addr(const void* p) {
    const ptrdiff_t off = static_cast<const float*>(p) - emu_cta->smem;
    if (off < 0 || (size_t)off > emu_cta->smem_floats) emu_fail("descriptor base outside shared memory");
    return (unsigned)(off * 4);
}
inline void wx_fence_proxy_async() {}
inline void wx_pin(float&) {}

struct EmuWg {
    std::barrier<> bar{128};
    struct Lane { int op; long seq; int n; int acc; unsigned long long desc; unsigned a[4]; } slot[2][128];
};
struct EmuPending { int n, acc; unsigned long long desc; unsigned a[32][4]; float* d; };
extern std::mutex emu_wg_mu;
extern std::map<std::pair<EmuCta*, int>, std::unique_ptr<EmuWg>> emu_wgs;
extern thread_local EmuWg* emu_wg;
extern thread_local EmuCta* emu_wg_cta;
extern thread_local int emu_wslot;
extern thread_local long emu_wseq;
extern thread_local std::vector<EmuPending> emu_issued;   // wgmma's issued, not yet committed
extern thread_local std::vector<std::vector<EmuPending>> emu_committed;  // commit groups, oldest first

inline EmuWg* emu_my_wg() {
    if (emu_wg == nullptr || emu_wg_cta != emu_cta) {
        std::lock_guard<std::mutex> g(emu_wg_mu);
        auto& p = emu_wgs[{emu_cta, (int)threadIdx.x / 128}];
        if (!p) p.reset(new EmuWg);
        emu_wg = p.get();
        emu_wg_cta = emu_cta;
        emu_wslot = 0;
        emu_wseq = 0;
    }
    return emu_wg;
}

// Stage this lane's part of warpgroup collective `op`, wait for all 128, check they agree.
inline EmuWg::Lane* emu_wg_exchange(const EmuWg::Lane& mine) {
    EmuWg* wg = emu_my_wg();
    const int wl = (int)threadIdx.x % 128;
    EmuWg::Lane* s = wg->slot[emu_wslot];
    s[wl] = mine;
    s[wl].seq = emu_wseq;
    wg->bar.arrive_and_wait();
    for (int l = 0; l < 128; ++l) {
        if (s[l].op != mine.op || s[l].seq != emu_wseq) emu_fail("lanes of a warpgroup in different collectives");
        if (mine.op == 4 && (s[l].n != mine.n || s[l].acc != mine.acc || s[l].desc != mine.desc))
            emu_fail("lanes of a warpgroup disagree on a wgmma's N, scale-d or descriptor");
    }
    emu_wslot ^= 1;
    emu_wseq++;
    // The slot written next is the other one; the one just read is rewritten only after the next
    // collective's barrier, which every lane reaches after reading it.
    return s;
}

inline void emu_wgmma_exec(const EmuPending& p) {
    const unsigned long long desc = p.desc;
    if ((desc >> 62) != 0) emu_fail("descriptor: swizzled layout (the emulation knows only layout type 0)");
    if (((desc >> 49) & 7) != 0) emu_fail("descriptor: nonzero base offset");
    if ((desc >> 14) & 3 || (desc >> 30) & 3 || (desc >> 46) & 7 || (desc >> 52) & 0x3ff)
        emu_fail("descriptor: bits outside its fields set");
    const size_t start = (size_t)(desc & 0x3fff) << 4, lbo = (size_t)((desc >> 16) & 0x3fff) << 4,
                 sbo = (size_t)((desc >> 32) & 0x3fff) << 4;
    const char* base = reinterpret_cast<const char*>(emu_cta->smem);
    auto bval = [&](int n, int k) -> unsigned {
        const size_t byte = start + (size_t)(n / 8) * sbo + 16 * (size_t)(n % 8) + (size_t)(k / 4) * lbo + 4 * (size_t)(k % 4);
        if (byte + 4 > emu_cta->smem_floats * 4) emu_fail("wgmma B read outside shared memory");
        unsigned u;
        std::memcpy(&u, base + byte, 4);
        return u;
    };
    const int lane = (int)threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < p.n / 2; ++i) {
        const int row = g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);  // row within the warp's 16
        double v[9];
        v[8] = p.acc ? p.d[i] : 0.0;
        for (int k = 0; k < 8; ++k) {
            // A (row, k) of this warp: lane 4 (row % 8) + k % 4, register (row / 8) + 2 (k / 4)
            const unsigned av = p.a[4 * (row % 8) + k % 4][(row / 8) + 2 * (k / 4)];
            v[k] = emu_tf32_value(av) * emu_tf32_value(bval(col, k));
        }
        p.d[i] = emu_tc_sum(v);
    }
}

inline void wx_fence() {
    EmuWg::Lane mine{};
    mine.op = 3;
    emu_wg_exchange(mine);
}

inline void wx_commit() {
    EmuWg::Lane mine{};
    mine.op = 5;
    emu_wg_exchange(mine);
    emu_committed.push_back(emu_issued);
    emu_issued.clear();
}

// wgmma.wait_group N: every commit group but the newest N complete (executed now, oldest first).
inline void emu_wait(int n) {
    EmuWg::Lane mine{};
    mine.op = 6 + n;
    emu_wg_exchange(mine);
    if (!emu_issued.empty()) emu_fail("wgmma.wait_group with an uncommitted wgmma (it would not be waited for)");
    const size_t done = emu_committed.size() > (size_t)n ? emu_committed.size() - n : 0;
    for (size_t g = 0; g < done; ++g)
        for (auto& p : emu_committed[g]) emu_wgmma_exec(p);
    emu_committed.erase(emu_committed.begin(), emu_committed.begin() + done);
}
inline void wx_wait0() { emu_wait(0); }
inline void wx_wait1() { emu_wait(1); }

template <int N>
struct WgMma {
    static void run(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc, int accumulate) {
        EmuWg::Lane mine{};
        mine.op = 4;
        mine.n = N;
        mine.acc = accumulate != 0;
        mine.desc = desc;
        for (int q = 0; q < 4; ++q) mine.a[q] = a[q];
        const EmuWg::Lane* s = emu_wg_exchange(mine);
        EmuPending p{N, accumulate != 0, desc, {}, d};
        const int w0 = ((int)threadIdx.x % 128) / 32 * 32;  // this warp's lanes in the warpgroup
        for (int l = 0; l < 32; ++l)
            for (int q = 0; q < 4; ++q) p.a[l][q] = s[w0 + l].a[q];
        if (emu_mode == 0) emu_wgmma_exec(p);  // at issue
        else emu_issued.push_back(p);          // at the wait that completes it
    }
};
"""

EXTRA_GLOBALS = r"""std::mutex emu_wg_mu;
std::map<std::pair<EmuCta*, int>, std::unique_ptr<EmuWg>> emu_wgs;
thread_local EmuWg* emu_wg;
thread_local EmuCta* emu_wg_cta;
thread_local int emu_wslot;
thread_local long emu_wseq;
thread_local std::vector<EmuPending> emu_issued;
thread_local std::vector<std::vector<EmuPending>> emu_committed;
"""

TEST = r"""
static int failures = 0;

template <int EPI, int BM, int BN, int BK, int ST, int S, int FLUSH, int RUNS>
static void test(int M, int K, int N, int flags, unsigned seed, long py_smem_floats) {
    typedef WgCfg<BM, BN, BK, ST, S, FLUSH, RUNS> C;
    const long smem = tf32x3_wgmma_smem_floats<BM, BN, BK, ST, S, RUNS>();
    bool ok = smem == py_smem_floats;
    if (!ok) printf("SMEM MISMATCH: kernel %ld floats, rawgraph.ops %ld\n", smem, py_smem_floats);
    std::mt19937 g(seed);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(-4.0f, 4.0f);
    const bool rx = flags & RG_FLAG_ROWS_X, ry = flags & RG_FLAG_ROWS_Y, rr = flags & RG_FLAG_ROWS_R;
    const int cap = M + 5;
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
    const int nan_m = (flags & 1024) ? M / 2 : -1;
    if (nan_m >= 0) x[(size_t)(rx ? rows[nan_m] : nan_m) * K + K / 3] = NAN;
    float* yp = y.data() + ((flags & 256) ? 1 : 0);
    const float* rp = r.data() + ((flags & 256) ? 1 : 0);
    const int kflags = flags & 0xff;
    KernelFn fn, fn1;
    if constexpr (S == 1) fn = &tf32x3_wgmma_kernel<EPI, BM, BN, BK, ST, 1, FLUSH, RUNS>;
    else fn = &tf32x3_wgmma_split_kernel<EPI, BM, BN, BK, ST, S, 1, FLUSH, RUNS>;
    if constexpr (S == 1) fn1 = &tf32x3_wgmma_kernel<EPI, BM, BN, BK, ST, 1, FLUSH, 1>;
    else fn1 = &tf32x3_wgmma_split_kernel<EPI, BM, BN, BK, ST, S, 1, FLUSH, 1>;
    const float* xarg = x.data(); float* yarg = yp; const float* rarg = EPI == 2 ? rp : nullptr;
    static unsigned long long slots[3];
    slots[0] = (unsigned long long)xarg; slots[1] = (unsigned long long)yarg; slots[2] = (unsigned long long)rarg;
    if (kflags & RG_FLAG_IND_X) xarg = reinterpret_cast<const float*>(&slots[0]);
    if (kflags & RG_FLAG_IND_Y) yarg = reinterpret_cast<float*>(&slots[1]);
    if (kflags & RG_FLAG_IND_R) rarg = reinterpret_cast<const float*>(&slots[2]);
    long differ = 0;  // RUNS = 2: outputs whose bits differ from the one-run form's on the same inputs
    if constexpr (RUNS == 2) {
        const long smem1 = tf32x3_wgmma_smem_floats<BM, BN, BK, ST, S, 1>();
        launch(fn1, S, C::THREADS, smem1, (N + BN - 1) / BN, (M + BM - 1) / BM, xarg, W.data(), yarg, rarg,
               M, K, N, kflags, rows.data());
        std::vector<float> y1 = y;
        std::fill(y.begin(), y.end(), NAN);
        launch(fn, S, C::THREADS, smem, (N + BN - 1) / BN, (M + BM - 1) / BM, xarg, W.data(), yarg, rarg,
               M, K, N, kflags, rows.data());
        for (size_t i = 0; i < y.size(); ++i)
            if (std::memcmp(&y[i], &y1[i], 4) != 0) differ++;
    } else {
        launch(fn, S, C::THREADS, smem, (N + BN - 1) / BN, (M + BM - 1) / BM, xarg, W.data(), yarg, rarg,
               M, K, N, kflags, rows.data());
    }
    const int P = S;
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
            float ffma = 0.0f;
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
    ok = ok && differ == 0 && bad == 0 && nan_left == 0 && nan_lost == 0 && overwritten == 0 && fro < 1e-6
         && (!(flags & 2048) || fro <= ffma_fro) && emu_errors == 0;
    if (!ok) failures++;
    printf("%s EPI%d BM%d BN%d BK%d ST%d S%d FL%d RUNS%d  M=%d K=%d N=%d flags=%d mode=%d: bad=%ld nan=%ld "
           "nan_lost=%ld overwritten=%ld maxrel=%.2e fro=%.2e (ffma loop %.2e) bits_vs_runs1=%ld\n",
           ok ? "ok  " : "FAIL", EPI, BM, BN, BK, ST, S, FLUSH, RUNS, M, K, N, flags, emu_mode, bad, nan_left, nan_lost,
           overwritten, maxrel, fro, ffma_fro, differ);
    fflush(stdout);
}

int main(int argc, char** argv) {
    emu_mma_truncates = !(argc > 1 && std::string(argv[1]) == "exact");
#include "cases.inc"
    printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
"""


def build_runner() -> str:
    """tf32x3_emulate.py's runner (thread start-up, grid launch) around this file's kernel and test."""
    head = TF32X3_RUNNER[: TF32X3_RUNNER.index("static int failures = 0;")]
    head = head.replace('#include "tf32x3_emu.cu"', '#include "wgmma_emu.cu"')
    anchor = "thread_local long emu_seq;\n"
    if head.count(anchor) != 1 or head.count('#include "wgmma_emu.cu"') != 1:
        raise SystemExit("wgmma_emulate: tf32x3_emulate.py's runner changed shape")
    return head.replace(anchor, anchor + EXTRA_GLOBALS) + TEST


@dataclass(frozen=True)
class Case:
    """One emulated launch: a cut of tf32x3_wgmma.cu and the product it runs."""

    epi: int
    bm: int
    bn: int
    bk: int
    stages: int
    split: int
    flush: int
    m: int
    k: int
    n: int
    flags: int = 0
    mode: int = 1
    seed: int = 1
    quick: bool = False
    why: str = ""
    runs: int = 1

    def line(self) -> str:
        from rawgraph.ops.gemm import tf32x3_wgmma_smem_bytes

        smem = tf32x3_wgmma_smem_bytes(self.bm, self.bn, self.bk, self.stages, self.split, self.runs) // 4
        args = (self.epi, self.bm, self.bn, self.bk, self.stages, self.split, self.flush, self.runs)
        return (
            f"emu_mode = {self.mode}; test<{', '.join(map(str, args))}>({self.m}, {self.k}, {self.n}, {self.flags}, "
            f"{self.seed}, {smem});  // {self.why}"
        )


ROWS = 16 | 32 | 64
IND = 2 | 4 | 8
MISALIGNED, SCALED_ROWS, NAN_IN_X = 256, 512, 1024
# (EPI, BM, BN, BK, STAGES, S, FLUSH, M, K, N)
CASES = [
    Case(0, 64, 32, 16, 3, 1, 1, 50, 96, 68, mode=1, seed=11, quick=True, why="one warpgroup, tails in M, N, K"),
    Case(1, 128, 64, 32, 3, 1, 2, 130, 160, 100, mode=2, seed=12, quick=True, why="two warpgroups, relu, runs of 2"),
    Case(2, 128, 128, 32, 4, 1, 1, 70, 200, 132, mode=1, seed=13, why="the 128 x 128 tile, add, K tail"),
    Case(0, 64, 96, 8, 3, 1, 1, 64, 40, 96, mode=0, seed=14, why="BN 96, BK 8, executed at issue"),
    Case(2, 64, 64, 64, 3, 1, 4, 33, 256, 64, mode=1, seed=15, why="BK 64, runs of 4"),
    Case(2, 64, 64, 16, 3, 2, 2, 72, 200, 132, mode=1, seed=21, quick=True, why="cluster split 2, K tail"),
    Case(0, 128, 32, 16, 4, 3, 1, 40, 264, 64, mode=2, seed=22, why="cluster split 3, 2 warpgroups"),
    Case(1, 64, 32, 8, 3, 8, 1, 9, 160, 36, mode=1, seed=23, why="cluster split 8, empty K parts"),
    Case(2, 64, 64, 16, 3, 2, 1, 50, 96, 64, ROWS, mode=1, seed=31, quick=True, why="row tables, split"),
    Case(2, 128, 64, 16, 3, 1, 2, 100, 64, 128, ROWS | IND, mode=2, seed=32, why="row tables and pointer slots"),
    Case(2, 64, 32, 8, 3, 1, 1, 20, 48, 36, MISALIGNED, mode=1, seed=33, why="misaligned y and r: scalar stores"),
    Case(0, 64, 64, 16, 3, 1, 2, 40, 128, 64, SCALED_ROWS, mode=1, seed=34, why="rows scaled over 8 decades"),
    Case(1, 64, 32, 16, 3, 2, 1, 24, 64, 32, NAN_IN_X, mode=1, seed=35, quick=True, why="NaN in x reaches its row"),
    Case(0, 64, 32, 8, 3, 1, 1, 3, 8, 32, mode=1, seed=36, why="K = 8: one stage"),
]
# The two-run form (runs=2) on the same products where its rules allow the cut (flush >= 2 with an
# even number of runs a stage, bn <= 64 or 96 with bk 32, no cluster split), else the nearest cut
# they allow; each
# also checked bit for bit against the one-run form of the same cut on the same inputs.
CASES += [
    Case(0, 64, 32, 32, 3, 1, 2, 50, 96, 68, mode=1, seed=11, quick=True, runs=2, why="runs2: tails in M, N, K"),
    Case(1, 128, 64, 32, 3, 1, 2, 130, 160, 100, mode=2, seed=12, quick=True, runs=2, why="runs2: two warpgroups"),
    Case(2, 128, 96, 32, 4, 1, 2, 70, 200, 132, mode=1, seed=13, runs=2, why="runs2: BN 96, add, K tail"),
    Case(0, 64, 96, 32, 3, 1, 2, 64, 40, 96, mode=0, seed=14, runs=2, why="runs2: executed at issue"),
    Case(2, 64, 64, 64, 3, 1, 2, 33, 256, 64, mode=1, seed=15, runs=2, why="runs2: BK 64, four runs a stage"),
    Case(2, 64, 64, 64, 3, 1, 4, 33, 256, 64, mode=2, seed=16, runs=2, why="runs2: BK 64, runs of 4"),
    Case(2, 64, 64, 32, 3, 1, 2, 72, 200, 132, mode=1, seed=21, quick=True, runs=2, why="runs2: K tail"),
    Case(0, 128, 32, 32, 4, 1, 2, 40, 264, 64, mode=2, seed=22, runs=2, why="runs2: 2 warpgroups, 4 stages"),
    Case(1, 64, 32, 32, 3, 1, 2, 9, 160, 36, mode=1, seed=23, runs=2, why="runs2: tiny M, N tail"),
    Case(2, 64, 64, 32, 3, 1, 2, 50, 96, 64, ROWS, mode=1, seed=31, runs=2, why="runs2: row tables"),
    Case(2, 128, 64, 32, 3, 1, 2, 100, 64, 128, ROWS | IND, mode=2, seed=32, runs=2, why="runs2: tables, slots"),
    Case(2, 64, 32, 32, 3, 1, 2, 20, 48, 36, MISALIGNED, mode=1, seed=33, runs=2, why="runs2: misaligned y, r"),
    Case(0, 64, 64, 32, 3, 1, 2, 40, 128, 64, SCALED_ROWS, mode=1, seed=34, runs=2, why="runs2: scaled rows"),
    Case(1, 64, 32, 32, 3, 1, 2, 24, 64, 32, NAN_IN_X, mode=1, seed=35, runs=2, why="runs2: NaN in x"),
    Case(0, 64, 32, 32, 3, 1, 2, 3, 8, 32, mode=1, seed=36, runs=2, why="runs2: K = 8, one partial stage"),
]


def prepare_source(text: str) -> str:
    """tf32x3_wgmma.cu for the host: rawgraph.cuh and the dynamic shared memory come from the shim."""
    text = text.replace('#include "rawgraph.cuh"', "// rawgraph.cuh: replaced by shim.h")
    text, n = re.subn(r"extern __shared__ __align__\(16\) float smem\[\];", "float* const smem = emu_cta->smem;", text)
    if n != 1:
        raise SystemExit("wgmma_emulate: the dynamic shared memory declaration was not found")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the CPU test's subset")
    p.add_argument("--mma", choices=("truncate", "exact"), default="truncate")
    p.add_argument("--keep", help="write the generated files here and keep them")
    p.add_argument("--source", default=str(ROOT / "kernels" / "tf32x3_wgmma.cu"))
    p.add_argument("--cxx", default=shutil.which("g++") or "g++")
    a = p.parse_args(argv)
    cases = [c for c in CASES if c.quick or not a.quick]
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="wgmma_emu_"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "shim.h").write_text(SHIM + TENSOR_SHIM + WGMMA_SHIM)
    write_tile_header(Path(a.source).parent, work)
    (work / "runner.cpp").write_text(build_runner())
    (work / "cases.inc").write_text("\n".join(c.line() for c in cases) + "\n")
    (work / "wgmma_emu.cu").write_text(prepare_source(Path(a.source).read_text()))
    cmd = [a.cxx, "-std=c++20", "-O1", "-g", "-fno-strict-aliasing", "-fsanitize=address,undefined", "-pthread"]
    cmd += ["runner.cpp", "-o", "runner"]
    print("building:", " ".join(cmd), f"({len(cases)} cases)", flush=True)
    if subprocess.run(cmd, cwd=work).returncode:
        return 2
    rc = subprocess.run([str(work / "runner"), a.mma], cwd=work).returncode
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
