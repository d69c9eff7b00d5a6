"""Continuous batching: fixed slots, an index table, requests joining and leaving between steps."""

import time

import numpy as np
import pytest
from helpers import random_input, spin_after_collecting

from rawgraph import DeviceBuffer, DTypeError, LayoutError, ShapeError, SlotError, SlotPool, TinyBlock, get_device
from rawgraph.models.tinyblock import reference_forward

pytestmark = pytest.mark.gpu
WIDTH = 128


@pytest.fixture(scope="module")
def model():
    m = TinyBlock(WIDTH, 1, 1, seed=5, form="fused")
    yield m
    m.close()


def _trace(rng, steps, max_slots, rate=1.5, mean_len=12, max_len=40):
    """(join step, length) per request: Poisson arrivals, geometric lengths (capped: the block's
    outputs grow with every step)."""
    reqs = []
    ends: list[int] = []
    for t in range(steps):
        ends = [e for e in ends if e > t]
        for _ in range(int(rng.poisson(rate))):
            if len(ends) < max_slots:
                length = int(min(max_len, rng.geometric(1 / mean_len)))
                reqs.append((t, length))
                ends.append(t + length)
    return reqs


def _drive(pool, reqs, rows, steps, slot_of=None, order=None, history=None, wait=True):
    """Run the trace: join at its step, one step per tick, leave after its length. Returns each
    request's final row and how many steps it saw.

    ``slot_of(i, pool)`` picks the slot request ``i`` joins (``join(slot=...)``; the slot it gets
    back must be that one, at the next batch position). ``order`` (a Generator) shuffles the joins
    and leaves within each tick, so the swap-removes move requests to other batch positions;
    ``history`` (a dict) receives each request's batch position at every step it runs in.
    ``wait=False`` leaves with ``leave(slot, wait=False)`` and takes the rows at the end."""
    by_join: dict[int, list[int]] = {}
    for i, (t, _len) in enumerate(reqs):
        by_join.setdefault(t, []).append(i)
    leaving: dict[int, list[int]] = {}
    slot, final = {}, {}
    pool.busy_steps = 0  # ticks with a live request (a step with none runs nothing)
    for t in range(steps + 1):
        going = leaving.pop(t, [])
        if order is not None:
            going = [going[k] for k in order.permutation(len(going))]
        for i in going:
            final[i] = pool.leave(slot.pop(i), wait=wait)
        if t == steps:
            break
        coming = by_join.get(t, [])
        if order is not None:
            coming = [coming[k] for k in order.permutation(len(coming))]
        for i in coming:
            want = None if slot_of is None else slot_of(i, pool)
            slot[i] = pool.join(rows[i], slot=want)
            if want is not None:
                assert slot[i] == want, f"join(slot={want}) gave slot {slot[i]}"
                assert pool.live[-1] == want and len(pool) == len(slot)  # at the next batch position
            leaving.setdefault(t + reqs[i][1], []).append(i)
        if history is not None:
            for i, s in slot.items():
                history.setdefault(i, []).append(pool._pos[s])
        pool.busy_steps += pool.step() > 0
    for i, s in slot.items():  # still alive at the end
        final[i] = pool.leave(s, wait=wait)
    return {i: r if isinstance(r, np.ndarray) else r.result() for i, r in final.items()}


def _expected(reqs, rows, weights, steps):
    """Each request's row after its own steps, alone, in float64 (batched by step count)."""
    seen = {i: min(length, steps - t) for i, (t, length) in enumerate(reqs)}
    out = {}
    for k in sorted(set(seen.values())):
        ids = [i for i, v in seen.items() if v == k]
        y = np.stack([rows[i] for i in ids]).astype(np.float64)
        for _ in range(k):
            y = reference_forward(y, weights)
        out.update(zip(ids, y))
    return out, seen


@pytest.mark.parametrize(
    "table,gather", [("graph", "fused"), ("copy", "fused"), ("graph", "kernels"), ("params", "kernels")]
)
def test_a_random_join_leave_trace_matches_each_request_alone(model, stream, rng, table, gather):
    steps, slots = 10_000, 64
    reqs = _trace(rng, steps, slots)
    rows = [random_input(rng, (WIDTH,)) for _ in reqs]
    pool = SlotPool(model, max_slots=slots, table=table, gather=gather, stream=stream)
    assert (pool.mode, pool.gather) == (table, gather)
    final = _drive(pool, reqs, rows, steps)
    want, seen = _expected(reqs, rows, model.weights_numpy(stream), steps)
    assert len(final) == len(reqs) > 500
    worst = max(float(np.linalg.norm(final[i] - want[i]) / np.linalg.norm(want[i])) for i in final)
    assert worst < 1e-4, f"worst rel err {worst:.2e}, seed {rng.seed_used}"
    assert pool.steps == pool.busy_steps > 0.9 * steps and max(seen.values()) > 1
    pool.close()


