"""Rebinding by address (rawgraph.updates.rebind) on rawgraph's own graphs, hand-built memory nodes and a
CuPy-captured graph: every random rebind checked against a fresh eager run, and the refusals."""

import gc
import weakref

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import device_inputs, eager_output, random_input, referrers, rel_err, spin_ns, tiny_model

from rawgraph import AddressRebinder, ClosedError, DeviceBuffer, RebindError, TinyBlock, capture_plan, get_device, ops
from rawgraph.runtime.errors import call
from rawgraph.updates.rebind import AddressRebinder, LayoutMismatchError, RebindError

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(200_000_000)  # 200 ms queued in front: long against the Python that follows a launch
REBINDS = 1000


@pytest.mark.parametrize("form", ["unfused", "fused"])
def test_random_rebinds_of_our_graph_match_eager(stream, rng, form):
    batch, width = 2, 64
    model = TinyBlock(width, batch, 1, seed=int(rng.integers(1 << 30)), form=form)
    xs = [DeviceBuffer((batch, width)) for _ in range(3)]
    outs = [DeviceBuffer((batch, width)) for _ in range(3)]
    ref = DeviceBuffer((batch, width))
    for x in xs:
        x.copy_from_host(random_input(rng, (batch, width)), stream)
    graph = capture_plan(model.plan(xs[0], outs[0]), stream)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    found = reb.find(xs[0])
    assert {m.kind for m in found} == {"kernel"} and all(m.confirmed and m.offset == 0 for m in found)
    assert len(found) == 2  # the first matmul reads x, the residual (add / matmul_add) reads it again
    cur_x, cur_o = 0, 0
    host0 = None
    for it in range(REBINDS):
        i, j = int(rng.integers(3)), int(rng.integers(3))
        xh = random_input(rng, (batch, width))
        xs[i].copy_from_host(xh, stream)
        outs[j].poison(stream)
        ref.poison(stream)
        if i != cur_x:
            reb.move(xs[cur_x], xs[i])
            cur_x = i
        if j != cur_o:
            reb.move(outs[cur_o], outs[j])
            cur_o = j
        reb.launch(stream)
        model.forward(xs[i], ref, stream)
        got, want = outs[j].to_numpy(stream), ref.to_numpy(stream)
        assert np.array_equal(got, want), f"rebind {it}: x{i} out{j}, seed {rng.seed_used}"
        if host0 is None:
            host0 = (xh, got)
    assert rel_err(host0[1], model.reference(host0[0])) < 1e-4
    # every push was a real change: at most 2 kernel nodes per moved range
    assert reb.pushes <= 4 * REBINDS
    exe.close()
    graph.close()


def test_prepared_bindings_are_absolute(stream, rng):
    batch, width = 2, 64
    model = TinyBlock(width, batch, 1, seed=int(rng.integers(1 << 30)), form="unfused")
    x0, x1, o0, o1, ref = (DeviceBuffer((batch, width)) for _ in range(5))
    graph = capture_plan(model.plan(x0, o0), stream)
    reb = AddressRebinder(graph, graph.instantiate())
    pairs = [reb.prepare({x0: x0, o0: o0}), reb.prepare({x0: x1, o0: o1})]
    for it in range(50):
        k = int(rng.integers(2))
        x, o = (x0, o0) if k == 0 else (x1, o1)
        x.copy_from_host(random_input(rng, (batch, width)), stream)
        o.poison(stream)
        reb.apply(pairs[k])
        reb.launch(stream)
        model.forward(x, ref, stream)
        assert np.array_equal(o.to_numpy(stream), ref.to_numpy(stream)), f"step {it}, seed {rng.seed_used}"
    # an incremental rebind then an absolute binding: the binding wins
    reb.apply(pairs[1])
    reb.move(o1, o0)
    reb.apply(pairs[1])
    assert {m.value for m in reb.find(o1)} == {o1.ptr}
    assert not reb.find(o0, warn=False)
    reb.exec.close()
    graph.close()


