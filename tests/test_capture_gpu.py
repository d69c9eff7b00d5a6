"""Capture, node map, static-address replay and exec-update replay: all paths equal to the bit."""

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input, rel_err

from rawgraph import (
    Capture,
    CaptureMode,
    CaptureRefusedError,
    DeviceBuffer,
    DTypeError,
    ExecUpdateManager,
    ShapeError,
    StaticGraph,
    Stream,
    TinyBlock,
    capture_plan,
)
from rawgraph.graphs.graph import read_node_args
from rawgraph.runtime.errors import check

pytestmark = pytest.mark.gpu

SIZES = [(128, 1, 1), (128, 1, 8), (33, 3, 64), (1000, 17, 8), (256, 8, 1), (1, 1, 8), (128, 3, 64)]
CASES = [
    (form, *s)
    for s in SIZES
    for form in ("unfused", "fused", "block")
    if form != "block" or (s[0] % 4 == 0 and s[0] <= 256)
]


@pytest.mark.parametrize("form,width,batch,layers", CASES)
def test_all_paths_equal_to_the_bit(stream, rng, form, width, batch, layers):
    model = TinyBlock(width, batch, layers, seed=int(rng.integers(1 << 30)), form=form)
    shape = (batch, width)
    xh = random_input(rng, shape)
    x = DeviceBuffer.from_numpy(xh)
    # eager
    eager_out = DeviceBuffer(shape)
    eager_out.poison(stream)
    model.forward(x, eager_out, stream)
    eager = eager_out.to_numpy()
    assert rel_err(eager, model.reference(xh)) < 1e-5
    # graph replay of the plan on x itself
    g_out = DeviceBuffer(shape)
    graph = capture_plan(model.plan(x, g_out), stream)
    exe = graph.instantiate()
    g_out.poison(stream)
    exe.launch(stream)
    np.testing.assert_array_equal(g_out.to_numpy(), eager)
    # static-address copy + replay
    static = StaticGraph(model, stream)
    static.static_output.poison(stream)
    static(x, stream)
    np.testing.assert_array_equal(static.static_output.to_numpy(), eager)
    # exec-update: graph captured on other buffers, re-bound to x and a fresh output
    other_in = DeviceBuffer.from_numpy(random_input(rng, shape))
    other_out = DeviceBuffer(shape)
    graph2 = capture_plan(model.plan(other_in, other_out), stream)
    exe2 = graph2.instantiate()
    mgr = ExecUpdateManager(graph2, exe2)
    u_out = DeviceBuffer(shape)
    u_out.poison(stream)
    mgr.bind_many({"x": x, "out": u_out})
    mgr.launch(stream)
    np.testing.assert_array_equal(u_out.to_numpy(), eager)


@pytest.mark.parametrize("form", ["unfused", "fused", "block"])
def test_node_map_matches_the_driver(stream, form):
    model = TinyBlock(64, 2, 3, form=form)
    x, out = DeviceBuffer((2, 64)), DeviceBuffer((2, 64))
    x.poison(stream)
    plan = model.plan(x, out)
    graph = capture_plan(plan, stream)
    assert len(plan) == 3 * model.kernels_per_layer
    assert [n.launch for n in graph.nodes] == plan.launches
    # What the driver holds, asked of the driver: one kernel node per launch, and the recorded
    # handles are exactly its nodes.
    held = graph.all_nodes()
    assert all(check(driver.cuGraphNodeGetType(h)) == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL for h in held)
    assert sorted(int(h) for h in held) == sorted(int(n.handle) for n in graph.nodes)
    graph.verify_node_map()  # type, function, grid, block and argument values, per node
    # The nodes reading x are the first layer's, and they hold x's address.
    readers = {(i, a) for i, a, _ in plan.uses_of("x")}
    assert readers == {"unfused": {(0, "x"), (3, "b")}, "fused": {(0, "x"), (1, "r")}, "block": {(0, "x")}}[form]
    for i, arg in readers:
        assert read_node_args(graph.nodes[i].handle, graph.nodes[i].launch)[arg] == x.ptr
    writer = graph.nodes[-1]
    assert read_node_args(writer.handle, writer.launch)["y"] == out.ptr
    # The driver's edges are the chain in capture order, nothing else.
    chain = [(int(a.handle), int(b.handle)) for a, b in zip(graph.nodes, graph.nodes[1:])]
    assert sorted(graph.edges()) == sorted(chain)


@pytest.mark.parametrize("mode", list(CaptureMode))
def test_every_capture_mode_works(stream, rng, mode):
    model = TinyBlock(128, 1, 2)
    xh = random_input(rng, (1, 128))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((1, 128))
    graph = capture_plan(model.plan(x, out), stream, mode=mode)
    exe = graph.instantiate()
    out.poison(stream)
    exe.launch(stream)
    assert rel_err(out.to_numpy(), model.reference(xh)) < 1e-5


def test_legacy_stream_is_refused_before_the_driver():
    with pytest.raises(CaptureRefusedError, match="legacy"):
        Capture(Stream.legacy())


def test_instantiate_flags_upload_and_other_streams(stream, rng):
    model = TinyBlock(128, 4, 2, form="fused")
    xh = random_input(rng, (4, 128))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((4, 128))
    graph = capture_plan(model.plan(x, out), stream)
    flags = driver.CUgraphInstantiate_flags
    # UPLOAD needs an upload stream (cuGraphInstantiateWithParams): refused before the driver.
    with pytest.raises(ValueError, match="upload"):
        graph.instantiate(int(flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD))
    flag = int(flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
    exe = graph.instantiate(flag)
    assert exe.driver_flags() == flag and graph.instantiate().driver_flags() == 0  # read back from the driver
    ref = model.reference(xh)
    with Stream() as other, Stream(non_blocking=False) as blocking:
        for s in (other, blocking, stream):
            out.poison(s)
            exe.upload(s)
            exe.launch(s)
            s.synchronize()
            assert rel_err(out.to_numpy(), ref) < 1e-5


def test_static_graph_keeps_addresses_and_refuses_other_shapes(stream, rng):
    model = TinyBlock(128, 2, 1)
    static = StaticGraph(model, stream)
    ptrs = (static.static_input.ptr, static.static_output.ptr)
    for _ in range(3):
        xh = random_input(rng, (2, 128))
        static.static_output.poison(stream)
        static(DeviceBuffer.from_numpy(xh), stream)
        assert rel_err(static.static_output.to_numpy(), model.reference(xh)) < 1e-5
    node = static.graph.nodes[0]
    assert read_node_args(node.handle, node.launch)["x"] == ptrs[0]
    assert (static.static_input.ptr, static.static_output.ptr) == ptrs
    before = static.static_input.to_numpy()
    with pytest.raises(ShapeError, match="bucket"):
        static.copy_in(DeviceBuffer((3, 128)), stream)
    with pytest.raises(DTypeError):
        static.copy_in(DeviceBuffer((2, 128), np.float64), stream)
    np.testing.assert_array_equal(static.static_input.to_numpy(), before)
