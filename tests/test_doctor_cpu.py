"""The graph doctor without a GPU (issue 24): the classification of one address from made-up
driver facts, the PyTorch allocator view from a made-up snapshot, Report / Finding / to_dict / the
text table, the DOT annotation, the command's refusal without a GPU, and ``check`` over graphs
built on the CPU fake driver (tests/fakedriver.py) with facts read from the fake's allocations."""

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

from rawgraph.doctor import CLASS_NAMES, Finding, PointerFacts, Report, TorchView, classify_pointer
from rawgraph.doctor.verify import compare
from rawgraph.graphs.dot import SEVERITY_COLOURS, finding_marks
from rawgraph.runtime.device import gpu_available

DEV = PointerFacts(
    0x7F0000001000, "device", buffer_id=7, device_ordinal=0, range_start=0x7F0000000000, range_size=1 << 20
)


def _classes(*args, **kw):
    return [(c, s) for c, s, _o, _a in classify_pointer(*args, **kw)]


# ------------------------------------------------------------------------------- classes 1 to 4
def test_live_device_memory_is_clean():
    assert _classes(True, True, False, DEV) == []


def test_dangling_known_pointer_is_an_error_and_a_foreign_word_only_possible():
    gone = PointerFacts(0x7F0000001000)
    assert _classes(True, True, False, gone) == [(1, "error")]
    assert _classes(False, True, False, gone) == [(1, "warning")]  # a whole 8-byte parameter
    assert _classes(False, False, False, gone) == []  # a word inside a struct: not taken for a pointer


def test_reallocated_since_baseline_by_buffer_id():
    again = PointerFacts(DEV.address, "device", buffer_id=8, range_start=DEV.range_start, range_size=DEV.range_size)
    assert _classes(True, True, False, again, old=DEV) == [(1, "error")]
    # the same allocation: clean
    assert _classes(True, True, False, DEV, old=DEV) == []
    # freed since the baseline: an error even for a foreign word
    assert _classes(False, False, False, PointerFacts(DEV.address), old=DEV) == [(1, "error")]


def test_stream_ordered_pool():
    pooled = PointerFacts(
        DEV.address, "device", buffer_id=3, mempool=0xABC, range_start=DEV.range_start, range_size=4096
    )
    got = classify_pointer(False, False, False, pooled)
    assert [(c, s) for c, s, _o, _a in got] == [(2, "warning")]
    assert "0xabc" in got[0][2] and "cuMemFreeAsync" in got[0][3]
    # freed back to its pool: the driver forgets the address (as for any freed memory); a
    # baseline taken while it was live names the pool, and it is an error now
    gone = PointerFacts(DEV.address)
    assert _classes(True, True, False, gone, old=pooled) == [(2, "error")]
    assert _classes(True, True, False, gone) == [(1, "error")]  # no baseline: any freed memory
    plain_old = PointerFacts(DEV.address, "device", buffer_id=3, range_start=DEV.range_start, range_size=4096)
    assert _classes(True, True, False, gone, old=plain_old) == [(1, "error")]


def test_host_memory_kinds():
    pinned = PointerFacts(0x5000, "host", buffer_id=1, host_flags=0)
    registered = PointerFacts(0x5000, "host", buffer_id=1, host_flags=None)
    unknown = PointerFacts(0x5000)
    assert pinned.host_kind == "pinned" and registered.host_kind == "registered" and unknown.host_kind == "pageable"
    assert _classes(True, True, True, pinned) == [(3, "info")]
    assert _classes(True, True, True, unknown) == [(3, "warning")]
    assert _classes(True, True, True, unknown, old=pinned) == [(3, "error")]  # freed since
    again = PointerFacts(0x5000, "host", buffer_id=2, host_flags=0)
    assert _classes(True, True, True, again, old=pinned) == [(3, "error")]  # allocated again


