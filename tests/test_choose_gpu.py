"""Measured-cost choice on the GPU (issue 25, item 4): over a TinyBlock w256 fused and a short
trace, choose_strategy times every strategy and picks one of them."""

from __future__ import annotations

import pytest

from rawgraph import TinyBlock
from rawgraph.serving import choose_strategy, regret
from rawgraph.serving.choose import DEFAULT_CANDIDATES

pytestmark = pytest.mark.gpu


def test_choice_over_tinyblock_w256_fused(device, stream, rng):
    max_batch = 64
    sample = [int(n) for n in rng.integers(1, max_batch + 1, size=16)]
    with TinyBlock(256, 1, 2, seed=7, form="fused") as model:
        ch = choose_strategy(model, sample, max_batch, stream=stream, seconds=0.05)
    assert ch.name in DEFAULT_CANDIDATES
    assert set(ch.seconds) | set(ch.skipped) == set(DEFAULT_CANDIDATES)
    assert ch.name in ch.seconds
    assert all(t > 0 for t in ch.seconds.values()) and all(t > 0 for t in ch.per_step.values())
    assert all(m is None or m > 0 for m in ch.memory.values())
    assert ch.seconds[ch.name] == min(ch.seconds.values())
    assert regret(ch.name, ch.seconds) == 0.0


def test_budget_skips_the_larger_candidates(device, stream):
    with TinyBlock(256, 1, 2, seed=7, form="fused") as model:
        full = choose_strategy(model, [1, 5, 17, 64], 64, stream=stream, seconds=0.02)
        # from the objects' own buffers (deterministic), not cuMemGetInfo deltas (bucket graphs)
        sizes = [v for k, v in full.memory.items() if k in ("reshaped", "device_shaped") and v is not None]
        if not sizes:
            pytest.skip(f"neither buffer-sized candidate was built: {full.skipped}")
        budget = min(sizes)
        ch = choose_strategy(model, [1, 5, 17, 64], 64, memory_budget=budget, stream=stream, seconds=0.02)
    assert ch.memory[ch.name] is not None and ch.memory[ch.name] <= budget
    assert all("over budget" in r for k, r in ch.skipped.items() if k not in full.skipped)
