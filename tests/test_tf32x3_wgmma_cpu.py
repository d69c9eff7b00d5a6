"""The warpgroup form of the fp32-accurate tensor-core GEMM (``kernels/tf32x3_wgmma.cu``) without a
GPU: the refusals of cuts the kernel cannot be (a ShapeError naming the field), the
``"tf32x3_wgmma"`` cut of :class:`MatmulShape` (expression, grid, threads, shared memory), the
default routing left alone, the sm_90a compile (every instantiation the default rule gives on the
serving grid, with ptxas' register and spill counts), a pure-Python model of the kernel's index
arithmetic (which (thread, register) writes each output, what the descriptors address, the split
pass's bank pattern), launches on the fake driver, and the host emulation's subset
(``benchmarks/probes/wgmma_emulate.py``: the kernel source run on the CPU with wgmma as a
warpgroup-wide exchange that decodes the descriptors)."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rawgraph import ShapeError, ops
from rawgraph.ops import gemm
from rawgraph.ops.gemm import (
    WgmmaCut,
    gemm_smem_bytes,
    matmul_expr,
    matmul_file,
    matmul_shape,
    tf32x3_wgmma_cut,
    tf32x3_wgmma_default_cut,
    tf32x3_wgmma_shape,
    tf32x3_wgmma_smem_bytes,
)
from rawgraph.runtime.compiler import arch_for_source, compile_source
from rawgraph.runtime.module import kernel_source

ROOT = Path(__file__).resolve().parent.parent
OPTIN = 232448  # H100 / H200: most dynamic shared memory one CTA may ask for
SMS = 132
SERVING = [(m, w) for w in (1024, 2048, 4096) for m in range(64, 257, 8)]

# (M, K, N, cut): one and two warpgroups, every column tile width, cluster splits, runs of 1..4
CUTS = [
    (70, 1004, 260, WgmmaCut(128, 128, 32, 4, flush=2)),
    (37, 1000, 996, WgmmaCut(64, 64, 16, 3, split=3, flush=1)),
    (100, 1000, 132, WgmmaCut(128, 32, 64, 3, split=8, flush=4)),
    (20, 520, 260, WgmmaCut(64, 96, 8, 5, minb=2, flush=1)),
    # runs=2 at the edges its rule allows (registers within 255, no spills)
    (70, 1004, 260, WgmmaCut(128, 96, 32, 3, flush=2, runs=2)),
    (37, 1000, 996, WgmmaCut(64, 96, 32, 3, minb=2, flush=2, runs=2)),
    (100, 1000, 132, WgmmaCut(128, 64, 64, 3, flush=2, runs=2)),
    (20, 520, 260, WgmmaCut(64, 64, 64, 3, minb=2, flush=4, runs=2)),
    (20, 520, 260, WgmmaCut(128, 64, 48, 3, flush=3, runs=2)),
]


def _served_cuts() -> set[WgmmaCut]:
    return {tf32x3_wgmma_default_cut(m, w, w, SMS, True, OPTIN, runs) for m, w in SERVING for runs in (1, 2)}


# -- cuts and shapes --------------------------------------------------------------------------------


def test_every_cut_the_gpu_tests_launch_fits_hopper_shared_memory():
    """The GPU tests' hand-picked cuts each fit one CTA's shared memory on an H100 / H200, so they
    test the kernel rather than meet the launch's refusal (two of them once did not)."""
    from test_tf32x3_wgmma_gpu import CUTS as GPU_CUTS

    over = [(c, gemm.tf32x3_wgmma_smem_bytes(c.bm, c.bn, c.bk, c.stages, c.split, c.runs)) for *_, c in GPU_CUTS]
    assert [(c, b) for c, b in over if b > OPTIN] == []


