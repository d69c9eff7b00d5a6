"""Lifetime, ordering and thread holes of issue 21 (section 2: items 1, 2, 3, 4, 5, 10, 12) in the
core: the address rebinder, the exec-update manager, the indirect graph, the serving classes.
Each test failed before its fix (``benchmarks/bite_cases/holes_core.py`` puts each hole back)."""

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input, rel_err, spin_ns

from rawgraph import (
    AddressRebinder,
    BucketGraphs,
    ClosedError,
    DeviceArray,
    DeviceBuffer,
    ExecUpdateManager,
    IndirectGraph,
    LayoutError,
    RebindError,
    ReshapedGraph,
    RowCountBuckets,
    ShapeError,
    SlotPool,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)
from rawgraph.runtime.errors import call

pytestmark = pytest.mark.gpu

SPIN_NS = spin_ns(200_000_000)  # 200 ms queued in front: long against the Python that follows a launch
WIDTH = 128


def _model(rng, batch=2, width=WIDTH, form="fused"):
    return TinyBlock(width, batch, 1, seed=int(rng.integers(1 << 30)), form=form)


def _eager(model, x, stream):
    out = DeviceBuffer((model.batch, model.width))
    out.poison(stream)
    model.forward(x, out, stream)
    return out.to_numpy(stream)


def _buffers(rng, model, k, stream):
    hosts = [random_input(rng, (model.batch, model.width)) for _ in range(k)]
    return hosts, [DeviceBuffer.from_numpy(h, stream=stream) for h in hosts]


class Overlap:
    """Wraps a driver function: every call pauses inside it, so a second thread let into the same
    critical section meanwhile is seen (``overlaps``). With the owner's lock there is none."""

    def __init__(self, fn, pause=0.02):
        self.fn, self.pause, self.inside, self.overlaps, self.calls = fn, pause, 0, 0, 0
        self.__name__ = fn.__name__  # rawgraph.runtime.errors.call names the call by it
        self._lock = threading.Lock()

    def __call__(self, *args):
        with self._lock:
            self.inside += 1
            self.calls += 1
            self.overlaps += self.inside > 1
        try:
            time.sleep(self.pause)  # releases the GIL: the other thread runs now if nothing stops it
            return self.fn(*args)
        finally:
            with self._lock:
                self.inside -= 1


def _referrers(obj):
    """What still refers to ``obj`` (for a failure message)."""
    return [type(r).__name__ + (f" {sorted(r)[:6]}" if isinstance(r, dict) else "") for r in gc.get_referrers(obj)]


def _two_threads(work_a, work_b):
    """Run both from one barrier; returns the exceptions they raised."""
    start, errors = threading.Barrier(2, timeout=30), []

    def run(work):
        start.wait()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in (work_a, work_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


# -- item 1: the rebinder's liveness guards and keep-alive --------------------------------------------
@pytest.mark.parametrize("closed", ["exec", "graph", "rebinder"])
def test_the_rebinder_refuses_a_closed_exec_or_graph_before_the_driver(stream, rng, count_setparams, closed):
    model = _model(rng)
    _, (x, x2) = _buffers(rng, model, 2, stream)
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
    model = _model(rng)
    hosts, (x, a_copy, b_copy) = _buffers(rng, model, 3, stream)
    want_a, want_b = _eager(model, a_copy, stream), _eager(model, b_copy, stream)
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
    assert ref_a() is None, f"the buffer stayed held after its replays ran: {_referrers(ref_a())}"
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
    assert ref_b() is None, f"held after close: {_referrers(ref_b())}"
    exe.close()
    graph.close()


def test_an_adopted_graphs_rebinder_owns_its_exec(stream, rng):
    from rawgraph import adopt

    model = _model(rng)
    _, (x,) = _buffers(rng, model, 1, stream)
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(x, out), stream)
    with adopt(graph.handle, owner=graph) as adopted:
        reb = adopted.rebinder()
        exe = reb.exec
        reb.close()
        assert exe.closed
    graph.close()


