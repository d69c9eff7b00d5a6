// Elementwise kernels of the unfused block, and an empty kernel for launch-cost floors.
// Grid-stride loops: any n, any grid. PDL as in rawgraph.cuh: nothing is read before the wait.

#include "rawgraph.cuh"

extern "C" __global__ void relu(const float* x, float* y, long long n)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = rg_relu(x[i]);
}

// y = a + b, the residual add (same rounding as the fused matmul_add epilogue: one fp32 add).
extern "C" __global__ void add(const float* a, const float* b, float* y, long long n)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

// The launch-cost floor. It takes part in PDL like the others, so a chain of empty kernels
// launched with the attribute shows the floor of that path too.
extern "C" __global__ void empty()
{
    rg_allow_dependents();
    rg_wait_dependencies();
}

// Busy-wait on the device for `ns` nanoseconds (%globaltimer): a long kernel to queue work
// behind, so tests can change bindings, free memory or rewrite host tables while replays wait.
extern "C" __global__ void spin(unsigned long long ns)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// Add the number of elements whose bits differ between a and b to *count (NaN-safe: bits, not
// values). Lets soak runs check every replay's output on the device, stream-ordered after it.
extern "C" __global__ void count_mismatch(const unsigned* a, const unsigned* b, long long n, unsigned long long* count)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    unsigned long long bad = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        bad += a[i] != b[i];
    if (bad)
        atomicAdd(count, bad);
}
