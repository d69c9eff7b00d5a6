// rawgraph tf32x3, wgmma form (sm_90a): y[m, n] = epilogue( sum_k x[m, k] * W[k, n] ) to float32
// accuracy on Hopper's warpgroup tensor-core instructions. Same arguments, flags, PDL protocol,
// arithmetic and results contract as tf32x3.cu (whose header gives the reasons for the 3xTF32
// split, the accumulation runs and the epilogues); this file differs in how the products are issued:
//
//   (x, W, y, r, B = M, K, N, flags, rows)   x: M x K   W: K x N   y, r: M x N
//
// Requirements (checked by the host): K % 4 == 0, N % 4 == 0, x and W 16-byte aligned; compute
// capability 9.0 exactly (wgmma is an sm_90a feature: compiler.py compiles a source that defines
// RG_ARCH_SPECIFIC_SM 90 for sm_90a on such a device; any other target gets a body that traps).
#define RG_ARCH_SPECIFIC_SM 90
//
// The instruction: wgmma.mma_async.sync.aligned.m64nBNk8.f32.tf32.tf32 d, a, b-desc, scale-d, 1, 1.
// A warpgroup (4 warps, 128 threads) multiplies a 64 x 8 A held in registers by an 8 x BN B read
// from shared memory through a matrix descriptor, into BN / 2 fp32 accumulators a thread. For tf32
// both operands must be K-major (no transpose), which decides the layouts below.
//
// * A from registers (PTX ISA "register fragment" of wgmma .tf32, CUTLASS's ALayout_64x8): warp w
//   of the warpgroup holds rows 16w .. 16w + 15; lane 4g + t holds a0 (g, t), a1 (g + 8, t),
//   a2 (g, t + 4), a3 (g + 8, t + 4): mma.sync m16n8k8's A layout, so tf32x3.cu's ldmatrix.x4 of an
//   x tile at row stride BK + 4 floats gives it (conflict-free), and the split happens in registers.
// * D (CLayout_64xN): register i of lane 4g + t of warp w is row 16w + g + 8 ((i >> 1) & 1),
//   column 8 (i >> 2) + 2t + (i & 1).
// * B from shared memory, K-major, no swizzle (descriptor layout type 0): the canonical layout is
//   core matrices of 8 rows (n) x 16 bytes (4 k), each 128 contiguous bytes (row r at 16r); the
//   descriptor's leading byte offset (LBO) is the distance between the two core matrices along k
//   of a k8 step, the stride byte offset (SBO) that between successive groups of 8 rows. Here a
//   split tile of BN rows x BK k stores element (c, k) at byte 16 c + 4 (k % 4) + (k / 4) LBO,
//   LBO = 16 BN, SBO = 128: the descriptor of k8 step j starts at 2j LBO.
// * W is stored [K][N] (N-major for B) and tf32 wgmma cannot transpose, so B is transposed on the
//   way through registers: W stages land in shared memory as fp32 by cp.async, exactly as in
//   tf32x3.cu (W crosses DRAM, L2 and shared memory once, as fp32), and a split pass reads 4 k of
//   one column (4 conflict-free 4-byte loads: a warp reads 32 different columns of one row) and
//   writes big = tf32(v) and small = tf32(v - big) as two 16-byte stores into two K-major tiles
//   (32 consecutive rows of one k group: conflict-free). The split must be in shared memory
//   because wgmma reads B only from there; splitting W ahead of time would double its bytes.
// * Column order: B row c of a 32-column group holds W column perm(c), c = 8a + 2b + e ->
//   8b + 2a + e (an involution), so a lane's accumulators of the group's four n8 pieces are
//   8 consecutive output columns (8t .. 8t + 7) of rows g and g + 8: two 16-byte stores a row,
//   the epilogue of gemm_tile.cuh. Hence BN % 32 == 0.
//
// Arithmetic (tf32x3.cu's FLUSH > 0 form, the same products in the same order per output):
// a run accumulator `run` (BN / 2 registers) restarted from zero every FLUSH k8 steps (scale-d = 0
// on the first wgmma of a run), per k8 step small(A) * big(B), big(A) * small(B), big(A) * big(B)
// in that order, and at the end of a run `acc += run` in fp32 (FADD, round to nearest) after
// wgmma.wait_group 0. No wgmma is in flight across the end of a run, and every stage ends a run
// ((BK / 8) % FLUSH == 0): the only asynchrony is inside a run. Deterministic: fixed order, no
// atomics; the K parts of a cluster split summed in rank order (gt_reduce_partials).
//
// CTA: WG = BM / 64 warpgroups (BM 64 or 128), each computing 64 rows x BN; all share one split B.
// Registers a thread: acc and run, BN / 2 each (128 at BN = 128), 8 for a k8 step's split A.
//
// RUNS = 2, two accumulation runs in flight (the pipeline below is RUNS = 1's): runs alternate
// between two run accumulators, and run q + 1's first k8 step is issued (into the other one)
// before run q is waited for: after that step's commit and its split work, wgmma.wait_group 1
// completes every group but the newest (all of run q) and run q is added into acc while run
// q + 1's wgmma's run. The last run is waited for (wait_group 0) and added after the loop; the
// first addition adds the zeroed second accumulator (0 + 0), so acc receives the same runs in the
// same order as RUNS = 1: the same bits. A run is in flight across a stage's end, so a stage's
// split B may still be read by the other warpgroup's wgmma's during the next iteration: three
// split-B buffers, stage st in SB[st % 3]; at iteration st's barrier every warpgroup has waited
// (wait_group 1 at stage st - 1's first step) for all of stage st - 2, so SB[(st + 1) % 3], the one
// iteration st splits into, is free. Which accumulator a run uses is known at compile time (a
// stage has an even number of runs: run2 holds each stage's last). ptxas keeps these wgmma's
// asynchronous only for runs of FLUSH >= 2 k8 steps (with FLUSH = 1, or an odd number of runs a
// stage, it reports C7514 and serializes them), so RUNS = 2 requires FLUSH >= 2 and (BK / 8) /
// FLUSH even, and S == 1 (in the cluster-split kernels ptxas reports C7514 / C7517, serialized
// wgmma's or injected waits). Registers: a third BN / 2 set; the host allows RUNS = 2 only where it
// compiles without spills.
//
// Pipeline, one __syncthreads a stage (`st` runs over this CTA's stages of BK k):
// * cp.async ring of STAGES >= 3 raw stages (x tile [m][k] at row stride BK + 4, W tile [k][n] at
//   row stride BN). Two split-B buffers SB[0], SB[1] (big and small each).
// * Iteration st: wait until raw stage st + 1 has landed (cp.async.wait_group STAGES - 3), make
//   this thread's split writes to SB[st % 2] visible to the async proxy wgmma reads through
//   (fence.proxy.async.shared::cta), __syncthreads. After it: SB[st % 2] holds stage st whole;
//   raw stage st + 1 is in shared memory; every wgmma of stage st - 1 has completed (each
//   warpgroup waited at its last run's end), so SB[(st + 1) % 2] is free; no thread still reads
//   raw buffer (st - 1) % STAGES (x of stage st - 1 was read in iteration st - 1, its W in
//   iteration st - 2). Then: cp.async of stage st + STAGES - 1 into that buffer; for each k8 step
//   j: ldmatrix + split of A, wgmma.fence, the three wgmma's, commit; the split of k group
//   2j, 2j + 1 of stage st + 1 into SB[(st + 1) % 2] (overlapping the wgmma's in flight); at a
//   run's end wait_group 0 and acc += run.
// * Prologue: the first STAGES - 1 stages issued (W before griddepcontrol.wait, x after, as
//   tf32x3.cu), stage 0 split into SB[0] after its wait and a __syncthreads.
//
// K split over a cluster of S CTAs (rank r takes K rows [r kc, (r + 1) kc), kc a multiple of BK),
// partial tiles in shared memory and gt_reduce_partials, as tf32x3.cu with KS = 1. PDL, flags,
// row tables, EPI (0 none, 1 relu, 2 add): as tf32x3.cu.
//
// Shared memory (dynamic, floats): tf32x3_wgmma_smem_floats<BM, BN, BK, STAGES, S, RUNS>()
//   = max(2 (RUNS + 1) BN BK + STAGES (BM (BK + 4) + BK BN), S > 1 ? BM (BN + 4) : 0)
// (SB[0] big, SB[0] small, SB[1] big, SB[1] small (, SB[2] big, SB[2] small) at the start, then
// the raw stages); rawgraph.ops.tf32x3_wgmma_smem_bytes computes the same (x 4).
//
// Launch: grid (ceil(N / BN), S, ceil(M / BM)), block 128 * BM / 64 threads. Name expressions
// (RUNS, default 1, is left out when 1):
//   tf32x3_wgmma_kernel<EPI, BM, BN, BK, STAGES, MINB, FLUSH[, RUNS]>           (S == 1, no cluster)
//   tf32x3_wgmma_split_kernel<EPI, BM, BN, BK, STAGES, S, MINB, FLUSH[, RUNS]>  (2 <= S <= 8, clusters of (1, S, 1))
//
// RG_HOST_EMULATION (never set by NVRTC) swaps the inline-asm helpers for host versions
// (benchmarks/probes/wgmma_emulate.py: wgmma as a warpgroup-wide exchange that decodes the
// descriptor by the PTX ISA's canonical layout), which checks this file's index arithmetic,
// layouts, descriptors and pipeline order on the CPU.

