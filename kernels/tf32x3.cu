// rawgraph tf32x3: y[m, n] = epilogue( sum_k x[m, k] * W[k, n] ) to float32 accuracy on tensor
// cores ("3xTF32"), row-major, for serving shapes (M = 64..256 rows, K and N in the thousands).
// Same arguments, flags and PDL protocol as sgemm.cu and matmul.cu, so a cut of this file can
// replace theirs in ops.matmul:
//
//   (x, W, y, r, B = M, K, N, flags, rows)   x: M x K   W: K x N   y, r: M x N
//
// Requirements (checked by the host): K % 4 == 0, N % 4 == 0, x and W 16-byte aligned (cp.async
// moves 16-byte pieces; a piece is wholly inside or wholly outside the matrix). Any M >= 1. y and
// r need no alignment: the epilogue stores 16 bytes at a time when both are 16-byte aligned (a
// uniform test) and one float at a time otherwise.
//
// Arithmetic, and why:
//
// * Each fp32 operand v is split into big = tf32(v) (cvt.rna: 11 significant bits) and
//   small = tf32(v - big) (v - big is exact in fp32; its rounding to 11 bits leaves v - big - small
//   within 2^-22 |v|). x @ W = big*big + big*small + small*big + small*small; the last term is
//   below fp32 precision and is dropped: three mma.sync.m16n8k8 tf32 products per fp32 one.
// * A tensor core does not round like FFMA when it adds into its accumulator: the products (exact
//   for tf32 operands) and C are aligned to the largest of them with a few guard bits and the sum
//   is rounded toward zero (published measurements of V100 / A100 tensor cores; Hopper's mma.sync
//   is assumed alike). An accumulator carried over all of K therefore drifts toward zero by up to
//   an ulp per mma, a bias that grows with the number of mma's: at K = 1024 .. 4096 a model of it
//   puts the relative error 2-7x above an FFMA loop's (tf32x3_emulate.py models it). So the
//   tensor-core accumulator is restarted from zero every FLUSH k8 steps (the first mma of a run
//   takes C = 0) and added into an fp32 sum with FADD (round to nearest): each run's truncations
//   are relative to a sum of 8 * FLUSH terms only. Within a step the two correction products go
//   first (while the run's sum is small they lose nothing) and big*big last. In the model, FLUSH = 2
//   kept the error below an FFMA loop's over the same K parts at K = 1024 .. 4096 (1.6e-7 .. 2.5e-7
//   against 2.1e-7 .. 8e-7, relative Frobenius, normal data); FLUSH = 4 did not at K = 1024 in 8
//   parts (2.7e-7 against 2.1e-7).
// * FLUSH = 0 is the two-accumulator form instead: big*big accumulated over the whole K part in one
//   set, big*small + small*big in another (both from zero), added once at the end. Kept to measure
//   against; by the model above it loses accuracy with K.
// * The split happens in registers after the shared-memory load: x and W cross DRAM, L2 and shared
//   memory once, as fp32. Splitting W ahead of time would double the bytes read, which is what
//   bounds the small products.
// * cvt.rna.tf32.f32 is emitted by ptxas as an add of 0x1000 to the bits of a finite value and a
//   mask of the low 13 bits (sm_90 SASS: an inf / NaN test, the add, a select, LOP3), so big read
//   back as a float is the tf32 value itself and v - big is its exact remainder. NaN and inf stay
//   NaN and inf in big, so they reach y through big*big (an unwritten, NaN-poisoned x shows). The
//   remainder of a finite v is finite: small is rounded with the same add and mask, without the
//   test (for a non-finite v, small is meaningless and big*big already carries the NaN or inf);
//   ptxas drops that mask, the mma reading only the tf32 bits. 6 instructions a split.
// * Every sum runs in a fixed order (the same instructions in the same order on every run, the K
//   parts of a split reduced in rank order): bit-identical run to run, no atomics.
//
// Tiles:
//
// * A CTA slice of (BM / WM) x (BN / WN) warps computes a BM x BN tile; a warp a WM x WN piece:
//   WM / 16 m16 tiles by WN / 8 n8 tiles, 2 x WM x WN / 32 accumulators a thread (128 at 64 x 32:
//   the fp32 sums and the tensor-core run).
//   Per 8 steps of k a warp splits 4 WM / 16 + 2 WN / 8 values for 3 (WM / 16) (WN / 8) mma's: a
//   64 x 32 warp tile does 48 mma's for 24 splits, and 64 FADDs a run. A k8 step keeps either
//   the split B fragments of all its n8 tiles and streams A, or the reverse, whichever holds
//   fewer registers (B for 64 x 32: 16 + 8 against 32 + 12).
// * x tile [row][k] at a row stride of BK + 4 floats: the A fragment of an m16 tile is one
//   ldmatrix.x4 (b16 8 x 8 matrices read as 8 rows x 4 floats: lane 4g + t receives row g, float t
//   of each, which is the tf32 A layout a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)).
//   The 8 rows of one matrix lie (BK + 4) * 4 bytes apart, an odd number of 16-byte units when
//   BK % 8 == 0: 8 different bank groups, conflict-free.
// * W tile [k][n] at a row stride of BN + 8 floats. The B fragment is b0 = B(k = t, n = g),
//   b1 = B(t + 4, g). The four n8 tiles j = 0..3 of a group of 32 columns take their column g from
//   physical column 4g + j, so a lane reads its b0 of all four with one 16-byte load (and b1 with
//   another); with the stride = 8 (mod 32) floats the 8 lanes of each quarter warp hit 8 different
//   bank groups. The permutation comes back in the accumulators: c0 / c1 (row g, columns 2t / 2t + 1)
//   of n8 tile j are physical columns 8t + j / 8t + 4 + j, so a lane owns 8 consecutive columns of
//   rows g and g + 8 of each group: two 16-byte stores a row.
//
// Pipeline, K split, PDL, flags, epilogue: as sgemm.cu (its header has the reasons).
// * cp.async pipeline of STAGES stages of BK steps of k, one barrier a stage.
// * K is cut into P = S * KS parts: S CTAs of a thread-block cluster (template S,
//   __cluster_dims__(1, S, 1), grid y = S) and KS slices of warps inside a CTA, each with its own
//   stages and named barrier (bar.sync 1 + slice). Part p = rank * KS + slice takes K rows
//   [p * kc, (p + 1) * kc), kc a multiple of BK. Reduction: every slice stores its partial tile in
//   its CTA's shared memory (reusing the stages), the cluster synchronizes, and CTA `rank` finishes
//   rows [rank * ceil(BM / S), ...) of the tile, summing the P partials in the order
//   p = 0, 1, ..., P - 1 through distributed shared memory, then applies the epilogue. With P == 1
//   the epilogue runs straight from registers.
// * PDL (rawgraph.cuh): the first STAGES - 1 W stages are issued before griddepcontrol.wait, x
//   (and the row table) only after it. flags & RG_FLAG_EARLY: the successor may launch at the
//   start, else once the K loop is done.
// * Indirect pointers (RG_FLAG_IND_X / _Y / _R) and row tables (RG_FLAG_ROWS_X / _R / _Y) as in
//   matmul.cu: x rows looked up once per thread after the wait, y and r rows in the epilogue.
// * EPI: 0 none, 1 relu (NaN passes), 2 add (y = x @ W + r).
//
// Shared memory is dynamic: tf32x3_smem_floats<BM, BN, BK, STAGES, S, KS, WM, WN>() floats
// = max(KS * STAGES * (BM * (BK + 4) + BK * (BN + 8)), S * KS > 1 ? KS * BM * (BN + 4) : 0);
// rawgraph.ops.tf32x3_smem_bytes computes the same (x 4) and raises
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES above 48 KB.
//
// Launch: grid (ceil(N / BN), S, ceil(M / BM)), block KS * (BM / WM) * (BN / WN) * 32 threads.
// Name expressions:
//   tf32x3_kernel<EPI, BM, BN, BK, STAGES, KS, MINB, WM, WN, FLUSH>             (S == 1, no cluster)
//   tf32x3_split_kernel<EPI, BM, BN, BK, STAGES, S, KS, MINB, WM, WN, FLUSH>    (2 <= S <= 8, clusters of (1, S, 1))
// MINB is __launch_bounds__' minimum CTAs per SM (1 leaves ptxas up to 255 registers a thread).
// FLUSH: k8 steps per tensor-core accumulation run (BK / 8 a multiple of it), 0 for the
// two-accumulator form (see above).
//
// RG_HOST_EMULATION (never set by NVRTC) swaps the inline-asm helpers below for host versions
// (benchmarks/tf32x3_emulate.py: one std::thread per CUDA thread, ldmatrix and mma as warp-wide
// exchanges with the PTX fragment layouts), which checks the index arithmetic, fragment layouts,
// bounds, pipeline order and reduction of this file on the CPU.

