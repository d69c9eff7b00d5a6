"""SlotPool's join on the CPU fake driver (tests/fakedriver.py): a host row costs no wait for the
stream (issue 23, item 3), and the row the caller passed may be reused as soon as join returns."""

from __future__ import annotations

import fault_cases as fc
import numpy as np
import pytest
from cuda.bindings import driver
from fault_cases import fake_session

WAITS = ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")


@pytest.mark.parametrize("table", ["graph", "copy", "params"])
def test_a_host_row_joins_with_no_wait_and_the_callers_row_is_free_at_once(table):
    with fake_session() as (fake, hook), pytest.MonkeyPatch.context() as mp:
        hook.active = False
        st = fc._pool_setup(table, joined=1, step=True)()  # steady state: a step queued
        try:
            pool = st["pool"]
            waits: list[str] = []
            for name in WAITS:
                real = getattr(driver, name)
                mp.setattr(driver, name, lambda *a, _n=name, _r=real: waits.append(_n) or _r(*a))
            with pytest.raises(Exception, match="float32"):
                pool.join(np.ones(fc.W, np.float64))
            with pytest.raises(Exception, match="shape"):
                pool.join(np.ones(fc.W + 1, np.float32))
            fc.pool_consistent(st)  # refusals changed nothing
            row = np.full(fc.W, 4.5, np.float32)
            slot = pool.join(row)
            want = row.tobytes()
            row[:] = -1.0  # the caller reuses its row right away
            assert waits == [], f"join waited: {waits}"
            assert fake.read(pool.state.ptr + slot * fc.W * 4, fc.W * 4) == want
            st["rows"][slot] = np.frombuffer(want, np.float32)
            fc.pool_consistent(st)
        finally:
            mp.undo()
            fc.close_state(st)


def test_a_leave_that_does_not_wait_hands_back_the_row_later():
    from rawgraph.serving.slots import PendingRow

    with fake_session() as (fake, hook), pytest.MonkeyPatch.context() as mp:
        hook.active = False
        st = fc._pool_setup("graph", joined=2, step=True)()
        try:
            pool = st["pool"]
            waits: list[str] = []
            for name in ("cuStreamSynchronize", "cuCtxSynchronize"):
                real = getattr(driver, name)
                mp.setattr(driver, name, lambda *a, _n=name, _r=real: waits.append(_n) or _r(*a))
            slot = sorted(st["rows"])[0]
            want = fake.read(pool.state.ptr + slot * fc.W * 4, fc.W * 4)
            row = pool.leave(slot, wait=False)
            assert isinstance(row, PendingRow) and waits == [], f"leave waited for the stream: {waits}"
            del st["rows"][slot]
            fc.pool_consistent(st)  # the slot is free again at once
            # the slot joins again and leaves again before the first row was taken: the first row
            # is taken out of the way, not overwritten
            again = np.full(fc.W, 7.75, np.float32)
            assert pool.join(again, slot=slot) == slot
            second = pool.leave(slot, wait=False)
            assert row.done() and row.result().tobytes() == want
            assert second.result().tobytes() == again.tobytes()
            assert waits == []
            # one more left pending survives the pool's close
            last = sorted(st["rows"])[0]
            pending = pool.leave(last, wait=False)
            want_last = st["rows"].pop(last).tobytes()
            pool.close()
            assert pending.done() and pending.result().tobytes() == want_last
            with pytest.raises(Exception, match="closed"):
                pool.leave(last)
        finally:
            mp.undo()
            fc.close_state(st)


# -- the parts, each alone -------------------------------------------------------------------------
def test_the_slot_table_alone():
    """SlotTable is pure: the lowest free slot first, a given slot checked, swap-remove on leave,
    padding always the scratch slot, the version bumped by every join and leave."""
    from rawgraph.serving.slots import SlotError, SlotTable

    t = SlotTable(np.zeros(6, np.int32), 4)
    assert list(t.table) == [4] * 6 and t.scratch_slot == 4 and len(t) == 0
    for want in (0, 1, 2):
        assert t.choose() == want
        t.admit(want)
    assert t.choose(3) == 3
    t.admit(3)
    assert t.live == [0, 1, 2, 3] and t.version == 4
    with pytest.raises(SlotError, match="full"):
        t.choose()
    t.retire(1)  # the last live slot takes its place
    assert t.live == [0, 3, 2] and t.pos == {0: 0, 3: 1, 2: 2} and list(t.table[3:]) == [4] * 3
    assert t.free == [1] and t.version == 5
    for bad, match in ((0, "occupied"), (4, "not in"), (True, "not in"), (-1, "not in")):
        with pytest.raises(SlotError, match=match):
            t.choose(bad)
    assert t.choose(np.int64(1)) == 1


