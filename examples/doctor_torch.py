"""Check a PyTorch CUDA graph for what would make its replays silently wrong (issue 24).

torch captures a small block (``CUDAGraph(keep_graph=True)``, PyTorch >= 2.8); ``rawgraph.doctor.check``
reads every node back and asks the driver, and torch's caching allocator, about each address. The
fresh graph is clean. Then the classic bug: a tensor the graph reads is deleted and the allocator
hands its block to a new tensor; the check against the report taken right after capture names the
node that still reads the old address.
"""

import sys

import rawgraph as rg


def main() -> int:
    if not rg.gpu_available():
        print(f"doctor_torch.py needs a GPU: {rg.driver_status()[1]}", file=sys.stderr)
        return 2
    import torch

    from rawgraph.doctor import check

    torch.backends.cuda.matmul.allow_tf32 = False
    w = torch.randn(256, 256, device="cuda") / 16
    x = torch.randn(8, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch asks
        torch.relu(x @ w) + x
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        y = torch.relu(x @ w) + x

    graph = rg.from_torch(g)
    report = check(graph, inputs=[x])  # right after capture: the baseline
    assert report.findings == [], report
    del x  # the graph still reads x's block ...
    z = torch.empty(8, 256, device="cuda")  # ... which the allocator hands to z
    later = check(graph, baseline=report)
    bad = [f for f in later.findings if f.name == "allocator-freed" and f.severity == "error"]
    assert bad, later
    print(
        f"torch graph: clean after capture; after `del x`: {len(bad)} allocator-freed error(s), "
        f"first at node {bad[0].node_index} ({bad[0].kernel})"
    )
    graph.close()
    del y, z
    return 0


if __name__ == "__main__":
    sys.exit(main())
