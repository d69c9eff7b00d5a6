"""Conditional nodes (rawgraph.graphs.conditional): each branch as the device decides, the WHILE depth loop,
the norm early exit, exec updates of conditional graphs; and their error and lifetime cases: the
refusals made before the driver is called, and body captures that run the releases they deferred
(also those collected at the capture's edges) after the body capture, never inside it."""

import gc
import warnings

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import collect_at, cyclic_buffer, is_freed, random_input, rel_err

from rawgraph import (
    BlockWeights,
    Capture,
    DeviceBuffer,
    ExecUpdateManager,
    RawgraphError,
    Stream,
    TinyBlock,
    capture_plan,
)
from rawgraph.control.loops import DepthLoop, NormGate
from rawgraph.graphs import conditional as cn
from rawgraph.graphs.builder import GraphBuilder
from rawgraph.graphs.nodes import ConditionalInfo, read_graph
from rawgraph.models.tinyblock import reference_forward
from rawgraph.runtime import resource
from rawgraph.runtime.errors import RawgraphWarning, ReleaseWarning
from rawgraph.runtime.memory import POISON_BITS

gpu = pytest.mark.gpu
N = 1000

# (kind, size): IF, IF/ELSE, SWITCH of 3, WHILE.
CASES = [("if", 1), ("if", 2), ("switch", 3), ("while", 1)]


def _branch_values(rng, kind, size):
    big = int(rng.integers(2, 1 << 31))
    if kind == "if":
        return [0, 1, big]
    if kind == "switch":
        return list(range(size + 1)) + [big]
    return [0, 1, int(rng.integers(2, 7))]  # WHILE: iteration counts


def _expected_bodies(kind, size, value):
    """Which bodies run, in order, for a condition value."""
    if kind == "if":
        return [0] if value else ([1] if size == 2 else [])
    if kind == "switch":
        return [value] if value < size else []
    return [0] * value


def _build(device, stream, kind, size, x, y, value, coeffs, how, body_stream):
    """y = x (exact: x*1+0), then the conditional with body i: y = y * a_i + b_i (WHILE: and count down)."""
    copy = cn.axpb(device, x, y, 1.0, 0.0)
    bodies = []
    if how == "builder":
        g = GraphBuilder(device)
        h = cn.make_handle(g)
        k0 = g.kernel(copy)
        k1 = g.kernel(cn.set_condition(device, h, value), deps=k0)
        node = cn.add_conditional(g, kind, h, size=size, deps=k1)
        for i, body in enumerate(node.bodies):
            kb = body.kernel(cn.axpb(device, y, y, *coeffs[i]))
            if kind == "while":
                body.kernel(cn.countdown(device, h, value), deps=kb)
            bodies.append(body)
        return g.build(), node
    cap = Capture(stream)
    with cap:
        h = cn.capture_handle(cap)
        cap.launch(copy)
        cap.launch(cn.set_condition(device, h, value))
        node = cn.capture_conditional(cap, kind, h, size=size)
        for i in range(size):
            with node.capture_body(i, body_stream) as body:
                body.launch(cn.axpb(device, y, y, *coeffs[i]))
                if kind == "while":
                    body.launch(cn.countdown(device, h, value))
    return cap.captured, node


@gpu
@pytest.mark.parametrize("how", ["builder", "capture"])
@pytest.mark.parametrize("kind,size", CASES)
def test_each_branch_runs_as_the_device_decides(device, stream, rng, kind, size, how):
    if (kind == "switch" or size == 2) and cn.driver_cuda_version() < cn.MIN_DRIVER_ELSE_SWITCH:
        pytest.skip("IF/ELSE and SWITCH need a CUDA 12.8 driver")
    xh = random_input(rng, (N,))
    x, y = DeviceBuffer.from_numpy(xh), DeviceBuffer((N,))
    value = DeviceBuffer(1, np.uint32)
    coeffs = [(float(rng.uniform(0.5, 1.5)), float(rng.uniform(-1, 1))) for _ in range(size)]
    with Stream() as body_stream:
        graph, node = _build(device, stream, kind, size, x, y, value, coeffs, how, body_stream)
    assert node.size == size and all(
        len(node.body_kernel_nodes(i)) == (2 if kind == "while" else 1) for i in range(size)
    )
    assert graph.node_count() == 3
    types = [driver.cuGraphNodeGetType(n)[1] for n in graph.all_nodes()]
    assert types.count(driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL) == 1
    exe = graph.instantiate()
    eager = DeviceBuffer((N,))
    for v in _branch_values(rng, kind, size):
        value.copy_from_host(np.array([v], np.uint32), stream)
        y.poison(stream)
        exe.launch(stream)
        got = y.to_numpy(stream)
        # Eager: the same kernels chosen on the host.
        runs = _expected_bodies(kind, size, v)
        cn.axpb(device, x, eager, 1.0, 0.0)(stream)
        ref = xh.astype(np.float64)
        for i in runs:
            cn.axpb(device, eager, eager, *coeffs[i])(stream)
            ref = ref * coeffs[i][0] + coeffs[i][1]
        np.testing.assert_array_equal(got, eager.to_numpy(stream), err_msg=f"value {v}: bodies {runs}")
        assert rel_err(got, ref) < 1e-6, f"value {v}"
        if kind == "while":
            assert value.to_numpy(stream)[0] == 0  # the body counted down to zero


