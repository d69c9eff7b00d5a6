// rawgraph matmul family: y[b, n] = epilogue( sum_k x[b, k] * W[k, n] ), float32, row-major.
//
//   x: B x K    W: K x N    y: B x N    r: B x N (residual, EPI_ADD only)
//
// Tuned for the tiny-to-medium regime (batch 1-64) where reading W dominates:
// - a block owns a tile of TC output columns and BT batch rows; its 8 warps split the K rows
//   between them (split-K inside the block, so every SM gets work even when N is small);
// - inside a warp, LPR = TC / VEC lanes cover one row of the tile with VEC-wide loads (16-byte
//   float4 when VEC == 4) and RPW = 32 / LPR rows are read at once, so each warp load touches whole
//   32-byte sectors;
// - the K loop is unrolled by RG_UNROLL (8) with all W loads issued before any use, so each thread
//   keeps up to 128 bytes of loads in flight;
// - partial sums are reduced with warp shuffles, then across warps through shared memory, in a
//   fixed order: results are bit-identical run to run (no atomics).
// The grid's x dimension walks batch tiles, so blocks reading the same W columns run together and
// share them through L2.
//
// Name expressions instantiate it: matmul_kernel<EPI, VEC, TC, BT>.

#define RG_THREADS 256
#define RG_WARPS (RG_THREADS / 32)
#define RG_UNROLL 8

enum { EPI_NONE = 0, EPI_RELU = 1, EPI_ADD = 2 };

template <int VEC> struct VecT;
template <> struct VecT<1> {
    typedef float type;
    static __device__ __forceinline__ float get(const float& v, int) { return v; }
};
template <> struct VecT<4> {
    typedef float4 type;
    static __device__ __forceinline__ float get(const float4& v, int i) {
        return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
    }
};

// relu that lets NaN through (fmaxf(NaN, 0) would return 0 and hide an unwritten input).
__device__ __forceinline__ float rg_relu(float v) { return v < 0.0f ? 0.0f : v; }

template <int EPI, int VEC, int TC, int BT>
__global__ void __launch_bounds__(RG_THREADS)
matmul_kernel(const float* __restrict__ x, const float* __restrict__ W, float* __restrict__ y,
              const float* __restrict__ r, int B, int K, int N)
{
    typedef typename VecT<VEC>::type vec_t;
    constexpr int LPR = TC / VEC;          // lanes per tile row
    constexpr int RPW = 32 / LPR;          // tile rows per warp step
    constexpr int RPB = RG_WARPS * RPW;    // tile rows per block step
    static_assert(TC % VEC == 0 && 32 % LPR == 0 && LPR >= 1, "bad tile");
    static_assert(BT * TC <= 512, "shared partials are sized for BT * TC <= 512");

    __shared__ float part[RG_WARPS][BT * TC];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int lcol = lane % LPR;
    const int lrow = lane / LPR;
    const int b0 = blockIdx.x * BT;
    const int n0 = blockIdx.y * TC;
    const int col = n0 + lcol * VEC;
    const int nb = min(BT, B - b0);

    float acc[BT][VEC];
#pragma unroll
    for (int b = 0; b < BT; ++b)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[b][v] = 0.0f;

    // VEC == 4 is only chosen when N % 4 == 0, so col < N covers the whole vector.
    if (col < N) {
        const float* xb = x + (size_t)b0 * K;
        int k = warp * RPW + lrow;
        for (; k + (RG_UNROLL - 1) * RPB < K; k += RG_UNROLL * RPB) {
            vec_t w[RG_UNROLL];
#pragma unroll
            for (int u = 0; u < RG_UNROLL; ++u)
                w[u] = __ldg(reinterpret_cast<const vec_t*>(W + (size_t)(k + u * RPB) * N + col));
#pragma unroll
            for (int u = 0; u < RG_UNROLL; ++u) {
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    if (b < nb) {
                        const float xv = __ldg(xb + (size_t)b * K + k + u * RPB);
#pragma unroll
                        for (int v = 0; v < VEC; ++v) acc[b][v] = fmaf(xv, VecT<VEC>::get(w[u], v), acc[b][v]);
                    }
                }
            }
        }
        for (; k < K; k += RPB) {
            const vec_t w = __ldg(reinterpret_cast<const vec_t*>(W + (size_t)k * N + col));
#pragma unroll
            for (int b = 0; b < BT; ++b) {
                if (b < nb) {
                    const float xv = __ldg(xb + (size_t)b * K + k);
#pragma unroll
                    for (int v = 0; v < VEC; ++v) acc[b][v] = fmaf(xv, VecT<VEC>::get(w, v), acc[b][v]);
                }
            }
        }
    }

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

    for (int t = threadIdx.x; t < BT * TC; t += RG_THREADS) {
        const int b = t / TC;
        const int n = n0 + t % TC;
        if (b < nb && n < N) {
            float s = part[0][t];
#pragma unroll
            for (int w = 1; w < RG_WARPS; ++w) s += part[w][t];
            const size_t o = (size_t)(b0 + b) * N + n;
            if (EPI == EPI_RELU) s = rg_relu(s);
            if (EPI == EPI_ADD) s = s + r[o];
            y[o] = s;
        }
    }
}
