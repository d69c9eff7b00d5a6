"""Serving and control over any row-wise model (issue 22, item 3): BucketGraphs, RowCountBuckets,
ReshapedGraph, SlotPool, DepthLoop and NormGate over TinyBlock and over a second model made only
of user kernels (``examples/buckets_own_model.py``: RMSNormScale, two RawKernels and a scratch
array).

Every result is compared with the model's own eager plan run at the exact batch size: bit for bit
where the same kernels run with the same shapes (always for RMSNormScale, whose kernels compute
each row alone whatever the batch; for TinyBlock where its matmuls were cut the same way), and
always with the float64 reference. Inputs are fresh random rows (the seed is printed on failure),
outputs are poisoned before every run.
"""

import gc

import numpy as np
import pytest
from faultinject import FaultHook
from helpers import random_input, rel_err
from test_examples_cpu import load_example

from rawgraph import BucketGraphs, DeviceBuffer, LayoutError, ReshapedGraph, RowCountBuckets, SlotPool, TinyBlock
from rawgraph.control import DepthLoop, NormGate
from rawgraph.runtime.memory import POISON_BITS
from rawgraph.serving import pick_bucket

pytestmark = pytest.mark.gpu
WIDTH, MAX = 128, 32
MODELS = ("tinyblock", "rmsnorm")


def _rms():
    return load_example("buckets_own_model_class.py").RMSNormScale


def make_model(kind, batch=1, seed=7):
    if kind == "tinyblock":
        return TinyBlock(WIDTH, batch, 1, seed=seed, form="fused")
    return _rms()(WIDTH, batch, seed=seed)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    m = make_model(request.param)
    yield m
    m.close()


def _cut(plan):
    return [(l.kernel.name, l.grid[:2]) for l in plan.launches]


def bit_equal_expected(model, plan_a, plan_b):
    """RMSNormScale: each row is computed alone, whatever the batch; TinyBlock: when its matmuls
    were cut the same way."""
    return not isinstance(model, TinyBlock) or _cut(plan_a) == _cut(plan_b)


class Eager:
    """The model's own plan at each exact batch size (cached), run on host rows."""

    def __init__(self, model, stream):
        self.model, self.stream, self.models = model, stream, {}

    def plan(self, n):
        if n not in self.models:
            m = self.model.with_batch(n)
            x, out = DeviceBuffer((n, WIDTH)), DeviceBuffer((n, WIDTH))
            self.models[n] = (m, x, out, m.plan(x, out))
        return self.models[n][3]

    def __call__(self, rows):
        n = rows.shape[0]
        plan = self.plan(n)
        _m, x, out, _p = self.models[n]
        x.copy_from_host(np.ascontiguousarray(rows, np.float32), self.stream)
        out.poison(self.stream)
        plan.run(self.stream)
        return out.to_numpy(self.stream)

    def close(self):
        for m, x, out, _p in self.models.values():
            for obj in (m, x, out):
                obj.close()


def _ns(rng, top):
    return sorted(set(rng.integers(1, top + 1, size=10).tolist()) | {1, 3, top})


# -- bucket graphs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("scratch", ["arena", "graph", "private"])
def test_bucket_graphs_equal_the_exact_size_eager_plan(model, stream, rng, scratch):
    bg = BucketGraphs(model, max_batch=MAX, stream=stream, scratch=scratch)
    eager = Eager(model, stream)
    bit = 0
    for n in _ns(rng, MAX):
        xh = random_input(rng, (n, WIDTH))
        x = DeviceBuffer.from_numpy(xh, stream=stream)
        bg.input.poison(stream)
        bg.output.poison(stream)
        res = bg.run(x, n)
        assert res.shape == (n, WIDTH) and res.ptr == bg.output.ptr
        out = bg.output.to_numpy(stream)
        b = bg.bucket_for(n)
        assert np.isfinite(out[:b]).all(), f"n={n}: NaN in bucket {b} (padding not zeroed?), seed {rng.seed_used}"
        want = eager(xh)
        if bit_equal_expected(model, bg.graphs[b].plan, eager.plan(n)):
            bit += 1
            np.testing.assert_array_equal(out[:n], want, err_msg=f"n={n} bucket {b}, seed {rng.seed_used}")
        else:
            assert rel_err(out[:n], want) < 1e-5, f"n={n} bucket {b}, seed {rng.seed_used}"
        assert rel_err(out[:n], model.reference(xh)) < 1e-5, f"n={n}, seed {rng.seed_used}"
        x.close()
    assert bit > 0
    eager.close()
    bg.close()


