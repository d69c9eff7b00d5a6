"""A PNG timeline of a trace (matplotlib, the ``trace`` extra): the first few steps of each path,
each path on two rows (its host's driver calls above its device's spans), all on one time axis
of microseconds since the path's first drawn step began.

Drawn from the Trace Event Format document itself (:meth:`Tracer.to_chrome
<rawgraph.trace.tracer.Tracer.to_chrome>`, or a JSON file read back), so a trace can be drawn
again on a machine with no GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .records import DEVICE_PID_BASE

# Colours by span category (host groups, device kinds).
COLOURS = {
    "launch": "#d62728",
    "graph": "#9467bd",
    "update": "#ff7f0e",
    "copy": "#8c564b",
    "sync": "#7f7f7f",
    "kernel": "#1f77b4",
    "memcpy": "#8c564b",
    "memset": "#bcbd22",
    "step": "#2ca02c",
}
HOST_CATS = ("launch", "graph", "update", "copy", "sync")


def windows(doc: dict[str, Any], steps: int = 3) -> list[tuple[str, float, float, set[int]]]:
    """``(path, start us, end us, step indices)`` of the first ``steps`` steps of each path, in
    the order the paths ran."""
    by_path: dict[str, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "step" and "path" in e.get("args", {}):
            by_path.setdefault(e["args"]["path"], []).append(e)
    out = []
    for path, evs in by_path.items():
        evs = sorted(evs, key=lambda e: e["ts"])[:steps]
        out.append((path, evs[0]["ts"], max(e["ts"] + e["dur"] for e in evs), {e["args"]["index"] for e in evs}))
    return out


def draw(doc: dict[str, Any], path: str | Path, steps: int = 3, title: str = "") -> Path:
    """Draw the timeline of ``doc`` into the PNG file ``path``.

    A device span belongs to a path's window when the host call that launched it (its
    ``correlation``) ran in one of the drawn steps, or, without correlations (the CUDA-event
    fallback), when it is the device span of one of those steps.

    Raises
    ------
    ImportError
        matplotlib is not installed (``pip install 'rawgraph[trace]'``).
    ValueError
        The trace has no steps to draw.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wins = windows(doc, steps)
    if not wins:
        raise ValueError("the trace has no steps (Tracer.step) to draw")
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    host = [e for e in events if e["pid"] < DEVICE_PID_BASE and e.get("cat") in HOST_CATS]
    device = [e for e in events if e["pid"] >= DEVICE_PID_BASE]
    corrs_all = {e["args"]["correlation"] for e in host if "correlation" in e.get("args", {})}
    steps_by_index = {e["args"]["index"]: e for e in events if e.get("cat") == "step" and e["pid"] < DEVICE_PID_BASE}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(wins) * 2 + 1.5))
    labels, row = [], 0
    longest = 0.0
    for name, t0, t1, idx in wins:
        calls = [e for e in host if e.get("args", {}).get("step") in idx]
        corrs = {e["args"]["correlation"] for e in calls if "correlation" in e["args"]}
        dev = [
            e
            for e in device
            if e["args"].get("correlation") in corrs
            or (e.get("cat") == "step" and e["args"].get("step") in idx)
            # launched by calls the tracer did not wrap (PyTorch's): those that began in the window
            or (e["args"].get("correlation") not in corrs_all and e.get("cat") != "step" and t0 <= e["ts"] < t1)
        ]
        for i in idx:  # each step as a light band behind its path's host row
            st = steps_by_index[i]
            ax.broken_barh([(st["ts"] - t0, st["dur"])], (row - 0.5, 1.0), color=COLOURS["step"], alpha=0.12)
        for y, spans in ((row, calls), (row + 1, dev)):
            for e in spans:
                x = e["ts"] - t0
                ax.broken_barh([(x, max(e["dur"], 0.05))], (y - 0.4, 0.8), color=COLOURS.get(e.get("cat", ""), "#333"))
                longest = max(longest, x + e["dur"])
        labels += [f"{name}: host", f"{name}: device"]
        row += 2
    ax.set_yticks(range(row))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()  # the first path on top, each host row above its device row
    ax.set_xlim(0, longest * 1.02 if longest else 1)
    ax.set_xlabel(f"microseconds since the path's first drawn step (first {steps} steps of each path)")
    source = doc.get("metadata", {}).get("device_source", "?")
    ax.set_title(title or f"host launches against device work (device spans: {source})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="lower right", fontsize=7, ncol=3)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