SNAPSHOT = [
    {
        "address": 0x1000000,
        "total_size": 0x200000,
        "segment_pool_id": (0, 0),
        "blocks": [
            {"size": 0x1000, "state": "active_allocated"},
            {"size": 0x1000, "state": "inactive"},
            {"size": 0x1FE000, "state": "active_allocated"},
        ],
    },
    {
        "address": 0x4000000,
        "total_size": 0x200000,
        "segment_pool_id": (1, 0),
        "blocks": [{"address": 0x4000000, "size": 0x200000, "state": "inactive"}],
    },
]


def test_torch_view_blocks_from_a_snapshot():
    view = TorchView.from_snapshot(SNAPSHOT)
    b = view.block_of(0x1001010)
    assert (b.address, b.size, b.state, b.private) == (0x1001000, 0x1000, "inactive", False)
    assert view.block_of(0x4000010).private and view.block_of(0x3000000) is None


def test_allocator_freed_outside_private_pools_only():
    view = TorchView.from_snapshot(SNAPSHOT)
    f = PointerFacts(0x1001010, "device", buffer_id=1)
    assert _classes(False, False, False, f, view.block_of(0x1001010)) == [(4, "error")]
    assert _classes(False, False, False, f, view.block_of(0x1000010)) == []  # active
    assert _classes(False, False, False, f, view.block_of(0x4000010)) == []  # a graph's private pool
    # reused: the block the baseline saw is not the one there now
    old = view.block_of(0x1000010)
    now = TorchView.from_snapshot([{**SNAPSHOT[0], "blocks": [{"size": 0x800, "state": "active_allocated"}]}])
    assert _classes(False, False, False, f, now.block_of(0x1000010), old_block=old) == [(4, "error")]


# ------------------------------------------------------------------------------- report
def _finding(cls=5, sev="error", node=1, node_id=0x10):
    return Finding(
        cls,
        CLASS_NAMES[cls],
        sev,
        node,
        "kernel",
        "scale",
        0x7F00,
        "owner text",
        "advice text",
        str(node),
        node_id,
        "arg x",
        ("0",),
    )


def test_report_to_dict_text_and_rich():
    r = Report([_finding(), _finding(2, "warning", 0, 0x20)], "BuiltGraph 0x1", 2, 0.001)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["by_class"] == {"unordered-overlap": 1, "stream-ordered-pool": 1}
    assert d["by_severity"] == {"error": 1, "warning": 1} and d["ok"] is False
    assert d["findings"][0]["address"] == "0x7f00" and d["findings"][0]["related"] == ["0"]
    text = str(r)
    assert "5/unordered-overlap" in text and "-> advice text" in text and "with node(s) 0" in text
    assert r.of_class(5) and r.of_class("stream-ordered-pool") and not r.of_class(1)
    assert "clean" in str(Report([], "g", 3)) and Report([], "g").ok
    assert Report([_finding(7, "info")]).ok  # info only
    rich = pytest.importorskip("rich")
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(r.rich_table())
    assert "unordered-overlap" in console.export_text()
    del rich


def test_dot_annotation_marks_worst_severity():
    marks = finding_marks(Report([_finding(5, "warning"), _finding(1, "error"), _finding(3, "info", 2, 0x30)]))
    assert marks[0x10][0] == SEVERITY_COLOURS["error"]
    assert marks[0x10][1] == ["! warning: 5 unordered-overlap", "! error: 1 dangling"]
    assert marks[0x30][0] == SEVERITY_COLOURS["info"]


def test_compare_tolerance_and_nan():
    assert compare("o", np.array([1.0, np.nan]), np.array([1.0 + 1e-9, np.nan]), 1e-5, 1e-6) is None
    m = compare("o", np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 2.0], [3.5, 4.0]]), 1e-5, 1e-6)
    assert m.index == (1, 0) and m.count == 1 and abs(m.max_abs - 0.5) < 1e-12
    assert compare("i", np.array([1, 2]), np.array([1, 3]), 0, 0).index == (1,)


