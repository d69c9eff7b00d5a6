"""``rawgraph`` command line: ``info``, ``demo``, ``seed``, ``dot``, ``doctor --demo``, ``trace``,
``bench [SUITE]`` and ``bench report FILE``.

Results go to stdout, progress and status to stderr (``--json`` prints a results document instead
of the text). Exit statuses: :data:`rawgraph.bench.command.EXIT_STATUSES`; option values are
checked by the parser, before any GPU is looked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

import numpy as np

from . import __version__
from .bench.command import (
    EX_FAILED,
    EX_OK,
    EX_UNAVAILABLE,
    EX_USAGE,
    EXIT_STATUSES,
    HelpFormatter,
    add_model_options,
    emit,
    nonnegative_int,
    optional,
)

# ``rawgraph bench [SUITE] [options]``: suite -> (module, one-line help). A suite module has
# ``build_parser()`` (no GPU needed, so --help and option errors work anywhere) and ``main(argv)``.
# The first entry is the default suite. A new suite is one line here.
BENCH_SUITES: dict[str, tuple[str, str]] = {
    "paths": ("rawgraph.bench.launch_paths", "stream, graph, copy + replay, exec-update + replay; PyTorch and CuPy"),
    "kernels": ("rawgraph.bench.kernel_times", "device time per kernel against cuBLAS, --sweep for every cut"),
    "buckets": ("rawgraph.bench.buckets", "dynamic batch: bucket strategies, re-shaped graphs, PyTorch buckets"),
    "slots": ("rawgraph.bench.slots", "continuous batching: slots and index tables against PyTorch the vLLM way"),
    "choose": ("rawgraph.bench.choose", "the measured-cost strategy choice and its regret over a whole trace"),
}
# ``rawgraph bench report FILE``: renders a results file again; the one bench command with no GPU.
BENCH_REPORT = ("report", "rawgraph.bench.report")


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from .runtime.compiler import nvrtc_version

    out = {}
    try:
        out["cuda-bindings"] = version("cuda-bindings")
    except PackageNotFoundError:
        out["cuda-bindings"] = "?"
    out["nvrtc"] = "{}.{}".format(*nvrtc_version())
    return out


def info(ordinal: int = 0) -> dict:
    """What ``rawgraph info`` reports, as a document: GPU ``ordinal`` (None without one, and why),
    the driver, cuda-bindings, NVRTC and its CUBIN targets, where the kernel sources and cache are."""
    from .runtime.compiler import default_cache_dir, supported_archs
    from .runtime.device import driver_status, driver_version, get_device
    from .runtime.module import kernel_dir

    v = _versions()
    ok, reason = driver_status()
    gpu = None
    if ok:
        i = get_device(ordinal).info
        gpu = {
            "name": i.name,
            "ordinal": i.ordinal,
            "compute_capability": list(i.compute_capability),
            "arch": i.arch,
            "multiprocessors": i.multiprocessors,
            "total_memory_bytes": i.total_memory,
            "l2_bytes": i.l2_bytes,
        }
    return {
        "rawgraph": __version__,
        "gpu": gpu,
        "no_gpu_reason": None if ok else reason,
        "driver_cuda": driver_version() if ok else None,
        "cuda_bindings": v["cuda-bindings"],
        "nvrtc": v["nvrtc"],
        "cubin_targets": [f"sm_{a}" for a in supported_archs()],
        "kernel_sources": str(kernel_dir()),
        "kernel_cache": str(default_cache_dir()),
    }


def _info_text(doc: dict) -> str:
    lines = []
    i = doc["gpu"]
    if i is not None:
        lines.append(f"gpu: {i['name']} (device {i['ordinal']})")
        lines.append(
            f"compute capability: {i['compute_capability'][0]}.{i['compute_capability'][1]} ({i['arch']}), "
            f"{i['multiprocessors']} SMs, {i['total_memory_bytes'] / 2**30:.1f} GiB, "
            f"L2 {i['l2_bytes'] / 2**20:.0f} MiB"
        )
        lines.append(f"driver: CUDA {doc['driver_cuda']}")
    else:
        lines.append(f"gpu: none -- {doc['no_gpu_reason']}")
        lines.append("driver: none (NVRTC still compiles kernels; GPU tests and demos need a driver)")
    lines.append(f"cuda-bindings: {doc['cuda_bindings']}")
    lines.append(f"nvrtc: {doc['nvrtc']} (CUBIN targets: {', '.join(doc['cubin_targets'])})")
    lines.append(f"kernel sources: {doc['kernel_sources']}")
    lines.append(f"kernel cache: {doc['kernel_cache']}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    doc = info(args.device)
    emit(doc, lambda: _info_text(doc), args.json)
    return EX_OK


def _need_gpu() -> bool:
    """True where the CUDA driver initialises; else False, with why on stderr (the caller exits
    with :data:`EX_UNAVAILABLE`)."""
    from .runtime.device import driver_status

    ok, reason = driver_status()
    if not ok:
        print(f"rawgraph: this command needs a GPU: {reason}", file=sys.stderr)
    return ok


def cmd_demo(args: argparse.Namespace) -> int:
    if not _need_gpu():
        return EX_UNAVAILABLE
    from .models.tinyblock import TinyBlock
    from .runtime.device import get_device
    from .runtime.memory import DeviceBuffer
    from .runtime.stream import Stream

    dev = get_device(args.device)
    rng = np.random.default_rng()
    x_host = rng.standard_normal((args.batch, args.width), dtype=np.float32)
    with (
        Stream() as stream,
        TinyBlock(args.width, args.batch, args.layers, seed=args.seed, form=args.form) as model,
        DeviceBuffer.from_numpy(x_host) as x,
        DeviceBuffer((args.batch, args.width)) as out,
    ):
        out.poison(stream)
        model.forward(x, out, stream)
        stream.synchronize()
        y = out.to_numpy()
        ref = model.reference(x_host)
        launches = args.layers * model.kernels_per_layer
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    print(f"device: {dev.info.name} ({dev.arch})")
    print(
        f"TinyBlock width={args.width} batch={args.batch} layers={args.layers} form={args.form}: "
        f"{launches} kernel launches, eager on one stream"
    )
    print(f"relative error vs float64 NumPy: {err:.3e} ({'ok' if err < 1e-5 else 'TOO LARGE'})")
    return EX_OK if err < 1e-5 else EX_FAILED


def cmd_seed(args: argparse.Namespace) -> int:
    if not _need_gpu():
        return EX_UNAVAILABLE
    from .bench.seed import main

    return main()


def cmd_dot(args: argparse.Namespace) -> int:
    if not _need_gpu():
        return EX_UNAVAILABLE
    from .graphs.capture import capture_plan
    from .graphs.dot import export
    from .models.tinyblock import TinyBlock
    from .runtime.memory import DeviceBuffer
    from .runtime.stream import Stream

    with (
        Stream() as stream,
        TinyBlock(args.width, args.batch, args.layers, form=args.form) as model,
        DeviceBuffer((args.batch, args.width)) as x,
        DeviceBuffer((args.batch, args.width)) as out,
    ):
        x.poison(stream)
        graph = capture_plan(model.plan(x, out), stream)
        for kind, path in export(graph, args.output).items():
            print(f"{kind}: {path}")
        graph.close()
    return EX_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """``rawgraph doctor --demo``: build one seeded fault per class, check each, print the reports
    (a rich table when rich is installed) and verify's first diverging node. Exit 0 when every
    fault is found where it was seeded, 1 otherwise, 2 without ``--demo``, 69 without a GPU."""
    if not args.demo:
        print(
            "rawgraph doctor: only --demo runs from the command line; examine your own graphs with "
            "rawgraph.doctor.check(graph)",
            file=sys.stderr,
        )
        return EX_USAGE
    if not _need_gpu():
        return EX_UNAVAILABLE
    # torch before CuPy: the order in which both import side by side (benchmarks/NOTES.md).
    torch_ok = not args.no_torch and optional("torch", "torch", "the PyTorch faults") is not None
    cupy_ok = not args.no_cupy and optional("cupy", "cupy", "the CuPy fault") is not None

    from .doctor import faults
    from .doctor.verify import verify
    from .runtime.stream import Stream

    try:
        from rich.console import Console

        console: Any = Console()
    except ImportError:
        console = None
    missed: list[str] = []
    out: dict[str, Any] = {}
    with Stream() as stream:
        made = faults.all_faults(stream, torch=torch_ok, cupy=cupy_ok)
        try:
            for fault in made:
                report = fault.check()
                hit = [f for f in report.findings if f.cls == fault.cls and f.path == fault.node]
                status = "found" if hit else "MISSED"
                if not hit:
                    missed.append(fault.name)
                title = f"{fault.cls} {fault.name}: {fault.story} -> {status} at node {fault.node}"
                out[fault.name] = {"story": fault.story, "found": bool(hit), **report.to_dict()}
                if args.json:
                    continue
                if console is not None:
                    console.rule(title)
                    console.print(report.rich_table())
                else:
                    print(f"== {title}")
                    print(report)
        finally:
            for fault in made:
                fault.close()
        wrong = faults.wrong_argument(stream)
        try:
            res = verify(wrong.exec, stream)
        finally:
            wrong.close()
        out["verify"] = {"ok": res.ok, "node": res.node, "node_label": res.node_label, "text": str(res)}
        if res.node != 1:
            missed.append("verify")
    summary = f"verify (middle kernel given another constant by cuGraphExecKernelNodeSetParams): {res}\n" + (
        "every seeded fault found" if not missed else f"MISSED: {', '.join(missed)}"
    )
    emit(out, lambda: summary, args.json)
    return EX_OK if not missed else EX_FAILED


def cmd_trace(args: argparse.Namespace) -> int:
    """``rawgraph trace``: the TinyBlock, or the model ``--callable`` names, through every launch
    path under a tracer; writes the Chrome trace and the PNG timeline, prints the latency model
    (see :mod:`rawgraph.bench.trace`). Exit 0; 2 for a bad option, or a ``--callable`` that names
    no row-wise model or factory of one (one line on stderr, checked before the GPU); 69 without
    a GPU (checked before anything touches the driver)."""
    from .bench.trace import check_callable, run_checked

    why = check_callable(args)
    if why is not None:
        print(why, file=sys.stderr)
        return EX_USAGE
    if not _need_gpu():
        return EX_UNAVAILABLE
    return run_checked(args)


def bench_epilog() -> str:
    """What every ``rawgraph bench ... --help`` ends with, once: the suites, ``report``, where
    output goes and the exit statuses."""
    default = next(iter(BENCH_SUITES))
    suites = ", ".join(
        f"{name} ({'default; ' if name == default else ''}{help_})" for name, (_mod, help_) in BENCH_SUITES.items()
    )
    return (
        f"Suites: {suites}. rawgraph bench SUITE --help shows a suite's options. rawgraph bench report FILE "
        "renders a results file again, with no GPU (the table, and an HTML page with the plots). Results go to "
        f"stdout (with --json, the results document), progress and status to stderr. {EXIT_STATUSES}"
    )


def cmd_bench(argv: list[str]) -> int:
    """``rawgraph bench [SUITE] [--] [options]``: parse the suite's options, then check for a GPU.

    Parameters
    ----------
    argv : list of str
        Everything after ``bench``. A leading ``--`` (the old spelling, ``bench -- --quick``) is
        dropped, before and after the suite name.

    Returns
    -------
    int
        The suite's exit status; 69 without a GPU. ``--help`` exits 0 and a bad option or value
        exits 2 with the suite's usage, both before the GPU check. ``report`` needs no GPU.
    """
    rest = list(argv)
    if rest[:1] == ["--"]:
        rest.pop(0)
    suite = next(iter(BENCH_SUITES))
    named = bool(rest) and not rest[0].startswith("-")
    if named:
        suite = rest.pop(0)
        if suite not in BENCH_SUITES and suite != BENCH_REPORT[0]:
            argparse.ArgumentParser(prog="rawgraph bench", usage="%(prog)s [SUITE] [options]").error(
                f"unknown suite {suite!r} (choose from {', '.join(BENCH_SUITES)}, or {BENCH_REPORT[0]} FILE)"
            )
        if rest[:1] == ["--"]:
            rest.pop(0)
    module = importlib.import_module(BENCH_REPORT[1] if suite == BENCH_REPORT[0] else BENCH_SUITES[suite][0])
    parser: argparse.ArgumentParser = module.build_parser()
    parser.prog = f"rawgraph bench {suite}" if named else f"rawgraph bench [{suite}]"
    parser.epilog = bench_epilog()
    parser.parse_args(rest)  # exits here on --help (0) or a bad option or value (2), GPU or not
    if suite != BENCH_REPORT[0] and not _need_gpu():
        return EX_UNAVAILABLE
    return int(module.main(rest))


def _model_options(s: argparse.ArgumentParser) -> None:
    add_model_options(s, width=128, layers=2, form="unfused", batch=1)
    s.add_argument("--device", type=nonnegative_int, default=0, help="the GPU's ordinal")


def build_parser() -> argparse.ArgumentParser:
    """The ``rawgraph`` parser (``bench`` is listed for help; :func:`main` hands it its arguments)."""
    p = argparse.ArgumentParser(
        prog="rawgraph",
        description="rawgraph: driver-level CUDA Graphs from Python. "
        "Results go to stdout, progress and status to stderr.",
        epilog=EXIT_STATUSES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rawgraph {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help_, description=description, epilog=EXIT_STATUSES, formatter_class=HelpFormatter
        )

    s = command(
        "info",
        "GPU, driver, cuda-bindings, NVRTC and kernel cache (no GPU needed)",
        "Report the GPU (or why there is none), the driver, cuda-bindings, NVRTC and its CUBIN targets, "
        "and where the kernel sources and the kernel cache are. Runs without a GPU.",
    )
    s.add_argument("--device", type=nonnegative_int, default=0, help="the GPU's ordinal")
    s.add_argument("--json", action="store_true", help="print the report as one JSON document")
    s.set_defaults(fn=cmd_info)
    s = command(
        "demo",
        "run TinyBlock eagerly and check it against NumPy",
        "Run the TinyBlock (y = relu(x @ W1) @ W2 + x per layer) eagerly on one stream and print its "
        "relative error against a float64 NumPy reference. Needs a GPU.",
    )
    _model_options(s)
    s.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the weights")
    s.set_defaults(fn=cmd_demo)
    s = command(
        "dot",
        "export a TinyBlock graph as DOT (and PNG with Graphviz)",
        "Capture the TinyBlock into a graph and write it as DOT, and as PNG where Graphviz's dot is on "
        "the PATH. Needs a GPU.",
    )
    _model_options(s)
    s.add_argument("--output", default="tinyblock_graph", help="file stem of the DOT and PNG files")
    s.set_defaults(fn=cmd_dot)
    s = command(
        "doctor",
        "the graph doctor: --demo builds one seeded fault per class and reports it",
        "The graph doctor's demonstration: build one seeded fault of each kind the doctor knows, check "
        "each graph, print the reports, and verify a graph whose middle kernel was given another "
        "constant. Your own graphs: rawgraph.doctor.check(graph) from Python. Needs a GPU.",
    )
    s.add_argument("--demo", action="store_true", help="build the seeded faults, check them, print the reports")
    s.add_argument("--json", action="store_true", help="print the reports as one JSON document")
    s.add_argument("--no-torch", action="store_true", help="skip the PyTorch faults")
    s.add_argument("--no-cupy", action="store_true", help="skip the CuPy fault")
    s.set_defaults(fn=cmd_doctor)
    s = command(
        "seed",
        "the static-address experiment at driver level",
        "The static-address experiment at driver level: eager launches, copy + replay and exec-update + "
        "replay of one model, their results compared. Needs a GPU.",
    )
    s.set_defaults(fn=cmd_seed)
    from .bench.trace import DESCRIPTION as TRACE_DESCRIPTION
    from .bench.trace import add_options as add_trace_options

    s = command(
        "trace",
        "a timeline of host launches against device work, every launch path (Chrome trace + PNG); "
        "the TinyBlock or, with --callable MODULE:NAME, your own model",
        TRACE_DESCRIPTION,
    )
    add_model_options(s, width=128, layers=2, form="unfused", batch=1)
    add_trace_options(s)
    s.add_argument("--json", action="store_true", help="print the results document as JSON instead of the table")
    s.set_defaults(fn=cmd_trace)
    s = sub.add_parser(
        "bench",
        add_help=False,
        help=f"benchmarks: rawgraph bench [{'|'.join(BENCH_SUITES)}] [options], or "
        f"rawgraph bench report FILE (--help for a suite's options)",
    )
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=lambda args: cmd_bench(args.rest))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``rawgraph`` command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after the program name (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status: 0 done, 1 a check failed, 2 a bad option or value (before any GPU check), 69
        no GPU for a command that needs one.
    """
    args_in = sys.argv[1:] if argv is None else list(argv)
    # argparse cannot hand options on through a subcommand (a REMAINDER positional never takes an
    # argument that looks like an option: ``bench --quick`` was "unrecognized arguments"), so
    # bench gets its arguments whole and lets the suite's own parser read them.
    if args_in[:1] == ["bench"]:
        return cmd_bench(args_in[1:])
    args = build_parser().parse_args(args_in)
    return int(args.fn(args))
