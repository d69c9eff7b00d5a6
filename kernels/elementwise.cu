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

// Continuous batching: rows addressed through an index table (kernels/../rawgraph/serving/slots.py).
// dst[i, :] = src[idx[i], :] for i < rows (gather a batch from its slots)
extern "C" __global__ void gather_rows(const float* src, const int* idx, float* dst, int rows, int width)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    const long long total = (long long)rows * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(t / width), c = (int)(t % width);
        dst[t] = src[(long long)idx[i] * width + c];
    }
}

// dst[idx[i], :] = src[i, :] for i < rows (scatter a batch's results back into their slots)
extern "C" __global__ void scatter_rows(const float* src, const int* idx, float* dst, int rows, int width)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    const long long total = (long long)rows * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(t / width), c = (int)(t % width);
        dst[(long long)idx[i] * width + c] = src[t];
    }
}