# ------------------------------------------------------------------------------- the command
def test_doctor_without_gpu_says_so():
    if gpu_available():
        pytest.skip("this machine has a GPU; tests/test_doctor_gpu.py runs the demo")
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "doctor", "--demo"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 69 and "needs a GPU" in r.stderr  # EX_UNAVAILABLE, as every command that needs one


def test_doctor_without_demo_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "rawgraph", "doctor"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--demo" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "rawgraph", "doctor", "--nope"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and "unrecognized arguments: --nope" in r.stderr


# ------------------------------------------------------------------------------- on the fake driver
@pytest.fixture
def fake():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from fault_cases import fake_session

    import rawgraph.runtime.rawkernel as rawkernel

    # RawKernel's loaded-kernel cache outlives a fake session: start and end each one empty
    saved = dict(rawkernel._loaded)
    rawkernel._loaded.clear()
    try:
        with fake_session() as (drv, _hook):
            yield drv
    finally:
        rawkernel._loaded.clear()
        rawkernel._loaded.update(saved)


def _fake_facts(drv):
    def facts(addr):
        a = drv.find_alloc(addr)
        if a is None:
            return PointerFacts(addr)
        kind = "host" if a.kind == "host" else "device"
        return PointerFacts(
            addr,
            kind,
            buffer_id=a.base,
            range_start=a.base,
            range_size=a.size,
            host_flags=0 if kind == "host" else None,
        )

    return facts


def _kernels():
    from rawgraph.doctor import faults

    return faults.kernels()


def test_check_on_the_fake_driver_finds_dangling_and_missing_edge(fake):
    from rawgraph import DeviceBuffer, GraphBuilder
    from rawgraph.doctor import check

    k = _kernels()
    x, y, z = DeviceBuffer(64), DeviceBuffer(64), DeviceBuffer(64)
    b = GraphBuilder()
    w = b.kernel(k["fill"].launch(1, 64, (x, 1.0, 64)))
    b.kernel(k["scale"].launch(1, 64, (x, y, 2.0, 64)), deps=[w])  # ordered: clean
    b.kernel(k["scale"].launch(1, 64, (x, z, 3.0, 64)))  # no edge from the writer: overlap
    g = b.build()
    r = check(g, facts=_fake_facts(fake), torch=False)
    assert [(f.cls, f.path, f.severity) for f in r.findings] == [(5, "2", "error")], str(r)
    assert r.findings[0].related == ("0",) and r.nodes == 3
    y.close()  # node 1 now writes freed memory
    r = check(g, facts=_fake_facts(fake), torch=False)
    assert {(f.cls, f.path) for f in r.findings} == {(5, "2"), (1, "1")}, str(r)
    d = r.findings[[f.cls for f in r.findings].index(1)]
    assert d.where == "arg y" and d.kernel == "scale" and d.severity == "error"
    g.close()
    x.close()
    z.close()


@pytest.mark.parametrize("version", [13000, 13020])
def test_a_conditional_node_reads_back_where_the_driver_has_the_call(fake, version):
    """``cuGraphNodeGetParams`` (CUDA 13.2 drivers on) gives a conditional node's type, handle and
    bodies back; on an older driver (the binding raises, libcuda lacks the symbol) the node reads
    back with an error naming the call, never a failure."""
    from rawgraph import GraphBuilder
    from rawgraph.graphs import conditional as cn
    from rawgraph.graphs.nodes import ConditionalInfo, read_graph

    fake.version = version
    b = GraphBuilder()
    cond = cn.make_handle(b, default=1)
    cn.add_conditional(b, "if", cond)
    g = b.build()
    try:
        (info,) = [i for i in read_graph(g.handle) if isinstance(i, ConditionalInfo)]
        if version >= 13020:
            assert (info.cond_type, info.size, info.cond_handle, info.error) == ("IF", 1, int(cond), "")
            assert len(info.bodies) == 1 and info.bodies[0]
        else:
            assert info.cond_type == "" and "cuGraphNodeGetParams" in info.error and "missing" in info.error
    finally:
        g.close()


