"""Probe: where do the graph-table and copy-table SlotPools first disagree in the slots benchmark?

    PYTHONPATH=. python3 benchmarks/probes/slots_divergence.py

Runs both pools on the benchmark's trace (w1024 L8 fused, 256 slots) for 60 steps, with host-row
and with device-row joins, and after every step compares every live slot's row between the pools.
"""

import numpy as np

from rawgraph import DeviceBuffer, SlotPool, Stream, TinyBlock
from rawgraph.bench.slots import join_leave_trace
from rawgraph.runtime.memory import DeviceArray
from rawgraph.serving.sizes import vllm_sizes

W = 1024
for kind in ("host", "device"):
    for width, layers, slots in ((1024, 8, 256), (128, 2, 64)):
        s = Stream()
        model = TinyBlock(width, 1, layers, seed=11, form="fused")
        rng = np.random.default_rng(1)
        rows_h = rng.standard_normal((64, width), dtype=np.float32)
        rows = DeviceBuffer.from_numpy(rows_h, stream=s)
        pools = {t: SlotPool(model, slots, vllm_sizes(slots), table=t, stream=s) for t in ("graph", "copy")}
        slot_of = {t: {} for t in pools}
        nid = 0
        first = None
        for step, (admit, leaving) in enumerate(join_leave_trace(60, slots, 2.0, 48.0, 0)):
            for t, p in pools.items():
                for r in range(nid, nid + admit):
                    row = (
                        rows_h[r % 64]
                        if kind == "host"
                        else DeviceArray(rows.ptr + (r % 64) * width * 4, (width,), np.dtype(np.float32), rows)
                    )
                    slot_of[t][r] = p.join(row)
                p.step()
                s.synchronize()
            nid += admit
            a, b = pools["graph"].state.to_numpy(s), pools["copy"].state.to_numpy(s)
            bad = [r for r, sl in slot_of["graph"].items() if not np.array_equal(a[sl], b[slot_of["copy"][r]])]
            if bad and first is None:
                first = step
                r = bad[0]
                print(
                    f"{kind} w{width} L{layers} slots{slots}: first divergence after step {step} (admit {admit}), "
                    f"requests {bad[:8]}, slots graph {[slot_of['graph'][x] for x in bad[:8]]} copy "
                    f"{[slot_of['copy'][x] for x in bad[:8]]}, graph row nan={bool(np.isnan(a[slot_of['graph'][r]]).any())} "
                    f"copy row nan={bool(np.isnan(b[slot_of['copy'][r]]).any())}, live {len(pools['graph'])}, "
                    f"tables graph {pools['graph'].table[:8].tolist()} copy {pools['copy'].table[:8].tolist()}"
                )
            for t, p in pools.items():
                for r in leaving:
                    p.leave(slot_of[t].pop(r))
        if first is None:
            print(f"{kind} w{width} L{layers} slots{slots}: no divergence in 60 steps")
        for p in pools.values():
            p.close()
