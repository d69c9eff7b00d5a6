"""NVRTC compilation and the kernel cache: no GPU needed."""

import multiprocessing as mp
import os
import re

import pytest

from rawgraph import NvrtcError
from rawgraph.runtime.compiler import KernelCache, compile_source, default_cache_dir
from rawgraph.runtime.module import kernel_files, kernel_source
from rawgraph.ops import EPILOGUES, MATVEC_TILES, MatmulShape, matmul_expr

ARCHS = ["sm_80", "sm_90"]

# Every extern "C" kernel per file, and the instantiations TinyBlock and the benchmarks can ask
# for: every matvec tile with the plain epilogue, every epilogue on one tile, every GEMM; on
# sm_90 also the cluster (split) forms and the single-kernel block.
PLAIN = {"elementwise": ["relu", "add", "empty", "spin", "count_mismatch", "gather_rows", "scatter_rows"], "init": ["fill_uniform"],
         "control": ["rg_set_cond", "rg_countdown", "rg_axpb", "rg_noop", "rg_depth_init", "rg_select_layer",
                     "rg_layer_advance", "rg_norm_gate", "rg_set_band"],
         "philox": ["philox_draw", "philox_dropout", "philox_advance"],
         "device_launch": ["rg_graph_launch", "rg_bump", "rg_snapshot"],
         "device_update": ["rg_du_update_rows", "rg_du_update_table", "rg_du_rows", "rg_du_mark", "rg_du_shape",
                           "rg_du_count_live"],
         "allreduce": ["rg_allreduce_oneshot"]}


def _matvec_shapes(splits):
    for vec, tiles in MATVEC_TILES.items():
        for tc in tiles:
            for bt in (1, 2, 4, 8):
                if bt * tc <= 512:
                    for split in splits:
                        yield MatmulShape("matvec", vec, tc, bt, split, (1, split, 1))


def matmul_names(arch):
    splits = (1, 2, 4, 8) if arch == "sm_90" else (1,)
    names = {matmul_expr("none", s) for s in _matvec_shapes(splits)}
    names |= {matmul_expr(e, MatmulShape("matvec", 4, 64, 8, sp, (1, sp, 1))) for e in EPILOGUES for sp in splits}
    names |= {matmul_expr(e, MatmulShape("gemm", 4, bn, 64, sp, (1, sp, 1), 0, sl))
              for e in EPILOGUES for sp in splits for bn in (64, 128) for sl in (1, 2)}
    return sorted(names)


def rows_names(arch):
    from rawgraph.ops import ROW_PARAM_CAPS

    return [f"{k}_rows_param<{c}>" for k in ("gather", "scatter") for c in ROW_PARAM_CAPS]


def block_names(arch):
    return [f"block_kernel<{bt}, {cs}>" for bt in (1, 2, 4) for cs in (4, 8)] if arch == "sm_90" else []


def test_every_source_is_covered():
    assert sorted(kernel_files()) == sorted(list(PLAIN) + ["matmul", "block", "rows", "sgemm"])


# Issue 23's fp32 GEMM (benchmarks/gemm_sweep.py times every cut): one cut of each kernel, each
# epilogue, compiles for Hopper (clusters and named barriers need sm_90).
SGEMM = [f"sgemm_kernel<{e}, 64, 64, 16, 3, 1, 1>" for e in (0, 1, 2)] + \
        [f"sgemm_split_kernel<{e}, 128, 64, 16, 3, 2, 2, 1>" for e in (0, 2)]


def test_sgemm_cuts_compile_for_sm90():
    out = compile_source(kernel_source("sgemm"), "sgemm.cu", "sm_90", SGEMM, cache=False)
    assert set(out.lowered) == set(SGEMM) and all(out.lowered.values())


def test_headers_are_spliced_into_the_source():
    src = kernel_source("matmul")
    assert not re.search(r'^\s*#\s*include\s+"rawgraph.cuh"', src, re.M) and "griddepcontrol.wait" in src
    assert src.count("#define RAWGRAPH_CUH") == 1


