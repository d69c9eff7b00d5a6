"""What limits the w4096 sgemm cut against cuBLAS? (issue 23) One launch of each, for ncu.

The GEMM sweep (H100, 2026-12-06, ``gemm_sweep_2026-12-06_06a3c11_h100.json``) puts the best
sgemm cut at 62-67 % of fp32 peak at M = 128-256, K = N = 4096, and cuBLAS at 69-72 %. This runs
the table's cut at one shape once (after one warm-up launch) and ``torch.mm`` (TF32 off) once,
so that ncu can profile the two side by side:

    ncu --launch-count 12 --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \\
        --section Occupancy --section MemoryWorkloadAnalysis \\
        python3 benchmarks/probes/sgemm_ncu.py --m 256 --k 4096

ncu profiles every kernel launch (no name filter: on 2026-12-06 ``-k regex:gemm`` matched only
cuBLAS's ``Kernel2`` and ``splitKreduce_kernel``, never ours), the warm-up pair included. The
output is checked against float64 and the line ``CHECK`` says so.

``--cut BM,BN,BK,STAGES,S,KS,MINB[,TM]`` (repeatable) profiles those cuts instead of the table's,
each as a warm-up and a profiled launch, before the cuBLAS pair: ``--launch-count`` is then
2 x cuts + 4 (cuBLAS's two kernels, twice). ``--precision tf32x3`` profiles the cut
``ops.matmul(precision="tf32x3")`` launches at that shape instead (``--cut`` is then ignored).
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import parse_cut


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--cut", action="append", default=[], type=parse_cut, help="BM,BN,BK,STAGES,S,KS,MINB[,TM]")
    p.add_argument("--precision", choices=("fp32", "tf32x3"), default="fp32", help="the matmul precision profiled")
    a = p.parse_args()
    from rawgraph import DeviceBuffer, Stream, get_device, gpu_available, ops

    if not gpu_available():
        print("NO GPU: cuInit failed")
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev, s = get_device(), Stream()
    m, k = a.m, a.k
    rng = np.random.default_rng(20261206)
    xh, wh = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, k), dtype=np.float32)
    bufs = {
        "x": DeviceBuffer.from_numpy(xh, stream=s),
        "W": DeviceBuffer.from_numpy(wh, stream=s),
        "y": DeviceBuffer((m, k)),
    }
    views = {key: b.view() for key, b in bufs.items()}
    shapes = ([ops.sgemm_shape(m, k, k, c) for c in a.cut] if a.precision == "fp32" else []) or [None]
    ref = xh.astype(np.float64) @ wh
    for shape in shapes:  # each cut: a warm-up launch, then the profiled one
        launch = ops.matmul(dev, views, "x", "W", "y", "none", shape=shape, precision=a.precision)
        print(f"FACT cut {launch.kernel.name} grid {launch.grid} block {launch.block}")
        for _ in range(2):
            bufs["y"].poison(s)
            launch(s)
            s.synchronize()
        got = bufs["y"].to_numpy(s)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        print(f"CHECK {launch.kernel.name} m{m} k{k}: {'PASS' if err < 1e-5 else 'MISMATCH'} max rel err {err:.2e}")
    xt, wt = torch.from_numpy(xh).cuda(), torch.from_numpy(wh).cuda()
    for _ in range(2):  # warm-up pair, then the profiled pair
        yt = torch.mm(xt, wt)
        torch.cuda.synchronize()
    err = float(np.abs(yt.cpu().numpy() - ref).max() / np.abs(ref).max())
    print(f"CHECK cublas m{m} k{k}: {'PASS' if err < 1e-5 else 'MISMATCH'} max rel err {err:.2e}")
    for b in bufs.values():
        b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
