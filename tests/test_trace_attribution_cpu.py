"""Which step a device span belongs to, without a GPU: a step on a capturing stream gets no CUDA
events and so no device span (the event fallback), and device spans of launches the tracer does not
wrap (the CUDA runtime's, PyTorch's) are given to the step during which they began, up to the next
step's start, in a step none of whose traced calls launched device work (the CUPTI path, on the
fake CUPTI of ``tests/fake_cupti.py`` over the fake driver)."""

from __future__ import annotations

import time

import pytest
from cuda.bindings import driver

from rawgraph.trace import DeviceSpan, HostSpan, PathMark, Tracer
from rawgraph.trace import model as trace_model


@pytest.fixture
def tiny(fake_driver):
    """A TinyBlock's plan on the fake driver: (fake, stream, plan), closed after the test."""
    from rawgraph import DeviceBuffer, Stream, TinyBlock

    s = Stream()
    model = TinyBlock(64, 1, 2, seed=1, form="unfused")
    x, out = DeviceBuffer((1, 64)), DeviceBuffer((1, 64))
    plan = model.plan(x, out)
    yield fake_driver, s, plan
    s.synchronize()
    for obj in (model, x, out, s):
        obj.close()


# -- 1. the CUDA-event fallback: a step on a capturing stream ---------------------------------------
def test_a_step_on_a_capturing_stream_gets_no_events_and_no_device_span(tiny):
    """The step inside the capture gets no events: no reference event is recorded on its stream (no
    ``cuStreamSynchronize``, which a global capture forbids), the capture ends with the plan's
    kernels only, and the step has no device span; a step on another stream in the same trace
    does."""
    from rawgraph import Stream
    from rawgraph.graphs.capture import Capture

    fake, s, plan = tiny
    other = Stream()
    try:
        with Tracer() as t:
            with t.path("captured"):
                with Capture(s) as cap:
                    with t.step(s) as captured_step:
                        cap.run(plan)
            with t.path("eager"):
                with t.step(other) as eager_step:
                    plan.run(other)
            other.synchronize()
        graph = cap.graph
        assert graph is not None
        assert len(graph.nodes) == len(plan.launches) and graph.foreign_nodes == []
        graph.close()
    finally:
        other.synchronize()
        other.close()
    assert t.device_source == "events"
    assert [d.args["step"] for d in t.device_spans] == [eager_step]  # none for the captured step
    assert captured_step != eager_step
    assert {h.step for h in t.host if h.cat == "step"} == {captured_step, eager_step}
    meta = t.metadata()
    assert meta["device_clock"]["streams"] == 1  # a reference event on the eager step's stream only
    captured, eager = t.latency_model().paths
    assert (captured.path, captured.steps, captured.device_busy_us) == ("captured", 1, None)
    assert eager.path == "eager" and eager.device_busy_us is not None


# -- 2. the CUPTI path: launches the tracer does not wrap -------------------------------------------
@pytest.fixture
def cupti_tiny(tiny, monkeypatch):
    """``tiny`` with the fake ``cupti`` watching the fake driver and handed to the tracer as
    cupti-python's module (the tracer otherwise refuses CUPTI over the fake driver)."""
    import fake_cupti

    with fake_cupti.as_cupti_python(monkeypatch):
        yield (*tiny, fake_cupti)


@pytest.fixture
def steps_seen(monkeypatch):
    """The device spans :func:`rawgraph.trace.model.fit` counted for each step, in step order (its
    per-step union is spied on: a step with no spans is not called)."""
    seen: list[list[DeviceSpan]] = []
    union = trace_model._union_and_gaps

    def spy(spans):
        seen.append(sorted(spans, key=lambda d: d.start_ns))
        return union(spans)

    monkeypatch.setattr(trace_model, "_union_and_gaps", spy)
    return seen


def _runtime_launcher():
    """``cuLaunchKernel`` as it is before a tracer wraps it, here the fake CUPTI's watcher over the
    fake driver: a launch through it is seen by CUPTI but makes no host span and pushes no external
    correlation id, like a kernel PyTorch launches through the CUDA runtime."""
    unwrapped = driver.cuLaunchKernel

    def launch(launches, stream):
        for lau in launches:
            f, gx, gy, gz, bx, by, bz, sm, a = lau.packed()
            (err,) = unwrapped(f, gx, gy, gz, bx, by, bz, sm, stream.handle, a, 0)
            assert err == driver.CUresult.CUDA_SUCCESS

    return launch


