"""Fault injection on the real driver (issue 21, section 3): the failures the CPU fake cannot judge
by output. The same hook as the CPU harness (``tests/faultinject.py``) wraps every ``cu*`` function of
``cuda.bindings.driver``; for each multi-node apply (the manager's ``bind`` / ``bind_many`` /
``prepare`` + ``apply``, the address rebinder's ``apply``, ``IndirectGraph.apply``) every one of its
driver calls is made to fail in turn (``CUDA_ERROR_OUT_OF_MEMORY``, the call never reaching the
driver), a ``cuGraphExecKernelNodeSetParams`` half-way through included. After each failure:

- the error is a typed rawgraph error naming the call that failed;
- the exec still runs exactly its old bindings (rolled back: the next replay writes the old output
  bit for bit as an eager run of the old input, and leaves the new output untouched);
- the same call again succeeds, and the replay after it writes the new output equal to an eager
  run of the new input and to the float64 reference;
- once everything is closed, every handle made in between was destroyed.
"""

import gc

import numpy as np
import pytest
from faultinject import FaultHook, names_call
from helpers import CHECK_DESTRUCTION, random_input, rel_err

from rawgraph import DeviceBuffer, ExecUpdateManager, IndirectGraph, TinyBlock, capture_plan
from rawgraph.runtime.errors import RawgraphError
from rawgraph.updates.rebind import AddressRebinder

pytestmark = pytest.mark.gpu
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
WIDTH, BATCH, LAYERS = 128, 2, 2  # fused form: x is read by nodes 0 and 1, out written by node 3


@pytest.fixture
def hook(device):
    """The fault hook over the real driver, for this test only (the kernel cache's modules are
    alive by design and not counted as leaks)."""
    import rawgraph.runtime.module as kernels

    gc.collect()
    h = FaultHook()
    h.exempt = lambda: {("module", int(k.module.handle)) for k in kernels._kernels.values()}
    h.install()
    try:
        yield h
    finally:
        h.uninstall()


class Rig:
    """One model, its captured graph and exec, the arrays bound at capture (``x0``, ``o0``) and the
    ones an apply moves the exec to (``x1``, ``o1``), each input random, each output poisoned."""

    def __init__(self, stream, rng, seed):
        self.stream = stream
        self.model = TinyBlock(WIDTH, BATCH, LAYERS, seed=seed, form="fused")
        self.xh = [random_input(rng, (BATCH, WIDTH)) for _ in range(2)]
        self.x = [DeviceBuffer.from_numpy(h, stream=stream) for h in self.xh]
        self.o = [DeviceBuffer((BATCH, WIDTH)) for _ in range(2)]
        self.ref = DeviceBuffer((BATCH, WIDTH))
        self.graph = capture_plan(self.model.plan(self.x[0], self.o[0]), stream)
        self.exe = self.graph.instantiate()
        self.extra = []  # objects a case adds (managers, rebinders, indirect graphs)

    def eager(self, i):
        self.ref.poison(self.stream)
        self.model.forward(self.x[i], self.ref, self.stream)
        return self.ref.to_numpy(self.stream)

    def replay(self, launch, i):
        """Poison both outputs, replay, and return output ``i`` and the other one."""
        for o in self.o:
            o.poison(self.stream)
        launch(self.stream)
        return self.o[i].to_numpy(self.stream), self.o[1 - i].to_numpy(self.stream)

    def close(self):
        for obj in reversed(self.extra):
            obj.close()
        for obj in (self.exe, self.graph, self.ref, *self.o, *self.x, self.model):
            obj.close()


def _expect_bound(rig, launch, pair, what):
    """The next replay writes output ``pair[1]`` exactly as an eager run of input ``pair[0]`` does,
    and leaves the other output as poisoned (NaN) as it was."""
    xi, oi = pair
    got, other = rig.replay(launch, oi)
    np.testing.assert_array_equal(got, rig.eager(xi), err_msg=what)
    assert np.isnan(other).all(), f"{what}: the replay also wrote the output it is not bound to"
    return got


def _inject_each(hook, stream, rng, make, op, launch, bound_after_failure=None):
    """For every k: a fresh rig, ``op`` with its k-th driver call failing, then the judgement of
    the module docstring. ``make(rig)`` adds what the case needs (no fault); ``launch(rig, state)``
    returns the replay call; ``bound_after_failure(rig, state)`` the (input, output) a failed
    ``op`` leaves bound (default ``(0, 0)``: the old pair). The first round runs ``op`` with no
    fault and counts its calls. Returns those calls and how many of them that failed were
    ``cuGraphExecKernelNodeSetParams``."""
    seed = int(rng.integers(1 << 30))
    names: list[str] | None = None
    k, fired_setparams = 0, 0
    while names is None or k < len(names):
        hook.reset()  # everything the round makes is counted, the rig included
        rig = Rig(stream, rng, seed)
        state = make(rig)
        if names is None:
            hook.names = []
            op(rig, state)
            names, hook.names = hook.names, None
            assert names, "the operation made no driver call"
            what = "fault-free"
        else:
            k += 1
            hook.arm(k)
            try:
                op(rig, state)
            except RawgraphError as exc:
                fired = hook.fired
                hook.disarm()
                assert fired is not None and names_call(exc, fired[0], OOM), (
                    f"k={k}: {type(exc).__name__}: {exc} does not name {fired}"
                )
                fired_setparams += fired[0] == "cuGraphExecKernelNodeSetParams"
                old = (0, 0) if bound_after_failure is None else bound_after_failure(rig, state)
                _expect_bound(rig, launch(rig, state), old, f"after call {k} ({fired[0]}) failed")
                del exc
                op(rig, state)  # the same call again
            hook.disarm()
            assert hook.fired is not None, f"call {k} of {len(names)} was never made"
            what = f"after call {k} ({hook.fired[0]}) failed and the retry"
        out = _expect_bound(rig, launch(rig, state), (1, 1), what)
        assert rel_err(out, rig.model.reference(rig.xh[1])) < 1e-4, what
        rig.close()
        del rig, state
        gc.collect()
        assert not hook.problems, (k, hook.problems)
        if CHECK_DESTRUCTION:  # see helpers.CHECK_DESTRUCTION
            assert not hook.leaked(), (k, hook.where(hook.leaked()))
    return names, fired_setparams


