"""Lifetime defects: each test failed before its fix (see docs/semantics.md, "Lifetimes")."""

import gc
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import device_inputs, eager_output, random_input, rel_err, spin_ns, tiny_model

from rawgraph import (
    BucketGraphs,
    Capture,
    CaptureError,
    CaptureMode,
    CaptureRefusedError,
    CudaError,
    DeviceBuffer,
    ExecUpdateManager,
    IndirectGraph,
    ReshapedGraph,
    RowCountBuckets,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)
from rawgraph.runtime import _capturing
from rawgraph.runtime.errors import ReleaseWarning, call, check

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(200_000_000)  # 200 ms queued in front: long against the Python that follows a launch


def test_a_capture_object_is_single_use(stream):
    with Capture(stream) as cap:
        cap.launch(ops.empty(get_device()))
    with pytest.raises(CaptureRefusedError, match="single-use"):
        with cap:
            cap.launch(ops.empty(get_device()))
    assert len(cap.nodes) == 1 and cap.graph.node_count() == 1
    assert not stream.is_capturing()


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


def test_a_failed_release_warns_with_the_call_name():
    buf = DeviceBuffer(16)
    check(driver.cuMemFree(buf._ptr))  # freed behind the owner's back
    with pytest.warns(ReleaseWarning, match="cuMemFree failed.*CUDA_ERROR_INVALID_VALUE"):
        buf.close()
    other = DeviceBuffer(16)
    check(driver.cuMemFree(other._ptr))
    with pytest.warns(ReleaseWarning, match="cuMemFree failed"):
        del other
        gc.collect()


def test_a_failed_release_at_interpreter_exit_is_quiet():
    code = textwrap.dedent(
        """
        from cuda.bindings import driver
        from rawgraph import DeviceBuffer
        buf = DeviceBuffer(16)
        driver.cuMemFree(buf._ptr)  # its release at exit fails
        """
    )
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


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


@pytest.mark.parametrize("kind", ["buckets", "row_count", "reshaped"])
def test_a_run_on_a_new_stream_waits_for_one_queued_on_a_closed_stream(device, stream, rng, kind):
    model = tiny_model(rng, batch=4)
    _, (x1, x2) = device_inputs(rng, model, 2, stream)
    want = eager_output(model, x2, stream)
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