@gpu
@pytest.mark.parametrize("form,capture", [("unfused", False), ("fused", False), ("block", False), ("fused", True)])
def test_while_depth_loop_gives_the_bits_of_plain_graphs_of_each_depth(device, stream, rng, form, capture):
    width, batch, max_depth = 128, 2, 4
    seed = int(rng.integers(1 << 30))
    weights = BlockWeights(width, max_depth, seed=seed)
    xh = random_input(rng, (batch, width))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((batch, width))
    model = TinyBlock(width, batch, form=form, weights=weights)
    loop = DepthLoop(model, x, out, capture=capture, stream=stream)
    assert loop.graph.node_count() == 4  # memcpy, init, WHILE, memcpy
    plain_out = DeviceBuffer((batch, width))
    ws = weights.numpy(stream)
    for d in list(rng.permutation(max_depth + 1)) + [max_depth + 3]:
        d = int(d)
        loop.set_depth(d, stream)
        out.poison(stream)
        loop.launch(stream)
        got = out.to_numpy(stream)
        eff = min(d, max_depth)
        if eff == 0:
            np.testing.assert_array_equal(got, xh)
            continue
        plain = TinyBlock(width, batch, eff, seed=seed, form=form)
        plain_out.poison(stream)
        capture_plan(plain.plan(x, plain_out), stream).instantiate().launch(stream)
        np.testing.assert_array_equal(got, plain_out.to_numpy(stream), err_msg=f"depth {d}")
        assert rel_err(got, reference_forward(xh, ws[:eff])) < 1e-5


@gpu
@pytest.mark.parametrize("factor,runs", [(0.5, True), (2.0, False)])
def test_norm_gate_skips_the_block_under_the_threshold(device, stream, rng, factor, runs):
    model = TinyBlock(256, 4, 2, seed=int(rng.integers(1 << 30)), form="fused")
    xh = random_input(rng, (4, 256))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((4, 256))
    norm = float(np.linalg.norm(xh.astype(np.float64)))
    gate = NormGate(model, x, out, threshold=norm * factor)
    out.poison(stream)
    gate.launch(stream)
    got = out.to_numpy(stream)
    assert abs(float(gate.norm.to_numpy(stream)[0]) - norm) / norm < 1e-6
    if runs:
        eager = DeviceBuffer((4, 256))
        model.forward(x, eager, stream)
        np.testing.assert_array_equal(got, eager.to_numpy(stream))
        assert rel_err(got, model.reference(xh)) < 1e-5
    else:
        np.testing.assert_array_equal(got, xh)


@gpu
def test_conditional_refusals_before_the_driver(device, stream):
    flag = DeviceBuffer(1, np.uint32)
    g = GraphBuilder(device)
    h = cn.make_handle(g)
    node = cn.add_conditional(g, "if", h)
    with pytest.raises(RawgraphError, match="already drives"):
        cn.add_conditional(g, "while", h)
    other = GraphBuilder(device)
    with pytest.raises(RawgraphError, match="another graph"):
        cn.add_conditional(other, "if", cn.make_handle(g))
    body = node.bodies[0]
    for add in (lambda: body.host(lambda: None), lambda: body.mem_alloc(64)):
        with pytest.raises(RawgraphError, match="body may not hold"):
            add()
    with pytest.raises(RawgraphError, match="parent graph owns"):
        body.build()
    body.kernel(cn.set_condition(device, h, flag))
    # The body is captured on another stream than the capture that holds the node.
    s, s2 = Stream(), Stream()
    cap = Capture(s)
    with cap:
        ch = cn.capture_handle(cap)
        cnode = cn.capture_conditional(cap, "if", ch)
        with pytest.raises(RawgraphError, match="already capturing"):
            with cnode.capture_body(0, s):
                pass
        with cnode.capture_body(0, s2) as bc:
            bc.launch(cn.noop(device))
    assert cap.captured.node_count() == 1


