"""The misuse checklist: each case asserts its exact outcome (error type and driver code, or the
values computed), and that nothing is left broken afterwards."""

import gc
import threading
import time
import warnings

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import UNDER_SANITIZER, random_input, rel_err, spin_ns

from rawgraph import (
    Capture,
    CaptureError,
    CaptureMode,
    CaptureRefusedError,
    ClosedError,
    CudaError,
    DeviceBuffer,
    Event,
    ExecUpdateManager,
    LaunchPlan,
    ShapeError,
    StaticGraph,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)
from rawgraph.runtime import _capturing
from rawgraph.runtime.errors import EmptyCaptureWarning, ForeignNodeError, check, cuda_error, error_name
from rawgraph.runtime.memory import POISON_BITS

pytestmark = pytest.mark.gpu

GLOBAL, THREAD_LOCAL, RELAXED = CaptureMode.GLOBAL, CaptureMode.THREAD_LOCAL, CaptureMode.RELAXED
UNSUPPORTED = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
INVALIDATED = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
ILLEGAL_STATE = "CUDA_ERROR_ILLEGAL_STATE"
SPIN_NS = spin_ns(100_000_000)  # 100 ms: long enough that everything queued behind it is still waiting


def _usable_afterwards(stream, rng):
    """The stream is not capturing, no rawgraph capture is open, eager work runs, it captures again."""
    assert not stream.is_capturing()
    assert _capturing.active() == []
    model = TinyBlock(64, 2, 1, form="fused")
    xh = random_input(rng, (2, 64))
    x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((2, 64))
    ref = model.reference(xh, stream)
    out.poison(stream)
    model.forward(x, out, stream)
    assert rel_err(out.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"
    graph = capture_plan(model.plan(x, out), stream)
    out.poison(stream)
    graph.instantiate().launch(stream)
    assert rel_err(out.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"


def _model_io(rng, stream, width=64, batch=2, layers=1, form="fused"):
    model = TinyBlock(width, batch, layers, seed=int(rng.integers(1 << 30)), form=form)
    xh = random_input(rng, (batch, width))
    x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((batch, width))
    return model, xh, x, out


def _eager(model, x, stream):
    out = DeviceBuffer((model.batch, model.width))
    out.poison(stream)
    model.forward(x, out, stream)
    return out.to_numpy(stream)


# -- 1. default streams ----------------------------------------------------------------------
@pytest.mark.parametrize("which", ["legacy()", "handle 0", "CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD", "raw int 2"])
def test_default_stream_handles_are_refused_before_the_driver(stream, rng, monkeypatch, which):
    target = {
        "legacy()": lambda: Stream.legacy(),
        "handle 0": lambda: Stream.from_external(0),
        "CU_STREAM_LEGACY": lambda: driver.CUstream(1),
        "CU_STREAM_PER_THREAD": lambda: Stream.from_external(2),
        "raw int 2": lambda: 2,
    }[which]()
    model, _xh, x, out = _model_io(rng, stream)
    plan = model.plan(x, out)
    out.poison(stream)
    stream.synchronize()
    began = []
    real = driver.cuStreamBeginCapture
    monkeypatch.setattr(driver, "cuStreamBeginCapture", lambda *a: began.append(a) or real(*a))
    with pytest.raises(CaptureRefusedError, match="legacy/NULL"):
        Capture(target)
    with pytest.raises(CaptureRefusedError, match="legacy/NULL"):
        capture_plan(plan, target)  # refused before its warm-up runs on that stream
    assert began == []
    assert (out.to_numpy(stream).view(np.uint32) == POISON_BITS).all()


# -- 2-4. what the driver refuses inside a capture ---------------------------------------------
def test_legacy_stream_touched_while_a_blocking_stream_captures_is_implicit(rng):
    blocking = Stream(non_blocking=False)
    dev = get_device()
    with pytest.raises(CaptureError) as info:
        with Capture(blocking) as cap:
            cap.launch(ops.empty(dev))
            ops.empty(dev)(Stream.legacy())
    assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" and "cuLaunchKernel" in str(info.value)
    assert "legacy (NULL) stream" in info.value.hint
    assert cap.end_result == INVALIDATED and cap.graph is None
    _usable_afterwards(blocking, rng)


def test_legacy_work_beside_a_non_blocking_capture_is_allowed(stream, rng):
    # A non-blocking stream does not synchronise with the legacy stream, so nothing implicit joins
    # the capture: the driver allows it, and the graph holds only the recorded node.
    with Capture(stream) as cap:
        cap.launch(ops.empty(get_device()))
        ops.empty(get_device())(Stream.legacy())
    assert cap.graph.node_count() == 1
    _usable_afterwards(stream, rng)


def test_work_on_the_stream_outside_the_recorder_is_detected(stream, rng):
    from rawgraph import RawgraphError

    dev = get_device()
    # Refused on request: the node count names the unrecorded work.
    with pytest.raises(RawgraphError, match="outside Capture.launch.*KERNEL"):
        with Capture(stream, foreign="refuse") as cap:
            cap.launch(ops.empty(dev))
            ops.empty(dev)(stream)  # launched straight on the stream, not recorded
    assert cap.graph is None
    _usable_afterwards(stream, rng)
    # By default mapped: a foreign node with its type and its dependency on the recorded node.
    with Capture(stream) as cap:
        first = cap.launch(ops.empty(dev))
        ops.empty(dev)(stream)
        last = cap.launch(ops.empty(dev))
    graph = cap.graph
    assert [f.type for f in graph.foreign_nodes] == ["KERNEL"] and graph.node_count() == 3
    foreign = graph.foreign_nodes[0]
    assert foreign.deps == (int(first.handle),) and last.deps == (int(foreign.handle),)
    graph.verify_edges()
    _usable_afterwards(stream, rng)


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


def test_sync_during_capture_is_unsupported_and_invalidates(stream, rng):
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            stream.synchronize()
    assert info.value.name == UNSUPPORTED and info.value.call == "cuStreamSynchronize"
    assert "not allowed while a stream is capturing" in info.value.hint
    assert cap.end_result == INVALIDATED
    _usable_afterwards(stream, rng)


def test_stream_query_during_capture(stream, rng):
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            stream.query()
    assert info.value.name == UNSUPPORTED and info.value.call == "cuStreamQuery"
    assert cap.end_result == INVALIDATED
    _usable_afterwards(stream, rng)


# -- 5. the stream stays usable after every way a capture can fail ------------------------------
def _fail_sync(s):
    s.synchronize()


def _fail_alloc(s):
    DeviceBuffer(4096)


def _fail_query(s):
    s.query()


def _fail_python(s):
    raise KeyError("a bug in the body")


def _fail_bad_launch(s):
    launch = ops.empty(get_device())
    launch.shared_mem = 1 << 30  # far over any device's limit: cuLaunchKernel refuses it
    launch(s)


def _fail_swallowed(s):
    try:
        s.synchronize()
    except CaptureError:
        pass


def _fail_fence(s):
    get_device().synchronize()  # refused by rawgraph before the driver: the capture survives


FAILURES = {
    "sync": (_fail_sync, CaptureError),
    "alloc": (_fail_alloc, CaptureError),
    "query": (_fail_query, CaptureError),
    "python": (_fail_python, KeyError),
    "bad launch": (_fail_bad_launch, CudaError),
    "swallowed": (_fail_swallowed, CaptureError),
    "context fence": (_fail_fence, CaptureRefusedError),
}


@pytest.mark.parametrize("how", list(FAILURES))
def test_the_stream_is_usable_after_every_failed_capture(stream, rng, how):
    body, err = FAILURES[how]
    with pytest.raises(err):
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            body(stream)
    assert cap.graph is None
    _usable_afterwards(stream, rng)


# -- 6-7. ending and beginning in the wrong place (driver level: what rawgraph's Capture prevents) --
def test_end_capture_on_the_wrong_stream(rng):
    a, b = Stream(), Stream()
    check(driver.cuStreamBeginCapture(a.handle, GLOBAL.value), "cuStreamBeginCapture")
    err, graph = driver.cuStreamEndCapture(b.handle)
    assert error_name(err) == ILLEGAL_STATE and not int(graph or 0)
    assert a.is_capturing() and not b.is_capturing()
    graph = check(driver.cuStreamEndCapture(a.handle), "cuStreamEndCapture")
    check(driver.cuGraphDestroy(graph))
    _usable_afterwards(a, rng)
    _usable_afterwards(b, rng)


def test_end_capture_on_a_stream_that_joined_the_capture_is_unmatched(rng):
    """A side stream forked into the capture (event recorded on the origin, waited on by the side
    stream) is capturing, but the capture was not begun there: ending it on that stream returns
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED. Whether the capture survives is not documented, so both
    outcomes are accepted for the rest; either way both streams are usable afterwards."""
    a, b = Stream(), Stream()
    fork, join = Event(timing=False), Event(timing=False)
    check(driver.cuStreamBeginCapture(a.handle, GLOBAL.value), "cuStreamBeginCapture")
    check(driver.cuEventRecord(fork.handle, a.handle), "cuEventRecord")
    check(driver.cuStreamWaitEvent(b.handle, fork.handle, 0), "cuStreamWaitEvent")
    assert a.is_capturing() and b.is_capturing()  # b joined the capture
    err, graph = driver.cuStreamEndCapture(b.handle)
    assert error_name(err) == "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED" and not int(graph or 0)
    # Join b back into the origin and end the capture where it began. If the failed end
    # invalidated the capture, these calls answer CUDA_ERROR_STREAM_CAPTURE_INVALIDATED instead.
    driver.cuEventRecord(join.handle, b.handle)
    driver.cuStreamWaitEvent(a.handle, join.handle, 0)
    err, graph = driver.cuStreamEndCapture(a.handle)
    assert error_name(err) in ("CUDA_SUCCESS", INVALIDATED), error_name(err)
    if int(graph or 0):
        check(driver.cuGraphDestroy(graph))
    assert not a.is_capturing() and not b.is_capturing()
    fork.close()
    join.close()
    _usable_afterwards(a, rng)
    _usable_afterwards(b, rng)


def test_begin_twice_and_end_without_begin(stream, rng):
    (err,) = driver.cuStreamEndCapture(stream.handle)[:1]
    assert error_name(err) == ILLEGAL_STATE
    with Capture(stream) as cap:
        cap.launch(ops.empty(get_device()))
        # rawgraph refuses a second capture of a capturing stream before the driver ...
        with pytest.raises(CaptureRefusedError, match="already capturing"):
            Capture(stream).__enter__()
        # ... which itself says:
        (err,) = driver.cuStreamBeginCapture(stream.handle, GLOBAL.value)
        assert error_name(err) == ILLEGAL_STATE
    assert cap.graph is not None and cap.graph.node_count() == 1  # the first capture survived both
    _usable_afterwards(stream, rng)


# -- 8-9. allocation during capture, on this thread and on another ------------------------------
@pytest.mark.parametrize("mode,outcome", [(GLOBAL, UNSUPPORTED), (THREAD_LOCAL, UNSUPPORTED), (RELAXED, "allowed")])
def test_allocation_during_capture_in_each_mode(stream, rng, mode, outcome):
    held = []
    if outcome == "allowed":
        with Capture(stream, mode) as cap:
            cap.launch(ops.empty(get_device()))
            held.append(DeviceBuffer(4096))
        assert cap.graph.node_count() == 1 and held[0].ptr
    else:
        with pytest.raises(CaptureError) as info:
            with Capture(stream, mode) as cap:
                cap.launch(ops.empty(get_device()))
                DeviceBuffer(4096)
        assert info.value.name == outcome and info.value.call == "cuMemAlloc"
        assert cap.end_result == INVALIDATED
    _usable_afterwards(stream, rng)


@pytest.mark.parametrize("mode", [GLOBAL, THREAD_LOCAL, RELAXED])
def test_another_threads_unsafe_call_while_capturing(stream, rng, mode):
    began, done = threading.Event(), threading.Event()
    other: dict = {}

    def allocate():
        began.wait(10)
        try:
            other["buf"] = DeviceBuffer(4096)
        except CudaError as exc:
            other["error"] = exc
        done.set()

    t = threading.Thread(target=allocate)
    t.start()
    dev = get_device()
    outcome = None
    try:
        with Capture(stream, mode) as cap:
            cap.launch(ops.empty(dev))
            began.set()
            assert done.wait(10)
            cap.launch(ops.empty(dev))
    except CaptureError as exc:
        outcome = exc
    t.join()
    if mode is GLOBAL:
        # Global mode forbids every thread's unsafe calls while it captures: the other thread's
        # allocation fails, and the capture is invalidated with it.
        assert other["error"].name == UNSUPPORTED and "buf" not in other
        assert outcome is not None and outcome.name == INVALIDATED and cap.end_result == INVALIDATED
    else:
        assert "error" not in other and other["buf"].ptr
        assert outcome is None and cap.graph.node_count() == 2
    _usable_afterwards(stream, rng)


# -- 10-11. what a capture records --------------------------------------------------------------
def test_capture_does_not_execute_the_work(stream, rng):
    model, xh, x, out = _model_io(rng, stream)
    out.poison(stream)
    graph = capture_plan(model.plan(x, out), stream, warmup=False)
    assert (out.to_numpy(stream).view(np.uint32) == POISON_BITS).all(), "capture ran the kernels"
    graph.instantiate().launch(stream)
    assert rel_err(out.to_numpy(stream), model.reference(xh, stream)) < 1e-5, f"seed {rng.seed_used}"


def test_an_empty_capture_warns_and_gives_an_empty_graph(stream):
    with pytest.warns(EmptyCaptureWarning, match="recorded no work"):
        with Capture(stream) as cap:
            pass
    assert cap.graph.node_count() == 0 and cap.graph.edges() == []
    exe = cap.graph.instantiate()
    exe.launch(stream)
    stream.synchronize()


# -- 12-13. a capture abandoned half-way ---------------------------------------------------------
def test_a_capture_collected_mid_capture_is_ended(stream, rng):
    cap = Capture(stream)
    cap.__enter__()
    cap.launch(ops.empty(get_device()))
    assert stream.is_capturing()
    with pytest.warns(ResourceWarning, match="garbage-collected while capturing"):
        del cap
        gc.collect()
    assert not stream.is_capturing() and _capturing.active() == []
    get_device().synchronize()  # a context fence fails while any capture is open: none is
    _usable_afterwards(stream, rng)


def test_a_stream_closed_mid_capture_ends_the_capture(rng):
    s = Stream()
    with pytest.raises(ClosedError, match="closed during the capture"):
        with Capture(s) as cap:
            cap.launch(ops.empty(get_device()))
            s.close()
    assert cap.graph is None and _capturing.active() == []
    get_device().synchronize()
    with Stream() as fresh:
        _usable_afterwards(fresh, rng)


@pytest.mark.parametrize("mode", [CaptureMode.GLOBAL, CaptureMode.THREAD_LOCAL])
def test_a_stream_closed_mid_capture_frees_what_was_closed_before_it_after_the_capture(rng, mode):
    # Both closes are deferred inside the capture (a cuMemFree or cuStreamDestroy there breaks it);
    # the capture must end before the deferred cuMemFree runs, or the free fails and leaks.
    s = Stream()
    doomed = DeviceBuffer(4096)
    ptr = int(doomed.ptr)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ClosedError, match="closed during the capture"):
            with Capture(s, mode) as cap:
                cap.launch(ops.empty(get_device()))
                doomed.close()
                s.close()
    assert [str(w.message) for w in seen if "release" in str(w.message)] == []
    err, _kind = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    assert err != driver.CUresult.CUDA_SUCCESS, "the buffer closed inside the capture was never freed"
    assert cap.graph is None and _capturing.active() == []
    get_device().synchronize()
    with Stream() as fresh:
        _usable_afterwards(fresh, rng)


# -- 14. close twice -----------------------------------------------------------------------------
def test_close_twice_is_quiet_for_every_owner(stream, rng):
    model, _xh, x, out = _model_io(rng, stream)
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    mgr.launch(stream)
    static = StaticGraph(model, stream)
    owners = [mgr, static, exe, graph, model, x, out, Event(), Stream()]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for obj in owners:
            obj.close()
            obj.close()
    assert seen == [], [str(w.message) for w in seen]
    for obj in (exe, graph, model, x, out):
        assert obj.closed


# -- 15-17. replay ---------------------------------------------------------------------------------
def test_replay_on_another_stream_with_and_without_upload(stream, rng):
    model, xh, x, out = _model_io(rng, stream, form="fused", layers=2)
    ref = model.reference(xh, stream)
    graph = capture_plan(model.plan(x, out), stream)
    uploaded, plain = graph.instantiate(), graph.instantiate()
    with Stream() as other, Stream(non_blocking=False) as blocking:
        uploaded.upload(other)
        for exe, s in ((uploaded, other), (uploaded, blocking), (plain, other), (plain, blocking)):
            out.poison(s)
            exe.launch(s)
            assert rel_err(out.to_numpy(s), ref) < 1e-5, f"seed {rng.seed_used}"


def test_repeated_replay_accumulates(stream, rng):
    dev = get_device()
    n = 4099
    xh = rng.integers(-8, 9, size=n).astype(np.float32)
    xh[xh == 0] = 3.0
    acc0 = rng.integers(-100, 100, size=n).astype(np.float32)
    x, acc = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer.from_numpy(acc0, stream=stream)
    views = {"x": x.view(), "acc": acc.view()}
    plan = LaunchPlan([ops.add(dev, views, "acc", "x", "acc")], views, ("x",), ("acc",))
    graph = capture_plan(plan, stream, warmup=False)
    exe = graph.instantiate()
    for _ in range(7):
        exe.launch(stream)
    # Small integers add exactly in float32: 7 replays added x exactly 7 times.
    np.testing.assert_array_equal(acc.to_numpy(stream), acc0 + 7 * xh)


def test_two_execs_replay_concurrently_on_two_streams(rng):
    dev = get_device()
    streams = [Stream(), Stream()]
    cases = []
    for s in streams:
        xh = random_input(rng, (4096,))
        bufs = {"x": DeviceBuffer.from_numpy(xh, stream=s), "y": DeviceBuffer(4096)}
        views = {k: v.view() for k, v in bufs.items()}
        with Capture(s) as cap:
            cap.launch(ops.spin(dev, 50_000_000))
            cap.launch(ops.relu(dev, views, "x", "y"))
        cases.append((cap.graph.instantiate(), bufs, xh))
    for (exe, _bufs, _), s in zip(cases, streams):
        exe.launch(s)  # warm
        s.synchronize()
    t0 = time.perf_counter()
    for (exe, bufs, _), s in zip(cases, streams):
        bufs["y"].poison(s)
        exe.launch(s)
    for s in streams:
        s.synchronize()
    wall = time.perf_counter() - t0
    for (_exe, bufs, xh), s in zip(cases, streams):
        np.testing.assert_array_equal(bufs["y"].to_numpy(s), np.maximum(xh, 0))
    # Two 50 ms graphs on two streams overlap: well under the 100 ms they would take in turn.
    # (Skipped under compute-sanitizer, which serialises kernels.)
    if not UNDER_SANITIZER:
        assert 0.05 <= wall < 0.085, f"two 50 ms replays took {wall * 1e3:.1f} ms"


# -- 18. scalars and launch shape --------------------------------------------------------------------
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
    model, _xh, x, out = _model_io(rng, stream, width=128, batch=1, form="block")
    bgraph = capture_plan(model.plan(x, out), stream)
    bmgr = ExecUpdateManager(bgraph, bgraph.instantiate())
    with pytest.raises(ShapeError, match="cluster"):
        bmgr.set_params(0, grid=(4, 1, 1))
    assert pushes == []


# -- 19. a driver failure half-way through a bind ------------------------------------------------------
@pytest.mark.parametrize("path", ["bind_many", "bind"])
def test_a_setparams_failure_half_way_rolls_every_node_back(stream, rng, monkeypatch, path):
    model, xh, x, out = _model_io(rng, stream, width=128, batch=2, layers=2, form="unfused")
    graph = capture_plan(model.plan(x, out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    x2 = DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream)
    out2 = DeviceBuffer((2, 128))
    if path == "bind":
        assert mgr.bind("x", x2) == 2  # cached now: the next bind of x2 takes the fast path
        assert mgr.bind("x", x) == 2
    expected = _eager(model, x, stream)
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


# -- 20. an update changes only later launches --------------------------------------------------------
def test_update_affects_only_later_launches(stream, rng):
    model, _xh, x, out = _model_io(rng, stream, width=128, batch=2, layers=2, form="fused")
    graph = capture_plan(model.plan(x, out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    xs = [DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream) for _ in range(3)]
    outs = [DeviceBuffer((2, 128)) for _ in range(3)]
    expected = [_eager(model, xi, stream) for xi in xs]
    for o in outs:
        o.poison(stream)
    ops.spin(get_device(), SPIN_NS)(stream)
    for xi, oi in zip(xs, outs):
        mgr.bind_many({"x": xi, "out": oi})
        mgr.launch(stream)
    assert not stream.query(), "the replays were meant to be still queued behind the spin kernel"
    for oi, ei in zip(outs, expected):
        np.testing.assert_array_equal(oi.to_numpy(stream), ei)


# -- 21-22. destroying things with work in flight -------------------------------------------------------
def test_destroying_exec_graph_and_model_with_a_replay_in_flight(stream, rng):
    model, xh, x, out = _model_io(rng, stream, width=256, batch=4, layers=4, form="fused")
    ref = model.reference(xh, stream)
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    out.poison(stream)
    ops.spin(get_device(), SPIN_NS)(stream)
    exe.launch(stream)
    assert not stream.query()
    exe.close()
    graph.close()
    model.close()
    # Memory freed above may come back here: fill it with NaN on another stream at once. If the
    # replay still had to read it, its result would be NaN.
    with Stream() as other:
        junk = [DeviceBuffer((256, 256)) for _ in range(16)]
        for j in junk:
            j.poison(other)
        other.synchronize()
    assert rel_err(out.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"


def test_outputs_stay_valid_after_the_graph_is_destroyed(stream, rng):
    model, xh, x, _out = _model_io(rng, stream, width=128, batch=3, layers=2, form="fused")
    static = StaticGraph(model, stream)
    result = static(x, stream)
    expected = _eager(model, x, stream)
    static.close()
    assert static.closed and static.static_input.closed and not result.closed
    np.testing.assert_array_equal(result.to_numpy(stream), expected)
    with pytest.raises(ClosedError):
        static(x, stream)
    del static
    gc.collect()
    np.testing.assert_array_equal(result.to_numpy(stream), expected)


# -- 23. a caching allocator cannot reuse what a queued replay reads --------------------------------------
def test_a_freed_cupy_input_is_not_reused_while_a_replay_is_queued(stream, rng):
    cp = pytest.importorskip("cupy")
    model, _xh, x, out = _model_io(rng, stream, width=512, batch=8, layers=2, form="fused")
    graph = capture_plan(model.plan(x, out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    ah = random_input(rng, (8, 512))
    a = cp.asarray(ah)
    cp.cuda.Device().synchronize()
    a_ptr = a.data.ptr
    expected = _eager(model, DeviceBuffer.from_numpy(ah, stream=stream), stream)
    cp.empty((8, 512), cp.float32).fill(cp.nan)  # CuPy compiles its fill kernel now, not behind the spin
    cp.cuda.Device().synchronize()
    out.poison(stream)
    ops.spin(get_device(), 3 * SPIN_NS)(stream)
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


# -- 24. recapture, and one graph instantiated twice ----------------------------------------------------
def test_recapture_and_instantiating_one_graph_twice(stream, rng):
    model, xh, x, out = _model_io(rng, stream, width=128, batch=2, layers=2, form="fused")
    plan = model.plan(x, out)
    first = capture_plan(plan, stream)
    first.close()
    graph = capture_plan(plan, stream)  # the same plan again, after the first graph is gone
    e1, e2 = graph.instantiate(), graph.instantiate()
    assert int(e1.handle) != int(e2.handle)
    m2 = ExecUpdateManager(graph, e2)
    x2 = DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream)
    out2 = DeviceBuffer((2, 128))
    m2.bind_many({"x": x2, "out": out2})  # rebinding one exec leaves the other alone
    out.poison(stream)
    out2.poison(stream)
    e1.launch(stream)
    m2.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), _eager(model, x, stream))
    np.testing.assert_array_equal(out2.to_numpy(stream), _eager(model, x2, stream))


# -- 25. every driver result decodes ---------------------------------------------------------------------
def test_every_cuda_result_decodes_to_its_name():
    undescribed = []
    for code in driver.CUresult:
        exc = cuda_error(code, "cuSomething")
        assert exc.name == code.name and exc.code == int(code) and code.name in str(exc)
        if "no description" in exc.message:
            undescribed.append(code.name)
    # With a driver loaded, cuGetErrorString describes (nearly) every code this binding knows.
    assert len(undescribed) <= 3, undescribed


# -- 27. closed objects refuse before any driver call --------------------------------------------------
@pytest.fixture
def driver_calls(monkeypatch):
    calls = []
    for name in dir(driver):
        fn = getattr(driver, name)
        if name.startswith("cu") and callable(fn) and not isinstance(fn, type):
            monkeypatch.setattr(driver, name, lambda *a, _fn=fn, _name=name: calls.append(_name) or _fn(*a))
    return calls


def _closed_cases(stream, rng):
    model, _xh, x, out = _model_io(rng, stream)
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    host = np.ones((2, 64), np.float32)
    buf, ev, s, exe2, g2 = (
        DeviceBuffer((2, 64)),
        Event(),
        Stream(),
        graph.instantiate(),
        capture_plan(model.plan(x, out), stream),
    )
    open_event, ready_plan = Event(), model.plan(x, out)
    buf.close()
    ev.close()
    s.close()
    cases = {
        "buffer.ptr": lambda: buf.ptr,
        "buffer.to_numpy": lambda: buf.to_numpy(stream),
        "buffer.copy_from_host": lambda: buf.copy_from_host(host, stream),
        "buffer.poison": lambda: buf.poison(stream),
        "stream.synchronize": s.synchronize,
        "stream.query": s.query,
        "stream.is_capturing": s.is_capturing,
        "stream.wait": lambda: stream.wait(ev),
        "event.record": lambda: ev.record(stream),
        "event.query": ev.query,
        "event.synchronize": ev.synchronize,
        "event.record on closed stream": lambda: open_event.record(s),
        "plan.run on closed stream": lambda: ready_plan.run(s),
        "exec.launch on closed stream": lambda: exe.launch(s),
        "exec.upload on closed stream": lambda: exe.upload(s),
        "capture on closed stream": lambda: Capture(s),
        "bind into a closed stream's replay": lambda: mgr.launch(s),
    }
    exe2.close()
    cases.update(
        {
            "exec.launch": lambda: exe2.launch(stream),
            "exec.upload": lambda: exe2.upload(stream),
            "exec.update": lambda: exe2.update(g2),
            "exec.driver_flags": exe2.driver_flags,
        }
    )
    g3 = capture_plan(model.plan(x, out), stream)
    g3.close()
    cases.update(
        {
            "graph.instantiate": g3.instantiate,
            "graph.node_count": g3.node_count,
            "graph.edges": g3.edges,
            "graph.verify_node_map": g3.verify_node_map,
            "exec.update from closed graph": lambda: exe.update(g3),
        }
    )
    # The manager names its exec's handle and its graph's node handles: both must be open.
    g4 = capture_plan(model.plan(x, out), stream)
    e4 = g4.instantiate()
    m4 = ExecUpdateManager(g4, e4)
    x2 = DeviceBuffer((2, 64))
    b4 = m4.prepare({"x": x2})
    e4.close()
    cases.update(
        {
            "manager.bind after exec.close": lambda: m4.bind("x", x2),
            "manager.bind_many after exec.close": lambda: m4.bind_many({"x": x2}),
            "manager.apply after exec.close": lambda: m4.apply(b4),
            "manager.set_params after exec.close": lambda: m4.set_params(0, B=2),
            "manager.launch after exec.close": lambda: m4.launch(stream),
        }
    )
    g5 = capture_plan(model.plan(x, out), stream)
    m5 = ExecUpdateManager(g5, g5.instantiate())
    g5.close()
    cases["manager.bind after graph.close"] = lambda: m5.bind("x", x2)
    m6 = ExecUpdateManager(graph, graph.instantiate())
    m6.close()
    cases["manager.bind after manager.close"] = lambda: m6.bind("x", x2)
    static = StaticGraph(model, stream)
    static.close()
    cases.update({"static.__call__": lambda: static(x, stream), "static.replay": lambda: static.replay(stream)})
    m7 = TinyBlock(64, 2, 1)
    m7.close()
    cases.update({"model.plan": lambda: m7.plan(x, out), "model.forward": lambda: m7.forward(x, out, stream)})
    stream.synchronize()
    return cases


def test_closed_objects_refuse_before_any_driver_call(stream, rng, driver_calls):
    cases = _closed_cases(stream, rng)
    for name, action in cases.items():
        driver_calls.clear()
        with pytest.raises(ClosedError):
            action()
        # model.forward computes its cache key from array addresses (no driver call) first.
        assert driver_calls == [], f"{name}: called {driver_calls} before refusing"
