"""Terminal table and PNG plots for a launch-path benchmark result, and ``rawgraph bench report``:
any suite's results file rendered again with no GPU, as text and as one HTML page with its plots."""

from __future__ import annotations

import argparse
import base64
import contextlib
import html
import importlib
import json
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import command
from .progress import INSTALL_HINT, importable

PATH_ORDER = [
    "stream",
    "graph",
    "graph_nopdl",
    "graph_copy",
    "graph_update",
    "graph_update2",
    "graph_indirect",
    "graph_indirect_mapped",
    "graph_exec_update",
    "torch_eager",
    "torch_graph",
    "torch_graph_copy",
    "torch_graph_rebind",
    "cupy_eager",
    "cupy_graph",
    "floor_sync",
    "floor_empty_kernel",
    "floor_empty_graph",
]


def _m(rec, clock):
    v = rec.get(clock)
    return v["median"] if v else float("nan")


def breakeven_replays(result: dict, rec: dict) -> float | None:
    """Replays after which capture + instantiate is paid back by (stream - graph) per step."""
    if rec["path"] != "graph" or "capture_ms" not in rec:
        return None
    for r in result["records"]:
        if r["path"] == "stream" and all(r[k] == rec[k] for k in ("form", "layers", "width", "batch")):
            gain = _m(r, "sync_us") - _m(rec, "sync_us")
            cost_us = (rec["capture_ms"] + rec.get("instantiate_ms", 0.0)) * 1e3
            return cost_us / gain if gain > 0 else float("inf")
    return None


# Column layout of both tables (path, form, L, width, batch): 40 characters, so that with the
# clocks every line stays within WIDTH (readable in a 100-column terminal and in a diff).
WIDTH = 100
_KEY_HEAD = f"{'path':18s} {'form':7s} {'L':>3s} {'width':>5s} {'b':>3s}"


def _key(r: dict) -> str:
    return f"{r['path']:18s} {str(r['form'] or '-'):7s} {r['layers']:3d} {r['width']:5d} {r['batch']:3d}"


def table(result: dict) -> str:
    """The benchmark result as plain text, no line longer than ``WIDTH`` (100) characters.

    Parameters
    ----------
    result : dict
        A launch-path result: ``records`` as ``Runner.record`` writes them, optional ``microcosts``.

    Returns
    -------
    str
        Two tables: the three clocks' medians per (config, path, form) with the synced clock's
        p10-p90, then for each captured graph its capture and instantiate time and the replays
        after which they are paid back; then the host cost per driver call.
    """
    recs = sorted(
        result["records"],
        key=lambda r: (r["layers"], r["width"], r["batch"], PATH_ORDER.index(r["path"]), str(r["form"])),
    )
    head = f"{_KEY_HEAD} {'sync us':>9s} {'p10-p90':>17s} {'host us':>9s} {'device us':>9s}"
    lines = [head, "-" * len(head)]
    for r in recs:
        s = r["sync_us"]
        spread = f"{s['p10']:.1f}-{s['p90']:.1f}" if s else ""
        lines.append(
            f"{_key(r)} {_m(r, 'sync_us'):9.2f} {spread:>17s} {_m(r, 'host_us'):9.2f} {_m(r, 'device_us'):9.2f}"
        )
    built = [r for r in recs if "capture_ms" in r]
    if built:
        head = f"{_KEY_HEAD} {'capture ms':>10s} {'inst ms':>8s}  pays back after"
        lines += ["", head, "-" * len(head)]
        for r in built:
            inst = f"{r['instantiate_ms']:8.2f}" if "instantiate_ms" in r else f"{'-':>8s}"
            be = breakeven_replays(result, r)
            pays = "" if be is None else ("never (no gain)" if be == float("inf") else f"{be:.0f} replays")
            lines.append(f"{_key(r)} {r['capture_ms']:10.2f} {inst}  {pays}")
    micro = result.get("microcosts")
    if micro:
        lines.append("")
        lines.append(f"host cost per call: cuLaunchKernel {micro['cuLaunchKernel']['median']:.2f} us")
        for name in ("cuLaunchKernelEx_pdl", "cuLaunchKernelEx_plain", "manager_bind_1_node", "manager_bind_same"):
            if name in micro:
                lines.append(f"  {name}: {micro[name]['median']:.2f} us")
        for name in ("cuGraphLaunch", "cuGraphExecKernelNodeSetParams", "cuGraphExecUpdate"):
            f = micro[name]["fit"]
            lines.append(f"  {name}: {f['fixed_us']:.2f} us + {f['per_node_us']:.3f} us/node")
        for form, b in micro.get("bind_breakdown", {}).items():
            lines.extend(_bind_lines(form, b))
    return "\n".join(lines)


