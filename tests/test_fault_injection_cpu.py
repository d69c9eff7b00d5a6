"""Fault injection on the CPU fake driver (issue 21, section 3): every public operation, its k-th
driver call failing for every k, judged by ``tests/faultinject.py``; plus the harness's own parts
(the CUBIN layouts, the hook, the classifier on operations built to be wrong)."""

from __future__ import annotations

import ast
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver
from fakedriver import cubin_info, cubin_kernels, output_count
from fault_cases import all_cases, fake_session
from faultinject import GOOD, Case, count_calls, names_call, run_case

ROOT = Path(__file__).resolve().parent.parent
CASES = all_cases()  # closures only: nothing reaches a driver until a session runs them


def _slug(op: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", op).strip("_").lower()


@pytest.fixture(scope="module")
def session():
    """The fake driver and the hook for this module, every case warmed up once (kernels loaded,
    caches filled) so that each case's call count is the same every time it runs."""
    with fake_session() as (fake, hook):
        for case in CASES:
            count_calls(case, hook)
        yield fake, hook


@pytest.mark.parametrize("case", CASES, ids=[_slug(c.op) for c in CASES])
def test_every_injected_failure_is_typed_recovered_and_leaks_nothing(session, case):
    _fake, hook = session
    n, _names = count_calls(case, hook)
    assert n > 0, f"{case.op} makes no driver call: nothing to inject"
    results = [run_case(case, k, hook) for k in range(1, n + 1)]
    bad = [r for r in results if r.outcome not in GOOD]
    assert not bad, f"{case.op}: {len(bad)} of {n} cases not consistent:\n" + "\n".join(
        f"  k={r.k} {r.call}: {r.outcome}: {r.detail}" for r in bad[:12]
    )
    if case.closes:  # a close that releases anything must have met a failed release and warned
        assert any(r.outcome == "warned" for r in results), [r.outcome for r in results]


def test_the_operations_cover_the_issue_list():
    ops = " | ".join(c.op for c in CASES).lower()
    for word in (
        "capture",
        "instantiate",
        "upload",
        "launch",
        "manager bind",
        "bind_many",
        "prepare",
        "apply",
        "rebind",
        "adopt",
        "bucketgraphs build",
        "bucketgraphs run",
        "slotpool join",
        "slotpool leave",
        "slotpool step",
        "indirectgraph apply",
        "builder",
        "conditional",
        "device launch",
    ):
        assert word in ops, word
    closes = {c.op for c in CASES if c.closes}
    for owner in (
        "DeviceBuffer",
        "HostBuffer",
        "Stream",
        "Event",
        "Graph",
        "GraphExec",
        "Module",
        "TinyBlock",
        "StaticGraph",
        "ExecUpdateManager",
        "IndirectGraph",
        "BucketGraphs",
        "SlotPool",
        "DepthLoop",
        "NormGate",
        "DeviceGraph",
        "ReshapedGraph",
    ):
        assert f"close {owner}" in closes, owner


# -- the harness's parts ------------------------------------------------------------------------
def test_cubin_layouts_are_the_kernels_signatures():
    from rawgraph.runtime.compiler import compile_source
    from rawgraph.runtime.module import kernel_source

    kernels = cubin_kernels(compile_source(kernel_source("control"), "control.cu", "sm_90").image)
    # rg_axpb(const float* x, float* y, int n, float a, float b); rg_noop(); rg_set_cond(u64, const unsigned*)
    assert kernels["rg_axpb"] == [(0, 8), (8, 8), (16, 4), (20, 4), (24, 4)]
    assert kernels["rg_noop"] == []
    assert kernels["rg_set_cond"] == [(0, 8), (8, 8)]
    # rg_set_band(u64 h, const int* value, int n_arg, const int* tops, int count, int* used): select_band's spec
    assert kernels["rg_set_band"] == [(0, 8), (8, 8), (16, 4), (24, 8), (32, 4), (40, 8)]
    image = compile_source(kernel_source("rows"), "rows.cu", "sm_90", ["gather_rows_param<16>"])
    (sym,) = [k for k in cubin_kernels(image.image) if "gather_rows_param" in k]
    # (const float* src, float* dst, int rows, int width, RowTable<16> table): the table by value
    assert cubin_kernels(image.image)[sym] == [(0, 8), (8, 8), (16, 4), (20, 4), (24, 64)]
    assert cubin_info(image.image)[sym][1] == (0, 0, 0)  # no __cluster_dims__
    block = compile_source(kernel_source("block"), "block.cu", "sm_90", ["block_kernel<1, 8>"])
    layout, cluster = cubin_info(block.image)[block.lowered["block_kernel<1, 8>"]]
    # block_kernel(const float* x, W1, W2, float* y, int B, int W, int flags), __cluster_dims__(8, 1, 1)
    assert layout == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4), (40, 4)] and cluster == (8, 1, 1)


def test_failed_calls_have_the_shape_of_the_real_result():
    assert output_count("cuStreamGetCaptureInfo") == 6
    assert output_count("cuGraphGetNodes") == 2
    assert output_count("cuMemFree") == 0
    assert output_count("cuMemAlloc") == 1


