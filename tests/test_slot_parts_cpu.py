"""The parts SlotPool is composed of (rawgraph/serving/slots.py), each alone on the CPU fake driver:
:class:`SlotState` (the state rows and the bucket buffers), :class:`SlotExecs` (the bucket graphs
or the device-shaped graph) and :class:`LeaveRing` (the pinned rows of ``leave(wait=False)``).

None of the three owns a ``close()``: what each makes is released by the pool's
:class:`~rawgraph.serving.lifecycle.Held`, in the groups the pool names. The lifetime tests here
build the same holder around a part, close it (twice) and check what the part's objects refuse
afterwards. (SlotTable, SlotOptions, TableDelivery and RowGather are tested alone in
tests/test_slots_cpu.py.)"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import types

import numpy as np
import pytest
from cuda.bindings import driver
from test_device_shaped_cpu import updatable_attrs  # noqa: F401  (a fixture)

from rawgraph.runtime.errors import ClosedError, DTypeError, LayoutError, NotOnDeviceError, RawgraphError, ShapeError
from rawgraph.runtime.memory import POISON_BITS

W = 8  # row width: every kernel and node is there, nothing is big
POISON = int(POISON_BITS).to_bytes(4, "little")
MEMCPYS = ("cuMemcpyHtoDAsync", "cuMemcpyDtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyHtoD", "cuMemcpyDtoH")
WAITS = ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")


@contextlib.contextmanager
def driver_calls(*names):
    """Every call to the driver functions ``names`` made in the block, as ``(name, args)``; the
    call still made. (Patched and restored inside the test, while the fake driver is installed.)"""
    calls: list[tuple[str, tuple]] = []
    with pytest.MonkeyPatch.context() as mp:
        for name in names:
            real = getattr(driver, name)
            mp.setattr(driver, name, lambda *a, _n=name, _r=real: calls.append((_n, a)) or _r(*a))
        yield calls


def live(fake):
    """The fake's live handles, less the loaded modules (the kernel cache keeps those)."""
    return {k: v for k, v in fake.live().items() if k != "module"}


def pool_holder():
    """A holder with the pool's eight groups (slots._SHAPED .. slots._STREAM), closed in order."""
    from rawgraph.serving.lifecycle import Held

    return Held("SlotPool.close", [[] for _ in range(8)])


@pytest.fixture
def parts(fake_driver):
    """(fake, stream, make): ``make(form, max_slots, **options)`` gives a TinyBlock of width W and
    its checked SlotOptions; models and the stream are closed after the test."""
    from rawgraph import Stream, TinyBlock
    from rawgraph.serving.slots import SlotOptions

    s = Stream()
    models = []

    def make(form="fused", max_slots=4, **options):
        model = TinyBlock(W, 2, 1, seed=3, form=form)
        models.append(model)
        return model, SlotOptions.check(model, max_slots, **options)

    yield fake_driver, s, make
    s.synchronize()
    for m in models:
        m.close()
    s.close()


def state_bytes(fake, st):
    return fake.read(st.state.ptr, st.state.nbytes)


def row_bytes(fake, st, slot):
    return fake.read(st.row_ptr(slot), W * 4)


