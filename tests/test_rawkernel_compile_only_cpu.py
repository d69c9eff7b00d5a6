"""Kernels as CuPy users write them, checked on a machine with no GPU and no driver.

The CUDA toolkit headers (``<cuda_fp16.h>``, ``<cooperative_groups.h>``, ``<cuda/std/...>``,
``<mma.h>``) come from the wheels rawgraph depends on and reach NVRTC as include directories; a
missing one is a :class:`MissingHeadersError` naming the package. ``RawKernel(..., arch=)`` and
``check_kernel`` read the declaration, compile a CUBIN and check the parameter layout the CUBIN
records, without a single driver call. The GPU tests (``tests/test_rawkernel_gpu.py``) run them.
"""

from __future__ import annotations

import os
import re
import struct

import pytest
from cuda.bindings import driver

import rawgraph.runtime.compiler as compiler
from rawgraph import NvrtcError, SignatureError
from rawgraph.runtime.compiler import MissingHeadersError, compile_source, toolkit_include_dirs
from rawgraph.runtime.cubin import cubin_kernels
from rawgraph.runtime.rawkernel import CompileOnlyError, KernelParam, RawKernel, check_kernel

HALF = r"""
#include <cuda_fp16.h>
extern "C" __global__ void hscale(const __half* __restrict__ x, __half s, __half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hadd(__hmul(x[i], s), __float2half(1.0f));
}
extern "C" __global__ void hfill(half* y, half v, unsigned n) {  // cuda_fp16.h's own alias
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
"""
PLAIN = r"""
struct Affine { float scale; int shift; double bias; };
extern "C" __global__ void affine(Affine p, const float* x, float* t, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) t[i] = (float)(p.scale * x[i] + p.bias) + p.shift;
}
extern "C" __global__ void axpb(float a, const float* __restrict__ x, float b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
template <int K, typename T>
__global__ void scale_k(T* y, const T* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = T(K) * x[i];
}
template <typename T>
__global__ void shift_k(T* y, T by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += by;
}
namespace ns { __global__ void twice(float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] *= 2; } }
"""


def _has(*relative):
    return all(any(os.path.isfile(os.path.join(d, r)) for d in toolkit_include_dirs()) for r in relative)


# CI installs rawgraph with its dependencies, which bring these headers (cuda-toolkit's cudart,
# crt and cccl extras); elsewhere a test that needs them says what is missing.
needs_headers = pytest.mark.skipif(
    not _has("cuda_fp16.h", "cooperative_groups.h", "cuda/std/version", "nv/target", "crt/mma.h"),
    reason="no CUDA toolkit headers found (pip install 'cuda-toolkit[cudart,crt,cccl]', a rawgraph dependency)",
)


@pytest.fixture
def no_driver(monkeypatch):
    """Every driver function (and device lookup) fails the test if called."""
    import rawgraph.runtime.device as device
    import rawgraph.runtime.rawkernel as rawkernel

    called: list[str] = []

    def refuse(name):
        def fn(*args, **kw):
            called.append(name)
            raise AssertionError(f"{name} was called")

        return fn

    for name in dir(driver):
        if name.startswith("cu") and callable(getattr(driver, name)):
            monkeypatch.setattr(driver, name, refuse(name))
    monkeypatch.setattr(device, "get_device", refuse("get_device"))
    monkeypatch.setattr(rawkernel, "get_device", refuse("get_device"))
    return called


@needs_headers
def test_the_toolkit_headers_are_found_in_the_installed_wheels():
    dirs = toolkit_include_dirs()
    assert len(dirs) == 2 and all(os.path.isabs(d) for d in dirs)
    runtime, cccl = dirs
    assert os.path.isfile(os.path.join(runtime, "cuda_fp16.h"))
    assert os.path.isfile(os.path.join(cccl, "cuda", "std", "version"))


@needs_headers
def test_a_half_kernel_compiles_for_sm90_and_its_layout_is_checked_with_no_driver(no_driver, tmp_path):
    k = RawKernel(HALF, "hscale", arch="sm_90", cache=False)
    assert k.device is None and k.arch == "sm_90"
    assert k.spec == [("x", "ptr"), ("s", "f16"), ("y", "ptr"), ("n", "i32")]
    assert k.layout == [(0, 8), (8, 2), (16, 8), (24, 4)]  # a __half by value: 2 bytes, 2-aligned
    assert [p.role for p in k.params] == ["read", None, "write", None]
    assert check_kernel(HALF, "hfill", cache=False) == [
        KernelParam("y", "half*", "ptr", "write", 0, 8),
        KernelParam("v", "half", "f16", None, 8, 2),
        KernelParam("n", "unsigned int", "u32", None, 12, 4),
    ]
    # through the cache: the same layout from the stored CUBIN
    from rawgraph.runtime.compiler import KernelCache

    cache = KernelCache(tmp_path / "cache")
    first = check_kernel(HALF, "hscale", cache=cache)
    assert check_kernel(HALF, "hscale", cache=cache) == first
    assert no_driver == []


