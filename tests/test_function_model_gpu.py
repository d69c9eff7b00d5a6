"""FunctionModel on the GPU: an RMSNorm written as a function of two RawKernels
(``examples/buckets_own_model.py``: ``make_model``), served through bucket graphs, row-count
buckets, slot pools and a device-shaped exec with no protocol class written.

Every output is checked against the float64 reference, and against the function's own launches
run eagerly at the exact batch size: bit for bit, since both kernels compute each row alone
whatever the batch (one CTA per row, one thread per value). Inputs are fresh random rows (the seed
is printed on failure); outputs are poisoned before every run.
"""

import numpy as np
import pytest
from helpers import random_input, rel_err
from test_examples_cpu import load_example
from test_protocol_gpu import WIDTH, Eager, _ns
from test_slots_gpu import _drive, _trace

from rawgraph import BucketGraphs, DeviceBuffer, DeviceShapedGraph, RowCountBuckets, SlotPool
from rawgraph.runtime.memory import POISON_BITS

pytestmark = pytest.mark.gpu
MAX = 32


@pytest.fixture(scope="module")
def model():
    m = load_example("buckets_own_model.py").make_model(WIDTH, seed=13)
    yield m
    m.close()


def _expected(model, reqs, rows, steps):
    """Each request's row after its own steps, alone, in float64."""
    out = {}
    for i, (t, length) in enumerate(reqs):
        y = rows[i].astype(np.float64)[None]
        for _ in range(min(length, steps - t)):
            y = model.reference(y)
        out[i] = y[0]
    return out


def test_the_recorded_plan_equals_the_function_called_eagerly(model, stream, rng):
    for n in (1, 7, MAX):
        m = model.with_batch(n)
        xh = random_input(rng, (n, WIDTH))
        x, out, t = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((n, WIDTH)), DeviceBuffer((n, WIDTH))
        out.poison(stream)
        model.fn(x, out, {"t": t}, n, stream)  # the user's own call, eager
        called = out.to_numpy(stream)
        out.poison(stream)
        m.plan(x, out).run(stream)  # the launches recorded from that call
        planned = out.to_numpy(stream)
        np.testing.assert_array_equal(planned, called, err_msg=f"n={n}, seed {rng.seed_used}")
        assert rel_err(planned, model.reference(xh)) < 1e-5, f"n={n}, seed {rng.seed_used}"
        for obj in (m, x, out, t):
            obj.close()


@pytest.mark.parametrize(
    "kind,scratch",
    [(BucketGraphs, "arena"), (BucketGraphs, "graph"), (BucketGraphs, "private"), (RowCountBuckets, "arena")],
)
def test_bucket_graphs_serve_the_function(model, stream, rng, kind, scratch):
    """Every scratch mode (``graph`` records the function inside the bucket's capture); row-count
    buckets bound both kernels to the live rows with the row counts the recording found."""
    eager = Eager(model, stream)
    with kind(model, max_batch=MAX, stream=stream, scratch=scratch) as bg:
        for n in _ns(rng, MAX):
            xh = random_input(rng, (n, WIDTH))
            x = DeviceBuffer.from_numpy(xh, stream=stream)
            bg.input.poison(stream)
            bg.output.poison(stream)
            bg.run(x, n)
            out = bg.output.to_numpy(stream)
            b = bg.bucket_for(n)
            np.testing.assert_array_equal(out[:n], eager(xh), err_msg=f"n={n} bucket {b}, seed {rng.seed_used}")
            assert rel_err(out[:n], model.reference(xh)) < 1e-5, f"n={n}, seed {rng.seed_used}"
            if kind is RowCountBuckets:  # padding rows never written
                assert (out[n:b].view(np.uint32) == POISON_BITS).all(), f"n={n}: padding rows computed"
            else:  # padding rows zeroed, computed from zeros
                assert np.isfinite(out[:b]).all(), f"n={n}: NaN in bucket {b}, seed {rng.seed_used}"
            x.close()
        assert (bg.stats["computed"] == bg.stats["rows"]) == (kind is RowCountBuckets)
    eager.close()


@pytest.mark.parametrize("bands", [None, "plans"])
def test_a_device_shaped_exec_serves_every_n_in_random_order(model, stream, rng, bands):
    """One exec: the head cuts rms_scale's grid to n blocks and scale_residual's to ceil(n / 2),
    and both row counts to n (what the recording found); rows >= n are never written, n = 0 runs
    nothing."""
    eager = Eager(model, stream)
    with DeviceShapedGraph(model, MAX, stream, bands=bands) as dsg:
        assert [(e.param, e.factor, e.axis, e.rows_per_block) for e in dsg.entries] == [
            ("nrows", 1, 0, 1),
            ("n", WIDTH, 0, 2),
        ]  # 256 threads over 128 values a row
        xh = random_input(rng, (MAX, WIDTH))
        dsg.input.copy_from_host(xh, stream)
        ns = [int(n) for n in rng.permutation(np.arange(0, MAX + 1))]
        for n in ns:
            dsg.output.poison(stream)
            dsg.run(n, stream)
            got = dsg.output.to_numpy(stream)
            assert dsg.check_status(stream) == n
            assert (got[n:].view(np.uint32) == POISON_BITS).all(), f"n={n}: rows >= n were written"
            if n:
                np.testing.assert_array_equal(got[:n], eager(xh[:n]), err_msg=f"n={n}, seed {rng.seed_used}")
                assert rel_err(got[:n], model.reference(xh[:n])) < 1e-5, f"n={n}, seed {rng.seed_used}"
        assert dsg.replays == len(ns)
    eager.close()


@pytest.mark.parametrize(
    "table,shape", [("graph", "buckets"), ("copy", "buckets"), ("params", "buckets"), (None, "device")]
)
def test_slot_pools_match_each_request_alone(model, stream, rng, table, shape):
    """Over a random join/leave trace every request equals its own steps alone (float64), and a
    pool shaped on the device gives the bucket pool's bits (the kernels compute each row alone)."""
    steps, slots = 300, 16
    reqs = _trace(rng, steps, slots, max_len=20)
    rows = [random_input(rng, (WIDTH,)) for _ in reqs]
    with SlotPool(model, max_slots=slots, table=table, shape=shape, stream=stream) as pool:
        assert pool.gather == "kernels"  # user kernels take no row table
        final = _drive(pool, reqs, rows, steps)
    want = _expected(model, reqs, rows, steps)
    assert len(final) == len(reqs) > 50
    worst = max(float(np.linalg.norm(final[i] - want[i]) / np.linalg.norm(want[i])) for i in final)
    assert worst < 1e-4, f"worst rel err {worst:.2e}, seed {rng.seed_used}"
    if shape == "device":
        with SlotPool(model, max_slots=slots, table="copy", stream=stream) as buckets:
            other = _drive(buckets, reqs, rows, steps)
        for i in final:
            assert final[i].tobytes() == other[i].tobytes(), f"request {i}, seed {rng.seed_used}"
