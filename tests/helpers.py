"""Shared test helpers (imported by GPU tests)."""

import numpy as np


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
