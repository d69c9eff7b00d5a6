"""The built wheel, installed outside the checkout, finds and compiles the kernel sources, carries
the licence, needs neither CuPy nor PyTorch, and registers the pytest plugin's entry point."""

import email
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import pathlib, sys, rawgraph, rawgraph.bench.launch_paths
from rawgraph.runtime.module import kernel_dir, kernel_source, kernel_files
from rawgraph.runtime.compiler import compile_source, KernelCache
here = pathlib.Path(rawgraph.__file__).resolve()
assert str(here).startswith(sys.argv[2]), (here, sys.argv[2])
assert str(kernel_dir()).startswith(str(here.parent)), kernel_dir()
assert (here.parent / "py.typed").is_file(), "py.typed missing from the wheel"
import rawgraph.serving
import rawgraph.control
assert kernel_files() == sys.argv[3].split(","), (kernel_files(), sys.argv[3])  # every source of the checkout shipped
img = compile_source(kernel_source("matmul"), "matmul.cu", "sm_90", ["matvec_kernel<0, 4, 16, 1>"], cache=KernelCache(sys.argv[1]))
assert img.image[:4] == b"\\x7fELF"
import rawgraph.testing, _rawgraph_pytestplugin
assert str(pathlib.Path(_rawgraph_pytestplugin.__file__).resolve()).startswith(sys.argv[2])
assert "cupy" not in sys.modules and "torch" not in sys.modules, "importing rawgraph imported cupy or torch"
print("wheel-ok", kernel_dir())
"""


@pytest.mark.slow
def test_wheel_installs_and_finds_kernels(tmp_path):
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)]
    # Offline first, with an installed hatchling; where none (or too old a one) is installed, an
    # isolated build fetches a current one from the package index.
    r = subprocess.run(build + ["--no-build-isolation"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        r = subprocess.run(build, capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and (
        "No matching distribution" in r.stdout + r.stderr or "NewConnectionError" in r.stdout + r.stderr
    ):
        pytest.skip("cannot build a wheel here: no usable hatchling installed and no package index reachable")
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = wheels.glob("rawgraph-*.whl")
    # Install the wheel alone into its own folder (its dependencies come from this environment),
    # then import it from a directory that is not the checkout.
    target = tmp_path / "site-packages"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(whl)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAWGRAPH_KERNEL_DIR"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            str(tmp_path / "cache"),
            str(target),
            ",".join(sorted(p.stem for p in (ROOT / "kernels").glob("*.cu"))),
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wheel-ok" in r.stdout
    _check_metadata(whl)
    _check_plugin_entry_point(env, elsewhere)


def _check_metadata(whl):
    """The wheel's own files: licence, the plugin package and entry point, dependencies."""
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(f"{dist}/METADATA"))
        entry_points = z.read(f"{dist}/entry_points.txt").decode()
    assert {"rawgraph/testing/__init__.py", "rawgraph/testing/fakedriver.py", "_rawgraph_pytestplugin.py"} <= names
    assert any(n.startswith(f"{dist}/licenses/LICENSE") for n in names), sorted(n for n in names if "dist-info" in n)
    assert meta["License-Expression"] == "Apache-2.0"
    assert "[pytest11]\n_rawgraph_pytestplugin = _rawgraph_pytestplugin" in entry_points
    requires = [r.replace("'", '"') for r in meta.get_all("Requires-Dist")]  # one quoting of markers
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if r.startswith(("cupy", "torch", "mypy", "pytest"))], core

    def in_extra(name, extra):  # a requirement of the extra, named or through a self-reference
        return any(
            (r.startswith(name) or r.startswith("rawgraph[") and name.split("-")[0] in r) and f'extra == "{extra}"' in r
            for r in requires
        )

    for extra in ("test", "bench"):  # CuPy and PyTorch come with the extras that use them
        assert in_extra("cupy-cuda13x", extra) and in_extra("torch", extra), requires
    assert any(r.startswith("cupy-cuda13x") and 'extra == "cupy"' in r for r in requires)
    assert any(r.startswith("mypy") and 'extra == "dev"' in r for r in requires)
    assert not any(r.startswith("mypy") and 'extra == "test"' in r for r in requires)


def _check_plugin_entry_point(env, elsewhere):
    """pytest loads the installed entry point by itself: its options are listed everywhere, and
    the ini option enables the plugin."""
    env = {k: v for k, v in env.items() if k not in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS")}
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    r = subprocess.run(pytest_cmd + ["--help"], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--rawgraph-doctor" in r.stdout and "rawgraph_testing" in r.stdout
    (elsewhere / "pytest.ini").write_text("[pytest]\nrawgraph_testing = true\n")
    from test_testing_plugin_cpu import PROBE  # a gpu-marked test and one on the fake driver

    (elsewhere / "test_probe.py").write_text(PROBE)
    r = subprocess.run(pytest_cmd + ["-q", "-rs"], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    from rawgraph.runtime.device import gpu_available

    assert ("2 passed" if gpu_available() else "1 passed, 1 skipped") in r.stdout, r.stdout