def _bind_lines(form: str, b: dict) -> list[str]:
    """The re-binding breakdown (older results files lack some rows: those are left out)."""
    m = {k: v["median"] for k, v in b.items() if isinstance(v, dict) and "median" in v}

    def row(title: str, items: list[tuple[str, str]]) -> str:
        return f"  {title}: " + " | ".join(f"{label} {m[k]:.2f}" for label, k in items if k in m)

    lines = [
        f"re-binding x and out, {form} w{b['config']['width']} b{b['config']['batch']}, "
        f"{b['nodes_pushed']} nodes pushed, interleaved rounds (median us):",
        row(
            "per step",
            [("replay", "replay"), ("apply2+replay", "apply2_replay"), ("bind_many2+replay", "bind2_replay")],
        ),
        row(
            "per step",
            [
                ("raw pushes+replay", "raw_setparams_replay"),
                ("raw changed pushes+replay", "raw_changed_setparams_replay"),
            ],
        ),
        row(
            "calls",
            [
                ("apply2", "apply2_call"),
                ("bind_many2", "bind2_call"),
                ("raw pushes", "raw_setparams_call"),
                ("raw changed pushes", "raw_changed_setparams_call"),
            ],
        ),
        row("calls", [("apply2 Python", "apply2_python_us"), ("no-op bind_many2+replay", "bind2_noop_replay")]),
        row(
            "after push / none",
            [
                ("cuGraphLaunch", "launch_call_after_push"),
                ("/", "launch_call_no_push"),
                ("device", "device_after_push"),
                ("/", "device_no_push"),
            ],
        ),
    ]
    if "torch_graph_copy_replay" in m:
        r = b["ratios_vs_torch_graph_copy"]
        lines.append(row("torch", [("replay", "torch_graph_replay"), ("copy_+replay", "torch_graph_copy_replay")]))
        short = {"raw_setparams_replay": "raw", "raw_changed_setparams_replay": "raw changed"}
        lines.append(
            "  vs torch copy_+replay: "
            + ", ".join(f"{short.get(k, k.replace('_replay', ''))} {v:.2f}x" for k, v in r.items())
        )
    return lines


# The kernels issue's launch-path targets: (label, (layers, width, batch), path, reference path, at most).
TARGETS = [
    ("1 block: graph_update <= 0.6x torch_graph_copy", (1, 128, 1), "graph_update", "torch_graph_copy", 0.6),
    ("1 block: graph <= 0.8x torch_graph", (1, 128, 1), "graph", "torch_graph", 0.8),
    ("1 block: stream <= 0.4x torch_eager", (1, 128, 1), "stream", "torch_eager", 0.4),
    ("1 block: graph_update < graph_copy", (1, 128, 1), "graph_update", "graph_copy", 1.0),
    ("1 block: graph_update2 <= 0.6x torch_graph_copy", (1, 128, 1), "graph_update2", "torch_graph_copy", 0.6),
    ("1 block: graph_indirect <= 0.6x torch_graph_copy", (1, 128, 1), "graph_indirect", "torch_graph_copy", 0.6),
    ("1 block: graph_indirect_mapped <= 0.6x torch_g..", (1, 128, 1), "graph_indirect_mapped", "torch_graph_copy", 0.6),
    # the small-work floor: the replay, and the best way of feeding new arrays
    ("1 block: fused graph <= 0.6x torch_graph", (1, 128, 1), "graph", "torch_graph", 0.6),
    ("1 block: fused graph_indirect <= 0.55x torch_g..", (1, 128, 1), "graph_indirect", "torch_graph_copy", 0.55),
    ("1 block: fused graph_update <= 0.55x torch_g..", (1, 128, 1), "graph_update", "torch_graph_copy", 0.55),
    ("64 blocks: unfused graph <= 0.8x torch_graph", (64, 128, 1), "graph", "torch_graph", 0.8),
    ("64 blocks: fused graph <= 0.4x torch_graph", (64, 128, 1), "graph", "torch_graph", 0.4),
]


def _find(result: dict, path: str, form, cfg: tuple) -> dict | None:
    for r in result["records"]:
        if r["path"] == path and (form is None or r["form"] == form) and (r["layers"], r["width"], r["batch"]) == cfg:
            return r
    return None


