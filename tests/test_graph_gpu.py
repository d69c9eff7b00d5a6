"""Graphs and their execs (rawgraph.graphs.graph: ``Graph``, ``GraphExec``): instantiate, upload,
replay on any stream (uploaded or not, blocking or not), repeated replays, two execs replaying
concurrently on two streams, recapture of one plan and one graph instantiated twice; and their
lifetime and error cases: close twice, use after close refused, and closing an exec, its graph
and its model with a replay still in flight.

Capture itself is in ``tests/test_capture_gpu.py``, whole-graph update in ``tests/test_update_gpu.py``."""

import time

import numpy as np
import pytest
from helpers import UNDER_SANITIZER, eager_output, model_io, random_input, rel_err, spin_after_collecting, spin_ns

from rawgraph import (
    Capture,
    ClosedError,
    DeviceBuffer,
    ExecUpdateManager,
    LaunchPlan,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(100_000_000)  # 100 ms: long enough that everything queued behind it is still waiting


def test_replay_on_another_stream_with_and_without_upload(stream, rng):
    model, xh, x, out = model_io(rng, stream, form="fused", layers=2)
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


def test_recapture_and_instantiating_one_graph_twice(stream, rng):
    model, xh, x, out = model_io(rng, stream, width=128, batch=2, layers=2, form="fused")
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
    np.testing.assert_array_equal(out.to_numpy(stream), eager_output(model, x, stream))
    np.testing.assert_array_equal(out2.to_numpy(stream), eager_output(model, x2, stream))


def test_graph_and_exec_close(stream):
    model = TinyBlock(16, 1, 1)
    x, out = DeviceBuffer((1, 16)), DeviceBuffer((1, 16))
    x.poison(stream)
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    exe.close()
    exe.close()
    with pytest.raises(ClosedError):
        exe.launch(stream)
    graph.close()
    graph.close()
    with pytest.raises(ClosedError):
        graph.instantiate()


def test_destroying_exec_graph_and_model_with_a_replay_in_flight(stream, rng):
    model, xh, x, out = model_io(rng, stream, width=256, batch=4, layers=4, form="fused")
    ref = model.reference(xh, stream)
    graph = capture_plan(model.plan(x, out), stream)
    exe = graph.instantiate()
    out.poison(stream)
    spin_after_collecting(get_device(), SPIN_NS, stream)
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
