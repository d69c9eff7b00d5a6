"""What the driver promises that a reader of a driver-level guide looks for (semantics guide,
section 25): user objects and their destructors, one exec running one launch at a time, graph
memory nodes (relaunch, one exec at a time, the pool's counters and trim), instantiation with
parameters, what ``cuGraphExecUpdate`` keeps and refuses, edge data and the driver's DOT file.

Most of it goes straight to ``cuda.bindings.driver`` where rawgraph has no wrapper; graphs are
built with :class:`~rawgraph.graphs.builder.GraphBuilder` or captured with
:class:`~rawgraph.Capture`. Graphs holding memory nodes or unused conditional handles are
instantiated with the raw driver call, so the graph doctor (which checks every
``Graph.instantiate``) never sees them."""

import ctypes
import threading
import time

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import SANITIZER_SLOWDOWN, UNDER_SANITIZER, random_input, spin_ns

from rawgraph import Capture, DeviceArray, DeviceBuffer, Event, GraphUpdateError, Stream, get_device, ops
from rawgraph.graphs import conditional as cn
from rawgraph.graphs.builder import GraphBuilder
from rawgraph.graphs.dot import to_dot
from rawgraph.runtime.device import driver_cuda_version
from rawgraph.runtime.errors import call, error_name
from rawgraph.runtime.memory import POISON_BITS
from rawgraph.serving.graphmem import graph_memory, reset_high_water, trim_graph_memory

pytestmark = pytest.mark.gpu