def test_check_on_the_fake_driver_host_copy_and_baseline(fake):
    from rawgraph import DeviceBuffer, GraphBuilder, HostBuffer
    from rawgraph.doctor import check

    h, y = HostBuffer(64, np.float32), DeviceBuffer(64)
    b = GraphBuilder()
    b.memcpy(y, h, 256)
    g = b.build()
    facts = _fake_facts(fake)
    base = check(g, facts=facts, torch=False)
    assert base.findings == []  # live pinned memory: info only
    assert [f.name for f in check(g, facts=facts, torch=False, include_info=True).findings] == ["host-memory"]
    h.close()
    r = check(g, facts=facts, torch=False, baseline=base)
    assert [(f.cls, f.severity, f.where) for f in r.findings] == [(3, "error", "memcpy.src")], str(r)
    g.close()
    y.close()


def test_check_on_the_fake_driver_input_written_by_the_graph(fake):
    from rawgraph import DeviceBuffer, LaunchPlan, build_plan
    from rawgraph.doctor import check

    k = _kernels()
    x, y = DeviceBuffer(64), DeviceBuffer(64)
    launches = [
        k["scale"].launch(1, 64, (x, y, 2.0, 64), names={"x": "x", "y": "y"}),
        k["fill"].launch(1, 64, (x, 0.0, 64), names={"y": "x"}),
    ]  # writes the plan's input
    plan = LaunchPlan(launches, {"x": x.view(), "y": y.view()}, inputs=("x",), outputs=("y",))
    g = build_plan(plan)
    r = check(g, facts=_fake_facts(fake), torch=False)
    assert [(f.cls, f.path, f.severity) for f in r.findings] == [(6, "1", "error")], str(r)
    g.close()
    x.close()
    y.close()


def test_fake_check_gives_node_ids_the_dot_export_colours(fake):
    from rawgraph import DeviceBuffer, GraphBuilder
    from rawgraph.doctor import check
    from rawgraph.graphs.dot import to_dot

    k = _kernels()
    x, y = DeviceBuffer(64), DeviceBuffer(64)
    b = GraphBuilder()
    b.kernel(k["fill"].launch(1, 64, (x, 1.0, 64)))
    b.kernel(k["scale"].launch(1, 64, (x, y, 2.0, 64)))
    g = b.build()
    r = check(g, facts=_fake_facts(fake), torch=False)
    text = to_dot(g, findings=r)
    line = next(ln for ln in text.splitlines() if f"n{r.findings[0].node_id:x} [" in ln)
    assert "unordered-overlap" in line and SEVERITY_COLOURS["error"] in line
    assert to_dot(g).count("fillcolor") == 0
    g.close()
    x.close()
    y.close()


def test_conditional_handle_words_and_said_defaults():
    from rawgraph.doctor.check import _said_defaults

    h = SimpleNamespace(value=0x55, default=None)
    node = SimpleNamespace(cond=SimpleNamespace(value=0x66, default=3))
    assert _said_defaults([h, node]) == {0x55: None, 0x66: 3}
    assert _said_defaults({0x77: 1}) == {0x77: 1}
    assert driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL  # the binding names the type the records use


def test_host_mappings_keep_device_and_pinned_ranges():
    from rawgraph.doctor.check import host_mappings

    maps = (
        "7ffe66400000-7ffe66500000 rw-p 00000000 00:00 0                          [stack]\n"
        "55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0                          [heap]\n"
        "7f1200000000-7f1200200000 r-xp 00000000 08:01 123   /usr/lib/libcublasLt.so.13\n"
        "7f1300000000-7f1300200000 rw-s 00000000 00:05 77    /dev/nvidiactl\n"
        "7f1400000000-7f1400200000 rw-p 00000000 00:00 0 \n"
        "garbage line\n"
    )
    spans = host_mappings(maps)
    assert (0x7FFE66400000, 0x7FFE66500000) in spans and (0x55D0C0000000, 0x55D0C0100000) in spans
    assert (0x7F1200000000, 0x7F1200200000) in spans
    assert not any(lo == 0x7F1300000000 or lo == 0x7F1400000000 for lo, _ in spans)  # pinned / anonymous kept
    import sys

    if sys.platform.startswith("linux"):  # this process maps at least its stack and its libraries
        assert host_mappings()