#include "rawgraph.cuh"
#include "gemm_tile.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(RG_HOST_EMULATION)
#define RG_WGMMA 1
#endif

#ifndef RG_HOST_EMULATION
// fp32 -> tf32, round to nearest, ties away from zero (tf32x3.cu's tx_tf32).
__device__ __forceinline__ unsigned wx_tf32(float v)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// tf32x3.cu's tx_ldmatrix4: lane 4g + t receives float t of row g of matrix i (rows given by
// lanes 8i .. 8i + 7) in r[i].
__device__ __forceinline__ void wx_ldmatrix4(unsigned (&r)[4], const float* row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// The shared-window byte address of p (what a matrix descriptor's start address encodes).
__device__ __forceinline__ unsigned wx_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

#ifdef RG_WGMMA
// Order this thread's earlier register accesses before the warpgroup's next wgmma's (required
// whenever a wgmma's A or accumulator registers were written or read by other instructions).
__device__ __forceinline__ void wx_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wx_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wx_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Every committed group but the newest complete (RUNS = 2: the previous run).
__device__ __forceinline__ void wx_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// Generic-proxy writes to shared memory (the split pass) before async-proxy reads (wgmma).
__device__ __forceinline__ void wx_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Pin a register's value at this point: the compiler may not move reads of an accumulator above
// the wait_group that completes it (nor its writes below a later wgmma).
__device__ __forceinline__ void wx_pin(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// d (+)= A (64 x 8, registers) * B (8 x N, descriptor); accumulate == 0: d = A * B.
template <int N>
struct WgMma;

template <>
struct WgMma<32> {
    static __device__ __forceinline__ void run(float (&d)[16], const unsigned (&a)[4], unsigned long long desc,
                                               int accumulate)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                     "}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
    }
};

template <>
struct WgMma<64> {
    static __device__ __forceinline__ void run(float (&d)[32], const unsigned (&a)[4], unsigned long long desc,
                                               int accumulate)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                     "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                       "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
    }
};

