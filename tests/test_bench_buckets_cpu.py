"""``rawgraph bench buckets``' target rows, from a made-up result (no GPU): each device-shaped
strategy (one band, and bands from the plans) gets its memory, graph-memory, set-up and latency
rows, computed from the figures given."""

from __future__ import annotations

import pytest

from rawgraph.bench.buckets import targets

MiB = 1 << 20


def _result():
    def curve(scale):
        return {str(n): {"median": scale * (10.0 + n)} for n in (1, 8, 64)}

    setup = {"capture": 0.01, "instantiate": 0.002, "warmup": 0.001, "upload": 0.0005, "attributes": 0.0001}
    return {
        "weights_bytes": 64 * MiB,
        "strategies": {
            "vllm": {
                "buckets": 35,
                "memory": {"device_growth": 12 * MiB, "graphs": 6 * MiB},
                "setup_s": {"capture": 0.02, "instantiate": 0.004, "warmup": 0.002, "upload": 0.001},
            },
            "device": {"memory": {"device_growth": 26 * MiB, "buffers": 7 * MiB}, "setup_s": setup},
            "device_bands": {
                "memory": {"device_growth": 8 * MiB, "buffers": 7.5 * MiB},
                "setup_s": {**setup, "bands": 0.3},
            },
        },
        "uniform": {"exact": curve(1.0), "vllm": curve(1.1), "device": curve(3.0), "device_bands": curve(1.02)},
    }


def test_each_device_shaped_strategy_gets_its_rows():
    rows = {r["target"]: r for r in targets(_result())}
    one = "device-shaped"
    banded = "banded device-shaped"
    assert rows[f"memory: {one} (1 exec) <= 0.1x the vLLM buckets (35)"]["value"] == pytest.approx(26 / 12)
    assert rows[f"memory: {one}, beyond its buffers <= 0.1x vLLM graphs"]["value"] == pytest.approx(19 / 6)
    assert rows[f"memory: {banded}, beyond its buffers <= 0.1x vLLM graphs"]["value"] == pytest.approx(0.5 / 6)
    assert rows[f"memory: {banded}, beyond its buffers <= 0.1x vLLM graphs"]["met"]
    lat = rows[f"latency: {one} <= 1.05x exact-size graph at every n"]
    assert lat["value"] == pytest.approx(3.0) and not lat["met"]
    lat = rows[f"latency: {banded} <= 1.05x exact-size graph at every n"]
    assert lat["value"] == pytest.approx(1.02) and lat["met"]
    setup = rows[f"setup: {banded} <= 0.1x the vLLM buckets"]
    assert setup["value"] == pytest.approx(0.3136 / 0.027, rel=1e-6) and not setup["met"]  # the signatures count
    setup = rows[f"setup: {one} <= 0.1x the vLLM buckets"]
    assert setup["value"] == pytest.approx(0.0136 / 0.027, rel=1e-6)


def test_every_target_name_fits_the_report_column():
    assert all(len(r["target"]) <= 70 for r in targets(_result()))


def test_a_strategy_that_was_not_built_gets_no_rows():
    r = _result()
    del r["strategies"]["device_bands"], r["uniform"]["device_bands"]
    assert not [row for row in targets(r) if "banded" in row["target"]]


def test_the_report_shows_what_the_banded_exec_adds_per_n():
    from rawgraph.bench.buckets import report

    def st(v):
        return {"median": v, "p10": v, "p90": v}

    du = {
        "nodes": 16,
        "device_shaped_replay_us": st(700.0),
        "exact_replay_us": st(350.0),
        "device_update_us_per_node": 21.875,
        "host_setparams_us_per_call": st(0.5),
        "banded": {
            "nodes": 144,
            "bands": [1, 2, 256],
            "by_n": {"1": {"banded_us": st(60.0), "exact_us": st(51.2), "added_us_per_node": 8.8 / 144}},
        },
    }
    text = report(
        {"strategies": {}, "decode": {}, "padding_waste": {}, "uniform": {}, "device_update": du, "targets": []}
    )
    assert "banded (3 bands, 144 nodes) against the exact-size exec:" in text
    assert "n=   1:     60.0 vs     51.2 us (+0.061 us per node)" in text
    assert max(len(line) for line in text.splitlines()) <= 100
