"""The exec-update manager (rawgraph.updates.manager): validated binds, minimal driver updates, no
copies, prepared bindings, scalars and launch shape set on the exec; and its error, lifetime and
mutation cases: bad binds refused with the exec keeping its parameters, foreign nodes never reached
(a buffer a foreign node uses stays bound), a driver failure half-way through a bind rolling every
node back, an update changing only later launches, what a queued replay reads kept alive (also a
freed CuPy array), and a stream closed after a launch breaking no later bind or close. (More of its
refusals, mirrored from the CPU fake-driver tests: ``tests/test_updates_refusals_gpu.py``.)"""

import gc
import weakref

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import (
    device_inputs,
    eager_output,
    model_io,
    random_input,
    rel_err,
    spin_after_collecting,
    spin_ns,
    tiny_model,
)

from rawgraph import (
    Capture,
    CudaError,
    DeviceBuffer,
    DTypeError,
    ExecUpdateManager,
    IndirectGraph,
    LaunchPlan,
    LayoutError,
    NotOnDeviceError,
    ShapeError,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)
from rawgraph.runtime.errors import ForeignNodeError, check
from rawgraph.runtime.memory import POISON_BITS

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(200_000_000)  # 200 ms queued in front: long against the Python that follows a launch
SHORT_SPIN_NS = spin_ns(100_000_000)  # 100 ms: long enough that everything queued behind it is still waiting


def _setup(stream, width=128, batch=2, layers=2, form="unfused"):
    model = TinyBlock(width, batch, layers, seed=21, form=form)
    x0, out0 = DeviceBuffer((batch, width)), DeviceBuffer((batch, width))
    x0.poison(stream)
    graph = capture_plan(model.plan(x0, out0), stream)
    exe = graph.instantiate()
    return model, graph, exe, ExecUpdateManager(graph, exe), out0


def _eager(model, x, stream):
    out = DeviceBuffer((model.batch, model.width))
    out.poison(stream)
    model.forward(x, out, stream)
    return out.to_numpy()


@pytest.mark.parametrize("form", ["unfused", "fused", "block"])
def test_bind_updates_only_the_nodes_that_read_x(stream, rng, form, count_setparams):
    model, graph, exe, mgr, out0 = _setup(stream, form=form)
    assert sorted(mgr.bindings) == ["out", "x"]
    readers = {n for n, _, _ in mgr.bindings["x"]}
    assert readers == {"unfused": {0, 3}, "fused": {0, 1}, "block": {0}}[form]
    x = DeviceBuffer.from_numpy(random_input(rng, (2, 128)))
    assert mgr.bind("x", x) == len(readers)
    assert {int(h) for h in count_setparams} == {int(graph.nodes[i].handle) for i in readers}
    # Binding the same buffer again is free: no driver call at all.
    count_setparams.clear()
    assert mgr.bind("x", x) == 0 and mgr.bind("x", x.view()) == 0
    assert count_setparams == [] and mgr.update_calls == len(readers)
    out0.poison(stream)
    mgr.launch(stream)
    np.testing.assert_array_equal(out0.to_numpy(), _eager(model, x, stream))


def test_rebinding_three_inputs_over_1000_replays(stream, rng):
    model, graph, exe, mgr, _ = _setup(stream, width=64, batch=3, layers=3, form="fused")
    xs = [DeviceBuffer.from_numpy(random_input(rng, (3, 64))) for _ in range(3)]
    expected = [_eager(model, x, stream) for x in xs]
    assert all(not np.array_equal(expected[0], e) for e in expected[1:])
    out = DeviceBuffer((3, 64))
    mgr.bind("out", out)
    order = rng.integers(0, 3, size=1000)
    for step, i in enumerate(order):
        mgr.bind("x", xs[i])
        out.poison(stream)
        mgr.launch(stream)
        got = out.to_numpy()
        assert np.array_equal(got, expected[i]), f"replay {step} with input {i} differs"