@pytest.mark.parametrize("default", [1, 0, None])
def test_a_built_conditionals_default_reaches_the_doctor(fake, default):
    # GraphBuilder keeps what add_conditional knows of the node (its handle's default) in the
    # built graph's other_nodes: a handle made with a default is no finding, one without is.
    from rawgraph import DeviceBuffer, GraphBuilder
    from rawgraph.control import add_conditional, make_handle
    from rawgraph.doctor import check

    k = _kernels()
    y = DeviceBuffer(64)
    b = GraphBuilder()
    first = b.kernel(k["fill"].launch(1, 64, (y, 1.0, 64)))
    node = add_conditional(b, "if", make_handle(b, default=default), deps=first)
    node.bodies[0].kernel(k["scale"].launch(1, 64, (y, y, 2.0, 64)))
    g = b.build()
    try:
        details = [d for _h, kind, d in g.other_nodes if kind == "conditional"]
        assert details == [node]
        r = check(g, facts=_fake_facts(fake), torch=False)
        got = [(f.cls, f.name, f.severity) for f in r.findings if f.cls == 7]
        if default is None:
            assert got and got[0][1] == "conditional-default" and got[0][2] == "error", str(r)
        else:
            assert got == [], str(r)
    finally:
        g.close()
        y.close()


# ------------------------------------------------------------------------------- inputs named at the baseline
class _Named:
    """An input object as a caller names it: a range, and an identity (weak references allowed)."""

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes


def _whole_block(buf, state="active_allocated", size=None):
    """PyTorch's view of one segment holding ``buf`` as one block (the allocator's state the same
    before and after the owner changed: the case only the input's identity tells)."""
    return TorchView.from_snapshot(
        [
            {
                "address": buf.ptr,
                "total_size": buf.nbytes,
                "segment_pool_id": (0, 0),
                "blocks": [{"size": size or buf.nbytes, "state": state}],
            }
        ]
    )


@pytest.fixture
def reader(fake):
    """``(graph, x, y)``: node 0 touches only y, node 1 reads x (closed after the test)."""
    from rawgraph import DeviceBuffer, GraphBuilder

    k = _kernels()
    x, y = DeviceBuffer(64), DeviceBuffer(64)
    b = GraphBuilder()
    w = b.kernel(k["fill"].launch(1, 64, (y, 0.0, 64)))  # node 0: touches only y
    b.kernel(k["scale"].launch(1, 64, (x, y, 2.0, 64)), deps=[w])  # node 1: reads x
    g = b.build()
    try:
        yield g, x, y
    finally:
        g.close()
        x.close()
        y.close()