template <>
struct WgMma<96> {
    static __device__ __forceinline__ void run(float (&d)[48], const unsigned (&a)[4], unsigned long long desc,
                                               int accumulate)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
                     "}, {%48, %49, %50, %51}, %52, p, 1, 1;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                       "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                       "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                       "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
    }
};

template <>
struct WgMma<128> {
    static __device__ __forceinline__ void run(float (&d)[64], const unsigned (&a)[4], unsigned long long desc,
                                               int accumulate)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                     "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                       "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                       "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                       "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                       "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
    }
};

#endif  // RG_WGMMA
#endif  // RG_HOST_EMULATION

// v = big + small (to 2^-22 |v|), each an exact tf32 value (the low 13 bits zero): tf32x3.cu's split.
// The mask matters here: small is stored to shared memory and read back by the tensor core.
__device__ __forceinline__ void wx_split(float v, unsigned& big, unsigned& small)
{
    big = wx_tf32(v);
    small = (__float_as_uint(v - __uint_as_float(big)) + 0x1000u) & 0xffffe000u;
}

// Matrix descriptor of a K-major, unswizzled operand tile at shared byte address `addr`: start
// address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset (49-51) 0, layout
// type (62-63) 0 = no swizzle.
__device__ __forceinline__ unsigned long long wx_desc(unsigned addr, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((addr >> 4) & 0x3fffu) | ((unsigned long long)((lbo >> 4) & 0x3fffu) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3fffu) << 32);
}