def test_slot_options_alone_choose_and_refuse_before_anything_is_allocated():
    import types

    from rawgraph.runtime.errors import LayoutError, ShapeError
    from rawgraph.serving.slots import SlotOptions

    model = types.SimpleNamespace(
        width=8,
        batch=1,
        device=None,
        plan=None,
        with_batch=None,
        make_workspace=None,
        scratch_layout=None,
        reference=None,
        close=None,
    )
    o = SlotOptions.check(model, 8)
    assert (o.table, o.gather, o.shape, o.sizes[-1], o.copy_whole_table) == ("graph", None, "buckets", 8, False)
    o = SlotOptions.check(model, 8, shape="device", select="switch", bands=[3])
    assert (o.table, o.gather, o.sizes, o.bands, o.copy_whole_table) == ("copy", "kernels", [8], [3, 8], True)
    for kw, exc in (
        ({"shape": "x"}, ValueError),
        ({"bands": [3]}, ValueError),
        ({"shape": "device", "table": "graph"}, LayoutError),
        ({"table": "params", "gather": "fused"}, LayoutError),
        ({"sizes": [2, 4]}, ShapeError),
        ({"table": "params", "sizes": [8, 4096]}, Exception),
    ):
        with pytest.raises(exc):
            SlotOptions.check(model, 8, **kw)
    with pytest.raises(TypeError, match="protocol"):
        SlotOptions.check(object(), 8)


def test_table_delivery_alone_sends_each_version_once_per_bucket():
    """table="copy": one cuMemcpyHtoDAsync of the bucket's rows per new version, which serves
    every smaller bucket too; table="graph" copies nothing before the launch (its graph does)."""
    from rawgraph import Stream
    from rawgraph.runtime.device import get_device
    from rawgraph.serving.slots import SlotOptions, TableDelivery

    with fake_session() as (fake, hook), pytest.MonkeyPatch.context() as mp:
        hook.active = False
        copies: list = []
        real = driver.cuMemcpyHtoDAsync
        mp.setattr(driver, "cuMemcpyHtoDAsync", lambda d, src, n, s: copies.append(n) or real(d, src, n, s))
        model = fc._base({})["model"]
        try:
            for mode, want in (("copy", [8, 16]), ("graph", [])):
                opts = SlotOptions.check(model, 4, sizes=[2, 4], table=mode)
                tables = TableDelivery(opts, get_device())
                with Stream() as s:
                    tables.host[:] = 4
                    for b in (4, 2):
                        tables.track(b)
                    copies.clear()
                    tables.send(2, 1, s)  # version 1 to bucket 2 ...
                    tables.send(4, 1, s)  # ... is not yet in bucket 4
                    tables.send(2, 1, s)  # bucket 4's copy served bucket 2
                    assert copies == want, mode
                    if mode == "copy":
                        assert fake.read(tables.table_dev.ptr, 16) == tables.host[:4].tobytes()
                for obj in (tables.table_dev, tables.pinned, tables.read):
                    if obj is not None:
                        obj.close()
        finally:
            model.close()


@pytest.mark.parametrize("form,table,want", [("fused", "graph", "fused"), ("unfused", "copy", "kernels")])
def test_row_gather_alone_picks_and_builds_the_edges(form, table, want):
    """RowGather: the largest bucket's plan picks fused (its matmuls take the row table, rewritten
    in place) or gather and scatter kernels; table="params" fills their by-value tables with the
    scratch slot."""
    from rawgraph import DeviceBuffer, TinyBlock
    from rawgraph.serving.slots import RowGather

    with (
        fake_session() as (fake, hook),
        TinyBlock(fc.W, 4, 1, seed=3, form=form) as model,
        DeviceBuffer((5, fc.W)) as state,
        DeviceBuffer((4,), np.int32) as table_dev,
        DeviceBuffer((4, fc.W)) as x,
        DeviceBuffer((4, fc.W)) as y,
    ):
        hook.active = False
        views = {"state": state.view(), "table": table_dev.view(), "x": x.view(), "y": y.view()}
        route = RowGather(None, table, model, views, 4)
        plan = model.plan(x, y)
        edges = route.edges(4, plan)
        assert route.gather == want
        if want == "fused":
            assert edges is None and all(launch.args["rows"] == table_dev.ptr for launch in plan.launches[:1])
        else:
            assert [launch.kernel.name.split("<")[0] for launch in edges] == ["gather_rows", "scatter_rows"]
        params = RowGather("kernels", "params", model, views, 4).edges(4, model.plan(x, y))
        assert all(list(launch.args.array("table")[:4]) == [4] * 4 for launch in params)


def test_a_closed_pool_refuses_before_any_driver_call_and_closes_once():
    with fake_session() as (fake, hook), pytest.MonkeyPatch.context() as mp:
        hook.active = False
        st = fc._pool_setup("copy", joined=1, step=True)()
        try:
            pool = st["pool"]
            pool.close()
            assert pool.closed and pool.state.closed and all(e.closed for e in pool.execs.values())
            calls: list = []
            for name in ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuGraphLaunch", "cuMemFree"):
                real = getattr(driver, name)
                mp.setattr(driver, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
            for op in (pool.step, lambda: pool.join(np.ones(fc.W, np.float32)), lambda: pool.read(0)):
                with pytest.raises(Exception, match="closed"):
                    op()
            pool.close()  # twice: nothing released again
            assert calls == []
        finally:
            mp.undo()
            fc.close_state(st)
