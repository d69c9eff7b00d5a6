"""Stream capture (rawgraph.graphs.capture: ``Capture``, ``capture_plan``) and the static graph over
it: capture, node map, static-address replay and exec-update replay, all paths equal to the bit;
and the capture's error, lifetime and misuse cases: what a capture records, what rawgraph refuses
before the driver (default streams, a second use, context-wide fences while any thread captures),
what the driver refuses inside a capture (synchronisation, queries, allocation, legacy-stream work),
ending and beginning in the wrong place, failed and abandoned captures (the stream stays usable
after each), releases at a capture's edges, and the static graph's outputs after it is closed.
Each case asserts its exact outcome (error type and driver code, or the values computed)."""

import gc
import threading
import warnings

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import (
    collect_at,
    cyclic_buffer,
    eager_output,
    is_freed,
    model_io,
    random_input,
    rel_err,
    usable_afterwards,
)

from rawgraph import (
    Capture,
    CaptureError,
    CaptureMode,
    CaptureRefusedError,
    ClosedError,
    CudaError,
    DeviceBuffer,
    DTypeError,
    Event,
    ExecUpdateManager,
    ShapeError,
    StaticGraph,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)
from rawgraph.graphs.graph import read_node_args
from rawgraph.runtime import _capturing
from rawgraph.runtime.errors import EmptyCaptureWarning, ReleaseWarning, check, error_name
from rawgraph.runtime.memory import POISON_BITS

pytestmark = pytest.mark.gpu

GLOBAL, THREAD_LOCAL, RELAXED = CaptureMode.GLOBAL, CaptureMode.THREAD_LOCAL, CaptureMode.RELAXED
UNSUPPORTED = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
INVALIDATED = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
ILLEGAL_STATE = "CUDA_ERROR_ILLEGAL_STATE"

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


# -- what a capture records, and what it refuses before the driver ---------------------------------
def test_capture_does_not_execute_the_work(stream, rng):
    model, xh, x, out = model_io(rng, stream)
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


def test_a_capture_object_is_single_use(stream):
    with Capture(stream) as cap:
        cap.launch(ops.empty(get_device()))
    with pytest.raises(CaptureRefusedError, match="single-use"):
        with cap:
            cap.launch(ops.empty(get_device()))
    assert len(cap.nodes) == 1 and cap.graph.node_count() == 1
    assert not stream.is_capturing()


@pytest.mark.parametrize("which", ["legacy()", "handle 0", "CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD", "raw int 2"])
def test_default_stream_handles_are_refused_before_the_driver(stream, rng, monkeypatch, which):
    target = {
        "legacy()": lambda: Stream.legacy(),
        "handle 0": lambda: Stream.from_external(0),
        "CU_STREAM_LEGACY": lambda: driver.CUstream(1),
        "CU_STREAM_PER_THREAD": lambda: Stream.from_external(2),
        "raw int 2": lambda: 2,
    }[which]()
    model, _xh, x, out = model_io(rng, stream)
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


# -- what the driver refuses inside a capture -----------------------------------------------------
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
    usable_afterwards(blocking, rng)


def test_legacy_work_beside_a_non_blocking_capture_is_allowed(stream, rng):
    # A non-blocking stream does not synchronise with the legacy stream, so nothing implicit joins
    # the capture: the driver allows it, and the graph holds only the recorded node.
    with Capture(stream) as cap:
        cap.launch(ops.empty(get_device()))
        ops.empty(get_device())(Stream.legacy())
    assert cap.graph.node_count() == 1
    usable_afterwards(stream, rng)


def test_sync_during_capture_is_unsupported_and_invalidates(stream, rng):
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            stream.synchronize()
    assert info.value.name == UNSUPPORTED and info.value.call == "cuStreamSynchronize"
    assert "not allowed while a stream is capturing" in info.value.hint
    assert cap.end_result == INVALIDATED
    usable_afterwards(stream, rng)


def test_stream_query_during_capture(stream, rng):
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            stream.query()
    assert info.value.name == UNSUPPORTED and info.value.call == "cuStreamQuery"
    assert cap.end_result == INVALIDATED
    usable_afterwards(stream, rng)


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
    usable_afterwards(stream, rng)


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
    usable_afterwards(stream, rng)