def test_results_do_not_depend_on_slot_or_batch_position(model, stream, rng):
    steps, slots = 400, 64
    reqs = _trace(rng, steps, slots, rate=3.0)
    rows = [random_input(rng, (WIDTH,)) for _ in reqs]
    pool = SlotPool(model, max_slots=slots, stream=stream)
    plain_pos: dict[int, list[int]] = {}
    plain = _drive(pool, reqs, rows, steps, history=plain_pos)
    perm = rng.permutation(slots)

    def scrambled(i, p):  # another free slot, picked through a fixed permutation
        free = [s for s in perm if s not in p._pos]
        return int(free[i % len(free)])

    shuffled_pos: dict[int, list[int]] = {}
    shuffled = _drive(pool, reqs, rows, steps, slot_of=scrambled, order=rng, history=shuffled_pos)
    assert len(plain) == len(shuffled) == len(reqs) > 200
    # the second drive really put the requests elsewhere in the batch, not only in other slots
    moved = sum(plain_pos[i] != shuffled_pos[i] for i in plain_pos)
    assert moved > len(reqs) // 2, f"only {moved} of {len(reqs)} requests saw other batch positions"
    for i in plain:
        np.testing.assert_array_equal(plain[i], shuffled[i], err_msg=f"request {i}, seed {rng.seed_used}")
    pool.close()


def test_padding_slots_never_change_live_ones(model, stream, rng):
    pool = SlotPool(model, max_slots=16, sizes=[16], stream=stream)  # every step pads to 16
    rows = [random_input(rng, (WIDTH,)) for _ in range(5)]
    slots = [pool.join(r) for r in rows]
    gone = sorted(int(k) for k in rng.choice(5, size=2, replace=False))
    for k in gone:  # two requests leave: their batch positions become padding again
        np.testing.assert_array_equal(pool.leave(slots[k]), rows[k])
    live = [(slots[k], rows[k]) for k in range(5) if k not in gone]
    free = [i for i in range(16) if i not in {s for s, _ in live}]
    assert len(pool) == 3 and len(free) == 13
    # Every free slot holds a finite row of its own (as a finished request leaves behind): a step
    # whose padding named one of them instead of the scratch slot would change it.
    state = pool.state.to_numpy(stream)
    state[free] = rng.standard_normal((len(free), WIDTH), dtype=np.float32)
    pool.state.copy_from_host(state, stream)
    before = pool.state.to_numpy(stream)
    assert np.isnan(before[pool.scratch_slot]).all()  # padding reads NaN ...
    for _ in range(4):
        pool.step()
    w = model.weights_numpy(stream)
    for s, r in live:
        want = r.astype(np.float64)
        for _ in range(4):
            want = reference_forward(want[None], w)[0]
        got = pool.read(s)
        assert np.isfinite(got).all()  # ... and no live row sees it
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5, f"seed {rng.seed_used}"
    after = pool.state.to_numpy(stream)
    changed = [i for i in free if not np.array_equal(after[i].view(np.uint32), before[i].view(np.uint32))]
    assert not changed, f"free slots {changed} were written by padding, seed {rng.seed_used}"
    pool.close()


@pytest.mark.parametrize("gather", ["kernels", "fused"])
def test_the_pinned_table_is_not_rewritten_under_a_queued_step(model, stream, rng, gather):
    # One bucket of 8: the queued step's memcpy node copies table[0:8], so the entry the join
    # writes (table[1]) is one that step reads. The joining row is a device row: that join ends
    # in no stream synchronize, so only the table rule makes it wait.
    pool = SlotPool(model, max_slots=8, sizes=[8], gather=gather, stream=stream)
    a, b, c = (random_input(rng, (WIDTH,)) for _ in range(3))
    sa = pool.join(a)
    sc = pool.join(c)
    np.testing.assert_array_equal(pool.leave(sc), c)  # slot sc now holds c's finite row, and is free
    b_dev = DeviceBuffer.from_numpy(b, stream=stream)
    state0 = pool.state.to_numpy(stream)
    spin_after_collecting(get_device(), 200_000_000, stream)  # the next step waits 200 ms behind this
    pool.step()  # its table says: sa, then padding (the scratch slot)
    assert not pool._read.query()  # that replay has not read the table yet
    t0 = time.perf_counter()
    sb = pool.join(b_dev)  # must not touch the table before the queued step has read it
    waited = time.perf_counter() - t0
    assert sb == sc and pool.live == [sa, sb]
    if gather == "kernels":
        # What the queued step gathered into its batch row 1: the old table names the scratch
        # slot there; a table rewritten under it names sb, which still held c.
        gathered = pool.x.to_numpy(stream)[1]
        assert not np.array_equal(gathered, c), "the queued step gathered sb: it read the rewritten table"
        np.testing.assert_array_equal(gathered.view(np.uint32), state0[pool.scratch_slot].view(np.uint32))
    pool.step()  # sa and sb
    w = model.weights_numpy(stream)
    one = lambda v: reference_forward(v[None].astype(np.float64), w)[0]  # noqa: E731
    got_a, got_b = pool.read(sa), pool.read(sb)
    assert np.linalg.norm(got_a - one(one(a))) / np.linalg.norm(one(one(a))) < 1e-5, "a did not get two steps"
    assert np.linalg.norm(got_b - one(b)) / np.linalg.norm(one(b)) < 1e-5, "b ran in the step queued before it joined"
    assert waited > 0.05, f"join returned after {waited * 1e3:.1f} ms, before the queued step read the table"
    b_dev.close()
    pool.close()


