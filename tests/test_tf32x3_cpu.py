"""The fp32-accurate tensor-core GEMM (``kernels/tf32x3.cu``) without a GPU: the ``"tf32x3"`` cut of
:class:`MatmulShape` (expression, grid, threads, shared memory), the refusals of cuts the kernel
cannot be, ``precision`` in ``matmul_shape`` and ``ops.matmul`` (the table, the default rule, the
fp32 fallback), NVRTC compiles of every cut for sm_90 with ptxas' register and spill counts,
launches on the fake driver, the sweep's helpers, and a subset of the host emulation
(``benchmarks/tf32x3_emulate.py``: the kernel source run on the CPU against float64)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rawgraph import LayoutError, ShapeError, as_device_array, ops
from rawgraph.ops import gemm
from rawgraph.ops.gemm import (
    MatmulShape,
    Tf32x3Cut,
    _check_shape,
    gemm_smem_bytes,
    matmul_expr,
    matmul_file,
    matmul_shape,
    tf32x3_cut,
    tf32x3_default_cut,
    tf32x3_shape,
    tf32x3_smem_bytes,
)
from rawgraph.runtime.compiler import compile_source
from rawgraph.runtime.module import kernel_source

ROOT = Path(__file__).resolve().parent.parent
OPTIN = 232448  # H100 / H200: most dynamic shared memory one CTA may ask for
SMS = 132
GRID = [(m, w) for w in (1024, 2048, 4096) for m in range(8, 257, 8)]


class FakeCAI:
    def __init__(self, shape, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


def _arr(shape, ptr=0x7F0000000000):
    return as_device_array(FakeCAI(shape, ptr))


def _module(name: str):
    import importlib.util

    path = ROOT / "benchmarks" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"rawgraph_bench_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses need it registered while it loads
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


# (M, K, N, cut): every form -- no split, a cluster split (also not a power of two), in-CTA slices,
# both, every warp tile, both accumulation forms -- with tails in M, K and N
CUTS = [
    (70, 1004, 260, Tf32x3Cut(128, 128, 32, 4, wm=64, wn=32, flush=2)),
    (37, 1000, 996, Tf32x3Cut(96, 128, 32, 4, split=3, wm=48, wn=32, flush=4)),
    (100, 1000, 132, Tf32x3Cut(32, 128, 16, 3, split=8, wm=32, wn=64, flush=1)),
    (65, 520, 260, Tf32x3Cut(32, 64, 8, 2, slices=4, wm=16, wn=32, flush=1)),
    (33, 1000, 996, Tf32x3Cut(64, 128, 32, 3, split=2, slices=2, wm=32, wn=32, flush=0)),
    (20, 1000, 260, Tf32x3Cut(32, 128, 16, 3, minb=2, wm=16, wn=64, flush=2)),
]


@pytest.mark.parametrize("m,k,n,cut", CUTS)
def test_tf32x3_shape_numbers(m, k, n, cut):
    """Expression, grid, threads and shared memory, worked out by hand from the kernel's header."""
    shape = tf32x3_shape(m, k, n, cut)
    assert shape.kernel == "tf32x3" and matmul_file(shape) == "tf32x3" and tf32x3_cut(shape) == cut
    assert shape.grid == (-(-n // cut.bn), cut.split, -(-m // cut.bm))
    warps = (cut.bm // cut.wm) * (cut.bn // cut.wn)
    assert shape.threads == cut.threads == cut.slices * warps * 32
    stage = cut.bm * (cut.bk + 4) + cut.bk * (cut.bn + 8)
    part = cut.slices * cut.bm * (cut.bn + 4) if cut.split * cut.slices > 1 else 0
    assert (
        gemm_smem_bytes(shape)
        == tf32x3_smem_bytes(cut.bm, cut.bn, cut.bk, cut.stages, cut.split, cut.slices)
        == 4 * max(cut.slices * cut.stages * stage, part)
    )
    tail = f"{cut.bm}, {cut.bn}, {cut.bk}, {cut.stages}, "
    tail += (f"{cut.split}, " if cut.split > 1 else "") + f"{cut.slices}, {cut.minb}, {cut.wm}, {cut.wn}, {cut.flush}>"
    for epi, e in ops.EPILOGUES.items():
        kind = "tf32x3_split_kernel" if cut.split > 1 else "tf32x3_kernel"
        assert matmul_expr(epi, shape) == f"{kind}<{e}, {tail}"


def test_tf32x3_numbers_by_hand():
    shape = tf32x3_shape(256, 4096, 4096, Tf32x3Cut(128, 128, 32, 4, split=2))
    assert shape.grid == (32, 2, 2) and shape.threads == 256 and shape.ctas == 128
    assert gemm_smem_bytes(shape) == 4 * 4 * (128 * 36 + 32 * 136) == 143360
    assert matmul_expr("relu", shape) == "tf32x3_split_kernel<1, 128, 128, 32, 4, 2, 1, 1, 64, 32, 2>"


@pytest.mark.parametrize(
    "cut,clusters,match",
    [
        (Tf32x3Cut(64, 64, 16, 3, wm=24, wn=32), True, "warp tiles"),
        (Tf32x3Cut(64, 64, 16, 3, wm=32, wn=16), True, "warp tiles"),
        (Tf32x3Cut(128, 128, 16, 3, wm=64, wn=64), True, "accumulators"),
        (Tf32x3Cut(80, 64, 16, 3, wm=32, wn=32), True, "whole warp tiles"),
        (Tf32x3Cut(64, 96, 16, 3, wm=32, wn=64), True, "whole warp tiles"),
        (Tf32x3Cut(64, 64, 12, 3, wm=32, wn=32), True, "multiple of 8"),
        (Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32, flush=4), True, "runs of 4"),
        (Tf32x3Cut(64, 64, 16, 1, wm=32, wn=32), True, "2 pipeline stages"),
        (Tf32x3Cut(64, 64, 16, 3, split=2, wm=32, wn=32), False, "clusters"),
        (Tf32x3Cut(64, 64, 16, 3, split=9, wm=32, wn=32), True, "split 9"),
        (Tf32x3Cut(64, 64, 16, 3, slices=9, wm=32, wn=32), True, "slices"),
        (Tf32x3Cut(128, 128, 16, 3, slices=3, wm=32, wn=32), True, "threads per CTA"),
        (Tf32x3Cut(128, 128, 16, 3, minb=9, wm=64, wn=32), True, "threads per SM"),
    ],
)
def test_tf32x3_shape_refuses_what_the_kernel_cannot_be(cut, clusters, match):
    with pytest.raises(ShapeError, match=match):
        tf32x3_shape(64, 1024, 1024, cut, clusters=clusters)


def test_tf32x3_shape_refuses_an_empty_product_and_a_huge_grid():
    with pytest.raises(ShapeError, match=">= 1"):
        tf32x3_shape(0, 64, 64, Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32))
    with pytest.raises(ShapeError, match="65535"):
        tf32x3_shape(16 * 65536, 64, 64, Tf32x3Cut(16, 64, 16, 3, wm=16, wn=32))
    with pytest.raises(ShapeError, match="warp tile"):
        MatmulShape("tf32x3", 4, 64, 64, 1, (1, 1, 1), 0, 1, 16, 3, 1, 0, 24, 32)


def test_precision_picks_the_kernel_and_falls_back_to_fp32():
    for m, w in GRID:
        fp32 = matmul_shape(m, w, w, SMS, smem_limit=OPTIN)
        assert fp32 == matmul_shape(m, w, w, SMS, smem_limit=OPTIN, precision="fp32") and fp32.kernel != "tf32x3"
        tx = matmul_shape(m, w, w, SMS, smem_limit=OPTIN, precision="tf32x3")
        assert tx.kernel == "tf32x3" and tx == tf32x3_shape(m, w, w, tf32x3_cut(tx))
        # where the kernel's layout rules exclude the operands: the fp32 cut, unchanged
        for kw in ({"x_aligned16": False}, {"w_aligned16": False}):
            assert matmul_shape(m, w, w, SMS, smem_limit=OPTIN, precision="tf32x3", **kw) == matmul_shape(
                m, w, w, SMS, smem_limit=OPTIN, **kw
            )
    for k, n in ((1002, 1024), (1024, 1002)):
        assert matmul_shape(64, k, n, SMS, precision="tf32x3") == matmul_shape(64, k, n, SMS)
    with pytest.raises(ValueError, match="precision"):
        matmul_shape(64, 1024, 1024, SMS, precision="tf32")


def test_default_cut_fills_the_gpu_with_little_padding():
    """The default rule at the serving grid: a row tile that wastes less than 32 rows a tile, one
    CTA per SM reached (or the largest split taken), at least 4 stages of K a part, within the
    shared memory of an H100 / H200, no cluster split without clusters."""
    for m, w in GRID:
        cut = tf32x3_default_cut(m, w, w, SMS, smem_limit=OPTIN)
        shape = tf32x3_shape(m, w, w, cut)
        tiles = -(-m // cut.bm)
        assert tiles * cut.bm - m < 32 * tiles or cut.bm == 16, (m, w, cut)
        assert shape.ctas >= 0.9 * SMS or cut.split == ops.MAX_SPLIT, (m, w, cut)
        assert -(-w // cut.split) >= 4 * cut.bk, (m, w, cut)
        assert gemm_smem_bytes(shape) <= OPTIN and cut.flush == 2
        assert tf32x3_default_cut(m, w, w, SMS, clusters=False).split == 1
    assert tf32x3_default_cut(256, 4096, 4096, SMS) == Tf32x3Cut(128, 128, 32, 4, split=2, wm=64, wn=32, flush=2)
    small = tf32x3_default_cut(64, 4096, 4096, SMS, smem_limit=48 * 1024)  # fewer stages where memory is short
    assert (
        tf32x3_smem_bytes(small.bm, small.bn, small.bk, small.stages, small.split, 1) <= 48 * 1024 or small.stages == 2
    )


def test_table_entry_is_used_for_its_shape_and_the_row_counts_just_below(monkeypatch):
    entry = Tf32x3Cut(64, 128, 16, 4, split=2, slices=1, minb=1, wm=32, wn=64, flush=1)
    monkeypatch.setattr(gemm, "TF32X3_CUTS", {(64, 4096, 4096): entry})
    assert gemm.TF32X3_ROW_STEP == 8
    for m in range(57, 65):
        assert matmul_shape(m, 4096, 4096, SMS, precision="tf32x3") == tf32x3_shape(m, 4096, 4096, entry), m
    for other in ((65, 4096, 4096), (56, 4096, 4096), (64, 1024, 1024), (64, 4096, 4092)):
        got = matmul_shape(*other, SMS, precision="tf32x3")
        assert got.kernel == "tf32x3" and tf32x3_cut(got) != entry, other
    # an entry this device cannot run: the default rule's cut
    for kw in ({"clusters": False}, {"smem_limit": 32 * 1024}):
        got = matmul_shape(64, 4096, 4096, SMS, precision="tf32x3", **kw)
        assert tf32x3_cut(got) == tf32x3_default_cut(64, 4096, 4096, SMS, **kw)
    monkeypatch.setattr(gemm, "TF32X3_CUTS", {(64, 4096, 4096): (64, 128, 16, 4, 2, 1, 1, 32, 64, 1)})
    with pytest.raises(ShapeError, match="Tf32x3Cut"):
        matmul_shape(64, 4096, 4096, SMS, precision="tf32x3")
    monkeypatch.setattr(gemm, "TF32X3_CUTS", {(64, 4096, 4096): replace(entry, wn=48)})
    with pytest.raises(ShapeError, match="warp tiles"):
        matmul_shape(64, 4096, 4096, SMS, precision="tf32x3")


def test_hand_picked_tf32x3_cuts_are_checked():
    x, w = _arr((64, 1000)), _arr((1000, 996))
    good = tf32x3_shape(64, 1000, 996, Tf32x3Cut(64, 128, 16, 3, split=2, wm=32, wn=32))
    _check_shape(good, 64, 1000, 996, x, w, clusters=True)
    with pytest.raises(LayoutError, match="16-byte"):
        _check_shape(good, 64, 1000, 996, _arr((64, 1000), 0x7F0000000004), w, clusters=True)
    with pytest.raises(LayoutError, match="K % 4"):
        _check_shape(
            tf32x3_shape(64, 998, 996, tf32x3_cut(good)), 64, 998, 996, _arr((64, 998)), _arr((998, 996)), clusters=True
        )
    with pytest.raises(ShapeError, match="clusters"):
        _check_shape(good, 64, 1000, 996, x, w, clusters=False)
    with pytest.raises(ShapeError, match="does not fit"):
        _check_shape(good, 72, 1000, 996, _arr((72, 1000)), w, clusters=True)  # the grid of 64 rows
    big = tf32x3_shape(64, 1000, 996, Tf32x3Cut(128, 128, 32, 8, wm=64, wn=32))
    assert gemm_smem_bytes(big) > OPTIN
    with pytest.raises(ShapeError, match="shared memory"):
        _check_shape(big, 64, 1000, 996, x, w, clusters=True, smem_limit=OPTIN)


def _served_cuts():
    return sorted(
        {tf32x3_cut(matmul_shape(m, w, w, SMS, precision="tf32x3", smem_limit=OPTIN)) for m, w in GRID}
        | set(gemm.TF32X3_CUTS.values()),
        key=lambda c: tuple(vars(c).values()),
    )


def _ptxas(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v lines -> {mangled name: {registers, spill_stores, stack}}."""
    info: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        mt = re.search(r"Compiling entry function '([_A-Za-z0-9]+)'", line)
        if mt:
            cur = info.setdefault(mt.group(1), {})
        elif cur is not None and (mt := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)):
            cur.update(stack=int(mt.group(1)), spill_stores=int(mt.group(2)))
        elif cur is not None and (mt := re.search(r"Used (\d+) registers", line)):
            cur["registers"] = int(mt.group(1))
    return info


def test_every_tf32x3_cut_compiles_for_sm90_within_its_registers():
    """Every cut the dispatcher serves at the serving grid (table entries and the default rule,
    with each epilogue) and every hand-picked form compiles to a CUBIN for sm_90. ptxas' counts for
    the served cuts: at most 255 registers, and spills (if any) no more than the 64 bytes of loader
    state reloaded once a stage, never a large spill of accumulators. (A hand-picked form may spill:
    512 threads leave 128 registers a thread.)"""
    served = [tf32x3_shape(cut.bm, 1024, 1024, cut) for cut in _served_cuts()]
    forms = [tf32x3_shape(m, k, n, c) for m, k, n, c in CUTS]
    names = sorted(
        {matmul_expr(e, s) for s in served + forms[:2] for e in ops.EPILOGUES} | {matmul_expr("add", s) for s in forms}
    )
    assert any(n.startswith("tf32x3_split_kernel<") for n in names) and any(
        n.startswith("tf32x3_kernel<") for n in names
    )
    out = compile_source(
        kernel_source("tf32x3"), "tf32x3.cu", "sm_90", names, ("-std=c++17", "--ptxas-options=-v"), cache=False
    )
    assert out.image[:4] == b"\x7fELF" and set(out.lowered) == set(names)
    info = _ptxas(out.log)
    served_names = {matmul_expr(e, s) for s in served for e in ops.EPILOGUES}
    for name, sym in out.lowered.items():
        assert sym.startswith("_Z") and sym.encode() in out.image
        rec = info[sym]
        assert rec["registers"] <= 255, (name, rec)
        if name in served_names:
            assert rec["spill_stores"] <= 64, (name, rec)


# -- launches on the fake driver (tests/fakedriver.py): real NVRTC cubins ---------------------------


@pytest.fixture(scope="module")
def fake():
    from fault_cases import fake_session

    with fake_session() as (fake, hook):
        hook.active = False
        yield fake


def test_tf32x3_launch_is_built_from_its_cut(fake):
    from rawgraph import DeviceBuffer, get_device

    dev = get_device()
    m, k, n = 70, 1000, 260
    with DeviceBuffer((m, k)) as x, DeviceBuffer((k, n)) as w, DeviceBuffer((m, n)) as y, DeviceBuffer((m, n)) as r:
        views = {"x": x.view(), "W": w.view(), "y": y.view(), "r": r.view()}
        for cut in (Tf32x3Cut(64, 64, 32, 3, split=4, wm=32, wn=32), Tf32x3Cut(96, 128, 16, 3, wm=48, wn=32, flush=1)):
            shape = tf32x3_shape(m, k, n, cut)
            launch = ops.matmul(dev, views, "x", "W", "y", "add", r="r", shape=shape, precision="tf32x3")
            assert launch.kernel.name == matmul_expr("add", shape)
            assert launch.grid == shape.grid and launch.block == (cut.threads, 1, 1)
            assert launch.shared_mem == gemm_smem_bytes(shape)
            if launch.shared_mem > 48 * 1024:
                assert launch.kernel.max_dynamic_smem >= launch.shared_mem
            assert launch.kernel.cluster_dims == ((1, cut.split, 1) if cut.split > 1 else (0, 0, 0))
            assert launch.args["flags"] == ops.FLAG_EARLY  # 1 MB of W: successor at the start
            assert ops.routes_rows(launch)
        auto = ops.matmul(dev, views, "x", "W", "y", precision="tf32x3")
        assert auto.kernel.name == matmul_expr(
            "none",
            matmul_shape(
                m,
                k,
                n,
                dev.info.multiprocessors,
                clusters=ops.has_clusters(dev),
                smem_limit=dev.info.smem_per_block_optin,
                precision="tf32x3",
            ),
        )
        assert (
            ops.matmul(dev, views, "x", "W", "y").kernel.name
            == ops.matmul(dev, views, "x", "W", "y", precision="fp32").kernel.name
        )
        assert not ops.matmul(dev, views, "x", "W", "y").kernel.name.startswith("tf32x3")
        with pytest.raises(ValueError, match="precision='tf32x3'"):
            ops.matmul(dev, views, "x", "W", "y", shape=tf32x3_shape(m, k, n, Tf32x3Cut(64, 64, 32, 3, wm=32, wn=32)))
        with pytest.raises(ValueError, match="precision must be"):
            ops.matmul(dev, views, "x", "W", "y", precision="bf16")
        big_k = 4096
        with DeviceBuffer((m, big_k)) as xb, DeviceBuffer((big_k, 1024)) as wb, DeviceBuffer((m, 1024)) as yb:
            late = ops.matmul(dev, {"x": xb.view(), "W": wb.view(), "y": yb.view()}, "x", "W", "y", precision="tf32x3")
            assert late.kernel.name.startswith("tf32x3") and late.args["flags"] == 0  # 16 MB of W: after the K loop


def test_routes_rows_is_false_for_a_lookalike(fake):
    from types import SimpleNamespace

    from rawgraph import DeviceBuffer, get_device

    dev = get_device()
    with DeviceBuffer((64, 256)) as x, DeviceBuffer((256, 256)) as w, DeviceBuffer((64, 256)) as y:
        launch = ops.matmul(
            dev,
            {"x": x.view(), "W": w.view(), "y": y.view()},
            "x",
            "W",
            "y",
            precision="tf32x3",
            shape=tf32x3_shape(64, 256, 256, Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32)),
        )
        other = SimpleNamespace(kernel=SimpleNamespace(name=launch.kernel.name, module=launch.kernel.module))
        assert ops.routes_rows(launch) and not ops.routes_rows(other)


# -- the sweep's helpers and the emulation ---------------------------------------------------------


def test_the_sweep_parses_named_cuts_and_prints_the_table_literal():
    import argparse

    sweep = _module("tf32x3_sweep")
    cut = sweep.parse_cut("bm=128,bn=128,bk=32,stages=4,split=2,flush=1")
    assert cut == Tf32x3Cut(128, 128, 32, 4, split=2, flush=1)
    for bad, why in (
        ("bm=100,bn=128,bk=32,stages=4", "whole warp tiles"),
        ("bm=64,bn=64", "stages"),
        ("bm=64,bn=64,bk=16,stages=3,tm=4", "name=value"),
        ("64,64,16,3", "name=value"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            sweep.parse_cut(bad)
    table = tf32x3_default_cut(256, 4096, 4096, SMS)
    alts = sweep.alternates(table, 4096, 10)
    assert alts and table not in alts and len(set(alts)) == len(alts)
    assert {c.flush for c in alts} >= {0, 1, 4}
    for c in alts:
        tf32x3_shape(256, 4096, 4096, c)

    def rec(us, err, **kw):
        e = {"fro": err, "worst_row": err}
        return dict(
            us=us,
            p10=us,
            p90=us,
            tflops=1.0,
            pct_tf32x3_ideal=1.0,
            pct_fp32_peak=1.0,
            err_normal=e,
            err_scaled=e,
            deterministic=True,
            **kw,
        )

    row = {
        "M": 128,
        "K": 4096,
        "N": 4096,
        "tf32x3": [
            rec(60.0, 1e-7, cut="t", values=vars(table), table=True),
            rec(50.0, 9e-7, cut="fast but inaccurate", values=vars(alts[0]), table=False),
        ],
        "fp32": rec(100.0, 5e-7),
        "cublas_fp32": rec(95.0, 4e-7),
        "triton_tf32x3": rec(70.0, 2e-7),
    }
    sweep.judge(row)
    assert row["best"]["cut"] == "t" and not row["tf32x3"][1]["accurate"]
    assert row["verdict_best"]["meets_targets"] and row["verdict_best"]["needed_vs_cublas_fp32"] == 1.5
    literal = sweep.cuts_literal({"rows": [row]})
    got = eval(literal.split("=", 1)[1], {"Tf32x3Cut": Tf32x3Cut})  # noqa: S307 - our own output
    assert got == {(128, 4096, 4096): table}
    assert "every shape met its targets" in sweep.table({"gpu": "g", "commit": "c", "rows": [row], "not_run": []})


@pytest.mark.slow
def test_emulation_subset_passes():
    """benchmarks/tf32x3_emulate.py --quick: one case of each form (no split, splits, slices, row
    tables, pointer slots, misaligned y / r, a NaN in x, scaled rows, the accuracy against an FFMA
    loop) run on the CPU with warp-wide ldmatrix and mma, every output against float64."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tf32x3_emulate.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and "PASSED: 0 failures" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("\nok ") >= 9


@pytest.mark.parametrize("k,flush", [(256, 1), (512, 1), (520, 2), (1024, 2), (4096, 2)])
def test_the_default_cut_runs_single_k8_steps_where_k_is_short(k, flush):
    """At K <= 512 the split operands' rounding dominates: runs of 2 k8 steps leave tf32x3 within a
    few percent of cuBLAS fp32's error (the accuracy gate), runs of 1 clearly below it."""
    from rawgraph.ops.gemm import tf32x3_default_cut

    assert tf32x3_default_cut(64, k, 1024, 132).flush == flush


def test_the_sweep_takes_its_peaks_from_the_device_it_ran_on():
    """The percentages of peak are the named GPU's (the H100 SXM's, which the H200 shares);
    another GPU gets none, and its table prints dashes rather than another device's figures."""
    import json

    sweep = _module("tf32x3_sweep")
    assert sweep.peaks("NVIDIA H100 80GB HBM3") == sweep.peaks("NVIDIA H200") == (66.9, 164.9)
    assert sweep.peaks("NVIDIA A100-SXM4-80GB") is None
    committed = ROOT / "benchmarks" / "results" / "tf32x3_sweep_2026-12-07_39e1c3f_h100.json"
    result = json.loads(committed.read_text())
    assert "% of 165.0 (TF32 peak / 3)" in sweep.table(result)
    for row in result["rows"]:
        for rec in [*row["tf32x3"], row["fp32"]]:
            rec["pct_tf32x3_ideal"] = rec["pct_fp32_peak"] = None
    result.update(gpu="NVIDIA A100-SXM4-80GB", tf32x3_ideal_tflops=None, fp32_peak_tflops=None)
    text = sweep.table(result)
    assert "% of (unknown) (TF32 peak / 3)" in text and "    --     --  err" in text
