"""NVRTC compilation and the kernel cache: no GPU needed."""

import multiprocessing as mp
import os
import re
import stat
import warnings

import numpy as np
import pytest

from rawgraph import NvrtcError
from rawgraph.runtime.compiler import KernelCache, compile_source, default_cache_dir

try:  # the cache's own warning class (absent before the cache checked who may write it)
    from rawgraph.runtime.compiler import CacheWarning
except ImportError:
    CacheWarning = RuntimeWarning
from rawgraph.ops import EPILOGUES, MATVEC_TILES, MatmulShape, matmul_expr
from rawgraph.runtime.module import kernel_files, kernel_source

ARCHS = ["sm_80", "sm_90"]

# Every extern "C" kernel per file, and the instantiations TinyBlock and the benchmarks can ask
# for: every matvec tile with the plain epilogue, every epilogue on one tile, every GEMM; on
# sm_90 also the cluster (split) forms and the single-kernel block.
PLAIN = {
    "elementwise": ["relu", "add", "empty", "spin", "count_mismatch", "gather_rows", "scatter_rows"],
    "init": ["fill_uniform"],
    "control": [
        "rg_set_cond",
        "rg_countdown",
        "rg_axpb",
        "rg_noop",
        "rg_depth_init",
        "rg_select_layer",
        "rg_layer_advance",
        "rg_norm_gate",
        "rg_set_band",
    ],
    "philox": ["philox_draw", "philox_dropout", "philox_advance"],
    "device_launch": ["rg_graph_launch", "rg_bump", "rg_snapshot"],
    "device_update": [
        "rg_du_update_rows",
        "rg_du_update_table",
        "rg_du_rows",
        "rg_du_mark",
        "rg_du_shape",
        "rg_du_count_live",
    ],
    "allreduce": ["rg_allreduce_oneshot"],
}


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
    names |= {
        matmul_expr(e, MatmulShape("gemm", 4, bn, 64, sp, (1, sp, 1), 0, sl))
        for e in EPILOGUES
        for sp in splits
        for bn in (64, 128)
        for sl in (1, 2)
    }
    return sorted(names)


def rows_names(arch):
    from rawgraph.ops import ROW_PARAM_CAPS

    return [f"{k}_rows_param<{c}>" for k in ("gather", "scatter") for c in ROW_PARAM_CAPS]


def block_names(arch):
    return [f"block_kernel<{bt}, {cs}>" for bt in (1, 2, 4) for cs in (4, 8)] if arch == "sm_90" else []


def test_every_source_is_covered():
    assert sorted(kernel_files()) == sorted(
        list(PLAIN) + ["matmul", "block", "rows", "sgemm", "tf32x3", "tf32x3_wgmma"]
    )  # tf32x3: tests/test_tf32x3_cpu.py; tf32x3_wgmma (sm_90a): tests/test_tf32x3_wgmma_cpu.py


# Issue 23's fp32 GEMM (benchmarks/gemm_sweep.py times every cut): one cut of each kernel, each
# epilogue, compiles for Hopper (clusters and named barriers need sm_90).
SGEMM = [f"sgemm_kernel<{e}, 64, 64, 16, 3, 1, 1>" for e in (0, 1, 2)] + [
    f"sgemm_split_kernel<{e}, 128, 64, 16, 3, 2, 2, 1>" for e in (0, 2)
]


def test_sgemm_cuts_compile_for_sm90():
    out = compile_source(kernel_source("sgemm"), "sgemm.cu", "sm_90", SGEMM, cache=False)
    assert set(out.lowered) == set(SGEMM) and all(out.lowered.values())


def test_headers_are_spliced_into_the_source():
    src = kernel_source("matmul")
    assert not re.search(r'^\s*#\s*include\s+"rawgraph.cuh"', src, re.M) and "griddepcontrol.wait" in src
    assert src.count("#define RAWGRAPH_CUH") == 1
    for gemm in ("sgemm", "tf32x3"):  # two headers, one including the other: each spliced once
        src = kernel_source(gemm)
        assert src.count("#define RAWGRAPH_CUH") == 1 and src.count("void gt_reduce_partials(") == 1
        assert not re.search(r'^\s*#\s*include\s+"', src, re.M)


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
    img = compile_source(
        kernel_source("elementwise"), "elementwise.cu", "sm_90", fmt="ptx", cache=KernelCache(tmp_path)
    )
    text = img.image.decode()
    assert ".target sm_90" in text and ".entry relu" in text


