"""CPU check of kernels/sgemm.cu: runs the kernel source on the host, one std::thread per CUDA thread.

No GPU needed. The .cu file is compiled with g++ (C++20, AddressSanitizer + UBSan) against a shim
of the CUDA features it uses (thread and block indices, __syncthreads, named barriers, cluster
barriers and distributed shared memory, cp.async groups, rawgraph.cuh's helpers). Each test
launches a whole grid (a cluster's CTAs run together) on random inputs and checks every output
against a float64 product within the fp32 summation bound, that rows a row table leaves out keep
their NaN poison, and that shared-memory use stays inside the size gemm_sweep.py computes.

cp.async copies are applied at issue (mode 0), at the cp.async.wait that covers them (mode 1:
a read before its wait sees stale data) or at random in between (mode 2), so pipeline-order
mistakes show up as wrong results. Races between real warps are not modelled: that is
compute-sanitizer's job (racecheck / synccheck) on the GPU.

    python3 benchmarks/sgemm_emulate.py            # ~1 min on 2 cores
    python3 benchmarks/sgemm_emulate.py --keep DIR # keep the generated sources and binary

Exit status 0 when every case passes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHIM = r"""// Host emulation of the CUDA features sgemm.cu uses: one std::thread per CUDA thread.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#define RG_HOST_EMULATION 1
#define RG_HAS_CLUSTERS 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) alignas(n)

struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct emu_uint3 { unsigned x, y, z; };
extern thread_local emu_uint3 threadIdx, blockIdx;
using std::min;
using std::max;

struct EmuCta {
    float* smem = nullptr;
    size_t smem_floats = 0;
    std::unique_ptr<std::barrier<>> bar0;
    std::map<int, std::unique_ptr<std::barrier<>>> named;
    std::mutex mu;
};
struct EmuCluster {
    std::vector<EmuCta*> ctas;
    std::unique_ptr<std::barrier<>> cbar;
};
extern thread_local EmuCta* emu_cta;
extern thread_local EmuCluster* emu_cluster;
extern thread_local unsigned emu_rank;
extern int emu_mode;   // 0: cp.async applied at issue, 1: at the wait, 2: random
extern std::atomic<long> emu_errors;

