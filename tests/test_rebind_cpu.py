"""The pure parts of rebinding by address (no GPU): word scanning of parameter bytes, confirmation
by layout, address ranges of array-like objects, and the import order of the new modules."""

import struct
from pathlib import Path

import numpy as np
import pytest

from rawgraph.graphs.nodes import KernelInfo, ParamInfo, pack_params
from rawgraph.updates.addresses import RebindError, as_range, scan_words
from rawgraph.updates.adopt import _version

ROOT = Path(__file__).resolve().parent.parent


def _layout(*pairs):
    return [ParamInfo(i, o, s) for i, (o, s) in enumerate(pairs)]


def test_scan_finds_words_in_range_with_param_and_offset(rng):
    base = int(rng.integers(1 << 40, 1 << 46)) & ~0xFF
    size = 4096
    inside = base + int(rng.integers(0, size // 8)) * 8
    # (ptr x, ptr y, i32 n, i32 m, struct{ptr a; ptr b} at 24)
    blob = struct.pack("<QQiiQQ", base, base + size, 7, 9, base - 8, inside)
    layout = _layout((0, 8), (8, 8), (16, 4), (20, 4), (24, 16))
    hits = scan_words(blob, layout, base, base + size)
    assert [(h.layout_offset, h.param, h.offset, h.value, h.confirmed) for h in hits] == [
        (0, 0, 0, base, True),
        (32, 4, 8, inside, True),  # the second member of the struct parameter
    ]  # base + size is one past the end, base - 8 is below: neither matches


def test_words_the_layout_cannot_confirm():
    base = 0x7F0000000000
    # two i32 parameters whose bytes together read as an address in range
    lo, hi = base & 0xFFFFFFFF, base >> 32
    blob = struct.pack("<IIQ", lo, hi, base + 16)
    hits = scan_words(blob, _layout((0, 4), (4, 4), (8, 8)), base, base + 64)
    assert [(h.layout_offset, h.confirmed) for h in hits] == [(0, False), (8, True)]
    # no layout at all: every hit is unconfirmed, offsets are byte offsets in the blob
    hits = scan_words(blob, None, base, base + 64)
    assert [(h.param, h.offset, h.confirmed) for h in hits] == [(None, 0, False), (None, 8, False)]
    # a word in padding between parameters
    blob = struct.pack("<iiQ", 1, 0, 0) + struct.pack("<Q", base)
    hits = scan_words(blob, _layout((0, 4), (16, 8)), base, base + 8)
    assert [(h.layout_offset, h.param, h.confirmed) for h in hits] == [(16, 1, True)]
    hits = scan_words(struct.pack("<QQ", 0, base), _layout((0, 4)), base, base + 8)
    assert [(h.layout_offset, h.param, h.confirmed) for h in hits] == [(8, None, False)]


def test_scan_ignores_a_trailing_partial_word_and_empty_blobs():
    assert scan_words(b"", [], 0, 1 << 63) == []
    assert scan_words(struct.pack("<I", 5), _layout((0, 4)), 0, 10) == []


def test_pack_params_places_each_parameter_at_its_offset():
    vals = [
        np.array([0x1122334455667788], dtype=np.uint64),
        np.array([-3], dtype=np.int32),
        np.array([2.5], dtype=np.float32),
    ]
    table = np.array([v.ctypes.data for v in vals], dtype=np.uintp)
    blob = pack_params(_layout((0, 8), (8, 4), (12, 4)), int(table.ctypes.data))
    assert blob == struct.pack("<Qif", 0x1122334455667788, -3, 2.5)
    info = KernelInfo(
        handle=0, kind="kernel", index=0, graph=0, depth=0, layout=_layout((0, 8), (8, 4), (12, 4)), params=blob
    )
    assert info.param_bytes(1) == struct.pack("<i", -3)
    assert info.param_at(13).index == 2 and info.param_at(16) is None


class _Cai:
    def __init__(self, ptr, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": shape,
            "typestr": typestr,
            "strides": strides,
            "version": 3,
        }


class _Tensorish:
    def __init__(self, ptr, n, contiguous=True):
        self._p, self._n, self._c = ptr, n, contiguous

    def data_ptr(self):
        return self._p

    def numel(self):
        return self._n

    def element_size(self):
        return 4

    def is_contiguous(self):
        return self._c


def test_as_range_of_array_likes():
    assert as_range((0x1000, 64)) == (0x1000, 64)
    assert as_range(_Cai(0x2000, (3, 5), "<f4")) == (0x2000, 60)
    assert as_range(_Tensorish(0x3000, 10)) == (0x3000, 40)
    with pytest.raises(RebindError, match="non-contiguous"):
        as_range(_Tensorish(0x3000, 10, contiguous=False))
    with pytest.raises(RebindError, match="strided"):
        as_range(_Cai(0x2000, (3, 5), "<f4", strides=(4, 12)))
    with pytest.raises(RebindError, match="empty or null"):
        as_range((0, 16))
    with pytest.raises(TypeError):
        as_range(object())


def test_torch_version_parsing():
    assert _version("2.11.0+cu130") == (2, 11)
    assert _version("2.8.0a0") == (2, 8)
    assert _version("garbage") == (0, 0)


# -- the rebinder's driver calls against a fake driver: real binding structs, made-up handles -----
class _FakeDevice:
    context = 0

    def activate(self):
        return self

    def ensure_current(self):
        pass


@pytest.fixture
def fake_graph(monkeypatch):
    """A graph of two kernel nodes and a memset, served by a fake driver (see the fixture body)."""
    from cuda.bindings import driver as d

    S, INVALID = d.CUresult.CUDA_SUCCESS, d.CUresult.CUDA_ERROR_INVALID_VALUE
    T = d.CUgraphNodeType
    x, out, other = 0x7F0000100000, 0x7F0000200000, 0x7F0000300000
    allocs = {x: 4096, out: 4096, other: 8192}
    # node 1: k1(ptr x, i32 n, struct {ptr a; ptr b} = {x + 64, other}); node 2: k2(ptr out, ptr x)
    vals1 = [np.array([x], np.uint64), np.array([100], np.int32), np.array([x + 64, other], np.uint64)]
    vals2 = [np.array([out], np.uint64), np.array([x], np.uint64)]
    layouts = {0xF1: [(0, 8), (8, 4), (16, 16)], 0xF2: [(0, 8), (8, 8)]}
    tables = {n: np.array([v.ctypes.data for v in vals], dtype=np.uintp) for n, vals in ((0xA1, vals1), (0xA2, vals2))}
    funcs = {0xA1: 0xF1, 0xA2: 0xF2}
    pushed = []

    def kparams(node):
        p = d.CUDA_KERNEL_NODE_PARAMS()
        n = int(node)
        p.func = funcs[n]
        p.gridDimX = p.gridDimY = p.gridDimZ = 1
        p.blockDimX, p.blockDimY, p.blockDimZ = 32, 1, 1
        p.kernelParams = int(tables[n].ctypes.data)
        return S, p

    def mparams(node):
        p = d.CUDA_MEMSET_NODE_PARAMS()
        p.dst, p.value, p.elementSize, p.width, p.height, p.pitch = out + 128, 0, 4, 16, 1, 64
        return S, p

    def info(func, i):
        lay = layouts[int(func)]
        return (S, lay[i][0], lay[i][1]) if i < len(lay) else (INVALID, 0, 0)

    def set_kernel(exe, node, p):
        lay = layouts[int(p.func)]
        table = int(p.kernelParams)
        import ctypes

        blob = bytearray(max(o + s for o, s in lay))
        for i, (o, s) in enumerate(lay):
            blob[o : o + s] = ctypes.string_at(ctypes.c_void_p.from_address(table + 8 * i).value, s)
        pushed.append((int(node), bytes(blob)))
        return (S,)

    def set_memset(exe, node, p, ctx):
        pushed.append((int(node), int(p.dst)))
        return (S,)

    def address_range(ptr):
        for base, size in allocs.items():
            if base <= int(ptr) < base + size:
                return S, d.CUdeviceptr(base), size
        return d.CUresult.CUDA_ERROR_NOT_FOUND, d.CUdeviceptr(0), 0

    nodes = [d.CUgraphNode(0xA1), d.CUgraphNode(0xA2), d.CUgraphNode(0xA3)]
    types = {0xA1: T.CU_GRAPH_NODE_TYPE_KERNEL, 0xA2: T.CU_GRAPH_NODE_TYPE_KERNEL, 0xA3: T.CU_GRAPH_NODE_TYPE_MEMSET}
    edge = d.CUgraphEdgeData()
    fakes = {
        "cuGraphGetNodes": lambda g, n=0: (S, nodes if n else None, 3),
        "cuGraphNodeGetType": lambda node: (S, types[int(node)]),
        "cuGraphKernelNodeGetParams": kparams,
        "cuGraphMemsetNodeGetParams": mparams,
        "cuDriverGetVersion": lambda: (S, 13000),  # a 13.0 driver: layouts index by index, no parameter count
        "cuFuncGetParamInfo": info,
        "cuFuncGetName": lambda f: (S, {0xF1: b"k1", 0xF2: b"k2"}[int(f)]),
        "cuGraphGetEdges": lambda g, n=0: (
            S,
            [nodes[0], nodes[1]] if n else None,
            [nodes[1], nodes[2]] if n else None,
            [edge, edge] if n else None,
            2,
        ),
        "cuMemGetAddressRange": address_range,
        "cuGraphExecKernelNodeSetParams": set_kernel,
        "cuGraphExecMemsetNodeSetParams": set_memset,
    }
    for name, fn in fakes.items():
        monkeypatch.setattr(d, name, fn)
    return {
        "x": x,
        "out": out,
        "other": other,
        "pushed": pushed,
        "keep": (vals1, vals2, tables),
        "add_alloc": allocs.__setitem__,
    }


def test_rebinder_finds_and_moves_every_word_with_a_fake_driver(fake_graph):
    from rawgraph.graphs.nodes import MemsetInfo, read_graph
    from rawgraph.updates.rebind import AddressRebinder

    x, out, pushed = fake_graph["x"], fake_graph["out"], fake_graph["pushed"]
    infos = read_graph(0x1)
    assert [i.kind for i in infos] == ["kernel", "kernel", "memset"]
    assert infos[1].dependencies == [0xA1] and infos[2].dependencies == [0xA2]
    assert isinstance(infos[2], MemsetInfo) and infos[2].dst == out + 128
    reb = AddressRebinder(0x1, 0x2, device=_FakeDevice())
    found = reb.find((x, 4096))
    assert [(m.node, m.param, m.offset) for m in found] == [(0xA1, 0, 0), (0xA1, 2, 0), (0xA2, 1, 0)]
    assert [m.value for m in found] == [x, x + 64, x]
    new_x = 0x7F0000900000
    fake_graph["add_alloc"](new_x, 4096)
    reb.move((x, 4096), (new_x, 4096))
    blob1 = dict(pushed)[0xA1]
    assert struct.unpack_from("<QiiQQ", blob1) == (new_x, 100, 0, new_x + 64, fake_graph["other"])
    assert struct.unpack_from("<QQ", dict(pushed)[0xA2]) == (out, new_x)
    assert not reb.find((x, 4096)) and len(reb.find((new_x, 4096))) == 3
    # the output range: a kernel word and the memset's destination
    pushed.clear()
    new_out = 0x7F0000A00000
    fake_graph["add_alloc"](new_out, 4096)
    with pytest.warns(DeprecationWarning, match="use AddressRebinder.move"):
        reb.rebind((out, 4096), new_out)  # the old name of move: the same move, with a warning
    assert dict(pushed)[0xA3] == new_out + 128 and struct.unpack_from("<QQ", dict(pushed)[0xA2]) == (new_out, new_x)
    assert 0xA1 not in dict(pushed)  # unchanged nodes are not pushed
    # absolute bindings: back to the captured graph, then to (new_x, captured out)
    pushed.clear()
    reb.apply(reb.prepare({}))
    assert struct.unpack_from("<Q", dict(pushed)[0xA1])[0] == x and dict(pushed)[0xA3] == out + 128
    pushed.clear()
    binding = reb.prepare({(x, 4096): new_x})
    reb.apply(binding)
    reb.apply(binding)  # nothing changes the second time: nothing pushed
    assert sorted(dict(pushed)) == [0xA1, 0xA2] and len(pushed) == 2


def test_rebinder_refusals_with_a_fake_driver(fake_graph):
    from rawgraph.updates.rebind import AddressRebinder, LayoutMismatchError

    x = fake_graph["x"]
    reb = AddressRebinder(0x1, 0x2, device=_FakeDevice())
    with pytest.raises(RebindError, match="nothing to rebind"):
        reb.move((fake_graph["other"] + 4096, 64), (x, 64))
    with pytest.raises(RebindError, match="holds 64 bytes"):
        reb.move((x, 4096), (fake_graph["other"], 64))
    with pytest.raises(RebindError, match="past the end of its allocation"):
        reb.move((x, 8192), (fake_graph["other"], 8192))
    with pytest.raises(RebindError, match="past the end of its allocation"):
        reb.move((x, 4096), (fake_graph["other"] + 6000, 4096))
    with pytest.raises(LayoutMismatchError, match="k2"):
        AddressRebinder(0x1, 0x2, expect_layouts={"k2": [(0, 8), (8, 4)]}, device=_FakeDevice())
    assert fake_graph["pushed"] == []


def test_dot_labels_a_foreign_graph_with_a_fake_driver(fake_graph):
    from rawgraph.graphs.dot import to_dot

    text = to_dot(0x1, "fake")
    assert 'kind="foreign_kernel"' in text and "kernel k1" in text and "kernel k2" in text
    assert f"memset 64 B at 0x{fake_graph['out'] + 128:x}" in text
    assert text.count(" -> ") == 2 and "na1 -> na2;" in text and "na2 -> na3;" in text


def test_every_node_type_decodes_from_real_binding_structs(monkeypatch):
    """Each per-type decoder against the binding's own structs (wrong field names or types fail
    here as they would on the GPU); the GPU test checks the values the driver really returns."""
    from cuda.bindings import driver as d

    from rawgraph.graphs import nodes as N
    from rawgraph.graphs.dot import node_label

    S, T = d.CUresult.CUDA_SUCCESS, d.CUgraphNodeType
    m = d.CUDA_MEMCPY3D()
    m.srcMemoryType, m.srcHost = d.CUmemorytype.CU_MEMORYTYPE_HOST, 0x1000
    m.dstMemoryType, m.dstDevice = d.CUmemorytype.CU_MEMORYTYPE_DEVICE, 0x2000
    m.WidthInBytes, m.Height, m.Depth, m.srcXInBytes = 64, 1, 1, 8
    ms = d.CUDA_MEMSET_NODE_PARAMS()
    ms.dst, ms.value, ms.elementSize, ms.width, ms.height = 0x3000, 5, 4, 4, 1
    h = d.CUDA_HOST_NODE_PARAMS()
    h.fn, h.userData = d.CUhostFn(0x55), 7
    a = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    a.bytesize = 10
    c = d.CUgraphNodeParams()
    c.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    c.conditional.type = d.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_SWITCH
    c.conditional.handle = d.CUgraphConditionalHandle(3)
    c.conditional.size = 0  # no bodies: the fake has no driver-owned body array to point at
    for name, fn in {
        "cuGraphMemcpyNodeGetParams": lambda n: (S, m),
        "cuGraphMemsetNodeGetParams": lambda n: (S, ms),
        "cuGraphHostNodeGetParams": lambda n: (S, h),
        "cuGraphMemAllocNodeGetParams": lambda n: (S, a),
        "cuGraphEventRecordNodeGetEvent": lambda n: (S, d.CUevent(0x77)),
        "cuGraphEventWaitNodeGetEvent": lambda n: (S, d.CUevent(0x78)),
        "cuGraphChildGraphNodeGetGraph": lambda n: (S, d.CUgraph(0x999)),
        "cuGraphMemFreeNodeGetParams": lambda n: (S, d.CUdeviceptr(0x4000)),
        "cuGraphNodeGetParams": lambda n: (S, c),
        "cuGraphGetNodes": lambda g, n=0: (S, None, 0),
        "cuGraphGetEdges": lambda g, n=0: (S, None, None, None, 0),
    }.items():
        monkeypatch.setattr(d, name, fn)
    want = {
        "MEMCPY": (N.MemcpyInfo, "memcpy HtoD 64 B 0x1008 -> 0x2000"),
        "MEMSET": (N.MemsetInfo, "memset 0x3000 = 0x5 x4x1 (4 B)"),
        "HOST": (N.HostInfo, "host fn=0x55"),
        "GRAPH": (N.ChildGraphInfo, "child graph 0x999 (0 nodes)"),
        "EMPTY": (N.EmptyInfo, "empty"),
        "WAIT_EVENT": (N.EventInfo, "event_wait event=0x78"),
        "EVENT_RECORD": (N.EventInfo, "event_record event=0x77"),
        "MEM_ALLOC": (N.MemAllocInfo, "mem_alloc 0x0 10 B"),
        "MEM_FREE": (N.MemFreeInfo, "mem_free 0x4000"),
        "CONDITIONAL": (N.ConditionalInfo, "conditional SWITCH handle=0x3 bodies=0"),
        "BATCH_MEM_OP": (N.OtherNode, "CU_GRAPH_NODE_TYPE_BATCH_MEM_OP"),
    }
    for short, (cls, text) in want.items():
        t = getattr(T, f"CU_GRAPH_NODE_TYPE_{short}")
        monkeypatch.setattr(d, "cuGraphNodeGetType", lambda n, t=t: (S, t))
        info = N._node(d.CUgraphNode(2), 0, 0, 0, set())
        assert type(info) is cls and N.describe(info) == text, (short, info)
        assert node_label(info)
    assert info.depth == 0


def test_memcpy_rebind_moves_the_base_by_the_start_delta(monkeypatch):
    from cuda.bindings import driver as d

    from rawgraph.updates.rebind import AddressRebinder

    S = d.CUresult.CUDA_SUCCESS
    m = d.CUDA_MEMCPY3D()
    m.srcMemoryType = m.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
    m.srcDevice, m.dstDevice, m.srcXInBytes = 0x10000, 0x20000, 16
    m.WidthInBytes, m.Height, m.Depth = 64, 1, 1
    pushed = []
    for name, fn in {
        "cuGraphMemcpyNodeGetParams": lambda n: (S, m),
        "cuGraphGetNodes": lambda g, n=0: (S, [d.CUgraphNode(1)] if n else None, 1),
        "cuGraphGetEdges": lambda g, n=0: (S, None, None, None, 0),
        "cuGraphNodeGetType": lambda n: (S, d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY),
        "cuMemGetAddressRange": lambda p: (S, d.CUdeviceptr(int(p) & ~0xFFFF), 0x10000),
        "cuGraphExecMemcpyNodeSetParams": lambda e, n, p, c: (
            pushed.append((int(p.srcDevice), int(p.srcXInBytes), int(p.dstDevice))) or (S,)
        ),
    }.items():
        monkeypatch.setattr(d, name, fn)
    reb = AddressRebinder(1, 2, device=_FakeDevice())
    (match,) = reb.find((0x10000, 0x10000))
    assert (match.kind, match.value) == ("memcpy.src", 0x10010)  # the start includes srcXInBytes
    reb.move((0x10000, 0x10000), (0x50000, 0x10000))
    reb.move((0x20000, 64), (0x60000, 64))
    assert pushed == [(0x50000, 16, 0x20000), (0x50000, 16, 0x60000)]
    reb.apply(reb.prepare({}))  # back to the captured addresses
    assert pushed[-1] == (0x10000, 16, 0x20000)


def test_library_kernel_named_by_cukernel_only(fake_graph, monkeypatch):
    """A node whose func is 0 and kern set: the function comes from cuKernelGetFunction, and the
    rebinder pushes the node back naming the same CUkernel."""
    from cuda.bindings import driver as d

    from rawgraph.graphs.nodes import read_graph
    from rawgraph.updates.rebind import AddressRebinder

    S = d.CUresult.CUDA_SUCCESS
    real = d.cuGraphKernelNodeGetParams

    def by_kern(node):
        err, p = real(node)
        if int(node) == 0xA2:
            p.func, p.kern = 0, 0xBEEF
        return err, p

    monkeypatch.setattr(d, "cuGraphKernelNodeGetParams", by_kern)
    monkeypatch.setattr(d, "cuKernelGetFunction", lambda k: (S, d.CUfunction(0xF2)) if int(k) == 0xBEEF else (1, None))
    info = read_graph(0x1)[1]
    assert (info.function, info.func_field, info.kern, info.name) == (0xF2, 0, 0xBEEF, "k2")
    reb = AddressRebinder(0x1, 0x2, device=_FakeDevice())
    st = reb.kernels[0xA2]
    assert (int(st.params.func), int(st.params.kern)) == (0, 0xBEEF)


def test_a_refused_push_keeps_the_held_copy_and_bindings_stay_with_their_rebinder(fake_graph, monkeypatch):
    """When cuGraphExecKernelNodeSetParams fails the exec keeps its old values, so the rebinder's
    copy must too (the next apply pushes again); a binding names one rebinder's nodes and values,
    so another rebinder refuses it, and its words cannot be edited after it was checked."""
    from cuda.bindings import driver as d

    from rawgraph.runtime.errors import CudaError
    from rawgraph.updates.rebind import AddressRebinder

    x, pushed = fake_graph["x"], fake_graph["pushed"]
    new_x = 0x7F0000900000
    fake_graph["add_alloc"](new_x, 4096)
    reb = AddressRebinder(0x1, 0x2, device=_FakeDevice())
    binding = reb.prepare({(x, 4096): new_x})
    good = d.cuGraphExecKernelNodeSetParams
    monkeypatch.setattr(d, "cuGraphExecKernelNodeSetParams", lambda e, n, p: (d.CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        reb.apply(binding)
    assert reb.held(0xA1) == reb.kernels[0xA1].original[: reb.kernels[0xA1].size] and reb.pushes == 0
    assert [m.value for m in reb.find((x, 4096))] == [x, x + 64, x]  # still what the exec holds
    monkeypatch.setattr(d, "cuGraphExecKernelNodeSetParams", good)
    reb.apply(binding)
    assert sorted(dict(pushed)) == [0xA1, 0xA2] and reb.pushes == 2
    assert struct.unpack_from("<Q", reb.held(0xA1))[0] == new_x
    with pytest.raises(ValueError, match="read-only"):
        binding.kernels[0xA1][0] = 0
    other = AddressRebinder(0x1, 0x2, device=_FakeDevice())
    with pytest.raises(RebindError, match="another AddressRebinder"):
        other.apply(binding)


def test_foreign_holders_finds_struct_words_and_overlapping_memsets(fake_graph):
    """The manager's guard reads only the foreign nodes: node 1 (k1) holds x at param 0 and
    x + 64 inside its struct, and `other` in the struct; the memset (node 3) writes 64 bytes at
    out + 128. Node 2 (k2, which holds out and x) is recorded, so it pins nothing."""
    from types import SimpleNamespace

    from cuda.bindings import driver as d

    from rawgraph.graphs.graph import ForeignNode
    from rawgraph.updates.addresses import foreign_holders

    x, out, other = fake_graph["x"], fake_graph["out"], fake_graph["other"]
    graph = SimpleNamespace(
        handle=0x1,
        foreign_nodes=[
            ForeignNode(d.CUgraphNode(0xA1), "KERNEL", ()),
            ForeignNode(d.CUgraphNode(0xA3), "MEMSET", (0xA2,)),
        ],
    )
    spans = {
        "x_tail": (x + 64, 64),
        "out_head": (out, 128),
        "out_mid": (out + 160, 8),
        "other_end": (other + 8, 8192 - 8),
        "x_gap": (x + 8, 56),
    }
    holders, unreadable = foreign_holders(graph, spans)
    assert holders == {"x_tail": ["foreign node 0 (kernel k1)"], "out_mid": ["foreign node 2 (memset)"]}
    assert unreadable == []
    graph.foreign_nodes = []
    assert foreign_holders(graph, spans) == ({}, [])


def test_holders_follow_the_pitch_and_include_recorded_non_kernel_nodes(fake_graph, monkeypatch):
    """A memset of 3 rows of 64 bytes, 1 KB apart, reaches 2 KB + 64 past its start, not just its
    first 192 bytes; the range between its first and last byte counts (pitch gaps included: a
    buffer there is pinned, which is safe, where missing one would not be). The manager updates no
    memset it recorded either (``other_nodes``), so such a node pins what it touches like a
    foreign one."""
    from types import SimpleNamespace

    from cuda.bindings import driver as d

    from rawgraph.updates.addresses import foreign_holders

    out = fake_graph["out"]

    def pitched(node):
        p = d.CUDA_MEMSET_NODE_PARAMS()
        p.dst, p.value, p.elementSize, p.width, p.height, p.pitch = out, 0, 4, 16, 3, 1024
        return d.CUresult.CUDA_SUCCESS, p

    monkeypatch.setattr(d, "cuGraphMemsetNodeGetParams", pitched)
    graph = SimpleNamespace(handle=0x1, foreign_nodes=[], other_nodes=[(d.CUgraphNode(0xA3), "memset", None)])
    spans = {"row3": (out + 2048 + 60, 4), "gap": (out + 64, 960), "after": (out + 2048 + 64, 64)}
    holders, unreadable = foreign_holders(graph, spans)
    assert holders == {"row3": ["recorded node 2 (memset)"], "gap": ["recorded node 2 (memset)"]}
    assert unreadable == []


def test_a_binding_with_the_wrong_byte_count_is_refused_before_any_write(fake_graph):
    import numpy as np

    from rawgraph.updates.rebind import AddressBinding as Binding
    from rawgraph.updates.rebind import AddressRebinder

    reb = AddressRebinder(0x1, 0x2, device=_FakeDevice())
    before = reb.held(0xA1)
    forged = Binding({0xA1: np.zeros(2, np.uint64)}, {}, (), reb._token)
    with pytest.raises(RebindError, match="16 parameter bytes given"):
        reb.apply(forged)
    assert reb.held(0xA1) == before and reb.pushes == 0 and fake_graph["pushed"] == []
    with pytest.raises(RebindError, match="another AddressRebinder"):
        reb.apply(Binding({}, {}, ()))
