"""The tracer's NVTX ranges without a GPU: a fake ``nvtx`` module (the calls of the PyPI ``nvtx``
package the tracer makes, with that package's signatures) put in ``sys.modules`` records every
range, and the tracer runs the TinyBlock workload of tests/test_trace_cpu.py on the fake driver.

Checked: one range per path (``"path NAME"``) and one per step (``"PATH NAME INDEX"``, the names
the trace's own step spans carry), all in the domain ``"rawgraph"``, every push popped on the
thread that pushed it and properly nested (a step inside its path), each step's driver calls inside
its step's range, balanced also when the block raises; nothing pushed with ``nvtx=False``; and
without the ``nvtx`` package tracing works as before. The real package, where installed, takes the
same calls."""

from __future__ import annotations

import inspect
import sys
import threading
import time
import types
from dataclasses import dataclass, field

import pytest
from cuda.bindings import driver
from test_trace_cpu import block, trace_problems  # noqa: F401  (block: a fixture)

from rawgraph.trace import TraceError, Tracer

DOMAIN = "rawgraph"


@dataclass
class Range:
    """One NVTX range as the fake saw it."""

    thread: int
    domain: str | None
    message: str | None
    start_ns: int
    end_ns: int = -1
    parent: Range | None = None
    children: list[Range] = field(default_factory=list)


class FakeNvtx(types.ModuleType):
    """The ``nvtx`` package's push/pop API (``push_range(message=None, color="blue", domain=None,
    category=None, payload=None)``, ``pop_range(domain=None)``: its module-level functions, same
    parameters), recording ranges instead of calling libnvToolsExt. As NVTX does, each thread has
    its own stack of ranges per domain; a pop with nothing pushed in that thread and domain is
    recorded as a problem (the real library returns an error code the package drops)."""

    def __init__(self) -> None:
        super().__init__("nvtx")
        self.ranges: list[Range] = []  # every pushed range, in push order
        self.problems: list[str] = []
        self._stacks: dict[tuple[int, str | None], list[Range]] = {}
        self._lock = threading.Lock()

    def push_range(self, message=None, color="blue", domain=None, category=None, payload=None):
        key = (threading.get_ident(), domain)
        with self._lock:
            stack = self._stacks.setdefault(key, [])
            r = Range(key[0], domain, message, time.perf_counter_ns(), parent=stack[-1] if stack else None)
            if r.parent is not None:
                r.parent.children.append(r)
            stack.append(r)
            self.ranges.append(r)

    def pop_range(self, domain=None):
        key = (threading.get_ident(), domain)
        with self._lock:
            stack = self._stacks.get(key)
            if not stack:
                self.problems.append(f"pop_range(domain={domain!r}) on thread {key[0]} with no range open")
                return
            stack.pop().end_ns = time.perf_counter_ns()

    def open_ranges(self) -> list[Range]:
        return [r for r in self.ranges if r.end_ns < 0]


def same_parameters_as_the_package(fake_fn, name):
    """Where the real ``nvtx`` is installed, the fake's function takes the same parameters."""
    try:
        import nvtx as real
    except ImportError:
        return
    real_fn = getattr(real, name)
    assert list(inspect.signature(fake_fn).parameters) == list(inspect.signature(real_fn).parameters), name


@pytest.fixture
def fake_nvtx(monkeypatch):
    fake = FakeNvtx()
    same_parameters_as_the_package(fake.push_range, "push_range")
    same_parameters_as_the_package(fake.pop_range, "pop_range")
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    return fake


def _run(block, t, steps):
    """The workload of tests/test_trace_cpu.py's ``_traced`` inside an entered tracer ``t``: a
    ``"stream"`` path of eager steps and a ``"graph"`` path of replays, then a step outside any
    path and one with a name of its own."""
    fake, s, plan, graph, exe = block
    with t.path("stream"):
        for _ in range(steps):
            with t.step(s):
                plan.run(s)
    with t.path("graph"):
        for _ in range(steps):
            with t.step(s):
                exe.launch(s)
        with t.step(s, name="replay"):
            exe.launch(s)
    with t.step():
        s.synchronize()


