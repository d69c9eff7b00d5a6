"""Adopt PyTorch's CUDA graph and feed it new tensors with no copy (issue 22, item 1).

torch captures the graph (``CUDAGraph(keep_graph=True)``, PyTorch >= 2.8); ``rawgraph.from_torch``
adopts it, rawgraph instantiates its own exec, and ``rebind(old, new)`` moves the captured input
and output to other tensors in the kernel nodes' parameters: no ``static_in.copy_(x)`` per replay.
"""

import sys

import rawgraph as rg


def main() -> int:
    if not rg.gpu_available():
        print(f"torch_graph_rebind.py needs a GPU: {rg.driver_status()[1]}", file=sys.stderr)
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    w1, w2 = (torch.randn(256, 256, device="cuda") / 16 for _ in range(2))
    block = lambda x: torch.relu(x @ w1) @ w2 + x  # noqa: E731
    static_in = torch.randn(8, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch asks
        block(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        static_out = block(static_in)
    reb = rg.from_torch(g).rebinder()  # rawgraph's own exec of torch's graph
    s = rg.Stream.from_external(torch.cuda.current_stream())
    x_old, out_old = static_in, static_out
    for _ in range(3):
        x, out = torch.randn(8, 256, device="cuda"), torch.full((8, 256), float("nan"), device="cuda")
        moved = len(reb.move(x_old, x)) + len(reb.move(out_old, out))  # read x, write out: no copy
        reb.launch(s)
        torch.cuda.synchronize()
        assert torch.allclose(out, block(x), rtol=1e-5, atol=1e-5), float((out - block(x)).abs().max())
        x_old, out_old = x, out
    print(f"torch graph adopted: 3 replays on new tensors with no copy ({moved} node arguments moved each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
