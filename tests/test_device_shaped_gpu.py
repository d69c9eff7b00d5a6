"""DeviceShapedGraph on the GPU (issue 25, item 2): one capture at max_batch, the grids and row
counts set by the head kernel on the device at every replay."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import exact_run, random_input, refuses_what_the_driver_forbids, rel_err

from rawgraph import DeviceBuffer, DeviceShapedError, DeviceShapedGraph, TinyBlock
from rawgraph.models.tinyblock import reference_forward
from rawgraph.runtime.launch import KernelArgs, Launch, LaunchPlan
from rawgraph.runtime.memory import POISON_BITS
from rawgraph.runtime.module import get_kernel
from rawgraph.serving.device_shaped import grid_for

pytestmark = pytest.mark.gpu


def _clusters(device):
    return device.info.compute_capability >= (9, 0)


def _check_n(dsg, model, xh, weights, n, stream, counts):
    dsg.output.poison(stream)
    dsg.run(n, stream)
    got = dsg.output.to_numpy(stream)
    assert dsg.check_status(stream) == n
    assert (got[n:].view(np.uint32) == POISON_BITS).all(), f"n={n}: rows >= n were written"
    want, names = exact_run(model, xh, n, stream)
    if names == [l.kernel.name for l in dsg.plan_for(n).launches]:
        assert np.array_equal(got[:n].view(np.uint32), want.view(np.uint32)), f"n={n}: not bit-equal to the exact run"
        counts["bit"] += 1
    else:
        assert rel_err(got[:n], reference_forward(xh[:n], weights)) < 1e-5, f"n={n}"
        assert rel_err(want, reference_forward(xh[:n], weights)) < 1e-5
        counts["tol"] += 1


@pytest.mark.parametrize(
    "form,width,max_batch,subset",
    [
        ("unfused", 64, 64, None),
        ("fused", 64, 64, None),
        ("block", 64, 64, None),
        ("unfused", 1024, 256, 40),
        ("fused", 1024, 256, 40),
    ],
)
def test_every_n_in_random_order_equals_the_exact_size_run(device, stream, rng, form, width, max_batch, subset):
    if form == "block" and not _clusters(device):
        pytest.skip("the block form needs compute capability 9.0")
    with TinyBlock(width, 1, 2, seed=7, form=form) as model, DeviceShapedGraph(model, max_batch, stream) as dsg:
        xh = random_input(rng, (max_batch, width))
        dsg.input.copy_from_host(xh, stream)
        weights = model.weights_numpy(stream)
        ns = [int(n) for n in rng.permutation(np.arange(1, max_batch + 1))]
        if subset:
            # a random subset plus the sizes where the cut rules change (tiles of 8 and of 64 rows)
            ns = list(
                dict.fromkeys(ns[:subset] + [1, 7, 8, 9, 32, 63, 64, 65, 127, 128, 129, 192, max_batch - 1, max_batch])
            )
            rng.shuffle(ns)
        counts = {"bit": 0, "tol": 0}
        for n in ns:
            _check_n(dsg, model, xh, weights, n, stream, counts)
        assert counts["bit"] >= 1, f"no n ran the max plan's kernels bit-equal: {counts}"
        assert dsg.replays == len(ns)


@pytest.mark.parametrize(
    "form,width,max_batch,subset", [("fused", 1024, 256, 40), ("unfused", 64, 64, None), ("block", 64, 64, None)]
)
def test_bands_from_the_plans_give_the_exact_size_bits_at_every_n(device, stream, rng, form, width, max_batch, subset):
    """bands="plans": every n, in random order and with n = 0 between, runs its band's plan cut to
    n rows, which launches what the exact-size plan launches: the same bits."""
    if form == "block" and not _clusters(device):
        pytest.skip("the block form needs compute capability 9.0")
    with (
        TinyBlock(width, 1, 2, seed=11, form=form) as model,
        DeviceShapedGraph(model, max_batch, stream, bands="plans") as dsg,
    ):
        assert dsg.bands[-1] == max_batch
        xh = random_input(rng, (max_batch, width))
        dsg.input.copy_from_host(xh, stream)
        weights = model.weights_numpy(stream)
        ns = [int(n) for n in rng.permutation(np.arange(1, max_batch + 1))]
        if subset:  # a random subset plus both ends of every band
            ends = [t for t in dsg.bands] + [t + 1 for t in dsg.bands[:-1]]
            ns = list(dict.fromkeys(ns[:subset] + ends))
            rng.shuffle(ns)
        counts = {"bit": 0, "tol": 0}
        for k, n in enumerate(ns):
            if k % 7 == 3:  # n = 0 in between: every band disabled, then one enabled again
                dsg.output.poison(stream)
                dsg.run(0, stream)
                assert (dsg.output.to_numpy(stream).view(np.uint32) == POISON_BITS).all()
            _check_n(dsg, model, xh, weights, n, stream, counts)
        assert counts == {"bit": len(ns), "tol": 0}, counts


def test_grids_cover_exactly_n_rows(device, stream):
    """No padding block: the grid the head sets has ceil(n / rows_per_block) blocks on the row axis."""
    with TinyBlock(64, 1, 1, form="unfused") as model, DeviceShapedGraph(model, 64, stream) as dsg:
        for e in dsg.entries:
            if e.axis >= 0:
                assert grid_for(e, 64) == e.grid
                for n in (1, 9, 33, 64):
                    assert grid_for(e, n)[e.axis] == -(-n // e.rows_per_block)


def test_n_zero_runs_nothing_and_the_next_n_runs_again(device, stream, rng):
    with TinyBlock(64, 1, 2, form="unfused") as model, DeviceShapedGraph(model, 64, stream) as dsg:
        xh = random_input(rng, (64, 64))
        dsg.input.copy_from_host(xh, stream)
        dsg.run(17, stream)
        dsg.output.poison(stream)
        out = dsg.run(0, stream)
        assert out.shape == (0, 64)
        assert (dsg.output.to_numpy(stream).view(np.uint32) == POISON_BITS).all()
        assert dsg.check_status(stream) == 0
        _check_n(dsg, model, xh, model.weights_numpy(stream), 5, stream, {"bit": 0, "tol": 0})


def test_the_view_run_returns_reads_its_n_rows_and_refuses_once_closed(device, stream, rng):
    """``run(n)`` returns a DeviceArray view of the first n output rows: ``to_numpy`` copies just
    those rows, and refuses with ClosedError, before any driver call, once its owner is closed."""
    from rawgraph.runtime.errors import ClosedError

    with TinyBlock(64, 1, 2, form="unfused") as model:
        dsg = DeviceShapedGraph(model, 64, stream)
        xh = random_input(rng, (64, 64))
        dsg.input.copy_from_host(xh, stream)
        dsg.output.poison(stream)
        view = dsg.run(9, stream)
        got = view.to_numpy(stream)
        assert got.shape == (9, 64) and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), dsg.output.to_numpy(stream)[:9].view(np.uint32))
        assert rel_err(got, reference_forward(xh[:9], model.weights_numpy(stream))) < 1e-5
        dsg.close()
        with pytest.raises(ClosedError):
            view.to_numpy(stream)


@pytest.mark.parametrize("select,bands,form", [("updates", None, "fused"), ("switch", [4, 16, 40], "unfused")])
def test_n_written_by_a_kernel_in_the_same_graph(device, stream, rng, select, bands, form):
    """The prologue counts the live entries of a slot table into n_live; the head reads it in the
    same replay (rg_du_shape cutting the plan to n rows; rg_set_band picking the band, whose top's
    rows are written)."""
    slots = 64
    with (
        TinyBlock(64, 1, 2, form=form) as model,
        DeviceBuffer((slots,), np.int32) as table,
        DeviceBuffer((1,), np.int32) as n_live,
    ):
        args = KernelArgs([("table", "ptr"), ("count", "i32"), ("n_live", "ptr")])
        args.update({"table": table.ptr, "count": slots, "n_live": n_live.ptr})
        count = Launch(
            get_kernel("device_update", "rg_du_count_live", device), (1, 1, 1), (256, 1, 1), args, {}, 0, "count_live"
        )
        prologue = LaunchPlan([count], {}, (), ())
        with DeviceShapedGraph(
            model, slots, stream, n_live=n_live, prologue=prologue, bands=bands, select=select
        ) as dsg:
            xh = random_input(rng, (slots, 64))
            dsg.input.copy_from_host(xh, stream)
            weights = model.weights_numpy(stream)
            with pytest.raises(DeviceShapedError):
                dsg.run(3, stream)  # n comes from the graph: run() would race its writer
            for live in (int(k) for k in rng.permutation(np.arange(0, slots + 1))[:12]):
                t = np.full(slots, -1, np.int32)
                t[rng.choice(slots, live, replace=False)] = rng.integers(0, 1000, live)
                table.copy_from_host(t, stream)
                dsg.output.poison(stream)
                dsg.replay(stream)
                got = dsg.output.to_numpy(stream)
                assert dsg.check_status(stream) == live
                assert int(n_live.to_numpy(stream)[0]) == live
                top = live if select == "updates" or not live else min(b for b in dsg.bands if b >= live)
                assert (got[top:].view(np.uint32) == POISON_BITS).all(), f"live={live}"
                if live:
                    assert rel_err(got[:live], reference_forward(xh[:live], weights)) < 1e-5, f"live={live}"


def test_refusals_come_before_any_driver_call(device, stream, rng, monkeypatch):
    names = (
        "cuGraphInstantiate",
        "cuGraphInstantiateWithParams",
        "cuGraphExecUpdate",
        "cuGraphClone",
        "cuGraphExecKernelNodeSetParams",
    )
    with TinyBlock(64, 1, 1, form="unfused") as model, DeviceShapedGraph(model, 64, stream) as dsg:
        refuses_what_the_driver_forbids(dsg, monkeypatch, names)
        # still serving after the refusals
        xh = random_input(rng, (64, 64))
        dsg.input.copy_from_host(xh, stream)
        _check_n(dsg, model, xh, model.weights_numpy(stream), 9, stream, {"bit": 0, "tol": 0})


def test_close_twice_and_after_close(device, stream):
    from rawgraph.runtime.errors import ClosedError

    with TinyBlock(64, 1, 1) as model:
        dsg = DeviceShapedGraph(model, 16, stream)
        dsg.run(3, stream)
        stream.synchronize()
        dsg.close()
        dsg.close()
        assert dsg.exec.closed and dsg.graph.closed and dsg.input.closed
        with pytest.raises(ClosedError):
            dsg.run(1, stream)
