"""Device graph launch on the GPU: a kernel in a host graph launches a DeviceGraph (tail,
fire-and-forget, sibling); the latency benchmark runs and checks itself; and the error and
lifetime cases: the graphs the driver refuses for device launch are refused first, a launcher of
a closed DeviceGraph is refused before the driver, and closing a DeviceGraph with a launcher
replay still queued keeps its exec until that replay has run (in a child process: a kernel
device-launching a destroyed exec may fault the context)."""

import json

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import CHECK_DESTRUCTION, child_report, spin_ns

from rawgraph import Capture, ClosedError, DeviceBuffer, Graph, LaunchPlan, capture_plan, get_kernel, ops
from rawgraph.bench import device_launch as bench
from rawgraph.control import DeviceGraph, DeviceLaunchError, LauncherExec, device_launch_problems, launcher_graph
from rawgraph.control.device_launch import _launcher  # a second launcher node inside the launching graph
from rawgraph.runtime.errors import call
from rawgraph.runtime.launch import ArgUse, KernelArgs, Launch

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(300_000_000)  # what the replays wait behind: long against the Python between launch and collection


@pytest.fixture
def bufs(stream):
    b = {
        "counter": DeviceBuffer((1,), np.uint32),
        "snap": DeviceBuffer((1,), np.uint32),
        "after": DeviceBuffer((1,), np.uint32),
        "tail": DeviceBuffer((1,), np.uint32),
        "rc": DeviceBuffer((1,), np.int32),
    }
    yield b
    for v in b.values():
        v.close()


def _snapshot_plan(counter, snap):
    args = KernelArgs([("counter", "ptr"), ("snap", "ptr")])
    args.update({"counter": counter.ptr, "snap": snap.ptr})
    launch = Launch(
        get_kernel("device_launch", "rg_snapshot", counter.device),
        (1, 1, 1),
        (1, 1, 1),
        args,
        {"counter": ArgUse("counter", "read"), "snap": ArgUse("snap", "write")},
        0,
        "snapshot",
    )
    return LaunchPlan([launch], {"counter": counter.view(), "snap": snap.view()}, (), ("snap",), pdl=False)


def _set(buf, value, stream):
    buf.copy_from_host(np.array([value], dtype=buf.dtype), stream)


def _get(buf, stream):
    return int(buf.to_numpy(stream)[0])


def _target(bufs, stream, n=3):
    graph = capture_plan(bench.bump_chain(bufs["counter"], n), stream)
    return DeviceGraph(graph, stream)


SLOW_NS = 100_000_000  # the target's spin between its two bumps
IN_GRAPH_NS = 20_000_000  # the launching graph's spin before its own snapshot
# (snapshot in the launching graph after its spin, snapshot by a tail launch of that graph), as
# counts past c0. tail: the target runs after the launching graph (which sees none of it) and
# before the later tail launch; fire_and_forget: it starts at once (its first bump lands within the
# launching graph's spin, its second only after) and is a child of the launching graph, so the
# graph's tail launch waits for all of it; sibling: it starts at once too, but as a child of the
# launching graph's parent, so it does not hold back the launching graph's tail launch.
MODE_SEES = {"tail": (0, 2), "fire_and_forget": (1, 2), "sibling": (1, 1)}