def targets(result: dict) -> str:
    """Each launch-path target per rawgraph form (synced clock medians): ratio and met/missed."""
    lines = []
    for label, cfg, path, ref_path, limit in TARGETS:
        forms = (
            ["unfused"]
            if "unfused" in label
            else (["fused", "block"] if "fused" in label else ["unfused", "fused", "block"])
        )
        for form in forms:
            rec = _find(result, path, form, cfg)
            ref = _find(result, ref_path, form if ref_path.startswith("graph") else None, cfg)
            if rec is None or ref is None:
                continue
            a, b = _m(rec, "sync_us"), _m(ref, "sync_us")
            ratio = a / b
            met = ratio < limit if limit == 1.0 else ratio <= limit
            lines.append(f"{label:48s} {form:8s} {a:8.2f} / {b:8.2f} = {ratio:5.2f}  {'met' if met else 'MISSED'}")
    # The slots issue's additive target: the indirect path costs at most 1.5 us over the plain replay.
    for path in ("graph_indirect", "graph_indirect_mapped"):
        for form in ("fused", "block"):
            rec, ref = _find(result, path, form, (1, 128, 1)), _find(result, "graph", form, (1, 128, 1))
            if rec is None or ref is None:
                continue
            a, b = _m(rec, "sync_us"), _m(ref, "sync_us")
            label = f"1 block: {path} <= graph + 1.5 us"
            lines.append(
                f"{label:48s} {form:8s} {a:8.2f} - {b:8.2f} = {a - b:5.2f}  {'met' if a - b <= 1.5 else 'MISSED'}"
            )
    return "\n".join(lines)


def plots(result: dict, out_dir: Path, stem: str) -> list[Path]:
    """Latency (synced clock) vs depth and vs width per path, as PNGs.

    Parameters
    ----------
    result : dict
        A launch-path result (see :func:`table`).
    out_dir : Path
        Folder for the PNGs.
    stem : str
        File stem: ``{stem}_vs_layers.png`` and ``{stem}_vs_width.png``.

    Returns
    -------
    list of Path
        The files written; empty, with a printed note, when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not installed: plots skipped ({INSTALL_HINT})", flush=True)
        return []
    except Exception as exc:  # a broken matplotlib must not lose a finished benchmark's table and JSON
        print(f"matplotlib failed to load ({type(exc).__name__}: {exc}): plots skipped", flush=True)
        return []
    recs = [r for r in result["records"] if not r["path"].startswith("floor")]
    floors = {r["path"]: _m(r, "sync_us") for r in result["records"] if r["path"].startswith("floor")}
    widths = sorted({r["width"] for r in recs})
    layers = sorted({r["layers"] for r in recs})
    batch = min(r["batch"] for r in recs)
    written = []
    for axis, fixed_name, fixed_vals, var in (
        ("layers", "width", widths, "layers"),
        ("width", "layers", layers, "width"),
    ):
        fig, axes = plt.subplots(1, len(fixed_vals), figsize=(5.5 * len(fixed_vals), 4.5), squeeze=False)
        cmap = plt.get_cmap("tab20")
        colors = [cmap(i) for i in range(20)]
        for ax, fv in zip(axes[0], fixed_vals):
            for ci, path in enumerate(PATH_ORDER):
                for form in ("unfused", "fused", "block", None):
                    pts = sorted(
                        (r[var], _m(r, "sync_us"))
                        for r in recs
                        if r["path"] == path and r["form"] == form and r[fixed_name] == fv and r["batch"] == batch
                    )
                    if pts:
                        label = path + (f" ({form})" if form else "")
                        ax.plot(
                            [p[0] for p in pts],
                            [p[1] for p in pts],
                            marker={"fused": "s", "block": "^"}.get(form or "", "o"),
                            label=label,
                            color=colors[(2 * ci) % 20 if ci < 10 else (2 * ci + 1) % 20],
                            linestyle={"fused": "--", "block": ":"}.get(form or "", "-"),
                            lw=1.2,
                            ms=4,
                        )
            if "floor_empty_graph" in floors:
                ax.axhline(floors["floor_empty_graph"], color="gray", lw=0.8, ls=":", label="empty graph + sync")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(var)
            ax.set_ylabel("synced latency per step (us, median)")
            ax.set_title(f"{fixed_name}={fv}, batch={batch}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        png = out_dir / f"{stem}_vs_{axis}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        written.append(png)
    return written


def render(result: dict) -> str:
    """A launch-path result as text: :func:`table`, :func:`targets`, then its findings."""
    lines = [table(result), targets(result)]
    lines += [textwrap.fill(f"finding: {f}", WIDTH, subsequent_indent="  ") for f in result.get("findings", [])]
    return "\n".join(lines)


# -- rawgraph bench report ------------------------------------------------------------------------
# A results file's suite, told by the keys only that suite's document has (first match wins), and
# where its text renderer and plot function (or None) live, imported only when that kind is rendered.
KINDS: list[tuple[str, Callable[[dict], bool], str, str, str | None]] = [
    ("paths", lambda r: "records" in r and "grid" in r, "rawgraph.bench.report", "render", "plots"),
    # benchmarks/gemm_sweep.py writes rows and copy_GBps too, but with best_cuts and rows of M, N, K
    (
        "kernels",
        lambda r: "rows" in r and "copy_GBps" in r and "best_cuts" not in r,
        "rawgraph.bench.kernel_times",
        "render",
        None,
    ),
    (
        "buckets",
        lambda r: "uniform" in r and "decode" in r and "strategies" in r,
        "rawgraph.bench.buckets",
        "render",
        "plots",
    ),
    ("slots", lambda r: "bare_launch_us" in r and "strategies" in r, "rawgraph.bench.slots", "report", None),
    ("choose", lambda r: "best_fixed" in r and "us_per_step" in r, "rawgraph.bench.choose", "render", None),
]


def renderers(kind: str) -> tuple[Callable[[dict], str], Callable[[dict, Path, str], list] | None]:
    """The text renderer and the plot function (None: the suite draws none) of results of ``kind``."""
    module, text, draw = next((m, t, d) for name, _, m, t, d in KINDS if name == kind)
    mod = importlib.import_module(module)
    return getattr(mod, text), (getattr(mod, draw) if draw else None)


def kind_of(result: Any) -> str | None:
    """Which suite wrote ``result`` (``"paths"``, ``"kernels"``, ...), or None."""
    if not isinstance(result, dict):
        return None
    return next((name for name, match, *_ in KINDS if match(result)), None)


def html_page(title: str, text: str, pngs: list[Path], note: str | None, env: dict | None = None) -> str:
    """One self-contained HTML page: the text as preformatted, then each plot inline (base64 PNG),
    or ``note`` where there are none."""
    env = env or {}
    facts = ", ".join(f"{k} {env[k]}" for k in ("commit", "gpu", "driver", "date") if env.get(k))
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em} pre{font-size:12px;line-height:1.25} "
        "img{max-width:100%;display:block;margin:1em 0}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if facts:
        parts.append(f"<p>{html.escape(facts)}</p>")
    parts.append(f"<pre>{html.escape(text)}</pre>")
    if pngs:
        parts.append("<h2>Plots</h2>")
        for png in pngs:
            data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
            parts.append(f'<img alt="{html.escape(Path(png).stem)}" src="data:image/png;base64,{data}">')
    if note:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The options of ``rawgraph bench report`` (no GPU needed, ever)."""
    p = command.parser(
        "rawgraph bench report",
        "Render a results file again, with no GPU: the table on stdout, and an HTML page with the "
        "table and the plots (plots need matplotlib). Reads the JSON any suite wrote "
        "(paths, kernels, buckets, slots, choose).",
        json_help="",
    )
    p.add_argument("file", metavar="FILE", help="a results JSON written by a rawgraph bench suite")
    p.add_argument(
        "--html",
        metavar="PATH",
        default=None,
        help="where to write the HTML page (default: FILE's name with .html, in the current folder)",
    )
    p.add_argument("--no-html", action="store_true", help="print the table only; write no page")
    p.add_argument("--no-plots", action="store_true", help="leave the plots out of the page")
    return p


