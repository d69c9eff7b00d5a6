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