@pytest.mark.parametrize("mode", ["tail", "fire_and_forget", "sibling"])
def test_a_kernel_launches_the_device_graph(stream, rng, bufs, mode, device):
    counter = bufs["counter"]
    bumps = bench.bump_chain(counter, 2).launches
    slow = LaunchPlan(
        [bumps[0], ops.spin(device, SLOW_NS), bumps[1]], {"counter": counter.view()}, (), ("counter",), pdl=False
    )
    target = DeviceGraph(capture_plan(slow, stream), stream)  # bump, 100 ms, bump
    tail_snap = DeviceGraph(capture_plan(_snapshot_plan(counter, bufs["tail"]), stream), stream)
    # In the launching graph, after the launcher of the mode under test: a tail launch of
    # tail_snap, 20 ms of spin, then snap = counter.
    inner = LaunchPlan(
        [
            _launcher(tail_snap, "tail", None, device),
            ops.spin(device, IN_GRAPH_NS),
            _snapshot_plan(counter, bufs["snap"]).launches[0],
        ],
        {"counter": counter.view(), "snap": bufs["snap"].view()},
        (),
        ("snap",),
        pdl=False,
    )
    outer = launcher_graph(target, stream, mode, after=inner, rc=bufs["rc"])
    exe = outer.instantiate()
    after = _snapshot_plan(counter, bufs["after"])  # stream-ordered after the outer graph
    c0 = int(rng.integers(1, 1 << 20))
    _set(counter, c0, stream)
    _set(bufs["rc"], -2, stream)
    for name in ("snap", "tail", "after"):
        bufs[name].poison(stream)
    exe.launch(stream)
    after.run(stream)
    assert _get(bufs["rc"], stream) == 0  # cudaSuccess from the device-side cudaGraphLaunch
    assert _get(counter, stream) == c0 + 2, f"the launched graph did not run ({mode})"
    assert _get(bufs["after"], stream) == c0 + 2  # the stream's next work sees it finished
    seen = (_get(bufs["snap"], stream) - c0, _get(bufs["tail"], stream) - c0)
    assert seen == MODE_SEES[mode], (
        f"{mode}: the launching graph saw {seen[0]} bumps, its tail launch {seen[1]}; "
        f"expected {MODE_SEES[mode]} (tail {MODE_SEES['tail']}, fire_and_forget {MODE_SEES['fire_and_forget']}, "
        f"sibling {MODE_SEES['sibling']})"
    )
    for _ in range(5):
        exe.launch(stream)
    stream.synchronize()
    assert _get(counter, stream) == c0 + 12
    exe.close()
    outer.close()
    tail_snap.close()
    target.close()
    target.close()  # safe twice