def test_bad_slot_operations_are_refused_and_change_nothing(model, stream, rng):
    pool = SlotPool(model, max_slots=4, sizes=[2, 4], stream=stream)
    rows = [random_input(rng, (WIDTH,)) for _ in range(4)]
    slots = [pool.join(r) for r in rows]
    assert sorted(slots) == [0, 1, 2, 3]
    before = pool.state.to_numpy(stream)
    table = pool.table.copy()
    with pytest.raises(SlotError, match="full"):
        pool.join(rows[0])
    left = pool.leave(slots[1])
    np.testing.assert_array_equal(left, rows[1])
    with pytest.raises(SlotError, match="holds no request"):
        pool.leave(slots[1])  # leaving a free slot
    with pytest.raises(SlotError, match="occupied"):
        pool.join(rows[0], slot=slots[0])  # joining an occupied slot
    with pytest.raises(SlotError, match="not in"):
        pool.join(rows[0], slot=4)
    with pytest.raises(ShapeError):
        pool.join(random_input(rng, (WIDTH + 1,)))
    with pytest.raises(DTypeError):
        pool.join(rows[0].astype(np.float64))
    with pytest.raises(ShapeError):
        pool.join(DeviceBuffer((2, WIDTH)))
    after = pool.state.to_numpy(stream)
    # every row, the left slot's and the scratch slot's included, bit for bit
    np.testing.assert_array_equal(after.view(np.uint32), before.view(np.uint32), err_msg=f"seed {rng.seed_used}")
    assert len(pool) == 3 and pool.live == [slots[0], slots[3], slots[2]]  # the last live slot took the leaver's place
    assert list(pool.table) == [slots[0], slots[3], slots[2]] + [pool.scratch_slot] * (len(table) - 3)
    assert pool.join(rows[1]) == slots[1]  # the refused joins took no slot
    pool.close()


@pytest.mark.parametrize(
    "width,sizes,precision",
    [(WIDTH, None, "auto"), (2048, [32, 64], "fp32"), (2048, [32, 64], "tf32x3")],  # matvec, then GEMM cuts
)
def test_fused_gather_equals_gather_kernels_to_the_bit(stream, rng, width, sizes, precision):
    m = TinyBlock(width, 1, 2, seed=9, form="fused", precision=precision)
    steps, slots = (300, 64) if width == WIDTH else (12, 64)
    reqs = _trace(rng, steps, slots, rate=3.0 if width == WIDTH else 12.0, max_len=8)
    rows = [random_input(rng, (width,)) for _ in reqs]
    finals = {}
    for gather, table in (("fused", "graph"), ("kernels", "graph"), ("kernels", "params")):
        pool = SlotPool(m, max_slots=slots, sizes=sizes, table=table, gather=gather, stream=stream)
        if width != WIDTH:  # the GEMM cut is what this case is about
            kernel = "gemm" if precision == "fp32" else "tf32x3"
            assert pool.graphs[64].plan.launches[0].kernel.name.startswith(kernel)
        finals[gather, table] = _drive(pool, reqs, rows, steps)
        pool.close()
    a = finals["fused", "graph"]
    assert len(a) == len(reqs) > 10
    for other in (("kernels", "graph"), ("kernels", "params")):
        for i in a:
            np.testing.assert_array_equal(a[i], finals[other][i], err_msg=f"request {i} {other} seed {rng.seed_used}")
    w = m.weights_numpy(stream)
    for i in list(a)[:8]:
        t, length = reqs[i]
        want = rows[i][None].astype(np.float64)
        for _ in range(min(length, steps - t)):
            want = reference_forward(want, w)
        assert np.linalg.norm(a[i] - want[0]) / np.linalg.norm(want[0]) < 1e-4, f"seed {rng.seed_used}"
    m.close()


