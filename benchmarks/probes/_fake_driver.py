"""A stand-in for ``cuda.bindings.driver`` that lets the probes' GPU code paths run on a CPU machine.

    PYTHONPATH=. python3 benchmarks/probes/_fake_driver.py benchmarks/probes/conditional_nodes.py --rounds 5
    PYTHONPATH=. python3 benchmarks/probes/_fake_driver.py benchmarks/probes/device_launch.py --case run --variant nonrdc_cubin

A smoke test for edits to the probes, nothing more: the real binding structs
(``CUgraphNodeParams``, ``CUDA_KERNEL_NODE_PARAMS``, ...) are used, so wrong field names, wrong
argument types and wrong unpacking of result tuples fail here as they would on the GPU, but no
kernel runs (every CHECK that reads a device value says MISMATCH) and every figure is made up.
device_launch.py's parent starts its cases in fresh interpreters, which do not load this fake:
run a case directly with ``--case`` (instantiate, run, time, plainstream) instead.
"""

import ctypes
import itertools
import os
import runpy
import sys

from cuda.bindings import driver as d

S = d.CUresult.CUDA_SUCCESS
_ids = itertools.count(0x10000, 0x100)
_keep = []
CTX = d.CUcontext(next(_ids))
graphs = {}  # int(graph) -> list of (node_int, type)
capture = {}  # int(stream) -> {"graph": CUgraph, "last": [nodes]}

T = d.CUgraphNodeType


def new(cls):
    return cls(next(_ids))


def ok(*vals):
    return (S, *vals)


def _graph_new():
    g = new(d.CUgraph)
    graphs[int(g)] = []
    return g


def _add(g, t):
    n = new(d.CUgraphNode)
    graphs.setdefault(int(g), []).append((n, t))
    return n


def _check_deps(deps, n):
    assert deps is None or isinstance(deps, (list, tuple)), type(deps)
    if deps:
        for x in deps:
            assert isinstance(x, d.CUgraphNode), type(x)
    assert (len(deps) if deps else 0) == n, (deps, n)


F = {}


def fake(fn):
    F[fn.__name__] = fn
    return fn


@fake
def cuInit(flags):
    return ok()


@fake
def cuDeviceGetCount():
    return ok(1)


@fake
def cuDeviceGet(o):
    return ok(d.CUdevice(0))


@fake
def cuDevicePrimaryCtxRetain(dev):
    return ok(CTX)


@fake
def cuDevicePrimaryCtxRelease(dev):
    return ok()


@fake
def cuCtxSetCurrent(c):
    return ok()


@fake
def cuCtxGetCurrent():
    return ok(CTX)


@fake
def cuCtxSynchronize():
    return ok()


@fake
def cuDeviceGetAttribute(a, dev):
    A = d.CUdevice_attribute
    return ok(
        {A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0}.get(
            a, 132
        )
    )


@fake
def cuDeviceGetName(n, dev):
    return ok(b"Fake H200\0")


@fake
def cuDeviceTotalMem(dev):
    return ok(1 << 37)


@fake
def cuMemGetInfo():
    return ok(1 << 36, 1 << 37)


@fake
def cuDriverGetVersion():
    return ok(13000)


@fake
def cuGetErrorString(e):
    return ok(b"fake error text")


@fake
def cuModuleLoadData(ptr):
    assert isinstance(ptr, int)
    return ok(new(d.CUmodule))


@fake
def cuModuleUnload(m):
    return ok()


@fake
def cuModuleGetFunction(m, name):
    assert isinstance(name, bytes)
    return ok(new(d.CUfunction))


@fake
def cuFuncGetAttribute(a, f):
    return ok(0)


@fake
def cuFuncSetAttribute(f, a, v):
    return ok()


@fake
def cuFuncGetName(f):
    return ok(b"fake_kernel")


@fake
def cuKernelGetName(k):
    return (d.CUresult.CUDA_ERROR_INVALID_HANDLE, None)


@fake
def cuFuncGetModule(f):
    return ok(new(d.CUmodule))


@fake
def cuFuncGetParamCount(f):
    raise RuntimeError('Function "cuFuncGetParamCount" not found')


@fake
def cuFuncGetParamInfo(f, i):
    assert isinstance(f, d.CUfunction)
    if i >= 3:
        return (d.CUresult.CUDA_ERROR_INVALID_VALUE, None, None)
    return ok(i * 8, 8)


@fake
def cuKernelGetParamInfo(k, i):
    return (d.CUresult.CUDA_ERROR_INVALID_HANDLE, None, None)


@fake
def cuStreamCreate(flags):
    return ok(new(d.CUstream))


@fake
def cuStreamDestroy(s):
    return ok()


