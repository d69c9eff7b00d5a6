// Device graph launch: a kernel that launches an executable graph with the device runtime's
// cudaGraphLaunch (rawgraph/control/device_launch.py).
//
// NVRTC declares the device runtime API only under -rdc; rawgraph compiles without it and links
// nothing, so the function is declared here as cuda_device_runtime_api.h declares it. The
// resulting CUBIN, with cudaGraphLaunch left as an undefined symbol, loads and launches graphs:
// the driver resolves the call itself at module load (driver 580, NVRTC 13.0; the probe
// benchmarks/probes/device_launch.py, variant nonrdc_cubin; see benchmarks/NOTES.md).
//
// The target must be an exec instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH and
// uploaded; a plain exec made the probe's context fail with CUDA_ERROR_ILLEGAL_ADDRESS, which is
// why the Python side only builds this launch for a DeviceGraph. The launching kernel must itself
// run inside a graph launched from the host (or the device).

extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI
cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);

// mode: the special stream handle, cudaStreamGraphTailLaunch (0x0100000000000000),
// cudaStreamGraphFireAndForget (0x02...) or cudaStreamGraphFireAndForgetAsSibling (0x03...); 0
// launches nothing (the baseline of the latency benchmark). rc: where cudaGraphLaunch's
// cudaError_t goes (-1 when nothing was launched); may be null.
extern "C" __global__ void rg_graph_launch(cudaGraphExec_t graph, unsigned long long mode, int* rc)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int r = -1;
        if (mode != 0ull)
            r = (int)cudaGraphLaunch(graph, (cudaStream_t)mode);
        if (rc)
            *rc = r;
    }
}

// Work for the graphs the tests and the benchmark launch: counter[0] += 1 (one thread).
extern "C" __global__ void rg_bump(unsigned* counter)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        counter[0] += 1u;
}

// snap[0] = counter[0]: shows whether a launched graph ran before a later node or stream work.
extern "C" __global__ void rg_snapshot(const unsigned* counter, unsigned* snap)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        snap[0] = counter[0];
}
