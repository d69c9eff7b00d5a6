"""Bucket graphs, padding, the fallback, one arena, graph memory, and the re-shaping strategies
(BucketGraphs, RowCountBuckets, ReshapedGraph); their error and lifetime cases: bad batches and
sizes refused before the GPU, runs on two streams serialised, and a run on a new stream ordered
after one still queued on a stream closed since."""

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import (
    GPU_TO_ITSELF,
    device_inputs,
    eager_output,
    random_input,
    rel_err,
    spin_after_collecting,
    spin_ns,
    tiny_model,
)

from rawgraph import (
    BucketGraphs,
    ClosedError,
    DeviceArray,
    DeviceBuffer,
    DTypeError,
    LayoutError,
    NotOnDeviceError,
    ReshapedGraph,
    RowCountBuckets,
    ShapeError,
    Stream,
    TinyBlock,
    get_device,
    ops,
)
from rawgraph.runtime.errors import call
from rawgraph.runtime.memory import POISON_BITS
from rawgraph.serving import graph_memory, trim_graph_memory, vllm_sizes

pytestmark = pytest.mark.gpu
WIDTH, LAYERS, MAX = 128, 2, 64
SPIN_NS = spin_ns(200_000_000)  # 200 ms queued in front: long against the Python that follows a launch


@pytest.fixture(scope="module")
def model():
    m = TinyBlock(WIDTH, 1, LAYERS, seed=11, form="fused")
    yield m
    m.close()


@pytest.fixture(scope="module")
def weights_host(model):
    return model.weights_numpy()


def _exact(model, xh, stream):
    """The exact-size eager run of these rows: (output, the plan's per-launch cut)."""
    n = xh.shape[0]
    m = model.with_batch(n)
    x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((n, WIDTH))
    out.poison(stream)
    plan = m.plan(x, out)
    plan.run(stream)
    got = out.to_numpy(stream)
    return got, [(l.kernel.name, l.grid[:2]) for l in plan.launches]


def _cut(bg, b):
    return [(l.kernel.name, l.grid[:2]) for l in bg.graphs[b].plan.launches]


def _copy(dst_ptr, src_ptr, nbytes, stream):
    from cuda.bindings import driver

    from rawgraph.runtime.errors import call

    call(driver.cuMemcpyDtoDAsync, dst_ptr, src_ptr, nbytes, stream.handle)


def _stage(bg, xh, stream):
    """Poison the whole persistent input, then write the real rows: the padding starts as NaN."""
    bg.input.poison(stream)
    rows = DeviceBuffer.from_numpy(xh, stream=stream)
    _copy(bg.input.ptr, rows.ptr, rows.nbytes, stream)
    stream.synchronize()


@pytest.mark.parametrize("scratch", ["arena", "graph", "private"])
def test_every_n_through_the_buckets_equals_the_exact_size_run(model, weights_host, stream, rng, scratch):
    from rawgraph import reference_forward

    bg = BucketGraphs(model, max_batch=MAX, stream=stream, scratch=scratch)
    assert bg.sizes == vllm_sizes(MAX)
    if scratch != "graph":  # the eager runs before the captures: one per size that brought a new kernel function
        seen: set = set()
        brought = 0
        for b in reversed(bg.sizes):
            handles = {int(launch.kernel.handle) for launch in bg.graphs[b].plan.launches}
            brought += bool(handles - seen)
            seen |= handles
        assert (bg.warm_up.runs, bg.warm_up.skipped) == (brought, len(bg.sizes) - brought)
    ns = range(1, MAX + 1) if scratch == "arena" else sorted(set(rng.integers(1, MAX + 1, size=12).tolist()) | {1, MAX})
    same_cut = 0
    for n in ns:
        xh = random_input(rng, (n, WIDTH))
        _stage(bg, xh, stream)
        bg.output.poison(stream)
        res = bg.run(bg.input, n)  # the n real rows, a view of the output
        assert res.shape == (n, WIDTH) and res.ptr == bg.output.ptr
        out = bg.output.to_numpy(stream)
        b = bg.bucket_for(n)
        assert np.isfinite(out[:b]).all(), f"n={n}: NaN in the bucket's rows (padding not zeroed?)"
        assert rel_err(out[:n], reference_forward(xh, weights_host)) < 1e-5, f"n={n}, seed {rng.seed_used}"
        exact, cut = _exact(model, xh, stream)
        if cut == _cut(bg, b):
            same_cut += 1
            np.testing.assert_array_equal(out[:n], exact, err_msg=f"n={n} bucket {b}, same cut, not bit-equal")
        else:
            assert rel_err(out[:n], exact.astype(np.float64)) < 1e-5
    assert same_cut > 0
    assert bg.stats["runs"] == len(ns) and bg.stats["rows"] == sum(ns)
    bg.close()


