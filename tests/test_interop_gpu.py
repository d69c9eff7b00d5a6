"""CuPy, PyTorch, JAX and cuda.core: their arrays and streams in rawgraph and rawgraph's in theirs,
no copy, ordering checked by values. Everything runs in this pytest process except JAX (which
would otherwise take most of the GPU's memory for its allocator)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import bench_script, random_input, rel_err, spin_ns

from rawgraph import (
    CaptureRefusedError,
    DTypeError,
    LayoutError,
    NotOnDeviceError,
    Stream,
    TinyBlock,
    as_device_array,
    capture_plan,
    get_device,
    ops,
)

pytestmark = pytest.mark.gpu
SPIN_NS = spin_ns(30_000_000)  # 30 ms of device time queued first: a missing wait would show in the values


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


class DLPackOnly:
    """Hides every protocol but DLPack, so as_device_array must take the DLPack path."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kw):
        return self.array.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def _check_plan_reads_in_place(model, x, out, x_ptr, out_ptr):
    plan = model.plan(x, out)
    assert plan.buffers["x"].ptr == x_ptr and plan.buffers["out"].ptr == out_ptr
    assert plan.launches[0].args["x"] == x_ptr and plan.launches[-1].args["y"] == out_ptr
    return plan


# -- arrays --------------------------------------------------------------------------------------
def test_cupy_arrays_in_place(stream, rng):
    cp = pytest.importorskip("cupy")
    model = TinyBlock(128, 3, 2)
    xh = random_input(rng, (3, 128))
    x = cp.asarray(xh)
    out = cp.full((3, 128), cp.nan, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    plan = _check_plan_reads_in_place(model, x, out, x.data.ptr, out.data.ptr)
    plan.run(stream)
    stream.synchronize()
    assert rel_err(cp.asnumpy(out), model.reference(xh)) < 1e-5, f"seed {rng.seed_used}"
    with pytest.raises(LayoutError):
        model.plan(cp.asarray(random_input(rng, (128, 3))).T, out)
    with pytest.raises(DTypeError):
        model.plan(x.astype(cp.float64), out)
    assert as_device_array(x).owner is x


def test_torch_tensors_in_place(stream, rng):
    torch = _torch()
    model = TinyBlock(128, 3, 2, form="fused")
    xh = random_input(rng, (3, 128))
    x = torch.from_numpy(xh).cuda()
    out = torch.full((3, 128), float("nan"), device="cuda")
    torch.cuda.synchronize()
    plan = _check_plan_reads_in_place(model, x, out, x.data_ptr(), out.data_ptr())
    plan.run(stream)
    stream.synchronize()
    assert rel_err(out.cpu().numpy(), model.reference(xh)) < 1e-5, f"seed {rng.seed_used}"
    with pytest.raises(LayoutError):
        model.plan(torch.from_numpy(xh.T.copy()).cuda().t(), out)


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_dlpack_producers_without_a_copy(stream, rng, lib):
    xh = random_input(rng, (2, 64))
    if lib == "cupy":
        cp = pytest.importorskip("cupy")
        x, out = cp.asarray(xh), cp.full((2, 64), cp.nan, dtype=cp.float32)
        x_ptr, out_ptr, host = x.data.ptr, out.data.ptr, lambda a: cp.asnumpy(a)
        cp.cuda.Device().synchronize()
        host_tensor = DLPackOnly(np.ones((2, 64), np.float32))
    else:
        torch = _torch()
        x, out = torch.from_numpy(xh).cuda(), torch.full((2, 64), float("nan"), device="cuda")
        x_ptr, out_ptr, host = x.data_ptr(), out.data_ptr(), lambda a: a.cpu().numpy()
        torch.cuda.synchronize()
        host_tensor = DLPackOnly(torch.ones((2, 64)))
    model = TinyBlock(64, 2, 1, form="fused")
    view = as_device_array(DLPackOnly(x))
    assert (view.ptr, view.shape, view.dtype) == (x_ptr, (2, 64), np.float32)
    plan = _check_plan_reads_in_place(model, DLPackOnly(x), DLPackOnly(out), x_ptr, out_ptr)
    plan.run(stream)
    stream.synchronize()
    assert rel_err(host(out), model.reference(xh)) < 1e-5, f"seed {rng.seed_used}"
    with pytest.raises(NotOnDeviceError, match="device type 1"):
        as_device_array(host_tensor)
    strided = x.T if lib == "cupy" else x.t()
    with pytest.raises(LayoutError, match="strided"):
        model.plan(DLPackOnly(strided), out)


JAX_SCRIPT = """
import os, sys
import numpy as np
import jax, jax.numpy as jnp
from rawgraph import DeviceBuffer, Stream, TinyBlock, as_device_array, NotOnDeviceError

class DLPackOnly:
    def __init__(self, a): self.a = a
    def __dlpack__(self, **kw): return self.a.__dlpack__(**kw)
    def __dlpack_device__(self): return self.a.__dlpack_device__()

gpu = [d for d in jax.devices() if d.platform == "gpu"]
if not gpu:
    print("jax-no-gpu"); sys.exit(0)
xh = np.random.default_rng(int(sys.argv[1])).standard_normal((2, 64), dtype=np.float32)
x = jax.device_put(jnp.asarray(xh), gpu[0])
x.block_until_ready()
view = as_device_array(DLPackOnly(x))
assert view.ptr == x.unsafe_buffer_pointer(), (hex(view.ptr), hex(x.unsafe_buffer_pointer()))
model = TinyBlock(64, 2, 1, form="fused")
out = DeviceBuffer((2, 64))
s = Stream()
out.poison(s)
model.plan(DLPackOnly(x), out).run(s)
ref = model.reference(xh, s)
got = out.to_numpy(s)
err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
assert err < 1e-5, err
try:
    as_device_array(DLPackOnly(jax.device_put(jnp.ones(3), jax.devices("cpu")[0])))
    raise SystemExit("host jax array accepted")
except NotOnDeviceError:
    pass
print("jax-ok")
"""


def test_jax_arrays_through_dlpack(rng):
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=os.pathsep.join(sys.path))
    seed = int(rng.integers(1 << 31))
    r = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT, str(seed)], capture_output=True, text=True, timeout=300, env=env
    )
    if "jax-no-gpu" in r.stdout:
        pytest.skip("jax sees no GPU here")
    assert r.returncode == 0 and "jax-ok" in r.stdout, f"seed {seed}\n{r.stdout}\n{r.stderr[-3000:]}"


