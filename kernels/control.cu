// Control flow on the device: kernels that set conditional-node conditions, and the small helper
// kernels of the worked examples in rawgraph/conditional.py (device-decided depth, norm early exit).
//
// cudaGraphSetConditional lives in the device runtime. NVRTC declares the device-runtime API only
// with -rdc; without it the call is "identifier undefined". We declare the builtin ourselves, as
// cuda_device_runtime_api.h and cuda.core's tests do: the CUBIN then carries an undefined
// cudaGraphSetConditional that the driver binds at cuModuleLoadData (benchmarks/probes/conditional_nodes.py).
//
// Every condition is set by one thread (thread 0 of block 0): the value is per graph launch, and
// the last write before the conditional node is evaluated wins, so one writer keeps it defined.

extern "C" __device__ __cudart_builtin__ void CUDARTAPI
cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

// cond = *value (IF: nonzero runs body 0; IF/ELSE: 0 runs body 1; SWITCH: body *value if in range;
// WHILE: the first check).
extern "C" __global__ void rg_set_cond(cudaGraphConditionalHandle h, const unsigned int* value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(h, *value);
}

// SWITCH over bands of a row count: n = clamp(value ? *value : n_arg, 0, tops[count - 1]) (read
// from device memory, or the argument the host sets with cuGraphExecKernelNodeSetParams), cond =
// the index of the first band top >= n (tops ascending), or count (no body runs) when n == 0;
// used[0] = n. One thread: count is at most a few hundred, and the head's cost is its launch.
extern "C" __global__ void rg_set_band(cudaGraphConditionalHandle h, const int* value, int n_arg, const int* tops,
                                       int count, int* used) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int n = value ? *value : n_arg;
        const int top = tops[count - 1];
        n = n < 0 ? 0 : (n > top ? top : n);
        int lo = 0, hi = count;  // first index with tops[index] >= n
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (tops[mid] < n) lo = mid + 1;
            else hi = mid;
        }
        used[0] = n;
        cudaGraphSetConditional(h, n == 0 ? (unsigned int)count : (unsigned int)lo);
    }
}

// A WHILE body's last kernel: remaining -= 1 (saturating), cond = remaining > 0.
extern "C" __global__ void rg_countdown(cudaGraphConditionalHandle h, unsigned int* remaining) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned int r = *remaining;
        r = r ? r - 1u : 0u;
        *remaining = r;
        cudaGraphSetConditional(h, r > 0u ? 1u : 0u);
    }
}

// y = x * a + b (x == y allowed): the arithmetic of the branch tests.
extern "C" __global__ void rg_axpb(const float* x, float* y, int n, float a, float b) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] = x[i] * a + b;
    }
}

extern "C" __global__ void rg_noop() {}

// ---------------------------------------------------------------- device-decided depth (WHILE)
// Before the WHILE node: layer counter = 0, cond = min(*depth, max_depth) > 0.
extern "C" __global__ void rg_depth_init(cudaGraphConditionalHandle h, unsigned int* counter,
                                         const unsigned int* depth, int max_depth) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned int d = *depth;
        if (d > (unsigned int)max_depth) d = (unsigned int)max_depth;
        *counter = 0u;
        cudaGraphSetConditional(h, d > 0u ? 1u : 0u);
    }
}

// First kernel of each iteration: copy layer *counter's weights into the fixed buffers the body's
// matmuls read. w1_table / w2_table hold the device addresses of every layer's W1 / W2 (n floats
// each). 16-byte copies when n is a multiple of 4 (cuMemAlloc addresses are 256-byte aligned).
extern "C" __global__ void rg_select_layer(const unsigned long long* w1_table, const unsigned long long* w2_table,
                                           const unsigned int* counter, float* w1, float* w2, int n) {
    const unsigned int layer = *counter;
    const float* s1 = reinterpret_cast<const float*>(w1_table[layer]);
    const float* s2 = reinterpret_cast<const float*>(w2_table[layer]);
    const int stride = gridDim.x * blockDim.x;
    const int start = blockIdx.x * blockDim.x + threadIdx.x;
    if ((n & 3) == 0) {
        const int n4 = n >> 2;
        const float4* a1 = reinterpret_cast<const float4*>(s1);
        const float4* a2 = reinterpret_cast<const float4*>(s2);
        float4* d1 = reinterpret_cast<float4*>(w1);
        float4* d2 = reinterpret_cast<float4*>(w2);
        for (int i = start; i < n4; i += stride) {
            d1[i] = a1[i];
            d2[i] = a2[i];
        }
    } else {
        for (int i = start; i < n; i += stride) {
            w1[i] = s1[i];
            w2[i] = s2[i];
        }
    }
}

// Last kernel of each iteration: cur = nxt (the next layer's input), counter += 1,
// cond = counter < min(*depth, max_depth). Only block 0 touches the counter; the next iteration's
// rg_select_layer runs after this whole kernel, so it sees the new value.
extern "C" __global__ void rg_layer_advance(cudaGraphConditionalHandle h, float* cur, const float* nxt, int n,
                                            unsigned int* counter, const unsigned int* depth, int max_depth) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        cur[i] = nxt[i];
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned int d = *depth;
        if (d > (unsigned int)max_depth) d = (unsigned int)max_depth;
        const unsigned int next = *counter + 1u;
        *counter = next;
        cudaGraphSetConditional(h, next < d ? 1u : 0u);
    }
}

// ------------------------------------------------------------------ norm early exit (IF)
// One block of RG_NORM_THREADS: norm_out[0] = ||x||_2 (float64 sum in a fixed order, so every
// replay gives the same bits), cond = norm >= threshold (run the body: the norm is not small yet).
#define RG_NORM_THREADS 256
extern "C" __global__ void __launch_bounds__(RG_NORM_THREADS)
rg_norm_gate(cudaGraphConditionalHandle h, const float* x, int n, float threshold, float* norm_out) {
    __shared__ double part[RG_NORM_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += RG_NORM_THREADS) {
        const double v = (double)x[i];
        s += v * v;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = RG_NORM_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float norm = (float)sqrt(part[0]);
        norm_out[0] = norm;
        cudaGraphSetConditional(h, norm >= threshold ? 1u : 0u);
    }
}
