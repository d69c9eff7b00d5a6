"""Every node read back (rawgraph.graphs.nodes): rawgraph's kernels decoded generically agree with their
launch plans, and a hand-built graph with one node of every type reads back field by field."""

import ctypes
import re

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input

from rawgraph import DeviceBuffer, TinyBlock, capture_plan, ops
from rawgraph.graphs.dot import to_dot
from rawgraph.graphs.nodes import (
    ChildGraphInfo,
    ConditionalInfo,
    EmptyInfo,
    EventInfo,
    HostInfo,
    KernelInfo,
    MemAllocInfo,
    MemcpyInfo,
    MemFreeInfo,
    MemsetInfo,
    read_graph,
    walk,
)
from rawgraph.runtime.errors import call
from rawgraph.runtime.launch import ARG_DTYPES, LaunchPlan
from rawgraph.runtime.stream import Event

pytestmark = pytest.mark.gpu
T = driver.CUgraphNodeType


def _arg_layout(args):
    """(offset, size) per argument as rawgraph packs it (by-value arrays where launch.py has them)."""
    import rawgraph.runtime.launch as L

    dtype = getattr(L, "arg_dtype", ARG_DTYPES.__getitem__)
    return [(args.offsets[n], dtype(k).itemsize) for n, k in args.spec]


def _check_against_plan(graph):
    infos = graph.read_nodes()
    by_id = {i.id: i for i in infos}
    assert len(infos) == graph.node_count()
    for node in graph.nodes:
        info = by_id[int(node.handle)]
        launch = node.launch
        assert isinstance(info, KernelInfo)
        assert info.function == int(launch.kernel.handle)
        assert info.name == launch.kernel.symbol, (info.name, launch.kernel.symbol)
        assert (info.grid, info.block, info.shared_mem) == (launch.grid, launch.block, launch.shared_mem)
        want = _arg_layout(launch.args)
        assert [(p.offset, p.size) for p in info.layout] == want, launch.kernel.name
        extent = max((o + s for o, s in want), default=0)
        assert info.params == node.captured_args[:extent], launch.kernel.name
        assert info.via == "kernelParams"
    # dependencies: a linear capture, each node after the one before it
    order = sorted(graph.nodes, key=lambda n: n.index)
    for prev, cur in zip(order, order[1:]):
        assert by_id[int(cur.handle)].dependencies == [int(prev.handle)]
    return infos


@pytest.mark.parametrize("form", ["unfused", "fused", "block"])
def test_generic_decoding_agrees_with_the_plan(stream, rng, form):
    model = TinyBlock(128, 3, 2, seed=int(rng.integers(1 << 30)), form=form)
    x = DeviceBuffer.from_numpy(random_input(rng, (3, 128)))
    out = DeviceBuffer((3, 128))
    out.poison(stream)
    graph = capture_plan(model.plan(x, out), stream)
    infos = _check_against_plan(graph)
    # the pointers rawgraph bound are where the layout says: x is the first parameter of node 0
    first = next(i for i in infos if i.id == int(graph.nodes[0].handle))
    assert int.from_bytes(first.param_bytes(0), "little") == x.ptr
    graph.close()


def test_generic_decoding_of_the_other_kernels(stream, rng, device):
    rows, width = 5, 64
    src = DeviceBuffer.from_numpy(random_input(rng, (8, width)))
    dst = DeviceBuffer((8, width))
    idx = DeviceBuffer.from_numpy(rng.permutation(8)[:rows].astype(np.int32))
    count = DeviceBuffer((1,), np.uint64)
    bufs = {"src": src.view(), "dst": dst.view(), "idx": idx.view(), "count": count.view()}
    launches = [
        ops.gather_rows(device, bufs, "src", "idx", "dst", rows),
        ops.scatter_rows(device, bufs, "src", "idx", "dst", rows),
        ops.count_mismatch(device, bufs, "src", "dst", "count"),
        ops.fill_uniform(device, bufs["dst"], int(rng.integers(1 << 40)), 0.5),
        ops.spin(device, 10),
        ops.empty(device),
        ops.relu(device, bufs, "src", "dst"),
        ops.add(device, bufs, "src", "dst", "dst"),
    ]
    for name in ("gather_rows_param", "scatter_rows_param"):  # by-value row tables, where present
        if hasattr(ops, name):
            launches.append(getattr(ops, name)(device, bufs, "src", "dst", rows))
    graph = capture_plan(LaunchPlan(launches, bufs, (), ()), stream)
    _check_against_plan(graph)
    empty = [i for i in graph.read_nodes() if isinstance(i, KernelInfo) and i.layout == []]
    assert len(empty) == 1 and empty[0].params == b""
    graph.close()


