"""Host cost of single driver calls, fitted as fixed + per-node over graph sizes.

Each figure is host wall time per call with many calls issued back to back and one synchronize
at the end (device time is not on this clock as long as the queue does not fill).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from cuda.bindings import driver

from .. import ops
from ..graphs.capture import Capture
from ..runtime.device import get_device
from ..runtime.errors import check
from ..runtime.launch import LaunchPlan
from ..runtime.stream import Stream
from ..runtime.timing import stats

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
    cap.captured.plan = LaunchPlan(launches, {}, (), ())
    return cap.captured


def _bind_costs(stream: Stream) -> dict:
    """``ExecUpdateManager.bind`` per call on a 1-node graph: alternating between two checked
    inputs (one SetParams each) and re-binding the bound one (no driver call)."""
    from ..runtime.memory import DeviceBuffer
    from ..updates.manager import ExecUpdateManager

    dev = get_device()
    bufs = {n: DeviceBuffer(256) for n in ("x", "x2", "y")}
    views = {n: b.view() for n, b in bufs.items()}
    plan = LaunchPlan([ops.relu(dev, views, "x", "y")], views, ("x",), ("y",))
    with Capture(stream) as cap:
        cap.run(plan)
    cap.captured.plan = plan
    mgr = ExecUpdateManager(cap.captured, cap.captured.instantiate(), names=("x",))
    pair, state = (bufs["x"], bufs["x2"]), [0]

    def alternate():
        state[0] ^= 1
        mgr.bind("x", pair[state[0]])

    out = {
        "manager_bind_1_node": _per_call(alternate, stream, n=2000),
        "manager_bind_same": _per_call(lambda: mgr.bind("x", pair[state[0]]), stream, n=2000),
    }
    mgr.close()
    mgr.exec.close()
    cap.captured.close()
    return out


def measure(sizes=SIZES, torch_ok: bool = True) -> dict:
    """Returns ``{"cuLaunchKernel": stats, "cuGraphLaunch": {"points": [...], "fit": {...}}, ...}``.

    See Also
    --------
    cuLaunchKernel : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
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
                check(
                    driver.cuLaunchKernelEx(plain_cfg, plain.kernel.handle, plain.args.address, 0), "cuLaunchKernelEx"
                )

            out["cuLaunchKernelEx_plain"] = _per_call(ex_plain, stream)
        out.update(_bind_costs(stream))
        rows: dict[str, list] = {"cuGraphLaunch": [], "cuGraphExecKernelNodeSetParams": [], "cuGraphExecUpdate": []}
        for n in sizes:
            g = _empty_graph(n, stream)
            g2 = _empty_graph(n, stream)
            exe = g.instantiate()
            rows["cuGraphLaunch"].append((n, _per_call(lambda exe=exe: exe.launch(stream), stream, n=200)))
            node = g.nodes[0]
            p = driver.CUDA_KERNEL_NODE_PARAMS()
            p.func, p.gridDimX, p.gridDimY, p.gridDimZ = node.launch.kernel.handle, 1, 1, 1
            p.blockDimX, p.blockDimY, p.blockDimZ, p.kernelParams = 1, 1, 1, node.launch.args.address
            p.sharedMemBytes, p.extra, p.kern, p.ctx = 0, 0, 0, 0  # every field set (see Launch.node_params)

            def setp(exe=exe, node=node, p=p):
                check(
                    driver.cuGraphExecKernelNodeSetParams(exe.handle, node.handle, p), "cuGraphExecKernelNodeSetParams"
                )

            rows["cuGraphExecKernelNodeSetParams"].append((n, _per_call(setp, stream, n=500)))
            rows["cuGraphExecUpdate"].append((n, _per_call(lambda exe=exe, g2=g2: exe.update(g2), stream, n=50)))
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
    out["bind_breakdown"] = {
        form: bind_breakdown(form=form, torch_ok=torch_ok)
        for form in ("fused", "block")
        if form != "block" or ops.has_clusters(dev)
    }
    return out


