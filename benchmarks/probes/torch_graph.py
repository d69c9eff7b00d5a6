"""Probe: what a PyTorch-captured CUDA graph looks like from the driver API, and import order.

    PYTHONPATH=. python3 benchmarks/probes/torch_graph.py [--no-imports] [--no-graph]

1. Import order (each case in a fresh interpreter, traceback printed on failure): CuPy then
   torch, torch then CuPy, CuPy used before torch is imported, rawgraph + CuPy + torch, and the
   same orders inside pytest (a CuPy test collected and run before a torch test), which is where
   an earlier session saw torch's import fail in its own custom-op registration. For each failing
   case the CUDA libraries mapped into the process (from /proc/self/maps) are listed, to show
   which copies of libcudart / libnvrtc / libcublas / libnvJitLink each package brought in.
2. Graph anatomy (needs a GPU and a CUDA torch): capture ``relu(x @ w1) @ w2 + x`` (width 128,
   batch 1, float32, TF32 off) with ``torch.cuda.CUDAGraph(keep_graph=True)`` and
   ``torch.cuda.graph``; take ``raw_cuda_graph()`` as a ``driver.CUgraph``; enumerate its nodes
   (recursing into child graphs), and for kernel nodes read ``cuGraphKernelNodeGetParams``:
   function name, each parameter's (offset, size) from ``cuFuncGetParamInfo`` (looping until
   CUDA_ERROR_INVALID_VALUE; also tried through the CUkernel API), the raw parameter bytes, and
   every 8-byte-aligned word that points into x, w1, w2, an intermediate or the output.
   Then the graph is instantiated and launched by rawgraph's driver calls to check that the
   raw handle is usable outside torch.

Exit status: 0 when it ran to the end, 2 when the graph part found no GPU/CUDA torch.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from cuda.bindings import driver  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Printed by every import-order child: which CUDA libraries are mapped, from where.
MAPS_SNIPPET = r"""
def _cuda_maps():
    seen = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = path.rsplit("/", 1)[-1]
                if base.startswith(("libcu", "libnv", "libcupti")) and path not in seen:
                    seen.append(path)
    except OSError:
        pass
    for p in seen:
        print("MAPPED", p, flush=True)
"""

IMPORT_CASES = {
    "cupy_then_torch": "import cupy; print('cupy', cupy.__version__); import torch; print('torch', torch.__version__)",
    "torch_then_cupy": "import torch; print('torch', torch.__version__); import cupy; print('cupy', cupy.__version__)",
    "cupy_used_then_torch": (
        "import cupy\n"
        "try:\n    print('cupy sum', int(cupy.arange(4).sum()))\n"
        "except Exception as exc:\n    print('cupy use failed:', type(exc).__name__, exc)\n"
        "import torch\nprint('torch', torch.__version__, 'cuda', torch.cuda.is_available())\n"
        "if torch.cuda.is_available():\n    print('torch sum', float(torch.ones(4, device='cuda').sum()))\n"
    ),
    "rawgraph_cupy_torch": (
        "import rawgraph; print('gpu', rawgraph.gpu_available()); import cupy; "
        "print('cupy', cupy.__version__); import torch; print('torch', torch.__version__)"
    ),
}

# The pytest cases: a conftest like the project's (numpy + rawgraph.runtime.device) and two tests in one
# module, run in file order.
CONFTEST = "import numpy as np\nfrom rawgraph.runtime.device import driver_status\n"
TEST_CUPY = """
def test_{order}_cupy():
    import pytest
    cp = pytest.importorskip("cupy")
    try:
        print("cupy sum", int(cp.arange(4).sum()))
    except Exception as exc:  # no GPU: the import itself is what matters
        print("cupy use failed:", type(exc).__name__, exc)