# -- item 2: prepare() refuses what rebind() refuses ----------------------------------------------------
def test_prepare_refuses_a_range_a_child_graph_reads(device, stream, rng):
    model = _model(rng)
    hosts, (x, x2) = _buffers(rng, model, 2, stream)
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
    want = _eager(model, x, stream)
    np.testing.assert_array_equal(out2.to_numpy(stream), want)
    np.testing.assert_array_equal(out_child.to_numpy(stream), want)
    assert rel_err(want, model.reference(hosts[0])) < 1e-5, f"seed {rng.seed_used}"
    reb.close()
    exe.close()
    graph.close()
    child.close()


# -- item 3: the manager's close waits for queued replays ------------------------------------------------
def test_manager_close_waits_for_a_queued_replay_before_dropping_what_it_reads(stream, rng):
    # A caching allocator's array (CuPy's pool): cuMemFree would wait for the device, a pool hands
    # the block to the next allocation at once.
    cp = pytest.importorskip("cupy")
    model = _model(rng)
    hosts, (x, a_copy) = _buffers(rng, model, 2, stream)
    want = _eager(model, a_copy, stream)
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
    ops.spin(get_device(), SPIN_NS)(stream)
    mgr.launch(stream)
    mgr.bind("x", x)  # a is retired: the queued replay still reads it
    del a
    gc.collect()
    assert ref() is not None and not stream.query()
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


# -- item 4: a stream closed after a launch breaks nothing later -----------------------------------------
def test_a_stream_closed_after_a_launch_breaks_no_later_bind_or_close(stream, rng):
    model = _model(rng)
    _, (x, a, b) = _buffers(rng, model, 3, stream)
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
    np.testing.assert_array_equal(out.to_numpy(stream), _eager(model, a, stream))
    mgr.close()
    exe.close()
    graph.close()
    ind = IndirectGraph(model, x, out, stream)
    with Stream() as t:
        ind.launch(t)
    ind.bind(b, out2)
    out2.poison(stream)
    ind.launch(stream)
    np.testing.assert_array_equal(out2.to_numpy(stream), _eager(model, b, stream))
    ind.close()
    assert ind.exec.closed and ind.graph.closed


# -- item 5: a run on a new stream waits for one queued on a closed stream --------------------------------
@pytest.mark.parametrize("kind", ["buckets", "row_count", "reshaped"])
def test_a_run_on_a_new_stream_waits_for_one_queued_on_a_closed_stream(device, stream, rng, kind):
    model = _model(rng, batch=4)
    _, (x1, x2) = _buffers(rng, model, 2, stream)
    want = _eager(model, x2, stream)
    served = {
        "buckets": lambda: BucketGraphs(model, sizes=[4], stream=stream),
        "row_count": lambda: RowCountBuckets(model, sizes=[4], stream=stream),
        "reshaped": lambda: ReshapedGraph(model, max_batch=4, stream=stream),
    }[kind]()
    stream.synchronize()
    t = Stream()
    ops.spin(device, SPIN_NS)(t)
    served.run(x1, 4, stream=t)
    t.close()  # cuStreamDestroy returns with the spin and the run still queued
    u = Stream()
    served.run(x2, 4, stream=u)
    got = served.output.to_numpy(u)[:4]
    call(driver.cuCtxSynchronize)  # everything, the closed stream's run included
    after = served.output.to_numpy(stream)[:4]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(after, got, err_msg="the run on the closed stream ran after the later one")
    served.close()
    u.close()


# -- item 10: ReshapedGraph refuses bad sizes and an overlapping x ----------------------------------------
def test_reshaped_graph_refuses_bad_sizes_and_a_partly_overlapping_x(stream, rng, monkeypatch):
    model = _model(rng, batch=4)
    rg = ReshapedGraph(model, max_batch=4, stream=stream)
    copies = []
    real = driver.cuMemcpyDtoDAsync
    monkeypatch.setattr(driver, "cuMemcpyDtoDAsync", lambda *a: copies.append(a) or real(*a))
    for n in (0, 5, -1):
        with pytest.raises(ShapeError, match="1..max_batch"):
            rg.reshape(n)
    with pytest.raises(TypeError):
        rg.reshape(True)
    f32 = np.dtype(np.float32)
    shifted = DeviceArray(rg.input.ptr + model.width * 4, (3, model.width), f32, rg.input)
    with pytest.raises(LayoutError, match="overlaps"):
        rg.run(shifted, 3)
    assert copies == [], "a refused run reached the driver"
    # x that is the persistent input itself runs without a copy
    xh = random_input(rng, (4, model.width))
    rg.input.copy_from_host(xh, stream)
    y = rg.run(DeviceArray(rg.input.ptr, (4, model.width), f32, rg.input), 4)
    assert copies == [] and y.ptr == rg.output.ptr
    np.testing.assert_array_equal(
        rg.output.to_numpy(stream), _eager(model, DeviceBuffer.from_numpy(xh, stream=stream), stream)
    )
    rg.close()
    with pytest.raises(ClosedError):
        rg.reshape(2)