inline void emu_fail(const char* what) {
    fprintf(stderr, "EMU ERROR: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
    emu_errors++;
    abort();
}
inline void __syncthreads() { emu_cta->bar0->arrive_and_wait(); }
inline void __syncwarp() {}
inline void sg_bar_sync(int id, int count) {
    std::barrier<>* b;
    {
        std::lock_guard<std::mutex> g(emu_cta->mu);
        auto& slot = emu_cta->named[id];
        if (!slot) slot.reset(new std::barrier<>(count));
        b = slot.get();
    }
    b->arrive_and_wait();
}
template <typename T> inline T __ldcv(const T* p) { return *p; }

// ---- rawgraph.cuh equivalents ----
inline float rg_relu(float v) { return v < 0.0f ? 0.0f : v; }
#define RG_FLAG_EARLY 1
#define RG_FLAG_IND_X 2
#define RG_FLAG_IND_Y 4
#define RG_FLAG_IND_R 8
#define RG_FLAG_ROWS_X 16
#define RG_FLAG_ROWS_R 32
#define RG_FLAG_ROWS_Y 64
template <typename T> inline T* rg_arg_ptr(T* p, int flags, int bit) {
    if (!(flags & bit)) return p;
    return reinterpret_cast<T*>(__ldcv(reinterpret_cast<const unsigned long long*>(p)));
}
inline int rg_row(const int* rows, int flags, int bit, int m) { return (flags & bit) ? rows[m] : m; }
inline void rg_allow_dependents() {}
inline void rg_wait_dependencies() {}
inline unsigned rg_cluster_rank() { return emu_rank; }
inline void rg_cluster_sync() { emu_cluster->cbar->arrive_and_wait(); }
extern thread_local std::optional<std::barrier<>::arrival_token> emu_token;
inline void rg_cluster_arrive() { emu_token.emplace(emu_cluster->cbar->arrive()); }
inline void rg_cluster_wait() { emu_cluster->cbar->wait(std::move(*emu_token)); emu_token.reset(); }
inline float4 rg_dsmem_load4(const float* local, unsigned rank) {
    const ptrdiff_t off = local - emu_cta->smem;
    if (off < 0 || (size_t)off + 4 > emu_cta->smem_floats) emu_fail("dsmem offset out of range");
    if (off % 4) emu_fail("dsmem load4 misaligned");
    if (rank >= emu_cluster->ctas.size()) emu_fail("dsmem rank out of range");
    const float* p = emu_cluster->ctas[rank]->smem + off;
    return float4{p[0], p[1], p[2], p[3]};
}
struct EmuCopy { float* dst; const float* src; bool valid; };
extern thread_local std::vector<EmuCopy> emu_open;
extern thread_local std::vector<std::vector<EmuCopy>> emu_groups;
extern thread_local std::mt19937 emu_rng;
inline void emu_apply(const EmuCopy& c) {
    for (int i = 0; i < 4; ++i) c.dst[i] = c.valid ? c.src[i] : 0.0f;
}
inline void rg_cp_async16(void* smem, const void* gmem, bool valid) {
    float* d = static_cast<float*>(smem);
    const ptrdiff_t off = d - emu_cta->smem;
    if (off < 0 || (size_t)off + 4 > emu_cta->smem_floats) emu_fail("cp.async destination outside shared memory");
    if (off % 4) emu_fail("cp.async destination misaligned");
    if (valid && (reinterpret_cast<uintptr_t>(gmem) & 15)) emu_fail("cp.async source misaligned");
    EmuCopy c{d, static_cast<const float*>(gmem), valid};
    if (valid) { volatile float t = c.src[0] + c.src[3]; (void)t; }  // ASan checks the source now
    if (emu_mode == 0 || (emu_mode == 2 && (emu_rng() & 1))) emu_apply(c);
    else emu_open.push_back(c);
}
inline void rg_cp_async_commit() { emu_groups.push_back(std::move(emu_open)); emu_open.clear(); }
template <int N> inline void rg_cp_async_wait() {
    while (emu_groups.size() > (size_t)N) {
        for (auto& c : emu_groups.front()) emu_apply(c);
        emu_groups.erase(emu_groups.begin());
    }
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
int emu_mode = 0;
std::atomic<long> emu_errors{0};

#include "sgemm_emu.cu"

// Mirror of the Python formula in gemm_sweep.py (checked against the kernel's constexpr).
static long py_smem_floats(int BM, int BN, int BK, int ST, int S, int KS) {
    long pipe = (long)KS * ST * (BM * (BK + 4) + BK * BN);
    long part = (S * KS > 1) ? (long)KS * BM * (BN + 4) : 0;
    return std::max(pipe, part);
}

typedef void (*KernelFn)(const float*, const float*, float*, const float*, int, int, int, int, const int*);

struct ThreadArg { KernelFn fn; EmuCluster* cl; EmuCta* cta; unsigned rank; unsigned tid; emu_uint3 bid;
                   const float* x; const float* W; float* y; const float* r; int M, K, N, flags; const int* rows; };
static void* thread_main(void* p) {
    ThreadArg* a = static_cast<ThreadArg*>(p);
    threadIdx = {a->tid, 0, 0};
    blockIdx = a->bid;
    emu_cta = a->cta; emu_cluster = a->cl; emu_rank = a->rank;
    emu_rng.seed(a->tid * 7919u + a->bid.x * 131u + a->bid.y * 17u + a->bid.z);
    emu_open.clear(); emu_groups.clear();
    a->fn(a->x, a->W, a->y, a->r, a->M, a->K, a->N, a->flags, a->rows);
    if (!emu_open.empty()) emu_fail("uncommitted cp.async at exit");
    return nullptr;
}

static void launch(KernelFn fn, int S, int threads, long smem_floats, int gx, int gz,
                   const float* x, const float* W, float* y, const float* r, int M, int K, int N, int flags, const int* rows) {
    for (int bz = 0; bz < gz; ++bz)
        for (int bx = 0; bx < gx; ++bx) {
            EmuCluster cl;
            std::vector<std::unique_ptr<EmuCta>> ctas;
            std::vector<std::vector<float>> mem;
            for (int q = 0; q < S; ++q) {
                ctas.emplace_back(new EmuCta);
                ctas.back()->smem = static_cast<float*>(aligned_alloc(16, ((smem_floats * 4 + 15) / 16) * 16));
                for (long i = 0; i < smem_floats; ++i) ctas.back()->smem[i] = NAN;  // garbage
                ctas.back()->smem_floats = smem_floats;
                ctas.back()->bar0.reset(new std::barrier<>(threads));
                cl.ctas.push_back(ctas.back().get());
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
                    a = ThreadArg{fn, &cl, ctas[q].get(), (unsigned)q, (unsigned)t, {(unsigned)bx, (unsigned)q, (unsigned)bz},
                                  x, W, y, r, M, K, N, flags, rows};
                    if (pthread_create(&th[q * threads + t], &attr, thread_main, &a)) { perror("pthread_create"); abort(); }
                }
            for (auto& t : th) pthread_join(t, nullptr);
            for (auto& c : ctas) free(c->smem);
        }
}

static int failures = 0;

template <int EPI, int BM, int BN, int BK, int ST, int S, int KS, int MINB = 1, int TM = 8>
static void test(int M, int K, int N, int flags, unsigned seed) {
    typedef SgemmCfg<BM, BN, BK, ST, S, KS, TM> C;
    long smem = py_smem_floats(BM, BN, BK, ST, S, KS);
    if (smem != sgemm_smem_floats<BM, BN, BK, ST, S, KS, TM>()) { printf("SMEM FORMULA MISMATCH\n"); failures++; }
    std::mt19937 g(seed);
    std::normal_distribution<float> nd;
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
    // misaligned y / r (scalar epilogue path) when flags bit 256 is set (harness-only bit)
    float* yp = y.data() + ((flags & 256) ? 1 : 0);
    const float* rp = r.data() + ((flags & 256) ? 1 : 0);
    const int kflags = flags & 0xff;
    KernelFn fn;
    if constexpr (S == 1) fn = &sgemm_kernel<EPI, BM, BN, BK, ST, KS, MINB, TM>;
    else fn = &sgemm_split_kernel<EPI, BM, BN, BK, ST, S, KS, MINB, TM>;
    const float* xarg = x.data(); float* yarg = yp; const float* rarg = EPI == 2 ? rp : nullptr;
    static unsigned long long slots[3];
    slots[0] = (unsigned long long)xarg; slots[1] = (unsigned long long)yarg; slots[2] = (unsigned long long)rarg;
    if (kflags & RG_FLAG_IND_X) xarg = reinterpret_cast<const float*>(&slots[0]);
    if (kflags & RG_FLAG_IND_Y) yarg = reinterpret_cast<float*>(&slots[1]);
    if (kflags & RG_FLAG_IND_R) rarg = reinterpret_cast<const float*>(&slots[2]);
    launch(fn, S, C::THREADS, smem, (N + BN - 1) / BN, (M + BM - 1) / BM, xarg, W.data(), yarg, rarg,
           M, K, N, kflags, rows.data());
    // check
    long bad = 0, nan_left = 0, overwritten = 0;
    double maxrel = 0;
    std::vector<char> written(yrows, 0);
    for (int m = 0; m < M; ++m) {
        const int xm = rx ? rows[m] : m, ym = ry ? rows[m] : m, rm = rr ? rows[m] : m;
        written[ym] = 1;
        for (int n = 0; n < N; ++n) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; ++k) { s += (double)x[(size_t)xm * K + k] * W[(size_t)k * N + n]; sa += fabs((double)x[(size_t)xm * K + k] * W[(size_t)k * N + n]); }
            double ref = s;
            if (EPI == 1) ref = ref < 0 ? 0 : ref;
            if (EPI == 2) ref += rp[(size_t)rm * N + n];
            const float got = yp[(size_t)ym * N + n];
            const double bound = (K + 16) * 6.0e-8 * sa + 6.0e-8 * fabs(ref) + 1e-30;
            if (std::isnan(got)) { nan_left++; continue; }
            const double err = fabs(got - ref);
            if (!(err <= bound)) bad++;
            maxrel = std::max(maxrel, err / (sa + 1e-30));
        }
    }
    for (int m = 0; m < yrows; ++m)
        if (!written[m])
            for (int n = 0; n < N; ++n) if (!std::isnan(yp[(size_t)m * N + n])) overwritten++;
    const bool ok = bad == 0 && nan_left == 0 && overwritten == 0;
    if (!ok) failures++;
    printf("%s EPI%d BM%d BN%d BK%d ST%d S%d KS%d TM%d  M=%d K=%d N=%d flags=%d mode=%d: bad=%ld nan=%ld overwritten=%ld maxrel=%.2e\n",
           ok ? "ok  " : "FAIL", EPI, BM, BN, BK, ST, S, KS, TM, M, K, N, flags, emu_mode, bad, nan_left, overwritten, maxrel);
    fflush(stdout);
}

