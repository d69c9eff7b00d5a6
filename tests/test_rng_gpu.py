"""Graph-safe Philox RNG on the GPU: exact against the NumPy reference, fresh numbers every replay,
eager == replay for the same state, shared generators, seed reset, dropout in the TinyBlock."""

import numpy as np
import pytest
from helpers import bench_script, random_input, rel_err

from rawgraph import DeviceBuffer, TinyBlock, capture_plan
from rawgraph.control import (
    PhiloxGenerator,
    blocks_for,
    noisy_plan,
    reference_noisy_forward,
    reference_numbers,
    uniform24,
)
from rawgraph.runtime.errors import CaptureRefusedError, ClosedError

pytestmark = pytest.mark.gpu


def _seed(rng):
    return int(rng.integers(0, 2**63, dtype=np.uint64)) * 2 + int(rng.integers(0, 2))


def _run(fn, out, stream):
    out.poison(stream)
    fn(stream)
    return out.to_numpy(stream)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("n,offset", [(4099, 0), (1, 7), (4096, (1 << 32) - 3), (1000, 2**64 - 2)])
def test_device_numbers_equal_the_numpy_reference_exactly(stream, rng, n, offset, pdl):
    seed = _seed(rng)
    gen = PhiloxGenerator(seed, stream, offset)
    out = DeviceBuffer((n,), np.uint32)
    plan = gen.draw_plan(out, pdl=pdl)
    got = _run(plan.run, out, stream)
    assert np.array_equal(got, reference_numbers(seed, offset, n)), f"seed {rng.seed_used}"
    assert gen.get_state(stream) == (seed, (offset + blocks_for(n)) % 2**64)


def test_uniforms_are_the_reference_bits_and_pass_statistics(stream, rng):
    seed, offset, n = _seed(rng), int(rng.integers(0, 2**40)), 1 << 20
    gen = PhiloxGenerator(seed, stream, offset)
    out = DeviceBuffer((n,), np.float32)
    u = _run(gen.draw_plan(out, kind="uniform").run, out, stream)
    assert np.array_equal(u.view(np.uint32), uniform24(reference_numbers(seed, offset, n)).view(np.uint32))
    v = u.astype(np.float64)
    assert v.min() >= 0.0 and v.max() < 1.0
    assert abs(v.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n), f"mean {v.mean()}, seed {rng.seed_used}"
    assert abs(v.var() - 1 / 12) < 6 * np.sqrt(1 / 180 / n), f"var {v.var()}, seed {rng.seed_used}"
    counts = np.bincount((v * 256).astype(np.int64), minlength=256)
    chi2 = float(((counts - n / 256) ** 2 / (n / 256)).sum())
    assert chi2 < 255 + 6 * np.sqrt(2 * 255), f"chi2 {chi2} over 256 bins, seed {rng.seed_used}"


def test_replays_draw_fresh_numbers_and_match_eager_at_the_same_offsets(stream, rng):
    seed, off0, n = _seed(rng), int(rng.integers(0, 2**40)), 2050
    gen = PhiloxGenerator(seed, stream, off0)
    out = DeviceBuffer((n,), np.uint32)
    plan = gen.draw_plan(out)
    exe = capture_plan(plan, stream).instantiate()  # the warm-up run advanced the state...
    gen.set_state(seed, stream, off0)  # ...so start again from off0
    replays = [_run(exe.launch, out, stream) for _ in range(3)]
    nb = blocks_for(n)
    for i, r in enumerate(replays):
        assert np.array_equal(r, reference_numbers(seed, off0 + i * nb, n)), f"replay {i}, seed {rng.seed_used}"
    assert not np.array_equal(replays[0], replays[1]) and not np.array_equal(replays[1], replays[2])
    assert gen.get_state(stream) == (seed, off0 + 3 * nb)
    gen.set_state(seed, stream, off0)
    eager = [_run(plan.run, out, stream) for _ in range(3)]
    for e, r in zip(eager, replays):
        assert np.array_equal(e, r)


def test_two_graphs_sharing_a_generator_never_repeat(stream, rng):
    seed = _seed(rng)
    gen = PhiloxGenerator(seed, stream, 0)
    outs = {"a": DeviceBuffer((1000,), np.uint32), "b": DeviceBuffer((776,), np.uint32)}
    execs = {k: capture_plan(gen.draw_plan(o), stream).instantiate() for k, o in outs.items()}
    gen.set_state(seed, stream, 0)
    order = ["a", "b", "a", "a", "b", "b", "a"]
    offset, blocks = 0, []
    for k in order:
        got = _run(execs[k].launch, outs[k], stream)
        n = outs[k].size
        assert np.array_equal(got, reference_numbers(seed, offset, n)), f"{k} at offset {offset}"
        blocks += [tuple(b) for b in got.reshape(-1, 4)]
        offset += blocks_for(n)
    assert len(set(blocks)) == len(blocks) == offset  # every 4-word block drawn once
    assert gen.get_state(stream) == (seed, offset)