def main(argv: list[str] | None = None) -> int:
    """``rawgraph bench report FILE``: the table on stdout, the HTML page written, status on stderr.

    Returns
    -------
    int
        0; 2 (with the reason) for a file that cannot be read, is not JSON or is no suite's
        results; 1 when the renderer fails on it (a results file older than the renderer).
    """
    p = build_parser()
    args = p.parse_args(argv)
    path = Path(args.file)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        p.error(f"cannot read {path}: {exc}")
    kind = kind_of(result)
    if kind is None:
        p.error(
            f"{path} is no rawgraph bench results file (expected one written by a suite: "
            f"{', '.join(name for name, *_ in KINDS)})"
        )
    text_of, draw = renderers(kind)
    try:
        text = text_of(result)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        print(
            f"rawgraph bench report: cannot render {path} as {kind} results ({type(exc).__name__}: {exc}); "
            "it may predate this version of the renderer",
            file=sys.stderr,
        )
        return command.EX_FAILED
    print(text, flush=True)
    if args.no_html:
        return command.EX_OK
    note = None
    pngs: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        if args.no_plots:
            note = "plots left out (--no-plots)"
        elif draw is None:
            note = f"no plots for {kind} results"
        elif not importable("matplotlib"):
            note = f"matplotlib is not installed: the page has no plots ({command.INSTALL_EXTRA.format(extra='bench')})"
            print(note, flush=True)
        else:
            pngs = draw(result, Path(tmp), path.stem)
        page = html_page(f"rawgraph bench {kind}: {path.name}", text, pngs, note, result.get("env"))
    out = Path(args.html) if args.html else Path(path.stem + ".html")
    out.write_text(page, encoding="utf-8")
    print(f"html: {out}", file=sys.stderr)
    return command.EX_OK


if __name__ == "__main__":
    raise SystemExit(main())
