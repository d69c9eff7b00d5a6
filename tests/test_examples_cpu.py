"""The examples on a machine without a GPU: each compiles, the importable model example imports
and its kernels compile with NVRTC, and each (but ``own_kernel.py``, which the README shows word
for word, and ``driver_walkthrough.py``, which exits 69 as the CLI does) exits with status 2 and
says it needs a GPU instead of a traceback."""

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from rawgraph import gpu_available

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ALL = sorted(p.name for p in EXAMPLES.glob("*.py"))
# own_kernel.py is the README's block word for word (tests/test_readme_cpu.py): no GPU check in it;
# driver_walkthrough.py exits 69, the CLI's "no GPU" status (tests/test_walkthrough_cpu.py checks it)
NEEDS_GPU_MESSAGE = [n for n in ALL if n not in ("own_kernel.py", "driver_walkthrough.py")]


def load_example(name):
    """An example file imported as a module (``examples/`` is not a package)."""
    mod_name = f"rawgraph_example_{Path(name).stem}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, EXAMPLES / name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_examples_are_there():
    assert {"own_kernel.py", "buckets_own_model.py", "torch_graph_rebind.py", "conditional_loop.py"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_example_compiles(name, tmp_path):
    py_compile.compile(str(EXAMPLES / name), cfile=str(tmp_path / "out.pyc"), doraise=True)


@pytest.mark.parametrize("name", NEEDS_GPU_MESSAGE)
def test_example_without_a_gpu_exits_2_with_a_message(name):
    if gpu_available():
        pytest.skip("a GPU is present: tests/test_examples_gpu.py runs the examples")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2, f"{name} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stdout == ""
    assert f"{name} needs a GPU: " in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_model_example_imports_without_a_gpu_and_its_kernels_compile(tmp_path):
    from rawgraph import KernelCache, compile_source
    from rawgraph.runtime.signature import parse_signature
    from rawgraph.serving.protocol import REQUIRED

    mod = load_example("buckets_own_model_class.py")  # importing runs nothing (main() is under __main__)
    cls = mod.RMSNormScale
    assert all(hasattr(cls, name) for name in REQUIRED if name not in ("width", "batch", "device"))
    assert callable(cls.row_count_arg) and callable(cls._check_open)
    assert callable(load_example("buckets_own_model.py").make_model)  # the function form, importable alike
    img = compile_source(mod.SRC, "buckets_own_model.cu", "sm_90", cache=KernelCache(tmp_path))
    assert img.image
    norm, res = parse_signature(mod.SRC, "rms_scale"), parse_signature(mod.SRC, "scale_residual")
    assert [p.name for p in norm] == ["x", "g", "t", "width", "nrows", "eps"]
    assert [p.name for p in res] == ["t", "x", "s", "out", "n"]
    # SlotPool routes rows through a table into kernels with a "rows" argument (rawgraph's matmuls):
    # a user kernel must not take that name, or its plan would be taken for one that can.
    assert "rows" not in {p.name for p in norm + res}