def test_refusals(stream, rng):
    batch, width = 2, 64
    model = TinyBlock(width, batch, 1, form="unfused")
    x, out = DeviceBuffer((batch, width)), DeviceBuffer((batch, width))
    stray, small, big = DeviceBuffer((batch, width)), DeviceBuffer((1, width)), DeviceBuffer((4, width))
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    with pytest.raises(RebindError, match="nothing to rebind"):
        reb.move(stray, big)
    with pytest.raises(RebindError, match="holds .* bytes"):
        reb.move(x, small)
    with pytest.raises(RebindError, match="past the end of its allocation"):
        reb.move((x.ptr, x.nbytes + (4 << 20)), (big.ptr, x.nbytes + (4 << 20)))
    with pytest.raises(RebindError, match="past the end of its allocation"):
        reb.move(x, (small.ptr + small.nbytes - 8, x.nbytes))
    # a pointer to x kept in device memory (a "workspace"): parameter edits cannot move it
    table = DeviceBuffer((4,), np.uint64)
    table.copy_from_host(np.array([0, x.ptr + 64, 0, 0], dtype=np.uint64), stream)
    with pytest.raises(RebindError, match="device buffer 0 holds a pointer"):
        reb.move(x, big, device_buffers=[table])
    assert reb.pushes == 0  # nothing was pushed by a refused rebind
    # a parameter layout that differs from what the caller expects
    sym = model.plan(x, out).launches[1].kernel.symbol  # relu(x, y, n)
    with pytest.raises(LayoutMismatchError, match="relu"):
        AddressRebinder(graph, exe, expect_layouts={sym: [(0, 8), (8, 8), (16, 4)]})
    AddressRebinder(graph, exe, expect_layouts={sym: [(0, 8), (8, 8), (16, 8)]})  # the right one passes
    exe.close()
    graph.close()


def test_memcpy_and_memset_nodes_rebind(stream, rng, device):
    ctx = device.context
    n = 256
    a, b, a2, b2 = (DeviceBuffer((n,), np.uint32) for _ in range(4))
    value = int(rng.integers(1, 1 << 31))
    g = call(driver.cuGraphCreate, 0)
    sp = driver.CUDA_MEMSET_NODE_PARAMS()
    sp.dst, sp.value, sp.elementSize, sp.width, sp.height, sp.pitch = a.ptr, value, 4, n, 1, 4 * n
    ms = call(driver.cuGraphAddMemsetNode, g, None, 0, sp, ctx)
    mp = driver.CUDA_MEMCPY3D()
    mp.srcMemoryType = mp.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    mp.srcDevice, mp.dstDevice = a.ptr, b.ptr
    mp.WidthInBytes, mp.Height, mp.Depth = 4 * n, 1, 1
    mp.srcPitch = mp.dstPitch = 4 * n
    mp.srcHeight = mp.dstHeight = 1
    call(driver.cuGraphAddMemcpyNode, g, [ms], 1, mp, ctx)
    exe = call(driver.cuGraphInstantiate, g, 0)
    try:
        reb = AddressRebinder(g, exe, device=device)
        kinds = sorted(m.kind for m in reb.find(a))
        assert kinds == ["memcpy.src", "memset"]
        reb.move(a, a2)
        reb.move(b, b2)
        for buf in (a, b, a2, b2):
            buf.poison(stream)
        reb.launch(stream)
        want = np.full(n, value, dtype=np.uint32)
        assert np.array_equal(a2.to_numpy(stream), want) and np.array_equal(b2.to_numpy(stream), want)
        poison = np.full(n, 0x7FC0DEAD, dtype=np.uint32)
        assert np.array_equal(a.to_numpy(stream), poison) and np.array_equal(b.to_numpy(stream), poison)
        assert reb.pushes == 3  # memset + memcpy (a moved), memcpy again (b moved)
    finally:
        call(driver.cuGraphExecDestroy, exe)
        call(driver.cuGraphDestroy, g)


CUPY_SRC = r"""
extern "C" __global__ void fma_relu(const float* x, const float* w, float* y, long long n, float s) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i] * w[i]; y[i] = (v > 0.f ? v : 0.f) * s + x[i]; }
}
"""


