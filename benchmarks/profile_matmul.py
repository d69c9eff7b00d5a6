"""Occupancy and a profiler target for every cut of one matmul shape.

For each cut the kernel benchmark's sweep would time, print the kernel's registers and static
shared memory (``cuFuncGetAttribute``), how many CTAs fit on one SM
(``cuOccupancyMaxActiveBlocksPerMultiprocessor``) and, for cluster kernels, how many clusters
the whole GPU runs at once (``cuOccupancyMaxActiveClusters``) against how many the grid has:
a grid with more clusters than that runs in waves. Then launch each cut ``--launches`` times, so
``ncu`` (run this script under it) sees every one.

    PYTHONPATH=. python3 benchmarks/profile_matmul.py --width 4096 --batch 64
    ncu --clock-control none -k regex:gemm python3 benchmarks/profile_matmul.py ...
"""

from __future__ import annotations

import argparse

import numpy as np
from cuda.bindings import driver

from rawgraph import ops
from rawgraph.bench.kernel_times import _label, candidate_shapes, max_active_clusters
from rawgraph.runtime.device import get_device
from rawgraph.runtime.errors import call
from rawgraph.runtime.memory import DeviceBuffer
from rawgraph.runtime.stream import Event, Stream


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kernel", default="", help="only cuts whose kernel is this (matvec, gemm)")
    p.add_argument("--launches", type=int, default=1)
    a = p.parse_args()
    dev = get_device()
    stream = Stream()
    rng = np.random.default_rng()
    sms, clusters = dev.info.multiprocessors, ops.has_clusters(dev)
    x = DeviceBuffer.from_numpy(rng.standard_normal((a.batch, a.width), dtype=np.float32))
    w = DeviceBuffer.from_numpy(rng.standard_normal((a.width, a.width), dtype=np.float32))
    y = DeviceBuffer((a.batch, a.width))
    bufs = {"x": x.view(), "W": w.view(), "y": y.view()}
    print(f"{dev.info.name}: {sms} SMs; batch {a.batch}, width {a.width}")
    for shape in candidate_shapes(a.batch, a.width, sms, clusters):
        if a.kernel and shape.kernel != a.kernel:
            continue
        launch = ops.matmul(dev, bufs, "x", "W", "y", "none", shape=shape)
        k = launch.kernel
        per_sm = int(
            call(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor, k.handle, launch.block[0], launch.shared_mem)
        )
        line = (
            f"{_label(shape):18s} {k.registers:3d} regs {k.static_smem:6d}+{launch.shared_mem:5d} B smem  {per_sm} CTA/SM  "
            f"grid {launch.grid} = {shape.ctas} CTAs"
        )
        if shape.split > 1:
            fit = max_active_clusters(launch, shape.split)
            need = shape.ctas // shape.split
            line += f"  clusters: {need} in the grid, {fit} at once ({-(-need // fit)} wave(s))"
        launch(stream)  # warm-up (module load) outside the profiled launches' timing
        stream.synchronize()
        t0, t1 = Event(), Event()
        t0.record(stream)
        for _ in range(a.launches):
            launch(stream)
        t1.record(stream)
        t1.synchronize()
        line += f"  {t0.elapsed_ms(t1) * 1e3 / a.launches:.1f} us/launch (stream order)"
        print(line, flush=True)
    for b in (x, w, y):
        b.close()


if __name__ == "__main__":
    main()
