// One whole residual block in one kernel, for narrow widths (W <= 256, W % 4 == 0):
//
//   y = relu(x @ W1) @ W2 + x          x, y: B x W      W1, W2: W x W      (float32, row-major)
//
// A cluster of CS CTAs owns BT batch rows; CTA `rank` owns the column slice
// [rank * SL, rank * SL + SL) (SL = W / CS rounded up to 4) of both products:
//   1. h[:, slice] = x @ W1[:, slice], reduced inside the CTA; a[:, slice] = relu(h) in shared memory;
//   2. one cluster barrier, then every CTA gathers all of a from the others' shared memory (DSMEM);
//   3. y[:, slice] = a @ W2[:, slice] + x[:, slice], reduced inside the CTA.
// Each CTA reads its columns of W1 and W2 -- 2 * W * SL floats -- all before waiting for the
// previous kernel (PDL), so a layer is one graph node, no SM reads both whole matrices, and one
// cluster barrier (plus the one that keeps shared memory alive until the last remote read) is all
// the synchronisation between CTAs. Sums run in a fixed order: bit-identical run to run; another
// order than the matmul kernels', so equal to them only to float tolerance.
//
// Threads: t -> column group cg = t % CG (4 columns), row group kg = t / CG; a thread multiplies
// rows kg, kg + KG, ... Partials are summed over the row groups of a warp with shuffles, then over
// the 8 warps through shared memory.
//
// Name expressions instantiate it: block_kernel<BT, CS> (sm_90: clusters of 4 or 8).

#include "rawgraph.cuh"

#define RG_BLOCK_THREADS 256
#define RG_BLOCK_WARPS 8
#define RG_BLOCK_MAXW 256

#ifdef RG_HAS_CLUSTERS
// Column-slice product: out[b][c..c+3] partial over this thread's rows of src (shared, [BT][MAXW]),
// reduced over the CTA into sum[b][col in slice] (shared). Returns after a __syncthreads.
template <int BT, int CS>
__device__ __forceinline__ void rg_block_slice_product(const float (*src)[RG_BLOCK_MAXW], const float4* w,
                                                       float (*part)[BT][RG_BLOCK_MAXW / CS], int W, int kg, int cg)
{
    constexpr int CG = RG_BLOCK_MAXW / CS / 4;
    constexpr int KG = RG_BLOCK_THREADS / CG;
    constexpr int JR = RG_BLOCK_MAXW / KG;
    float acc[BT][4];
#pragma unroll
    for (int b = 0; b < BT; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < JR; ++j) {
        const int k = kg + KG * j;
        if (k < W) {
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                const float s = src[b][k];
                acc[b][0] = fmaf(s, w[j].x, acc[b][0]);
                acc[b][1] = fmaf(s, w[j].y, acc[b][1]);
                acc[b][2] = fmaf(s, w[j].z, acc[b][2]);
                acc[b][3] = fmaf(s, w[j].w, acc[b][3]);
            }
        }
    }
    // Lanes of a warp with the same cg hold other rows of the same columns: fold them, fixed order.
#pragma unroll
    for (int off = CG; off < 32; off <<= 1)
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[b][v] += __shfl_xor_sync(0xffffffffu, acc[b][v], off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane < CG) {
#pragma unroll
        for (int b = 0; b < BT; ++b)
            *reinterpret_cast<float4*>(&part[warp][b][4 * cg]) = make_float4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
    }
    __syncthreads();
}

