"""A fake ``cupti.cupti`` (cupti-python 13.0.1) over rawgraph's CPU fake driver, for the CPU tests of
the CUPTI path of ``rawgraph.trace``.

It mimics what was confirmed against the real module (``cupti.pyi``, the docstrings, and its Cython
callback wrappers driven through ctypes):

- ``activity_register_callbacks(requested, completed)``: ``requested()`` returns ``(bytes, max
  records)``; ``completed(activities)`` gets a list of record objects whose ``kind`` is a plain
  int, on a thread of its own when a buffer fills, and on the caller's thread inside
  ``activity_flush_all``. A non-forced flush hands over full buffers only; ``FLUSH_FORCED`` every
  buffer with records, records of work not yet ended with ``end == 0``.
- Correlation: every driver call gets a ``correlation_id``; with ``DRIVER`` enabled it writes an
  ``ActivityAPI`` record, preceded (with ``EXTERNAL_CORRELATION`` enabled) by one
  ``ActivityExternalCorrelation`` per kind with an id pushed on the calling thread. Without
  ``DRIVER``, no external correlation record at all (the CUPTI header's wording).
- ``subscribe(callback, userdata)``: one subscriber per process (a second raises ``cuptiError``);
  the callback is called as ``callback(userdata, domain, cbid, data)`` with ``data`` a
  ``ResourceData`` whose ``resource_descriptor`` is the address of a ``GraphData``
  (``GraphData.from_ptr``), for ``GRAPHNODE_CLONED`` once per node an instantiation clones.
- ``get_timestamp()``: nanoseconds on a clock of its own (a rate and an offset off
  ``perf_counter_ns``), the clock of the records' ``start`` and ``end``.

The enums are the real module's where ``cupti-python`` imports, else copies of their values.
"""

from __future__ import annotations

import enum
import itertools
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver

try:  # the real enums (the module imports without libcuda; only its calls need the driver)
    from cupti import cupti as _real

    ActivityKind = _real.ActivityKind
    ActivityFlag = _real.ActivityFlag
    ActivityMemcpyKind = _real.ActivityMemcpyKind
    ExternalCorrelationKind = _real.ExternalCorrelationKind
    CallbackDomain = _real.CallbackDomain
    CallbackIdResource = _real.CallbackIdResource
    REAL = True
except ImportError:  # the values of cupti-python 13.0.1
    REAL = False

    class ActivityKind(enum.IntEnum):  # type: ignore[no-redef]
        MEMCPY = 1
        MEMSET = 2
        KERNEL = 3
        DRIVER = 4
        RUNTIME = 5
        CONCURRENT_KERNEL = 10
        EXTERNAL_CORRELATION = 39

    class ActivityFlag(enum.IntEnum):  # type: ignore[no-redef]
        NONE = 0
        FLUSH_FORCED = 1

    class ActivityMemcpyKind(enum.IntEnum):  # type: ignore[no-redef]
        UNKNOWN = 0
        HTOD = 1
        DTOH = 2
        DTOD = 8

    class ExternalCorrelationKind(enum.IntEnum):  # type: ignore[no-redef]
        INVALID = 0
        UNKNOWN = 1
        OPENACC = 2
        CUSTOM0 = 3
        CUSTOM1 = 4
        CUSTOM2 = 5

    class CallbackDomain(enum.IntEnum):  # type: ignore[no-redef]
        DRIVER_API = 1
        RUNTIME_API = 2
        RESOURCE = 3

    class CallbackIdResource(enum.IntEnum):  # type: ignore[no-redef]
        GRAPHNODE_CREATED = 13
        GRAPHNODE_CLONED = 20


class cuptiError(Exception):  # noqa: N801 (the real name)
    pass


# -- records: the real classes' names and the fields rawgraph reads (all ints but the kernel's name)
@dataclass
class ActivityKernel10:
    kind: int
    name: str
    start: int
    end: int
    device_id: int
    stream_id: int
    correlation_id: int
    graph_id: int = 0
    graph_node_id: int = 0
    grid_x: int = 1
    grid_y: int = 1
    grid_z: int = 1
    block_x: int = 1
    block_y: int = 1
    block_z: int = 1
    registers_per_thread: int = 32
    static_shared_memory: int = 0
    dynamic_shared_memory: int = 0


