// One whole residual block in one kernel, for narrow widths (W <= 256, W % 4 == 0):
//
//   y = relu(x @ W1) @ W2 + x          x, y: B x W      W1, W2: W x W      (float32, row-major)
//
// A block owns BT batch rows. x rows and the intermediate a = relu(x @ W1) stay in shared memory,
// so a layer is one launch (one graph node) instead of two or four. Each product is cut like
// matmul_kernel's: lanes cover 128 columns with 16-byte loads of W, the 8 warps split the K rows
// (several loads in flight per thread), partials are summed across warps through shared memory in
// a fixed order (deterministic). Widths over 128 take two column passes.
//
// Name expressions instantiate it: block_kernel<BT>.

#define RG_BLOCK_THREADS 256
#define RG_BLOCK_WARPS 8
#define RG_BLOCK_MAXW 256

__device__ __forceinline__ float rg_block_relu(float v) { return v < 0.0f ? 0.0f : v; }

// dst[b][n] = epilogue(sum_k src[b][k] * Wm[k][n]) for n < W, b < nb; src in shared memory.
// RESIDUAL == false: dst is shared memory (stride RG_BLOCK_MAXW), epilogue relu.
// RESIDUAL == true: dst is global y (stride W), epilogue + res[b][n] (shared).
template <int BT, bool RESIDUAL>
__device__ __forceinline__ void rg_block_product(const float (*src)[RG_BLOCK_MAXW], const float* __restrict__ Wm,
                                                 float* dst, const float (*res)[RG_BLOCK_MAXW],
                                                 float (*part)[BT * 128], int W, int nb)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int c0 = 0; c0 < W; c0 += 128) {
        const int col = c0 + lane * 4;
        float acc[BT][4];
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[b][v] = 0.0f;
        if (col < W) {
#pragma unroll 4
            for (int k = warp; k < W; k += RG_BLOCK_WARPS) {
                const float4 w = __ldg(reinterpret_cast<const float4*>(Wm + (size_t)k * W + col));
#pragma unroll
                for (int b = 0; b < BT; ++b) {
                    const float s = src[b][k];
                    acc[b][0] = fmaf(s, w.x, acc[b][0]);
                    acc[b][1] = fmaf(s, w.y, acc[b][1]);
                    acc[b][2] = fmaf(s, w.z, acc[b][2]);
                    acc[b][3] = fmaf(s, w.w, acc[b][3]);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < BT; ++b)
#pragma unroll
            for (int v = 0; v < 4; ++v) part[warp][b * 128 + lane * 4 + v] = acc[b][v];
        __syncthreads();
        for (int t = threadIdx.x; t < BT * 128; t += RG_BLOCK_THREADS) {
            const int b = t / 128;
            const int n = c0 + t % 128;
            if (b < nb && n < W) {
                float s = part[0][t];
#pragma unroll
                for (int w = 1; w < RG_BLOCK_WARPS; ++w) s += part[w][t];
                if (RESIDUAL) dst[(size_t)b * W + n] = s + res[b][n];
                else dst[b * RG_BLOCK_MAXW + n] = rg_block_relu(s);
            }
        }
        __syncthreads();  // part is reused by the next pass; dst is read by the next product
    }
}

template <int BT>
__global__ void __launch_bounds__(RG_BLOCK_THREADS)
block_kernel(const float* __restrict__ x, const float* __restrict__ W1, const float* __restrict__ W2,
             float* __restrict__ y, int B, int W)
{
    static_assert(BT >= 1 && BT <= 4, "shared memory is sized for BT <= 4");
    __shared__ float xs[BT][RG_BLOCK_MAXW];
    __shared__ float as[BT][RG_BLOCK_MAXW];
    __shared__ float part[RG_BLOCK_WARPS][BT * 128];

    const int b0 = blockIdx.x * BT;
    const int nb = min(BT, B - b0);
    for (int t = threadIdx.x; t < BT * RG_BLOCK_MAXW; t += RG_BLOCK_THREADS) {
        const int b = t / RG_BLOCK_MAXW;
        const int k = t % RG_BLOCK_MAXW;
        // Rows past the batch and columns past W are zero, so they add nothing to any sum.
        xs[b][k] = (b < nb && k < W) ? x[(size_t)(b0 + b) * W + k] : 0.0f;
        as[b][k] = 0.0f;
    }
    __syncthreads();
    rg_block_product<BT, false>(xs, W1, &as[0][0], xs, part, W, nb);
    rg_block_product<BT, true>(as, W2, y + (size_t)b0 * W, xs, part, W, nb);
}
