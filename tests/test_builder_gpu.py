"""Explicit graph construction (rawgraph.graphs.builder): the same graph as capture, every node kind, clone rules."""

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input, rel_err

from rawgraph import (
    DeviceArray,
    DeviceBuffer,
    Event,
    ExecUpdateManager,
    HostBuffer,
    RawgraphError,
    TinyBlock,
    capture_plan,
)
from rawgraph.graphs import conditional as cn
from rawgraph.graphs.builder import GraphBuilder, HostCallback, build_plan, edge_list
from rawgraph.graphs.graph import read_node_args

pytestmark = pytest.mark.gpu


def _kernel_params(node):
    p = driver.cuGraphKernelNodeGetParams(node.handle)[1]
    # The driver may report func 0 for a captured node (verify_node_map allows it); else it is the launch's.
    assert int(p.func) in (0, int(node.launch.kernel.handle))
    return (
        (p.gridDimX, p.gridDimY, p.gridDimZ),
        (p.blockDimX, p.blockDimY, p.blockDimZ),
        int(p.sharedMemBytes),
        read_node_args(node.handle, node.launch),
    )


def _indexed_edges(graph):
    index = {int(n.handle): n.index for n in graph.nodes}
    return sorted((index[int(a)], index[int(b)], data) for a, b, data in edge_list(graph.handle))


@pytest.mark.parametrize("form", ["unfused", "fused", "block"])
def test_built_tinyblock_is_the_captured_graph(stream, rng, form):
    model = TinyBlock(128, 2, 3, seed=int(rng.integers(1 << 30)), form=form)
    xh = random_input(rng, (2, 128))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((2, 128))
    plan = model.plan(x, out)
    captured = capture_plan(plan, stream)
    built = build_plan(plan)
    assert built.node_count() == captured.node_count() == len(plan)
    assert len(built.nodes) == len(captured.nodes) == len(plan)
    built.verify_node_map()
    captured.verify_node_map()
    # Same kernel parameters node by node: function, grid, block, smem, argument values.
    for b, c in zip(built.nodes, captured.nodes):
        assert _kernel_params(b) == _kernel_params(c), f"node {b.index} ({b.launch.label})"
        assert b.captured_args == c.captured_args
    # Same edges, with their type and ports (PDL capture makes programmatic edges).
    ce, be = _indexed_edges(captured), _indexed_edges(built)
    assert be == ce, f"built {be} captured {ce}"
    assert [k for _, _, k in built.edge_types()] == [k for _, _, k in captured.edge_types()]
    assert [k for _, _, k in built.edge_types()] == ["programmatic" if model.pdl else "default"] * (len(plan) - 1)
    # Replays give the same bits.
    results = []
    for g in (captured, built):
        exe = g.instantiate()
        out.poison(stream)
        exe.launch(stream)
        results.append(out.to_numpy(stream))
    assert rel_err(results[0], model.reference(xh)) < 1e-5
    np.testing.assert_array_equal(results[1], results[0])


def test_exec_update_manager_rebinds_a_built_graph(stream, rng):
    model = TinyBlock(256, 1, 2, seed=int(rng.integers(1 << 30)), form="fused")
    xs = [random_input(rng, (1, 256)) for _ in range(3)]
    bufs = [DeviceBuffer.from_numpy(v) for v in xs]
    out = DeviceBuffer((1, 256))
    graph = build_plan(model.plan(bufs[0], out))
    mgr = ExecUpdateManager(graph, graph.instantiate())
    for i in (2, 1, 0, 2):
        mgr.bind("x", bufs[i])
        out.poison(stream)
        mgr.launch(stream)
        assert rel_err(out.to_numpy(stream), model.reference(xs[i])) < 1e-5


def test_every_node_kind_runs_in_a_built_graph(device, stream, rng):
    n = 4096
    src_h = random_input(rng, (n,))
    src, dst, back = DeviceBuffer.from_numpy(src_h), DeviceBuffer((n,)), DeviceBuffer((n,))
    pinned = HostBuffer((n,), np.float32)
    fill = float(rng.uniform(1, 2))
    bits = int(np.array([fill], np.float32).view(np.uint32)[0])
    calls = []
    a, b = float(rng.uniform(0.5, 2)), float(rng.uniform(-1, 1))
    # A child graph: dst = dst * a + b.
    child = GraphBuilder(device)
    child.kernel(cn.axpb(device, dst, dst, a, b))
    child_graph = child.build()
    ev = Event(timing=False)
    g = GraphBuilder(device)
    ms = g.memset(dst, bits, n)  # dst = fill
    alloc, tmp = g.mem_alloc(n * 4, deps=ms)
    cp = g.memcpy(tmp, src, n * 4, deps=alloc)  # tmp = src (graph memory)
    ch = g.child(child_graph, deps=ms)  # dst = fill * a + b
    join = g.empty(deps=[cp, ch])
    tmp_view = DeviceArray(tmp, (n,), np.dtype(np.float32), None)
    add = g.kernel(cn.axpb(device, tmp_view, back, 2.0, 0.0), deps=join)  # back = 2 * src
    host = g.host(lambda: calls.append(len(calls)), deps=add)
    rec = g.event_record(ev, deps=host)
    wait = g.event_wait(ev, deps=rec)
    free = g.mem_free(tmp, deps=wait)
    g.memcpy(pinned, back, n * 4, deps=free)  # device -> pinned host
    graph = g.build()
    kinds = [nd.kind for nd in graph.built_nodes]
    assert kinds == [
        "memset",
        "mem_alloc",
        "memcpy",
        "child",
        "empty",
        "kernel",
        "host",
        "event_record",
        "event_wait",
        "mem_free",
        "memcpy",
    ]
    assert graph.node_count() == len(kinds)
    exe = graph.instantiate()
    for replay in range(2):
        for buf in (dst, back):
            buf.poison(stream)
        pinned.array[:] = np.nan
        exe.launch(stream)
        stream.synchronize()
        assert calls == list(range(replay + 1))
        # (the kernel may fuse x * a + b into one FMA: compare with float64, not float32 steps)
        want = np.full(n, float(np.float32(fill)) * float(np.float32(a)) + float(np.float32(b)))
        assert rel_err(dst.to_numpy(stream), want) < 1e-6
        assert rel_err(back.to_numpy(stream), 2.0 * src_h.astype(np.float64)) < 1e-7
        np.testing.assert_array_equal(pinned.array, back.to_numpy(stream))
    cb = [k for k in graph.keep if isinstance(k, HostCallback)]
    assert len(cb) == 1 and cb[0].calls == 2 and not cb[0].errors


