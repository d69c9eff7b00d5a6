"""RawKernel: a user's kernel from source to a rebound replay through the public API (issue 22, item 1)."""

import runpy
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input

from rawgraph import (
    ArgumentError,
    Capture,
    DeviceArray,
    DeviceBuffer,
    ExecUpdateManager,
    RawKernel,
    SignatureError,
    Stream,
)

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent

AXPB = r"""
extern "C" __global__ void __launch_bounds__(256) axpb(float a, const float* __restrict__ x, float b,
                                                      float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""
# Two kernels sharing an intermediate, a by-value struct, a 64-bit count and a double.
CHAIN = r"""
struct Affine { float scale; int shift; double bias; };
extern "C" __global__ void affine(Affine p, const float* x, float* t, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) t[i] = (float)((double)(p.scale * x[i]) + p.bias) + (float)p.shift;
}
extern "C" __global__ void square_add(const float* t, const float* x, float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = t[i] * t[i] + x[i];
}
"""
TEMPLATE = r"""
template <int K, typename T>
__global__ void scale_k(T* y, const T* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = T(K) * x[i];
}
"""
AFFINE = np.dtype([("scale", np.float32), ("shift", np.int32), ("bias", np.float64)], align=True)


def _grid(n, block=256):
    return (n + block - 1) // block


def _poisoned(shape, stream):
    y = DeviceBuffer(shape)
    y.poison(stream)
    return y


def test_eager_call_matches_float64_with_arrays_from_every_source(stream, rng):
    k = RawKernel(AXPB, "axpb")
    assert [(p.name, p.kind, p.role) for p in k.params] == [
        ("a", "f32", None),
        ("x", "ptr", "read"),
        ("b", "f32", None),
        ("y", "ptr", "write"),
        ("n", "i32", None),
    ]
    n = int(rng.integers(1000, 5000))
    a, b = float(rng.uniform(-2, 2)), float(rng.uniform(-1, 1))
    xh = random_input(rng, (n,))
    ref = a * xh.astype(np.float64) + b
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    y = _poisoned((n,), stream)
    k(_grid(n), 256, (a, x, b, y, n), stream=stream)
    got = y.to_numpy(stream)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, err_msg=f"seed {rng.seed_used}")
    # CuPy arrays (its own stream synchronised first), a DeviceArray view and a DLPack producer
    cp = pytest.importorskip("cupy")
    stream.synchronize()
    xc, yc = cp.asarray(xh), cp.full(n, cp.nan, cp.float32)
    cp.cuda.Device().synchronize()
    k(_grid(n), 256, (a, xc, b, yc, n), stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(yc), got)  # the same kernel: the same bits
    y2 = _poisoned((n,), stream)
    k(
        _grid(n),
        (256, 1),
        (np.float32(a), x.view(), b, DeviceArray(y2.ptr, (n,), np.dtype(np.float32), y2), np.int32(n)),
        stream=stream,
    )
    np.testing.assert_array_equal(y2.to_numpy(stream), got)
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(xh).cuda()
    yt = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    k(_grid(n), 256, (a, xt, b, yt, n), stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(yt.cpu().numpy(), got)


def test_bad_arguments_are_refused_before_the_driver(stream, rng, monkeypatch):
    k = RawKernel(AXPB, "axpb")
    n = 512
    x = DeviceBuffer.from_numpy(random_input(rng, (n,)), stream=stream)
    y = _poisoned((n,), stream)
    calls = []
    real = driver.cuLaunchKernel
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda *a: calls.append(a) or real(*a))
    cases = [
        ((2.0, x, 1.0, y, 2.5), "'n' \\(i32\\) takes an int"),  # a float for an int
        ((2.0, x, 1.0, y, 2**40), "'n' \\(i32\\) cannot hold"),  # out of int32's range
        ((2.0, x, 1.0, y, True), "n.*takes an int"),  # a bool is not an int
        ((2.0, np.zeros(n, np.float32), 1.0, y, n), "'x'.*host array"),  # a host array for a pointer
        ((2.0, x.ptr, 1.0, y, n), "'x' is a pointer"),  # a raw address
        (("2", x, 1.0, y, n), "'a' \\(f32\\) takes a number"),  # a string for a float
        ((2.0, x, 1.0, y), "takes 5 arguments"),  # too few
    ]
    for args, match in cases:
        with pytest.raises(ArgumentError, match=match):
            k(_grid(n), 256, args, stream=stream)
    for grid, block in (((0,), 256), (1, (2048,)), (1.5, 256), (1, (1, 1, 1, 1))):
        with pytest.raises(ArgumentError):
            k(grid, block, (2.0, x, 1.0, y, n), stream=stream)
    assert calls == [], "a refused call reached cuLaunchKernel"
    assert np.isnan(y.to_numpy(stream)).all()
    with pytest.raises(SignatureError, match="no __global__"):
        RawKernel(AXPB, "missing")


def test_structs_by_value_64_bit_counts_and_types_given_by_hand(stream, rng):
    affine = RawKernel(CHAIN, "affine")
    assert [p.kind for p in affine.params] == ["struct", "ptr", "ptr", "i64"]
    assert affine.spec[0] == ("p", f"u8[{AFFINE.itemsize}]")
    n = int(rng.integers(1000, 3000))
    xh = random_input(rng, (n,))
    p = np.zeros((), AFFINE)
    p["scale"], p["shift"], p["bias"] = rng.uniform(0.5, 2), int(rng.integers(-3, 3)), rng.uniform(-1, 1)
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    t1, t2 = _poisoned((n,), stream), _poisoned((n,), stream)
    affine(_grid(n), 256, (p[()], x, t1, n), stream=stream)
    affine(_grid(n), 256, (p.tobytes(), x, t2, n), stream=stream)  # the same struct as bytes
    want = (p["scale"] * xh.astype(np.float64)) + p["bias"] + p["shift"]
    got = t1.to_numpy(stream)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"seed {rng.seed_used}")
    np.testing.assert_array_equal(t2.to_numpy(stream), got)
    with pytest.raises(ArgumentError, match="16-byte struct"):
        affine(1, 32, (b"short", x, t1, n), stream=stream)
    # a macro-made or template declaration: the types given by hand, checked against the driver's sizes
    hand = RawKernel(CHAIN, "affine", types=[f"u8[{AFFINE.itemsize}]", "const float*", "float*", "long long"])
    t3 = _poisoned((n,), stream)
    hand(_grid(n), 256, (p[()], x, t3, n), stream=stream)
    np.testing.assert_array_equal(t3.to_numpy(stream), got)
    with pytest.raises(SignatureError, match="bytes"):
        RawKernel(CHAIN, "affine", types=["u8[8]", "const float*", "float*", "int"])


def test_template_name_expressions(stream, rng):
    k3 = RawKernel(TEMPLATE, "scale_k<3, float>")
    assert [p.kind for p in k3.params] == ["ptr", "ptr", "i32"]
    n = 777
    xh = random_input(rng, (n,))
    x = DeviceBuffer.from_numpy(xh, stream=stream)
    y = _poisoned((n,), stream)
    k3(_grid(n), 256, (y, x, n), stream=stream)
    np.testing.assert_array_equal(y.to_numpy(stream), np.float32(3) * xh)


def test_a_captured_user_kernel_is_rebound_by_the_array_object_with_no_copy(stream, rng, monkeypatch):
    k = RawKernel(AXPB, "axpb")
    n = int(rng.integers(2000, 6000))
    a, b = float(rng.uniform(-2, 2)), float(rng.uniform(-1, 1))
    hosts = [random_input(rng, (n,)) for _ in range(3)]
    xs = [DeviceBuffer.from_numpy(h, stream=stream) for h in hosts]
    ys = [_poisoned((n,), stream) for _ in range(3)]
    eager = []
    for x in xs:
        e = _poisoned((n,), stream)
        k(_grid(n), 256, (a, x, b, e, n), stream=stream)
        eager.append(e.to_numpy(stream))
    with Capture(stream) as cap:
        k(_grid(n), 256, (a, xs[0], b, ys[0], n), stream=stream)
    graph = cap.graph
    assert graph.plan is not None and set(graph.plan.buffers) == {"x", "y"}
    assert graph.plan.inputs == ("x",) and graph.plan.outputs == ("y",)
    assert [n_.launch.uses["x"].buffer for n_ in graph.nodes] == ["x"]
    exe = graph.instantiate()
    upd = ExecUpdateManager(graph, exe)
    copies = []
    for name in ("cuMemcpyDtoDAsync", "cuMemcpyAsync", "cuMemcpy2DAsync"):
        real = getattr(driver, name)
        monkeypatch.setattr(driver, name, (lambda r, nm: lambda *a: copies.append(nm) or r(*a))(real, name))
    assert upd.rebind(xs[0], xs[1]) == 1  # by the captured object
    assert upd.rebind(ys[0], ys[1]) == 1
    for y in ys:
        y.poison(stream)
    upd.launch(stream)
    monkeypatch.undo()
    got = [y.to_numpy(stream) for y in ys]
    np.testing.assert_array_equal(got[1], eager[1], err_msg=f"seed {rng.seed_used}")
    assert np.isnan(got[0]).all() and np.isnan(got[2]).all(), "the replay wrote an output it is not bound to"
    assert copies == [], "the rebind or replay copied"
    # by the C parameter's name, and by a view with the same address and size
    upd.bind("x", xs[2])
    upd.rebind(ys[1].view(), ys[2])
    ys[2].poison(stream)
    upd.launch(stream)
    np.testing.assert_array_equal(ys[2].to_numpy(stream), eager[2])
    with pytest.raises(KeyError, match="bound to none"):
        upd.rebind(xs[0], xs[1])  # xs[0] is bound to nothing any more
    upd.close()
    exe.close()
    graph.close()


def test_a_two_kernel_capture_shares_names_and_renames_on_request(stream, rng):
    affine, sq = RawKernel(CHAIN, "affine"), RawKernel(CHAIN, "square_add")
    n = int(rng.integers(1000, 3000))
    hosts = [random_input(rng, (n,)) for _ in range(2)]
    xs = [DeviceBuffer.from_numpy(h, stream=stream) for h in hosts]
    t, out = DeviceBuffer((n,)), _poisoned((n,), stream)
    p = np.zeros((), AFFINE)
    p["scale"], p["shift"], p["bias"] = 1.5, 1, -0.25

    def run(x, o, s, names=None):
        affine(_grid(n), 256, (p[()], x, t, n), stream=s, names=names)
        sq(_grid(n), 256, (t, x, o, n), stream=s)

    want = []
    for x in xs:
        e = _poisoned((n,), stream)
        run(x, e, stream)
        want.append(e.to_numpy(stream))
    with Capture(stream) as cap:
        run(xs[0], out, stream, names={"x": "inp"})
    plan = cap.graph.plan
    # x is one array used by both kernels: one name (given at the first call); t is read and written
    assert set(plan.buffers) == {"inp", "t", "out"}
    assert [nd.launch.uses["x"].buffer for nd in cap.graph.nodes] == ["inp", "inp"]
    exe = cap.graph.instantiate()
    upd = ExecUpdateManager(cap.graph, exe, names=["inp"])
    assert upd.rebind(xs[0], xs[1]) == 2  # both nodes read it
    out.poison(stream)
    upd.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), want[1], err_msg=f"seed {rng.seed_used}")
    upd.close()
    exe.close()
    cap.graph.close()


def test_a_call_on_a_stream_no_rawgraph_capture_records_is_not_in_any_node_map(stream, rng):
    """Eager calls on other streams while a capture is open run now, and are not recorded."""
    k = RawKernel(AXPB, "axpb")
    n = 256
    x = DeviceBuffer.from_numpy(random_input(rng, (n,)), stream=stream)
    y, z = _poisoned((n,), stream), _poisoned((n,), stream)
    stream.synchronize()  # z's poison lands before the kernel on the other stream writes it
    with Stream() as other:
        with Capture(stream) as cap:
            k(1, 256, (1.0, x, 0.0, y, n), stream=stream)
            k(1, 256, (1.0, x, 0.0, z, n), stream=other)  # runs now, on the other stream
        other.synchronize()
        assert len(cap.graph.nodes) == 1 and cap.graph.foreign_nodes == []
        np.testing.assert_array_equal(z.to_numpy(other), x.to_numpy(other))
    cap.graph.close()


GATED = r"""
extern "C" __global__ void gated(bool on, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = on ? 2.0f * x[i] : -x[i];
}
"""


@pytest.mark.parametrize("taken", [1, 0])
def test_a_call_in_a_conditional_body_runs_when_the_device_says_so(stream, rng, taken):
    from rawgraph.graphs import conditional as cn

    k = RawKernel(GATED, "gated")
    n = int(rng.integers(500, 3000))
    xh = random_input(rng, (n,))
    x, y = DeviceBuffer.from_numpy(xh, stream=stream), _poisoned((n,), stream)
    with Stream() as body_stream:
        with Capture(stream) as cap:
            h = cn.capture_handle(cap, default=taken)
            node = cn.capture_conditional(cap, "if", h)
            with node.capture_body(0, body_stream):
                k(_grid(n), 256, (True, x, y, n), stream=body_stream)
    (kn,) = node.body_kernel_nodes(0)
    assert set(kn.launch.uses) == {"x", "y"}
    exe = cap.graph.instantiate()
    exe.launch(stream)
    got = y.to_numpy(stream)
    if taken:
        np.testing.assert_array_equal(
            got, (2.0 * xh.astype(np.float64)).astype(np.float32), err_msg=f"seed {rng.seed_used}"
        )
    else:
        assert np.isnan(got).all(), "the body ran although the condition was 0"
    exe.close()
    cap.graph.close()


def test_the_own_kernel_example_runs():
    runpy.run_path(str(ROOT / "examples" / "own_kernel.py"), run_name="__main__")


def test_plain_cpp_and_namespaced_kernels_run(stream, rng):
    from test_rawkernel_cpu import CPP  # __global__ void saxpy(...) and ns::twice(...): C++ linkage

    saxpy, twice = RawKernel(CPP, "saxpy"), RawKernel(CPP, "ns::twice")
    assert saxpy.kernel.symbol.startswith("_Z") and twice.kernel.symbol.startswith("_ZN2ns")
    n = int(rng.integers(500, 3000))
    a = np.float32(rng.uniform(-2, 2))
    xh, yh = random_input(rng, (n,)), random_input(rng, (n,))
    x, y = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer.from_numpy(yh, stream=stream)
    saxpy(_grid(n), 256, (a, x, y, n), stream=stream)
    got = y.to_numpy(stream)
    want = np.float64(a) * xh.astype(np.float64) + yh
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"seed {rng.seed_used}")
    twice(_grid(n), 256, (y, n), stream=stream)
    np.testing.assert_array_equal(y.to_numpy(stream), np.float32(2) * got)  # doubling is exact


HALF = r"""
#include <cuda_fp16.h>
extern "C" __global__ void hscale(const __half* __restrict__ x, __half s, __half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hadd(__hmul(x[i], s), __float2half(1.0f));
}
"""


def test_a_half_kernel_from_cuda_fp16_h_runs_with_float16_arrays_and_a_half_scalar(stream, rng):
    # <cuda_fp16.h> comes from the toolkit headers rawgraph's dependencies install; a __half
    # scalar is packed from a Python or NumPy float (rounded to float16), __half* takes float16.
    k = RawKernel(HALF, "hscale")
    assert k.spec == [("x", "ptr"), ("s", "f16"), ("y", "ptr"), ("n", "i32")]
    assert k.layout == [(0, 8), (8, 2), (16, 8), (24, 4)]
    n = int(rng.integers(1000, 5000))
    xh = rng.uniform(-4, 4, n).astype(np.float16)
    for s in (float(rng.uniform(0.5, 2)), np.float16(rng.uniform(-2, -0.5))):
        x = DeviceBuffer.from_numpy(xh, stream=stream)
        y = DeviceBuffer.from_numpy(np.full(n, np.nan, np.float16), stream=stream)
        k(_grid(n), 256, (x, s, y, n), stream=stream)
        got = y.to_numpy(stream).astype(np.float64)
        prod = xh.astype(np.float64) * float(np.float16(s))  # the scalar as the kernel got it
        want = prod + 1.0
        # __hmul and __hadd each round to half (relative error at most 2**-11): bound both.
        bound = 2.0**-11 * (np.abs(prod) + np.abs(want)) * 1.01
        bad = np.abs(got - want) > bound
        assert not bad.any(), (
            f"seed {rng.seed_used}: {bad.sum()} of {n} off, first at {np.argmax(bad)}: "
            f"got {got[bad][:4]}, want {want[bad][:4]}"
        )
    with pytest.raises(ArgumentError, match="points at float16"):
        k(_grid(n), 256, (DeviceBuffer.from_numpy(xh.astype(np.float32), stream=stream), 1.0, y, n), stream=stream)
    with pytest.raises(ArgumentError, match="would become infinite"):
        k(_grid(n), 256, (x, 1e6, y, n), stream=stream)
