"""The regret of the measured-cost choice: :func:`rawgraph.serving.choose_strategy`
picks a strategy from the first ``--sample`` steps of a decode-like batch-size trace; then every
strategy replays the whole trace, in interleaved rounds, and the choice's median time is
compared with the best fixed strategy's (:func:`rawgraph.serving.regret`; target <= 3 %).

Each strategy replays ``run(x, n)`` per step on one stream (``run(n)`` for the device-shaped
graph), synchronized once per pass over the trace, as the choice's own timer does; the figure
per strategy is the median over ``--rounds`` passes (p10/p90 beside it). All of them are built
once and stay resident, so rounds interleave. Writes ``<out>/<name>.json`` with the commit.

    rawgraph bench choose --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import command
from .provenance import environment

TARGET_REGRET = 0.03


DESCRIPTION = (
    "The regret of the measured-cost strategy choice: choose_strategy picks a strategy from the first "
    "--sample steps of a decode-like batch-size trace; then every strategy replays the whole trace in "
    "interleaved rounds, and the choice's median time is compared with the best fixed strategy's "
    f"(target: at most {100 * TARGET_REGRET:.0f} % slower). Writes OUT/NAME.json; prints the figures."
)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``rawgraph bench choose`` (parsing them needs no GPU)."""
    p = command.parser("rawgraph bench choose", DESCRIPTION)
    command.add_model_options(p, width=1024, layers=2, form="fused")
    p.add_argument("--max-batch", type=command.positive_int, default=256, help="the largest batch")
    p.add_argument("--steps", type=command.positive_int, default=1000, help="steps of the whole trace")
    p.add_argument("--sample", type=command.positive_int, default=200, help="first steps the choice is made from")
    p.add_argument("--seconds", type=command.positive_float, default=0.3, help="the choice's time per candidate")
    p.add_argument("--rounds", type=command.positive_int, default=7, help="passes over the whole trace per strategy")
    command.add_trace_options(p, rate=6.0, mean_len=32.0, seed=7)
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    p.add_argument("--name", default="choose", help="file stem of the JSON")
    return p


def trace_seconds(adapter: Any, trace: list[int], rounds: int, warmup: bool = True) -> list[float]:
    """Seconds per pass of ``adapter`` over ``trace`` (``rounds`` passes), after one warm-up pass
    unless ``warmup`` is False."""
    if warmup:
        for n in trace:
            adapter.step(n)
    adapter.sync()
    out = []
    clock = time.perf_counter
    for _ in range(rounds):
        t0 = clock()
        for n in trace:
            adapter.step(n)
        adapter.sync()
        out.append(clock() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure the choice's regret; write the JSON; the figures (or, with ``--json``, the result)
    on stdout, progress on stderr. Returns the exit status: 0, or 69 without a GPU."""
    args = build_parser().parse_args(argv)
    from ..runtime.device import driver_status, gpu_available

    if not gpu_available():
        print(f"rawgraph bench choose: needs a GPU: {driver_status()[1]}", file=sys.stderr)
        return command.EX_UNAVAILABLE
    return command.run_suite(args, collect, render)


def collect(args: argparse.Namespace) -> dict:
    """Make the choice, replay the trace through every strategy, write the JSON; return the result."""
    from ..models.tinyblock import TinyBlock
    from ..runtime.stream import Stream
    from ..runtime.timing import stats
    from ..serving.choose import DEFAULT_CANDIDATES, Adapter, choose_strategy, footprint, regret
    from .buckets import decode_trace

    trace, _finished = decode_trace(args.steps, args.max_batch, args.rate, args.mean_len, args.seed)
    sample = trace[: args.sample]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with TinyBlock(args.width, batch=1, layers=args.layers, seed=3, form=args.form) as model, Stream() as s:
        t0 = time.perf_counter()
        choice = choose_strategy(model, sample, args.max_batch, stream=s, seconds=args.seconds)
        choose_s = time.perf_counter() - t0
        print(f"choice: {choice.name} in {choose_s:.2f} s (sample figures {choice.seconds})", flush=True)
        built: dict[str, Any] = {}
        skipped = dict(choice.skipped)
        try:
            for name, factory in DEFAULT_CANDIDATES.items():
                try:
                    built[name] = factory(model, args.max_batch, s)
                except Exception as exc:  # the choice skipped it too, with its reason
                    skipped.setdefault(name, f"failed to build: {type(exc).__name__}: {exc}")
            print(f"built {sorted(built)} in {time.perf_counter() - t0 - choose_s:.2f} s", flush=True)
            adapters = {name: Adapter(obj, s) for name, obj in built.items()}
            samples: dict[str, list[float]] = {name: [] for name in built}
            for ad in adapters.values():  # one warm-up pass each, then only timed passes
                trace_seconds(ad, trace, 0)
            for k in range(args.rounds):  # interleaved: one pass of each strategy per round
                for name, ad in adapters.items():
                    samples[name] += trace_seconds(ad, trace, 1, warmup=False)
                print(f"round {k + 1}/{args.rounds} at {time.perf_counter() - t0:.1f} s", flush=True)
            memory = {name: footprint(obj) for name, obj in built.items()}
        finally:
            for obj in built.values():
                obj.close()
    medians = {name: float(np.median(v)) for name, v in samples.items()}
    best = min(medians, key=lambda k: medians[k])
    r = regret(choice.name, medians) if choice.name in medians else None
    result: dict[str, Any] = {
        "env": environment(),
        "config": vars(args),
        "trace_mean_batch": float(np.mean(trace)),
        "sample_mean_batch": float(np.mean(sample)),
        "choice": {
            "name": choice.name,
            "sample_seconds": choice.seconds,
            "skipped": choice.skipped,
            "memory": choice.memory,
            "wall_s": choose_s,
        },
        "trace_seconds": {name: stats(v) for name, v in samples.items()},
        "us_per_step": {name: 1e6 * m / len(trace) for name, m in medians.items()},
        "memory": memory,
        "skipped": skipped,
        "best_fixed": best,
        "regret": r,
        "target_regret": TARGET_REGRET,
        "met": r is not None and r <= TARGET_REGRET,
    }
    path = out_dir / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"json: {path}")
    return result


def render(result: dict) -> str:
    """A choose result as text: the trace, each strategy's time per step, the regret of the choice."""
    cfg, choice = result["config"], result["choice"]
    lines = [
        f"trace: {cfg['steps']} steps, mean batch {result['trace_mean_batch']:.1f}; sample: first "
        f"{min(cfg['sample'], cfg['steps'])} (mean {result['sample_mean_batch']:.1f}); choice made in "
        f"{choice['wall_s']:.2f} s"
    ]
    for name, us in result["us_per_step"].items():
        st = result["trace_seconds"][name]
        mark = " <- choice" if name == choice["name"] else ""
        lines.append(
            f"  {name:14s} {us:8.2f} us/step  (pass p10 {1e3 * st['p10']:.2f} / "
            f"median {1e3 * st['median']:.2f} / p90 {1e3 * st['p90']:.2f} ms){mark}"
        )
    for name, why in result["skipped"].items():
        lines.append(f"  {name:14s} skipped: {why}")
    r = result["regret"]
    rtxt = "n/a" if r is None else f"{100 * r:.2f} %"
    lines.append(
        f"best fixed: {result['best_fixed']}; regret of the choice: {rtxt} (target <= "
        f"{100 * result['target_regret']:.0f} %: {'met' if result['met'] else 'MISSED'})"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