_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def test_every_node_type_reads_back(stream, rng, device):
    ctx = device.context
    a = DeviceBuffer.from_numpy(random_input(rng, 256))
    b = DeviceBuffer((256,))
    relu = ops.relu(device, {"a": a.view(), "b": b.view()}, "a", "b")
    ev = Event(timing=False)
    g = call(driver.cuGraphCreate, 0)
    try:
        kp = driver.CUDA_KERNEL_NODE_PARAMS()
        kp.func = relu.kernel.handle
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = relu.grid
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = relu.block
        kp.sharedMemBytes = 0
        kp.kernelParams = relu.args.address
        k = call(driver.cuGraphAddKernelNode, g, None, 0, kp)
        nbytes = int(rng.integers(16, 256)) * 4
        mp = driver.CUDA_MEMCPY3D()
        mp.srcMemoryType = mp.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        mp.srcDevice, mp.dstDevice = b.ptr, a.ptr
        mp.WidthInBytes, mp.Height, mp.Depth = nbytes, 1, 1
        mp.srcPitch = mp.dstPitch = nbytes
        mp.srcHeight = mp.dstHeight = 1
        mc = call(driver.cuGraphAddMemcpyNode, g, [k], 1, mp, ctx)
        value = int(rng.integers(1, 1 << 31))
        sp = driver.CUDA_MEMSET_NODE_PARAMS()
        sp.dst, sp.value, sp.elementSize, sp.width, sp.height, sp.pitch = b.ptr, value, 4, 64, 1, 256
        ms = call(driver.cuGraphAddMemsetNode, g, [mc], 1, sp, ctx)
        fn = _HOST_FN(lambda _p: None)
        fn_addr = ctypes.cast(fn, ctypes.c_void_p).value
        hp = driver.CUDA_HOST_NODE_PARAMS()
        hp.fn = driver.CUhostFn(fn_addr)
        hp.userData = 0x1234
        host = call(driver.cuGraphAddHostNode, g, [ms], 1, hp)
        rec = call(driver.cuGraphAddEventRecordNode, g, [host], 1, ev.handle)
        wait = call(driver.cuGraphAddEventWaitNode, g, [rec], 1, ev.handle)
        emp = call(driver.cuGraphAddEmptyNode, g, [wait], 1)
        child = call(driver.cuGraphCreate, 0)
        call(driver.cuGraphAddMemsetNode, child, None, 0, sp, ctx)
        ch = call(driver.cuGraphAddChildGraphNode, g, [emp], 1, child)
        call(driver.cuGraphDestroy, child)  # the node holds its own clone
        ap = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
        ap.poolProps.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        ap.poolProps.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        ap.poolProps.location.id = device.ordinal
        ap.bytesize = 1 << 16
        al = call(driver.cuGraphAddMemAllocNode, g, [ch], 1, ap)
        dptr = int(ap.dptr)
        fr = call(driver.cuGraphAddMemFreeNode, g, [al], 1, dptr)
        handle = call(driver.cuGraphConditionalHandleCreate, g, ctx, 0, 1)
        cp = driver.CUgraphNodeParams()
        cp.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
        cp.conditional.handle = handle
        cp.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
        cp.conditional.size = 1
        cp.conditional.ctx = ctx
        cond = call(driver.cuGraphAddNode, g, [fr], None, 1, cp)
        body = list(cp.conditional.phGraph_out)[0]
        call(driver.cuGraphAddEmptyNode, body, None, 0)  # empty nodes are allowed in every body

        infos = read_graph(g)
        by_id = {i.id: i for i in infos}
        assert len(infos) == 11
        ki = by_id[int(k)]
        assert isinstance(ki, KernelInfo) and ki.name == "relu" and ki.grid == relu.grid
        assert (
            int.from_bytes(ki.param_bytes(0), "little") == a.ptr
            and int.from_bytes(ki.param_bytes(1), "little") == b.ptr
        )
        mi = by_id[int(mc)]
        assert isinstance(mi, MemcpyInfo) and (mi.src, mi.dst, mi.nbytes, mi.direction) == (
            b.ptr,
            a.ptr,
            nbytes,
            "DtoD",
        )
        assert mi.dependencies == [int(k)]
        si = by_id[int(ms)]
        assert isinstance(si, MemsetInfo) and (si.dst, si.value, si.element_size, si.width, si.height) == (
            b.ptr,
            value,
            4,
            64,
            1,
        )
        hi = by_id[int(host)]
        assert isinstance(hi, HostInfo) and hi.fn == fn_addr and hi.user_data == 0x1234
        ri, wi = by_id[int(rec)], by_id[int(wait)]
        assert isinstance(ri, EventInfo) and ri.kind == "event_record" and ri.event == int(ev.handle)
        assert isinstance(wi, EventInfo) and wi.kind == "event_wait" and wi.event == int(ev.handle)
        assert isinstance(by_id[int(emp)], EmptyInfo)
        ci = by_id[int(ch)]
        assert isinstance(ci, ChildGraphInfo) and len(ci.nodes) == 1 and isinstance(ci.nodes[0], MemsetInfo)
        assert ci.nodes[0].depth == 1 and ci.nodes[0].value == value
        ai, fi = by_id[int(al)], by_id[int(fr)]
        assert isinstance(ai, MemAllocInfo) and (ai.dptr, ai.bytesize) == (dptr, 1 << 16)
        assert isinstance(fi, MemFreeInfo) and fi.dptr == dptr
        co = by_id[int(cond)]
        assert isinstance(co, ConditionalInfo), co
        if co.error:  # only where the driver itself cannot give a conditional node's parameters back
            assert "missing" in co.error and not hasattr(ctypes.CDLL("libcuda.so.1"), "cuGraphNodeGetParams"), co.error
        else:
            assert (co.cond_type, co.size, co.bodies) == ("IF", 1, [int(body)])
            assert co.cond_handle == int(handle)
            assert len(co.body_nodes[0]) == 1 and isinstance(co.body_nodes[0][0], EmptyInfo)
        assert len(walk(infos)) == (12 if co.error else 13)  # the body's node only when the body is readable
        # dependencies against the driver's own per-node query
        for info in infos:
            r = driver.cuGraphNodeGetDependencies(info.handle, 0)
            assert r[0] == driver.CUresult.CUDA_SUCCESS
            n = int(r[-1])
            got = driver.cuGraphNodeGetDependencies(info.handle, n) if n else (r[0], [])
            assert sorted(int(d) for d in (got[1] or [])[:n]) == sorted(info.dependencies)
        # DOT labels every type
        text = to_dot(g)
        # an unreadable conditional (driver 580) is labelled with the reason, and its body is not drawn
        cond_words = ("conditional", "cuGraphNodeGetParams") if co.error else ("conditional IF",)
        for word in (
            "kernel relu",
            "memcpy DtoD",
            "memset",
            "host",
            "event_record",
            "event_wait",
            "empty",
            "child graph",
            "mem_alloc",
            "mem_free",
            *cond_words,
            "cluster_",
        ):
            assert word in text, word
        assert len(re.findall(r"^\s*n[0-9a-f]+ \[label=", text, re.M)) == (12 if co.error else 13)
    finally:
        call(driver.cuGraphDestroy, g)  # before the event its nodes name
        ev.close()
