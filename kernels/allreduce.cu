// One-shot all-reduce over peer-mapped buffers (rawgraph/multi/allreduce.py): every rank reads
// every rank's `n` floats and writes their sum to its own `out`. One kernel, no staging copies:
// the cheapest form for the small messages of a decode step (a few KiB to a few hundred KiB),
// where NCCL's ring/tree latency dominates.
//
// Barrier: each rank's signal buffer (also IPC-mapped) holds, per block b and source rank r,
// a start flag and an end flag. Block b of rank s stores the epoch into start[b][s] of every
// peer (release, system scope: the data this rank's earlier kernels wrote is then visible to
// the peer's acquire), waits until its own start[b][r] == epoch for every r (acquire), sums
// its slice, then does the same with the end flags, so no rank's next replay overwrites its
// data while a peer still reads it. Every rank launches the same grid, so block b of every rank
// covers the same elements and a per-block barrier is enough.
//
// Epoch: a per-block counter in this rank's own signal buffer, read at the start and advanced
// at the end by the block's thread 0. The kernel's arguments never change between replays, so
// the captured node replays as is: flags from replay k (epoch k) never satisfy replay k + 1.
//
// A peer that never arrives (dead, stalled, not replaying) must not hang the GPU for ever: a
// wait longer than `timeout_us` (%globaltimer) writes 1 to `error` and lets the block go on
// (the sum is then wrong and the host reports the error word).

#define RG_AR_MAX_WORLD 8


__device__ __forceinline__ void rg_st_release_sys(unsigned int* p, unsigned int v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int rg_ld_acquire_sys(const unsigned int* p)
{
    unsigned int v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long rg_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// flags: a rank's signal buffer, as unsigned ints: [0, B*W) start flags, [B*W, 2*B*W) end flags,
// [2*B*W, 2*B*W + B) per-block epochs (local only), then one error word. B = max_blocks, W = RG_AR_MAX_WORLD.
__device__ __forceinline__ void rg_ar_barrier(const unsigned long long* peer_signal, int rank, int world,
                                              int max_blocks, int which, unsigned int epoch,
                                              unsigned long long timeout_ns, unsigned int* error)
{
    int t = threadIdx.x;
    size_t slot = (size_t)which * max_blocks * RG_AR_MAX_WORLD + (size_t)blockIdx.x * RG_AR_MAX_WORLD;
    if (t < world) {
        unsigned int* peer = reinterpret_cast<unsigned int*>(peer_signal[t]);
        rg_st_release_sys(peer + slot + rank, epoch);
        const unsigned int* mine = reinterpret_cast<const unsigned int*>(peer_signal[rank]) + slot + t;
        unsigned long long start = rg_now();
        while (rg_ld_acquire_sys(mine) != epoch) {
            if (rg_now() - start > timeout_ns) {
                atomicExch(error, 1u);
                break;
            }
        }
    }
    __syncthreads();
}

extern "C" __global__ void rg_allreduce_oneshot(const unsigned long long* peer_data, const unsigned long long* peer_signal,
                                                float* out, long long n, int rank, int world, int max_blocks,
                                                unsigned int timeout_us)
{
    // Microseconds in 32 bits, not nanoseconds in 64: a 64-bit 10^10 among the parameters reads
    // like a device address to anyone scanning them (the graph doctor did).
    const unsigned long long timeout_ns = 1000ull * timeout_us;
    unsigned int* signal = reinterpret_cast<unsigned int*>(peer_signal[rank]);
    unsigned int* epochs = signal + 2 * (size_t)max_blocks * RG_AR_MAX_WORLD;
    unsigned int* error = epochs + max_blocks;
    __shared__ unsigned int epoch;
    if (threadIdx.x == 0)
        epoch = epochs[blockIdx.x] + 1;
    __syncthreads();
    rg_ar_barrier(peer_signal, rank, world, max_blocks, 0, epoch, timeout_ns, error);

    // float4 where every buffer allows (n % 4 == 0 and 16-byte bases), else scalars.
    long long stride = (long long)gridDim.x * blockDim.x;
    long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    bool vec = (n % 4) == 0 && (reinterpret_cast<unsigned long long>(out) % 16) == 0;
    for (int r = 0; r < world && vec; ++r)
        vec = (peer_data[r] % 16) == 0;
    if (vec) {
        for (long long i = first; i < n / 4; i += stride) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int r = 0; r < world; ++r) {
                // Same order of additions on every rank (rank 0 first): every rank gets the same bits.
                float4 v = reinterpret_cast<const float4*>(peer_data[r])[i];
                acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
            }
            reinterpret_cast<float4*>(out)[i] = acc;
        }
    } else {
        for (long long i = first; i < n; i += stride) {
            float acc = 0.f;
            for (int r = 0; r < world; ++r)
                acc += reinterpret_cast<const float*>(peer_data[r])[i];
            out[i] = acc;
        }
    }
    __syncthreads();
    rg_ar_barrier(peer_signal, rank, world, max_blocks, 1, epoch, timeout_ns, error);
    if (threadIdx.x == 0)
        epochs[blockIdx.x] = epoch;
}
