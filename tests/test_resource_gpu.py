"""Owners of driver resources (rawgraph.runtime.resource) on the GPU: buffers, streams, events,
models, plans, graphs, execs, managers and static graphs; close twice is quiet, context managers
close, every closed owner refuses before any driver call, a plan refuses to run once its buffers
or model are closed; a failed release warns with the call's name, and quietly only at interpreter
exit; nothing raises at exit with everything alive and work in flight.
(The CPU side of release calls: ``tests/test_resource_cpu.py``.)"""

import gc
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import model_io

from rawgraph import (
    Capture,
    ClosedError,
    DeviceBuffer,
    Event,
    ExecUpdateManager,
    StaticGraph,
    Stream,
    TinyBlock,
    capture_plan,
)
from rawgraph.runtime.errors import ReleaseWarning, check

pytestmark = pytest.mark.gpu


def test_close_twice_and_context_managers(stream):
    with DeviceBuffer(16) as b, Stream() as s, Event() as e, TinyBlock(8, 1, 1) as m:
        e.record(s)
    for obj in (b, s, e, m):
        assert obj.closed
        obj.close()
    with pytest.raises(ClosedError):
        _ = b.ptr
    with pytest.raises(ClosedError):
        s.synchronize()


def test_close_twice_is_quiet_for_every_owner(stream, rng):
    model, _xh, x, out = model_io(rng, stream)
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


def test_plan_refuses_to_run_after_its_buffers_close(stream):
    model = TinyBlock(16, 1, 1)
    x, out = DeviceBuffer((1, 16)), DeviceBuffer((1, 16))
    plan = model.plan(x, out)
    x.close()
    with pytest.raises(ClosedError):
        plan.run(stream)
    x2 = DeviceBuffer((1, 16))
    plan2 = model.plan(x2, out)
    model.close()
    with pytest.raises(ClosedError):
        plan2.run(stream)
    with pytest.raises(ClosedError):
        model.plan(x2, out)


# -- closed objects refuse before any driver call ---------------------------------------------------
@pytest.fixture
def driver_calls(monkeypatch):
    calls = []
    for name in dir(driver):
        fn = getattr(driver, name)
        if name.startswith("cu") and callable(fn) and not isinstance(fn, type):
            monkeypatch.setattr(driver, name, lambda *a, _fn=fn, _name=name: calls.append(_name) or _fn(*a))
    return calls


def _closed_cases(stream, rng):
    model, _xh, x, out = model_io(rng, stream)
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


# -- failed releases, and interpreter exit ---------------------------------------------------------
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


def test_nothing_raises_at_interpreter_exit():
    code = textwrap.dedent(
        """
        import numpy as np
        from rawgraph import *
        s = Stream(); m = TinyBlock(32, 2, 2)
        x = DeviceBuffer.from_numpy(np.ones((2, 32), np.float32)); o = DeviceBuffer((2, 32))
        g = capture_plan(m.plan(x, o), s); e = g.instantiate(); mgr = ExecUpdateManager(g, e)
        mgr.launch(s)
        ev = Event().record(s)
        # exit with everything alive and work possibly in flight
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr
