"""What the ``rawgraph`` command and its benchmark suites share on the command line: exit statuses,
option value types, help that shows each default, ``--json``, and where output goes.

Output rule: a command's results (its table, or with ``--json`` its results document) go to
stdout; progress, status and notes go to stderr. So ``rawgraph bench SUITE --json > out.json``
leaves a file that is one JSON document, with the progress still on the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

# Exit statuses. 2 is argparse's own (a bad option or value); 69 is sysexits.h's EX_UNAVAILABLE, so
# a script can tell "no GPU here" from a mistake in its command line.
EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EXIT_STATUSES = (
    f"Exit status: {EX_OK} done; {EX_FAILED} a check failed; {EX_USAGE} a bad option or value "
    f"(refused before any GPU is looked for); {EX_UNAVAILABLE} no CUDA driver or GPU for a "
    "command that needs one."
)
INSTALL_EXTRA = "pip install 'rawgraph[{extra}]'"


def _number(kind: Callable[[str], Any], text: str, ok: Callable[[Any], bool], what: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def positive_int(text: str) -> int:
    """An option value that is an integer >= 1 (argparse ``type``: anything else is a usage error)."""
    return _number(int, text, lambda v: v >= 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    """An option value that is an integer >= 0."""
    return _number(int, text, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """An option value that is a finite number > 0."""
    return _number(float, text, lambda v: 0 < v < float("inf"), "a number > 0")


class HelpFormatter(argparse.HelpFormatter):
    """Help with each option's default appended, ``(default: X)``.

    Left out where it says nothing: a flag (default False), a default of None (the help text says
    what happens then), and help that names its default already.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or default is False
            or default is argparse.SUPPRESS
            or "%(default)" in text
            or not action.option_strings
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{text} (default: {shown})"


def parser(prog: str, description: str, *, json_help: str | None = None) -> argparse.ArgumentParser:
    """An argument parser in the command's style: the defaults shown, and ``--json`` (unless
    ``json_help`` is empty) printing the results document to stdout instead of the text."""
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
    if json_help != "":
        p.add_argument(
            "--json",
            action="store_true",
            help=json_help
            or "print the results document as JSON on stdout instead of the text "
            "(progress and status still go to stderr)",
        )
    return p


FORMS = ("unfused", "fused", "block")


def add_model_options(
    p: argparse.ArgumentParser, *, width: int, layers: int, form: str | None = None, batch: int | None = None
) -> None:
    """The TinyBlock's options with these defaults: ``--width``, ``--batch`` (where ``batch`` is
    given), ``--layers``, ``--form`` (where ``form`` is given)."""
    p.add_argument("--width", type=positive_int, default=width, help="the TinyBlock's width")
    if batch is not None:
        p.add_argument("--batch", type=positive_int, default=batch, help="rows of the input")
    p.add_argument("--layers", type=positive_int, default=layers, help="the TinyBlock's depth")
    if form is not None:
        p.add_argument(
            "--form",
            choices=FORMS,
            default=form,
            help="kernels per layer: unfused (matmul, relu, matmul, add), fused (two), block (one)",
        )


def add_trace_options(p: argparse.ArgumentParser, *, rate: float, mean_len: float, seed: int) -> None:
    """A join-leave trace's options with these defaults: Poisson arrivals (``--rate``), geometric
    request lengths (``--mean-len``), ``--seed``."""
    p.add_argument("--rate", type=positive_float, default=rate, help="mean new requests per step (Poisson)")
    p.add_argument("--mean-len", type=positive_float, default=mean_len, help="mean steps a request lives (geometric)")
    p.add_argument("--seed", type=nonnegative_int, default=seed, help="seed of the trace and the inputs")


def emit(result: Any, text: Callable[[], str], as_json: bool, out: Any = None) -> None:
    """Write the results to ``out`` (default stdout): ``result`` as one JSON document, or ``text()``."""
    out = sys.stdout if out is None else out
    if as_json:
        json.dump(result, out, indent=1)
        out.write("\n")
    else:
        print(text(), file=out)
    out.flush()


def run_suite(
    args: argparse.Namespace, collect: Callable[[argparse.Namespace], dict], render: Callable[[dict], str]
) -> int:
    """Run a suite: ``collect(args)`` measures and writes its files, with whatever it prints
    (progress, status, the paths written) sent to stderr; then the results go to stdout, as
    ``render(result)`` or, with ``--json``, the document itself."""
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = collect(args)
    emit(result, lambda: render(result), bool(getattr(args, "json", False)), out)
    return EX_OK


def optional(module: str, extra: str, without: str) -> Any:
    """``module`` imported, or None with a note on stderr naming what is skipped and the extra
    that brings it.

    Parameters
    ----------
    module : str
        e.g. ``"torch"``.
    extra : str
        rawgraph's extra that installs it, e.g. ``"torch"``.
    without : str
        What the run leaves out without it, e.g. ``"the PyTorch rows"``.
    """
    try:
        return importlib.import_module(module)
    except Exception as exc:  # a broken install is as good as none for an optional package
        why = "not installed" if isinstance(exc, ImportError) else f"failed to import ({type(exc).__name__}: {exc})"
        print(f"{module} {why}: {without} skipped ({INSTALL_EXTRA.format(extra=extra)})", file=sys.stderr, flush=True)
        return None