# ----------------------------------------------------------------------------------- SlotState
@pytest.mark.parametrize("shape", ["buckets", "device"])
def test_slot_state_allocates_poisoned_rows_and_the_bucket_buffers(parts, rng, shape):
    """``state`` is ``(max_slots + 1, width)`` float32 (the slots, then the scratch slot), all
    poisoned; ``x``, ``y`` and the arena are sized for the largest bucket, None with
    ``shape="device"``; row ``i`` starts ``i`` rows into the state."""
    from rawgraph.serving.slots import SlotState

    fake, s, make = parts
    max_slots = int(rng.integers(1, 9))
    model, opts = make("unfused", max_slots, shape=shape)
    st = SlotState.allocate(model, opts, s)
    try:
        assert st.width == W
        assert st.state.shape == (max_slots + 1, W) and st.state.dtype == np.float32
        assert state_bytes(fake, st) == POISON * ((max_slots + 1) * W)
        if shape == "device":
            assert st.x is None and st.y is None and st.arena is None
        else:
            top = opts.sizes[-1]
            assert top >= max_slots
            for buf in (st.x, st.y):
                assert buf.shape == (top, W) and buf.dtype == np.float32
            assert st.arena is not None and st.arena.rows == top
        for slot in range(max_slots + 1):
            assert st.row_ptr(slot) == st.state.ptr + slot * W * 4
        assert st.row_ptr(max_slots) + W * 4 == st.state.ptr + st.state.nbytes  # the scratch row is last
        with pytest.raises(dataclasses.FrozenInstanceError):
            st.state = None
    finally:
        for obj in (st.state, st.x, st.y, st.arena):
            if obj is not None:
                obj.close()


def test_slot_state_rows_round_trip_and_touch_only_their_slot(parts, rng):
    """Rows written from the host (a strided view included) and from device memory (a ``(1,
    width)`` array counts: ``width`` float32 values) read back exactly; every other row keeps its
    bytes; a read row is the caller's own copy."""
    from rawgraph import DeviceBuffer
    from rawgraph.serving.slots import SlotState

    fake, s, make = parts
    max_slots = int(rng.integers(3, 9))
    model, opts = make("fused", max_slots)
    st = SlotState.allocate(model, opts, s)
    try:
        want = {}
        slots = [int(v) for v in rng.permutation(max_slots)[:3]]
        host = rng.standard_normal(W, dtype=np.float32)
        strided = rng.standard_normal(2 * W, dtype=np.float32)[::2]  # shape (W,), not contiguous
        dev_host = rng.standard_normal((1, W), dtype=np.float32)
        with DeviceBuffer.from_numpy(dev_host, stream=s) as dev:
            for slot, row, expect in zip(slots, (host, strided, dev), (host, strided, dev_host[0])):
                before = state_bytes(fake, st)
                st.write_row(slot, row, s)
                want[slot] = expect.copy()
                after = state_bytes(fake, st)
                lo, hi = slot * W * 4, (slot + 1) * W * 4
                assert after[:lo] == before[:lo] and after[hi:] == before[hi:], f"slot {slot} wrote outside its row"
        for slot, expect in want.items():
            got = st.read_row(slot, s)
            assert got.dtype == np.float32 and got.shape == (W,)
            assert got.tobytes() == expect.tobytes()
            got[:] = 0  # the caller's copy: the state keeps the row
            assert st.read_row(slot, s).tobytes() == expect.tobytes()
        untouched = [i for i in range(max_slots + 1) if i not in want]
        assert all(row_bytes(fake, st, i) == POISON * W for i in untouched)
    finally:
        for obj in (st.state, st.x, st.y, st.arena):
            obj.close()


def test_slot_state_copies_are_ordered_on_the_stream_and_a_pinned_row_is_staged(parts, rng):
    """``write_row`` queues its copy on the given stream and waits for nothing; the caller may reuse
    its row once it returns, so the copy never reads a pinned (DMA-read-later) caller row in place.
    ``read_row`` copies on the stream and waits for that stream."""
    from rawgraph import HostBuffer
    from rawgraph.serving.slots import SlotState

    fake, s, make = parts
    model, opts = make("fused", 4)
    st = SlotState.allocate(model, opts, s)
    pinned = HostBuffer((W,), np.float32)
    try:
        pinned.array[:] = rng.standard_normal(W, dtype=np.float32)
        want = pinned.array.tobytes()
        slot = int(rng.integers(0, 4))
        with driver_calls(*MEMCPYS, *WAITS) as calls:
            st.write_row(slot, pinned.array, s)
        [(name, (dst, src, n, stream))] = calls
        assert name == "cuMemcpyHtoDAsync" and int(stream) == int(s.handle)
        assert (int(dst), int(n)) == (st.row_ptr(slot), W * 4)
        src_alloc = fake.find_alloc(int(src))
        assert src_alloc is None or src_alloc.kind != "host", "the copy reads the caller's pinned row in place"
        pinned.array[:] = -1.0  # reused at once
        assert row_bytes(fake, st, slot) == want
        with driver_calls(*MEMCPYS, *WAITS) as calls:
            got = st.read_row(slot, s)
        assert [name for name, _ in calls] == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]
        assert int(calls[0][1][3]) == int(s.handle) and int(calls[1][1][0]) == int(s.handle)
        assert got.tobytes() == want
    finally:
        pinned.close()
        for obj in (st.state, st.x, st.y, st.arena):
            obj.close()


