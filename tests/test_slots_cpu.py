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
