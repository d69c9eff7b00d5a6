"""Whole-graph update (cuGraphExecUpdate): same topology succeeds, a changed one is reported."""

import numpy as np
import pytest
from helpers import random_input, rel_err

from rawgraph import DeviceBuffer, ExecUpdateManager, GraphUpdateError, TinyBlock, capture_plan, get_device

pytestmark = pytest.mark.gpu


def test_same_topology_new_buffers(stream, rng):
    model = TinyBlock(128, 2, 3, form="fused")
    x1, o1 = DeviceBuffer.from_numpy(random_input(rng, (2, 128))), DeviceBuffer((2, 128))
    xh2 = random_input(rng, (2, 128))
    x2, o2 = DeviceBuffer.from_numpy(xh2), DeviceBuffer((2, 128))
    g1 = capture_plan(model.plan(x1, o1), stream)
    exe = g1.instantiate()
    mgr = ExecUpdateManager(g1, exe)
    g2 = capture_plan(model.plan(x2, o2), stream)
    exe.update(g2)
    mgr.follow_update(g2)
    o2.poison(stream)
    exe.launch(stream)
    assert rel_err(o2.to_numpy(), model.reference(xh2)) < 1e-5
    # The manager's shadows follow the update: binding x2 again changes nothing.
    assert mgr.bind("x", x2) == 0
    # ... and binding x1 re-points the same exec node handles.
    assert mgr.bind("x", x1) == 2


def test_topology_change_is_reported_and_the_exec_keeps_working(stream, rng):
    model1, model2 = TinyBlock(64, 1, 1), TinyBlock(64, 1, 2)
    xh = random_input(rng, (1, 64))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((1, 64))
    exe = capture_plan(model1.plan(x, out), stream).instantiate()
    g2 = capture_plan(model2.plan(x, out), stream)
    with pytest.raises(GraphUpdateError) as info:
        exe.update(g2)
    assert info.value.result == "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED"
    assert "TOPOLOGY_CHANGED" in str(info.value) and "re-instantiate" in str(info.value)
    out.poison(stream)
    exe.launch(stream)
    assert rel_err(out.to_numpy(), model1.reference(xh)) < 1e-5
    # The fall-back: instantiate the new graph.
    out.poison(stream)
    g2.instantiate().launch(stream)
    assert rel_err(out.to_numpy(), model2.reference(xh)) < 1e-5


def test_kernels_may_change_at_the_same_topology(stream, rng):
    # Two kernel nodes either way, other functions in each: relu then add (out = relu(x) + x),
    # or add then relu (out = relu(x + x)). The driver (CUDA 13.0) accepts the function change
    # in place; the exec then computes the new graph.
    from rawgraph import Capture, ops

    dev = get_device()
    xh = random_input(rng, (1000,))
    bufs = {"x": DeviceBuffer.from_numpy(xh), "h": DeviceBuffer(1000), "out": DeviceBuffer(1000)}
    views = {k: v.view() for k, v in bufs.items()}
    graphs = []
    for steps in (
        [ops.relu(dev, views, "x", "h"), ops.add(dev, views, "h", "x", "out")],
        [ops.add(dev, views, "x", "x", "h"), ops.relu(dev, views, "h", "out")],
    ):
        with Capture(stream) as cap:
            for launch in steps:
                cap.launch(launch)
        graphs.append(cap.graph)
    exe = graphs[0].instantiate()
    exe.update(graphs[1])
    bufs["out"].poison(stream)
    exe.launch(stream)
    np.testing.assert_array_equal(bufs["out"].to_numpy(), np.maximum(xh + xh, 0))


def test_update_error_names_the_failing_node(stream, rng):
    # A one-kernel exec updated from a graph whose one node is a memset: the driver refuses the
    # node type change and names the new graph's node.
    from cuda.bindings import driver

    from rawgraph import Capture, Graph, ops
    from rawgraph.runtime.errors import check

    dev = get_device()
    with Capture(stream) as cap:
        cap.launch(ops.empty(dev))
    exe = cap.graph.instantiate()
    buf = DeviceBuffer(256)
    handle = check(driver.cuGraphCreate(0))
    p = driver.CUDA_MEMSET_NODE_PARAMS()
    p.dst, p.value, p.elementSize, p.width, p.height, p.pitch = buf.ptr, 0, 4, 256, 1, 0
    memset = check(driver.cuGraphAddMemsetNode(handle, None, 0, p, dev.context))
    other = Graph(handle, [], dev)
    with pytest.raises(GraphUpdateError) as info:
        exe.update(other)
    assert info.value.result == "CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED"
    assert info.value.error_node == int(memset) != 0
    assert f"0x{int(memset):x}" in str(info.value)
    exe.launch(stream)  # the exec is unchanged and still runs
    stream.synchronize()