def test_the_hook_fails_exactly_the_kth_call_and_tallies_handles(session):
    fake, hook = session
    ok, oom = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    hook.reset()
    hook.arm(2)
    r1, r2, r3 = driver.cuMemAlloc(8), driver.cuMemAlloc(8), driver.cuMemAlloc(8)
    hook.disarm()
    assert r1[0] == ok and r2 == (oom, None) and r3[0] == ok and hook.fired == ("cuMemAlloc", 2)
    assert set(hook.leaked()) == {("memory", int(r1[1])), ("memory", int(r3[1]))}
    hook.arm(1)
    assert driver.cuMemFree(r1[1]) == (oom,)  # refused: the driver still holds it
    hook.disarm()
    assert ("memory", int(r1[1])) in hook.failed_releases and ("memory", int(r1[1])) not in hook.leaked()
    assert fake.find_alloc(int(r1[1])) is not None  # the fake was never reached
    fake.api["cuMemFree"](r1[1])  # (freed behind the hook's back, to clean up)
    assert driver.cuMemFree(r3[1]) == (ok,) and not hook.leaked() and not hook.problems
    driver.cuMemFree(r3[1])  # a second destroy of the same handle is reported
    assert hook.problems and "twice" in hook.problems[0]
    hook.reset()


def test_names_call_reads_the_error_chain():
    from rawgraph.runtime.errors import CaptureError, CudaError

    inner = CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY", "x", "cuLaunchKernelEx(relu)")
    try:
        try:
            raise inner
        except CudaError as e:
            raise CaptureError(0, "CAPTURE_BODY_ERROR", "y", "cuStreamEndCapture") from e
    except CaptureError as outer:
        assert names_call(outer, "cuLaunchKernelEx", "CUDA_ERROR_OUT_OF_MEMORY")
        assert not names_call(outer, "cuLaunchKernel", "CUDA_ERROR_OUT_OF_MEMORY")
        assert not names_call(outer, "cuLaunchKernelEx", "CUDA_ERROR_INVALID_VALUE")


def _bad_cases() -> list[Case]:
    """Operations built to be wrong in each way the classifier must see."""
    from rawgraph import DeviceBuffer, Stream
    from rawgraph.runtime.errors import call

    def setup() -> dict:
        s = Stream()
        return {"s": s, "buf": DeviceBuffer(4)}

    def close(st: dict) -> None:
        st["buf"].close()
        st["s"].close()

    def untyped(st: dict) -> None:  # a driver failure turned into an untyped error
        try:
            call(driver.cuMemAlloc, 64)
        except Exception:
            raise RuntimeError("something went wrong") from None

    def leaky(st: dict) -> None:  # on failure the first allocation is lost
        a = call(driver.cuMemAlloc, 64)
        b = call(driver.cuMemAlloc, 64)
        driver.cuMemFree(a)
        driver.cuMemFree(b)

    def half(st: dict) -> None:  # the shadow moves before the driver accepted the change
        st["shadow"] = 7.0
        st["buf"].copy_from_host(np.full(4, 7.0, np.float32), st["s"])

    def consistent(st: dict) -> None:
        from fault_cases import FAKE

        held = struct.unpack("<f", FAKE.read(st["buf"].ptr, 4))[0]
        assert held == st.get("shadow", 0.0), (held, st.get("shadow"))

    return [
        Case("untyped", setup, untyped, lambda st: None, close),
        Case("leaky", setup, leaky, lambda st: None, close),
        Case("half-applied", setup, half, consistent, close, consistent=consistent),
    ]


def test_the_classifier_catches_untyped_errors_leaks_and_half_applied_state(session):
    _fake, hook = session
    untyped, leaky, half = _bad_cases()
    r = run_case(untyped, 1, hook)
    assert r.call == "cuMemAlloc" and r.outcome == "inconsistent" and "untyped" in r.detail, r
    r = run_case(leaky, 2, hook)
    assert r.call == "cuMemAlloc" and r.outcome == "leak" and "memory" in r.detail, r
    n, names = count_calls(half, hook)
    k = names.index("cuMemcpyHtoDAsync") + 1
    outcomes = [run_case(half, j, hook) for j in range(1, n + 1)]
    # every failure up to the copy leaves the shadow ahead of the device; one after it does not
    assert all(r.outcome == "inconsistent" and "AssertionError" in r.detail for r in outcomes[:k]), outcomes[:k]
    assert all(r.outcome == "recovered" for r in outcomes[k:]) and outcomes[k:], outcomes[k:]


def test_no_module_caches_a_driver_function_at_import():
    """The hook replaces ``cuda.bindings.driver`` attributes: a module-level ``x = driver.cuY`` or
    ``from cuda.bindings.driver import cuY`` would keep calling the unwrapped function."""
    for path in sorted((ROOT / "rawgraph").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "cuda.bindings.driver":
                names = [a.name for a in node.names if a.name.startswith("cu") and not a.name.startswith("cuuint")]
                assert not names, f"{path.name} imports {names} from cuda.bindings.driver"
            targets = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None else None
            if targets is not None:
                for sub in ast.walk(targets):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "driver"
                        and re.match(r"cu[A-Z]", sub.attr)
                        and not isinstance(targets, ast.Call)
                    ):
                        pytest.fail(f"{path.name}:{node.lineno} keeps driver.{sub.attr} at import time")
