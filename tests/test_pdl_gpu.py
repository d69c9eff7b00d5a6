"""Programmatic dependent launch: captured as programmatic edges, same bits as plain stream order."""

import numpy as np
import pytest
from helpers import random_input, rel_err

from rawgraph import DeviceBuffer, ExecUpdateManager, LaunchPlan, TinyBlock, capture_plan, ops

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_sm90(device):
    if not ops.has_clusters(device):
        pytest.skip("programmatic dependent launch needs compute capability 9.0")


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("form", ["unfused", "fused", "block"])
def test_plan_edges_are_programmatic_exactly_with_pdl(stream, form, pdl):
    model = TinyBlock(128, 2, 3, form=form, pdl=pdl)
    x, out = DeviceBuffer((2, 128)), DeviceBuffer((2, 128))
    x.poison(stream)
    plan = model.plan(x, out)
    assert [l.pdl for l in plan.launches] == [False] + [pdl] * (len(plan) - 1)
    graph = capture_plan(plan, stream)
    kinds = [k for _, _, k in graph.edge_types()]
    assert kinds == ["programmatic" if pdl else "default"] * (len(plan) - 1)
    graph.verify_node_map()


@pytest.mark.parametrize(
    "form,width,batch,layers",
    [
        ("unfused", 128, 1, 64),
        ("fused", 128, 1, 64),
        ("block", 128, 1, 64),
        ("fused", 1024, 8, 8),
        ("unfused", 4096, 1, 2),
        ("fused", 256, 64, 8),
        ("block", 256, 17, 8),
    ],
)
def test_pdl_chains_give_the_bits_of_plain_stream_order(stream, rng, form, width, batch, layers):
    seed = int(rng.integers(1 << 30))
    plain = TinyBlock(width, batch, layers, seed=seed, form=form, pdl=False)
    chained = TinyBlock(width, batch, layers, seed=seed, form=form, pdl=True)
    xh = random_input(rng, (batch, width))
    x = DeviceBuffer.from_numpy(xh)
    outs = [DeviceBuffer((batch, width)) for _ in range(3)]
    for o in outs:
        o.poison(stream)
    plain.forward(x, outs[0], stream)
    chained.forward(x, outs[1], stream)
    exe = capture_plan(chained.plan(x, outs[2]), stream).instantiate()
    exe.launch(stream)
    stream.synchronize()
    ref = outs[0].to_numpy()
    assert rel_err(ref, plain.reference(xh)) < 1e-5
    np.testing.assert_array_equal(outs[1].to_numpy(), ref)
    np.testing.assert_array_equal(outs[2].to_numpy(), ref)


def test_pdl_replays_with_rebinding_stay_exact(stream, rng):
    # 64 layers of 2 PDL nodes, a new input bound before every replay, checked every replay.
    model = TinyBlock(128, 1, 64, seed=int(rng.integers(1 << 30)), form="fused", pdl=True)
    plain = TinyBlock(128, 1, 64, seed=model.seed, form="fused", pdl=False)
    xs = [DeviceBuffer.from_numpy(random_input(rng, (1, 128))) for _ in range(4)]
    expected = []
    for x in xs:
        o = DeviceBuffer((1, 128))
        plain.forward(x, o, stream)
        expected.append(o.to_numpy())
    out = DeviceBuffer((1, 128))
    graph = capture_plan(model.plan(xs[0], out), stream)
    mgr = ExecUpdateManager(graph, graph.instantiate())
    for step, i in enumerate(rng.integers(0, 4, size=200)):
        mgr.bind("x", xs[i])
        out.poison(stream)
        mgr.launch(stream)
        assert np.array_equal(out.to_numpy(), expected[i]), f"replay {step} with input {i}"


@pytest.mark.parametrize("replay", [False, True])
def test_first_launch_waits_for_weights_written_just_before(stream, rng, replay):
    # The first launch of a plan is never a PDL launch: stream work before it (here: new weights)
    # is complete before it reads anything, weights included.
    model = TinyBlock(256, 2, 2, seed=1, form="fused", pdl=True)
    xh = random_input(rng, (2, 256))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((2, 256))
    plan = model.plan(x, out)
    exe = capture_plan(plan, stream).instantiate()
    before = model.reference(xh)
    w1 = model.weights[0][0]
    ops.fill_uniform(model.device, w1.view(), 99, float(np.sqrt(3.0 / 256)))(stream)  # no sync after
    out.poison(stream)
    (exe.launch if replay else plan.run)(stream)
    stream.synchronize()
    after = model.reference(xh)
    assert rel_err(after, before) > 1e-2  # the weights did change
    assert rel_err(out.to_numpy(), after) < 1e-5


def test_a_pdl_plan_refuses_a_repeated_launch(device):
    bufs = {k: DeviceBuffer((4,)).view() for k in ("a", "b")}
    relu = ops.relu(device, bufs, "a", "b")
    LaunchPlan([relu, relu], bufs)  # plain order: a launch may repeat
    with pytest.raises(ValueError, match="appears twice"):
        LaunchPlan([relu, relu], bufs, pdl=True)
