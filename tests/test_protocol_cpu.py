"""The row-wise model protocol (rawgraph/serving/protocol.py) without a GPU.

Two halves: the checks themselves (``check_model``, ``row_count_arg``) on plain objects and fake
launches, and every serving and control class built over the example's second model
(``examples/buckets_own_model.py``: two user RawKernels, a scratch array) on the fake driver
(``tests/fakedriver.py``; kernels compile with NVRTC and are loaded, never run): what they
capture, which row counts they push, what they refuse and that nothing they made outlives them.
The results are checked on the GPU (``tests/test_protocol_gpu.py``).
"""

from __future__ import annotations

import gc
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from fault_cases import fake_session
from test_examples_cpu import load_example

from rawgraph import (
    BucketGraphs,
    ClosedError,
    KernelArgs,
    LayoutError,
    ReshapedGraph,
    RowCountBuckets,
    SlotPool,
    Stream,
)
from rawgraph.control import DepthLoop, NormGate
from rawgraph.serving.protocol import REQUIRED, RowwiseModel, check_model, row_count_arg

WIDTH = 64


class Complete:
    """Every required attribute of the protocol, nothing behind them (the checks read no more)."""

    width, batch, device = WIDTH, 1, None

    def plan(self, x, out, scratch=None): ...
    def with_batch(self, batch, workspace=None): ...
    def make_workspace(self, rows): ...
    def scratch_layout(self, batch): ...
    def reference(self, x): ...
    def close(self): ...


def lacking(*names):
    """A Complete whose class hides ``names`` (a model that does not keep the protocol)."""
    cls = type("Lacking", (), {k: v for k, v in vars(Complete).items() if k not in names and not k.startswith("__")})
    return cls()


def fake_launch(name="k", spec=(("x", "ptr"), ("n", "i32"))):
    return SimpleNamespace(kernel=SimpleNamespace(name=name), args=KernelArgs(list(spec)))


# -- check_model --------------------------------------------------------------------------------
def test_a_complete_model_passes_and_keeps_the_runtime_protocol():
    m = Complete()
    assert check_model(m) is m
    assert isinstance(m, RowwiseModel)


@pytest.mark.parametrize("missing", [(name,) for name in REQUIRED] + [("plan", "with_batch"), REQUIRED])
def test_a_model_missing_attributes_is_a_type_error_naming_them(missing):
    m = lacking(*missing)
    with pytest.raises(TypeError, match="row-wise model protocol") as err:
        check_model(m, "BucketGraphs model")
    for name in missing:
        assert name in str(err.value)
    assert "BucketGraphs model" in str(err.value)


@pytest.mark.parametrize("width", [0, -4, True, 2.0, "64", None])
def test_a_width_that_is_not_a_positive_int_is_refused(width):
    m = Complete()
    m.width = width
    with pytest.raises(TypeError, match="width must be a positive int"):
        check_model(m)


def test_a_closed_model_refuses_with_its_own_error():
    m = Complete()
    m._check_open = lambda: (_ for _ in ()).throw(ClosedError("Complete is closed"))
    with pytest.raises(ClosedError, match="Complete is closed"):
        check_model(m)


@pytest.mark.parametrize(
    "make",
    [
        lambda m: BucketGraphs(m, sizes=[1, 2]),
        lambda m: RowCountBuckets(m, sizes=[1, 2]),
        lambda m: ReshapedGraph(m, max_batch=2),
        lambda m: SlotPool(m, max_slots=2),
    ],
)
@pytest.mark.parametrize("missing", ["with_batch", "make_workspace", "scratch_layout", "plan", "width"])
def test_serving_refuses_a_model_missing_a_method_before_any_driver_call(make, missing):
    with fake_session() as (_fake, hook):
        with pytest.raises(TypeError, match=missing):
            make(lacking(missing))
        assert hook.calls == 0 and not hook.live, "a refused model reached the driver"


@pytest.mark.parametrize(
    "make", [lambda m: DepthLoop(m, None, None, max_depth=2), lambda m: NormGate(m, None, None, 1.0)]
)
@pytest.mark.parametrize("missing", ["plan", "batch", "width", "device"])
def test_control_refuses_a_model_missing_what_it_uses_before_any_driver_call(make, missing):
    with fake_session() as (_fake, hook):
        with pytest.raises(TypeError, match=missing):
            make(lacking(missing))
        assert hook.calls == 0 and not hook.live


