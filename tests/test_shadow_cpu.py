"""The shadow-parameter core (rawgraph/updates/shadow.py, issue 22 item 2) on the CPU fake driver:
only changed nodes are pushed, a push refused at the k-th node leaves the exec equal to the
shadow, replaced objects stay alive until the replay's stream event has fired, and every update
path (manager, rebinder, re-shaped graph, slot pool's params mode, indirect graph) runs on it."""

from __future__ import annotations

import fault_cases as fc
import pytest
from cuda.bindings import driver
from fault_cases import fake_session

SET = "cuGraphExecKernelNodeSetParams"


@pytest.fixture(scope="module")
def session():
    with fake_session() as (fake, hook):
        yield fake, hook


@pytest.fixture
def st(session):
    """A state dict whose objects are closed after the test."""
    state: dict = {}
    yield state
    fc.close_state(state)


class Pushes:
    """Counts cuGraphExecKernelNodeSetParams calls; refuses the ``fail``-th one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: int = 0):
        self.real = getattr(driver, SET)
        self.calls: list[int] = []
        self.fail = fail
        monkeypatch.setattr(driver, SET, self)

    def __call__(self, exe, node, params):
        self.calls.append(int(node))
        if len(self.calls) == self.fail:
            return (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
        return self.real(exe, node, params)


def _manager(st: dict, layers: int = 2) -> None:
    st.update(fc._manager(layers)())


def test_only_the_nodes_whose_parameters_changed_are_pushed(st, monkeypatch):
    _manager(st)
    mgr = st["mgr"]
    readers = {i for i, _a, _r in mgr.bindings["x"]}
    writers = {i for i, _a, _r in mgr.bindings["out"]}
    assert readers and writers and readers != set(range(len(mgr._handles)))
    pushes = Pushes(monkeypatch)
    assert mgr.bind("x", st["x2"]) == len(readers)
    assert set(pushes.calls) == {int(mgr._handles[i]) for i in readers}
    pushes.calls.clear()
    assert mgr.bind("x", st["x2"]) == 0 and mgr.bind_many({"x": st["x2"], "out": st["out"]}) == 0
    assert pushes.calls == []  # nothing changed: no driver call
    assert mgr.bind_many({"x": st["x2"], "out": st["o2"]}) == len(writers)
    assert set(pushes.calls) == {int(mgr._handles[i]) for i in writers}
    assert mgr.update_calls == mgr._shadow.pushes == len(readers) + len(writers)
    fc.mgr_consistent(st)


def test_a_push_of_no_node_makes_no_driver_call(st, monkeypatch):
    _manager(st)
    pushes = Pushes(monkeypatch)
    assert st["mgr"]._shadow.push([]) == 0 and pushes.calls == []


def _rebinder(st: dict) -> None:
    st.update(fc._rebinder_setup())
    st["binding"] = st["reb"].prepare({st["x"]: st["x2"], st["out"]: st["o2"]})


def _reshaped(st: dict) -> None:
    st.update(fc._reshaped_run_setup())


def _slots(st: dict) -> None:
    st.update(fc._pool_setup("params", joined=1)())
    st["pool"].join(fc.np.full(fc.W, 2.5, fc.np.float32))  # the table changed: the next step pushes


# path -> (setup, the update that pushes several nodes, exec == shadow check, nodes it pushes)
PATHS = {
    "manager": (
        _manager,
        lambda st: st["mgr"].bind_many({"x": st["x2"], "out": st["o2"]}),
        fc.mgr_consistent,
        lambda st: len({i for ns in st["mgr"].bindings.values() for i, _a, _r in ns}),
    ),
    "rebinder": (
        _rebinder,
        lambda st: st["reb"].apply(st["binding"]),
        fc.reb_consistent,
        lambda st: len(st["binding"].kernels),
    ),
    "reshaped": (
        _reshaped,
        lambda st: st["rg"].reshape(1),
        fc._reshaped_consistent,
        lambda st: sum(a != b for a, b in zip(st["rg"]._current[st["rg"]._group_of[1]], st["rg"]._keys[1])),
    ),
    "slots": (_slots, lambda st: st["pool"].step(), lambda st: _slots_consistent(st), lambda st: 2),
}


def _slots_consistent(st: dict) -> None:
    """Each gather/scatter node of every bucket holds the by-value table its shadow holds."""
    pool = st["pool"]
    for b, (shadow, tables) in pool._pushes.items():
        for node, table in zip(shadow.handles, tables):
            k = fc.held_kernel(pool.execs[b], node)
            off, _size = fc.FAKE.layout(k["func"])[[n for n, _ in pool._edges[b][0].args.spec].index("table")]
            assert k["blob"][off : off + table.nbytes] == table.tobytes(), f"bucket {b}: exec and shadow differ"


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_push_refused_at_the_kth_node_leaves_exec_and_shadow_equal(session, monkeypatch, path):
    from rawgraph.runtime.errors import CudaError

    setup, update, consistent, count = PATHS[path]
    probe: dict = {}
    setup(probe)
    n = count(probe)
    fc.close_state(probe)
    assert n >= 2, f"{path}: the update pushes {n} node(s), too few to fail half-way"
    for k in range(1, n + 1):
        st: dict = {}
        setup(st)
        try:
            pushes = Pushes(monkeypatch, fail=k)
            with pytest.raises(CudaError, match=SET):
                update(st)
            # the k-1 nodes the driver took were given their old values again
            assert len(pushes.calls) == k + (k - 1), (path, k, pushes.calls)
            assert pushes.calls[k:] == pushes.calls[: k - 1][::-1]
            consistent(st)
            monkeypatch.setattr(driver, SET, pushes.real)
            update(st)  # the same update again: it now goes through whole
            consistent(st)
        finally:
            monkeypatch.setattr(driver, SET, pushes.real)
            fc.close_state(st)


def test_a_replaced_array_is_held_until_the_event_after_its_replay_fires(st, monkeypatch):
    _manager(st)
    mgr, s = st["mgr"], st["s"]
    mgr.bind("x", st["x2"])
    assert mgr.retained == []  # never launched: no replay can read the old array
    mgr.launch(s)
    assert mgr._shadow.streams.streams == {s.ptr: s}  # the core's registry of streams launched on
    mgr.bind("x", st["x"])
    assert mgr.retained == [st["x2"]]
    recorded = []
    real_record, real_query = driver.cuEventRecord, driver.cuEventQuery
    monkeypatch.setattr(driver, "cuEventRecord", lambda e, h: recorded.append(int(h)) or real_record(e, h))
    monkeypatch.setattr(driver, "cuEventQuery", lambda e: (driver.CUresult.CUDA_ERROR_NOT_READY,))
    assert mgr.collect() == 1 and recorded == [int(s.handle)]  # covered by an event on the stream launched on
    assert mgr.retained == [st["x2"]]  # that event has not fired: still held
    monkeypatch.setattr(driver, "cuEventQuery", real_query)
    assert mgr.collect() == 0 and mgr.retained == []


def test_every_update_path_runs_on_the_shadow_core(st, monkeypatch):
    from rawgraph import RowCountBuckets
    from rawgraph.updates.shadow import ExecShadow

    seen: list[type] = []
    real = ExecShadow.push

    def push(self, nodes, undo=None, log=None):
        n = real(self, nodes, undo, log)
        if n:
            seen.append(owner_of.get(id(self), "?"))
        return n

    def part(setup):  # a setup whose objects this test's state closes
        sub = setup()
        st.setdefault("_own", []).extend(sub.get("_own", []))
        return sub

    m_st, r_st, g_st = part(fc._manager()), part(fc._rebinder_setup), part(fc._reshaped_run_setup)
    pool = part(fc._pool_setup("params", joined=1))["pool"]
    owner_of: dict[int, str] = {}
    # (before the row-count buckets: their setters bind the shadow's push once, when made)
    monkeypatch.setattr(ExecShadow, "push", push)
    rcb = fc._own(st, RowCountBuckets(g_st["model"], sizes=[2], stream=g_st["s"]))  # run(x, 1) bounds its 2 rows to 1
    ind_st = part(fc._ind_apply_setup())
    ind = ind_st["ind"]
    mgr, reb, rg = m_st["mgr"], r_st["reb"], g_st["rg"]
    owner_of.update(
        {
            id(mgr._shadow): "manager",
            id(reb._shadow): "rebinder",
            **{id(shadow): "slots" for shadow, _tables in pool._pushes.values()},
            **{id(sh): "reshaped" for sh in rg._shadows.values()},
            **{id(m._shadow): "rowcount" for m in rcb.managers.values()},
        }
    )
    # The manager's bind (its per-replay path) pushes through the core too: the core's
    # parameters, counter and rollback (tests/test_fault_injection_cpu.py)
    before = mgr._shadow.pushes
    pushed = mgr.bind("x", m_st["x2"])
    assert pushed > 0 and mgr._shadow.pushes == before + pushed
    reb.move(r_st["x"], r_st["x2"])
    rg.reshape(1)
    pool.step()
    rcb.run(g_st["x"], 1)
    assert sorted(set(seen)) == ["manager", "rebinder", "reshaped", "rowcount", "slots"], seen
    # the indirect graph pushes no node (its table moves): its keep-alive is the core's
    assert isinstance(ind._shadow, ExecShadow) and ind._keep is ind._shadow.keep
    old = ind.bound
    ind.apply(ind_st["pair"])
    assert ind._shadow.keep.retained == [old] and ind.retained == [old]
    # the counters tests read are the core's
    assert reb.pushes == reb._shadow.pushes > 0 and mgr.update_calls == mgr._shadow.pushes > 0
    assert rg.pushes == sum(sh.pushes for sh in rg._shadows.values()) > 0


def test_one_binding_family_with_one_liveness_rule(st):
    from rawgraph import Binding, IndirectBinding
    from rawgraph.runtime.errors import ClosedError
    from rawgraph.updates import rebind
    from rawgraph.updates.rebind import AddressBinding
    from rawgraph.updates.validate import BaseBinding

    # the rebinder's module no longer shadows rawgraph.Binding: its old name resolves, with a warning
    assert "Binding" not in vars(rebind)
    with pytest.warns(DeprecationWarning, match="AddressBinding"):
        assert rebind.Binding is AddressBinding
    assert all(issubclass(c, BaseBinding) for c in (Binding, IndirectBinding, AddressBinding))
    _manager(st)
    reb_st = fc._rebinder_setup()
    st.setdefault("_own", []).extend(reb_st["_own"])
    reb = reb_st["reb"]
    from rawgraph import DeviceBuffer

    for make, apply in (
        (lambda new: st["mgr"].prepare({"x": new}), lambda b: st["mgr"].apply(b)),
        (lambda new: reb.prepare({reb_st["x"]: new}), reb.apply),
    ):
        new = DeviceBuffer((st["model"].batch, st["model"].width))
        binding = make(new)
        assert binding.holds == (new,) or new in binding.holds
        new.close()
        with pytest.raises(ClosedError, match="closed after it was prepared"):
            apply(binding)