"""
TEST_TORCH = """
def test_{order}_torch():
    import pytest
    torch = pytest.importorskip("torch")
    print("torch", torch.__version__, "cuda", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("torch sum", float(torch.ones(4, device="cuda").sum()))
"""


def child_code(body: str) -> str:
    """A child program: run ``body``; on any exception print the full traceback, then try
    ``import torch`` once more (a second import after a half-done first one is a classic source
    of "already registered" errors in torch's op registration), and list the mapped libraries."""
    return MAPS_SNIPPET + textwrap.dedent(f"""
import sys, traceback
try:
    exec({body!r})
    print("IMPORT-CASE OK", flush=True)
except BaseException:
    traceback.print_exc(file=sys.stdout)
    print("IMPORT-CASE FAILED", flush=True)
    print("torch modules loaded after the failure:", sum(1 for m in sys.modules if m.split('.')[0] == 'torch'))
    try:
        import torch
        print("SECOND import torch: OK", torch.__version__)
    except BaseException:
        print("SECOND import torch: FAILED")
        traceback.print_exc(file=sys.stdout)
    _cuda_maps()
    sys.exit(1)
""")


def run(cmd, cwd=None, timeout=300, env=None) -> tuple[int, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
        return r.returncode, (r.stdout + ("\n" + r.stderr if r.stderr.strip() else "")).rstrip()
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n(timeout after {timeout} s)"


def print_block(label: str, text: str, limit: int = 120) -> None:
    lines = text.splitlines()
    for line in lines[:limit]:
        print(f"    | {line}", flush=True)
    if len(lines) > limit:
        print(f"    | ... {len(lines) - limit} more lines", flush=True)


def import_order_part() -> None:
    C.section("import order (fresh interpreter per case)")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for name, body in IMPORT_CASES.items():
        rc, out = run([sys.executable, "-c", child_code(body)], env=env)
        status = "OK" if rc == 0 and "IMPORT-CASE OK" in out else f"FAILED (exit {rc})"
        print(f"STEP import {name}: {status}", flush=True)
        print_block(name, out)

    # pytest: conftest imports numpy + rawgraph.runtime.device; module order decides import order.
    for order, first, second in (("a", TEST_CUPY, TEST_TORCH), ("b", TEST_TORCH, TEST_CUPY)):
        label = "pytest_cupy_then_torch" if order == "a" else "pytest_torch_then_cupy"
        with tempfile.TemporaryDirectory(prefix="rg_probe_") as d:
            with open(os.path.join(d, "conftest.py"), "w") as f:
                f.write(CONFTEST)
            with open(os.path.join(d, "test_order.py"), "w") as f:
                f.write(first.format(order=order + "1") + second.format(order=order + "2"))
            rc, out = run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-s",
                    "-rA",
                    "--tb=long",
                    "-p",
                    "no:cacheprovider",
                    "--rootdir",
                    d,
                    d,
                ],
                cwd=d,
                env=env,
            )
        print(f"STEP import {label}: {'OK' if rc == 0 else f'FAILED (pytest exit {rc})'}", flush=True)
        print_block(label, out)

    # The project's own CuPy test, then a torch test, in one pytest session (the failing setup).
    project_test = os.path.join(REPO, "tests", "test_interop_gpu.py")
    if os.path.isfile(project_test):
        with tempfile.TemporaryDirectory(prefix="rg_probe_") as d:
            torch_test = os.path.join(d, "test_zz_torch_after.py")
            with open(torch_test, "w") as f:  # named so that -k cupy keeps it
                f.write(TEST_TORCH.format(order="zz_after_cupy"))
            # -k cupy: the project's CuPy tests (their names change; the keyword does not), then ours.
            rc, out = run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-s",
                    "-rA",
                    "--tb=long",
                    "-p",
                    "no:cacheprovider",
                    "-c",
                    os.path.join(REPO, "pyproject.toml"),
                    "--rootdir",
                    REPO,
                    "-k",
                    "cupy",
                    project_test,
                    torch_test,
                ],
                cwd=REPO,
                env=env,
            )
        print(
            f"STEP import pytest_project_cupy_test_then_torch: {'OK' if rc == 0 else f'FAILED (pytest exit {rc})'}",
            flush=True,
        )
        print_block("pytest_project", out)


