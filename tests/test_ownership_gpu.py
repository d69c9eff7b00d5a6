"""Ownership holes of issue 21 (section 2: items 6, 7, 8, 9, 11); each test failed before its fix.

The hazards of items 6 and 7 (the driver calling freed memory, a kernel device-launching a destroyed
exec) run in a child process: before the fix they may crash it or fault its context, which must not
take the test session down with them; the child reports what it saw as JSON.
"""

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import CHECK_DESTRUCTION, random_input, rel_err, spin_ns

from rawgraph import ClosedError, DeviceBuffer, RawgraphError, Stream, TinyBlock, capture_plan
from rawgraph.bench import device_launch as bench
from rawgraph.control import DeviceGraph, LauncherExec, launcher_graph
from rawgraph.graphs import conditional as cn
from rawgraph.graphs.builder import GraphBuilder, build_plan, edge_data
from rawgraph.runtime import resource
from rawgraph.runtime.errors import ReleaseWarning, call

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SPIN_NS = spin_ns(300_000_000)  # what the replays wait behind: long against the Python between launch and collection


def _child(code: str, *args: object, debug_malloc: bool = False) -> dict:
    """Run ``code`` in a fresh interpreter on this tree; its last stdout line is a JSON report."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if debug_malloc:
        env["PYTHONMALLOC"] = "debug"
    try:
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child process hung (a replay calling into freed memory?): {exc}")
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- item 6: a host node's callback outlives its exec while a replay is queued -------------------------
HOST_NODE_CHILD = """
import gc, json, sys, weakref
from rawgraph import Stream, get_device, ops
from rawgraph.graphs import builder
from rawgraph.graphs.builder import GraphBuilder, HostCallback

token, spin_ns = int(sys.argv[1]), int(sys.argv[2])
dev = get_device()
s = Stream()
ops.spin(dev, 0)(s)
s.synchronize()  # the spin kernel is loaded now, not behind the timing below
hits = []
g = GraphBuilder(dev)
k = g.kernel(ops.spin(dev, spin_ns))
g.host(lambda: hits.append(token), deps=k)  # the host node runs behind the slow kernel
graph = g.build()
exe = graph.instantiate()
ref = weakref.ref([o for o in graph.keep if isinstance(o, HostCallback)][0])
exe.launch(s)
queued = not s.query()
exe.close()
graph.close()
g.close()
del exe, graph, g, k
gc.collect()
held = ref() is not None
# Fresh thunks of the same type: a freed thunk's memory would be reused by one of them, and a
# replay calling it would record -1 (or crash) instead of the token.
decoys = [HostCallback(lambda: hits.append(-1)) for _ in range(64)]
s.synchronize()
builder.collect_held()
print(json.dumps({"queued": queued, "held": held, "hits": hits, "released": ref() is None}))
"""


def test_a_host_callback_outlives_builder_graph_and_exec_destroyed_with_a_replay_queued(rng):
    token = int(rng.integers(1, 1 << 40))
    got = _child(HOST_NODE_CHILD, token, SPIN_NS)
    assert got["queued"], "the replay was meant to be still queued behind the spin kernel"
    assert got["held"], "the callback was released while a queued replay could still call it"
    assert got["hits"] == [token], f"the queued replay called {got['hits']}, not the callback"
    assert got["released"], "the callback was not let go once the replay had run"


# -- item 7: a launcher of a closed DeviceGraph ---------------------------------------------------------
def _set(buf, value, stream):
    buf.copy_from_host(np.array([value], dtype=buf.dtype), stream)


def _get(buf, stream):
    return int(buf.to_numpy(stream)[0])


def test_a_launcher_of_a_closed_device_graph_is_refused_before_the_driver(stream, rng, monkeypatch):
    counter, rc = DeviceBuffer((1,), np.uint32), DeviceBuffer((1,), np.int32)
    target = DeviceGraph(capture_plan(bench.bump_chain(counter, 2), stream), stream)
    outer = launcher_graph(target, stream, "tail", rc=rc)
    exe = outer.instantiate()
    assert isinstance(exe, LauncherExec)
    c0 = int(rng.integers(1, 1 << 20))
    _set(counter, c0, stream)
    _set(rc, -2, stream)
    exe.launch(stream)
    assert _get(rc, stream) == 0 and _get(counter, stream) == c0 + 2  # it runs while the target is open
    target.close()
    calls = []
    monkeypatch.setattr(
        driver, "cuGraphLaunch", lambda *a: calls.append(("cuGraphLaunch", a)) or (driver.CUresult.CUDA_SUCCESS,)
    )
    monkeypatch.setattr(
        driver,
        "cuGraphInstantiate",
        lambda *a: calls.append(("cuGraphInstantiate", a)) or (driver.CUresult.CUDA_ERROR_UNKNOWN, None),
    )
    with pytest.raises(ClosedError, match="DeviceGraph"):
        exe.launch(stream)
    with pytest.raises(ClosedError, match="DeviceGraph"):
        outer.instantiate()
    for use in (lambda: target.launch(stream), lambda: target.handle, lambda: target.exec):
        with pytest.raises(ClosedError):
            use()
    assert calls == []
    monkeypatch.undo()
    assert _get(counter, stream) == c0 + 2
    target.close()  # safe twice
    exe.close()
    outer.close()


LAUNCHER_CHILD = """
import gc, json, sys, weakref
import numpy as np
sys.path.insert(0, "tests")  # cwd is the checkout
from helpers import describe_holders
from rawgraph import DeviceBuffer, Stream, capture_plan, get_device, ops
from rawgraph.graphs import builder
from rawgraph.bench import device_launch as bench
from rawgraph.control import DeviceGraph, launcher_graph

