// rawgraph sgemm: y[m, n] = epilogue( sum_k x[m, k] * W[k, n] ), float32 FMA, float32 accumulation,
// row-major, for serving shapes (M = 64..256 rows, K and N in the thousands). No tensor cores,
// no TF32. Same arguments, flags and PDL protocol as matmul.cu's gemm_kernel, so a cut of this
// file can replace a matmul.cu cut in ops.matmul:
//
//   (x, W, y, r, B = M, K, N, flags, rows)   x: M x K   W: K x N   y, r: M x N
//
// Requirements (checked by the host): K % 4 == 0, N % 4 == 0, x and W 16-byte aligned (cp.async
// moves 16-byte pieces; a piece is wholly inside or wholly outside the matrix). Any M >= 1. y and
// r need no alignment: the epilogue stores 16 bytes at a time when both are 16-byte aligned (a
// uniform test) and one float at a time otherwise.
//
// Design, and why:
//
// * 8 x 8 outputs per thread (64 fp32 accumulators). Per 4 steps of k a thread does 8 16-byte
//   shared loads of x (one per row: 4 k values each) and 8 of W (2 per k) for 256 FMAs: 16 loads
//   per 256 FMAs, and shared memory bandwidth (1 wavefront per load, see below) is a quarter used.
//   That ratio is what register blocking buys; 4 x 4 (matmul.cu's gemm) needs twice the loads per FMA.
//   SASS of the K loop (NVRTC 13.5, sm_90): 1024 FFMA of 1167 instructions per BK = 16 stage
//   (88 %; 67 LDS, the rest cp.async bookkeeping and the barrier), 2048 of 2306 at BK = 32.
//   Since an SM issues one instruction per scheduler per cycle, that fraction bounds the kernel:
//   at K = N = 4096, M = 256 (64 tiles of 128 x 128, or 128 of 64 x 128, on 128 of the 132 SMs)
//   the ceiling is about 0.89 * 128 / 132 = 86 % of fp32 peak before barrier and latency stalls.
//
// * A slice of (BM / TM) x (BN / 8) threads computes a BM x BN tile. A warp holds 4 thread rows x
//   8 thread columns (a 4 TM-row x 64-column piece of the tile), so BM % (4 TM) == 0, BN % 64 == 0.
//   Thread (tr, tc) owns rows tr + j * BM / TM (j < TM) and columns 4 tc .. 4 tc + 3 and
//   BN / 2 + 4 tc .. + 3 of the tile. Rows are strided so that the 4 rows a warp loads at once are
//   adjacent: with the x tile stored [row][k] at a row stride of BK + 4 floats their 16-byte
//   pieces fall in 4 different bank groups (conflict-free, 1 wavefront, 8-way broadcast). The W
//   tile is [k][n] unpadded: a warp's 8 thread columns read 32 consecutive floats (1 wavefront).
//   Columns in two halves keep each of those loads contiguous across the warp.
//
// * x is stored [row][k] because cp.async copies 16 contiguous bytes of global memory, and x's
//   contiguous direction is k. Reading 4 k values per 16-byte load and using them over 4 steps of
//   k costs 32 registers of x fragment instead of 8, which the 255-register budget of a 256-thread
//   CTA at one CTA per SM affords (no transpose through registers, no extra barrier). ptxas uses
//   221-225 registers at BK = 16 and 230-254 at BK = 32 for the table's cuts (NVRTC 13.5).
//
// * The loaders keep running source pointers and K counters, so a stage costs a compare, a
//   select and a 64-bit add per 16-byte piece; no multiplications in the K loop.
//
// * cp.async pipeline of STAGES stages of BK steps of k (x tile and W tile per stage), one
//   barrier per stage. Small products (K split to 128-256 rows per CTA) should prefetch their
//   whole K range at once (STAGES - 1 >= stages per CTA): there the cost is DRAM latency, not
//   bandwidth, and a 3-stage pipeline of 16-row stages pays it 4-8 times over (matmul.cu's gemm
//   at 72 x 1024 x 1024; measured: see benchmarks/NOTES.md).
//
// * Filling 132 SMs at small M: K is cut into P = S * KS parts.
//   - S CTAs of a thread-block cluster (template S, __cluster_dims__(1, S, 1), grid y = S).
//   - KS slices of threads inside one CTA (template KS), each with its own pipeline stages and
//     its own named barrier (bar.sync 1 + slice), so slices don't wait for each other in the K
//     loop. KS puts more warps on one SM from one CTA: one CTA per SM balances (clusters are
//     placed per GPC, and a GPU's GPCs may differ in SM count; measured: see benchmarks/NOTES.md).
//   Part p = rank * KS + slice takes K rows [p * kc, (p + 1) * kc), kc a multiple of BK.
//   Reduction: every slice stores its partial tile in its CTA's shared memory (reusing the
//   stages), the cluster synchronizes, and CTA `rank` finishes rows [rank * ceil(BM / S), ...) of
//   the tile, summing the P partials in the fixed order p = 0, 1, ..., P - 1 through distributed
//   shared memory (its own included), then applies the epilogue. No atomics: bit-identical run to
//   run, independent of scheduling. With P == 1 the epilogue runs straight from registers.
//
// * PDL (rawgraph.cuh): the first STAGES - 1 W stages are issued before griddepcontrol.wait
//   (weights are never written by a predecessor), x (and the row table) only after it.
//   flags & RG_FLAG_EARLY: the successor may launch at the start (small products: hide launch
//   latency, let its W prefetch overlap our tail), else once our K loop is done (large ones:
//   an early successor only competes for DRAM and SM slots).
//
// * Indirect pointers (RG_FLAG_IND_X / _Y / _R) and row tables (RG_FLAG_ROWS_X / _R / _Y) work as
//   in matmul.cu: x rows are looked up once per thread after the wait (each thread loads the same
//   tile rows at every stage), y and r rows in the epilogue.
//
// Shared memory is dynamic: sgemm_smem_floats<BM, BN, BK, STAGES, S, KS>() floats
// = max(KS * STAGES * (BM * (BK + 4) + BK * BN), S * KS > 1 ? KS * BM * (BN + 4) : 0); the host
// (benchmarks/gemm_sweep.py, later ops) computes the same formula and raises
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES above 48 KB.
//
// * TM (template, default 8): output rows per thread. TM = 4 gives 4 x 8 outputs (32 accumulators,
//   about 128 registers instead of 225-254): twice the threads for the same tile, so 2-4 CTAs or
//   16+ warps per SM where the 8 x 8 tile runs one CTA, and row tiles in steps of 16 (a warp
//   covers 4 TM rows), e.g. 80 rows for M = 72 where cuBLAS computes 128. cuBLAS's small-M SIMT
//   kernel (cutlass_80_simt_sgemm_64x64_8x5) uses 4 x 8 per thread. Per 4 steps of k: 4 x loads
//   and 8 W loads for 128 FMAs.
//
// Launch: grid (ceil(N / BN), S, ceil(M / BM)), block KS * (BM / TM) * (BN / 8) threads.
// Name expressions (TM written only when it is not 8):
//   sgemm_kernel<EPI, BM, BN, BK, STAGES, KS, MINB[, TM]>            (S == 1, no cluster)
//   sgemm_split_kernel<EPI, BM, BN, BK, STAGES, S, KS, MINB[, TM]>   (2 <= S <= 8, clusters of (1, S, 1))
// MINB is __launch_bounds__' minimum CTAs per SM: 1 leaves ptxas up to 255 registers; MINB *
// threads = 512 caps it at 128 (16 warps per SM): the 8 x 8 tile then fits at BK = 8 (128 x 128,
// one slice: no spills) and spills 48-64 bytes in some other shapes -- the sweep decides.
// EPI as in matmul.cu: 0 none, 1 relu (NaN passes), 2 add (y = x @ W + r).
//
// RG_HOST_EMULATION (never set by NVRTC) swaps the one inline-asm helper below for a host
// version: the index arithmetic, bounds, pipeline order and reduction of this file were checked by
// running it on the CPU, one std::thread per CUDA thread, with cp.async copies applied at issue,
// at the wait, or at random in between, under AddressSanitizer.