def test_runtime_kernels_go_to_the_step_during_which_they_began(cupti_tiny, steps_seen):
    """Three steps launch 1, 2 and 3 kernels outside the tracer's wrappers: no host spans, device
    spans with a correlation id no traced call has, each counted in the model for the step during
    which it began (a kernel that began after its step's end, before the next step's start, too)."""
    fake, s, plan, fc = cupti_tiny
    runtime = _runtime_launcher()
    with Tracer(device="cupti") as t:
        with t.path("runtime"):
            for k in range(3):
                with t.step(s):
                    runtime(plan.launches[: k + 1], s)
                time.sleep(0.002)  # the kernels of a step have begun before the next step starts
        s.synchronize()
    assert t.device_source == "cupti"
    assert [h for h in t.host if h.cat == "launch"] == []  # no host span of the runtime's launches
    kernels = [d for d in t.device_spans if d.kind == "kernel"]
    assert len(kernels) == 1 + 2 + 3
    assert not {d.correlation for d in kernels} & set(t.correlations.values())
    model = t.latency_model()
    (runtime_path,) = model.paths
    assert (runtime_path.path, runtime_path.steps, runtime_path.calls_per_step) == ("runtime", 3, 0.0)
    assert runtime_path.device_busy_us is not None and runtime_path.kernels
    # each step counted exactly the kernels that began from its start to the next step's start
    steps = sorted((h for h in t.host if h.cat == "step"), key=lambda h: h.start_ns)
    path_end = steps[0].path.end_ns
    until = [st.start_ns for st in steps[1:]] + [path_end]
    assert [len(dev) for dev in steps_seen] == [1, 2, 3]
    for st, end, dev in zip(steps, until, steps_seen):
        assert all(st.start_ns <= d.start_ns < end for d in dev)
    assert sorted((d for dev in steps_seen for d in dev), key=lambda d: d.start_ns) == sorted(
        kernels, key=lambda d: d.start_ns
    )
    names = [fake.functions[int(lau.kernel.handle)].name for lau in plan.launches]
    assert [[d.name for d in dev] for dev in steps_seen] == [names[: k + 1] for k in range(3)]


def test_runtime_kernels_in_a_step_whose_traced_calls_launched_work_are_left_out(cupti_tiny, steps_seen):
    """A step that makes a traced launch and a launch outside the tracer's wrappers: the model counts
    the traced launch's device span only (through its correlation id); the other kernel, which
    began during the step, is on the device rows of the trace but in no step of the model."""
    fake, s, plan, fc = cupti_tiny
    runtime = _runtime_launcher()
    first, second = plan.launches[0], plan.launches[1]
    with Tracer(device="cupti") as t:
        with t.path("mixed"):
            with t.step(s):
                first(s)  # traced: a host span whose correlation id its kernel carries
                runtime([second], s)
        s.synchronize()
    kernels = sorted((d for d in t.device_spans if d.kind == "kernel"), key=lambda d: d.start_ns)
    assert len(kernels) == 2
    traced, untraced = kernels
    assert traced.correlation in t.correlations.values()
    assert untraced.correlation not in t.correlations.values()
    (step,) = [h for h in t.host if h.cat == "step"]
    assert step.start_ns <= untraced.start_ns < step.path.end_ns  # it began during the step
    (mixed,) = t.latency_model().paths
    assert [[d.correlation for d in dev] for dev in steps_seen] == [[traced.correlation]]
    assert list(mixed.kernels) == [first.kernel.name]  # the traced launch's kernel name only
    device_rows = [e for e in t.to_chrome()["traceEvents"] if e.get("cat") == "kernel"]
    assert len(device_rows) == 2  # both kernels are on the timeline


def test_loose_spans_are_given_by_start_time_from_a_steps_start_to_the_next_steps_start(steps_seen):
    """Synthetic spans with no traced call's correlation id, against steps at 0-10, 20-30 and 40-50
    µs of a path that ends at 60 µs: a span that began before the first step, or after the path
    ended, is in no step; one that began after a step's end and before the next step's start
    belongs to the earlier step, one that began at a step's very start to that step; the last step
    takes spans up to the path's end."""
    path = PathMark("runtime", 0, 0, 60_000)
    host = [
        HostSpan(100 + k, "step", "step", 20_000 * k, 20_000 * k + 10_000, 7, {"index": k}, "", path, k)
        for k in range(3)
    ]
    starts = {"before": -5_000, "a": 1_000, "b": 15_000, "c": 20_000, "d": 45_000, "e": 55_000, "after": 65_000}
    device = [
        DeviceSpan("kernel", n, t0, t0 + 2_000, 0, 1, correlation=900 + i) for i, (n, t0) in enumerate(starts.items())
    ]
    model = trace_model.fit(host, device, {}, "cupti")
    assert [[d.name for d in dev] for dev in steps_seen] == [["a", "b"], ["c"], ["d", "e"]]
    (p,) = model.paths
    assert sorted(p.kernels) == ["a", "b", "c", "d", "e"]
