"""DeviceShapedGraph without a GPU (issue 25, item 2): the head kernel's table (entries per node:
grid axis, rows per block, row-count offset and size, factor) from TinyBlock plans built on the
CPU fake driver (tests/fakedriver.py), the pure helpers, and the refusals of what the driver
forbids, made before any driver call."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
from cuda.bindings import driver
from fault_cases import fake_session
from helpers import refuses_what_the_driver_forbids

from rawgraph.ops import GEMM_TILE_M
from rawgraph.serving.device_shaped import (
    ENTRY_DTYPE,
    ShapeEntry,
    check_bands,
    grid_for,
    pack_table,
    plan_bands,
    plan_signature,
    shape_entries,
)
from rawgraph.serving.protocol import row_grid


def _launch(name, args=()):
    return types.SimpleNamespace(kernel=types.SimpleNamespace(name=name), args=None)


@pytest.fixture(scope="module")
def fake():
    with fake_session() as (fake, hook):
        hook.active = False
        yield fake


def test_entry_layout_matches_the_kernel_struct():
    # kernels/device_update.cu's rg_du_shape_entry: node @0, grid @8, axis @20, rows_per_block @24,
    # param_offset @28, param_size @32, factor @36, lo @40, hi @44, 48 bytes.
    assert ENTRY_DTYPE.itemsize == 48
    assert [
        ENTRY_DTYPE.fields[f][1]
        for f in ("node", "grid", "axis", "rows_per_block", "param_offset", "param_size", "factor", "lo", "hi")
    ] == [0, 8, 20, 24, 28, 32, 36, 40, 44]
    src = open("kernels/device_update.cu").read()
    assert "struct rg_du_shape_entry" in src and "sizeof(rg_du_shape_entry) == 48" in src
    body = src[src.index("struct rg_du_shape_entry") :]
    body = body[: body.index("};")]
    assert [line.split()[-1].rstrip(";") for line in body.splitlines()[1:] if line.strip()] == [
        "node",
        "grid[3]",
        "axis",
        "rows_per_block",
        "param_offset",
        "param_size",
        "factor",
        "lo",
        "hi",
    ]


def test_pack_table_bytes():
    e = ShapeEntry(0, "L0.matmul1", "matvec_kernel<0, 4, 64, 8>", (4, 1, 8), 2, 8, "B", 32, 4, 1, 1, 64)
    f = ShapeEntry(1, "L0.relu", "relu", (64, 1, 1), -1, 0, "n", 16, 8, 64, 65, 128)
    t = pack_table([e, f], [0x7F0000001000, 0x7F0000002000])
    raw = t.tobytes()
    assert len(raw) == 96
    words = np.frombuffer(raw, np.int32)
    assert int(np.frombuffer(raw[:8], np.uint64)[0]) == 0x7F0000001000
    assert int(np.frombuffer(raw[48:56], np.uint64)[0]) == 0x7F0000002000
    assert list(words[2:12]) == [4, 1, 8, 2, 8, 32, 4, 1, 1, 64]
    assert list(words[14:24]) == [64, 1, 1, -1, 0, 16, 8, 64, 65, 128]
    with pytest.raises(ValueError):
        pack_table([e], [])


@pytest.mark.parametrize(
    "n,runs", [(0, False), (1, False), (64, False), (65, True), (100, True), (128, True), (129, False)]
)
def test_a_node_runs_only_for_the_row_counts_of_its_band(n, runs):
    e = ShapeEntry(0, "", "k", (4, 1, 8), 2, 8, "B", 32, 4, 1, 65, 128)
    assert e.runs(n) is runs
    assert ShapeEntry(0, "", "k", (4, 1, 8), 2, 8, "B", 32, 4, 1).runs(1)  # default band: every n > 0


def test_band_tops_from_signatures_and_from_the_caller():
    assert plan_bands(["a", "a", "b", "b", "b", "c"]) == [2, 5, 6]
    assert plan_bands(["a"] * 4) == [4]
    assert plan_bands(["a", "b", "a"]) == [1, 2, 3]  # a signature that comes back is a new band
    with pytest.raises(ValueError):
        plan_bands([])
    assert check_bands(None, 256) == [256]
    assert check_bands([64, 8, 64], 256) == [8, 64, 256]
    assert check_bands([8, 256], 256) == [8, 256]
    assert check_bands(np.array([64, 8]), 256) == [8, 64, 256]  # any sequence of ints, NumPy's too
    from rawgraph.runtime.errors import ShapeError

    for bad, exc in (
        ([0], ShapeError),
        ([300], ShapeError),
        ([1.5], TypeError),
        ([True], TypeError),
        ("64", TypeError),
        (7, TypeError),
    ):
        with pytest.raises(exc):
            check_bands(bad, 256)


@pytest.mark.parametrize(
    "n,want", [(0, (4, 1, 1)), (1, (4, 1, 1)), (8, (4, 1, 1)), (9, (4, 1, 2)), (64, (4, 1, 8)), (500, (4, 1, 8))]
)
def test_grid_for_covers_exactly_n_rows(n, want):
    e = ShapeEntry(0, "", "matvec_kernel<0, 4, 64, 8>", (4, 1, 8), 2, 8, "B", 32, 4, 1)
    assert grid_for(e, n) == want
    untouched = ShapeEntry(1, "", "relu", (64, 1, 1), -1, 0, "n", 16, 8, 64)
    assert grid_for(untouched, n) == (64, 1, 1)


def test_tinyblock_row_grid_parses_every_kernel_form():
    from rawgraph.models.tinyblock import TinyBlock

    rg = TinyBlock.row_grid
    assert rg(None, _launch("matvec_kernel<0, 4, 64, 8>")) == (2, 8)
    assert rg(None, _launch("matvec_split_kernel<1, 1, 16, 2, 4>")) == (2, 2)
    assert rg(None, _launch("gemm_kernel<2, 128, 2>")) == (2, GEMM_TILE_M)
    assert rg(None, _launch("gemm_split_kernel<0, 64, 8, 1>")) == (2, GEMM_TILE_M)
    assert rg(None, _launch("block_kernel<4, 8>")) == (1, 4)
    assert rg(None, _launch("relu")) is None and rg(None, _launch("add")) is None


def test_row_grid_helper_checks_the_answer():
    launch = _launch("k")
    assert row_grid(object(), launch) is None
    for bad in ((3, 8), (0, 0), ("2", 8), (2,), 5):
        model = types.SimpleNamespace(row_grid=lambda l, bad=bad: bad)
        with pytest.raises(TypeError):
            row_grid(model, launch)
    assert row_grid(types.SimpleNamespace(row_grid=lambda l: (1, 4)), launch) == (1, 4)


def _expect(model, launch, max_batch):
    name = launch.kernel.name
    if name in ("relu", "add"):
        return -1, 0, "n", 8, model.width
    if name.startswith("block_kernel"):
        return 1, int(re.findall(r"\d+", name)[0]), "B", 4, 1
    if name.startswith("gemm"):
        return 2, GEMM_TILE_M, "B", 4, 1
    if name.startswith(("sgemm", "tf32x3")):  # sgemm / tf32x3[_wgmma][_split]_kernel<EPI, BM, ...>
        return 2, int(re.findall(r"\d+", name.split("<")[1])[1]), "B", 4, 1
    return 2, int(re.findall(r"\d+", name.split("<")[1])[3]), "B", 4, 1


@pytest.mark.parametrize(
    "form,width,max_batch",
    [
        ("unfused", 64, 64),
        ("fused", 64, 64),
        ("unfused", 1024, 256),
        ("fused", 1024, 256),
        ("block", 64, 64),
        ("unfused", 64, 5),
    ],
)
def test_table_entries_of_tinyblock_plans(fake, form, width, max_batch):
    from rawgraph import DeviceBuffer, TinyBlock

    with (
        TinyBlock(width, max_batch, 2, seed=1, form=form) as model,
        DeviceBuffer((max_batch, width)) as x,
        DeviceBuffer((max_batch, width)) as out,
    ):
        plan = model.plan(x, out)
        entries = shape_entries(model, plan.launches, max_batch)
        assert len(entries) == len(plan.launches) == 2 * model.kernels_per_layer
        for e, launch in zip(entries, plan.launches):
            axis, rpb, param, size, factor = _expect(model, launch, max_batch)
            assert (e.axis, e.rows_per_block, e.param, e.param_size, e.factor) == (axis, rpb, param, size, factor)
            assert e.param_offset == launch.args.offsets[param]
            assert e.param_offset == {"B": 32, "n": 16 if launch.kernel.name == "relu" else 24}[param]
            assert e.grid == launch.grid
            if axis >= 0:
                assert launch.grid[axis] == -(-max_batch // rpb)
                assert grid_for(e, max_batch) == launch.grid


def test_table_refuses_a_model_that_lies(fake):
    from rawgraph import DeviceBuffer, TinyBlock
    from rawgraph.runtime.errors import ShapeError

    with TinyBlock(64, 64, 1, form="unfused") as model, DeviceBuffer((64, 64)) as x, DeviceBuffer((64, 64)) as out:
        plan = model.plan(x, out)
        liar = types.SimpleNamespace(
            width=64,
            row_count_arg=model.row_count_arg,
            row_grid=lambda l: (0, 1) if "matvec" in l.kernel.name or "gemm" in l.kernel.name else None,
        )
        with pytest.raises(ShapeError, match="row_grid says"):
            shape_entries(liar, plan.launches, 64)
        with pytest.raises(ShapeError, match="holds 64"):
            shape_entries(model, plan.launches, 32)  # the plan is a 64-row plan
        silent = types.SimpleNamespace(width=64)
        with pytest.raises(TypeError, match="row-count"):
            shape_entries(silent, plan.launches, 64)


@pytest.fixture
def updatable_attrs(monkeypatch):
    """The fake driver has no device-updatable nodes: opting a node in hands back a made-up
    device handle per node."""
    handles: dict[int, int] = {}

    def set_attr(node, attr, value):
        handles.setdefault(int(node), 0x7F00_0000_0000 + 0x100 * (len(handles) + 1))
        value.deviceUpdatableKernelNode.devNode = handles[int(node)]
        return (driver.CUresult.CUDA_SUCCESS,)

    def get_attr(node, attr):
        v = driver.CUkernelNodeAttrValue()
        v.deviceUpdatableKernelNode.deviceUpdatable = 1
        v.deviceUpdatableKernelNode.devNode = handles[int(node)]
        return (driver.CUresult.CUDA_SUCCESS, v)

    monkeypatch.setattr(driver, "cuGraphKernelNodeSetAttribute", set_attr)
    monkeypatch.setattr(driver, "cuGraphKernelNodeGetAttribute", get_attr)
    return handles


def test_build_writes_the_table_and_refuses_what_the_driver_forbids(fake, updatable_attrs, monkeypatch):
    from rawgraph import DeviceShapedGraph, TinyBlock

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        dsg = DeviceShapedGraph(model, max_batch=64)
        try:
            assert len(updatable_attrs) == len(dsg.entries) == 4
            table = np.frombuffer(dsg._table.to_numpy(dsg.stream).tobytes(), ENTRY_DTYPE)
            assert [int(h) for h in table["node"]] == dsg.handles
            assert list(table["axis"]) == [e.axis for e in dsg.entries]
            assert list(table["param_offset"]) == [e.param_offset for e in dsg.entries]
            assert int(dsg.n_live.ptr) and dsg.head.kernel.name == "rg_du_shape"
            # every refusal comes before any driver call
            refuses_what_the_driver_forbids(
                dsg,
                monkeypatch,
                ("cuGraphInstantiate", "cuGraphExecUpdate", "cuGraphClone", "cuGraphExecKernelNodeSetParams"),
            )
            from rawgraph.runtime.errors import ShapeError

            with pytest.raises(ShapeError):
                dsg.set_rows(65)
            with pytest.raises(TypeError):
                dsg.run(True)
        finally:
            dsg.close()
            dsg.close()  # twice is safe
        assert dsg.closed and dsg.exec.closed and dsg.graph.closed
        from rawgraph.runtime.errors import ClosedError

        with pytest.raises(ClosedError):
            dsg.run(1)
        with pytest.raises(ClosedError):
            dsg.plan_for(1)


def test_graph_marked_device_updatable_follows_the_drivers_rules(fake, monkeypatch):
    """The rules live on Graph itself (any graph, not only DeviceShapedGraph's): one live exec,
    no exec update, no host update path; marking after an exec exists is refused."""
    from rawgraph import AddressRebinder, DeviceUpdatableError, ExecUpdateManager, Stream, TinyBlock, capture_plan
    from rawgraph.runtime.memory import DeviceBuffer

    with (
        TinyBlock(64, 1, 1, seed=3, form="unfused") as model,
        DeviceBuffer((1, 64), np.float32) as x,
        DeviceBuffer((1, 64), np.float32) as out,
        Stream() as stream,
    ):
        graph = capture_plan(model.plan(x, out), stream)
        with graph:
            first = graph.instantiate()
            with pytest.raises(DeviceUpdatableError, match="before instantiating"):
                graph.mark_device_updatable()
            first.close()
            graph.mark_device_updatable()
            assert graph.device_updatable
            calls = []
            for name in ("cuGraphInstantiate", "cuGraphExecUpdate", "cuGraphExecKernelNodeSetParams"):
                real = getattr(driver, name)
                monkeypatch.setattr(driver, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
            exe = graph.instantiate()
            assert calls == ["cuGraphInstantiate"]
            with pytest.raises(DeviceUpdatableError, match="instantiated only once"):
                graph.instantiate()
            with pytest.raises(DeviceUpdatableError, match="cuGraphExecUpdate"):
                exe.update(graph)
            with pytest.raises(DeviceUpdatableError, match="ExecUpdateManager"):
                ExecUpdateManager(graph, exe)
            with pytest.raises(DeviceUpdatableError, match="AddressRebinder"):
                AddressRebinder(graph, exe)
            assert calls == ["cuGraphInstantiate"]
            exe.close()
            graph.instantiate().close()  # once the exec is closed, one more may live
            assert calls == ["cuGraphInstantiate"] * 2


def test_a_slot_pool_shaped_on_the_device_runs_one_exec_over_the_table(fake, updatable_attrs):
    """SlotPool(shape="device"): one DeviceShapedGraph over the model seen through the slot table
    (gather, the model, scatter); a step copies the table when it changed, writes n = the live
    rows for the head, and replays the one exec; the gather and scatter are bounded by their rows."""
    from rawgraph import SlotPool, TinyBlock
    from rawgraph.runtime.errors import LayoutError

    with TinyBlock(64, 1, 1, seed=4, form="unfused") as model:
        with pytest.raises(LayoutError):
            SlotPool(model, 8, shape="device", table="graph")
        with pytest.raises(ValueError):
            SlotPool(model, 8, shape="sideways")
        pool = SlotPool(model, 8, shape="device")
        try:
            dsg = pool._shaped
            assert pool.mode == "copy" and pool.gather == "kernels" and not pool.execs
            assert dsg.graph.device_updatable and dsg.max_batch == 8
            names = [e.kernel for e in dsg.entries]
            assert names[0].startswith("gather_rows") and names[-1].startswith("scatter_rows"), names
            assert [e.param for e in dsg.entries][:1] == ["rows"] and dsg.entries[-1].param == "rows"
            assert dsg.entries[0].axis == -1  # grid-stride: the grid stays, the row count bounds it
            rows = [np.full(64, 1.0 + i, np.float32) for i in range(3)]
            slots = [pool.join(r) for r in rows]
            launches = dsg.replays
            assert pool.step() == 3 and dsg.replays == launches + 1
            assert int(np.frombuffer(fake.read(dsg.n_live.ptr, 4), np.int32)[0]) == 3
            table = np.frombuffer(fake.read(pool.table_dev.ptr, 4 * 3), np.int32)
            assert sorted(int(v) for v in table) == sorted(slots)
            pool.leave(slots[1])
            assert pool.step() == 2
            assert int(np.frombuffer(fake.read(dsg.n_live.ptr, 4), np.int32)[0]) == 2
        finally:
            pool.close()
            pool.close()
        assert dsg.closed and dsg.exec.closed


def test_bands_capture_one_plan_per_band_behind_the_head(fake, updatable_attrs):
    """bands=[2, 8]: the 2-row plan and the 8-row plan are captured one after the other behind the
    head; their entries carry the bands 1..2 and 3..8, and so does the table the head reads."""
    from rawgraph import DeviceShapedGraph, TinyBlock

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model, DeviceShapedGraph(model, max_batch=8, bands=[2]) as dsg:
        per_plan = model.kernels_per_layer  # one layer
        assert dsg.bands == [2, 8] and len(dsg.plans) == 2 and dsg.plan is dsg.plans[-1]
        assert len(dsg.entries) == len(updatable_attrs) == 2 * per_plan
        assert [(e.lo, e.hi) for e in dsg.entries] == [(1, 2)] * per_plan + [(3, 8)] * per_plan
        assert [e.index for e in dsg.entries] == list(range(2 * per_plan))
        table = np.frombuffer(dsg._table.to_numpy(dsg.stream).tobytes(), ENTRY_DTYPE)
        assert list(table["lo"]) == [e.lo for e in dsg.entries] and list(table["hi"]) == [e.hi for e in dsg.entries]
        assert [int(h) for h in table["node"]] == dsg.handles
        launches = [launch for plan in dsg.plans for launch in plan.launches]
        assert [n.launch for n in dsg._nodes] == launches
        assert dsg.plans[0].launches[0].args["B"] == 2 and dsg.plans[1].launches[0].args["B"] == 8
        assert [dsg.plan_for(n) is dsg.plans[0 if n <= 2 else 1] for n in range(0, 9)] == [True] * 9
        for n in range(0, 9):  # exactly one band's nodes run for n > 0, none for n = 0
            running = [e for e in dsg.entries if e.runs(n)]
            assert len(running) == (per_plan if n else 0)
            assert all(e.lo <= n <= e.hi for e in running)


def test_bands_with_the_same_kernels_are_warmed_up_once(fake, updatable_attrs):
    """bands=[16, 24] under 32 rows of w1024: the three bands' plans launch the same two kernel
    functions (one table cut, relu and add epilogues), so only the first plan runs eagerly before
    the capture (lifecycle.WarmUp); bands with a new kernel run (the plans test below)."""
    from rawgraph import DeviceShapedGraph, TinyBlock, ops

    cuts = {ops.matmul_expr("relu", ops.matmul_shape(n, 1024, 1024, 132)) for n in (16, 24, 32)}
    assert len(cuts) == 1, cuts  # the table's one cut for 16-32 rows (else this test needs new bands)
    with (
        TinyBlock(1024, 1, 1, seed=2, form="fused") as model,
        DeviceShapedGraph(model, max_batch=32, bands=[16, 24]) as dsg,
    ):
        assert dsg.bands == [16, 24, 32]
        names = [[launch.kernel.name for launch in plan.launches] for plan in dsg.plans]
        assert names[0] == names[1] == names[2]
        assert (dsg.warm_up.runs, dsg.warm_up.skipped) == (1, 2)
        assert dsg.setup["warmup"] > 0


def test_bands_from_the_plans_follow_every_change_of_kernel_or_cut(fake, updatable_attrs):
    """bands="plans" over TinyBlock w1024 (fused, max 256, precision "auto") puts a band wherever
    the matmul kernel or cut changes (ops.matmul_shape, computed here apart from the plans), and every n runs a plan with
    the exact-size plan's signature."""
    from rawgraph import DeviceBuffer, DeviceShapedGraph, TinyBlock, ops
    from rawgraph.runtime.device import get_device

    dev = get_device()
    sms = dev.info.multiprocessors
    # the model's default precision, "auto", picks per row count (tf32x3 at some, fp32 at others)
    # (the fake device is a 9.0 one: the warpgroup kernel where its table has the product)
    shapes = [
        ops.matmul_shape(
            b,
            1024,
            1024,
            sms,
            precision=ops.resolve_precision("auto", b, 1024, 1024, dev),
            smem_limit=dev.info.smem_per_block_optin,
            wgmma=ops.wgmma_available(dev),
        )
        for b in range(1, 257)
    ]
    assert {"tf32x3_wgmma", "sgemm"} <= {s.kernel for s in shapes}  # tf32x3 at some row counts, fp32 at others
    cuts = [ops.matmul_expr("relu", s) for s in shapes]
    grids = [s.grid[:2] for s in shapes]
    want = [b for b in range(1, 256) if (cuts[b], grids[b]) != (cuts[b - 1], grids[b - 1])] + [256]
    with (
        TinyBlock(1024, 1, 1, seed=2, form="fused") as model,
        DeviceShapedGraph(model, max_batch=256, bands="plans") as dsg,
    ):
        assert dsg.bands == want and len(want) > 1
        assert dsg.setup["bands"] > 0
        # the eager warm-up ran a band only while it brought a kernel function no earlier band ran
        seen, new_bands = set(), 0
        for plan in dsg.plans:
            handles = {int(launch.kernel.handle) for launch in plan.launches}
            new_bands += bool(handles - seen)
            seen |= handles
        assert (dsg.warm_up.runs, dsg.warm_up.skipped) == (new_bands, len(dsg.plans) - new_bands)
        assert new_bands > 0
        for n in (1, 2, 3, 5, 24, 25, 64, 65, 200, 256):
            with model.with_batch(n) as exact, DeviceBuffer((n, 1024)) as x, DeviceBuffer((n, 1024)) as out:
                assert plan_signature(model, exact.plan(x, out).launches) == plan_signature(
                    model, dsg.plan_for(n).launches
                ), n


def test_bands_are_checked_before_anything_is_allocated(fake):
    from rawgraph import DeviceShapedGraph, TinyBlock
    from rawgraph.runtime.errors import ShapeError

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        calls = []
        real = driver.cuMemAlloc
        try:
            driver.cuMemAlloc = lambda *a: calls.append(a) or real(*a)
            with pytest.raises(ShapeError):
                DeviceShapedGraph(model, max_batch=8, bands=[9])
            with pytest.raises(TypeError):
                DeviceShapedGraph(model, max_batch=8, bands="exact")
            with pytest.raises(ShapeError):
                DeviceShapedGraph(model, max_batch=8, bands=np.array([0, 4]))
        finally:
            driver.cuMemAlloc = real
        assert calls == []


def test_bands_from_the_plans_over_a_model_that_is_not_a_context_manager(fake, updatable_attrs):
    """The protocol asks a model view for close(), not for `with`: bands="plans" builds over the
    README's own-kernel model (RMSNormScale, examples/buckets_own_model.py), whose plan never
    changes with the row count: one band."""
    from test_examples_cpu import load_example

    from rawgraph import DeviceShapedGraph

    ex = load_example("buckets_own_model_class.py")
    model = ex.RMSNormScale(64, 1, seed=4)
    try:
        assert not hasattr(model, "__enter__")
        with DeviceShapedGraph(model, max_batch=16, bands="plans") as dsg:
            assert dsg.bands == [16] and len(dsg.plans) == 1
            assert dsg.setup["bands"] > 0
    finally:
        model.close()


def test_bands_given_once_as_an_iterator_are_read_once(fake, updatable_attrs):
    from rawgraph import DeviceShapedGraph, TinyBlock

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        with DeviceShapedGraph(model, max_batch=8, bands=iter([2, 4])) as dsg:
            assert dsg.bands == [2, 4, 8]
        with DeviceShapedGraph(model, max_batch=8, bands=(b for b in (4,))) as dsg:
            assert dsg.bands == [4, 8]


def test_with_bands_every_plan_must_start_on_a_full_edge(fake, updatable_attrs, monkeypatch):
    """A band's plan that starts with a PDL launch would hang a programmatic edge off the previous
    band's last node: refused."""
    from rawgraph import DeviceShapedError, DeviceShapedGraph, TinyBlock

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        real = type(model).plan

        def pdl_first(self, *a, **k):
            plan = real(self, *a, **k)
            plan.launches[0].pdl = True
            return plan

        monkeypatch.setattr(type(model), "plan", pdl_first)
        with pytest.raises(DeviceShapedError, match="full edge"):
            DeviceShapedGraph(model, max_batch=8, bands=[4])
        DeviceShapedGraph(model, max_batch=8).close()  # one band: the head fences before its trigger


def test_runs_clamps_n_as_the_head_does():
    e = ShapeEntry(0, "", "k", (4, 1, 8), 2, 8, "B", 32, 4, 1, 129, 256)
    assert not e.runs(300) and e.runs(300, max_rows=256) and not e.runs(-5, max_rows=256)


def test_a_slot_pool_shaped_on_the_device_takes_bands(fake, updatable_attrs):
    """SlotPool(shape="device", bands=...) hands its bands to the device-shaped graph: each band's
    plan is gather, the model, scatter; bands without shape="device" are refused first."""
    from rawgraph import SlotPool, TinyBlock
    from rawgraph.runtime.errors import ShapeError

    with TinyBlock(64, 1, 1, seed=4, form="unfused") as model:
        with pytest.raises(ValueError, match="shape='device'"):
            SlotPool(model, 8, bands=[4])
        with pytest.raises(ShapeError):
            SlotPool(model, 8, shape="device", bands=[9])
        with SlotPool(model, 8, shape="device", bands=[3]) as pool:
            dsg = pool._shaped
            assert dsg.bands == [3, 8] and len(dsg.plans) == 2
            for plan, top in zip(dsg.plans, dsg.bands):
                names = [launch.kernel.name for launch in plan.launches]
                assert names[0].startswith("gather_rows") and names[-1].startswith("scatter_rows")
                assert not plan.launches[0].pdl and plan.launches[0].args["rows"] == top
            pool.join(np.ones(64, np.float32))
            assert pool.step() == 1


# -- select="switch": a SWITCH node picks the band ------------------------------------------------
def test_a_switch_captures_one_body_per_band_behind_rg_set_band(fake):
    """select="switch", bands=[2]: rg_set_band reads n_live and the band tops [2, 8] (device
    memory), then a SWITCH of two bodies, each the band top's plan as captured; no node is opted in
    to device updates and the graph is not marked."""
    from rawgraph import DeviceShapedGraph, TinyBlock

    with (
        TinyBlock(64, 1, 1, seed=2, form="unfused") as model,
        DeviceShapedGraph(model, max_batch=8, bands=[2], select="switch") as dsg,
    ):
        assert dsg.bands == [2, 8] and dsg.entries == [] and dsg.handles == []
        assert dsg.head.kernel.name == "rg_set_band" and dsg.head.args["count"] == 2
        # n is the head's argument (no n_live): captured at max_batch, pushed by run / set_rows
        assert dsg.n_live is None and dsg.head.args["value"] == 0 and dsg.head.args["n_arg"] == 8
        assert dsg.head.args["tops"] == dsg._table.ptr and dsg.head.args["used"] == dsg._rc.ptr
        assert list(dsg._table.to_numpy(dsg.stream)) == [2, 8]
        assert dsg.switch.size == 2 and not dsg.graph.device_updatable
        for i, plan in enumerate(dsg.plans):
            body = dsg.switch.body_kernel_nodes(i)
            assert [n.launch for n in body] == list(plan.launches)
            assert plan.launches[0].args["B"] == dsg.bands[i]
        assert [dsg.plan_for(n) is dsg.plans[0 if n <= 2 else 1] for n in range(0, 9)] == [True] * 9
        assert "select=switch" in repr(dsg)
        pushed = []
        real = driver.cuGraphExecKernelNodeSetParams
        driver.cuGraphExecKernelNodeSetParams = lambda e, n, p: pushed.append(int(n)) or real(e, n, p)
        try:
            copies = []
            real_copy = driver.cuMemcpyHtoDAsync
            driver.cuMemcpyHtoDAsync = lambda *a: copies.append(a) or real_copy(*a)
            try:
                dsg.run(5)
                dsg.run(5)  # the same n: nothing pushed
                dsg.set_rows(0)
            finally:
                driver.cuMemcpyHtoDAsync = real_copy
        finally:
            driver.cuGraphExecKernelNodeSetParams = real
        assert pushed == [int(dsg._head_node.handle)] * 2 and copies == []
        assert dsg._n_arg.args["n_arg"] == 0 and dsg.replays == 2


def test_a_switch_reads_the_callers_n_live(fake):
    """With n_live given, the SWITCH head reads it from device memory and run() is refused."""
    from rawgraph import DeviceBuffer, DeviceShapedError, DeviceShapedGraph, TinyBlock

    with (
        TinyBlock(64, 1, 1, seed=2, form="unfused") as model,
        DeviceBuffer((1,), np.int32) as n_live,
        DeviceShapedGraph(model, max_batch=8, n_live=n_live, select="switch") as dsg,
    ):
        assert dsg.head.args["value"] == n_live.ptr and dsg._n_arg is None
        with pytest.raises(DeviceShapedError, match="n_live"):
            dsg.run(3)
        dsg.replay()


def test_a_switch_refuses_what_it_does_not_offer_before_any_driver_call(fake, monkeypatch):
    from rawgraph import DeviceShapedError, DeviceShapedGraph, TinyBlock

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        calls = []
        real = driver.cuMemAlloc
        monkeypatch.setattr(driver, "cuMemAlloc", lambda *a: calls.append(a) or real(*a))
        with pytest.raises(ValueError, match="select"):
            DeviceShapedGraph(model, max_batch=8, select="disable")
        assert calls == []
        monkeypatch.setattr(driver, "cuMemAlloc", real)
        with DeviceShapedGraph(model, max_batch=8, select="switch") as dsg:
            for name in ("cuGraphExecUpdate", "cuGraphClone"):
                monkeypatch.setattr(driver, name, lambda *a, _n=name: calls.append(_n))
            with pytest.raises(DeviceShapedError, match="conditional node"):
                dsg.clone()
            with pytest.raises(DeviceShapedError, match="cuGraphExecUpdate"):
                dsg.update(dsg.graph)
            assert calls == []
        from rawgraph.runtime.errors import ClosedError

        with pytest.raises(ClosedError):
            dsg.update(dsg.graph)


def test_a_switch_slot_pool_copies_the_whole_table(fake, monkeypatch):
    """SlotPool(shape="device", select="switch"): a band runs at its top's rows, so each changed
    table is copied whole (4 * max_slots bytes), not only the live rows; select needs
    shape="device"."""
    from rawgraph import SlotPool, TinyBlock

    with TinyBlock(64, 1, 1, seed=4, form="unfused") as model:
        with pytest.raises(ValueError, match="shape='device'"):
            SlotPool(model, 8, select="switch")
        with pytest.raises(ValueError, match="select"):
            SlotPool(model, 8, shape="device", select="maybe")
        with SlotPool(model, 8, shape="device", bands=[3], select="switch") as pool:
            assert pool._shaped.select == "switch" and pool._shaped.bands == [3, 8]
            sizes = []
            real = driver.cuMemcpyHtoDAsync
            monkeypatch.setattr(
                driver, "cuMemcpyHtoDAsync", lambda dst, src, n, s: sizes.append((int(dst), n)) or real(dst, src, n, s)
            )
            pool.join(np.ones(64, np.float32))
            sizes.clear()
            assert pool.step() == 1
            assert (int(pool.table_dev.ptr), 4 * 8) in sizes


def test_a_switch_on_a_driver_before_12_8_is_refused_before_anything_is_allocated(fake, monkeypatch):
    from rawgraph import DeviceShapedGraph, TinyBlock
    from rawgraph.graphs import conditional as cn

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        calls = []
        real = driver.cuMemAlloc
        monkeypatch.setattr(driver, "cuMemAlloc", lambda *a: calls.append(a) or real(*a))
        monkeypatch.setattr(cn, "driver_cuda_version", lambda: 12040)
        with pytest.raises(cn.ConditionalUnsupportedError, match="12.8"):
            DeviceShapedGraph(model, max_batch=8, select="switch")
        assert calls == []


def test_select_band_checks_its_arrays(fake):
    """rg_set_band reads int32 words: tops, value and used of another dtype or empty are refused
    when the launch is built; value=None takes n as the argument."""
    from rawgraph import DeviceBuffer
    from rawgraph.graphs.conditional import ConditionalHandle, select_band
    from rawgraph.runtime.device import get_device
    from rawgraph.runtime.errors import ShapeError

    dev = get_device()
    cond = ConditionalHandle(0x1234, 0, None)
    with (
        DeviceBuffer((3,), np.int32) as tops,
        DeviceBuffer((1,), np.int32) as used,
        DeviceBuffer((1,), np.uint32) as u32,
        DeviceBuffer((0,), np.int32) as empty,
    ):
        launch = select_band(dev, cond, None, tops, used, n=7)
        assert (launch.args["value"], launch.args["n_arg"], launch.args["count"]) == (0, 7, 3)
        assert select_band(dev, cond, used, tops, used).args["value"] == used.ptr
        for bad in ({"tops": u32}, {"tops": empty}, {"value": u32}, {"used": u32}):
            kw = {"value": None, "tops": tops, "used": used, **bad}
            with pytest.raises(ShapeError, match="int32"):
                select_band(dev, cond, kw["value"], kw["tops"], kw["used"])


def test_a_switch_head_takes_each_threads_n_for_its_own_launch(fake, monkeypatch):
    """run(n) from several threads at once: every launch reads the n its own thread pushed (the
    push and the launch are one step under the graph's lock; without it a thread switch between
    them hands the launch another thread's n)."""
    import sys
    import threading

    from rawgraph import DeviceShapedGraph, TinyBlock

    with (
        TinyBlock(64, 1, 1, seed=2, form="unfused") as model,
        DeviceShapedGraph(model, max_batch=16, bands=[4, 8], select="switch") as dsg,
    ):
        state = {"exec_n": dsg._n_arg.args["n_arg"]}
        wrong = []
        set_params, launch = driver.cuGraphExecKernelNodeSetParams, driver.cuGraphLaunch

        def pushed(e, node, p):
            state["exec_n"] = dsg._n_arg.args["n_arg"]
            return set_params(e, node, p)

        def launched(e, s):
            if state["exec_n"] != want.n:
                wrong.append((want.n, state["exec_n"]))
            return launch(e, s)

        want = threading.local()
        monkeypatch.setattr(driver, "cuGraphExecKernelNodeSetParams", pushed)
        monkeypatch.setattr(driver, "cuGraphLaunch", launched)

        def worker(n):
            want.n = n
            for _ in range(200):
                dsg.run(n)

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            threads = [threading.Thread(target=worker, args=(n,)) for n in (3, 7, 12, 16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(old)
        assert dsg.replays == 800 and wrong == []


@pytest.mark.parametrize("select", ["updates", "switch"])
@pytest.mark.parametrize("as_plan", [True, False])
def test_the_prologue_is_captured_before_the_head(fake, updatable_attrs, select, as_plan):
    """A prologue (a plan, or a callable given the capturing stream) is recorded first, the head
    right after it, in both selects."""
    from rawgraph import DeviceBuffer, DeviceShapedGraph, TinyBlock
    from rawgraph.runtime.launch import KernelArgs, Launch, LaunchPlan
    from rawgraph.runtime.module import get_kernel

    with (
        TinyBlock(64, 1, 1, seed=2, form="unfused") as model,
        DeviceBuffer((8,), np.int32) as table,
        DeviceBuffer((1,), np.int32) as n_live,
    ):
        args = KernelArgs([("table", "ptr"), ("count", "i32"), ("n_live", "ptr")])
        args.update({"table": table.ptr, "count": 8, "n_live": n_live.ptr})
        count = Launch(
            get_kernel("device_update", "rg_du_count_live"), (1, 1, 1), (256, 1, 1), args, {}, 0, "count_live"
        )
        plan = LaunchPlan([count], {}, (), ())
        prologue = plan if as_plan else (lambda s: count(s))
        with DeviceShapedGraph(model, 8, n_live=n_live, prologue=prologue, select=select) as dsg:
            names = [n.launch.kernel.name for n in dsg.graph.nodes]
            if as_plan:  # recorded by the capture
                assert names[:2] == ["rg_du_count_live", dsg.head.kernel.name], names
            else:  # launched on the capturing stream behind the capture's back: a foreign node
                assert names[0] == dsg.head.kernel.name and len(dsg.graph.foreign_nodes) == 1, names
            assert dsg._prologue is prologue


# -- the parts, each alone -------------------------------------------------------------------------
def test_bands_are_a_pure_record_of_tops():
    from rawgraph.runtime.errors import ShapeError
    from rawgraph.serving.shape_table import Bands

    b = Bands.of([64, 8], 256)
    assert b.tops == (8, 64, 256) and len(b) == 3
    assert [b.index(n) for n in (0, 1, 8, 9, 64, 65, 256, 300)] == [0, 0, 0, 1, 1, 2, 2, 2]
    assert [b.lo(i) for i in range(3)] == [1, 9, 65]
    assert Bands.of(None, 16).tops == (16,)
    assert Bands.from_signatures(["a", "a", "b"]).tops == (2, 3)
    for bad in ((), (0, 4), (4, 4), (8, 4)):
        with pytest.raises(ShapeError):
            Bands(bad)


def test_a_plan_signature_is_named_and_compares_as_the_tuples_it_replaced():
    from rawgraph.serving.shape_table import LaunchSignature

    sig = LaunchSignature("k", (128, 1, 1), 0, False, (4, 1, 0))
    assert sig == ("k", (128, 1, 1), 0, False, (4, 1, 0)) and sig.grid == (4, 1, 0)


def _io_and_plans(model, max_batch, bands, select, held):
    from rawgraph.serving.device_shaped import BandPlans, ShapedIO
    from rawgraph.serving.shape_table import Bands

    setup = dict.fromkeys(("bands", "plans"), 0.0)
    io = ShapedIO(model, max_batch, None, select, held)
    tops = None if bands == "plans" else Bands.of(bands, max_batch)
    return io, BandPlans.build(model, tops, io, max_batch, select, held, setup)


@pytest.mark.parametrize("select", ["updates", "switch"])
def test_band_plans_alone(fake, select):
    """BandPlans over ShapedIO, without a head or a capture: one model view and plan per band top
    over the persistent buffers, the entries' bands (updates only), the plan for each n; the holder
    closes the views and buffers, newest first."""
    from rawgraph import TinyBlock
    from rawgraph.serving.lifecycle import Held

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        held = Held("test.close", newest_first=True)
        io, plans = _io_and_plans(model, 8, [3], select, held)
        try:
            assert plans.bands.tops == (3, 8) and len(plans.models) == len(plans.plans) == 2
            assert (io.n_buf is not None) == (select == "updates") and io.input.shape == (8, 64)
            assert io.nbytes == 2 * 8 * 64 * 4 + io.arena.nbytes + (4 if select == "updates" else 0)
            assert [p.launches[0].args["B"] for p in plans.plans] == [3, 8]
            assert plans.launches == [launch for p in plans.plans for launch in p.launches]
            assert plans.launches[0].args["x"] == io.input.ptr
            if select == "updates":
                per = len(plans.plans[0].launches)
                assert [(e.lo, e.hi) for e in plans.entries] == [(1, 3)] * per + [(4, 8)] * per
            else:
                assert plans.entries == []
            assert [plans.plan_for(n) is plans.plans[0 if n <= 3 else 1] for n in range(9)] == [True] * 9
        finally:
            held.close()
        assert io.input.closed and io.output.closed and all(m.closed for m in plans.models)


def test_the_heads_alone_before_their_capture(fake):
    """UpdatesHead: a 48-byte table row per entry, a status word per entry plus n, rg_du_shape over
    them; SwitchHead: the band tops written to device memory, no head launch until the capture."""
    from rawgraph import TinyBlock
    from rawgraph.serving.device_shaped import SwitchHead, UpdatesHead
    from rawgraph.serving.lifecycle import Held

    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model:
        held = Held("test.close", newest_first=True)
        try:
            io, plans = _io_and_plans(model, 8, [3], "updates", held)
            head = UpdatesHead(plans, io.n_live, 8, model.device, held)
            count = len(plans.entries)
            assert head.table.nbytes == count * ENTRY_DTYPE.itemsize and head.rc.shape == (count + 1,)
            assert head.head.kernel.name == "rg_du_shape" and head.head.args["count"] == count
            assert head.head.args["n_live"] == io.n_live.ptr and head.switch is None and head.handles == []
            from rawgraph.runtime.stream import Stream

            s = held.add(Stream())
            sw = SwitchHead(plans.bands, None, 8, model.device, s, held)
            assert list(sw.table.to_numpy(s)) == [3, 8] and sw.rc.shape == (1,) and sw.head is None
        finally:
            held.close()


def test_live_count_alone_copies_n_or_pushes_nothing_when_unchanged(fake):
    """LiveCount with an n_live buffer: each write is one 4-byte cuMemcpyHtoDAsync of n."""
    from rawgraph import DeviceBuffer, Stream
    from rawgraph.serving.device_shaped import LiveCount

    with DeviceBuffer((1,), np.int32) as n_live, Stream() as s:
        count = LiveCount(n_live.view())
        copies = []
        real = driver.cuMemcpyHtoDAsync
        driver.cuMemcpyHtoDAsync = lambda d, src, n, st: copies.append((int(d), n)) or real(d, src, n, st)
        try:
            count.write(5, s)
            count.write(0, s)
        finally:
            driver.cuMemcpyHtoDAsync = real
        assert copies == [(n_live.ptr, 4)] * 2 and count.arg is None
        assert list(n_live.to_numpy(s)) == [0]


def test_the_runner_alone_refuses_an_overlapping_x_before_it_copies_or_launches(fake):
    from rawgraph import DeviceBuffer, Stream, TinyBlock
    from rawgraph.runtime.errors import LayoutError
    from rawgraph.runtime.memory import DeviceArray
    from rawgraph.serving.buckets import StreamOrder
    from rawgraph.serving.device_shaped import LiveCount, ShapedRunner
    from rawgraph.serving.lifecycle import Held

    launches = []
    exe = types.SimpleNamespace(launch=lambda s: launches.append(s))
    with TinyBlock(64, 1, 1, seed=2, form="unfused") as model, Stream() as s:
        held = Held("test.close", newest_first=True)
        try:
            io, _plans = _io_and_plans(model, 8, None, "updates", held)
            runner = ShapedRunner(exe, LiveCount(io.n_live), held.add(StreamOrder(model.device)), s, io)
            f32 = np.dtype(np.float32)
            half = DeviceArray(io.input.ptr + 64 * 4, (4, 64), f32, io.input)  # rows 1..4 of the input
            with pytest.raises(LayoutError, match="overlaps"):
                runner.run(4, half)
            assert launches == [] and runner.replays == 0
            with DeviceBuffer((8, 64)) as x:
                runner.run(3, x.view())
                runner.replay()
            assert launches == [s, s] and runner.replays == 2
        finally:
            held.close()
