"""Smoke test of the warpgroup tf32x3 kernel (``kernels/tf32x3_wgmma.cu``): one product, checked against
float64 NumPy, then timed beside the mma.sync kernel (``kernels/tf32x3.cu``) on the same inputs.

    PYTHONPATH=. python3 benchmarks/probes/wgmma_smoke.py                      # M = 128, K = N = 4096
    PYTHONPATH=. python3 benchmarks/probes/wgmma_smoke.py --m 64 --width 1024
    PYTHONPATH=. python3 benchmarks/probes/wgmma_smoke.py --cut bm=128,bn=128,bk=32,stages=4,split=2,flush=2
    PYTHONPATH=. python3 benchmarks/probes/wgmma_smoke.py --runs2   # also the two-run form (runs=2)

``--runs2`` adds the two-runs-in-flight form (``tf32x3_wgmma_default_cut(..., runs=2)``, or
``--cut2``): its own CHECK lines (float64, deterministic, and bit for bit equal to the one-run
form of the same cut) and TIME line.

Prints one fact per line (benchmarks/probes/README.md's format): ``FACT`` the device, cut,
registers and shared memory; ``CHECK wgmma vs float64: PASS|MISMATCH rel=..`` (relative Frobenius
error against float64, normal inputs, a NaN-poisoned y; PASS below 5e-6, and the mma.sync kernel's
error beside it); ``CHECK deterministic``; ``TIME`` lines: the median over 20 launches after 5
warm-up ones, each launch timed alone with CUDA events (launch gaps included, so slower than the
sweep's graph replays), and TFLOP/s. Exit status 0 when both CHECKs pass, 1 when one fails, 2 with
no usable GPU (compute capability 9.0 is required).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TOL = 5e-6


def _time_us(launch, stream, reps: int = 20, warm: int = 5) -> float:
    from rawgraph import Event

    for _ in range(warm):
        launch(stream)
    stream.synchronize()
    out = []
    with Event() as start, Event() as stop:
        for _ in range(reps):
            start.record(stream)
            launch(stream)
            stop.record(stream)
            stop.synchronize()
            out.append(1000.0 * start.elapsed_ms(stop))
    return float(np.median(out))


def main(argv: list[str] | None = None) -> int:
    from tf32x3_sweep import parse_wgmma_cut

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--width", type=int, default=4096, help="K = N")
    p.add_argument("--cut", type=parse_wgmma_cut, default=None, help="a WgmmaCut (default: the default rule's)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--runs2", action="store_true", help="also the two-run form (runs=2)")
    p.add_argument("--cut2", type=parse_wgmma_cut, default=None, help="the runs=2 cut (default: the rule's)")
    a = p.parse_args(argv)

    from rawgraph import DeviceBuffer, Stream, ops
    from rawgraph.runtime.device import get_device, gpu_available

    if not gpu_available():
        print("NO GPU: no CUDA device here")
        return 2
    dev = get_device()
    if not ops.wgmma_available(dev):
        print(f"NO GPU: wgmma needs compute capability 9.0, this device is {dev.info.compute_capability}")
        return 2
    m, k, n = a.m, a.width, a.width
    seed = a.seed if a.seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
    rng = np.random.default_rng(seed)
    xh = rng.standard_normal((m, k), dtype=np.float32)
    lim = np.float32(np.sqrt(3.0 / k))
    wh = rng.uniform(-lim, lim, size=(k, n)).astype(np.float32)
    ref = xh.astype(np.float64) @ wh.astype(np.float64)
    sms, optin = dev.info.multiprocessors, dev.info.smem_per_block_optin
    cut = a.cut or ops.tf32x3_wgmma_default_cut(m, k, n, sms, True, optin)
    wshape = ops.tf32x3_wgmma_shape(m, k, n, cut)
    mshape = ops.matmul_shape(m, k, n, sms, clusters=True, smem_limit=optin, precision="tf32x3")
    forms = [("wgmma", wshape), ("mma.sync", mshape)]
    if a.runs2:
        from dataclasses import replace

        cut2 = a.cut2 or ops.tf32x3_wgmma_default_cut(m, k, n, sms, True, optin, runs=2)
        forms.insert(1, ("wgmma runs2", ops.tf32x3_wgmma_shape(m, k, n, cut2)))
        forms.insert(2, ("wgmma runs2-as-1", ops.tf32x3_wgmma_shape(m, k, n, replace(cut2, runs=1))))
    print(f"FACT device = {dev.info.name} cc {dev.info.compute_capability} {sms} SMs")
    print(f"FACT shape = M {m} K {k} N {n}; seed {seed}")
    stream = Stream()
    bufs = {"x": DeviceBuffer.from_numpy(xh), "W": DeviceBuffer.from_numpy(wh), "y": DeviceBuffer((m, n))}
    views = {key: b.view() for key, b in bufs.items()}
    ok = True
    try:
        results = {}
        for tag, shape in forms:
            launch = ops.matmul(dev, views, "x", "W", "y", shape=shape, precision="tf32x3")
            kern = launch.kernel
            print(
                f"FACT {tag} kernel = {kern.name}; {kern.registers} registers, {launch.shared_mem} B dynamic shared "
                f"memory, grid {launch.grid}, block {launch.block}, arch {kern.module.compiled.arch}"
            )
            outs = []
            for _ in range(2):
                bufs["y"].poison(stream)
                launch(stream)
                stream.synchronize()
                outs.append(bufs["y"].to_numpy())
            err = float(np.linalg.norm(outs[0] - ref) / np.linalg.norm(ref)) if np.all(np.isfinite(outs[0])) else 1.0
            same = np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
            us = _time_us(launch, stream)
            results[tag] = (err, same, us)
            if tag.startswith("wgmma runs2"):
                results[tag + " bits"] = outs[0].view(np.uint32).copy()
        err, same, us = results["wgmma"]
        merr = results["mma.sync"][0]
        good = err < TOL
        ok = good and same
        print(f"CHECK wgmma vs float64: {'PASS' if good else 'MISMATCH'} rel={err:.3e} (mma.sync rel={merr:.3e})")
        print(f"CHECK deterministic: {'PASS' if same else 'MISMATCH'} (two runs, bit for bit)")
        if a.runs2:
            e2, s2, _ = results["wgmma runs2"]
            b2 = np.array_equal(results.pop("wgmma runs2 bits"), results.pop("wgmma runs2-as-1 bits"))
            print(f"CHECK wgmma runs2 vs float64: {'PASS' if e2 < TOL else 'MISMATCH'} rel={e2:.3e}")
            print(f"CHECK wgmma runs2 deterministic: {'PASS' if s2 else 'MISMATCH'}")
            print(f"CHECK wgmma runs2 bits == runs1 of its cut: {'PASS' if b2 else 'MISMATCH'}")
            ok = ok and e2 < TOL and s2 and b2
        flop = 2.0 * m * k * n
        for tag, (_e, _s, t) in results.items():  # noqa: B007
            print(f"TIME {tag}: median={t:.2f} us {flop / t / 1e6:.1f} TFLOP/s")
        print(f"FACT speedup wgmma vs mma.sync = {results['mma.sync'][2] / us:.2f}x")
    finally:
        for b in bufs.values():
            b.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