int main(int argc, char** argv) {
#include "cases.inc"
    printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
"""

CASES = r"""for (int mode = 0; mode < 3; ++mode) {
  emu_mode = mode;
  test<0, 128, 128, 16, 4, 1, 1>(136, 128, 256, 0, 11);
  test<1, 128, 128, 16, 4, 2, 1>(72, 200, 132, 0, 12);
  test<2, 64, 128, 16, 4, 1, 2>(64, 256, 256, 0, 13);
  test<2, 64, 128, 32, 3, 4, 2>(200, 512, 128, 0, 14);
  test<0, 64, 64, 32, 5, 8, 1>(64, 512, 64, 0, 15);
  test<0, 32, 128, 16, 4, 3, 4>(40, 384, 128, 0, 16);
  test<1, 96, 128, 8, 6, 2, 1>(100, 100, 200, 0, 17);
  test<0, 128, 64, 16, 2, 1, 2>(130, 96, 68, 0, 18);
}
emu_mode = 2;
// row tables, indirect pointers, misaligned y / r (harness bit 256), empty K parts, tiny M
test<2, 64, 128, 16, 4, 2, 2>(72, 256, 192, 16 | 32 | 64, 21);
test<2, 64, 128, 16, 4, 1, 1>(72, 64, 192, 16 | 32 | 64 | 2 | 4 | 8 | 1, 22);
test<2, 64, 128, 16, 4, 1, 1>(72, 64, 132, 256, 23);
test<2, 64, 128, 16, 4, 2, 2>(72, 64, 132, 256 | 64, 24);
test<1, 64, 64, 16, 3, 4, 2>(24, 16, 64, 0, 25);
test<0, 64, 64, 16, 3, 1, 1>(1, 32, 64, 0, 26);
test<0, 128, 128, 16, 4, 8, 1>(5, 96, 128, 0, 27);
test<2, 128, 128, 16, 4, 2, 1, 2>(256, 64, 132, 2 | 8, 28);
emu_mode = 1;
test<0, 64, 64, 32, 8, 2, 2>(72, 100, 64, 0, 31);      // more stages than the K range needs
test<2, 32, 64, 8, 4, 1, 8>(40, 512, 64, 0, 32);       // KS = 8 (named barriers 1..8), T = 32
test<1, 256, 128, 8, 3, 4, 1>(256, 256, 128, 0, 33);    // 512 threads
test<0, 128, 128, 32, 3, 2, 1>(129, 4 * 33, 132, 0, 34);
// 4 rows per thread (TM = 4): a warp covers 16 rows
for (int mode = 0; mode < 3; ++mode) {
  emu_mode = mode;
  test<0, 64, 64, 8, 5, 8, 1, 1, 4>(40, 512, 128, 0, 41);
  test<2, 16, 128, 16, 3, 2, 2, 1, 4>(72, 200, 132, 0, 42);
  test<1, 64, 128, 8, 3, 6, 2, 1, 4>(104, 768, 256, 0, 43);
  test<2, 48, 64, 16, 4, 1, 1, 2, 4>(100, 96, 68, 0, 44);
}
emu_mode = 2;
test<2, 32, 128, 16, 4, 2, 2, 1, 4>(72, 256, 192, 16 | 32 | 64 | 256, 45);
test<2, 32, 64, 8, 3, 1, 1, 1, 4>(33, 64, 132, 2 | 8 | 1, 46);
"""


def write_tile_header(kernels: Path, work: Path) -> None:
    """gemm_tile.cuh (the GEMMs' shared pieces) beside the emulated source, on the shim too."""
    text = (kernels / "gemm_tile.cuh").read_text()
    (work / "gemm_tile.cuh").write_text(text.replace('#include "rawgraph.cuh"', "// rawgraph.cuh: replaced by shim.h"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keep", help="write the generated files here and keep them")
    p.add_argument("--source", default=str(ROOT / "kernels" / "sgemm.cu"))
    p.add_argument("--cxx", default=shutil.which("g++") or "g++")
    a = p.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="sgemm_emu_"))
    work.mkdir(parents=True, exist_ok=True)
    src = Path(a.source).read_text()
    src = src.replace('#include "rawgraph.cuh"', "// rawgraph.cuh: replaced by shim.h")
    src, n = re.subn(r"extern __shared__ __align__\(16\) float smem\[\];", "float* const smem = emu_cta->smem;", src)
    if n != 1:
        print("sgemm_emulate: the dynamic shared memory declaration was not found", file=sys.stderr)
        return 2
    (work / "shim.h").write_text(SHIM)
    write_tile_header(Path(a.source).parent, work)
    (work / "runner.cpp").write_text(RUNNER)
    (work / "cases.inc").write_text(CASES)
    (work / "sgemm_emu.cu").write_text(src)
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
    print("building:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=work).returncode:
        return 2
    rc = subprocess.run([str(work / "runner")], cwd=work).returncode
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
