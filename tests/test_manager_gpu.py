"""The exec-update manager: validated binds, minimal driver updates, no copies, keep-alive."""

import gc
import weakref

import numpy as np
import pytest
from helpers import device_inputs, eager_output, random_input, spin_ns, tiny_model

from rawgraph import (
    DeviceBuffer,
    DTypeError,
    ExecUpdateManager,
    LayoutError,
    NotOnDeviceError,
    ShapeError,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(200_000_000)  # 200 ms queued in front: long against the Python that follows a launch


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