#include "rawgraph.cuh"
#include "gemm_tile.cuh"

#ifndef RG_HOST_EMULATION
// Named barrier `id` (1..15) over `count` threads (a multiple of 32): one K slice's threads.
__device__ __forceinline__ void sg_bar_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
#endif

template <int BM, int BN, int BK, int STAGES, int S, int KS, int TM = 8>
struct SgemmCfg {
    static constexpr int TR = BM / TM;                // thread rows of a slice
    static constexpr int TC = BN / 8;                 // thread columns of a slice
    static constexpr int T = TR * TC;                 // threads per slice
    static constexpr int THREADS = T * KS;
    static constexpr int WARPS_N = BN / 64;           // warps across a slice's columns
    static constexpr int XS = BK + 4;                 // x tile row stride (floats)
    static constexpr int XTILE = BM * XS;             // floats of one stage's x tile
    static constexpr int STAGE = XTILE + BK * BN;     // floats per stage
    static constexpr int PS = BN + 4;                 // partial tile row stride
    static constexpr int PIPE = KS * STAGES * STAGE;
    static constexpr int PART = (S * KS > 1) ? KS * BM * PS : 0;
    static constexpr int SMEM_FLOATS = PIPE > PART ? PIPE : PART;
    static constexpr int XCH = BM * BK / 4;           // 16-byte pieces of an x tile
    static constexpr int WCH = BK * BN / 4;           // 16-byte pieces of a W tile
    static constexpr int XPT = (XCH + T - 1) / T;     // pieces per thread
    static constexpr int WPT = (WCH + T - 1) / T;
    static_assert(TM == 8 || TM == 4, "8 or 4 rows per thread");
    static_assert(BM % (4 * TM) == 0 && BN % 64 == 0, "a warp covers 4 TM rows x 64 columns");
    static_assert(BK % 4 == 0 && BK >= 4, "BK is a multiple of 4");
    static_assert(STAGES >= 2, "at least two stages");
    static_assert(S >= 1 && S <= 8, "portable cluster size");
    static_assert(KS >= 1 && KS <= 8, "K slices per CTA");
    static_assert(THREADS <= 1024, "too many threads");
    static_assert(KS == 1 || T % 32 == 0, "a slice is whole warps");
};

