"""The exec-update manager's refusals and what it follows, on the GPU: a torch tensor whose memory
moved while the object stayed (``t.set_(...)``, ``t.data = other``) is read at its new address after
``bind(t)``; a refused grid or scalar leaves what the exec computes as it was, also after an
unrelated bind; ``rebind`` of the buffer two captured halves lie in moves neither half.
(The CPU tests, ``tests/test_updates_refusals_cpu.py``, read the exec's parameters on the fake driver.)"""

import numpy as np
import pytest
from helpers import random_input

from rawgraph import ArgumentError, Capture, DeviceArray, DeviceBuffer, ExecUpdateManager, RawKernel, ShapeError

pytestmark = pytest.mark.gpu

AXPB = r"""
extern "C" __global__ void axpb(float a, const float* __restrict__ x, float b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""
F32 = np.dtype(np.float32)


def _grid(n, block=256):
    return (n + block - 1) // block


def _coefficients(rng):
    return float(np.float32(rng.uniform(-2, 2))), float(np.float32(rng.uniform(-1, 1)))


def _expect(got, a, x, b, rng, what):
    np.testing.assert_allclose(
        got, a * x.astype(np.float64) + b, rtol=1e-6, atol=1e-6, err_msg=f"{what} (seed {rng.seed_used})"
    )


@pytest.mark.parametrize("move", ["set_", "data"])
def test_a_torch_tensor_whose_memory_moved_is_read_at_its_new_address(stream, rng, move):
    torch = pytest.importorskip("torch")
    k = RawKernel(AXPB, "axpb")
    n = int(rng.integers(1000, 5000))
    a, b = _coefficients(rng)
    xs = [random_input(rng, (n,)) for _ in range(3)]
    t = torch.from_numpy(xs[0]).cuda()
    y = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    with Capture(stream) as cap:
        k(_grid(n), 256, (a, t, b, y, n), stream=stream)
    exe = cap.graph.instantiate()
    mgr = ExecUpdateManager(cap.graph, exe)
    held = [t.view(-1)]  # every storage t leaves stays alive: a stale address reads old data, not freed memory
    try:
        assert mgr.bind("x", t) == 0  # the captured tensor: checked and remembered, nothing to push
        for i in (1, 2, 1):
            other = torch.from_numpy(xs[i]).cuda()
            held.append(t.view(-1))
            if move == "set_":
                t.set_(other)  # t now shares other's storage, size and strides
            else:
                t.data = other
            assert t.data_ptr() == other.data_ptr() != held[-1].data_ptr()
            torch.cuda.synchronize()
            assert mgr.bind("x", t) == 1, f"t.{move}: the manager pushed nothing for a tensor that moved"
            y.fill_(float("nan"))
            torch.cuda.synchronize()
            mgr.launch(stream)
            stream.synchronize()
            _expect(y.cpu().numpy(), a, xs[i], b, rng, f"after t.{move} to input {i}")
    finally:
        mgr.close()
        exe.close()
        cap.graph.close()


def test_a_refused_grid_or_scalar_leaves_what_the_exec_computes(stream, rng):
    k = RawKernel(AXPB, "axpb")
    n = int(rng.integers(1000, 5000))
    a, b = _coefficients(rng)
    xh, x2h = random_input(rng, (n,)), random_input(rng, (n,))
    x, x2, y = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer.from_numpy(x2h, stream=stream), DeviceBuffer(n)
    with Capture(stream) as cap:
        k(_grid(n), 256, (a, x, b, y, n), stream=stream)
    exe = cap.graph.instantiate()
    mgr = ExecUpdateManager(cap.graph, exe)
    try:
        with pytest.raises(ShapeError):
            mgr.set_params(0, grid=(1, 2**32), n=n // 2)
        with pytest.raises(ArgumentError):
            mgr.scalar_setter(0, "n")(n / 2 + 0.4)
        with pytest.raises(ArgumentError):
            mgr.scalar_setter(0, "a")(True)
        assert mgr.bind("x", x2) == 1  # pushes the node: none of the refused values may ride along
        y.poison(stream)
        mgr.launch(stream)
        _expect(y.to_numpy(stream), a, x2h, b, rng, "after refused calls and a bind")
    finally:
        mgr.close()
        exe.close()
        cap.graph.close()
        for buf in (x, x2, y):
            buf.close()


def test_rebind_of_the_buffer_two_captured_halves_lie_in_moves_neither(stream, rng):
    k = RawKernel(AXPB, "axpb")
    n = int(rng.integers(1000, 5000))
    a, b = _coefficients(rng)
    wh, nh = random_input(rng, (2 * n,)), random_input(rng, (n,))
    whole, new = DeviceBuffer.from_numpy(wh, stream=stream), DeviceBuffer.from_numpy(nh, stream=stream)
    lo, hi = DeviceArray(whole.ptr, (n,), F32, whole), DeviceArray(whole.ptr + 4 * n, (n,), F32, whole)
    y1, y2 = DeviceBuffer(n), DeviceBuffer(n)
    with Capture(stream) as cap:
        k(_grid(n), 256, (a, lo, b, y1, n), stream=stream)
        k(_grid(n), 256, (a, hi, b, y2, n), stream=stream)
    exe = cap.graph.instantiate()
    mgr = ExecUpdateManager(cap.graph, exe)
    try:
        with pytest.raises(KeyError, match="bound to none"):
            mgr.rebind(whole, new)
        assert mgr.rebind(hi, new) == 1
        y1.poison(stream)
        y2.poison(stream)
        mgr.launch(stream)
        _expect(y1.to_numpy(stream), a, wh[:n], b, rng, "the first half, not rebound")
        _expect(y2.to_numpy(stream), a, nh, b, rng, "the second half, rebound by its view")
    finally:
        mgr.close()
        exe.close()
        cap.graph.close()
        for buf in (whole, new, y1, y2):
            buf.close()