def test_slot_state_refuses_bad_rows_before_any_copy(parts, rng):
    """A row that is not ``width`` float32 values is refused with a typed error and nothing is
    copied: the state keeps every byte."""
    from rawgraph import DeviceBuffer
    from rawgraph.serving.slots import SlotState

    fake, s, make = parts
    model, opts = make("fused", 4)
    st = SlotState.allocate(model, opts, s)
    closed = DeviceBuffer((W,))
    closed.close()
    wrong_dtype = DeviceBuffer((W,), np.int32)
    too_long = DeviceBuffer((W + 1,))
    try:
        st.write_row(1, rng.standard_normal(W, dtype=np.float32), s)  # a live row among the poison
        before = state_bytes(fake, st)
        bad = [
            (np.ones(W, np.float64), DTypeError),
            (np.ones(W, np.float16), DTypeError),
            (np.ones(W, np.int32), DTypeError),
            (np.ones(W, ">f4"), DTypeError),
            (np.ones(W + 1, np.float32), ShapeError),
            (np.ones(W - 1, np.float32), ShapeError),
            (np.ones((1, W), np.float32), ShapeError),  # a host row is (width,)
            (np.ones((), np.float32), ShapeError),
            (np.float32(1.0), NotOnDeviceError),  # a NumPy scalar is no (width,) array
            ([1.0] * W, NotOnDeviceError),
            (wrong_dtype, DTypeError),
            (too_long, ShapeError),
            (closed, ClosedError),
        ]
        for row, exc in bad:
            with driver_calls(*MEMCPYS) as calls:
                with pytest.raises(exc) as info:
                    st.write_row(1, row, s)
            assert isinstance(info.value, RawgraphError)
            assert calls == [], f"{row!r}: copied before refusing"
            assert state_bytes(fake, st) == before
    finally:
        for obj in (wrong_dtype, too_long, st.state, st.x, st.y, st.arena):
            obj.close()


def test_slot_state_after_its_buffers_are_released_refuses_before_any_driver_call(parts):
    """Released the way the pool releases it (its buffers in the holder's buffer group), the state
    refuses ``write_row`` and ``read_row`` with ClosedError before any driver call; a second close
    releases nothing again."""
    from rawgraph.serving.slots import _BUFFERS, SlotState

    fake, s, make = parts
    model, opts = make("fused", 4)
    baseline = live(fake)
    # patched before the buffers are made: each keeps the cuMemFree it was made with
    with driver_calls("cuMemFree", *MEMCPYS, *WAITS) as calls:
        st = SlotState.allocate(model, opts, s)
        held = pool_holder()
        for buf in (st.state, st.x, st.y, st.arena):
            held.add(buf, _BUFFERS)
        ptrs = {st.state.ptr, st.x.ptr, st.y.ptr}
        assert live(fake) != baseline
        held.close()
        assert live(fake) == baseline
        assert {int(a[0]) for n, a in calls if n == "cuMemFree"} >= ptrs
        calls.clear()
        held.close()
        for op in (lambda: st.write_row(0, np.ones(W, np.float32), s), lambda: st.read_row(0, s)):
            with pytest.raises(ClosedError):
                op()
        assert calls == []