@pytest.mark.parametrize("keep", [True, False])
def test_an_input_collected_since_the_baseline_is_allocator_freed_at_its_reader(fake, reader, keep):
    # The memory stays live (the fake driver, and the same whole active torch block before and
    # after): only the identity the baseline recorded tells the input's owner has gone.
    import gc

    from rawgraph.doctor import check

    g, x, y = reader
    facts, view = _fake_facts(fake), _whole_block(x)
    obj = _Named(x.ptr, x.nbytes)
    base = check(g, inputs=[obj], facts=facts, torch=view)
    assert base.findings == [], str(base)
    assert [(r.label, r.lo, r.hi, r.alive) for r in base.inputs] == [("input 0", x.ptr, x.ptr + 256, True)]
    if not keep:
        del obj
        gc.collect()
    later = check(g, baseline=base, facts=facts, torch=view)
    got = [(f.cls, f.name, f.severity, f.path, f.where) for f in later.findings]
    if keep:
        assert got == [], str(later)
        return
    assert got == [(4, "allocator-freed", "error", "1", "arg x")], str(later)
    hit = later.findings[0]
    assert hit.address == x.ptr and "input 0" in hit.owner and "active_allocated" in hit.owner
    assert "keep the input alive" in hit.advice
    # the later report carries the baseline's input on: a check against it still names the node
    assert [r.alive for r in later.inputs] == [False]
    again = check(g, baseline=later, facts=facts, torch=view)
    assert [(f.cls, f.path) for f in again.findings] == [(4, "1")], str(again)
    # the block split since (the per-address classification's class 4): one finding, not two
    split = check(g, baseline=base, facts=facts, torch=_whole_block(x, size=128))
    assert [(f.cls, f.path) for f in split.findings] == [(4, "1")], str(split)
    assert "changed since the baseline" in split.findings[0].owner
    # freed at the driver too: class 1 says it, class 4 does not repeat it
    x.close()
    gone = check(g, baseline=base, facts=facts, torch=False)
    assert [(f.cls, f.path) for f in gone.findings] == [(1, "1")], str(gone)


def test_a_report_keeps_no_input_alive_and_lists_them(fake, reader):
    import gc
    import weakref

    from rawgraph.doctor import check

    g, x, y = reader
    obj = _Named(x.ptr, x.nbytes)
    alive = weakref.ref(obj)
    r = check(g, inputs=[obj], facts=_fake_facts(fake), torch=False)
    assert r.inputs[0].alive is True
    del obj
    gc.collect()
    assert alive() is None
    assert r.inputs[0].alive is False
    d = json.loads(json.dumps(r.to_dict()))
    assert d["inputs"] == [{"label": "input 0", "lo": f"0x{x.ptr:x}", "nbytes": 256, "alive": False}]


def test_a_pointer_and_size_input_has_no_identity(fake, reader):
    from rawgraph.doctor import check

    g, x, y = reader
    facts, view = _fake_facts(fake), _whole_block(x)
    base = check(g, inputs=[(x.ptr, x.nbytes)], facts=facts, torch=view)
    assert base.inputs[0].ref is None and base.inputs[0].alive is None
    assert base.to_dict()["inputs"][0]["alive"] is None
    later = check(g, baseline=base, facts=facts, torch=view)
    assert later.findings == [], str(later)


class _FakeTensor:
    """What the doctor reads of a torch tensor: ``data_ptr``, ``element_size``, ``_base``; its
    truth value refused, as a tensor of more than one element refuses it."""

    def __init__(self, ptr, n, base=None):
        self._ptr, self._n, self._base = ptr, n, base

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        return 4

    def numel(self):
        return self._n

    def __bool__(self):
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")


def test_the_owner_of_a_view_is_its_base():
    import gc

    from rawgraph.doctor.check import _input_records, _memory_owner

    root = _FakeTensor(0x7F0000001000, 64)
    view = _FakeTensor(0x7F0000001040, 16, base=root)
    assert _memory_owner(view) is root and _memory_owner(root) is root
    assert _memory_owner(_Named(1, 2)) is not None
    (rec,) = _input_records([view])
    assert (rec.lo, rec.nbytes) == (0x7F0000001040, 64) and rec.ref() is root
    del view
    gc.collect()
    assert rec.alive  # the view is gone, the memory's owner is not
    (bare,) = _input_records([object.__new__(_NoWeakref)])
    assert bare.ref is None and bare.alive is None  # refuses weak references: no identity


class _Storage:
    pass


class _FakeStorageTensor(_FakeTensor):
    """A torch tensor of torch >= 2: one storage object shared by its views and ``detach()``."""

    def __init__(self, ptr, n, storage):
        super().__init__(ptr, n)
        self._storage = storage

    def untyped_storage(self):
        return self._storage

    def detach(self):
        return _FakeStorageTensor(self._ptr, self._n, self._storage)