def test_padding_can_never_change_a_real_row(model, stream, rng):
    zeroed = BucketGraphs(model, sizes=[16], stream=stream)
    raw = BucketGraphs(model, sizes=[16], stream=stream, zero_padding=False)
    xh = random_input(rng, (9, WIDTH))  # the vLLM PR's 9 requests padded to 16
    results = []
    for bg in (zeroed, raw):
        _stage(bg, xh, stream)
        bg.output.poison(stream)
        bg.run(bg.input, 9)
        results.append(bg.output.to_numpy(stream))
    np.testing.assert_array_equal(results[0][:9], results[1][:9])  # NaN padding changed nothing real
    assert np.isfinite(results[0]).all() and np.isnan(results[1][9:]).all()
    assert zeroed.padding_waste() == pytest.approx(7 / 16)
    for bg in (zeroed, raw):
        bg.close()


def test_above_the_largest_bucket_runs_in_chunks(model, weights_host, stream, rng):
    from rawgraph import reference_forward

    bg = BucketGraphs(model, sizes=[1, 8, 32], stream=stream)
    n = 2 * 32 + 5
    xh = random_input(rng, (n, WIDTH))
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    res = bg.run(x, n)
    assert res.shape == (n, WIDTH)
    got = np.empty((n, WIDTH), np.float32)
    from cuda.bindings import driver

    from rawgraph.runtime.errors import call

    call(driver.cuMemcpyDtoHAsync, got.ctypes.data, res.ptr, got.nbytes, stream.handle)
    stream.synchronize()
    assert rel_err(got, reference_forward(xh, weights_host)) < 1e-5, f"seed {rng.seed_used}"
    assert (bg.stats["fallback_runs"], bg.stats["fallback_chunks"], bg.stats["computed"]) == (1, 3, 32 + 32 + 8)
    # each chunk ran in its bucket: the same bits as running its rows alone
    bg.run(x, 5)  # rows 0..4 of x again
    alone = bg.output.to_numpy(stream)[:5]
    np.testing.assert_array_equal(got[:5], alone)
    bg.close()


def test_one_arena_replayed_in_random_order_stays_correct(model, stream, rng):
    bg = BucketGraphs(model, max_batch=MAX, stream=stream)
    cases = {}
    for n in rng.integers(1, MAX + 1, size=8):
        n = int(n)
        xh = random_input(rng, (n, WIDTH))
        cases[n] = (DeviceBuffer.from_numpy(xh, stream=stream), _exact(model, xh, stream)[0])
    order = rng.choice(list(cases), size=60)
    for step, n in enumerate(order):
        x, want = cases[int(n)]
        res = bg.run(x, int(n))
        got = np.empty_like(want)
        from cuda.bindings import driver

        from rawgraph.runtime.errors import call

        call(driver.cuMemcpyDtoHAsync, got.ctypes.data, res.ptr, got.nbytes, stream.handle)
        stream.synchronize()
        assert rel_err(got, want.astype(np.float64)) < 1e-5, f"step {step}, n={n}, seed {rng.seed_used}"
    bg.close()


def test_runs_on_two_streams_are_serialised(model, stream, rng):
    bg = BucketGraphs(model, sizes=[4, 16], stream=stream)
    a, b = Stream(), Stream()
    xa, xb = random_input(rng, (3, WIDTH)), random_input(rng, (13, WIDTH))
    da, db = DeviceBuffer.from_numpy(xa, stream=a), DeviceBuffer.from_numpy(xb, stream=b)
    want_a, want_b = _exact(model, xa, a)[0], _exact(model, xb, b)[0]
    keep = DeviceBuffer((3, WIDTH))
    spin_after_collecting(get_device(), 100_000_000, a)  # a's run waits 100 ms behind this
    res = bg.run(da, 3, stream=a)
    _copy(keep.ptr, res.ptr, keep.nbytes, a)  # a's result, before b runs
    bg.run(db, 13, stream=b)  # same arena and output: must not start before a's work is done
    assert not a.query()
    np.testing.assert_array_equal(keep.to_numpy(a), want_a)
    np.testing.assert_array_equal(bg.output.to_numpy(b)[:13], want_b)
    bg.close()


