"""Seeded faults: one graph per class of :func:`~rawgraph.doctor.check.check`, each made the way
users make it, for the tests and ``rawgraph doctor --demo``.

Every builder returns a :class:`Fault`: the graph to examine, the class expected, the node path
expected to carry it, the keyword arguments ``check`` needs (a baseline taken right after capture,
the inputs, what the caller knows of a conditional handle) and what to close afterwards. Kernels
are small :class:`~rawgraph.runtime.rawkernel.RawKernel` sources; PyTorch and CuPy are imported
only by the builders that need them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.builder import GraphBuilder
from ..graphs.capture import capture_plan
from ..graphs.graph import GraphExec
from ..runtime.device import get_device
from ..runtime.errors import call
from ..runtime.launch import LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, HostBuffer
from ..runtime.rawkernel import RawKernel
from ..runtime.stream import Stream
from .check import Report, check

N = 1024
BLOCK = 128
SOURCE = r"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void shift(const float* x, float* y, float c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + c;
}
extern "C" __global__ void fill(float* y, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
"""


def kernels() -> dict[str, RawKernel]:
    """The three small kernels (compiled once per process through the kernel cache)."""
    return {name: RawKernel(SOURCE, name) for name in ("scale", "shift", "fill")}


@dataclass
class Fault:
    """A seeded fault.

    Attributes
    ----------
    name : str
        The class's short name it seeds.
    cls : int
    graph : Any
        What to give ``check``.
    node : str
        The node path the finding must name.
    options : dict
        Keyword arguments for ``check`` (``baseline``, ``inputs``, ``conditions``).
    story : str
        How a user gets it.
    keep : list
        Held until :meth:`close`.
    """

    name: str
    cls: int
    graph: Any
    node: str
    story: str
    options: dict[str, Any] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)
    closers: list[Callable[[], Any]] = field(default_factory=list)

    def check(self) -> Report:
        return check(self.graph, **self.options)

    def close(self) -> None:
        for fn in reversed(self.closers):
            with contextlib.suppress(Exception):
                fn()
        self.closers.clear()
        self.keep.clear()


def _grid() -> int:
    return (N + BLOCK - 1) // BLOCK


def dangling() -> Fault:
    """Class 1: a kernel node built over a buffer, then the buffer freed (``cuMemFree``).

    See Also
    --------
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """
    k = kernels()
    x, y = DeviceBuffer(N), DeviceBuffer(N)
    b = GraphBuilder()
    b.kernel(k["scale"].launch(_grid(), BLOCK, (x, y, 2.0, N)))
    graph = b.build()
    # A baseline while x lives: the next allocation of its size (a later fault's, in the demo)
    # may take x's address, which is then live again; the baseline tells the new owner apart.
    base = check(graph)
    x.close()  # the graph still holds x's address
    return Fault(
        "dangling",
        1,
        graph,
        "0",
        "a buffer freed while a graph still points at it",
        {"baseline": base},
        keep=[y],
        closers=[graph.close, y.close],
    )


def stream_ordered_pool(stream: Stream) -> Fault:
    """Class 2: a ``cuMemAllocAsync`` buffer baked into a graph, then freed with ``cuMemFreeAsync``.

    The device's default pool keeps what is freed (release threshold raised for the fault, put
    back by :meth:`Fault.close`), so the memory stays the pool's and the next allocation takes it.
    The driver forgets the address once it is freed (``cuPointerGetAttributes`` answers as for
    freed memory, measured with driver 580), so the check is given a baseline taken
    while the buffer was live: it names the pool there.

    See Also
    --------
    cuMemAllocAsync, cuMemFreeAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC_ASYNC.html
    cuPointerGetAttributes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html
    """
    k = kernels()
    dev = get_device()
    pool = call(driver.cuDeviceGetDefaultMemPool, dev.handle)
    attr = driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    old = call(driver.cuMemPoolGetAttribute, pool, attr)
    call(driver.cuMemPoolSetAttribute, pool, attr, driver.cuuint64_t(2**63))
    ptr = int(call(driver.cuMemAllocAsync, N * 4, stream.handle))
    stream.synchronize()
    y = DeviceBuffer(N)
    b = GraphBuilder()
    b.kernel(k["scale"].launch(_grid(), BLOCK, (DeviceArray(ptr, (N,), np.dtype(np.float32)), y, 2.0, N)))
    graph = b.build()
    base = check(graph)
    call(driver.cuMemFreeAsync, ptr, stream.handle)
    stream.synchronize()

    def restore() -> None:
        call(driver.cuMemPoolSetAttribute, pool, attr, old)
        call(driver.cuMemPoolTrimTo, pool, 0)

    return Fault(
        "stream-ordered-pool",
        2,
        graph,
        "0",
        "a cudaMallocAsync buffer freed after capture",
        {"baseline": base},
        keep=[y],
        closers=[restore, graph.close, y.close],
    )