def bind_breakdown(
    rounds: int = 1500, width: int = 128, batch: int = 1, form: str = "fused", torch_ok: bool = True
) -> dict:
    """Where the time of re-binding input and output + replay goes (one process, interleaved rounds).

    Per round, in turn, each a synchronized step on the same exec alternating between the same two
    input/output pairs: ``replay`` (launch only), ``apply2_replay`` (a prepared two-name
    :class:`~rawgraph.updates.manager.Binding` applied, then launch), ``bind2_replay`` (``bind_many`` of
    the two names, then launch), ``raw_setparams_replay`` (the same node pushes made straight with
    ``cuGraphExecKernelNodeSetParams``, then launch), ``bind2_noop_replay`` (binding what is
    already bound: no push) and, when torch is importable, ``torch_graph_replay`` and
    ``torch_graph_copy_replay`` (``static_in.copy_(src)`` + replay of torch's graph of the same
    block and weights). Also, per step: the host time of the apply / bind_many call alone, of the
    raw pushes alone, of ``cuGraphLaunch`` right after pushes and with none, and the device time
    of the replay (events) after pushes and with none. Medians with p10/p90 in microseconds.

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    from ..graphs.capture import capture_plan
    from ..models.tinyblock import TinyBlock
    from ..runtime.memory import DeviceBuffer
    from ..runtime.stream import Event
    from ..updates.manager import ExecUpdateManager

    rng = np.random.default_rng(5)
    s = Stream()
    model = TinyBlock(width, batch, 1, seed=3, form=form)
    shape = (batch, width)
    xs = [DeviceBuffer.from_numpy(rng.standard_normal(shape, dtype=np.float32), stream=s) for _ in range(2)]
    outs = [DeviceBuffer(shape) for _ in range(2)]
    graph = capture_plan(model.plan(xs[0], outs[0]), s)
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    pairs = [{"x": xs[0], "out": outs[0]}, {"x": xs[1], "out": outs[1]}]
    for p in pairs:  # both pairs checked and cached
        mgr.bind_many(p)
    prepared = [mgr.prepare(p) for p in pairs]
    nodes = sorted({n for name in ("x", "out") for n, _a, _r in mgr.bindings[name]})
    setp = driver.cuGraphExecKernelNodeSetParams
    clock = time.perf_counter
    names = [
        "replay",
        "apply2_replay",
        "bind2_replay",
        "raw_setparams_replay",
        "bind2_noop_replay",
        "apply2_call",
        "bind2_call",
        "raw_setparams_call",
        "raw_changed_setparams_replay",
        "raw_changed_setparams_call",
        "launch_call_after_push",
        "launch_call_no_push",
        "device_after_push",
        "device_no_push",
    ]
    torch_step = _torch_block(model, xs[0], torch_ok)
    if torch_step is not None:
        names += ["torch_graph_replay", "torch_graph_copy_replay"]
    samples: dict[str, list[float]] = {k: [] for k in names}
    ev = [Event(), Event()]
    state = [0]

    def push_raw() -> None:
        for n in nodes:
            setp(exe.handle, mgr._handles[n], mgr._params[n])

    # The same pushes with the pointers of the other pair, from argument blocks filled once: what
    # the driver charges when the values really change (pushing unchanged values may cost less).
    from ..runtime.launch import KernelArgs

    def params_for(pair: dict) -> list:
        out = []
        for n in nodes:
            args = KernelArgs.from_bytes(mgr._args[n].spec, mgr._args[n]._storage.tobytes())
            for name, arr in pair.items():
                for node, arg, _role in mgr.bindings[name]:
                    if node == n:
                        args[arg] = arr.ptr
            out.append((mgr._handles[n], graph.nodes[n].launch.node_params(args), args))
        return out

    other_params = [params_for(p) for p in pairs]

    def push_changed(i: int) -> None:
        for h, p, _args in other_params[i]:
            setp(exe.handle, h, p)

    for r in range(rounds + 50):
        keep = r >= 50  # warm-up rounds are not kept
        # replay alone (no push since the last launch)
        ev[0].record(s)
        t1 = clock()
        exe.launch(s)
        t2 = clock()
        ev[1].record(s)
        s.synchronize()
        t3 = clock()
        if keep:
            samples["replay"].append((t3 - t1) * 1e6)  # launch, end event, synchronize
            samples["launch_call_no_push"].append((t2 - t1) * 1e6)
            samples["device_no_push"].append(ev[0].elapsed_ms(ev[1]) * 1e3)
        # a prepared binding applied, then replay
        state[0] ^= 1
        t0 = clock()
        mgr.apply(prepared[state[0]])
        t1 = clock()
        ev[0].record(s)
        t2 = clock()
        exe.launch(s)
        t3 = clock()
        ev[1].record(s)
        s.synchronize()
        t4 = clock()
        if keep:
            samples["apply2_replay"].append(((t1 - t0) + (t4 - t2)) * 1e6)  # apply, then as "replay"
            samples["apply2_call"].append((t1 - t0) * 1e6)
            samples["launch_call_after_push"].append((t3 - t2) * 1e6)
            samples["device_after_push"].append(ev[0].elapsed_ms(ev[1]) * 1e3)
        # bind_many of the two names, then replay
        state[0] ^= 1
        t0 = clock()
        mgr.bind_many(pairs[state[0]])
        t1 = clock()
        exe.launch(s)
        ev[1].record(s)
        s.synchronize()
        t2 = clock()
        if keep:
            samples["bind2_replay"].append((t2 - t0) * 1e6)
            samples["bind2_call"].append((t1 - t0) * 1e6)
        # the same pushes straight to the driver, then replay
        t0 = clock()
        push_raw()
        t1 = clock()
        exe.launch(s)
        ev[1].record(s)
        s.synchronize()
        t2 = clock()
        if keep:
            samples["raw_setparams_replay"].append((t2 - t0) * 1e6)
            samples["raw_setparams_call"].append((t1 - t0) * 1e6)
        # changed pointers pushed straight from ready argument blocks, then the manager's back
        t0 = clock()
        push_changed(state[0] ^ 1)
        t1 = clock()
        exe.launch(s)
        ev[1].record(s)
        s.synchronize()
        t2 = clock()
        push_raw()
        if keep:
            samples["raw_changed_setparams_replay"].append((t2 - t0) * 1e6)
            samples["raw_changed_setparams_call"].append((t1 - t0) * 1e6)
        # binding what is bound: the manager's fixed cost, no push
        t0 = clock()
        mgr.bind_many(pairs[state[0]])
        exe.launch(s)
        ev[1].record(s)
        s.synchronize()
        t1 = clock()
        if keep:
            samples["bind2_noop_replay"].append((t1 - t0) * 1e6)
        if torch_step is not None:
            for name, dt in torch_step().items():
                if keep:
                    samples[name].append(dt)
    out: dict[str, Any] = {k: stats(v) for k, v in samples.items()}
    out["apply2_python_us"] = _apply_python_cost(mgr, prepared)
    out["nodes_pushed"] = len(nodes)
    out["config"] = {"width": width, "batch": batch, "form": form, "rounds": rounds}
    if torch_step is not None:
        ref = out["torch_graph_copy_replay"]["median"]
        out["ratios_vs_torch_graph_copy"] = {
            k: out[k]["median"] / ref
            for k in ("apply2_replay", "bind2_replay", "raw_setparams_replay", "raw_changed_setparams_replay", "replay")
        }
    mgr.close()
    for obj in (exe, graph, model, *xs, *outs, *ev, s):
        obj.close()
    return out


def _apply_python_cost(mgr: Any, prepared: list, n: int = 20000) -> dict:
    """Host time of ``apply`` alternating two prepared bindings with the driver's push replaced
    by a no-op: the manager's own Python per call (the exec is re-synchronised afterwards)."""
    real = driver.cuGraphExecKernelNodeSetParams
    ok = (driver.CUresult.CUDA_SUCCESS,)
    per: list[float] = []
    try:
        driver.cuGraphExecKernelNodeSetParams = lambda *_a: ok
        for _ in range(7):
            t0 = time.perf_counter()
            for i in range(n):
                mgr.apply(prepared[i & 1])
            per.append((time.perf_counter() - t0) / n * 1e6)
    finally:
        driver.cuGraphExecKernelNodeSetParams = real
    mgr._slots.forget()  # what the exec holds is not what the shadows say: push them all
    for n_ in mgr._slots.now:
        real(mgr.exec.handle, mgr._handles[n_], mgr._params[n_])
    return stats(per)


def _torch_block(model: Any, x: Any, torch_ok: bool) -> Any:
    """One round of torch's graph of ``model``'s block (same weights): returns a function giving
    ``{"torch_graph_replay": us, "torch_graph_copy_replay": us}`` per call, or None without torch."""
    if not torch_ok:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    ((w1, w2),) = [(torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")) for a, b in model.weights]
    src = torch.as_tensor(x, device="cuda").clone()
    static_in = src.clone()
    tstream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(tstream):
        for _ in range(3):
            torch.relu(static_in @ w1) @ w2 + static_in
        tstream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=tstream):
            torch.relu(static_in @ w1) @ w2 + static_in
    clock = time.perf_counter

    def step() -> dict:
        with torch.cuda.stream(tstream):
            t0 = clock()
            g.replay()
            tstream.synchronize()
            t1 = clock()
            static_in.copy_(src)
            g.replay()
            tstream.synchronize()
            t2 = clock()
        return {"torch_graph_replay": (t1 - t0) * 1e6, "torch_graph_copy_replay": (t2 - t1) * 1e6}

    step.keep = (g, w1, w2, src, static_in, tstream)  # type: ignore[attr-defined]
    return step