# ----------------------------------------------------------------------------------- SlotExecs
def held_args(fake, exe, node):
    """Argument name -> the value exec ``exe`` holds for kernel node ``node`` (8-byte values as
    ints, by-value tables as int32 arrays)."""
    out = {}
    for name, raw in zip(node.launch.args.names(), fake.exec_kernel_args(exe.handle, node.handle)):
        out[name] = int.from_bytes(raw, "little") if len(raw) in (4, 8) else np.frombuffer(raw, np.int32)
    return out


def bucket_parts(model, opts, s):
    """The parts a SlotExecs builds over, made and held as the pool makes and holds them:
    (state, tables, holder, execs)."""
    from rawgraph.runtime.device import get_device
    from rawgraph.serving.slots import _BUFFERS, SlotExecs, SlotState, TableDelivery

    st = SlotState.allocate(model, opts, s)
    tables = TableDelivery(opts, get_device())
    held = pool_holder()
    for buf in (st.state, st.x, st.y, st.arena, tables.table_dev, tables.pinned, tables.read):
        held.add(buf, _BUFFERS)
    return st, tables, held, SlotExecs()


def test_slot_execs_starts_with_nothing_built():
    from rawgraph.serving.slots import SlotExecs

    ex = SlotExecs()
    assert ex.setup == {"warmup": 0.0, "capture": 0.0, "instantiate": 0.0, "upload": 0.0}
    assert ex.warm_up.setup is ex.setup  # the warm-up's seconds land in the part's setup
    assert (ex.models, ex.graphs, ex.execs, ex.edges, ex.shaped, ex.gather) == ({}, {}, {}, {}, None, "")


