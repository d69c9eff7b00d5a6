"""What the exec-update manager refuses, and what it follows, on the CPU fake driver: a grid or a
scalar it cannot push is refused before the driver and leaves the shadow and the exec as they were
(also for the next, unrelated bind, which pushes the node's shadow whole); ``rebind`` matches the
captured array, not the allocation it views; an array whose memory moved while its identity stayed
is bound at its new address. Every check reads what the fake exec holds (``FakeDriver.exec_kernel``),
not what the manager believes."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest
from test_rawkernel_cpu import fake  # noqa: F401 - the fixture: the fake driver, RawKernel's modules closed with it

from rawgraph import ArgumentError, Capture, DeviceArray, DeviceBuffer, ExecUpdateManager, RawKernel, ShapeError, Stream
from rawgraph.runtime.errors import ArrayError

SRC = r"""
extern "C" __global__ void gate(float a, const float* __restrict__ x, float* y, int n, unsigned m, bool on) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (on && i < n && (unsigned)i < m) y[i] = a * x[i];
}
"""
FORMAT = {"f32": "<f", "ptr": "<Q", "i32": "<i", "u32": "<I", "bool": "<?"}
F32 = np.dtype(np.float32)


class Rig(SimpleNamespace):
    """One captured ``gate`` launch, its exec and manager, and spare inputs."""

    def held(self, node: int = 0) -> dict:
        """Grid and argument values the fake exec holds for ``node``."""
        k = self.fake.exec_kernel(self.exe.handle, self.graph.nodes[node].handle)
        out = {"grid": k["grid"]}
        for (name, kind), (off, size) in zip(self.k.spec, self.fake.layout(k["func"])):
            (out[name],) = struct.unpack(FORMAT[kind], k["blob"][off : off + size])
        return out

    def shadow(self, node: int = 0) -> dict:
        return self.mgr.node_params(node)


def _close(*objs) -> None:
    for obj in reversed(objs):
        obj.close()


@pytest.fixture
def rig(fake, rng):
    k = RawKernel(SRC, "gate")
    s = Stream()
    n = int(rng.integers(64, 1024))
    x, x2, x3, y = (DeviceBuffer(n) for _ in range(4))
    grid = (int(rng.integers(1, 9)), 1, 1)
    a = float(np.float32(rng.uniform(-2, 2)))
    with Capture(s) as cap:
        k(grid, 128, (a, x, y, n, n, True), stream=s)
    exe = cap.graph.instantiate()
    mgr = ExecUpdateManager(cap.graph, exe)
    r = Rig(fake=fake, rng=rng, k=k, n=n, x=x, x2=x2, x3=x3, y=y, graph=cap.graph, exe=exe, mgr=mgr)
    r.captured = {"grid": grid, "a": a, "x": x.ptr, "y": y.ptr, "n": n, "m": n, "on": True}
    assert r.held() == r.captured == r.shadow()
    yield r
    _close(s, x, x2, x3, y, cap.graph, exe, mgr)


# -- a refused grid ------------------------------------------------------------------------------
BAD_GRIDS = [(2**32,), (5, 2**32), (5, 1, 1 << 16), (1 << 31,), (0,), (2.5,), (True,), (1, 1, 1, 1)]


@pytest.mark.parametrize("grid", BAD_GRIDS, ids=[str(g) for g in BAD_GRIDS])
def test_a_refused_grid_changes_neither_the_shadow_nor_the_exec(rig, count_setparams, grid):
    mgr = rig.mgr
    n = int(rig.rng.integers(1, rig.n))
    with pytest.raises(ShapeError, match="grid"):
        mgr.set_params(0, grid=grid, n=n)
    assert count_setparams == [] and rig.held() == rig.captured
    # An unrelated bind pushes the node's whole shadow: the refused values must not be in it.
    assert mgr.bind("x", rig.x2) == 1
    assert rig.held() == {**rig.captured, "x": rig.x2.ptr}, "the exec got values of the refused call"
    assert rig.shadow() == rig.held()
    # The limits themselves are taken: the driver's largest grid, and a changed count with it.
    assert mgr.set_params(0, grid=((1 << 31) - 1, 65535, 1), n=n) == 1
    assert rig.held() == {**rig.captured, "x": rig.x2.ptr, "grid": ((1 << 31) - 1, 65535, 1), "n": n}


# -- a refused scalar ----------------------------------------------------------------------------
BAD_SCALARS = [
    ("n", 2.9, "takes an int"),
    ("n", True, "takes an int"),
    ("n", 1 << 31, "cannot hold"),
    ("m", np.int64(-1), "cannot hold"),
    ("m", -1, "cannot hold"),
    ("m", 1 << 32, "cannot hold"),
    ("a", 1e39, "infinite"),
    ("a", "1", "takes a number"),
    ("a", True, "takes a number"),
    ("on", 1, "True or False"),
    ("on", np.int8(0), "True or False"),
]


@pytest.mark.parametrize("arg,value,match", BAD_SCALARS, ids=[f"{a}={v!r}" for a, v, _m in BAD_SCALARS])
def test_a_scalar_setter_refuses_what_a_launch_and_set_params_refuse(rig, count_setparams, arg, value, match):
    mgr = rig.mgr
    setter = mgr.scalar_setter(0, arg)
    for refuse in (setter, lambda v: mgr.set_params(0, **{arg: v})):
        with pytest.raises(ArgumentError, match=match):
            refuse(value)
        assert count_setparams == [] and rig.held() == rig.captured == rig.shadow()
    assert mgr.bind("x", rig.x2) == 1
    assert rig.held() == {**rig.captured, "x": rig.x2.ptr} == rig.shadow(), "the exec got the refused value"


def test_a_scalar_setter_pushes_a_checked_value_once(rig, count_setparams):
    mgr = rig.mgr
    n, m = int(rig.rng.integers(1, rig.n)), int(rig.rng.integers(0, 1 << 32))
    a = float(rig.rng.uniform(-4, 4))  # most doubles are no float32: stored rounded
    set_n, set_m, set_a, set_on = (mgr.scalar_setter(0, name) for name in ("n", "m", "a", "on"))
    assert set_n(n) == 1 and set_m(np.uint32(m)) == 1 and set_a(a) == 1 and set_on(np.bool_(False)) == 1
    want = {**rig.captured, "n": n, "m": m, "a": float(np.float32(a)), "on": False}
    assert rig.held() == want == rig.shadow() and len(count_setparams) == 4
    # The same values again, as the argument stores them: nothing changed, nothing pushed.
    assert (set_n(np.int64(n)), set_m(m), set_a(a), set_a(np.float64(a)), set_on(False)) == (0, 0, 0, 0, 0)
    assert len(count_setparams) == 4 and rig.held() == want


# -- rebind matches the captured array ---------------------------------------------------------------
def test_rebind_matches_the_captured_view_or_its_address_never_the_owner_of_a_part(fake, rng, count_setparams):
    k = RawKernel(SRC, "gate")
    n = int(rng.integers(64, 512))
    s = Stream()
    whole, half_x, half_y, buf = DeviceBuffer(2 * n), DeviceBuffer(n), DeviceBuffer(n), DeviceBuffer(n)
    lo, hi = DeviceArray(whole.ptr, (n,), F32, whole), DeviceArray(whole.ptr + 4 * n, (n,), F32, whole)
    outs = [DeviceBuffer(n) for _ in range(3)]
    with Capture(s) as cap:
        k(1, 128, (1.0, lo, outs[0], n, n, True), stream=s)  # the two halves of one buffer, as two arguments
        k(1, 128, (1.0, hi, outs[1], n, n, True), stream=s)
        k(1, 128, (1.0, buf, outs[2], n, n, True), stream=s)  # a whole buffer
    graph = cap.graph
    assert [n_.launch.uses["x"].buffer for n_ in graph.nodes] == ["x", "x_2", "x_3"]
    exe = graph.instantiate()
    mgr = ExecUpdateManager(graph, exe)
    try:

        def xs():
            return [struct.unpack("<Q", fake.exec_kernel(exe.handle, n_.handle)["blob"][8:16])[0] for n_ in graph.nodes]

        # The owner of the halves was never passed to a kernel: it matches no name, by identity or address.
        with pytest.raises(KeyError, match="bound to none"):
            mgr.rebind(whole, half_x)
        assert xs() == [lo.ptr, hi.ptr, buf.ptr] and count_setparams == []
        # The captured view matches its own name only.
        assert mgr.rebind(lo, half_x) == 1 and xs() == [half_x.ptr, hi.ptr, buf.ptr]
        # Another object at the same address and size matches.
        assert mgr.rebind(DeviceArray(hi.ptr, (n,), F32, None), half_y) == 1 and xs() == [
            half_x.ptr,
            half_y.ptr,
            buf.ptr,
        ]
        # A whole buffer captured: the buffer, and a view of all of it, match; a part of it does not.
        with pytest.raises(KeyError, match="bound to none"):
            mgr.rebind(DeviceArray(buf.ptr, (n // 2,), F32, buf), outs[2])
        assert mgr.rebind(buf, lo) == 1 and xs() == [half_x.ptr, half_y.ptr, lo.ptr]
        assert mgr.rebind(lo, hi) == 1 and xs() == [half_x.ptr, half_y.ptr, hi.ptr]  # bound since: by identity
        with pytest.raises(KeyError, match="bound to none"):
            mgr.rebind(whole, half_x)
        assert xs() == [half_x.ptr, half_y.ptr, hi.ptr] and len(count_setparams) == 4
    finally:
        _close(s, whole, half_x, half_y, buf, *outs, graph, exe, mgr)


# -- an array whose memory moved -------------------------------------------------------------------
class Movable:
    """A stand-in for an array whose memory can move while its identity stays (a torch tensor after
    ``t.set_(...)`` or ``t.data = other``): ``__cuda_array_interface__`` gives its current buffer."""

    def __init__(self, buf: DeviceBuffer):
        self.buf = buf

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.buf.__cuda_array_interface__


BIND_PATHS = {
    "bind": lambda mgr, arr: mgr.bind("x", arr),
    "bind_many": lambda mgr, arr: mgr.bind_many({"x": arr}),
    "rebind": lambda mgr, arr: mgr.rebind(arr, arr),
}


@pytest.mark.parametrize("path", sorted(BIND_PATHS))
def test_an_array_whose_memory_moved_is_bound_at_its_new_address(rig, count_setparams, path):
    bind, mgr = BIND_PATHS[path], rig.mgr
    t = Movable(rig.x2)
    assert mgr.bind("x", t) == 1 and rig.held()["x"] == rig.x2.ptr
    for buf in (rig.x3, rig.x2, rig.x3):  # the same object, its memory moved each time
        t.buf = buf
        assert bind(mgr, t) == 1, f"{path}: nothing pushed for an array that moved"
        assert rig.held() == {**rig.captured, "x": buf.ptr} == rig.shadow() and mgr.bound("x").ptr == buf.ptr
        assert bind(mgr, t) == 0  # not moved since: nothing to push
    # Moved somewhere it does not fit: refused by the full check, the exec keeps its old address.
    t.buf = DeviceBuffer(rig.n + 1)
    try:
        with pytest.raises(ShapeError):
            bind(mgr, t)
        assert rig.held() == {**rig.captured, "x": rig.x3.ptr} == rig.shadow() and len(count_setparams) == 4
    finally:
        t.buf.close()


def test_a_prepared_binding_whose_array_moved_is_refused(rig, count_setparams):
    mgr = rig.mgr
    t = Movable(rig.x2)
    binding = mgr.prepare({"x": t})
    t.buf = rig.x3
    with pytest.raises(ArrayError, match="moved"):
        mgr.apply(binding)
    assert count_setparams == [] and rig.held() == rig.captured == rig.shadow()
    assert mgr.apply(mgr.prepare({"x": t})) == 1 and rig.held()["x"] == rig.x3.ptr
    t.buf = rig.x2
    assert mgr.apply(binding) == 1 and rig.held()["x"] == rig.x2.ptr  # back where it was prepared


def test_only_arrays_whose_address_can_move_are_read_again(rig):
    from rawgraph.updates.validate import address_reader

    assert address_reader(rig.x) is None and address_reader(rig.x.view()) is None  # fixed for their life
    t = Movable(rig.x2)
    read = address_reader(t)
    assert read is not None and read(t) == rig.x2.ptr
    t.buf = rig.x3
    assert read(t) == rig.x3.ptr
    cp = pytest.importorskip("cupy")
    # A CuPy array's memory pointer cannot be reassigned (``data`` is read-only): made without a GPU.
    mem = cp.cuda.memory.UnownedMemory(rig.x.ptr, rig.x.nbytes, rig.x, 0)
    arr = cp.ndarray((rig.n,), cp.float32, cp.cuda.memory.MemoryPointer(mem, 0))
    with pytest.raises(AttributeError):
        arr.data = cp.cuda.memory.MemoryPointer(mem, 4)
    assert address_reader(arr) is None


# -- read-only memory ----------------------------------------------------------------------------
class ReadOnly:
    """``buf``'s memory exported read-only through ``__cuda_array_interface__`` (``data[1]``)."""

    def __init__(self, buf):
        self.buf = buf
        self.__cuda_array_interface__ = {"shape": buf.shape, "typestr": "<f4", "data": (buf.ptr, True), "version": 3}


