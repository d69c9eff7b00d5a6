"""Bands picked by a SWITCH node instead of disabled device-updatable nodes (issue 25): device time.

``DeviceShapedGraph(bands="plans")`` chains every band's plan behind its head and disables the
bands that do not hold ``n`` (``cudaGraphKernelNodeSetEnabled``). Measured on an H100
(2026-12-06, ``probe_device_shaped_cuts_2026-12-06_026332a_h100.txt``): 379.5 us at n = 1
against 63.6 for the exact-size exec, about 2.5 us for each of the 128 disabled nodes. This probe
asks whether a conditional SWITCH, one body per band (each body the band top's own plan, the
kernels exact-size graphs run), pays only for the body taken:

- ``switch``: ``rg_set_cond`` (the band index, a word in device memory) then one SWITCH node with
  one body per band, each body captured from the plan of the band's top row count;
- ``exact``: the exact-size bucket exec at ``n`` (``BucketGraphs``), as in the other probe.

Bodies are captured with plain edges (``pdl=False``; a PDL chain inside a conditional body is
tried first and its error, if any, printed). Per ``n``: both device times (events, median, p10,
p90), their ratio, and whether the switch's first ``n`` output rows equal the exact exec's to the
bit. Also the device memory and the set-up (capture + instantiate + upload) of the switch exec,
for the plan bands and for the 35 vLLM sizes as bands.

    PYTHONPATH=. python3 benchmarks/probes/switch_bands.py [--width 1024 --layers 8 --rounds 40]
"""
from __future__ import annotations

import argparse
import bisect
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--form", default="fused")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=40)
    a = p.parse_args()
    from rawgraph.control.conditional import capture_conditional, capture_handle, set_condition
    from rawgraph.graphs.capture import Capture
    from rawgraph.models.tinyblock import TinyBlock
    from rawgraph.runtime.device import get_device, gpu_available
    from rawgraph.runtime.memory import DeviceArray, DeviceBuffer
    from rawgraph.runtime.stream import Stream
    from rawgraph.runtime.timing import device_us, stats
    from rawgraph.serving.buckets import BucketGraphs
    from rawgraph.serving.device_shaped import DeviceShapedGraph
    from rawgraph.serving.sizes import vllm_sizes

    if not gpu_available():
        print("NO GPU: cuInit failed")
        return 2
    dev = get_device()
    top, w = a.max_batch, a.width
    f32 = np.dtype(np.float32)
    print(f"FACT config width={w} layers={a.layers} form={a.form} max_batch={top}; {dev.info.name}")
    s, body_stream = Stream(), Stream()
    model = TinyBlock(w, 1, a.layers, seed=1234, form=a.form)
    with DeviceShapedGraph(model, top, s, bands="plans") as dsb:
        plan_bands = list(dsb.bands)
    ns = sorted({1, 3, 16, 24, 25, 56, 64, 65, 100, 128, 129, 192, 200, 256} & set(range(1, top + 1)))
    exact = BucketGraphs(model, sizes=ns, stream=s)
    xh = np.random.default_rng(5).standard_normal((top, w), dtype=np.float32)
    x = DeviceBuffer.from_numpy(xh, stream=s)
    out = DeviceBuffer((top, w), np.float32, dev)
    sel = DeviceBuffer((1,), np.uint32, dev)
    ws = model.make_workspace(top)  # one workspace: the bodies never run together

    def build(bands: list[int], pdl: bool | None):
        plans = []
        for b in bands:
            m = model.with_batch(b, workspace=ws)
            plans.append((m, m.plan(DeviceArray(x.ptr, (b, w), f32, x), DeviceArray(out.ptr, (b, w), f32, out))))
        for _m, plan in plans:  # warm-up outside capture (modules loaded, caches filled)
            plan.run(s)
        s.synchronize()
        t0 = time.perf_counter()
        cap = Capture(s)
        with cap:
            cond = capture_handle(cap)
            cap.launch(set_condition(dev, cond, sel))
            node = capture_conditional(cap, "switch", cond, size=len(bands))
            for i, (_m, plan) in enumerate(plans):
                with node.capture_body(i, body_stream) as body:
                    body.run(plan, pdl=pdl)
        graph = cap.captured
        free0 = dev.memory_info()[0]
        ex = graph.instantiate()
        ex.upload(s)
        s.synchronize()
        setup = time.perf_counter() - t0
        grown = free0 - dev.memory_info()[0]
        return ex, graph, setup, grown, plans, node

    def band_of(bands: list[int], n: int) -> int:
        return bisect.bisect_left(bands, n)

    def measure(label: str, bands: list[int], pdl: bool | None) -> None:
        try:
            ex, graph, setup, grown, keep, node = build(bands, pdl)
        except Exception as exc:  # what the driver says of this form, recorded
            print(f"FACT {label}: build failed: {type(exc).__name__}: {exc}")
            return
        nodes = sum(len(node.body_kernel_nodes(i)) for i in range(len(bands)))
        print(f"FACT {label}: {len(bands)} bodies, {nodes} kernel nodes, set-up {setup * 1e3:.2f} ms "
              f"(capture + instantiate + upload), exec memory +{grown / 2**20:.2f} MiB")
        for n in ns:
            i = band_of(bands, n)
            sel.copy_from_host(np.array([i], np.uint32), s)
            te = stats(device_us(lambda: exact.execs[n].launch(s), s, a.rounds))
            tsw = stats(device_us(lambda: ex.launch(s), s, a.rounds))
            out.poison(s)
            ex.launch(s)
            got = out.to_numpy(s)[:n]
            want = exact.run(x, n, s).to_numpy(s)
            same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            print(f"TIME {label} n={n} band top {bands[i]}: exact median={te['median']:.1f} (p10 {te['p10']:.1f} "
                  f"p90 {te['p90']:.1f}) switch median={tsw['median']:.1f} (p10 {tsw['p10']:.1f} p90 {tsw['p90']:.1f}) "
                  f"ratio switch/exact={tsw['median'] / te['median']:.3f} bits equal: {same}")
        ex.close()
        graph.close()

    for label, bands, pdl in (("plan bands, PDL kept", plan_bands, None), ("plan bands, plain edges", plan_bands, False),
                              ("vLLM sizes, plain edges", vllm_sizes(top), False)):
        try:
            measure(label, bands, pdl)
        except Exception as exc:  # one variant failing leaves the others to run
            print(f"FACT {label}: failed while measuring: {type(exc).__name__}: {exc}")
            s.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
