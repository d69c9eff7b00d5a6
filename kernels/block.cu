// One whole residual block in one kernel, for narrow widths (W <= 256, W % 4 == 0):
//
//   y = relu(x @ W1) @ W2 + x          x, y: B x W      W1, W2: W x W      (float32, row-major)
//
// A cluster of CS CTAs owns BT batch rows; CTA `rank` owns the slice [rank * SL, rank * SL + SL)
// of the width (SL = W / CS rounded up to 4):
//   1. partial P = x[:, slice] @ W1[slice, :] over all W columns (its rows of W1 only);
//   2. after a cluster barrier, a[:, slice] = relu(sum over ranks of P[:, slice]), read from
//      every CTA's shared memory in rank order;
//   3. partial Q = a[:, slice] @ W2[slice, :] -- the slice of a this CTA made itself;
//   4. after a second barrier, y[:, slice] = sum over ranks of Q[:, slice] + x[:, slice].
// Each CTA reads 2 * SL rows of weights, all of them before waiting for the previous kernel (PDL),
// so a layer is one graph node and no SM reads both whole matrices. Sums run in a fixed order:
// bit-identical run to run; another order than the matmul kernels', so equal to them only to
// float tolerance.
//
// Name expressions instantiate it: block_kernel<BT, CS> (sm_90: clusters).

#include "rawgraph.cuh"

#define RG_BLOCK_THREADS 256
#define RG_BLOCK_MAXW 256
#define RG_BLOCK_CG 64  // column groups of 4: threads t and t + 64 share columns
#define RG_BLOCK_KG (RG_BLOCK_THREADS / RG_BLOCK_CG)

#ifdef RG_HAS_CLUSTERS
// sl[b][kk] += sum over this thread's rows k of src[b][k - ks] * w[j]; rows k = ks + kg + KG * j.
template <int BT, int J>
__device__ __forceinline__ void rg_block_partial(float (*acc)[4], const float (*src)[RG_BLOCK_MAXW / 2],
                                                 const float4* w, int kg, int sl_rows)
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int kk = kg + RG_BLOCK_KG * j;
        if (kk < sl_rows) {
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                const float s = src[b][kk];
                acc[b][0] = fmaf(s, w[j].x, acc[b][0]);
                acc[b][1] = fmaf(s, w[j].y, acc[b][1]);
                acc[b][2] = fmaf(s, w[j].z, acc[b][2]);
                acc[b][3] = fmaf(s, w[j].w, acc[b][3]);
            }
        }
    }
}

// dst[b][n] = sum over the RG_BLOCK_KG row groups of red; every column of the tile.
template <int BT>
__device__ __forceinline__ void rg_block_fold(float (*dst)[RG_BLOCK_MAXW], const float (*red)[BT][RG_BLOCK_MAXW], int W)
{
    for (int t = threadIdx.x; t < BT * W; t += RG_BLOCK_THREADS) {
        const int b = t / W, n = t - b * W;
        float s = red[0][b][n];
#pragma unroll
        for (int g = 1; g < RG_BLOCK_KG; ++g) s += red[g][b][n];
        dst[b][n] = s;
    }
}