def test_bad_binds_are_refused_and_the_exec_keeps_its_parameters(stream, rng, count_setparams):
    model, graph, exe, mgr, out0 = _setup(stream)
    good = DeviceBuffer.from_numpy(random_input(rng, (2, 128)))
    mgr.bind("x", good)
    count_setparams.clear()
    bad = {
        ShapeError: [DeviceBuffer((3, 128)), DeviceBuffer((1, 128))],
        DTypeError: [DeviceBuffer((2, 128), np.float64)],
        NotOnDeviceError: [np.ones((2, 128), np.float32)],
    }
    for err, arrays in bad.items():
        for a in arrays:
            with pytest.raises(err):
                mgr.bind("x", a)
    cp = pytest.importorskip("cupy")
    strided = cp.asarray(random_input(rng, (128, 2))).T
    with pytest.raises(LayoutError):
        mgr.bind("x", strided)
    with pytest.raises(LayoutError, match="overlap"):
        mgr.bind("out", good)  # would write the input it reads
    with pytest.raises(KeyError):
        mgr.bind("W1[0]", good)
    # One bad name in a batch: nothing changes, not even the good one.
    fresh = DeviceBuffer.from_numpy(random_input(rng, (2, 128)))
    with pytest.raises(ShapeError):
        mgr.bind_many({"x": fresh, "out": DeviceBuffer((5, 5))})
    assert count_setparams == [] and mgr.bound("x").ptr == good.ptr
    out0.poison(stream)
    mgr.launch(stream)
    np.testing.assert_array_equal(out0.to_numpy(), _eager(model, good, stream))


def test_closed_buffer_is_refused(stream):
    model, graph, exe, mgr, _ = _setup(stream)
    b = DeviceBuffer((2, 128))
    b.close()
    from rawgraph import ClosedError

    with pytest.raises(ClosedError):
        mgr.bind("x", b)


def test_bound_arrays_stay_alive_until_their_replays_finish(stream, rng):
    cp = pytest.importorskip("cupy")
    model, graph, exe, mgr, _ = _setup(stream, width=1024, batch=8, layers=8)
    a = cp.asarray(random_input(rng, (8, 1024)))
    ref = weakref.ref(a)
    mgr.bind("x", a)
    for _ in range(5):
        mgr.launch(stream)
    del a
    gc.collect()
    # Re-binding while replays may still read `a`: the manager holds it, the pool cannot reuse it.
    mgr.bind("x", cp.asarray(random_input(rng, (8, 1024))))
    assert ref() is not None and len(mgr.retained) == 1
    gc.collect()
    assert ref() is not None
    stream.synchronize()
    mgr.collect()  # covers it with an event recorded after the replays
    stream.synchronize()
    assert mgr.collect() == 0
    gc.collect()
    assert ref() is None


def test_never_replayed_arrays_are_not_retained(stream, rng):
    model, graph, exe, mgr, _ = _setup(stream)
    mgr.bind("x", DeviceBuffer.from_numpy(random_input(rng, (2, 128))))
    mgr.bind("x", DeviceBuffer.from_numpy(random_input(rng, (2, 128))))
    assert mgr.retained == []


