"""Host (Python) cost of the exec-update hot path, on the CPU fake driver: what a redesign of the
update core can change, with the driver's own cost taken out.

Runs in any checkout that has ``tests/fault_cases.py`` (the fake driver) and uses only top-level
``rawgraph`` names, so two trees can be compared on one machine::

    PYTHONPATH=<tree>:<tree>/tests python3 benchmarks/probes/update_host_cost.py [--rounds N]

Per operation, the median of ``--repeats`` timings of ``--rounds`` calls each (microseconds per
call): ``bind`` (one array, alternating between two: one node pushed), ``bind_same`` (the bound
array again: nothing pushed), ``apply`` (a prepared two-name Binding, alternating), ``bind_many``
(x and out together). Once everything is built, ``cuGraphExecKernelNodeSetParams`` is replaced by a
call that only returns success, so the figures are the library's own Python per call (the fake
driver's SetParams is a much slower Python function); compare trees, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def _time(fn, rounds: int, repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / rounds)
    samples.sort()
    return {
        "median": statistics.median(samples),
        "p10": samples[len(samples) // 10],
        "p90": samples[-1 - len(samples) // 10],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json")
    args = p.parse_args(argv)
    from fault_cases import fake_session

    import rawgraph as rg

    out = {}
    with fake_session():
        s = rg.Stream()
        model = rg.TinyBlock(128, 1, 1, seed=1, form="fused")
        xs = [rg.DeviceBuffer((1, 128)) for _ in range(2)]
        outs = [rg.DeviceBuffer((1, 128)) for _ in range(2)]
        graph = rg.capture_plan(model.plan(xs[0], outs[0]), s)
        exe = graph.instantiate()
        mgr = rg.ExecUpdateManager(graph, exe)
        state = {"i": 0}

        def bind() -> None:
            state["i"] ^= 1
            mgr.bind("x", xs[state["i"]])

        def bind_same() -> None:
            mgr.bind("x", xs[state["i"]])

        prepared = [mgr.prepare({"x": xs[i], "out": outs[i]}) for i in (0, 1)]

        def apply() -> None:
            state["i"] ^= 1
            mgr.apply(prepared[state["i"]])

        def bind_many() -> None:
            state["i"] ^= 1
            mgr.bind_many({"x": xs[state["i"]], "out": outs[state["i"]]})

        from cuda.bindings import driver

        ok = (driver.CUresult.CUDA_SUCCESS,)
        real = driver.cuGraphExecKernelNodeSetParams
        driver.cuGraphExecKernelNodeSetParams = lambda *a: ok
        for name, fn in (("bind", bind), ("bind_same", bind_same), ("apply", apply), ("bind_many", bind_many)):
            fn()
            out[name] = _time(fn, args.rounds, args.repeats)
        driver.cuGraphExecKernelNodeSetParams = real
        mgr.close()
        for obj in (exe, graph, model, *xs, *outs, s):
            obj.close()
    print(" ".join(f"{k}={v['median']:.3f}us" for k, v in out.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