def assert_balanced(nv: FakeNvtx):
    assert nv.problems == []
    assert nv.open_ranges() == [], [r.message for r in nv.open_ranges()]
    for r in nv.ranges:  # nested: a child lies within its parent
        assert r.start_ns <= r.end_ns
        if r.parent is not None:
            assert r.parent.start_ns <= r.start_ns <= r.end_ns <= r.parent.end_ns, (r.message, r.parent.message)


def test_a_range_per_path_and_step_in_the_rawgraph_domain_nested_and_balanced(block, fake_nvtx):
    nv = fake_nvtx
    t = Tracer(device="events")
    assert nv.ranges == []  # the package is used once the tracer starts, not before
    with t:
        _run(block, t, steps=3)
    assert_balanced(nv)
    assert {r.domain for r in nv.ranges} == {DOMAIN}
    assert {r.thread for r in nv.ranges} == {threading.get_ident()}

    paths = [h for h in t.host if h.cat == "path"]
    steps = [h for h in t.host if h.cat == "step"]
    assert [p.name for p in paths] == ["stream", "graph"] and len(steps) == 3 + 3 + 1 + 1
    # the ranges, in push order: each path, its steps inside it; the last step outside any path
    want = []
    for p in paths:
        want.append((f"path {p.name}", None))
        want += [(f"{p.name} {h.name} {h.step}", f"path {p.name}") for h in steps if h.path is p.path]
    want += [(f"{h.name} {h.step}", None) for h in steps if h.path is None]
    got = [(r.message, r.parent.message if r.parent else None) for r in nv.ranges]
    assert got == want
    assert "graph replay 6" in [m for m, _ in got] and "step 7" in [m for m, _ in got]
    assert all(not r.children for r in nv.ranges if r.parent is not None)  # a step holds no range

    # each step's range holds the step's span and every driver call made in it
    by_message = {r.message: r for r in nv.ranges}
    for h in steps:
        r = by_message[f"{h.path.name} {h.name} {h.step}" if h.path else f"{h.name} {h.step}"]
        inside = [c for c in t.host if c.step == h.step and c.cat not in ("step", "path")]
        assert inside, f"step {h.step} made no driver call"
        for c in [h, *inside]:
            assert r.start_ns <= c.start_ns <= c.end_ns <= r.end_ns, (r.message, c.name)
    assert trace_problems(t.to_chrome()) == []


def test_ranges_are_popped_when_the_block_raises(block, fake_nvtx):
    fake, s, plan, graph, exe = block
    with pytest.raises(ZeroDivisionError):
        with Tracer(device="events") as t:
            with t.path("graph"):
                with t.step(s):
                    exe.launch(s)
                with t.step(s):
                    exe.launch(s)
                    raise ZeroDivisionError("inside a step")
    s.synchronize()
    assert_balanced(fake_nvtx)
    assert [r.message for r in fake_nvtx.ranges] == ["path graph", "graph step 0", "graph step 1"]
    assert {r.domain for r in fake_nvtx.ranges} == {DOMAIN}


def test_each_thread_pops_the_ranges_it_pushed(fake_driver, fake_nvtx):
    """NVTX ranges belong to the thread that pushed them: a path and step opened on a worker
    thread while the main thread is inside its own path are pushed and popped there, named after
    the worker's path (the tracer's paths are per thread)."""
    from rawgraph import Stream

    s = Stream()
    worker_id = []

    def worker():
        worker_id.append(threading.get_ident())
        with t.path("worker"), t.step(s):
            s.synchronize()

    with Tracer(device="none") as t:
        with t.path("main"):
            th = threading.Thread(target=worker)
            th.start()
            th.join()
            with t.step(s):
                s.synchronize()
    s.close()
    assert_balanced(fake_nvtx)
    main = threading.get_ident()
    got = {(r.thread == main, r.message, r.parent.message if r.parent else None) for r in fake_nvtx.ranges}
    worker_step, main_step = (h.step for h in sorted(t.host, key=lambda h: h.start_ns) if h.cat == "step")
    assert len(fake_nvtx.ranges) == 4 and got == {
        (False, "path worker", None),
        (False, f"worker step {worker_step}", "path worker"),
        (True, "path main", None),
        (True, f"main step {main_step}", "path main"),
    }
    assert {r.thread for r in fake_nvtx.ranges if r.thread != main} == set(worker_id)
    assert {r.domain for r in fake_nvtx.ranges} == {DOMAIN}


