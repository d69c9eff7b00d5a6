"""Measured-cost choice (issue 25, item 4) without a GPU: stub candidates and an injected timer
drive choose_strategy's logic; regret arithmetic; bad input refused with typed errors."""

from __future__ import annotations

import pytest

from rawgraph.runtime.errors import RawgraphError, ShapeError
from rawgraph.serving import Choice, ChooseError, choose_strategy, regret
from rawgraph.serving.choose import DEFAULT_CANDIDATES, footprint


class Stub:
    """A candidate: ``memory`` dict or ``nbytes``, ``run(x, n, stream)``, ``close``."""

    def __init__(self, log, name, nbytes=1000, as_dict=False, fail_run=False):
        self.log, self.name, self.fail_run = log, name, fail_run
        if as_dict:
            self.memory = {
                "weights": 10**9,
                "io": nbytes // 2,
                "workspace": nbytes - nbytes // 2,
                "allocated": 0,
                "graphs": 0,
            }
        else:
            self.nbytes = nbytes
        self.runs = []
        self.closed = 0
        log.append(("built", name))

    def run(self, x, n, stream=None):
        if self.fail_run:
            raise RuntimeError("boom")
        self.runs.append(n)

    def close(self):
        self.closed += 1
        self.log.append(("closed", self.name))


def _factories(log, built, spec):
    """spec: name -> dict of Stub kwargs, or an exception to raise while building."""

    def make(name, kw):
        def factory(model, max_batch, stream):
            if isinstance(kw, BaseException):
                raise kw
            built[name] = s = Stub(log, name, **kw)
            return s

        return factory

    return {name: make(name, kw) for name, kw in spec.items()}


def _fake_timer(costs, calls=None):
    def timer(name, adapter, sample):
        for n in sample:  # drive the adapter as the real timer does
            adapter.step(n)
        adapter.sync()
        if calls is not None:
            calls.append(name)
        c = costs[name]
        if isinstance(c, BaseException):
            raise c
        return c

    return timer


SAMPLE = [1, 3, 7, 8, 2, 64]


def test_fastest_fitting_is_picked_and_every_candidate_closed():
    log, built = [], {}
    fac = _factories(log, built, {"a": {}, "b": {"as_dict": True}, "c": {}, "d": {}})
    ch = choose_strategy(None, SAMPLE, 64, candidates=fac, timer=_fake_timer({"a": 3.0, "b": 1.0, "c": 2.0, "d": 4.0}))
    assert isinstance(ch, Choice) and ch.name == "b"
    assert ch.seconds == {"a": 3.0, "b": 1.0, "c": 2.0, "d": 4.0}
    assert ch.per_step["b"] == pytest.approx(1.0 / len(SAMPLE))
    assert ch.skipped == {} and ch.sample_len == len(SAMPLE)
    assert ch.memory["b"] == 1000  # weights not counted
    assert ch.speedup("d") == pytest.approx(4.0)
    assert all(s.closed == 1 for s in built.values()) and set(built) == set("abcd")
    assert all(s.runs == SAMPLE for s in built.values())
    # one at a time: each closed before the next is built
    assert log == [(e, n) for n in "abcd" for e in ("built", "closed")]


def test_over_budget_skipped_with_reason_and_closed():
    log, built, calls = [], {}, []
    fac = _factories(
        log, built, {"small": {"nbytes": 100}, "big": {"nbytes": 10_000}, "bigdict": {"nbytes": 5000, "as_dict": True}}
    )
    ch = choose_strategy(
        None,
        SAMPLE,
        64,
        memory_budget=1000,
        candidates=fac,
        timer=_fake_timer({"small": 5.0, "big": 1.0, "bigdict": 1.0}, calls),
    )
    assert ch.name == "small"
    assert set(ch.skipped) == {"big", "bigdict"}
    assert "over budget" in ch.skipped["big"] and "10000" in ch.skipped["big"]
    assert calls == ["small"]  # over-budget ones are never timed
    assert all(s.closed == 1 for s in built.values())
    with pytest.raises(ChooseError, match="no candidate fits"):
        choose_strategy(None, SAMPLE, 64, memory_budget=10, candidates=fac, timer=_fake_timer({}))
    assert all(s.closed == 1 for s in built.values())


def test_a_candidate_raising_while_building_or_timing_is_skipped_and_the_rest_closed():
    log, built = [], {}
    fac = _factories(
        log,
        built,
        {"ok": {}, "nobuild": ValueError("no row count"), "norun": {"fail_run": True}, "badtimer": {}, "slow": {}},
    )
    ch = choose_strategy(
        None,
        SAMPLE,
        64,
        candidates=fac,
        timer=_fake_timer({"ok": 2.0, "badtimer": KeyError("x"), "slow": 9.0, "norun": 0.1}),
    )
    assert ch.name == "ok" and set(ch.seconds) == {"ok", "slow"}
    assert "failed to build" in ch.skipped["nobuild"] and "no row count" in ch.skipped["nobuild"]
    assert "failed to run" in ch.skipped["norun"] and "boom" in ch.skipped["norun"]
    assert "failed to run" in ch.skipped["badtimer"]
    assert set(built) == {"ok", "norun", "badtimer", "slow"}
    assert all(s.closed == 1 for s in built.values())


