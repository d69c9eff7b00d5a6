"""Fork/join capture: the node map and its dependencies equal the driver's edges, replays equal
eager and the linear capture to the bit; and its error cases: unjoined streams give the typed
error (every stream stays usable), fork refusals come before the driver, and foreign work inside a
rawgraph capture (launched straight on the stream, not recorded) is mapped, or refused on request."""

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input, rel_err, usable_afterwards

from rawgraph import Capture, CaptureError, CaptureRefusedError, DeviceBuffer, Stream, get_device, ops
from rawgraph.models.branches import TwoBranchBlock, concat, split
from rawgraph.runtime import _capturing
from rawgraph.runtime.errors import check
from rawgraph.runtime.memory import DeviceArray

pytestmark = pytest.mark.gpu

UNJOINED = "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"


def _chain(nodes):
    return {(int(a.handle), int(b.handle)) for a, b in zip(nodes, nodes[1:])}


def _branch_io(model, rng, stream):
    xh = random_input(rng, (model.batch, model.width))
    xa, xb = (DeviceBuffer.from_numpy(h, stream=stream) for h in split(xh))
    ya, yb = DeviceBuffer((model.batch, model.half)), DeviceBuffer((model.batch, model.half))
    return xh, xa, xb, ya, yb


def _replay(exe, outs, stream):
    for o in outs:
        o.poison(stream)
    exe.launch(stream)
    return concat(*(o.to_numpy(stream) for o in outs))


@pytest.mark.parametrize("form", ["unfused", "fused", "block"])
def test_two_branches_fork_join_equal_eager_and_linear_to_the_bit(stream, rng, form):
    model = TwoBranchBlock(256, 4, 2, seed=int(rng.integers(1 << 30)), form=form)
    xh, xa, xb, ya, yb = _branch_io(model, rng, stream)
    plans = model.plans(xa, xb, ya, yb)
    for o in (ya, yb):
        o.poison(stream)
    model.forward(xa, xb, ya, yb, stream)
    eager = concat(ya.to_numpy(stream), yb.to_numpy(stream))
    assert rel_err(eager, model.reference(xh, stream)) < 1e-4, f"seed {rng.seed_used}"
    forked = model.capture(plans, stream, fork=True)
    linear = model.capture(plans, stream, fork=False)
    n_a, n_b = len(plans[0]), len(plans[1])
    for g in (forked, linear):
        assert g.node_count() == n_a + n_b and g.foreign_nodes == []
        g.verify_node_map()
        g.verify_edges()
    # The DAG: two independent chains, each starting from nothing; the linear form: one chain.
    a_nodes, b_nodes = forked.nodes[:n_a], forked.nodes[n_a:]
    assert set(forked.edges()) == _chain(a_nodes) | _chain(b_nodes)
    assert a_nodes[0].deps == () and b_nodes[0].deps == ()
    assert set(linear.edges()) == _chain(linear.nodes) and linear.nodes[n_a].deps == (
        int(linear.nodes[n_a - 1].handle),
    )
    fx, lx = forked.instantiate(), linear.instantiate()
    np.testing.assert_array_equal(_replay(fx, (ya, yb), stream), eager)
    np.testing.assert_array_equal(_replay(lx, (ya, yb), stream), eager)
    # Fresh input through the same addresses: still the same bits on both graphs.
    xh2 = random_input(rng, xh.shape)
    for buf, h in zip((xa, xb), split(xh2)):
        buf.copy_from_host(h, stream)
    got = _replay(fx, (ya, yb), stream)
    np.testing.assert_array_equal(got, _replay(lx, (ya, yb), stream))
    assert rel_err(got, model.reference(xh2, stream)) < 1e-4, f"seed {rng.seed_used}"


def _buffers(shape, stream, rng, names):
    """A random input ``x`` and poisoned buffers ``names``, all ``shape`` float32."""
    bufs = {}
    for name in names:
        bufs[name] = DeviceBuffer(shape)
        bufs[name].poison(stream)
    xh = random_input(rng, shape)
    bufs["x"] = DeviceBuffer.from_numpy(xh, stream=stream)
    return xh, bufs