template <int BM, int BN, int BK, int STAGES, int S, int KS, int TM = 8>
__host__ __device__ constexpr int sgemm_smem_floats()
{
    return SgemmCfg<BM, BN, BK, STAGES, S, KS, TM>::SMEM_FLOATS;  // the same for every TM
}



template <int EPI, int BM, int BN, int BK, int STAGES, int S, int KS, int TM>
__device__ __forceinline__ void sgemm_body(const float* x, const float* __restrict__ W, float* y, const float* r,
                                           int M, int K, int N, int early, const int* rows, int flags)
{
    typedef SgemmCfg<BM, BN, BK, STAGES, S, KS, TM> C;
    constexpr int TR = C::TR, T = C::T, XS = C::XS;
    extern __shared__ __align__(16) float smem[];

    const int slice = (KS == 1) ? 0 : (int)threadIdx.x / T;
    const int tid = (KS == 1) ? (int)threadIdx.x : (int)threadIdx.x % T;
    const int warp = tid / 32, lane = tid % 32;
    const int tr = (warp / C::WARPS_N) * 4 + lane / 8;   // rows tr + j * TR
    const int tc = (warp % C::WARPS_N) * 8 + lane % 8;   // columns 4 tc.., BN / 2 + 4 tc..
    const int n0 = (int)blockIdx.x * BN;
    const int m0 = (int)blockIdx.z * BM;
    unsigned rank = 0;
#ifdef RG_HAS_CLUSTERS
    if (S > 1) rank = rg_cluster_rank();
#endif
    // K in P parts of whole stages; this slice's part is rank * KS + slice.
    constexpr int P = S * KS;
    const int kc = ((K + P - 1) / P + BK - 1) / BK * BK;
    const int kb = min(K, ((int)rank * KS + slice) * kc);
    const int ke = min(K, kb + kc);
    const int nst = (ke - kb + BK - 1) / BK;
    // Every slice passes its barrier kc / BK times, computing on its first nst stages only, so the
    // slices of a CTA reach the full __syncthreads() before the partial tiles after equally many
    // barrier passes: compute-sanitizer's racecheck orders accesses by barrier count, and with a
    // slice's own count (a short last part: K not a multiple of P * BK) it reports hazards there.
    const int nloop = (KS == 1) ? nst : kc / BK;
    float* const base = smem + slice * STAGES * C::STAGE;

    // Loaders keep running state (the next stage's source pointers and first K row), so a stage
    // costs a compare, a select and a 64-bit add per 16-byte piece (no multiplies in the K loop).
    // W: piece c = tid + i * T is row c / (BN / 4), columns 4 * (c % (BN / 4)) of a W tile.
    const float* wsrc[C::WPT];
    int wrow[C::WPT];
    bool wok[C::WPT];
#pragma unroll
    for (int i = 0; i < C::WPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BN / 4), col = (c % (BN / 4)) * 4;
        wrow[i] = row;
        wok[i] = (C::WCH % T == 0 || c < C::WCH) && n0 + col < N;
        wsrc[i] = W + (size_t)(kb + row) * N + n0 + col;   // only dereferenced when in range
    }
    int kw = kb;  // first K row of the next W stage to load
    auto load_w = [&](int buf) {
        float* ws = base + buf * C::STAGE + C::XTILE;
#pragma unroll
        for (int i = 0; i < C::WPT; ++i) {
            const int c = tid + i * T;
            if (C::WCH % T == 0 || c < C::WCH) {
                const bool ok = wok[i] && kw + wrow[i] < ke;
                rg_cp_async16(ws + c * 4, ok ? wsrc[i] : W, ok);
                wsrc[i] += (size_t)BK * N;
            }
        }
        kw += BK;
    };
    // x: piece c = tid + i * T is row c / (BK / 4), k offset 4 * (c % (BK / 4)) of an x tile. The
    // row's source is set after rg_wait_dependencies (the row table may have just been written).
    const float* xsrc[C::XPT];
    int xdst[C::XPT], xkq[C::XPT];
    bool xok[C::XPT];
