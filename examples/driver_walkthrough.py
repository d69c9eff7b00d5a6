"""The seed's experiment with only cuda.bindings (driver + NVRTC) and NumPy: the tiny block
``y = relu(x @ W1) @ W2 + x`` (float32) by eager launches, by a graph replay after copying the request
into the captured input (PyTorch's way), and by the same graph with its input pointer rebound by
``cuGraphExecKernelNodeSetParams`` (no copy); then the bits and the time of each. Each step names the
rule it shows and its ``docs/semantics.md`` section (§). Exit status: 0 equal bits, 1 not, 69 no GPU."""

import ctypes
import statistics
import sys
import time

import numpy as np
from cuda.bindings import driver, nvrtc

NAME = "driver_walkthrough.py"
BATCH, WIDTH, WARMUP, ROUNDS = 1, 128, 20, 200  # the seed's shape: one row of 128 floats
POISON = 0xFFFFFFFF  # a NaN: a path that writes nothing cannot pass the bit comparison
SRC = r"""
extern "C" __global__ void mm_epilogue(const float* a, const float* w, const float* res, float* out,
                                       int rows, int n, int relu) {
    // out = act(a @ w) (+ res): one thread per output, k in the same order every time (same bits)
    int i = blockIdx.x * blockDim.x + threadIdx.x, r = i / n, j = i % n;
    if (i >= rows * n) return;
    float acc = 0.0f;
    for (int k = 0; k < n; ++k) acc = fmaf(a[r * n + k], w[k * n + j], acc);
    out[i] = (relu ? fmaxf(acc, 0.0f) : acc) + (res ? res[i] : 0.0f);
}"""
KERNEL = "mm_epilogue"
ARG_TYPES = (np.uint64,) * 4 + (np.int32,) * 3  # a, w, res, out: pointers; rows, n, relu: int
POINTERS = range(4)
KEEP = []  # every packed table and its cells, alive all run: the driver reads them in each call given one


def call(fn, *args):
    """One driver or NVRTC call: its outputs, or an error naming the call and its result (§6)."""
    err, *out = fn(*args)
    if err:  # CUresult and nvrtcResult are int enums; 0 is success
        raise RuntimeError(f"{fn.__name__} failed: {getattr(err, 'name', err)}")
    return out[0] if len(out) == 1 else tuple(out)


def compile_cubin(arch):
    """NVRTC: SRC to a CUBIN for exactly ``arch`` ("sm_90"); raises with the compile log."""
    prog = call(nvrtc.nvrtcCreateProgram, SRC.encode(), b"walkthrough.cu", 0, [], [])
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [f"-arch={arch}".encode()])  # sm_XY: SASS, no PTX JIT
        if err:  # out-buffers are bytearrays, never bytes: NVRTC writes into what it is given (§16)
            log = bytearray(call(nvrtc.nvrtcGetProgramLogSize, prog))
            call(nvrtc.nvrtcGetProgramLog, prog, log)
            raise RuntimeError(f"nvrtcCompileProgram failed: {err.name}\n{log.decode(errors='replace')}")
        cubin = bytearray(call(nvrtc.nvrtcGetCUBINSize, prog))
        call(nvrtc.nvrtcGetCUBIN, prog, cubin)
        return bytes(cubin)
    finally:
        call(nvrtc.nvrtcDestroyProgram, prog)


def pack(values):
    """``kernelParams`` as C takes it: the address of a ``void*[]`` pointing at one host cell per argument,
    typed as the kernel declares it (§17); cuda.bindings would build it from ``((values), (ctypes types))``,
    by hand it is the very table a kernel node hands back and ``cuGraphExecKernelNodeSetParams`` takes."""
    cells = [np.array([v], dtype=t) for v, t in zip(values, ARG_TYPES)]
    table = np.array([c.ctypes.data for c in cells], dtype=np.uint64)
    KEEP.append((table, cells))
    return int(table.ctypes.data)


def unpack(table):  # the argument values behind a kernelParams table: pack's inverse
    slots = [ctypes.c_void_p.from_address(table + 8 * i).value for i in range(len(ARG_TYPES))]
    return [np.frombuffer(ctypes.string_at(s, np.dtype(t).itemsize), t)[0].item() for s, t in zip(slots, ARG_TYPES)]