c0, spin_ns = int(sys.argv[1]), int(sys.argv[2])
dev = get_device()
s, s2 = Stream(), Stream()
ops.spin(dev, 0)(s)
counter, other, rc = DeviceBuffer((1,), np.uint32), DeviceBuffer((1,), np.uint32), DeviceBuffer((1,), np.int32)
target = DeviceGraph(capture_plan(bench.bump_chain(counter, 3), s), s)  # (its warm-up bumps counter)
outer = launcher_graph(target, s, "tail", rc=rc)
exe = outer.instantiate()
texec = weakref.ref(target.exec)
counter.copy_from_host(np.array([c0], np.uint32), s)
other.copy_from_host(np.array([0], np.uint32), s)
rc.copy_from_host(np.array([-2], np.int32), s)
s.synchronize()
ops.spin(dev, spin_ns)(s)
exe.launch(s)  # queued behind the spin: it device-launches the target when it runs
queued = not s.query()
target.close()
exe.close()
outer.close()
del target, exe, outer
gc.collect()
t = texec()
held = t is not None and not t.closed
del t
# A device graph made now may take over a destroyed exec's handle or memory: launched by the queued
# replay instead of the target, it would bump `other`, not `counter`.
decoy = DeviceGraph(capture_plan(bench.bump_chain(other, 1), s2, warmup=False), s2)
s.synchronize()
still = builder.collect_held()
destroyed = texec() is None
gc.collect()
holders = "" if texec() is None else describe_holders(texec(), depth=6)
report = {"queued": queued, "held": held, "destroyed": destroyed, "destroyed_after_gc": texec() is None,
          "still_held": still, "holders": holders, "counter": int(counter.to_numpy(s)[0]),
          "rc": int(rc.to_numpy(s)[0]), "other": int(other.to_numpy(s)[0])}