#pragma unroll
    for (int i = 0; i < C::XPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BK / 4), kq = (c % (BK / 4)) * 4;
        xsrc[i] = x;
        xok[i] = false;
        xdst[i] = row * XS + kq;
        xkq[i] = kq;
    }
    int kx = kb;  // first K row of the next x stage to load
    auto load_x = [&](int buf) {
        float* xs = base + buf * C::STAGE;
#pragma unroll
        for (int i = 0; i < C::XPT; ++i) {
            const int c = tid + i * T;
            if (C::XCH % T == 0 || c < C::XCH) {
                const bool ok = xok[i] && kx + xkq[i] < ke;
                rg_cp_async16(xs + xdst[i], ok ? xsrc[i] : x, ok);
                xsrc[i] += BK;
            }
        }
        kx += BK;
    };

    if (early) rg_allow_dependents();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st)
        if (st < nst) load_w(st);
    rg_wait_dependencies();
#pragma unroll
    for (int i = 0; i < C::XPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BK / 4);
        if ((C::XCH % T == 0 || c < C::XCH) && m0 + row < M) {
            xok[i] = true;
            xsrc[i] = x + (size_t)rg_row(rows, flags, RG_FLAG_ROWS_X, m0 + row) * K + kb + xkq[i];
        }
    }
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < nst) load_x(st);
        rg_cp_async_commit();  // group st (group 0 also holds every W stage issued before the wait)
    }

    float acc[TM][8];