def test_params_tables_are_pushed_only_after_a_join_or_leave(model, stream, rng, count_setparams):
    pool = SlotPool(model, max_slots=8, sizes=[4, 8], table="params", stream=stream)
    a = pool.join(random_input(rng, (WIDTH,)))
    pool.join(random_input(rng, (WIDTH,)))
    before = len(count_setparams)
    pool.step()
    assert len(count_setparams) - before == 2  # the gather and scatter nodes of bucket 4
    pool.step()
    pool.step()
    assert len(count_setparams) - before == 2  # nothing changed: nothing pushed
    pool.leave(a)
    pool.step()
    assert len(count_setparams) - before == 4
    got = pool.read(pool.live[0])
    assert np.isfinite(got).all()
    pool.close()


def test_gather_and_table_choices_the_kernels_cannot_run_are_refused(stream):
    with TinyBlock(WIDTH, 1, 1, seed=1, form="unfused") as unfused:
        with pytest.raises(LayoutError, match="fused form"):
            SlotPool(unfused, max_slots=4, gather="fused", stream=stream)
        pool = SlotPool(unfused, max_slots=4, stream=stream)  # the default picks the gather kernels
        assert pool.gather == "kernels"
        pool.close()
    m = TinyBlock(WIDTH, 1, 1, seed=1, form="fused")
    with pytest.raises(LayoutError, match="by value"):
        SlotPool(m, max_slots=4, table="params", gather="fused", stream=stream)
    with pytest.raises(ShapeError, match="at most 1024"):
        SlotPool(m, max_slots=1100, table="params", stream=stream)
    with pytest.raises(ValueError, match="gather must be"):
        SlotPool(m, max_slots=4, gather="scattered", stream=stream)
    m.close()


def test_leaving_without_a_wait_gives_the_rows_a_waiting_leave_gives(model, stream, rng):
    """leave(slot, wait=False): the row comes back through the pool's pinned rows after its own
    event, with the same bits as a leave that synchronizes the stream, over a random trace (slots
    are reused while earlier rows are still pending)."""
    steps, max_slots = 120, 16
    reqs = _trace(rng, steps, max_slots)
    rows = [random_input(rng, (WIDTH,)) for _ in reqs]
    got = {}
    for wait in (True, False):
        with SlotPool(model, max_slots, [1, 2, 4, 8, 16], stream=stream) as pool:
            got[wait] = _drive(pool, reqs, rows, steps, wait=wait)
    assert got[True].keys() == got[False].keys() and len(got[True]) == len(reqs)
    for i in got[True]:
        assert got[True][i].tobytes() == got[False][i].tobytes(), f"request {i}"


@pytest.mark.parametrize("bands,select", [(None, None), ("plans", None), ("plans", "switch")])
def test_a_pool_shaped_on_the_device_matches_each_request_alone_and_the_bucket_pool(model, stream, rng, bands, select):
    """shape="device": one exec, grids and row counts set on the device to the live rows each
    step. Over a random trace every request equals its own steps alone (float64 reference), and
    the bucket pool running the same gather-kernel path gives the same rows within the same bound
    (its matmul cuts follow the bucket size, the device-shaped exec's the largest: the summation
    order may differ, and a row lives up to 40 steps). With bands from the plans, each step runs
    the exact-size plan's kernels; picked by a SWITCH node (select="switch"), a band runs at its
    top's rows, its padding rows read and written through the scratch slot only."""
    steps, slots = 600, 32
    reqs = _trace(rng, steps, slots)
    rows = [random_input(rng, (WIDTH,)) for _ in reqs]
    with SlotPool(model, max_slots=slots, shape="device", stream=stream, bands=bands, select=select) as pool:
        assert (pool.mode, pool.gather, pool.shape) == ("copy", "kernels", "device")
        final = _drive(pool, reqs, rows, steps)
        assert pool._shaped.check_status(stream) >= 0
    with SlotPool(model, max_slots=slots, table="copy", gather="kernels", stream=stream) as buckets:
        other = _drive(buckets, reqs, rows, steps)
    want, seen = _expected(reqs, rows, model.weights_numpy(stream), steps)
    assert len(final) == len(reqs) > 50
    worst = max(float(np.linalg.norm(final[i] - want[i]) / np.linalg.norm(want[i])) for i in final)
    assert worst < 1e-4, f"worst rel err {worst:.2e}, seed {rng.seed_used}"
    apart = max(float(np.linalg.norm(final[i] - other[i]) / np.linalg.norm(other[i])) for i in final)
    assert apart < 1e-4, f"device-shaped vs buckets rel diff {apart:.2e}, seed {rng.seed_used}"