#include "rawgraph.cuh"
#include "gemm_tile.cuh"

#ifndef RG_HOST_EMULATION
// Named barrier `id` (1..15) over `count` threads (a multiple of 32): one K slice's threads.
__device__ __forceinline__ void tx_bar_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// fp32 -> tf32, round to nearest, ties away from zero; the bits of a float with the low 13 zero.
__device__ __forceinline__ unsigned tx_tf32(float v)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// Four 8 x 4-float matrices from shared memory: lanes 8i .. 8i + 7 give the row addresses of
// matrix i; lane 4g + t receives float t of row g of matrix i in r[i].
__device__ __forceinline__ void tx_ldmatrix4(unsigned (&r)[4], const float* row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// d += A (16 x 8, row) * B (8 x 8, col), tf32 operands, fp32 accumulators.
__device__ __forceinline__ void tx_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = A * B (C = 0): the first mma of an accumulation run.
__device__ __forceinline__ void tx_mma_z(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
#endif

// v = big + small (to 2^-22 |v|), each a tf32 value (see the header).
__device__ __forceinline__ void tx_split(float v, unsigned& big, unsigned& small)
{
    big = tx_tf32(v);
    small = (__float_as_uint(v - __uint_as_float(big)) + 0x1000u) & 0xffffe000u;
}

template <int BM, int BN, int BK, int STAGES, int S, int KS, int WM, int WN, int FLUSH = 0>
struct Tf32x3Cfg {
    static constexpr int WARPS_M = BM / WM;
    static constexpr int WARPS_N = BN / WN;
    static constexpr int T = 32 * WARPS_M * WARPS_N;  // threads per slice
    static constexpr int THREADS = T * KS;
    static constexpr int MT = WM / 16;                 // m16 tiles of a warp
    static constexpr int NG = WN / 32;                 // groups of four n8 tiles of a warp
    static constexpr int XS = BK + 4;                  // x tile row stride (floats)
    static constexpr int WS = BN + 8;                  // W tile row stride (floats)
    static constexpr int XTILE = BM * XS;
    static constexpr int STAGE = XTILE + BK * WS;      // floats per stage
    static constexpr int PS = BN + 4;                  // partial tile row stride
    static constexpr int PIPE = KS * STAGES * STAGE;
    static constexpr int PART = (S * KS > 1) ? KS * BM * PS : 0;
    static constexpr int SMEM_FLOATS = PIPE > PART ? PIPE : PART;
    static constexpr int XCH = BM * BK / 4;            // 16-byte pieces of an x tile
    static constexpr int WCH = BK * BN / 4;            // 16-byte pieces of a W tile
    static constexpr int XPT = (XCH + T - 1) / T;      // pieces per thread
    static constexpr int WPT = (WCH + T - 1) / T;
    static_assert(WM % 16 == 0 && WM >= 16 && WM <= 64, "a warp covers 1..4 m16 tiles");
    static_assert(WN == 32 || WN == 64, "a warp covers one or two groups of four n8 tiles");
    static_assert((WM / 16) * (WN / 32) <= 4, "at most 128 accumulators a thread (two sets)");
    static_assert(BM % WM == 0 && BN % WN == 0, "whole warps");
    static_assert(BK % 8 == 0 && BK >= 8, "BK is a multiple of 8 (the mma's k, the ldmatrix bank rule)");
    static_assert(FLUSH >= 0 && (BK / 8) % (FLUSH > 0 ? FLUSH : 1) == 0, "accumulation runs end with a stage");
    static_assert(STAGES >= 2, "at least two stages");
    static_assert(S >= 1 && S <= 8, "portable cluster size");
    static_assert(KS >= 1 && KS <= 8, "K slices per CTA");
    static_assert(THREADS <= 1024, "too many threads");
};

template <int BM, int BN, int BK, int STAGES, int S, int KS, int WM, int WN>
__host__ __device__ constexpr int tf32x3_smem_floats()
{
    return Tf32x3Cfg<BM, BN, BK, STAGES, S, KS, WM, WN>::SMEM_FLOATS;
}



template <int EPI, int BM, int BN, int BK, int STAGES, int S, int KS, int WM, int WN, int FLUSH>
__device__ __forceinline__ void tf32x3_body(const float* x, const float* __restrict__ W, float* y, const float* r,
                                            int M, int K, int N, int early, const int* rows, int flags)
{
    typedef Tf32x3Cfg<BM, BN, BK, STAGES, S, KS, WM, WN, FLUSH> C;
    constexpr int T = C::T, XS = C::XS, WS = C::WS, MT = C::MT, NG = C::NG;
    constexpr int RUN = FLUSH > 0 ? FLUSH : 1;  // k8 steps per tensor-core run (when FLUSH > 0)
    extern __shared__ __align__(16) float smem[];

    const int slice = (KS == 1) ? 0 : (int)threadIdx.x / T;
    const int tid = (KS == 1) ? (int)threadIdx.x : (int)threadIdx.x % T;
    const int warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;
    const int wm0 = (warp / C::WARPS_N) * WM;   // the warp's first row and column in the tile
    const int wn0 = (warp % C::WARPS_N) * WN;
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
    // Every slice passes its barrier kc / BK times, computing on its first nst stages only: the
    // barrier counts of all slices stay equal (compute-sanitizer's racecheck orders accesses by them).
    const int nloop = (KS == 1) ? nst : kc / BK;
    float* const base = smem + slice * STAGES * C::STAGE;

    // W: piece c = tid + i * T is row c / (BN / 4), columns 4 * (c % (BN / 4)) of a W tile.
    const float* wsrc[C::WPT];
    int wrow[C::WPT], wdst[C::WPT];
    bool wok[C::WPT];
#pragma unroll
    for (int i = 0; i < C::WPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BN / 4), col = (c % (BN / 4)) * 4;
        wrow[i] = row;
        wdst[i] = row * WS + col;
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
                rg_cp_async16(ws + wdst[i], ok ? wsrc[i] : W, ok);
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

    // [m16 tile][n8 tile][fragment]. FLUSH > 0: acc holds the fp32 sums, run the tensor-core run
    // (restarted every FLUSH k8 steps). FLUSH == 0: acc accumulates big * big, run
    // big * small + small * big, both over the whole K part.
    float acc[MT][4 * NG][4], run[MT][4 * NG][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4 * NG; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                acc[i][j][q] = 0.0f;
                run[i][j][q] = 0.0f;
            }

    // One k8 step of m16 tile i by n8 tile j, corrections first: big*big comes last so that the
    // corrections enter a run while it is small (FLUSH > 0), or an accumulator of their own (FLUSH == 0).
    // The order of the mma's into one accumulator is the same in both loop orders below.
    auto step = [&](int i, int j, int kk, const unsigned (&ab)[4], const unsigned (&as)[4], unsigned bb0, unsigned bs0,
                    unsigned bb1, unsigned bs1) {
        float (&d)[4] = run[i][j];
        if (FLUSH > 0 && (kk / 8) % RUN == 0) tx_mma_z(d, as, bb0, bb1);
        else tx_mma(d, as, bb0, bb1);
        tx_mma(d, ab, bs0, bs1);
        tx_mma(FLUSH > 0 ? d : acc[i][j], ab, bb0, bb1);
    };
    // Keep the split B fragments of a k8 step (16 registers per group of four n8 tiles) and stream A,
    // or keep A (8 per m16 tile) and stream B, whichever holds fewer registers.
    constexpr bool HOLD_B = 16 * NG + 8 < 8 * MT + 12;

    // ldmatrix row address of this lane: matrix lane / 8 = (rows + 8 (lane / 8 odd), k + 4 (lane >= 16)).
    const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8, lk = (lane >> 4) * 4;

    int buf = 0;                  // stage st lives in buffer st % STAGES
    int nbuf = STAGES - 1;        // buffer of stage st + STAGES - 1
    for (int st = 0; st < nloop; ++st) {
        rg_cp_async_wait<STAGES - 2>();
        // Stage st landed for every thread of the slice; stage st - 1 (buffer nbuf) is no longer read.
        if (KS == 1) __syncthreads();
        else tx_bar_sync(1 + slice, T);
        if (st + STAGES - 1 < nst) {  // stage st + STAGES - 1 into the buffer stage st - 1 left
            load_w(nbuf);
            load_x(nbuf);
        }
        rg_cp_async_commit();
        if (st < nst) {  // uniform over the slice: every lane of a warp takes part in its mma's
            const float* xs = base + buf * C::STAGE + (wm0 + lrow) * XS + lk;
            const float* ws = base + buf * C::STAGE + C::XTILE + t * WS + wn0 + 4 * g;
            // The split A fragment of m16 tile i at k step kk.
            auto load_a = [&](int i, int kk, unsigned (&ab)[4], unsigned (&as)[4]) {
                unsigned raw[4];
                tx_ldmatrix4(raw, xs + 16 * i * XS + kk);
#pragma unroll
                for (int q = 0; q < 4; ++q) tx_split(__uint_as_float(raw[q]), ab[q], as[q]);
            };
            // b0 (k = t) and b1 (k = t + 4) of the four n8 tiles of column group h at k step kk.
            auto load_b = [&](int h, int kk, float4& v0, float4& v1) {
                v0 = *reinterpret_cast<const float4*>(ws + kk * WS + 32 * h);
                v1 = *reinterpret_cast<const float4*>(ws + (kk + 4) * WS + 32 * h);
            };
#pragma unroll
            for (int kk = 0; kk < BK; kk += 8) {
                if constexpr (HOLD_B) {
                    unsigned bf[4 * NG][4];  // big b0, small b0, big b1, small b1
#pragma unroll
                    for (int h = 0; h < NG; ++h) {
                        float4 v0, v1;
                        load_b(h, kk, v0, v1);
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            tx_split(gt_get(v0, j), bf[4 * h + j][0], bf[4 * h + j][1]);
                            tx_split(gt_get(v1, j), bf[4 * h + j][2], bf[4 * h + j][3]);
                        }
                    }
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        unsigned ab[4], as[4];
                        load_a(i, kk, ab, as);
#pragma unroll
                        for (int j = 0; j < 4 * NG; ++j) step(i, j, kk, ab, as, bf[j][0], bf[j][1], bf[j][2], bf[j][3]);
                    }
                } else {
                    unsigned ab[MT][4], as[MT][4];
#pragma unroll
                    for (int i = 0; i < MT; ++i) load_a(i, kk, ab[i], as[i]);
#pragma unroll
                    for (int h = 0; h < NG; ++h) {
                        float4 v0, v1;
                        load_b(h, kk, v0, v1);
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            unsigned bb0, bs0, bb1, bs1;
                            tx_split(gt_get(v0, j), bb0, bs0);
                            tx_split(gt_get(v1, j), bb1, bs1);
#pragma unroll
                            for (int i = 0; i < MT; ++i) step(i, 4 * h + j, kk, ab[i], as[i], bb0, bs0, bb1, bs1);
                        }
                    }
                }
                if (FLUSH > 0 && (kk / 8) % RUN == RUN - 1) {  // end of a run: into the fp32 sums
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int j = 0; j < 4 * NG; ++j)
#pragma unroll
                            for (int q = 0; q < 4; ++q) acc[i][j][q] += run[i][j][q];
                }
            }
        }
        buf = (buf + 1 == STAGES) ? 0 : buf + 1;
        nbuf = (nbuf + 1 == STAGES) ? 0 : nbuf + 1;
    }
    rg_cp_async_wait<0>();
    if (!early) rg_allow_dependents();  // the successor's prologue overlaps only our epilogue

    // This thread's outputs: m16 tile i, row g + 8e, columns 8t .. 8t + 3 (fragment 2e of the
    // group's n8 tiles 0..3) and 8t + 4 .. 8t + 7 (fragment 2e + 1) of column group h.
    auto out1 = [&](int i, int j, int q) { return FLUSH > 0 ? acc[i][j][q] : acc[i][j][q] + run[i][j][q]; };
    auto out4 = [&](int i, int h, int q) {
        return make_float4(out1(i, 4 * h, q), out1(i, 4 * h + 1, q), out1(i, 4 * h + 2, q), out1(i, 4 * h + 3, q));
    };
    const bool vec = ((reinterpret_cast<size_t>(y) | (EPI == 2 ? reinterpret_cast<size_t>(r) : 0)) & 15) == 0;

    if constexpr (P == 1) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int m = m0 + wm0 + 16 * i + g + 8 * e;
                if (m < M) {
                    const int my = rg_row(rows, flags, RG_FLAG_ROWS_Y, m);
                    const int mr = EPI == 2 ? rg_row(rows, flags, RG_FLAG_ROWS_R, m) : 0;
#pragma unroll
                    for (int h = 0; h < NG; ++h)
#pragma unroll
                        for (int u = 0; u < 2; ++u) {
                            const int n = n0 + wn0 + 32 * h + 8 * t + 4 * u;
                            if (n < N) gt_store4<EPI>(y, r, N, my, mr, n, out4(i, h, 2 * e + u), vec);
                        }
                }
            }
    } else {
        __syncthreads();  // every slice is done with its stages: they become the partial tiles
        float* const pt = smem + slice * BM * C::PS;
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e)
#pragma unroll
                for (int h = 0; h < NG; ++h)
