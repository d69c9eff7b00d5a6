"""``rawgraph trace``: the TinyBlock, or a row-wise model of the user's (``--callable``), through
every launch path under one tracer, written as a Chrome trace (Perfetto, ``chrome://tracing``), a
PNG timeline and the latency model fitted from it.

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

A user's model (``--callable MODULE:NAME``, :func:`resolve_callable`): NAME is a model keeping the
row-wise protocol (:mod:`rawgraph.serving.protocol`; a :class:`~rawgraph.serving.FunctionModel`
over the user's own kernels is one) or a callable that makes one. It goes through the runner's
:meth:`~rawgraph.bench.launch_paths.Runner.model_paths`, the paths the TinyBlock takes, made from
the protocol alone (``plan``, ``batch``, ``width``), every output checked against the stream
path's before it is traced (a difference is a finding, not an error). What a protocol model
cannot give is left out, with the reason in the findings: ``graph_nopdl`` (the same model rebuilt without programmatic dependent launch,
which only the TinyBlock's constructor offers), the ``torch_*`` paths (a twin of the model in
PyTorch, which the runner writes from the TinyBlock's weights) and, for kernels that cannot read
``x`` and ``out`` through a pointer slot (any but rawgraph's matmul and block kernels),
``graph_indirect`` and ``graph_indirect_mapped``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from .. import ops
from ..serving.protocol import REQUIRED, check_model
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
# The keywords a --callable factory is given, those of them it names as parameters.
FACTORY_KEYWORDS = ("width", "batch", "layers", "form")
# Why a user's model has no such path (TracingRunner.user_model_paths).
_NOT_FOR_A_MODEL = {
    "graph_nopdl": "it needs the same model rebuilt without programmatic dependent launch, which only the "
    "TinyBlock's constructor offers",
    "torch": "they run a PyTorch twin of the model written from the TinyBlock's weights; a model of your own "
    "has none (trace your PyTorch code with rawgraph.trace.Tracer: its steps and, with CUPTI, its kernels)",
}


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

    def wants(self, path: str) -> bool:
        # a path not traced is not set up either: no driver calls of its own in the trace
        if path in self.paths:
            return True
        self.skipped.append(path)
        return False

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

    def user_model_paths(self, model: Any) -> None:
        """The launch paths of a user's row-wise ``model``: the runner's own
        (:meth:`~rawgraph.bench.launch_paths.Runner.model_paths`), the indirect ones where its
        kernels can read x and out through pointer slots, an output that differs from the stream
        path's a finding; the paths it cannot take are findings too, with the reason."""
        for group, why in _NOT_FOR_A_MODEL.items():
            left = [p for p in self.paths if p.startswith(group)]
            if left:
                self.findings.append(f"{', '.join(left)} not traced for a model of your own: {why}")
        _ref, xs = self.model_paths(model, ("callable", 0, model.width, model.batch), indirect=None, exact=False)
        for x in xs:
            x.close()


class CallableError(ValueError):
    """A ``--callable`` that names no row-wise model nor a callable making one: the message says
    what is wrong in one line (``rawgraph trace`` prints it and exits 2)."""


_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_STEP_FUNCTION = ("x", "out", "scratch", "rows", "stream")


