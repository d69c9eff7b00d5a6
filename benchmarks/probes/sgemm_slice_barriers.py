"""Are racecheck's hazards in the K-slice sgemm kernels real? (issue 23)

On an H100 (2026-12-06, ``benchmarks/results/sanitize_racecheck_2026-12-06_1e6f542_h100.txt``)
racecheck reported hazards in the sgemm kernels whose CTA holds KS >= 2 K slices, each slice
synchronizing its pipeline with a counted named barrier (``bar.sync 1 + slice, T``). Each hazard
pairs an access before with one after a full ``__syncthreads()``, and every result was right.

This runs those cuts at shapes where every slice has as many K stages (K = N = 1024), each
checked against float64, once as built and once with ``-DRG_SG_SLICE_SYNCTHREADS`` (the slices
synchronize with ``__syncthreads()``; ``kernels/sgemm.cu``). Run it under racecheck both ways:

    compute-sanitizer --tool racecheck python3 benchmarks/probes/sgemm_slice_barriers.py
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sgemm_slice_barriers.py --syncthreads

Hazards in the first run only: racecheck does not follow counted named barriers. Hazards in
both: the kernel's ordering (the partial-tile reuse of shared memory) is at fault.
"""
from __future__ import annotations

import sys

import numpy as np

# (BM, BN, BK, STAGES, S, KS, MINB): the cuts racecheck flagged (the last four are in SGEMM_CUTS)
CUTS = [(32, 128, 16, 3, 1, 2, 1), (64, 64, 32, 2, 1, 4, 1), (32, 128, 16, 3, 2, 4, 1),
        (32, 128, 16, 3, 4, 2, 1), (32, 128, 16, 4, 8, 2, 1), (64, 64, 16, 3, 2, 4, 1)]


def main(argv: list[str]) -> int:
    import rawgraph.runtime.module as module
    from rawgraph import DeviceBuffer, Stream, get_device, gpu_available, ops
    from rawgraph.ops import sgemm_shape

    if not gpu_available():
        print("NO GPU: cuInit failed")
        return 2
    if "--syncthreads" in argv:
        # every get_kernel(s) call of this process compiles with the define (its own cache key)
        d = list(module.get_kernels.__defaults__ or ())
        d[2] = tuple(d[2]) + ("-DRG_SG_SLICE_SYNCTHREADS",)
        module.get_kernels.__defaults__ = tuple(d)
    dev, s = get_device(), Stream()
    rng = np.random.default_rng(20261206)
    bad = 0
    for cut in CUTS:
        for m in (70, 256):
            k = n = 1024
            xh, wh, rh = (rng.standard_normal(sh, dtype=np.float32) for sh in ((m, k), (k, n), (m, n)))
            bufs = {"x": DeviceBuffer.from_numpy(xh, stream=s), "W": DeviceBuffer.from_numpy(wh, stream=s),
                    "r": DeviceBuffer.from_numpy(rh, stream=s), "y": DeviceBuffer((m, n))}
            bufs["y"].poison(s)
            launch = ops.matmul(dev, {key: b.view() for key, b in bufs.items()}, "x", "W", "y", "add", r="r",
                                shape=sgemm_shape(m, k, n, *cut))
            launch(s)
            ref = xh.astype(np.float64) @ wh + rh
            got = bufs["y"].to_numpy(s)
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            ok = bool(np.isfinite(got).all()) and err < 1e-5
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {launch.kernel.name} m{m} k{k} n{n}: max rel err {err:.2e}", flush=True)
            for b in bufs.values():
                b.close()
    print(f"{'syncthreads' if '--syncthreads' in argv else 'named barriers'}: {len(CUTS) * 2 - bad} ok, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