# -- row_count_arg ------------------------------------------------------------------------------
def test_row_count_arg_returns_the_name_and_an_int_factor():
    class M(Complete):
        def row_count_arg(self, launch):
            return ("n", np.int64(WIDTH)) if launch.kernel.name == "k" else None

    got = row_count_arg(M(), fake_launch())
    assert got == ("n", WIDTH) and type(got[1]) is int and type(got[0]) is str


def test_row_count_arg_refusals_are_type_errors():
    with pytest.raises(TypeError, match="names no row-count argument of k"):
        row_count_arg(Complete(), fake_launch())  # the optional method is absent

    class Nothing(Complete):
        def row_count_arg(self, launch):
            return None

    with pytest.raises(TypeError, match="names no row-count argument of k"):
        row_count_arg(Nothing(), fake_launch())

    class Wrong(Complete):
        def row_count_arg(self, launch):
            return "rows", 1

    with pytest.raises(TypeError, match="names 'rows', not an argument of k"):
        row_count_arg(Wrong(), fake_launch())


# -- the example's model on the fake driver --------------------------------------------------------
@pytest.fixture
def fake():
    """(fake driver, hook, stream): a fake-driver session whose RawKernel modules are closed with it,
    and one stream open for the whole test (a stream closed in the test would leave its tail event
    to the garbage collector). Modules and that stream count as no leak."""
    import rawgraph.runtime.module as kernels
    import rawgraph.runtime.rawkernel as rawkernel

    saved = dict(rawkernel._loaded)
    rawkernel._loaded.clear()
    with fake_session() as (fk, hook):
        s = Stream()
        hook.exempt = lambda: (
            {("module", int(k.module.handle)) for k in [*kernels._kernels.values(), *rawkernel._loaded.values()]}
            | {("stream", s.ptr)}  # noqa: F821 (pyflakes reads the del below as undefining s)
        )
        try:
            yield fk, hook, s
        finally:
            s.close()
            del s
            for k in rawkernel._loaded.values():
                k.module.close()
            rawkernel._loaded.clear()
    rawkernel._loaded.update(saved)


@pytest.fixture
def example():
    return load_example("buckets_own_model_class.py")


def _leaks(hook):
    gc.collect()
    return hook.leaked()


def _arg(fake, exe, node, name):
    """The value exec ``exe`` holds for ``name`` of kernel node ``node`` (an int32)."""
    blob = fake.exec_kernel(exe.handle, node.handle)["blob"]
    return struct.unpack_from("<i", blob, node.launch.args.offsets[name])[0]


def test_the_model_keeps_the_protocol_and_plans_two_user_kernels(fake, example):
    from rawgraph import DeviceBuffer, ShapeError
    from rawgraph.serving.protocol import RowScratch

    m = example.RMSNormScale(WIDTH, 3, seed=1)
    assert check_model(m) is m and isinstance(m, RowwiseModel)
    x, out = DeviceBuffer((3, WIDTH)), DeviceBuffer((3, WIDTH))
    plan = m.plan(x, out)
    assert (plan.inputs, plan.outputs) == (("x",), ("out",)) and set(plan.buffers) == {"x", "g", "t", "out"}
    assert [row_count_arg(m, l) for l in plan.launches] == [("nrows", 1), ("n", WIDTH)]
    assert [l.grid[0] for l in plan.launches] == [3, 1] and plan.launches[1].args["n"] == 3 * WIDTH
    assert m.scratch_layout(5) == {"t": ((5, WIDTH), np.dtype(np.float32))}
    ws = m.make_workspace(8)
    assert isinstance(ws, RowScratch) and ws.layout == {"t": WIDTH}
    small = m.with_batch(5, workspace=ws)
    assert small.workspace is ws and small.g is m.g and small.batch == 5
    assert small.plan(DeviceBuffer((5, WIDTH)), DeviceBuffer((5, WIDTH))).buffers["t"].ptr == ws.buffers["t"].ptr
    with pytest.raises(ShapeError):
        m.with_batch(9, workspace=ws)  # the workspace holds 8 rows
    bare = m.with_batch(2, workspace=False)
    with pytest.raises(ValueError, match="pass scratch"):
        bare.plan(DeviceBuffer((2, WIDTH)), DeviceBuffer((2, WIDTH)))
    with pytest.raises(ShapeError):
        m.plan(DeviceBuffer((2, WIDTH)), out)  # x of another batch
    m.close()
    for model in (m, small):  # closing the weights' owner closes them all
        with pytest.raises(ClosedError):
            model.plan(x, out)
    with pytest.raises(ClosedError):
        plan.check_open()
    with pytest.raises(ClosedError):
        check_model(small)
    ws.close()
    for b in (x, out):
        b.close()
    assert not _leaks(hook=fake[1])


