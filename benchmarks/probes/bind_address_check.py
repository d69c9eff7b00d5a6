"""What the bind fast path's address check costs: ``ExecUpdateManager.bind`` as it is, against the
same method with that one check taken out (its source, the clause removed), in one process,
interleaved, warm.

The check: an array bound before is found in the manager's cache by identity; for one whose memory
can move while the object stays (a torch tensor after ``t.set_``; any ``__cuda_array_interface__``
object rawgraph does not know) its address is read again and compared with the cached one. A
DeviceBuffer, a DeviceArray and a CuPy array cannot move: for them the check is one ``is None`` test.

    PYTHONPATH=. python3 benchmarks/probes/bind_address_check.py [--rounds 2000] [--repeats 21]

With a GPU it binds real arrays (DeviceBuffer, torch and CuPy when importable, a plain
``__cuda_array_interface__`` object) into a TinyBlock exec; without one it runs on the CPU fake
driver (``tests/fault_cases.py``) with ``cuGraphExecKernelNodeSetParams`` answering success at once,
so only the library's Python is timed. Two modes per array: ``same`` binds the bound array (no push:
the fast path alone) and ``alternate`` flips between two arrays (one push per bind). Per figure,
``--repeats`` samples of ``--rounds`` binds each, the two variants alternating which goes first;
``TIME ... added`` is the per-repeat difference (checked minus bypassed).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import fact, median_line, note  # noqa: E402

import rawgraph as rg  # noqa: E402
from rawgraph.updates import manager  # noqa: E402

# The clause this probe takes out of bind (see the module docstring); a change to it must show here.
# It stands on its own line of the condition (a backslash continuation before it, or none).
CHECK = re.compile(r"(\s*\\)?\n\s*or \(hit\.reread is not None and hit\.reread\(array\) != hit\.ptr\)")


def bind_without_check() -> Callable[..., int]:
    """``ExecUpdateManager.bind`` compiled again from its source with the address check removed,
    over a copy of the manager module's globals (nothing of the module is changed)."""
    src = textwrap.dedent(inspect.getsource(manager.ExecUpdateManager.bind))
    stripped, n = CHECK.subn("", src)
    if n != 1:
        raise SystemExit("the address check is not where this probe looks for it: update CHECK")
    scope = dict(vars(manager))
    exec(compile(stripped, manager.__file__, "exec"), scope)
    return scope["bind"]


class Interface:
    """A plain ``__cuda_array_interface__`` object (what rawgraph reads again on every bind)."""

    def __init__(self, buf: Any):
        self.buf = buf

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.buf.__cuda_array_interface__


def _sample(fn: Callable[[], Any], rounds: int) -> float:
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - t0) * 1e6 / rounds


def measure(mgr: Any, kind: str, pair: tuple, rounds: int, repeats: int) -> None:
    variants = {"checked": manager.ExecUpdateManager.bind, "bypassed": bind_without_check()}
    for mode in ("same", "alternate"):
        fns = {}
        for name, bind in variants.items():
            state = {"i": 0}
            if mode == "same":
                fns[name] = lambda bind=bind: bind(mgr, "x", pair[0])
            else:

                def flip(bind: Callable[..., int] = bind, state: dict = state) -> None:
                    state["i"] ^= 1
                    bind(mgr, "x", pair[state["i"]])

                fns[name] = flip
        mgr.bind("x", pair[1])
        mgr.bind("x", pair[0])  # both checked and cached; pair[0] bound
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():  # warm
            _sample(fn, rounds)
        for r in range(repeats):
            for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                samples[name].append(_sample(fns[name], rounds))
        for name, got in samples.items():
            median_line(f"bind {kind} {mode} {name}", got)
        median_line(f"bind {kind} {mode} added", [c - b for c, b in zip(samples["checked"], samples["bypassed"])])


def run(rounds: int, repeats: int, on_gpu: bool) -> None:
    s = rg.Stream()
    model = rg.TinyBlock(128, 1, 1, seed=1, form="fused")
    bufs = [rg.DeviceBuffer((1, 128)) for _ in range(3)]
    graph = rg.capture_plan(model.plan(bufs[0], bufs[2]), s)
    exe = graph.instantiate()
    mgr = rg.ExecUpdateManager(graph, exe)
    kinds: dict[str, tuple] = {
        "DeviceBuffer": (bufs[0], bufs[1]),
        "interface": (Interface(bufs[0]), Interface(bufs[1])),
    }
    if on_gpu:
        try:
            import torch

            kinds["torch"] = tuple(torch.zeros((1, 128), device="cuda") for _ in range(2))
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a probe reports, never stops
            note(f"torch not measured: {type(exc).__name__}: {exc}")
        try:
            import cupy

            kinds["cupy"] = tuple(cupy.zeros((1, 128), cupy.float32) for _ in range(2))
            cupy.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001
            note(f"cupy not measured: {type(exc).__name__}: {exc}")
    for kind, pair in kinds.items():
        measure(mgr, kind, pair, rounds, repeats)
    mgr.close()
    for obj in (exe, graph, model, *bufs, s):
        obj.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args(argv)
    ok, reason = rg.driver_status()
    fact("python", sys.version.split()[0])
    if ok:
        fact("device", repr(rg.get_device()))
        run(args.rounds, args.repeats, on_gpu=True)
        return 0
    note(f"no GPU ({reason.split('(')[0].strip()}): the CPU fake driver, SetParams answering success at once")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    from cuda.bindings import driver
    from fault_cases import fake_session

    with fake_session():
        real = driver.cuGraphExecKernelNodeSetParams
        ok_result = (driver.CUresult.CUDA_SUCCESS,)
        driver.cuGraphExecKernelNodeSetParams = lambda *a: ok_result
        try:
            run(args.rounds, args.repeats, on_gpu=False)
        finally:
            driver.cuGraphExecKernelNodeSetParams = real
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
