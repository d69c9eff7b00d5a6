"""Shared test helpers (imported by GPU tests)."""

import dataclasses
import gc
import os
import threading
import time

import numpy as np

# Under compute-sanitizer (device_run.sh sets RAWGRAPH_SANITIZER) every host call and launch is
# many times slower, while a spin kernel still waits the same device time: a spin meant to keep
# work queued while Python runs must be longer there.
UNDER_SANITIZER = bool(os.environ.get("RAWGRAPH_SANITIZER"))
SANITIZER_SLOWDOWN = 10 if UNDER_SANITIZER else 1

# Under compute-sanitizer the Python frame of every driver call (cuLaunchKernel, cuGraphLaunch)
# stays referenced, so the locals of the code that made it live on: a temporary stream's tail
# event, a closed launcher exec (benchmarks/probes/sanitizer_frames.py shows it; without the
# sanitizer nothing is retained). Checks that an object was destroyed once unreferenced are
# therefore made only without the sanitizer; everything else those tests check still runs.
CHECK_DESTRUCTION = not UNDER_SANITIZER

# Other processes on the same GPU (benchmarks/memcheck_gpu_tests.sh with MEMCHECK_PARALLEL sets
# RAWGRAPH_SHARED_GPU): the device's free memory then moves with their allocations too, so tests
# that measure it (cuMemGetInfo before and after) are made only on a GPU of their own.
GPU_TO_ITSELF = not os.environ.get("RAWGRAPH_SHARED_GPU")


def spin_ns(ns):
    """``ns`` of device time to queue in front of work that must still be queued when the host
    code after the launch runs (``ns`` times :data:`SANITIZER_SLOWDOWN`)."""
    return int(ns) * SANITIZER_SLOWDOWN


def spin_after_collecting(device, ns, stream):
    """Queue ``ns`` of device time on ``stream`` in front of work a test must find still queued,
    after collecting earlier tests' garbage: a collection during the host calls that follow could
    run a ``cuMemFree``, which the driver documents may synchronize, and so wait out the spin."""
    from rawgraph import ops

    gc.collect()
    ops.spin(device, ns)(stream)


def rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert np.all(np.isfinite(got)), "non-finite output (an unwritten, poisoned element?)"
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def perturbed_tolerance(xh, weights, rng, tol=1e-5, trials=4):
    """``tol``, or more where the block itself is ill-conditioned: a width-1 block whose residual
    add cancels (1 + w1 w2 near 0 in a layer) leaves outputs 1e-4 of its intermediates, so float32
    rounding of those intermediates is 6e-5 of the output (seen on an H100, 2026-12-06, seed
    304102080171447095890217911722853984241). The float64 block is rerun with x, every weight and
    every intermediate (h, the matmul, the sum) moved by a relative 2^-24, one float32 rounding of
    random sign; 8 times the largest change is what a correct float32 run may miss by. (3000 random
    width-1, 8-layer blocks in float32 NumPy: at most 0.07 of it; 200 of width 64: none above ``tol``.)"""
    from rawgraph.models.tinyblock import reference_forward

    ref = reference_forward(xh, weights)
    u = 2.0**-24

    def bump(a):
        a = np.asarray(a, np.float64)
        return a * (1 + u * rng.choice([-1.0, 1.0], size=a.shape))

    moved = 0.0
    for _ in range(trials):
        y = bump(xh)
        for w1, w2 in weights:
            h = bump(y @ bump(w1))
            y = bump(bump(np.maximum(h, 0.0) @ bump(w2)) + y)
        moved = max(moved, rel_err(y, ref))
    return max(tol, 8 * moved)


def random_input(rng, shape):
    """Standard normal float32, never all zeros."""
    x = rng.standard_normal(shape, dtype=np.float32)
    assert np.any(x != 0)
    return x


def exact_run(model, xh, n, stream):
    """The eager run of ``model``'s n-row plan on ``xh[:n]`` (its own buffers and scratch): the
    output rows and the plan's kernel names."""
    from rawgraph import DeviceBuffer

    with (
        model.with_batch(n) as m,
        DeviceBuffer.from_numpy(np.ascontiguousarray(xh[:n])) as x,
        DeviceBuffer((n, model.width)) as out,
    ):
        plan = m.plan(x, out)
        plan.run(stream)
        return out.to_numpy(stream), [l.kernel.name for l in plan.launches]


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