@dataclass
class ActivityMemcpy6:
    kind: int
    start: int
    end: int
    device_id: int
    stream_id: int
    correlation_id: int
    copy_kind: int
    bytes: int
    graph_id: int = 0
    graph_node_id: int = 0


@dataclass
class ActivityMemset4:
    kind: int
    start: int
    end: int
    device_id: int
    stream_id: int
    correlation_id: int
    bytes: int
    value: int
    graph_id: int = 0
    graph_node_id: int = 0


@dataclass
class ActivityAPI:
    kind: int
    cbid: int
    start: int
    end: int
    correlation_id: int
    process_id: int = 0
    thread_id: int = 0
    return_value: int = 0


@dataclass
class ActivityExternalCorrelation:
    kind: int
    external_kind: int
    external_id: int
    correlation_id: int


@dataclass
class GraphData:
    graph: int
    original_graph: int
    node: int
    original_node: int
    node_type: int
    dependency: int
    graph_exec: int

    @staticmethod
    def from_ptr(ptr: int, readonly: bool = False) -> GraphData:
        return STATE.pointers[int(ptr)]


@dataclass
class ResourceData:
    context: int
    resource_descriptor: int

    @staticmethod
    def from_ptr(ptr: int, readonly: bool = False) -> ResourceData:
        return STATE.pointers[int(ptr)]


RECORD_BYTES = 256  # what one record takes of a buffer here


@dataclass
class _State:
    requested: Any = None
    completed: Any = None
    enabled: set = field(default_factory=set)
    subscriber: tuple | None = None  # (handle, callback, userdata)
    callbacks: set = field(default_factory=set)  # (domain, cbid) enabled
    stacks: dict = field(default_factory=dict)  # (thread, kind) -> external ids
    buffers: list = field(default_factory=list)  # full buffers, not handed over yet
    current: list | None = None
    capacity: int = 0
    pointers: dict = field(default_factory=dict)
    node_ids: dict = field(default_factory=dict)  # CUgraphNode -> CUPTI node id
    exec_nodes: dict = field(default_factory=dict)  # exec -> [(clone, original, func)]
    stream_free: dict = field(default_factory=dict)  # stream -> device ns when it is next free
    corr: Any = field(default_factory=lambda: itertools.count(1))
    ids: Any = field(default_factory=lambda: itertools.count(1))
    calls: list = field(default_factory=list)  # what rawgraph called, in order
    deliveries: list = field(default_factory=list)  # (thread name, records) per buffer handed over
    unended: int = 0  # the next this many device records have no end (still running at a flush)
    wrapped: dict = field(default_factory=dict)


STATE = _State()
RATE = 1.00005  # the fake device clock runs 50 ppm fast against perf_counter_ns ...
BASE = 7_000_000_000_000  # ... from an offset of its own
KERNEL_NS = 3_000


def get_timestamp() -> int:
    STATE.calls.append("get_timestamp")
    return BASE + round(time.perf_counter_ns() * RATE)


def _device_to_host(t: int) -> float:
    return (t - BASE) / RATE


def activity_register_callbacks(func_buffer_requested: Any, func_buffer_completed: Any) -> None:
    STATE.calls.append("activity_register_callbacks")
    STATE.requested, STATE.completed = func_buffer_requested, func_buffer_completed


def activity_enable(kind: int) -> None:
    STATE.calls.append(f"activity_enable {ActivityKind(int(kind)).name}")
    STATE.enabled.add(int(kind))


def activity_disable(kind: int) -> None:
    STATE.calls.append(f"activity_disable {ActivityKind(int(kind)).name}")
    STATE.enabled.discard(int(kind))


def activity_push_external_correlation_id(kind: int, id: int) -> None:  # noqa: A002 (the real name)
    STATE.stacks.setdefault((threading.get_native_id(), int(kind)), []).append(int(id))


def activity_pop_external_correlation_id(kind: int) -> int:
    stack = STATE.stacks.get((threading.get_native_id(), int(kind)))
    if not stack:
        raise cuptiError("ERROR_QUEUE_EMPTY")
    return stack.pop()


def _deliver(records: list, on_thread: bool) -> None:
    def hand() -> None:
        STATE.deliveries.append((threading.current_thread().name, len(records)))
        STATE.completed(list(records))

    if on_thread:  # a full buffer: CUPTI's worker thread
        t = threading.Thread(target=hand, name="cupti-worker")
        t.start()
        t.join()
    else:
        hand()


