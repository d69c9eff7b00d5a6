"""Ownership: close() twice, context managers, use after close, interpreter exit."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rawgraph import ClosedError, DeviceBuffer, Event, Stream, TinyBlock, capture_plan

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


def test_host_round_trip(rng):
    a = rng.standard_normal((3, 5), dtype=np.float32)
    with DeviceBuffer.from_numpy(a) as b:
        np.testing.assert_array_equal(b.to_numpy(), a)
        assert b.__cuda_array_interface__["data"][0] == b.ptr


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