@fake
def cuStreamSynchronize(s):
    return ok()


@fake
def cuStreamWaitEvent(s, e, f):
    return ok()


@fake
def cuStreamIsCapturing(s):
    st = d.CUstreamCaptureStatus
    return ok(st.CU_STREAM_CAPTURE_STATUS_ACTIVE if int(s) in capture else st.CU_STREAM_CAPTURE_STATUS_NONE)


@fake
def cuMemAlloc(n):
    b = ctypes.create_string_buffer(int(n))
    _keep.append(b)
    return ok(d.CUdeviceptr(ctypes.addressof(b)))


@fake
def cuMemFree(p):
    return ok()


@fake
def cuMemcpyHtoDAsync(dst, src, n, s):
    ctypes.memmove(int(dst), int(src), n)
    return ok()


@fake
def cuMemcpyDtoHAsync(dst, src, n, s):
    ctypes.memmove(int(dst), int(src), n)
    return ok()


@fake
def cuMemcpyDtoDAsync(dst, src, n, s):
    ctypes.memmove(int(dst), int(src), n)
    return ok()


@fake
def cuMemcpyHtoD(dst, src, n):
    ctypes.memmove(int(dst), int(src), n)
    return ok()


@fake
def cuMemcpyDtoH(dst, src, n):
    ctypes.memmove(int(dst), int(src), n)
    return ok()


@fake
def cuPointerGetAttribute(a, p):
    A = d.CUpointer_attribute
    if a == A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        return ok(d.CUmemorytype.CU_MEMORYTYPE_DEVICE)
    return ok(0)


@fake
def cuEventCreate(f):
    return ok(new(d.CUevent))


@fake
def cuEventRecord(e, s):
    return ok()


@fake
def cuEventDestroy(e):
    return ok()


@fake
def cuEventSynchronize(e):
    return ok()


@fake
def cuEventElapsedTime(a, b):
    return ok(0.0042)


@fake
def cuGraphCreate(f):
    return ok(_graph_new())


@fake
def cuGraphDestroy(g):
    return ok()


@fake
def cuGraphExecDestroy(e):
    return ok()


@fake
def cuGraphAddKernelNode(g, deps, n, p):
    _check_deps(deps, n)
    assert isinstance(p, d.CUDA_KERNEL_NODE_PARAMS)
    assert int(p.kernelParams) or p.gridDimX == 0
    return ok(_add(g, T.CU_GRAPH_NODE_TYPE_KERNEL))


@fake
def cuGraphAddEmptyNode(g, deps, n):
    _check_deps(deps, n)
    return ok(_add(g, T.CU_GRAPH_NODE_TYPE_EMPTY))


@fake
def cuGraphAddMemsetNode(g, deps, n, p, ctx):
    _check_deps(deps, n)
    assert isinstance(p, d.CUDA_MEMSET_NODE_PARAMS)
    return ok(_add(g, T.CU_GRAPH_NODE_TYPE_MEMSET))


@fake
def cuGraphAddMemcpyNode(g, deps, n, p, ctx):
    _check_deps(deps, n)
    assert isinstance(p, d.CUDA_MEMCPY3D)
    return ok(_add(g, T.CU_GRAPH_NODE_TYPE_MEMCPY))


@fake
def cuGraphAddChildGraphNode(g, deps, n, child):
    _check_deps(deps, n)
    assert isinstance(child, d.CUgraph)
    return ok(_add(g, T.CU_GRAPH_NODE_TYPE_GRAPH))


@fake
def cuGraphChildGraphNodeGetGraph(node):
    return ok(_graph_new())


@fake
def cuGraphAddNode(g, deps, edges, n, p):
    _check_deps(deps, n)
    assert edges is None or len(edges) == n
    assert isinstance(p, d.CUgraphNodeParams)
    if p.type == T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
        size = p.conditional.size
        if size == 0 or (p.conditional.type == d.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE and size != 1):
            return (d.CUresult.CUDA_ERROR_INVALID_VALUE, None)
        arr = (ctypes.c_uint64 * size)(*[int(_graph_new()) for _ in range(size)])
        _keep.append(arr)
        ctypes.c_uint64.from_address(int(p.conditional.getPtr()) + 16).value = ctypes.addressof(arr)
        assert int(p.conditional.ctx) == int(CTX)
    return ok(_add(g, p.type))


@fake
def cuGraphGetNodes(g, n=0):
    nodes = [x for x, _ in graphs.get(int(g), [])]
    if n == 0:
        return ok(None, len(nodes))
    return ok(nodes[:n], len(nodes))