# ----------------------------------------------------------------------------- graph anatomy
def read_bytes(addr: int, n: int) -> bytes:
    return ctypes.string_at(addr, n) if addr and n else b""


def extra_buffer(extra: int) -> tuple[int, int]:
    """The argument buffer and its size from a ``CU_LAUNCH_PARAM_*`` ``extra`` array."""
    buf, size, i = 0, 0, 0
    while i < 16:
        key = ctypes.c_void_p.from_address(extra + 8 * i).value or 0
        if key == 0:  # CU_LAUNCH_PARAM_END
            break
        val = ctypes.c_void_p.from_address(extra + 8 * (i + 1)).value or 0
        if key == 1:  # CU_LAUNCH_PARAM_BUFFER_POINTER
            buf = val
        elif key == 2 and val:  # CU_LAUNCH_PARAM_BUFFER_SIZE: pointer to a size_t
            size = ctypes.c_size_t.from_address(val).value
        i += 2
    return buf, size


def param_layout(func_int: int) -> tuple[list[tuple[int, int]], str]:
    """(offset, size) per parameter via cuFuncGetParamInfo, then the CUkernel API as a fallback."""
    attempts = []
    for api, wrap, fn in (
        ("cuFuncGetParamInfo", driver.CUfunction, driver.cuFuncGetParamInfo),
        ("cuKernelGetParamInfo(func as CUkernel)", driver.CUkernel, driver.cuKernelGetParamInfo),
    ):
        layout, stop = [], None
        for i in range(512):
            st, res = C.raw_step("", fn, wrap(func_int), i)
            if st != "OK":
                stop = st
                break
            layout.append((int(res[1]), int(res[2])))
        attempts.append(f"{api}: {len(layout)} params, stopped with {stop}")
        if layout or stop == "CUDA_ERROR_INVALID_VALUE":
            return layout, "; ".join(attempts)
    return [], "; ".join(attempts)


