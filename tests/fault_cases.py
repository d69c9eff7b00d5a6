"""The operations fault injection runs on the CPU fake driver (issue 21, section 3): one
:class:`~faultinject.Case` per public operation, each with what a right result is in terms of the
driver's state (kernels do not run on the fake: "right" means the exec, graph, tables and device
bytes are what a run with no fault leaves, and the library's shadow of them matches).

:func:`fake_session` installs the fake driver and the hook and saves and restores rawgraph's
process-wide state around them (device, loaded kernels), so the tests may run in a process that
also has the real driver. :func:`all_cases` lists the cases; ``benchmarks/fault_injection.py`` and
``tests/test_fault_injection_cpu.py`` run them.
"""

from __future__ import annotations

import contextlib
import gc
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from cuda.bindings import driver
from fakedriver import FakeDriver
from faultinject import Case, FaultHook

FAKE: FakeDriver | None = None
HOOK: FaultHook | None = None
W, B = 8, 2  # tiny shapes: every node and every call is there, nothing is big


@contextlib.contextmanager
def fake_session() -> Iterator[tuple[FakeDriver, FaultHook]]:
    """The fake driver and the hook installed over ``cuda.bindings.driver``, rawgraph's device and
    kernel caches emptied for the session and restored after it."""
    global FAKE, HOOK
    import rawgraph.graphs.keepalive as keepalive
    import rawgraph.runtime.device as device
    import rawgraph.runtime.module as kernels
    import rawgraph.runtime.stream as stream

    gc.collect()  # nothing of an earlier real-driver test may be released into the fake
    saved = (device._init_state, dict(device._devices), dict(kernels._kernels), list(keepalive._held))
    # Borrowed-stream checks made on one driver must not vouch for a handle on the other.
    stream._checked.clear()
    stream._wrappers.clear()
    device._init_state = None
    device._devices.clear()
    kernels._kernels.clear()
    keepalive._held.clear()
    fake = FakeDriver()
    fake.install()
    hook = FaultHook()
    hook.install()
    hook.exempt = lambda: {("module", int(k.module.handle)) for k in kernels._kernels.values()}
    hook.after_case = lambda: _clean_up(fake)
    FAKE, HOOK = fake, hook
    try:
        yield fake, hook
    finally:
        gc.collect()
        stream._checked.clear()
        stream._wrappers.clear()
        hook.active = False
        for k in list(kernels._kernels.values()):
            k.module.close()
        for dev in device._devices.values():
            dev._finalizer.detach()
        keepalive._held.clear()
        hook.uninstall()
        fake.uninstall()
        device._init_state = saved[0]
        device._devices.clear()
        device._devices.update(saved[1])
        kernels._kernels.clear()
        kernels._kernels.update(saved[2])
        keepalive._held[:] = saved[3]
        FAKE = HOOK = None


def _clean_up(fake: FakeDriver) -> list[str]:
    """What a case left behind that would spoil the next ones: captures still open in the fake or
    in rawgraph's registry, releases still deferred. Each is ended, run or dropped, and named."""
    import rawgraph.runtime._capturing as capturing
    import rawgraph.runtime.resource as resource

    problems = []
    for rec in capturing.active():
        problems.append(f"rawgraph still counts a capture open: {rec.describe()}")
        capturing.end(rec)
    for h, s in list(fake.streams.items()):
        if s.seq is not None:
            problems.append(f"stream 0x{h:x} left capturing")
            if s.seq.origin == h:
                fake.api["cuStreamEndCapture"](h)
            s.seq = None
    if resource._deferred:
        problems.append(f"{len(resource._deferred)} release(s) still deferred after the case")
        resource.flush_deferred()
    return problems


# ------------------------------------------------------------------------------- helpers
def _own(st: dict, *objs: Any) -> Any:
    st.setdefault("_own", []).extend(objs)
    return objs[-1] if objs else None


def close_state(st: dict) -> None:
    """Close what a case made, newest first (an exec before its graph, both before buffers)."""
    from rawgraph.graphs.builder import collect_held

    for obj in reversed(st.get("_own", [])):
        if obj is not None:
            obj.close()
    st.get("_own", []).clear()
    collect_held()  # callbacks held for replays of destroyed execs go once their fences fired


def _base(st: dict, layers: int = 1, form: str = "fused", width: int = W, batch: int = B) -> dict:
    from rawgraph import DeviceBuffer, Stream, TinyBlock

    s = _own(st, Stream())
    model = _own(st, TinyBlock(width, batch, layers, seed=3, form=form))
    rng = np.random.default_rng(7)
    x = _own(st, DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32), stream=s))
    out = _own(st, DeviceBuffer((batch, width)))
    st.update(s=s, model=model, x=x, out=out, rng=rng)
    return st


def _buffers(st: dict, *names: str) -> None:
    from rawgraph import DeviceBuffer

    for n in names:
        st[n] = _own(st, DeviceBuffer((st["model"].batch, st["model"].width)))


def _captured(st: dict) -> None:
    from rawgraph import capture_plan

    st["plan"] = st["model"].plan(st["x"], st["out"])
    st["graph"] = _own(st, capture_plan(st["plan"], st["s"]))


def words(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 8}Q", blob[: len(blob) // 8 * 8]))


def held_kernel(exe: Any, node: Any) -> dict:
    assert FAKE is not None
    return FAKE.exec_kernel(getattr(exe, "handle", exe), node)


def arg_value(args: Any, layout: list, blob: bytes, name: str) -> bytes:
    """The bytes argument ``name`` of ``args``' spec has in a device-side blob."""
    j = args.names().index(name)
    off, size = layout[j]
    return blob[off : off + size]


def assert_args_held(args: Any, func: int, blob: bytes, what: str) -> None:
    """The driver's blob holds exactly ``args`` (a KernelArgs shadow), parameter by parameter."""
    assert FAKE is not None
    layout = FAKE.layout(func)
    raw = args._storage.view(np.uint8)
    assert len(layout) == len(args.spec), f"{what}: layout {layout} vs spec {args.spec}"
    for (name, _kind), (off, size) in zip(args.spec, layout):
        mine = raw[args.offsets[name] : args.offsets[name] + size].tobytes()
        assert blob[off : off + size] == mine, (
            f"{what}: argument {name} held {blob[off : off + size].hex()}, shadow {mine.hex()}"
        )


