"""What limits the w4096 sgemm cut against cuBLAS? (issue 23) One launch of each, for ncu.

The GEMM sweep (H100, 2026-12-06, ``gemm_sweep_2026-12-06_026332a_h100.json``) puts the best
sgemm cut at 61-64 % of fp32 peak at M = 128-256, K = N = 4096, and cuBLAS at 69-72 %. This runs
the table's cut at one shape once (after one warm-up launch) and ``torch.mm`` (TF32 off) once,
so that ncu can profile the two side by side:

    ncu --launch-count 12 --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \\
        --section Occupancy --section MemoryWorkloadAnalysis \\
        python3 benchmarks/probes/sgemm_ncu.py --m 256 --k 4096

ncu profiles every kernel launch (no name filter: on 2026-12-06 ``-k regex:gemm`` matched only
cuBLAS's ``Kernel2`` and ``splitKreduce_kernel``, never ours), the warm-up pair included. The
output is checked against float64 and the line ``CHECK`` says so.
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--k", type=int, default=4096)
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
    bufs = {"x": DeviceBuffer.from_numpy(xh, stream=s), "W": DeviceBuffer.from_numpy(wh, stream=s),
            "y": DeviceBuffer((m, k))}
    launch = ops.matmul(dev, {key: b.view() for key, b in bufs.items()}, "x", "W", "y", "none")
    print(f"FACT cut {launch.kernel.name} grid {launch.grid} block {launch.block}")
    xt, wt = torch.from_numpy(xh).cuda(), torch.from_numpy(wh).cuda()
    for _ in range(2):  # warm-up pair, then the profiled pair
        bufs["y"].poison(s)
        launch(s)
        s.synchronize()
        yt = torch.mm(xt, wt)
        torch.cuda.synchronize()
    ref = xh.astype(np.float64) @ wh
    for name, got in (("sgemm", bufs["y"].to_numpy(s)), ("cublas", yt.cpu().numpy())):
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        print(f"CHECK {name} m{m} k{k}: {'PASS' if err < 1e-5 else 'MISMATCH'} max rel err {err:.2e}")
    for b in bufs.values():
        b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
