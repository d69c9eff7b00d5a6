"""Probe: why torch.mm of (8, 128) x (128, 128) float32 takes ~50 us on the H200 when (1, 128)
and (64, 128) take 2-6 us (README kernel table, launch-path sweep: torch_graph at w128 b8).

    PYTHONPATH=. python3 benchmarks/probes/torch_small_gemm.py

For batches 1-16, 32, 64 at width 128 (and 1024 at b8): the median device time of torch.mm
(CUDA events around 200 back-to-back calls), with TF32 off and on, and with cuBLASLt preferred.
Then, per batch, the kernel(s) torch's graph of one mm holds (rawgraph.graphs.nodes: name, grid, block).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # before _common, which loads rawgraph and the driver

# isort: split
import _common as C


def time_mm(a: torch.Tensor, b: torch.Tensor, reps: int = 200) -> float:
    for _ in range(10):
        torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        torch.mm(a, b)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def kernels_of(a: torch.Tensor, b: torch.Tensor) -> list[str]:
    from rawgraph.graphs.nodes import KernelInfo, read_graph, walk
    from rawgraph.updates.adopt import from_torch

    g = torch.cuda.CUDAGraph(keep_graph=True)
    s = torch.cuda.Stream()
    torch.mm(a, b)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        torch.mm(a, b)
    adopted = from_torch(g)
    out = [
        f"{i.name[:90]} grid={i.grid} block={i.block} smem={i.shared_mem}"
        for i in walk(read_graph(adopted))
        if isinstance(i, KernelInfo)
    ]
    adopted.close()
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("NO GPU: torch sees no CUDA device")
        return C.NO_GPU_EXIT
    C.fact("torch", torch.__version__)
    C.fact("cublas", torch.backends.cuda.preferred_blas_library())
    shapes = [(m, 128) for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32, 64)] + [(8, 1024), (64, 1024)]
    for m, w in shapes:
        a = torch.randn(m, w, device="cuda")
        b = torch.randn(w, w, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        off = time_mm(a, b)
        torch.backends.cuda.matmul.allow_tf32 = True
        on = time_mm(a, b)
        torch.backends.cuda.matmul.allow_tf32 = False
        lt = None
        try:
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = time_mm(a, b)
        except Exception as exc:
            C.note(f"cublaslt at {m}x{w}: {type(exc).__name__}: {exc}")
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")
        C.fact(
            f"mm {m}x{w}x{w} us", f"tf32 off {off:.2f}  tf32 on {on:.2f}  cublaslt {lt if lt is None else round(lt, 2)}"
        )
        if m in (1, 7, 8, 9, 16, 64):
            for line in kernels_of(a, b):
                C.fact(f"kernel {m}x{w}", line)
    # the transposed-weight form (x @ w.T, what nn.Linear does) at the slow size
    a, b = torch.randn(8, 128, device="cuda"), torch.randn(128, 128, device="cuda")
    C.fact("mm 8x128 @ w.t() us", f"{time_mm(a, b.t()):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