def graph_fingerprint(handle: Any) -> list:
    """A graph's structure as the fake holds it: node kinds, functions, launch shapes, edges by
    index, recursively into child graphs and bodies (addresses left out: they differ per run)."""
    assert FAKE is not None
    g = FAKE.graphs[int(handle)]
    pos = {h: i for i, h in enumerate(g.nodes)}
    out: list = []
    for h in g.nodes:
        n = FAKE.nodes[h]
        item: list = [n.kind.name]
        if "kernel" in n.params:
            k = n.params["kernel"]
            item += [FAKE.functions[k["func"]].name, k["grid"], k["block"], k["smem"], len(k["blob"])]
        for child in n.params.get("owned", ()):
            item.append(graph_fingerprint(child))
        out.append(item)
    out.append(sorted((pos[a], pos[b], e) for a, b, e in g.edges))
    return out


def same_as_first(key: str) -> Callable[[Any], None]:
    """A check that records a fingerprint on the fault-free run and compares every later one."""
    seen: dict[str, Any] = {}

    def check(value: Any) -> None:
        if key not in seen:
            seen[key] = value
        assert value == seen[key], f"{key}: {value!r} differs from the fault-free run's {seen[key]!r}"

    return check


def no_capture_open() -> None:
    """No stream of the fake is left capturing (an error path that forgot to end a capture)."""
    assert FAKE is not None
    open_ = [hex(h) for h, s in FAKE.streams.items() if s.seq is not None]
    assert not open_, f"streams still capturing: {open_}"
    import rawgraph.runtime._capturing as cap

    assert not cap.active(), f"rawgraph still counts open captures: {[r.describe() for r in cap.active()]}"


def check_graph(graph: Any, fp: Callable[[Any], None]) -> None:
    graph.verify_node_map()
    graph.verify_edges()
    fp(graph_fingerprint(graph.handle))
    no_capture_open()


def exec_matches_graph(exe: Any) -> None:
    """A fresh exec holds its graph's parameters for every kernel, memcpy and memset node."""
    assert FAKE is not None
    ex = FAKE.execs[int(exe.handle)]
    for h, stt in ex.state.items():
        n = FAKE.nodes[h]
        want = (
            n.params["kernel"]
            if "kernel" in n.params
            else {k: v for k, v in n.params.items() if k in ("memcpy", "memset")}
        )
        assert stt == want, f"exec node 0x{h:x} holds {stt}, graph {want}"


def last_launch(exe: Any, stream: Any) -> None:
    assert FAKE is not None
    assert FAKE.launch_log and FAKE.launch_log[-1] == ("graph", int(exe.handle), int(stream.handle)), (
        f"last launch {FAKE.launch_log[-1:]}, expected exec 0x{int(exe.handle):x} on 0x{int(stream.handle):x}"
    )


# ------------------------------------------------------------------------ the exec-update manager
def _manager(layers: int = 2) -> Callable[[], dict]:
    def setup() -> dict:
        from rawgraph import ExecUpdateManager

        st = _base({}, layers=layers)
        _captured(st)
        st["exe"] = _own(st, st["graph"].instantiate())
        st["mgr"] = _own(st, ExecUpdateManager(st["graph"], st["exe"]))
        _buffers(st, "x2", "o2")
        st["want"] = {"x": st["x"].ptr, "out": st["out"].ptr}
        return st

    return setup


def mgr_consistent(st: dict) -> None:
    """Every node's shadow equals what the exec holds; each name's slots hold one pointer, the
    one the manager says is bound (no half-applied bind), and the bound object is that array."""
    from rawgraph.runtime.memory import as_device_array

    mgr = st["mgr"]
    assert FAKE is not None
    for i, h in enumerate(mgr._handles):
        k = held_kernel(mgr.exec, h)
        assert_args_held(mgr._args[i], k["func"], k["blob"], f"node {i}")
        p = mgr._params[i]
        assert k["grid"] == (p.gridDimX, p.gridDimY, p.gridDimZ), f"node {i} grid {k['grid']}"
        now = mgr._slots.now.get(i)
        if now is not None:
            assert now == tuple(v.value for v in mgr._slots.views[i]), f"node {i}: cached slots differ from the slots"
    for name, uses in mgr.bindings.items():
        held = set()
        for i, arg, _role in uses:
            k = held_kernel(mgr.exec, mgr._handles[i])
            held.add(struct.unpack("<Q", arg_value(mgr._args[i], FAKE.layout(k["func"]), k["blob"], arg))[0])
        bound = mgr._bound_ptr[name][0]
        assert held == {bound}, f"{name}: the exec holds {sorted(map(hex, held))}, the manager says 0x{bound:x}"
        assert as_device_array(mgr._bound_obj[name]).ptr == bound, f"{name}: the object kept is not the one bound"


def mgr_expect(st: dict) -> None:
    mgr_consistent(st)
    for name, ptr in st["want"].items():
        assert st["mgr"].bound(name).ptr == ptr, f"{name} bound to 0x{st['mgr'].bound(name).ptr:x}, want 0x{ptr:x}"


def _bind(st: dict) -> None:
    st["mgr"].bind("x", st["x2"])
    st["want"]["x"] = st["x2"].ptr


def _bind_many(st: dict) -> None:
    st["mgr"].bind_many({"x": st["x2"], "out": st["o2"]})
    st["want"] = {"x": st["x2"].ptr, "out": st["o2"].ptr}


def _prepare_setup() -> dict:
    st = _manager()()
    return st


def _prepare(st: dict) -> None:
    st["binding"] = st["mgr"].prepare({"x": st["x2"], "out": st["o2"]})


def _prepare_check(st: dict) -> None:
    b = st["binding"]
    assert b.names == ("x", "out") and dict(b.entries)["x"][0] == st["x2"].ptr
    mgr_expect(st)  # preparing changes nothing