@needs_headers
@pytest.mark.parametrize(
    "include, body",
    [
        (
            "<cooperative_groups.h>",
            "namespace cg = cooperative_groups;\n"
            'extern "C" __global__ void k(int* y) { auto b = cg::this_thread_block(); b.sync(); y[b.thread_rank()] = 1; }',
        ),
        ("<cuda/std/cstdint>", 'extern "C" __global__ void k(cuda::std::int64_t* y) { y[0] = 1; }'),
        (
            "<mma.h>",
            "using namespace nvcuda;\n"
            'extern "C" __global__ void k(const __half* a) {\n'
            "    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> f; wmma::load_matrix_sync(f, a, 16); }",
        ),
    ],
)
def test_cooperative_groups_cuda_std_and_mma_compile(include, body):
    (param,) = check_kernel(f"#include {include}\n{body}", "k", cache=False)
    assert (param.kind, param.offset, param.size) == ("ptr", 0, 8)


def test_a_missing_toolkit_header_names_the_package_to_install(monkeypatch):
    monkeypatch.setattr(compiler, "_locate_headers", lambda lib: None)  # as on a machine without the wheels
    with pytest.raises(MissingHeadersError) as got:
        compile_source(HALF, "half.cu", "sm_90", cache=False)
    err = got.value
    assert isinstance(err, NvrtcError) and err.headers == ["cuda_fp16.h"] and err.packages == ["nvidia-cuda-runtime"]
    assert 'pip install "cuda-toolkit[cudart,crt,cccl]==' in str(err)
    assert re.search(r'(could not|cannot) open source file "cuda_fp16.h"', err.log)  # NVRTC's log, whole
    with pytest.raises(MissingHeadersError, match="nvidia-cuda-cccl") as got:
        check_kernel('#include <cuda/std/cstdint>\nextern "C" __global__ void k(int* y) {}', "k", cache=False)
    assert got.value.packages == ["nvidia-cuda-cccl"]
    # a header that is no toolkit's stays the compiler's error
    with pytest.raises(NvrtcError) as other:
        compile_source('#include "mine.cuh"\n__global__ void k() {}', "m.cu", "sm_90", cache=False)
    assert not isinstance(other.value, MissingHeadersError)


@needs_headers
def test_only_what_is_missing_is_named(monkeypatch, tmp_path):
    real = compiler._locate_headers
    monkeypatch.setattr(compiler, "_locate_headers", lambda lib: None if lib == "cccl" else real(lib))
    # the runtime's headers are there, but cooperative_groups.h needs CCCL's (<nv/target>,
    # <cuda/std/...>: which one is missing first depends on where the wheels put <nv/target>)
    with pytest.raises(MissingHeadersError) as got:
        check_kernel('#include <cooperative_groups.h>\nextern "C" __global__ void k(int* y) {}', "k", cache=False)
    assert got.value.packages == ["nvidia-cuda-cccl"]
    assert got.value.headers and all(h.startswith(("nv/", "cuda/")) for h in got.value.headers)
    # crt/ is a wheel of its own that lands in the runtime's directory: mma.h needs its crt/mma.h
    runtime = real("cudart")
    partial = tmp_path / "include"
    partial.mkdir()
    for entry in os.listdir(runtime):
        if entry != "crt":
            (partial / entry).symlink_to(os.path.join(runtime, entry))
    monkeypatch.setattr(compiler, "_locate_headers", lambda lib: str(partial) if lib == "cudart" else real(lib))
    with pytest.raises(MissingHeadersError) as got:
        check_kernel('#include <mma.h>\nextern "C" __global__ void k(int* y) {}', "k", cache=False)
    assert got.value.headers == ["crt/mma.h"] and got.value.packages == ["nvidia-cuda-crt"]
    monkeypatch.setattr(compiler, "_locate_headers", real)
    # a toolkit-looking name the installed toolkit does not have: a typo, not a package to install
    with pytest.raises(NvrtcError) as typo:
        check_kernel('#include <cuda_fp61.h>\nextern "C" __global__ void k(int* y) {}', "k", cache=False)
    assert not isinstance(typo.value, MissingHeadersError)