def _manager(rig):
    mgr = ExecUpdateManager(rig.graph, rig.exe)
    rig.extra.append(mgr)
    mgr.launch(rig.stream)  # replayed once: a replaced array is retired behind a fence
    rig.stream.synchronize()
    return mgr


def test_bind_many_refused_half_way_is_rolled_back(hook, stream, rng):
    def op(rig, mgr):
        mgr.bind_many({"x": rig.x[1], "out": rig.o[1]})

    names, half = _inject_each(hook, stream, rng, _manager, op, lambda rig, mgr: mgr.launch)
    assert names.count("cuGraphExecKernelNodeSetParams") == 3  # nodes 0 and 1 read x, node 3 writes out
    assert half == 3  # the first, a middle and the last push each failed once


def test_bind_of_a_known_array_refused_half_way_is_rolled_back(hook, stream, rng):
    def make(rig):
        mgr = _manager(rig)
        mgr.bind("x", rig.x[1])  # checked once: the next bind of it takes the hot path
        mgr.bind("x", rig.x[0])
        mgr.bind("out", rig.o[1])
        return mgr

    def op(rig, mgr):
        mgr.bind("x", rig.x[1])

    def launch(rig, mgr):
        return mgr.launch

    # a failed bind leaves x0 bound, and out where make() put it: o1
    names, half = _inject_each(hook, stream, rng, make, op, launch, bound_after_failure=lambda rig, mgr: (0, 1))
    assert names.count("cuGraphExecKernelNodeSetParams") == 2 and half == 2


def test_prepared_apply_refused_half_way_is_rolled_back(hook, stream, rng):
    def make(rig):
        mgr = _manager(rig)
        return mgr, mgr.prepare({"x": rig.x[1], "out": rig.o[1]})

    def op(rig, state):
        state[0].apply(state[1])

    names, half = _inject_each(hook, stream, rng, make, op, lambda rig, state: state[0].launch)
    assert names.count("cuGraphExecKernelNodeSetParams") == 3 and half == 3


def test_rebinder_apply_refused_half_way_is_rolled_back(hook, stream, rng):
    def make(rig):
        reb = AddressRebinder(rig.graph, rig.exe)
        return reb, reb.prepare({rig.x[0]: rig.x[1], rig.o[0]: rig.o[1]})

    def op(rig, state):
        state[0].apply(state[1])

    names, half = _inject_each(hook, stream, rng, make, op, lambda rig, state: state[0].launch)
    assert names.count("cuGraphExecKernelNodeSetParams") == 3 and half == 3


@pytest.mark.parametrize("batch_edge", [False, True], ids=["apply", "apply at the keep-alive batch"])
def test_indirect_apply_failures_leave_the_table_and_its_pair_agreeing(hook, stream, rng, batch_edge):
    """No SetParams here: the pair lives in a pinned table the graph copies in. A failure in the
    wait for the last replay (or, at the keep-alive batch, in the fence covering retired pairs)
    must leave the pair the graph calls bound the one the next replay reads."""

    def make(rig):
        ind = IndirectGraph(rig.model, rig.x[0], rig.o[0], rig.stream)
        rig.extra.append(ind)
        ind.launch(rig.stream)
        # finished before the op: its cuEventQuery then answers at once, every round the same calls
        rig.stream.synchronize()
        pairs = [ind.prepare(rig.x[0], rig.o[0]), ind.prepare(rig.x[1], rig.o[1])]
        if batch_edge:  # one replaced pair short of the keep-alive batch, pair 0 applied last
            spare = DeviceBuffer((BATCH, WIDTH))
            rig.extra.insert(0, spare)
            filler = ind.prepare(spare, rig.o[0])
            for i in range(ind._keep.batch - 1):
                ind.apply(pairs[0] if i % 2 == 0 else filler)
            assert ind.bound is pairs[0].arrays and len(ind.retained) == ind._keep.batch - 1
        return ind, pairs

    def op(rig, state):
        state[0].apply(state[1][1])

    def bound_after_failure(rig, state):
        i = 1 if state[0].bound == (rig.x[1], rig.o[1]) else 0
        assert state[0].bound == (rig.x[i], rig.o[i])
        return (i, i)

    names, _half = _inject_each(hook, stream, rng, make, op, lambda rig, state: state[0].launch, bound_after_failure)
    assert "cuEventQuery" in names