# -- streams -------------------------------------------------------------------------------------
def _ordered_replay(exe, run_on, write_x, read_out):
    """Queue: spin, framework writes x, rawgraph replays, framework reads out -- all on one stream."""
    ops.spin(get_device(), SPIN_NS)(run_on)
    write_x()
    exe.launch(run_on)
    return read_out()


def test_capture_on_a_torch_stream_and_replay_on_torchs_current_stream(rng):
    torch = _torch()
    model = TinyBlock(128, 2, 2, form="fused")
    xh0, xh1 = random_input(rng, (2, 128)), random_input(rng, (2, 128))
    x = torch.from_numpy(xh0).cuda()
    out = torch.full((2, 128), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    graph = capture_plan(model.plan(x, out), side)  # borrowed from torch for the capture
    exe = graph.instantiate()
    cur = torch.cuda.current_stream()
    src = torch.from_numpy(xh1).cuda()
    torch.cuda.synchronize()
    # torch writes x after 30 ms of queued device work, rawgraph replays, torch reads the result:
    # right values only if every step waited for the one before on torch's own stream.
    result = _ordered_replay(exe, cur, lambda: x.copy_(src), lambda: out * 2 + 1)
    expected = 2 * model.reference(xh1) + 1
    assert rel_err(result.cpu().numpy(), expected) < 1e-5, f"seed {rng.seed_used}"
    # The same with a rawgraph replay on a non-default torch stream.
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        out.fill_(float("nan"))
        result = _ordered_replay(exe, other, lambda: x.copy_(src * 3), lambda: out.clone())
    other.synchronize()
    assert rel_err(result.cpu().numpy(), model.reference(3 * xh1)) < 1e-5, f"seed {rng.seed_used}"


def test_capture_on_a_cupy_stream_and_replay_on_cupys_current_stream(rng):
    cp = pytest.importorskip("cupy")
    model = TinyBlock(128, 2, 2, form="fused")
    xh0, xh1 = random_input(rng, (2, 128)), random_input(rng, (2, 128))
    x = cp.asarray(xh0)
    out = cp.full((2, 128), cp.nan, dtype=cp.float32)
    side = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    graph = capture_plan(model.plan(x, out), side)
    exe = graph.instantiate()
    cur = cp.cuda.get_current_stream()
    src = cp.asarray(xh1)
    cp.cuda.Device().synchronize()
    result = _ordered_replay(exe, cur, lambda: x.__setitem__(Ellipsis, src), lambda: out * 2 + 1)
    assert rel_err(cp.asnumpy(result), 2 * model.reference(xh1) + 1) < 1e-5, f"seed {rng.seed_used}"


def test_rawgraph_streams_in_cupy_and_cuda_core(rng):
    cp = pytest.importorskip("cupy")
    model = TinyBlock(64, 2, 1, form="fused")
    xh = random_input(rng, (2, 64))
    x, out = cp.asarray(xh), cp.full((2, 64), cp.nan, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    s = Stream()
    assert s.__cuda_stream__() == (0, s.ptr)
    exe = capture_plan(model.plan(x, out), s).instantiate()
    theirs = cp.cuda.Stream.from_external(s)
    assert theirs.ptr == s.ptr
    with theirs:
        ops.spin(get_device(), SPIN_NS)(s)
        x[...] = x * 2  # CuPy work on rawgraph's stream, ordered before the replay
        exe.launch(s)
        doubled = out + 0  # and after it
    theirs.synchronize()
    assert rel_err(cp.asnumpy(doubled), model.reference(2 * xh)) < 1e-5, f"seed {rng.seed_used}"
    try:
        from cuda.core import Device as CoreDevice
    except ImportError:
        try:
            from cuda.core.experimental import Device as CoreDevice
        except ImportError:
            pytest.skip("cuda.core is not installed")
    core_dev = CoreDevice(0)
    core_dev.set_current()
    core_stream = core_dev.create_stream(s)
    assert int(core_stream.handle) == s.ptr
    back = Stream.from_external(core_stream)  # and cuda.core's stream back in rawgraph
    assert back.ptr == s.ptr and not back.owned


CUPY_SPIN = r"""
extern "C" __global__ void cupy_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def test_borrowed_default_streams_launch_but_never_capture(rng):
    cp = pytest.importorskip("cupy")
    null = cp.cuda.Stream.null
    model = TinyBlock(64, 1, 1)
    x = cp.asarray(random_input(rng, (1, 64)))
    out = cp.full((1, 64), cp.nan, dtype=cp.float32)
    plan = model.plan(x, out)
    with pytest.raises(CaptureRefusedError, match="legacy"):
        capture_plan(plan, null)
    borrowed = Stream.from_external(null)
    assert borrowed.is_legacy and not borrowed.owned
    own = Stream()
    mine = cp.full((1, 64), cp.nan, dtype=cp.float32)
    # CuPy's own spin (not rawgraph's launch path): it holds the legacy stream for 30 ms.
    cupy_spin = cp.RawKernel(CUPY_SPIN, "cupy_spin")
    for k, on in enumerate((borrowed, null)):  # rawgraph's borrowed stream, then CuPy's own object
        xh = random_input(rng, (1, 64))
        src = cp.asarray(xh)
        with null:
            out.fill(cp.nan)
            null.synchronize()
            # 30 ms of device work on the borrowed stream, then CuPy spins and writes x on the legacy
            # stream, the plan runs on the borrowed stream, CuPy reads out: right only if all of it
            # is one stream in that order (a plan on any other stream reads the old x).
            ops.spin(get_device(), SPIN_NS)(on)
            cupy_spin((1,), (1,), (cp.uint64(SPIN_NS),))
            x[...] = src
            plan.run(on)  # eager work on a default stream is fine (only capture is refused)
            got = cp.asnumpy(out)
        assert rel_err(got, model.reference(xh)) < 1e-5, f"launch {k} on {on!r}, seed {rng.seed_used}"
        # the same kernels on a rawgraph stream of its own: the same bits
        mine.fill(cp.nan)
        null.synchronize()
        model.plan(x, mine).run(own)
        own.synchronize()
        np.testing.assert_array_equal(got.view(np.uint32), cp.asnumpy(mine).view(np.uint32))
    borrowed.close()  # releases nothing: CuPy's stream still works
    null.synchronize()
    out.fill(cp.nan)
    plan.run(null)
    null.synchronize()
    assert np.isfinite(cp.asnumpy(out)).all()
    own.close()


def test_streams_of_another_kind_are_refused(stream):
    from rawgraph import Event

    with pytest.raises(TypeError, match="not a stream"):
        Stream.from_external("stream 7")
    with pytest.raises(TypeError, match="not a stream"):
        Event().record(3.5)
    with pytest.raises(TypeError, match="not a stream"):
        Event().record(True)


# -- the soak's checks, run here in small -----------------------------------------------------------


def test_the_mismatch_counter_the_soak_relies_on_counts_exactly(stream, rng):
    sanitize = bench_script("sanitize_kernels")
    checks = sanitize.Checker()
    for n in (1001, 4096 + 7):
        sanitize.check_count_mismatch(checks, get_device(), stream, rng, n=n)
    assert checks.failures == [], f"{checks.failures}, seed {rng.seed_used}"


def test_soak_replays_are_checked_against_float64(rng):
    pytest.importorskip("cupy")
    soak = bench_script("soak")
    seed = int(rng.integers(1 << 31))
    r = soak.replays(3000, seed)
    assert r["checker"]["counted"] == r["checker"]["expected"] > 0, r["checker"]
    assert r["eager_vs_float64"] < soak.FLOAT64_TOL and r["replays_vs_float64"] < soak.FLOAT64_TOL, r
    assert r["mismatched_elements"] == 0 and soak.replays_ok(r), r
