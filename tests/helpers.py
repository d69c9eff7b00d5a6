"""Shared test helpers (imported by GPU tests)."""

import os

import numpy as np

# Under compute-sanitizer (device_run.sh sets RAWGRAPH_SANITIZER) every host call and launch is
# many times slower, while a spin kernel still waits the same device time: a spin meant to keep
# work queued while Python runs must be longer there.
SANITIZER_SLOWDOWN = 10 if os.environ.get("RAWGRAPH_SANITIZER") else 1


def spin_ns(ns):
    """``ns`` of device time to queue in front of work that must still be queued when the host
    code after the launch runs (``ns`` times :data:`SANITIZER_SLOWDOWN`)."""
    return int(ns) * SANITIZER_SLOWDOWN


def rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert np.all(np.isfinite(got)), "non-finite output (an unwritten, poisoned element?)"
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def random_input(rng, shape):
    """Standard normal float32, never all zeros."""
    x = rng.standard_normal(shape, dtype=np.float32)
    assert np.any(x != 0)
    return x


def bench_script(name):
    """A benchmark script of this checkout (``benchmarks/NAME.py``), imported as a module, so its
    checks run in-process."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"rawgraph_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