def test_nvtx_false_pushes_nothing(block, fake_nvtx):
    with Tracer(device="events", nvtx=False) as t:
        _run(block, t, steps=2)
    assert fake_nvtx.ranges == [] and fake_nvtx.problems == []
    assert sum(h.cat == "step" for h in t.host) == 6  # traced all the same


def test_without_the_nvtx_package_tracing_works_the_same(block, monkeypatch):
    """``import nvtx`` fails (None in sys.modules makes it raise ImportError): the tracer runs
    and records the same paths and steps as with the package; NVTX is optional, so nothing of the
    trace is missing or noted as failed."""
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(ImportError):
        import nvtx  # noqa: F401
    with Tracer(device="events") as without:
        _run(block, without, steps=2)
    monkeypatch.setitem(sys.modules, "nvtx", FakeNvtx())
    with Tracer(device="events") as with_it:
        _run(block, with_it, steps=2)
    assert len(sys.modules["nvtx"].ranges) == 2 + 2 * 2 + 2

    def marks(t):
        return [(h.cat, h.name, h.step, h.path.name if h.path else None) for h in t.host if h.cat in ("path", "step")]

    def calls(t):
        return [(h.name, h.step, h.error) for h in t.host if h.cat not in ("path", "step")]

    assert marks(without) == marks(with_it) and len(marks(without)) == 2 + 2 * 2 + 2
    assert calls(without) == calls(with_it) and calls(without)
    assert without.notes == with_it.notes
    doc = without.to_chrome()
    assert trace_problems(doc) == []
    assert doc["metadata"]["device_source"] == "events"


def test_the_installed_nvtx_package_takes_the_tracers_calls(block, monkeypatch):
    """The real ``nvtx`` package (where installed): the tracer's calls go through it without error
    (its own push_range and pop_range run), balanced, in the domain ``"rawgraph"``."""
    real = pytest.importorskip("nvtx")
    seen = []
    real_push, real_pop = real.push_range, real.pop_range

    def bound(fn, args, kwargs):  # the arguments by parameter name, however they were passed
        b = inspect.signature(fn).bind(*args, **kwargs)
        b.apply_defaults()
        return b.arguments

    def push(*args, **kwargs):
        seen.append(("push", bound(real_push, args, kwargs)["domain"]))
        return real_push(*args, **kwargs)

    def pop(*args, **kwargs):
        seen.append(("pop", bound(real_pop, args, kwargs)["domain"]))
        return real_pop(*args, **kwargs)

    monkeypatch.setattr(real, "push_range", push)
    monkeypatch.setattr(real, "pop_range", pop)
    monkeypatch.setitem(sys.modules, "nvtx", real)
    with Tracer(device="events") as t:
        _run(block, t, steps=1)
    assert sum(h.cat == "step" for h in t.host) == 4
    assert [op for op, _ in seen].count("push") == [op for op, _ in seen].count("pop") == 2 + 4
    depth = 0
    for op, domain in seen:
        assert domain == DOMAIN
        depth += 1 if op == "push" else -1
        assert depth >= 0
    assert depth == 0


def test_a_step_that_fails_to_start_leaves_no_range_open_and_no_step_set(fake_driver, fake_nvtx):
    """A step whose start event cannot be made (here cuEventCreate fails) is refused with
    TraceError; the range it pushed must be popped and the thread must be back outside any step,
    so a driver call after it belongs to no step."""
    from rawgraph import Stream

    s = Stream()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "cuEventCreate", lambda flags: (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None))
        with Tracer(device="events") as t:
            with pytest.raises(TraceError, match="cuEventCreate"):
                with t.step(s):
                    pass
            s.synchronize()
    s.close()
    assert [h.step for h in t.host if h.name == "cuStreamSynchronize"] == [-1]
    assert_balanced(fake_nvtx)