def test_compile_error_carries_the_log(tmp_path):
    with pytest.raises(NvrtcError) as info:
        compile_source(
            'extern "C" __global__ void k() { this_is_not_cuda; }', "broken.cu", "sm_90", cache=KernelCache(tmp_path)
        )
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


# ------------------------------------------------------------------------------- who may write the cache
def _as_root_or_skip():
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root (CI runs as root)")


def _plant(directory):
    """Compile SRC into ``directory``, then overwrite its entry with a well-formed one (right key,
    right SHA-256) whose image and symbol are an attacker's; return the genuine image."""
    from rawgraph.runtime.compiler import CompiledImage

    good = compile_source(SRC, "k.cu", "sm_90", cache=KernelCache(directory))
    (entry,) = directory.glob("*.bin")
    evil = CompiledImage(os.urandom(64), "cubin", "sm_90", {"k": "planted_symbol"}, "", False)
    KernelCache(directory).store(entry.stem, evil)
    assert KernelCache(directory).load(entry.stem).image == evil.image  # a well-formed entry
    return good.image, entry


def _compile_warned(directory):
    """Compile SRC through the cache in ``directory``: the image, and the CacheWarnings said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        img = compile_source(SRC, "k.cu", "sm_90", cache=KernelCache(directory))
    return img, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def test_the_cache_directory_and_the_parents_it_makes_are_0700(tmp_path):
    top = tmp_path / "a"
    compile_source(SRC, "k.cu", "sm_90", cache=KernelCache(top / "b" / "c"))
    for d in (top, top / "b", top / "b" / "c"):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700, d
    assert [stat.S_IMODE(e.stat().st_mode) for e in (top / "b" / "c").glob("*.bin")] == [0o600]


@pytest.mark.parametrize("how", ["group-writable", "other-writable", "another-owner", "symlink"])
def test_a_cache_directory_others_can_write_is_refused(tmp_path, how):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    good, entry = _plant(real)
    planted = entry.read_bytes()
    directory = real
    if how == "group-writable":
        real.chmod(0o770)
    elif how == "other-writable":
        real.chmod(0o707)
    elif how == "another-owner":
        _as_root_or_skip()
        os.chown(real, 12345, 12345)
    else:
        directory = tmp_path / "link"
        directory.symlink_to(real, target_is_directory=True)
    img, said = _compile_warned(directory)
    assert not img.from_cache and img.image == good and img.lowered == {}, "the planted entry was loaded"
    assert len(said) == 1 and "compiling without the cache" in said[0], said
    assert entry.read_bytes() == planted  # neither read nor written
    assert [p.name for p in real.iterdir()] == [entry.name]


@pytest.mark.parametrize("how", ["another-owner", "others-can-write", "symlink"])
def test_an_entry_not_of_this_user_is_ignored_and_replaced(tmp_path, how):
    directory = tmp_path / "cache"
    good, entry = _plant(directory)
    if how == "another-owner":
        _as_root_or_skip()
        os.chown(entry, 12345, 12345)
    elif how == "others-can-write":
        entry.chmod(0o666)
    else:  # a link to a well-formed entry elsewhere (owned by this user even)
        elsewhere = tmp_path / "elsewhere.bin"
        entry.rename(elsewhere)
        entry.symlink_to(elsewhere)
    img, said = _compile_warned(directory)
    assert not img.from_cache and img.image == good, "the planted entry was loaded"
    assert len(said) == 1 and "ignored" in said[0], said
    # replaced (renamed over) by this user's own entry, which then loads
    st = os.lstat(entry)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600
    again = compile_source(SRC, "k.cu", "sm_90", cache=KernelCache(directory))
    assert again.from_cache and again.image == good


# ------------------------------------------------------------------------------- headers in the key
def _value_src(include, name="V"):
    return f'{include}\nextern "C" __global__ void k(float* y) {{ y[threadIdx.x] = {name}; }}\n'


def _stores(ptx: bytes, value: float) -> bool:
    """The PTX stores the float32 ``value`` (NVVM writes it as its bits, decimal or ``0f`` hex)."""
    bits = np.float32(value).view(np.uint32).item()
    text = ptx.decode()
    return re.search(rf"\b{bits}\b", text) is not None or f"0f{bits:08X}" in text


@pytest.mark.parametrize("how", ["-I", "-I-apart", "--include-path", "angled", "nested", "pre-include", "source-dir"])
def test_an_edited_header_recompiles(tmp_path, how):
    # What a compile reads through #include (or -include) is in the key: after an edit the old
    # image never loads again, in this process or any other (the key is of the files' contents).
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    header = inc / "sub" / "deep.cuh" if how == "nested" else inc / "h.cuh"
    name, opts, include = str(tmp_path / "k.cu"), ["-std=c++17", f"-I{inc}"], '#include "h.cuh"'
    if how == "-I-apart":
        opts = ["-std=c++17", "-I", str(inc)]
    elif how == "--include-path":
        opts = ["-std=c++17", f"--include-path={inc}"]
    elif how == "angled":
        include = "#include <h.cuh>"
    elif how == "nested":  # h.cuh includes sub/deep.cuh, which includes its neighbour by a quoted name
        (inc / "h.cuh").write_text('#include "sub/deep.cuh"\n')
        (inc / "sub" / "deep.cuh").write_text("")
        header = inc / "sub" / "deeper.cuh"
        (inc / "sub" / "deep.cuh").write_text('#include "deeper.cuh"\n')
    elif how == "pre-include":
        opts, include = ["-std=c++17", f"-I{inc}", "-include", "h.cuh"], ""
    elif how == "source-dir":  # no option at all: a quoted include is looked up beside the source
        header, opts = tmp_path / "h.cuh", ["-std=c++17"]
    cache = KernelCache(tmp_path / "cache")
    rng = np.random.default_rng()
    values = [float(np.float32(v)) for v in rng.uniform(1, 2, 2)]
    for i, value in enumerate(values):
        header.write_text(f"#define V {value!r}f\n")
        img = compile_source(_value_src(include), name, "sm_90", options=opts, fmt="ptx", cache=cache)
        assert not img.from_cache, f"compile {i}: the image of the header before the edit was loaded"
        assert _stores(img.image, value)
        again = compile_source(_value_src(include), name, "sm_90", options=opts, fmt="ptx", cache=cache)
        assert again.from_cache and again.image == img.image  # unchanged headers: still cached


def test_an_include_that_cannot_be_named_is_not_cached_and_a_missing_one_is_keyed_absent(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    (tmp_path / "h.cuh").write_text("#define V 1.5f\n")
    opts = ["-std=c++17", f"-I{tmp_path}"]
    by_macro = _value_src('#define HEADER "h.cuh"\n#include HEADER')
    for _ in range(2):  # which file the macro names is the preprocessor's to say: compiled every time
        assert not compile_source(by_macro, "m.cu", "sm_90", options=opts, cache=cache).from_cache
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.bin"))
    # a header no search path holds (an inactive branch here) is keyed as absent: cached, and
    # recompiled once a file of that name appears where the preprocessor would look
    guarded = _value_src('#ifdef USE_EXTRA\n#include "extra.cuh"\n#endif\n#include "h.cuh"')
    assert not compile_source(guarded, "g.cu", "sm_90", options=opts, cache=cache).from_cache
    assert compile_source(guarded, "g.cu", "sm_90", options=opts, cache=cache).from_cache
    (tmp_path / "extra.cuh").write_text("#error never active\n")
    assert not compile_source(guarded, "g.cu", "sm_90", options=opts, cache=cache).from_cache


def test_a_header_edited_during_the_compile_is_not_stored(tmp_path, monkeypatch):
    import rawgraph.runtime.compiler as compiler

    header = tmp_path / "h.cuh"
    header.write_text("#define V 1.5f\n")
    real = compiler._compile

    def edited_meanwhile(*args, **kw):
        header.write_text("#define V 2.5f\n")  # after the key was taken: which one NVRTC read is unknown
        return real(*args, **kw)

    monkeypatch.setattr(compiler, "_compile", edited_meanwhile)
    cache = KernelCache(tmp_path / "cache")
    compile_source(
        _value_src('#include "h.cuh"'), "k.cu", "sm_90", options=["-std=c++17", f"-I{tmp_path}"], cache=cache
    )
    assert list((tmp_path / "cache").glob("*.bin")) == []


def test_an_angled_include_is_keyed_only_where_nvrtc_looks_for_it(tmp_path):
    # NVRTC looks up <name> in the include directories only, never beside the source or the
    # header that includes it: a file of that name there is never read, so never keyed.
    inc, src_dir = tmp_path / "inc", tmp_path / "src"
    (inc / "sub").mkdir(parents=True)
    src_dir.mkdir()
    (inc / "h.cuh").write_text("#include <sub/v.cuh>\n")
    (inc / "sub" / "v.cuh").write_text("#include <w.cuh>\n")  # angled: not looked up in sub/
    (inc / "w.cuh").write_text("#define V 1.5f\n")
    cache = KernelCache(tmp_path / "cache")
    opts = ["-std=c++17", f"-I{inc}"]
    name, src = str(src_dir / "k.cu"), _value_src("#include <h.cuh>")
    assert _stores(compile_source(src, name, "sm_90", options=opts, fmt="ptx", cache=cache).image, 1.5)
    (src_dir / "h.cuh").write_text("#define V 9.5f\n")  # beside the source
    (inc / "sub" / "w.cuh").write_text("#define V 9.5f\n")  # beside the header including it
    again = compile_source(src, name, "sm_90", options=opts, fmt="ptx", cache=cache)
    assert again.from_cache and _stores(again.image, 1.5)
    (inc / "w.cuh").write_text("#define V 2.5f\n")  # where NVRTC does look: recompiled
    edited = compile_source(src, name, "sm_90", options=opts, fmt="ptx", cache=cache)
    assert not edited.from_cache and _stores(edited.image, 2.5)


def test_each_header_is_looked_up_once_per_place(tmp_path, monkeypatch):
    # A chain of headers, each including the next, among several include directories: every
    # (name, directory) pair is looked at once, not once more for each level of the chain (the
    # toolkit's <cuda/std/...> headers name hundreds of files: that took seconds per cache hit).
    import rawgraph.runtime.compiler as compiler

    dirs = [tmp_path / f"d{i}" for i in range(10)]
    for d in dirs:
        d.mkdir()
    depth = 60
    for i in range(depth):
        (dirs[i % len(dirs)] / f"h{i}.cuh").write_text(f"#include <h{i + 1}.cuh>\n" if i + 1 < depth else "")
    calls = []  # file system lookups: stat, and the lstat of each component realpath resolves

    def counting(real):
        return lambda *a, **k: calls.append(a[0]) or real(*a, **k)

    for fn in ("stat", "lstat"):
        monkeypatch.setattr(os, fn, counting(getattr(os, fn)))
    found = compiler._headers("#include <h0.cuh>\n", "k.cu", [f"-I{d}" for d in dirs])
    monkeypatch.undo()
    assert len([f for f, digest in found if digest != "absent"]) == depth
    assert len(calls) <= 2 * depth * len(dirs), f"{len(calls)} lookups for {depth} names in {len(dirs)} directories"


def test_toolkit_include_directories_come_after_the_callers_and_only_where_a_header_is_named(tmp_path, monkeypatch):
    import rawgraph.runtime.compiler as compiler

    asked = []
    monkeypatch.setattr(compiler, "_locate_headers", lambda lib: asked.append(lib) or f"/toolkit/{lib}")
    # rawgraph's own kernels name no header: their options (and cache keys) are as they were,
    # and no toolkit is looked for on their account
    for name in kernel_files():
        assert compiler._toolkit_options(kernel_source(name), ["-std=c++17"]) == []
    assert asked == []
    mine = str(tmp_path)
    assert compiler._toolkit_options("#include <cuda_fp16.h>\n", ["-std=c++17", f"-I{mine}"]) == [
        "-I/toolkit/cudart",
        "-I/toolkit/cccl",
    ]
    assert compiler._toolkit_options("", ["-include", "x.cuh"]) == ["-I/toolkit/cudart", "-I/toolkit/cccl"]
    # a directory the caller already gives is not given twice
    assert compiler._toolkit_options('#include "x.cuh"\n', ["-I", "/toolkit/cccl"]) == ["-I/toolkit/cudart"]
    seen = []
    monkeypatch.setattr(compiler, "_compile", lambda s, n, a, names, options, fmt: seen.append(options))
    compile_source("#include <v.cuh>\n", "k.cu", "sm_90", options=["-std=c++17", f"-I{mine}"], cache=False)
    assert seen == [["-std=c++17", f"-I{mine}", "-I/toolkit/cudart", "-I/toolkit/cccl", "--gpu-architecture=sm_90"]]
