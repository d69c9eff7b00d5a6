"""rawgraph.trace on the GPU: CUPTI's device spans of a graph replay are one per kernel node, carrying
the graph's own node ids (read back) and rawgraph's node map; their durations agree with CUDA-event
timings of the same kernels; eager launches of a small TinyBlock leave the device idle between
kernels (the host's launches on the critical path) where the graph's replay does not; the
``rawgraph trace`` command writes a valid trace; and the driver's functions are untouched once a
tracer has ended, so the hot paths cost what they cost before."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from statistics import median

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import spin_ns
from test_trace_cpu import driver_functions, same_functions, trace_problems

from rawgraph import DeviceBuffer, ExecUpdateManager, TinyBlock, capture_plan, get_device, ops
from rawgraph.graphs.nodes import read_graph
from rawgraph.runtime.stream import Event
from rawgraph.trace import Tracer

pytestmark = pytest.mark.gpu


def _cupti():
    """cupti-python's module, or the test is skipped with why."""
    from rawgraph.trace.activity import load_cupti

    mod, why = load_cupti()
    if mod is None:
        pytest.skip(f"the CUPTI tests need cupti-python (pip install 'rawgraph[trace]'): {why}")
    return mod


def _block(width, batch, layers, form="unfused", pdl=None):
    model = TinyBlock(width, batch, layers, seed=3, form=form, **({} if pdl is None else {"pdl": pdl}))
    rng = np.random.default_rng(3)
    x = DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32))
    out = DeviceBuffer((batch, width))
    return model, x, out, model.plan(x, out)


def test_replay_device_spans_are_one_per_kernel_node_with_the_graphs_node_ids(stream):
    cupti = _cupti()
    model, x, out, plan = _block(128, 1, 2)
    graph = capture_plan(plan, stream)
    kernels = [n for n in read_graph(graph) if n.kind == "kernel"]
    want_ids = {int(cupti.get_graph_node_id(int(n.handle))) for n in kernels}
    assert len(kernels) == len(graph.nodes) == len(plan.launches)
    with Tracer(device="cupti") as t:
        exe = graph.instantiate()  # inside the tracer: CUPTI sees the nodes cloned into the exec
        t.label_graph(graph, "tinyblock")
        with t.path("graph"):
            for _ in range(3):
                with t.step(stream):
                    exe.launch(stream)
        stream.synchronize()
    assert t.device_source == "cupti", t.device_source_reason
    spans = t.joined_device_spans()
    corr = {h.id: t.correlations.get(h.id) for h in t.host if h.name == "cuGraphLaunch"}
    assert len(corr) == 3 and all(corr.values()), corr
    labels = {n.index: n.launch.label for n in graph.nodes}
    for launch_id, c in corr.items():
        mine = [d for d in spans if d.correlation == c]
        assert len(mine) == len(kernels), (launch_id, [d.name for d in mine])
        assert all(d.kind == "kernel" and d.graph_id and d.graph_node_id for d in mine)
        assert {d.node_id for d in mine} == want_ids, "node ids differ from the graph's (GRAPHNODE_CLONED map)"
        assert sorted(d.args["node"] for d in mine) == sorted(labels)
        assert all(d.args["launch"] == labels[d.args["node"]] for d in mine)
        assert all(isinstance(d.args["buffers"], dict) for d in mine)
    doc = t.to_chrome()
    assert trace_problems(doc) == []
    assert doc["metadata"]["device_clock"]["clone_map_entries"] >= len(kernels)
    exe.close()
    graph.close()
    for obj in (model, x, out):
        obj.close()