def test_context_fence_is_refused_while_any_thread_captures_and_stream_reads_work(rng):
    """8 threads capture in thread-local mode at once; meanwhile another thread reads weights
    back (stream-ordered: fine) and tries the context-wide fences (refused before the driver)."""
    n = 8
    models = [TinyBlock(64, 2, 2, seed=int(rng.integers(1 << 30)), form="fused") for _ in range(n)]
    inputs = [random_input(rng, (2, 64)) for _ in range(n)]
    captured, errors = {}, []
    began, release_ = threading.Barrier(n + 1, timeout=60), threading.Barrier(n + 1, timeout=60)

    def capture(i):
        try:
            s = Stream()
            x, out = DeviceBuffer.from_numpy(inputs[i], stream=s), DeviceBuffer((2, 64))
            plan = models[i].plan(x, out)
            plan.run(s)
            s.synchronize()
            with Capture(s, CaptureMode.THREAD_LOCAL) as cap:
                cap.run(plan)
                began.wait()
                release_.wait()
            captured[i] = (cap.graph, s, out)
        except Exception as exc:  # reported below, with the thread
            errors.append((i, exc))
            began.abort()
            release_.abort()

    threads = [threading.Thread(target=capture, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    began.wait()
    assert len(_capturing.active()) == n
    ref0 = models[0].reference(inputs[0])  # weights read on a private stream
    probe = DeviceBuffer.from_numpy(inputs[1], stream=Stream())
    with pytest.raises(CaptureRefusedError, match="context-wide fence"):
        probe.to_numpy()
    with pytest.raises(CaptureRefusedError, match="context-wide fence"):
        get_device().synchronize()
    np.testing.assert_array_equal(probe.to_numpy(Stream()), inputs[1])
    release_.wait()
    for t in threads:
        t.join()
    assert errors == []
    for i, (graph, s, out) in captured.items():
        out.poison(s)
        graph.instantiate().launch(s)
        ref = ref0 if i == 0 else models[i].reference(inputs[i], s)
        assert rel_err(out.to_numpy(s), ref) < 1e-5, f"thread {i}, seed {rng.seed_used}"


# -- ending and beginning in the wrong place (driver level: what rawgraph's Capture prevents) -------
def test_end_capture_on_the_wrong_stream(rng):
    a, b = Stream(), Stream()
    check(driver.cuStreamBeginCapture(a.handle, GLOBAL.value), "cuStreamBeginCapture")
    err, graph = driver.cuStreamEndCapture(b.handle)
    assert error_name(err) == ILLEGAL_STATE and not int(graph or 0)
    assert a.is_capturing() and not b.is_capturing()
    graph = check(driver.cuStreamEndCapture(a.handle), "cuStreamEndCapture")
    check(driver.cuGraphDestroy(graph))
    usable_afterwards(a, rng)
    usable_afterwards(b, rng)


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
    usable_afterwards(a, rng)
    usable_afterwards(b, rng)


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
    usable_afterwards(stream, rng)


# -- the stream stays usable after every way a capture can fail ------------------------------------
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
    usable_afterwards(stream, rng)


def test_a_swallowed_capture_error_still_fails_at_exit(stream):
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            try:
                stream.synchronize()
            except CaptureError:
                pass  # the body carries on as if nothing happened
    err = info.value
    assert err.name == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" and err.call == "cuStreamEndCapture"
    assert "caught 1 driver error" in str(err) and "cuStreamSynchronize" in str(err)
    assert isinstance(err.__cause__, CaptureError) and err.__cause__.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert cap.graph is None and not stream.is_capturing()


def test_a_swallowed_launch_error_fails_the_capture_whatever_the_driver_did(stream):
    bad = ops.empty(get_device())
    bad.shared_mem = 1 << 30
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(get_device()))
            try:
                bad(stream)
            except CudaError:
                pass
    assert isinstance(info.value.__cause__, CudaError) and info.value.__cause__.name == "CUDA_ERROR_INVALID_VALUE"
    assert cap.graph is None and not stream.is_capturing()


# -- a capture abandoned half-way, and releases at a capture's edges ---------------------------------
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
    usable_afterwards(stream, rng)


def test_a_stream_closed_mid_capture_ends_the_capture(rng):
    s = Stream()
    with pytest.raises(ClosedError, match="closed during the capture"):
        with Capture(s) as cap:
            cap.launch(ops.empty(get_device()))
            s.close()
    assert cap.graph is None and _capturing.active() == []
    get_device().synchronize()
    with Stream() as fresh:
        usable_afterwards(fresh, rng)


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
        usable_afterwards(fresh, rng)


@pytest.mark.parametrize("edge", ["begin", "end"])
def test_a_buffer_collected_at_the_edge_of_a_capture_is_freed_after_it_not_into_it(
    stream, rng, monkeypatch, recwarn, edge
):
    width, batch = 128, 2
    model = TinyBlock(width, batch, 2, seed=int(rng.integers(1 << 30)), form="fused")
    x = DeviceBuffer.from_numpy(random_input(rng, (batch, width)), stream=stream)
    out = DeviceBuffer((batch, width))
    plan = model.plan(x, out)
    plan.run(stream)
    eager = out.to_numpy(stream)
    out.poison(stream)
    wrapper = cyclic_buffer()
    ptr = wrapper[1]
    doomed = [wrapper[0]]
    del wrapper
    collect_at(edge, "cuStreamBeginCapture", doomed, monkeypatch)
    graph = capture_plan(plan, stream, warmup=False)  # a cuMemFree inside it would invalidate it
    monkeypatch.undo()
    assert is_freed(ptr), "the collected buffer was never freed once the capture ended"
    assert not [w for w in recwarn if issubclass(w.category, ReleaseWarning)], [str(w.message) for w in recwarn]
    graph.instantiate().launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), eager)


# -- the static graph's lifetime ------------------------------------------------------------------
def test_outputs_stay_valid_after_the_graph_is_destroyed(stream, rng):
    model, xh, x, _out = model_io(rng, stream, width=128, batch=3, layers=2, form="fused")
    static = StaticGraph(model, stream)
    result = static(x, stream)
    expected = eager_output(model, x, stream)
    static.close()
    assert static.closed and static.static_input.closed and not result.closed
    np.testing.assert_array_equal(result.to_numpy(stream), expected)
    with pytest.raises(ClosedError):
        static(x, stream)
    del static
    gc.collect()
    np.testing.assert_array_equal(result.to_numpy(stream), expected)