def host_memory() -> Fault:
    """Class 3: a memcpy node from a pinned staging buffer (rawgraph ``HostBuffer``), the buffer
    freed (``cuMemFreeHost``) and pinned memory of the same size allocated again.

    See Also
    --------
    cuMemFreeHost : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """
    h = HostBuffer(N, np.float32)
    y = DeviceBuffer(N)
    b = GraphBuilder()
    b.memcpy(y, h, N * 4)
    graph = b.build()
    base = check(graph)
    h.close()
    again = HostBuffer(N, np.float32)  # often the same address: the baseline tells them apart
    return Fault(
        "host-memory",
        3,
        graph,
        "0",
        "a pinned staging buffer freed and allocated again",
        {"baseline": base},
        keep=[y, again],
        closers=[graph.close, y.close, again.close],
    )


def host_memory_cupy() -> Fault:
    """Class 3 the CuPy way: ``ndarray.set`` from a CuPy pinned buffer captured on a CuPy stream,
    the buffer returned to CuPy's pinned pool, the pool emptied (``cudaFreeHost``) and pinned
    memory of the same size taken again."""
    import cupy  # optional: only this fault needs it

    from ..updates.adopt import from_cupy

    mem = cupy.cuda.alloc_pinned_memory(N * 4)
    host = np.frombuffer(mem, np.float32, N)
    host[:] = 1.0
    dev = cupy.empty(N, cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    # What ndarray.set does, through the runtime call itself: CuPy 14 refuses ndarray.set on a
    # capturing stream ("H2D transfers are disallowed"), the runtime captures it as a memcpy node.
    rt = cupy.cuda.runtime
    s.begin_capture()
    try:
        rt.memcpyAsync(dev.data.ptr, host.ctypes.data, N * 4, rt.memcpyHostToDevice, s.ptr)
    finally:
        cg = s.end_capture()  # never leave a capture open: every later sync in the context fails
    adopted = from_cupy(cg)
    base = check(adopted)
    del host, mem
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    again = cupy.cuda.alloc_pinned_memory(N * 4)
    return Fault(
        "host-memory",
        3,
        adopted,
        "0",
        "a CuPy pinned staging buffer freed and allocated again",
        {"baseline": base},
        keep=[dev, again, s],
        closers=[adopted.close],
    )


def unordered_overlap() -> Fault:
    """Class 5: a writer and a reader of one buffer built with no edge between them."""
    k = kernels()
    buf, out = DeviceBuffer(N), DeviceBuffer(N)
    b = GraphBuilder()
    b.kernel(k["fill"].launch(_grid(), BLOCK, (buf, 1.0, N)))
    b.kernel(k["scale"].launch(_grid(), BLOCK, (buf, out, 2.0, N)))  # deps=() : the edge is missing
    graph = b.build()
    return Fault(
        "unordered-overlap",
        5,
        graph,
        "1",
        "a graph built with a missing edge",
        keep=[buf, out],
        closers=[graph.close, buf.close, out.close],
    )


def conditional_default() -> Fault:
    """Class 7: an IF node whose handle was made without a default and that no kernel sets."""
    k = kernels()
    dev = get_device()
    y = DeviceBuffer(N)
    b = GraphBuilder()
    first = b.kernel(k["fill"].launch(_grid(), BLOCK, (y, 1.0, N)))
    handle = call(driver.cuGraphConditionalHandleCreate, b.handle, dev.context, 0, 0)  # no ASSIGN_DEFAULT
    p = driver.CUgraphNodeParams()
    p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    p.conditional.handle = handle
    p.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
    p.conditional.size = 1
    p.conditional.ctx = dev.context
    b.node(p, "conditional", [first])
    body = list(p.conditional.phGraph_out)[0]
    launch = k["scale"].launch(_grid(), BLOCK, (y, y, 2.0, N))
    call(driver.cuGraphAddKernelNode, body, None, 0, launch.node_params())
    b.keep.append(launch)
    graph = b.build()
    return Fault(
        "conditional-default",
        7,
        graph,
        "1",
        "a conditional node nobody sets, made without a default",
        {"conditions": {int(handle): None}},
        keep=[y],
        closers=[graph.close, y.close],
    )


def allocator_freed() -> Fault:
    """Class 4: a PyTorch tensor captured by ``torch.cuda.graph`` then deleted, its block taken by
    a new tensor (the baseline, taken right after capture, tells the new owner from the old)."""
    import torch  # optional: only this fault needs it

    from ..updates.adopt import from_torch

    x = torch.randn(N, device="cuda")
    g = _torch_capture(torch, lambda: x * 2 + 1)  # noqa: F821 (run here, before the `del x` below)
    adopted = from_torch(g)
    base = check(adopted)
    ptr = x.data_ptr()
    del x
    z = torch.empty(N // 2, device="cuda")  # the caching allocator hands out x's block again
    return Fault(
        "allocator-freed",
        4,
        adopted,
        _first_holder(adopted, ptr),
        "a torch tensor captured, then deleted and its block reused",
        {"baseline": base},
        keep=[z, g],
        closers=[adopted.close],
    )


def input_is_intermediate() -> Fault:
    """Class 6: a PyTorch graph whose input is allocated inside the capture after an intermediate
    was freed: the private pool gives it the intermediate's address."""
    import torch  # optional: only this fault needs it

    from ..updates.adopt import from_torch

    x = torch.randn(N, device="cuda")
    box: dict[str, Any] = {}

    def body() -> Any:
        t = x * 2
        y = t + 1
        box["t"] = t.data_ptr()
        del t
        inp = torch.empty_like(x)  # the caller will copy its input here before each replay
        box["inp"] = inp
        return inp * 3 + y

    g = _torch_capture(torch, body)
    inp = box["inp"]
    adopted = from_torch(g)
    return Fault(
        "input-is-intermediate",
        6,
        adopted,
        _first_holder(adopted, inp.data_ptr()),
        "a torch graph whose input is also an intermediate",
        {"inputs": [inp]},
        keep=[x, inp, g, box],
        closers=[adopted.close],
    )


def _torch_capture(torch: Any, fn: Callable[[], Any]) -> Any:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up, as torch asks before capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        g._rawgraph_out = fn()
    return g


def _first_holder(adopted: Any, ptr: int) -> str:
    """The path of the first node (in ``cuGraphGetNodes`` order) whose parameters hold ``ptr``."""
    from ..graphs.nodes import KernelInfo
    from ._scan import scan_words

    for info in adopted.read_nodes():
        if isinstance(info, KernelInfo) and info.params is not None and scan_words(info.params, None, ptr, ptr + 1):
            return str(info.index)
    return "?"


# --------------------------------------------------------------------------- verify's fault
@dataclass
class WrongArgument:
    """A three-kernel rawgraph plan (``h1 = 2 x``, ``h2 = h1 + 1``, ``out = 3 h2``), captured,
    instantiated, and its middle node given another constant through
    ``cuGraphExecKernelNodeSetParams``: :func:`~rawgraph.doctor.verify.verify` must name node 1.

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    graph: Any
    exec: GraphExec
    plan: LaunchPlan
    buffers: list[DeviceBuffer]

    def close(self) -> None:
        self.exec.close()
        self.graph.close()
        for b in self.buffers:
            b.close()


def wrong_argument(stream: Stream) -> WrongArgument:
    k = kernels()
    x, h1, h2, out = (DeviceBuffer(N) for _ in range(4))
    launches = [
        k["scale"].launch(_grid(), BLOCK, (x, h1, 2.0, N), names={"x": "x", "y": "h1"}),
        k["shift"].launch(_grid(), BLOCK, (h1, h2, 1.0, N), names={"x": "h1", "y": "h2"}),
        k["scale"].launch(_grid(), BLOCK, (h2, out, 3.0, N), names={"x": "h2", "y": "out"}),
    ]
    bufs = {"x": x.view(), "h1": h1.view(), "h2": h2.view(), "out": out.view()}
    plan = LaunchPlan(launches, bufs, inputs=("x",), outputs=("out",))
    graph = capture_plan(plan, stream)
    exe = graph.instantiate()
    wrong = launches[1].args.copy()
    wrong["c"] = 5.0  # the exec's node 1 adds 5, the plan (its eager twin) adds 1
    call(driver.cuGraphExecKernelNodeSetParams, exe.handle, graph.nodes[1].handle, launches[1].node_params(wrong))
    return WrongArgument(graph, exe, plan, [x, h1, h2, out])


def all_faults(stream: Stream, torch: bool = True, cupy: bool = True) -> list[Fault]:
    """Every seeded fault this machine can make (the torch and CuPy ones when asked and importable)."""
    faults = [dangling(), stream_ordered_pool(stream), host_memory(), unordered_overlap(), conditional_default()]
    if torch:
        with contextlib.suppress(ImportError):
            faults += [allocator_freed(), input_is_intermediate()]
    if cupy:
        with contextlib.suppress(ImportError):
            faults.append(host_memory_cupy())
    return faults


__all__ = [
    "Fault",
    "WrongArgument",
    "all_faults",
    "allocator_freed",
    "conditional_default",
    "dangling",
    "host_memory",
    "host_memory_cupy",
    "input_is_intermediate",
    "kernels",
    "stream_ordered_pool",
    "unordered_overlap",
    "wrong_argument",
]
