"""rawgraph.trace without a GPU: the Chrome trace is valid Trace Event Format, the fake driver's calls
appear as host spans, the CUDA-event fallback is labelled, the driver's functions are the very
objects they were once a tracer ends (error or not, nested with the fake driver either way), a
second tracer is refused, the latency model reads launch-bound steps from device gaps, and
``rawgraph trace`` refuses cleanly without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cuda.bindings import driver

from rawgraph.runtime.device import gpu_available
from rawgraph.runtime.errors import RawgraphError
from rawgraph.trace import DeviceSpan, HostSpan, PathMark, TraceActiveError, TraceError, Tracer, TraceWarning
from rawgraph.trace.model import LAUNCH_BOUND_IDLE, fit
from rawgraph.trace.records import chrome_trace


def driver_functions() -> dict:
    return {n: getattr(driver, n) for n in dir(driver) if n.startswith("cu")}


def same_functions(before: dict) -> list[str]:
    """The names whose attribute is not the very object it was (``is``)."""
    return [n for n, fn in before.items() if getattr(driver, n) is not fn]


def trace_problems(doc: dict) -> list[str]:
    """What makes ``doc`` invalid Trace Event Format, as a trace viewer reads it: every event has
    ph/ts/pid/tid; complete events have dur >= 0; complete events of one row (pid, tid) nest (none
    starts inside another and ends after it); span ids are unique; each flow id is one start and
    one finish. Also used by tests/test_trace_gpu.py."""
    problems = []
    events = doc["traceEvents"]
    for e in events:
        missing = [k for k in ("ph", "ts", "pid", "tid") if k not in e]
        if missing:
            problems.append(f"{e.get('name')}: no {missing}")
        if e.get("ph") == "X" and not e.get("dur", -1) >= 0:
            problems.append(f"{e.get('name')}: dur {e.get('dur')}")
    rows: dict = {}
    for e in events:
        if e.get("ph") == "X":
            rows.setdefault((e["pid"], e["tid"]), []).append(e)
    for row, spans in rows.items():
        stack: list[float] = []
        for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
            end = round(e["ts"] + e["dur"], 3)
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            if stack and end > stack[-1]:
                problems.append(f"row {row}: {e['name']} at {e['ts']} ends after the span it starts in")
            stack.append(end)
    ids = [e["args"]["span_id"] for e in events if e.get("ph") in ("X", "i")]
    if len(ids) != len(set(ids)):
        problems.append("span ids repeat")
    flows: dict = {}
    for e in events:
        if e.get("ph") in ("s", "f"):
            flows.setdefault(e["id"], []).append(e["ph"])
    problems += [f"flow {i}: {phs}" for i, phs in flows.items() if sorted(phs) != ["f", "s"]]
    return problems


@pytest.fixture
def block(fake_driver):
    """A TinyBlock on the fake driver: (fake, stream, plan, graph, exec), closed after the test."""
    from rawgraph import DeviceBuffer, Stream, TinyBlock, capture_plan

    s = Stream()
    model = TinyBlock(64, 1, 2, seed=1, form="unfused")
    x, out = DeviceBuffer((1, 64)), DeviceBuffer((1, 64))
    plan = model.plan(x, out)
    graph = capture_plan(plan, s)
    exe = graph.instantiate()
    yield fake_driver, s, plan, graph, exe
    s.synchronize()
    for obj in (exe, graph, model, x, out, s):
        obj.close()


def _traced(block, steps=3, **options):
    fake, s, plan, graph, exe = block
    with Tracer(**options) as t:
        t.label_graph(graph, "tinyblock")
        with t.path("stream"):
            for _ in range(steps):
                with t.step(s):
                    plan.run(s)
        with t.path("graph"):
            for _ in range(steps):
                with t.step(s):
                    exe.launch(s)
        s.synchronize()
    return t


def test_the_json_is_valid_trace_event_format(block, tmp_path):
    t = _traced(block)
    path = t.write(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    assert trace_problems(doc) == []
    assert doc["metadata"]["device_source"] == "events"
    names = {(e["name"], e["args"]["name"]) for e in doc["traceEvents"] if e["ph"] == "M" and "name" in e["args"]}
    assert any(n == "process_name" and v.startswith("host") for n, v in names)
    assert any(n == "process_name" and v.startswith("GPU 0") for n, v in names)  # the device rows
    # a path span holds its steps, a step its driver calls: one row, nested
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == doc["traceEvents"][0]["pid"]]
    assert {e["cat"] for e in spans} >= {"path", "step", "launch", "graph"}


def test_the_fake_drivers_calls_are_host_spans(block):
    fake, s, plan, graph, exe = block
    t = _traced(block, steps=4)
    stream_hex = f"0x{int(s.handle):x}"
    steps = {p: [h for h in t.host if h.cat == "step" and h.path.name == p] for p in ("stream", "graph")}
    assert [len(v) for v in steps.values()] == [4, 4]
    for st in steps["stream"]:
        calls = [h for h in t.host if h.step == st.step and h.cat == "launch"]
        assert [c.args["kernel"] for c in calls] == [l.kernel.name for l in plan.launches]
        assert all(c.args["stream"] == stream_hex and c.error == "" for c in calls)
        assert all(st.start_ns <= c.start_ns <= c.end_ns <= st.end_ns for c in calls)
    for st in steps["graph"]:
        calls = [h for h in t.host if h.step == st.step and h.cat != "step"]
        assert [c.name for c in calls] == ["cuGraphLaunch"]
        assert calls[0].args == {"exec": f"0x{int(exe.handle):x}", "stream": stream_hex}
    # every launch the fake logged in the block is one span
    assert sum(1 for h in t.host if h.name == "cuGraphLaunch") == 4
    assert sum(1 for h in t.host if h.cat == "launch") == 4 * len(plan.launches)


def test_the_event_fallback_is_labelled_with_one_device_span_per_step(block):
    t = _traced(block)
    meta = t.metadata()
    assert meta["device_source"] == "events"
    assert "fake driver" in meta["device_source_reason"]
    steps = [d for d in t.device_spans if d.kind == "step"]
    assert len(steps) == 6 and all(d.end_ns >= d.start_ns for d in steps)
    assert sorted(d.args["step"] for d in steps) == sorted(h.step for h in t.host if h.cat == "step")
    model = t.latency_model()
    assert [p.path for p in model.paths] == ["stream", "graph"]
    assert all(p.gap_us is None and p.launch_bound is None for p in model.paths)  # no per-kernel rows
    assert meta["latency_model"]["source"] == "events"
    labels = meta["graphs"]["tinyblock"]
    assert [lab["launch"] for lab in labels] == [n.launch.label for n in block[3].nodes]
    assert labels[0]["buffers"] == {a: u.buffer for a, u in block[3].nodes[0].launch.uses.items()}


def test_cupti_is_refused_over_the_fake_driver(fake_driver):
    before = driver_functions()
    with pytest.raises(TraceError, match="fake driver"):
        with Tracer(device="cupti"):
            pass
    assert same_functions(before) == []
    with Tracer(device="none") as t:  # and the slot was released
        pass
    assert t.device_source == "none"


def test_without_a_driver_auto_falls_back_to_events_and_says_why():
    if gpu_available():
        pytest.skip("this machine has a GPU: CUPTI may start")
    with Tracer() as t:
        pass
    assert t.device_source == "events" and t.device_source_reason  # cupti-python missing, or no driver for it
    assert t.metadata()["device_source_reason"] == t.device_source_reason


def test_tracing_off_leaves_the_drivers_functions_as_they_were():
    before = driver_functions()
    with Tracer(device="none") as t:
        assert driver.cuLaunchKernel is not before["cuLaunchKernel"]  # wrapped while active
        assert driver.cuLaunchKernel.__wrapped__ is before["cuLaunchKernel"]
        assert driver.cuFuncGetAttribute is before["cuFuncGetAttribute"]  # outside the default selection
    assert same_functions(before) == []
    assert t.metadata()["calls_wrapped"] == len(t.calls) > 20


def test_an_exception_in_the_block_restores_the_driver():
    before = driver_functions()
    with pytest.raises(ZeroDivisionError):
        with Tracer(device="none", calls="all"):
            raise ZeroDivisionError("inside the block")
    assert same_functions(before) == []
    with Tracer(device="none"):  # the slot is free again
        pass


def test_a_second_tracer_is_refused_and_a_tracer_is_single_use():
    before = driver_functions()
    outer = Tracer(device="none")
    with outer:
        with pytest.raises(TraceActiveError) as info:
            with Tracer(device="none"):
                pass
        assert isinstance(info.value, RawgraphError)
        assert outer.active and driver.cuGraphLaunch.__wrapped__ is before["cuGraphLaunch"]
    assert same_functions(before) == []
    with pytest.raises(TraceError, match="single-use"):
        with outer:
            pass
    with pytest.raises(TraceError, match="outside"):
        with outer.step():
            pass


def test_nested_with_the_fake_driver_in_either_order():
    from rawgraph.testing.fakedriver import FakeDriver, fake_driver_session

    before = driver_functions()
    with Tracer(device="none") as t:  # the fake installed over the wrappers, and taken off first
        with fake_driver_session():
            from rawgraph import Stream

            Stream().synchronize()
        assert driver.cuGraphLaunch.__wrapped__ is before["cuGraphLaunch"]
    assert same_functions(before) == []
    assert not [h for h in t.host if h.name == "cuStreamSynchronize"]  # the fake's calls bypassed the wrappers
    with fake_driver_session() as fake:
        inside = driver_functions()
        with Tracer(device="none"):
            assert driver.cuGraphLaunch.__wrapped__ is inside["cuGraphLaunch"]
        assert same_functions(inside) == []
        assert FakeDriver.installed is fake
    assert same_functions(before) == []
    # Not nested: the fake installed inside the tracer and taken off after it. The tracer cannot take
    # its wrappers off functions it no longer holds; they stay, passing calls through, and it warns.
    fake = FakeDriver()
    try:
        with pytest.warns(TraceWarning, match="passing calls through"):
            with Tracer(device="none") as t:
                fake.install()
        fake.uninstall()
        assert t.notes and driver.cuGraphLaunch.__wrapped__ is before["cuGraphLaunch"]
        with Tracer(device="none") as t2:  # a later tracer is not fooled by the stale wrapper
            pass
        assert t2.host == []
    finally:
        fake.uninstall()
        for name, fn in before.items():
            setattr(driver, name, fn)
    assert same_functions(before) == []


def test_doctor_findings_and_verify_results_are_instants_on_their_nodes(block):
    from rawgraph.doctor.report import Finding, Report
    from rawgraph.doctor.verify import VerifyResult

    graph = block[3]
    t = _traced(block, steps=1)
    node = graph.nodes[2]
    finding = Finding(1, "dangling", "error", 2, "kernel", node.launch.kernel.name, 0x1000, "freed", "keep it alive")
    finding = Finding(**{**finding.__dict__, "path": "2", "node_id": int(node.handle)})
    assert t.add_findings(Report(findings=[])) == []
    (ev,) = t.add_findings(Report(findings=[finding]))
    assert ev.cat == "doctor" and ev.args["launch"] == node.launch.label and ev.args["node"] == 2
    (ev,) = t.add_findings(VerifyResult(ok=False, node=1, node_label="L0.relu"))
    assert ev.cat == "verify" and "first diverging node 1" in ev.name
    with pytest.raises(TypeError):
        t.add_findings(object())
    doc = t.to_chrome()
    assert trace_problems(doc) == []
    assert [e["cat"] for e in doc["traceEvents"] if e["ph"] == "i"] == ["doctor", "verify"]


def _span(i, name, cat, t0, t1, path=None, step=-1, args=None):
    return HostSpan(i, name, cat, t0, t1, 7, args or {}, "", path, step)


def test_the_latency_model_reads_launch_bound_steps_from_device_gaps():
    """Synthetic CUPTI-like spans: eager steps whose kernels wait for each launch (2 us kernels,
    3 us apart) and a replay whose kernels run back to back."""
    host, device, corr = [], [], {}
    ids = iter(range(1, 1000))
    eager, replay = PathMark("stream", 0, 0, 100_000), PathMark("graph", 1, 100_000, 200_000)
    for k in range(3):  # eager: 4 launches of 1 us each, every 3 us
        t0 = k * 20_000
        sid = next(ids)
        for j in range(4):
            cid = next(ids)
            host.append(_span(cid, "cuLaunchKernel", "launch", t0 + 3000 * j, t0 + 3000 * j + 1000, eager, k))
            corr[cid] = 500 + 10 * k + j
            start = t0 + 3000 * j + 2000
            device.append(DeviceSpan("kernel", f"k{j}", start, start + 2000, 0, 1, 500 + 10 * k + j))
        host.append(_span(sid, "step", "step", t0, t0 + 13_000, eager, k, {"index": k}))
    for k in range(3):  # replay: one launch, 4 kernels back to back
        t0 = 100_000 + k * 20_000
        sid, cid = next(ids), next(ids)
        host.append(_span(cid, "cuGraphLaunch", "graph", t0, t0 + 2000, replay, 10 + k))
        corr[cid] = 900 + k
        for j in range(4):
            start = t0 + 3000 + 2100 * j
            device.append(
                DeviceSpan("kernel", f"k{j}", start, start + 2000, 0, 1, 900 + k, graph_id=3, graph_node_id=j + 1)
            )
        host.append(_span(sid, "step", "step", t0, t0 + 2500, replay, 10 + k, {"index": 10 + k}))
    model = fit(host, device, corr, "cupti")
    stream, graph = model.paths
    assert (stream.path, stream.steps, stream.calls_per_step, stream.host_launch_us) == ("stream", 3, 4.0, 4.0)
    assert stream.gap_us == pytest.approx(1.0) and stream.launch_bound
    assert stream.idle_fraction == pytest.approx(3 / 11) and stream.idle_fraction > LAUNCH_BOUND_IDLE
    assert graph.gap_us == pytest.approx(0.1) and not graph.launch_bound
    assert graph.host_launch_us == 2.0 and graph.kernels == {f"k{j}": 2.0 for j in range(4)}
    assert "stream" in model.table() and "launch" in model.table()
    doc = chrome_trace(host, device, [], 0, {"latency_model": model.to_dict()}, corr)
    assert trace_problems(doc) == []
    flows = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == 12 + 3  # each launch to its first device span


def test_overlapping_device_spans_of_one_stream_go_to_lanes():
    """A programmatic dependent launch starts before the kernel it follows ends: one row of a
    viewer only nests, so the overlapping span gets a row of its own."""
    device = [
        DeviceSpan("kernel", "a", 0, 5000, 0, 1),
        DeviceSpan("kernel", "b", 4000, 9000, 0, 1),
        DeviceSpan("kernel", "c", 9000, 9500, 0, 1),
    ]
    doc = chrome_trace([], device, [], 0, {})
    assert trace_problems(doc) == []
    tids = {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert tids["a"] == tids["c"] != tids["b"]
    rows = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
    assert rows == ["stream 1", "stream 1 (overlap 1)"]


def test_options_are_checked_before_anything_is_installed():
    before = driver_functions()
    with pytest.raises(ValueError, match="device"):
        Tracer(device="gpu")
    with pytest.raises(ValueError, match="cuNoSuchCall"):
        Tracer(calls=["cuLaunchKernel", "cuNoSuchCall"])
    assert set(Tracer(calls=["cuLaunchKernel"]).calls) == {"cuLaunchKernel"}
    default = Tracer().calls
    for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch", "cuGraphExecKernelNodeSetParams"):
        assert name in default
    assert default["cuMemcpyHtoDAsync"] == "copy" and default["cuStreamSynchronize"] == "sync"
    assert same_functions(before) == []


def test_the_trace_workload_runs_every_path_on_the_fake_driver(fake_driver, monkeypatch, tmp_path):
    """``rawgraph trace``'s workload end to end on the fake: the launch-path runner's set-up and
    its step functions, each path traced. The fake runs no kernel, so the runner's bit-equality
    checks of the outputs are waived here (the GPU test runs them)."""
    from rawgraph.bench import launch_paths
    from rawgraph.bench import trace as bench_trace

    monkeypatch.setattr(launch_paths.np, "array_equal", lambda a, b: True)
    args = bench_trace.build_parser().parse_args(
        ["--width", "64", "--form", "fused", "--no-torch", "--steps", "2", "--out", str(tmp_path), "--no-png"]
    )
    result = bench_trace.run(args)
    assert result["paths_traced"] == [
        "stream",
        "graph",
        "graph_copy",
        "graph_update",
        "graph_update2",
        "graph_indirect",
    ]
    doc = json.loads((tmp_path / "trace_w64_b1_L2_fused.json").read_text())
    assert trace_problems(doc) == []
    assert doc["metadata"]["device_source"] == "events"
    env = doc["metadata"]["environment"]  # a results JSON names its commit and GPU
    assert env["commit"] and env["commit"] == result["env"]["commit"] and "gpu" in env
    assert [p["path"] for p in doc["metadata"]["latency_model"]["paths"]] == result["paths_traced"]
    assert all(p["steps"] == 2 for p in doc["metadata"]["latency_model"]["paths"])
    assert doc["metadata"]["graphs"]  # the graphs capture_plan made, labelled
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert {"capture", "update", "graph", "launch", "copy"} <= cats  # the capture phase is on the timeline
    pytest.importorskip("matplotlib")
    from rawgraph.trace.timeline import draw

    png = draw(doc, tmp_path / "t.png", steps=2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rawgraph_trace_without_a_gpu_exits_69_with_one_line():
    if gpu_available():
        pytest.skip("this machine has a GPU: the command would run")
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "trace", "--width", "128", "--batch", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 69, r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "needs a GPU" in r.stderr


def test_rawgraph_trace_bad_option_is_a_usage_error():
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "trace", "--paths", "nope"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr


def test_spans_carry_their_thread_and_nothing_is_recorded_after_the_block(fake_driver):
    """A call from another thread is a span on that thread's row; a call made after the tracer
    ended is not recorded."""
    import threading

    from rawgraph import Stream

    s = Stream()
    with Tracer(device="none") as t:
        th = threading.Thread(target=s.synchronize)
        th.start()
        th.join()
        s.synchronize()
    n = len(t.host)
    s.synchronize()
    assert len(t.host) == n == 2
    assert [h.thread == threading.get_native_id() for h in t.host] == [False, True]
    assert trace_problems(t.to_chrome()) == []
    s.close()


# -- the CUPTI path on the CPU: tests/fake_cupti.py (the cupti-python API as confirmed) over the fake driver
@pytest.fixture
def cupti_block(block, monkeypatch):
    """``block`` with the fake ``cupti`` watching the fake driver and handed to the tracer as
    cupti-python's module (the tracer otherwise refuses CUPTI over the fake driver)."""
    import fake_cupti

    with fake_cupti.as_cupti_python(monkeypatch, buffer_records=16):  # buffers fill: worker deliveries
        yield (*block, fake_cupti)