def test_the_reference_is_row_wise_float64():
    ex = load_example("buckets_own_model_class.py")
    m = object.__new__(ex.RMSNormScale)  # the reference needs no device: only g, s and eps
    m.g_host = (1 + 0.1 * np.random.default_rng(0).standard_normal(WIDTH)).astype(np.float32)
    m.s, m.eps = 0.5, 1e-6
    x = np.random.default_rng(1).standard_normal((5, WIDTH)).astype(np.float32)
    y = m.reference(x)
    assert y.dtype == np.float64 and y.shape == x.shape
    for i in range(5):
        np.testing.assert_array_equal(m.reference(x[i : i + 1])[0], y[i])  # each row on its own
    ms = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, x / ms * m.g_host * 0.5 + x, rtol=1e-12)


@pytest.mark.parametrize("scratch", ["arena", "graph", "private"])
def test_bucket_graphs_capture_the_model_in_every_scratch_mode_and_leak_nothing(fake, example, scratch):
    m = example.RMSNormScale(WIDTH, 1, seed=2)
    s = fake[2]
    bg = BucketGraphs(m, sizes=[1, 4, 8], stream=s, scratch=scratch)
    for b in bg.sizes:
        launches = bg.graphs[b].plan.launches
        assert [l.kernel.name for l in launches] == ["rms_scale", "scale_residual"]
        assert launches[0].grid[0] == b and launches[0].args["nrows"] == b
    assert bg.memory["weights"] == WIDTH * 4
    bg.run(bg.input, 3)
    assert bg.stats["bucket:4"] == 1
    bg.close()
    m.close()
    assert not _leaks(fake[1])


def test_row_count_buckets_push_the_live_rows_into_both_kernels(fake, example):
    m = example.RMSNormScale(WIDTH, 1, seed=3)
    s = fake[2]
    rc = RowCountBuckets(m, sizes=[4, 8], stream=s)
    for n in (3, 8, 5):
        b = rc.bucket_for(n)
        rc.run(rc.input, n)
        norm, res = rc.graphs[b].nodes
        assert _arg(fake[0], rc.execs[b], norm, "nrows") == n
        assert _arg(fake[0], rc.execs[b], res, "n") == n * WIDTH
        assert _arg(fake[0], rc.execs[b], norm, "width") == WIDTH  # the other arguments as captured
    rc.close()
    m.close()
    assert not _leaks(fake[1])


def test_row_count_buckets_refuse_a_model_that_names_no_row_count_and_leak_nothing(fake, example):
    class NoRowCount(example.RMSNormScale):
        def row_count_arg(self, launch):
            return None

    m = NoRowCount(WIDTH, 1, seed=4)
    s = fake[2]
    before = _leaks(fake[1])
    with pytest.raises(TypeError, match="names no row-count argument of rms_scale"):
        RowCountBuckets(m, sizes=[2, 4], stream=s)
    assert not set(_leaks(fake[1])) - set(before), "the refused RowCountBuckets left something allocated"
    BucketGraphs(m, sizes=[2, 4], stream=s).close()  # plain buckets need no row count
    m.close()
    assert not _leaks(fake[1])


def test_reshaped_graph_serves_every_size_from_one_exec(fake, example):
    m = example.RMSNormScale(WIDTH, 1, seed=5)
    s = fake[2]
    rg_ = ReshapedGraph(m, max_batch=6, stream=s)
    assert len(rg_.groups) == 1 and sorted(next(iter(rg_.groups.values()))) == list(range(1, 7))
    (sig,) = rg_.execs
    norm, res = rg_.graphs[sig].nodes
    for n in (2, 6, 1):
        rg_.run(rg_.input, n)
        assert _arg(fake[0], rg_.execs[sig], norm, "nrows") == n
        assert _arg(fake[0], rg_.execs[sig], res, "n") == n * WIDTH
        assert fake[0].exec_kernel(rg_.execs[sig].handle, norm.handle)["grid"][0] == n
    rg_.close()
    m.close()
    assert not _leaks(fake[1])


@pytest.mark.parametrize("table", ["graph", "copy", "params"])
def test_slot_pool_gathers_the_model_with_kernels(fake, example, table):
    m = example.RMSNormScale(WIDTH, 1, seed=6)
    s = fake[2]
    pool = SlotPool(m, max_slots=4, sizes=[2, 4], table=table, stream=s)
    assert pool.gather == "kernels"  # its kernels take no row table
    for b in pool.sizes:
        names = [n.launch.kernel.name for n in pool.graphs[b].nodes]
        assert names[1:3] == ["rms_scale", "scale_residual"] and len(names) == 4
    pool.join(np.ones(WIDTH, np.float32))
    assert pool.step() == 2
    pool.close()
    m.close()
    assert not _leaks(fake[1])


