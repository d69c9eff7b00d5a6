"""``rawgraph trace``: the TinyBlock through every launch path under one tracer, written as a Chrome
trace (Perfetto, ``chrome://tracing``), a PNG timeline and the latency model fitted from it.

The paths are the launch-path benchmark's own (:class:`rawgraph.bench.launch_paths.Runner`): the
same set-up, the same correctness checks, the same step functions. Only the timing differs: the
runner's :meth:`~rawgraph.bench.launch_paths.Runner.clocks` hook hands the step function back
instead of timing it, and :meth:`TracingRunner.record` runs a few warm-up steps and then ``--steps``
traced steps of each path (back to back, one synchronize after them, as a server would issue
them). Everything else the runner does (capture, instantiate, the checks) is traced too, outside
any step: the capture phase is on the timeline. Every graph the runner captures (its
:meth:`~rawgraph.bench.launch_paths.Runner.capture` hook) is labelled with its node map (:meth:`Tracer.label_graph <rawgraph.trace.tracer.Tracer.label_graph>`).

PyTorch launches through the CUDA runtime, which rawgraph does not wrap: its paths have step
spans and (with CUPTI) device spans, no host spans of their own launches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .. import ops
from ..trace import Tracer
from . import command
from .launch_paths import Runner, env_info

# The paths traced by default, and every path the runner has (the rest by --paths).
DEFAULT_PATHS = (
    "stream",
    "graph",
    "graph_copy",
    "graph_update",
    "graph_update2",
    "graph_indirect",
    "torch_eager",
    "torch_graph",
    "torch_graph_rebind",
)
ALL_PATHS = DEFAULT_PATHS + ("graph_nopdl", "graph_exec_update", "graph_indirect_mapped", "torch_graph_copy")
_DEFERRED = "rawgraph.trace: step function"


class TracingRunner(Runner):
    """The launch-path runner with each path's step function run under ``tracer`` instead of
    timed by the three clocks."""

    def __init__(self, tracer: Tracer, steps: int, warmup: int, paths: tuple[str, ...], out_dir: Path, torch_ok: bool):
        super().__init__(0.0, out_dir, torch_ok, cupy_ok=False)
        self.tracer = tracer
        self.steps = steps
        self.warmup = warmup
        self.paths = paths
        self.traced: list[str] = []
        self.skipped: list[str] = []
        self.captured = 0

    def clocks(self, fn, stream, est_us, budget_s) -> dict:
        return {_DEFERRED: (fn, stream)}  # run by record(), under the tracer

    def host_loop_us(self, calls, loops=200):
        return None  # a host-time loop is not a step: it would fill the trace with its calls

    def capture(self, plan, stream, warmup=True):
        graph = super().capture(plan, stream, warmup)
        self.tracer.label_graph(graph, f"capture_plan {self.captured}")
        self.captured += 1
        return graph

    def record(self, path, form, layers, width, batch, clocks=None, **extra) -> None:
        job = (clocks or {}).get(_DEFERRED)
        if job is None or path not in self.paths:
            self.skipped.append(path)
            return
        fn, stream = job
        for _ in range(self.warmup):
            fn()
        stream.synchronize()
        with self.tracer.path(path):
            for _ in range(self.steps):
                with self.tracer.step(stream):
                    fn()
            stream.synchronize()
        self.traced.append(path)
        self.records.append({"path": path, "form": form, "layers": layers, "width": width, "batch": batch})
        print(f"  traced {path}: {self.warmup} warm-up + {self.steps} steps", flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Trace every selected path of the TinyBlock (options as :func:`build_parser` reads them);
    write the JSON and the PNG; return the results document."""
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.name or f"trace_w{args.width}_b{args.batch}_L{args.layers}_{args.form}"
    paths = tuple(args.paths) if args.paths else DEFAULT_PATHS
    torch_ok = not args.no_torch and any(p.startswith("torch") for p in paths)
    if torch_ok:
        torch_ok = command.optional("torch", "torch", "the PyTorch paths") is not None
    findings: list[str] = []
    if args.form == "unfused" and any(p.startswith("graph_indirect") for p in paths):
        findings.append("graph_indirect runs for the fused and block forms only (kernels reading x and out by slot)")
    tracer = Tracer(device=args.device_source)
    runner = TracingRunner(tracer, args.steps, args.warmup, paths, out_dir, torch_ok)
    print(f"rawgraph trace on {runner.dev.info.name}: TinyBlock w{args.width} b{args.batch} L{args.layers} {args.form}")
    if args.form == "block" and not ops.block_fits(args.width, runner.dev):
        raise SystemExit(f"rawgraph trace: the block form does not fit width {args.width} on this GPU")
    with tracer:
        runner.rawgraph_paths(args.form, args.layers, args.width, args.batch)
        model, _weights, xs, ref = runner._last
        try:
            runner.torch_paths(args.layers, args.width, args.batch, model, xs[1], ref)
        except Exception as exc:  # reported, not fatal: the rawgraph paths are traced already
            findings.append(f"torch paths failed: {type(exc).__name__}: {exc}")
        runner.stream.synchronize()
    model.close()
    for x in xs:
        x.close()
    findings += runner.findings
    json_path = tracer.write(out_dir / f"{name}.json")
    print(f"json: {json_path}")
    png_path = None
    if not args.no_png:
        if command.optional("matplotlib", "trace", "the PNG timeline") is not None:
            from ..trace.timeline import draw

            doc = json.loads(json_path.read_text())
            title = (
                f"TinyBlock w{args.width} b{args.batch} L{args.layers} {args.form}: host launches against device work"
            )
            png_path = draw(doc, out_dir / f"{name}.png", steps=args.png_steps, title=title)
            print(f"png: {png_path}")
    model_fit = tracer.latency_model()
    return {
        "json": str(json_path),
        "png": None if png_path is None else str(png_path),
        "device_source": tracer.device_source,
        "device_source_reason": tracer.device_source_reason,
        "paths_traced": runner.traced,
        "paths_skipped": sorted(set(runner.skipped)),
        "latency_model": model_fit.to_dict(),
        "table": model_fit.table(),
        "findings": findings,
        "notes": tracer.notes,
        "env": env_info(runner),
        "wall_s": time.perf_counter() - t_start,
    }