@pytest.mark.parametrize(
    "form,table,gather,want",
    [
        ("fused", "graph", None, "fused"),
        ("unfused", "copy", None, "kernels"),
        ("fused", "params", "kernels", "kernels"),
        ("fused", "copy", "kernels", "kernels"),
    ],
)
def test_slot_execs_builds_one_graph_per_bucket(parts, rng, form, table, gather, want):
    """One graph and exec per bucket, largest first, each held in the pool's exec / graph / model
    groups: [table copy node, event] -> [gather] -> plan -> [scatter]. What each exec holds: the
    pinned table copied into the device table (``table="graph"``), the rows read from and written
    to the state through the device table (fused: the matmuls' row flags; kernels: the gather and
    scatter around the bucket's x and y), by-value tables of the scratch slot (``"params"``)."""
    from rawgraph.ops import ROW_FLAGS
    from rawgraph.serving.slots import _EXECS, _GRAPHS, _MODELS, _SHAPED

    fake, s, make = parts
    max_slots = int(rng.integers(3, 9))
    sizes = sorted({1, int(rng.integers(2, max_slots + 1)), max_slots})
    model, opts = make(form, max_slots, sizes=sizes, table=table, gather=gather)
    st, tables, held, ex = bucket_parts(model, opts, s)
    try:
        ex.build_buckets(model, opts, st, tables, s, held)
        assert ex.gather == want
        assert list(ex.execs) == list(ex.graphs) == list(ex.models) == sorted(sizes, reverse=True)
        assert held.groups[_SHAPED] == [] and ex.shaped is None
        assert held.groups[_EXECS] == list(ex.execs.values())
        assert held.groups[_GRAPHS] == list(ex.graphs.values())
        assert held.groups[_MODELS] == list(ex.models.values())
        assert all(m.batch == b for b, m in ex.models.items()) and not model.closed
        assert all(ex.setup[k] > 0 for k in ("capture", "instantiate", "upload"))
        assert tables.sent == dict.fromkeys(sizes, 0)
        assert sorted(tables.pushes) == (sorted(sizes) if table == "params" else [])

        # warm-up: a bucket ran eagerly exactly when it launches a kernel function no earlier one did
        seen, ran = set(), 0
        for graph in ex.graphs.values():  # in build order
            funcs = {int(n.launch.kernel.handle) for n in graph.nodes}
            ran += bool(funcs - seen)
            seen |= funcs
        assert (ex.warm_up.runs, ex.warm_up.skipped) == (ran, len(sizes) - ran) and ran >= 1
        assert (ex.setup["warmup"] > 0) == (ran > 0)

        state, table_dev = st.state.ptr, tables.table_dev.ptr
        for b, graph in ex.graphs.items():
            exe, plan = ex.execs[b], graph.plan
            order = fake.graphs[int(graph.handle)].nodes
            kinds = [fake.nodes[h].kind.name.removeprefix("CU_GRAPH_NODE_TYPE_") for h in order]
            kernels = list(graph.nodes)
            if table == "graph":
                assert kinds[:2] == ["MEMCPY", "EVENT_RECORD"] and set(kinds[2:]) == {"KERNEL"}
                m = fake.exec_memory(exe.handle, order[0])["memcpy"]
                assert (m["srcHost"], m["dstDevice"], m["WidthInBytes"]) == (tables.pinned.ptr, table_dev, 4 * b)
                assert fake.nodes[order[1]].params["event"] == int(tables.read.handle)
                edges = {(a, c) for a, c, _ in fake.graphs[int(graph.handle)].edges}
                assert {(order[0], order[1]), (order[1], int(kernels[0].handle))} <= edges
            else:
                assert set(kinds) == {"KERNEL"}
            io = set(plan.inputs) | set(plan.outputs)
            if want == "fused":
                assert ex.edges[b] is None and len(kernels) == len(plan.launches)
                routed = 0
                for n in kernels:
                    args = held_args(fake, exe, n)
                    mine = [a for a, use in n.launch.uses.items() if use.buffer in io]
                    for a in mine:
                        assert args[a] == state and args["flags"] & ROW_FLAGS[a], (n.launch.label, a)
                    if mine:
                        assert args["rows"] == table_dev
                        routed += 1
                assert routed >= 2  # the first matmul reads, the last one writes, through the table
                assert st.x.ptr not in [v for n in kernels for v in held_args(fake, exe, n).values()]
            else:
                edges = ex.edges[b]
                assert edges is not None and len(kernels) == len(plan.launches) + 2
                first, last = kernels[0], kernels[-1]
                assert (first.launch, last.launch) == (edges.gather, edges.scatter)
                assert (first.launch.label, last.launch.label) == (f"gather{b}", f"scatter{b}")
                g, sc = held_args(fake, exe, first), held_args(fake, exe, last)
                assert (g["src"], g["dst"], g["rows"]) == (state, st.x.ptr, b)
                assert (sc["src"], sc["dst"], sc["rows"]) == (st.y.ptr, state, b)
                if table == "params":
                    for a in (g, sc):
                        assert list(a["table"][:b]) == [max_slots] * b  # padding: the scratch slot
                    assert tables.pushes[b].tables[0] is edges.gather.args.array("table")
                else:
                    assert g["idx"] == sc["idx"] == table_dev
                for n in kernels[1:-1]:  # the plan between them works on the bucket's x and y only
                    args = held_args(fake, exe, n)
                    assert state not in args.values()
    finally:
        held.close()


def test_slot_execs_refuses_fused_rows_for_a_model_that_cannot_take_the_table(parts):
    """``gather="fused"`` over a model whose kernels cannot pick rows through a table (the unfused
    TinyBlock's relu and add): LayoutError before any eager run, capture or instantiation; what was
    made until then sits in the holder, whose close releases all of it."""
    fake, s, make = parts
    model, opts = make("unfused", 4, sizes=[2, 4], gather="fused")
    baseline = live(fake)
    st, tables, held, ex = bucket_parts(model, opts, s)
    launches = len(fake.launch_log)
    with driver_calls("cuStreamBeginCapture", "cuGraphInstantiate") as calls:
        with pytest.raises(LayoutError, match="fused"):
            ex.build_buckets(model, opts, st, tables, s, held)
    assert calls == [] and len(fake.launch_log) == launches
    assert ex.graphs == {} and ex.execs == {} and ex.gather == ""
    held.close()
    held.close()
    assert live(fake) == baseline


