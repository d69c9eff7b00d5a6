"""Host cost of single driver calls, fitted as fixed + per-node over graph sizes.

Each figure is host wall time per call with many calls issued back to back and one synchronize
at the end (device time is not on this clock as long as the queue does not fill).
"""

from __future__ import annotations

import time

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..capture import Capture
from ..device import get_device
from ..errors import check
from ..launch import LaunchPlan
from ..stream import Stream
from ..timing import stats

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _per_call(fn, stream: Stream, n: int = 500, repeats: int = 7) -> dict:
    fn()
    stream.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / n)
        stream.synchronize()
    return stats(samples)


def _empty_graph(nodes: int, stream: Stream):
    dev = get_device()
    launches = [ops.empty(dev) for _ in range(nodes)]
    with Capture(stream) as cap:
        for l in launches:
            cap.launch(l)
    cap.graph.plan = LaunchPlan(launches, {}, (), ())
    return cap.graph


def _bind_costs(stream: Stream) -> dict:
    """``ExecUpdateManager.bind`` per call on a 1-node graph: alternating between two checked
    inputs (one SetParams each) and re-binding the bound one (no driver call)."""
    from ..manager import ExecUpdateManager
    from ..memory import DeviceBuffer

    dev = get_device()
    bufs = {n: DeviceBuffer(256) for n in ("x", "x2", "y")}
    views = {n: b.view() for n, b in bufs.items()}
    plan = LaunchPlan([ops.relu(dev, views, "x", "y")], views, ("x",), ("y",))
    with Capture(stream) as cap:
        cap.run(plan)
    cap.graph.plan = plan
    mgr = ExecUpdateManager(cap.graph, cap.graph.instantiate(), names=("x",))
    pair, state = (bufs["x"], bufs["x2"]), [0]

    def alternate():
        state[0] ^= 1
        mgr.bind("x", pair[state[0]])

    out = {"manager_bind_1_node": _per_call(alternate, stream, n=2000),
           "manager_bind_same": _per_call(lambda: mgr.bind("x", pair[state[0]]), stream, n=2000)}
    mgr.close()
    mgr.exec.close()
    cap.graph.close()
    return out


def measure(sizes=SIZES) -> dict:
    """Returns ``{"cuLaunchKernel": stats, "cuGraphLaunch": {"points": [...], "fit": {...}}, ...}``."""
    dev = get_device()
    out: dict = {}
    with Stream() as stream:
        empty = ops.empty(dev)
        out["cuLaunchKernel"] = _per_call(lambda: empty(stream), stream)
        if ops.has_clusters(dev):
            chained = ops.empty(dev)
            chained.pdl = True
            out["cuLaunchKernelEx_pdl"] = _per_call(lambda: chained(stream), stream)
            # The same config with no attributes: is the gap the binding's argument conversion
            # (11 arguments against 4) or what the driver does for a PDL launch?
            plain = ops.empty(dev)
            plain_cfg = plain.config()  # built as for PDL, then without its one attribute
            plain_cfg.numAttrs = 0

            def ex_plain():
                plain_cfg.hStream = stream.handle
                check(driver.cuLaunchKernelEx(plain_cfg, plain.kernel.handle, plain.args.address, 0), "cuLaunchKernelEx")

            out["cuLaunchKernelEx_plain"] = _per_call(ex_plain, stream)
        out.update(_bind_costs(stream))
        rows = {"cuGraphLaunch": [], "cuGraphExecKernelNodeSetParams": [], "cuGraphExecUpdate": []}
        for n in sizes:
            g = _empty_graph(n, stream)
            g2 = _empty_graph(n, stream)
            exe = g.instantiate()
            rows["cuGraphLaunch"].append((n, _per_call(lambda: exe.launch(stream), stream, n=200)))
            node = g.nodes[0]
            p = driver.CUDA_KERNEL_NODE_PARAMS()
            p.func, p.gridDimX, p.gridDimY, p.gridDimZ = node.launch.kernel.handle, 1, 1, 1
            p.blockDimX, p.blockDimY, p.blockDimZ, p.kernelParams = 1, 1, 1, node.launch.args.address

            def setp():
                check(driver.cuGraphExecKernelNodeSetParams(exe.handle, node.handle, p), "cuGraphExecKernelNodeSetParams")

            rows["cuGraphExecKernelNodeSetParams"].append((n, _per_call(setp, stream, n=500)))
            rows["cuGraphExecUpdate"].append((n, _per_call(lambda: exe.update(g2), stream, n=50)))
            exe.close()
            g.close()
            g2.close()
        for name, pts in rows.items():
            ns = np.array([n for n, _ in pts], dtype=float)
            med = np.array([s["median"] for _, s in pts])
            per_node, fixed = np.polyfit(ns, med, 1)
            out[name] = {
                "points": [{"nodes": n, **s} for n, s in pts],
                "fit": {"fixed_us": float(fixed), "per_node_us": float(per_node)},
            }
    return out