def test_a_compile_only_kernel_refuses_to_launch_before_any_driver_call(no_driver):
    k = RawKernel(PLAIN, "axpb", arch="sm_90", cache=False)
    assert "compiled for sm_90 only" in repr(k)
    for attempt in (
        lambda: k(1, 32, (1.0, None, 0.0, None, 4)),
        lambda: k.launch(1, 32, (1.0, None, 0.0, None, 4)),
        lambda: k.kernel,
    ):
        with pytest.raises(CompileOnlyError, match="compiled for sm_90 only"):
            attempt()
    assert no_driver == []
    with pytest.raises(TypeError, match="not given with device="):
        RawKernel(PLAIN, "axpb", arch="sm_90", device=object())
    with pytest.raises(ValueError, match="sm_90"):
        RawKernel(PLAIN, "axpb", arch="90", cache=False)
    assert no_driver == []


def test_check_kernel_plain_template_namespaced_and_struct_by_value(no_driver):
    assert [(p.name, p.ctype, p.kind, p.offset, p.size) for p in check_kernel(PLAIN, "axpb", cache=False)] == [
        ("a", "float", "f32", 0, 4),
        ("x", "const float*", "ptr", 8, 8),
        ("b", "float", "f32", 16, 4),
        ("y", "float*", "ptr", 24, 8),
        ("n", "int", "i32", 32, 4),
    ]
    assert [(p.kind, p.offset, p.size) for p in check_kernel(PLAIN, "affine", cache=False)] == [
        ("u8[16]", 0, 16),
        ("ptr", 16, 8),
        ("ptr", 24, 8),
        ("i64", 32, 8),
    ]
    assert [(p.kind, p.role) for p in check_kernel(PLAIN, "scale_k<3, float>", cache=False)] == [
        ("ptr", "write"),
        ("ptr", "read"),
        ("i32", None),
    ]
    assert [p.name for p in check_kernel(PLAIN, "ns::twice", arch="sm_80", cache=False)] == ["y", "n"]
    # a by-value template parameter: the declaration cannot say its size, the types given can
    with pytest.raises(SignatureError, match="give types="):
        check_kernel(PLAIN, "shift_k<double>", cache=False)
    assert [
        (p.kind, p.size)
        for p in check_kernel(PLAIN, "shift_k<double>", types=["double*", "double", "int"], cache=False)
    ] == [("ptr", 8), ("f64", 8), ("i32", 4)]
    # types that disagree with the compiled kernel are refused, as against the driver's sizes
    with pytest.raises(SignatureError, match="is 4 bytes as read, but the kernel takes 8"):
        check_kernel(PLAIN, "shift_k<double>", types=["double*", "float", "int"], cache=False)
    with pytest.raises(SignatureError, match="no __global__"):
        check_kernel(PLAIN, "missing", cache=False)
    assert no_driver == []


def test_the_cubin_reader_agrees_with_the_fake_driver_and_refuses_damage():
    from rawgraph.runtime.module import kernel_source
    from rawgraph.testing.fakedriver import cubin_info

    for name, exprs in (("control", []), ("block", ["block_kernel<1, 8>"])):  # block: __cluster_dims__(8, 1, 1)
        image = compile_source(kernel_source(name), f"{name}.cu", "sm_90", exprs, cache=False).image
        ours = cubin_kernels(image)
        assert ours and {s: (k.params, k.cluster_dims) for s, k in ours.items()} == {
            s: (layout, tuple(cluster)) for s, (layout, cluster) in cubin_info(image).items()
        }
    assert any(k.cluster_dims == (8, 1, 1) for k in ours.values())
    image = compile_source(PLAIN, "plain.cu", "sm_90", ["affine"], cache=False).image
    assert cubin_kernels(image)["affine"].params == [(0, 16), (16, 8), (24, 8), (32, 8)]
    for bad in (b"", b"not an elf", image[:100], image[: len(image) // 2], image[:4] + b"\x01" + image[5:]):
        with pytest.raises(ValueError):
            cubin_kernels(bad)
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    with pytest.raises(ValueError, match="section header"):
        cubin_kernels(image[:0x28] + struct.pack("<Q", shoff + len(image)) + image[0x30:])