def test_read_only_memory_binds_only_where_every_kernel_reads_it(rig, count_setparams):
    mgr = rig.mgr
    assert mgr.bind("x", ReadOnly(rig.x2)) == 1  # x is a const pointer: reading is all it does
    assert rig.held()["x"] == rig.x2.ptr
    with pytest.raises(ArrayError, match="read-only"):
        mgr.bind("y", ReadOnly(rig.x3))
    with pytest.raises(ArrayError, match="read-only"):
        mgr.rebind(rig.y, ReadOnly(rig.x3))
    assert rig.held()["y"] == rig.y.ptr and len(count_setparams) == 1


# -- follow_update ---------------------------------------------------------------------------------
def test_follow_update_takes_the_new_graphs_launch_configuration_so_no_later_push_restores_an_old_grid(rig):
    """After ``exec.update(g2)`` the exec runs g2's grid; ``follow_update(g2)`` must make the shadow say so,
    or the next bind that pushes the node puts back the grid ``set_params`` gave before."""
    mgr, s = rig.mgr, Stream()
    g2_grid = (rig.captured["grid"][0] + 1, 1, 1)
    with Capture(s) as cap2:
        rig.k(g2_grid, 128, (rig.captured["a"], rig.x2, rig.y, rig.n, rig.n, True), stream=s)
    mgr.set_params(0, grid=(rig.captured["grid"][0] + 2,))
    rig.exe.update(cap2.graph)
    mgr.follow_update(cap2.graph)
    assert rig.held()["grid"] == g2_grid == mgr.node_params(0)["grid"]
    assert mgr.bind("x", rig.x3) == 1
    assert rig.held()["grid"] == g2_grid and rig.held()["x"] == rig.x3.ptr
    with pytest.warns(DeprecationWarning, match="use ExecUpdateManager.follow_update"):
        mgr.adopt(cap2.graph)  # the old name: the same update, with a warning
    assert rig.held()["grid"] == g2_grid and mgr.bind("x", rig.x3) == 1 and rig.held()["x"] == rig.x3.ptr
    _close(s, cap2.graph)