def test_bad_batches_are_refused_before_the_gpu(model, stream):
    bg = BucketGraphs(model, sizes=[4, 8], stream=stream)
    bg.output.poison(stream)
    x = DeviceBuffer((8, WIDTH))
    for n, err in ((0, ShapeError), (-3, ShapeError), (2.0, TypeError), (True, TypeError), (9, ShapeError)):
        with pytest.raises(err):
            bg.run(x, n)
    with pytest.raises(ShapeError, match="expected"):
        bg.run(DeviceBuffer((8, WIDTH + 1)), 4)
    with pytest.raises(DTypeError):
        bg.run(DeviceBuffer((8, WIDTH), np.float64), 4)
    with pytest.raises(NotOnDeviceError):
        bg.run(np.ones((8, WIDTH), np.float32), 4)
    assert bg.stats["runs"] == 0
    assert (bg.output.to_numpy(stream).view(np.uint32) == POISON_BITS).all()  # nothing ran
    bg.close()


@pytest.mark.skipif(not GPU_TO_ITSELF, reason="measures the device's free memory: other processes share this GPU")
def test_one_set_of_weights_and_one_arena_for_every_bucket(stream):
    big = TinyBlock(1024, 1, 8, seed=2, form="fused")
    dev = get_device()
    free0 = dev.memory_info()[0]
    bg = BucketGraphs(big, max_batch=256, stream=stream)
    used = free0 - dev.memory_info()[0]
    assert all(m.block_weights is big.block_weights for m in bg._models.values())
    arena = 5 * 256 * 1024 * 4
    assert bg.memory["workspace"] == arena and bg.memory["io"] == 2 * 256 * 1024 * 4
    # 35 buckets hold one arena and the persistent buffers, not 35 copies of the 64 MiB of weights
    assert used < big.block_weights.nbytes, (used, big.block_weights.nbytes)
    bg.close()
    big.close()


def test_graph_memory_is_reused_across_buckets_and_trimmed(model, stream, rng):
    from rawgraph.serving.graphmem import reset_high_water

    # Large enough that the buckets' scratch together (86 MB) is well over the pool's 32 MiB unit.
    big = TinyBlock(1024, 1, 1, seed=3, form="fused")
    base = trim_graph_memory()["reserved_current"]  # what other graphs still hold
    reset_high_water()
    bg = BucketGraphs(big, max_batch=256, stream=stream, scratch="graph")
    for b in bg.sizes:  # every bucket replayed, one after another on one stream
        bg.run(bg.input, b)
    stream.synchronize()
    mem = graph_memory()
    largest = 5 * 256 * 1024 * 4
    total = sum(5 * b * 1024 * 4 for b in bg.sizes)
    assert mem["used_high"] >= largest, mem
    # replayed one after another on one stream, the buckets share the largest one's pages
    assert mem["reserved_high"] < total, (mem, total)
    assert mem["reserved_current"] >= largest, mem  # the pool still holds the pages after the replays
    # Closed (the execs and their graph allocations gone) and trimmed: the pages go back to the
    # device. Without the trim the pool would keep them.
    bg.close()
    stream.synchronize()
    after = trim_graph_memory()
    assert after["reserved_current"] < mem["reserved_current"], (after, mem)
    assert after["reserved_current"] <= base, (after, base)  # all of this test's pages, not only some
    big.close()