def test_an_interrupt_still_closes_the_candidate_built():
    log, built = [], {}
    fac = _factories(log, built, {"a": {}, "b": {}})
    with pytest.raises(KeyboardInterrupt):
        choose_strategy(None, SAMPLE, 64, candidates=fac, timer=_fake_timer({"a": 1.0, "b": KeyboardInterrupt()}))
    assert all(s.closed == 1 for s in built.values()) and set(built) == {"a", "b"}


def test_nonpositive_time_is_skipped():
    log, built = [], {}
    fac = _factories(log, built, {"a": {}, "b": {}})
    ch = choose_strategy(None, SAMPLE, 64, candidates=fac, timer=_fake_timer({"a": 0.0, "b": 1.0}))
    assert ch.name == "b" and "timer gave" in ch.skipped["a"]


def test_regret_arithmetic():
    t = {"buckets": 1.03, "rowcount": 1.0, "reshaped": 2.0}
    assert regret("rowcount", t) == 0.0
    assert regret("buckets", t) == pytest.approx(0.03)
    assert regret("reshaped", t) == pytest.approx(1.0)
    with pytest.raises(ChooseError):
        regret("device_shaped", t)
    with pytest.raises(ChooseError):
        regret("a", {"a": 1.0, "b": 0.0})
    with pytest.raises(ChooseError):
        regret("a", {"a": 1.0, "b": float("nan")})
    with pytest.raises(TypeError):
        regret("a", {"a": "1"})


@pytest.mark.parametrize(
    "sample,exc",
    [
        ([], ChooseError),
        ([0], ShapeError),
        ([65], ShapeError),
        ([1, -3], ShapeError),
        ([1.5], TypeError),
        ([True], TypeError),
    ],
)
def test_bad_sample_refused_before_anything_is_built(sample, exc):
    log, built = [], {}
    fac = _factories(log, built, {"a": {}})
    with pytest.raises(exc):
        choose_strategy(None, sample, 64, candidates=fac, timer=_fake_timer({"a": 1.0}))
    assert built == {}


@pytest.mark.parametrize(
    "kwargs,exc",
    [
        ({"memory_budget": -1}, ChooseError),
        ({"memory_budget": "1GB"}, TypeError),
        ({"max_batch": 0}, ShapeError),
        ({"max_batch": 2.0}, TypeError),
        ({"seconds": 0}, ChooseError),
        ({"candidates": ["buckets", "nope"]}, ChooseError),
        ({"candidates": {}}, ChooseError),
        ({"candidates": {"a": 3}}, ChooseError),
    ],
)
def test_bad_arguments_refused(kwargs, exc):
    args = {"max_batch": 64, "candidates": _factories([], {}, {"a": {}}), "timer": _fake_timer({"a": 1.0})}
    args.update(kwargs)
    with pytest.raises(exc):
        choose_strategy(None, [1, 2], **args)


def test_errors_are_rawgraph_and_value_errors():
    assert issubclass(ChooseError, RawgraphError) and issubclass(ChooseError, ValueError)


def test_default_candidates_are_the_serving_strategies():
    assert list(DEFAULT_CANDIDATES) == [
        "buckets",
        "rowcount",
        "reshaped",
        "device_shaped",
        "device_bands",
        "switch_sizes",
    ]


def test_footprint_reads_memory_dict_nbytes_or_buffers():
    class Buf:
        def __init__(self, n):
            self.nbytes = n

    class Reshaped:
        input, output, arena = Buf(10), Buf(20), Buf(5)

    class Bare:
        pass

    class Mem:
        memory = {"weights": 999, "io": 10, "workspace": 5, "allocated": 40, "graphs": 7}

    assert footprint(Mem()) == 47
    assert footprint(Reshaped()) == 35
    assert footprint(Bare()) is None


def test_the_bench_builds_the_model_it_is_told_to(monkeypatch, tmp_path):
    """``rawgraph bench choose --width W --layers L --form F`` builds TinyBlock(W, layers=L, form=F)
    (it once passed --layers as the batch and --max-batch as the layers: 256 layers a step)."""
    import rawgraph.models.tinyblock as tinyblock
    import rawgraph.runtime.device as device
    from rawgraph.bench import choose as bench

    seen = {}

    class Built(Exception):
        pass

    def fake_block(width, batch=None, layers=1, seed=0, form="unfused", **kw):
        seen.update(width=width, batch=batch, layers=layers, form=form)
        raise Built

    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(tinyblock, "TinyBlock", fake_block)
    with pytest.raises(Built):
        bench.main(["--width", "96", "--layers", "3", "--max-batch", "40", "--form", "block", "--out", str(tmp_path)])
    assert seen == {"width": 96, "batch": 1, "layers": 3, "form": "block"}