@fake
def cuGraphNodeGetType(node):
    for lst in graphs.values():
        for x, t in lst:
            if int(x) == int(node):
                return ok(t)
    return ok(T.CU_GRAPH_NODE_TYPE_EMPTY)


@fake
def cuGraphKernelNodeGetParams(node):
    p = d.CUDA_KERNEL_NODE_PARAMS()
    p.func = new(d.CUfunction)
    vals = (ctypes.c_uint64 * 3)(0x1000, 0x2000, 0x3000)
    ptrs = (ctypes.c_void_p * 3)(*[ctypes.addressof(vals) + 8 * i for i in range(3)])
    _keep.extend([vals, ptrs])
    p.kernelParams = ctypes.addressof(ptrs)
    return ok(p)


@fake
def cuGraphConditionalHandleCreate(g, ctx, default, flags):
    assert isinstance(default, int) and isinstance(flags, int)
    return ok(new(d.CUgraphConditionalHandle))


@fake
def cuGraphInstantiate(g, flags):
    assert isinstance(flags, int)
    return ok(new(d.CUgraphExec))


@fake
def cuGraphInstantiateWithParams(g, ip):
    assert isinstance(ip, d.CUDA_GRAPH_INSTANTIATE_PARAMS)
    if int(ip.flags) & int(d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH):
        return (d.CUresult.CUDA_ERROR_INVALID_VALUE, None)
    return ok(new(d.CUgraphExec))


@fake
def cuGraphExecGetFlags(e):
    return ok(d.cuuint64_t(4))


@fake
def cuGraphLaunch(e, s):
    return ok()


@fake
def cuGraphUpload(e, s):
    return ok()


@fake
def cuGraphClone(g):
    return (d.CUresult.CUDA_ERROR_NOT_SUPPORTED, None)


@fake
def cuGraphExecUpdate(e, g):
    return ok(d.CUgraphExecUpdateResultInfo())


@fake
def cuGraphExecKernelNodeSetParams(e, n, p):
    assert isinstance(p, d.CUDA_KERNEL_NODE_PARAMS)
    return ok()


@fake
def cuGraphExecNodeSetParams(e, n, p):
    return (d.CUresult.CUDA_ERROR_INVALID_VALUE,)


@fake
def cuStreamBeginCapture(s, mode):
    capture[int(s)] = {"graph": _graph_new(), "last": []}
    return ok()


@fake
def cuStreamBeginCaptureToGraph(s, g, deps, edata, n, mode):
    if int(s) in capture:
        return (d.CUresult.CUDA_ERROR_ILLEGAL_STATE,)
    capture[int(s)] = {"graph": g, "last": list(deps or [])}
    return ok()


@fake
def cuStreamGetCaptureInfo(s):
    c = capture.get(int(s))
    st = d.CUstreamCaptureStatus
    if c is None:
        return ok(st.CU_STREAM_CAPTURE_STATUS_NONE, d.cuuint64_t(0), None, [], None, 0)
    return ok(st.CU_STREAM_CAPTURE_STATUS_ACTIVE, d.cuuint64_t(7), c["graph"], list(c["last"]), None, len(c["last"]))


@fake
def cuStreamUpdateCaptureDependencies(s, deps, edata, n, flags):
    _check_deps(deps, n)
    capture[int(s)]["last"] = list(deps)
    return ok()


@fake
def cuStreamEndCapture(s):
    c = capture.pop(int(s), None)
    if c is None:
        return (d.CUresult.CUDA_ERROR_ILLEGAL_STATE, None)
    return ok(c["graph"])


@fake
def cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sm, s, params, extra):
    assert isinstance(params, int)
    c = capture.get(int(s))
    if c is not None:
        c["last"] = [_add(c["graph"], T.CU_GRAPH_NODE_TYPE_KERNEL)]
    return ok()


@fake
def cuMemsetD32Async(p, v, n, s):
    return ok()


@fake
def cuLaunchKernelEx(config, f, params, extra):
    assert isinstance(params, int)
    return ok()


@fake
def cuLinkCreate(n, opts, vals):
    assert len(opts) == n == len(vals)
    return ok(new(d.CUlinkState))


@fake
def cuLinkAddData(st, t, data, size, name, n, o, v):
    assert isinstance(data, int)
    return ok()


@fake
def cuLinkAddFile(st, t, path, n, o, v):
    assert isinstance(path, bytes)
    return ok()


@fake
def cuLinkComplete(st):
    b = ctypes.create_string_buffer(b"\x7fELF" + b"\0" * 60)
    _keep.append(b)
    return ok(ctypes.addressof(b), 64)


@fake
def cuLinkDestroy(st):
    return ok()


for name, fn in F.items():
    assert hasattr(d, name), name
    setattr(d, name, fn)

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
