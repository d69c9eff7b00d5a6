"""Adopting PyTorch graphs (rawgraph.updates.adopt): torch's CUDAGraph(keep_graph=True) read back,
instantiated as rawgraph's own exec, its static input and output moved by address to new tensors
(no copy): equal to torch's own copy_ + replay to the bit, over 1,000 random rebinds."""

import warnings

import numpy as np
import pytest
from helpers import rel_err, torch_with_graphs

from rawgraph import Stream
from rawgraph.graphs.nodes import KernelInfo
from rawgraph.runtime.errors import RawgraphError
from rawgraph.updates.addresses import InteriorPointerWarning

pytestmark = pytest.mark.gpu
REBINDS = 1000


def _torch():
    torch = torch_with_graphs()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _capture(torch, fn, static_in):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up, as torch asks before capture (cuBLAS handles, workspaces)
            fn(static_in)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        static_out = fn(static_in)
    g.instantiate()  # torch's own exec, for the copy_ + replay reference
    return g, static_out


def _random_rebinds(torch, rng, fn, shape_in, slack=1):
    """Adopt, then REBINDS times: fresh input into a random pool tensor, rebind input and output,
    launch rawgraph's exec, and compare with torch's copy_ + replay of its own exec."""
    from rawgraph.updates.adopt import from_torch

    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 62)))
    static_in = torch.randn(shape_in, device="cuda", generator=gen)
    g, static_out = _capture(torch, fn, static_in)
    adopted = from_torch(g)
    kernels = [i for i in adopted.read_nodes() if isinstance(i, KernelInfo)]
    assert kernels and all(k.name for k in kernels)
    reb = adopted.rebinder()
    s = Stream.from_external(torch.cuda.current_stream())
    xs = [torch.empty_like(static_in) for _ in range(3)]
    # Outputs as the front of larger buffers: torch's pool may give the output the address of an
    # intermediate it freed earlier in the capture, and that tensor moves with it (its extent is
    # not visible in the parameters).
    outs = [
        torch.empty(static_out.numel() * slack, device="cuda")[: static_out.numel()].view(static_out.shape)
        for _ in range(3)
    ]
    assert reb.find(static_in), "the static input is not in any kernel parameter"
    assert reb.find(static_out), "the static output is not in any kernel parameter"
    cur_x, cur_o = static_in, static_out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InteriorPointerWarning)  # counted below instead
        for it in range(REBINDS):
            i, j = int(rng.integers(3)), int(rng.integers(3))
            xs[i].copy_(torch.randn(shape_in, device="cuda", generator=gen))
            outs[j].fill_(float("nan"))
            if xs[i] is not cur_x:
                reb.move(cur_x, xs[i])
                cur_x = xs[i]
            if outs[j] is not cur_o:
                reb.move(cur_o, outs[j])
                cur_o = outs[j]
            reb.launch(s)
            static_in.copy_(xs[i])
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(outs[j], static_out), (
                f"rebind {it}: max |diff| {float((outs[j] - static_out).abs().max()):.3g}, seed {rng.seed_used}"
            )
    # and against eager torch in float64 terms
    ref = fn(xs[i]).double()
    assert rel_err(outs[j].double().cpu().numpy(), ref.cpu().numpy()) < 1e-5
    # the input moved, so the static input is no longer held anywhere in our exec
    assert not reb.find(static_in, warn=False) or static_in.data_ptr() == xs[i].data_ptr()
    reb.exec.close()
    adopted.close()
    return g, kernels


def test_torch_block_rebinds_equal_torch_replay(rng):
    torch = _torch()
    width, batch = 128, 4
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 62)))
    w1 = torch.randn(width, width, device="cuda", generator=gen) / width**0.5
    w2 = torch.randn(width, width, device="cuda", generator=gen) / width**0.5

    def block(x):
        return torch.relu(x @ w1) @ w2 + x

    g, kernels = _random_rebinds(torch, rng, block, (batch, width))
    # the H200 probe: cuFuncGetParamInfo decodes every kernel of this graph
    assert all(k.layout is not None and k.params is not None for k in kernels), [k.layout_error for k in kernels]
    assert len(kernels) >= 4  # two cuBLAS matmuls, relu, add (the H200 probe saw exactly 4)


def test_torch_mlp_rebinds_equal_torch_replay(rng):
    torch = _torch()
    torch.manual_seed(int(rng.integers(1 << 62)))
    mlp = (
        torch.nn.Sequential(
            torch.nn.Linear(128, 256),
            torch.nn.GELU(),
            torch.nn.LayerNorm(256),
            torch.nn.Linear(256, 128),
            torch.nn.Tanh(),
        )
        .cuda()
        .eval()
    )

    def fn(x):
        with torch.no_grad():
            return mlp(x)

    g, kernels = _random_rebinds(torch, rng, fn, (8, 128), slack=2)
    unread = [(k.name, k.layout_error) for k in kernels if k.params is None]
    assert not unread, unread  # an unread node could hold x or out: the equality above would catch it too
    names = " ".join(k.name for k in kernels)
    assert "layer_norm" in names.lower() or "LayerNorm" in names, names
    assert len(kernels) >= 5


def test_refusals_without_keep_graph_and_not_a_graph():
    torch = _torch()
    from rawgraph.updates.adopt import from_cupy, from_torch

    x = torch.ones(16, device="cuda")
    g = torch.cuda.CUDAGraph()  # keep_graph=False: torch drops the cudaGraph_t after instantiating
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x * 2
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        y = x * 2
    g.replay()
    with pytest.raises(RawgraphError, match="keep_graph"):
        from_torch(g)
    with pytest.raises(RawgraphError, match="CUDAGraph"):
        from_torch(object())
    with pytest.raises(RawgraphError, match="cupy"):
        from_cupy(object())
    del y, g


def test_adopted_graph_is_not_destroyed_by_rawgraph(rng):
    torch = _torch()
    from rawgraph.updates.adopt import from_torch

    x = torch.randn(64, device="cuda")
    g, out = _capture(torch, lambda t: t * 3 + 1, x)
    a = from_torch(g)
    n = a.node_count()
    assert a.owner is g
    a.close()
    a.close()  # twice is fine
    assert a.owner is None
    # torch's graph is intact: it replays, and a second adoption reads the same nodes
    x.copy_(torch.randn(64, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 3 + 1)
    b = from_torch(g)
    assert b.node_count() == n
    b.close()
    np.testing.assert_array_equal(out.cpu().numpy(), (x * 3 + 1).cpu().numpy())
