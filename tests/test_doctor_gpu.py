"""The graph doctor on the GPU (issue 24): one seeded fault per class, each made the way users get
it, named on the right node; verify's first diverging node; and no finding at all on the clean
graphs the suite builds (TinyBlock plans in every form, captured and built, fork/join, buckets,
slots, RawKernel captures, torch and CuPy graphs adopted cleanly)."""

import numpy as np
import pytest
from helpers import CHECK_DESTRUCTION, torch_with_graphs

from rawgraph.doctor import check, faults, verify, watch
from rawgraph.doctor.verify import VerifyError

pytestmark = pytest.mark.gpu


_torch = torch_with_graphs


def _named(report, fault):
    hits = [f for f in report.findings if f.cls == fault.cls and f.path == fault.node]
    assert hits, f"{fault.name}: expected class {fault.cls} on node {fault.node}; got\n{report}"
    return hits[0]


@pytest.fixture
def seeded():
    made = []
    yield made
    for f in made:
        f.close()


# ------------------------------------------------------------------------------- seeded faults
def test_dangling_freed_buffer(seeded):
    f = faults.dangling()
    seeded.append(f)
    hit = _named(f.check(), f)
    assert hit.severity == "error" and hit.name == "dangling" and hit.kernel == "scale"
    assert hit.where == "arg x"
    # an allocation of x's size may take its address again (the demo's later faults do): the
    # baseline still tells it from the buffer the graph was built with
    from rawgraph import DeviceBuffer

    with DeviceBuffer(faults.N):
        again = _named(f.check(), f)
    assert again.severity == "error" and again.name == "dangling" and again.where == "arg x"


def test_stream_ordered_pool_buffer_freed_after_capture(seeded, stream):
    f = faults.stream_ordered_pool(stream)
    seeded.append(f)
    # while it was live (the baseline): a warning naming the pool
    live = [x for x in f.options["baseline"].findings if x.path == f.node or str(x.node_index) == f.node]
    assert [(x.name, x.severity) for x in live] == [("stream-ordered-pool", "warning")]
    assert "pool" in live[0].owner
    # freed back to the pool: the driver no longer knows the address, the baseline does
    hit = _named(f.check(), f)
    assert hit.name == "stream-ordered-pool" and hit.severity == "error"
    assert "cuMemFreeAsync" in hit.owner
    # without the baseline it reads as any freed memory
    plain = check(f.graph)
    assert [x.name for x in plain.findings] == ["dangling"]


def test_host_staging_buffer_freed_and_reallocated(seeded):
    f = faults.host_memory()
    seeded.append(f)
    hit = _named(f.check(), f)
    assert hit.name == "host-memory" and hit.severity == "error" and hit.where == "memcpy.src"
    # without the baseline the driver still says the memory is live pinned memory or unknown
    plain = check(f.graph, include_info=True)
    assert plain.of_class(3)


def test_cupy_pinned_staging_buffer_freed_and_reallocated(seeded):
    pytest.importorskip("torch")  # conftest order: torch before CuPy
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("CuPy has no CUDA here")
    f = faults.host_memory_cupy()
    seeded.append(f)
    hit = _named(f.check(), f)
    assert hit.name == "host-memory" and hit.severity == "error"


def test_torch_tensor_deleted_and_block_reused(seeded):
    torch = _torch()
    f = faults.allocator_freed()
    seeded.append(f)
    assert f.node != "?"
    hit = _named(f.check(), f)
    assert hit.name == "allocator-freed" and hit.severity == "error"
    del torch


def _torch_reader(torch):
    """A torch graph reading ``x`` (8 x 256 float32, allocated before capture, warmed up on a side
    stream), as examples/doctor_torch.py makes it: (adopted graph, torch graph, w, x)."""
    from rawgraph.updates.adopt import from_torch

    w = torch.randn(256, 256, device="cuda") / 16
    x = torch.randn(8, 256, device="cuda")
    g = faults._torch_capture(torch, lambda: torch.relu(x @ w) + x)
    return from_torch(g), g, w, x