def test_resetting_the_seed_reproduces_the_sequence(stream, rng):
    seed, other = _seed(rng), _seed(rng)
    gen = PhiloxGenerator(seed, stream, 0)
    out = DeviceBuffer((512,), np.uint32)
    exe = capture_plan(gen.draw_plan(out), stream).instantiate()

    def sequence(s):
        gen.set_state(s, stream, 0)
        return [_run(exe.launch, out, stream) for _ in range(4)]

    first = sequence(seed)
    again = sequence(seed)
    for a, b in zip(first, again):
        assert np.array_equal(a, b)
    different = sequence(other)
    assert not any(np.array_equal(a, b) for a, b in zip(first, different))


def test_state_write_is_refused_on_a_capturing_stream(stream):
    gen = PhiloxGenerator(1, stream)
    out = DeviceBuffer((16,), np.uint32)
    from rawgraph import Capture

    with pytest.raises(CaptureRefusedError):
        with Capture(stream) as cap:
            cap.run(gen.draw_plan(out))
            gen.set_state(2, stream)
    assert gen.get_state(stream) == (1, 0)  # nothing ran: the capture was discarded


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("width,batch,layers,p", [(256, 8, 2, 0.25), (129, 3, 3, 0.5)])
def test_dropout_block_matches_float64_reference_with_the_same_mask(stream, rng, width, batch, layers, p, pdl):
    model = TinyBlock(width, batch, layers, seed=int(rng.integers(1 << 30)), form="unfused", pdl=pdl)
    seed, off0 = _seed(rng), int(rng.integers(0, 2**40))
    gen = PhiloxGenerator(seed, stream, off0)
    xh = random_input(rng, (batch, width))
    x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((batch, width))
    plan = noisy_plan(model, x, out, gen, p=p)
    assert len(plan) == layers * 5 + 1
    weights = model.weights_numpy(stream)
    nb = layers * blocks_for(batch * width)
    eager = _run(plan.run, out, stream)
    assert rel_err(eager, reference_noisy_forward(xh, weights, seed, off0, p)) < 1e-5, f"seed {rng.seed_used}"
    exe = capture_plan(plan, stream, warmup=False).instantiate()
    gen.set_state(seed, stream, off0)
    first = _run(exe.launch, out, stream)
    assert np.array_equal(first.view(np.uint32), eager.view(np.uint32))  # same state: same bits
    second = _run(exe.launch, out, stream)
    assert not np.array_equal(first, second)
    assert rel_err(second, reference_noisy_forward(xh, weights, seed, off0 + nb, p)) < 1e-5
    assert gen.get_state(stream) == (seed, off0 + 2 * nb)
    # The plain plan of the same model is untouched by the generator (dropout is off by default).
    plain = _run(model.plan(x, out).run, out, stream)
    assert rel_err(plain, model.reference(xh, stream)) < 1e-5
    assert gen.get_state(stream) == (seed, off0 + 2 * nb)


def test_noisy_plan_refusals(stream):
    gen = PhiloxGenerator(3, stream)
    x, out = DeviceBuffer((2, 64)), DeviceBuffer((2, 64))
    with pytest.raises(ValueError, match="noisy_plan needs the 'unfused' form") as info:
        noisy_plan(TinyBlock(64, 2, 1, form="fused"), x, out, gen, p=0.1)
    assert type(info.value) is ValueError
    model = TinyBlock(64, 2, 1, form="unfused")
    for bad in (1.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"drop probability p must be in \[0, 1\), got") as info:
            noisy_plan(model, x, out, gen, p=bad)
        assert type(info.value) is ValueError, bad
    with pytest.raises(ValueError, match="rounds to dropping everything") as info:
        noisy_plan(model, x, out, gen, p=1 - 2**-26)  # under 1, but its threshold rounds to 2^24
    assert type(info.value) is ValueError
    for bad in (True, "0.1", None):
        with pytest.raises(TypeError, match="p must be a float, got") as info:
            noisy_plan(model, x, out, gen, p=bad)
        assert type(info.value) is TypeError, bad
    assert gen.get_state(stream) == (3, 0)  # the refusals changed nothing
    gen.close()
    gen.close()  # safe twice
    with pytest.raises(ClosedError, match="PhiloxGenerator is closed") as info:
        noisy_plan(model, x, out, gen, p=0.1)
    assert type(info.value) is ClosedError
    model.close()


# -- the sanitizer target's Philox check, run here ---------------------------------------------------


def test_the_sanitize_philox_check_uses_the_seed_the_host_set(device, stream, rng):
    sanitize = bench_script("sanitize_kernels")
    checks = sanitize.Checker()
    sanitize.check_philox(checks, device, stream, rng)
    assert checks.failures == [], f"{checks.failures}, seed {rng.seed_used}"