# -- exec updates from a thread that never made a context current ---------------------------------------
NEW_THREAD_CHILD = """
import json, threading
import numpy as np
from rawgraph import AddressRebinder, DeviceBuffer, ExecUpdateManager, ReshapedGraph, Stream, TinyBlock, capture_plan
s = Stream()
m = TinyBlock(128, 2, 1, seed=3, form="fused")
xs = [DeviceBuffer.from_numpy(np.random.default_rng(i).standard_normal((2, 128), dtype=np.float32), stream=s)
      for i in range(2)]
out = DeviceBuffer((2, 128))
g = capture_plan(m.plan(xs[0], out), s)
e1, e2 = g.instantiate(), g.instantiate()
mgr, reb = ExecUpdateManager(g, e1), AddressRebinder(g, e2)
setter = mgr.scalar_setter(0, "B")
rg = ReshapedGraph(m, max_batch=2, stream=s)
ops = {"bind": lambda: mgr.bind("x", xs[1]), "prepare": lambda: reb.prepare({xs[0]: xs[1]}), "set_params": lambda: mgr.set_params(0, grid=(1, 1, 1)),
       "scalar_setter": lambda: setter(1), "rebind": lambda: reb.move(xs[0], xs[1]),
       "reshape": lambda: rg.reshape(1), "exec.update": lambda: e1.update(g)}
done = {}
for name, op in ops.items():
    def run(name=name, op=op):
        try:
            op()
            done[name] = "ok"
        except Exception as exc:
            done[name] = repr(exc)
    t = threading.Thread(target=run)  # a fresh thread: no current context
    t.start()
    t.join()
print(json.dumps(done))
"""


def test_exec_updates_from_a_thread_with_no_current_context_do_not_crash():
    # Before the fix cuGraphExecKernelNodeSetParams crashed the process there (driver 580): a child.
    env = dict(os.environ, PYTHONPATH=str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NEW_THREAD_CHILD)], env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, f"the child died ({r.returncode}): {r.stderr[-3000:]}"
    done = json.loads(r.stdout.strip().splitlines()[-1])
    assert done == {
        k: "ok" for k in ("bind", "prepare", "set_params", "scalar_setter", "rebind", "reshape", "exec.update")
    }, done


# -- item 12: one thread at a time in each owner ---------------------------------------------------------
def test_two_threads_joining_a_slot_pool_never_pick_one_slot(stream, rng, monkeypatch):
    model = TinyBlock(WIDTH, 1, 1, seed=int(rng.integers(1 << 30)), form="fused")
    pool = SlotPool(model, max_slots=8, sizes=[8], stream=stream)
    spy = Overlap(driver.cuMemcpyHtoDAsync)
    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", spy)
    rows = [random_input(rng, (WIDTH,)) for _ in range(8)]
    got: dict[int, list] = {0: [], 1: []}

    def joiner(k):
        return lambda: got[k].extend(pool.join(rows[4 * k + i]) for i in range(4))

    errors = _two_threads(joiner(0), joiner(1))
    monkeypatch.undo()
    assert errors == [], errors
    assert spy.overlaps == 0, "two joins ran inside the pool at once"
    slots = got[0] + got[1]
    assert sorted(slots) == list(range(8)) and len(pool) == 8
    for k in (0, 1):
        for i, slot in enumerate(got[k]):
            np.testing.assert_array_equal(pool.read(slot), rows[4 * k + i])
    pool.close()


