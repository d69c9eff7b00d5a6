"""The Python cost of the per-replay update paths, with the driver calls taken out: on the CPU fake
driver, after setup, ``cuGraphExecKernelNodeSetParams`` and ``cuGraphLaunch`` are replaced by
functions that return success, so what is timed is the library's own work per call.

Run one tree per process (``PYTHONPATH=<tree>``), alternating trees, to compare two versions of
the library on this machine:

    for t in old new old new; do PYTHONPATH=$t python3 benchmarks/probes/bind_python_cost.py --label $t; done

Paths (TinyBlock w128 b1, one layer, as ``rawgraph.bench.launch_paths`` builds them): ``bind``
(``mgr.bind("x", ...)`` alternating two inputs), ``apply2`` (a prepared two-name binding applied,
alternating two), ``launch`` (``mgr.launch``), ``bind_same`` (re-binding the bound input).
Prints one line per path (the probes' format, benchmarks/probes/README.md): ``TIME <label>
<path>: median=.. p10=.. p90=.. us`` over 15 repeats of 5,000 calls each, after 500 warm-up calls.
"""

from __future__ import annotations

import argparse
import statistics
import time


def per_call(fn, n: int = 5000, repeats: int = 15) -> dict:
    for _ in range(500):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / n)
    q = statistics.quantiles(samples, n=10)
    return {"median": statistics.median(samples), "p10": q[0], "p90": q[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="")
    ap.add_argument("--form", default="fused")
    args = ap.parse_args()

    from cuda.bindings import driver

    from rawgraph.graphs.capture import Capture
    from rawgraph.models.tinyblock import TinyBlock
    from rawgraph.runtime.memory import DeviceBuffer
    from rawgraph.runtime.stream import Stream
    from rawgraph.testing.fakedriver import fake_driver_session
    from rawgraph.updates.manager import ExecUpdateManager

    with fake_driver_session():
        s = Stream()
        model = TinyBlock(128, 1, 1, seed=1234, form=args.form)
        xs = [DeviceBuffer((1, 128)) for _ in range(2)]
        outs = [DeviceBuffer((1, 128)) for _ in range(4)]

        def capture(plan):
            with Capture(s) as cap:
                cap.run(plan)
            cap.captured.plan = plan
            return cap.captured

        g1 = capture(model.plan(xs[0], outs[0]))
        mgr = ExecUpdateManager(g1, g1.instantiate())
        g2 = capture(model.plan(xs[0], outs[1]))
        mgr2 = ExecUpdateManager(g2, g2.instantiate())
        mgr.launch(s)
        mgr2.launch(s)
        pairs = [mgr2.prepare({"x": xs[0], "out": outs[1]}), mgr2.prepare({"x": xs[1], "out": outs[2]})]
        ok = (driver.CUresult.CUDA_SUCCESS,)
        saved = (driver.cuGraphExecKernelNodeSetParams, driver.cuGraphLaunch)
        driver.cuGraphExecKernelNodeSetParams = lambda *a: ok
        driver.cuGraphLaunch = lambda *a: ok
        try:
            st = [0]

            def bind():
                st[0] ^= 1
                mgr.bind("x", xs[st[0]])

            def apply2():
                st[0] ^= 1
                mgr2.apply(pairs[st[0]])

            out = {
                "bind": per_call(bind),
                "apply2": per_call(apply2),
                "launch": per_call(lambda: mgr.launch(s)),
                "bind_same": per_call(lambda: mgr.bind("x", xs[st[0]])),
            }
        finally:
            driver.cuGraphExecKernelNodeSetParams, driver.cuGraphLaunch = saved
        mgr.close()
        mgr2.close()
        s.close()
    for path, t in out.items():
        print(
            f"TIME {args.label} {args.form} {path}: median={t['median']:.3f} p10={t['p10']:.3f} p90={t['p90']:.3f} us"
        )


if __name__ == "__main__":
    main()