SUCCESS = driver.CUresult.CUDA_SUCCESS
INVALID_VALUE = driver.CUresult.CUDA_ERROR_INVALID_VALUE
AUTO_FREE = int(driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
UPLOAD = int(driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
INSTANTIATED = driver.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_SUCCESS
N = 4096
FILL = 0x3F800000  # what the memory-node graphs' memset writes (1.0f)
SPIN_NS = spin_ns(100_000_000)  # one launch of the serialization tests: 100 ms of device time
SPIN_MS = SPIN_NS / 1e6

# The user-object destructors handed to the driver. Never freed: should a test fail before the
# driver has called one, the driver still calls it later, and the thunk must still be there.
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DESTRUCTORS: list = []


# -- helpers ---------------------------------------------------------------------------------------
def _spin_graph(stream, ns):
    """A captured graph of one spin kernel busy for ``ns`` of device time."""
    with Capture(stream) as cap:
        cap.launch(ops.spin(get_device(), ns))
    return cap.captured


def _one_launch_ms(exe, stream):
    """Device time of one launch of ``exe`` on ``stream`` alone (events around it)."""
    with Event() as start, Event() as end:
        start.record(stream)
        exe.launch(stream)
        end.record(stream)
        end.synchronize()
        return start.elapsed_ms(end)


def _relu_chain(dev, pairs):
    """A built graph of one relu node per ``(x, y)`` pair, each after the one before; and its nodes."""
    g = GraphBuilder(dev)
    nodes = []
    try:
        for x, y in pairs:
            views = {"x": x.view(), "y": y.view()}
            nodes.append(g.kernel(ops.relu(dev, views, "x", "y"), deps=nodes[-1] if nodes else ()))
    except BaseException:
        g.close()
        raise
    return g.build(), nodes


def _alloc_graph(dev, nbytes, free):
    """A built graph that allocates ``nbytes`` (``cuGraphAddMemAllocNode``), fills them with
    ``FILL`` (a memset node) and, when ``free``, frees them again (``cuGraphAddMemFreeNode``)."""
    g = GraphBuilder(dev)
    try:
        alloc, ptr = g.mem_alloc(nbytes)
        last = g.memset(ptr, FILL, nbytes // 4, deps=alloc)
        if free:
            g.mem_free(ptr, deps=last)
    except BaseException:
        g.close()
        raise
    return g.build(), ptr


def _instantiate(graph, flags=0):
    """``cuGraphInstantiate`` straight on the driver: the raw exec handle."""
    return call(driver.cuGraphInstantiate, graph.handle, flags)


def _instantiate_params(flags=0, upload_stream=None):
    p = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
    p.flags = flags
    if upload_stream is not None:
        p.hUploadStream = upload_stream.handle
    return p


def _destroy_execs(execs):
    for exe in execs:
        driver.cuGraphExecDestroy(exe)
    execs.clear()


# -- user objects ----------------------------------------------------------------------------------
def test_a_user_object_outlives_graph_and_exec_until_the_last_launch_has_run(stream):
    """A user object whose one reference was moved into a graph: destroying the graph leaves it
    to the exec, destroying the exec with a launch running leaves it to that launch, and its
    destructor runs once, on a driver thread, after the launch has finished."""
    tag = 0x5EED
    ran = []

    def on_destroy(ptr):  # no CUDA call here: it runs on the driver's thread
        ran.append((ptr, threading.get_ident()))

    thunk = _DESTRUCTOR(on_destroy)
    _DESTRUCTORS.append(thunk)
    address = ctypes.cast(thunk, ctypes.c_void_p).value
    graph = _spin_graph(stream, spin_ns(200_000_000))
    exe = None
    no_sync = int(driver.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    obj = call(driver.cuUserObjectCreate, tag, driver.CUhostFn(address), 1, no_sync)
    ours = 1  # references this thread owns (released in finally if the move did not happen)
    try:
        move = int(driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE)
        call(driver.cuGraphRetainUserObject, graph.handle, obj, 1, move)
        ours = 0
        exe = graph.instantiate()
        graph.close()  # cuGraphDestroy: the exec holds its own copy of the reference
        time.sleep(0.1)
        assert ran == [], "the destructor ran when the graph was destroyed while an exec of it lives"
        exe.launch(stream)  # 200 ms of device time
        exe.close()  # cuGraphExecDestroy with the launch in flight
        time.sleep(0.05)
        assert not stream.query(), "the launch had finished already: the check below would mean nothing"
        assert ran == [], "the destructor ran while the launch that holds the reference was running"
        stream.synchronize()
        deadline = time.monotonic() + 2.0 * SANITIZER_SLOWDOWN
        while not ran and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # a second call, were there one, would come now
        assert [ptr for ptr, _thread in ran] == [tag], ran
        assert ran[0][1] != threading.get_ident(), "the destructor ran on the thread that synchronized"
    finally:
        if ours:
            driver.cuUserObjectRelease(obj, ours)
        if exe is not None:
            exe.close()
        graph.close()


# -- one exec, one launch at a time ------------------------------------------------------------------
def test_one_exec_launched_on_two_streams_runs_one_launch_at_a_time(stream):
    """The same exec launched on two streams: the second launch starts after the first ends."""
    with _spin_graph(stream, SPIN_NS) as graph, graph.instantiate() as exe, Stream() as other:
        for s in (stream, other):  # warm: the first launch on each stream
            exe.launch(s)
            s.synchronize()
        single = _one_launch_ms(exe, stream)
        assert single >= 0.9 * SPIN_MS, f"one launch took {single:.1f} ms"
        with Event() as start, Event() as end1, Event() as end2, Event() as done:
            start.record(stream)
            exe.launch(stream)
            end1.record(stream)
            exe.launch(other)
            end2.record(other)
            stream.wait(end2)
            done.record(stream)
            done.synchronize()
            total, gap = start.elapsed_ms(done), end1.elapsed_ms(end2)
    assert total >= 1.8 * single, f"two launches of one exec on two streams took {total:.1f} ms, one {single:.1f}"
    assert gap >= 0.8 * single, f"the second launch ended {gap:.1f} ms after the first (one launch: {single:.1f})"


def test_two_execs_of_one_graph_overlap_on_two_streams(stream):
    """Two execs of the same graph on two streams run at the same time."""
    if UNDER_SANITIZER:
        pytest.skip("compute-sanitizer serialises kernels")
    with (
        _spin_graph(stream, SPIN_NS) as graph,
        graph.instantiate() as first,
        graph.instantiate() as second,
        Stream() as other,
    ):
        for exe, s in ((first, stream), (second, other)):
            exe.launch(s)
            s.synchronize()
        single = _one_launch_ms(first, stream)
        assert single >= 0.9 * SPIN_MS, f"one launch took {single:.1f} ms"
        with Event() as start, Event() as end2, Event() as done:
            start.record(stream)
            first.launch(stream)
            second.launch(other)
            end2.record(other)
            stream.wait(end2)
            done.record(stream)
            done.synchronize()
            total = start.elapsed_ms(done)
    assert single * 0.9 <= total <= 1.5 * single, f"two execs on two streams took {total:.1f} ms, one {single:.1f}"


# -- graph memory nodes ----------------------------------------------------------------------------
def test_a_relaunch_with_an_unfreed_graph_allocation_fails_unless_auto_free_on_launch(device, stream):
    n = 1 << 18
    graph, ptr = _alloc_graph(device, 4 * n, free=False)
    view = DeviceArray(ptr, (n,), np.uint32, None)
    execs = []
    live = False  # an allocation of the graph is outstanding
    try:
        execs.append(_instantiate(graph))
        call(driver.cuGraphLaunch, execs[0], stream.handle)
        live = True
        # The allocation outlives the launch: later stream work reads what the graph wrote.
        assert (view.to_numpy(stream) == FILL).all()
        (err,) = driver.cuGraphLaunch(execs[0], stream.handle)
        assert err == INVALID_VALUE, error_name(err)
        call(driver.cuMemFreeAsync, ptr, stream.handle)
        live = False
        call(driver.cuGraphLaunch, execs[0], stream.handle)  # freed: it launches again
        live = True
        call(driver.cuMemFreeAsync, ptr, stream.handle)
        live = False
        stream.synchronize()
        _destroy_execs(execs)

        execs.append(_instantiate(graph, AUTO_FREE))
        assert int(call(driver.cuGraphExecGetFlags, execs[0])) == AUTO_FREE
        for _ in range(3):
            call(driver.cuGraphLaunch, execs[0], stream.handle)
            live = True
            assert (view.to_numpy(stream) == FILL).all()
            # Poisoned while live: the next launch frees it, allocates it again and writes it.
            call(driver.cuMemsetD32Async, ptr, POISON_BITS, n, stream.handle)
        # The flag frees on the next launch only: the last allocation is the caller's to free.
        assert (view.to_numpy(stream) == POISON_BITS).all()
        call(driver.cuMemFreeAsync, ptr, stream.handle)
        live = False
        stream.synchronize()
    finally:
        if live:
            driver.cuMemFreeAsync(ptr, stream.handle)
        driver.cuStreamSynchronize(stream.handle)
        _destroy_execs(execs)
        graph.close()


def test_a_graph_with_memory_nodes_has_one_exec_at_a_time(device, stream):
    graph, _ptr = _alloc_graph(device, 1 << 20, free=True)
    execs = []
    try:
        execs.append(_instantiate(graph))
        err, second = driver.cuGraphInstantiate(graph.handle, 0)
        if err == SUCCESS:
            execs.append(second)
        assert err != SUCCESS, "a second exec of a graph holding memory nodes was instantiated"
        params = _instantiate_params()
        err, third = driver.cuGraphInstantiateWithParams(graph.handle, params)
        if err == SUCCESS:
            execs.append(third)
        assert err != SUCCESS, "a second exec (cuGraphInstantiateWithParams) was instantiated"
        # With the first exec destroyed the graph instantiates again, and that exec runs.
        call(driver.cuGraphExecDestroy, execs.pop(0))
        execs.append(_instantiate(graph))
        call(driver.cuGraphLaunch, execs[0], stream.handle)
        stream.synchronize()
    finally:
        driver.cuStreamSynchronize(stream.handle)
        _destroy_execs(execs)
        graph.close()


def test_graph_memory_attributes_count_the_allocation_and_trim_gives_it_back(device, stream):
    nbytes = 64 << 20  # over the pool's 32 MiB unit
    base = trim_graph_memory(device)["reserved_current"]  # what other graphs still hold
    reset_high_water(device)
    graph, _ptr = _alloc_graph(device, nbytes, free=True)
    execs = []
    try:
        execs.append(_instantiate(graph))
        call(driver.cuGraphLaunch, execs[0], stream.handle)
        stream.synchronize()
        mem = graph_memory(device)  # cuDeviceGetGraphMemAttribute, each value as an int
        assert mem["used_high"] >= nbytes, mem
        assert mem["reserved_current"] >= nbytes, mem  # the pool keeps the pages after the launch
        _destroy_execs(execs)
        after = trim_graph_memory(device)  # cuDeviceGraphMemTrim, then the attributes again
        assert after["reserved_current"] < mem["reserved_current"], (after, mem)
        assert after["reserved_current"] <= base, (after, base)
    finally:
        _destroy_execs(execs)
        graph.close()


# -- instantiation ---------------------------------------------------------------------------------
def test_instantiate_with_params_uploads_and_the_exec_flags_omit_upload(device, stream, rng):
    xh = random_input(rng, (N,))
    with DeviceBuffer.from_numpy(xh, stream=stream) as x, DeviceBuffer(N) as y:
        graph, _nodes = _relu_chain(device, [(x, y)])
        exe = None
        try:
            params = _instantiate_params(AUTO_FREE | UPLOAD, upload_stream=stream)
            exe = call(driver.cuGraphInstantiateWithParams, graph.handle, params)
            assert params.result_out == INSTANTIATED, params.result_out
            assert int(params.hErrNode_out) == 0
            assert int(call(driver.cuGraphExecGetFlags, exe)) == AUTO_FREE  # the upload flag is not kept
            y.poison(stream)
            call(driver.cuGraphLaunch, exe, stream.handle)
            np.testing.assert_array_equal(y.to_numpy(stream), np.maximum(xh, 0))
        finally:
            driver.cuStreamSynchronize(stream.handle)
            if exe is not None:
                driver.cuGraphExecDestroy(exe)
            graph.close()


def test_an_unused_conditional_handle_fails_instantiation(device, stream):
    if driver_cuda_version() < 12080:
        pytest.skip(
            f"CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED needs CUDA 12.8, the driver has {driver_cuda_version()}"
        )
    unused = GraphBuilder(device)
    unused.kernel(ops.spin(device, 0))
    cn.make_handle(unused, default=0)  # cuGraphConditionalHandleCreate, no node takes it
    lone = unused.build()
    used = GraphBuilder(device)
    first = used.kernel(ops.spin(device, 0))
    node = cn.add_conditional(used, "if", cn.make_handle(used, default=0), deps=first)
    node.bodies[0].kernel(cn.noop(device))
    paired = used.build()
    execs = []
    try:
        params = _instantiate_params()
        err, exe = driver.cuGraphInstantiateWithParams(lone.handle, params)
        if err == SUCCESS:
            execs.append(exe)
        assert err != SUCCESS, "a graph with an unused conditional handle was instantiated"
        unused_result = driver.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED
        assert params.result_out == unused_result, (error_name(err), params.result_out)
        # The same graph with a conditional node on its handle instantiates and runs.
        params = _instantiate_params()
        execs.append(call(driver.cuGraphInstantiateWithParams, paired.handle, params))
        assert params.result_out == INSTANTIATED, params.result_out
        call(driver.cuGraphLaunch, execs[-1], stream.handle)
        stream.synchronize()
    finally:
        driver.cuStreamSynchronize(stream.handle)
        _destroy_execs(execs)
        lone.close()
        paired.close()


# -- cuGraphExecUpdate fine print --------------------------------------------------------------------
def test_exec_update_keeps_a_disabled_node_disabled(device, stream, rng):
    x1h, x2h = random_input(rng, (N,)), random_input(rng, (N,))
    with (
        DeviceBuffer.from_numpy(x1h, stream=stream) as x1,
        DeviceBuffer.from_numpy(x2h, stream=stream) as x2,
        DeviceBuffer(N) as y1,
        DeviceBuffer(N) as y2,
    ):
        g1, (a, _b) = _relu_chain(device, [(x1, y1), (x1, y2)])
        g2, _nodes = _relu_chain(device, [(x2, y1), (x2, y2)])
        with g1, g2, g1.instantiate() as exe:
            y1.poison(stream)
            exe.launch(stream)
            np.testing.assert_array_equal(y1.to_numpy(stream), np.maximum(x1h, 0))  # the node runs enabled
            call(driver.cuGraphNodeSetEnabled, exe.handle, a.handle, 0)
            exe.update(g2)  # cuGraphExecUpdate: same shape, every node reads x2 now
            assert int(call(driver.cuGraphNodeGetEnabled, exe.handle, a.handle)) == 0
            y1.poison(stream)
            y2.poison(stream)
            exe.launch(stream)
            np.testing.assert_array_equal(y2.to_numpy(stream), np.maximum(x2h, 0))  # the update took effect
            assert (y1.to_numpy(stream).view(np.uint32) == POISON_BITS).all(), "the disabled node ran"
            # Enabled again, the node runs the parameters the update gave it while it was disabled.
            call(driver.cuGraphNodeSetEnabled, exe.handle, a.handle, 1)
            y1.poison(stream)
            exe.launch(stream)
            np.testing.assert_array_equal(y1.to_numpy(stream), np.maximum(x2h, 0))


def test_exec_update_with_one_node_more_is_a_topology_change(device, stream, rng):
    x1h, x2h = random_input(rng, (N,)), random_input(rng, (N,))
    with (
        DeviceBuffer.from_numpy(x1h, stream=stream) as x1,
        DeviceBuffer.from_numpy(x2h, stream=stream) as x2,
        DeviceBuffer(N) as y1,
        DeviceBuffer(N) as y2,
    ):
        g1, _one = _relu_chain(device, [(x1, y1)])
        g2, _two = _relu_chain(device, [(x2, y1), (x2, y2)])
        with g1, g2, g1.instantiate() as exe:
            err, _info = driver.cuGraphExecUpdate(exe.handle, g2.handle)
            assert err == driver.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, error_name(err)
            with pytest.raises(GraphUpdateError) as refused:  # reads the result info the binding drops
                exe.update(g2)
            assert refused.value.result == "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED", refused.value
            assert refused.value.error_node == 0  # the node counts differ: the driver names no node
            y1.poison(stream)
            y2.poison(stream)
            exe.launch(stream)  # the exec is unchanged: its one node still reads x1
            np.testing.assert_array_equal(y1.to_numpy(stream), np.maximum(x1h, 0))
            assert (y2.to_numpy(stream).view(np.uint32) == POISON_BITS).all()


# -- edge data and the driver's DOT file ----------------------------------------------------------
def _edges_without_data(graph_handle, count):
    """``cuGraphGetEdges`` with ``from`` and ``to`` but a null ``edgeData`` (libcuda's
    ``cuGraphGetEdges_v2`` through ctypes): the result code and the edge count."""
    fn = ctypes.CDLL("libcuda.so.1").cuGraphGetEdges_v2
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    frm, to = (ctypes.c_void_p * count)(), (ctypes.c_void_p * count)()
    n = ctypes.c_size_t(count)
    rc = fn(int(graph_handle), frm, to, None, ctypes.byref(n))
    return rc, n.value


def test_a_programmatic_edge_makes_a_query_without_edge_data_lossy(device):
    pdl = GraphBuilder(device)
    a = pdl.kernel(ops.spin(device, 0))
    b = pdl.kernel(ops.spin(device, 0), deps=[(a, "programmatic")])  # cuGraphAddDependencies with edge data
    programmatic = pdl.build()
    plain = GraphBuilder(device)
    c = plain.kernel(ops.spin(device, 0))
    plain.kernel(ops.spin(device, 0), deps=c)
    default = plain.build()
    with programmatic, default:
        rc, _n = _edges_without_data(programmatic.handle, 1)
        assert rc == int(driver.CUresult.CUDA_ERROR_LOSSY_QUERY), error_name(rc)
        frm, to, data, n = call(driver.cuGraphGetEdges, programmatic.handle, 1)
        assert n == 1 and (int(frm[0]), int(to[0])) == (int(a.handle), int(b.handle))
        assert int(data[0].type) == int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
        assert int(data[0].from_port) == int(driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
        assert int(data[0].to_port) == 0
        # Default edges lose nothing: the same query without edge data answers.
        assert _edges_without_data(default.handle, 1) == (0, 1)


def test_the_drivers_dot_file_names_each_kernel(device, tmp_path):
    with DeviceBuffer(N) as x, DeviceBuffer(N) as y:
        g = GraphBuilder(device)
        first = g.kernel(ops.spin(device, 0))
        g.kernel(ops.relu(device, {"x": x.view(), "y": y.view()}, "x", "y"), deps=first)
        with g.build() as graph:
            path = tmp_path / "driver.dot"
            call(driver.cuGraphDebugDotPrint, graph.handle, str(path).encode(), 0)  # no flags: the default content
            text = path.read_text()
            assert text.lstrip().startswith("digraph"), text[:200]
            assert "spin" in text and "relu" in text, text[:2000]
            ours = to_dot(graph)
            assert "spin" in ours and "relu" in ours
