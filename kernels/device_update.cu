// Device-updatable kernel nodes (CUDA 12.4+): a kernel inside a graph changes another kernel
// node's grid, a scalar parameter, or its enabled state, for this and later replays of the exec
// (what the driver accepts is probed by benchmarks/probes/device_updatable.py).
//
// How a node becomes updatable (host side, driver API): CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
// (= 13) with CUlaunchAttributeValue.deviceUpdatableKernelNode = {int deviceUpdatable = 1;
// CUgraphDeviceNode devNode /* returned */}, set on an explicit node with
// cuGraphKernelNodeSetAttribute or on a captured cuLaunchKernelEx. The returned devNode (an opaque
// 8-byte handle) is what the kernels below take. Rules from cuda.h (13.0) for such a graph: it may
// be instantiated only once, neither it nor its exec may go through cuGraphExecUpdate, the node
// cannot opt out again, cannot be destroyed (cuGraphDestroyNode) nor have attributes copied; an
// exec whose own kernels update its nodes must be cuGraphUpload-ed before it is launched, and again
// after a host update of an updatable node (cuGraphExecKernelNodeSetParams), which overwrites the
// device-side updates at the next upload or launch.
//
// Declarations. NVRTC declares the device runtime API only under -rdc (without it: `identifier
// "cudaGraphKernelNodeSetEnabled" is undefined`, NVRTC 13.0 and 13.5), but it does know the types
// cudaGraphDeviceNode_t, cudaGraphKernelNodeUpdate and cudaGraphKernelNodeField (driver_types.h is
// built in). So the four entry points are declared here exactly as CUDA 13.0's
// cuda_device_runtime_api.h declares them: inside its `extern "C" { ... }` block, as
// `extern __device__ __cudart_builtin__ cudaError_t CUDARTAPI`. In 13.0 all four are such extern
// builtins (only the templated `cudaGraphKernelNodeSetParam<T>(node, offset, const T&)` is an inline
// wrapper, over the 4-argument form), so the CUBIN compiled without -rdc carries them as undefined
// symbols for the driver to bind at load, as it binds cudaGraphLaunch (device_launch.cu) and
// cudaGraphSetConditional (control.cu). nvcc 13.0 without -rdc leaves the same undefined symbol in
// its CUBIN, and linking libcudadevrt.a (nvJitLink 13.0, -rdc) leaves all four undefined too: no
// library implements them, the driver does. Under -rdc these declarations repeat NVRTC's own.

extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI
cudaGraphKernelNodeSetParam(cudaGraphDeviceNode_t node, size_t offset, const void* value, size_t size);

extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI
cudaGraphKernelNodeSetEnabled(cudaGraphDeviceNode_t node, bool enable);

extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI
cudaGraphKernelNodeSetGridDim(cudaGraphDeviceNode_t node, dim3 gridDim);

extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI
cudaGraphKernelNodeUpdatesApply(const cudaGraphKernelNodeUpdate* updates, size_t updateCount);

// One update, laid out as driver_types.h (13.0) declares struct cudaGraphKernelNodeUpdate:
//   offset  0  cudaGraphDeviceNode_t node
//   offset  8  enum cudaGraphKernelNodeField field   (Invalid 0, GridDim 1, Param 2, Enabled 3)
//   offset 16  union updateData (24 bytes, 8-aligned):
//                dim3 gridDim (12 bytes) | struct {const void* pValue @16; size_t offset @24;
//                size_t size @32} param | unsigned int isEnabled
//   size 40.
// (Offsets checked with nvcc 13.0 and offsetof on the real header.) The header's own type cannot be
// a local variable in C++: `cudaGraphKernelNodeUpdate u[2];` fails in NVRTC 13.0 and 13.5 with "the
// default constructor ... is a deleted function" (its union holds a dim3, which has constructors).
// So this copy uses uint3 for gridDim, as the header itself does before C++11, and is handed to
// cudaGraphKernelNodeUpdatesApply by a pointer cast. The asserts pin size, alignment and field
// values against the built-in type, and the offsets where the compiler has __builtin_offsetof.
struct rg_du_update {
    cudaGraphDeviceNode_t node;
    enum cudaGraphKernelNodeField field;
    union {
        uint3 gridDim;
        struct {
            const void* pValue;
            size_t offset;
            size_t size;
        } param;
        unsigned int isEnabled;
    } updateData;
};
static_assert(sizeof(rg_du_update) == 40 && sizeof(cudaGraphKernelNodeUpdate) == 40, "update size");
static_assert(alignof(rg_du_update) == alignof(cudaGraphKernelNodeUpdate), "update alignment");
// NVRTC 13.0 has no __builtin_offsetof (nor offsetof: no <cstddef>); NVRTC 13.5 has it.
#if defined(__has_builtin)
#if __has_builtin(__builtin_offsetof)
static_assert(__builtin_offsetof(cudaGraphKernelNodeUpdate, field) == 8 &&
              __builtin_offsetof(cudaGraphKernelNodeUpdate, updateData.param.pValue) == 16 &&
              __builtin_offsetof(cudaGraphKernelNodeUpdate, updateData.param.offset) == 24 &&
              __builtin_offsetof(cudaGraphKernelNodeUpdate, updateData.param.size) == 32, "header offsets");
