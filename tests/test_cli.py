import subprocess
import sys

import pytest

from rawgraph.runtime.device import gpu_available


def _run(*args):
    return subprocess.run([sys.executable, "-m", "rawgraph", *args], capture_output=True, text=True, timeout=600)


def test_info_always_reports_nvrtc():
    r = _run("info")
    assert r.returncode == 0, r.stderr
    assert "nvrtc: 13." in r.stdout and "kernel cache:" in r.stdout
    if gpu_available():
        assert "compute capability:" in r.stdout
    else:
        assert "gpu: none" in r.stdout


def test_demo_without_gpu_says_so():
    if gpu_available():
        pytest.skip("this machine has a GPU; test_demo_on_gpu covers it")
    r = _run("demo")
    assert r.returncode == 69 and "needs a GPU" in r.stderr  # EX_UNAVAILABLE, not argparse's 2


@pytest.mark.gpu
def test_demo_on_gpu():
    r = _run("demo", "--width", "33", "--batch", "3", "--layers", "4")
    assert r.returncode == 0, r.stderr
    assert "relative error vs float64 NumPy" in r.stdout and "ok" in r.stdout


@pytest.mark.gpu
def test_seed_experiment():
    from rawgraph.bench.seed import run

    r = run(rounds=20)
    assert r["max_abs_diff"] == 0.0
    assert r["rel_err_vs_float64"] < 1e-5
    assert r["dynamic_shape_rejected"] == "ShapeError"
    # Every timed exec-update step (20 warm-up + 20 rounds) swapped the input: one push for each
    # of the 2 unfused nodes that read x (matmul1 of layer 0 and its residual add).
    assert r["driver_update_calls"] == 2 * (20 + 20)


# -- argument handling: parsed before any GPU is needed, so these hold on every machine ------------


def _no_gpu_here():
    if gpu_available():
        pytest.skip("this machine has a GPU: the command would run the benchmark")


def test_version():
    import rawgraph

    r = _run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"rawgraph {rawgraph.__version__}"


def test_bench_help_shows_the_default_suites_options():
    r = _run("bench", "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: rawgraph bench [paths]" in r.stdout
    for opt in ("--quick", "--budget", "--no-torch", "--layers"):
        assert opt in r.stdout
    assert "kernels" in r.stdout  # the other suites are named
    assert "needs a GPU" not in r.stderr


def test_bench_kernels_help():
    r = _run("bench", "kernels", "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: rawgraph bench kernels" in r.stdout and "--sweep" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "--quick"),
        ("bench", "--", "--quick"),
        ("bench", "paths", "--quick", "--width", "128"),
        ("bench", "kernels", "--sweep"),
        ("bench", "kernels", "--", "--sweep"),
    ],
)
def test_bench_options_reach_the_gpu_check(args):
    _no_gpu_here()
    r = _run(*args)
    assert r.returncode == 69, r.stderr
    assert "needs a GPU" in r.stderr
    assert "usage:" not in r.stderr and "error:" not in r.stderr  # no argparse complaint


def test_bench_bad_option_is_the_suites_error():
    r = _run("bench", "--no-such-option")
    assert r.returncode == 2
    assert "usage: rawgraph bench [paths]" in r.stderr
    assert "unrecognized arguments: --no-such-option" in r.stderr
    assert "needs a GPU" not in r.stderr  # the suite parser ran first


def test_bench_option_of_another_suite_is_refused():
    r = _run("bench", "kernels", "--quick")
    assert r.returncode == 2
    assert "rawgraph bench kernels: error: unrecognized arguments: --quick" in r.stderr


def test_bench_unknown_suite():
    r = _run("bench", "nope")
    assert r.returncode == 2
    assert "unknown suite 'nope'" in r.stderr and "paths" in r.stderr and "kernels" in r.stderr


@pytest.mark.parametrize("args", [("demo", "--no-such-option"), ("info", "--quick"), ("seed", "--quick")])
def test_other_commands_refuse_unknown_options(args):
    r = _run(*args)
    assert r.returncode == 2
    assert f"unrecognized arguments: {args[1]}" in r.stderr