def _apply_setup() -> dict:
    st = _manager()()
    st["binding"] = st["mgr"].prepare({"x": st["x2"], "out": st["o2"]})
    return st


def _apply(st: dict) -> None:
    st["mgr"].apply(st["binding"])
    st["want"] = {"x": st["x2"].ptr, "out": st["o2"].ptr}


def _retire_setup() -> dict:
    """A manager whose keep-alive is one retired array short of its batch: the next bind that
    replaces an array records the covering fence (cuEventCreate, cuEventRecord, cuEventQuery)."""
    st = _manager()()
    mgr = st["mgr"]
    mgr.launch(st["s"])
    _buffers(st, "x3")
    for i in range(mgr._BATCH - 1):
        mgr.bind_many({"x": st["x3"] if i % 2 == 0 else st["x"], "out": st["out"]})
    assert len(mgr.retained) == mgr._BATCH - 1, len(mgr.retained)
    st["want"] = {"x": mgr.bound("x").ptr, "out": st["out"].ptr}
    return st


def _set_params(st: dict) -> None:
    st["mgr"].set_params(1, grid=(2, 1, 1))


def _set_params_check(st: dict) -> None:
    mgr_expect(st)
    assert held_kernel(st["exe"], st["mgr"]._handles[1])["grid"] == (2, 1, 1)


def _launch_mgr(st: dict) -> None:
    st["mgr"].launch(st["s"])


# ------------------------------------------------------------------------------- address rebinder
def _rebinder_setup() -> dict:
    from rawgraph.updates.rebind import AddressRebinder

    st = _base({}, layers=2)
    _captured(st)
    st["exe"] = _own(st, st["graph"].instantiate())
    st["reb"] = AddressRebinder(st["graph"], st["exe"])
    _buffers(st, "x2", "o2")
    return st


def reb_consistent(st: dict) -> None:
    """Every kernel node's copy equals what the exec holds, and every range sits wholly on one
    side of a move (all its words moved, or none: no half-applied rebind)."""
    reb = st["reb"]
    nbytes = st["x"].nbytes
    for node, kst in reb.kernels.items():
        blob = held_kernel(st["exe"], node)["blob"]
        assert blob == kst.held[: len(blob)] and kst.current() == kst.held[: kst.size], (
            f"node {kst.info.index}: the exec holds {blob.hex()}, the rebinder {kst.held.hex()}"
        )
    for old, new in (("x", "x2"), ("out", "o2")):
        lo_o, lo_n = st[old].ptr, st[new].ptr
        at_old = at_new = 0
        for node in reb.kernels:
            for w in words(held_kernel(st["exe"], node)["blob"]):
                at_old += lo_o <= w < lo_o + nbytes
                at_new += lo_n <= w < lo_n + nbytes
        assert at_old == 0 or at_new == 0, f"{old}: {at_old} word(s) still in the old range, {at_new} moved"


def _rebind(st: dict) -> None:
    st["reb"].move(st["x"], st["x2"])


def _rebind_check(st: dict) -> None:
    reb_consistent(st)
    found = st["reb"].find(st["x2"])
    assert len(found) == 2 and not st["reb"].find(st["x"]), (len(found), st["reb"].find(st["x"]))


def _reb_apply_setup() -> dict:
    st = _rebinder_setup()
    st["binding"] = st["reb"].prepare({st["x"]: st["x2"], st["out"]: st["o2"]})
    return st


def _reb_apply(st: dict) -> None:
    st["reb"].apply(st["binding"])


def _reb_apply_check(st: dict) -> None:
    reb_consistent(st)
    reb = st["reb"]
    assert len(reb.find(st["x2"])) == 2 and len(reb.find(st["o2"])) == 1
    assert not reb.find(st["x"]) and not reb.find(st["out"])


def _adopt_setup() -> dict:
    st = _base({}, layers=1)
    _captured(st)
    return st


def _adopt(st: dict) -> None:
    from rawgraph import adopt

    ag = adopt(st["graph"].handle, owner=st["graph"])
    st["ag"] = ag
    st["reb"] = ag.rebinder()
    _own(st, ag, st["reb"].exec)


def _adopt_check(st: dict) -> None:
    reb = st["reb"]
    assert len(reb.kernels) == 2 and not reb.unreadable
    assert all(kst.info.name and kst.info.layout for kst in reb.kernels.values()), (
        "a kernel read without name or layout"
    )
    for node, kst in reb.kernels.items():
        assert held_kernel(reb.exec, node)["blob"] == kst.held[: kst.size]
    assert len(reb.find(st["x"])) == 2


# ----------------------------------------------------------------------- whole-graph update + adopt
def _update_setup() -> dict:
    from rawgraph import capture_plan

    st = _manager(layers=1)()
    _buffers(st, "x3", "o3")
    st["graph2"] = _own(st, capture_plan(st["model"].plan(st["x3"], st["o3"]), st["s"]))
    return st


def _update(st: dict) -> None:
    st["exe"].update(st["graph2"])
    st["mgr"].follow_update(st["graph2"])
    st["want"] = {"x": st["x3"].ptr, "out": st["o3"].ptr}


def _update_consistent(st: dict) -> None:
    mgr_consistent(st)


# ------------------------------------------------------------------------------ capture and execs
def _capture_setup() -> dict:
    st = _base({})
    st["plan"] = st["model"].plan(st["x"], st["out"])
    return st


def _capture(st: dict) -> None:
    from rawgraph import capture_plan

    st["graph"] = _own(st, capture_plan(st["plan"], st["s"]))


def _branches_setup() -> dict:
    from rawgraph import DeviceBuffer

    st = _base({})
    st["x2"] = _own(st, DeviceBuffer((B, W)))
    st["o2"] = _own(st, DeviceBuffer((B, W)))
    st["plans"] = [st["model"].plan(st["x"], st["out"]), st["model"].plan(st["x2"], st["o2"])]
    return st


def _branches(st: dict) -> None:
    from rawgraph import capture_branches

    st["graph"] = _own(st, capture_branches(st["plans"], st["s"]))
    st["graph"].keep = st["plans"]