static_assert(__builtin_offsetof(rg_du_update, field) == 8 && __builtin_offsetof(rg_du_update, updateData) == 16 &&
              __builtin_offsetof(rg_du_update, updateData.param.size) == 32, "mirror offsets");
#endif
#endif
static_assert(sizeof(((rg_du_update*)0)->updateData) == 24, "union size");
static_assert((int)cudaGraphKernelNodeFieldGridDim == 1 && (int)cudaGraphKernelNodeFieldParam == 2 &&
              (int)cudaGraphKernelNodeFieldEnabled == 3, "field values");

__device__ __forceinline__ void rg_du_grid(rg_du_update& u, cudaGraphDeviceNode_t node, unsigned int x) {
    u.node = node;
    u.field = cudaGraphKernelNodeFieldGridDim;
    u.updateData.gridDim = make_uint3(x, 1u, 1u);
}
// pValue must stay valid for the call only: the header's own SetParam<T> passes &value of a reference.
__device__ __forceinline__ void rg_du_param(rg_du_update& u, cudaGraphDeviceNode_t node, size_t offset,
                                            const void* value, size_t size) {
    u.node = node;
    u.field = cudaGraphKernelNodeFieldParam;
    u.updateData.param.pValue = value;
    u.updateData.param.offset = offset;
    u.updateData.param.size = size;
}
__device__ __forceinline__ void rg_du_enable(rg_du_update& u, cudaGraphDeviceNode_t node, bool on) {
    u.node = node;
    u.field = cudaGraphKernelNodeFieldEnabled;
    u.updateData.isEnabled = on ? 1u : 0u;
}
__device__ __forceinline__ int rg_du_apply(const rg_du_update* u, int count) {
    return (int)cudaGraphKernelNodeUpdatesApply(reinterpret_cast<const cudaGraphKernelNodeUpdate*>(u), (size_t)count);
}