def test_bench_suites_import_and_parse_in_a_fresh_process():
    """Every suite module imports and builds its parser (here, with no GPU: import needs none)."""
    probe = (
        "import importlib; from rawgraph.cli import BENCH_SUITES\n"
        "for name, (module, _) in BENCH_SUITES.items():\n"
        "    mod = importlib.import_module(module)\n"
        "    assert callable(mod.main) and vars(mod.build_parser().parse_args([])), name\n"
        "print(' '.join(BENCH_SUITES))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["paths", "kernels"]


# -- exit statuses, value checks, help -------------------------------------------------------------

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from rawgraph import cli  # noqa: E402
from rawgraph.bench import command  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


@pytest.fixture
def no_gpu(monkeypatch):
    """The machine as one without a driver, whatever this one has."""
    import rawgraph.runtime.device as device

    monkeypatch.setattr(device, "driver_status", lambda: (False, "no CUDA driver found (stand-in)"))
    monkeypatch.setattr(device, "gpu_available", lambda: False)


@pytest.fixture
def gpu_check_forbidden(monkeypatch):
    """Fails the test if anything asks whether there is a GPU."""

    def asked():
        raise AssertionError("the GPU check ran")

    monkeypatch.setattr(cli, "_need_gpu", asked)


def _parsers():
    """Every parser of the command line: (name, parser)."""
    top = cli.build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    out = [("rawgraph", top)] + [(f"rawgraph {n}", p) for n, p in sub.choices.items() if n != "bench"]
    import importlib

    for name, (module, _help) in cli.BENCH_SUITES.items():
        out.append((f"rawgraph bench {name}", importlib.import_module(module).build_parser()))
    out.append(("rawgraph bench report", importlib.import_module(cli.BENCH_REPORT[1]).build_parser()))
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ["demo"],
        ["dot"],
        ["seed"],
        ["doctor", "--demo"],
        ["bench"],
        ["bench", "kernels"],
        ["bench", "slots", "--json"],
        ["bench", "choose", "--steps", "10"],
    ],
)
def test_no_gpu_is_status_69_with_the_reason(argv, no_gpu, capsys):
    assert cli.main(argv) == command.EX_UNAVAILABLE == 69
    err = capsys.readouterr().err
    assert "needs a GPU: no CUDA driver found (stand-in)" in err