def test_row_count_buckets_bound_both_models_to_the_live_rows(model, stream, rng):
    rc = RowCountBuckets(model, max_batch=MAX, stream=stream)
    eager = Eager(model, stream)
    for n in _ns(rng, MAX):
        xh = random_input(rng, (n, WIDTH))
        x = DeviceBuffer.from_numpy(xh, stream=stream)
        rc.input.poison(stream)
        rc.output.poison(stream)
        rc.run(x, n)
        out = rc.output.to_numpy(stream)
        b = rc.bucket_for(n)
        want = eager(xh)
        if bit_equal_expected(model, rc.graphs[b].plan, eager.plan(n)):
            np.testing.assert_array_equal(out[:n], want, err_msg=f"n={n} bucket {b}, seed {rng.seed_used}")
        else:
            assert rel_err(out[:n], want) < 1e-5, f"n={n} bucket {b}, seed {rng.seed_used}"
        assert rel_err(out[:n], model.reference(xh)) < 1e-5, f"n={n}, seed {rng.seed_used}"
        # every kernel was bounded to n rows: the padding rows of the output were never written
        assert (out[n:b].view(np.uint32) == POISON_BITS).all(), f"n={n}: padding rows computed"
        x.close()
    assert rc.stats["computed"] == rc.stats["rows"]
    eager.close()
    rc.close()