def inspect_graph(graph, tensors: dict, depth: int = 0, summary=None) -> dict:
    summary = summary if summary is not None else {"types": {}, "kernels": [], "matches": set(), "paraminfo": []}
    r = C.step("cuGraphGetNodes(count)", driver.cuGraphGetNodes, graph, 0, quiet=True)
    if r is None:
        return summary
    n = int(r[1])
    r = C.step("cuGraphGetNodes", driver.cuGraphGetNodes, graph, n, quiet=True) if n else None
    nodes = list(r[0] or [])[:n] if r else []
    C.fact(f"{'  ' * depth}graph 0x{int(graph):x} nodes", n)
    for idx, node in enumerate(nodes):
        t = C.step("cuGraphNodeGetType", driver.cuGraphNodeGetType, node, quiet=True)
        tname = t.name.replace("CU_GRAPH_NODE_TYPE_", "") if t is not None else "?"
        summary["types"][tname] = summary["types"].get(tname, 0) + 1
        pre = f"NODE {'  ' * depth}{idx} {tname}"
        if tname == "GRAPH":
            child = C.step("cuGraphChildGraphNodeGetGraph", driver.cuGraphChildGraphNodeGetGraph, node, quiet=True)
            print(pre, flush=True)
            if child is not None:
                inspect_graph(child, tensors, depth + 1, summary)
            continue
        if tname != "KERNEL":
            print(pre, flush=True)
            continue
        p = C.step("cuGraphKernelNodeGetParams", driver.cuGraphKernelNodeGetParams, node, quiet=True)
        if p is None:
            print(pre + " (cuGraphKernelNodeGetParams failed)", flush=True)
            continue
        func, kern = int(p.func), int(p.kern)
        handle = func or kern  # a node may name its kernel by CUfunction or by CUkernel
        st, res = C.raw_step("", driver.cuFuncGetName, driver.CUfunction(handle))
        name = res[1].decode(errors="replace") if st == "OK" and isinstance(res[1], bytes) else f"<cuFuncGetName: {st}>"
        kname = C.raw_step("", driver.cuKernelGetName, driver.CUkernel(handle))
        module = C.raw_step("", driver.cuFuncGetModule, driver.CUfunction(handle))
        print(
            f"{pre} name={name} func=0x{func:x} kern=0x{kern:x} ctx=0x{int(p.ctx):x} "
            f"grid=({p.gridDimX},{p.gridDimY},{p.gridDimZ}) block=({p.blockDimX},{p.blockDimY},{p.blockDimZ}) "
            f"smem={p.sharedMemBytes} kernelParams=0x{int(p.kernelParams):x} extra=0x{int(p.extra):x}",
            flush=True,
        )
        C.fact(f"  node {idx} cuKernelGetName(handle as CUkernel)", kname[0] if kname[0] != "OK" else kname[1][1])
        C.fact(f"  node {idx} cuFuncGetModule", module[0] if module[0] != "OK" else f"OK 0x{int(module[1][1]):x}")
        count = C.raw_step("", driver.cuFuncGetParamCount, driver.CUfunction(handle))  # not in the 13.0 driver
        C.fact(f"  node {idx} cuFuncGetParamCount", count[0] if count[0] != "OK" else int(count[1][1]))
        layout, how = param_layout(handle)
        C.fact(f"  node {idx} param layout", f"{[(o, s) for o, s in layout]} via {how}")
        summary["paraminfo"].append(bool(layout))
        summary["kernels"].append(name)
        table, extra = int(p.kernelParams), int(p.extra)
        blob = bytearray(max((o + s for o, s in layout), default=0))
        if table:  # kernelParams: one pointer per parameter, each to that parameter's value
            for i, (off, size) in enumerate(layout):
                slot = ctypes.c_void_p.from_address(table + 8 * i).value or 0
                blob[off : off + size] = read_bytes(slot, size)
        elif extra:  # extra: {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, END}
            buf, size = extra_buffer(extra)
            C.note(f"node {idx}: parameters come through `extra` (buffer 0x{buf:x}, {size} bytes)")
            blob = bytearray(read_bytes(buf, size))
        else:
            C.note(f"node {idx}: neither kernelParams nor extra is set; parameters not read")
            continue
        for i, (off, size) in enumerate(layout):
            raw = bytes(blob[off : off + size])
            print(
                f"  PARAM {i} offset={off} size={size} bytes={raw[:256].hex()}{'...' if size > 256 else ''}", flush=True
            )
        for word_off in range(0, len(blob) - 7, 8):  # device-side layout offsets, 8-aligned
            value = int.from_bytes(blob[word_off : word_off + 8], "little")
            for tname_, (ptr, nbytes) in tensors.items():
                if ptr <= value < ptr + nbytes:
                    param = next((i for i, (o, s) in enumerate(layout) if o <= word_off < o + s), None)
                    print(
                        f"  MATCH param={param} layout_offset={word_off} value=0x{value:x} -> {tname_}+{value - ptr}",
                        flush=True,
                    )
                    summary["matches"].add(tname_)
    return summary