def test_the_owner_of_a_torch_tensor_is_its_storage_so_a_detached_wrapper_is_not_freed():
    import gc

    from rawgraph.doctor.check import _input_records

    x = _FakeStorageTensor(0x7F0000001000, 64, _Storage())
    (rec,) = _input_records([x.detach()])  # the wrapper dies at once; the storage lives with x
    gc.collect()
    assert rec.alive is True
    del x
    gc.collect()
    assert rec.alive is False  # the last tensor on the storage is gone: the memory is the allocator's


class _NoWeakref:
    __slots__ = ()
    ptr = 0x7F0000002000
    nbytes = 64


# ------------------------------------------------------------------------------- host memory in the overlap analysis
@pytest.mark.parametrize("into", ["pinned", "device"])
def test_two_unordered_copies_into_one_buffer_are_unordered_writes_pinned_as_device(fake, into):
    # Two copies writing the same bytes with no path between them race in every replay, whatever
    # the memory: pinned host memory gets the same class 5 error as device memory.
    from rawgraph import DeviceBuffer, GraphBuilder, HostBuffer
    from rawgraph.doctor import check

    rng = np.random.default_rng()
    n = int(rng.integers(16, 1025))  # floats in the destination
    la, lb = (int(v) for v in rng.integers(1, n + 1, 2))  # each copy writes the destination's first floats
    dst = HostBuffer(n, np.float32) if into == "pinned" else DeviceBuffer(n)
    x, y = DeviceBuffer(n), DeviceBuffer(n)
    graphs = []
    try:
        for ordered in (False, True):
            gb = GraphBuilder()
            first = gb.memcpy(dst, x, 4 * la)
            gb.memcpy(dst, y, 4 * lb, deps=[first] if ordered else ())
            g = gb.build()
            graphs.append(g)
            r = check(g, facts=_fake_facts(fake), torch=False)
            got = [(f.cls, f.name, f.severity, f.address, f.where, f.related) for f in r.findings if f.cls == 5]
            if ordered:
                assert got == [], str(r)
            else:
                assert got == [(5, "unordered-overlap", "error", dst.ptr, "memcpy.dst", ("0",))], str(r)
    finally:
        for g in graphs:
            g.close()
        for buf in (dst, x, y):
            buf.close()


# ------------------------------------------------------------------------------- what check() takes
@pytest.mark.parametrize(
    "bad",
    [
        3.5,
        True,
        "5",
        b"\x05",
        None,
        np.float64(7.0),
        SimpleNamespace(handle=7.5),
        SimpleNamespace(handle=driver.CUstream(7)),
        SimpleNamespace(),
    ],
    ids=["float", "bool", "str", "bytes", "None", "np.float64", "float-handle", "stream-handle", "no-handle"],
)
def test_check_refuses_what_is_not_a_graph_by_type_before_any_driver_call(monkeypatch, bad):
    # Only a graph object or a CUgraph / integer handle is a graph: anything else (a float that
    # int() would truncate to a handle, a string int() would parse, another driver object) is
    # refused with DoctorError before the node read-back reaches the driver.
    from rawgraph.doctor import DoctorError, check

    doctor_check = sys.modules["rawgraph.doctor.check"]  # the module (the package's `check` is the function)
    reached = []
    monkeypatch.setattr(doctor_check, "read_graph", lambda handle: reached.append(int(handle)) or [])
    with pytest.raises(DoctorError, match="check\\(\\) takes a Graph"):
        check(bad, torch=False)
    assert reached == []
    # the handles it does take reach the read-back as they are
    value = int(np.random.default_rng().integers(1, 1 << 40))
    for good in (value, np.uint64(value), driver.CUgraph(value), SimpleNamespace(handle=driver.CUgraph(value))):
        assert check(good, torch=False).findings == []
    assert reached == [value] * 4
    for bounds in (-1, 1 << 64):
        with pytest.raises(DoctorError, match="handle"):
            check(bounds, torch=False)
    assert reached == [value] * 4
