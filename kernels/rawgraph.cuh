// Device helpers shared by rawgraph's kernels. kernels.py splices this file into any .cu that
// writes `#include "rawgraph.cuh"`, so the kernel cache key covers its text too.
//
// Programmatic dependent launch (PDL, sm_90): a launch made with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (captured as a programmatic graph edge)
// may start while the kernel before it is still running. Every rawgraph kernel
//   1. lets its own successor start early (rg_allow_dependents), then
//   2. reads only the weights (which nothing in a plan writes) before rg_wait_dependencies,
//   3. reads activations and writes anything only after it.
// rg_wait_dependencies returns once the previous grid has finished and its writes are visible,
// so the order of memory effects is the stream order; only weight loads and launch latency
// overlap the previous kernel. Launched without the attribute, both calls are no-ops.
//
// Clusters (sm_90): CTAs of one cluster read each other's shared memory (DSMEM). rawgraph uses
// them to split a reduction over K across CTAs and sum the partials in a fixed rank order, which
// keeps results bit-identical run to run without atomics or a second kernel.

#ifndef RAWGRAPH_CUH
#define RAWGRAPH_CUH

// relu that lets NaN through (fmaxf(NaN, 0) would return 0 and hide an unwritten input).
__device__ __forceinline__ float rg_relu(float v) { return v < 0.0f ? 0.0f : v; }

// Launch flags (the matmul and block kernels' last argument). RG_FLAG_EARLY: let the successor
// launch at the start. RG_FLAG_IND_X / _Y / _R: that pointer argument is the address of an 8-byte
// slot holding the real pointer (the graph_indirect launch path: the graph refreshes the slots,
// so a new input or output costs the host a store, not a SetParams). The slot is read with
// ld.global.cv (no cached copy) because the host or a memcpy node rewrites it between replays.
#define RG_FLAG_EARLY 1
#define RG_FLAG_IND_X 2
#define RG_FLAG_IND_Y 4
#define RG_FLAG_IND_R 8
// RG_FLAG_ROWS_X / _R / _Y: row m of x, r or y is row rows[m] of that buffer (continuous batching:
// the batch's rows are gathered from, and scattered back to, request slots inside the matmuls).
// rows is the kernels' `rows` argument, an int32 table with one entry per batch row, read after
// rg_wait_dependencies (a memcpy node or copy may have just written it).
#define RG_FLAG_ROWS_X 16
#define RG_FLAG_ROWS_R 32
#define RG_FLAG_ROWS_Y 64

template <typename T>
__device__ __forceinline__ T* rg_arg_ptr(T* p, int flags, int bit)
{
    if (!(flags & bit)) return p;
    return reinterpret_cast<T*>(__ldcv(reinterpret_cast<const unsigned long long*>(p)));
}

__device__ __forceinline__ int rg_row(const int* rows, int flags, int bit, int m)
{
    return (flags & bit) ? rows[m] : m;
}

__device__ __forceinline__ void rg_allow_dependents()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void rg_wait_dependencies()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#if __CUDA_ARCH__ >= 900
#define RG_HAS_CLUSTERS 1

__device__ __forceinline__ unsigned rg_cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// All threads of all CTAs in the cluster; shared-memory writes before it are visible after it.
__device__ __forceinline__ void rg_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Split form: arrive once this CTA's reads of other CTAs' shared memory are done; wait before
// exiting, so no CTA's shared memory goes away while another still reads it.
__device__ __forceinline__ void rg_cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

__device__ __forceinline__ void rg_cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Load a float from the same shared-memory location in CTA `rank` of this cluster.
__device__ __forceinline__ float rg_dsmem_load(const float* local, unsigned rank)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared(local), remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

__device__ __forceinline__ float4 rg_dsmem_load4(const float* local, unsigned rank)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared(local), remote;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
    return v;
}
#endif  // __CUDA_ARCH__ >= 900

// 16-byte global -> shared copy that bypasses L1 (cp.async, sm_80+). src_bytes == 0 writes zeros
// and reads nothing: how tiles past the edge of a matrix are filled.
__device__ __forceinline__ void rg_cp_async16(void* smem, const void* gmem, bool valid)
{
    unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void rg_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void rg_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Weights are read once per launch: keep them out of L1 (ld.global.nc.L1::no_allocate).
__device__ __forceinline__ float4 rg_load_stream4(const float* p)
{
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float rg_load_stream(const float* p)
{
    float v;
    asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

#endif  // RAWGRAPH_CUH
