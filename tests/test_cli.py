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
    assert r.returncode == 2 and "needs a GPU" in r.stderr


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


@pytest.mark.parametrize("args", [("bench", "--quick"), ("bench", "--", "--quick"), ("bench", "paths", "--quick", "--width", "128"),
                                  ("bench", "kernels", "--sweep"), ("bench", "kernels", "--", "--sweep")])
def test_bench_options_reach_the_gpu_check(args):
    _no_gpu_here()
    r = _run(*args)
    assert r.returncode == 2, r.stderr
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
    probe = ("import importlib; from rawgraph.cli import BENCH_SUITES\n"
             "for name, (module, _) in BENCH_SUITES.items():\n"
             "    mod = importlib.import_module(module)\n"
             "    assert callable(mod.main) and vars(mod.build_parser().parse_args([])), name\n"
             "print(' '.join(BENCH_SUITES))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["paths", "kernels"]