def _instantiate_setup() -> dict:
    st = _base({})
    _captured(st)
    return st


def _instantiate(st: dict) -> None:
    st["exe"] = _own(st, st["graph"].instantiate())


def _exec_setup() -> dict:
    st = _instantiate_setup()
    st["exe"] = _own(st, st["graph"].instantiate())
    return st


def _static_setup() -> dict:
    return _base({})


def _static(st: dict) -> None:
    from rawgraph import StaticGraph

    st["sg"] = _own(st, StaticGraph(st["model"], st["s"]))


def _static_check(st: dict) -> None:
    sg = st["sg"]
    check_graph(sg.graph, st["fp"])
    exec_matches_graph(sg.exec)


def _static_call_setup() -> dict:
    st = _static_setup()
    _static(st)
    return st


def _static_call(st: dict) -> None:
    st["sg"](st["x"], st["s"])


def _static_call_check(st: dict) -> None:
    sg = st["sg"]
    last_launch(sg.exec, st["s"])
    assert FAKE is not None
    assert FAKE.read(sg.static_input.ptr, sg.static_input.nbytes) == FAKE.read(st["x"].ptr, st["x"].nbytes)


# The block kernels: used by no other case (those run the fused form), compiled with clusters.
MODULE_FILE, MODULE_KERNELS = "block", ["block_kernel<1, 8>", "block_kernel<2, 4>"]


def _module_setup() -> dict:
    import rawgraph.runtime.module as kernels

    for key in [k for k in kernels._kernels if k[1] == MODULE_FILE]:
        kernels._kernels.pop(key).module.close()
    return {}


def _module(st: dict) -> None:
    from rawgraph.runtime.module import get_kernels

    st["kernels"] = get_kernels(MODULE_FILE, MODULE_KERNELS)


def _module_check(st: dict) -> None:
    assert FAKE is not None
    for k, cluster in zip(st["kernels"], ((8, 1, 1), (4, 1, 1))):
        assert int(k.handle) in FAKE.functions and FAKE.functions[int(k.handle)].name == k.symbol
        assert k.cluster_dims == cluster and k.registers == 32, (k.name, k.cluster_dims, k.registers)


# ------------------------------------------------------------------------------ indirect graph
def _indirect_setup() -> dict:
    return _base({}, layers=2)


def _indirect(st: dict) -> None:
    from rawgraph import IndirectGraph

    st["ind"] = _own(st, IndirectGraph(st["model"], st["x"], st["out"], st["s"]))


def _indirect_check(st: dict) -> None:
    ind = st["ind"]
    check_graph(ind.graph, st["fp"])
    exec_matches_graph(ind.exec)
    assert tuple(int(v) for v in ind._table) == (st["x"].ptr, st["out"].ptr)
    assert FAKE is not None and FAKE.read(ind._dev.ptr, 16) == ind._table.tobytes()


def _ind_apply_setup(retire: bool = False) -> Callable[[], dict]:
    def setup() -> dict:
        st = _indirect_setup()
        _indirect(st)
        _buffers(st, "x2", "o2")
        ind = st["ind"]
        ind.launch(st["s"])
        if retire:  # one replaced pair short of the keep-alive batch
            _buffers(st, "x3")
            pairs = [ind.prepare(st["x3"], st["o2"]), ind.prepare(st["x"], st["out"])]
            for i in range(ind._keep.batch - 1):
                ind.apply(pairs[i % 2])
            assert len(ind.retained) == ind._keep.batch - 1
        st["pair"] = ind.prepare(st["x2"], st["o2"])
        return st

    return setup


def ind_consistent(st: dict) -> None:
    """The pinned table holds the pair the graph says is bound."""
    from rawgraph.runtime.memory import as_device_array

    ind = st["ind"]
    held = tuple(int(v) for v in ind._table)
    bound = tuple(as_device_array(a).ptr for a in ind.bound)
    assert held == bound, f"the table holds {tuple(map(hex, held))}, bound {tuple(map(hex, bound))}"


def _ind_apply(st: dict) -> None:
    st["ind"].apply(st["pair"])


def _ind_apply_check(st: dict) -> None:
    ind_consistent(st)
    assert st["ind"].bound == (st["x2"], st["o2"])


# ------------------------------------------------------------------------------ bucket graphs
def _buckets_setup() -> dict:
    return _base({})


def _buckets(scratch: str = "arena") -> Callable[[dict], None]:
    def run(st: dict) -> None:
        from rawgraph import BucketGraphs

        st["bg"] = _own(st, BucketGraphs(st["model"], sizes=[1, 2], stream=st["s"], scratch=scratch))

    return run


def _buckets_check(st: dict) -> None:
    bg = st["bg"]
    st["fp"]([graph_fingerprint(bg.graphs[b].handle) for b in bg.sizes])
    for b in bg.sizes:
        exec_matches_graph(bg.execs[b])
    no_capture_open()


def _buckets_run_setup(cls: str = "BucketGraphs") -> Callable[[], dict]:
    def setup() -> dict:
        import rawgraph

        st = _base({})
        st["bg"] = _own(st, getattr(rawgraph, cls)(st["model"], sizes=[1, 2], stream=st["s"]))
        big = st["rng"].standard_normal((5, W), dtype=np.float32)
        st["xbig"] = _own(st, rawgraph.DeviceBuffer.from_numpy(big, stream=st["s"]))
        return st

    return setup


def _buckets_run(n: int, stream: str = "s") -> Callable[[dict], None]:
    def run(st: dict) -> None:
        from rawgraph import Stream

        if stream != "s" and "s2" not in st:
            st["s2"] = _own(st, Stream())
        st["src"] = st["xbig"] if n > st["bg"].largest else st["x"]
        st["res"] = st["bg"].run(st["src"], n, st[stream])
        st["n"], st["stream"] = n, st[stream]

    return run