// B row c of a 32-column group holds W column wx_perm(c): c = 32h + 8a + 2b + e -> 32h + 8b + 2a + e
// (an involution; see the header).
__host__ __device__ constexpr int wx_perm(int c) { return (c & ~31) | ((c & 6) << 2) | ((c >> 2) & 6) | (c & 1); }

template <int BM, int BN, int BK, int STAGES, int S, int FLUSH, int RUNS = 1>
struct WgCfg {
    static constexpr int WG = BM / 64;                 // warpgroups, 64 rows each
    static constexpr int THREADS = 128 * WG;
    static constexpr int XS = BK + 4;                  // raw x tile row stride (floats): the ldmatrix rule
    static constexpr int WS = BN;                      // raw W tile row stride
    static constexpr int XTILE = BM * XS;
    static constexpr int STAGE = XTILE + BK * WS;      // floats per raw stage
    static constexpr int SPLIT = BN * BK;              // one split B tile (big or small)
    static constexpr int NSB = RUNS + 1;               // split-B buffers (big and small each)
    static constexpr int SBUF = 2 * NSB * SPLIT;       // SB[0] big, SB[0] small, SB[1] big, ...
    static constexpr int RPS = BK / 8 / FLUSH;         // accumulation runs a stage
    static constexpr int PS = BN + 4;                  // partial tile row stride
    static constexpr int PIPE = SBUF + STAGES * STAGE;
    static constexpr int PART = S > 1 ? BM * PS : 0;
    static constexpr int SMEM_FLOATS = PIPE > PART ? PIPE : PART;
    static constexpr int XCH = BM * BK / 4;            // 16-byte pieces of an x tile
    static constexpr int WCH = BK * BN / 4;            // 16-byte pieces of a W tile
    static constexpr int XPT = (XCH + THREADS - 1) / THREADS;
    static constexpr int WPT = (WCH + THREADS - 1) / THREADS;
    static constexpr int ITEMS = 2 * BN;               // split items of one k8 step: 2 k groups x BN rows
    static constexpr int IPT = (ITEMS + THREADS - 1) / THREADS;
    static constexpr unsigned LBO = 16u * BN;          // bytes between the k groups of a split tile
    static constexpr unsigned SBO = 128u;              // bytes between its groups of 8 rows
    static_assert(BM == 64 || BM == 128, "one or two warpgroups of 64 rows");
    static_assert(BN % 32 == 0 && BN >= 32 && BN <= 128, "whole 32-column groups; acc + run = BN registers");
    static_assert(BK % 8 == 0 && BK >= 8 && BK <= 64, "whole k8 steps");
    static_assert(FLUSH >= 1 && (BK / 8) % FLUSH == 0, "every stage ends an accumulation run");
    static_assert(STAGES >= 3, "a stage computes while the next is split and a third loads");
    static_assert(S >= 1 && S <= 8, "portable cluster size");
    static_assert(RUNS == 1 || RUNS == 2, "one or two accumulation runs in flight");
    static_assert(RUNS == 1 || BN <= 96, "RUNS = 2: acc and two run sets, 3 BN / 2 registers (the host's rule)");
    static_assert(RUNS == 1 || (FLUSH >= 2 && RPS % 2 == 0),
                  "RUNS = 2: runs of 2 or more k8 steps, an even number a stage (else ptxas serializes the wgmma's)");
    static_assert(RUNS == 1 || S == 1, "RUNS = 2: no cluster split (ptxas serializes the split kernels' wgmma's)");
};

template <int BM, int BN, int BK, int STAGES, int S, int RUNS = 1>
__host__ __device__ constexpr int tf32x3_wgmma_smem_floats()
{
    // WgCfg's SMEM_FLOATS, written out (WgCfg also checks FLUSH, which the size does not depend on)
    constexpr int pipe = 2 * (RUNS + 1) * BN * BK + STAGES * (BM * (BK + 4) + BK * BN);
    constexpr int part = S > 1 ? BM * (BN + 4) : 0;
    return pipe > part ? pipe : part;
}