#pragma unroll
    for (int j = 0; j < TM; ++j)
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[j][q] = 0.0f;

    int buf = 0;                  // stage st lives in buffer st % STAGES
    int nbuf = STAGES - 1;        // buffer of stage st + STAGES - 1
    for (int st = 0; st < nloop; ++st) {
        rg_cp_async_wait<STAGES - 2>();
        // Stage st landed for every thread of the slice; stage st - 1 (buffer nbuf) is no longer read.
        if (KS == 1) __syncthreads();
        else sg_bar_sync(1 + slice, T);
        if (st + STAGES - 1 < nst) {  // stage st + STAGES - 1 into the buffer stage st - 1 left
            load_w(nbuf);
            load_x(nbuf);
        }
        rg_cp_async_commit();
        const float* xs = base + buf * C::STAGE;
        const float* ws = xs + C::XTILE;
#pragma unroll
        for (int kq = 0; kq < BK && st < nst; kq += 4) {
            float4 a[TM];
#pragma unroll
            for (int j = 0; j < TM; ++j) a[j] = *reinterpret_cast<const float4*>(xs + (tr + j * TR) * XS + kq);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const float4 b0 = *reinterpret_cast<const float4*>(ws + (kq + kk) * BN + 4 * tc);
                const float4 b1 = *reinterpret_cast<const float4*>(ws + (kq + kk) * BN + BN / 2 + 4 * tc);
                const float bq[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
                // Column-major order (one W value against the TM rows) rather than row-major: ptxas
                // then allocates registers with fewer bank conflicts at BK = 32 (fewer FFMAs whose two
                // register-file source reads are equal mod 4), and fewer dispatch stalls per issued
                // instruction follow (measured at w4096 M = 256: see benchmarks/NOTES.md). The order
                // changes which registers hold what, not the arithmetic: each sum still runs over k
                // in order, so the bits are the same.
#pragma unroll
                for (int q = 0; q < 8; ++q)
#pragma unroll
                    for (int j = 0; j < TM; ++j) acc[j][q] = fmaf(gt_get(a[j], kk), bq[q], acc[j][q]);
            }
        }
        buf = (buf + 1 == STAGES) ? 0 : buf + 1;
        nbuf = (nbuf + 1 == STAGES) ? 0 : nbuf + 1;
    }
    rg_cp_async_wait<0>();
    if (!early) rg_allow_dependents();  // the successor's prologue overlaps only our epilogue

    const bool vec = ((reinterpret_cast<size_t>(y) | (EPI == 2 ? reinterpret_cast<size_t>(r) : 0)) & 15) == 0;

    if constexpr (P == 1) {
#pragma unroll
        for (int j = 0; j < TM; ++j) {
            const int m = m0 + tr + j * TR;
            if (m < M) {
                const int my = rg_row(rows, flags, RG_FLAG_ROWS_Y, m);
                const int mr = EPI == 2 ? rg_row(rows, flags, RG_FLAG_ROWS_R, m) : 0;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int n = n0 + h * (BN / 2) + 4 * tc;
                    if (n < N)
                        gt_store4<EPI>(y, r, N, my, mr, n,
                                       make_float4(acc[j][4 * h], acc[j][4 * h + 1], acc[j][4 * h + 2], acc[j][4 * h + 3]), vec);
                }
            }
        }
    } else {
        __syncthreads();  // every slice is done with its stages: they become the partial tiles
        float* const pt = smem + slice * BM * C::PS;
#pragma unroll
        for (int j = 0; j < TM; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float4*>(pt + (tr + j * TR) * C::PS + h * (BN / 2) + 4 * tc) =
                    make_float4(acc[j][4 * h], acc[j][4 * h + 1], acc[j][4 * h + 2], acc[j][4 * h + 3]);
#ifdef RG_HAS_CLUSTERS
        if (S > 1) rg_cluster_sync();  // all threads of all CTAs: the partials are visible cluster-wide
        else __syncthreads();
#else
        __syncthreads();
#endif
        gt_reduce_partials<EPI, BM, BN, S, KS, C::PS, C::THREADS>(smem, rank, m0, n0, M, N, y, r, rows, flags, vec);
    }
}

// grid (ceil(N / BN), 1, ceil(M / BM)), KS * (BM / TM) * (BN / 8) threads; MINB: __launch_bounds__'s
// minimum resident CTAs per SM (1: up to 255 registers; 2 at 256 threads: at most 128, 16 warps per SM)
template <int EPI, int BM, int BN, int BK, int STAGES, int KS, int MINB, int TM = 8>
__global__ void __launch_bounds__(SgemmCfg<BM, BN, BK, STAGES, 1, KS, TM>::THREADS, MINB)
sgemm_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N, int flags,
             const int* rows)
{
    sgemm_body<EPI, BM, BN, BK, STAGES, 1, KS, TM>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W, rg_arg_ptr(y, flags, RG_FLAG_IND_Y),
        rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows, flags);
}

#ifdef RG_HAS_CLUSTERS
// grid (ceil(N / BN), S, ceil(M / BM)), clusters of (1, S, 1): cluster rank == blockIdx.y
template <int EPI, int BM, int BN, int BK, int STAGES, int S, int KS, int MINB, int TM = 8>
__global__ void __cluster_dims__(1, S, 1) __launch_bounds__(SgemmCfg<BM, BN, BK, STAGES, S, KS, TM>::THREADS, MINB)
sgemm_split_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N,
                   int flags, const int* rows)
{
    sgemm_body<EPI, BM, BN, BK, STAGES, S, KS, TM>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W, rg_arg_ptr(y, flags, RG_FLAG_IND_Y),
        rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows, flags);
}
#endif
