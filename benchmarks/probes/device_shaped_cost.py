"""Where a device-shaped replay's time goes (issue 25): device time (events) of one replay of

- ``exact``: the exact-size bucket exec at ``n`` rows (no updatable node);
- ``shaped``: :class:`rawgraph.serving.DeviceShapedGraph` after ``set_rows(n)`` (head + plan), its
  head making one ``cudaGraphKernelNodeUpdatesApply`` per node (``rg_du_shape``);
- ``banded``: the same with ``bands="plans"`` (one plan per band of row counts over which the
  model's plan does not change; the head enables the band holding ``n``), its output compared to
  the bit with the exact-size exec's at every ``n``;
- ``marked``: the ``max_batch``-row plan captured alone, every node opted in to
  ``CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE`` but never updated (no head): what opting in
  alone costs;
- ``plain``: the same capture, not opted in (equals ``exact`` at ``max_batch``).

Also the device memory each exec adds (``cuMemGetInfo`` around instantiate + upload).

    PYTHONPATH=. python3 benchmarks/probes/device_shaped_cost.py [--width 1024 --layers 8 --form fused]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import astuple

import numpy as np
from _common import model_args, parse_cut


class _NoRowGrid:
    """A row-wise model seen without its row grids: the head then changes no grid."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def row_grid(self, launch):
        return None

    def with_batch(self, batch, workspace=None):
        return _NoRowGrid(self._model.with_batch(batch, workspace=workspace))

    def close(self):
        self._model.close()