// PDL: a device update of a node whose edge from the updater is programmatic is visible to that
// node only if the updater fences before the trigger (cuda_device_runtime_api.h). The trigger and
// wait are the PTX of cudaTriggerProgrammaticLaunchCompletion / cudaGridDependencySynchronize
// (inline functions of the same header, not declared without -rdc); both are no-ops without a
// programmatic edge.
// (Guarded like rawgraph.cuh's rg_allow_dependents / rg_wait_dependencies; this file stands alone so
// that the probe can compile it with no include path.)
__device__ __forceinline__ void rg_du_fence_and_trigger() {
    __threadfence();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void rg_du_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// --------------------------------------------------------------------------- the updater (probe)
// One thread. ctl[0] = n, the live row count; ctl[1] = mode:
//   0 direct: cudaGraphKernelNodeSetGridDim, SetParam (n at n_offset), SetEnabled(target), SetEnabled(gated)
//   1 apply:  one cudaGraphKernelNodeUpdatesApply with the same 3 or 4 updates
//   2 apply1: the same updates, one UpdatesApply call each (tells which field a failure belongs to)
// n < 0 makes no update at all (to see what persists from earlier replays). The target's grid
// becomes ceil(n / rows_per_block) blocks, clamped to [1, max_blocks]; the target is disabled when
// n == 0 (a grid of 0 blocks is not a grid); `gated` (may be null) runs only when n >= gate_min.
// rc[0..3]: the cudaError_t of each call (apply: rc[0] only; -1 = not called);
// rc[4] = the grid set, rc[5] = the n set, rc[6] = calls made.
extern "C" __global__ void rg_du_update_rows(cudaGraphDeviceNode_t target, cudaGraphDeviceNode_t gated,
                                             const int* ctl, int rows_per_block, int max_blocks,
                                             unsigned long long n_offset, int gate_min, int* rc)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int n = ctl[0];
    const int mode = ctl[1];
    for (int i = 0; i < 7; ++i) rc[i] = -1;
    if (n >= 0) {
        long long b = ((long long)n + rows_per_block - 1) / rows_per_block;
        const unsigned int blocks = (unsigned int)(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
        const int nv = n;  // the parameter's new bytes (an int, 4 bytes)
        rg_du_update u[4];
        rg_du_grid(u[0], target, blocks);
        rg_du_param(u[1], target, (size_t)n_offset, &nv, sizeof(nv));
        rg_du_enable(u[2], target, n > 0);
        int count = 3;
        if (gated) rg_du_enable(u[count++], gated, n >= gate_min);
        if (mode == 0) {
            rc[0] = (int)cudaGraphKernelNodeSetGridDim(target, dim3(blocks, 1u, 1u));
            rc[1] = (int)cudaGraphKernelNodeSetParam(target, (size_t)n_offset, &nv, sizeof(nv));
            rc[2] = (int)cudaGraphKernelNodeSetEnabled(target, n > 0);
            if (gated) rc[3] = (int)cudaGraphKernelNodeSetEnabled(gated, n >= gate_min);
            rc[6] = count;
        } else if (mode == 1) {
            rc[0] = rg_du_apply(u, count);
            rc[6] = 1;
        } else {
            for (int i = 0; i < count; ++i) rc[i] = rg_du_apply(&u[i], 1);
            rc[6] = count;
        }
        rc[4] = (int)blocks;
        rc[5] = n;
    }
    rg_du_fence_and_trigger();
}

// ----------------------------------------------------------------- the updater (table, for later)
// The head kernel of a device-shaped graph: one thread per entry i of a table in device memory.
// nodes[i]: device node handle; rows_per_block[i] > 0: grid = ceil(n / rows_per_block[i]) clamped
// to [1, max_blocks[i]] (<= 0: grid untouched); n_offsets[i]: byte offset of the node's int row
// count parameter (~0ull: none); the node is enabled iff n > 0. n = *n_live clamped to [0, max_rows].
// One cudaGraphKernelNodeUpdatesApply per entry; rc[i] = its cudaError_t. Launch with at least
// `count` threads in total.
extern "C" __global__ void rg_du_update_table(const unsigned long long* nodes, const int* rows_per_block,
                                              const int* max_blocks, const unsigned long long* n_offsets,
                                              int count, const int* n_live, int max_rows, int* rc)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        int n = *n_live;
        n = n < 0 ? 0 : (n > max_rows ? max_rows : n);
        const cudaGraphDeviceNode_t node = (cudaGraphDeviceNode_t)nodes[i];
        rg_du_update u[3];
        int k = 0;
        if (rows_per_block[i] > 0) {
            long long b = ((long long)n + rows_per_block[i] - 1) / rows_per_block[i];
            b = b < 1 ? 1 : (b > max_blocks[i] ? max_blocks[i] : b);
            rg_du_grid(u[k++], node, (unsigned int)b);
        }
        if (n_offsets[i] != ~0ull) rg_du_param(u[k++], node, (size_t)n_offsets[i], &n, sizeof(n));
        rg_du_enable(u[k++], node, n > 0);
        rc[i] = rg_du_apply(u, k);
    }
    rg_du_fence_and_trigger();
}

// ----------------------------------------------------------------------------------- targets
// y = 2 x + 1 on rows [0, n) of a row-major n x width matrix; block b takes rows
// [b * rows_per_block, (b + 1) * rows_per_block). Records what it ran with: hits[b] += 1 for every
// block that ran, seen[0] = gridDim.x and seen[1] = n (block 0), so the host can tell the grid and
// the parameter the updater set. Waits for a programmatic predecessor before touching memory.
extern "C" __global__ void rg_du_rows(const float* x, float* y, int n, int width, int rows_per_block,
                                      unsigned int* hits, int* seen)
{
    rg_du_wait();
    if (threadIdx.x == 0) {
        atomicAdd(&hits[blockIdx.x], 1u);
        if (blockIdx.x == 0) {
            seen[0] = (int)gridDim.x;
            seen[1] = n;
        }
    }
    const int row0 = blockIdx.x * rows_per_block;
    int rows = n - row0;
    rows = rows < rows_per_block ? rows : rows_per_block;
    if (rows <= 0) return;
    const long long base = (long long)row0 * width;
    const int total = rows * width;
    for (int i = threadIdx.x; i < total; i += blockDim.x) y[base + i] = 2.0f * x[base + i] + 1.0f;
}

