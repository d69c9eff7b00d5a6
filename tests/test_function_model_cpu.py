"""FunctionModel (rawgraph/serving/function.py) without a GPU: a function of the user's own kernels
served as a row-wise model.

Two halves: what two recordings tell (``row_count_candidates``, ``row_grid_of``) on plain launches,
and the example's RMSNorm function (``examples/buckets_own_model.py``: two RawKernels, a scratch
array, a weight closed over) on the fake driver (kernels compile with NVRTC and load, never run):
the launches the model records per batch size, its answers to the protocol, the misuse it refuses,
and bucket graphs, row-count buckets, slot pools and a device-shaped exec built over it, leaking
nothing. The results are checked on the GPU (``tests/test_function_model_gpu.py``).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from cuda.bindings import driver
from test_device_shaped_cpu import updatable_attrs  # noqa: F401  (a fixture)
from test_examples_cpu import load_example
from test_protocol_cpu import _arg, _leaks, fake  # noqa: F401  (fake: a fixture)

from rawgraph import (
    BucketGraphs,
    ClosedError,
    DeviceBuffer,
    DeviceShapedGraph,
    KernelArgs,
    RawKernel,
    RowCountBuckets,
    ShapeError,
    SlotPool,
)
from rawgraph.serving import FunctionModel, FunctionModelError
from rawgraph.serving.function import PROBE_ROWS, row_count_candidates, row_grid_of
from rawgraph.serving.protocol import RowScratch, RowwiseModel, check_model, row_count_arg

W = 64
LO, HI = PROBE_ROWS


@pytest.fixture
def example():
    return load_example("buckets_own_model.py")


def _kernels(example):
    return RawKernel(example.SRC, "rms_scale"), RawKernel(example.SRC, "scale_residual")


# -- what two recordings tell (no driver) ---------------------------------------------------------
def _recorded(values, spec=(("x", "ptr"), ("width", "i32"), ("nrows", "i32"), ("n", "i64"), ("eps", "f32"))):
    args = KernelArgs(list(spec))
    args.update(values)
    return types.SimpleNamespace(args=args)


def test_the_row_count_is_the_integer_argument_linear_in_rows():
    def at(rows):
        return _recorded({"x": 0x1000, "width": W, "nrows": rows, "n": rows * W, "eps": float(rows)})

    assert row_count_candidates(at(LO), at(HI), LO, HI) == [("nrows", 1), ("n", W)]  # both: ambiguous
    at_lo, at_hi = at(LO), at(HI)
    at_hi.args["nrows"] = 16  # a constant is no row count, nor a float that moves
    assert row_count_candidates(at_lo, at_hi, LO, HI) == [("n", W)]
    at_hi.args["n"] = (HI + 1) * W  # rows + 1: not linear
    assert row_count_candidates(at_lo, at_hi, LO, HI) == []


@pytest.mark.parametrize("k", [*range(1, 20), 32, 64, 128])
def test_the_row_grid_singles_out_small_and_power_of_two_rows_per_block(k):
    assert row_grid_of((-(-LO // k), 3, 1), (-(-HI // k), 3, 1), LO, HI) == (0, k)
    assert row_grid_of((2, -(-LO // k), 1), (2, -(-HI // k), 1), LO, HI) == (1, k)


@pytest.mark.parametrize("k", [20, 24, 100, 256])
def test_rows_per_block_the_two_row_counts_cannot_tell_give_no_row_grid(k):
    # several k fit (or none moved): a guess could give a grid the head then cuts wrongly
    assert row_grid_of((-(-LO // k), 1, 1), (-(-HI // k), 1, 1), LO, HI) is None


def test_a_grid_that_does_not_follow_the_rows_in_whole_blocks_has_no_row_grid():
    assert row_grid_of((132, 1, 1), (132, 1, 1), LO, HI) is None  # grid-stride: constant
    assert row_grid_of((LO, LO, 1), (HI, HI, 1), LO, HI) is None  # two axes moved
    # 100 values a row, 256 per block: no whole number of rows per block
    assert row_grid_of((-(-LO * 100 // 256), 1, 1), (-(-HI * 100 // 256), 1, 1), LO, HI) is None
    assert row_grid_of((4 * LO, 1, 1), (4 * HI, 1, 1), LO, HI) is None  # 4 blocks a row


# -- the example's function on the fake driver ----------------------------------------------------
def test_the_model_records_the_functions_launches_per_batch_and_runs_none(fake, example):
    fk, hook, _s = fake
    model = example.make_model(W, seed=1)
    calls = []
    fn = model.fn
    model._shared.fn = lambda x, out, scratch, rows, stream: (
        calls.append((x.shape, out.shape, {k: v.shape for k, v in scratch.items()}, rows, stream))
        or fn(x, out, scratch, rows, stream)
    )
    assert check_model(model) is model and isinstance(model, RowwiseModel)
    assert model.weights_nbytes == W * 4 and model.scratch_layout(5) == {"t": ((5, W), np.dtype(np.float32))}
    for b in (1, 3, 8):
        m = model.with_batch(b)
        x, out = DeviceBuffer((b, W)), DeviceBuffer((b, W))
        plan = m.plan(x, out)
        assert calls[-1][:4] == ((b, W), (b, W), {"t": (b, W)}, b)
        assert calls[-1][4] is not None and calls[-1][4] is not _s  # its own recording stream
        norm, res = plan.launches
        assert (norm.kernel.name, res.kernel.name) == ("rms_scale", "scale_residual")
        assert (plan.inputs, plan.outputs) == (("x",), ("out",)) and set(plan.buffers) == {"x", "g", "t", "out"}
        assert plan.buffers["x"].ptr == x.ptr and plan.buffers["out"].ptr == out.ptr
        assert plan.buffers["t"].ptr == m.workspace.buffers["t"].ptr
        assert norm.grid[0] == b and norm.args["nrows"] == b and res.args["n"] == b * W
        assert [row_count_arg(m, l) for l in plan.launches] == [("nrows", 1), ("n", W)]
        assert [m.row_grid(l) for l in plan.launches] == [(0, 1), (0, 4)]  # 256 threads, 64 values a row
        for obj in (m, x, out):
            obj.close()
    assert not [e for e in fk.launch_log if e[0] == "kernel"], "a recording ran a kernel"
    model.close()
    assert not _leaks(hook)


def test_workspaces_weights_and_closing_follow_the_protocol(fake, example):
    fk, hook, _s = fake
    model = example.make_model(W, seed=2)
    g = model.plan(DeviceBuffer((1, W)), DeviceBuffer((1, W))).buffers["g"]
    ws = model.make_workspace(8)
    assert isinstance(ws, RowScratch) and ws.layout == {"t": W}
    small = model.with_batch(5, workspace=ws)
    x, out = DeviceBuffer((5, W)), DeviceBuffer((5, W))
    plan = small.plan(x, out)
    assert plan.buffers["t"].ptr == ws.buffers["t"].ptr and plan.buffers["g"].ptr == g.ptr  # shared weights
    with pytest.raises(ShapeError):
        model.with_batch(9, workspace=ws)  # the workspace holds 8 rows
    bare = model.with_batch(5, workspace=False)
    with pytest.raises(ValueError, match="pass scratch"):
        bare.plan(x, out)
    t = DeviceBuffer((5, W))
    assert bare.plan(x, out, scratch={"t": t}).buffers["t"].ptr == t.ptr
    with pytest.raises(KeyError):
        bare.plan(x, out, scratch={"u": t})
    with pytest.raises(ShapeError):
        model.plan(x, out)  # a 5-row x for a 1-row model
    small.close()  # a view: its plans refuse, the model goes on
    with pytest.raises(ClosedError):
        plan.check_open()
    assert model.with_batch(2).batch == 2
    model.close()  # the root: weights (owns), every view
    for m in (model, bare):
        with pytest.raises(ClosedError):
            m.plan(x, out)
    with pytest.raises(ClosedError):
        check_model(bare)
    for obj in (ws, x, out, t):
        obj.close()
    assert not _leaks(hook)


def test_closing_a_weight_makes_the_plans_refuse(fake, example):
    norm, _res = _kernels(example)
    g = DeviceBuffer(W)

    def halve(x, out, scratch, rows, stream):
        norm(rows, 128, (x, g, out, W, rows, 1e-6), stream=stream)

    model = FunctionModel(halve, W)
    x, out = DeviceBuffer((1, W)), DeviceBuffer((1, W))
    plan = model.plan(x, out)
    assert model.make_workspace(4) is None and model.workspace is None and model.weights_nbytes == W * 4
    g.close()  # the user's weight, not handed to the model
    with pytest.raises(ClosedError):
        plan.check_open()
    for obj in (model, x, out):
        obj.close()
    assert not _leaks(fake[1])


def test_the_reference_is_float64_of_the_right_shape(fake, example):
    model = example.make_model(W, seed=3)
    x = np.random.default_rng(1).standard_normal((5, W)).astype(np.float32)
    y = model.reference(x)
    assert y.dtype == np.float64 and y.shape == x.shape
    for i in range(5):
        np.testing.assert_array_equal(model.reference(x[i : i + 1])[0], y[i])  # row by row
    bad = FunctionModel(model.fn, W, scratch={"t": W}, reference=lambda x: x[:, :1])
    with pytest.raises(ShapeError, match="reference"):
        bad.reference(x)
    none = FunctionModel(model.fn, W, scratch={"t": W})
    with pytest.raises(TypeError, match="no reference"):
        none.reference(x)
    for m in (bad, none, model):
        m.close()
    assert not _leaks(fake[1])


# -- misuse -----------------------------------------------------------------------------------------
def _misuse(example):
    """Functions that break a rule, each over the example's kernels and a weight ``g``."""
    norm, res = _kernels(example)
    g = DeviceBuffer(W)

    def nothing(x, out, scratch, rows, stream):
        pass

    def memset(x, out, scratch, rows, stream):
        norm(rows, 128, (x, g, out, W, rows, 1e-6), stream=stream)
        driver.cuMemsetD32Async(out.ptr, 0, rows * W, stream.handle)

    def writes_no_out(x, out, scratch, rows, stream):
        norm(rows, 128, (x, g, scratch["t"], W, rows, 1e-6), stream=stream)
        res(rows, 256, (out, x, 0.5, scratch["t"], rows * W), stream=stream)  # out read only

    def picks_by_rows(x, out, scratch, rows, stream):
        if rows < 200:
            res(rows, 256, (x, x, 0.5, out, rows * W), stream=stream)
        norm(rows, 128, (x, g, out, W, rows, 1e-6), stream=stream)

    return g, {"nothing": nothing, "memset": memset, "writes_no_out": writes_no_out, "picks_by_rows": picks_by_rows}