def main() -> int:
    p = argparse.ArgumentParser()
    model_args(p, rounds=100)
    p.add_argument(
        "--cut",
        action="append",
        default=[],
        type=parse_cut,
        help="BM,BN,BK,STAGES,S,KS,MINB: also measure with this sgemm cut at max_batch rows "
        "(ops.SGEMM_CUTS; S=1 launches no cluster); repeatable",
    )
    p.add_argument("--passes", type=int, default=2)
    p.add_argument(
        "--no-pdl", action="store_true", help="also measure the same model built without PDL (plain and device-shaped)"
    )
    p.add_argument(
        "--no-grid",
        action="store_true",
        help="also measure a device-shaped exec whose head sets only row counts and enables "
        "(the model seen with no row grid): the grids stay as captured",
    )
    a = p.parse_args()
    from rawgraph.graphs.capture import Capture
    from rawgraph.models.tinyblock import TinyBlock
    from rawgraph.runtime.device import get_device, gpu_available
    from rawgraph.runtime.memory import DeviceArray, DeviceBuffer
    from rawgraph.runtime.stream import Stream
    from rawgraph.runtime.timing import device_us, stats
    from rawgraph.serving.buckets import BucketGraphs
    from rawgraph.serving.device_shaped import DeviceShapedGraph, _set_updatable

    if not gpu_available():
        print("NO GPU: cuInit failed")
        return 2
    from rawgraph import ops
    from rawgraph.runtime.module import get_kernel

    dev = get_device()
    top = a.max_batch
    free0 = dev.memory_info()[0]
    get_kernel("device_update", "rg_du_shape", dev)
    print(
        f"FACT memory of loading the head's module (device_update.cu): +{(free0 - dev.memory_info()[0]) / 2**20:.2f} MiB"
    )
    ns = sorted({1, 16, 64, 65, 128, 129, 192, 256} & set(range(1, top + 1)) | {top})
    print(f"FACT config width={a.width} layers={a.layers} form={a.form} max_batch={top}; {dev.info.name}")
    s = Stream()
    model = TinyBlock(a.width, 1, a.layers, seed=1234, form=a.form)
    exact = BucketGraphs(model, sizes=ns, stream=s)
    s.synchronize()
    free0 = dev.memory_info()[0]
    dsg = DeviceShapedGraph(model, top, s)
    s.synchronize()
    print(
        f"FACT memory of building a DeviceShapedGraph: +{(free0 - dev.memory_info()[0]) / 2**20:.2f} MiB "
        f"(its own buffers {dsg.nbytes / 2**20:.2f} MiB)"
    )
    s.synchronize()
    free0 = dev.memory_info()[0]
    dsb = DeviceShapedGraph(model, top, s, bands="plans")
    s.synchronize()
    print(
        f"FACT banded: bands {dsb.bands}, {len(dsb.entries)} nodes, memory +{(free0 - dev.memory_info()[0]) / 2**20:.2f} MiB, "
        f"setup { {k: round(v * 1e3, 2) for k, v in dsb.setup.items()} } ms"
    )
    x = np.random.default_rng(5).standard_normal((top, a.width), dtype=np.float32)
    dsg.input.copy_from_host(x, s)
    dsb.input.copy_from_host(x, s)
    print(f"FACT shaped nodes={len(dsg.entries)} setup={ {k: round(v * 1e3, 2) for k, v in dsg.setup.items()} } ms")

    def add_exec(mark: bool, mdl=model):
        ws = mdl.make_workspace(top)
        m = mdl.with_batch(top, workspace=ws)
        x = DeviceBuffer((top, a.width), np.float32, dev)
        y = DeviceBuffer((top, a.width), np.float32, dev)
        f32 = np.dtype(np.float32)
        plan = m.plan(DeviceArray(x.ptr, (top, a.width), f32, x), DeviceArray(y.ptr, (top, a.width), f32, y))
        x.poison(s)
        plan.run(s)
        s.synchronize()
        cap = Capture(s)
        with cap:
            cap.run(plan)
        g = cap.captured
        if mark:
            g.mark_device_updatable()
            for node in cap.nodes:
                _set_updatable(node.handle)
        s.synchronize()
        free0 = dev.memory_info()[0]
        ex = g.instantiate()
        ex.upload(s)
        s.synchronize()
        grown = free0 - dev.memory_info()[0]
        return ex, grown, (m, x, y, g, ws)

    marked, grown_marked, keep1 = add_exec(True)
    plain, grown_plain, keep2 = add_exec(False)
    print(f"FACT exec memory: plain +{grown_plain / 2**20:.2f} MiB, marked +{grown_marked / 2**20:.2f} MiB")
    r = a.rounds
    for _ in range(a.passes):  # interleaved passes; the last is the one to read
        t_plain = stats(device_us(lambda: plain.launch(s), s, r))
        t_marked = stats(device_us(lambda: marked.launch(s), s, r))
        print(f"TIME plain {top}: median={t_plain['median']:.1f} p10={t_plain['p10']:.1f} p90={t_plain['p90']:.1f} us")
        print(
            f"TIME marked {top} (opted in, never updated): median={t_marked['median']:.1f} "
            f"p10={t_marked['p10']:.1f} p90={t_marked['p90']:.1f} us"
        )
        for n in ns:
            ex = exact.execs[n]
            te = stats(device_us(lambda ex=ex: ex.launch(s), s, r))
            dsg.set_rows(n, s)
            ts = stats(device_us(lambda: dsg.replay(s), s, r))
            dsb.set_rows(n, s)
            tb = stats(device_us(lambda: dsb.replay(s), s, r))
            want = exact.run(dsb.input, n, s).to_numpy(s)
            same = np.array_equal(want.view(np.uint32), dsb.output.to_numpy(s)[:n].view(np.uint32))
            print(
                f"TIME n={n}: exact median={te['median']:.1f} (p10 {te['p10']:.1f} p90 {te['p90']:.1f}) "
                f"shaped median={ts['median']:.1f} (p10 {ts['p10']:.1f} p90 {ts['p90']:.1f}) "
                f"banded median={tb['median']:.1f} (p10 {tb['p10']:.1f} p90 {tb['p90']:.1f}) "
                f"ratio shaped/exact={ts['median'] / te['median']:.3f} banded/exact={tb['median'] / te['median']:.3f} "
                f"banded==exact bits: {same}; n used {dsg.check_status()} / {dsb.check_status()}"
            )
    # Variants that tell why a device-shaped replay with 3-4 row-blocks takes twice the plain exec:
    # an sgemm cut with or without clusters (--cut), the same model without PDL (--no-pdl).
    variants = [(f"cut {','.join(map(str, astuple(cut)))}", cut, False) for cut in a.cut]
    if a.no_pdl:
        variants.append(("no PDL", None, True))
    if a.no_grid:
        variants.append(("no grid updates", None, "no-grid"))
    for label, cut, no_pdl in variants:
        if cut is not None:
            ops.SGEMM_CUTS[(top, a.width, a.width)] = cut
        owned: list = []
        try:
            mdl = model
            if no_pdl is True:
                mdl = TinyBlock(a.width, 1, a.layers, seed=1234, form=a.form, pdl=False)
                owned.append(mdl)
            c_plain, _, keep3 = add_exec(False, mdl)
            owned[:0] = [c_plain, *reversed(keep3)]
            c_dsg = DeviceShapedGraph(_NoRowGrid(mdl) if no_pdl == "no-grid" else mdl, top, s)
            owned.insert(0, c_dsg)
            kernels = sorted({e.kernel for e in c_dsg.entries})
            print(f"FACT {label}: kernels {kernels}")
            tp = stats(device_us(lambda c_plain=c_plain: c_plain.launch(s), s, r))
            print(f"TIME {label} plain {top}: median={tp['median']:.1f} p10={tp['p10']:.1f} p90={tp['p90']:.1f} us")
            for n in (1, 64, 65, 129, top):
                c_dsg.set_rows(n, s)
                tc = stats(device_us(lambda c_dsg=c_dsg: c_dsg.replay(s), s, r))
                print(
                    f"TIME {label} n={n}: shaped median={tc['median']:.1f} (p10 {tc['p10']:.1f} p90 {tc['p90']:.1f}) "
                    f"shaped/plain-{top}={tc['median'] / tp['median']:.3f}; n used {c_dsg.check_status()}"
                )
        except Exception as exc:  # a cut this device cannot run: say so, go on
            print(f"STEP {label}: EXC {type(exc).__name__}: {exc}")
        finally:
            ops.SGEMM_CUTS.pop((top, a.width, a.width), None)
            s.synchronize()
            for obj in owned:
                obj.close()
    s.synchronize()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
