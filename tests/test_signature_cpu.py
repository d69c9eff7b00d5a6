"""parse_signature reads kernel parameter types from CUDA source text (no GPU needed)."""

import re

import pytest

from rawgraph.runtime.errors import RawgraphError, SignatureError
from rawgraph.runtime.module import kernel_files, kernel_source
from rawgraph.runtime.signature import KINDS, Param, parse_signature


def P(name, ctype, kind, role=None):
    return Param(name, ctype, kind, role)


SAXPY = [
    P("a", "float", "f32"),
    P("x", "const float*", "ptr", "read"),
    P("y", "float*", "ptr", "write"),
    P("n", "int", "i32"),
]


def test_saxpy_extern_c():
    src = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) { y[0] = a; }'
    assert parse_signature(src, "saxpy") == SAXPY


def test_extern_c_block_and_specifiers():
    src = """
    extern "C" {
    static __global__ void __launch_bounds__(256, 2) __noinline__ saxpy(float a, const float* x,
                                                                        float* y, int n) {}
    __global__ __cluster_dims__(2,1,1) void __forceinline__ other(int n) {}
    }
    """
    assert parse_signature(src, "saxpy") == SAXPY
    assert parse_signature(src, "other") == [P("n", "int", "i32")]


def test_launch_bounds_anywhere_and_macros():
    src = """
    __global__ __launch_bounds__(RG_THREADS * 2, 3 / SL) void a(int n) {}
    __global__ void __cluster_dims__(1, S, 1) __launch_bounds__(RG_THREADS)
    b(const float* x, int n) {}
    __global__ void MY_BOUNDS(128) c(double d) {}
    """
    assert parse_signature(src, "a") == [P("n", "int", "i32")]
    assert parse_signature(src, "b") == [P("x", "const float*", "ptr", "read"), P("n", "int", "i32")]
    assert parse_signature(src, "c") == [P("d", "double", "f64")]


def test_comments_strings_and_preprocessor_ignored():
    src = r"""
    #include <cuda_fp16.h>
    #define DECL __global__ void saxpy(double a)
    #define LONG_MACRO(x) \
        __global__ void saxpy(char c)
    // __global__ void saxpy(long q)
    /* __global__ void saxpy(short s) */
    __device__ const char* msg = "__global__ void saxpy(bool b) /* not a comment";
    __device__ const char* raw = R"x(__global__ void saxpy(int8_t i) )" )x";
    __device__ char quote = '"';
    extern "C" __global__ void /* here */ saxpy(float a, // the scale
        const float* x /* input */, float* y, int n) {}
    """
    assert parse_signature(src, "saxpy") == SAXPY


def test_whole_identifier_only():
    src = """
    __global__ void relu_fused(const float* x, float* y, int n, float alpha) {}
    __global__ void prelu(float* x) {}
    __global__ void relu(const float* x, float* y, long long n) {}
    """
    assert parse_signature(src, "relu") == [
        P("x", "const float*", "ptr", "read"),
        P("y", "float*", "ptr", "write"),
        P("n", "long long", "i64"),
    ]
    with pytest.raises(SignatureError, match="'rel'"):
        parse_signature(src, "rel")


def test_name_expressions():
    src = """
    namespace ns {
    template <int BM, int BN> __global__ void gemm(const float* a, float* c, int k) {}
    template <typename T> __global__ void k(T* x, T v) {}
    }
    """
    gemm = [P("a", "const float*", "ptr", "read"), P("c", "float*", "ptr", "write"), P("k", "int", "i32")]
    assert parse_signature(src, "gemm<64, 4>") == gemm
    assert parse_signature(src, "ns::gemm<64, 4>") == gemm
    assert parse_signature(src, "ns::k<float>") == [P("x", "T*", "ptr", "write"), P("v", "T", None)]


def test_templates():
    src = """
    template <typename T, int N>
    __global__ void k(T* x, const T* y, int n, T scale, const T bias, Pair<T, N> p, Box<N> b) {}
    template <class U, typename... Rest, int M = 4> __global__ void u(U const* in, Rest* r) {}
    """
    assert parse_signature(src, "k<float, 4>") == [
        P("x", "T*", "ptr", "write"),
        P("y", "const T*", "ptr", "read"),
        P("n", "int", "i32"),
        P("scale", "T", None),
        P("bias", "T", None),
        P("p", "Pair<T, N>", None),
        P("b", "Box<N>", "struct"),  # N is a non-type parameter: Box<N> is a concrete struct
    ]
    assert parse_signature(src, "u") == [P("in", "const U*", "ptr", "read"), P("r", "Rest*", "ptr", "write")]


