"""``rawgraph`` command line: ``info``, ``demo``, ``seed``, ``dot``, ``doctor --demo``, ``bench [SUITE]``."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

import numpy as np

from . import __version__

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


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from .runtime.compiler import nvrtc_version

    out = {}
    try:
        out["cuda-bindings"] = version("cuda-bindings")
    except PackageNotFoundError:
        out["cuda-bindings"] = "?"
    out["nvrtc"] = "%d.%d" % nvrtc_version()
    return out


def cmd_info(args: argparse.Namespace) -> int:
    from .runtime.compiler import default_cache_dir, supported_archs
    from .runtime.device import driver_status, driver_version, get_device
    from .runtime.module import kernel_dir

    v = _versions()
    ok, reason = driver_status()
    if ok:
        dev = get_device(args.device)
        i = dev.info
        print(f"gpu: {i.name} (device {i.ordinal})")
        print(f"compute capability: {i.compute_capability[0]}.{i.compute_capability[1]} ({i.arch}), {i.multiprocessors} SMs, "
              f"{i.total_memory / 2**30:.1f} GiB, L2 {i.l2_bytes / 2**20:.0f} MiB")
        print(f"driver: CUDA {driver_version()}")
    else:
        print(f"gpu: none -- {reason}")
        print("driver: none (NVRTC still compiles kernels; GPU tests and demos need a driver)")
    print(f"cuda-bindings: {v['cuda-bindings']}")
    print(f"nvrtc: {v['nvrtc']} (CUBIN targets: {', '.join('sm_%d' % a for a in supported_archs())})")
    print(f"kernel sources: {kernel_dir()}")
    print(f"kernel cache: {default_cache_dir()}")
    return 0


def _need_gpu() -> bool:
    from .runtime.device import driver_status

    ok, reason = driver_status()
    if not ok:
        print(f"rawgraph: this command needs a GPU: {reason}", file=sys.stderr)
    return ok


def cmd_demo(args: argparse.Namespace) -> int:
    if not _need_gpu():
        return 2
    from .runtime.device import get_device
    from .runtime.memory import DeviceBuffer
    from .models.tinyblock import TinyBlock
    from .runtime.stream import Stream

    dev = get_device(args.device)
    rng = np.random.default_rng()
    x_host = rng.standard_normal((args.batch, args.width), dtype=np.float32)
    with Stream() as stream, TinyBlock(args.width, args.batch, args.layers, seed=args.seed, form=args.form) as model, \
            DeviceBuffer.from_numpy(x_host) as x, DeviceBuffer((args.batch, args.width)) as out:
        out.poison(stream)
        model.forward(x, out, stream)
        stream.synchronize()
        y = out.to_numpy()
        ref = model.reference(x_host)
        launches = args.layers * model.kernels_per_layer
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    print(f"device: {dev.info.name} ({dev.arch})")
    print(f"TinyBlock width={args.width} batch={args.batch} layers={args.layers} form={args.form}: "
          f"{launches} kernel launches, eager on one stream")
    print(f"relative error vs float64 NumPy: {err:.3e} ({'ok' if err < 1e-5 else 'TOO LARGE'})")
    return 0 if err < 1e-5 else 1


def cmd_seed(args: argparse.Namespace) -> int:
    if not _need_gpu():
        return 2
    from .bench.seed import main

    return main()


def cmd_dot(args: argparse.Namespace) -> int:
    if not _need_gpu():
        return 2
    from .graphs.capture import capture_plan
    from .graphs.dot import export
    from .runtime.memory import DeviceBuffer
    from .models.tinyblock import TinyBlock
    from .runtime.stream import Stream

    with Stream() as stream, TinyBlock(args.width, args.batch, args.layers, form=args.form) as model, \
            DeviceBuffer((args.batch, args.width)) as x, DeviceBuffer((args.batch, args.width)) as out:
        x.poison(stream)
        graph = capture_plan(model.plan(x, out), stream)
        for kind, path in export(graph, args.output).items():
            print(f"{kind}: {path}")
        graph.close()
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """``rawgraph doctor --demo``: build one seeded fault per class, check each, print the reports
    (a rich table when rich is installed) and verify's first diverging node. Exit 0 when every
    fault is found where it was seeded, 1 otherwise, 2 without a GPU or without ``--demo``."""
    if not args.demo:
        print("rawgraph doctor: only --demo runs from the command line; examine your own graphs with "
              "rawgraph.doctor.check(graph)", file=sys.stderr)
        return 2
    if not _need_gpu():
        return 2
    import json

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
        made = faults.all_faults(stream, torch=not args.no_torch, cupy=not args.no_cupy)
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
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"verify (middle kernel given another constant by cuGraphExecKernelNodeSetParams): {res}")
        print("every seeded fault found" if not missed else f"MISSED: {', '.join(missed)}")
    return 0 if not missed else 1


def _bench_help() -> str:
    default = next(iter(BENCH_SUITES))
    suites = ", ".join(f"{name} ({'default; ' if name == default else ''}{help_})" for name, (_mod, help_) in BENCH_SUITES.items())
    return f"Suites: {suites}. rawgraph bench SUITE --help shows a suite's options."


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
        The suite's exit status; 2 without a GPU. ``--help`` exits 0 and a bad option exits 2
        with the suite's usage, both before the GPU check.
    """
    rest = list(argv)
    if rest[:1] == ["--"]:
        rest.pop(0)
    suite = next(iter(BENCH_SUITES))
    named = bool(rest) and not rest[0].startswith("-")
    if named:
        suite = rest.pop(0)
        if suite not in BENCH_SUITES:
            argparse.ArgumentParser(prog="rawgraph bench", usage="%(prog)s [SUITE] [options]").error(
                f"unknown suite {suite!r} (choose from {', '.join(BENCH_SUITES)})")
        if rest[:1] == ["--"]:
            rest.pop(0)
    module = importlib.import_module(BENCH_SUITES[suite][0])
    parser: argparse.ArgumentParser = module.build_parser()
    parser.prog = f"rawgraph bench {suite}" if named else f"rawgraph bench [{suite}]"
    parser.epilog = _bench_help()
    parser.parse_args(rest)  # exits here on --help (0) or a bad option (2), GPU or not
    if not _need_gpu():
        return 2
    return int(module.main(rest))