def test_node_parameters_are_copied_when_the_node_is_added(device, rng):
    y = DeviceBuffer(64)
    launch = cn.axpb(device, y, y, float(rng.uniform(1, 2)), 0.5)
    g = GraphBuilder(device)
    g.kernel(launch)
    graph = g.build()
    before = read_node_args(graph.nodes[0].handle, launch)
    launch.args["a"] = 7.0
    launch.args["n"] = 3
    assert read_node_args(graph.nodes[0].handle, launch) == before
    assert before["n"] == 64 and before["a"] != 7.0
    graph.verify_node_map()  # against the bytes copied at add time


def test_host_callback_exceptions_are_kept_not_raised(device, stream):
    def boom():
        raise ValueError("host node failure")

    g = GraphBuilder(device)
    g.host(boom)
    graph = g.build()
    exe = graph.instantiate()
    exe.launch(stream)
    stream.synchronize()
    cb = [k for k in graph.keep if isinstance(k, HostCallback)][0]
    assert cb.calls == 1 and "host node failure" in cb.errors[0]


def test_clone_of_a_plain_graph_works_and_keeps_its_node_map(stream, rng):
    model = TinyBlock(128, 1, 2, seed=int(rng.integers(1 << 30)), form="fused")
    xh = random_input(rng, (1, 128))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((1, 128))
    graph = build_plan(model.plan(x, out))
    copy = graph.clone()
    assert int(copy.handle) != int(graph.handle) and copy.node_count() == graph.node_count()
    copy.verify_node_map()
    graph.close()  # the copy is independent of the original
    out.poison(stream)
    copy.instantiate().launch(stream)
    assert rel_err(out.to_numpy(stream), model.reference(xh)) < 1e-5


def _refuses_before_the_driver(monkeypatch, graph, match):
    called = []
    real = driver.cuGraphClone
    monkeypatch.setattr(driver, "cuGraphClone", lambda *a: called.append(a) or real(*a))
    with pytest.raises(RawgraphError, match=match):
        graph.clone()
    assert called == []


def test_clone_refuses_memory_nodes_before_the_driver(device, monkeypatch):
    g = GraphBuilder(device)
    node, ptr = g.mem_alloc(1024)
    g.mem_free(ptr, deps=node)
    _refuses_before_the_driver(monkeypatch, g.build(), "memory allocation node")
    # And the driver does refuse it (the reason we check first).
    g2 = GraphBuilder(device)
    g2.mem_alloc(1024)
    graph2 = g2.build()
    err, _clone = driver.cuGraphClone(graph2.handle)
    assert err != driver.CUresult.CUDA_SUCCESS


def test_clone_and_child_refuse_conditional_graphs_before_the_driver(device, monkeypatch):
    flag = DeviceBuffer(1, np.uint32)
    g = GraphBuilder(device)
    h = cn.make_handle(g)
    k = g.kernel(cn.set_condition(device, h, flag))
    node = cn.add_conditional(g, "if", h, deps=k)
    node.bodies[0].kernel(cn.noop(device))
    graph = g.build()
    _refuses_before_the_driver(monkeypatch, graph, "conditional node")
    parent = GraphBuilder(device)
    with pytest.raises(RawgraphError, match="conditional node"):
        parent.child(graph)
    assert parent.nodes == []


def test_builder_refuses_bad_input_before_the_driver(device):
    g = GraphBuilder(device)
    buf = DeviceBuffer(16)
    a = g.empty()
    with pytest.raises(ValueError, match="twice"):
        g.empty(deps=[a, a])
    with pytest.raises(ValueError, match="overruns"):
        g.memcpy(buf, buf, 65)
    with pytest.raises(ValueError, match="fit"):
        g.memset(buf, 256, 4, element_size=1)
    with pytest.raises(ValueError, match="kernel node"):
        g.empty(deps=[(a, "programmatic")])
    with pytest.raises(TypeError):
        g.host(42)
    graph = g.build()
    with pytest.raises(RawgraphError, match="after build"):
        g.empty()
    assert graph.node_count() == 1