def _buckets_run_check(st: dict) -> None:
    assert FAKE is not None
    bg, n = st["bg"], st["n"]
    assert bg.stats["runs"] == 1, f"runs counted {bg.stats['runs']} times"
    rb = bg._row_bytes
    x = FAKE.read(st["src"].ptr, n * rb)
    if n <= bg.largest:
        b = bg.bucket_for(n)
        last_launch(bg.execs[b], st["stream"])
        assert FAKE.read(bg.input.ptr, n * rb) == x
        assert FAKE.read(bg.input.ptr + n * rb, (b - n) * rb) == bytes((b - n) * rb)
        if hasattr(bg, "_setters"):  # row-count buckets: every node bounded to n rows
            mgr = bg.managers[b]
            for i, h in enumerate(mgr._handles):
                k = held_kernel(bg.execs[b], h)
                assert_args_held(mgr._args[i], k["func"], k["blob"], f"bucket {b} node {i}")
                assert mgr._args[i]["B"] == n
    else:
        # (chunks a failed run computed before its error count as computed: they ran)
        assert bg.stats["fallback_chunks"] >= -(-n // bg.largest) and bg.stats["fallback_runs"] == 1
        tail = n - (n - 1) // bg.largest * bg.largest  # rows of the last chunk
        assert FAKE.read(bg.input.ptr, tail * rb) == x[(n - tail) * rb :]
        last_launch(bg.execs[bg.bucket_for(tail)], st["stream"])
        assert bg._overflow is not None and bg._overflow.shape[0] >= n


def _rowcount_consistent(st: dict) -> None:
    bg = st["bg"]
    for b, mgr in bg.managers.items():
        for i, h in enumerate(mgr._handles):
            k = held_kernel(bg.execs[b], h)
            assert_args_held(mgr._args[i], k["func"], k["blob"], f"bucket {b} node {i}")


def _reshaped(st: dict) -> None:
    from rawgraph import ReshapedGraph

    st["rg"] = _own(st, ReshapedGraph(st["model"], max_batch=2, stream=st["s"]))


def _reshaped_check(st: dict) -> None:
    rg = st["rg"]
    st["fp"]([graph_fingerprint(g.handle) for g in rg.graphs.values()])
    for exe in rg.execs.values():
        exec_matches_graph(exe)
    no_capture_open()


def _reshaped_run_setup() -> dict:
    st = _base({})
    _reshaped(st)
    return st


def _reshaped_run(st: dict) -> None:
    st["rg"].run(st["x"], 1)


def _reshaped_consistent(st: dict) -> None:
    """Each exec node holds exactly the parameters the graph believes it pushed last."""
    assert FAKE is not None
    rg = st["rg"]
    for sig, exe in rg.execs.items():
        for i, h in enumerate(rg._handles[sig]):
            k = held_kernel(exe, h)
            func, grid, block, smem, blob = rg._current[sig][i]
            assert (k["func"], k["grid"], k["block"], k["smem"]) == (int(func), grid, block, smem), f"node {i} shape"
            args = rg._plans[next(b for b in rg._plans if rg._keys[b][i] == rg._current[sig][i])].launches[i].args
            assert_args_held(args, k["func"], k["blob"], f"node {i}")


def _reshaped_run_check(st: dict) -> None:
    _reshaped_consistent(st)
    rg = st["rg"]
    sig = rg._group_of[1]
    assert rg._current[sig] == rg._keys[1], "the exec was not re-shaped to 1 row"
    last_launch(rg.execs[sig], st["s"])
    assert FAKE is not None and FAKE.read(rg.input.ptr, rg._row_bytes) == FAKE.read(st["x"].ptr, rg._row_bytes)


# ------------------------------------------------------------------------------------ slots
def _slots_setup() -> dict:
    return _base({})


def _slots(table: str) -> Callable[[dict], None]:
    def run(st: dict) -> None:
        from rawgraph import SlotPool

        st["pool"] = _own(st, SlotPool(st["model"], max_slots=2, sizes=[1, 2], table=table, stream=st["s"]))

    return run


def _slots_check(st: dict) -> None:
    pool = st["pool"]
    st["fp"]([graph_fingerprint(pool.graphs[b].handle) for b in pool.sizes])
    for b in pool.sizes:
        exec_matches_graph(pool.execs[b])
    assert list(pool.table) == [pool.scratch_slot] * len(pool.table) and len(pool) == 0
    no_capture_open()


def _pool_setup(table: str, joined: int = 0, step: bool = False) -> Callable[[], dict]:
    def setup() -> dict:
        st = _slots_setup()
        _slots(table)(st)
        pool = st["pool"]
        st["rows"] = {}
        for i in range(joined):
            row = np.full(W, 1.5 + i, np.float32)
            st["rows"][pool.join(row)] = row
        if step:
            pool.step()
        st["steps"] = pool.steps
        return st

    return setup


def pool_consistent(st: dict) -> None:
    """The pool's bookkeeping agrees with itself and with the device: the live slots are the
    table's first entries, the rest the scratch slot, every live row's bytes on the device."""
    assert FAKE is not None
    pool = st["pool"]
    live = sorted(pool._pos)
    assert sorted(st["rows"]) == live, f"live slots {live}, expected {sorted(st['rows'])}"
    assert sorted(int(v) for v in pool.table[: len(live)]) == live
    assert all(int(v) == pool.scratch_slot for v in pool.table[len(live) :])
    assert sorted(pool._free + live) == list(range(pool.max_slots))
    for slot, row in st["rows"].items():
        assert FAKE.read(pool.state.ptr + slot * W * 4, W * 4) == row.tobytes(), f"slot {slot} row"


def _join(st: dict) -> None:
    row = np.full(W, 9.25, np.float32)
    st["rows"][st["pool"].join(row)] = row


def _leave(st: dict) -> None:
    slot = sorted(st["rows"])[0]
    got = st["pool"].leave(slot)
    assert np.array_equal(got, st["rows"][slot]), (got, st["rows"][slot])
    del st["rows"][slot]


def _step(st: dict) -> None:
    st["bucket"] = st["pool"].step()
    st["steps"] += 1


def _step_check(st: dict) -> None:
    assert FAKE is not None
    pool_consistent(st)
    pool, b = st["pool"], st["bucket"]
    assert pool.steps == st["steps"], f"steps {pool.steps}, expected {st['steps']}"
    last_launch(pool.execs[b], pool.stream)
    if pool.mode == "copy":
        assert FAKE.read(pool.table_dev.ptr, 4 * b) == pool.table[:b].tobytes()
    if pool.mode == "params":
        shadow, tables = pool._pushes[b]
        for node, _table in zip(shadow.handles, tables):
            k = held_kernel(pool.execs[b], node)
            layout = FAKE.layout(k["func"])
            off, size = layout[[n for n, _ in pool._edges[b][0].args.spec].index("table")]
            assert k["blob"][off : off + 4 * b] == pool.table[:b].tobytes(), "by-value table not pushed"


# ------------------------------------------------------------------------------------ builder
def _builder_setup() -> dict:
    from rawgraph import Event, HostBuffer

    st = _base({})
    st["plan"] = st["model"].plan(st["x"], st["out"])
    st["hb"] = _own(st, HostBuffer(4, np.int32))
    st["ev"] = _own(st, Event(timing=False))
    return st


def _build_plan(st: dict) -> None:
    from rawgraph import build_plan

    st["graph"] = _own(st, build_plan(st["plan"]))


def _builder_nodes(st: dict) -> None:
    from rawgraph import GraphBuilder

    with GraphBuilder() as g:
        a = g.memcpy(st["x"], st["hb"], 16)
        k = g.run(st["plan"], deps=a)
        m = g.memset(st["out"], 0, 4, deps=k[-1])
        h = g.host(lambda: None, deps=m)
        e = g.event_record(st["ev"], deps=h)
        w = g.event_wait(st["ev"], deps=e)
        node, ptr = g.mem_alloc(64, deps=w)
        f = g.mem_free(ptr, deps=node)
        g.empty(deps=[f, k[0]])
        st["graph"] = _own(st, g.build())


def _built_check(st: dict) -> None:
    check_graph(st["graph"], st["fp"])


def _edge_setup() -> dict:
    """A builder the caller keeps using: one kernel node in, the next one to follow it by a
    programmatic (PDL) edge."""
    from rawgraph import GraphBuilder

    st = _builder_setup()
    st["builder"] = _own(st, GraphBuilder())
    launches = st["plan"].launches
    st["first"] = st["builder"].kernel(launches[0])
    return st


def _edge(st: dict) -> None:
    st["builder"].kernel(st["plan"].launches[1], deps=[(st["first"], "programmatic")])


def _edge_check(st: dict) -> None:
    b = st["builder"]
    assert len(b.nodes) == len(b.kernel_nodes) == 2, (len(b.nodes), len(b.kernel_nodes))
    st["fp"](graph_fingerprint(b.handle))


def _edge_consistent(st: dict) -> None:
    """After a refused add, the graph holds exactly the nodes the builder recorded."""
    assert FAKE is not None
    b = st["builder"]
    held = FAKE.graphs[int(b.handle)].nodes
    assert [int(n.handle) for n in b.nodes] == held, (
        f"the graph holds {len(held)} nodes, the builder recorded {len(b.nodes)}"
    )
    assert len(b.nodes) == len(b.kernel_nodes)


def _clone_setup() -> dict:
    st = _builder_setup()
    _build_plan(st)
    return st


def _clone(st: dict) -> None:
    st["copy"] = _own(st, st["graph"].clone())


def _clone_check(st: dict) -> None:
    check_graph(st["copy"], st["fp"])
    assert graph_fingerprint(st["copy"].handle) == graph_fingerprint(st["graph"].handle)


def _child_setup() -> dict:
    st = _clone_setup()
    return st


def _child(st: dict) -> None:
    from rawgraph import GraphBuilder

    with GraphBuilder() as g:
        g.child(st["graph"])
        g.empty()
        st["parent"] = _own(st, g.build())


def _child_check(st: dict) -> None:
    check_graph(st["parent"], st["fp"])


# --------------------------------------------------------------------------- control: conditional, device launch
def _control_setup() -> dict:
    from rawgraph import DeviceBuffer

    st = _base({}, layers=2)
    st["w"] = st["model"].block_weights
    st["depth_x"] = _own(st, DeviceBuffer((B, W)))
    return st


def _normgate(st: dict) -> None:
    from rawgraph.control import NormGate

    st["gate"] = _own(st, NormGate(st["model"], st["x"], st["out"], 1.0))


def _normgate_check(st: dict) -> None:
    g = st["gate"]
    st["fp"](graph_fingerprint(g.graph.handle))
    exec_matches_graph(g.exec)


def _depthloop(capture: bool) -> Callable[[dict], None]:
    def run(st: dict) -> None:
        from rawgraph.control import DepthLoop

        st["loop"] = _own(st, DepthLoop(st["model"], st["x"], st["out"], capture=capture, stream=st["s"]))

    return run


def _depthloop_check(st: dict) -> None:
    loop = st["loop"]
    st["fp"](graph_fingerprint(loop.graph.handle))
    exec_matches_graph(loop.exec)
    no_capture_open()
    assert FAKE is not None and FAKE.read(loop.depth.ptr, 4) == struct.pack("<I", loop.max_depth)


def _devgraph_setup() -> dict:
    st = _base({})
    _captured(st)
    return st


def _devgraph(st: dict) -> None:
    from rawgraph.control import DeviceGraph

    st["dg"] = _own(st, DeviceGraph(st["graph"], st["s"]))


def _devgraph_check(st: dict) -> None:
    dg = st["dg"]
    assert FAKE is not None
    ex = FAKE.execs[int(dg.exec.handle)]
    assert ex.flags & int(driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    exec_matches_graph(dg.exec)


def _launcher_setup() -> dict:
    st = _devgraph_setup()
    _devgraph(st)
    return st


def _launcher(st: dict) -> None:
    from rawgraph.control import launcher_graph

    st["lg"] = _own(st, launcher_graph(st["dg"], st["s"], "tail"))


def _launcher_check(st: dict) -> None:
    check_graph(st["lg"], st["fp"])


# ------------------------------------------------------------------------------------ closes
def _closer(
    make: Callable[[dict], Any], use: Callable[[Any, dict], Any], close: Callable[[Any], None] | None = None
) -> tuple[Callable[[], dict], Callable[[dict], None], Callable[[dict], Any], Callable[[dict], None]]:
    """(setup, run, again, check) of closing the object ``make`` builds: ``run`` closes it, ``again``
    uses it (must raise ClosedError before any driver call)."""

    def setup() -> dict:
        st = _base({})
        st["obj"] = make(st)
        return st

    def run(st: dict) -> None:
        (close or (lambda o: o.close()))(st["obj"])

    def again(st: dict) -> Any:
        return use(st["obj"], st)

    def check(st: dict) -> None:
        no_capture_open()

    return setup, run, again, check


def _launched_mgr(st: dict) -> Any:
    from rawgraph import DeviceBuffer, ExecUpdateManager

    _captured(st)
    st["exe"] = _own(st, st["graph"].instantiate())
    mgr = ExecUpdateManager(st["graph"], st["exe"])
    mgr.launch(st["s"])
    for _ in range(3):  # three retired arrays, covered by a fence on the next collect
        mgr.bind("x", _own(st, DeviceBuffer((B, W))))
    mgr.collect()
    mgr.bind("x", st["x"])
    return mgr


def _host_node_exec(st: dict) -> Any:
    from rawgraph import GraphBuilder

    with GraphBuilder() as g:
        g.host(lambda: None)
        graph = _own(st, g.build())
    exe = graph.instantiate()
    exe.launch(st["s"])
    return exe


def _closing_stream(st: dict) -> Any:
    from rawgraph import Stream

    s = Stream()
    st["model"].forward(st["x"], st["out"], s)
    return s


def _close_cases() -> list[Case]:
    from rawgraph import (
        BlockWeights,
        BucketGraphs,
        DeviceBuffer,
        Event,
        HostBuffer,
        IndirectGraph,
        ReshapedGraph,
        RowCountBuckets,
        SlotPool,
        StaticGraph,
        TinyBlock,
        Workspace,
        capture_plan,
        get_kernel,
    )
    from rawgraph.control import DepthLoop, DeviceGraph, NormGate
    from rawgraph.runtime.module import Module

    defs: list[tuple[str, Callable[[dict], Any], Callable[[Any, dict], Any]]] = [
        ("close DeviceBuffer", lambda st: DeviceBuffer((B, W)), lambda o, st: o.to_numpy(st["s"])),
        ("close HostBuffer", lambda st: HostBuffer(4), lambda o, st: o.array),
        ("close Stream", _closing_stream, lambda o, st: o.synchronize()),
        ("close Event", lambda st: Event().record(st["s"]), lambda o, st: o.synchronize()),
        (
            "close Graph",
            lambda st: capture_plan(st["model"].plan(st["x"], st["out"]), st["s"]),
            lambda o, st: o.instantiate(),
        ),
        (
            "close GraphExec",
            lambda st: _own(st, capture_plan(st["model"].plan(st["x"], st["out"]), st["s"])).instantiate(),
            lambda o, st: o.launch(st["s"]),
        ),
        ("close GraphExec with host node", _host_node_exec, lambda o, st: o.launch(st["s"])),
        (
            "close TinyBlock",
            lambda st: TinyBlock(W, B, 1, seed=5, form="fused"),
            lambda o, st: o.plan(st["x"], st["out"]),
        ),
        ("close StaticGraph", lambda st: StaticGraph(st["model"], st["s"]), lambda o, st: o.replay(st["s"])),
        ("close ExecUpdateManager", _launched_mgr, lambda o, st: o.bind("x", st["out"])),
        (
            "close IndirectGraph",
            lambda st: _launched(IndirectGraph(st["model"], st["x"], st["out"], st["s"]), st),
            lambda o, st: o.launch(st["s"]),
        ),
        (
            "close BucketGraphs",
            lambda st: BucketGraphs(st["model"], sizes=[1, 2], stream=st["s"]),
            lambda o, st: o.run(st["x"], 1),
        ),
        (
            "close RowCountBuckets",
            lambda st: RowCountBuckets(st["model"], sizes=[1, 2], stream=st["s"]),
            lambda o, st: o.run(st["x"], 1),
        ),
        (
            "close SlotPool",
            lambda st: SlotPool(st["model"], max_slots=2, sizes=[1, 2], stream=st["s"]),
            lambda o, st: o.join(np.zeros(W, np.float32)),
        ),
        ("close DepthLoop", lambda st: DepthLoop(st["model"], st["x"], st["out"]), lambda o, st: o.launch(st["s"])),
        ("close NormGate", lambda st: NormGate(st["model"], st["x"], st["out"], 1.0), lambda o, st: o.launch(st["s"])),
        (
            "close DeviceGraph",
            lambda st: DeviceGraph(_own(st, capture_plan(st["model"].plan(st["x"], st["out"]), st["s"])), st["s"]),
            lambda o, st: o.launch(st["s"]),
        ),
        (
            "close Module",
            lambda st: Module(get_kernel("elementwise", "relu").module.compiled),
            lambda o, st: o.function("relu"),
        ),
        ("close BlockWeights", lambda st: BlockWeights(W, 2, seed=1), lambda o, st: o.numpy(st["s"])),
        ("close Workspace", lambda st: Workspace(B, W), lambda o, st: o.views(1)),
        ("close GraphBuilder (not built)", _unbuilt, lambda o, st: o.empty()),
        (
            "close ReshapedGraph",
            lambda st: ReshapedGraph(st["model"], max_batch=2, stream=st["s"]),
            lambda o, st: o.run(st["x"], 1),
        ),
    ]
    cases = []
    for op, make, use in defs:
        setup, run, again, check = _closer(make, use)
        cases.append(Case(op, setup, run, check, _close_obj, again=again, closes=True))
    return cases


def _unbuilt(st: dict) -> Any:
    from rawgraph import GraphBuilder

    g = GraphBuilder()
    g.run(st["model"].plan(st["x"], st["out"]))
    return g


def _launched(obj: Any, st: dict) -> Any:
    obj.launch(st["s"])
    return obj


def _close_obj(st: dict) -> None:
    obj = st.pop("obj", None)
    if obj is not None:
        obj.close()
    close_state(st)


# ------------------------------------------------------------------------------------ catalog
def _case(
    op: str,
    setup: Callable[[], dict],
    run: Callable[[dict], Any],
    check: Callable[[dict], None],
    consistent: Callable[[dict], None] | None = None,
    again: Callable[[dict], Any] | None = None,
) -> Case:
    fp = same_as_first(op)

    def setup_fp() -> dict:
        st = setup()
        st["fp"] = fp
        return st

    return Case(op, setup_fp, run, check, close_state, consistent, again)


def all_cases() -> list[Case]:
    """Every operation fault injection covers on the CPU (see the module docstring)."""
    fp_check = lambda key: lambda st: check_graph(st[key], st["fp"])  # noqa: E731
    cases = [
        _case("module load (get_kernels)", _module_setup, _module, _module_check),
        _case("capture (capture_plan)", _capture_setup, _capture, fp_check("graph")),
        _case("capture fork/join (capture_branches)", _branches_setup, _branches, fp_check("graph")),
        _case("instantiate", _instantiate_setup, _instantiate, lambda st: exec_matches_graph(st["exe"])),
        _case("upload", _exec_setup, lambda st: st["exe"].upload(st["s"]), lambda st: exec_matches_graph(st["exe"])),
        _case("launch", _exec_setup, lambda st: st["exe"].launch(st["s"]), lambda st: last_launch(st["exe"], st["s"])),
        _case("StaticGraph build", _static_setup, _static, _static_check),
        _case("StaticGraph copy-in + replay", _static_call_setup, _static_call, _static_call_check),
        _case("manager bind", _manager(), _bind, mgr_expect, mgr_consistent),
        _case("manager bind_many", _manager(), _bind_many, mgr_expect, mgr_consistent),
        _case("manager prepare", _prepare_setup, _prepare, _prepare_check, mgr_consistent),
        _case("manager apply", _apply_setup, _apply, mgr_expect, mgr_consistent),
        _case("manager bind_many at the keep-alive batch", _retire_setup, _bind_many, mgr_expect, mgr_consistent),
        _case("manager set_params", _manager(), _set_params, _set_params_check, mgr_consistent),
        _case("manager launch", _manager(), _launch_mgr, lambda st: last_launch(st["exe"], st["s"]), mgr_consistent),
        _case("exec update + manager adopt", _update_setup, _update, mgr_expect, _update_consistent),
        _case("rebinder rebind", _rebinder_setup, _rebind, _rebind_check, reb_consistent),
        _case("rebinder prepare + apply", _reb_apply_setup, _reb_apply, _reb_apply_check, reb_consistent),
        _case("adopt a raw graph + rebinder", _adopt_setup, _adopt, _adopt_check),
        _case("IndirectGraph build", _indirect_setup, _indirect, _indirect_check),
        _case("IndirectGraph apply", _ind_apply_setup(), _ind_apply, _ind_apply_check, ind_consistent),
        _case(
            "IndirectGraph apply at the keep-alive batch",
            _ind_apply_setup(True),
            _ind_apply,
            _ind_apply_check,
            ind_consistent,
        ),
        _case("BucketGraphs build (arena)", _buckets_setup, _buckets("arena"), _buckets_check),
        _case("BucketGraphs build (graph memory)", _buckets_setup, _buckets("graph"), _buckets_check),
        _case("BucketGraphs run", _buckets_run_setup(), _buckets_run(1), _buckets_run_check),
        _case("BucketGraphs run on another stream", _buckets_run_setup(), _buckets_run(1, "s2"), _buckets_run_check),
        _case("BucketGraphs run above the largest bucket", _buckets_run_setup(), _buckets_run(3), _buckets_run_check),
        _case(
            "RowCountBuckets run",
            _buckets_run_setup("RowCountBuckets"),
            _buckets_run(1),
            _buckets_run_check,
            _rowcount_consistent,
        ),
        _case("ReshapedGraph build", _buckets_setup, _reshaped, _reshaped_check),
        _case(
            "ReshapedGraph run (re-shape pushes)",
            _reshaped_run_setup,
            _reshaped_run,
            _reshaped_run_check,
            _reshaped_consistent,
        ),
        _case("SlotPool build (graph table)", _slots_setup, _slots("graph"), _slots_check),
        _case("SlotPool build (copy table)", _slots_setup, _slots("copy"), _slots_check),
        _case("SlotPool build (params table)", _slots_setup, _slots("params"), _slots_check),
    ]
    for table in ("graph", "copy", "params"):
        cases += [
            _case(f"SlotPool join ({table})", _pool_setup(table, 1, True), _join, pool_consistent, pool_consistent),
            _case(f"SlotPool leave ({table})", _pool_setup(table, 2, True), _leave, pool_consistent, pool_consistent),
            _case(f"SlotPool step ({table})", _pool_setup(table, 1), _step, _step_check, pool_consistent),
        ]
    cases += [
        _case("builder build (build_plan)", _builder_setup, _build_plan, _built_check),
        _case("builder every node type", _builder_setup, _builder_nodes, _built_check),
        _case("builder kernel node with a PDL edge (builder kept)", _edge_setup, _edge, _edge_check, _edge_consistent),
        _case("builder clone", _clone_setup, _clone, _clone_check),
        _case("builder child graph", _child_setup, _child, _child_check),
        _case("conditional NormGate (IF)", _control_setup, _normgate, _normgate_check),
        _case("conditional DepthLoop (WHILE, builder)", _control_setup, _depthloop(False), _depthloop_check),
        _case("conditional DepthLoop (WHILE, captured body)", _control_setup, _depthloop(True), _depthloop_check),
        _case("device launch DeviceGraph", _devgraph_setup, _devgraph, _devgraph_check),
        _case("device launch launcher_graph", _launcher_setup, _launcher, _launcher_check),
    ]
    return cases + _close_cases()