def test_cupy_graph_random_rebinds(stream, rng):
    cp = pytest.importorskip("cupy")
    from rawgraph.updates.adopt import from_cupy

    n, s = 4096, np.float32(rng.uniform(0.5, 2.0))
    k = cp.RawKernel(CUPY_SRC, "fma_relu")
    w = cp.asarray(random_input(rng, n))
    xs = [cp.asarray(random_input(rng, n)) for _ in range(3)]
    outs = [cp.empty(n, dtype=cp.float32) for _ in range(3)]
    ref = cp.empty(n, dtype=cp.float32)
    grid, block = ((n + 255) // 256,), (256,)
    cs = cp.cuda.Stream(non_blocking=True)
    with cs:
        k(grid, block, (xs[0], w, outs[0], np.int64(n), s))  # loaded before capture
        cs.synchronize()
        cs.begin_capture()
        k(grid, block, (xs[0], w, outs[0], np.int64(n), s))
        cg = cs.end_capture()
    adopted = from_cupy(cg)
    reb = adopted.rebinder()
    (info,) = [i for i in reb.nodes if i.kind == "kernel"]
    assert [(p.offset, p.size) for p in info.layout] == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 4)]
    assert info.name == "fma_relu"
    cur_x = cur_o = 0
    for it in range(REBINDS):
        i, j = int(rng.integers(3)), int(rng.integers(3))
        xs[i][...] = cp.asarray(random_input(rng, n))
        outs[j].fill(cp.nan)
        if i != cur_x:
            reb.move(xs[cur_x], xs[i])
            cur_x = i
        if j != cur_o:
            reb.move(outs[cur_o], outs[j])
            cur_o = j
        cp.cuda.Device().synchronize()
        reb.launch(stream)
        stream.synchronize()
        k(grid, block, (xs[i], w, ref, np.int64(n), s))
        cp.cuda.Device().synchronize()
        assert bool(cp.array_equal(outs[j], ref)), f"rebind {it}: x{i} out{j}, seed {rng.seed_used}"
    xh, wh = cp.asnumpy(xs[cur_x]).astype(np.float64), cp.asnumpy(w).astype(np.float64)
    assert rel_err(cp.asnumpy(outs[cur_o]), np.maximum(xh * wh, 0) * float(s) + xh) < 1e-6
    reb.exec.close()
    adopted.close()
    assert adopted.owner is None  # released our reference; CuPy still owns (and destroys) the graph
    del cg


def test_parameters_are_copied_and_exec_updates_leave_the_graph_alone(stream, rng, device):
    from rawgraph import ops
    from rawgraph.graphs.nodes import read_graph
    from rawgraph.runtime.launch import LaunchPlan

    n = 1024
    a = DeviceBuffer.from_numpy(random_input(rng, n))
    b, b2, c = DeviceBuffer((n,)), DeviceBuffer((n,)), DeviceBuffer((n,))
    bufs = {"a": a.view(), "b": b.view()}
    launch = ops.relu(device, bufs, "a", "b")
    graph = capture_plan(LaunchPlan([launch], bufs, ("a",), ("b",)), stream)
    launch.args["y"] = c.ptr  # edited after capture: the node keeps the copy made at capture
    (info,) = read_graph(graph)
    assert int.from_bytes(info.param_bytes(1), "little") == b.ptr
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    reb.move(b, b2)
    for buf in (b, b2, c):
        buf.poison(stream)
    reb.launch(stream)
    assert np.array_equal(b2.to_numpy(stream), np.maximum(a.to_numpy(stream), 0))
    assert np.isnan(b.to_numpy(stream)).all() and np.isnan(c.to_numpy(stream)).all()
    # the graph's node still holds b: cuGraphExecKernelNodeSetParams changed only the exec, and the
    # exec has no getter, so the rebinder's own copy is the only record of what it holds
    (after,) = read_graph(graph)
    assert int.from_bytes(after.param_bytes(1), "little") == b.ptr
    assert int.from_bytes(reb.held(info.id)[8:16], "little") == b2.ptr
    exe.close()
    graph.close()


@pytest.mark.parametrize("closed", ["exec", "graph", "rebinder"])
def test_the_rebinder_refuses_a_closed_exec_or_graph_before_the_driver(stream, rng, count_setparams, closed):
    model = tiny_model(rng)
    _, (x, x2) = device_inputs(rng, model, 2, stream)
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    binding = reb.prepare({x: x2})
    {"exec": exe, "graph": graph, "rebinder": reb}[closed].close()
    before = len(count_setparams)
    for op in (
        lambda: reb.apply(binding),
        lambda: reb.move(x, x2),
        lambda: reb.prepare({x: x2}),
        lambda: reb.launch(stream),
        lambda: reb.find(x),
    ):
        with pytest.raises(ClosedError, match="closed"):
            op()
    assert len(count_setparams) == before, "a driver update reached a closed exec"
    reb.close()
    reb.close()  # safe twice
    exe.close()
    graph.close()


