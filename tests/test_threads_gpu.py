"""Threads: two threads on one owner (a slot pool, an exec-update manager, a rebinder, an
indirect graph) leave what it holds and the exec agreeing; an exec update from a thread
with no current context raises instead of crashing the process."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import Overlap, device_inputs, eager_output, random_input, tiny_model, two_threads

from rawgraph import AddressRebinder, DeviceBuffer, ExecUpdateManager, IndirectGraph, SlotPool, TinyBlock, capture_plan

pytestmark = pytest.mark.gpu
WIDTH = 128


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


def test_two_threads_joining_a_slot_pool_never_pick_one_slot(stream, rng, monkeypatch):
    model = TinyBlock(WIDTH, 1, 1, seed=int(rng.integers(1 << 30)), form="fused")
    pool = SlotPool(model, max_slots=8, sizes=[8], stream=stream)
    spy = Overlap(driver.cuMemcpyHtoDAsync)
    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", spy)
    rows = [random_input(rng, (WIDTH,)) for _ in range(8)]
    got: dict[int, list] = {0: [], 1: []}

    def joiner(k):
        return lambda: got[k].extend(pool.join(rows[4 * k + i]) for i in range(4))

    errors = two_threads(joiner(0), joiner(1))
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
    model = tiny_model(rng)
    _, xs = device_inputs(rng, model, 3, stream)
    wants = [eager_output(model, x, stream) for x in xs]
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(xs[0], out), stream)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    spy = Overlap(driver.cuGraphExecKernelNodeSetParams)
    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", spy)
    order = [[1, 2, 1, 2], [2, 0, 2, 0]]
    errors = two_threads(*[(lambda seq=seq: [mgr.bind("x", xs[i]) for i in seq]) for seq in order])
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
    model = tiny_model(rng)
    _, xs = device_inputs(rng, model, 3, stream)
    wants = [eager_output(model, x, stream) for x in xs]
    out = DeviceBuffer((model.batch, model.width))
    graph = capture_plan(model.plan(xs[0], out), stream)
    exe = graph.instantiate()
    reb = AddressRebinder(graph, exe)
    bindings = [reb.prepare({})] + [reb.prepare({xs[0]: x}) for x in xs[1:]]
    spy = Overlap(driver.cuGraphExecKernelNodeSetParams)
    monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", spy)
    order = [[1, 2, 1, 2], [2, 0, 2, 0]]
    errors = two_threads(*[(lambda seq=seq: [reb.apply(bindings[i]) for i in seq]) for seq in order])
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
    model = tiny_model(rng)
    _, xs = device_inputs(rng, model, 3, stream)
    wants = [eager_output(model, x, stream) for x in xs]
    outs = [DeviceBuffer((model.batch, model.width)) for _ in range(3)]
    ind = IndirectGraph(model, xs[0], outs[0], stream)
    ind.launch(stream)  # launched: every apply now asks the read event (cuEventQuery) inside the lock
    stream.synchronize()
    pairs = [ind.prepare(x, o) for x, o in zip(xs, outs)]
    spy = Overlap(driver.cuEventQuery)
    monkeypatch.setattr(driver, "cuEventQuery", spy)
    order = [[1, 2, 1, 2], [2, 0, 2, 0]]
    errors = two_threads(*[(lambda seq=seq: [ind.apply(pairs[i]) for i in seq]) for seq in order])
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
