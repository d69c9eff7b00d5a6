import subprocess
import sys

import pytest

from rawgraph.device import gpu_available


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
    from rawgraph.experiment import run

    r = run(rounds=20)
    assert r["max_abs_diff"] == 0.0
    assert r["rel_err_vs_float64"] < 1e-5
    assert r["dynamic_shape_rejected"] == "ShapeError"
    assert r["driver_update_calls"] > 0
    for k in ("eager_median_us", "copy_plus_graph_replay_median_us", "exec_update_plus_graph_replay_median_us"):
        assert r[k] > 0
