// Pieces the tiled fp32 GEMMs share (sgemm.cu: FFMA; tf32x3.cu: tensor cores): the 4-wide epilogue
// store, and the reduction of the partial tiles a cluster's CTAs (and a CTA's K slices) leave in
// shared memory. Both kernels inline them; the code each compiles to is theirs unchanged.
#include "rawgraph.cuh"

__device__ __forceinline__ float gt_get(const float4& v, int i)
{
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <int EPI>
__device__ __forceinline__ float gt_epi(float s, const float* r, size_t o)
{
    if (EPI == 1) return rg_relu(s);
    if (EPI == 2) return s + r[o];
    return s;
}

// Four outputs y[my, n .. n + 3] (n < N, N % 4 == 0 so all four exist), epilogue applied.
template <int EPI>
__device__ __forceinline__ void gt_store4(float* y, const float* r, int N, int my, int mr, int n, float4 v, bool vec)
{
    const size_t oy = (size_t)my * N + n;
    const size_t orr = (size_t)mr * N + n;
    if (EPI == 2 && vec) {
        const float4 q = *reinterpret_cast<const float4*>(r + orr);
        v.x += q.x; v.y += q.y; v.z += q.z; v.w += q.w;
    } else if (EPI != 0) {
        v.x = gt_epi<EPI>(v.x, r, orr); v.y = gt_epi<EPI>(v.y, r, orr + 1);
        v.z = gt_epi<EPI>(v.z, r, orr + 2); v.w = gt_epi<EPI>(v.w, r, orr + 3);
    }
    if (vec) {
        *reinterpret_cast<float4*>(y + oy) = v;
    } else {
        y[oy] = v.x; y[oy + 1] = v.y; y[oy + 2] = v.z; y[oy + 3] = v.w;
    }
}

// The partial tiles are in shared memory (slice sl of CTA q at smem + sl * BM * PS, row pitch PS,
// visible cluster-wide): CTA `rank` sums rows [rank * RS, rank * RS + RS) over every CTA and slice
// in a fixed order (same bits run to run) and stores them with the epilogue, then waits at the
// cluster barrier so that no CTA leaves while another still reads its shared memory.
template <int EPI, int BM, int BN, int S, int KS, int PS, int THREADS>
__device__ __forceinline__ void gt_reduce_partials(const float* smem, unsigned rank, int m0, int n0, int M, int N,
                                                   float* y, const float* r, const int* rows, int flags, bool vec)
{
    // CTA `rank` finishes rows [rank * RS, rank * RS + RS) of the tile, 4 columns per item.
    constexpr int RS = (BM + S - 1) / S;
    constexpr int Q4 = BN / 4;
    constexpr int ITEMS = RS * Q4;
    constexpr int PER = (ITEMS + THREADS - 1) / THREADS;
    const int rlo = (int)rank * RS;
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        const int item = (int)threadIdx.x + e * THREADS;
        const int row = rlo + item / Q4, c4 = (item % Q4) * 4;
        const int m = m0 + row, n = n0 + c4;
        if ((ITEMS % THREADS == 0 || item < ITEMS) && row < BM && m < M && n < N) {
            const float* src = smem + row * PS + c4;
            float4 s;
#pragma unroll
            for (int q = 0; q < S; ++q) {
#pragma unroll
                for (int sl = 0; sl < KS; ++sl) {
                    float4 v;
#ifdef RG_HAS_CLUSTERS
                    if (S > 1) v = rg_dsmem_load4(src + sl * BM * PS, (unsigned)q);
                    else v = *reinterpret_cast<const float4*>(src + sl * BM * PS);
#else
                    v = *reinterpret_cast<const float4*>(src + sl * BM * PS);
#endif
                    if (q == 0 && sl == 0) {
                        s = v;
                    } else {
                        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
                    }
                }
            }
            const int my = rg_row(rows, flags, RG_FLAG_ROWS_Y, m);
            const int mr = EPI == 2 ? rg_row(rows, flags, RG_FLAG_ROWS_R, m) : 0;
            gt_store4<EPI>(y, r, N, my, mr, n, s, vec);
        }
    }
#ifdef RG_HAS_CLUSTERS
    if (S > 1) {
        // No CTA leaves (taking its shared memory with it) while another still reads it.
        __syncwarp();  // barrier.cluster is .aligned: the warp reconverged after the items
        rg_cluster_arrive();
        rg_cluster_wait();
    }
#endif
}
