"""DeviceShapedGraph(select="switch") on the GPU (issue 25): the band holding n picked on the device
by a SWITCH node, one body per band, each body its band top's plan as captured."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import exact_run, random_input, rel_err

from rawgraph import DeviceShapedError, DeviceShapedGraph, TinyBlock
from rawgraph.models.tinyblock import reference_forward
from rawgraph.runtime.memory import POISON_BITS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "form,width,max_batch,subset", [("fused", 1024, 256, 40), ("unfused", 64, 64, None), ("block", 64, 64, None)]
)
def test_a_switch_over_plan_bands_gives_the_exact_size_bits_at_every_n(
    device, stream, rng, form, width, max_batch, subset
):
    """Every n, in random order with n = 0 between: the band's body runs the exact-size plan's
    kernels at the band top's rows, so the first n rows equal the exact run to the bit; n = 0
    runs no body (SWITCH value = band count) and writes nothing."""
    if form == "block" and device.info.compute_capability < (9, 0):
        pytest.skip("the block form needs compute capability 9.0")
    with (
        TinyBlock(width, 1, 2, seed=13, form=form) as model,
        DeviceShapedGraph(model, max_batch, stream, bands="plans", select="switch") as dsg,
    ):
        assert dsg.switch is not None and dsg.switch.size == len(dsg.bands) and dsg.entries == []
        xh = random_input(rng, (max_batch, width))
        dsg.input.copy_from_host(xh, stream)
        ns = [int(n) for n in rng.permutation(np.arange(1, max_batch + 1))]
        if subset:  # a random subset plus both ends of every band
            ends = list(dsg.bands) + [t + 1 for t in dsg.bands[:-1]]
            ns = list(dict.fromkeys(ns[:subset] + ends))
            rng.shuffle(ns)
        for k, n in enumerate(ns):
            if k % 7 == 3:
                dsg.output.poison(stream)
                dsg.run(0, stream)
                assert (dsg.output.to_numpy(stream).view(np.uint32) == POISON_BITS).all(), "n = 0 wrote rows"
                assert dsg.check_status(stream) == 0
            dsg.output.poison(stream)
            dsg.run(n, stream)
            got = dsg.output.to_numpy(stream)
            assert dsg.check_status(stream) == n
            want, names = exact_run(model, xh, n, stream)
            assert names == [l.kernel.name for l in dsg.plan_for(n).launches]
            assert np.array_equal(got[:n].view(np.uint32), want.view(np.uint32)), f"n={n}, seed {rng.seed_used}"
            top = min(t for t in dsg.bands if t >= n)
            assert not (got[n:top].view(np.uint32) == POISON_BITS).any(), f"n={n}: the band top's rows not run"
            assert (got[top:].view(np.uint32) == POISON_BITS).all(), f"n={n}: rows past the band top written"


def test_a_switch_over_every_row_count_writes_exactly_n_rows(device, stream, rng):
    """bands = every row count: the body taken is the exact-size plan itself, so rows >= n keep
    their poison and rows < n match the float64 reference."""
    with (
        TinyBlock(64, 1, 2, seed=3, form="fused") as model,
        DeviceShapedGraph(model, 48, stream, bands=range(1, 49), select="switch") as dsg,
    ):
        assert dsg.bands == list(range(1, 49))
        xh = random_input(rng, (48, 64))
        dsg.input.copy_from_host(xh, stream)
        weights = model.weights_numpy(stream)
        for n in (int(k) for k in rng.permutation(np.arange(1, 49))):
            dsg.output.poison(stream)
            got = dsg.run(n, stream).to_numpy(stream)
            whole = dsg.output.to_numpy(stream)
            assert (whole[n:].view(np.uint32) == POISON_BITS).all(), f"n={n}"
            assert rel_err(got, reference_forward(xh[:n], weights)) < 1e-5, f"n={n}, seed {rng.seed_used}"


def test_a_switch_graph_refuses_clone_and_update_before_any_driver_call(device, stream, monkeypatch):
    from cuda.bindings import driver

    calls: list[str] = []
    with (
        TinyBlock(64, 1, 1, form="unfused") as model,
        DeviceShapedGraph(model, 16, stream, bands=[8], select="switch") as dsg,
    ):
        for name in ("cuGraphExecUpdate", "cuGraphClone"):
            real = getattr(driver, name)
            monkeypatch.setattr(driver, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
        with pytest.raises(DeviceShapedError, match="conditional node"):
            dsg.clone()
        with pytest.raises(DeviceShapedError, match="cuGraphExecUpdate"):
            dsg.update(dsg.graph)
        assert calls == []
        dsg.run(5, stream)
        assert dsg.check_status(stream) == 5
    assert dsg.exec.closed and dsg.graph.closed
