// Graph-safe random numbers: Philox4x32-10 (Salmon et al., SC'11; the generator of cuRAND's
// Philox4_32_10 and of PyTorch's CUDA generator), with its state in device memory.
//
// State: two unsigned long longs in device memory, {seed, offset} (rawgraph/control/rng.py).
//   key     = {lo32(seed), hi32(seed)}
//   counter = the 128-bit little-endian integer offset + skip + b, i.e.
//             {lo32(c), hi32(c), 0, 0} with c = offset + skip + b (64-bit wrap-around)
// where b is the index of a 4-word block inside one draw and `skip` is a launch argument (the
// blocks drawn before this launch by earlier kernels of the same plan). Word j of block b is
// random number 4*b + j of the draw. The offset counts blocks (4 numbers each), not numbers.
//
// Nothing random is baked into a captured kernel node: every kernel reads `offset` from device
// memory when it runs, and philox_advance (the last node of a plan that draws) adds what the plan
// drew. So each replay of a graph draws the next numbers, and graphs sharing one state continue
// each other's sequence in stream order.
//
// PDL as in rawgraph.cuh: nothing is read before rg_wait_dependencies, so these kernels may follow
// a matmul that let them launch early, and the state is read only once the kernel before (which
// may be the previous replay's philox_advance) has finished.

#include "rawgraph.cuh"

#define RG_PHILOX_M0 0xD2511F53u
#define RG_PHILOX_M1 0xCD9E8D57u
#define RG_PHILOX_W0 0x9E3779B9u
#define RG_PHILOX_W1 0xBB67AE85u

struct rg_philox_state {
    unsigned long long seed;
    unsigned long long offset;
};

// One Philox4x32-10 block: 10 rounds, the key bumped by the Weyl constants between rounds.
__device__ __forceinline__ uint4 rg_philox4x32_10(uint4 c, uint2 k)
{
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k.x += RG_PHILOX_W0;
            k.y += RG_PHILOX_W1;
        }
        const unsigned hi0 = __umulhi(RG_PHILOX_M0, c.x), lo0 = RG_PHILOX_M0 * c.x;
        const unsigned hi1 = __umulhi(RG_PHILOX_M1, c.z), lo1 = RG_PHILOX_M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

__device__ __forceinline__ uint4 rg_philox_block(unsigned long long seed, unsigned long long counter)
{
    return rg_philox4x32_10(make_uint4((unsigned)counter, (unsigned)(counter >> 32), 0u, 0u),
                            make_uint2((unsigned)seed, (unsigned)(seed >> 32)));
}

// 24 random bits -> [0, 1), every value exactly representable in float32.
__device__ __forceinline__ float rg_uniform24(unsigned v) { return (float)(v >> 8) * (1.0f / 16777216.0f); }

__device__ __forceinline__ unsigned rg_word(uint4 r, int j) { return j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w; }

// Calls f(i, v) with v = random number i of this draw, for every i < n: one thread per 4-word
// block, grid-stride. Everything is read after rg_wait_dependencies (see the top of this file).
template <typename F>
__device__ __forceinline__ void rg_philox_each(const rg_philox_state* __restrict__ state, unsigned long long skip,
                                               long long n, F f)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    const unsigned long long seed = state->seed, base = state->offset + skip;
    const long long blocks = (n + 3) / 4;
    for (long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x; b < blocks; b += (long long)gridDim.x * blockDim.x) {
        const uint4 r = rg_philox_block(seed, base + (unsigned long long)b);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long i = 4 * b + j;
            if (i < n)
                f(i, rg_word(r, j));
        }
    }
}

// out[i] = random number i of this draw, for i < n: raw uint32 bits (kind 0) or a float32
// uniform in [0, 1) written as its bits (kind 1).
extern "C" __global__ void philox_draw(const rg_philox_state* __restrict__ state, unsigned long long skip,
                                       unsigned* __restrict__ out, long long n, int kind)
{
    rg_philox_each(state, skip, n, [=](long long i, unsigned v) { out[i] = kind == 1 ? __float_as_uint(rg_uniform24(v)) : v; });
}

// Dropout: y[i] = x[i] * scale where (number i >> 8) >= threshold, else 0 (keep probability
// 1 - threshold / 2^24; the host passes threshold = round(p * 2^24) and scale = 1 / (1 - p), so
// the mask is exact integer arithmetic). y may be x (in place: each element is read, then written,
// by the same thread).
extern "C" __global__ void philox_dropout(const rg_philox_state* __restrict__ state, unsigned long long skip,
                                          const float* x, float* y, long long n, unsigned threshold, float scale)
{
    rg_philox_each(state, skip, n, [=](long long i, unsigned v) { y[i] = (v >> 8) >= threshold ? x[i] * scale : 0.0f; });
}

// offset += blocks: the last node of every plan that draws (one thread). It waits for the kernel
// before it, which waited for the one before that, so every draw of this replay has read the old
// offset before it changes.
extern "C" __global__ void philox_advance(rg_philox_state* state, unsigned long long blocks)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    if (threadIdx.x == 0 && blockIdx.x == 0)
        state->offset += blocks;
}