decoy.close()
s.synchronize()
print(json.dumps(report))
"""


def test_closing_a_device_graph_with_a_launcher_replay_queued_is_safe(rng):
    c0 = int(rng.integers(1, 1 << 20))
    got = _child(LAUNCHER_CHILD, c0, SPIN_NS)
    assert got["queued"], "the launcher replay was meant to be still queued behind the spin kernel"
    assert got["held"], "the target's exec was destroyed while a queued launcher replay could still launch it"
    assert got["rc"] == 0, "the device-side cudaGraphLaunch failed"
    assert got["counter"] == c0 + 3 and got["other"] == 0, got
    if CHECK_DESTRUCTION:  # see helpers.CHECK_DESTRUCTION
        assert got["destroyed"], f"the target's exec was not destroyed once the launcher replay had run: {got}"


# -- item 8: a body capture runs the releases it deferred ---------------------------------------------
def test_a_body_capture_runs_the_releases_it_deferred(device, stream):
    g = GraphBuilder(device)
    node = cn.add_conditional(g, "if", cn.make_handle(g, default=1))
    doomed = DeviceBuffer(1024)
    ptr = int(doomed.ptr)
    noops = [cn.noop(device), cn.noop(device)]  # kernels loaded before the capture, not inside it
    before = {id(e) for e in resource._deferred}
    with Stream() as body_stream:
        with node.capture_body(0, body_stream) as body:
            first = body.launch(noops[0])
            del doomed  # garbage in the capture body: cuMemFree here would invalidate the capture
            gc.collect()
            held = [e for e in resource._deferred if id(e) not in before]
            assert any(name == "cuMemFree" and int(args[0]) == ptr for name, _fn, args in held)
            second = body.launch(noops[1])
        left = [e for e in resource._deferred if any(e is h for h in held)]
        assert left == [], f"the body capture left {len(left)} deferred release(s) behind"
    err, _kind = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    assert err != driver.CUresult.CUDA_SUCCESS, "the buffer was never freed"
    # Item 9 for bodies: each captured kernel records what it depends on.
    assert first.deps == () and second.deps == (int(first.handle),)
    exe = g.build().instantiate()  # the capture was not invalidated
    exe.launch(stream)
    stream.synchronize()


# -- a finalizer at the edges of a capture (found on the H100, 2026-12-06) ------------------------------
def _collect_at(edge: str, begin_name: str, doomed: list, monkeypatch) -> None:
    """Patch the driver so that garbage collection frees ``doomed`` (a self-referencing list holding a
    buffer, so only the cycle collector frees it) right after the capture begins or right before it
    ends: the two moments a finalizer could once run while rawgraph did not count the capture open."""
    name = begin_name if edge == "begin" else "cuStreamEndCapture"
    real = getattr(driver, name)

    def at_the_edge(*args):
        if edge == "end":
            doomed.clear()
            gc.collect()
        result = real(*args)
        if edge == "begin":
            doomed.clear()
            gc.collect()
        return result

    monkeypatch.setattr(driver, name, at_the_edge)


def _cyclic_buffer() -> tuple[list, int]:
    buf = DeviceBuffer(4096)
    cycle: list = [buf]
    cycle.append(cycle)
    return cycle, int(buf.ptr)


def _freed(ptr: int) -> bool:
    err, _kind = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    return err != driver.CUresult.CUDA_SUCCESS


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
    wrapper = _cyclic_buffer()
    ptr = wrapper[1]
    doomed = [wrapper[0]]
    del wrapper
    _collect_at(edge, "cuStreamBeginCapture", doomed, monkeypatch)
    graph = capture_plan(plan, stream, warmup=False)  # invalidated before the fix
    monkeypatch.undo()
    assert _freed(ptr), "the collected buffer was never freed once the capture ended"
    assert not [w for w in recwarn if issubclass(w.category, ReleaseWarning)], [str(w.message) for w in recwarn]
    graph.instantiate().launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), eager)


@pytest.mark.parametrize("edge", ["begin", "end"])
def test_a_buffer_collected_at_the_edge_of_a_body_capture_is_freed_after_it_not_into_it(
    device, stream, monkeypatch, recwarn, edge
):
    g = GraphBuilder(device)
    node = cn.add_conditional(g, "if", cn.make_handle(g, default=1))
    noop = cn.noop(device)
    wrapper = _cyclic_buffer()
    ptr = wrapper[1]
    doomed = [wrapper[0]]
    del wrapper
    with Stream() as body_stream:
        _collect_at(edge, "cuStreamBeginCaptureToGraph", doomed, monkeypatch)
        with node.capture_body(0, body_stream) as body:
            body.launch(noop)
        monkeypatch.undo()
    assert _freed(ptr), "the collected buffer was never freed once the body capture ended"
    assert not [w for w in recwarn if issubclass(w.category, ReleaseWarning)], [str(w.message) for w in recwarn]
    exe = g.build().instantiate()  # the body capture was not invalidated
    exe.launch(stream)
    stream.synchronize()


# -- item 9: built kernel nodes record their dependencies -----------------------------------------------
def test_verify_edges_passes_on_a_built_graph_and_catches_an_edge_behind_its_back(device, stream, rng):
    n = 3000
    xh = random_input(rng, (n,))
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    y1, y2, y3 = DeviceBuffer((n,)), DeviceBuffer((n,)), DeviceBuffer((n,))
    c = [(float(rng.uniform(0.5, 1.5)), float(rng.uniform(-1, 1))) for _ in range(5)]
    g = GraphBuilder(device)
    root = g.empty()
    k1 = g.kernel(cn.axpb(device, x, y1, *c[0]), deps=root)
    k2 = g.kernel(cn.axpb(device, x, y2, *c[1]), deps=root)
    k3 = g.kernel(cn.axpb(device, y1, y1, *c[2]), deps=k1)
    k4 = g.kernel(cn.axpb(device, y2, y3, *c[3]))  # a root for now: its edge is added below
    g.depend(k2, k4)
    k5 = g.kernel(cn.axpb(device, y3, y3, *c[4]), deps=g.empty(deps=[k3, k4]))
    graph = g.build()
    assert [kn.deps for kn in graph.nodes] == [
        (int(root.handle),),
        (int(root.handle),),
        (int(k1.handle),),
        (int(k2.handle),),
        (int(graph.built_nodes[-2].handle),),
    ]
    graph.verify_edges()
    graph.clone().verify_edges()  # the copy's node map names the copy's nodes
    for b in (y1, y2, y3):
        b.poison(stream)
    graph.instantiate().launch(stream)
    ref1 = (xh.astype(np.float64) * c[0][0] + c[0][1]) * c[2][0] + c[2][1]
    ref3 = ((xh.astype(np.float64) * c[1][0] + c[1][1]) * c[3][0] + c[3][1]) * c[4][0] + c[4][1]
    assert rel_err(y1.to_numpy(stream), ref1) < 1e-6 and rel_err(y3.to_numpy(stream), ref3) < 1e-6
    # An edge the builder did not add is caught, naming the node.
    call(driver.cuGraphAddDependencies, graph.handle, [k1.handle], [k5.handle], [edge_data("default")], 1)
    with pytest.raises(RawgraphError, match=r"node 4 "):
        graph.verify_edges()


@pytest.mark.parametrize("form", ["unfused", "fused"])
def test_verify_edges_passes_on_a_built_plan_with_programmatic_edges(stream, rng, form):
    model = TinyBlock(128, 2, 3, seed=int(rng.integers(1 << 30)), form=form)
    x, out = DeviceBuffer.from_numpy(random_input(rng, (2, 128)), stream=stream), DeviceBuffer((2, 128))
    plan = model.plan(x, out)
    built = build_plan(plan)
    built.verify_edges()
    assert [kn.deps for kn in built.nodes[1:]] == [(int(prev.handle),) for prev in built.nodes[:-1]]
    assert built.nodes[0].deps == ()
    kinds = {k for _a, _b, k in built.edge_types()}
    assert kinds == ({"programmatic"} if model.pdl else {"default"})
    capture_plan(plan, stream).verify_edges()  # the same check a captured graph passes


# -- item 11: graph memory nodes under PYTHONMALLOC=debug -----------------------------------------------
DEBUG_MALLOC_CHILD = """
import json, sys
import numpy as np
from rawgraph import DeviceArray, DeviceBuffer, Stream, get_device
from rawgraph.graphs.builder import GraphBuilder
from rawgraph.graphs import conditional as cn

