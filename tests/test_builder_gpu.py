"""Explicit graph construction (rawgraph.graphs.builder): the same graph as capture, every node kind, clone rules;
and the builder's error, lifetime and edge cases: bad input and clones refused before the driver, host
callbacks' exceptions kept, a host callback held past its builder, graph and exec while a replay that
calls it is queued, built kernel nodes recording their dependencies (``verify_edges`` passes on
built graphs and plans and catches an edge added behind the builder's back), and graph memory nodes
built under ``PYTHONMALLOC=debug``. The hazards that may crash the process (the driver calling freed
memory) run in a child process (``helpers.child_report``)."""

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import child_report, random_input, rel_err, spin_ns

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
from rawgraph.graphs.builder import GraphBuilder, HostCallback, build_plan, edge_data, edge_list
from rawgraph.graphs.graph import read_node_args
from rawgraph.runtime.errors import call

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(300_000_000)  # what the replays wait behind: long against the Python between launch and collection


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


# -- a host callback outlives its exec while a replay is queued -------------------------------------
HOST_NODE_CHILD = """
import gc, json, sys, weakref
from rawgraph import Stream, get_device, ops
from rawgraph.graphs import builder
from rawgraph.graphs.builder import GraphBuilder, HostCallback

token, spin_ns = int(sys.argv[1]), int(sys.argv[2])
dev = get_device()
s = Stream()
ops.spin(dev, 0)(s)
s.synchronize()  # the spin kernel is loaded now, not behind the timing below
hits = []
g = GraphBuilder(dev)
k = g.kernel(ops.spin(dev, spin_ns))
g.host(lambda: hits.append(token), deps=k)  # the host node runs behind the slow kernel
graph = g.build()
exe = graph.instantiate()
ref = weakref.ref([o for o in graph.keep if isinstance(o, HostCallback)][0])
exe.launch(s)
queued = not s.query()
exe.close()
graph.close()
g.close()
del exe, graph, g, k
gc.collect()
held = ref() is not None
# Fresh thunks of the same type: a freed thunk's memory would be reused by one of them, and a
# replay calling it would record -1 (or crash) instead of the token.
decoys = [HostCallback(lambda: hits.append(-1)) for _ in range(64)]
s.synchronize()
builder.collect_held()
print(json.dumps({"queued": queued, "held": held, "hits": hits, "released": ref() is None}))
"""


def test_a_host_callback_outlives_builder_graph_and_exec_destroyed_with_a_replay_queued(rng):
    token = int(rng.integers(1, 1 << 40))
    got = child_report(HOST_NODE_CHILD, token, SPIN_NS)
    assert got["queued"], "the replay was meant to be still queued behind the spin kernel"
    assert got["held"], "the callback was released while a queued replay could still call it"
    assert got["hits"] == [token], f"the queued replay called {got['hits']}, not the callback"
    assert got["released"], "the callback was not let go once the replay had run"


# -- built kernel nodes record their dependencies ----------------------------------------------------
def test_verify_edges_passes_on_a_built_graph_and_catches_an_edge_behind_its_back(device, stream, rng):
    n = 3000
    xh = random_input(rng, (n,))
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    y1, y2, y3 = DeviceBuffer((n,)), DeviceBuffer((n,)), DeviceBuffer((n,))
    c = [(float(rng.uniform(0.5, 1.5)), float(rng.uniform(-1, 1))) for _ in range(5)]
    g = GraphBuilder(device)
    root = g.empty()
    k1 = g.kernel(cn.axpb(device, x, y1, *c[0]), deps=root)
    k2 = g.kernel(cn.axpb(device, x, y2, *c[1]), deps=root)
    k3 = g.kernel(cn.axpb(device, y1, y1, *c[2]), deps=k1)
    k4 = g.kernel(cn.axpb(device, y2, y3, *c[3]))  # a root for now: its edge is added below
    g.depend(k2, k4)
    k5 = g.kernel(cn.axpb(device, y3, y3, *c[4]), deps=g.empty(deps=[k3, k4]))
    graph = g.build()
    assert [kn.deps for kn in graph.nodes] == [
        (int(root.handle),),
        (int(root.handle),),
        (int(k1.handle),),
        (int(k2.handle),),
        (int(graph.built_nodes[-2].handle),),
    ]
    graph.verify_edges()
    graph.clone().verify_edges()  # the copy's node map names the copy's nodes
    for b in (y1, y2, y3):
        b.poison(stream)
    graph.instantiate().launch(stream)
    ref1 = (xh.astype(np.float64) * c[0][0] + c[0][1]) * c[2][0] + c[2][1]
    ref3 = ((xh.astype(np.float64) * c[1][0] + c[1][1]) * c[3][0] + c[3][1]) * c[4][0] + c[4][1]
    assert rel_err(y1.to_numpy(stream), ref1) < 1e-6 and rel_err(y3.to_numpy(stream), ref3) < 1e-6
    # An edge the builder did not add is caught, naming the node.
    call(driver.cuGraphAddDependencies, graph.handle, [k1.handle], [k5.handle], [edge_data("default")], 1)
    with pytest.raises(RawgraphError, match=r"node 4 "):
        graph.verify_edges()


@pytest.mark.parametrize("form", ["unfused", "fused"])
def test_verify_edges_passes_on_a_built_plan_with_programmatic_edges(stream, rng, form):
    model = TinyBlock(128, 2, 3, seed=int(rng.integers(1 << 30)), form=form)
    x, out = DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream), DeviceBuffer((2, 128))
    plan = model.plan(x, out)
    built = build_plan(plan)
    built.verify_edges()
    assert [kn.deps for kn in built.nodes[1:]] == [(int(prev.handle),) for prev in built.nodes[:-1]]
    assert built.nodes[0].deps == ()
    kinds = {k for _a, _b, k in built.edge_types()}
    assert kinds == ({"programmatic"} if model.pdl else {"default"})
    capture_plan(plan, stream).verify_edges()  # the same check a captured graph passes


# -- graph memory nodes under PYTHONMALLOC=debug -----------------------------------------------------
DEBUG_MALLOC_CHILD = """
import json, sys
import numpy as np
from rawgraph import DeviceArray, DeviceBuffer, Stream, get_device
from rawgraph.graphs.builder import GraphBuilder
from rawgraph.graphs import conditional as cn

dev = get_device()
s = Stream()
n = 4096
src_h = np.random.default_rng(int(sys.argv[1])).standard_normal(n, dtype=np.float32)
src, back = DeviceBuffer.from_numpy(src_h, stream=s), DeviceBuffer((n,))
g = GraphBuilder(dev)
alloc, tmp = g.mem_alloc(n * 4)
cp = g.memcpy(tmp, src, n * 4, deps=alloc)  # cuGraphAddMemcpyNode on the graph memory's address
view = DeviceArray(tmp, (n,), np.dtype(np.float32), None)
k = g.kernel(cn.axpb(dev, view, back, 2.0, 0.0), deps=cp)
g.mem_free(tmp, deps=k)  # cuGraphAddMemFreeNode on the same address
exe = g.build().instantiate()
back.poison(s)
exe.launch(s)
got = back.to_numpy(s)
print(json.dumps({"address": tmp, "exact": bool(np.array_equal(got, src_h * np.float32(2)))}))
"""


def test_graph_memory_nodes_build_and_run_under_the_debug_allocator(rng):
    got = child_report(DEBUG_MALLOC_CHILD, int(rng.integers(1 << 30)), debug_malloc=True)
    assert got["address"] != 0xDDDDDDDDDDDDDDDD and got["address"] > 0
    assert got["exact"], "2 * src through graph memory differs from NumPy"