@gpu
def test_exec_update_leaves_conditional_graphs_alone_but_body_kernels_rebind(
    device, stream, rng, count_setparams, monkeypatch
):
    # rawgraph's own update path on a graph holding conditional nodes: a TinyBlock plan built node by
    # node, then a taken IF (default 1) whose body writes z = w*a + b and an IF never taken (default 0).
    model = TinyBlock(256, 1, 1, seed=int(rng.integers(1 << 30)), form="fused")
    xs = [random_input(rng, (1, 256)) for _ in range(3)]
    bufs = [DeviceBuffer.from_numpy(v, stream=stream) for v in xs]
    out, eager = DeviceBuffer((1, 256)), DeviceBuffer((1, 256))
    wh = random_input(rng, (N,))
    w, z, z_eager, skipped = (
        DeviceBuffer.from_numpy(wh, stream=stream),
        DeviceBuffer((N,)),
        DeviceBuffer((N,)),
        DeviceBuffer((N,)),
    )
    a, b = float(rng.uniform(0.5, 1.5)), float(rng.uniform(-1, 1))
    g = GraphBuilder(device)
    plan = model.plan(bufs[0], out)
    chain = g.run(plan)
    taken = cn.add_conditional(g, "if", cn.make_handle(g, default=1), deps=chain[-1])
    taken.bodies[0].kernel(cn.axpb(device, w, z, a, b))
    never = cn.add_conditional(g, "if", cn.make_handle(g, default=0), deps=chain[-1])
    never.bodies[0].kernel(cn.axpb(device, w, skipped, a, b))
    graph = g.build()
    exe = graph.instantiate()
    cond_handles = {int(taken.node.handle), int(never.node.handle)}
    body_handles = {int(kn.handle) for c in (taken, never) for kn in c.body_kernel_nodes(0)}
    kernel_handles = {int(n.handle) for n in graph.nodes}
    assert len(graph.nodes) == len(plan.launches) and {int(h) for h, _k, _d in graph.other_nodes} == cond_handles
    # The manager reads the conditionals once; one whose bodies the driver does not give back
    # (driver 580: no cuGraphNodeGetParams) brings a warning, not a refusal.
    infos = [i for i in read_graph(graph) if isinstance(i, ConditionalInfo)]
    assert len(infos) == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mgr = ExecUpdateManager(graph, exe)
    said = [c for c in caught if issubclass(c.category, RawgraphWarning) and "cannot be read" in str(c.message)]
    assert len(said) == (1 if any(i.error for i in infos) else 0), [str(c.message) for c in caught]
    generic = []  # any cuGraphExecNodeSetParams (the call a conditional node would need)
    real = getattr(driver, "cuGraphExecNodeSetParams", None)

    def recording(*args):
        generic.append(args[1])
        return real(*args)

    monkeypatch.setattr(driver, "cuGraphExecNodeSetParams", recording, raising=False)
    pushed_before = len(count_setparams)
    cn.axpb(device, w, z_eager, a, b)(stream)
    want_z = z_eager.to_numpy(stream)
    prev = 0
    for i in (2, 1, 1, 0, 2):
        pushes = mgr.bind("x", bufs[i])
        assert (pushes == 0) == (i == prev), f"bind x{prev} -> x{i} pushed {pushes} nodes"
        prev = i
        for buf in (out, z, skipped):
            buf.poison(stream)
        mgr.launch(stream)
        model.forward(bufs[i], eager, stream)
        np.testing.assert_array_equal(out.to_numpy(stream), eager.to_numpy(stream), err_msg=f"x{i}")
        assert rel_err(out.to_numpy(stream), model.reference(xs[i])) < 1e-5, f"x{i}, seed {rng.seed_used}"
        np.testing.assert_array_equal(z.to_numpy(stream), want_z, err_msg="the taken IF did not run its body")
        assert rel_err(z.to_numpy(stream), wh.astype(np.float64) * a + b) < 1e-6
        assert (skipped.to_numpy(stream).view(np.uint32) == POISON_BITS).all(), "the IF of value 0 ran its body"
    pushed = {int(h) for h in count_setparams[pushed_before:]}
    assert pushed and pushed <= kernel_handles, "the manager pushed a node that is not one of the plan's kernels"
    assert not pushed & (cond_handles | body_handles) and generic == []
    # The body's kernel node itself takes cuGraphExecKernelNodeSetParams (the driver's side; the
    # manager does not reach into bodies): a new scale, the manager's binding untouched.
    kn = taken.body_kernel_nodes(0)[0]
    a2 = float(rng.uniform(1.5, 2.5))
    kn.launch.args["a"] = a2
    (err,) = driver.cuGraphExecKernelNodeSetParams(exe.handle, kn.handle, kn.launch.node_params())
    assert err == driver.CUresult.CUDA_SUCCESS
    for buf in (out, z):
        buf.poison(stream)
    mgr.launch(stream)
    cn.axpb(device, w, z_eager, a2, b)(stream)
    np.testing.assert_array_equal(z.to_numpy(stream), z_eager.to_numpy(stream))
    assert rel_err(z.to_numpy(stream), wh.astype(np.float64) * a2 + b) < 1e-6
    model.forward(bufs[2], eager, stream)
    np.testing.assert_array_equal(out.to_numpy(stream), eager.to_numpy(stream))
    mgr.close()