template <int BT, int CS>
__global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(RG_BLOCK_THREADS)
block_kernel(const float* x, const float* __restrict__ W1, const float* __restrict__ W2, float* y, int B, int W,
             int flags)
{
    x = rg_arg_ptr(x, flags, RG_FLAG_IND_X);  // flags: rawgraph.cuh (only the indirect bits apply)
    y = rg_arg_ptr(y, flags, RG_FLAG_IND_Y);
    static_assert(BT >= 1 && BT <= 4 && (CS == 4 || CS == 8), "shared memory and registers are sized for BT <= 4, CS 4 or 8");
    constexpr int MAXSL = RG_BLOCK_MAXW / CS;  // slice columns at most
    constexpr int CG = MAXSL / 4;              // column groups of 4
    constexpr int KG = RG_BLOCK_THREADS / CG;  // row groups
    constexpr int JR = RG_BLOCK_MAXW / KG;     // rows per thread at most
    static_assert(32 % CG == 0, "a warp holds whole row groups");
    __shared__ __align__(16) float xs[BT][RG_BLOCK_MAXW];   // x rows (the whole width)
    __shared__ __align__(16) float af[BT][RG_BLOCK_MAXW];   // a rows, gathered from the cluster
    __shared__ __align__(16) float as[BT][MAXSL];           // a[:, slice], read by every CTA
    __shared__ __align__(16) float part[RG_BLOCK_WARPS][BT][MAXSL];

    const unsigned rank = rg_cluster_rank();
    const int sl = ((W + CS - 1) / CS + 3) / 4 * 4;
    const int cs0 = (int)rank * sl;                       // this CTA's first column
    const int b0 = blockIdx.y * BT;
    const int nb = min(BT, B - b0);
    const int cg = threadIdx.x % CG, kg = threadIdx.x / CG;
    const int c = cs0 + 4 * cg;
    const bool colok = 4 * cg < sl && c < W;              // W % 4 == 0: whole float4s

    float4 w1[JR], w2[JR];
    rg_allow_dependents();
#pragma unroll
    for (int j = 0; j < JR; ++j) {
        const int k = kg + KG * j;
        const bool ok = colok && k < W;
        const size_t o = (size_t)k * W + c;
        w1[j] = ok ? rg_load_stream4(W1 + o) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        w2[j] = ok ? rg_load_stream4(W2 + o) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    rg_wait_dependencies();

    for (int t = threadIdx.x; t < BT * RG_BLOCK_MAXW; t += RG_BLOCK_THREADS) {
        const int b = t / RG_BLOCK_MAXW, k = t % RG_BLOCK_MAXW;
        xs[b][k] = (b < nb && k < W) ? x[(size_t)(b0 + b) * W + k] : 0.0f;
    }
    __syncthreads();

    rg_block_slice_product<BT, CS>(xs, w1, part, W, kg, cg);
    for (int t = threadIdx.x; t < BT * MAXSL; t += RG_BLOCK_THREADS) {
        const int b = t / MAXSL, n = t % MAXSL;
        float h = part[0][b][n];
#pragma unroll
        for (int q = 1; q < RG_BLOCK_WARPS; ++q) h += part[q][b][n];
        as[b][n] = rg_relu(h);
    }
    rg_cluster_sync();  // every CTA's slice of a is complete

    for (int t = threadIdx.x; t < BT * RG_BLOCK_MAXW; t += RG_BLOCK_THREADS) {
        const int b = t / RG_BLOCK_MAXW, k = t % RG_BLOCK_MAXW;
        const int owner = k / sl;
        af[b][k] = k < W ? rg_dsmem_load(&as[b][k - owner * sl], owner) : 0.0f;
    }
    rg_cluster_arrive();  // done reading the other CTAs' shared memory
    __syncthreads();      // af complete; part free again

    rg_block_slice_product<BT, CS>(af, w2, part, W, kg, cg);
    for (int t = threadIdx.x; t < BT * MAXSL; t += RG_BLOCK_THREADS) {
        const int b = t / MAXSL, n = t % MAXSL;
        if (b < nb && n < sl && cs0 + n < W) {
            float s = part[0][b][n];
#pragma unroll
            for (int q = 1; q < RG_BLOCK_WARPS; ++q) s += part[q][b][n];
            y[(size_t)(b0 + b) * W + cs0 + n] = s + xs[b][cs0 + n];
        }
    }
    rg_cluster_wait();
}
#endif  // RG_HAS_CLUSTERS