def test_slot_execs_are_released_execs_first_then_graphs_then_memory(parts):
    """The pool's holder closes every exec before any graph, and both before the state and tables
    their nodes name; twice releases nothing more; a released exec refuses to launch before the
    driver is called."""
    fake, s, make = parts
    model, opts = make("unfused", 4, sizes=[1, 2, 4], table="copy")
    baseline = live(fake)
    # patched before anything is made: each object keeps the release function it was made with
    with driver_calls("cuGraphExecDestroy", "cuGraphDestroy", "cuMemFree", "cuGraphLaunch") as calls:
        st, tables, held, ex = bucket_parts(model, opts, s)
        ex.build_buckets(model, opts, st, tables, s, held)
        memory = {st.state.ptr, st.x.ptr, st.y.ptr, tables.table_dev.ptr}
        execs = {int(e.handle) for e in ex.execs.values()}
        graphs = {int(g.handle) for g in ex.graphs.values()}
        calls.clear()
        held.close()
        order = [(name, int(a[0])) for name, a in calls]
        calls.clear()
        held.close()
        for exe in ex.execs.values():
            with pytest.raises(ClosedError):
                exe.launch(s)
        assert calls == []
    assert {h for n, h in order if n == "cuGraphExecDestroy"} == execs
    assert {h for n, h in order if n == "cuGraphDestroy"} == graphs
    assert memory <= {h for n, h in order if n == "cuMemFree"}
    pos = {key: i for i, key in enumerate(order)}
    last_exec = max(pos[("cuGraphExecDestroy", h)] for h in execs)
    assert last_exec < min(pos[("cuGraphDestroy", h)] for h in graphs)
    assert max(pos[("cuGraphDestroy", h)] for h in graphs) < min(pos[("cuMemFree", p)] for p in memory)
    assert all(g.closed for g in ex.graphs.values()) and all(m.closed for m in ex.models.values())
    assert not model.closed  # the pool's model is the caller's: its weights are shared, not copied
    assert live(fake) == baseline


@pytest.mark.parametrize("select,bands", [(None, None), ("switch", [2])])
def test_slot_execs_builds_one_device_shaped_graph(parts, updatable_attrs, rng, select, bands):
    """``shape="device"``: one device-shaped graph of ``max_slots`` rows (the first group the
    holder closes), gather and scatter kernels reading the state through the device table, the
    select the options give (``"updates"`` unless ``"switch"``); no bucket graphs."""
    from rawgraph.runtime.device import get_device
    from rawgraph.serving.slots import _BUFFERS, _SHAPED, SlotExecs, SlotState, TableDelivery, _views

    fake, s, make = parts
    max_slots = int(rng.integers(3, 9))
    model, opts = make("unfused", max_slots, shape="device", select=select, bands=bands)
    baseline = live(fake)
    st = SlotState.allocate(model, opts, s)
    tables = TableDelivery(opts, get_device())
    held = pool_holder()
    for buf in (st.state, tables.table_dev, tables.pinned, tables.read):
        held.add(buf, _BUFFERS)
    ex = SlotExecs()
    try:
        ex.build_shaped(model, opts, _views(st, tables), s, held)
        shaped = ex.shaped
        assert held.groups[_SHAPED] == [shaped] and all(held.groups[i] == [] for i in (1, 2, 3))
        assert ex.gather == "kernels" and ex.graphs == ex.execs == ex.models == {}
        assert ex.setup["capture"] > 0
        assert shaped.max_batch == max_slots and shaped.select == (select or "updates")
        assert shaped.bands == ([2, max_slots] if bands else [max_slots])
        # every band's plan: gather from the state through the device table, the model, scatter back
        assert len(shaped.plans) == len(shaped.bands)
        for plan in shaped.plans:
            gather, scatter = plan.launches[0], plan.launches[-1]
            assert (gather.kernel.name, scatter.kernel.name) == ("gather_rows", "scatter_rows")
            assert (gather.args["src"], gather.args["idx"]) == (st.state.ptr, tables.table_dev.ptr)
            assert (scatter.args["dst"], scatter.args["idx"]) == (st.state.ptr, tables.table_dev.ptr)
        if select != "switch":  # the nodes sit in the exec itself (with "switch": in SWITCH bodies)
            edges = [n for n in shaped.graph.nodes if n.launch.kernel.name in ("gather_rows", "scatter_rows")]
            assert len(edges) == 2
            for n, ptr in zip(edges, ("src", "dst")):
                a = held_args(fake, shaped.exec, n)
                assert (a[ptr], a["idx"]) == (st.state.ptr, tables.table_dev.ptr)
    finally:
        held.close()
    assert ex.shaped.closed and not model.closed
    assert live(fake) == baseline