# -- body captures: the releases they defer run after them ------------------------------------------
@gpu
def test_a_body_capture_runs_the_releases_it_deferred(device, stream):
    g = GraphBuilder(device)
    node = cn.add_conditional(g, "if", cn.make_handle(g, default=1))
    doomed = DeviceBuffer(1024)
    ptr = int(doomed.ptr)
    noops = [cn.noop(device), cn.noop(device)]  # kernels loaded before the capture, not inside it
    before = {id(e) for e in resource._deferred}
    with Stream() as body_stream:
        with node.capture_body(0, body_stream) as body:
            first = body.launch(noops[0])
            del doomed  # garbage in the capture body: cuMemFree here would invalidate the capture
            gc.collect()
            held = [e for e in resource._deferred if id(e) not in before]
            assert any(name == "cuMemFree" and int(args[0]) == ptr for name, _fn, args in held)
            second = body.launch(noops[1])
        left = [e for e in resource._deferred if any(e is h for h in held)]
        assert left == [], f"the body capture left {len(left)} deferred release(s) behind"
    err, _kind = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    assert err != driver.CUresult.CUDA_SUCCESS, "the buffer was never freed"
    # Each kernel captured into a body records what it depends on.
    assert first.deps == () and second.deps == (int(first.handle),)
    exe = g.build().instantiate()  # the capture was not invalidated
    exe.launch(stream)
    stream.synchronize()


@gpu
@pytest.mark.parametrize("edge", ["begin", "end"])
def test_a_buffer_collected_at_the_edge_of_a_body_capture_is_freed_after_it_not_into_it(
    device, stream, monkeypatch, recwarn, edge
):
    g = GraphBuilder(device)
    node = cn.add_conditional(g, "if", cn.make_handle(g, default=1))
    noop = cn.noop(device)
    wrapper = cyclic_buffer()
    ptr = wrapper[1]
    doomed = [wrapper[0]]
    del wrapper
    with Stream() as body_stream:
        collect_at(edge, "cuStreamBeginCaptureToGraph", doomed, monkeypatch)
        with node.capture_body(0, body_stream) as body:
            body.launch(noop)
        monkeypatch.undo()
    assert is_freed(ptr), "the collected buffer was never freed once the body capture ended"
    assert not [w for w in recwarn if issubclass(w.category, ReleaseWarning)], [str(w.message) for w in recwarn]
    exe = g.build().instantiate()  # the body capture was not invalidated
    exe.launch(stream)
    stream.synchronize()


# ----------------------------------------------------------------------------- no GPU needed
@pytest.mark.parametrize(
    "kind,size,version,error",
    [
        ("while", 2, 13000, ValueError),
        ("if", 3, 13000, ValueError),
        ("switch", 0, 13000, ValueError),
        ("switch", None, 13000, ValueError),
        ("loop", 1, 13000, ValueError),
        ("if", 2, 12060, cn.ConditionalUnsupportedError),
        ("switch", 4, 12060, cn.ConditionalUnsupportedError),
        ("while", 1, 12020, cn.ConditionalUnsupportedError),
    ],
)
def test_check_kind_refuses_what_the_driver_would(kind, size, version, error):
    with pytest.raises(error):
        cn.check_kind(kind, size, version)


@pytest.mark.parametrize(
    "kind,size,version,want",
    [("if", None, 12030, 1), ("while", None, 12030, 1), ("if", 2, 12080, 2), ("switch", 5, 13000, 5)],
)
def test_check_kind_accepts_what_the_driver_has(kind, size, version, want):
    assert cn.check_kind(kind, size, version) == want