def render(result: dict[str, Any]) -> str:
    lines = [result["table"], f"trace: {result['json']} (open it in ui.perfetto.dev: Open trace file)"]
    if result["png"]:
        lines.append(f"timeline: {result['png']}")
    if result["device_source"] != "cupti":
        lines.append(f"device spans from {result['device_source']}: {result['device_source_reason']}")
    lines += [f"note: {f}" for f in result["findings"] + result["notes"]]
    return "\n".join(lines)


DESCRIPTION = (
    "Trace the TinyBlock through every launch path (stream, graph, copy + replay, bind + replay, prepared "
    "apply + replay, indirect, PyTorch eager and graph): host spans of rawgraph's driver calls, device spans "
    "from CUPTI (or CUDA events without it). Writes OUT/NAME.json (Chrome trace: open it in ui.perfetto.dev) "
    "and OUT/NAME.png; prints the latency model fitted from the trace. Needs a GPU."
)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of ``rawgraph trace`` besides the model's (parsing them needs no GPU)."""
    p.add_argument("--steps", type=command.positive_int, default=5, help="traced steps per path")
    p.add_argument("--warmup", type=command.nonnegative_int, default=3, help="untraced steps before them")
    p.add_argument(
        "--paths",
        nargs="+",
        choices=ALL_PATHS,
        default=None,
        metavar="PATH",
        help=f"paths to trace, of {', '.join(ALL_PATHS)} (default: {' '.join(DEFAULT_PATHS)})",
    )
    p.add_argument(
        "--device-source",
        choices=("auto", "cupti", "events"),
        default="auto",
        help="device spans: CUPTI (cupti-python) where it loads, else CUDA events around each step",
    )
    p.add_argument("--out", default="traces", help="folder for the JSON and the PNG")
    p.add_argument("--name", default=None, help="file stem (default: trace_wW_bB_LL_FORM)")
    p.add_argument("--no-torch", action="store_true", help="leave out the PyTorch paths")
    p.add_argument("--no-png", action="store_true", help="write no PNG timeline")
    p.add_argument("--png-steps", type=command.positive_int, default=3, help="steps of each path in the PNG")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m rawgraph.bench.trace`` (the same options as ``rawgraph trace``)."""
    p = command.parser("rawgraph trace", DESCRIPTION)
    command.add_model_options(p, width=128, layers=2, form="unfused", batch=1)
    add_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Trace the paths; the latency model's table (or, with ``--json``, the results document) on
    stdout, progress on stderr. Returns the exit status (0)."""
    return command.run_suite(build_parser().parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