def test_pointer_spellings():
    src = """__global__ void k(float *a, float* __restrict__ b, const float* __restrict__ c,
        float const * d, float** e, const float* const f, void* g, const void* h,
        const float** i, float* const* j, volatile int* v, float arr[], const float carr[16],
        rg_state* s, const ns::Foo<int>* t) {}"""
    assert parse_signature(src, "k") == [
        P("a", "float*", "ptr", "write"),
        P("b", "float*", "ptr", "write"),
        P("c", "const float*", "ptr", "read"),
        P("d", "const float*", "ptr", "read"),
        P("e", "float**", "ptr", "write"),
        P("f", "const float*", "ptr", "read"),
        P("g", "void*", "ptr", "write"),
        P("h", "const void*", "ptr", "read"),
        P("i", "const float**", "ptr", "write"),  # the pointee (a const float*) is writable
        P("j", "float* const*", "ptr", "read"),  # the pointee (a float* const) is not
        P("v", "volatile int*", "ptr", "write"),
        P("arr", "float*", "ptr", "write"),
        P("carr", "const float*", "ptr", "read"),
        P("s", "rg_state*", "ptr", "write"),
        P("t", "const ns::Foo<int>*", "ptr", "read"),
    ]


SCALARS = [
    ("int", "int", "i32"),
    ("signed int", "int", "i32"),
    ("signed", "int", "i32"),
    ("unsigned", "unsigned int", "u32"),
    ("unsigned int", "unsigned int", "u32"),
    ("int32_t", "int32_t", "i32"),
    ("uint32_t", "uint32_t", "u32"),
    ("long long", "long long", "i64"),
    ("long long int", "long long", "i64"),
    ("signed long long", "long long", "i64"),
    ("unsigned long long", "unsigned long long", "u64"),
    ("unsigned long long int", "unsigned long long", "u64"),
    ("long unsigned long", "unsigned long long", "u64"),
    ("int64_t", "int64_t", "i64"),
    ("uint64_t", "uint64_t", "u64"),
    ("size_t", "size_t", "u64"),
    ("std::size_t", "size_t", "u64"),
    ("ptrdiff_t", "ptrdiff_t", "i64"),
    ("long", "long", "i64"),
    ("long int", "long", "i64"),
    ("unsigned long", "unsigned long", "u64"),
    ("short", "short", "i16"),
    ("short int", "short", "i16"),
    ("unsigned short", "unsigned short", "u16"),
    ("int16_t", "int16_t", "i16"),
    ("uint16_t", "uint16_t", "u16"),
    ("char", "char", "i8"),
    ("signed char", "signed char", "i8"),
    ("int8_t", "int8_t", "i8"),
    ("unsigned char", "unsigned char", "u8"),
    ("char unsigned", "unsigned char", "u8"),
    ("uint8_t", "uint8_t", "u8"),
    ("bool", "bool", "bool"),
    ("float", "float", "f32"),
    ("double", "double", "f64"),
    ("__half", "__half", "f16"),
    ("half", "half", "f16"),
    ("const int", "int", "i32"),
    ("int const", "int", "i32"),
    ("const unsigned long long", "unsigned long long", "u64"),
    ("cudaGraphConditionalHandle", "cudaGraphConditionalHandle", "u64"),
]


@pytest.mark.parametrize("spelling,ctype,kind", SCALARS)
def test_scalars(spelling, ctype, kind):
    assert parse_signature(f"__global__ void k({spelling} v) {{}}", "k") == [P("v", ctype, kind)]
    assert KINDS[ctype] == kind


def test_structs_by_value():
    src = """__global__ void k(MyStruct s, struct Params p, float4 v, const Foo<int, 2> f,
        ns::Bar<Baz<int>, (3 > 2)> b, const __grid_constant__ Params g) {}"""
    assert parse_signature(src, "k") == [
        P("s", "MyStruct", "struct"),
        P("p", "Params", "struct"),
        P("v", "float4", "struct"),
        P("f", "Foo<int, 2>", "struct"),
        P("b", "ns::Bar<Baz<int>, (3>2)>", "struct"),
        P("g", "Params", "struct"),
    ]


def test_unnamed_parameters():
    src = "__global__ void k(float*, const int*, int, unsigned long, MyStruct, ns::Foo) {}"
    assert parse_signature(src, "k") == [
        P("", "float*", "ptr", "write"),
        P("", "const int*", "ptr", "read"),
        P("", "int", "i32"),
        P("", "unsigned long", "u64"),
        P("", "MyStruct", "struct"),
        P("", "ns::Foo", "struct"),
    ]


def test_zero_parameters():
    src = "__global__ void a() {}\n__global__ void b(void) {}\n__global__ void c( \n ) {}"
    assert parse_signature(src, "a") == []
    assert parse_signature(src, "b") == []
    assert parse_signature(src, "c") == []


def test_whitespace_and_newlines_anywhere():
    src = 'extern\n"C"\n__global__\nvoid\nsaxpy\n(\n float\n a ,\nconst\nfloat\n*\nx,float*y,int\tn\n)\n{\n}'
    assert parse_signature(src, "saxpy") == SAXPY
    assert parse_signature(src, "  saxpy ") == SAXPY


def test_declaration_and_definition_agree():
    src = """
    __global__ void k(const float*, int);
    __global__ void k(const float* x, int n) {}
    """
    assert parse_signature(src, "k") == [P("x", "const float*", "ptr", "read"), P("n", "int", "i32")]


