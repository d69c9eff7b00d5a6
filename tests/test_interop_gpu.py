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


TORCH_SCRIPT = """
import numpy as np, torch
from rawgraph import TinyBlock, LayoutError
model = TinyBlock(128, 3, 2, form="fused")
xh = np.random.default_rng().standard_normal((3, 128), dtype=np.float32)
x = torch.from_numpy(xh).cuda()
out = torch.full((3, 128), float("nan"), device="cuda")
torch.cuda.synchronize()
from rawgraph import Stream
s = Stream()
plan = model.plan(x, out)
assert plan.launches[0].args["x"] == x.data_ptr() and plan.launches[-1].args["y"] == out.data_ptr()
plan.run(s); s.synchronize()
ref = model.reference(xh)
err = np.linalg.norm(out.cpu().numpy() - ref) / np.linalg.norm(ref)
assert err < 1e-5, err
try:
    model.plan(torch.from_numpy(xh.T.copy()).cuda().t(), out)
    raise SystemExit("strided tensor accepted")
except LayoutError:
    pass
print("torch-ok")
"""


def test_torch_tensors():
    # In its own interpreter, with torch imported first: on the H200 image, importing torch after
    # CuPy inside this pytest process failed in torch's own custom-op registration.
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    r = subprocess.run([sys.executable, "-c", TORCH_SCRIPT], capture_output=True, text=True, timeout=300)
    if "torch has no CUDA" in r.stdout:
        pytest.skip("torch has no CUDA here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch-ok" in r.stdout