def test_binding_does_not_disturb_the_eager_plan(stream, rng):
    model = TinyBlock(128, 2, 1)
    xh = random_input(rng, (2, 128))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((2, 128))
    plan = model.plan(x, out)
    graph = capture_plan(plan, stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    mgr.bind("x", DeviceBuffer.from_numpy(random_input(rng, (2, 128))))
    assert plan.launches[0].args["x"] == x.ptr


@pytest.mark.parametrize("form", ["fused", "block"])
def test_prepared_bindings_replay_each_pair_and_push_only_changed_nodes(stream, rng, form, count_setparams):
    """Prepared (x, out) sets applied in random order: each replay writes its own output, equal
    to the bit to an eager run on its input; applying what is applied pushes nothing."""
    if form == "block":
        from rawgraph import ops
        from rawgraph.runtime.device import get_device

        if not ops.has_clusters(get_device()):
            pytest.skip("the block form needs thread-block clusters")
    model, graph, exe, mgr, _ = _setup(stream, width=128, batch=1, layers=1, form=form)
    xs = [DeviceBuffer.from_numpy(random_input(rng, (1, 128))) for _ in range(3)]
    outs = [DeviceBuffer((1, 128)) for _ in range(3)]
    expected = [_eager(model, x, stream) for x in xs]
    touched = {n for name in ("x", "out") for n, _, _ in mgr.bindings[name]}
    sets = [mgr.prepare({"x": xs[i], "out": outs[i]}) for i in range(3)]
    assert count_setparams == []  # preparing validates, it pushes nothing
    last = None
    for step, i in enumerate(rng.integers(0, 3, size=300)):
        count_setparams.clear()
        pushed = mgr.apply(sets[i])
        assert pushed == (0 if i == last else len(touched)) == len(count_setparams), f"step {step}"
        assert mgr.bound("x").ptr == xs[i].ptr and mgr.bound("out").ptr == outs[i].ptr
        outs[i].poison(stream)
        mgr.launch(stream)
        np.testing.assert_array_equal(outs[i].to_numpy(), expected[i], err_msg=f"step {step}, pair {i}")
        last = i
    # a single-name bind in between is seen: the next apply pushes what it changed back
    mgr.bind("x", xs[(last + 1) % 3])
    count_setparams.clear()
    assert mgr.apply(sets[last]) == len({n for n, _, _ in mgr.bindings["x"]}) == len(count_setparams)


def test_prepare_refuses_what_bind_many_refuses_and_apply_refuses_stale_bindings(stream, rng, count_setparams):
    from rawgraph import ClosedError

    model, graph, exe, mgr, out0 = _setup(stream)
    good = DeviceBuffer.from_numpy(random_input(rng, (2, 128)))
    with pytest.raises(ShapeError):
        mgr.prepare({"x": good, "out": DeviceBuffer((5, 5))})
    with pytest.raises(LayoutError, match="overlap"):
        mgr.prepare({"x": good, "out": good})
    with pytest.raises(KeyError):
        mgr.prepare({"W1[0]": good})
    doomed = DeviceBuffer((2, 128))
    binding = mgr.prepare({"x": good, "out": doomed})
    other = _setup(stream)[3]
    with pytest.raises(ValueError, match="another"):
        other.apply(binding)
    doomed.close()
    with pytest.raises(ClosedError, match="closed after it was prepared"):
        mgr.apply(binding)
    assert count_setparams == [] and mgr.bound("x").ptr != good.ptr
    # a partial set is checked for overlap against what is bound when it is applied
    y = DeviceBuffer((2, 128))
    partial = mgr.prepare({"out": y})  # x is bound to the captured input: no overlap yet
    mgr.bind("x", y)
    count_setparams.clear()
    with pytest.raises(LayoutError, match="overlap"):
        mgr.apply(partial)  # it would write the input the graph reads
    assert count_setparams == [] and mgr.bound("out").ptr == out0.ptr


def test_a_prepared_binding_keeps_its_arrays_alive(stream, rng):
    cp = pytest.importorskip("cupy")
    model, graph, exe, mgr, _ = _setup(stream)
    a = cp.asarray(random_input(rng, (2, 128)))
    ref = weakref.ref(a)
    binding = mgr.prepare({"x": a})
    del a
    gc.collect()
    assert ref() is not None  # the binding holds it: its pointer cannot be reused under it
    mgr.apply(binding)
    del binding
    mgr.bind("x", DeviceBuffer.from_numpy(random_input(rng, (2, 128))))
    gc.collect()
    assert ref() is None  # never replayed while bound: nothing else keeps it


def test_manager_close_waits_for_a_queued_replay_before_dropping_what_it_reads(stream, rng):
    # A caching allocator's array (CuPy's pool): cuMemFree would wait for the device, a pool hands
    # the block to the next allocation at once.
    cp = pytest.importorskip("cupy")
    model = tiny_model(rng)
    hosts, (x, a_copy) = device_inputs(rng, model, 2, stream)
    want = eager_output(model, a_copy, stream)
    a = cp.asarray(hosts[1])
    cp.empty(a.shape, cp.float32).fill(cp.nan)  # CuPy compiles its fill kernel now, not behind the spin
    cp.cuda.Device().synchronize()
    a_ptr = a.data.ptr
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    ref = weakref.ref(a)
    mgr.bind("x", a)
    out.poison(stream)
    # Earlier tests' garbage is released now, not in the collect below: a cuMemFree among it may
    # synchronize the device and so wait out the spin the assertion needs still running.
    gc.collect()
    ops.spin(get_device(), SPIN_NS)(stream)
    mgr.launch(stream)
    mgr.bind("x", x)  # a is retired: the queued replay still reads it
    del a
    gc.collect()
    assert ref() is not None, "the retired array was dropped with a replay that reads it queued"
    assert not stream.query(), "the spin ended before the check (the test proves nothing then)"
    mgr.close()
    queued = not stream.query()
    gc.collect()
    assert ref() is None, "close kept a retired array"
    # The pool's next arrays, filled on CuPy's stream (which does not wait for ours)
    fresh = [cp.empty((model.batch, model.width), cp.float32) for _ in range(4)]
    for f in fresh:
        f.fill(cp.nan)
    reused = any(f.data.ptr == a_ptr for f in fresh)
    np.testing.assert_array_equal(
        out.to_numpy(stream), want, err_msg=f"the replay read a reused block (reused={reused}, queued={queued})"
    )
    assert not queued, "close let a retired array go with the replay that reads it still queued"
    exe.close()
    graph.close()


# -- foreign nodes: never reached, and what they read stays bound ------------------------------------
def test_the_manager_never_reaches_a_foreign_node(stream, rng):
    # A memset captured between a plan's launches writes `out` itself; the manager binds only the
    # recorded launches' arguments by name and refuses the foreign node by index.
    model = TinyBlock(64, 2, 1, form="fused")
    x, out = DeviceBuffer.from_numpy(random_input(rng, (2, 64))), DeviceBuffer((2, 64))
    plan = model.plan(x, out)
    plan.run(stream)
    stream.synchronize()
    with Capture(stream) as cap:
        cap.run(plan)
        check(driver.cuMemsetD32Async(out.ptr, POISON_BITS, out.size, stream.handle))
    graph = cap.graph
    graph.plan = plan
    assert [f.type for f in graph.foreign_nodes] == ["MEMSET"]
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    foreign_index = len(graph.nodes)
    assert all(i < foreign_index for uses in mgr.bindings.values() for i, _a, _r in uses)
    with pytest.raises(KeyError, match="not in this graph"):
        mgr.set_params(foreign_index, B=1)
    # The replay runs the foreign node too: out ends poisoned.
    exe.launch(stream)
    assert np.all(out.to_numpy(stream).view(np.uint32) == POISON_BITS)
    # The memset writes `out` itself: binding `out` elsewhere would leave it writing the old
    # buffer, so it is refused (before any driver call: nothing was pushed), for bind, bind_many
    # and prepare alike; rebinding `out` to itself is fine.
    other = DeviceBuffer((2, 64))
    for attempt in (
        lambda: mgr.bind("out", other),
        lambda: mgr.bind_many({"x": x, "out": other}),
        lambda: mgr.prepare({"out": other}),
    ):
        with pytest.raises(ForeignNodeError, match=r"'out'.*foreign node \d+ \(memset\)"):
            attempt()
    assert mgr.update_calls == 0 and mgr.bound("out").ptr == out.ptr
    assert mgr.bind("out", out) == 0


def test_a_buffer_a_foreign_kernel_reads_is_pinned_and_the_rest_still_binds(stream, rng):
    # Plan b runs straight on the capturing stream (not recorded): its two kernels are foreign
    # and read x. Binding x away would leave them reading the old x: refused. `out`, which only
    # the recorded plan writes, binds freely, and the replay computes both blocks right.
    model = TinyBlock(64, 2, 1, form="fused")
    xh = random_input(rng, (2, 64))
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    out, out_b, out_new = DeviceBuffer((2, 64)), DeviceBuffer((2, 64)), DeviceBuffer((2, 64))
    plan_a, plan_b = model.plan(x, out), model.plan(x, out_b)
    plan_a.run(stream)
    stream.synchronize()
    with Capture(stream) as cap:
        cap.run(plan_a)
        plan_b.run(stream)
    graph = cap.graph
    graph.plan = plan_a
    assert [f.type for f in graph.foreign_nodes] == ["KERNEL"] * len(plan_b.launches)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    with pytest.raises(ForeignNodeError, match=r"'x'.*foreign node \d+ \(kernel "):
        mgr.bind("x", DeviceBuffer.from_numpy(xh, stream=stream))
    assert mgr.bind("out", out_new) >= 1
    ref = model.reference(xh, stream)
    for buf in (out, out_b, out_new):
        buf.poison(stream)
    mgr.launch(stream)
    assert rel_err(out_new.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"
    assert rel_err(out_b.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"
    assert np.all(out.to_numpy(stream).view(np.uint32) == POISON_BITS)  # moved away from: not written


# -- scalars and launch shape ----------------------------------------------------------------------
def _relu_graph(stream, rng, n=5000):
    dev = get_device()
    xh = random_input(rng, (n,))
    bufs = {"x": DeviceBuffer.from_numpy(xh, stream=stream), "y": DeviceBuffer(n)}
    views = {k: v.view() for k, v in bufs.items()}
    plan = LaunchPlan([ops.relu(dev, views, "x", "y")], views, ("x",), ("y",))
    graph = capture_plan(plan, stream)
    exe = graph.instantiate()
    return graph, exe, ExecUpdateManager(graph, exe), bufs, xh


def test_rebinding_scalars_and_grid_takes_effect(stream, rng):
    graph, exe, mgr, bufs, xh = _relu_graph(stream, rng)
    assert mgr.set_params(0, n=1234) == 1
    bufs["y"].poison(stream)
    mgr.launch(stream)
    y = bufs["y"].to_numpy(stream)
    np.testing.assert_array_equal(y[:1234], np.maximum(xh[:1234], 0))
    assert (y[1234:].view(np.uint32) == POISON_BITS).all()
    # One CTA of the grid-stride loop covers everything, just slower: the grid changed in the exec.
    assert mgr.set_params(0, grid=(1,), n=5000) == 1
    assert mgr.node_params(0)["grid"] == (1, 1, 1) and mgr.node_params(0)["n"] == 5000
    bufs["y"].poison(stream)
    mgr.launch(stream)
    np.testing.assert_array_equal(bufs["y"].to_numpy(stream), np.maximum(xh, 0))
    assert mgr.set_params(0, grid=(1,), n=5000) == 0  # nothing changed: no driver call
    # The graph (not the exec) still holds what was captured.
    params = check(driver.cuGraphKernelNodeGetParams(graph.nodes[0].handle))
    assert params.gridDimX == graph.nodes[0].launch.grid[0] > 1


def test_rebinding_refuses_what_it_cannot_check(stream, rng, monkeypatch):
    graph, exe, mgr, bufs, xh = _relu_graph(stream, rng)
    pushes = []
    real = driver.cuGraphExecKernelNodeSetParams
    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", lambda *a: pushes.append(a) or real(*a))
    with pytest.raises(TypeError, match="pointer argument"):
        mgr.set_params(0, x=bufs["y"].ptr)
    with pytest.raises(KeyError, match="no argument"):
        mgr.set_params(0, rows=3)
    with pytest.raises(KeyError, match="not in this graph"):
        mgr.set_params(5, n=3)
    with pytest.raises(ShapeError, match="positive"):
        mgr.set_params(0, grid=(0,))
    with pytest.raises(TypeError, match="cannot hold"):
        mgr.set_params(0, n=1 << 70)
    with pytest.raises(TypeError, match="takes an int"):
        mgr.set_params(0, n=2.5)
    # A cluster kernel (the single-kernel block on clusters of 8) only takes whole clusters.
    model, _xh, x, out = model_io(rng, stream, width=128, batch=1, form="block")
    bgraph = capture_plan(model.plan(x, out), stream)
    bmgr = ExecUpdateManager(bgraph, bgraph.instantiate())
    with pytest.raises(ShapeError, match="cluster"):
        bmgr.set_params(0, grid=(4, 1, 1))
    assert pushes == []


# -- a driver failure half-way through a bind ------------------------------------------------------
@pytest.mark.parametrize("path", ["bind_many", "bind"])
def test_a_setparams_failure_half_way_rolls_every_node_back(stream, rng, monkeypatch, path):
    model, xh, x, out = model_io(rng, stream, width=128, batch=2, layers=2, form="unfused")
    graph = capture_plan(model.plan(x, out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    x2 = DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream)
    out2 = DeviceBuffer((2, 128))
    if path == "bind":
        assert mgr.bind("x", x2) == 2  # cached now: the next bind of x2 takes the fast path
        assert mgr.bind("x", x) == 2
    expected = eager_output(model, x, stream)
    pushes = []
    real = driver.cuGraphExecKernelNodeSetParams

    def failing_second(exe, node, params):
        pushes.append(int(node))
        if len(pushes) == 2:
            return (driver.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return real(exe, node, params)

    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", failing_second)
    with pytest.raises(CudaError, match="cuGraphExecKernelNodeSetParams") as info:
        if path == "bind":
            mgr.bind("x", x2)
        else:
            mgr.bind_many({"x": x2, "out": out2})
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE"
    readers = [int(graph.nodes[i].handle) for i, _, _ in mgr.bindings["x"]]
    # First reader pushed, second refused, then the first given its old parameters back.
    assert pushes == [readers[0], readers[1], readers[0]]
    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", real)
    assert mgr.bound("x").ptr == x.ptr and mgr.bound("out").ptr == out.ptr
    out.poison(stream)
    out2.poison(stream)
    mgr.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), expected)
    assert (out2.to_numpy(stream).view(np.uint32) == POISON_BITS).all()
    # The shadows are right too: binding x2 now pushes both readers (nothing thinks it is done).
    assert mgr.bind("x", x2) == 2


# -- an update changes only later launches ---------------------------------------------------------
def test_update_affects_only_later_launches(stream, rng):
    model, _xh, x, out = model_io(rng, stream, width=128, batch=2, layers=2, form="fused")
    graph = capture_plan(model.plan(x, out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    xs = [DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream) for _ in range(3)]
    outs = [DeviceBuffer((2, 128)) for _ in range(3)]
    expected = [eager_output(model, xi, stream) for xi in xs]
    for o in outs:
        o.poison(stream)
    spin_after_collecting(get_device(), SHORT_SPIN_NS, stream)
    for xi, oi in zip(xs, outs):
        mgr.bind_many({"x": xi, "out": oi})
        mgr.launch(stream)
    assert not stream.query(), "the replays were meant to be still queued behind the spin kernel"
    for oi, ei in zip(outs, expected):
        np.testing.assert_array_equal(oi.to_numpy(stream), ei)


# -- what a queued replay reads stays alive; closed streams -----------------------------------------
def test_a_freed_cupy_input_is_not_reused_while_a_replay_is_queued(stream, rng):
    cp = pytest.importorskip("cupy")
    model, _xh, x, out = model_io(rng, stream, width=512, batch=8, layers=2, form="fused")
    graph = capture_plan(model.plan(x, out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    ah = random_input(rng, (8, 512))
    a = cp.asarray(ah)
    cp.cuda.Device().synchronize()
    a_ptr = a.data.ptr
    expected = eager_output(model, DeviceBuffer.from_numpy(ah, stream=stream), stream)
    cp.empty((8, 512), cp.float32).fill(cp.nan)  # CuPy compiles its fill kernel now, not behind the spin
    cp.cuda.Device().synchronize()
    # Earlier tests' garbage collected now, not inside the window below: a cuMemFree a finalizer
    # makes there waits for the whole device, the spin included, and the window closes early.
    gc.collect()
    out.poison(stream)
    ops.spin(get_device(), 3 * SHORT_SPIN_NS)(stream)
    mgr.bind("x", a)
    mgr.launch(stream)
    mgr.bind("x", x)  # a is no longer bound, but the queued replay still reads it
    del a
    gc.collect()
    fresh = [cp.empty((8, 512), cp.float32) for _ in range(4)]
    for f in fresh:
        f.fill(cp.nan)  # on CuPy's stream, which does not wait for ours
    assert all(f.data.ptr != a_ptr for f in fresh)
    assert not stream.query()
    np.testing.assert_array_equal(out.to_numpy(stream), expected)
    mgr.collect()
    stream.synchronize()
    assert mgr.collect() == 0


def test_a_stream_closed_after_a_launch_breaks_no_later_bind_or_close(stream, rng):
    model = tiny_model(rng)
    _, (x, a, b) = device_inputs(rng, model, 3, stream)
    out, out2 = DeviceBuffer((model.batch, model.width)), DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    with Stream() as t:
        mgr.launch(t)
    assert mgr.bind("x", a) > 0
    mgr.collect()  # covers the retired x with a fence: the closed stream takes none, its tail stands in
    stream.synchronize()
    out.poison(stream)
    mgr.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), eager_output(model, a, stream))
    mgr.close()
    exe.close()
    graph.close()
    ind = IndirectGraph(model, x, out, stream)
    with Stream() as t:
        ind.launch(t)
    ind.bind(b, out2)
    out2.poison(stream)
    ind.launch(stream)
    np.testing.assert_array_equal(out2.to_numpy(stream), eager_output(model, b, stream))
    ind.close()
    assert ind.exec.closed and ind.graph.closed
