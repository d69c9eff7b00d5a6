"""The indirect launch path: kernels read x and out through a pointer table the graph refreshes."""

import time

import numpy as np
import pytest
from cuda.bindings import driver
from helpers import random_input

from rawgraph import ClosedError, DeviceBuffer, LayoutError, ShapeError, TinyBlock, ops
from rawgraph.runtime.device import get_device
from rawgraph.runtime.memory import DeviceArray
from rawgraph.updates.indirect import IndirectGraph, make_indirect

pytestmark = pytest.mark.gpu


def _model(form, width=128, batch=1, layers=1):
    if form == "block" and not ops.has_clusters(get_device()):
        pytest.skip("the block form needs thread-block clusters")
    return TinyBlock(width, batch, layers, seed=17, form=form)


def _eager(model, x, stream):
    out = DeviceBuffer((model.batch, model.width))
    out.poison(stream)
    model.forward(x, out, stream)
    return out.to_numpy(stream)


@pytest.mark.parametrize("table", ["device", "mapped"])
@pytest.mark.parametrize(
    "form,width,batch,layers", [("fused", 128, 1, 1), ("fused", 1024, 8, 3), ("block", 128, 1, 1), ("block", 256, 4, 2)]
)
def test_each_replay_reads_the_pair_applied_last_equal_to_eager(
    stream, rng, table, form, width, batch, layers, count_setparams
):
    model = _model(form, width, batch, layers)
    shape = (batch, width)
    xs = [DeviceBuffer.from_numpy(random_input(rng, shape)) for _ in range(3)]
    outs = [DeviceBuffer(shape) for _ in range(3)]
    expected = [_eager(model, x, stream) for x in xs]
    ind = IndirectGraph(model, xs[0], outs[0], stream, table=table)
    # the captured graph: a memcpy node and an event node in front of the kernels ("device"),
    # the kernels and an event node after them ("mapped")
    kinds = {driver.cuGraphNodeGetType(n)[1].name for n in ind.graph.all_nodes()}
    pairs = [ind.prepare(xs[i], outs[i]) for i in range(3)]
    for step, i in enumerate(rng.integers(0, 3, size=200)):
        outs[i].poison(stream)
        ind.apply(pairs[i])
        ind.launch(stream)
        np.testing.assert_array_equal(outs[i].to_numpy(stream), expected[i], err_msg=f"step {step}, pair {i}")
        assert ind.bound == (xs[i], outs[i])
    assert count_setparams == []  # a new pair is two host stores, never a node push
    assert ("CU_GRAPH_NODE_TYPE_MEMCPY" in kinds) == (table == "device") and "CU_GRAPH_NODE_TYPE_EVENT_RECORD" in kinds
    ind.close()
    ind.close()
    with pytest.raises(ClosedError):
        ind.apply(pairs[0])


def test_forms_whose_kernels_cannot_read_slots_are_refused(stream, rng):
    model = TinyBlock(64, 2, 1, form="unfused")
    x, out = DeviceBuffer((2, 64)), DeviceBuffer((2, 64))
    plan = model.plan(x, out)
    before = [l.args._storage.tobytes() for l in plan.launches]
    with pytest.raises(LayoutError, match="pointer slot"):
        make_indirect(plan, {"x": 0x1000, "out": 0x2000})
    after = [l.args._storage.tobytes() for l in plan.launches]
    assert before == after  # refused before any argument changed
    with pytest.raises(LayoutError):
        IndirectGraph(model, x, out, stream)


def test_bad_pairs_are_refused_before_the_table_changes(stream, rng):
    model = _model("fused")
    x, out = DeviceBuffer.from_numpy(random_input(rng, (1, 128))), DeviceBuffer((1, 128))
    ind = IndirectGraph(model, x, out, stream)
    table_before = ind._table.copy()
    big = DeviceBuffer((2, 128))
    with pytest.raises(ShapeError):
        ind.prepare(DeviceBuffer((2, 128)), out)
    with pytest.raises(LayoutError, match="overlaps"):
        ind.prepare(x, x)
    with pytest.raises(LayoutError, match="aligned"):
        ind.prepare(DeviceArray(big.ptr + 4, (1, 128), np.float32, big), out)
    doomed = DeviceBuffer((1, 128))
    pair = ind.prepare(x, doomed)
    doomed.close()
    with pytest.raises(ClosedError, match="closed after it was prepared"):
        ind.apply(pair)
    other = IndirectGraph(model, x, DeviceBuffer((1, 128)), stream)
    with pytest.raises(ValueError, match="another"):
        other.apply(ind.prepare(x, out))
    np.testing.assert_array_equal(ind._table, table_before)
    ind.close()
    other.close()


@pytest.mark.parametrize("table", ["device", "mapped"])
def test_a_queued_replay_reads_its_own_table_behind_a_blocked_stream(stream, rng, table):
    """The host-memory rule: with a 200 ms kernel in front, replay A is queued when the host
    applies pair B; apply waits until A has read the table, so A writes out A and B writes out B."""
    model = _model("fused")
    xs = [DeviceBuffer.from_numpy(random_input(rng, (1, 128))) for _ in range(2)]
    outs = [DeviceBuffer((1, 128)) for _ in range(2)]
    expected = [_eager(model, x, stream) for x in xs]
    ind = IndirectGraph(model, xs[0], outs[0], stream, table=table)
    a, b = ind.prepare(xs[0], outs[0]), ind.prepare(xs[1], outs[1])
    for o in outs:
        o.poison(stream)
    ind.apply(a)
    ops.spin(get_device(), 200_000_000)(stream)
    ind.launch(stream)
    t0 = time.perf_counter()
    ind.apply(b)  # must not touch the table before replay A has read it
    waited = time.perf_counter() - t0
    ind.launch(stream)
    np.testing.assert_array_equal(outs[0].to_numpy(stream), expected[0])
    np.testing.assert_array_equal(outs[1].to_numpy(stream), expected[1])
    assert waited > 0.05  # it did wait for the spin (200 ms queued in front of replay A)
    ind.close()