def test_one_reshaped_graph_runs_the_exact_plan_of_every_size(model, stream, rng):
    rs = ReshapedGraph(model, max_batch=MAX // 2, stream=stream)
    eager = Eager(model, stream)
    for n in _ns(rng, MAX // 2) + [1, MAX // 2]:
        xh = random_input(rng, (n, WIDTH))
        x = DeviceBuffer.from_numpy(xh, stream=stream)
        rs.output.poison(stream)
        rs.run(x, n)
        got = rs.output.to_numpy(stream)[:n]
        # the exec runs exactly the plan of size n: the same kernels, shapes and bits
        np.testing.assert_array_equal(got, eager(xh), err_msg=f"n={n}, seed {rng.seed_used}")
        assert rel_err(got, model.reference(xh)) < 1e-5
        x.close()
    eager.close()
    rs.close()


# -- slots -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,gather", [("rmsnorm", "kernels"), ("tinyblock", "kernels"), ("tinyblock", "fused")])
def test_slot_steps_equal_the_eager_plan_at_the_live_count(stream, rng, kind, gather):
    model = make_model(kind, seed=int(rng.integers(1 << 20)))
    sizes = [2, 4, 8]
    pool = SlotPool(model, max_slots=8, sizes=sizes, gather=gather, stream=stream)
    assert pool.gather == gather
    eager = Eager(model, stream)
    rows: dict[int, np.ndarray] = {}
    used: set[int] = set()
    for step in range(24):
        live = pool.live
        for slot in [s for s in live if rng.random() < 0.25]:
            np.testing.assert_array_equal(pool.leave(slot), rows.pop(slot))  # the state row it held
        for _ in range(int(rng.integers(0, 4))):
            if len(pool) < 8:
                r = random_input(rng, (WIDTH,))
                slot = pool.join(r)
                rows[slot] = r
                used.add(slot)
        live = pool.live
        if not live:
            assert pool.step() == 0
            continue
        n = len(live)
        prev = np.stack([rows[s] for s in live])
        want = eager(prev)
        b = pool.step()
        assert b == pick_bucket(sizes, n)
        state = pool.state.to_numpy(stream)
        got = state[live]
        if kind == "rmsnorm" or n == b:  # same kernels, same shapes (fused loads == gather kernels)
            np.testing.assert_array_equal(got, want, err_msg=f"step {step}, n={n}, seed {rng.seed_used}")
        else:
            assert rel_err(got, want) < 1e-5, f"step {step}, n={n}, seed {rng.seed_used}"
        assert rel_err(got, model.reference(prev)) < 1e-5, f"step {step}, n={n}, seed {rng.seed_used}"
        never = [s for s in range(8) if s not in used]
        assert (state[never].view(np.uint32) == POISON_BITS).all(), "a step wrote a slot nobody joined"
        rows.update(zip(live, got))
    assert pool.steps > 10
    eager.close()
    pool.close()
    model.close()


# -- control -----------------------------------------------------------------------------------------
class Flat:
    """A model seen without ``layer_plan``: DepthLoop repeats its whole plan (non-layered)."""

    def __init__(self, model):
        self._m = model

    def __getattr__(self, name):
        if name == "layer_plan":
            raise AttributeError(name)
        return getattr(self._m, name)


@pytest.mark.parametrize("capture", [False, True])
def test_a_non_layered_depth_loop_equals_its_plan_repeated(stream, rng, capture):
    batch, max_depth = 3, 3
    for kind in MODELS:
        model = make_model(kind, batch, seed=int(rng.integers(1 << 20)))
        xh = random_input(rng, (batch, WIDTH))
        x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((batch, WIDTH))
        loop = DepthLoop(Flat(model), x, out, max_depth=max_depth, capture=capture, stream=stream)
        a, b = DeviceBuffer((batch, WIDTH)), DeviceBuffer((batch, WIDTH))
        plans = (model.plan(a, b), model.plan(b, a))  # the eager ping-pong
        for d in [int(v) for v in rng.permutation(max_depth + 1)] + [max_depth + 2]:
            loop.set_depth(d, stream)
            out.poison(stream)
            loop.launch(stream)
            got = out.to_numpy(stream)
            eff = min(d, max_depth)
            a.copy_from_host(xh, stream)
            ref = xh.astype(np.float64)
            for i in range(eff):
                (b if i % 2 == 0 else a).poison(stream)
                plans[i % 2].run(stream)
                ref = model.reference(ref)
            want = (a if eff % 2 == 0 else b).to_numpy(stream)
            np.testing.assert_array_equal(got, want, err_msg=f"{kind} depth {d}, seed {rng.seed_used}")
            if eff:
                assert rel_err(got, ref) < 1e-5, f"{kind} depth {d}"
            else:
                np.testing.assert_array_equal(got, xh)
        loop.close()
        for buf in (x, out, a, b):
            buf.close()
        model.close()


@pytest.mark.parametrize("factor,runs", [(0.5, True), (2.0, False)])
def test_norm_gate_over_both_models(stream, rng, factor, runs):
    batch = 4
    for kind in MODELS:
        model = make_model(kind, batch, seed=int(rng.integers(1 << 20)))
        xh = random_input(rng, (batch, WIDTH))
        x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((batch, WIDTH))
        norm = float(np.linalg.norm(xh.astype(np.float64)))
        gate = NormGate(model, x, out, threshold=norm * factor)
        out.poison(stream)
        gate.launch(stream)
        got = out.to_numpy(stream)
        if runs:
            eager = DeviceBuffer((batch, WIDTH))
            eager.poison(stream)
            model.plan(x, eager).run(stream)
            np.testing.assert_array_equal(got, eager.to_numpy(stream), err_msg=f"{kind}, seed {rng.seed_used}")
            assert rel_err(got, model.reference(xh)) < 1e-5
            eager.close()
        else:
            np.testing.assert_array_equal(got, xh)
        gate.close()
        for buf in (x, out):
            buf.close()
        model.close()


# -- refusals ----------------------------------------------------------------------------------------
@pytest.fixture
def hook(device):
    """Creates and destroys of driver handles during the test (the kernel caches' modules are
    alive by design)."""
    import rawgraph.runtime.module as kernels
    import rawgraph.runtime.rawkernel as rawkernel

    gc.collect()
    h = FaultHook()
    h.exempt = lambda: {
        ("module", int(k.module.handle)) for k in [*kernels._kernels.values(), *rawkernel._loaded.values()]
    }
    h.install()
    try:
        yield h
    finally:
        h.uninstall()


class Hide:
    """A model without one attribute of the protocol."""

    def __init__(self, model, name):
        self._m, self._name = model, name

    def __getattr__(self, name):
        if name == self._name:
            raise AttributeError(name)
        return getattr(self._m, name)


@pytest.mark.parametrize("missing", ["with_batch", "make_workspace", "scratch_layout", "reference", "close"])
def test_a_model_missing_a_protocol_method_is_refused_before_anything_is_allocated(model, stream, hook, missing):
    x, out = DeviceBuffer((1, WIDTH)), DeviceBuffer((1, WIDTH))
    hook.live.clear()
    bad = Hide(model, missing)
    for make in (
        lambda: BucketGraphs(bad, sizes=[1, 2], stream=stream),
        lambda: RowCountBuckets(bad, sizes=[1, 2], stream=stream),
        lambda: ReshapedGraph(bad, max_batch=2, stream=stream),
        lambda: SlotPool(bad, max_slots=2, stream=stream),
    ):
        with pytest.raises(TypeError, match=missing):
            make()
    for make in (
        lambda: DepthLoop(Hide(model, "plan"), x, out, max_depth=2, stream=stream),
        lambda: NormGate(Hide(model, "device"), x, out, 1.0),
    ):
        with pytest.raises(TypeError, match="plan|device"):
            make()
    assert not hook.live, f"a refused model made driver objects: {hook.where(set(hook.live))}"
    x.close()
    out.close()


def test_row_count_buckets_refuse_a_model_naming_no_row_count_and_leak_nothing(stream, hook):
    class NoRowCountBlock(TinyBlock):
        def row_count_arg(self, launch):
            return None

    class NoRowCountRMS(_rms()):
        def row_count_arg(self, launch):
            return None

    for model in (NoRowCountBlock(WIDTH, 1, 1, seed=3, form="fused"), NoRowCountRMS(WIDTH, 1, seed=3)):
        stream.synchronize()
        gc.collect()
        before = dict(hook.leaked())
        with pytest.raises(TypeError, match="names no row-count argument"):
            RowCountBuckets(model, sizes=[2, 4], stream=stream)
        stream.synchronize()
        gc.collect()
        new = set(hook.leaked()) - set(before)
        assert not new, f"left allocated: {hook.where(new)}"
        model.close()


def test_slot_pool_refuses_fused_gather_for_user_kernels_and_leaks_nothing(stream, hook):
    model = _rms()(WIDTH, 1, seed=5)
    stream.synchronize()
    gc.collect()
    before = dict(hook.leaked())
    with pytest.raises(LayoutError, match="gather='kernels'"):
        SlotPool(model, max_slots=4, sizes=[4], gather="fused", stream=stream)
    stream.synchronize()
    gc.collect()
    assert not set(hook.leaked()) - set(before)
    model.close()