#ifdef RG_WGMMA
template <int EPI, int BM, int BN, int BK, int STAGES, int S, int FLUSH, int RUNS>
__device__ __forceinline__ void tf32x3_wgmma_body(const float* x, const float* __restrict__ W, float* y,
                                                  const float* r, int M, int K, int N, int early, const int* rows,
                                                  int flags)
{
    typedef WgCfg<BM, BN, BK, STAGES, S, FLUSH, RUNS> C;
    constexpr int T = C::THREADS, XS = C::XS, WS = C::WS, NR = BN / 2;
    extern __shared__ __align__(16) float smem[];

    const int tid = (int)threadIdx.x;
    const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = (int)blockIdx.x * BN;
    const int m0 = (int)blockIdx.z * BM;
    unsigned rank = 0;
#ifdef RG_HAS_CLUSTERS
    if (S > 1) rank = rg_cluster_rank();
#endif
    // K in S parts of whole stages; this CTA's part is its cluster rank's.
    const int kc = ((K + S - 1) / S + BK - 1) / BK * BK;
    const int kb = min(K, (int)rank * kc);
    const int ke = min(K, kb + kc);
    const int nst = (ke - kb + BK - 1) / BK;
    float* const raw = smem + C::SBUF;  // raw stage s: x tile at raw + s * STAGE, W tile after it

    // W: piece c = tid + i * T is row c / (BN / 4), columns 4 * (c % (BN / 4)) of a W tile.
    const float* wsrc[C::WPT];
    int wrow[C::WPT], wdst[C::WPT];
    bool wok[C::WPT];
#pragma unroll
    for (int i = 0; i < C::WPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BN / 4), col = (c % (BN / 4)) * 4;
        wrow[i] = row;
        wdst[i] = row * WS + col;
        wok[i] = (C::WCH % T == 0 || c < C::WCH) && n0 + col < N;
        wsrc[i] = W + (size_t)(kb + row) * N + n0 + col;  // only dereferenced when in range
    }
    int kw = kb;  // first K row of the next W stage to load
    auto load_w = [&](int buf) {
        float* ws = raw + buf * C::STAGE + C::XTILE;
#pragma unroll
        for (int i = 0; i < C::WPT; ++i) {
            const int c = tid + i * T;
            if (C::WCH % T == 0 || c < C::WCH) {
                const bool ok = wok[i] && kw + wrow[i] < ke;
                rg_cp_async16(ws + wdst[i], ok ? wsrc[i] : W, ok);
                wsrc[i] += (size_t)BK * N;
            }
        }
        kw += BK;
    };
    // x: piece c = tid + i * T is row c / (BK / 4), k offset 4 * (c % (BK / 4)) of an x tile; the
    // row's source is set after rg_wait_dependencies (the row table may have just been written).
    const float* xsrc[C::XPT];
    int xdst[C::XPT], xkq[C::XPT];
    bool xok[C::XPT];
#pragma unroll
    for (int i = 0; i < C::XPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BK / 4), kq = (c % (BK / 4)) * 4;
        xsrc[i] = x;
        xok[i] = false;
        xdst[i] = row * XS + kq;
        xkq[i] = kq;
    }
    int kx = kb;  // first K row of the next x stage to load
    auto load_x = [&](int buf) {
        float* xs = raw + buf * C::STAGE;
#pragma unroll
        for (int i = 0; i < C::XPT; ++i) {
            const int c = tid + i * T;
            if (C::XCH % T == 0 || c < C::XCH) {
                const bool ok = xok[i] && kx + xkq[i] < ke;
                rg_cp_async16(xs + xdst[i], ok ? xsrc[i] : x, ok);
                xsrc[i] += BK;
            }
        }
        kx += BK;
    };

    if (early) rg_allow_dependents();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st)
        if (st < nst) load_w(st);
    rg_wait_dependencies();
