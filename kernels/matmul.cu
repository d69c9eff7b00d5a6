// rawgraph matmul family: y[b, n] = epilogue( sum_k x[b, k] * W[k, n] ), float32, row-major.
//
//   x: B x K    W: K x N    y: B x N    r: B x N (residual, EPI_ADD only)
//
// Two kernels, chosen per shape by ops.matmul_shape:
//
// matvec (batch <= 8, or any shape the GEMM cannot take): reading W dominates. A CTA owns TC
// output columns and BT batch rows; its 8 warps split its K rows; inside a warp LPR = TC / VEC
// lanes cover one row of the tile with VEC-wide loads (16-byte float4 when VEC == 4) and
// RPW = 32 / LPR rows are read at once. The K loop keeps RG_UNROLL loads in flight per thread and
// loads the next group before using the current one. x is staged in shared memory as [k][b], so
// one 16-byte shared load gives four batch rows. With S > 1 the S CTAs of a cluster split K
// again and the partials are summed through distributed shared memory in rank order.
//
// gemm (batch >= 32 on large W; K % 4 == 0, N % 4 == 0, x and W 16-byte aligned): a CTA computes
// a 64 x BN (64 or 128) tile of y from 16-deep slices of x and W that cp.async streams into
// shared memory 3 stages ahead; each thread owns a 4 x BN/16 block of outputs. With S > 1 the cluster splits K and sums the
// tiles through distributed shared memory, again in rank order.
//
// Both: every sum is taken in a fixed order (no atomics), so results are bit-identical run to
// run and launch path to launch path. PDL as described in rawgraph.cuh: the first W loads are
// issued before waiting for the previous kernel. `early` (flags & RG_FLAG_EARLY) says when the
// successor may launch: at the start (small products, where launch latency is the cost to hide)
// or once the K loop is done (large ones, where a successor prefetching early only competes for
// DRAM). The other flags (rawgraph.cuh) make x, y or r indirect, or pick their rows through the
// `rows` table (gather from and scatter to request slots).
//
// Name expressions instantiate them: matvec_kernel<EPI, VEC, TC, BT>,
// matvec_split_kernel<EPI, VEC, TC, BT, S>, gemm_kernel<EPI, BN, SL>, gemm_split_kernel<EPI, BN, S, SL>.

#include "rawgraph.cuh"

#define RG_THREADS 256
#define RG_WARPS (RG_THREADS / 32)
#define RG_UNROLL 8
#define RG_XS_FLOATS 4096  // x staged per piece: 16 KB

enum { EPI_NONE = 0, EPI_RELU = 1, EPI_ADD = 2 };

template <int EPI>
__device__ __forceinline__ float rg_epilogue(float s, const float* r, size_t o)
{
    if (EPI == EPI_RELU) return rg_relu(s);
    if (EPI == EPI_ADD) return s + r[o];
    return s;
}

template <int VEC> struct VecT;
template <> struct VecT<1> {
    typedef float type;
    static __device__ __forceinline__ float load(const float* p) { return rg_load_stream(p); }
    static __device__ __forceinline__ float zero() { return 0.0f; }
    static __device__ __forceinline__ float get(const float& v, int) { return v; }
};
template <> struct VecT<4> {
    typedef float4 type;
    static __device__ __forceinline__ float4 load(const float* p) { return rg_load_stream4(p); }
    static __device__ __forceinline__ float4 zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static __device__ __forceinline__ float get(const float4& v, int i) {
        return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
    }
};

// ---------------------------------------------------------------------------------------------
// matvec
// ---------------------------------------------------------------------------------------------

