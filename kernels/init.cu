// Deterministic weight initialisation on the device: uniform in [-scale, scale) from a
// counter-based hash of (seed, index), so a seed gives the same weights on any GPU and no
// host-side random generation or upload is needed for large widths.

__device__ __forceinline__ unsigned long long rg_splitmix64(unsigned long long z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void fill_uniform(float* __restrict__ y, long long n, unsigned long long seed, float scale)
{
    const unsigned long long s = rg_splitmix64(seed);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        // 24 random bits -> [0, 1) exactly representable in float32, then [-scale, scale).
        const float u = (float)(rg_splitmix64(s ^ (unsigned long long)i) >> 40) * (1.0f / 16777216.0f);
        y[i] = (2.0f * u - 1.0f) * scale;
    }
}