@pytest.mark.parametrize("m,k,n,cut", CUTS)
def test_wgmma_shape_numbers(m, k, n, cut):
    """Expression, grid, threads and shared memory, worked out from the kernel's header."""
    shape = tf32x3_wgmma_shape(m, k, n, cut)
    assert shape.kernel == "tf32x3_wgmma" and matmul_file(shape) == "tf32x3_wgmma" and tf32x3_wgmma_cut(shape) == cut
    assert shape.grid == (-(-n // cut.bn), cut.split, -(-m // cut.bm))
    assert shape.threads == cut.threads == 128 * (cut.bm // 64)
    stage = cut.bm * (cut.bk + 4) + cut.bk * cut.bn
    part = cut.bm * (cut.bn + 4) if cut.split > 1 else 0
    assert (
        gemm_smem_bytes(shape)
        == tf32x3_wgmma_smem_bytes(cut.bm, cut.bn, cut.bk, cut.stages, cut.split, cut.runs)
        == 4 * max(2 * (cut.runs + 1) * cut.bn * cut.bk + cut.stages * stage, part)
    )
    runs = "" if cut.runs == 1 else f", {cut.runs}"
    for epi, e in ops.EPILOGUES.items():
        if cut.split > 1:
            want = (
                f"tf32x3_wgmma_split_kernel<{e}, {cut.bm}, {cut.bn}, {cut.bk}, {cut.stages}, {cut.split}, "
                f"{cut.minb}, {cut.flush}{runs}>"
            )
        else:
            want = (
                f"tf32x3_wgmma_kernel<{e}, {cut.bm}, {cut.bn}, {cut.bk}, {cut.stages}, {cut.minb}, {cut.flush}{runs}>"
            )
        assert matmul_expr(epi, shape) == want


def test_wgmma_numbers_by_hand():
    shape = tf32x3_wgmma_shape(256, 4096, 4096, WgmmaCut(128, 128, 32, 4, split=2, flush=2))
    assert shape.grid == (32, 2, 2) and shape.threads == 256 and shape.ctas == 128
    assert gemm_smem_bytes(shape) == 4 * (4 * 128 * 32 + 4 * (128 * 36 + 32 * 128)) == 204800
    assert matmul_expr("relu", shape) == "tf32x3_wgmma_split_kernel<1, 128, 128, 32, 4, 2, 1, 2>"


@pytest.mark.parametrize(
    "cut,clusters,field",
    [
        (WgmmaCut(96, 64, 16, 3), True, "bm"),
        (WgmmaCut(256, 64, 16, 3), True, "bm"),
        (WgmmaCut(64, 48, 16, 3), True, "bn"),
        (WgmmaCut(64, 256, 16, 3), True, "bn"),
        (WgmmaCut(64, 0, 16, 3), True, "bn"),
        (WgmmaCut(64, 64, 12, 3), True, "bk"),
        (WgmmaCut(64, 64, 128, 3), True, "bk"),
        (WgmmaCut(64, 64, 16, 3, flush=0), True, "flush"),
        (WgmmaCut(64, 64, 16, 3, flush=4), True, "flush"),
        (WgmmaCut(64, 64, 16, 2), True, "stages"),
        (WgmmaCut(64, 64, 16, 3, split=2), False, "split"),
        (WgmmaCut(64, 64, 16, 3, split=9), True, "split"),
        (WgmmaCut(64, 64, 16, 3, split=0), True, "split"),
        (WgmmaCut(64, 64, 16, 3, slices=2), True, "slices"),
        (WgmmaCut(128, 64, 16, 3, minb=9), True, "minb"),
        (WgmmaCut(128, 64, 16, 3, minb=0), True, "minb"),
        (WgmmaCut(64, 64, 32, 3, flush=2, runs=3), True, "runs"),
        (WgmmaCut(64, 64, 32, 3, flush=2, runs=0), True, "runs"),
        (WgmmaCut(64, 128, 32, 3, flush=2, runs=2), True, "runs"),  # a third set of 64: spills
        (WgmmaCut(64, 96, 48, 3, flush=3, runs=2), True, "runs"),  # measured: spills
        (WgmmaCut(64, 64, 32, 3, flush=1, runs=2), True, "runs"),  # runs of 1: ptxas serializes
        (WgmmaCut(64, 64, 16, 3, flush=2, runs=2), True, "runs"),  # one run a stage
        (WgmmaCut(128, 32, 32, 3, minb=2, flush=2, runs=2), True, "runs"),  # 128 registers a thread
        (WgmmaCut(64, 64, 32, 3, split=2, flush=2, runs=2), True, "runs"),  # the split kernels serialize
    ],
)
def test_wgmma_shape_refuses_what_the_kernel_cannot_be(cut, clusters, field):
    """Every refusal is a ShapeError whose message starts by naming the bad field."""
    with pytest.raises(ShapeError, match=rf"^tf32x3_wgmma {field}\b"):
        tf32x3_wgmma_shape(64, 1024, 1024, cut, clusters=clusters)


def test_wgmma_shape_refuses_other_records_an_empty_product_and_a_huge_grid():
    with pytest.raises(TypeError, match="WgmmaCut"):
        tf32x3_wgmma_shape(64, 1024, 1024, ops.Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32))
    with pytest.raises(ShapeError, match="batch, K, N >= 1"):
        tf32x3_wgmma_shape(0, 1024, 1024, WgmmaCut(64, 64, 16, 3))
    with pytest.raises(ShapeError, match="grid z"):
        tf32x3_wgmma_shape(64 * 65536, 1024, 1024, WgmmaCut(64, 64, 16, 3))
    with pytest.raises(ShapeError, match="not a tf32x3_wgmma shape"):
        tf32x3_wgmma_cut(ops.tf32x3_shape(64, 1024, 1024, ops.Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32)))


def test_routing_picks_the_wgmma_kernel_from_its_table_only_where_the_device_runs_it():
    """``matmul_shape`` launches the warpgroup kernel at ``precision="tf32x3"`` on a device that
    runs it (``wgmma=True``) exactly where ``TF32X3_WGMMA_CUTS`` has the product (its rows rounded
    up to the table's row step), and that entry's cut; never at ``"fp32"`` or without ``wgmma``."""
    step = ops.TF32X3_ROW_STEP
    picked = 0
    for m, w in SERVING + [(8, 1024), (1, 4096), (512, 4096), (57, 1024), (121, 4096), (250, 4096), (249, 2048)]:
        for precision in ops.PRECISIONS:
            for wgmma in (False, True):
                shape = matmul_shape(m, w, w, SMS, clusters=True, smem_limit=OPTIN, precision=precision, wgmma=wgmma)
                entry = ops.TF32X3_WGMMA_CUTS.get((-(-m // step) * step, w, w))
                if precision == "tf32x3" and wgmma and entry is not None:
                    assert shape.kernel == "tf32x3_wgmma" and tf32x3_wgmma_cut(shape) == entry, (m, w)
                    picked += 1
                else:
                    assert shape.kernel != "tf32x3_wgmma", (m, w, precision, wgmma)
    assert picked >= 8


def test_a_malformed_wgmma_table_entry_is_refused(monkeypatch):
    monkeypatch.setitem(ops.TF32X3_WGMMA_CUTS, (64, 1024, 1024), ops.Tf32x3Cut(64, 64, 32, 4))
    with pytest.raises(ShapeError, match=r"TF32X3_WGMMA_CUTS\[\(64, 1024, 1024\)\].*expected WgmmaCut, got Tf32x3Cut"):
        matmul_shape(64, 1024, 1024, SMS, smem_limit=OPTIN, precision="tf32x3", wgmma=True)


def test_the_wgmma_table_text_is_one_row_per_product_in_named_columns():
    """TF32X3_WGMMA_TABLE: the header names WgmmaCut's fields, rows on the row grid sorted by
    (K, N, M), each a cut the kernel can be that fits an H100's shared memory; the formatter prints
    the same text back."""
    cuts = ops.TF32X3_WGMMA_CUTS
    assert cuts == ops.parse_cut_table(ops.TF32X3_WGMMA_TABLE, WgmmaCut)
    assert ops.format_cut_table(cuts, WgmmaCut) == ops.TF32X3_WGMMA_TABLE.strip("\n")
    for key, cut in cuts.items():
        assert key[0] % ops.TF32X3_ROW_STEP == 0, key
        assert gemm_smem_bytes(tf32x3_wgmma_shape(*key, cut)) <= OPTIN, (key, cut)
    with pytest.raises(ValueError, match="header"):
        ops.parse_cut_table(ops.SGEMM_TABLE, WgmmaCut)


def test_the_default_cut_is_a_valid_cut_that_fits():
    for m, w in SERVING:
        cut = tf32x3_wgmma_default_cut(m, w, w, SMS, True, OPTIN)
        shape = tf32x3_wgmma_shape(m, w, w, cut)
        assert gemm_smem_bytes(shape) <= OPTIN
        assert cut.flush == 2 and (w // cut.split) // cut.bk >= 4
    assert tf32x3_wgmma_default_cut(64, 512, 1024, SMS).flush == 1
    for m, w in SERVING:  # the two-run form's first guess: valid, fits, runs of 2, two a stage
        cut = tf32x3_wgmma_default_cut(m, w, w, SMS, True, OPTIN, runs=2)
        assert cut.runs == 2 and cut.flush == 2 and cut.bk == 32 and cut.bn == 64 and cut.split == 1
        assert gemm_smem_bytes(tf32x3_wgmma_shape(m, w, w, cut)) <= OPTIN
        one = tf32x3_wgmma_default_cut(m, w, w, SMS, True, OPTIN)
        assert tf32x3_wgmma_default_cut(m, w, w, SMS, True, OPTIN, runs=1) == one and one.runs == 1
    assert tf32x3_wgmma_default_cut(64, 512, 1024, SMS, runs=2).runs == 1  # runs of 1 there
    assert tf32x3_wgmma_default_cut(256, 4096, 4096, SMS, clusters=False).split == 1


def test_wgmma_available_is_compute_capability_9_0_exactly():
    from types import SimpleNamespace

    def dev(cc):
        return SimpleNamespace(info=SimpleNamespace(compute_capability=cc))

    assert ops.wgmma_available(dev((9, 0)))
    assert not any(ops.wgmma_available(dev(cc)) for cc in ((8, 0), (8, 9), (10, 0), (12, 0)))


# -- the compile: sm_90a for this file only ---------------------------------------------------------


def test_only_a_source_that_asks_is_compiled_for_sm90a():
    wg = kernel_source("tf32x3_wgmma")
    assert arch_for_source(wg, "sm_90") == "sm_90a"
    for arch in ("sm_80", "sm_89", "sm_100", "sm_120", "sm_90a"):
        assert arch_for_source(wg, arch) == arch
    for name in ("tf32x3", "sgemm", "matmul", "block", "elementwise"):
        assert arch_for_source(kernel_source(name), "sm_90") == "sm_90"
    assert arch_for_source("// #define RG_ARCH_SPECIFIC_SM 90\n", "sm_90") == "sm_90"
    assert arch_for_source("#define RG_ARCH_SPECIFIC_SM 100\n", "sm_90") == "sm_90"


def _ptxas(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v lines -> {mangled name: {registers, spill_stores, spill_loads, stack}}."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\S+)", line):
            cur = out.setdefault(m.group(1), {})
        elif cur is not None and (
            mt := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        ):
            cur.update(stack=int(mt.group(1)), spill_stores=int(mt.group(2)), spill_loads=int(mt.group(3)))
        elif cur is not None and (mt := re.search(r"Used (\d+) registers", line)):
            cur["registers"] = int(mt.group(1))
    return out


def test_every_wgmma_cut_compiles_for_sm90a_without_spills():
    """Every cut the default rule gives on the serving grid (M = 64..256, K = N = 1024, 2048,
    4096) and every cut of the table matmul launches, with each epilogue, and every hand-picked form compiles to an sm_90a CUBIN (asked for
    sm_90: the source asks for the arch-specific target) with no spills and no stack at most 255
    registers, and no wgmma serialization warning from ptxas (its sign that it could not keep the
    accumulators in place across the asynchronous instructions)."""
    served = [tf32x3_wgmma_shape(cut.bm, 1024, 1024, cut) for cut in _served_cuts()]
    forms = [tf32x3_wgmma_shape(m, k, n, c) for m, k, n, c in CUTS]
    forms += [tf32x3_wgmma_shape(*key, c) for key, c in ops.TF32X3_WGMMA_CUTS.items()]  # what matmul launches
    names = sorted({matmul_expr(e, s) for s in served + forms for e in ops.EPILOGUES})
    assert any(n.startswith("tf32x3_wgmma_split_kernel<") for n in names)
    assert any(n.startswith("tf32x3_wgmma_kernel<") for n in names)
    out = compile_source(
        kernel_source("tf32x3_wgmma"),
        "tf32x3_wgmma.cu",
        "sm_90",
        names,
        ("-std=c++17", "--ptxas-options=-v"),
        cache=False,
    )
    assert out.arch == "sm_90a" and out.image[:4] == b"\x7fELF" and set(out.lowered) == set(names)
    # The one-run form: no ptxas warning and no serialized wgmma's or injected waits. The two-run
    # form (names ending ", 2>") compiles without spills, but ptxas still reports C7514 / C7517
    # (serialized wgmma's or an injected wait_group) for it: a known open item, checked for the
    # one-run form's functions only.
    assert any(n.endswith(", 2>") for n in names)  # the two-run form is among them
    assert "warning" not in out.log.lower(), out.log
    two = {out.lowered[n] for n in names if n.endswith(", 2>")}
    notes = [ln for ln in out.log.splitlines() if re.search(r"serializ|C7514|C7517", ln, re.I)]
    assert all(any(sym in ln for sym in two) for ln in notes), notes
    info = _ptxas(out.log)
    for name, sym in out.lowered.items():
        rec = info[sym]
        assert rec["registers"] <= 255, (name, rec)
        assert rec["spill_stores"] == rec["spill_loads"] == rec["stack"] == 0, (name, rec)


def test_the_wgmma_source_compiles_to_a_trap_for_other_targets():
    """Compiled for a target without wgmma (a device the host refuses anyway) the kernels are a
    trap, not a compile error."""
    name = "tf32x3_wgmma_kernel<0, 64, 64, 16, 3, 1, 1>"
    out = compile_source(kernel_source("tf32x3_wgmma"), "tf32x3_wgmma.cu", "sm_80", [name], cache=False)
    assert out.arch == "sm_80" and out.image[:4] == b"\x7fELF"


# -- a pure-Python model of the kernel's index arithmetic -------------------------------------------


def perm(c: int) -> int:
    """tf32x3_wgmma.cu's wx_perm: c = 32h + 8a + 2b + e -> 32h + 8b + 2a + e."""
    return (c & ~31) | ((c & 6) << 2) | ((c >> 2) & 6) | (c & 1)


def d_layout(warp: int, lane: int, i: int) -> tuple[int, int]:
    """PTX ISA / CUTLASS CLayout_64xN: (row in the warpgroup's 64, wgmma column) of register i."""
    g, t = lane // 4, lane % 4
    return 16 * warp + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


def desc(addr: int, lbo: int, sbo: int) -> int:
    """tf32x3_wgmma.cu's wx_desc."""
    return ((addr >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)


def desc_read(d: int, n: int, k: int) -> int:
    """The byte a wgmma reads B(k, n) from, by the canonical K-major unswizzled layout."""
    assert d >> 62 == 0 and (d >> 49) & 7 == 0
    start, lbo, sbo = (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4
    return start + (n // 8) * sbo + 16 * (n % 8) + (k // 4) * lbo + 4 * (k % 4)


def test_perm_is_an_involution_within_each_32_column_group():
    for c in range(128):
        assert perm(perm(c)) == c and perm(c) // 32 == c // 32
    assert sorted(perm(c) for c in range(128)) == list(range(128))


@pytest.mark.parametrize("bm,bn", [(64, 32), (64, 128), (128, 64), (128, 96), (128, 128)])
def test_every_output_is_written_once_by_the_register_that_holds_it(bm, bn):
    """The epilogue's out4 (h, u, rr) -> registers i0, i0 + 1, i0 + 4, i0 + 5 with
    i0 = 4 (4h + 2u) + 2rr, for columns 32h + 8t + 4u .. + 3 of row 64 wg + 16 warp + g + 8 rr: by
    the D layout and the column permutation each register holds that output, and every output of
    the tile is written exactly once."""
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for tid in range(128 * (bm // 64)):
        wg, warp, lane = tid // 128, (tid // 32) % 4, tid % 32
        g, t = lane // 4, lane % 4
        for rr in range(2):
            for h in range(bn // 32):
                for u in range(2):
                    i0 = 4 * (4 * h + 2 * u) + 2 * rr
                    for q, i in enumerate((i0, i0 + 1, i0 + 4, i0 + 5)):
                        assert 0 <= i < bn // 2
                        row, col = 64 * wg + 16 * warp + g + 8 * rr, 32 * h + 8 * t + 4 * u + q
                        drow, dcol = d_layout(warp, lane, i)
                        assert (64 * wg + drow, perm(dcol)) == (row, col), (tid, rr, h, u, q)
                        assert (row, col) not in seen, ((row, col), seen.get((row, col)), (tid, i))
                        seen[(row, col)] = (tid, i)
    assert len(seen) == bm * bn


@pytest.mark.parametrize("bn,bk", [(32, 8), (64, 16), (96, 32), (128, 32), (128, 64)])
def test_the_descriptors_read_what_the_split_pass_wrote(bn, bk):
    """The split pass writes B row c, k = 4 kg + q at float kg * 4 BN + 4c + q of a split tile
    (item it of k8 step j: kg = 2j + it / BN, c = it % BN), from W column perm(c); the descriptor
    of k8 step j (start 2j LBO, LBO 16 BN, SBO 128) reads B(k, n) of that step exactly there, so
    the wgmma multiplies by W[8j + k, perm(n)]. Each element is written once."""
    lbo, sbo, base = 16 * bn, 128, 4096  # base: any 16-byte aligned split tile address
    written: dict[int, tuple[int, int]] = {}  # byte -> (K row of the stage, W column)
    for j in range(bk // 8):
        for it in range(2 * bn):
            kg, c = 2 * j + it // bn, it % bn
            for q in range(4):
                byte = base + 4 * (kg * 4 * bn + 4 * c + q)
                assert byte not in written
                written[byte] = (4 * kg + q, perm(c))
    assert len(written) == bn * bk
    for j in range(bk // 8):
        d = desc(base + 2 * j * lbo, lbo, sbo)
        assert ((d >> 16) & 0x3FFF) << 4 == lbo and ((d >> 32) & 0x3FFF) << 4 == sbo
        for n in range(bn):
            for k in range(8):
                assert written[desc_read(d, n, k)] == (8 * j + k, perm(n))


def test_descriptor_addresses_fit_their_fields():
    """Start addresses up to the largest shared memory a CTA may have (>> 4 in 14 bits), LBO up to
    16 x 128 bytes, SBO 128: nothing is cut off."""
    assert (OPTIN >> 4) < (1 << 14) and ((16 * 128) >> 4) < (1 << 14)
    d = desc(OPTIN - 16, 2048, 128)
    assert (d & 0x3FFF) << 4 == OPTIN - 16 and d >> 46 == 0


@pytest.mark.parametrize("bn,threads", [(32, 128), (64, 256), (128, 128), (128, 256)])
def test_the_split_pass_is_free_of_bank_conflicts(bn, threads):
    """A warp's 4-byte loads of one raw W row (row stride BN) hit 32 different banks; each quarter
    warp's 16-byte stores hit 8 different 16-byte bank groups."""
    items = 2 * bn
    for w0 in range(0, min(items, threads), 32):
        its = [it for it in range(w0, w0 + 32) if it < items]
        for q in range(4):
            banks = [((4 * (it // bn) + q) * bn + perm(it % bn)) % 32 for it in its]
            assert len(set(banks)) == len(banks)
        for q0 in range(0, len(its), 8):
            groups = [((it // bn) * 4 * bn + 4 * (it % bn)) // 4 % 8 for it in its[q0 : q0 + 8]]
            assert len(set(groups)) == len(groups)


# -- launches on the fake driver (real NVRTC cubins) ------------------------------------------------


@pytest.fixture(scope="module")
def fake():
    from fault_cases import fake_session

    with fake_session() as (fake, hook):
        hook.active = False
        yield fake


def test_wgmma_launch_is_built_from_its_cut(fake, monkeypatch):
    from rawgraph import DeviceBuffer, get_device

    dev = get_device()
    m, k, n = 70, 1000, 260
    with DeviceBuffer((m, k)) as x, DeviceBuffer((k, n)) as w, DeviceBuffer((m, n)) as y, DeviceBuffer((m, n)) as r:
        views = {"x": x.view(), "W": w.view(), "y": y.view(), "r": r.view()}
        for cut in (WgmmaCut(64, 64, 16, 3, split=4), WgmmaCut(128, 128, 32, 4, flush=2)):
            shape = tf32x3_wgmma_shape(m, k, n, cut)
            launch = ops.matmul(dev, views, "x", "W", "y", "add", r="r", shape=shape, precision="tf32x3")
            assert launch.kernel.name == matmul_expr("add", shape)
            assert launch.kernel.module.compiled.arch == "sm_90a"
            assert launch.grid == shape.grid and launch.block == (cut.threads, 1, 1)
            assert launch.shared_mem == gemm_smem_bytes(shape)
            if launch.shared_mem > 48 * 1024:
                assert launch.kernel.max_dynamic_smem >= launch.shared_mem
            assert launch.kernel.cluster_dims == ((1, cut.split, 1) if cut.split > 1 else (0, 0, 0))
            assert launch.args["flags"] == ops.FLAG_EARLY  # 1 MB of W: successor at the start
            assert ops.routes_rows(launch)
        shape = tf32x3_wgmma_shape(m, k, n, WgmmaCut(64, 64, 16, 3))
        with pytest.raises(ValueError, match="precision='tf32x3'"):
            ops.matmul(dev, views, "x", "W", "y", shape=shape)
        with pytest.raises(ShapeError, match="does not fit"):
            wrong = tf32x3_wgmma_shape(m + 64, k, n, WgmmaCut(64, 64, 16, 3))
            ops.matmul(dev, views, "x", "W", "y", shape=wrong, precision="tf32x3")
        assert (m, k, n) not in ops.TF32X3_WGMMA_CUTS
        assert not ops.matmul(dev, views, "x", "W", "y", precision="tf32x3").kernel.name.startswith("tf32x3_wgmma")
        monkeypatch.setattr(gemm, "WGMMA_COMPUTE_CAPABILITY", (10, 0))
        with pytest.raises(ShapeError, match="compute capability"):
            ops.matmul(dev, views, "x", "W", "y", shape=shape, precision="tf32x3")


def test_matmul_launches_the_wgmma_table_cut_on_9_0_only(fake, monkeypatch):
    """At a product of TF32X3_WGMMA_CUTS, ``ops.matmul(precision="tf32x3")`` (and so a model at
    ``"tf32x3"``, or at ``"auto"`` where that picks tf32x3) launches the entry's cut on the fake
    driver's 9.0 device, and the mma.sync kernel on a device of another compute capability."""
    from rawgraph import DeviceBuffer, get_device

    dev = get_device()
    m, k = 64, 1024
    cut = ops.TF32X3_WGMMA_CUTS[(m, k, k)]
    with DeviceBuffer((m, k)) as x, DeviceBuffer((k, k)) as w, DeviceBuffer((m, k)) as y:
        views = {"x": x.view(), "W": w.view(), "y": y.view()}
        launch = ops.matmul(dev, views, "x", "W", "y", "relu", precision="tf32x3")
        assert launch.kernel.name == matmul_expr("relu", tf32x3_wgmma_shape(m, k, k, cut))
        assert launch.grid == tf32x3_wgmma_shape(m, k, k, cut).grid
        assert ops.matmul(dev, views, "x", "W", "y", precision="fp32").kernel.name.startswith("sgemm")
        monkeypatch.setattr(gemm, "WGMMA_COMPUTE_CAPABILITY", (10, 0))
        other = ops.matmul(dev, views, "x", "W", "y", "relu", precision="tf32x3")
        assert other.kernel.name.startswith("tf32x3_") and not other.kernel.name.startswith("tf32x3_wgmma")


# -- the host emulation ------------------------------------------------------------------------------


@pytest.mark.slow
def test_wgmma_emulation_subset_passes():
    """benchmarks/probes/wgmma_emulate.py --quick: one and two warpgroups, runs of 1 and 2, a
    cluster split, row tables, a NaN in x, every output against float64, wgmma's executed at the
    wait that completes them; the two-run form (runs=2, wait_group 1) on the same products, bit
    for bit equal to the one-run form of its cut."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "probes" / "wgmma_emulate.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and "PASSED: 0 failures" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("\nok ") >= 8 and "RUNS2" in proc.stdout


# -- the sweep's wgmma rows ---------------------------------------------------------------------------


def test_the_sweep_parses_wgmma_cuts_and_judges_their_rows():
    import argparse
    import importlib.util

    path = ROOT / "benchmarks" / "tf32x3_sweep.py"
    spec = importlib.util.spec_from_file_location("rawgraph_bench_tf32x3_sweep_wg", path)
    sweep = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sweep
    spec.loader.exec_module(sweep)
    assert sweep.parse_wgmma_cut("bm=128,bn=128,bk=32,stages=4,split=2,flush=2") == WgmmaCut(
        128, 128, 32, 4, 2, flush=2
    )
    for bad, why in (
        ("bm=96,bn=128,bk=32,stages=4", "bm"),
        ("bm=64,bn=64,bk=16,stages=2", "stages"),
        ("wm=64", "name"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            sweep.parse_wgmma_cut(bad)
    first = tf32x3_wgmma_default_cut(128, 4096, 4096, SMS, True, OPTIN)
    alts = sweep.wgmma_alternates(first, 4096, 10)
    assert alts and first not in alts and len(set(alts)) == len(alts)
    for c in alts:
        tf32x3_wgmma_shape(128, 4096, 4096, c)
    search = sweep.wgmma_search(128, 4096, SMS, OPTIN)
    one_wave = WgmmaCut(bm=128, bn=64, bk=32, stages=4, split=2, flush=2)  # 128 CTAs in 64 clusters of 2
    assert one_wave in search
    assert WgmmaCut(bm=128, bn=128, bk=32, stages=4, split=3, flush=2) in search  # 96 CTAs, clusters of 3
    assert WgmmaCut(bm=128, bn=128, bk=32, stages=4, split=2, flush=2) not in search  # 64 CTAs: SMs idle
    for c in search:
        tf32x3_wgmma_shape(128, 4096, 4096, c)
    # the sweep's extras are the search's cuts it does not list anyway, and none without the flag
    stub = types.SimpleNamespace(
        a=types.SimpleNamespace(wgmma_search=True),
        sms=SMS,
        dev=types.SimpleNamespace(info=types.SimpleNamespace(smem_per_block_optin=OPTIN)),
    )
    extras = sweep.Sweep.wgmma_extras(stub, 128, 4096, [first, one_wave])
    assert one_wave not in extras and set(extras) == set(search) - {first, one_wave}
    stub.a.wgmma_search = False
    assert sweep.Sweep.wgmma_extras(stub, 128, 4096, [first]) == []

    def rec(us, err, **kw):
        e = {"fro": err, "worst_row": err}
        return dict(us=us, p10=us, p90=us, tflops=1.0, pct_tf32x3_ideal=1.0, pct_fp32_peak=1.0, err_normal=e,
                    err_scaled=e, deterministic=True, **kw)  # fmt: skip

    row = {
        "M": 128,
        "K": 4096,
        "N": 4096,
        "tf32x3": [rec(60.0, 1e-7, cut="t", values={}, table=True)],
        "wgmma": [rec(40.0, 1e-7, cut="w", values=vars(first), table=True), rec(30.0, 9e-7, cut="x", table=False)],
        "fp32": rec(100.0, 5e-7),
        "cublas_fp32": rec(95.0, 4e-7),
    }
    sweep.judge(row)
    assert row["best_wgmma"]["cut"] == "w" and not row["wgmma"][1]["accurate"]
    assert row["verdict_best_wgmma"]["speedup_vs_cublas_fp32"] == 95.0 / 40.0
    text = sweep.table({"gpu": "g", "commit": "c", "rows": [row], "not_run": []})
    assert "wgmma default" in text and "verdict best_wgmma" in text
    assert "wgmma" in sweep.line(row)


def test_launch_waves_counts_clusters_and_ctas(monkeypatch):
    """``rawgraph.bench.kernel_times.launch_waves`` (the tf32x3 sweep records it per cut): a K split
    over a cluster counts clusters against ``cuOccupancyMaxActiveClusters`` (32 clusters of 4 where
    24 fit at once: 2 waves); no split counts CTAs against blocks per SM x SMs; a refused query is
    a recorded figure, not an error."""
    from types import SimpleNamespace

    from cuda.bindings import driver

    from rawgraph.bench.kernel_times import launch_waves

    ok = driver.CUresult.CUDA_SUCCESS
    monkeypatch.setattr(driver, "cuOccupancyMaxActiveClusters", lambda fn, cfg: (ok, 24), raising=False)
    monkeypatch.setattr(driver, "cuOccupancyMaxActiveBlocksPerMultiprocessor", lambda fn, t, s: (ok, 2), raising=False)

    def launch(grid, cluster):
        kernel = SimpleNamespace(handle=0, cluster_dims=(1, cluster, 1) if cluster > 1 else (0, 0, 0))
        return SimpleNamespace(grid=grid, block=(256, 1, 1), shared_mem=1024, kernel=kernel)

    assert launch_waves(launch((32, 4, 1), 4), 132) == {"max_active_clusters": 24, "waves": 2}
    assert launch_waves(launch((16, 2, 2), 2), 132) == {"max_active_clusters": 24, "waves": 2}
    assert launch_waves(launch((32, 1, 8), 1), 132) == {"ctas_per_sm": 2, "waves": 1}
    assert launch_waves(launch((33, 1, 9), 1), 132) == {"ctas_per_sm": 2, "waves": 2}

    monkeypatch.setattr(driver, "cuOccupancyMaxActiveClusters", lambda fn, cfg: (ok, 0))
    assert launch_waves(launch((32, 4, 1), 4), 132) == {
        "max_active_clusters": 0,
        "waves_error": "no cluster of this launch fits the device",
    }

    def refuse(fn, cfg):
        return (driver.CUresult.CUDA_ERROR_INVALID_VALUE, 0)

    monkeypatch.setattr(driver, "cuOccupancyMaxActiveClusters", refuse)
    assert "CUDA_ERROR_INVALID_VALUE" in launch_waves(launch((32, 4, 1), 4), 132)["waves_error"]