template <int EPI, int VEC, int TC, int BT, int S>
__device__ __forceinline__ void matvec_body(const float* x, const float* __restrict__ W, float* y, const float* r,
                                            int B, int K, int N, int early, const int* rows, int flags)
{
    typedef VecT<VEC> V;
    typedef typename V::type vec_t;
    constexpr int LPR = TC / VEC;             // lanes per tile row
    constexpr int RPW = 32 / LPR;             // tile rows per warp step
    constexpr int RPB = RG_WARPS * RPW;       // tile rows per block step
    constexpr int GROUP = RG_UNROLL * RPB;    // rows one unrolled group covers
    constexpr int XK = RG_XS_FLOATS / BT;     // rows of x staged per piece
    static_assert(TC % VEC == 0 && 32 % LPR == 0 && LPR >= 1, "bad tile");
    static_assert(BT * TC <= 512, "partials are sized for BT * TC <= 512");
    static_assert(XK % GROUP == 0, "a group must not straddle two x pieces");

    __shared__ __align__(16) float xs[RG_XS_FLOATS];
    __shared__ float part[RG_WARPS][BT * TC];
    __shared__ float red[S > 1 ? BT * TC : 1];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int lcol = lane % LPR;
    const int lrow = lane / LPR;
    const int n0 = blockIdx.x * TC;
    const int col = n0 + lcol * VEC;
    const int b0 = blockIdx.z * BT;
    const int nb = min(BT, B - b0);
    unsigned rank = 0;
#ifdef RG_HAS_CLUSTERS
    if (S > 1) rank = rg_cluster_rank();
#endif
    // This CTA's rows of K: the cluster splits K into S chunks of whole block steps.
    const int kc = ((K + S - 1) / S + RPB - 1) / RPB * RPB;
    const int kb = min(K, (int)rank * kc);
    const int ke = min(K, kb + kc);
    const int span = (ke - kb + GROUP - 1) / GROUP * GROUP;  // uniform over the CTA
    const int row0 = kb + warp * RPW + lrow;                  // this thread's first row
    const bool colok = col < N;                               // VEC == 4 only when N % 4 == 0

    vec_t w[RG_UNROLL];
    if (early) rg_allow_dependents();
#pragma unroll
    for (int u = 0; u < RG_UNROLL; ++u) {
        const int k = row0 + u * RPB;
        w[u] = (colok && k < ke) ? V::load(W + (size_t)k * N + col) : V::zero();
    }
    rg_wait_dependencies();

    float acc[BT][VEC];
#pragma unroll
    for (int b = 0; b < BT; ++b)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[b][v] = 0.0f;

    for (int p = 0; p < span; p += XK) {
        const int prow = min(XK, ke - kb - p);
        if (p) __syncthreads();  // the previous piece has been read by every warp
        for (int t = threadIdx.x; t < BT * prow; t += RG_THREADS) {
            const int b = t / prow, kk = t - b * prow;
            xs[kk * BT + b] = b < nb ? x[(size_t)rg_row(rows, flags, RG_FLAG_ROWS_X, b0 + b) * K + kb + p + kk] : 0.0f;
        }
        __syncthreads();
        const int pend = min(span, p + XK);
        for (int g = p; g < pend; g += GROUP) {
            vec_t wn[RG_UNROLL];
            const bool more = g + GROUP < span;
#pragma unroll
            for (int u = 0; u < RG_UNROLL; ++u) {
                const int k = row0 + g + GROUP + u * RPB;
                wn[u] = (more && colok && k < ke) ? V::load(W + (size_t)k * N + col) : V::zero();
            }
#pragma unroll
            for (int u = 0; u < RG_UNROLL; ++u) {
                const int kk = row0 - kb + g + u * RPB - p;  // row within the piece
                if (kb + p + kk < ke) {
                    const float* xr = xs + kk * BT;
                    float xv[BT];
                    if (BT % 4 == 0) {
#pragma unroll
                        for (int b = 0; b < BT; b += 4) {
                            const float4 q = *reinterpret_cast<const float4*>(xr + b);
                            xv[b] = q.x; xv[b + 1] = q.y; xv[b + 2] = q.z; xv[b + 3] = q.w;
                        }
                    } else {
#pragma unroll
                        for (int b = 0; b < BT; ++b) xv[b] = xr[b];
                    }
#pragma unroll
                    for (int b = 0; b < BT; ++b)
#pragma unroll
                        for (int v = 0; v < VEC; ++v) acc[b][v] = fmaf(xv[b], V::get(w[u], v), acc[b][v]);
                }
            }
#pragma unroll
            for (int u = 0; u < RG_UNROLL; ++u) w[u] = wn[u];
        }
    }

    if (!early) rg_allow_dependents();  // the successor's prologue overlaps only our reduction

    // Reduce over the RPW rows a warp read at once: lanes with the same lcol, fixed order.
#pragma unroll
    for (int off = LPR; off < 32; off <<= 1)
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[b][v] += __shfl_xor_sync(0xffffffffu, acc[b][v], off);
    if (lrow == 0) {
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int v = 0; v < VEC; ++v) part[warp][b * TC + lcol * VEC + v] = acc[b][v];
    }
    __syncthreads();

    if constexpr (S == 1) {
        for (int t = threadIdx.x; t < BT * TC; t += RG_THREADS) {
            const int b = t / TC, n = n0 + t % TC;
            if (b < nb && n < N) {
                float s = part[0][t];
#pragma unroll
                for (int q = 1; q < RG_WARPS; ++q) s += part[q][t];
                const size_t oy = (size_t)rg_row(rows, flags, RG_FLAG_ROWS_Y, b0 + b) * N + n;
                const size_t orr = (size_t)rg_row(rows, flags, RG_FLAG_ROWS_R, b0 + b) * N + n;
                y[oy] = rg_epilogue<EPI>(s, r, orr);
            }
        }
    } else {
#ifdef RG_HAS_CLUSTERS
    for (int t = threadIdx.x; t < BT * TC; t += RG_THREADS) {
        float s = part[0][t];
#pragma unroll
        for (int q = 1; q < RG_WARPS; ++q) s += part[q][t];
        red[t] = s;
    }
    rg_cluster_sync();
    // CTA `rank` finishes a contiguous share of the tile's outputs: at most 256 (BT*TC <= 512, S >= 2).
    constexpr int SHARE = (BT * TC + S - 1) / S;
    const int t = (int)rank * SHARE + threadIdx.x;
    const bool mine = threadIdx.x < SHARE && t < BT * TC;
    float s = 0.0f;
    if (mine) {
#pragma unroll
        for (int q = 0; q < S; ++q) s += rg_dsmem_load(&red[t], q);
    }
    rg_cluster_arrive();
    if (mine) {
        const int b = t / TC, n = n0 + t % TC;
        if (b < nb && n < N) {
            const size_t oy = (size_t)rg_row(rows, flags, RG_FLAG_ROWS_Y, b0 + b) * N + n;
            const size_t orr = (size_t)rg_row(rows, flags, RG_FLAG_ROWS_R, b0 + b) * N + n;
            y[oy] = rg_epilogue<EPI>(s, r, orr);
        }
    }
    rg_cluster_wait();
#endif
    }
}