def _emit(record: Any) -> None:
    if STATE.current is None:
        size, most = STATE.requested()
        STATE.current = []
        STATE.capacity = min(int(size) // RECORD_BYTES, int(most) or 1 << 62)
    STATE.current.append(record)
    if len(STATE.current) >= STATE.capacity:
        STATE.buffers.append(STATE.current)
        STATE.current = None
        _deliver(STATE.buffers.pop(0), on_thread=True)


def activity_flush_all(flag: int) -> None:
    STATE.calls.append(f"activity_flush_all {int(flag)}")
    full, STATE.buffers = STATE.buffers, []
    for records in full:
        _deliver(records, on_thread=False)
    if int(flag) & int(ActivityFlag.FLUSH_FORCED) and STATE.current:
        records, STATE.current = STATE.current, None
        _deliver(records, on_thread=False)


def subscribe(callback: Any, userdata: Any) -> int:
    STATE.calls.append("subscribe")
    if STATE.subscriber is not None:
        raise cuptiError("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)")
    handle = 0x5B5B0000 + next(STATE.ids)
    STATE.subscriber = (handle, callback, userdata)
    return handle


def enable_callback(enable: int, subscriber: int, domain: int, cbid: int) -> None:
    STATE.calls.append(f"enable_callback {int(enable)} {int(domain)} {int(cbid)}")
    if STATE.subscriber is None or STATE.subscriber[0] != int(subscriber):
        raise cuptiError("ERROR_INVALID_PARAMETER")
    (STATE.callbacks.add if enable else STATE.callbacks.discard)((int(domain), int(cbid)))


def unsubscribe(subscriber: int) -> None:
    STATE.calls.append("unsubscribe")
    if STATE.subscriber is None or STATE.subscriber[0] != int(subscriber):
        raise cuptiError("ERROR_INVALID_PARAMETER")
    STATE.subscriber = None
    STATE.callbacks.clear()


def get_graph_node_id(node: int) -> int:
    h = int(node)
    if h not in STATE.node_ids:
        STATE.node_ids[h] = (1 << 32) | next(STATE.ids)
    return STATE.node_ids[h]


# -- the driver side: each rawgraph driver call is an API call CUPTI sees ------------------------------
def _api_call(name: str, fn: Any, args: tuple) -> Any:
    corr = next(STATE.corr)
    t0 = get_timestamp()
    result = fn(*args)
    t1 = get_timestamp()
    if int(ActivityKind.DRIVER) in STATE.enabled:
        if int(ActivityKind.EXTERNAL_CORRELATION) in STATE.enabled:
            tid = threading.get_native_id()
            for kind in ExternalCorrelationKind:
                stack = STATE.stacks.get((tid, int(kind)))
                if stack:
                    _emit(
                        ActivityExternalCorrelation(int(ActivityKind.EXTERNAL_CORRELATION), int(kind), stack[-1], corr)
                    )
        _emit(ActivityAPI(int(ActivityKind.DRIVER), 0, t0, t1, corr))
    if result[0] == driver.CUresult.CUDA_SUCCESS:
        _device_work(name, args, result, corr, t1)
    return result


def _run(kind_cls: Any, stream: int, t: int, corr: int, **fields: Any) -> None:
    kernel = kind_cls is ActivityKernel10
    kind = (
        ActivityKind.CONCURRENT_KERNEL
        if kernel
        else (ActivityKind.MEMCPY if kind_cls is ActivityMemcpy6 else ActivityKind.MEMSET)
    )
    if int(kind) not in STATE.enabled:
        return
    start = max(t + 2_000, STATE.stream_free.get(stream, 0) + 500)
    end = start + KERNEL_NS
    STATE.stream_free[stream] = end
    if STATE.unended:
        STATE.unended -= 1
        end = 0
    _emit(
        kind_cls(int(kind), start=start, end=end, device_id=0, stream_id=stream & 0xFFFF, correlation_id=corr, **fields)
    )


def _fake() -> Any:
    from rawgraph.testing.fakedriver import FakeDriver

    return FakeDriver.installed


def _device_work(name: str, args: tuple, result: tuple, corr: int, t: int) -> None:
    fake = _fake()
    if name == "cuLaunchKernel":
        f = fake.functions[int(args[0])]
        grid, block = [int(a) for a in args[1:4]], [int(a) for a in args[4:7]]
        _run(ActivityKernel10, int(args[8]), t, corr, name=f.name, grid_x=grid[0], block_x=block[0])
    elif name == "cuLaunchKernelEx":
        cfg = args[0]
        f = fake.functions[int(args[1])]
        _run(ActivityKernel10, int(cfg.hStream), t, corr, name=f.name, grid_x=int(cfg.gridDimX))
    elif name.startswith("cuGraphInstantiate"):
        _instantiated(int(result[1]))
    elif name == "cuGraphLaunch":
        exe, stream = int(args[0]), int(args[1])
        graph_id = next(STATE.ids)
        for clone, _original, func in STATE.exec_nodes.get(exe, []):
            _run(
                ActivityKernel10,
                stream,
                t,
                corr,
                name=fake.functions[func].name,
                graph_id=graph_id,
                graph_node_id=get_graph_node_id(clone),
            )
    elif name.startswith("cuMemcpy") and name.endswith("Async"):
        copy = ActivityMemcpyKind.HTOD if "HtoD" in name else ActivityMemcpyKind.DTOH if "DtoH" in name else 8
        _run(ActivityMemcpy6, int(args[-1]), t, corr, copy_kind=int(copy), bytes=int(args[2]))
    elif name.startswith("cuMemsetD") and name.endswith("Async"):
        _run(ActivityMemset4, int(args[-1]), t, corr, bytes=int(args[2]), value=int(args[1]))


def _instantiated(exe: int) -> None:
    """The exec's nodes as clones of the graph's, each announced by GRAPHNODE_CLONED."""
    ex = _fake().execs[exe]
    nodes = []
    for original, state in ex.state.items():
        if "func" not in state:
            continue
        clone = 0xC1000000 + next(STATE.ids)
        nodes.append((clone, original, int(state["func"])))
        key = (int(CallbackDomain.RESOURCE), int(CallbackIdResource.GRAPHNODE_CLONED))
        if STATE.subscriber is not None and key in STATE.callbacks:
            gd = GraphData(0, ex.graph, clone, original, 1, 0, exe)
            rd = ResourceData(0, 0x6D000000 + next(STATE.ids))
            STATE.pointers[rd.resource_descriptor] = gd
            _handle, callback, userdata = STATE.subscriber
            callback(userdata, key[0], key[1], rd)
    STATE.exec_nodes[exe] = nodes


WRAPPED = (
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuGraphLaunch",
    "cuGraphInstantiate",
    "cuGraphInstantiateWithFlags",
    "cuGraphInstantiateWithParams",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
)


def attach() -> None:
    """Start watching the driver calls (over the fake driver, before a tracer wraps them)."""
    global STATE
    STATE = _State()
    for name in WRAPPED:
        fn = getattr(driver, name, None)
        if fn is None:  # not in this binding (cuGraphInstantiateWithFlags is gone in 13)
            continue

        def call(*args: Any, _n: str = name, _f: Any = fn) -> Any:
            return _api_call(_n, _f, args)

        STATE.wrapped[name] = fn
        setattr(driver, name, call)


def detach() -> None:
    for name, fn in STATE.wrapped.items():
        setattr(driver, name, fn)
    STATE.wrapped.clear()


@contextmanager
def as_cupti_python(monkeypatch: Any, buffer_records: int | None = None) -> Iterator[None]:
    """This module watching the fake driver and handed to rawgraph's tracer as cupti-python's
    (the tracer otherwise refuses CUPTI over the fake driver); ``buffer_records``: activity
    buffers that small, so that they fill and are delivered by the worker. Undone on exit."""
    from rawgraph.trace import activity, tracer

    monkeypatch.setattr(tracer, "_fake_driver_installed", lambda: False)
    monkeypatch.setattr(tracer, "load_cupti", lambda: (sys.modules[__name__], ""))
    monkeypatch.setattr(activity, "_registered", False)
    if buffer_records is not None:
        monkeypatch.setattr(activity, "_BUFFER_BYTES", buffer_records * RECORD_BYTES)
    attach()
    try:
        yield
    finally:
        detach()
        activity._sink.clear()
