"""The benchmark report and progress helpers, on made-up results (no GPU)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from rawgraph.bench import report
from rawgraph.bench.progress import SweepProgress, duration, missing_extras

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _clock(median: float) -> dict:
    return {"median": median, "p10": median * 0.95, "p90": median * 1.2}


def _record(path, form, layers, width, batch, sync, **extra) -> dict:
    """A record as ``launch_paths.Runner.record`` writes it (host and device clocks below sync)."""
    rec = {
        "path": path,
        "form": form,
        "layers": layers,
        "width": width,
        "batch": batch,
        "sync_us": _clock(sync),
        "host_us": _clock(sync * 0.5),
        "device_us": _clock(sync * 0.7),
    }
    rec.update(extra)
    return rec


def fake_result() -> dict:
    recs = [
        _record("floor_sync", None, 0, 0, 0, 0.84),
        _record("floor_empty_kernel", None, 0, 0, 0, 10.49),
        _record("floor_empty_graph", None, 0, 0, 0, 6.59),
    ]
    for layers, width, batch, scale in ((1, 128, 1, 1.0), (64, 4096, 64, 1000.0)):
        key = (layers, width, batch)
        recs += [
            _record("stream", "unfused", *key, 22.32 * scale),
            _record("graph", "unfused", *key, 11.27 * scale, capture_ms=0.28, instantiate_ms=0.06, pdl=True),
            _record("graph_nopdl", "unfused", *key, 12.60 * scale, pdl=False),
            _record("graph_copy", "unfused", *key, 18.89 * scale),
            _record("graph_update", "unfused", *key, 14.64 * scale),
            _record("graph_exec_update", "unfused", *key, 16.01 * scale),
            _record("torch_eager", None, *key, 38.73 * scale, rel_err_vs_rawgraph=1e-7),
            _record("torch_graph", None, *key, 13.69 * scale, capture_ms=7.55),
            _record("torch_graph_copy", None, *key, 20.23 * scale),
            _record("cupy_eager", None, *key, 30.0 * scale, rel_err_vs_rawgraph=1e-7),
            _record("cupy_graph", None, *key, 12.0 * scale, note="CuPy RawKernels", rel_err_vs_cupy_eager=0.0),
        ]
    recs.append(
        {
            "path": "graph",
            "form": "fused",
            "layers": 1,
            "width": 128,
            "batch": 1,
            "sync_us": None,
            "host_us": None,
            "device_us": None,
        }
    )  # a record with no clocks (as record() allows)
    fit = {"points": [], "fit": {"fixed_us": 2.21, "per_node_us": 0.001}}
    micro = {
        "cuLaunchKernel": _clock(5.50),
        "cuLaunchKernelEx_pdl": _clock(4.22),
        "cuLaunchKernelEx_plain": _clock(5.03),
        "manager_bind_1_node": _clock(1.62),
        "manager_bind_same": _clock(0.31),
        "cuGraphLaunch": fit,
        "cuGraphExecKernelNodeSetParams": fit,
        "cuGraphExecUpdate": fit,
    }
    return {"env": {}, "grid": {}, "findings": [], "microcosts": micro, "records": recs, "wall_s": 1.0}


def _assert_fits(text: str) -> None:
    long = [line for line in text.splitlines() if len(line) > report.WIDTH]
    assert not long, f"{len(long)} lines over {report.WIDTH} columns, e.g. {long[0]!r}"


def test_table_fits_100_columns_and_keeps_the_values():
    result = fake_result()
    text = report.table(result)
    _assert_fits(text)
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("stream ") and " 128 " in line)
    assert row.split() == ["stream", "unfused", "1", "128", "1", "22.32", "21.2-26.8", "11.16", "15.62"]
    big = next(line for line in lines if line.startswith("torch_eager") and " 4096 " in line)
    assert "38730.00" in big and "36793.5-46476.0" in big
    assert any(line.startswith("graph_exec_update") for line in lines)
    # the second table: capture / instantiate and the break-even against the stream path
    built = [line for line in lines if line.startswith("graph ") and "replays" in line]
    gain = 22.32 - 11.27
    assert f"{(0.28 + 0.06) * 1e3 / gain:.0f} replays" in built[0] and "0.28" in built[0] and "0.06" in built[0]
    assert any(line.startswith("torch_graph ") and "7.55" in line for line in lines)
    assert "host cost per call: cuLaunchKernel 5.50 us" in text
    assert "cuGraphLaunch: 2.21 us + 0.001 us/node" in text
    assert "nan" in next(line for line in lines if line.startswith("graph ") and "fused  " in line)


@pytest.mark.parametrize("name", ["launch_paths_quick.json", "launch_paths.json"])
def test_table_of_a_recorded_run_fits(name):
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    _assert_fits(report.table(json.loads(path.read_text())))


def test_plots_without_matplotlib_say_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    assert report.plots(fake_result(), tmp_path, "x") == []
    assert "matplotlib not installed: plots skipped (pip install -e '.[bench]')" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_plots_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    written = report.plots(fake_result(), tmp_path, "x")
    assert [p.name for p in written] == ["x_vs_layers.png", "x_vs_width.png"]
    assert all(p.stat().st_size > 1000 for p in written)


# -- progress -----------------------------------------------------------------------------------


def test_duration():
    assert [duration(s) for s in (0.4, 59.6, 187, 3900)] == ["0s", "1m00s", "3m07s", "1h05m"]


def test_progress_plain_without_rich(monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)  # rich may be installed: hide it
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    buf = io.StringIO()
    bar = SweepProgress(3, "demo", plots=True, file=buf, use_rich=True)  # asks for rich, gets plain lines
    seen = []
    for item in bar.over(["a", "b", "c"]):
        bar.step(f"item={item}")
        bar.detail("cut 1/2")  # no line in plain mode
        assert not bar.rich
        seen.append(item)
    assert seen == ["a", "b", "c"]
    lines = buf.getvalue().splitlines()
    assert lines[0] == "rich not installed: plain progress lines (pip install -e '.[bench]')"
    assert lines[1] == "matplotlib not installed: no plots (pip install -e '.[bench]')"
    assert lines[2] == "[1/3] item=a (elapsed 0s, eta ?)"
    assert lines[3].startswith("[2/3] item=b (elapsed ") and ", eta " in lines[3]
    assert lines[4].startswith("[3/3] item=c")
    assert lines[5].startswith("demo: 3/3 done in ")
    assert len(lines) == 6


def test_progress_plain_on_a_pipe_even_with_rich():
    buf = io.StringIO()  # not a terminal: a log gets plain lines, not a bar
    with SweepProgress(2, "demo", file=buf) as bar:
        bar.step("one")
        assert not bar.rich
    assert "[1/2] one (elapsed 0s, eta ?)" in buf.getvalue()


def test_progress_rich_bar(capsys):
    pytest.importorskip("rich")
    buf = io.StringIO()
    bar = SweepProgress(3, "demo", file=buf, use_rich=True)
    for item in bar.over(["a", "b", "c"]):
        bar.step(f"item={item}")
        assert bar.rich
        bar.detail("cut 1/2")
        print(f"line {item}")  # shown above the bar (rich redirects stdout while it draws)
    assert not bar.rich  # stopped at the end of the loop
    out = buf.getvalue()
    assert "rich not installed" not in out
    assert "3/3" in out and "eta" in out and "demo" in out
    assert "line a" in out and "line c" in out
    assert capsys.readouterr().out == ""  # nothing leaked past the bar's console


def test_progress_stops_on_an_exception():
    pytest.importorskip("rich")
    buf = io.StringIO()
    stdout = sys.stdout
    bar = SweepProgress(3, "demo", file=buf, use_rich=True)
    with pytest.raises(RuntimeError):
        for item in bar.over("abc"):
            bar.step(item)
            raise RuntimeError("boom")
    assert not bar.rich and sys.stdout is stdout  # bar stopped, stdout given back


def test_missing_extras_lists_only_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)
    notes = missing_extras(plots=False)
    assert notes == ["rich not installed: plain progress lines (pip install -e '.[bench]')"]
