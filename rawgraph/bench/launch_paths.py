"""Launch-path benchmark: the same TinyBlock work through every way of launching it, one process.

Paths (record key ``path``): stream, graph, graph_nopdl (the same graph captured without
programmatic dependent launch), graph_copy, graph_update, graph_update2 (input and output re-bound every step: a prepared two-name Binding applied), graph_indirect / graph_indirect_mapped (kernels read x and out through a pointer table the graph refreshes from pinned memory / read in pinned memory), graph_exec_update, torch_eager, torch_graph, torch_graph_copy, torch_graph_rebind (torch's graph adopted, our exec, input and output moved by address every step), cupy_eager, cupy_graph, floor_sync,
floor_empty_kernel, floor_empty_graph. Every path's output is checked before it is timed.

Clocks, never mixed (each ``{"median", "p10", "p90"}`` in microseconds):
``sync_us`` per-iteration wall time with a synchronize (the seed's method), ``host_us`` pipelined
host time per step (N steps, one sync), ``device_us`` CUDA events around each step.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import ops
from ..graphs.capture import Capture, capture_plan
from ..models.tinyblock import TinyBlock
from ..runtime.device import get_device
from ..runtime.errors import LayoutError
from ..runtime.launch import ARG_DTYPES
from ..runtime.memory import DeviceArray, DeviceBuffer
from ..runtime.stream import Stream
from ..runtime.timing import device_us, pipelined_us, stats, synced_us
from ..updates.indirect import IndirectGraph
from ..updates.manager import ExecUpdateManager
from ..updates.static import StaticGraph
from . import command
from .progress import SweepProgress
from .provenance import environment

FULL = {"layers": (1, 8, 64), "width": (128, 1024, 4096), "batch": (1, 8, 64)}
QUICK = {"layers": (1, 64), "width": (128, 1024), "batch": (1, 8)}
FORMS = ("unfused", "fused", "block")  # block only where it fits (width <= 256, % 4)


def _clocks(fn, stream: Stream, est_us: float, budget_s: float) -> dict:
    """All three clocks for ``fn``, rounds scaled so each clock takes about ``budget_s``."""
    n = int(max(20, min(300, budget_s * 1e6 / max(est_us, 1.0))))
    return {
        "sync_us": stats(synced_us(fn, stream, rounds=n, warmup=5)),
        "host_us": stats(pipelined_us(fn, stream, steps=max(10, n // 5), repeats=5, warmup=5)),
        "device_us": stats(device_us(fn, stream, rounds=max(20, n // 2), warmup=5)),
    }


def _estimate_us(fn, stream: Stream) -> float:
    fn()
    stream.synchronize()
    t0 = time.perf_counter()
    fn()
    stream.synchronize()
    return (time.perf_counter() - t0) * 1e6


class Runner:
    """Every launch path of the TinyBlock, set up, checked and measured in one process.

    Hooks for a runner that does something else with the same paths (``rawgraph trace``):
    :meth:`clocks` (what is done with a path's checked step function), :meth:`capture` (how a
    plan becomes a graph), :meth:`wants` (which of the optional paths are set up at all) and
    :meth:`host_loop_us` (the host-time loops)."""

    stream: Stream

    def __init__(self, budget_s: float, out_dir: Path, torch_ok: bool, cupy_ok: bool):
        self.dev = get_device()
        self.stream = Stream()
        self.budget_s = budget_s
        self.records: list[dict] = []
        self.findings: list[str] = []
        self.torch = self._import("torch") if torch_ok else None
        self.cupy = self._import("cupy") if cupy_ok else None
        if self.torch is not None and not self.torch.cuda.is_available():
            self.torch = None
        if self.torch is not None:
            self.torch.backends.cuda.matmul.allow_tf32 = False
            self.torch.backends.cudnn.allow_tf32 = False
        self.out_dir = out_dir

    def clocks(self, fn, stream: Stream, est_us: float, budget_s: float) -> dict:
        """The three clocks of one path's step function (handed to :meth:`record`)."""
        return _clocks(fn, stream, est_us, budget_s)

    def capture(self, plan, stream: Stream, warmup: bool = True):
        """A plan captured into a graph (:func:`~rawgraph.graphs.capture.capture_plan`)."""
        return capture_plan(plan, stream, warmup=warmup)

    def host_loop_us(self, calls: list, loops: int = 200) -> dict | None:
        """Host time per call of ``calls`` (functions of no argument) made in order, alone, no
        launch: ``loops`` samples of the whole list, as :func:`~rawgraph.runtime.timing.stats`."""
        samples = []
        for _ in range(loops):
            t0 = time.perf_counter()
            for call in calls:
                call()
            samples.append((time.perf_counter() - t0) * 1e6 / len(calls))
        return stats(samples)

    @staticmethod
    def _import(name: str):
        try:
            return __import__(name)
        except Exception:
            return None

    def record(self, path, form, layers, width, batch, clocks=None, **extra) -> None:
        rec = {
            "path": path,
            "form": form,
            "layers": layers,
            "width": width,
            "batch": batch,
            "sync_us": None,
            "host_us": None,
            "device_us": None,
        }
        if clocks:
            rec.update(clocks)
        rec.update(extra)
        self.records.append(rec)
        med = rec["sync_us"]["median"] if rec["sync_us"] else float("nan")
        print(f"  {path:18s} {str(form):8s} L{layers:<3d} w{width:<5d} b{batch:<3d} sync {med:9.2f} us", flush=True)

    # -- floors -------------------------------------------------------------------------------
    def floors(self) -> None:
        s = self.stream
        self.record("floor_sync", None, 0, 0, 0, self.clocks(lambda: None, s, 5, self.budget_s))
        empty = ops.empty(self.dev)
        self.record("floor_empty_kernel", None, 0, 0, 0, self.clocks(lambda: empty(s), s, 8, self.budget_s))
        with Capture(s) as cap:
            cap.launch(empty)
        exe = cap.captured.instantiate()
        self.record("floor_empty_graph", None, 0, 0, 0, self.clocks(lambda: exe.launch(s), s, 8, self.budget_s))
        exe.close()
        cap.captured.close()

    # -- rawgraph paths -----------------------------------------------------------------------
    def rawgraph_paths(self, form: str, layers: int, width: int, batch: int) -> np.ndarray:
        """The TinyBlock's paths (:meth:`model_paths`, every output equal to the stream path's to
        the bit), with ``graph_nopdl`` where the block chains with PDL and the indirect paths for
        the forms whose kernels read x and out through pointer slots; returns the reference output.
        """
        model = TinyBlock(width, batch, layers, seed=1234, form=form)
        # graph_nopdl: the same form and weights (same seed) in plain stream order
        plain = (
            TinyBlock(width, batch, layers, seed=1234, form=form, pdl=False)
            if model.pdl and self.wants("graph_nopdl")
            else None
        )
        try:
            ref, xs = self.model_paths(
                model, (form, layers, width, batch), plain=plain, indirect=form in ("fused", "block"), exact=True
            )
        finally:
            if plain is not None:
                plain.close()
        self._last = (model, [(w1, w2) for w1, w2 in model.weights], xs, ref)
        return ref

    def model_paths(
        self,
        model: Any,
        key: tuple[Any, int, int, int],
        plain: Any = None,
        indirect: bool | None = None,
        exact: bool = True,
    ) -> tuple[np.ndarray, list[DeviceBuffer]]:
        """Every rawgraph launch path of a row-wise ``model`` (its ``plan``, ``batch``, ``width``
        only), set up, checked on one input against the stream path's output, then handed to
        :meth:`clocks` and :meth:`record` under ``key`` (form, layers, width, batch).

        ``plain``: the same model without programmatic dependent launch (``graph_nopdl``), if any.
        ``indirect``: run the indirect paths (True), leave them out (False), or try them and leave
        them out with a finding where the model's kernels cannot read x and out through pointer
        slots (None). ``exact``: an output that differs from the stream path's raises; else it is a
        finding (a user's kernels may differ run to run). Returns the reference output and the two
        inputs.
        """
        s = self.stream
        form, layers, width, batch = key
        where = f"({form} L{layers} w{width} b{batch})"
        shape = (model.batch, model.width)
        rng = np.random.default_rng()
        xs = [DeviceBuffer.from_numpy(rng.standard_normal(shape, dtype=np.float32)) for _ in range(2)]
        outs = [DeviceBuffer(shape) for _ in range(9)]
        plan = model.plan(xs[0], outs[0])
        graph = self.capture(plan, s, warmup=True)
        # capture time measured again without the warm-up run inside it
        t0 = time.perf_counter()
        graph_b = self.capture(model.plan(xs[1], outs[0]), s, warmup=False)
        capture_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        exe = graph.instantiate()
        instantiate_ms = (time.perf_counter() - t0) * 1e3
        static = StaticGraph(model, s)
        # graph_update: its own exec, the input re-bound between two buffers every step
        g_upd = self.capture(model.plan(xs[0], outs[2]), s, warmup=False)
        mgr = ExecUpdateManager(g_upd, g_upd.instantiate())
        # graph_update2: input and output re-bound together every step, between two pairs
        g_upd2 = self.capture(model.plan(xs[0], outs[5]), s, warmup=False)
        mgr2 = ExecUpdateManager(g_upd2, g_upd2.instantiate())
        # graph_exec_update: whole-graph update alternating between graphs captured on xs[0] / xs[1]
        whole_update = self.wants("graph_exec_update")
        g_w0 = self.capture(model.plan(xs[0], outs[3]), s, warmup=False) if whole_update else None
        g_w1 = self.capture(model.plan(xs[1], outs[3]), s, warmup=False) if whole_update else None
        exe_w = g_w0.instantiate() if g_w0 is not None else None
        g_plain = self.capture(plain.plan(xs[1], outs[4]), s, warmup=True) if plain is not None else None
        exe_plain = g_plain.instantiate() if g_plain is not None else None

        # -- correct before timed: every path on xs[1], equal to the stream path's output
        for o in (*outs, static.static_output):
            o.poison(s)
        plan_b = model.plan(xs[1], outs[1])
        plan_b.run(s)
        ref = outs[1].to_numpy()
        exe_b = graph_b.instantiate()
        exe_b.launch(s)
        static(xs[1], s)
        mgr.bind("x", xs[1])
        mgr.launch(s)
        mgr2.apply(mgr2.prepare({"x": xs[1], "out": outs[6]}))
        mgr2.launch(s)
        if exe_w is not None:
            exe_w.update(g_w1)
            exe_w.launch(s)
        if exe_plain is not None:
            exe_plain.launch(s)
        s.synchronize()
        checks = [
            ("graph", outs[0]),
            ("graph_copy", static.static_output),
            ("graph_update", outs[2]),
            ("graph_update2", outs[6]),
        ]
        if exe_w is not None:
            checks.append(("graph_exec_update", outs[3]))
        if exe_plain is not None:
            checks.append(("graph_nopdl", outs[4]))
        for name, buf in checks:
            self._agree(name, buf.to_numpy(), ref, exact, where)
        exe_b.close()

        est = _estimate_us(lambda: plan.run(s), s)
        self.record("stream", *key, self.clocks(lambda: plan.run(s), s, est, self.budget_s))
        self.record(
            "graph",
            *key,
            self.clocks(lambda: exe.launch(s), s, est, self.budget_s),
            capture_ms=capture_ms,
            instantiate_ms=instantiate_ms,
            pdl=getattr(model, "pdl", None),
        )
        if exe_plain is not None:
            self.record("graph_nopdl", *key, self.clocks(lambda: exe_plain.launch(s), s, est, self.budget_s), pdl=False)
        self.record("graph_copy", *key, self.clocks(lambda: static(xs[0], s), s, est, self.budget_s))
        st = {"i": 0}

        def upd():
            st["i"] ^= 1
            mgr.bind("x", xs[st["i"]])
            mgr.launch(s)

        self.record("graph_update", *key, self.clocks(upd, s, est, self.budget_s))
        pairs = [mgr2.prepare({"x": xs[0], "out": outs[5]}), mgr2.prepare({"x": xs[1], "out": outs[6]})]

        def upd2():
            st["i"] ^= 1
            mgr2.apply(pairs[st["i"]])
            mgr2.launch(s)

        self.record("graph_update2", *key, self.clocks(upd2, s, est, self.budget_s))
        if exe_w is not None:
            gw = [g_w0, g_w1]

            def whole():
                st["i"] ^= 1
                exe_w.update(gw[st["i"]])
                exe_w.launch(s)

            self.record("graph_exec_update", *key, self.clocks(whole, s, est, self.budget_s))
        tables = (("device", "graph_indirect"), ("mapped", "graph_indirect_mapped"))
        for place, name in [(p, n) for p, n in tables if self.wants(n) and indirect is not False]:
            try:
                ind = IndirectGraph(model, xs[0], outs[7], s, table=place)
            except LayoutError as exc:
                if indirect:
                    raise
                self.findings.append(
                    f"graph_indirect and graph_indirect_mapped left out {where}: the indirect graph needs kernels "
                    f"that read x and out through a pointer slot (rawgraph's matmul and block kernels): {exc}"
                )
                break
            ipairs = [ind.prepare(xs[0], outs[7]), ind.prepare(xs[1], outs[8])]
            outs[8].poison(s)
            ind.apply(ipairs[1])
            ind.launch(s)
            self._agree(name, outs[8].to_numpy(s), ref, exact, where)

            def indirect_step(ind=ind, ipairs=ipairs):
                st["i"] ^= 1
                ind.apply(ipairs[st["i"]])
                ind.launch(s)

            self.record(name, *key, self.clocks(indirect_step, s, est, self.budget_s), table=place)
            ind.close()
        s.synchronize()
        mgr.close()
        mgr2.close()
        for obj in (
            exe,
            exe_w,
            mgr.exec,
            mgr2.exec,
            static,
            graph,
            graph_b,
            g_upd,
            g_upd2,
            g_w0,
            g_w1,
            exe_plain,
            g_plain,
        ):
            if obj is not None:
                obj.close()
        for o in outs:
            o.close()
        return ref, xs

    def wants(self, path: str) -> bool:
        """Whether ``path`` is to be set up at all (every path, here)."""
        return True

    def _agree(self, path: str, got: np.ndarray, ref: np.ndarray, exact: bool, where: str) -> None:
        """``path``'s output against the stream path's. ``exact``: equal to the bit, a NaN
        anywhere included (the poison left where nothing wrote), else an ``AssertionError``.
        Otherwise a finding where they differ (NaN where both left the poison is no difference)."""
        if exact:
            if not np.array_equal(got, ref):
                raise AssertionError(f"{path} differs from stream output {where}")
            return
        differ = ~((got == ref) | (np.isnan(got) & np.isnan(ref)))
        if not differ.any():
            return
        both = differ & np.isfinite(got) & np.isfinite(ref)
        worst = float(np.abs(got[both].astype(np.float64) - ref[both]).max()) if both.any() else float("nan")
        self.findings.append(
            f"{path}: {int(differ.sum())} of {ref.size} output values differ from the stream path's {where} "
            f"(max |difference| {worst:.3g} where both are finite); measured all the same"
        )

    # -- torch --------------------------------------------------------------------------------
    def torch_paths(
        self, layers: int, width: int, batch: int, model: TinyBlock, x_buf: DeviceBuffer, ref: np.ndarray
    ) -> None:
        torch = self.torch
        if torch is None:
            return
        ws = [(torch.as_tensor(w1, device="cuda"), torch.as_tensor(w2, device="cuda")) for w1, w2 in model.weights]
        x_in = torch.as_tensor(x_buf, device="cuda").clone()

        def block(x):
            for w1, w2 in ws:
                x = torch.relu(x @ w1) @ w2 + x
            return x

        key = (None, layers, width, batch)
        tstream = torch.cuda.Stream()
        with torch.inference_mode(), torch.cuda.stream(tstream):
            got = block(x_in).cpu().numpy()
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            if err > 1e-4:
                raise AssertionError(f"torch differs from rawgraph by {err:.2e}")
            rs = Stream.from_external(tstream)  # rawgraph's clocks on torch's stream
            est = _estimate_us(lambda: block(x_in), rs)
            self.record(
                "torch_eager", *key, self.clocks(lambda: block(x_in), rs, est, self.budget_s), rel_err_vs_rawgraph=err
            )
            static_in = x_in.clone()
            for _ in range(3):
                block(static_in)
            tstream.synchronize()
            g = torch.cuda.CUDAGraph()
            t0 = time.perf_counter()
            with torch.cuda.graph(g, stream=tstream):
                static_out = block(static_in)
            cap_ms = (time.perf_counter() - t0) * 1e3
            g.replay()
            tstream.synchronize()
            if not np.allclose(static_out.cpu().numpy(), got, rtol=1e-5, atol=1e-5):
                raise AssertionError("torch graph replay differs from torch eager")
            self.record("torch_graph", *key, self.clocks(g.replay, rs, est, self.budget_s), capture_ms=cap_ms)
            src = x_in.clone()

            def copy_replay():  # timed before the `del g` below (pyflakes reads it as undefining g)
                static_in.copy_(src)
                g.replay()  # noqa: F821

            self.record("torch_graph_copy", *key, self.clocks(copy_replay, rs, est, self.budget_s))
            try:
                self._torch_graph_rebind(torch, block, static_in, static_out, tstream, rs, key, est)
            except Exception as exc:  # torch < 2.8 (no keep_graph), or a refusal: reported, not fatal
                self.findings.append(
                    f"torch_graph_rebind skipped at L{layers} w{width} b{batch}: {type(exc).__name__}: {exc}"
                )
            del g

    def _torch_graph_rebind(self, torch, block, static_in, ref_out, tstream, rs, key, est) -> None:
        """torch's graph adopted (``keep_graph=True``), our own exec of it, its static input and
        output moved by address to one of two (input, output) pairs before every launch."""
        from ..updates.adopt import from_torch

        x0 = static_in.clone()
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g, stream=tstream):
            out0 = block(x0)
        adopted = from_torch(g)
        reb = adopted.rebinder()
        xs = [static_in.clone(), static_in.clone()]
        outs = [torch.empty_like(out0), torch.empty_like(out0)]
        pairs = [reb.prepare({x0: xs[i], out0: outs[i]}) for i in range(2)]
        for i in range(2):
            outs[i].fill_(float("nan"))
            reb.apply(pairs[i])
            reb.launch(rs)
        tstream.synchronize()
        for i in range(2):  # the same kernels on the same values: equal to torch's replay to the bit
            if not torch.equal(outs[i], ref_out):
                raise AssertionError("torch graph rebound by address differs from torch's own replay")
        st = {"i": 0}

        def rebind_launch():
            st["i"] ^= 1
            reb.apply(pairs[st["i"]])
            reb.launch(rs)

        form, layers, width, batch = key
        clocks = self.clocks(rebind_launch, rs, est, self.budget_s)
        # The apply alone (host clock, no launch): when it is longer than the graph's device time
        # the path is host-bound, and the event clock then counts the host's gaps too.
        applies = self.host_loop_us([functools.partial(reb.apply, pairs[i]) for i in (0, 1) * 5])
        self.record(
            "torch_graph_rebind",
            form,
            layers,
            width,
            batch,
            clocks,
            apply_us=applies,
            nodes=len(reb.nodes),
            nodes_rebound=len(pairs[0].kernels) + len(pairs[0].memory),
        )
        tstream.synchronize()
        reb.exec.close()
        adopted.close()
        del g

    # -- cupy ---------------------------------------------------------------------------------
    def cupy_paths(
        self, layers: int, width: int, batch: int, model: TinyBlock, x_buf: DeviceBuffer, ref: np.ndarray
    ) -> None:
        cp = self.cupy
        if cp is None:
            return
        ws = [(cp.asarray(w1), cp.asarray(w2)) for w1, w2 in model.weights]
        x = cp.asarray(x_buf).copy()
        key = (None, layers, width, batch)
        cstream = cp.cuda.Stream(non_blocking=True)

        def block():
            y = x
            for w1, w2 in ws:
                y = cp.maximum(y @ w1, 0) @ w2 + y
            return y

        with cstream:
            got = cp.asnumpy(block())
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            if err > 1e-4:
                raise AssertionError(f"cupy differs from rawgraph by {err:.2e}")
            rs = Stream.from_external(cstream)
            est = _estimate_us(block, rs)
            self.record("cupy_eager", *key, self.clocks(block, rs, est, self.budget_s), rel_err_vs_rawgraph=err)
            try:
                cstream.begin_capture()
                try:
                    block()
                finally:
                    cstream.end_capture()
                self.findings.append("CuPy captured its cuBLAS matmul (not expected)")
            except Exception as exc:  # NotImplementedError on CuPy 14.2: cuBLAS not capturable
                msg = f"CuPy cannot capture its cuBLAS matmul: {type(exc).__name__}: {exc}"
                if msg not in self.findings:
                    self.findings.append(msg)
            self._cupy_rawkernel_graph(cp, cstream, rs, key, model, x, got, est)

    def _cupy_rawkernel_graph(self, cp, cstream, rs, key, model, x, ref_cupy, est) -> None:
        """The same block from rawgraph's own .cu sources as CuPy RawKernels, captured by CuPy."""
        from ..ops import matmul_expr, matmul_file, matmul_shape, resolve_precision
        from ..runtime.module import kernel_source

        # the model's own kernels: its precision, resolved for this product on this device
        precision = resolve_precision(model.precision, model.batch, model.width, model.width, self.dev)
        shape = matmul_shape(
            model.batch,
            model.width,
            model.width,
            self.dev.info.multiprocessors,
            clusters=ops.has_clusters(self.dev),
            smem_limit=self.dev.info.smem_per_block_optin,
            precision=precision,
        )
        exprs = [matmul_expr("relu", shape), matmul_expr("add", shape)]
        # CuPy's own NVRTC builds it for this GPU; launched plainly (no PDL), clusters come from
        # the kernels' __cluster_dims__.
        mod = cp.RawModule(code=kernel_source(matmul_file(shape)), options=("-std=c++17",), name_expressions=exprs)
        k_relu, k_add = (mod.get_function(e) for e in exprs)
        ws = [(cp.asarray(w1), cp.asarray(w2)) for w1, w2 in model.weights]
        a = cp.empty_like(x)
        acts = [cp.empty_like(x), cp.empty_like(x)]
        out = cp.empty_like(x)
        # The argument list comes from rawgraph's own launch of the same cut, so it follows the
        # kernels' parameters: CuPy passes exactly the tuple it is given, and the driver reads as
        # many parameters as the kernel declares (a short tuple made it read past the end).
        views = {
            n: DeviceArray(int(arr.data.ptr), arr.shape, np.dtype(np.float32), arr)
            for n, arr in (("x", x), ("W", ws[0][0]), ("y", a))
        }
        spec_launch = ops.matmul(self.dev, views, "x", "W", "y", "relu", shape=shape, precision=precision)
        spec = [
            (n, k, None if k == "ptr" else ARG_DTYPES[k].type(spec_launch.args[n])) for n, k in spec_launch.args.spec
        ]

        def args(**arrays):
            return tuple(arrays[n] if n in arrays else (np.uint64(0) if v is None else v) for n, k, v in spec)

        grid, block = shape.grid, (shape.threads, 1, 1)
        smem = spec_launch.shared_mem  # the cut's tiles and the residency pad, as rawgraph launches it
        for k in (k_relu, k_add):
            if smem > k.max_dynamic_shared_size_bytes:
                k.max_dynamic_shared_size_bytes = smem

        def run():
            src = x
            for i, (w1, w2) in enumerate(ws):
                dst = out if i == len(ws) - 1 else acts[i % 2]
                k_relu(grid, block, args(x=src, W=w1, y=a), shared_mem=smem)
                k_add(grid, block, args(x=a, W=w2, y=dst, r=src), shared_mem=smem)
                src = dst

        run()
        cstream.synchronize()
        cstream.begin_capture()
        run()
        graph = cstream.end_capture()
        out.fill(cp.nan)
        graph.launch(cstream)
        cstream.synchronize()
        got = cp.asnumpy(out)
        err = float(np.linalg.norm(got - ref_cupy) / np.linalg.norm(ref_cupy))
        if not err < 1e-4:
            raise AssertionError(f"cupy RawKernel graph differs from the cuBLAS block by {err:.2e}")
        self.record(
            "cupy_graph",
            key[0],
            key[1],
            key[2],
            key[3],
            self.clocks(lambda: graph.launch(cstream), rs, est, self.budget_s),
            note="CuPy RawKernels from kernels/matmul.cu (the fused form's kernels, no PDL)",
            rel_err_vs_cupy_eager=err,
        )