#pragma unroll
                    for (int u = 0; u < 2; ++u)
                        *reinterpret_cast<float4*>(pt + (wm0 + 16 * i + g + 8 * e) * C::PS + wn0 + 32 * h + 8 * t + 4 * u) =
                            out4(i, h, 2 * e + u);
#ifdef RG_HAS_CLUSTERS
        if (S > 1) rg_cluster_sync();  // all threads of all CTAs: the partials are visible cluster-wide
        else __syncthreads();
#else
        __syncthreads();
#endif
        gt_reduce_partials<EPI, BM, BN, S, KS, C::PS, C::THREADS>(smem, rank, m0, n0, M, N, y, r, rows, flags, vec);
    }
}

// grid (ceil(N / BN), 1, ceil(M / BM)), KS * (BM / WM) * (BN / WN) * 32 threads
template <int EPI, int BM, int BN, int BK, int STAGES, int KS, int MINB, int WM, int WN, int FLUSH>
__global__ void __launch_bounds__(Tf32x3Cfg<BM, BN, BK, STAGES, 1, KS, WM, WN, FLUSH>::THREADS, MINB)
tf32x3_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N, int flags,
              const int* rows)
{
    tf32x3_body<EPI, BM, BN, BK, STAGES, 1, KS, WM, WN, FLUSH>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W,
        rg_arg_ptr(y, flags, RG_FLAG_IND_Y), rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows,
        flags);
}

#ifdef RG_HAS_CLUSTERS
// grid (ceil(N / BN), S, ceil(M / BM)), clusters of (1, S, 1): cluster rank == blockIdx.y
template <int EPI, int BM, int BN, int BK, int STAGES, int S, int KS, int MINB, int WM, int WN, int FLUSH>
__global__ void __cluster_dims__(1, S, 1)
__launch_bounds__(Tf32x3Cfg<BM, BN, BK, STAGES, S, KS, WM, WN, FLUSH>::THREADS, MINB)
tf32x3_split_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N,
                    int flags, const int* rows)
{
    tf32x3_body<EPI, BM, BN, BK, STAGES, S, KS, WM, WN, FLUSH>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W,
        rg_arg_ptr(y, flags, RG_FLAG_IND_Y), rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows,
        flags);
}
#endif