template <int BT, int CS>
__global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(RG_BLOCK_THREADS)
block_kernel(const float* x, const float* __restrict__ W1, const float* __restrict__ W2, float* y, int B, int W)
{
    static_assert(BT >= 1 && BT <= 4 && (CS == 4 || CS == 8), "shared memory and registers are sized for BT <= 4, CS 4 or 8");
    constexpr int MAXSL = RG_BLOCK_MAXW / 2;          // slice rows at most (CS >= 2)
    constexpr int J = MAXSL / RG_BLOCK_KG;            // weight rows per thread at most
    constexpr int JC = (RG_BLOCK_MAXW / CS + RG_BLOCK_KG - 1) / RG_BLOCK_KG;  // ... for this CS
    static_assert(JC <= J, "slice too tall");
    __shared__ __align__(16) float xs[BT][MAXSL];     // x[:, slice] (also the residual)
    __shared__ __align__(16) float as[BT][MAXSL];     // a[:, slice]
    __shared__ __align__(16) float red[RG_BLOCK_KG][BT][RG_BLOCK_MAXW];
    __shared__ __align__(16) float P[BT][RG_BLOCK_MAXW];
    __shared__ __align__(16) float Q[BT][RG_BLOCK_MAXW];

    const unsigned rank = rg_cluster_rank();
    const int sl = ((W + CS - 1) / CS + 3) / 4 * 4;
    const int ks = min(W, (int)rank * sl);
    const int rows = min(W, ks + sl) - ks;            // this CTA's slice height (may be 0)
    const int b0 = blockIdx.y * BT;
    const int nb = min(BT, B - b0);
    const int cg = threadIdx.x % RG_BLOCK_CG, kg = threadIdx.x / RG_BLOCK_CG;
    const int c = 4 * cg;
    const bool colok = c < W;

    float4 w1[JC], w2[JC];
    rg_allow_dependents();
#pragma unroll
    for (int j = 0; j < JC; ++j) {
        const int kk = kg + RG_BLOCK_KG * j;
        const bool ok = colok && kk < rows;
        const size_t o = (size_t)(ks + kk) * W + c;
        w1[j] = ok ? rg_load_stream4(W1 + o) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        w2[j] = ok ? rg_load_stream4(W2 + o) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    rg_wait_dependencies();

    for (int t = threadIdx.x; t < BT * MAXSL; t += RG_BLOCK_THREADS) {
        const int b = t / MAXSL, kk = t % MAXSL;
        xs[b][kk] = (b < nb && kk < rows) ? x[(size_t)(b0 + b) * W + ks + kk] : 0.0f;
    }
    __syncthreads();

    float acc[BT][4];
#pragma unroll
    for (int b = 0; b < BT; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
    rg_block_partial<BT, JC>(acc, xs, w1, kg, rows);
#pragma unroll
    for (int b = 0; b < BT; ++b)
        if (colok) *reinterpret_cast<float4*>(&red[kg][b][c]) = make_float4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
    __syncthreads();
    rg_block_fold<BT>(P, red, W);
    rg_cluster_sync();  // every CTA's P is complete

    for (int t = threadIdx.x; t < BT * MAXSL; t += RG_BLOCK_THREADS) {
        const int b = t / MAXSL, kk = t % MAXSL;
        float s = 0.0f;
        if (kk < rows) {
#pragma unroll
            for (int q = 0; q < CS; ++q) s += rg_dsmem_load(&P[b][ks + kk], q);
        }
        as[b][kk] = rg_relu(s);
    }
    __syncthreads();  // as is complete; red was last read before the cluster barrier

#pragma unroll
    for (int b = 0; b < BT; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
    rg_block_partial<BT, JC>(acc, as, w2, kg, rows);
#pragma unroll
    for (int b = 0; b < BT; ++b)
        if (colok) *reinterpret_cast<float4*>(&red[kg][b][c]) = make_float4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
    __syncthreads();
    rg_block_fold<BT>(Q, red, W);
    rg_cluster_sync();  // every CTA's Q is complete

    float out[(BT * MAXSL + RG_BLOCK_THREADS - 1) / RG_BLOCK_THREADS];
#pragma unroll
    for (int e = 0; e < (BT * MAXSL + RG_BLOCK_THREADS - 1) / RG_BLOCK_THREADS; ++e) {
        const int t = threadIdx.x + e * RG_BLOCK_THREADS;
        const int b = t / MAXSL, kk = t % MAXSL;
        float s = 0.0f;
        if (t < BT * MAXSL && b < nb && kk < rows) {
#pragma unroll
            for (int q = 0; q < CS; ++q) s += rg_dsmem_load(&Q[b][ks + kk], q);
        }
        out[e] = s;
    }
    rg_cluster_arrive();  // done reading the other CTAs' Q
#pragma unroll
    for (int e = 0; e < (BT * MAXSL + RG_BLOCK_THREADS - 1) / RG_BLOCK_THREADS; ++e) {
        const int t = threadIdx.x + e * RG_BLOCK_THREADS;
        const int b = t / MAXSL, kk = t % MAXSL;
        if (t < BT * MAXSL && b < nb && kk < rows) y[(size_t)(b0 + b) * W + ks + kk] = out[e] + xs[b][kk];
    }
    rg_cluster_wait();
}
#endif  // RG_HAS_CLUSTERS