def test_device_span_durations_agree_with_cuda_event_timings(stream):
    """Each large kernel of an eager run, timed by CUPTI and by CUDA events around it alone: the
    medians agree within 10 % (kernels over 20 us, where an event pair's own cost is small)."""
    _cupti()
    model, x, out, plan = _block(2048, 256, 2, pdl=False)
    rounds = 20
    plan.run(stream)
    stream.synchronize()
    ev = [(Event(), Event()) for _ in plan.launches]
    by_events: list[list[float]] = [[] for _ in plan.launches]
    for _ in range(rounds):
        # The round queued behind a spin: each event pair then times its kernel alone, not the
        # host's launch gap an idle device would wait through between the two events.
        ops.spin(get_device(), spin_ns(2_000_000))(stream)
        for i, launch in enumerate(plan.launches):
            ev[i][0].record(stream)
            launch(stream)
            ev[i][1].record(stream)
        stream.synchronize()
        for i, (a, b) in enumerate(ev):
            by_events[i].append(a.elapsed_ms(b) * 1e3)
    with Tracer(device="cupti") as t:
        with t.path("stream"):
            for _ in range(rounds):
                with t.step(stream):
                    plan.run(stream)
        stream.synchronize()
    spans = t.joined_device_spans()
    corrs = t.correlations
    by_call = {corrs[h.id]: h for h in t.host if h.cat == "launch" and h.id in corrs}
    by_cupti: list[list[float]] = [[] for _ in plan.launches]
    for h_step in [h for h in t.host if h.cat == "step"]:
        calls = sorted((c for c in by_call.values() if c.step == h_step.step), key=lambda c: c.start_ns)
        assert len(calls) == len(plan.launches)
        for i, c in enumerate(calls):
            (d,) = [d for d in spans if d.correlation == corrs[c.id]]
            by_cupti[i].append((d.end_ns - d.start_ns) / 1e3)
    compared = 0
    for i, launch in enumerate(plan.launches):
        e, c = median(by_events[i]), median(by_cupti[i])
        if e < 20:
            continue
        compared += 1
        assert abs(c - e) / e < 0.10, f"{launch.label}: CUPTI {c:.2f} us, events {e:.2f} us"
    assert compared >= 2, [median(v) for v in by_events]
    for obj in (model, x, out):
        obj.close()


def test_eager_launches_leave_device_gaps_that_the_replay_closes(stream):
    """w128 b1: each kernel takes about as long as the host needs to launch one, so eagerly the
    device waits for every launch; the replay submits them all at once."""
    _cupti()
    model, x, out, plan = _block(128, 1, 8)
    graph = capture_plan(plan, stream)
    exe = graph.instantiate()
    for fn in (lambda: plan.run(stream), lambda: exe.launch(stream)):
        for _ in range(5):
            fn()
    stream.synchronize()
    with Tracer(device="cupti") as t:
        for name, fn in (("stream", lambda: plan.run(stream)), ("graph", lambda: exe.launch(stream))):
            with t.path(name):
                for _ in range(10):
                    with t.step(stream):
                        fn()
                stream.synchronize()
    eager, replay = t.latency_model().paths
    text = t.latency_model().table()
    assert (eager.path, replay.path) == ("stream", "graph")
    assert eager.calls_per_step == len(plan.launches) and replay.calls_per_step == 1
    assert eager.launch_bound, text
    assert eager.gap_us > 3 * max(replay.gap_us, 0.1), text
    assert eager.idle_fraction > 2 * replay.idle_fraction, text
    assert eager.host_launch_us > replay.host_launch_us, text
    exe.close()
    graph.close()
    for obj in (model, x, out):
        obj.close()