@pytest.mark.parametrize(
    "which,match",
    [
        ("nothing", "launched no kernel"),
        ("memset", "MEMSET"),
        ("writes_no_out", "writes out"),
        ("picks_by_rows", "same kernels"),
    ],
)
def test_a_function_breaking_a_rule_is_refused_when_the_model_is_made_and_keeps_nothing(fake, example, which, match):
    fk, hook, s = fake
    g, fns = _misuse(example)
    before = set(_leaks(hook))
    with pytest.raises(FunctionModelError, match=match) as err:
        FunctionModel(fns[which], W, scratch={"t": W})
    assert isinstance(err.value, TypeError)  # as for a model that misses the protocol
    assert not set(_leaks(hook)) - before, "a refused function model left something allocated"
    assert not s.is_capturing()
    g.close()
    assert not _leaks(hook)


def test_other_kernels_or_a_nonlinear_row_count_at_a_batch_size_are_refused_at_its_plan(fake, example):
    norm, res = _kernels(example)
    g = DeviceBuffer(W)

    def small_batches_differ(x, out, scratch, rows, stream):
        n = max(rows, 16) * W if rows < 4 else rows * W  # padded to 16 rows below 4
        norm(rows, 128, (x, g, scratch["t"], W, rows, 1e-6), stream=stream)
        res(-(-n // 256), 256, (scratch["t"], x, 0.5, out, n), stream=stream)
        if rows == 1:
            res(1, 256, (scratch["t"], x, 0.5, out, W), stream=stream)

    model = FunctionModel(small_batches_differ, W, scratch={"t": W}, owns=[g])
    for b, match in ((1, "same kernels"), (2, "linear in rows")):
        m = model.with_batch(b)
        x, out = DeviceBuffer((b, W)), DeviceBuffer((b, W))
        with pytest.raises(FunctionModelError, match=match):
            m.plan(x, out)
        for obj in (m, x, out):
            obj.close()
    model.close()
    assert not _leaks(fake[1])


def test_two_row_counts_in_one_kernel_serve_buckets_but_not_row_count_rebinding(fake, example):
    # rms_scale's `width` passed the row count too: the protocol rebinds one argument per launch
    norm, _res = _kernels(example)
    g = DeviceBuffer(W)

    def twice(x, out, scratch, rows, stream):
        norm(rows, 128, (x, g, out, rows, rows, 1e-6), stream=stream)

    model = FunctionModel(twice, W, owns=[g])
    s = fake[2]
    BucketGraphs(model, sizes=[1, 2], stream=s).close()  # plain buckets ask no row count
    with pytest.raises(FunctionModelError, match="2 arguments"):
        RowCountBuckets(model, sizes=[1, 2], stream=s)
    model.close()
    assert not _leaks(fake[1])


def test_bad_parameters_are_refused_before_anything_is_allocated(fake, example):
    fn = example.make_model  # any callable: nothing is recorded before the checks
    before = set(_leaks(fake[1]))
    for kwargs, error in [
        ({"fn": None}, TypeError),
        ({"width": 0}, ShapeError),
        ({"width": True}, ShapeError),
        ({"scratch": {"x": W}}, ValueError),
        ({"scratch": {"t": 0}}, ShapeError),
        ({"reference": 3}, TypeError),
        ({"batch": 0}, ShapeError),
    ]:
        args = {"fn": fn, "width": W, **kwargs}
        with pytest.raises(error):
            FunctionModel(args.pop("fn"), args.pop("width"), **args)
    assert not set(_leaks(fake[1])) - before


# -- served on the fake driver ----------------------------------------------------------------------
@pytest.mark.parametrize("scratch", ["arena", "graph", "private"])
def test_bucket_graphs_capture_the_function_in_every_scratch_mode(fake, example, scratch):
    # scratch="graph" records the function while the bucket's own capture is open
    model = example.make_model(W, seed=4)
    bg = BucketGraphs(model, sizes=[1, 4, 8], stream=fake[2], scratch=scratch)
    for b in bg.sizes:
        launches = bg.graphs[b].plan.launches
        assert [l.kernel.name for l in launches] == ["rms_scale", "scale_residual"]
        assert launches[0].grid[0] == b and launches[0].args["nrows"] == b
    assert bg.memory["weights"] == W * 4
    bg.run(bg.input, 3)
    assert bg.stats["bucket:4"] == 1
    bg.close()
    model.close()
    assert not _leaks(fake[1])


def test_row_count_buckets_push_the_live_rows_the_recording_found(fake, example):
    model = example.make_model(W, seed=5)
    rc = RowCountBuckets(model, sizes=[4, 8], stream=fake[2])
    for n in (3, 8, 5):
        b = rc.bucket_for(n)
        rc.run(rc.input, n)
        norm, res = rc.graphs[b].nodes
        assert _arg(fake[0], rc.execs[b], norm, "nrows") == n
        assert _arg(fake[0], rc.execs[b], res, "n") == n * W
        assert _arg(fake[0], rc.execs[b], norm, "width") == W
    rc.close()
    model.close()
    assert not _leaks(fake[1])


@pytest.mark.parametrize("table", ["graph", "copy", "params"])
def test_slot_pools_gather_the_function_with_kernels(fake, example, table):
    model = example.make_model(W, seed=6)
    pool = SlotPool(model, max_slots=4, sizes=[2, 4], table=table, stream=fake[2])
    assert pool.gather == "kernels"
    for b in pool.sizes:
        assert [n.launch.kernel.name for n in pool.graphs[b].nodes][1:3] == ["rms_scale", "scale_residual"]
    pool.join(np.ones(W, np.float32))
    assert pool.step() == 2
    pool.close()
    model.close()
    assert not _leaks(fake[1])


def test_a_device_shaped_exec_cuts_the_grids_and_row_counts_the_recording_found(fake, updatable_attrs, example):
    model = example.make_model(W, seed=7)
    with DeviceShapedGraph(model, max_batch=16, stream=fake[2]) as dsg:
        got = [(e.kernel, e.axis, e.rows_per_block, e.param, e.factor, e.grid[0]) for e in dsg.entries]
        assert got == [("rms_scale", 0, 1, "nrows", 1, 16), ("scale_residual", 0, 4, "n", W, 4)]
        dsg.run(5)
    with SlotPool(model, max_slots=8, shape="device", stream=fake[2]) as pool:
        assert [e.kernel for e in pool._shaped.entries] == [
            "gather_rows",
            "rms_scale",
            "scale_residual",
            "scatter_rows",
        ]
        pool.join(np.ones(W, np.float32))
        assert pool.step() == 1
    with DeviceShapedGraph(model, max_batch=8, stream=fake[2], bands="plans") as dsg:
        assert dsg.bands == [8]  # the function's plan never changes
    model.close()
    assert not _leaks(fake[1])