@pytest.mark.skipif(
    not CHECK_DESTRUCTION,
    reason="under compute-sanitizer the driver calls' frames keep the "
    "deleted input alive (tests/helpers.py), so its weak reference never dies",
)
def test_a_deleted_torch_input_whose_block_is_reused_whole_is_named():
    # examples/doctor_torch.py on an H200: after `del x` the caching allocator handed z exactly
    # x's block (same address, same size, active again), so no allocator state differed from the
    # baseline; the baseline's weak reference to the input it was given tells x has gone.
    torch = _torch()
    # the control: x kept alive, a tensor of its size allocated after it
    a, g, w, x = _torch_reader(torch)
    try:
        base = check(a, inputs=[x.detach()])  # a wrapper dies at once; the storage it names lives
        assert base.findings == [], str(base)
        z = torch.empty(8, 256, device="cuda")
        later = check(a, baseline=base)
        assert later.of_class(4) == [], str(later)
        assert [r.alive for r in later.inputs] == [True]
        del z
    finally:
        a.close()
    del g, w, x
    # the bug: x deleted, z takes its memory
    a, g, w, x = _torch_reader(torch)
    try:
        base = check(a, inputs=[x])
        assert base.findings == [], str(base)
        ptr = x.data_ptr()
        holder = faults._first_holder(a, ptr)
        del x
        z = torch.empty(8, 256, device="cuda")
        later = check(a, baseline=base)
        hits = [f for f in later.findings if f.cls == 4 and f.name == "allocator-freed" and f.severity == "error"]
        assert hits, str(later)
        if holder != "?":
            assert holder in {f.path for f in hits}, f"first node holding x: {holder}\n{later}"
        if z.data_ptr() == ptr:  # the whole block reused: only the input's identity tells
            assert any("input 0" in f.owner for f in hits), str(later)
        assert [r.alive for r in later.inputs] == [False]
        del z
    finally:
        a.close()
    del g, w


def test_missing_edge_between_writer_and_reader(seeded):
    f = faults.unordered_overlap()
    seeded.append(f)
    hit = _named(f.check(), f)
    assert hit.severity == "error" and hit.related == ("0",)
    # the same two kernels with the edge: clean
    from rawgraph import DeviceBuffer, GraphBuilder

    k = faults.kernels()
    buf, out = DeviceBuffer(faults.N), DeviceBuffer(faults.N)
    b = GraphBuilder()
    w = b.kernel(k["fill"].launch(8, 128, (buf, 1.0, faults.N)))
    b.kernel(k["scale"].launch(8, 128, (buf, out, 2.0, faults.N)), deps=[w])
    g = b.build()
    assert check(g).findings == []
    g.close()
    buf.close()
    out.close()


def test_two_unordered_copies_into_one_pinned_buffer_are_unordered_writes():
    # Driver facts for real pinned memory (cuMemHostAlloc): the race of two copies writing it is
    # the class 5 error a device buffer gets; with the edge, no class 5 finding.
    from rawgraph import DeviceBuffer, GraphBuilder, HostBuffer

    n = int(np.random.default_rng().integers(64, 4097))
    host, x, y = HostBuffer(n, np.float32), DeviceBuffer(n), DeviceBuffer(n)
    try:
        for ordered in (False, True):
            b = GraphBuilder()
            first = b.memcpy(host, x, 4 * n)
            b.memcpy(host, y, 4 * n, deps=[first] if ordered else ())
            g = b.build()
            try:
                r = check(g)
                got = [(f.cls, f.name, f.severity, f.address, f.where) for f in r.findings if f.cls == 5]
                want = [] if ordered else [(5, "unordered-overlap", "error", host.ptr, "memcpy.dst")]
                assert got == want, str(r)
            finally:
                g.close()
    finally:
        for buf in (host, x, y):
            buf.close()


def test_torch_input_that_is_an_intermediate(seeded):
    _torch()
    f = faults.input_is_intermediate()
    seeded.append(f)
    t_ptr, inp = f.keep[3]["t"], f.keep[1]
    if t_ptr != inp.data_ptr():
        pytest.skip("torch's private pool did not give the input the intermediate's address this time")
    hit = _named(f.check(), f)
    assert hit.name == "input-is-intermediate" and hit.severity == "warning"
    assert hit.related  # the later readers of the same address


def test_conditional_without_default_nobody_sets(seeded):
    f = faults.conditional_default()
    seeded.append(f)
    hit = _named(f.check(), f)
    assert hit.name == "conditional-default" and hit.severity == "error"
    # without the caller's word the driver cannot say whether the handle has a default: a warning
    unsure = _named(check(f.graph), f)
    assert unsure.severity == "warning"


# ------------------------------------------------------------------------------- verify
def test_verify_names_the_middle_node_given_a_wrong_argument(stream):
    w = faults.wrong_argument(stream)
    try:
        x_before = (
            np.array(w.plan.buffers["x"].owner.to_numpy()) if hasattr(w.plan.buffers["x"].owner, "to_numpy") else None
        )
        res = verify(w.exec, stream, seed=1)
        assert not res.ok and res.mismatch.output == "out"
        assert res.node == 1, res
        assert "shift" in res.node_label
        # a finite difference everywhere: 3 * (5 - 1) = 12
        assert abs(abs(res.node_mismatch.got - res.node_mismatch.want) - 4.0) < 1e-4
        with pytest.raises(VerifyError, match="first diverging node 1"):
            verify(w.exec, stream, action="raise")
        # the buffers as they were (verify puts every plan buffer back)
        if x_before is not None:
            np.testing.assert_array_equal(w.plan.buffers["x"].owner.to_numpy(), x_before)
        v = watch(w.exec, every=0)
        assert v is w.exec  # verification off: the exec itself
        v2 = watch(w.exec, every=2)
        v2.launch(stream)
        with pytest.raises(VerifyError):
            v2.launch(stream)
    finally:
        w.close()