def test_a_trace_leaves_the_hot_paths_as_they_were(stream):
    """After a tracer (CUPTI or events) ends, the driver's functions are the very objects they were,
    and the bind + replay and replay steps cost what they did (interleaved medians, within 10 %:
    the calls are identical, so this bounds the noise)."""
    model, x, out, plan = _block(128, 1, 2)
    graph = capture_plan(plan, stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    x2 = DeviceBuffer((1, 128))
    st = {"i": 0}

    def bind_replay():
        st["i"] ^= 1
        mgr.bind("x", (x, x2)[st["i"]])
        mgr.launch(stream)

    def replay():
        mgr.launch(stream)

    def per_step(fn, steps=200):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        stream.synchronize()
        return (time.perf_counter() - t0) / steps * 1e6

    before_fns = driver_functions()
    before = {f.__name__: [per_step(f) for _ in range(3)] for f in (bind_replay, replay)}
    with Tracer() as t:
        with t.path("graph"), t.step(stream):
            bind_replay()
        stream.synchronize()
    assert same_functions(before_fns) == []
    after: dict = {f.__name__: [] for f in (bind_replay, replay)}
    for _ in range(5):  # interleaved, so drift in clocks hits both alike
        for f in (bind_replay, replay):
            before[f.__name__].append(per_step(f))
            after[f.__name__].append(per_step(f))
    for name in before:
        ratio = median(after[name]) / median(before[name])
        assert ratio < 1.10, f"{name}: {median(before[name]):.2f} us before, {median(after[name]):.2f} after"
    mgr.close()
    mgr.exec.close()
    graph.close()
    for obj in (model, x, x2, out):
        obj.close()


def test_rawgraph_trace_writes_a_valid_trace_and_the_model(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "trace", "--width", "128", "--batch", "1", "--layers", "2"]
        + ["--form", "fused", "--steps", "3", "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    for path in ("stream", "graph", "graph_copy", "graph_update", "graph_update2", "graph_indirect"):
        assert path in result["paths_traced"], result
    doc = json.loads(open(result["json"]).read())
    assert trace_problems(doc) == []
    assert doc["metadata"]["device_source"] == result["device_source"]
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "kernel"]
    if result["device_source"] == "cupti":
        assert kernels and any("node" in e["args"] for e in kernels)  # graph nodes joined to the node map
    if result["png"] is not None:
        assert open(result["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert driver.cuLaunchKernel.__module__ != "rawgraph.trace.hooks"
    # exec updates happen in the steps of the update paths, and in set-up: never by the thousand
    # outside every path (a host-time loop of the benchmark run under the tracer)
    loose = [
        e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "update" and "path" not in e.get("args", {})
    ]
    assert len(loose) < 100, len(loose)


def test_a_while_body_s_kernels_are_traced_per_iteration_but_not_under_the_launch_s_id(stream):
    """What CUPTI reports for a conditional node's body, at several depths of one exec, each
    replay alone on the device: the kernel outside the WHILE node (``rg_depth_init``) once per
    replay under the correlation id of its ``cuGraphLaunch``; every kernel of every iteration of
    the body (d iterations of k kernels), each once, none of them under that id. A trace can count
    a body's iterations by time, not by the launch that ran them. The records are in the failure
    message."""
    from rawgraph.control import DepthLoop

    _cupti()
    model = TinyBlock(128, 1, 4, seed=5, form="fused")
    x = DeviceBuffer.from_numpy(np.random.default_rng(5).standard_normal((1, 128), dtype=np.float32))
    out = DeviceBuffer((1, 128))
    loop = DepthLoop(model, x, out, stream=stream)
    body = Counter([launch.kernel.symbol for launch in loop.body_plan.launches] + ["rg_layer_advance"])
    depths = [0, 1, 2, 4]
    with Tracer(device="cupti") as t:  # one CUPTI session: the launches' correlation ids held in it
        for d in depths:
            loop.set_depth(d, stream)
            stream.synchronize()
            loop.launch(stream)
            stream.synchronize()
    assert t.device_source == "cupti", t.device_source_reason
    launches = sorted((h for h in t.host if h.name == "cuGraphLaunch"), key=lambda h: h.start_ns)
    assert len(launches) == len(depths), [h.name for h in t.host]
    # each replay's kernels by time: it ran alone between its launch and the next one
    bounds = [h.start_ns for h in launches[1:]] + [float("inf")]
    rows = []
    for d, h, end in zip(depths, launches, bounds):
        c = t.correlations.get(h.id)
        kernels = [s for s in t.device_spans if s.kind == "kernel" and h.start_ns <= s.start_ns < end]
        mine = [s.name for s in kernels if s.correlation == c]
        rows.append((d, c, mine, [(s.name, s.correlation) for s in kernels if s.correlation != c]))
    msg = f"body {dict(body)}; (depth, launch's id, kernels under it, other kernels (name, id)): {rows}"
    for d, c, mine, other in rows:
        assert c is not None and len(mine) == 1 and "rg_depth_init" in mine[0], msg
        assert Counter(n for n, _ in other) == Counter({n: d * m for n, m in body.items() if d}), msg
    loop.close()
    for obj in (model, x, out):
        obj.close()