def describe_holders(obj, depth=4, width=4):
    """Who keeps ``obj`` alive: its referrers (``gc.get_referrers``), theirs, ``depth`` levels,
    as one line per object (type and a short repr; a frame names its code). A failing lifetime
    check prints it."""
    import gc
    import sys
    import types

    lines: list[str] = []
    seen = {id(obj), id(lines), id(sys._getframe())}
    frontier = [(obj, 0)]
    seen.add(id(frontier))
    while frontier:
        cur, level = frontier.pop(0)
        if level >= depth:
            continue
        refs = [
            r
            for r in gc.get_referrers(cur)
            if id(r) not in seen
            and not (isinstance(r, tuple) and len(r) == 2 and r[0] is cur and isinstance(r[1], int))
        ]
        for r in refs[:width]:
            seen.add(id(r))
            if isinstance(r, types.FrameType):
                text = f"frame of {r.f_code.co_name} at {r.f_code.co_filename.rsplit('/', 1)[-1]}:{r.f_lineno}"
            elif isinstance(r, (dict, list, tuple, set)):
                text = f"{type(r).__name__} of {len(r)}"
                if isinstance(r, dict):
                    text += f" (keys {[k for k, v in r.items() if v is cur][:3]!r})"
            else:
                text = repr(r)
            lines.append(f"{'  ' * level}<- {type(r).__name__}: {text[:160]}")
            frontier.append((r, level + 1))
    return "\n".join(lines)


def torch_with_graphs():
    """torch, skipping the test where it is missing, has no CUDA, or is too old to hand out its
    graph (``CUDAGraph(keep_graph=True)``, torch >= 2.8)."""
    import pytest

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from rawgraph.updates.adopt import TORCH_MIN, _version

    if _version(torch.__version__) < TORCH_MIN:
        pytest.skip(f"torch {torch.__version__} has no CUDAGraph(keep_graph=True)")
    return torch