def test_two_threads_binding_one_manager_leave_shadow_and_exec_agreeing(stream, rng, monkeypatch):
    model = _model(rng)
    _, xs = _buffers(rng, model, 3, stream)
    wants = [_eager(model, x, stream) for x in xs]
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(xs[0], out), stream)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    spy = Overlap(driver.cuGraphExecKernelNodeSetParams)
    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", spy)
    order = [[1, 2, 1, 2], [2, 0, 2, 0]]
    errors = _two_threads(*[(lambda seq=seq: [mgr.bind("x", xs[i]) for i in seq]) for seq in order])
    monkeypatch.undo()
    assert errors == [] and spy.calls > 0
    assert spy.overlaps == 0, "two binds pushed at once"
    for i in (0, 1, 2, 1, 0):
        mgr.bind("x", xs[i])
        out.poison(stream)
        mgr.launch(stream)
        np.testing.assert_array_equal(out.to_numpy(stream), wants[i], err_msg=f"x{i}")
    mgr.close()
    exe.close()
    graph.close()


def test_two_threads_applying_one_rebinder_leave_held_and_exec_agreeing(stream, rng, monkeypatch):
    model = _model(rng)
    _, xs = _buffers(rng, model, 3, stream)
    wants = [_eager(model, x, stream) for x in xs]
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(xs[0], out), stream)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    bindings = [reb.prepare({})] + [reb.prepare({xs[0]: x}) for x in xs[1:]]
    spy = Overlap(driver.cuGraphExecKernelNodeSetParams)
    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", spy)
    order = [[1, 2, 1, 2], [2, 0, 2, 0]]
    errors = _two_threads(*[(lambda seq=seq: [reb.apply(bindings[i]) for i in seq]) for seq in order])
    monkeypatch.undo()
    assert errors == [] and spy.calls > 0
    assert spy.overlaps == 0, "two applies pushed at once"
    for i in (0, 1, 2, 1, 0):
        reb.apply(bindings[i])
        out.poison(stream)
        reb.launch(stream)
        np.testing.assert_array_equal(out.to_numpy(stream), wants[i], err_msg=f"x{i}")
    reb.close()
    exe.close()
    graph.close()


def test_two_threads_applying_one_indirect_graph_leave_table_and_bound_agreeing(stream, rng, monkeypatch):
    model = _model(rng)
    _, xs = _buffers(rng, model, 3, stream)
    wants = [_eager(model, x, stream) for x in xs]
    outs = [DeviceBuffer((model.batch, model.width)) for _ in range(3)]
    ind = IndirectGraph(model, xs[0], outs[0], stream)
    ind.launch(stream)  # launched: every apply now asks the read event (cuEventQuery) inside the lock
    stream.synchronize()
    pairs = [ind.prepare(x, o) for x, o in zip(xs, outs)]
    spy = Overlap(driver.cuEventQuery)
    monkeypatch.setattr(driver, "cuEventQuery", spy)
    order = [[1, 2, 1, 2], [2, 0, 2, 0]]
    errors = _two_threads(*[(lambda seq=seq: [ind.apply(pairs[i]) for i in seq]) for seq in order])
    monkeypatch.undo()
    assert errors == [] and spy.calls > 0
    assert spy.overlaps == 0, "two applies ran inside the IndirectGraph at once"

    def replay_checks(i, what):
        for o in outs:
            o.poison(stream)
        ind.launch(stream)
        for k, o in enumerate(outs):
            got = o.to_numpy(stream)
            if k == i:
                np.testing.assert_array_equal(got, wants[i], err_msg=what)
            else:
                assert np.isnan(got).all(), f"{what}: the replay also wrote out{k}"

    # whichever apply came last, the pair it says is bound is the one the table holds
    last = [k for k in range(3) if ind.bound is pairs[k].arrays]
    assert len(last) == 1, "bound names none of the applied pairs"
    replay_checks(last[0], "after the two threads")
    for i in (0, 1, 2, 1, 0):
        ind.apply(pairs[i])
        replay_checks(i, f"pair {i}")
    ind.close()