template <int EPI, int VEC, int TC, int BT>
__global__ void __launch_bounds__(RG_THREADS)
matvec_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N, int flags,
              const int* rows)
{
    matvec_body<EPI, VEC, TC, BT, 1>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W, rg_arg_ptr(y, flags, RG_FLAG_IND_Y),
        rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows, flags);
}

#ifdef RG_HAS_CLUSTERS
// grid (N / TC, S, batch tiles), clusters of (1, S, 1): cluster rank == blockIdx.y.
template <int EPI, int VEC, int TC, int BT, int S>
__global__ void __cluster_dims__(1, S, 1) __launch_bounds__(RG_THREADS)
matvec_split_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N, int flags,
              const int* rows)
{
    matvec_body<EPI, VEC, TC, BT, S>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W, rg_arg_ptr(y, flags, RG_FLAG_IND_Y),
        rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows, flags);
}
#endif

// ---------------------------------------------------------------------------------------------
// gemm
// ---------------------------------------------------------------------------------------------

#define RG_GM_BM 64
#define RG_GM_KC 16
#define RG_GM_STAGES 3
#define RG_GM_XS (RG_GM_KC + 4)  // x tile row stride: 16-byte rows, rows 4 apart land 16 banks apart

// Thread (tm, tn) owns rows 4*tm .. 4*tm+3 and, in each 64-column half of the 64 x BN tile,
// columns 4*tn .. 4*tn+3: per 4 k, 4 shared loads of x and 4 * BN / 64 of W feed 16 * BN / 4
// FMAs, and a warp's W loads are 256 contiguous bytes each.
//
// SL (1 or 2) slices of 256 threads share a CTA and split its K range again, each with its own
// stages; slice 1 hands its tile to slice 0 through shared memory. Two slices put 16 warps on an
// SM from one CTA, so a grid of one CTA per SM keeps every SM equally busy (clusters are placed
// per GPC, and a GPU's GPCs may differ in SM count: several CTAs per SM can leave some SMs doing
// 1.5x the work of others; measured: see benchmarks/NOTES.md).
//
// Shared memory is dynamic: SL * RG_GM_STAGES * STAGE floats (ops.gemm_smem_bytes).
template <int EPI, int BN, int S, int SL>
__device__ __forceinline__ void gemm_body(const float* x, const float* __restrict__ W, float* y, const float* r,
                                          int B, int K, int N, int early, const int* rows, int flags)
{
    constexpr int H = BN / 64;                                    // 64-column halves
    constexpr int STAGE = RG_GM_BM * RG_GM_XS + RG_GM_KC * BN;    // floats per stage
    constexpr int PS = BN + 4;                                    // partial tile row stride
    static_assert(H == 1 || H == 2, "BN is 64 or 128");
    static_assert(SL == 1 || SL == 2, "one or two K slices per CTA");
    static_assert(RG_GM_BM * PS <= RG_GM_STAGES * STAGE, "partial tile reuses the stages");
    extern __shared__ __align__(16) float smem[];

    const int slice = threadIdx.x / RG_THREADS;
    const int tid = threadIdx.x % RG_THREADS;
    const int tm = tid / 16, tn = tid % 16;
    const int m0 = blockIdx.z * RG_GM_BM;
    const int n0 = blockIdx.x * BN;
    unsigned rank = 0;
#ifdef RG_HAS_CLUSTERS
    if (S > 1) rank = rg_cluster_rank();
#endif
    // K is cut into S * SL chunks of whole stages: this thread's slice takes chunk rank * SL + slice.
    const int kc = ((K + S * SL - 1) / (S * SL) + RG_GM_KC - 1) / RG_GM_KC * RG_GM_KC;
    const int kb = min(K, ((int)rank * SL + slice) * kc);
    const int ke = min(K, kb + kc);
    // Every slice runs the loop (and its barriers) as often as slice 0, whose chunk is the longest;
    // stages past a slice's own chunk load zeros and add nothing.
    const int kb0 = min(K, (int)rank * SL * kc);
    const int nst = (min(K, kb0 + kc) - kb0 + RG_GM_KC - 1) / RG_GM_KC;
    float* const base = smem + slice * RG_GM_STAGES * STAGE;

    // Loader coordinates: H 16-byte pieces of the W slice (16 rows x BN columns) and one of the
    // x slice (64 rows x 16 columns) per thread.
    constexpr int WQ = BN / 4;  // 16-byte pieces per W row
    const int wr = tid / WQ, wc = (tid % WQ) * 4;
    const int xr = tid / 4, xc = (tid % 4) * 4;
    auto xs_of = [&](int st) { return base + (st % RG_GM_STAGES) * STAGE; };
    auto ws_of = [&](int st) { return xs_of(st) + RG_GM_BM * RG_GM_XS; };
    auto load_w = [&](int st) {
#pragma unroll
        for (int h = 0; h < H; ++h) {
            const int row = wr + (RG_THREADS / WQ) * h;
            const int k = kb + st * RG_GM_KC + row;
            const bool ok = k < ke && n0 + wc < N;
            rg_cp_async16(ws_of(st) + row * BN + wc, ok ? W + (size_t)k * N + n0 + wc : W, ok);
        }
    };
    int xrow = 0;  // the x row this thread loads: set after rg_wait_dependencies (rows may be fresh)
    auto load_x = [&](int st) {
        const int k = kb + st * RG_GM_KC + xc;
        const bool ok = k < ke && m0 + xr < B;
        rg_cp_async16(xs_of(st) + xr * RG_GM_XS + xc, ok ? x + (size_t)xrow * K + k : x, ok);
    };

    if (early) rg_allow_dependents();
#pragma unroll
    for (int st = 0; st < RG_GM_STAGES - 1; ++st)
        if (st < nst) load_w(st);
    rg_wait_dependencies();
    if (m0 + xr < B) xrow = rg_row(rows, flags, RG_FLAG_ROWS_X, m0 + xr);
#pragma unroll
    for (int st = 0; st < RG_GM_STAGES - 1; ++st) {
        if (st < nst) load_x(st);
        rg_cp_async_commit();  // group st also holds every W slice issued before the wait
    }

    float acc[4][4 * H];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4 * H; ++j) acc[i][j] = 0.0f;

    for (int st = 0; st < nst; ++st) {
        rg_cp_async_wait<RG_GM_STAGES - 2>();
        __syncthreads();  // stage st landed for every thread; stage st - 1 is no longer read
        if (st + RG_GM_STAGES - 1 < nst) {
            load_w(st + RG_GM_STAGES - 1);
            load_x(st + RG_GM_STAGES - 1);
        }
        rg_cp_async_commit();
        const float* xs = xs_of(st);
        const float* ws = ws_of(st);
#pragma unroll
        for (int kq = 0; kq < RG_GM_KC; kq += 4) {
            float4 a[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(xs + (4 * tm + i) * RG_GM_XS + kq);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                float4 bv[H];
#pragma unroll
                for (int h = 0; h < H; ++h) bv[h] = *reinterpret_cast<const float4*>(ws + (kq + kk) * BN + 64 * h + 4 * tn);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float av = VecT<4>::get(a[i], kk);
#pragma unroll
                    for (int h = 0; h < H; ++h) {
                        acc[i][4 * h + 0] = fmaf(av, bv[h].x, acc[i][4 * h + 0]);
                        acc[i][4 * h + 1] = fmaf(av, bv[h].y, acc[i][4 * h + 1]);
                        acc[i][4 * h + 2] = fmaf(av, bv[h].z, acc[i][4 * h + 2]);
                        acc[i][4 * h + 3] = fmaf(av, bv[h].w, acc[i][4 * h + 3]);
                    }
                }
            }
        }
    }
    rg_cp_async_wait<0>();
    if (!early) rg_allow_dependents();

    if constexpr (SL == 2) {
        __syncthreads();  // both slices are done with their stages
        float* hand = smem;
        if (slice == 1) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < H; ++h)
                    *reinterpret_cast<float4*>(hand + (4 * tm + i) * PS + 64 * h + 4 * tn) =
                        make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
        }
        __syncthreads();
        if (slice == 0) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < H; ++h) {
                    const float4 v = *reinterpret_cast<const float4*>(hand + (4 * tm + i) * PS + 64 * h + 4 * tn);
                    acc[i][4 * h] += v.x; acc[i][4 * h + 1] += v.y; acc[i][4 * h + 2] += v.z; acc[i][4 * h + 3] += v.w;
                }
        }
    }

    // The epilogue reads r and writes y one float at a time: neither needs 16-byte alignment.
    // Only slice 0 holds the CTA's sums.
    if constexpr (S == 1) {
        if (slice != 0) return;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = m0 + 4 * tm + i;
            const int my = m < B ? rg_row(rows, flags, RG_FLAG_ROWS_Y, m) : 0;
            const int mr = m < B ? rg_row(rows, flags, RG_FLAG_ROWS_R, m) : 0;
#pragma unroll
            for (int j = 0; j < 4 * H; ++j) {
                const int n = n0 + 64 * (j / 4) + 4 * tn + j % 4;
                if (m < B && n < N) {
                    y[(size_t)my * N + n] = rg_epilogue<EPI>(acc[i][j], r, (size_t)mr * N + n);
                }
            }
        }
    } else {
#ifdef RG_HAS_CLUSTERS
    __syncthreads();  // every thread is done with the stages (and the hand-off): reuse them for the partial tile
    float* pt = smem;
    if (slice == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float* row = pt + (4 * tm + i) * PS;
#pragma unroll
            for (int h = 0; h < H; ++h)
                *reinterpret_cast<float4*>(row + 64 * h + 4 * tn) =
                    make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
        }
    }
    rg_cluster_sync();  // every thread of every CTA: barrier.cluster counts them all
    // CTA `rank` finishes rows [rank * BM / S, (rank + 1) * BM / S) of the tile, 4 columns at a time.
    constexpr int ROWS = RG_GM_BM / S;
    constexpr int Q4 = BN / 4;
    constexpr int ITEMS = ROWS * Q4;
    constexpr int PER = (ITEMS + RG_THREADS - 1) / RG_THREADS;
    float4 sum[PER];
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        const int item = tid + e * RG_THREADS;
        sum[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (item < ITEMS && slice == 0) {
            const float* src = pt + ((int)rank * ROWS + item / Q4) * PS + (item % Q4) * 4;
#pragma unroll
            for (int q = 0; q < S; ++q) {
                const float4 v = rg_dsmem_load4(src, q);
                sum[e].x += v.x; sum[e].y += v.y; sum[e].z += v.z; sum[e].w += v.w;
            }
        }
    }
    rg_cluster_arrive();
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        const int item = tid + e * RG_THREADS;
        if (item < ITEMS && slice == 0) {
            const int m = m0 + (int)rank * ROWS + item / Q4;
            const int nq = n0 + (item % Q4) * 4;
            const float vals[4] = {sum[e].x, sum[e].y, sum[e].z, sum[e].w};
            const int my = m < B ? rg_row(rows, flags, RG_FLAG_ROWS_Y, m) : 0;
            const int mr = m < B ? rg_row(rows, flags, RG_FLAG_ROWS_R, m) : 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (m < B && nq + j < N) {
                    y[(size_t)my * N + nq + j] = rg_epilogue<EPI>(vals[j], r, (size_t)mr * N + nq + j);
                }
            }
        }
    }
    rg_cluster_wait();
#endif
    }
}

// grid (ceil(N / BN), 1, ceil(B / 64)), SL * 256 threads
template <int EPI, int BN, int SL>
__global__ void __launch_bounds__(RG_THREADS * SL, 3 / SL)
gemm_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N, int flags,
              const int* rows)
{
    gemm_body<EPI, BN, 1, SL>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W, rg_arg_ptr(y, flags, RG_FLAG_IND_Y),
        rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows, flags);
}

#ifdef RG_HAS_CLUSTERS
// grid (ceil(N / BN), S, ceil(B / 64)), clusters of (1, S, 1), SL * 256 threads
template <int EPI, int BN, int S, int SL>
__global__ void __cluster_dims__(1, S, 1) __launch_bounds__(RG_THREADS * SL, 3 / SL)
gemm_split_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N, int flags,
              const int* rows)
{
    gemm_body<EPI, BN, S, SL>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W, rg_arg_ptr(y, flags, RG_FLAG_IND_Y),
        rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows, flags);
}
#endif