def refuses_what_the_driver_forbids(dsg, monkeypatch, names):
    """A DeviceShapedGraph refuses a second instantiate, exec updates, a clone and an update
    manager before any of the driver calls ``names`` is made."""
    import pytest
    from cuda.bindings import driver

    from rawgraph import AddressRebinder, DeviceUpdatableError, ExecUpdateManager
    from rawgraph.serving import DeviceShapedError

    calls: list[str] = []
    for name in names:
        real = getattr(driver, name)
        monkeypatch.setattr(driver, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    with pytest.raises(DeviceUpdatableError, match="instantiated only once"):
        dsg.graph.instantiate()
    with pytest.raises(DeviceUpdatableError, match="cuGraphExecUpdate"):
        dsg.exec.update(dsg.graph)
    with pytest.raises(DeviceUpdatableError, match="cuGraphExecUpdate"):
        dsg.update(dsg.graph)
    with pytest.raises(DeviceShapedError, match="cloned"):
        dsg.clone()
    with pytest.raises(DeviceUpdatableError, match="ExecUpdateManager"):
        ExecUpdateManager(dsg.graph, dsg.exec)
    with pytest.raises(DeviceUpdatableError, match="AddressRebinder"):
        AddressRebinder(dsg.graph, dsg.exec)
    assert calls == []


def tiny_model(rng, batch=2, width=128, form="fused"):
    """A one-layer TinyBlock with a seed drawn from ``rng``."""
    from rawgraph import TinyBlock

    return TinyBlock(width, batch, 1, seed=int(rng.integers(1 << 30)), form=form)


def eager_output(model, x, stream):
    """The model's eager output for ``x`` (into a poisoned buffer), on the host."""
    from rawgraph import DeviceBuffer

    out = DeviceBuffer((model.batch, model.width))
    out.poison(stream)
    model.forward(x, out, stream)
    return out.to_numpy(stream)


def device_inputs(rng, model, k, stream):
    """``k`` random inputs for ``model``: the host arrays and their device copies."""
    from rawgraph import DeviceBuffer

    hosts = [random_input(rng, (model.batch, model.width)) for _ in range(k)]
    return hosts, [DeviceBuffer.from_numpy(h, stream=stream) for h in hosts]


class Overlap:
    """Wraps a driver function: every call pauses inside it, so a second thread let into the same
    critical section meanwhile is seen (``overlaps``). With the owner's lock there is none."""

    def __init__(self, fn, pause=0.02):
        self.fn, self.pause, self.inside, self.overlaps, self.calls = fn, pause, 0, 0, 0
        self.__name__ = fn.__name__  # rawgraph.runtime.errors.call names the call by it
        self._lock = threading.Lock()

    def __call__(self, *args):
        with self._lock:
            self.inside += 1
            self.calls += 1
            self.overlaps += self.inside > 1
        try:
            time.sleep(self.pause)  # releases the GIL: the other thread runs now if nothing stops it
            return self.fn(*args)
        finally:
            with self._lock:
                self.inside -= 1


def referrers(obj):
    """What still refers to ``obj`` (for a failure message)."""
    return [type(r).__name__ + (f" {sorted(r)[:6]}" if isinstance(r, dict) else "") for r in gc.get_referrers(obj)]


def two_threads(work_a, work_b):
    """Run both from one barrier; returns the exceptions they raised."""
    start, errors = threading.Barrier(2, timeout=30), []

    def run(work):
        start.wait()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in (work_a, work_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


@dataclasses.dataclass
class RowTableRun:
    """Two runs of one GEMM launch whose x, r and y rows go through a row table (the slot pool's
    fused gather and scatter): y[table[i]] = x[table[i]] @ W + r[table[i]] for the m live rows."""

    routes: bool  # ops.routes_rows(launch): the launch reads its rows through the table
    outs: list  # y as a whole after each run (poisoned before each)
    table: np.ndarray  # live row i -> state row
    ref: np.ndarray  # float64 reference of y's live rows
    rest: np.ndarray  # the state rows outside the table: never written


def row_table_run(device, stream, rng, m, k, shape, **matmul_kw):
    """:class:`RowTableRun` of ``ops.matmul`` at ``shape`` over a state of 3 m + 1 rows."""
    from rawgraph import DeviceBuffer, ops
    from rawgraph.runtime.memory import DeviceArray

    states = 3 * m + 1
    table = rng.permutation(states)[:m].astype(np.int32)
    xh, wh, rh = random_input(rng, (states, k)), random_input(rng, (k, k)), random_input(rng, (states, k))
    bufs = {
        "x": DeviceBuffer.from_numpy(xh),
        "W": DeviceBuffer.from_numpy(wh),
        "r": DeviceBuffer.from_numpy(rh),
        "y": DeviceBuffer((states, k)),
        "t": DeviceBuffer.from_numpy(table),
    }
    views = {"W": bufs["W"].view()}
    views.update({key: DeviceArray(bufs[key].ptr, (m, k), np.float32, bufs[key]) for key in ("x", "r", "y")})
    launch = ops.matmul(device, views, "x", "W", "y", "add", r="r", shape=shape, **matmul_kw)
    routes = ops.routes_rows(launch)
    for arg in ("x", "r", "y"):
        launch.args["flags"] = int(launch.args["flags"]) | ops.ROW_FLAGS[arg]
    launch.args["rows"] = bufs["t"].ptr
    outs = []
    for _ in range(2):
        bufs["y"].poison(stream)
        launch(stream)
        stream.synchronize()
        outs.append(bufs["y"].to_numpy())
    for b in bufs.values():
        b.close()
    ref = xh[table].astype(np.float64) @ wh + rh[table]
    return RowTableRun(routes, outs, table, ref, np.setdiff1d(np.arange(states), table))


def usable_afterwards(stream, rng):
    """The stream is not capturing, no rawgraph capture is open, eager work runs, it captures again."""
    from rawgraph import DeviceBuffer, TinyBlock, capture_plan
    from rawgraph.runtime import _capturing

    assert not stream.is_capturing()
    assert _capturing.active() == []
    model = TinyBlock(64, 2, 1, form="fused")
    xh = random_input(rng, (2, 64))
    x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((2, 64))
    ref = model.reference(xh, stream)
    out.poison(stream)
    model.forward(x, out, stream)
    assert rel_err(out.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"
    graph = capture_plan(model.plan(x, out), stream)
    out.poison(stream)
    graph.instantiate().launch(stream)
    assert rel_err(out.to_numpy(stream), ref) < 1e-5, f"seed {rng.seed_used}"


def model_io(rng, stream, width=64, batch=2, layers=1, form="fused"):
    """A TinyBlock with a seed drawn from ``rng``, a random input (host and device) and an output buffer."""
    from rawgraph import DeviceBuffer, TinyBlock

    model = TinyBlock(width, batch, layers, seed=int(rng.integers(1 << 30)), form=form)
    xh = random_input(rng, (batch, width))
    x, out = DeviceBuffer.from_numpy(xh, stream=stream), DeviceBuffer((batch, width))
    return model, xh, x, out


def child_report(code, *args, debug_malloc=False):
    """Run ``code`` in a fresh interpreter on this checkout; its last stdout line is a JSON report.

    For hazards that may crash the process or fault its context (the driver calling freed memory, a
    kernel device-launching a destroyed exec): they must not take the test session down with them."""
    import json
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    import pytest

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    if debug_malloc:
        env["PYTHONMALLOC"] = "debug"
    try:
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child process hung (a replay calling into freed memory?): {exc}")
    assert r.returncode == 0, f"child exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def collect_at(edge, begin_name, doomed, monkeypatch):
    """Patch the driver so that garbage collection frees ``doomed`` (a self-referencing list holding a
    buffer, so only the cycle collector frees it) right after the capture begins (``edge`` "begin",
    the driver's ``begin_name``) or right before it ends ("end"): the two moments a finalizer runs
    inside the capture unless rawgraph counts the capture open from its first to its last driver call."""
    from cuda.bindings import driver

    name = begin_name if edge == "begin" else "cuStreamEndCapture"
    real = getattr(driver, name)

    def at_the_edge(*args):
        if edge == "end":
            doomed.clear()
            gc.collect()
        result = real(*args)
        if edge == "begin":
            doomed.clear()
            gc.collect()
        return result

    monkeypatch.setattr(driver, name, at_the_edge)


def cyclic_buffer():
    """A 4 KiB buffer in a self-referencing list (freed only by the cycle collector), and its address."""
    from rawgraph import DeviceBuffer

    buf = DeviceBuffer(4096)
    cycle: list = [buf]
    cycle.append(cycle)
    return cycle, int(buf.ptr)


def is_freed(ptr):
    """The driver no longer knows ``ptr`` as device memory."""
    from cuda.bindings import driver

    err, _kind = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    return err != driver.CUresult.CUDA_SUCCESS