def measure(step, stream, ev0, ev1):
    """Median us per step: host clock to the synchronized end, device time between events around it."""
    host, dev = [], []
    for i in range(WARMUP + ROUNDS):
        t = time.perf_counter()
        call(driver.cuEventRecord, ev0, stream)
        step(i)
        call(driver.cuEventRecord, ev1, stream)
        call(driver.cuEventSynchronize, ev1)
        if i >= WARMUP:
            host.append(time.perf_counter() - t)
            dev.append(call(driver.cuEventElapsedTime, ev0, ev1))
    return statistics.median(host) * 1e6, statistics.median(dev) * 1e3


def walkthrough(dev, owned):
    own = lambda release, handle: owned.append((release, handle)) or handle  # released in reverse order at the end
    # 1. The primary context (the one CuPy and PyTorch use), current on this thread: an exec update
    #    from a thread with no current context crashes the process (semantics.md §16).
    ctx = call(driver.cuDevicePrimaryCtxRetain, dev)
    own(driver.cuDevicePrimaryCtxRelease, dev)
    call(driver.cuCtxSetCurrent, ctx)
    attr = driver.CUdevice_attribute
    major = call(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = call(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    arch, gpu = f"sm_{major}{minor}", call(driver.cuDeviceGetName, 64, dev).split(b"\0")[0].decode()
    # 2. NVRTC to a CUBIN for this device's exact compute capability; 3. load it, find the kernel. §17
    image = np.frombuffer(compile_cubin(arch), np.uint8)  # the driver copies the image in the call
    module = own(driver.cuModuleUnload, call(driver.cuModuleLoadData, image.ctypes.data))
    kernel = call(driver.cuModuleGetFunction, module, KERNEL.encode())
    # A stream of our own, non-blocking: the legacy default stream cannot be captured. §2, §3
    stream = own(driver.cuStreamDestroy, call(driver.cuStreamCreate, int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    ev0, ev1 = (own(driver.cuEventDestroy, call(driver.cuEventCreate, 0)) for _ in range(2))  # timing events

    def alloc(host=None, nbytes=4 * BATCH * WIDTH):  # device memory, filled in stream order
        ptr = own(driver.cuMemFree, int(call(driver.cuMemAlloc, nbytes if host is None else host.nbytes)))
        if host is not None:
            call(driver.cuMemcpyHtoDAsync, ptr, host.ctypes.data, host.nbytes, stream)
        return ptr

    rng = np.random.default_rng(83)
    w1h, w2h = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.float32(WIDTH**0.5) for _ in range(2))
    reqh = [rng.standard_normal((BATCH, WIDTH), dtype=np.float32) for _ in range(2)]  # two requests
    w1, w2, req = alloc(w1h), alloc(w2h), [alloc(r) for r in reqh]  # requests keep their addresses
    x_static, h, y = alloc(), alloc(), alloc()  # the graph's input, intermediate and output

    # 4. Arguments packed once per input, as a real launcher does (the eager times count launches,
    #    not NumPy): h = relu(x @ W1), then y = h @ W2 + x. Scalars in their C type, pointers as
    #    addresses (§17); the host cells outlive every call that reads them (§4).
    tables = {x: (pack((x, w1, 0, h, BATCH, WIDTH, 1)), pack((h, w2, x, y, BATCH, WIDTH, 0))) for x in (x_static, *req)}
    grid, block = (BATCH * WIDTH + 127) // 128, 128

    # 5. Eager: one cuLaunchKernel per kernel, each a host call (T_eager = Σ(T_launch + T_kernel)). §1
    def launch_block(x):
        for table in tables[x]:
            call(driver.cuLaunchKernel, kernel, grid, 1, 1, block, 1, 1, 0, stream, table, 0)

    launch_block(x_static)  # warm-up before capture (lazy module loading happens here)
    # 6. Capture: the same launches are recorded, not run (§2); thread-local mode, so another
    #    thread's unsafe call cannot invalidate it (§3). Each node copies its arguments (§4).
    call(driver.cuStreamBeginCapture, stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    launch_block(x_static)
    graph = own(driver.cuGraphDestroy, call(driver.cuStreamEndCapture, stream))
    # 7. Instantiate once; every replay is one cuGraphLaunch (T_replay = T_graph_launch + Σ T_kernel). §1, §5
    gexec = own(driver.cuGraphExecDestroy, call(driver.cuGraphInstantiate, graph, 0))
    # 8. Rebinding: read each kernel node back (cuGraphGetNodes + cuGraphKernelNodeGetParams; the
    #    graph keeps the captured values, an exec cannot be read back: §11), point every argument
    #    that held x_static at the request, push it into the exec only (§6, §11 "Rebinding by address").
    every = call(driver.cuGraphGetNodes, graph, call(driver.cuGraphGetNodes, graph, 0)[1])[0]  # count, then nodes
    nodes = [n for n in every if call(driver.cuGraphNodeGetType, n) == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL]

    def rebound(x):  # [(node, params)] moving every x_static argument to x
        out = []
        for node in nodes:
            p = call(driver.cuGraphKernelNodeGetParams, node)
            vals = unpack(int(p.kernelParams))
            if any(vals[i] == x_static for i in POINTERS):  # func, grid, block stay as read
                p.kernelParams = pack([x if i in POINTERS and v == x_static else v for i, v in enumerate(vals)])
                out.append((node, p))
        return out

    plans = [rebound(x) for x in req]

    # 9. The three paths; step i serves request i % 2, at its own address.
    def copy_replay(i):  # PyTorch's way: new data into the captured input, then replay
        call(driver.cuMemcpyDtoDAsync, x_static, req[i % 2], 4 * BATCH * WIDTH, stream)
        call(driver.cuGraphLaunch, gexec, stream)

    def rebind_replay(i):  # no copy: the exec reads the request where it is (later launches only, §6)
        for node, p in plans[i % 2]:
            call(driver.cuGraphExecKernelNodeSetParams, gexec, node, p)
        call(driver.cuGraphLaunch, gexec, stream)

    eager = lambda i: launch_block(req[i % 2])
    paths = [("eager (2 launches)", eager), ("copy + replay", copy_replay), ("rebind + replay", rebind_replay)]

    # 10. Each path on request 0 after poisoning x_static, h and y (so the rebind path must read the
    #     request), compared bit for bit with eager and with float64; then timed.
    x64 = reqh[0].astype(np.float64)
    ref = np.maximum(x64 @ w1h.astype(np.float64), 0) @ w2h.astype(np.float64) + x64
    bits, rows = {}, []
    for name, step in paths:
        for ptr in (x_static, h, y):
            call(driver.cuMemsetD32Async, ptr, POISON, BATCH * WIDTH, stream)
        step(0)
        out = np.empty((BATCH, WIDTH), np.float32)
        call(driver.cuMemcpyDtoHAsync, out.ctypes.data, y, out.nbytes, stream)
        call(driver.cuStreamSynchronize, stream)
        got = out.view(np.uint32)  # the bits themselves (a NaN never equals, -0.0 differs from 0.0)
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        if not np.array_equal(got, bits.setdefault("eager", got)) or not err < 1e-5:
            diff = f"{np.count_nonzero(got != bits['eager'])} of {got.size} floats differ from eager's bits"
            print(f"{NAME}: FAILED: {name}: {diff}; relative error vs float64 {err:.1e}", file=sys.stderr)
            return 1
        rows.append((name, *measure(step, stream, ev0, ev1)))
    print(f"{gpu} ({arch}), block {BATCH}x{WIDTH} float32, median of {ROUNDS} steps")
    print(f"{'path':<20}{'host us/step':>14}{'device us/step':>16}")
    for name, host_us, dev_us in rows:
        print(f"{name:<20}{host_us:>14.2f}{dev_us:>16.2f}")
    print(f"rebinding moved x in {len(plans[0])} of {len(nodes)} kernel nodes")
    print(f"three paths, equal bits: eager == copy + replay == rebind + replay (vs float64: {err:.1e})")
    return 0


def main():
    try:  # without libcuda cuda.bindings raises instead of returning an error code
        call(driver.cuInit, 0)
        if call(driver.cuDeviceGetCount) < 1:
            raise RuntimeError("the CUDA driver found no GPU")
    except Exception as exc:
        print(f"{NAME} needs a GPU: {' '.join(str(exc).split())}", file=sys.stderr)
        return 69
    owned = []  # (release call, handle): everything made, released in reverse order. §4
    try:
        return walkthrough(call(driver.cuDeviceGet, 0), owned)
    finally:
        failed = [fn.__name__ for fn, handle in reversed(owned) if fn(handle)[0]]
        if failed:
            raise RuntimeError(f"release failed: {', '.join(failed)}")


if __name__ == "__main__":
    sys.exit(main())