def _cupti_traced(cupti_block, steps=3, **options):
    fake, s, plan, graph, exe, fc = cupti_block
    with Tracer(**options) as t:
        exe2 = graph.instantiate()  # inside: the clones are announced
        t.label_graph(graph, "tinyblock")
        with t.path("stream"):
            for _ in range(steps):
                with t.step(s):
                    plan.run(s)
        with t.path("graph"):
            for _ in range(steps):
                with t.step(s):
                    exe2.launch(s)
        s.synchronize()
    exe2.close()
    return t


def test_the_cupti_path_joins_calls_kernels_and_graph_nodes_on_the_fake(cupti_block):
    fake, s, plan, graph, exe, fc = cupti_block
    t = _cupti_traced(cupti_block, device="cupti")
    assert t.device_source == "cupti" and t.notes == []
    st = fc.STATE
    # the calls, in order: registered once; DRIVER on (else no external correlation records); a
    # forced flush before the kinds go off; the subscriber released
    assert st.calls[0] == "activity_register_callbacks"
    enabled = [c.split()[1] for c in st.calls if c.startswith("activity_enable")]
    assert enabled == ["CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "DRIVER", "EXTERNAL_CORRELATION"]
    flush = st.calls.index(f"activity_flush_all {int(fc.ActivityFlag.FLUSH_FORCED)}")
    assert flush < min(i for i, c in enumerate(st.calls) if c.startswith("activity_disable"))
    assert st.enabled == set() and st.subscriber is None and "unsubscribe" in st.calls
    assert {name for name, _ in st.deliveries} == {"cupti-worker", "MainThread"}  # full buffers, then the flush
    # every launch call is joined to its device work through the external correlation records
    corr = t.correlations
    launches = [h for h in t.host if h.cat in ("launch", "graph") and h.name != "cuGraphInstantiateWithFlags"]
    launches = [h for h in launches if h.name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch")]
    assert len(launches) == 3 * len(plan.launches) + 3 and all(h.id in corr for h in launches)
    spans = t.joined_device_spans()
    labels = {lab.node_id: lab for lab in t.labels["tinyblock"]}
    assert all(lab.node_id for lab in labels.values())
    for h in launches:
        mine = [d for d in spans if d.correlation == corr[h.id]]
        assert all(d.start_ns >= h.start_ns for d in mine)  # on the host clock, after the call began
        if h.name == "cuGraphLaunch":
            assert len(mine) == len(graph.nodes)
            assert {d.node_id for d in mine} == set(labels)  # clones mapped back to the graph's nodes
            assert all(d.graph_node_id not in labels for d in mine)
            assert sorted(d.args["node"] for d in mine) == [n.index for n in graph.nodes]
            assert all(d.args["launch"] == labels[d.node_id].launch for d in mine)
        else:
            (d,) = mine
            assert d.kind == "kernel" and d.args["launch"] == h.args["kernel"]  # d.name: the driver's (mangled)
            assert d.args["host_call"] == h.name and d.args["grid"][0] >= 1
    meta = t.metadata()
    assert meta["device_clock"]["clone_map_entries"] == len(graph.nodes)
    model = t.latency_model()
    assert [p.path for p in model.paths] == ["stream", "graph"]
    assert all(p.gap_us is not None and p.kernels for p in model.paths)
    doc = t.to_chrome()
    assert trace_problems(doc) == []
    assert len([e for e in doc["traceEvents"] if e["ph"] == "s"]) == len(launches)  # a flow per launch


def test_the_fake_cupti_writes_external_correlation_only_with_api_records(cupti_block):
    """What the fake mimics of CUPTI (the header: an external correlation record precedes an *API*
    record): without the DRIVER kind the pushed ids are never reported."""
    fake, s, plan, graph, exe, fc = cupti_block
    got = []
    fc.activity_register_callbacks(lambda: (1 << 20, 0), got.extend)
    for kind in (fc.ActivityKind.CONCURRENT_KERNEL, fc.ActivityKind.EXTERNAL_CORRELATION):
        fc.activity_enable(kind)
    fc.activity_push_external_correlation_id(fc.ExternalCorrelationKind.CUSTOM0, 99)
    plan.run(s)
    assert fc.activity_pop_external_correlation_id(fc.ExternalCorrelationKind.CUSTOM0) == 99
    fc.activity_flush_all(0)
    assert got == []  # not full, not forced
    fc.activity_flush_all(int(fc.ActivityFlag.FLUSH_FORCED))
    assert {type(a).__name__ for a in got} == {"ActivityKernel10"}
    assert all(isinstance(a.kind, int) and not isinstance(a.kind, fc.ActivityKind) for a in got)
    fc.activity_disable(fc.ActivityKind.CONCURRENT_KERNEL)
    fc.activity_disable(fc.ActivityKind.EXTERNAL_CORRELATION)
    with pytest.raises(fc.cuptiError):
        fc.activity_pop_external_correlation_id(fc.ExternalCorrelationKind.CUSTOM0)


def test_cupti_under_another_subscriber_keeps_the_exec_node_ids_and_says_so(cupti_block):
    fake, s, plan, graph, exe, fc = cupti_block
    other = fc.subscribe(lambda *a: None, None)  # a profiler holds the one slot
    try:
        t = _cupti_traced(cupti_block, steps=1)
    finally:
        fc.unsubscribe(other)
    assert t.device_source == "cupti"
    assert any("cupti.subscribe" in n and "MULTIPLE_SUBSCRIBERS" in n for n in t.notes)
    graph_spans = [d for d in t.device_spans if d.graph_node_id]
    assert graph_spans and all(d.node_id == d.graph_node_id for d in graph_spans)
    assert t.metadata()["device_clock"]["clone_map_entries"] == 0
    assert not any("node" in d.args for d in t.joined_device_spans())


def test_cupti_records_without_an_end_are_dropped_and_counted(cupti_block):
    fake, s, plan, graph, exe, fc = cupti_block
    fc.STATE.unended = 2
    t = _cupti_traced(cupti_block, steps=1)
    launched = len(plan.launches) + len(graph.nodes)
    assert len([d for d in t.device_spans if d.kind == "kernel"]) == launched - 2
    assert any("2 device record(s) without an end time" in n for n in t.notes)


def test_cupti_copies_memsets_and_odd_records(cupti_block):
    """Copies and memsets on the fake driver become device spans; records the tracer does not use
    (another kind, another external-correlation kind) and a broken buffer never raise into CUPTI's
    thread."""
    import numpy as np

    from rawgraph import DeviceBuffer

    fake, s, plan, graph, exe, fc = cupti_block
    buf = DeviceBuffer((1, 64))
    host = np.zeros(64, np.float32)
    with Tracer(device="cupti") as t:
        with t.path("copy"), t.step(s):
            driver.cuMemsetD32Async(buf.ptr, 7, 64, s.handle)
            driver.cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data, 256, s.handle)
        c = t._collector
        c._completed([fc.ActivityExternalCorrelation(int(fc.ActivityKind.EXTERNAL_CORRELATION), 4, 10**9, 6)])
        c._completed([fc.ActivityAPI(int(fc.ActivityKind.RUNTIME), 0, 1, 2, 3)])
        odd = fc.ActivityMemcpy6(int(fc.ActivityKind.MEMCPY), 10, 20, 0, 1, 0, copy_kind=12345, bytes=8)
        c._completed([odd])
        c._completed([object()])  # no kind: noted, not raised
        s.synchronize()
    buf.close()
    kinds = {d.kind: d for d in t.device_spans}
    assert kinds["memset"].args == {"bytes": 64, "value": 7} and kinds["memset"].name == "memset"
    assert kinds["memcpy"].name == "memcpy HTOD" and kinds["memcpy"].args == {"bytes": 256}
    assert any(d.name == "memcpy 12345" for d in t.device_spans)
    assert 10**9 not in t.correlations  # CUSTOM1 is not ours
    assert any(n.startswith("activity buffer: AttributeError") for n in t.notes)
    assert all(d.correlation in t.correlations.values() for d in t.device_spans if d.name != "memcpy 12345")


def test_cupti_that_fails_to_start_is_undone_and_auto_falls_back(cupti_block, monkeypatch):
    fake, s, plan, graph, exe, fc = cupti_block
    real_enable = fc.activity_enable

    def enable(kind):
        if int(kind) == int(fc.ActivityKind.DRIVER):
            raise fc.cuptiError("ERROR_NOT_COMPATIBLE")
        real_enable(kind)

    monkeypatch.setattr(fc, "activity_enable", enable)
    with Tracer() as t:
        pass
    assert t.device_source == "events" and "CUPTI did not start" in t.device_source_reason
    assert fc.STATE.enabled == set() and fc.STATE.subscriber is None
    with pytest.raises(TraceError, match="ERROR_NOT_COMPATIBLE"):
        with Tracer(device="cupti"):
            pass
    assert fc.STATE.enabled == set()


def test_the_graph_node_cloned_callback_takes_a_bare_pointer_and_never_raises(cupti_block):
    from rawgraph.trace.activity import CuptiCollector

    fake, s, plan, graph, exe, fc = cupti_block
    c = CuptiCollector(fc)
    res, cloned = int(fc.CallbackDomain.RESOURCE), int(fc.CallbackIdResource.GRAPHNODE_CLONED)
    fc.STATE.pointers[0x100] = fc.ResourceData(0, 0x200)
    fc.STATE.pointers[0x200] = fc.GraphData(1, 2, 0xAA, 0xBB, 1, 0, 3)
    c._resource(None, res, cloned, 0x100)  # a CUpti_ResourceData address, not its wrapper
    assert c.clones == {fc.get_graph_node_id(0xAA): fc.get_graph_node_id(0xBB)}
    c._resource(None, res, int(fc.CallbackIdResource.GRAPHNODE_CREATED), 0x100)
    c._resource(None, int(fc.CallbackDomain.DRIVER_API), cloned, 0x100)
    assert len(c.clones) == 1
    c._resource(None, res, cloned, 0xDEAD)  # unknown pointer: noted
    assert c.notes and c.notes[0].startswith("GRAPHNODE_CLONED callback: KeyError")


def test_the_clock_interpolates_between_its_readings(cupti_block):
    """The fake CUPTI clock runs 50 ppm fast from an offset of its own: interpolated between a
    reading at the start and one at the end, a device time lands within the brackets of the host
    time it was taken at; the mean offset alone would be off by the drift."""
    import time

    from rawgraph.trace.activity import Clock

    fake, s, plan, graph, exe, fc = cupti_block
    fc.RATE, rate = 1.01, fc.RATE  # exaggerated, so the drift shows over a short test
    try:
        clock = Clock()
        clock.start, clock.start_at, b0 = Clock.sample(fc.get_timestamp)
        h0 = time.perf_counter_ns()
        d = fc.get_timestamp()
        h1 = time.perf_counter_ns()
        time.sleep(0.1)
        clock.end, clock.end_at, b1 = Clock.sample(fc.get_timestamp)
    finally:
        fc.RATE = rate
    slack = max(b0, b1) + 50_000
    assert h0 - slack <= clock.to_host(d) <= h1 + slack
    assert abs((d - clock.offset) - (h0 + h1) / 2) > 200_000  # the mean offset misses by about half the drift (0.5 ms)
    assert clock.to_host(clock.start_at - 10) == clock.start_at - 10 - clock.start  # held outside
    assert clock.to_host(clock.end_at + 10) == clock.end_at + 10 - clock.end
    assert Clock(start=5).to_host(100) == 95  # one reading: a plain offset


def test_cupti_enable_callback_and_disable_failures_are_undone_and_noted(cupti_block, monkeypatch):
    fake, s, plan, graph, exe, fc = cupti_block

    def no_callback(*args):
        raise fc.cuptiError("ERROR_INVALID_PARAMETER")

    def no_disable(kind):
        raise fc.cuptiError("ERROR_UNKNOWN")

    monkeypatch.setattr(fc, "enable_callback", no_callback)
    with Tracer(device="cupti") as t:
        assert fc.STATE.subscriber is None  # subscribed, then released when enable_callback failed
        monkeypatch.setattr(fc, "activity_disable", no_disable)
    assert "unsubscribe" in fc.STATE.calls
    assert any("cupti.subscribe: ERROR_INVALID_PARAMETER" in n for n in t.notes)
    assert sum("cupti.activity_disable" in n for n in t.notes) == 5


def test_the_trace_workload_makes_no_host_time_loops():
    """The launch-path runner's host-time loops (the adopted graph's apply alone) are not steps:
    under the tracer they would put thousands of spans outside every path, so the tracing runner
    makes none."""
    from rawgraph.bench import trace as bench_trace

    called = []
    assert bench_trace.TracingRunner.host_loop_us(None, [lambda: called.append(1)]) is None
    assert called == []