dev = get_device()
s = Stream()
n = 4096
src_h = np.random.default_rng(int(sys.argv[1])).standard_normal(n, dtype=np.float32)
src, back = DeviceBuffer.from_numpy(src_h, stream=s), DeviceBuffer((n,))
g = GraphBuilder(dev)
alloc, tmp = g.mem_alloc(n * 4)
cp = g.memcpy(tmp, src, n * 4, deps=alloc)  # cuGraphAddMemcpyNode on the graph memory's address
view = DeviceArray(tmp, (n,), np.dtype(np.float32), None)
k = g.kernel(cn.axpb(dev, view, back, 2.0, 0.0), deps=cp)
g.mem_free(tmp, deps=k)  # cuGraphAddMemFreeNode on the same address
exe = g.build().instantiate()
back.poison(s)
exe.launch(s)
got = back.to_numpy(s)
print(json.dumps({"address": tmp, "exact": bool(np.array_equal(got, src_h * np.float32(2)))}))
"""


def test_graph_memory_nodes_build_and_run_under_the_debug_allocator(rng):
    got = _child(DEBUG_MALLOC_CHILD, int(rng.integers(1 << 30)), debug_malloc=True)
    assert got["address"] != 0xDDDDDDDDDDDDDDDD and got["address"] > 0
    assert got["exact"], "2 * src through graph memory differs from NumPy"