def build_parser() -> argparse.ArgumentParser:
    """The ``rawgraph`` parser (``bench`` is listed for help; :func:`main` hands it its arguments)."""
    p = argparse.ArgumentParser(prog="rawgraph", description="Driver-level CUDA Graph reference")
    p.add_argument("--version", action="version", version=f"rawgraph {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("info", help="GPU, driver, cuda-bindings, NVRTC and kernel cache")
    s.add_argument("--device", type=int, default=0)
    s.set_defaults(fn=cmd_info)
    for name, fn, help_ in (("demo", cmd_demo, "run TinyBlock eagerly and check it against NumPy"),
                            ("dot", cmd_dot, "export a TinyBlock graph as DOT (and PNG with Graphviz)")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--width", type=int, default=128)
        s.add_argument("--batch", type=int, default=1)
        s.add_argument("--layers", type=int, default=2)
        s.add_argument("--form", choices=("unfused", "fused", "block"), default="unfused")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--device", type=int, default=0)
        if name == "dot":
            s.add_argument("--output", default="tinyblock_graph")
        s.set_defaults(fn=fn)
    s = sub.add_parser("doctor", help="the graph doctor: --demo builds one seeded fault per class and reports it")
    s.add_argument("--demo", action="store_true", help="build the seeded faults, check them, print the reports")
    s.add_argument("--json", action="store_true", help="print the reports as JSON")
    s.add_argument("--no-torch", action="store_true", help="skip the PyTorch faults")
    s.add_argument("--no-cupy", action="store_true", help="skip the CuPy fault")
    s.set_defaults(fn=cmd_doctor)
    s = sub.add_parser("seed", help="the seed note's static-address experiment at driver level")
    s.set_defaults(fn=cmd_seed)
    s = sub.add_parser("bench", add_help=False,
                       help=f"benchmarks: rawgraph bench [{'|'.join(BENCH_SUITES)}] [options] (--help for a suite's)")
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
        Exit status: 0 done, 1 a check failed, 2 usage error or no GPU for a command that needs one.
    """
    args_in = sys.argv[1:] if argv is None else list(argv)
    # argparse cannot hand options on through a subcommand (a REMAINDER positional never takes an
    # argument that looks like an option: ``bench --quick`` was "unrecognized arguments"), so
    # bench gets its arguments whole and lets the suite's own parser read them.
    if args_in[:1] == ["bench"]:
        return cmd_bench(args_in[1:])
    args = build_parser().parse_args(args_in)
    return args.fn(args)