def test_slot_pool_refuses_fused_gather_for_the_model_and_leaks_nothing(fake, example):
    m = example.RMSNormScale(WIDTH, 1, seed=7)
    s = fake[2]
    before = _leaks(fake[1])
    with pytest.raises(LayoutError, match="gather='kernels'"):
        SlotPool(m, max_slots=4, sizes=[4], gather="fused", stream=s)
    assert not set(_leaks(fake[1])) - set(before)
    m.close()
    assert not _leaks(fake[1])


@pytest.mark.parametrize("capture", [False, True])
def test_depth_loop_and_norm_gate_build_over_the_model(fake, example, capture):
    from rawgraph import DeviceBuffer

    m = example.RMSNormScale(WIDTH, 2, seed=8)
    x, out = DeviceBuffer((2, WIDTH)), DeviceBuffer((2, WIDTH))
    s = fake[2]
    with pytest.raises(TypeError, match="give max_depth"):
        DepthLoop(m, x, out, stream=s)  # not layered: the depth bound is the caller's
    loop = DepthLoop(m, x, out, max_depth=3, capture=capture, stream=s)
    assert loop.graph.node_count() == 4  # memcpy, init, WHILE, memcpy
    assert [l.kernel.name for l in loop.body_plan.launches] == ["rms_scale", "scale_residual"]
    assert loop.body_plan.buffers["x"].ptr == loop.cur.ptr and loop.body_plan.buffers["out"].ptr == loop.nxt.ptr
    loop.set_depth(2, s)
    loop.launch(s)
    loop.close()
    gate = NormGate(m, x, out, threshold=1.0)
    gate.launch(s)
    gate.close()
    for b in (x, out):
        b.close()
    m.close()
    assert not _leaks(fake[1])


ROWS_SRC = r"""
extern "C" __global__ void halve_rows(const float* x, float* y, int rows, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * width) y[i] = 0.5f * x[i];
}"""


def test_only_rawgraphs_matmuls_route_rows_a_user_rows_argument_is_never_rewritten(fake):
    # A slot pool rewrites x/y and the `rows` table of kernels that route rows themselves; a user
    # kernel that merely names an argument `rows` must be gathered with kernels, untouched.
    from rawgraph import DeviceBuffer, RawKernel, TinyBlock, ops

    k = RawKernel(ROWS_SRC, "halve_rows")
    x, y = DeviceBuffer((4, WIDTH)), DeviceBuffer((4, WIDTH))
    user = k.launch(1, 256, (x, y, 4, WIDTH))
    assert not ops.routes_rows(user)
    block = TinyBlock(WIDTH, 4, form="fused", pdl=False)
    plan = block.plan(DeviceBuffer((4, WIDTH)), DeviceBuffer((4, WIDTH)))
    assert all(ops.routes_rows(launch) for launch in plan.launches)
    block.close()


class _OneLayer:
    """A TinyBlock seen as a plain row-wise model: its layer_plan hidden, so DepthLoop repeats
    its whole (PDL-chained on sm_90) plan."""

    def __init__(self, block):
        self._b = block
        self.width, self.batch, self.device = block.width, block.batch, block.device

    def plan(self, x, out, scratch=None):
        return self._b.plan(x, out, scratch)


def test_a_captured_depth_loop_body_gets_plain_edges_never_a_pdl_chain(fake, monkeypatch):
    # Programmatic edges inside a conditional body are not what the builder path makes either:
    # a captured body launches the model's PDL launches with cuLaunchKernel.
    from cuda.bindings import driver

    from rawgraph import DeviceBuffer, TinyBlock

    block = TinyBlock(WIDTH, 2, form="fused", pdl=True)
    x, out = DeviceBuffer((2, WIDTH)), DeviceBuffer((2, WIDTH))
    assert any(l.pdl for l in block.plan(x, out).launches)
    calls = []
    real = driver.cuLaunchKernelEx
    monkeypatch.setattr(driver, "cuLaunchKernelEx", lambda *a: calls.append(a) or real(*a))
    loop = DepthLoop(_OneLayer(block), x, out, max_depth=2, capture=True, stream=fake[2])
    assert calls == []
    assert len(loop.body_plan.launches) == 2
    loop.close()
    for b in (x, out):
        b.close()
    block.close()