@pytest.mark.parametrize("arch", ARCHS)
def test_compile_every_kernel_to_cubin(arch, tmp_path):
    cache = KernelCache(tmp_path)
    for file, names in PLAIN.items():
        img = compile_source(kernel_source(file), f"{file}.cu", arch, cache=cache)
        assert img.fmt == "cubin" and img.image[:4] == b"\x7fELF"
        for n in names:
            assert n.encode() in img.image, f"{n} missing from {file}.cu's CUBIN"
    for file, names in (("matmul", matmul_names(arch)), ("block", block_names(arch)), ("rows", rows_names(arch))):
        if not names:
            continue
        img = compile_source(kernel_source(file), f"{file}.cu", arch, names, cache=cache)
        assert img.image[:4] == b"\x7fELF"
        assert set(img.lowered) == set(names)
        for sym in img.lowered.values():
            assert sym.startswith("_Z") and sym.encode() in img.image


def test_ptx_is_explicit(tmp_path):
    img = compile_source(kernel_source("elementwise"), "elementwise.cu", "sm_90", fmt="ptx", cache=KernelCache(tmp_path))
    text = img.image.decode()
    assert ".target sm_90" in text and ".entry relu" in text


def test_compile_error_carries_the_log(tmp_path):
    with pytest.raises(NvrtcError) as info:
        compile_source('extern "C" __global__ void k() { this_is_not_cuda; }', "broken.cu", "sm_90", cache=KernelCache(tmp_path))
    assert "this_is_not_cuda" in info.value.log
    assert "broken.cu" in str(info.value)
    assert info.value.name == "NVRTC_ERROR_COMPILATION"


def test_unsupported_arch_is_refused():
    with pytest.raises(NvrtcError, match="cannot compile for sm_1"):
        compile_source("", "x.cu", "sm_10", cache=False)
    with pytest.raises(ValueError):
        compile_source("", "x.cu", "ampere", cache=False)


SRC = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 2.0f; }'


def test_cache_miss_then_hit(tmp_path):
    cache = KernelCache(tmp_path)
    first = compile_source(SRC, "k.cu", "sm_90", cache=cache)
    assert not first.from_cache
    assert len(list(tmp_path.glob("*.bin"))) == 1
    second = compile_source(SRC, "k.cu", "sm_90", cache=cache)
    assert second.from_cache and second.image == first.image
    # Another arch, another option or another source is another entry.
    assert not compile_source(SRC, "k.cu", "sm_80", cache=cache).from_cache
    assert not compile_source(SRC, "k.cu", "sm_90", options=["-std=c++17", "-lineinfo"], cache=cache).from_cache
    assert not compile_source(SRC.replace("2.0f", "3.0f"), "k.cu", "sm_90", cache=cache).from_cache
    assert len(list(tmp_path.glob("*.bin"))) == 4


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_recompiled_not_loaded(tmp_path, damage):
    cache = KernelCache(tmp_path)
    good = compile_source(SRC, "k.cu", "sm_90", cache=cache)
    (entry,) = tmp_path.glob("*.bin")
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[: len(data) - 100])
    elif damage == "flip":
        b = bytearray(data)
        b[-50] ^= 0xFF
        entry.write_bytes(bytes(b))
    elif damage == "garbage":
        entry.write_bytes(os.urandom(len(data)))
    else:
        entry.write_bytes(b"")
    again = compile_source(SRC, "k.cu", "sm_90", cache=cache)
    assert not again.from_cache
    assert again.image == good.image
    # ... and the entry was rewritten whole.
    assert compile_source(SRC, "k.cu", "sm_90", cache=cache).from_cache


def _compile_in_child(directory, n):
    cache = KernelCache(directory)
    for _ in range(n):
        img = compile_source(SRC, "k.cu", "sm_90", cache=cache)
        assert img.image[:4] == b"\x7fELF"


def test_concurrent_processes_leave_a_valid_cache(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_compile_in_child, args=(str(tmp_path), 3)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    cache = KernelCache(tmp_path)
    assert compile_source(SRC, "k.cu", "sm_90", cache=cache).from_cache


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("RAWGRAPH_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    compile_source(SRC, "k.cu", "sm_90")
    assert len(list((tmp_path / "here").glob("*.bin"))) == 1


def test_unwritable_cache_only_warns(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="cache not written"):
        img = compile_source(SRC, "k.cu", "sm_90", cache=KernelCache(blocker / "sub"))
    assert img.image[:4] == b"\x7fELF"