def test_fork_into_three_streams_with_diamonds(stream, rng):
    dev = get_device()
    shape = (8, 300)
    xh, owned = _buffers(shape, stream, rng, ["t", "u1", "u2", "u3", "v", "out"])
    bufs = {k: b.view() for k, b in owned.items()}
    n0 = ops.add(dev, bufs, "x", "x", "t")  # t = 2x            (origin)
    l1 = ops.relu(dev, bufs, "t", "u1")  # u1 = relu(2x)     (s1)
    l2 = ops.add(dev, bufs, "t", "x", "u2")  # u2 = 3x           (s2)
    l3 = ops.add(dev, bufs, "t", "t", "u3")  # u3 = 4x           (s3)
    l4 = ops.add(dev, bufs, "u1", "u2", "v")  # v = u1 + u2       (s3, after joining s1 and s2)
    l5 = ops.add(dev, bufs, "v", "u3", "out")  # out = v + u3      (origin, after the join)
    order = [n0, l1, l2, l3, l4, l5]
    for launch in order:  # eager, and the kernels loaded before the capture
        launch(stream)
    eager = owned["out"].to_numpy(stream)
    x64 = xh.astype(np.float64)
    assert rel_err(eager, np.maximum(2 * x64, 0) + 3 * x64 + 4 * x64) < 1e-6, f"seed {rng.seed_used}"
    with Stream() as s1, Stream() as s2, Stream() as s3:
        with Capture(stream) as cap:
            k0 = cap.launch(n0)
            assert cap.fork([s1, s2, s3]) == [s1, s2, s3]
            k1, k2, k3 = cap.launch(l1, s1), cap.launch(l2, s2), cap.launch(l3, s3)
            cap.join([s1, s2], into=s3)
            k4 = cap.launch(l4, s3)
            cap.join()  # every side stream back into the origin
            k5 = cap.launch(l5)
        graph = cap.graph
        assert {s.ptr for s in cap.streams} == {s1.ptr, s2.ptr, s3.ptr}
        assert not any(s.is_capturing() for s in (stream, s1, s2, s3))
    h = lambda k: int(k.handle)  # noqa: E731
    # The fork: three nodes hanging off k0; the diamond: k4 on all three branches.
    assert k1.deps == k2.deps == k3.deps == (h(k0),)
    assert set(k4.deps) == {h(k1), h(k2), h(k3)}
    # The final join carries k4 and whatever else the origin's dependency set held (the driver
    # may keep edges that are transitively implied): k4 must be among them, k5 on nothing else.
    assert h(k4) in k5.deps and set(k5.deps) <= {h(k0), h(k1), h(k2), h(k4)}
    assert graph.node_count() == 6 and graph.foreign_nodes == []
    graph.verify_node_map()
    graph.verify_edges()
    exe = graph.instantiate()
    for _ in range(3):
        xh = random_input(rng, shape)
        owned["x"].copy_from_host(xh, stream)
        for name in ("t", "u1", "u2", "u3", "v", "out"):
            owned[name].poison(stream)
        exe.launch(stream)
        got = owned["out"].to_numpy(stream)
        for launch in order:
            launch(stream)
        np.testing.assert_array_equal(got, owned["out"].to_numpy(stream))
        x64 = xh.astype(np.float64)
        assert rel_err(got, np.maximum(2 * x64, 0) + 7 * x64) < 1e-6, f"seed {rng.seed_used}"


def _usable(streams, rng):
    """Every stream is out of capture, no rawgraph capture is open, and a fork/join capture on the
    same streams works and replays correctly."""
    assert not any(s.is_capturing() for s in streams) and _capturing.active() == []
    model = TwoBranchBlock(128, 2, 1, form="fused")
    xh, xa, xb, ya, yb = _branch_io(model, rng, streams[0])
    plans = model.plans(xa, xb, ya, yb)
    for p in plans:
        p.run(streams[0])
    with Capture(streams[0]) as cap:
        cap.fork(streams[1:2])
        cap.run(plans[0])
        cap.run(plans[1], streams[1])
        cap.join(streams[1:2])
    cap.graph.verify_edges()
    got = _replay(cap.graph.instantiate(), (ya, yb), streams[0])
    assert rel_err(got, model.reference(xh, streams[0])) < 1e-4, f"seed {rng.seed_used}"