#pragma unroll
    for (int i = 0; i < C::XPT; ++i) {
        const int c = tid + i * T;
        const int row = c / (BK / 4);
        if ((C::XCH % T == 0 || c < C::XCH) && m0 + row < M) {
            xok[i] = true;
            xsrc[i] = x + (size_t)rg_row(rows, flags, RG_FLAG_ROWS_X, m0 + row) * K + kb + xkq[i];
        }
    }
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < nst) load_x(st);
        rg_cp_async_commit();  // group st (group 0 also holds every W stage issued before the wait)
    }

    // The split of k8 step j's two k groups (2j, 2j + 1) of the raw W stage in buffer `rb` into
    // split buffer `sb`: item it = tid + i * T is k group 2j + it / BN, B row c = it % BN, which
    // reads W column wx_perm(c) at the group's 4 k (a warp: 32 columns of one row, 32 banks) and
    // writes 16 bytes of big and of small at row c (a warp: 512 contiguous bytes).
    auto split_b = [&](int rb, int sb, int j) {
        const float* ws = raw + rb * C::STAGE + C::XTILE;
        float* const big = smem + sb * 2 * C::SPLIT;
#pragma unroll
        for (int i = 0; i < C::IPT; ++i) {
            const int it = tid + i * T;
            if (C::ITEMS % T == 0 || it < C::ITEMS) {
                const int kg = 2 * j + it / BN, c = it % BN;
                const float* src = ws + 4 * kg * WS + wx_perm(c);
                unsigned b[4], s[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) wx_split(src[q * WS], b[q], s[q]);
                const int o = kg * 4 * BN + 4 * c;
                *reinterpret_cast<float4*>(big + o) =
                    make_float4(__uint_as_float(b[0]), __uint_as_float(b[1]), __uint_as_float(b[2]), __uint_as_float(b[3]));
                *reinterpret_cast<float4*>(big + C::SPLIT + o) =
                    make_float4(__uint_as_float(s[0]), __uint_as_float(s[1]), __uint_as_float(s[2]), __uint_as_float(s[3]));
            }
        }
    };

    // acc: fp32 sums (FADD); run: the tensor-core run, restarted every FLUSH k8 steps. D layout:
    // register 4j + q is row 16 warp + g + 8 (q >> 1), B row 8j + 2t + (q & 1) of this warpgroup.
    float acc[NR], run[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
        acc[i] = 0.0f;
        run[i] = 0.0f;
    }

    // ldmatrix row address of this lane: matrix lane / 8 = (rows + 8 (lane / 8 odd), k + 4 (lane >= 16))
    // of the warp's 16 rows; in raw stage 0, at k 0.
    const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8, lk = (lane >> 4) * 4;
    const float* const xlane = raw + (64 * wg + 16 * warp + lrow) * XS + lk;
    const unsigned sb_addr = wx_smem_addr(smem);

    if (nst > 0) {  // stage 0 into SB[0]; made visible at the loop's first barrier
        rg_cp_async_wait<STAGES - 2>();
        __syncthreads();
#pragma unroll
        for (int j = 0; j < BK / 8; ++j) split_b(0, 0, j);
    }
    int buf = 0;            // raw buffer of stage st
    int nbuf = STAGES - 1;  // raw buffer of stage st + STAGES - 1 (the one stage st - 1 left)
    if constexpr (RUNS == 1) {
        for (int st = 0; st < nst; ++st) {
            rg_cp_async_wait<STAGES - 3>();  // stage st + 1 landed (this thread's pieces)
            wx_fence_proxy_async();           // this thread's split writes, visible to wgmma
            __syncthreads();                  // the invariants of the header hold from here
            if (st + STAGES - 1 < nst) {
                load_w(nbuf);
                load_x(nbuf);
            }
            rg_cp_async_commit();
            const int sb = st & 1;
            const int buf1 = (buf + 1 == STAGES) ? 0 : buf + 1;  // raw buffer of stage st + 1
            const bool next = st + 1 < nst;                      // uniform over the CTA
            const float* const xs = xlane + buf * C::STAGE;
            const unsigned big_addr = sb_addr + (unsigned)(sb * 2 * C::SPLIT) * 4u;
            const unsigned small_addr = big_addr + (unsigned)C::SPLIT * 4u;
    #pragma unroll
            for (int j = 0; j < BK / 8; ++j) {
                unsigned a[4], ab[4], as[4];
                wx_ldmatrix4(a, xs + 8 * j);
    #pragma unroll
                for (int q = 0; q < 4; ++q) wx_split(__uint_as_float(a[q]), ab[q], as[q]);
                const unsigned off = 2u * (unsigned)j * C::LBO;
                const unsigned long long dbig = wx_desc(big_addr + off, C::LBO, C::SBO);
                const unsigned long long dsmall = wx_desc(small_addr + off, C::LBO, C::SBO);
    #pragma unroll
                for (int i = 0; i < NR; ++i) wx_pin(run[i]);
                wx_fence();
                WgMma<BN>::run(run, as, dbig, j % FLUSH != 0);  // a run's first wgmma starts from zero
                WgMma<BN>::run(run, ab, dsmall, 1);
                WgMma<BN>::run(run, ab, dbig, 1);
                wx_commit();
                if (next) split_b(buf1, sb ^ 1, j);  // while the wgmma's run
                if (j % FLUSH == FLUSH - 1) {        // end of a run: into the fp32 sums
                    wx_wait0();
    #pragma unroll
                    for (int i = 0; i < NR; ++i) {
                        wx_pin(run[i]);
                        acc[i] += run[i];
                    }
                }
            }
            buf = buf1;
            nbuf = (nbuf + 1 == STAGES) ? 0 : nbuf + 1;
        }
    } else {
        // RUNS = 2 (see the header): run q in run when q is even, in run2 when odd; stage st's
        // split B in SB[sbc], sbc = st % 3.
        float run2[NR];
#pragma unroll
        for (int i = 0; i < NR; ++i) run2[i] = 0.0f;
        int sbc = 0;
        for (int st = 0; st < nst; ++st) {
            rg_cp_async_wait<STAGES - 3>();  // stage st + 1 landed (this thread's pieces)
            wx_fence_proxy_async();           // this thread's split writes, visible to wgmma
            __syncthreads();                  // from here every wgmma of stage st - 2 has completed
            if (st + STAGES - 1 < nst) {
                load_w(nbuf);
                load_x(nbuf);
            }
            rg_cp_async_commit();
            const int sbn = (sbc + 1 == C::NSB) ? 0 : sbc + 1;   // split buffer of stage st + 1
            const int buf1 = (buf + 1 == STAGES) ? 0 : buf + 1;  // raw buffer of stage st + 1
            const bool next = st + 1 < nst;                      // uniform over the CTA
            const float* const xs = xlane + buf * C::STAGE;
            const unsigned big_addr = sb_addr + (unsigned)(sbc * 2 * C::SPLIT) * 4u;
            const unsigned small_addr = big_addr + (unsigned)C::SPLIT * 4u;
            // k8 step j of the stage: cur is this step's run, prev the run before it (complete
            // after wait_group 1). Each call names run and run2 directly, and the loop is unrolled,
            // so j is a constant and each array stays in registers (no generic lambda: NVRTC 13.0
            // takes one for a host function).
            auto k8 = [&](int j, float (&cur)[NR], float (&prev)[NR]) {
                unsigned a[4], ab[4], as[4];
                wx_ldmatrix4(a, xs + 8 * j);
#pragma unroll
                for (int q = 0; q < 4; ++q) wx_split(__uint_as_float(a[q]), ab[q], as[q]);
                const unsigned off = 2u * (unsigned)j * C::LBO;
                const unsigned long long dbig = wx_desc(big_addr + off, C::LBO, C::SBO);
                const unsigned long long dsmall = wx_desc(small_addr + off, C::LBO, C::SBO);
#pragma unroll
                for (int i = 0; i < NR; ++i) wx_pin(cur[i]);
                wx_fence();
                WgMma<BN>::run(cur, as, dbig, j % FLUSH != 0);  // a run's first wgmma starts from zero
                WgMma<BN>::run(cur, ab, dsmall, 1);
                WgMma<BN>::run(cur, ab, dbig, 1);
                wx_commit();
                if (next) split_b(buf1, sbn, j);  // while the wgmma's run
                if (j % FLUSH == 0) {             // a run's first step: the previous run into the sums
                    wx_wait1();
#pragma unroll
                    for (int i = 0; i < NR; ++i) {
                        wx_pin(prev[i]);
                        acc[i] += prev[i];
                    }
                }
            };
            // A stage holds an even number of runs, so its first run is always in run.
#pragma unroll
            for (int j = 0; j < BK / 8; ++j) {
                if (((j / FLUSH) & 1) == 0) k8(j, run, run2);
                else k8(j, run2, run);
            }
            buf = buf1;
            nbuf = (nbuf + 1 == STAGES) ? 0 : nbuf + 1;
            sbc = sbn;
        }
        // The last run (a stage's last run is odd: run2; none when nst == 0, and run2 is still zero).
        wx_wait0();
#pragma unroll
        for (int i = 0; i < NR; ++i) {
            wx_pin(run2[i]);
            acc[i] += run2[i];
        }
    }
    rg_cp_async_wait<0>();
    if (!early) rg_allow_dependents();  // the successor's prologue overlaps only our epilogue

    // This thread's outputs: rows 64 wg + 16 warp + g + 8 rr, columns 32h + 8t + 4u .. + 3 of each
    // 32-column group h: n8 pieces 4h + 2u and 4h + 2u + 1, registers 2rr and 2rr + 1 of each.
    auto out4 = [&](int h, int u, int rr) {
        const int i0 = 4 * (4 * h + 2 * u) + 2 * rr;
        return make_float4(acc[i0], acc[i0 + 1], acc[i0 + 4], acc[i0 + 5]);
    };
    const int mrow = 64 * wg + 16 * warp + g;  // the thread's first row in the tile
    const bool vec = ((reinterpret_cast<size_t>(y) | (EPI == 2 ? reinterpret_cast<size_t>(r) : 0)) & 15) == 0;
    if constexpr (S == 1) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int m = m0 + mrow + 8 * rr;
            if (m < M) {
                const int my = rg_row(rows, flags, RG_FLAG_ROWS_Y, m);
                const int mr = EPI == 2 ? rg_row(rows, flags, RG_FLAG_ROWS_R, m) : 0;
#pragma unroll
                for (int h = 0; h < BN / 32; ++h)
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        const int n = n0 + 32 * h + 8 * t + 4 * u;
                        if (n < N) gt_store4<EPI>(y, r, N, my, mr, n, out4(h, u, rr), vec);
                    }
            }
        }
    } else {
        // Every wgmma has completed (each warpgroup's last wait was wait_group 0); the stages become
        // the partial tile.
        wx_fence_proxy_async();
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int h = 0; h < BN / 32; ++h)
#pragma unroll
                for (int u = 0; u < 2; ++u)
                    *reinterpret_cast<float4*>(smem + (mrow + 8 * rr) * C::PS + 32 * h + 8 * t + 4 * u) = out4(h, u, rr);
