"""``examples/driver_walkthrough.py`` (issue 44, section 3) without a GPU: it imports nothing but
cuda.bindings, NumPy and the standard library; its kernel compiles with NVRTC for sm_90 and its
argument types match the layout in the CUBIN; without a GPU it exits 69 with one line; and its whole
driver-call sequence runs on the CPU fake driver, here taught to run the example's one kernel (on
the fake's device memory, which is host memory), so the bit comparison of the three paths is real:
a rebind that never reaches the exec, or a copy that never happens, fails the run with status 1."""

import ast
import ctypes
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver

from rawgraph import gpu_available
from rawgraph.testing.fakedriver import cubin_kernels, fake_driver_session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "driver_walkthrough.py"


@pytest.fixture(scope="module")
def walk():
    """The example imported as a module (``main()`` is under ``__main__``: importing runs nothing)."""
    spec = importlib.util.spec_from_file_location("rawgraph_example_driver_walkthrough", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_it_imports_only_cuda_bindings_numpy_and_the_standard_library():
    tree = ast.parse(EXAMPLE.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            names |= {f"{node.module}.{a.name}" for a in node.names}
    outside = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"numpy", "cuda.bindings.driver", "cuda.bindings.nvrtc"}, outside
    assert not any("rawgraph" in n for n in names)
    assert "__import__" not in EXAMPLE.read_text() and "importlib" not in EXAMPLE.read_text()


def test_it_is_short_and_guards_main():
    text = EXAMPLE.read_text()
    assert len(text.splitlines()) <= 215  # issue 44: at most about 200
    assert 'if __name__ == "__main__":\n    sys.exit(main())' in text


def test_the_kernel_compiles_for_sm_90_and_its_layout_matches_the_packed_types(walk):
    cubin = walk.compile_cubin("sm_90")
    assert cubin[:4] == b"\x7fELF"
    layout = cubin_kernels(cubin)[walk.KERNEL]  # (offset, size) per parameter, from the CUBIN itself
    assert [size for _off, size in layout] == [np.dtype(t).itemsize for t in walk.ARG_TYPES]


def test_a_compile_error_carries_the_log(walk, monkeypatch):
    monkeypatch.setattr(walk, "SRC", walk.SRC.replace("float acc = 0.0f;", "float acc = undeclared;"))
    with pytest.raises(RuntimeError, match=r"(?s)nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION.*undeclared"):
        walk.compile_cubin("sm_90")


def test_pack_and_unpack_are_inverse(walk):
    values = (0x7F0000001000, 0x7F0000002000, 0, 0x7F0000003000, 3, 128, 1)
    address = walk.pack(values)
    assert walk.unpack(address) == list(values)
    table, cells = walk.KEEP[-1]  # kept alive for the run: the driver reads them in each call given the table
    assert int(table.ctypes.data) == address
    assert [int(a) for a in table] == [int(c.ctypes.data) for c in cells]  # one pointer per argument
    assert [c.dtype for c in cells] == [np.dtype(t) for t in walk.ARG_TYPES]


def test_without_a_gpu_it_exits_69_with_one_line():
    if gpu_available():
        pytest.skip("a GPU is present: tests/test_walkthrough_gpu.py runs the example")
    r = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=str(ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 69, f"exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("driver_walkthrough.py needs a GPU: "), r.stderr


# -- the whole walkthrough on the fake driver, with the kernel run on the host --------------------
def _floats(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))


def _run_kernel(values):
    """mm_epilogue on the fake's memory: out = act(a @ w) (+ res), float32."""
    a, w, res, out, rows, n, relu = values
    acc = _floats(a, rows * n).reshape(rows, n) @ _floats(w, n * n).reshape(n, n)
    if relu:
        acc = np.maximum(acc, np.float32(0))
    if res:
        acc = acc + _floats(res, rows * n).reshape(rows, n)
    _floats(out, rows * n)[:] = acc.ravel()


def _run_on_fake(walk, monkeypatch, silence=None):
    """``walk.main()`` on the fake driver that runs the kernel; ``silence``: a call made a no-op
    that still answers success. Returns (exit status, the fake, its launch log length)."""
    monkeypatch.setattr(walk, "WARMUP", 1)
    monkeypatch.setattr(walk, "ROUNDS", 3)
    with fake_driver_session() as fake:
        saved = {n: getattr(driver, n) for n in ("cuLaunchKernel", "cuGraphLaunch", silence) if n}

        def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            before = len(fake.launch_log)
            res = saved["cuLaunchKernel"](f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
            if not res[0] and len(fake.launch_log) > before:  # run, not captured
                _run_kernel(walk.unpack(int(params)))
            return res

        def graph_launch(exe, stream):
            res = saved["cuGraphLaunch"](exe, stream)
            if not res[0]:
                for node in fake.execs[int(exe)].order:  # a linear capture: nodes in launch order
                    args = fake.exec_kernel_args(exe, node)
                    _run_kernel([np.frombuffer(b, t)[0].item() for b, t in zip(args, walk.ARG_TYPES)])
            return res

        launch.__name__, graph_launch.__name__ = "cuLaunchKernel", "cuGraphLaunch"
        driver.cuLaunchKernel, driver.cuGraphLaunch = launch, graph_launch
        if silence:
            setattr(driver, silence, lambda *args: (driver.CUresult.CUDA_SUCCESS,))
        try:
            status = walk.main()
        finally:
            for name, fn in saved.items():
                setattr(driver, name, fn)
        return status, fake


def test_the_walkthrough_runs_on_the_fake_driver_and_releases_everything(walk, monkeypatch, capsys):
    status, fake = _run_on_fake(walk, monkeypatch)
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    assert lines[-1].startswith("three paths, equal bits: eager == copy + replay == rebind + replay")
    assert lines[-2] == "rebinding moved x in 2 of 2 kernel nodes"
    assert [ln.split("  ")[0] for ln in lines[2:5]] == ["eager (2 launches)", "copy + replay", "rebind + replay"]
    assert not any(fake.live().values()), fake.live()  # exec, graph, module, memory, stream, events
    assert fake.ctx_refs == 0  # the primary context retained once, released once
    eager = sum(1 for kind, *_ in fake.launch_log if kind == "kernel")
    graphs = sum(1 for kind, *_ in fake.launch_log if kind == "graph")
    steps = 1 + walk.WARMUP + walk.ROUNDS  # the checked step and the timed ones, per path
    assert (eager, graphs) == (2 + 2 * steps, 2 * steps)  # + the warm-up before capture


@pytest.mark.parametrize(
    "silence, path", [("cuGraphExecKernelNodeSetParams", "rebind + replay"), ("cuMemcpyDtoDAsync", "copy + replay")]
)
def test_a_path_that_reads_stale_input_fails_with_status_1(walk, monkeypatch, capsys, silence, path):
    status, fake = _run_on_fake(walk, monkeypatch, silence)
    out, err = capsys.readouterr()
    assert status == 1 and out == ""
    assert err.startswith(f"driver_walkthrough.py: FAILED: {path}: 128 of 128 floats differ from eager's bits"), err
    assert not any(fake.live().values()), fake.live()  # released on failure too