def resolve_callable(spec: str) -> tuple[Any, str]:
    """The object ``spec`` names and what it is: ``(obj, "model")`` for a model keeping the
    row-wise protocol (:mod:`rawgraph.serving.protocol`), ``(obj, "factory")`` for a callable (a
    function, a class) whose required parameters are all among :data:`FACTORY_KEYWORDS`.

    ``spec`` is ``MODULE:NAME``, as ``python -m`` and uvicorn read it: ``MODULE`` is imported with
    the current directory first on ``sys.path``, ``NAME`` (dotted for an attribute of an attribute)
    is looked up in it. No GPU work here, unless the module does some when imported.

    Raises
    ------
    CallableError
        No colon, a module that cannot be imported, no such attribute, or an object of another
        kind; the message names which.
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise CallableError(
            f"--callable {spec!r}: give MODULE:NAME (a module importable from here, a colon, a name in it)"
        )
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        raise CallableError(
            f"--callable {spec!r}: {module_name!r} is a file path; give the module's name "
            "(run from its folder: mymodel.py is mymodel)"
        )
    if not _SPEC.match(module_name) or not _SPEC.match(attr):
        raise CallableError(f"--callable {spec!r}: MODULE and NAME must be dotted Python names")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CallableError(
                f"--callable {spec!r}: no module named {exc.name!r} in the current directory ({cwd}) or on sys.path"
            ) from None
        raise CallableError(
            f"--callable {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    except Exception as exc:
        raise CallableError(
            f"--callable {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            raise CallableError(f"--callable {spec!r}: {where} has no attribute {part!r}")
        obj = getattr(obj, part)
    if all(hasattr(obj, name) for name in REQUIRED):
        try:
            check_model(obj, spec)
        except Exception as exc:  # a width that is no width, a model already closed
            raise CallableError(f"--callable {spec!r}: {exc}") from None
        return obj, "model"
    if not callable(obj):
        missing = ", ".join(name for name in REQUIRED if not hasattr(obj, name))
        raise CallableError(
            f"--callable {spec!r} is of type {type(obj).__name__}: neither a row-wise model (rawgraph.serving.protocol; "
            f"it has no {missing}) nor a callable that makes one"
        )
    _check_factory(spec, obj)
    return obj, "factory"


def _factory_parameters(obj: Any) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): called with none
        return []


def _check_factory(spec: str, obj: Any) -> None:
    """A :class:`CallableError` unless every required parameter of ``obj`` is one rawgraph trace
    gives (:data:`FACTORY_KEYWORDS`, by name)."""
    params = _factory_parameters(obj)
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
        and p.kind is not inspect.Parameter.VAR_KEYWORD
        and (p.kind is inspect.Parameter.POSITIONAL_ONLY or p.name not in FACTORY_KEYWORDS)
    ]
    if not required:
        return
    if tuple(p.name for p in params[:5]) == _STEP_FUNCTION:
        raise CallableError(
            f"--callable {spec!r} is a step function fn(x, out, scratch, rows, stream), not a model: name a "
            "function that returns FunctionModel(fn, width, ...) (rawgraph.serving.FunctionModel) instead"
        )
    raise CallableError(
        f"--callable {spec!r} takes {', '.join(map(repr, required))}, which rawgraph trace cannot give: a factory is "
        f"called with those of {', '.join(FACTORY_KEYWORDS)} it names (--width, --batch, --layers, --form)"
    )


def make_model(spec: str, args: argparse.Namespace) -> tuple[Any, list[Any], dict[str, Any]]:
    """The row-wise model ``--callable`` names, for ``--batch`` rows: ``(model, what to close,
    the workload's description)``. A factory is called with those of ``--width``, ``--batch``,
    ``--layers``, ``--form`` it names as parameters; a model of another batch size is replaced by
    its ``with_batch(args.batch)``. A model the module holds is not closed (it is the module's)."""
    obj, kind = resolve_callable(spec)
    made: list[Any] = []
    given: dict[str, Any] = {}
    model = obj
    try:
        if kind == "factory":
            names = {p.name for p in _factory_parameters(obj) if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
            given = {k: getattr(args, k) for k in FACTORY_KEYWORDS if k in names}
            model = obj(**given)
            if callable(getattr(model, "close", None)):
                made.append(model)
            missing = [name for name in REQUIRED if not hasattr(model, name)]
            if missing:
                raise CallableError(
                    f"--callable {spec!r} returned a {type(model).__name__}, not a row-wise model "
                    f"(rawgraph.serving.protocol): it has no {', '.join(missing)}"
                )
            try:
                check_model(model, f"the model {spec} made")
            except TypeError as exc:
                raise CallableError(f"--callable {spec!r}: {exc}") from None
        if model.batch != args.batch:
            model = model.with_batch(args.batch)
            made.append(model)
    except BaseException:
        for m in reversed(made):
            m.close()
        raise
    workload = {
        "kind": "callable",
        "callable": spec,
        "object": kind,
        "given": given,
        "model": type(model).__qualname__,
        "repr": repr(model)[:200],
        "width": int(model.width),
        "batch": int(model.batch),
    }
    return model, made[::-1], workload


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Trace every selected path of the TinyBlock, or of the model ``--callable`` names (options
    as :func:`build_parser` reads them); write the JSON and the PNG; return the results
    document."""
    if getattr(args, "callable", None):
        return _run_callable(args)
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = tuple(args.paths) if args.paths else DEFAULT_PATHS
    torch_ok = not args.no_torch and any(p.startswith("torch") for p in paths)
    if torch_ok:
        torch_ok = command.optional("torch", "torch", "the PyTorch paths") is not None
    findings: list[str] = []
    if args.form == "unfused" and any(p.startswith("graph_indirect") for p in paths):
        findings.append("graph_indirect runs for the fused and block forms only (kernels reading x and out by slot)")
    workload = {"kind": "tinyblock", "width": args.width, "batch": args.batch, "layers": args.layers, "form": args.form}
    tracer = Tracer(device=args.device_source, workload=workload)
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
    name = args.name or f"trace_w{args.width}_b{args.batch}_L{args.layers}_{args.form}"
    title = f"TinyBlock w{args.width} b{args.batch} L{args.layers} {args.form}"
    return _finish(args, tracer, runner, findings + runner.findings, out_dir / name, title, t_start)


def _run_callable(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run` for ``--callable``: the model it names through :meth:`TracingRunner.user_model_paths`."""
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = tuple(p for p in (args.paths or DEFAULT_PATHS) if not (args.no_torch and p.startswith("torch")))
    tracer = Tracer(device=args.device_source)
    runner = TracingRunner(tracer, args.steps, args.warmup, paths, out_dir, torch_ok=False)
    made: list[Any] = []
    try:
        with tracer:  # the model's making (its kernels' loading, its weights' copies) is traced too
            model, made, tracer.workload = make_model(args.callable, args)
            print(
                f"rawgraph trace on {runner.dev.info.name}: {args.callable} ({type(model).__name__}, "
                f"width {model.width}, batch {model.batch})"
            )
            runner.user_model_paths(model)
            runner.stream.synchronize()
    finally:
        for obj in made:
            obj.close()
    stem = re.sub(r"[^\w.-]+", "_", args.callable.rpartition(":")[2])
    name = args.name or f"trace_{stem}_w{tracer.workload['width']}_b{tracer.workload['batch']}"
    title = f"{args.callable} w{tracer.workload['width']} b{tracer.workload['batch']}"
    return _finish(args, tracer, runner, runner.findings, out_dir / name, title, t_start)


def _finish(
    args: argparse.Namespace,
    tracer: Tracer,
    runner: TracingRunner,
    findings: list[str],
    stem: Path,
    title: str,
    t_start: float,
) -> dict[str, Any]:
    """Write the JSON (and the PNG) of a finished trace; the results document."""
    doc = tracer.to_chrome()
    env = env_info(runner)
    doc["metadata"]["environment"] = env  # commit, GPU, versions, date: what every results JSON records
    json_path = tracer.write(stem.with_name(stem.name + ".json"), doc)
    print(f"json: {json_path}")
    png_path = None
    if not args.no_png:
        if command.optional("matplotlib", "trace", "the PNG timeline") is not None:
            from ..trace.timeline import draw

            title = f"{title}: host launches against device work"
            png_path = draw(doc, stem.with_name(stem.name + ".png"), steps=args.png_steps, title=title)
            print(f"png: {png_path}")
    model_fit = tracer.latency_model()
    return {
        "json": str(json_path),
        "png": None if png_path is None else str(png_path),
        "workload": dict(tracer.workload),
        "device_source": tracer.device_source,
        "device_source_reason": tracer.device_source_reason,
        "paths_traced": runner.traced,
        "paths_skipped": sorted(set(runner.skipped)),
        "latency_model": model_fit.to_dict(),
        "table": model_fit.table(),
        "findings": findings,
        "notes": tracer.notes,
        "env": env,
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
    "Trace the TinyBlock, or with --callable a row-wise model of your own, through every launch path (stream, "
    "graph, copy + replay, bind + replay, prepared apply + replay, indirect, PyTorch eager and graph): host "
    "spans of rawgraph's driver calls, device spans from CUPTI (or CUDA events without it). Writes "
    "OUT/NAME.json (Chrome trace: open it in ui.perfetto.dev) and OUT/NAME.png; prints the latency model "
    "fitted from the trace. Needs a GPU. Any other code of yours: rawgraph.trace.Tracer from Python "
    "(docs/trace.md)."
)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of ``rawgraph trace`` besides the model's (parsing them needs no GPU; the
    ``--callable`` object is looked up after parsing, by :func:`check_callable`)."""
    p.add_argument(
        "--callable",
        default=None,
        metavar="MODULE:NAME",
        help="trace your own model instead of the TinyBlock: NAME in MODULE, imported with the current "
        "directory first on sys.path (as python -m does), is a model keeping the row-wise protocol "
        "(rawgraph.serving.protocol, e.g. a rawgraph.serving.FunctionModel) or a callable returning one, "
        "called with those of width, batch, layers, form it takes as parameters (from --width, --batch, "
        "--layers, --form); --batch rows are traced. No PyTorch or graph_nopdl paths for it, and "
        "graph_indirect only where its kernels read x and out through pointer slots (default: the TinyBlock)",
    )
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
    p.add_argument(
        "--name", default=None, help="file stem (default: trace_wW_bB_LL_FORM, with --callable trace_NAME_wW_bB)"
    )
    p.add_argument("--no-torch", action="store_true", help="leave out the PyTorch paths")
    p.add_argument("--no-png", action="store_true", help="write no PNG timeline")
    p.add_argument("--png-steps", type=command.positive_int, default=3, help="steps of each path in the PNG")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m rawgraph.bench.trace`` (the same options as ``rawgraph trace``)."""
    p = command.parser("rawgraph trace", DESCRIPTION)
    command.add_model_options(p, width=128, layers=2, form="unfused", batch=1)
    add_options(p)
    return p


def check_callable(args: argparse.Namespace) -> str | None:
    """None, or the one line saying why ``args.callable`` names nothing ``rawgraph trace`` can
    run (:func:`resolve_callable`'s refusal); checked after the options, before the GPU."""
    if getattr(args, "callable", None) is None:
        return None
    try:
        resolve_callable(args.callable)
    except CallableError as exc:
        return f"rawgraph trace: {exc}"
    return None


def run_checked(args: argparse.Namespace) -> int:
    """:func:`run` through :func:`~rawgraph.bench.command.run_suite`, a model the ``--callable``
    factory made that keeps no protocol refused with one line on stderr and exit 2."""
    try:
        return command.run_suite(args, run, render)
    except CallableError as exc:
        print(f"rawgraph trace: {exc}", file=sys.stderr)
        return command.EX_USAGE


def main(argv: list[str] | None = None) -> int:
    """Trace the paths; the latency model's table (or, with ``--json``, the results document) on
    stdout, progress on stderr. Returns the exit status: 0, or 2 for a bad option or
    ``--callable`` (one line on stderr)."""
    args = build_parser().parse_args(argv)
    why = check_callable(args)
    if why is not None:
        print(why, file=sys.stderr)
        return command.EX_USAGE
    return run_checked(args)


if __name__ == "__main__":
    sys.exit(main())
