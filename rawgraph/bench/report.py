"""Terminal table and PNG plots for a launch-path benchmark result."""

from __future__ import annotations

from pathlib import Path

from .progress import INSTALL_HINT

PATH_ORDER = ["stream", "graph", "graph_nopdl", "graph_copy", "graph_update", "graph_update2", "graph_indirect", "graph_indirect_mapped", "graph_exec_update", "torch_eager", "torch_graph",
              "torch_graph_copy", "torch_graph_rebind", "cupy_eager", "cupy_graph", "floor_sync", "floor_empty_kernel", "floor_empty_graph"]


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
    recs = sorted(result["records"], key=lambda r: (r["layers"], r["width"], r["batch"], PATH_ORDER.index(r["path"]), str(r["form"])))
    head = f"{_KEY_HEAD} {'sync us':>9s} {'p10-p90':>17s} {'host us':>9s} {'device us':>9s}"
    lines = [head, "-" * len(head)]
    for r in recs:
        s = r["sync_us"]
        spread = f"{s['p10']:.1f}-{s['p90']:.1f}" if s else ""
        lines.append(f"{_key(r)} {_m(r, 'sync_us'):9.2f} {spread:>17s} {_m(r, 'host_us'):9.2f} {_m(r, 'device_us'):9.2f}")
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

    lines = [f"re-binding x and out, {form} w{b['config']['width']} b{b['config']['batch']}, "
             f"{b['nodes_pushed']} nodes pushed, interleaved rounds (median us):",
             row("per step", [("replay", "replay"), ("apply2+replay", "apply2_replay"),
                              ("bind_many2+replay", "bind2_replay")]),
             row("per step", [("raw pushes+replay", "raw_setparams_replay"),
                              ("raw changed pushes+replay", "raw_changed_setparams_replay")]),
             row("calls", [("apply2", "apply2_call"), ("bind_many2", "bind2_call"), ("raw pushes", "raw_setparams_call"),
                           ("raw changed pushes", "raw_changed_setparams_call")]),
             row("calls", [("apply2 Python", "apply2_python_us"), ("no-op bind_many2+replay", "bind2_noop_replay")]),
             row("after push / none", [("cuGraphLaunch", "launch_call_after_push"), ("/", "launch_call_no_push"),
                                       ("device", "device_after_push"), ("/", "device_no_push")])]
    if "torch_graph_copy_replay" in m:
        r = b["ratios_vs_torch_graph_copy"]
        lines.append(row("torch", [("replay", "torch_graph_replay"), ("copy_+replay", "torch_graph_copy_replay")]))
        short = {"raw_setparams_replay": "raw", "raw_changed_setparams_replay": "raw changed"}
        lines.append("  vs torch copy_+replay: " + ", ".join(
            f"{short.get(k, k.replace('_replay', ''))} {v:.2f}x" for k, v in r.items()))
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
    # issue 23's small-work floor: the replay, and the best way of feeding new arrays
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
        forms = ["unfused"] if "unfused" in label else (["fused", "block"] if "fused" in label else ["unfused", "fused", "block"])
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
            lines.append(f"{label:48s} {form:8s} {a:8.2f} - {b:8.2f} = {a - b:5.2f}  {'met' if a - b <= 1.5 else 'MISSED'}")
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
    for axis, fixed_name, fixed_vals, var in (("layers", "width", widths, "layers"), ("width", "layers", layers, "width")):
        fig, axes = plt.subplots(1, len(fixed_vals), figsize=(5.5 * len(fixed_vals), 4.5), squeeze=False)
        cmap = plt.get_cmap("tab20")
        colors = [cmap(i) for i in range(20)]
        for ax, fv in zip(axes[0], fixed_vals):
            for ci, path in enumerate(PATH_ORDER):
                for form in ("unfused", "fused", "block", None):
                    pts = sorted((r[var], _m(r, "sync_us")) for r in recs
                                 if r["path"] == path and r["form"] == form and r[fixed_name] == fv and r["batch"] == batch)
                    if pts:
                        label = path + (f" ({form})" if form else "")
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker={"fused": "s", "block": "^"}.get(form or "", "o"),
                                label=label, color=colors[(2 * ci) % 20 if ci < 10 else (2 * ci + 1) % 20],
                                linestyle={"fused": "--", "block": ":"}.get(form or "", "-"), lw=1.2, ms=4)
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


def main(argv: list[str] | None = None) -> int:
    """``python -m rawgraph.bench.report RESULT.json``: print the table and redraw the plots."""
    import argparse
    import json
    import textwrap

    p = argparse.ArgumentParser(prog="python -m rawgraph.bench.report")
    p.add_argument("json")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    path = Path(args.json)
    result = json.loads(path.read_text())
    print(table(result))
    print(targets(result))
    for f in result.get("findings", []):
        print(textwrap.fill(f"finding: {f}", WIDTH, subsequent_indent="  "))
    if not args.no_plots:
        for png in plots(result, path.parent, path.stem):
            print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
