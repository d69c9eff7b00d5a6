"""The examples (issue 22, item 1) run as a user runs them: each file as its own process, from the
checkout, exit status 0 and its one-line result on stdout (each asserts its own correctness
against a float64 or eager reference before printing)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# example -> the line it prints once its checks passed
LINES = {
    "own_kernel.py": r"replayed on x1 with no copy, \d+ node updates?",
    "buckets_own_model.py": r"rms_norm_scale as a FunctionModel: plain and row-count buckets, a device-shaped exec and a slot pool \(gather=kernels\) match float64 to \d\.\de[-+]\d+",
    "buckets_own_model_class.py": r"RMSNormScale as a class: plain and row-count buckets, a device-shaped exec and a slot pool \(gather=kernels\) match float64 to \d\.\de[-+]\d+",
    "torch_graph_rebind.py": r"torch graph adopted: 3 replays on new tensors with no copy \(\d+ node arguments moved each\)",
    "conditional_loop.py": r"one WHILE exec ran depths \[(\d, ){6}\d\] as the device read them, each matching float64",
    "doctor_torch.py": r"torch graph: clean after capture; after `del x`: \d+ allocator-freed error\(s\), "
    r"first at node \d+ \(.+\)",
}
TORCH_GRAPH = ("torch_graph_rebind.py", "doctor_torch.py")  # need CUDAGraph(keep_graph=True)


def run_example(name, timeout=600):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout
    )


OWN_TESTS = {"driver_walkthrough.py"}  # a table, not one line: tests/test_walkthrough_gpu.py runs it


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted([*LINES, *OWN_TESTS])


@pytest.mark.parametrize("name", sorted(LINES))
def test_example_runs_and_prints_its_result(name):
    if name in TORCH_GRAPH:
        torch = pytest.importorskip("torch")
        if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph"):
            pytest.skip(f"torch {torch.__version__} has no CUDAGraph(keep_graph=True)")
    r = run_example(name)
    assert r.returncode == 0, f"{name} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(LINES[name], lines[0]), f"{name} printed {r.stdout!r}"
