"""CuPy arrays and PyTorch tensors as inputs and outputs, with no copy."""

import numpy as np
import pytest

from helpers import random_input, rel_err
from rawgraph import DTypeError, LayoutError, TinyBlock, as_device_array

pytestmark = pytest.mark.gpu


def _check_no_copy(model, x, out, x_ptr, out_ptr):
    plan = model.plan(x, out)
    assert plan.buffers["x"].ptr == x_ptr and plan.buffers["out"].ptr == out_ptr
    first = plan.launches[0]
    assert first.args["x"] == x_ptr
    assert plan.launches[-1].args["y"] == out_ptr
    return plan


def test_cupy_arrays(stream, rng):
    cp = pytest.importorskip("cupy")
    model = TinyBlock(128, 3, 2)
    xh = random_input(rng, (3, 128))
    x = cp.asarray(xh)
    out = cp.full((3, 128), cp.nan, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    plan = _check_no_copy(model, x, out, x.data.ptr, out.data.ptr)
    plan.run(stream)
    stream.synchronize()
    assert rel_err(cp.asnumpy(out), model.reference(xh)) < 1e-5
    with pytest.raises(LayoutError):
        model.plan(cp.asarray(random_input(rng, (128, 3))).T, out)
    with pytest.raises(DTypeError):
        model.plan(x.astype(cp.float64), out)
    assert as_device_array(x).owner is x


def test_torch_tensors(stream, rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    model = TinyBlock(128, 3, 2, form="fused")
    xh = random_input(rng, (3, 128))
    x = torch.from_numpy(xh).cuda()
    out = torch.full((3, 128), float("nan"), device="cuda")
    torch.cuda.synchronize()
    plan = _check_no_copy(model, x, out, x.data_ptr(), out.data_ptr())
    plan.run(stream)
    stream.synchronize()
    assert rel_err(out.cpu().numpy(), model.reference(xh)) < 1e-5
    with pytest.raises(LayoutError):
        model.plan(torch.from_numpy(random_input(rng, (128, 3))).cuda().t(), out)