#ifdef RG_HAS_CLUSTERS
        rg_cluster_sync();  // all threads of all CTAs: the partials are visible cluster-wide
#endif
        gt_reduce_partials<EPI, BM, BN, S, 1, C::PS, T>(smem, rank, m0, n0, M, N, y, r, rows, flags, vec);
    }
}
#endif  // RG_WGMMA

// grid (ceil(N / BN), 1, ceil(M / BM)), 128 * BM / 64 threads
template <int EPI, int BM, int BN, int BK, int STAGES, int MINB, int FLUSH, int RUNS = 1>
__global__ void __launch_bounds__(WgCfg<BM, BN, BK, STAGES, 1, FLUSH, RUNS>::THREADS, MINB)
tf32x3_wgmma_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N,
                    int flags, const int* rows)
{
#ifdef RG_WGMMA
    tf32x3_wgmma_body<EPI, BM, BN, BK, STAGES, 1, FLUSH, RUNS>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W,
        rg_arg_ptr(y, flags, RG_FLAG_IND_Y), rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows,
        flags);
#else
    asm volatile("trap;");  // compiled for a target without wgmma: never launched (the host checks 9.0)
#endif
}

#ifdef RG_HAS_CLUSTERS
// grid (ceil(N / BN), S, ceil(M / BM)), clusters of (1, S, 1): cluster rank == blockIdx.y
template <int EPI, int BM, int BN, int BK, int STAGES, int S, int MINB, int FLUSH, int RUNS = 1>
__global__ void __cluster_dims__(1, S, 1) __launch_bounds__(WgCfg<BM, BN, BK, STAGES, S, FLUSH, RUNS>::THREADS, MINB)
tf32x3_wgmma_split_kernel(const float* x, const float* __restrict__ W, float* y, const float* r, int B, int K, int N,
                          int flags, const int* rows)
{
#ifdef RG_WGMMA
    tf32x3_wgmma_body<EPI, BM, BN, BK, STAGES, S, FLUSH, RUNS>(rg_arg_ptr(x, flags, RG_FLAG_IND_X), W,
        rg_arg_ptr(y, flags, RG_FLAG_IND_Y), rg_arg_ptr(r, flags, RG_FLAG_IND_R), B, K, N, flags & RG_FLAG_EARLY, rows,
        flags);
#else
    asm volatile("trap;");
#endif
}
#endif