def test_device_graph_also_runs_from_the_host_and_holds_the_flag(stream, rng, bufs):
    target = _target(bufs, stream, n=4)
    assert target.exec.driver_flags() & int(driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    c0 = int(rng.integers(1, 1 << 20))
    _set(bufs["counter"], c0, stream)
    target.launch(stream)
    assert _get(bufs["counter"], stream) == c0 + 4


def test_mode_none_runs_the_launcher_without_launching(stream, rng, bufs):
    target = _target(bufs, stream)
    exe = launcher_graph(target, stream, None, rc=bufs["rc"]).instantiate()
    c0 = int(rng.integers(1, 1 << 20))
    _set(bufs["counter"], c0, stream)
    _set(bufs["rc"], -2, stream)
    exe.launch(stream)
    assert _get(bufs["rc"], stream) == -1 and _get(bufs["counter"], stream) == c0


def test_a_device_graph_with_a_child_graph_and_a_memset(stream, rng, bufs, device):
    # kernel, memset and child-graph nodes are the node types a device graph may hold
    child = capture_plan(bench.bump_chain(bufs["counter"], 2), stream)
    g = call(driver.cuGraphCreate, 0)
    node = call(driver.cuGraphAddChildGraphNode, g, None, 0, child.handle)
    p = driver.CUDA_MEMSET_NODE_PARAMS()
    value = int(rng.integers(1, 1 << 30))
    p.dst, p.value, p.elementSize, p.width, p.height, p.pitch = bufs["snap"].ptr, value, 4, 1, 1, 0
    call(driver.cuGraphAddMemsetNode, g, [node], 1, p, device.context)
    graph = Graph(g, [], device)
    assert device_launch_problems(graph) == []
    target = DeviceGraph(graph, stream)
    exe = launcher_graph(target, stream, "tail").instantiate()
    c0 = int(rng.integers(1, 1 << 20))
    _set(bufs["counter"], c0, stream)
    bufs["snap"].poison(stream)
    exe.launch(stream)
    assert _get(bufs["counter"], stream) == c0 + 2 and _get(bufs["snap"], stream) == value


def _empty_graph(device):
    return Graph(call(driver.cuGraphCreate, 0), [], device)


def test_refuses_an_empty_graph(stream, device):
    with pytest.raises(DeviceLaunchError, match="no kernel, memcpy or memset"):
        DeviceGraph(_empty_graph(device), stream)


def test_refuses_empty_nodes_also_inside_a_child_graph(stream, device, bufs):
    g = _empty_graph(device)
    call(driver.cuGraphAddEmptyNode, g.handle, None, 0)
    with pytest.raises(DeviceLaunchError, match=r"node 0 \(EMPTY\)"):
        DeviceGraph(g, stream)
    inner = _empty_graph(device)
    call(driver.cuGraphAddEmptyNode, inner.handle, None, 0)
    outer = capture_plan(bench.bump_chain(bufs["counter"], 1), stream)
    call(driver.cuGraphAddChildGraphNode, outer.handle, None, 0, inner.handle)
    problems = device_launch_problems(outer)
    assert len(problems) == 1 and "(GRAPH) > node 0 (EMPTY)" in problems[0]


def test_refuses_memory_alloc_and_free_nodes(stream, bufs):
    cap = Capture(stream)
    with cap:
        ptr = cap.mem_alloc(4096)
        cap.run(bench.bump_chain(bufs["counter"], 1))
        cap.mem_free(ptr)
    with pytest.raises(DeviceLaunchError, match="MEM_ALLOC") as info:
        DeviceGraph(cap.captured, stream)
    assert "MEM_FREE" in str(info.value)


def test_refuses_a_conditional_node(stream, device, bufs):
    g = capture_plan(bench.bump_chain(bufs["counter"], 1), stream)
    handle = call(
        driver.cuGraphConditionalHandleCreate, g.handle, device.context, 1, int(driver.CU_GRAPH_COND_ASSIGN_DEFAULT)
    )
    p = driver.CUgraphNodeParams()
    p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    p.conditional.handle, p.conditional.type = handle, driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
    p.conditional.size, p.conditional.ctx = 1, device.context
    call(driver.cuGraphAddNode, g.handle, [], None, 0, p)
    with pytest.raises(DeviceLaunchError, match="CONDITIONAL"):
        DeviceGraph(g, stream)


def test_launcher_refuses_a_plain_exec_and_a_closed_target(stream, bufs):
    graph = capture_plan(bench.bump_chain(bufs["counter"], 1), stream)
    plain = graph.instantiate()
    with pytest.raises(DeviceLaunchError, match="ILLEGAL_ADDRESS"):
        launcher_graph(plain, stream, "tail")
    target = DeviceGraph(graph, stream)
    with pytest.raises(DeviceLaunchError, match="mode"):
        launcher_graph(target, stream, "later")
    target.close()
    with pytest.raises(DeviceLaunchError, match="closed"):
        launcher_graph(target, stream, "tail")


def test_latency_benchmark_runs_and_checks_every_launch(tmp_path):
    assert bench.main(["--sizes", "1,4", "--rounds", "10", "--warmup", "3", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "device_launch.json").read_text())
    assert result["all_ran_every_time"] and result["env"]["commit"]
    assert [r["n"] for r in result["records"]] == [1, 4]
    for rec in result["records"]:
        for row in bench.ROWS:
            assert rec[row]["device_us"]["median"] > 0 and rec[row]["host_synced_us"]["median"] > 0
        assert rec["tail"]["expected"] == 2 * 13 * rec["n"] and rec["launcher_only"]["expected"] == 0
    rng = result["rng"]
    assert rng["dropout"]["nodes"] == rng["plain"]["nodes"] + rng["config"]["layers"] + 1
    assert rng["dropout"]["device_us"]["median"] > 0 and rng["draw_2^20_uniforms"]["nodes"] == 2


# -- a launcher of a closed DeviceGraph --------------------------------------------------------------
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
    got = child_report(LAUNCHER_CHILD, c0, SPIN_NS)
    assert got["queued"], "the launcher replay was meant to be still queued behind the spin kernel"
    assert got["held"], "the target's exec was destroyed while a queued launcher replay could still launch it"
    assert got["rc"] == 0, "the device-side cudaGraphLaunch failed"
    assert got["counter"] == c0 + 3 and got["other"] == 0, got
    if CHECK_DESTRUCTION:  # see helpers.CHECK_DESTRUCTION
        assert got["destroyed"], f"the target's exec was not destroyed once the launcher replay had run: {got}"