def test_not_found():
    with pytest.raises(SignatureError, match=r"kernel 'saxpy': no __global__ function named 'saxpy'"):
        parse_signature("__device__ void saxpy(float a) {}\n// __global__ void saxpy(float a)", "saxpy")
    with pytest.raises(SignatureError, match="'gemm<64>'"):
        parse_signature("__global__ void other(int n) {}", "gemm<64>")
    with pytest.raises(SignatureError, match="not an identifier"):
        parse_signature("__global__ void k() {}", "<int>")


def test_overloads_refused():
    src = "__global__ void k(float* x) {}\n__global__ void k(double* x) {}"
    with pytest.raises(SignatureError, match=r"kernel 'k': 2 overloads.*\(double\*\).*\(float\*\)"):
        parse_signature(src, "k")


@pytest.mark.parametrize(
    "params,match",
    [
        ("float& x", "references"),
        ("const float& x", "references"),
        ("float&& x", "references"),
        ("int n = 3", "default arguments"),
        ("int n, ...", "variadic"),
        ("void (*f)(int)", "function pointers"),
        ("float x[2][3]", "multi-dimensional"),
        ("long double d", "unknown builtin type 'long double'"),
        ("unsigned float f", "unknown builtin type"),
        ("unsigned MyT t", "cannot read the type"),
        ("void v", "has type void"),
        ("const", "has no type"),
        ("Foo<int s", "unbalanced"),
        ("float* x y", "cannot read"),
    ],
)
def test_unreadable_parameters(params, match):
    with pytest.raises(SignatureError, match=match) as info:
        parse_signature(f"__global__ void kern({params}) {{}}", "kern")
    assert "kernel 'kern'" in str(info.value)
    assert isinstance(info.value, RawgraphError) and isinstance(info.value, ValueError)


GLOBAL = re.compile(r"__global__\s+void\s+(?:__\w+__\s*\([^()]*\)\s*)*([A-Za-z_]\w*)\s*\(")


def test_every_kernel_in_the_repo_parses():
    seen = 0
    for stem in kernel_files():
        src = kernel_source(stem)
        names = GLOBAL.findall(src)
        assert len(names) == src.count("__global__"), (stem, names)
        for name in names:
            params = parse_signature(src, name)
            seen += 1
            for p in params:
                # The repo's templates take only non-type parameters (int N), so no by-value
                # parameter depends on a template type: every kind is known.
                assert p.kind is not None, (stem, name, p)
                assert (p.role is not None) == (p.kind == "ptr"), (stem, name, p)
                assert p.kind in ("ptr", "struct") or p.ctype in KINDS, (stem, name, p)
    assert seen >= 20


BRANCHES = """
#ifdef USE_INT
extern "C" __global__ void k(int a, float* y)
#else
extern "C" __global__ void k(float a, float* y)
#endif
{ y[0] = a; }
"""


def test_declarators_in_other_preprocessor_branches_are_refused():
    # Which branch compiles is up to the preprocessor: the types of either could be wrong.
    with pytest.raises(SignatureError, match=r"kernel 'k':.*#if.*types="):
        parse_signature(BRANCHES, "k")
    split = "__global__ void k(\n#if A\n int a,\n#elif B\n float a,\n#endif\n float* y) {}"
    with pytest.raises(SignatureError, match="types="):
        parse_signature(split, "k")
    with pytest.raises(SignatureError, match=r"2 overloads.*types="):
        parse_signature("#if A\n__global__ void k(int a) {}\n#else\n__global__ void k(float a) {}\n#endif\n", "k")
    two_groups = "#ifdef A\n__global__ void k(int a)\n#endif\n#ifndef A\n__global__ void k(float a)\n#endif\n{}"
    with pytest.raises(SignatureError, match=r"2 overloads.*\(float\).*\(int\).*types="):
        parse_signature(two_groups, "k")


def test_what_one_branch_holds_alone_still_parses():
    one = [P("a", "float", "f32"), P("y", "float*", "ptr", "write")]
    # attributes chosen per branch, a guard around the whole kernel, the same kernel in both
    # branches, a forward declaration identical to the definition, a template
    assert (
        parse_signature(
            "__global__ void\n#if __CUDA_ARCH__ >= 900\n__launch_bounds__(256, 2)\n#else\n"
            "__launch_bounds__(256)\n#endif\nk(float a, float* y) {}",
            "k",
        )
        == one
    )
    assert parse_signature("#ifndef K_H\n#define K_H\n__global__ void k(float a, float* y) {}\n#endif\n", "k") == one
    assert (
        parse_signature(
            "#if A\n__global__ void k(float a, float* y) {}\n#else\n__global__ void k(float b, float* z) { }\n#endif\n",
            "k",
        )
        == one
    )
    assert parse_signature("__global__ void k(float, float*);\n__global__ void k(float a, float* y) {}", "k") == one
    assert parse_signature(
        "template <typename T>\n#if A\n__global__ void k(T a, float* y) {}\n#endif\n", "k<float>"
    ) == [P("a", "T", None), P("y", "float*", "ptr", "write")]