// counter[0] += 1 (one thread): the node the updater enables or disables.
extern "C" __global__ void rg_du_mark(unsigned int* counter)
{
    rg_du_wait();
    if (threadIdx.x == 0 && blockIdx.x == 0) counter[0] += 1u;
}

// ------------------------------------------------------------- the head of a device-shaped graph
// rawgraph.serving.DeviceShapedGraph: one entry per kernel node of the model's plans (one plan per
// band), 48 bytes, the layout of device_shaped.py's ENTRY_DTYPE:
//   offset  0  node            the device node handle (cuGraphKernelNodeGetAttribute)
//   offset  8  grid[3]         the grid the node was captured with (at its band's top row count)
//   offset 20  axis            the grid axis along rows (0, 1, 2), or -1: grid untouched
//   offset 24  rows_per_block  rows one block covers along that axis
//   offset 28  param_offset    byte offset of the node's row-count parameter, or -1: none
//   offset 32  param_size      4 (int32) or 8 (int64)
//   offset 36  factor          the parameter's value is n * factor
//   offset 40  lo, hi          the node's band: it runs iff lo <= n <= hi (and n > 0)
//   size 48
struct rg_du_shape_entry {
    unsigned long long node;
    unsigned int grid[3];
    int axis;
    int rows_per_block;
    int param_offset;
    int param_size;
    int factor;
    int lo;
    int hi;
};
static_assert(sizeof(rg_du_shape_entry) == 48, "shape entry size");

// n = *n_live clamped to [0, max_rows]. Per entry (one thread each): a node of the band holding n
// (lo <= n <= hi, n > 0) gets grid[axis] = ceil(n / rows_per_block) clamped to [1, the captured
// grid[axis]], the row-count parameter = n * factor, and is enabled, all in one
// cudaGraphKernelNodeUpdatesApply; a node of any other band is only disabled (one update). rc[i] =
// the call's cudaError_t, rc[count] = the n used (thread 0). Launch with at least `count` threads
// in total. A node that follows through a programmatic edge sees the updates only after the fence.
// (One UpdatesApply per node, from its own thread: one call per block for the whole table is
// slower a replay, measured for 16 nodes: see benchmarks/NOTES.md.)
extern "C" __global__ void rg_du_shape(const rg_du_shape_entry* table, int count, const int* n_live, int max_rows,
                                       int* rc)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    int n = *n_live;
    n = n < 0 ? 0 : (n > max_rows ? max_rows : n);
    if (i == 0) rc[count] = n;
    if (i < count) {
        const rg_du_shape_entry e = table[i];
        const cudaGraphDeviceNode_t node = (cudaGraphDeviceNode_t)e.node;
        rg_du_update u[3];
        int k = 0;
        const bool on = n > 0 && n >= e.lo && n <= e.hi;
        if (on && e.axis >= 0 && e.axis < 3 && e.rows_per_block > 0) {
            unsigned int g[3] = {e.grid[0], e.grid[1], e.grid[2]};
            long long b = ((long long)n + e.rows_per_block - 1) / e.rows_per_block;
            b = b < 1 ? 1 : (b > (long long)g[e.axis] ? (long long)g[e.axis] : b);
            g[e.axis] = (unsigned int)b;
            u[k].node = node;
            u[k].field = cudaGraphKernelNodeFieldGridDim;
            u[k].updateData.gridDim = make_uint3(g[0], g[1], g[2]);
            ++k;
        }
        const long long v64 = (long long)n * e.factor;
        const int v32 = (int)v64;
        if (on && e.param_offset >= 0) {
            if (e.param_size == 8) rg_du_param(u[k++], node, (size_t)e.param_offset, &v64, 8);
            else rg_du_param(u[k++], node, (size_t)e.param_offset, &v32, 4);
        }
        rg_du_enable(u[k++], node, on);
        rc[i] = rg_du_apply(u, k);
    }
    rg_du_fence_and_trigger();
}

// n_live[0] = how many of table[0 .. count) are >= 0 (a slot table: -1 marks a free slot). One
// block; the n that a device-shaped graph's head reads, computed inside the same graph.
extern "C" __global__ void rg_du_count_live(const int* table, int count, int* n_live)
{
    __shared__ int total;
    rg_du_wait();
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    int mine = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) mine += table[i] >= 0 ? 1 : 0;
    if (mine) atomicAdd(&total, mine);
    __syncthreads();
    if (threadIdx.x == 0) n_live[0] = total;
    rg_du_fence_and_trigger();
}