def env_info(runner: Runner) -> dict:
    return environment(torch=getattr(runner.torch, "__version__", None), cupy=getattr(runner.cupy, "__version__", None))


DESCRIPTION = (
    "Launch-path benchmark: the same TinyBlock work through every way of launching it (stream, "
    "graph, copy + replay, exec-update + replay, PyTorch, CuPy), in one process. Writes "
    "OUT/NAME.json and plots; prints the table and the targets."
)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``rawgraph bench paths`` (parsing them needs no GPU)."""
    p = command.parser("rawgraph bench paths", DESCRIPTION)
    p.add_argument("--quick", action="store_true", help="the quick grid: layers 1/64, width 128/1024, batch 1/8")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON and the plots")
    p.add_argument("--name", default=None, help="file stem (default: launch_paths, or launch_paths_quick with --quick)")
    p.add_argument(
        "--budget",
        type=command.positive_float,
        default=0.15,
        help="seconds per clock per path (the rounds scale to it)",
    )
    p.add_argument("--no-torch", action="store_true", help="leave out the PyTorch paths")
    p.add_argument("--no-cupy", action="store_true", help="leave out the CuPy paths")
    p.add_argument("--no-micro", action="store_true", help="skip the microcost fits")
    p.add_argument(
        "--layers", type=command.positive_int, nargs="+", help="depths to sweep (default: the full or quick grid's)"
    )
    p.add_argument(
        "--width", type=command.positive_int, nargs="+", help="widths to sweep (default: the full or quick grid's)"
    )
    p.add_argument(
        "--batch", type=command.positive_int, nargs="+", help="batch sizes to sweep (default: the full or quick grid's)"
    )
    return p


def collect(args: argparse.Namespace) -> dict:
    """Run the launch-path sweep; write the JSON and draw the plots; return the result."""
    grid = dict(QUICK if args.quick else FULL)
    for k in ("layers", "width", "batch"):
        if getattr(args, k):
            grid[k] = tuple(getattr(args, k))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.name or ("launch_paths_quick" if args.quick else "launch_paths")
    if not args.no_torch:
        command.optional("torch", "torch", "the PyTorch paths")
    if not args.no_cupy:
        command.optional("cupy", "cupy", "the CuPy paths")
    runner = Runner(args.budget, out_dir, not args.no_torch, not args.no_cupy)
    t_start = time.perf_counter()
    print(f"rawgraph bench on {runner.dev.info.name}: {grid}", flush=True)
    runner.floors()
    micro = None
    if not args.no_micro:
        from .microcosts import measure

        micro = measure(torch_ok=runner.torch is not None)
    configs = [(l, w, b) for l in grid["layers"] for w in grid["width"] for b in grid["batch"]]
    bar = SweepProgress(len(configs), "launch paths", plots=True)
    for l, w, b in bar.over(configs):
        bar.step(f"layers={l} width={w} batch={b}")
        try:
            for form in FORMS:
                if form != "block" or ops.block_fits(w, runner.dev):
                    runner.rawgraph_paths(form, l, w, b)
        except Exception as exc:  # report and go on: one broken point must not lose the sweep
            runner.findings.append(f"rawgraph paths failed at L{l} w{w} b{b}: {type(exc).__name__}: {exc}")
            print(f"  FAILED: {exc}", flush=True)
            continue
        model, _w, xs, ref = runner._last
        try:
            runner.torch_paths(l, w, b, model, xs[1], ref)
        except Exception as exc:
            runner.findings.append(f"torch paths failed at L{l} w{w} b{b}: {type(exc).__name__}: {exc}")
        try:
            runner.cupy_paths(l, w, b, model, xs[1], ref)
        except Exception as exc:
            runner.findings.append(f"cupy paths failed at L{l} w{w} b{b}: {type(exc).__name__}: {exc}")
        model.close()
        for x in xs:
            x.close()
    result = {
        "env": env_info(runner),
        "grid": grid,
        "findings": runner.findings,
        "microcosts": micro,
        "records": runner.records,
        "wall_s": time.perf_counter() - t_start,
    }
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=1))
    from .report import plots

    for png in plots(result, out_dir, name):
        print(f"plot: {png}")
    print(f"json: {path} ({time.perf_counter() - t_start:.0f}s)")
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the launch-path sweep (options as :func:`build_parser` reads them); write the JSON and
    plots; the table and targets (or, with ``--json``, the result) on stdout, progress on stderr.
    Returns the exit status (0)."""
    from .report import render

    return command.run_suite(build_parser().parse_args(argv), collect, render)


if __name__ == "__main__":
    sys.exit(main())