def test_verify_clean_plan_is_ok(stream, rng):
    from rawgraph import DeviceBuffer, TinyBlock, capture_plan

    with (
        TinyBlock(64, 4, 2, seed=int(rng.integers(1 << 30))) as model,
        DeviceBuffer((4, 64)) as x,
        DeviceBuffer((4, 64)) as out,
    ):
        g = capture_plan(model.plan(x, out), stream)
        exe = g.instantiate()
        res = verify(exe, stream, seed=int(rng.integers(1 << 30)))
        assert res.ok, res
        exe.close()
        g.close()


# ------------------------------------------------------------------------------- clean graphs
def _clean(graph, **kw):
    report = check(graph, **kw)
    assert report.findings == [], str(report)
    return report


def test_clean_tinyblock_plans_in_every_form(stream):
    from rawgraph import DeviceBuffer, TinyBlock, build_plan, capture_plan

    for form in ("unfused", "fused", "block"):
        with TinyBlock(64, 4, 3, form=form) as model, DeviceBuffer((4, 64)) as x, DeviceBuffer((4, 64)) as out:
            x.poison(stream)
            plan = model.plan(x, out)
            g = capture_plan(plan, stream)
            _clean(g)
            _clean(g.instantiate())  # an exec: its graph is examined
            g.close()
            b = build_plan(plan)
            _clean(b)
            b.close()


def test_clean_fork_join_and_rawkernel_capture(stream):
    from rawgraph import Capture, DeviceBuffer, TwoBranchBlock, capture_branches

    with TwoBranchBlock(64, 4) as model:
        bufs = [DeviceBuffer((4, 32)) for _ in range(4)]
        for buf in bufs[:2]:
            buf.poison(stream)
        for fork in (True, False):
            g = capture_branches(model.plans(*bufs), stream, fork=fork)
            _clean(g)
            g.close()
        for buf in bufs:
            buf.close()
    k = faults.kernels()
    a, b2, c = DeviceBuffer(faults.N), DeviceBuffer(faults.N), DeviceBuffer(faults.N)
    with Capture(stream, side_streams=1) as cap:
        k["fill"](8, 128, (a, 1.0, faults.N), stream=stream)
        side = cap.fork(1)[0]
        k["scale"](8, 128, (a, b2, 2.0, faults.N), stream=stream)
        k["shift"](8, 128, (a, c, 1.0, faults.N), stream=side)
        cap.join([side])
    _clean(cap.graph)
    cap.graph.close()
    for buf in (a, b2, c):
        buf.close()


def test_clean_buckets_and_slots(stream):
    from rawgraph import BucketGraphs, SlotPool, TinyBlock

    with TinyBlock(64, 8, 2) as model:
        bg = BucketGraphs(model, sizes=[2, 4, 8], stream=stream)
        try:
            assert bg.graphs
            for g in bg.graphs.values():
                _clean(g)
        finally:
            bg.close()
        from rawgraph.serving.slots import TABLE_MODES

        for table in TABLE_MODES:
            pool = SlotPool(model, max_slots=4, sizes=[2, 4], table=table, stream=stream)
            try:
                assert pool.graphs
                for g in pool.graphs.values():
                    _clean(g)
            finally:
                pool.close()


def test_clean_torch_graph_adopted(rng):
    torch = _torch()
    from rawgraph.updates.adopt import from_torch

    width = 128
    w1 = torch.randn(width, width, device="cuda") / width**0.5
    w2 = torch.randn(width, width, device="cuda") / width**0.5
    mlp = (
        torch.nn.Sequential(
            torch.nn.Linear(width, 256), torch.nn.GELU(), torch.nn.LayerNorm(256), torch.nn.Linear(256, width)
        )
        .cuda()
        .eval()
    )
    x = torch.randn(4, width, device="cuda")

    def fn():
        with torch.no_grad():
            return mlp(torch.relu(x @ w1) @ w2 + x)

    g = faults._torch_capture(torch, fn)
    a = from_torch(g)
    _clean(a, inputs=[x])
    a.close()


def test_clean_cupy_graph_adopted():
    pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    from rawgraph.updates.adopt import from_cupy

    x = cupy.arange(4096, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        y = x * 2  # warm-up
        s.synchronize()
        s.begin_capture()
        y = cupy.sin(x * 2) + 1
        cg = s.end_capture()
    a = from_cupy(cg)
    _clean(a, inputs=[x])
    a.close()
    del y


def test_report_json_and_dot(seeded):
    import json

    from rawgraph.graphs.dot import to_dot

    f = faults.unordered_overlap()
    seeded.append(f)
    report = f.check()
    data = json.loads(json.dumps(report.to_dict()))
    assert data["by_class"] == {"unordered-overlap": 1} and not data["ok"]
    text = to_dot(f.graph, findings=report)
    assert "unordered-overlap" in text and "fillcolor" in text
    assert np.isfinite(report.seconds)


def test_doctor_demo_command():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "doctor", "--demo"], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "every seeded fault found" in r.stdout