def graph_part() -> int:
    C.section("torch graph anatomy: relu(x @ w1) @ w2 + x, w=128, b=1, float32, TF32 off")
    try:
        import torch
    except Exception as exc:
        print(f"NO GPU: torch not importable ({type(exc).__name__}: {exc}) -- graph part skipped", flush=True)
        return C.NO_GPU_EXIT
    C.fact("torch", torch.__version__)
    if not torch.cuda.is_available():
        print("NO GPU: torch.cuda.is_available() is False -- graph part skipped", flush=True)
        return C.NO_GPU_EXIT
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 128, generator=gen).cuda()
    w1 = (torch.randn(128, 128, generator=gen) / 128**0.5).cuda()
    w2 = (torch.randn(128, 128, generator=gen) / 128**0.5).cuda()

    def f():
        h1 = x @ w1
        h2 = torch.relu(h1)
        h3 = h2 @ w2
        return h1, h2, h3, h3 + x

    side = torch.cuda.Stream()  # warm-up on a side stream, as torch's docs ask before capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            ref = f()[-1]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        C.fact("torch.cuda.CUDAGraph(keep_graph=True)", "accepted")
    except TypeError as exc:
        C.fact("torch.cuda.CUDAGraph(keep_graph=True)", f"TypeError: {exc}")
        return 0
    try:
        torch.cuda.graph(g, keep_graph=True)
        C.fact("torch.cuda.graph(g, keep_graph=True)", "accepted")
    except TypeError as exc:
        C.fact("torch.cuda.graph(g, keep_graph=True)", f"TypeError: {exc} (keep_graph belongs to CUDAGraph())")
    with torch.cuda.graph(g):
        h1, h2, h3, y = f()
    raw = g.raw_cuda_graph()
    C.fact("raw_cuda_graph()", f"{type(raw).__name__} 0x{int(raw):x}")

    dev = C.gpu_device()  # rawgraph: the primary context torch uses, made current
    if dev is None:
        return C.NO_GPU_EXIT
    cur = C.step("cuCtxGetCurrent", driver.cuCtxGetCurrent, quiet=True)
    C.fact("current context is rawgraph's primary context", cur is not None and int(cur) == int(dev.context))
    tensors = {
        name: (t.data_ptr(), t.numel() * t.element_size())
        for name, t in (("x", x), ("w1", w1), ("w2", w2), ("h1=x@w1", h1), ("h2=relu", h2), ("h3=h2@w2", h3), ("y", y))
    }
    for name, (ptr, nb) in tensors.items():
        C.fact(f"tensor {name}", f"0x{ptr:x} {nb} bytes")
    graph = driver.CUgraph(int(raw))
    summary = C.guarded("inspect", lambda: inspect_graph(graph, tensors))
    if summary:
        C.fact("SUMMARY node types", summary["types"])
        C.fact("SUMMARY kernels", summary["kernels"])
        C.fact(
            "SUMMARY cuFuncGetParamInfo worked", f"{sum(summary['paraminfo'])}/{len(summary['paraminfo'])} kernel nodes"
        )
        C.fact("SUMMARY tensors found in parameters", sorted(summary["matches"]))

    # The graph through torch, then through the driver directly on a rawgraph stream.
    def replay():
        g.instantiate()
        y.zero_()
        g.replay()
        torch.cuda.synchronize()
        C.check(
            "torch replay matches eager",
            torch.allclose(y, ref, rtol=1e-5, atol=1e-5),
            f"max |diff|={float((y - ref).abs().max()):.3g}",
        )

    C.guarded("torch replay", replay)

    def own_launch():
        from rawgraph.runtime.stream import Stream

        exe = C.step("cuGraphInstantiate(torch's raw graph)", driver.cuGraphInstantiate, graph, 0)
        if exe is None:
            return
        s = Stream()
        y.zero_()
        torch.cuda.synchronize()
        if C.step("cuGraphLaunch on a rawgraph stream", driver.cuGraphLaunch, exe, s.handle) is not None:
            s.synchronize()
            C.check(
                "driver-launched torch graph matches eager",
                torch.allclose(y, ref, rtol=1e-5, atol=1e-5),
                f"max |diff|={float((y - ref).abs().max()):.3g}",
            )
        driver.cuGraphExecDestroy(exe)
        s.close()

    C.guarded("driver launch", own_launch)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-imports", action="store_true", help="skip the import-order cases")
    ap.add_argument("--no-graph", action="store_true", help="skip the graph anatomy part")
    args = ap.parse_args(argv)
    C.section("environment")
    C.env_report()
    if not args.no_imports:
        C.guarded("import order", import_order_part)
    rc = 0
    if not args.no_graph:
        rc = C.guarded("graph", graph_part) or 0
    print("DONE torch_graph", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
