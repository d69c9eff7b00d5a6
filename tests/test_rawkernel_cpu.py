"""RawKernel on the CPU fake driver (no GPU): what reaches the driver, byte for byte.

The kernels are really compiled (NVRTC, sm_90 CUBIN) and loaded by the fake, which reads each
kernel's parameter layout from the CUBIN, answers ``cuFuncGetParamInfo`` from it and copies the
argument values at launch and capture as the driver does. So these tests see the exact bytes a
launch passes, which node a capture recorded, and what an exec holds after a rebind. Kernels never
run here; the GPU tests (``tests/test_rawkernel_gpu.py``) check the results.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from cuda.bindings import driver
from fault_cases import fake_session

from rawgraph import ArgumentError, Capture, DeviceBuffer, ExecUpdateManager, RawKernel, SignatureError, Stream

AXPB = r"""
extern "C" __global__ void axpb(float a, const float* __restrict__ x, float b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
struct Affine { float scale; int shift; double bias; };
extern "C" __global__ void affine(Affine p, const float* x, float* t, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) t[i] = (float)(p.scale * x[i] + p.bias) + p.shift;
}
"""
AFFINE = np.dtype([("scale", np.float32), ("shift", np.int32), ("bias", np.float64)], align=True)


@pytest.fixture
def fake():
    import rawgraph.runtime.rawkernel as rawkernel

    saved = dict(rawkernel._loaded)
    rawkernel._loaded.clear()  # modules loaded into the fake must not outlive it
    with fake_session() as (fk, _hook):
        try:
            yield fk
        finally:
            for k in rawkernel._loaded.values():
                k.module.close()
            rawkernel._loaded.clear()
    rawkernel._loaded.update(saved)


@pytest.fixture
def launches(fake, monkeypatch):
    """Every cuLaunchKernel outside a capture: (grid, block, smem, stream, argument bytes)."""
    seen: list[tuple] = []
    real = driver.cuLaunchKernel

    def spy(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        blob = fake._kernel_params(f, (gx, gy, gz), (bx, by, bz), smem, int(params), int(extra))["blob"]
        seen.append(((gx, gy, gz), (bx, by, bz), smem, int(stream), blob))
        return real(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)

    monkeypatch.setattr(driver, "cuLaunchKernel", spy)
    return seen


def _value(fake, kernel, blob, i):
    off, size = fake.layout(kernel.kernel.handle)[i]
    return blob[off : off + size]


def test_the_layout_comes_from_the_driver_and_the_types_from_the_declaration(fake):
    k = RawKernel(AXPB, "axpb")
    assert fake.layout(k.kernel.handle) == [(0, 4), (8, 8), (16, 4), (24, 8), (32, 4)]
    assert k.spec == [("a", "f32"), ("x", "ptr"), ("b", "f32"), ("y", "ptr"), ("n", "i32")]
    assert [p.role for p in k.params] == [None, "read", None, "write", None]
    aff = RawKernel(AXPB, "affine")
    assert aff.spec == [("p", "u8[16]"), ("x", "ptr"), ("t", "ptr"), ("n", "i64")]
    assert "axpb(float a, const float* x" in repr(k)
    with pytest.raises(SignatureError, match="4 arguments; 3 types"):
        RawKernel(AXPB, "affine", types=["u8[16]", "ptr", "ptr"])
    with pytest.raises(SignatureError, match="16"):
        RawKernel(AXPB, "affine", types=["u8[12]", "ptr", "ptr", "i64"])
    with pytest.raises(SignatureError, match="unknown argument type"):
        RawKernel(AXPB, "affine", types=["Affine", "ptr", "ptr", "i64"])
    loads = []
    real = driver.cuModuleLoadData
    driver.cuModuleLoadData = lambda *a: loads.append(a) or real(*a)
    try:
        with pytest.raises(SignatureError, match="no __global__ function named 'axp'"):
            RawKernel(AXPB, "axp")  # refused from the source, before NVRTC and the driver
    finally:
        driver.cuModuleLoadData = real
    assert loads == []


@pytest.mark.parametrize("version", [13000, 13020])
def test_the_layout_asks_the_parameter_count_where_the_driver_has_the_call(fake, monkeypatch, version):
    """A driver of CUDA 13.2 or later answers ``cuFuncGetParamCount``: the layout then asks exactly
    that many ``cuFuncGetParamInfo`` indexes. An older one does not export the call (the binding
    raises): it is never called there, and the layout is read until ``CUDA_ERROR_INVALID_VALUE``."""
    from rawgraph.graphs.nodes import read_layout
    from rawgraph.runtime.module import read_param_layout

    fake.version = version
    calls = []
    for name in ("cuFuncGetParamCount", "cuFuncGetParamInfo"):
        real = getattr(driver, name)
        monkeypatch.setattr(driver, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    k = RawKernel(AXPB + f"// driver {version}\n", "axpb")  # a source of its own: loaded, not cached
    assert k.spec == [("a", "f32"), ("x", "ptr"), ("b", "f32"), ("y", "ptr"), ("n", "i32")]
    if version >= 13020:
        assert calls == ["cuFuncGetParamCount"] + ["cuFuncGetParamInfo"] * 5
    else:
        assert calls == ["cuFuncGetParamInfo"] * 6  # the sixth answers CUDA_ERROR_INVALID_VALUE
    layout, why = read_layout(k.kernel.handle)
    assert [(p.offset, p.size) for p in layout] == [(0, 4), (8, 8), (16, 4), (24, 8), (32, 4)] and why == ""
    if version >= 13020:  # a function the driver has no layout for: a reason naming the call, no raise
        monkeypatch.setattr(driver, "cuFuncGetParamCount", lambda f: (driver.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0))
        assert read_layout(k.kernel.handle) == (None, "cuFuncGetParamCount(0): CUDA_ERROR_NOT_SUPPORTED")
        assert read_param_layout(k.kernel.handle).call == "cuFuncGetParamCount"


def test_a_call_passes_exactly_its_arguments(fake, launches):
    k, aff = RawKernel(AXPB, "axpb"), RawKernel(AXPB, "affine")
    with Stream() as s:
        x, y = DeviceBuffer(1000), DeviceBuffer(1000)
        k((4,), 256, (1.5, x, np.float32(-2.0), y, 1000), stream=s)
        grid, block, smem, h, blob = launches[-1]
        assert (grid, block, smem, h) == ((4, 1, 1), (256, 1, 1), 0, int(s.handle))
        got = [_value(fake, k, blob, i) for i in range(5)]
        assert got == [
            struct.pack("<f", 1.5),
            struct.pack("<Q", x.ptr),
            struct.pack("<f", -2.0),
            struct.pack("<Q", y.ptr),
            struct.pack("<i", 1000),
        ]
        p = np.zeros((), AFFINE)
        p["scale"], p["shift"], p["bias"] = 0.5, -7, 1e300
        aff(1, 32, (p[()], x, y, 1 << 40), stream=s)
        blob = launches[-1][4]
        assert _value(fake, aff, blob, 0) == p.tobytes()
        assert _value(fake, aff, blob, 3) == struct.pack("<q", 1 << 40)
        aff(1, 32, (bytearray(p.tobytes()), x, y, 3), stream=s)  # bytes-like of the right size
        assert _value(fake, aff, launches[-1][4], 0) == p.tobytes()


def test_bad_arguments_never_reach_the_driver(fake, launches):
    k, aff = RawKernel(AXPB, "axpb"), RawKernel(AXPB, "affine")
    with Stream() as s:
        x, y = DeviceBuffer(64), DeviceBuffer(64)
        bad = {
            "a float for an int": ((1.0, x, 0.0, y, 2.5), "'n' \\(i32\\) takes an int"),
            "2**40 for an int32": ((1.0, x, 0.0, y, 1 << 40), "cannot hold"),
            "a bool for an int": ((1.0, x, 0.0, y, True), "takes an int"),
            "a host array for a pointer": ((1.0, np.zeros(64, np.float32), 0.0, y, 64), "host array"),
            "an address for a pointer": ((1.0, x.ptr, 0.0, y, 64), "is a pointer"),
            "a list for a float": (([1.0], x, 0.0, y, 64), "takes a number"),
            "too many": ((1.0, x, 0.0, y, 64, 1), "takes 5 arguments"),
            "not a tuple": ("abc", "tuple"),
        }
        for _what, (args, match) in bad.items():
            with pytest.raises(ArgumentError, match=match):
                k(1, 64, args, stream=s)
        for grid, block in (
            (0, 64),
            (1, 2048),
            (1.5, 64),
            (1, (1, 1, 1, 1)),
            ((True,), 64),
            (1 << 32, 64),
            ((1, 65536), 64),
            (1, (1, 1, 65)),
        ):
            with pytest.raises(ArgumentError):
                k(grid, block, (1.0, x, 0.0, y, 64), stream=s)
        with pytest.raises(ArgumentError, match="16-byte struct"):
            aff(1, 32, (b"\x00" * 12, x, y, 64), stream=s)
        with pytest.raises(ArgumentError, match="not pointer parameters"):
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s, names={"n": "count"})
        with pytest.raises(ArgumentError, match="shared_mem"):
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s, shared_mem=-1)
        assert launches == [], "a refused call reached cuLaunchKernel"
        x.close()
        with pytest.raises(Exception, match="closed"):
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s)
        assert launches == []


def test_a_capture_records_the_call_and_the_manager_rebinds_it_by_array(fake):
    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x0, x1, y0, y1 = (DeviceBuffer(512) for _ in range(4))
        with Capture(s) as cap:
            k(2, 256, (2.0, x0, 1.0, y0, 512), stream=s)
        graph = cap.graph
        (node,) = graph.nodes
        assert {a: u.buffer for a, u in node.launch.uses.items()} == {"x": "x", "y": "y"}
        assert graph.plan is not None and graph.plan.inputs == ("x",) and graph.plan.outputs == ("y",)
        exe = graph.instantiate()
        upd = ExecUpdateManager(graph, exe)

        def held(i):
            return _value(fake, k, fake.exec_kernel(exe.handle, node.handle)["blob"], i)

        assert held(1) == struct.pack("<Q", x0.ptr)
        assert upd.rebind(x0, x1) == 1  # by the object captured
        assert held(1) == struct.pack("<Q", x1.ptr) and held(3) == struct.pack("<Q", y0.ptr)
        assert upd.rebind(y0.view(), y1) == 1  # by a view of the same memory
        assert held(3) == struct.pack("<Q", y1.ptr)
        assert held(0) == struct.pack("<f", 2.0) and held(4) == struct.pack("<i", 512)  # scalars kept
        upd.bind("x", x0)  # by the C parameter's name
        assert held(1) == struct.pack("<Q", x0.ptr)
        with pytest.raises(KeyError, match="bound to none"):
            upd.rebind(x1, y0)
        with pytest.raises(Exception, match="overlaps"):
            upd.rebind(x0, y1)  # x would overlap the written y
        assert held(1) == struct.pack("<Q", x0.ptr)
        upd.close()
        exe.close()
        graph.close()


def test_names_are_shared_by_one_array_and_numbered_for_two(fake):
    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, y1, y2 = DeviceBuffer(256), DeviceBuffer(256), DeviceBuffer(256)
        other = DeviceBuffer(256)
        with Capture(s) as cap:
            k(1, 256, (1.0, x, 0.0, y1, 256), stream=s, names={"x": "inp"})
            k(1, 256, (2.0, x, 0.0, y2, 256), stream=s)  # the same x: the same name
            k(1, 256, (3.0, other, 0.0, y2, 256), stream=s)  # another x: numbered
        names = [{a: u.buffer for a, u in n.launch.uses.items()} for n in cap.graph.nodes]
        assert names == [{"x": "inp", "y": "y"}, {"x": "inp", "y": "y_2"}, {"x": "x", "y": "y_2"}]
        exe = cap.graph.instantiate()
        upd = ExecUpdateManager(cap.graph, exe, names=["inp"])
        fresh = DeviceBuffer(256)
        assert upd.rebind(x, fresh) == 2  # both nodes that read it
        blobs = [fake.exec_kernel(exe.handle, n.handle)["blob"] for n in cap.graph.nodes]
        assert [_value(fake, k, b, 1) for b in blobs] == [
            struct.pack("<Q", p) for p in (fresh.ptr, fresh.ptr, other.ptr)
        ]
        upd.close()
        exe.close()
        cap.graph.close()


def test_a_capture_whose_names_clash_gets_no_plan(fake):
    """Capture.run of a plan whose buffer names another array already has: no plan is guessed."""
    from rawgraph.runtime.launch import ArgUse, Launch, LaunchPlan

    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, y, z = DeviceBuffer(64), DeviceBuffer(64), DeviceBuffer(64)
        with Capture(s) as cap:
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s)
            launch = k.launch(1, 64, (1.0, z, 0.0, y, 64))
            cap.run(LaunchPlan([launch], {"x": z.view(), "y": y.view()}, ("x",), ("y",)))
        assert cap.graph.plan is None
        with pytest.raises(ValueError, match="no launch plan"):
            ExecUpdateManager(cap.graph, cap.graph.instantiate())
        assert isinstance(launch, Launch) and launch.uses["x"] == ArgUse("x", "read")
        cap.graph.close()


def test_unnamed_parameters_get_positional_names(fake, launches):
    k = RawKernel('extern "C" __global__ void fill(float*, int) {}\n', "fill")
    assert k.spec == [("arg0", "ptr"), ("arg1", "i32")]
    with Stream() as s:
        y = DeviceBuffer(8)
        k(1, 8, (y, 8), stream=s)
        assert _value(fake, k, launches[-1][4], 0) == struct.pack("<Q", y.ptr)


KINDS_SRC = r"""
extern "C" __global__ void kinds(bool on, float h, double d, unsigned short u, const int* idx, void* raw,
                                 unsigned char* bytes, float* y) {}