def test_the_rebinder_holds_a_moved_in_buffer_until_the_replays_that_read_it_have_run(stream, rng):
    model = tiny_model(rng)
    hosts, (x, a_copy, b_copy) = device_inputs(rng, model, 3, stream)
    want_a, want_b = eager_output(model, a_copy, stream), eager_output(model, b_copy, stream)
    # a and b are known to the rebinder only (the eager runs above used copies)
    a, b = (DeviceBuffer.from_numpy(h, stream=stream) for h in hosts[1:])
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    ref_a, ref_b = weakref.ref(a), weakref.ref(b)
    # rebind(): the exec points into a, so the rebinder holds it
    reb.move(x, a)
    del a
    gc.collect()
    assert ref_a() is not None, "the rebinder let go of a buffer the exec points into"
    out.poison(stream)
    ops.spin(get_device(), SPIN_NS)(stream)
    reb.launch(stream)
    reb.move(ref_a(), x)  # moved away while the replay that reads it is queued
    gc.collect()
    assert not stream.query() and ref_a() is not None, "a buffer a queued replay reads was let go"
    np.testing.assert_array_equal(out.to_numpy(stream), want_a)
    assert rel_err(out.to_numpy(stream), model.reference(hosts[1])) < 1e-5, f"seed {rng.seed_used}"
    reb.collect()  # covers the retired buffer with a fence behind the replay
    stream.synchronize()
    assert reb.collect() == 0
    gc.collect()
    assert ref_a() is None, f"the buffer stayed held after its replays ran: {referrers(ref_a())}"
    # prepare()/apply(): the binding holds b, then the rebinder while it is applied
    binding = reb.prepare({x: b})
    del b
    gc.collect()
    assert ref_b() is not None
    reb.apply(binding)
    del binding
    gc.collect()
    assert ref_b() is not None, "the rebinder let go of an applied binding's buffer"
    out.poison(stream)
    ops.spin(get_device(), SPIN_NS)(stream)
    reb.launch(stream)
    reb.apply(reb.prepare({}))  # back to x while the replay reading b is queued
    gc.collect()
    assert not stream.query() and ref_b() is not None
    np.testing.assert_array_equal(out.to_numpy(stream), want_b)
    reb.close()
    gc.collect()
    assert reb.retained == []
    assert ref_b() is None, f"held after close: {referrers(ref_b())}"
    exe.close()
    graph.close()


def test_an_adopted_graphs_rebinder_owns_its_exec(stream, rng):
    from rawgraph import adopt

    model = tiny_model(rng)
    _, (x,) = device_inputs(rng, model, 1, stream)
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(x, out), stream)
    with adopt(graph.handle, owner=graph) as adopted:
        reb = adopted.rebinder()
        exe = reb.exec
        reb.close()
        assert exe.closed
    graph.close()


def test_prepare_refuses_a_range_a_child_graph_reads(device, stream, rng):
    model = tiny_model(rng)
    hosts, (x, x2) = device_inputs(rng, model, 2, stream)
    out, out_child, out2 = (DeviceBuffer((model.batch, model.width)) for _ in range(3))
    graph = capture_plan(model.plan(x, out), stream)
    child = capture_plan(model.plan(x, out_child), stream)  # the child reads x too
    # after the parent's last kernel: both use the model's one workspace
    call(driver.cuGraphAddChildGraphNode, graph.handle, [graph.nodes[-1].handle], 1, child.handle)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    assert any(not m.reachable for m in reb.find(x))
    with pytest.raises(RebindError, match="child graph or conditional body"):
        reb.move(x, x2)
    with pytest.raises(RebindError, match="child graph or conditional body"):
        reb.prepare({x: x2})
    with pytest.raises(RebindError, match="child graph or conditional body"):
        reb.prepare([(out, out2), (x, x2)])
    # what only the top level reads still moves
    reb.apply(reb.prepare({out: out2}))
    for o in (out, out2, out_child):
        o.poison(stream)
    reb.launch(stream)
    want = eager_output(model, x, stream)
    np.testing.assert_array_equal(out2.to_numpy(stream), want)
    np.testing.assert_array_equal(out_child.to_numpy(stream), want)
    assert rel_err(want, model.reference(hosts[0])) < 1e-5, f"seed {rng.seed_used}"
    reb.close()
    exe.close()
    graph.close()
    child.close()