def test_row_count_rebinding_matches_the_bucket_graphs(model, stream, rng):
    plain = BucketGraphs(model, max_batch=MAX, stream=stream)
    rows = RowCountBuckets(model, max_batch=MAX, stream=stream)
    for n in sorted(set(rng.integers(1, MAX + 1, size=16).tolist()) | {1, 9, MAX}):
        xh = random_input(rng, (n, WIDTH))
        x = DeviceBuffer.from_numpy(xh, stream=stream)
        for bg in (plain, rows):
            bg.output.poison(stream)
            bg.input.poison(stream)
            bg.run(x, n)
        want = plain.output.to_numpy(stream)[:n]
        got = rows.output.to_numpy(stream)
        # same kernels and cut, bounded to n rows: the same bits; the padding rows were never written
        np.testing.assert_array_equal(got[:n], want, err_msg=f"n={n}")
        b = rows.bucket_for(n)
        assert (got[n:b].view(np.uint32) == POISON_BITS).all(), f"n={n}: padding rows computed"
    assert rows.stats["computed"] == rows.stats["rows"]  # no padding arithmetic
    plain.close()
    rows.close()


def test_one_reshaped_graph_serves_every_batch_size(model, stream, rng):
    rg = ReshapedGraph(model, max_batch=MAX, stream=stream)
    for n in list(range(1, MAX + 1)) + [MAX, 1, 1]:
        xh = random_input(rng, (n, WIDTH))
        rg.output.poison(stream)
        rg.run(DeviceBuffer.from_numpy(xh, stream=stream), n)
        exact, _ = _exact(model, xh, stream)
        # the exec runs exactly the plan that size would have: the same bits
        np.testing.assert_array_equal(rg.output.to_numpy(stream)[:n], exact, err_msg=f"n={n}")
    pushes = rg.pushes
    rg.run(rg.input, 1)  # the same size again: nothing to push
    assert rg.pushes == pushes
    rg.close()


def test_reshaped_graph_refuses_bad_sizes_and_a_partly_overlapping_x(stream, rng, monkeypatch):
    model = tiny_model(rng, batch=4)
    rg = ReshapedGraph(model, max_batch=4, stream=stream)
    copies = []
    real = driver.cuMemcpyDtoDAsync
    monkeypatch.setattr(driver, "cuMemcpyDtoDAsync", lambda *a: copies.append(a) or real(*a))
    for n in (0, 5, -1):
        with pytest.raises(ShapeError, match="1..max_batch"):
            rg.reshape(n)
    with pytest.raises(TypeError):
        rg.reshape(True)
    f32 = np.dtype(np.float32)
    shifted = DeviceArray(rg.input.ptr + model.width * 4, (3, model.width), f32, rg.input)
    with pytest.raises(LayoutError, match="overlaps"):
        rg.run(shifted, 3)
    assert copies == [], "a refused run reached the driver"
    # x that is the persistent input itself runs without a copy
    xh = random_input(rng, (4, model.width))
    rg.input.copy_from_host(xh, stream)
    y = rg.run(DeviceArray(rg.input.ptr, (4, model.width), f32, rg.input), 4)
    assert copies == [] and y.ptr == rg.output.ptr
    np.testing.assert_array_equal(
        rg.output.to_numpy(stream), eager_output(model, DeviceBuffer.from_numpy(xh, stream=stream), stream)
    )
    rg.close()
    with pytest.raises(ClosedError):
        rg.reshape(2)


# -- a run on a closed stream -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["buckets", "row_count", "reshaped"])
def test_a_run_on_a_new_stream_waits_for_one_queued_on_a_closed_stream(device, stream, rng, kind):
    model = tiny_model(rng, batch=4)
    _, (x1, x2) = device_inputs(rng, model, 2, stream)
    want = eager_output(model, x2, stream)
    served = {
        "buckets": lambda: BucketGraphs(model, sizes=[4], stream=stream),
        "row_count": lambda: RowCountBuckets(model, sizes=[4], stream=stream),
        "reshaped": lambda: ReshapedGraph(model, max_batch=4, stream=stream),
    }[kind]()
    stream.synchronize()
    t = Stream()
    ops.spin(device, SPIN_NS)(t)
    served.run(x1, 4, stream=t)
    t.close()  # cuStreamDestroy returns with the spin and the run still queued
    u = Stream()
    served.run(x2, 4, stream=u)
    got = served.output.to_numpy(u)[:4]
    call(driver.cuCtxSynchronize)  # everything, the closed stream's run included
    after = served.output.to_numpy(stream)[:4]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(after, got, err_msg="the run on the closed stream ran after the later one")
    served.close()
    u.close()
