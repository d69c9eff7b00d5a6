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
for the plan bands, for the 35 vLLM sizes as bands and for one body per row count (what a
SWITCH-shaped exec with no padding at all would cost). Last, ``switch+updates``: the bodies'
nodes opted in to device updates and ``rg_du_shape`` before the SWITCH cutting each band's grids
and row counts to ``n`` (whether a conditional body may hold device-updatable nodes at all, then
the time, the bits and whether rows ``>= n`` stay untouched).

    PYTHONPATH=. python3 benchmarks/probes/switch_bands.py [--width 1024 --layers 8 --rounds 40]
"""

from __future__ import annotations

import argparse
import bisect
import time

import numpy as np
from _common import model_args


def main() -> int:
    p = argparse.ArgumentParser()
    model_args(p, rounds=40)
    a = p.parse_args()
    from rawgraph.graphs.capture import Capture
    from rawgraph.graphs.conditional import capture_conditional, capture_handle, set_condition
    from rawgraph.models.tinyblock import TinyBlock
    from rawgraph.runtime.device import get_device, gpu_available
    from rawgraph.runtime.memory import POISON_BITS, DeviceArray, DeviceBuffer
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

    def band_plans(bands: list[int]) -> list:
        """``(model view, plan)`` of each band top over the shared x, out and workspace, each run
        once outside any capture (modules loaded, caches filled)."""
        plans = []
        for b in bands:
            m = model.with_batch(b, workspace=ws)
            plans.append((m, m.plan(DeviceArray(x.ptr, (b, w), f32, x), DeviceArray(out.ptr, (b, w), f32, out))))
        for _m, plan in plans:
            plan.run(s)
        s.synchronize()
        return plans

    def capture_switch(plans: list, pdl: bool | None, head=None):
        """[head ->] rg_set_cond -> SWITCH with one body per plan; the graph and the node."""
        cap = Capture(s)
        with cap:
            cond = capture_handle(cap)
            if head is not None:
                cap.launch(head)
            cap.launch(set_condition(dev, cond, sel))
            node = capture_conditional(cap, "switch", cond, size=len(plans))
            for i, (_m, plan) in enumerate(plans):
                with node.capture_body(i, body_stream) as body:
                    body.run(plan, pdl=pdl)
        return cap.captured, node

    def build(bands: list[int], pdl: bool | None):
        plans = band_plans(bands)
        t0 = time.perf_counter()
        graph, node = capture_switch(plans, pdl)
        free0 = dev.memory_info()[0]
        ex = graph.instantiate()
        ex.upload(s)
        s.synchronize()
        setup = time.perf_counter() - t0
        grown = free0 - dev.memory_info()[0]
        return ex, graph, setup, grown, plans, node

    def band_of(bands: list[int], n: int) -> int:
        return bisect.bisect_left(bands, n)

    def compare(label: str, bands: list[int], ex, n_live=None, rc=None) -> None:
        """Per n: the band index (and n, where a head reads it) written, both execs timed, the
        switch's rows against the exact exec's to the bit, rows >= n checked untouched, and the
        head's update codes where it has them."""
        for n in ns:
            i = band_of(bands, n)
            sel.copy_from_host(np.array([i], np.uint32), s)
            if n_live is not None:
                n_live.copy_from_host(np.array([n], np.int32), s)
            te = stats(device_us(lambda n=n: exact.execs[n].launch(s), s, a.rounds))
            tsw = stats(device_us(lambda: ex.launch(s), s, a.rounds))
            out.poison(s)
            ex.launch(s)
            whole = out.to_numpy(s)
            want = exact.run(x, n, s).to_numpy(s)
            same = np.array_equal(whole[:n].view(np.uint32), want.view(np.uint32))
            untouched = bool((whole[n:].view(np.uint32) == POISON_BITS).all())
            head = ""
            if rc is not None:
                codes = rc.to_numpy(s)
                head = f"; head n={int(codes[-1])}, failed updates {int((codes[:-1] != 0).sum())}"
            print(
                f"TIME {label} n={n} band top {bands[i]}: exact median={te['median']:.1f} (p10 {te['p10']:.1f} "
                f"p90 {te['p90']:.1f}) switch median={tsw['median']:.1f} (p10 {tsw['p10']:.1f} p90 {tsw['p90']:.1f}) "
                f"ratio switch/exact={tsw['median'] / te['median']:.3f} bits equal: {same}; "
                f"rows >= n untouched: {untouched}{head}"
            )

    def measure(label: str, bands: list[int], pdl: bool | None) -> None:
        try:
            ex, graph, setup, grown, keep, node = build(bands, pdl)
        except Exception as exc:  # what the driver says of this form, recorded
            print(f"FACT {label}: build failed: {type(exc).__name__}: {exc}")
            return
        nodes = sum(len(node.body_kernel_nodes(i)) for i in range(len(bands)))
        print(
            f"FACT {label}: {len(bands)} bodies, {nodes} kernel nodes, set-up {setup * 1e3:.2f} ms "
            f"(capture + instantiate + upload), exec memory +{grown / 2**20:.2f} MiB"
        )
        compare(label, bands, ex)
        ex.close()
        graph.close()

    def measure_updatable(label: str, bands: list[int]) -> None:
        """The SWITCH picks the band; inside it, the body's nodes are device-updatable and the
        head (``rg_du_shape``, as ``DeviceShapedGraph`` uses it) cuts their grids and row counts to
        ``n``: can a body hold such nodes, and does a band then cost what the exact exec costs?"""
        from rawgraph.runtime.launch import KernelArgs, Launch
        from rawgraph.runtime.module import get_kernel
        from rawgraph.serving.device_shaped import (
            _HEAD_THREADS,
            ENTRY_DTYPE,
            _check_offsets,
            _set_updatable,
            pack_table,
            shape_entries,
        )

        plans = band_plans(bands)
        entries, lo = [], 1
        for b, (_m, plan) in zip(bands, plans):
            entries += shape_entries(model, plan.launches, b, lo=lo, start=len(entries))
            lo = b + 1
        _check_offsets(entries, [launch for _m, plan in plans for launch in plan.launches])
        count = len(entries)
        table = DeviceBuffer((count * ENTRY_DTYPE.itemsize // 8,), np.uint64, dev)
        rc = DeviceBuffer((count + 1,), np.int32, dev)
        n_live = DeviceBuffer((1,), np.int32, dev)
        args = KernelArgs([("table", "ptr"), ("count", "i32"), ("n_live", "ptr"), ("max_rows", "i32"), ("rc", "ptr")])
        args.update({"table": table.ptr, "count": count, "n_live": n_live.ptr, "max_rows": top, "rc": rc.ptr})
        threads = min(_HEAD_THREADS, max(32, -(-count // 32) * 32))
        head = Launch(
            get_kernel("device_update", "rg_du_shape", dev),
            (-(-count // threads), 1, 1),
            (threads, 1, 1),
            args,
            {},
            0,
            "device_shape",
        )
        n_live.copy_from_host(np.array([top], np.int32), s)
        t0 = time.perf_counter()
        graph, node = capture_switch(plans, None, head)
        graph.mark_device_updatable()
        kernels = [k for i in range(len(bands)) for k in node.body_kernel_nodes(i)]
        if len(kernels) != count or any(k.handle is None for k in kernels):
            print(f"FACT {label}: {len(kernels)} body kernel nodes with handles for {count} entries: not measured")
            return
        try:
            handles = [_set_updatable(k.handle) for k in kernels]
        except Exception as exc:
            print(f"FACT {label}: opting a body's kernel node in failed: {type(exc).__name__}: {exc}")
            return
        table.copy_from_host(pack_table(entries, handles).view(np.uint64), s)
        free0 = dev.memory_info()[0]
        try:
            ex = graph.instantiate()
            ex.upload(s)
            s.synchronize()
        except Exception as exc:
            print(f"FACT {label}: instantiate/upload failed: {type(exc).__name__}: {exc}")
            return
        print(
            f"FACT {label}: {len(bands)} bodies, {count} updatable nodes, set-up {(time.perf_counter() - t0) * 1e3:.2f} ms, "
            f"exec memory +{(free0 - dev.memory_info()[0]) / 2**20:.2f} MiB"
        )
        compare(label, bands, ex, n_live, rc)
        ex.close()
        graph.close()

    every = list(range(1, top + 1))  # one body per row count: exact at every n, nothing padded
    for label, bands, pdl in (
        ("plan bands, PDL kept", plan_bands, None),
        ("plan bands, plain edges", plan_bands, False),
        ("vLLM sizes, plain edges", vllm_sizes(top), False),
        ("every row count, PDL kept", every, None),
    ):
        try:
            measure(label, bands, pdl)
        except Exception as exc:  # one variant failing leaves the others to run
            print(f"FACT {label}: failed while measuring: {type(exc).__name__}: {exc}")
            s.synchronize()
    try:
        measure_updatable("plan bands, updatable bodies", plan_bands)
    except Exception as exc:
        print(f"FACT plan bands, updatable bodies: failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