"""


def test_bool_floats_and_byte_pointers_pack_and_refuse_what_they_cannot_hold(fake, launches):
    from rawgraph.graphs.graph import read_node_args

    k = RawKernel(KINDS_SRC, "kinds")
    assert k.spec == [
        ("on", "bool"),
        ("h", "f32"),
        ("d", "f64"),
        ("u", "u16"),
        ("idx", "ptr"),
        ("raw", "ptr"),
        ("bytes", "ptr"),
        ("y", "ptr"),
    ]
    with Stream() as s:
        idx, y = DeviceBuffer(4, np.int32), DeviceBuffer(4)
        raw, b8 = DeviceBuffer(16, np.float64), DeviceBuffer(16, np.uint8)
        k(1, 1, (True, 1.5, float("inf"), 65535, idx, raw, y, b8), stream=s)  # any array for void*/u8*
        blob = launches[-1][4]
        assert [_value(fake, k, blob, i) for i in range(4)] == [
            b"\x01",
            struct.pack("<f", 1.5),
            struct.pack("<d", float("inf")),
            struct.pack("<H", 65535),
        ]
        k(1, 1, (np.bool_(False), np.float16(-2), 0.0, 0, idx, raw, b8, b8), stream=s)  # a byte array for float*
        assert _value(fake, k, launches[-1][4], 0) == b"\x00"
        n = len(launches)
        bad = {
            "an int for a bool": ((1, 1.0, 0.0, 0, idx, raw, b8, y), "takes True or False"),
            "a finite value past f32": ((True, 1e39, 0.0, 0, idx, raw, b8, y), "would become infinite"),
            "an int past any float": ((True, 1.0, 2**2000, 0, idx, raw, b8, y), "too large"),
            "65536 for an unsigned short": ((True, 1.0, 0.0, 65536, idx, raw, b8, y), "cannot hold"),
            "floats for const int*": ((True, 1.0, 0.0, 0, y, raw, b8, y), "'idx' points at int32"),
            "ints for float*": ((True, 1.0, 0.0, 0, idx, raw, b8, idx), "'y' points at float32"),
            "a bool for a float": ((True, True, 0.0, 0, idx, raw, b8, y), "takes a number"),
        }
        for _what, (args, match) in bad.items():
            with pytest.raises(ArgumentError, match=match):
                k(1, 1, args, stream=s)
        assert len(launches) == n, "a refused call reached cuLaunchKernel"
        with Capture(s) as cap:
            k(1, 1, (True, 0.25, -3.0, 7, idx, raw, b8, y), stream=s)
        (node,) = cap.graph.nodes
        got = read_node_args(node.handle, node.launch)
        assert got["on"] is True and got["h"] == 0.25 and got["d"] == -3.0 and got["u"] == 7
        assert got["idx"] == idx.ptr and got["y"] == y.ptr
        exe = cap.graph.instantiate()
        upd = ExecUpdateManager(cap.graph, exe)
        assert upd.set_params(0, on=False, u=9) == 1
        held = fake.exec_kernel(exe.handle, node.handle)["blob"]
        assert _value(fake, k, held, 0) == b"\x00" and _value(fake, k, held, 3) == struct.pack("<H", 9)
        with pytest.raises(ArgumentError, match="takes True or False"):
            upd.set_params(0, on=0)
        assert _value(fake, k, fake.exec_kernel(exe.handle, node.handle)["blob"], 0) == b"\x00"
        upd.close()
        exe.close()
        cap.graph.close()


def test_a_call_from_another_thread_into_an_open_capture_is_refused(fake, launches):
    import threading

    from rawgraph import CaptureRefusedError

    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, y = DeviceBuffer(64), DeviceBuffer(64)
        errors: list[BaseException] = []

        def other():
            try:
                k(1, 64, (1.0, x, 0.0, y, 64), stream=s)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)

        with Capture(s) as cap:
            k(1, 64, (2.0, x, 0.0, y, 64), stream=s)
            t = threading.Thread(target=other, name="intruder")
            t.start()
            t.join()
        assert len(errors) == 1 and isinstance(errors[0], CaptureRefusedError), errors
        assert "MainThread" in str(errors[0])
        assert len(cap.graph.nodes) == 1 and cap.graph.foreign_nodes == []
        assert len(launches) == 1, "the refused call reached cuLaunchKernel"
        cap.graph.close()


def test_explicit_names_are_never_renamed(fake):
    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, other, y, y2 = (DeviceBuffer(64) for _ in range(4))
        with Capture(s) as cap:
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s, names={"x": "inp"})
            with pytest.raises(ArgumentError, match="'inp' is another array"):
                k(1, 64, (1.0, other, 0.0, y, 64), stream=s, names={"x": "inp"})
            with pytest.raises(ArgumentError, match="already 'inp'"):
                k(1, 64, (1.0, x, 0.0, y, 64), stream=s, names={"x": "source"})
            with pytest.raises(ArgumentError, match="two different arrays"):
                k(1, 64, (1.0, other, 0.0, y2, 64), stream=s, names={"x": "z", "y": "z"})
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s, names={"x": "inp"})  # the same array, the same name
        # Refused before any driver call, so the capture itself is unharmed: two nodes, one plan.
        assert len(cap.graph.nodes) == 2
        assert cap.graph.plan is not None and set(cap.graph.plan.buffers) == {"inp", "y"}
        cap.graph.close()


def test_the_plan_a_capture_keeps_is_checked_against_the_captured_pointers(fake):
    import gc
    import weakref

    from rawgraph.runtime.launch import LaunchPlan

    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, y, z = DeviceBuffer(64), DeviceBuffer(64), DeviceBuffer(64)
        # A launch whose uses name "x" while its argument holds z's address: no plan is guessed.
        with Capture(s) as cap:
            launch = k.launch(1, 64, (1.0, z, 0.0, y, 64))
            cap.launch(launch, buffers={"x": x.view(), "y": y.view()})
        assert cap.graph.plan is None
        cap.graph.close()
        # No plan (two arrays named "x"), yet the graph holds every array its nodes point at.
        with Capture(s) as cap:
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s)
            cap.run(LaunchPlan([k.launch(1, 64, (1.0, z, 0.0, y, 64))], {"x": z.view(), "y": y.view()}))
        assert cap.graph.plan is None
        ref = weakref.ref(z)
        graph = cap.graph
        del cap, launch, z
        gc.collect()
        assert ref() is not None and any(a.owner is ref() for a in graph.arrays)
        graph.close()
        # One plan run and nothing else: the graph's plan is that plan itself, guards and all.
        w = DeviceBuffer(64)
        plan = LaunchPlan([k.launch(1, 64, (1.0, w, 0.0, y, 64))], {"x": w.view(), "y": y.view()}, ("x",), ("y",))
        with Capture(s) as cap:
            cap.run(plan)
        assert cap.graph.plan is plan
        cap.graph.close()
        # A RawKernel call on a forked side stream is recorded there, after the fork.
        with Capture(s, side_streams=1) as cap:
            k(1, 64, (1.0, x, 0.0, y, 64), stream=s)
            (side,) = cap.fork(1)
            k(1, 64, (1.0, y, 0.0, w, 64), stream=side)
            cap.join(side)
        first, second = cap.graph.nodes
        assert int(first.handle) in second.deps and cap.graph.foreign_nodes == []
        assert cap.graph.plan is not None and cap.graph.plan.inputs == ("x",)
        assert set(cap.graph.plan.outputs) == {"y", "y_2"}
        cap.graph.close()
        # Two plans in one capture, each naming the middle buffer its own way ("y" written by the
        # first, "mid" read by the second): the derived plan's only input is x, never "mid".
        z = DeviceBuffer(64)
        first = LaunchPlan([k.launch(1, 64, (1.0, w, 0.0, y, 64))], {"x": w.view(), "y": y.view()}, ("x",), ("y",))
        second = LaunchPlan(
            [k.launch(1, 64, (1.0, y, 0.0, z, 64), names={"x": "mid", "y": "z"})],
            {"mid": y.view(), "z": z.view()},
            ("mid",),
            ("z",),
        )
        with Capture(s) as cap:
            cap.run(first)
            cap.run(second)
        derived = cap.graph.plan
        assert derived is not None and derived.inputs == ("x",), derived.inputs
        assert set(derived.outputs) == {"y", "mid", "z"}
        cap.graph.close()


def test_a_call_inside_a_conditional_body_is_recorded_in_the_body(fake):
    from rawgraph.graphs import conditional as cn

    k = RawKernel(AXPB, "axpb")
    with Stream() as s, Stream() as body_stream:
        x, y = DeviceBuffer(64), DeviceBuffer(64)
        with Capture(s) as cap:
            h = cn.capture_handle(cap, default=1)
            node = cn.capture_conditional(cap, "if", h)
            with node.capture_body(0, body_stream):
                k(1, 64, (3.0, x, 0.5, y, 64), stream=body_stream)
        (kn,) = node.body_kernel_nodes(0)
        assert kn.launch.kernel is k.kernel and set(kn.launch.uses) == {"x", "y"}
        assert _value(fake, k, kn.captured_args, 0) == struct.pack("<f", 3.0)
        assert any(getattr(a, "owner", None) is x for a in node.bodies[0].keep)  # held by the body
        with pytest.raises(Exception, match="own stream"):
            with node.capture_body(0, body_stream) as bc:
                bc.launch(kn.launch, stream=s)
        cap.graph.close()


# C++ linkage, one kernel in a namespace (tests/test_rawkernel_gpu.py runs them).
CPP = r"""
__global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
namespace ns {
__global__ void twice(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * y[i];
}
}
"""


def test_a_plain_cpp_or_namespaced_kernel_loads_by_its_mangled_name(fake, launches):
    saxpy, k = RawKernel(CPP, "saxpy"), RawKernel(CPP, "ns::twice")
    # C++ linkage: the CUBIN holds the mangled symbol NVRTC reports for the name expression.
    assert saxpy.kernel.symbol.startswith("_Z") and "saxpy" in saxpy.kernel.symbol
    assert k.kernel.symbol.startswith("_ZN2ns") and k.spec == [("y", "ptr"), ("n", "i32")]
    with Stream() as s:
        x, y = DeviceBuffer(64), DeviceBuffer(64)
        saxpy(1, 64, (2.0, x, y, 64), stream=s)
        assert _value(fake, saxpy, launches[-1][4], 2) == struct.pack("<Q", y.ptr)
        k(1, 64, (y, 64), stream=s)
        assert _value(fake, k, launches[-1][4], 1) == struct.pack("<i", 64)


ROWS = r"""
struct Rows { int r[4]; };
extern "C" __global__ void rows(Rows t, float* y) {}
"""


def test_int32_array_arguments_are_checked_like_int_scalars(fake, launches):
    k = RawKernel(ROWS, "rows", types=["i32[4]", "float*"])
    with Stream() as s:
        y = DeviceBuffer(4)
        k(1, 1, ([1, -2, 2**31 - 1, -(2**31)], y), stream=s)
        assert _value(fake, k, launches[-1][4], 0) == struct.pack("<4i", 1, -2, 2**31 - 1, -(2**31))
        k(1, 1, (np.arange(4, dtype=np.int64), y), stream=s)  # NumPy integers in range
        assert _value(fake, k, launches[-1][4], 0) == struct.pack("<4i", 0, 1, 2, 3)
        n = len(launches)
        bad = {
            "floats": ([1.7, 2.9, -3.5, 4.2], r"'t'\[0\] \(i32\) takes an int"),
            "2**40": ([0, 2**40, 0, 0], r"'t'\[1\] \(i32\) cannot hold"),
            "strings": (["1", "2", "3", "4"], "takes an int, got str"),
            "bools": ([True, 0, 0, 0], "takes an int"),
            "a float array": (np.ones(4), "takes an int"),
            "three values": ([1, 2, 3], "takes 4 int32 values"),
            "a string": ("abcd", "takes 4 int32 values"),
            "nested": ([[1, 2], [3, 4]], "takes 4 int32 values"),
        }
        for _what, (value, match) in bad.items():
            with pytest.raises(ArgumentError, match=match):
                k(1, 1, (value, y), stream=s)
        assert len(launches) == n, "a refused call reached cuLaunchKernel"


def test_a_device_array_made_with_a_numpy_scalar_type_is_a_pointer_argument(fake, launches):
    from rawgraph import DeviceArray

    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, y = DeviceBuffer(64), DeviceBuffer(64)
        view = DeviceArray(y.ptr, (64,), np.float32, y)  # the form the pointer error suggests
        k(1, 64, (1.0, x, 0.0, view, 64), stream=s)
        assert view.dtype == np.dtype(np.float32) and view.nbytes == 256
        assert _value(fake, k, launches[-1][4], 3) == struct.pack("<Q", y.ptr)
        with pytest.raises(ArgumentError, match="points at float32"):
            k(1, 64, (1.0, DeviceArray(x.ptr, (64,), np.int32, x), 0.0, y, 64), stream=s)


class _CAI:
    def __init__(self, ptr, typestr="<f4", readonly=False, shape=(64,)):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, readonly),
            "strides": None,
            "version": 3,
        }


def test_read_only_arrays_only_for_const_pointers_and_big_endian_never(fake, launches):
    from test_dlpack_cpu import FakeCapsule

    k = RawKernel(AXPB, "axpb")
    with Stream() as s:
        x, y = DeviceBuffer(64), DeviceBuffer(64)
        ro = _CAI(x.ptr, readonly=True)
        k(1, 64, (1.0, ro, 0.0, y, 64), stream=s)  # read-only memory for `const float* x`
        assert _value(fake, k, launches[-1][4], 1) == struct.pack("<Q", x.ptr)
        n = len(launches)
        with pytest.raises(ArgumentError, match=r"'y' is read-only memory.*float\* y"):
            k(1, 64, (1.0, x, 0.0, _CAI(y.ptr, readonly=True), 64), stream=s)
        dl_ro = FakeCapsule(shape=(64,), data=y.ptr, versioned=True, flags=1)  # DLPack's read-only flag
        with pytest.raises(ArgumentError, match="'y' is read-only memory"):
            k(1, 64, (1.0, x, 0.0, dl_ro.capsule, 64), stream=s)
        for which in (1, 3):  # const or not: a big-endian array is never what the kernel reads
            args = [1.0, x, 0.0, y, 64]
            args[which] = _CAI(y.ptr, typestr=">f4")
            with pytest.raises(ArgumentError, match="big-endian"):
                k(1, 64, tuple(args), stream=s)
        assert len(launches) == n, "a refused call reached cuLaunchKernel"
        # types= given by hand: only a const pointer type takes read-only memory
        hand = RawKernel(AXPB, "axpb", types=["float", "float*", "float", "float*", "int"])
        with pytest.raises(ArgumentError, match="'x' is read-only memory"):
            hand(1, 64, (1.0, ro, 0.0, y, 64), stream=s)
        RawKernel(AXPB, "axpb", types=["float", "const float*", "float", "float*", "int"])(
            1, 64, (1.0, ro, 0.0, y, 64), stream=s
        )
        assert len(launches) == n + 1


def test_a_kernel_declared_per_preprocessor_branch_needs_types(fake, launches):
    src = (
        '#ifdef USE_INT\nextern "C" __global__ void k(int a, float* y)\n#else\n'
        'extern "C" __global__ void k(float a, float* y)\n#endif\n{ y[0] = a; }\n'
    )
    with pytest.raises(SignatureError, match="types="):
        RawKernel(src, "k", options=["-DUSE_INT"])
    k = RawKernel(src, "k", options=["-DUSE_INT"], types=["int", "float*"])
    assert k.spec == [("arg0", "i32"), ("arg1", "ptr")]
    with Stream() as s:
        y = DeviceBuffer(4)
        with pytest.raises(ArgumentError, match="takes an int"):
            k(1, 1, (2.0, y), stream=s)
        k(1, 1, (2, y), stream=s)
        assert _value(fake, k, launches[-1][4], 0) == struct.pack("<i", 2)