@pytest.mark.parametrize("how", ["never_joined", "work_after_the_join"])
def test_an_unjoined_stream_is_named_and_every_stream_stays_usable(stream, rng, how):
    dev = get_device()
    side = Stream()
    with pytest.raises(CaptureError) as info:
        with Capture(stream) as cap:
            cap.launch(ops.empty(dev))
            cap.fork([side])
            cap.launch(ops.empty(dev), side)
            if how == "work_after_the_join":
                cap.join([side])
                cap.launch(ops.empty(dev))
                cap.launch(ops.empty(dev), side)  # the origin does not depend on this one
    exc = info.value
    assert exc.name == UNJOINED and exc.call == "cuStreamEndCapture"
    assert repr(side) in str(exc) and exc.unjoined == [side]
    assert cap.end_result == UNJOINED and cap.graph is None
    _usable([stream, side], rng)
    side.close()


def test_a_stream_joined_through_another_counts_as_joined(stream, rng):
    # s1 is joined into s2 only, and s2 into the origin: s1's work is reachable from the origin,
    # which is what cuStreamEndCapture asks for (rawgraph's prediction must agree).
    dev = get_device()
    with Stream() as s1, Stream() as s2:
        with Capture(stream) as cap:
            cap.fork([s1, s2])
            k1 = cap.launch(ops.empty(dev), s1)
            cap.join([s1], into=s2)
            k2 = cap.launch(ops.empty(dev), s2)
            # Before the last join neither is reached: s1 only through s2, which is not joined yet.
            assert {s.ptr for s in cap._unjoined()} == {s1.ptr, s2.ptr}
            cap.join([s2])
            assert cap._unjoined() == []
        assert k2.deps == (int(k1.handle),) and cap.graph.node_count() == 2
        cap.graph.verify_edges()
        _usable([stream, s1], rng)


def test_fork_refusals_before_the_driver(stream):
    dev = get_device()
    with Stream() as stranger, Stream() as other_origin:
        with Capture(stream, side_streams=1) as cap:
            with pytest.raises(CaptureRefusedError, match="not capturing.*fork it"):
                cap.launch(ops.empty(dev), stranger)  # would run now, not be captured
            with pytest.raises(CaptureRefusedError, match="default stream"):
                cap.fork([Stream.legacy()])
            with pytest.raises(CaptureRefusedError, match="side_streams"):
                cap.fork(2)
            with pytest.raises(CaptureRefusedError, match="forked from"):
                cap.fork([stream])
            with Capture(other_origin) as other:
                other.launch(ops.empty(dev))
                with pytest.raises(CaptureRefusedError, match="another capture"):
                    cap.fork([other_origin])
            (own,) = cap.fork(1)
            cap.launch(ops.empty(dev), own)
            cap.join()
        assert cap.graph.node_count() == 1 and other.graph.node_count() == 1
        assert own.closed  # the capture's own side streams end with it
        assert not stranger.is_capturing()