# ----------------------------------------------------------------------------------- LeaveRing
@pytest.fixture
def ring_parts(parts, rng):
    """(fake, stream, ring, pool, state, rows): a LeaveRing of 4 slots over a state whose rows
    0..3 hold random values; ``pool`` stands in for the SlotPool (its lock and ring are all a
    PendingRow reads). The ring's events and pinned rows are released the way the pool does."""
    from rawgraph.runtime.device import get_device
    from rawgraph.serving.lifecycle import Held
    from rawgraph.serving.slots import _RING, _RING_EVENTS, LeaveRing, SlotState

    fake, s, make = parts
    model, opts = make("fused", 4)
    st = SlotState.allocate(model, opts, s)
    rows = rng.standard_normal((4, W), dtype=np.float32)
    for slot in range(4):
        st.write_row(slot, rows[slot], s)
    ring = LeaveRing(4, W, get_device())
    pool = types.SimpleNamespace(_lock=threading.Lock(), _ring=ring)
    groups = [[] for _ in range(8)]
    groups[_RING_EVENTS], groups[_RING] = ring.events, ring.buffers  # the ring's own lists, filled later
    held = Held("SlotPool.close", groups)
    yield fake, s, ring, pool, st, rows, held
    held.close()
    for obj in (st.state, st.x, st.y, st.arena):
        obj.close()


def test_leave_ring_makes_its_pinned_rows_at_the_first_pending(ring_parts, rng):
    """Nothing is allocated until the first pending row: then one pinned ``(max_slots, width)``
    float32 buffer, an event for that slot only, and the row as the slot's owner. The copy is
    queued on the stream with the event after it, and nothing waits for the stream; ``result()``
    waits for that event only, hands back the source row, and gives the pinned row back."""
    fake, s, ring, pool, st, rows, held = ring_parts
    assert ring.host is None and ring.buffers == [] and ring.events == [] and ring.owner == []
    slot = int(rng.integers(0, 4))
    with driver_calls("cuMemHostAlloc", "cuEventCreate", "cuMemcpyDtoHAsync", "cuEventRecord", *WAITS) as calls:
        row = ring.pending(pool, slot, st.row_ptr(slot), s)
    names = [n for n, _ in calls]
    assert names == ["cuMemHostAlloc", "cuEventCreate", "cuMemcpyDtoHAsync", "cuEventRecord"]
    host = ring.host
    assert host.shape == (4, W) and host.dtype == np.float32 and fake.find_alloc(host.ptr).kind == "host"
    dst, src, n, stream = calls[2][1]
    assert (int(dst), int(src), int(n)) == (host.ptr + slot * W * 4, st.row_ptr(slot), W * 4)
    assert int(stream) == int(s.handle)
    ev = ring.events[slot]
    assert [e is not None for e in ring.events] == [i == slot for i in range(4)]
    assert (int(calls[3][1][0]), int(calls[3][1][1])) == (int(ev.handle), int(s.handle))
    assert ring.owner[slot] is row and all(o is None for i, o in enumerate(ring.owner) if i != slot)
    with driver_calls(*WAITS) as calls:
        assert row.done()
        got = row.result()
    assert [(n, int(a[0])) for n, a in calls] == [("cuEventSynchronize", int(ev.handle))]
    assert got.tobytes() == rows[slot].tobytes()
    assert ring.owner[slot] is None
    host.array[slot] = -1.0  # the pinned row is the ring's again: the result is the row's own
    assert row.result().tobytes() == rows[slot].tobytes()