def test_help_documents_the_exit_statuses():
    r = _run("--help")
    assert r.returncode == 0
    flat = " ".join(r.stdout.split())
    assert "69 no CUDA driver or GPU for a command that needs one" in flat
    assert "2 a bad option or value" in flat


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--width", "-5"], "argument --width: must be a positive integer, got -5"),
        (["dot", "--layers", "0"], "argument --layers: must be a positive integer, got 0"),
        (["demo", "--batch", "two"], "argument --batch: must be a positive integer, got 'two'"),
        (["info", "--device", "-1"], "argument --device: must be an integer >= 0, got -1"),
        (["bench", "--budget", "0"], "argument --budget: must be a number > 0, got 0"),
        (["bench", "paths", "--width", "128", "-5"], "argument --width: must be a positive integer, got -5"),
        (["bench", "kernels", "--batch", "0"], "argument --batch: must be a positive integer, got 0"),
        (["bench", "buckets", "--rate", "-1"], "argument --rate: must be a number > 0, got -1"),
        (["bench", "slots", "--steps", "0"], "argument --steps: must be a positive integer, got 0"),
        (["bench", "choose", "--seconds", "inf"], "argument --seconds: must be a number > 0, got inf"),
    ],
)
def test_bad_values_are_usage_errors_before_the_gpu_check(argv, message, gpu_check_forbidden, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" in err


@pytest.mark.parametrize("name, parser", _parsers(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_has_help_and_shows_its_default(name, parser):
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        assert action.help, f"{name} {action.option_strings[0]} has no help text"
        if action.default not in (None, False):
            shown = " ".join(map(str, action.default)) if isinstance(action.default, list) else str(action.default)
            assert f"(default: {shown})" in text, f"{name} {action.option_strings[0]}: default not shown"
        elif action.default is None and action.nargs != 0:
            # no default: the help says what happens without the option
            assert "default" in action.help, f"{name} {action.option_strings[0]}: help does not say its default"


@pytest.mark.parametrize("name, parser", _parsers(), ids=lambda v: v if isinstance(v, str) else "")
def test_help_text_is_plain(name, parser):
    texts = [parser.description or ""] + [a.help or "" for a in parser._actions]
    for text in texts:
        assert not re.search(r"``|:(func|class|mod|meth|data):`|\bissue \d", text), f"{name}: {text!r}"


@pytest.mark.parametrize("suite", [*cli.BENCH_SUITES, "report"])
def test_each_bench_help_ends_with_the_epilogue_once(suite):
    r = _run("bench", suite, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Suites: ") == 1 and r.stdout.count("Exit status:") == 1
    assert f"usage: rawgraph bench {suite}" in r.stdout


# -- results on stdout, progress on stderr ---------------------------------------------------------


def test_info_json_is_one_document_on_stdout():
    r = _run("info", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["nvrtc"].startswith("13.") and "sm_90" in doc["cubin_targets"]
    assert (doc["gpu"] is None) == (not gpu_available()) == (doc["no_gpu_reason"] is not None)
    assert Path(doc["kernel_sources"]).is_dir()


def _result_of(suite):
    """A committed results file of ``suite`` (skips where this checkout has none)."""
    names = {
        "paths": "launch_paths_quick.json",
        "kernels": "kernel_times.json",
        "buckets": "buckets.json",
        "slots": "slots.json",
        "choose": "choose_2026-12-06_847ed0a_h100.json",
    }
    path = RESULTS / names[suite]
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    return json.loads(path.read_text())


@pytest.mark.parametrize("suite", list(cli.BENCH_SUITES))
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_suites_print_results_on_stdout_and_progress_on_stderr(suite, as_json, monkeypatch, capsys):
    import importlib

    import rawgraph.runtime.device as device

    result = _result_of(suite)
    module = importlib.import_module(cli.BENCH_SUITES[suite][0])

    def collect(args):
        print("[1/1] measuring (progress)")
        return result

    monkeypatch.setattr(module, "collect", collect)
    monkeypatch.setattr(device, "gpu_available", lambda: True)  # choose looks itself
    assert module.main(["--json"] if as_json else []) == 0
    out, err = capsys.readouterr()
    assert err == "[1/1] measuring (progress)\n"
    if as_json:
        assert json.loads(out) == result
    else:
        from rawgraph.bench.report import renderers

        assert out == renderers(suite)[0](result) + "\n" and out.strip()


@pytest.mark.parametrize(
    "module_name, stop_at",
    [
        ("rawgraph.bench.launch_paths", "Runner"),
        ("rawgraph.bench.kernel_times", "measure"),
        ("rawgraph.bench.slots", "run"),
    ],
)
def test_a_suite_without_torch_or_cupy_says_what_it_leaves_out(module_name, stop_at, monkeypatch, capsys, tmp_path):
    import importlib

    module = importlib.import_module(module_name)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    monkeypatch.setitem(sys.modules, "cupy", None)

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(module, stop_at, stop)
    with pytest.raises(Stop):
        module.main(["--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "torch not installed: " in err and "(pip install 'rawgraph[torch]')" in err
    if module_name.endswith("launch_paths"):
        assert "cupy not installed: the CuPy paths skipped (pip install 'rawgraph[cupy]')" in err


def test_optional_import_of_a_missing_package(capsys):
    assert command.optional("no_such_module_rawgraph", "cupy", "the CuPy rows") is None
    assert capsys.readouterr().err == (
        "no_such_module_rawgraph not installed: the CuPy rows skipped (pip install 'rawgraph[cupy]')\n"
    )
    assert command.optional("json", "x", "y") is json


# -- rawgraph bench report ---------------------------------------------------------------------------


@pytest.mark.parametrize("suite", list(cli.BENCH_SUITES))
def test_report_renders_any_suites_file_with_no_gpu(suite, tmp_path, monkeypatch, gpu_check_forbidden, capsys):
    result = _result_of(suite)
    src = tmp_path / f"{suite}_run.json"
    src.write_text(json.dumps(result))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as without the bench extra
    page = tmp_path / "page.html"
    assert cli.main(["bench", "report", str(src), "--html", str(page)]) == 0
    out, err = capsys.readouterr()
    from rawgraph.bench.report import renderers

    assert out == renderers(suite)[0](result) + "\n"
    html = page.read_text()
    first = next(line for line in out.splitlines() if line.strip() and "&" not in line and "<" not in line)
    assert first in html and "data:image/png" not in html
    if suite in ("paths", "buckets"):  # the suites with plots say why there are none
        assert "matplotlib is not installed: the page has no plots" in html
        assert "matplotlib is not installed" in err
    assert f"html: {page}" in err


def test_report_page_embeds_the_plots_with_matplotlib(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = tmp_path / "paths.json"
    src.write_text(json.dumps(_result_of("paths")))
    assert cli.main(["bench", "report", str(src), "--html", str(tmp_path / "p.html")]) == 0
    html = (tmp_path / "p.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "no plots" not in html


def test_report_refuses_what_is_no_results_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text('{"something": 1}')
    for path, message in (
        (bad, "cannot read"),
        (other, "is no rawgraph bench results file"),
        (tmp_path / "missing.json", "cannot read"),
    ):
        with pytest.raises(SystemExit) as exc:
            cli.main(["bench", "report", str(path), "--no-html"])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"records": [{"path": "graph"}], "grid": {}}))  # a paths file it cannot read
    assert cli.main(["bench", "report", str(old), "--no-html"]) == 1
    assert "cannot render" in capsys.readouterr().err


def test_report_runs_as_a_command_without_a_gpu(tmp_path):
    src = tmp_path / "k.json"
    src.write_text(json.dumps(_result_of("kernels")))
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "bench", "report", str(src)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "device-to-device copy:" in r.stdout and (tmp_path / "k.html").is_file()


def test_importing_every_module_runs_nothing():
    """As autodoc or any walk over the package does: no module runs a command (or exits) on import."""
    import importlib
    import pkgutil

    import rawgraph

    names = [m.name for m in pkgutil.walk_packages(rawgraph.__path__, "rawgraph.")]
    assert {"rawgraph.__main__", "rawgraph.multi.__main__", "rawgraph.testing"} <= set(names)
    for name in names:
        importlib.import_module(name)  # a SystemExit here fails the test