@pytest.mark.parametrize("foreign", ["memset", "cupy"])
def test_foreign_work_inside_a_capture_is_mapped_and_replays(stream, rng, foreign):
    dev = get_device()
    shape = (4, 256)
    xh = random_input(rng, shape)
    if foreign == "cupy":
        cp = pytest.importorskip("cupy")
        arrays = {"x": cp.asarray(xh), **{n: cp.full(shape, cp.nan, dtype=cp.float32) for n in ("h", "f", "out")}}
        cp.cuda.Device().synchronize()
        bufs = {n: DeviceArray(int(a.data.ptr), shape, np.dtype(np.float32), a) for n, a in arrays.items()}
        # CuPy 14 takes rawgraph's stream through the CUDA stream protocol (ExternalStream is
        # deprecated there); older CuPy only by address
        from_external = getattr(cp.cuda.Stream, "from_external", None)
        theirs = from_external(stream) if from_external else cp.cuda.ExternalStream(stream.ptr)

        def submit():  # f = 2 h, by a CuPy kernel on rawgraph's stream
            with theirs:
                cp.multiply(arrays["h"], cp.float32(2), out=arrays["f"])

        expect = lambda x: 2 * np.maximum(x, 0) + x  # noqa: E731
        kind = "KERNEL"
    else:
        owned = {n: DeviceBuffer(shape) for n in ("h", "f", "out")}
        owned["x"] = DeviceBuffer.from_numpy(xh, stream=stream)
        bufs = {n: b.view() for n, b in owned.items()}
        value = np.float32(1.5)

        def submit():  # f = 1.5 everywhere, by cuMemsetD32Async on the capturing stream
            check(driver.cuMemsetD32Async(bufs["f"].ptr, int(value.view(np.uint32)), bufs["f"].size, stream.handle))

        expect = lambda x: 1.5 + x  # noqa: E731
        kind = "MEMSET"
    relu, add = ops.relu(dev, bufs, "x", "h"), ops.add(dev, bufs, "f", "x", "out")
    relu(stream)
    submit()  # warm-up: CuPy compiles and loads its kernel outside the capture
    add(stream)
    stream.synchronize()
    with Capture(stream) as cap:
        k_relu = cap.launch(relu)
        submit()
        k_add = cap.launch(add)
    graph = cap.graph
    assert graph.node_count() == 3 and len(graph.nodes) == 2
    (f,) = graph.foreign_nodes
    assert f.type == kind and f.deps == (int(k_relu.handle),) and k_add.deps == (int(f.handle),)
    graph.verify_node_map()
    graph.verify_edges()
    exe = graph.instantiate()

    def read(name):
        out = np.empty(shape, np.float32)
        check(driver.cuMemcpyDtoHAsync(out.ctypes.data, bufs[name].ptr, out.nbytes, stream.handle))
        stream.synchronize()
        return out

    def poison(name):
        check(driver.cuMemsetD32Async(bufs[name].ptr, 0x7FC0DEAD, bufs[name].size, stream.handle))

    for _ in range(2):
        xh = random_input(rng, shape)
        check(driver.cuMemcpyHtoDAsync(bufs["x"].ptr, xh.ctypes.data, xh.nbytes, stream.handle))
        for name in ("h", "f", "out"):
            poison(name)
        exe.launch(stream)
        got = read("out")
        assert rel_err(got, expect(xh.astype(np.float64))) < 1e-6, f"seed {rng.seed_used}"
        # Equal to the bit to the same work run eagerly.
        relu(stream)
        submit()
        add(stream)
        np.testing.assert_array_equal(got, read("out"))


def test_work_on_the_stream_outside_the_recorder_is_detected(stream, rng):
    from rawgraph import RawgraphError

    dev = get_device()
    # Refused on request: the node count names the unrecorded work.
    with pytest.raises(RawgraphError, match="outside Capture.launch.*KERNEL"):
        with Capture(stream, foreign="refuse") as cap:
            cap.launch(ops.empty(dev))
            ops.empty(dev)(stream)  # launched straight on the stream, not recorded
    assert cap.graph is None
    usable_afterwards(stream, rng)
    # By default mapped: a foreign node with its type and its dependency on the recorded node.
    with Capture(stream) as cap:
        first = cap.launch(ops.empty(dev))
        ops.empty(dev)(stream)
        last = cap.launch(ops.empty(dev))
    graph = cap.graph
    assert [f.type for f in graph.foreign_nodes] == ["KERNEL"] and graph.node_count() == 3
    foreign = graph.foreign_nodes[0]
    assert foreign.deps == (int(first.handle),) and last.deps == (int(foreign.handle),)
    graph.verify_edges()
    usable_afterwards(stream, rng)