def test_a_row_is_done_when_its_event_says_so_not_the_stream(ring_parts):
    """``done()`` asks the row's own event (``cuEventQuery``); once taken, the row is done without
    asking."""
    fake, s, ring, pool, st, rows, held = ring_parts
    row = ring.pending(pool, 2, st.row_ptr(2), s)
    ev = int(ring.events[2].handle)
    asked = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "cuEventQuery", lambda e: asked.append(int(e)) or (driver.CUresult.CUDA_ERROR_NOT_READY,))
        assert not row.done()
        assert asked == [ev]
        assert row.result().tobytes() == rows[2].tobytes()
        assert row.done() and asked == [ev]


def test_a_second_pending_of_a_slot_takes_the_first_row_out_of_the_way(ring_parts, rng):
    """The slot's pinned row is reused: the earlier row, not yet taken, is taken first (waiting for
    its own event, never for the stream), so it keeps its value; the slot's event is reused; other
    slots' rows are untouched."""
    fake, s, ring, pool, st, rows, held = ring_parts
    slot, other = (int(v) for v in rng.permutation(4)[:2])
    first = ring.pending(pool, slot, st.row_ptr(slot), s)
    beside = ring.pending(pool, other, st.row_ptr(other), s)
    ev = ring.events[slot]
    newer = rng.standard_normal(W, dtype=np.float32)
    st.write_row(slot, newer, s)  # the slot's state row changes (a request joined it again)
    with driver_calls("cuEventCreate", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize") as calls:
        second = ring.pending(pool, slot, st.row_ptr(slot), s)
    assert [(n, int(a[0])) for n, a in calls] == [("cuEventSynchronize", int(ev.handle))]
    assert ring.events[slot] is ev and ring.owner[slot] is second and ring.owner[other] is beside
    assert first.done() and first.result().tobytes() == rows[slot].tobytes()
    assert second.result().tobytes() == newer.tobytes()
    assert beside.result().tobytes() == rows[other].tobytes()


def test_take_all_keeps_every_row_past_the_rings_release(ring_parts, rng):
    """``take_all`` takes every row still on its way; their ``result()`` keeps working after the
    pool's holder released the pinned rows and events (twice: once). Released, the ring refuses a
    new pending row before any copy."""
    fake, s, ring, pool, st, rows, held = ring_parts
    with driver_calls(*WAITS) as calls:
        ring.take_all()  # nothing made yet: nothing to take
    assert calls == [] and ring.host is None
    slots = [int(v) for v in rng.permutation(4)[: int(rng.integers(2, 4))]]  # one slot left unused
    pending = {slot: ring.pending(pool, slot, st.row_ptr(slot), s) for slot in slots}
    before = live(fake)
    ring.take_all()
    assert all(o is None for o in ring.owner)
    ring.host.array[:] = np.nan
    held.close()
    held.close()
    now = live(fake)
    assert len(before["host"]) - len(now["host"]) == 1  # the pinned rows
    assert len(before["event"]) - len(now["event"]) == len(slots)  # an event per slot used
    assert ring.host.closed and all(e.closed for e in ring.events if e is not None)
    for slot, row in pending.items():
        assert row.done() and row.result().tobytes() == rows[slot].tobytes()
    unused = next(slot for slot in range(4) if slot not in slots)
    for slot in (slots[0], unused):  # one with an event, one without: neither makes one now
        with driver_calls("cuEventCreate", "cuMemcpyDtoHAsync", "cuEventRecord") as calls:
            with pytest.raises(ClosedError):
                ring.pending(pool, slot, st.row_ptr(slot), s)
        assert calls == [], slot
