"""A CPU stand-in for the parts of ``cuda.bindings.driver`` rawgraph uses, good enough to run its
public operations, and graph code built on them, without a GPU.

:func:`fake_driver_session` installs it for a block of code (the plugin's ``fake_driver`` fixture
is that block around one test); :meth:`FakeDriver.install` alone for whoever manages rawgraph's
process-wide state itself.

What it models, with real binding structs (``CUDA_KERNEL_NODE_PARAMS``, ``CUDA_MEMCPY3D``, ...) and
fake handles (never reused in a process, so a use after destroy is seen):

- the device, its primary context, attributes; device memory and pinned host memory as real host
  bytes (``cuMemcpy*`` and ``cuMemsetD32*`` really copy and fill, eagerly, so a staged input, a
  pinned table or a state row can be read back), address ranges and pointer attributes;
- streams, events, stream capture (global / thread-local / relaxed: the calls a capture forbids
  fail with ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` and invalidate it), fork/join through events,
  ``cuStreamBeginCaptureToGraph``, ``cuStreamUpdateCaptureDependencies``, unjoined side streams;
- modules loaded from the NVRTC CUBIN: functions and their parameter layouts come from the
  ELF's ``.nv.info.<kernel>`` sections (``EIATTR_KPARAM_INFO``), so kernel nodes copy the argument
  values at capture / add time exactly as the driver does, and ``cuFuncGetParamInfo`` answers;
- graphs (every node type rawgraph adds, edges with edge data, child graphs, conditional nodes
  with driver-owned body graphs, clones), execs (instantiate, upload, launch, update,
  ``cuGraphExec{Kernel,Memcpy,Memset}NodeSetParams``): each exec keeps its own copy of every
  node's parameters, which :meth:`FakeDriver.exec_kernel`, :meth:`FakeDriver.exec_kernel_args`
  and :meth:`FakeDriver.exec_memory` hand to a test, so it can compare what the library believes
  the exec holds with what it holds.

What it does not model: kernels never run (a launch is logged, nothing computes), timing,
concurrency between streams (everything is complete when the call returns), several devices or
threads, graph memory pools, and any error the real driver would raise that rawgraph never
provokes.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
import itertools
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

from cuda.bindings import driver as d

R = d.CUresult
S = R.CUDA_SUCCESS
T = d.CUgraphNodeType
_ST = d.CUstreamCaptureStatus
_MODE = d.CUstreamCaptureMode
_MT = d.CUmemorytype
_PSS = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_DEP_PROG = int(d.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
_PORT_PROG = int(d.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
_DEVICE_LAUNCH = int(d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
_SET_DEPS = int(d.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES)
_SPECIAL_STREAMS = (0, 1, 2)
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CTA_PER_CLUSTER = 0x3D


# ------------------------------------------------------------------------------------ CUBIN
def cubin_kernels(image: bytes) -> dict[str, list[tuple[int, int]]]:
    """Kernel symbol -> parameter layout ``[(offset, size), ...]`` (by ordinal) from a CUBIN
    (:func:`cubin_info` without the cluster dimensions)."""
    return {sym: layout for sym, (layout, _cluster) in cubin_info(image).items()}


def cubin_info(image: bytes) -> dict[str, tuple[list[tuple[int, int]], tuple[int, int, int]]]:
    """Kernel symbol -> (parameter layout ``[(offset, size), ...]`` by ordinal, compiled cluster
    dimensions, ``(0, 0, 0)`` without ``__cluster_dims__``) from a CUBIN.

    Reads the ELF section headers, then each ``.nv.info.<symbol>`` section's records, 4-byte
    aligned: a format byte, an attribute byte, then 2 bytes (unused for ``EIFMT_NVAL`` (1), the
    value for ``EIFMT_BVAL`` / ``EIFMT_HVAL`` (2, 3)) or, for ``EIFMT_SVAL`` (4), a 16-bit size and
    that many bytes. ``EIATTR_KPARAM_INFO`` (0x17) carries ``u32 index, u16 ordinal, u16 offset,
    u32 flags`` with the parameter's size in bits 18-31 of ``flags`` (kernels without parameters
    have none); ``EIATTR_CTA_PER_CLUSTER`` (0x3d) three ``u32``, the cluster's shape.
    """
    if image[:4] != b"\x7fELF":
        raise ValueError("not an ELF image")
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    sections = []
    for i in range(shnum):
        name, _typ, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize)
        sections.append((name, offset, size))
    strtab = sections[shstrndx][1]

    def section_name(off: int) -> str:
        start = strtab + off
        return image[start : image.index(b"\0", start)].decode()

    kernels: dict[str, tuple[list[tuple[int, int]], tuple[int, int, int]]] = {}
    infos: dict[str, bytes] = {}
    for name_off, offset, size in sections:
        name = section_name(name_off)
        if name.startswith(".text."):
            kernels.setdefault(name[len(".text.") :], ([], (0, 0, 0)))
        elif name.startswith(".nv.info."):
            infos[name[len(".nv.info.") :]] = image[offset : offset + size]
    for sym, data in infos.items():
        params: dict[int, tuple[int, int]] = {}
        cluster = (0, 0, 0)
        p = 0
        while p + 2 <= len(data):
            fmt, attr = data[p], data[p + 1]
            if fmt == 4:
                (n,) = struct.unpack_from("<H", data, p + 2)
                payload = data[p + 4 : p + 4 + n]
                p += 4 + n
            else:
                payload, p = data[p + 2 : p + 4], p + 4
            if attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
                _idx, ordinal, off, flags = struct.unpack_from("<IHHI", payload)
                params[ordinal] = (off, (flags >> 18) & 0x3FFF)
            elif attr == _EIATTR_CTA_PER_CLUSTER and fmt == 4 and len(payload) >= 12:
                cluster = struct.unpack_from("<III", payload)
        if sym in kernels or params:
            kernels[sym] = ([params[i] for i in sorted(params)], cluster)
    return kernels


def _elf_size(ptr: int) -> int:
    """Bytes of an ELF image in memory: the end of its section header table or of its last section."""
    head = ctypes.string_at(ptr, 64)
    shoff = struct.unpack_from("<Q", head, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    end = shoff + shentsize * shnum
    table = ctypes.string_at(ptr + shoff, shentsize * shnum)
    for i in range(shnum):
        _n, typ, _f, _a, offset, size = struct.unpack_from("<IIQQQQ", table, i * shentsize)
        if typ != 8:  # SHT_NOBITS takes no file space
            end = max(end, offset + size)
    return end


# ------------------------------------------------------------------------------------ state
@dataclass
class Alloc:
    base: int
    size: int
    kind: str  # "device" | "host" | "graph"
    buf: Any


@dataclass
class Func:
    handle: int
    module: int
    name: str
    layout: list[tuple[int, int]]
    attrs: dict[int, int] = field(default_factory=dict)  # cuFuncGetAttribute answers (cluster dims, set ones)


@dataclass
class Node:
    handle: int
    graph: int
    kind: Any  # CUgraphNodeType
    params: dict
    keep: list = field(default_factory=list)  # what getters handed out (driver-owned memory)


@dataclass
class Graph:
    handle: int
    owner: Any = None  # None: the caller's; ("node", h): a child graph / body; ("capture", id)
    nodes: list[int] = field(default_factory=list)
    edges: list[tuple[int, int, tuple[int, int, int]]] = field(
        default_factory=list
    )  # (from, to, (type, from_port, to_port))
    cond_handles: set = field(default_factory=set)
    clone_map: dict[int, int] = field(default_factory=dict)  # original node -> node of this clone


@dataclass
class Sequence:
    """One capture sequence: the graph it records into and the streams that joined it."""

    id: int
    graph: int
    mode: int
    origin: int
    to_graph: bool
    status: Any = _ST.CU_STREAM_CAPTURE_STATUS_ACTIVE
    members: set = field(default_factory=set)


@dataclass
class Stream:
    handle: int
    flags: int
    seq: Sequence | None = None
    deps: list[tuple[int, tuple[int, int, int]]] = field(default_factory=list)


@dataclass
class Event:
    handle: int
    flags: int
    captured: tuple | None = None  # (sequence, [(node, edge)]) when last recorded in a capture


@dataclass
class Exec:
    handle: int
    graph: int
    flags: int
    order: list[int]  # the source graph's top-level nodes, in order (exec updates pair by position)
    state: dict[int, dict]  # node handle -> parameters the exec holds (kernel, memcpy, memset)
    keep: list = field(default_factory=list)


class FakeError(Exception):
    """Raised inside the fake for a call it cannot serve; turned into the result code."""

    def __init__(self, code: Any):
        super().__init__(code.name if hasattr(code, "name") else str(code))
        self.code = code


def _fail(code: Any) -> NoReturn:
    raise FakeError(code)


def _i(x: Any) -> int:
    return 0 if x is None else int(x)


def _edge(e: Any) -> tuple[int, int, int]:
    if e is None:
        return (0, 0, 0)
    return (int(e.type), int(e.from_port), int(e.to_port))


def _edge_data(t: tuple[int, int, int]) -> Any:
    e = d.CUgraphEdgeData()
    e.type, e.from_port, e.to_port = t
    return e


MEMCPY_FIELDS = [
    f"{side}{name}"
    for side in ("src", "dst")
    for name in ("XInBytes", "Y", "Z", "LOD", "MemoryType", "Host", "Device", "Array", "Pitch", "Height")
]
MEMCPY_FIELDS += ["WidthInBytes", "Height", "Depth"]
MEMSET_FIELDS = ["dst", "pitch", "value", "elementSize", "width", "height"]


def memcpy_dict(p: Any) -> dict:
    out = {}
    for f in MEMCPY_FIELDS:
        v = getattr(p, f)
        out[f] = int(v) if v is not None else 0
    return out


def memcpy_struct(m: dict) -> Any:
    p = d.CUDA_MEMCPY3D()
    for f, v in m.items():
        if f.endswith("MemoryType"):
            setattr(p, f, _MT(v))
        else:
            setattr(p, f, v)
    return p


class FakeDriver:
    """The fake driver's state and its ``cu*`` functions (see the module docstring).

    :meth:`install` puts the functions on ``cuda.bindings.driver`` (the binding's types stay the
    real ones), :meth:`uninstall` restores the originals.

    Notes
    -----
    State: 18 instance attributes, one table per kind of driver object the fake hands out
    (allocations, modules, functions, streams, events, graphs, nodes, execs, conditional handles,
    the context and its references) plus the logs a test reads (``api``, ``launch_log``) and the
    counters that number handles; a driver's state is that many tables, and the tests read them
    directly.
    """

    ctx_refs: int

    CC = (9, 0)
    TOTAL = 1 << 37
    # The fake whose functions are on cuda.bindings.driver now, if any: code that must ask the
    # real driver (the graph doctor's address checks) looks here first.
    installed: ClassVar[FakeDriver | None] = None
    # The CUDA version cuDriverGetVersion reports. A call newer than it raises as the binding does
    # on a driver that does not export it (cuFuncGetParamCount, cuGraphNodeGetParams: 13.2); set it
    # to be a newer driver.
    version: int = 13000

    def __init__(self) -> None:
        self._ids = itertools.count(0x5A000000, 0x100)
        self._seq_ids = itertools.count(1)
        self.ctx = d.CUcontext(next(self._ids))
        self.ctx_refs = 0
        self.allocs: dict[int, Alloc] = {}
        self._bases: list[int] = []
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.modules: dict[int, list[int]] = {}  # module -> its functions
        self._pending_kernels: dict[int, dict] = {}  # module -> what its CUBIN holds (cubin_info)
        self.functions: dict[int, Func] = {}
        self.graphs: dict[int, Graph] = {}
        self.nodes: dict[int, Node] = {}
        self.execs: dict[int, Exec] = {}
        self.cond_handles: dict[int, int] = {}  # handle -> graph
        self.launch_log: list[tuple[str, int, int]] = []  # ("graph" | "kernel", handle, stream)
        self._saved: dict[str, Any] = {}
        self.api: dict[str, Callable[..., tuple]] = {
            name[1:]: getattr(self, name) for name in dir(self) if name.startswith("_cu")
        }

    # -- installation --------------------------------------------------------------------------
    def install(self) -> None:
        for name, fn in self.api.items():
            if name in self._saved:
                continue
            self._saved[name] = getattr(d, name)
            wrapped = self._entry(name, fn)
            setattr(d, name, wrapped)
        FakeDriver.installed = self

    def uninstall(self) -> None:
        for name, fn in self._saved.items():
            setattr(d, name, fn)
        self._saved.clear()
        if FakeDriver.installed is self:
            FakeDriver.installed = None

    @staticmethod
    def _entry(name: str, fn: Callable[..., tuple]) -> Callable[..., tuple]:
        outputs = output_count(name)

        def entry(*args: Any) -> tuple:
            try:
                return fn(*args)
            except FakeError as exc:
                return (exc.code,) + (None,) * outputs

        entry.__name__ = entry.__qualname__ = name
        return entry

    # -- memory helpers --------------------------------------------------------------------------
    def _new(self) -> int:
        return next(self._ids)

    def _alloc(self, size: int, kind: str) -> int:
        if size <= 0:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        buf = (ctypes.c_char * (int(size) + 256))()
        base = (ctypes.addressof(buf) + 255) & ~255
        self.allocs[base] = Alloc(base, int(size), kind, buf)
        bisect.insort(self._bases, base)
        return base

    def _free(self, ptr: int, kind: str) -> None:
        a = self.allocs.get(int(ptr))
        if a is None or a.kind != kind:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        del self.allocs[a.base]
        self._bases.remove(a.base)

    def find_alloc(self, ptr: int) -> Alloc | None:
        """The allocation holding address ``ptr``, or None."""
        i = bisect.bisect_right(self._bases, int(ptr)) - 1
        if i < 0:
            return None
        a = self.allocs[self._bases[i]]
        return a if a.base <= int(ptr) < a.base + a.size else None

    def _check_range(self, ptr: int, n: int, want: str) -> None:
        """Device memory (``want="device"``: device or graph allocations) or any host memory."""
        if want == "host":
            if not ptr:
                _fail(R.CUDA_ERROR_INVALID_VALUE)
            return
        a = self.find_alloc(ptr)
        if a is None or a.kind == "host" and want == "device-only" or ptr + n > a.base + a.size:
            _fail(R.CUDA_ERROR_INVALID_VALUE)

    def read(self, ptr: int, n: int) -> bytes:
        """Bytes at a device (or pinned) address, for the harness."""
        a = self.find_alloc(ptr)
        assert a is not None and ptr + n <= a.base + a.size, f"0x{ptr:x}+{n} is in no allocation"
        return ctypes.string_at(ptr, n)

    # -- capture helpers ---------------------------------------------------------------------------
    def _stream(self, h: Any) -> Stream | None:
        h = _i(h)
        if h in _SPECIAL_STREAMS:
            return None
        s = self.streams.get(h)
        if s is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        return s

    def _active(self) -> list[Sequence]:
        seen = {}
        for s in self.streams.values():
            if s.seq is not None and s.seq.status == _ST.CU_STREAM_CAPTURE_STATUS_ACTIVE:
                seen[s.seq.id] = s.seq
        return list(seen.values())

    def _unsafe(self) -> None:
        """A call a global or thread-local capture forbids (this fake has one thread): it fails
        and invalidates those captures, as the driver does."""
        bad = [q for q in self._active() if q.mode != int(_MODE.CU_STREAM_CAPTURE_MODE_RELAXED)]
        if bad:
            for q in bad:
                q.status = _ST.CU_STREAM_CAPTURE_STATUS_INVALIDATED
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)

    def _capturing(self, h: Any) -> Stream | None:
        """The stream if it captures now (an invalidated capture fails the call)."""
        s = self._stream(h)
        if s is None or s.seq is None:
            return None
        if s.seq.status != _ST.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        return s

    def _add_node(self, graph: int, kind: Any, params: dict, deps: list[tuple[int, tuple[int, int, int]]]) -> int:
        g = self.graphs.get(int(graph))
        if g is None:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        for dep, _e in deps:
            n = self.nodes.get(int(dep))
            if n is None or n.graph != g.handle:
                _fail(R.CUDA_ERROR_INVALID_VALUE)
        if len({int(x) for x, _ in deps}) != len(deps):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        h = self._new()
        self.nodes[h] = Node(h, g.handle, kind, params)
        g.nodes.append(h)
        for dep, e in deps:
            g.edges.append((int(dep), h, e))
        return h

    def _captured_node(self, s: Stream, kind: Any, params: dict, programmatic: bool = False) -> int:
        deps = []
        for dep, e in s.deps:
            if programmatic and self.nodes[dep].kind == T.CU_GRAPH_NODE_TYPE_KERNEL:
                e = (_DEP_PROG, _PORT_PROG, 0)
            deps.append((dep, e))
        h = self._add_node(s.seq.graph, kind, params, deps)  # type: ignore[union-attr]
        s.deps = [(h, (0, 0, 0))]
        return h

    def _kernel_params(self, func: Any, grid: tuple, block: tuple, smem: int, table: int, extra: int) -> dict:
        f = self.functions.get(_i(func))
        if f is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        if min(grid) < 1 or min(block) < 1:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        blob = bytearray(max((o + n for o, n in f.layout), default=0))
        if f.layout:
            if table:
                for i, (o, n) in enumerate(f.layout):
                    slot = ctypes.c_void_p.from_address(table + 8 * i).value
                    if not slot:
                        _fail(R.CUDA_ERROR_INVALID_VALUE)
                    blob[o : o + n] = ctypes.string_at(slot, n)
            elif extra:
                buf = ctypes.c_void_p.from_address(extra + 8).value or 0
                size_p = ctypes.c_void_p.from_address(extra + 24).value or 0
                size = ctypes.c_size_t.from_address(size_p).value if size_p else 0
                if not buf or size != len(blob):
                    _fail(R.CUDA_ERROR_INVALID_VALUE)
                blob[:] = ctypes.string_at(buf, size)
            else:
                _fail(R.CUDA_ERROR_INVALID_VALUE)
        return {
            "func": f.handle,
            "grid": tuple(int(v) for v in grid),
            "block": tuple(int(v) for v in block),
            "smem": int(smem),
            "blob": bytes(blob),
        }

    def _kparams_from_struct(self, p: Any) -> dict:
        return self._kernel_params(
            p.func,
            (p.gridDimX, p.gridDimY, p.gridDimZ),
            (p.blockDimX, p.blockDimY, p.blockDimZ),
            p.sharedMemBytes,
            _i(p.kernelParams),
            _i(p.extra),
        )

    def _copy(self, dst: int, src: int, n: int, dst_kind: str, src_kind: str) -> None:
        self._check_range(int(dst), int(n), dst_kind)
        self._check_range(int(src), int(n), src_kind)
        ctypes.memmove(int(dst), int(src), int(n))

    def _memcpy_node(self, s: Stream, dst: int, src: int, n: int, dst_host: bool, src_host: bool) -> int:
        m = {f: 0 for f in MEMCPY_FIELDS}
        m.update(
            srcMemoryType=int(_MT.CU_MEMORYTYPE_HOST if src_host else _MT.CU_MEMORYTYPE_DEVICE),
            dstMemoryType=int(_MT.CU_MEMORYTYPE_HOST if dst_host else _MT.CU_MEMORYTYPE_DEVICE),
            WidthInBytes=int(n),
            Height=1,
            Depth=1,
            srcPitch=int(n),
            dstPitch=int(n),
            srcHeight=1,
            dstHeight=1,
        )
        m["srcHost" if src_host else "srcDevice"] = int(src)
        m["dstHost" if dst_host else "dstDevice"] = int(dst)
        return self._captured_node(s, T.CU_GRAPH_NODE_TYPE_MEMCPY, {"memcpy": m})

    # -- harness queries ------------------------------------------------------------------------
    def exec_kernel(self, exe: Any, node: Any) -> dict:
        """What exec ``exe`` holds for kernel node ``node``: func, grid, block, smem, blob."""
        return dict(self.execs[_i(exe)].state[_i(node)])

    def exec_kernel_args(self, exe: Any, node: Any) -> list[bytes]:
        """The argument values exec ``exe`` holds for kernel node ``node``, one ``bytes`` per
        parameter in declaration order, cut from the parameter buffer by the kernel's layout."""
        held = self.exec_kernel(exe, node)
        return [held["blob"][off : off + size] for off, size in self.functions[held["func"]].layout]

    def exec_memory(self, exe: Any, node: Any) -> dict:
        """What exec ``exe`` holds for a memcpy (``{"memcpy": fields}``) or memset node."""
        return dict(self.execs[_i(exe)].state[_i(node)])

    def graph_node(self, node: Any) -> Node:
        return self.nodes[_i(node)]

    def layout(self, func: Any) -> list[tuple[int, int]]:
        return list(self.functions[_i(func)].layout)

    def live(self) -> dict[str, set]:
        """Every handle alive now, per kind (what a leak check compares)."""
        return {
            "memory": {a.base for a in self.allocs.values() if a.kind == "device"},
            "host": {a.base for a in self.allocs.values() if a.kind == "host"},
            "stream": set(self.streams),
            "event": set(self.events),
            "graph": {g.handle for g in self.graphs.values() if g.owner is None},
            "exec": set(self.execs),
            "module": set(self.modules),
        }

    # ======================================================================= the driver API
    # -- init, device, context -------------------------------------------------------------------
    def _cuInit(self, flags: int) -> tuple:
        return (S,)

    def _cuDriverGetVersion(self) -> tuple:
        return (S, self.version)

    def _newer_than_driver(self, name: str, since: int) -> None:
        if self.version < since:
            raise RuntimeError(f'Function "{name}" not found')  # what the binding raises

    def _cuDeviceGetCount(self) -> tuple:
        return (S, 1)

    def _cuDeviceGet(self, ordinal: int) -> tuple:
        if int(ordinal) != 0:
            _fail(R.CUDA_ERROR_INVALID_DEVICE)
        return (S, d.CUdevice(0))

    def _cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple:
        self.ctx_refs += 1
        return (S, self.ctx)

    def _cuDevicePrimaryCtxRelease(self, dev: Any) -> tuple:
        self.ctx_refs -= 1
        return (S,)

    def _cuCtxSetCurrent(self, ctx: Any) -> tuple:
        if _i(ctx) != int(self.ctx):
            _fail(R.CUDA_ERROR_INVALID_CONTEXT)
        return (S,)

    def _cuCtxGetCurrent(self) -> tuple:
        return (S, self.ctx)

    def _cuCtxSynchronize(self) -> tuple:
        self._unsafe()
        return (S,)

    def _cuDeviceGetAttribute(self, attr: Any, dev: Any) -> tuple:
        A = d.CUdevice_attribute
        table = {
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: self.CC[0],
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: self.CC[1],
            A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
            A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 50 << 20,
            A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 233472,
            A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
            A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: 1024,
        }
        return (S, int(table.get(attr, 0)))

    def _cuDeviceGetName(self, n: int, dev: Any) -> tuple:
        return (S, b"Fake H200 (rawgraph tests)".ljust(int(n), b"\0"))

    def _cuDeviceTotalMem(self, dev: Any) -> tuple:
        return (S, self.TOTAL)

    def _cuMemGetInfo(self) -> tuple:
        used = sum(a.size for a in self.allocs.values() if a.kind != "host")
        return (S, self.TOTAL - used, self.TOTAL)

    def _cuGetErrorString(self, code: Any) -> tuple:
        return (S, f"fake driver: {R(int(code)).name}".encode())

    def _cuGetErrorName(self, code: Any) -> tuple:
        return (S, R(int(code)).name.encode())

    def _cuDeviceGetGraphMemAttribute(self, dev: Any, attr: Any) -> tuple:
        return (S, d.cuuint64_t(0))

    def _cuDeviceSetGraphMemAttribute(self, dev: Any, attr: Any, value: Any) -> tuple:
        return (S,)

    def _cuDeviceGraphMemTrim(self, dev: Any) -> tuple:
        return (S,)

    # -- memory -------------------------------------------------------------------------------
    def _cuMemAlloc(self, n: int) -> tuple:
        self._unsafe()
        return (S, d.CUdeviceptr(self._alloc(int(n), "device")))

    def _cuMemFree(self, ptr: Any) -> tuple:
        self._unsafe()
        self._free(_i(ptr), "device")
        return (S,)

    def _cuMemHostAlloc(self, n: int, flags: int) -> tuple:
        self._unsafe()
        return (S, self._alloc(int(n), "host"))

    def _cuMemFreeHost(self, ptr: Any) -> tuple:
        self._unsafe()
        self._free(_i(ptr), "host")
        return (S,)

    def _cuMemHostGetDevicePointer(self, ptr: Any, flags: int) -> tuple:
        a = self.find_alloc(_i(ptr))
        if a is None or a.kind != "host":
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return (S, d.CUdeviceptr(_i(ptr)))

    def _cuMemGetAddressRange(self, ptr: Any) -> tuple:
        a = self.find_alloc(_i(ptr))
        if a is None or a.kind == "host":
            _fail(R.CUDA_ERROR_NOT_FOUND)
        return (S, d.CUdeviceptr(a.base), a.size)

    def _cuPointerGetAttribute(self, attr: Any, ptr: Any) -> tuple:
        a = self.find_alloc(_i(ptr))
        if a is None:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        A = d.CUpointer_attribute
        if attr == A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            return (S, int(_MT.CU_MEMORYTYPE_HOST if a.kind == "host" else _MT.CU_MEMORYTYPE_DEVICE))
        if attr == A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            return (S, 0)
        return (S, 0)

    def _cuMemcpyHtoD(self, dst: Any, src: Any, n: int) -> tuple:
        self._unsafe()
        self._copy(_i(dst), _i(src), n, "device", "host")
        return (S,)

    def _cuMemcpyDtoH(self, dst: Any, src: Any, n: int) -> tuple:
        self._unsafe()
        self._copy(_i(dst), _i(src), n, "host", "device")
        return (S,)

    def _cuMemsetD32(self, ptr: Any, value: int, n: int) -> tuple:
        self._unsafe()
        self._fill32(_i(ptr), int(value), int(n))
        return (S,)

    def _fill32(self, ptr: int, value: int, n: int) -> None:
        self._check_range(ptr, 4 * n, "device")
        ctypes.memmove(ptr, struct.pack("<I", value & 0xFFFFFFFF) * n, 4 * n)

    def _async_copy(self, dst: Any, src: Any, n: int, stream: Any, dst_host: bool, src_host: bool) -> tuple:
        s = self._capturing(stream)
        if s is not None:
            self._check_range(_i(dst), int(n), "host" if dst_host else "device")
            self._check_range(_i(src), int(n), "host" if src_host else "device")
            self._memcpy_node(s, _i(dst), _i(src), int(n), dst_host, src_host)
            return (S,)
        self._copy(_i(dst), _i(src), n, "host" if dst_host else "device", "host" if src_host else "device")
        return (S,)

    def _cuMemcpyHtoDAsync(self, dst: Any, src: Any, n: int, stream: Any) -> tuple:
        return self._async_copy(dst, src, n, stream, False, True)

    def _cuMemcpyDtoHAsync(self, dst: Any, src: Any, n: int, stream: Any) -> tuple:
        return self._async_copy(dst, src, n, stream, True, False)

    def _cuMemcpyDtoDAsync(self, dst: Any, src: Any, n: int, stream: Any) -> tuple:
        return self._async_copy(dst, src, n, stream, False, False)

    def _cuMemsetD32Async(self, ptr: Any, value: int, n: int, stream: Any) -> tuple:
        s = self._capturing(stream)
        if s is not None:
            self._check_range(_i(ptr), 4 * int(n), "device")
            m = {
                "dst": _i(ptr),
                "pitch": 4 * int(n),
                "value": int(value),
                "elementSize": 4,
                "width": int(n),
                "height": 1,
            }
            self._captured_node(s, T.CU_GRAPH_NODE_TYPE_MEMSET, {"memset": m})
            return (S,)
        self._fill32(_i(ptr), int(value), int(n))
        return (S,)

    def _cuMemAllocAsync(self, n: int, stream: Any) -> tuple:
        s = self._capturing(stream)
        if s is None:
            return (S, d.CUdeviceptr(self._alloc(int(n), "device")))
        ptr = self._alloc(int(n), "graph")
        self._captured_node(s, T.CU_GRAPH_NODE_TYPE_MEM_ALLOC, {"dptr": ptr, "bytesize": int(n)})
        return (S, d.CUdeviceptr(ptr))

    def _cuMemFreeAsync(self, ptr: Any, stream: Any) -> tuple:
        s = self._capturing(stream)
        if s is None:
            self._free(_i(ptr), "device")
            return (S,)
        a = self.allocs.get(_i(ptr))
        if a is None or a.kind != "graph":
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        self._captured_node(s, T.CU_GRAPH_NODE_TYPE_MEM_FREE, {"dptr": _i(ptr)})
        return (S,)

    # -- modules and functions --------------------------------------------------------------------
    def _cuModuleLoadData(self, image: Any) -> tuple:
        ptr = _i(image)
        if ctypes.string_at(ptr, 4) != b"\x7fELF":
            _fail(R.CUDA_ERROR_INVALID_IMAGE)  # PTX is not modelled
        kernels = cubin_info(ctypes.string_at(ptr, _elf_size(ptr)))
        h = self._new()
        self.modules[h] = []
        self._pending_kernels[h] = kernels
        return (S, d.CUmodule(h))

    def _cuModuleUnload(self, mod: Any) -> tuple:
        self._unsafe()
        funcs = self.modules.pop(_i(mod), None)
        if funcs is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        for f in funcs:
            self.functions.pop(f, None)
        self._pending_kernels.pop(_i(mod), None)
        return (S,)

    def _cuModuleGetFunction(self, mod: Any, name: bytes) -> tuple:
        kernels = self._pending_kernels.get(_i(mod))
        if kernels is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        sym = name.decode() if isinstance(name, (bytes, bytearray)) else str(name)
        if sym not in kernels:
            _fail(R.CUDA_ERROR_NOT_FOUND)
        for f in self.modules[_i(mod)]:
            if self.functions[f].name == sym:
                return (S, d.CUfunction(f))
        h = self._new()
        layout, cluster = kernels[sym]
        A = d.CUfunction_attribute
        attrs = dict(
            zip(
                (
                    int(A.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH),
                    int(A.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT),
                    int(A.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH),
                ),
                cluster,
            )
        )
        self.functions[h] = Func(h, _i(mod), sym, layout, attrs)
        self.modules[_i(mod)].append(h)
        return (S, d.CUfunction(h))

    def _func(self, f: Any) -> Func:
        fn = self.functions.get(_i(f))
        if fn is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        return fn

    def _cuFuncGetAttribute(self, attr: Any, f: Any) -> tuple:
        fn = self._func(f)
        A = d.CUfunction_attribute
        default = {A.CU_FUNC_ATTRIBUTE_NUM_REGS: 32}.get(attr, 0)
        return (S, fn.attrs.get(int(attr), default))

    def _cuFuncSetAttribute(self, f: Any, attr: Any, value: int) -> tuple:
        self._func(f).attrs[int(attr)] = int(value)
        return (S,)

    def _cuFuncGetName(self, f: Any) -> tuple:
        return (S, self._func(f).name.encode())

    def _cuFuncGetParamCount(self, f: Any) -> tuple:
        self._newer_than_driver("cuFuncGetParamCount", 13020)
        return (S, len(self._func(f).layout))

    def _cuFuncGetParamInfo(self, f: Any, i: int) -> tuple:
        lay = self._func(f).layout
        if not 0 <= int(i) < len(lay):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return (S, lay[int(i)][0], lay[int(i)][1])

    def _cuKernelGetFunction(self, k: Any) -> tuple:
        _fail(R.CUDA_ERROR_INVALID_HANDLE)
        return ()

    # -- launches -----------------------------------------------------------------------------------
    def _cuLaunchKernel(
        self,
        f: Any,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        smem: int,
        stream: Any,
        params: Any,
        extra: Any,
    ) -> tuple:
        p = self._kernel_params(f, (gx, gy, gz), (bx, by, bz), smem, _i(params), _i(extra))
        s = self._capturing(stream)
        if s is not None:
            self._captured_node(s, T.CU_GRAPH_NODE_TYPE_KERNEL, {"kernel": p})
        else:
            self._stream(stream)
            self.launch_log.append(("kernel", p["func"], _i(stream)))
        return (S,)

    def _cuLaunchKernelEx(self, cfg: Any, f: Any, params: Any, extra: Any) -> tuple:
        p = self._kernel_params(
            f,
            (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
            (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
            cfg.sharedMemBytes,
            _i(params),
            _i(extra),
        )
        pdl = any(
            a.id == _PSS and a.value.programmaticStreamSerializationAllowed
            for a in list(cfg.attrs)[: int(cfg.numAttrs)]
        )
        s = self._capturing(cfg.hStream)
        if s is not None:
            self._captured_node(s, T.CU_GRAPH_NODE_TYPE_KERNEL, {"kernel": p}, programmatic=pdl)
        else:
            self._stream(cfg.hStream)
            self.launch_log.append(("kernel", p["func"], _i(cfg.hStream)))
        return (S,)

    # -- streams and events -----------------------------------------------------------------------
    def _cuStreamCreate(self, flags: int) -> tuple:
        h = self._new()
        self.streams[h] = Stream(h, int(flags))
        return (S, d.CUstream(h))

    def _cuStreamDestroy(self, stream: Any) -> tuple:
        s = self._stream(stream)
        if s is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        if s.seq is not None:  # the driver invalidates a capture whose stream goes away
            s.seq.status = _ST.CU_STREAM_CAPTURE_STATUS_INVALIDATED
            s.seq.members.discard(s.handle)
        del self.streams[s.handle]
        return (S,)

    def _cuStreamSynchronize(self, stream: Any) -> tuple:
        s = self._stream(stream)
        if s is not None and s.seq is not None:
            s.seq.status = _ST.CU_STREAM_CAPTURE_STATUS_INVALIDATED
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        if s is None:
            self._unsafe()  # the legacy stream: a fence with every blocking stream
        return (S,)

    def _cuStreamQuery(self, stream: Any) -> tuple:
        s = self._stream(stream)
        if s is not None and s.seq is not None:
            s.seq.status = _ST.CU_STREAM_CAPTURE_STATUS_INVALIDATED
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        return (S,)

    def _cuStreamGetCtx(self, stream: Any) -> tuple:
        self._stream(stream)
        return (S, self.ctx)

    def _cuStreamGetFlags(self, stream: Any) -> tuple:
        s = self._stream(stream)
        return (S, s.flags if s is not None else 0)

    def _cuStreamIsCapturing(self, stream: Any) -> tuple:
        s = self._stream(stream)
        if s is None or s.seq is None:
            return (S, _ST.CU_STREAM_CAPTURE_STATUS_NONE)
        return (S, s.seq.status)

    def _cuStreamGetCaptureInfo(self, stream: Any) -> tuple:
        s = self._stream(stream)
        if s is None or s.seq is None:
            return (S, _ST.CU_STREAM_CAPTURE_STATUS_NONE, d.cuuint64_t(0), None, [], [], 0)
        q = s.seq
        if q.status != _ST.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return (S, q.status, d.cuuint64_t(q.id), None, [], [], 0)
        deps = [d.CUgraphNode(n) for n, _ in s.deps]
        edges = [_edge_data(e) for _, e in s.deps]
        return (S, q.status, d.cuuint64_t(q.id), d.CUgraph(q.graph), deps, edges, len(deps))

    def _cuStreamBeginCapture(self, stream: Any, mode: Any) -> tuple:
        s = self._stream(stream)
        if s is None:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        if s.seq is not None:
            _fail(R.CUDA_ERROR_ILLEGAL_STATE)
        g = self._new()
        q = Sequence(next(self._seq_ids), g, int(mode), s.handle, False)
        self.graphs[g] = Graph(g, owner=("capture", q.id))
        q.members.add(s.handle)
        s.seq, s.deps = q, []
        return (S,)

    def _cuStreamBeginCaptureToGraph(self, stream: Any, graph: Any, deps: Any, edata: Any, n: int, mode: Any) -> tuple:
        s = self._stream(stream)
        if s is None:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        if s.seq is not None:
            _fail(R.CUDA_ERROR_ILLEGAL_STATE)
        if _i(graph) not in self.graphs:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        q = Sequence(next(self._seq_ids), _i(graph), int(mode), s.handle, True)
        q.members.add(s.handle)
        s.seq = q
        s.deps = [(_i(x), _edge(e)) for x, e in zip(list(deps or [])[: int(n)], list(edata or [None] * int(n)))]
        return (S,)

    def _cuStreamUpdateCaptureDependencies(self, stream: Any, deps: Any, edata: Any, n: int, flags: int) -> tuple:
        s = self._stream(stream)
        if s is None or s.seq is None:
            _fail(R.CUDA_ERROR_ILLEGAL_STATE)
        new = [(_i(x), _edge(e)) for x, e in zip(list(deps or [])[: int(n)], list(edata or [None] * int(n)))]
        for x, _e in new:
            if x not in self.nodes or self.nodes[x].graph != s.seq.graph:
                _fail(R.CUDA_ERROR_INVALID_VALUE)
        s.deps = new if int(flags) == _SET_DEPS else s.deps + new
        return (S,)

    def _reached(self, g: Graph, start: list[int]) -> set[int]:
        into: dict[int, list[int]] = {}
        for a, b, _e in g.edges:
            into.setdefault(b, []).append(a)
        seen, todo = set(start), list(start)
        while todo:
            for a in into.get(todo.pop(), ()):
                if a not in seen:
                    seen.add(a)
                    todo.append(a)
        return seen

    def _cuStreamEndCapture(self, stream: Any) -> tuple:
        s = self._stream(stream)
        if s is None or s.seq is None:
            _fail(R.CUDA_ERROR_ILLEGAL_STATE)
        q = s.seq
        if q.origin != s.handle:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
        g = self.graphs[q.graph]
        code = S
        if q.status != _ST.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            code = R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        else:
            reached = self._reached(g, [n for n, _ in s.deps])
            for m in q.members:
                if m != s.handle and not {n for n, _ in self.streams[m].deps} <= reached:
                    code = R.CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        for m in list(q.members):
            if m in self.streams:
                self.streams[m].seq, self.streams[m].deps = None, []
        for e in self.events.values():
            if e.captured is not None and e.captured[0] is q:
                e.captured = (None, e.captured[1])
        if q.to_graph:
            return (code, d.CUgraph(q.graph) if code == S else None)
        if code != S:
            self._destroy_graph(g)
            return (code, None)
        g.owner = None
        return (S, d.CUgraph(g.handle))

    def _cuEventCreate(self, flags: int) -> tuple:
        h = self._new()
        self.events[h] = Event(h, int(flags))
        return (S, d.CUevent(h))

    def _event(self, e: Any) -> Event:
        ev = self.events.get(_i(e))
        if ev is None:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        return ev

    def _cuEventDestroy(self, e: Any) -> tuple:
        self._event(e)
        del self.events[_i(e)]
        return (S,)

    def _cuEventRecord(self, e: Any, stream: Any) -> tuple:
        ev = self._event(e)
        s = self._capturing(stream)
        ev.captured = (s.seq, list(s.deps)) if s is not None else None
        if s is None:
            self._stream(stream)
        return (S,)

    def _cuEventRecordWithFlags(self, e: Any, stream: Any, flags: int) -> tuple:
        ev = self._event(e)
        s = self._capturing(stream)
        if s is not None and int(flags) & int(d.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL):
            self._captured_node(s, T.CU_GRAPH_NODE_TYPE_EVENT_RECORD, {"event": ev.handle})
            return (S,)
        return self._cuEventRecord(e, stream)

    def _event_ready(self, ev: Event) -> None:
        if ev.captured is not None and ev.captured[0] is not None:
            _fail(R.CUDA_ERROR_CAPTURED_EVENT)

    def _cuEventQuery(self, e: Any) -> tuple:
        self._event_ready(self._event(e))
        return (S,)

    def _cuEventSynchronize(self, e: Any) -> tuple:
        self._event_ready(self._event(e))
        return (S,)

    def _cuEventElapsedTime(self, a: Any, b: Any) -> tuple:
        self._event(a)
        self._event(b)
        return (S, 0.01)

    def _cuStreamWaitEvent(self, stream: Any, e: Any, flags: int) -> tuple:
        ev = self._event(e)
        s = self._stream(stream)
        seq = ev.captured[0] if ev.captured is not None else None
        if seq is None or seq.status != _ST.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            if s is not None and s.seq is not None:
                s.seq.status = _ST.CU_STREAM_CAPTURE_STATUS_INVALIDATED
                _fail(R.CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            return (S,)
        if s is None:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        nodes = list(ev.captured[1]) if ev.captured is not None else []
        if s.seq is None:
            s.seq, s.deps = seq, nodes
            seq.members.add(s.handle)
        elif s.seq is seq:
            have = {n for n, _ in s.deps}
            s.deps = s.deps + [x for x in nodes if x[0] not in have]
        else:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_MERGE)
        return (S,)

    # -- graphs ---------------------------------------------------------------------------------------
    def _graph(self, g: Any) -> Graph:
        gr = self.graphs.get(_i(g))
        if gr is None:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return gr

    def _node(self, n: Any) -> Node:
        node = self.nodes.get(_i(n))
        if node is None:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return node

    def _cuGraphCreate(self, flags: int) -> tuple:
        h = self._new()
        self.graphs[h] = Graph(h)
        return (S, d.CUgraph(h))

    def _destroy_graph(self, g: Graph) -> None:
        for n in g.nodes:
            node = self.nodes.pop(n, None)
            if node is None:
                continue
            for child in node.params.get("owned", ()):
                if child in self.graphs:
                    self._destroy_graph(self.graphs[child])
            if node.kind == T.CU_GRAPH_NODE_TYPE_MEM_ALLOC:
                a = self.allocs.pop(node.params["dptr"], None)
                if a is not None:
                    self._bases.remove(a.base)
        for h, owner in list(self.cond_handles.items()):
            if owner == g.handle:
                del self.cond_handles[h]
        del self.graphs[g.handle]

    def _cuGraphDestroy(self, g: Any) -> tuple:
        gr = self._graph(g)
        if gr.owner is not None:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        self._destroy_graph(gr)
        return (S,)

    def _deps(self, deps: Any, n: int, edata: Any = None) -> list[tuple[int, tuple[int, int, int]]]:
        items = list(deps or [])[: int(n)]
        if len(items) != int(n):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        data = list(edata or [None] * int(n))
        return [(_i(x), _edge(e)) for x, e in zip(items, data)]

    def _cuGraphAddKernelNode(self, g: Any, deps: Any, n: int, p: Any) -> tuple:
        h = self._add_node(
            _i(g), T.CU_GRAPH_NODE_TYPE_KERNEL, {"kernel": self._kparams_from_struct(p)}, self._deps(deps, n)
        )
        return (S, d.CUgraphNode(h))

    def _cuGraphAddMemcpyNode(self, g: Any, deps: Any, n: int, p: Any, ctx: Any) -> tuple:
        m = memcpy_dict(p)
        for side in ("src", "dst"):
            host = m[f"{side}MemoryType"] == int(_MT.CU_MEMORYTYPE_HOST)
            self._check_range(
                m[f"{side}Host"] if host else m[f"{side}Device"], m["WidthInBytes"], "host" if host else "device"
            )
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_MEMCPY, {"memcpy": m}, self._deps(deps, n))
        return (S, d.CUgraphNode(h))

    def _cuGraphAddMemsetNode(self, g: Any, deps: Any, n: int, p: Any, ctx: Any) -> tuple:
        m = {f: int(getattr(p, f)) for f in MEMSET_FIELDS}
        self._check_range(m["dst"], m["width"] * m["elementSize"], "device")
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_MEMSET, {"memset": m}, self._deps(deps, n))
        return (S, d.CUgraphNode(h))

    def _cuGraphAddHostNode(self, g: Any, deps: Any, n: int, p: Any) -> tuple:
        h = self._add_node(
            _i(g), T.CU_GRAPH_NODE_TYPE_HOST, {"fn": _i(p.fn), "userData": _i(p.userData)}, self._deps(deps, n)
        )
        return (S, d.CUgraphNode(h))

    def _cuGraphAddEventRecordNode(self, g: Any, deps: Any, n: int, e: Any) -> tuple:
        self._event(e)
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_EVENT_RECORD, {"event": _i(e)}, self._deps(deps, n))
        return (S, d.CUgraphNode(h))

    def _cuGraphAddEventWaitNode(self, g: Any, deps: Any, n: int, e: Any) -> tuple:
        self._event(e)
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_WAIT_EVENT, {"event": _i(e)}, self._deps(deps, n))
        return (S, d.CUgraphNode(h))

    def _cuGraphAddEmptyNode(self, g: Any, deps: Any, n: int) -> tuple:
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_EMPTY, {}, self._deps(deps, n))
        return (S, d.CUgraphNode(h))

    def _clone_into(self, src: Graph, dst: Graph) -> None:
        for n in src.nodes:
            node = self.nodes[n]
            params = dict(node.params)
            owned = []
            for child in node.params.get("owned", ()):
                c = self._new()
                self.graphs[c] = Graph(c, owner=("node", None))
                self._clone_into(self.graphs[child], self.graphs[c])
                owned.append(c)
            if owned:
                params["owned"] = owned
                if "child" in params:
                    params["child"] = owned[0]
            h = self._new()
            self.nodes[h] = Node(h, dst.handle, node.kind, params)
            for c in owned:
                self.graphs[c].owner = ("node", h)
            dst.nodes.append(h)
            dst.clone_map[n] = h
        for a, b, e in src.edges:
            dst.edges.append((dst.clone_map[a], dst.clone_map[b], e))

    def _no_clone(self, g: Graph) -> bool:
        for n in g.nodes:
            node = self.nodes[n]
            if node.kind in (
                T.CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                T.CU_GRAPH_NODE_TYPE_MEM_FREE,
                T.CU_GRAPH_NODE_TYPE_CONDITIONAL,
            ):
                return True
            if node.kind == T.CU_GRAPH_NODE_TYPE_GRAPH and self._no_clone(self.graphs[node.params["child"]]):
                return True
        return False

    def _cuGraphAddChildGraphNode(self, g: Any, deps: Any, n: int, child: Any) -> tuple:
        src = self._graph(child)
        if self._no_clone(src):
            _fail(R.CUDA_ERROR_NOT_SUPPORTED)
        deps_ = self._deps(deps, n)
        c = self._new()
        self.graphs[c] = Graph(c, owner=("node", None))
        self._clone_into(src, self.graphs[c])
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_GRAPH, {"child": c, "owned": [c]}, deps_)
        self.graphs[c].owner = ("node", h)
        return (S, d.CUgraphNode(h))

    def _cuGraphAddMemAllocNode(self, g: Any, deps: Any, n: int, p: Any) -> tuple:
        deps_ = self._deps(deps, n)
        ptr = self._alloc(int(p.bytesize), "graph")
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_MEM_ALLOC, {"dptr": ptr, "bytesize": int(p.bytesize)}, deps_)
        p.dptr = ptr  # the driver writes the address into the caller's struct
        return (S, d.CUgraphNode(h))

    def _cuGraphAddMemFreeNode(self, g: Any, deps: Any, n: int, ptr: Any) -> tuple:
        a = self.allocs.get(_i(ptr))
        if a is None or a.kind != "graph":
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        h = self._add_node(_i(g), T.CU_GRAPH_NODE_TYPE_MEM_FREE, {"dptr": _i(ptr)}, self._deps(deps, n))
        return (S, d.CUgraphNode(h))

    def _cuGraphConditionalHandleCreate(self, g: Any, ctx: Any, default: int, flags: int) -> tuple:
        gr = self._graph(g)
        if _i(ctx) != int(self.ctx):
            _fail(R.CUDA_ERROR_INVALID_CONTEXT)
        h = self._new()
        self.cond_handles[h] = gr.handle
        return (S, d.CUgraphConditionalHandle(h))

    def _ancestry(self, g: Graph) -> list[int]:
        out = [g.handle]
        while g.owner is not None and g.owner[0] == "node" and g.owner[1] in self.nodes:
            g = self.graphs[self.nodes[g.owner[1]].graph]
            out.append(g.handle)
        return out

    def _cuGraphAddNode(self, g: Any, deps: Any, edata: Any, n: int, p: Any) -> tuple:
        gr = self._graph(g)
        deps_ = self._deps(deps, n, edata)
        if p.type != T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            _fail(R.CUDA_ERROR_NOT_SUPPORTED)  # rawgraph adds only conditional nodes this way
        c = p.conditional
        kind, size = int(c.type), int(c.size)
        allowed = {0: (1, 2), 1: (1,)}.get(kind)
        if size < 1 or (allowed is not None and size not in allowed):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        if self.cond_handles.get(_i(c.handle)) not in self._ancestry(gr) or _i(c.ctx) != int(self.ctx):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        bodies = []
        for _ in range(size):
            b = self._new()
            self.graphs[b] = Graph(b, owner=("node", None))
            bodies.append(b)
        h = self._add_node(
            gr.handle, T.CU_GRAPH_NODE_TYPE_CONDITIONAL, {"cond": (_i(c.handle), kind, size), "owned": bodies}, deps_
        )
        for b in bodies:
            self.graphs[b].owner = ("node", h)
        node = self.nodes[h]
        arr = (ctypes.c_uint64 * size)(*bodies)
        node.keep.append(arr)  # driver-owned memory, valid while the node lives
        ctypes.c_uint64.from_address(int(c.getPtr()) + 16).value = ctypes.addressof(arr)
        return (S, d.CUgraphNode(h))

    def _cuGraphNodeGetParams(self, n: Any) -> tuple:
        self._newer_than_driver("cuGraphNodeGetParams", 13020)
        node = self._node(n)
        p = d.CUgraphNodeParams()
        p.type = node.kind
        if node.kind == T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            handle, kind, size = node.params["cond"]
            c = p.conditional
            c.handle = d.CUgraphConditionalHandle(handle)
            c.type = d.CUgraphConditionalNodeType(kind)
            c.size = size
            c.ctx = self.ctx
            arr = node.keep[0]
            ctypes.c_uint64.from_address(int(c.getPtr()) + 16).value = ctypes.addressof(arr)
        return (S, p)

    def _cuGraphAddDependencies(self, g: Any, frm: Any, to: Any, edata: Any, n: int) -> tuple:
        gr = self._graph(g)
        a_list, b_list = list(frm or [])[: int(n)], list(to or [])[: int(n)]
        data = list(edata or [None] * int(n))
        for a, b, e in zip(a_list, b_list, data):
            for x in (a, b):
                if _i(x) not in self.nodes or self.nodes[_i(x)].graph != gr.handle:
                    _fail(R.CUDA_ERROR_INVALID_VALUE)
            if any(x == _i(a) and y == _i(b) for x, y, _e in gr.edges):
                _fail(R.CUDA_ERROR_INVALID_VALUE)
            gr.edges.append((_i(a), _i(b), _edge(e)))
        return (S,)

    def _cuGraphDestroyNode(self, n: Any) -> tuple:
        node = self._node(n)
        g = self.graphs[node.graph]
        if g.owner is not None and g.owner[0] == "capture":
            _fail(R.CUDA_ERROR_INVALID_VALUE)  # no node removal while capturing
        for child in node.params.get("owned", ()):
            if child in self.graphs:
                self._destroy_graph(self.graphs[child])
        g.nodes.remove(node.handle)
        g.edges = [e for e in g.edges if node.handle not in (e[0], e[1])]
        del self.nodes[node.handle]
        return (S,)

    def _cuGraphClone(self, g: Any) -> tuple:
        src = self._graph(g)
        if self._no_clone(src):
            _fail(R.CUDA_ERROR_NOT_SUPPORTED)
        h = self._new()
        self.graphs[h] = Graph(h)
        self._clone_into(src, self.graphs[h])
        return (S, d.CUgraph(h))

    def _cuGraphNodeFindInClone(self, orig: Any, clone: Any) -> tuple:
        c = self._graph(clone)
        if _i(orig) not in c.clone_map:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return (S, d.CUgraphNode(c.clone_map[_i(orig)]))

    def _cuGraphGetNodes(self, g: Any, n: int = 0) -> tuple:
        gr = self._graph(g)
        if not int(n):
            return (S, [], len(gr.nodes))
        nodes = [d.CUgraphNode(h) for h in gr.nodes[: int(n)]]
        nodes += [d.CUgraphNode(0)] * (int(n) - len(nodes))
        return (S, nodes, min(int(n), len(gr.nodes)))

    def _cuGraphGetEdges(self, g: Any, n: int = 0) -> tuple:
        gr = self._graph(g)
        if not int(n):
            return (S, [], [], [], len(gr.edges))
        es = gr.edges[: int(n)]
        return (
            S,
            [d.CUgraphNode(a) for a, _b, _e in es],
            [d.CUgraphNode(b) for _a, b, _e in es],
            [_edge_data(e) for _a, _b, e in es],
            len(es),
        )

    def _cuGraphNodeGetType(self, n: Any) -> tuple:
        return (S, self._node(n).kind)

    def _kernel_struct(self, k: dict, keep: list) -> Any:
        f = self.functions[k["func"]]
        vals = (ctypes.c_char * max(len(k["blob"]), 1)).from_buffer_copy(k["blob"] or b"\0")
        table = (ctypes.c_void_p * max(len(f.layout), 1))(*[ctypes.addressof(vals) + o for o, _n in f.layout])
        keep[:] = [vals, table]
        p = d.CUDA_KERNEL_NODE_PARAMS()
        p.func = d.CUfunction(k["func"])
        p.gridDimX, p.gridDimY, p.gridDimZ = k["grid"]
        p.blockDimX, p.blockDimY, p.blockDimZ = k["block"]
        p.sharedMemBytes = k["smem"]
        p.kernelParams = ctypes.addressof(table)
        p.ctx = self.ctx
        return p

    def _cuGraphKernelNodeGetParams(self, n: Any) -> tuple:
        node = self._node(n)
        if node.kind != T.CU_GRAPH_NODE_TYPE_KERNEL:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return (S, self._kernel_struct(node.params["kernel"], node.keep))

    def _cuGraphMemcpyNodeGetParams(self, n: Any) -> tuple:
        node = self._node(n)
        if node.kind != T.CU_GRAPH_NODE_TYPE_MEMCPY:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return (S, memcpy_struct(node.params["memcpy"]))

    def _cuGraphMemsetNodeGetParams(self, n: Any) -> tuple:
        node = self._node(n)
        if node.kind != T.CU_GRAPH_NODE_TYPE_MEMSET:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        p = d.CUDA_MEMSET_NODE_PARAMS()
        for f, v in node.params["memset"].items():
            setattr(p, f, v)
        return (S, p)

    def _cuGraphHostNodeGetParams(self, n: Any) -> tuple:
        node = self._node(n)
        p = d.CUDA_HOST_NODE_PARAMS()
        p.fn = d.CUhostFn(node.params["fn"])
        p.userData = node.params["userData"]
        return (S, p)

    def _cuGraphEventRecordNodeGetEvent(self, n: Any) -> tuple:
        return (S, d.CUevent(self._node(n).params["event"]))

    def _cuGraphEventWaitNodeGetEvent(self, n: Any) -> tuple:
        return (S, d.CUevent(self._node(n).params["event"]))

    def _cuGraphChildGraphNodeGetGraph(self, n: Any) -> tuple:
        node = self._node(n)
        if node.kind != T.CU_GRAPH_NODE_TYPE_GRAPH:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return (S, d.CUgraph(node.params["child"]))

    def _cuGraphMemAllocNodeGetParams(self, n: Any) -> tuple:
        node = self._node(n)
        p = d.CUDA_MEM_ALLOC_NODE_PARAMS()
        p.bytesize = node.params["bytesize"]
        p.dptr = node.params["dptr"]
        return (S, p)

    def _cuGraphMemFreeNodeGetParams(self, n: Any) -> tuple:
        return (S, d.CUdeviceptr(self._node(n).params["dptr"]))

    def _cuGraphDebugDotPrint(self, g: Any, path: bytes, flags: int) -> tuple:
        gr = self._graph(g)
        with open(path, "w") as f:
            f.write(f"digraph fake {{ /* {len(gr.nodes)} nodes */ }}\n")
        return (S,)

    # -- execs -----------------------------------------------------------------------------------------
    def _exec_state(self, g: Graph, state: dict[int, dict]) -> None:
        for n in g.nodes:
            node = self.nodes[n]
            if node.kind == T.CU_GRAPH_NODE_TYPE_KERNEL:
                state[n] = dict(node.params["kernel"])
            elif node.kind == T.CU_GRAPH_NODE_TYPE_MEMCPY:
                state[n] = {"memcpy": dict(node.params["memcpy"])}
            elif node.kind == T.CU_GRAPH_NODE_TYPE_MEMSET:
                state[n] = {"memset": dict(node.params["memset"])}
            elif node.kind == T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
                for b in node.params["owned"]:  # body kernels take SetParams too
                    self._exec_state(self.graphs[b], state)

    def _device_launch_ok(self, g: Graph) -> bool:
        ok_kinds = (T.CU_GRAPH_NODE_TYPE_KERNEL, T.CU_GRAPH_NODE_TYPE_MEMCPY, T.CU_GRAPH_NODE_TYPE_MEMSET)
        if not g.nodes:
            return False
        for n in g.nodes:
            node = self.nodes[n]
            if node.kind == T.CU_GRAPH_NODE_TYPE_GRAPH:
                if not self._device_launch_ok(self.graphs[node.params["child"]]):
                    return False
            elif node.kind not in ok_kinds:
                return False
        return True

    def _cuGraphInstantiate(self, g: Any, flags: Any) -> tuple:
        gr = self._graph(g)
        if gr.owner is not None and gr.owner[0] == "capture":
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        if int(flags) & _DEVICE_LAUNCH and not self._device_launch_ok(gr):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        has_alloc = any(self.nodes[n].kind == T.CU_GRAPH_NODE_TYPE_MEM_ALLOC for n in gr.nodes)
        if has_alloc and any(e.graph == gr.handle for e in self.execs.values()):
            _fail(R.CUDA_ERROR_NOT_SUPPORTED)  # one exec at a time for a graph with memory nodes
        h = self._new()
        state: dict[int, dict] = {}
        self._exec_state(gr, state)
        self.execs[h] = Exec(h, gr.handle, int(flags), list(gr.nodes), state)
        return (S, d.CUgraphExec(h))

    def _exec(self, e: Any) -> Exec:
        ex = self.execs.get(_i(e))
        if ex is None:
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return ex

    def _cuGraphExecDestroy(self, e: Any) -> tuple:
        self._unsafe()
        self._exec(e)
        del self.execs[_i(e)]
        return (S,)

    def _cuGraphExecGetFlags(self, e: Any) -> tuple:
        return (S, d.cuuint64_t(self._exec(e).flags))

    def _cuGraphUpload(self, e: Any, stream: Any) -> tuple:
        self._exec(e)
        if self._capturing(stream) is not None:
            _fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        self._stream(stream)
        return (S,)

    def _cuGraphLaunch(self, e: Any, stream: Any) -> tuple:
        ex = self._exec(e)
        if self._capturing(stream) is not None:
            _fail(R.CUDA_ERROR_NOT_SUPPORTED)  # a child-graph launch into a capture: not modelled
        self._stream(stream)
        self.launch_log.append(("graph", ex.handle, _i(stream)))
        return (S,)

    def _settable(self, ex: Exec, n: Any, kind: str) -> dict:
        if _i(n) not in self.nodes:
            _fail(R.CUDA_ERROR_INVALID_HANDLE)
        st = ex.state.get(_i(n))
        if st is None or (kind == "kernel") != ("func" in st) or (kind != "kernel" and kind not in st):
            _fail(R.CUDA_ERROR_INVALID_VALUE)
        return st

    def _cuGraphExecKernelNodeSetParams(self, e: Any, n: Any, p: Any) -> tuple:
        ex = self._exec(e)
        st = self._settable(ex, n, "kernel")
        st.update(self._kparams_from_struct(p))
        return (S,)

    def _cuGraphExecMemcpyNodeSetParams(self, e: Any, n: Any, p: Any, ctx: Any) -> tuple:
        st = self._settable(self._exec(e), n, "memcpy")
        m = memcpy_dict(p)
        old = st["memcpy"]
        if any(m[f] != old[f] for f in ("srcMemoryType", "dstMemoryType", "WidthInBytes", "Height", "Depth")):
            _fail(R.CUDA_ERROR_INVALID_VALUE)  # only the addresses may change
        st["memcpy"] = m
        return (S,)

    def _cuGraphExecMemsetNodeSetParams(self, e: Any, n: Any, p: Any, ctx: Any) -> tuple:
        st = self._settable(self._exec(e), n, "memset")
        st["memset"] = {f: int(getattr(p, f)) for f in MEMSET_FIELDS}
        return (S,)

    def _cuGraphExecUpdate(self, e: Any, g: Any) -> tuple:
        ex = self._exec(e)
        new = self._graph(g)
        old = self.graphs.get(ex.graph)
        info = d.CUgraphExecUpdateResultInfo()

        def refuse(why: Any) -> tuple:
            info.result = why
            return (R.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, info)

        U = d.CUgraphExecUpdateResult
        if old is None or len(new.nodes) != len(ex.order):
            return refuse(U.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED)
        pos_new = {h: i for i, h in enumerate(new.nodes)}
        pos_old = {h: i for i, h in enumerate(ex.order)}
        if sorted((pos_new[a], pos_new[b], t) for a, b, t in new.edges) != sorted(
            (pos_old[a], pos_old[b], t) for a, b, t in old.edges if a in pos_old and b in pos_old
        ):
            return refuse(U.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED)
        for h_new, h_old in zip(new.nodes, ex.order):
            if self.nodes[h_new].kind != self.nodes[h_old].kind:
                return refuse(U.CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED)
        for h_new, h_old in zip(new.nodes, ex.order):
            if h_old in ex.state:
                p = self.nodes[h_new].params
                ex.state[h_old] = dict(p["kernel"]) if "kernel" in p else {k: dict(v) for k, v in p.items()}
        info.result = U.CU_GRAPH_EXEC_UPDATE_SUCCESS
        return (S, info)


# ------------------------------------------------------------------------------- result arity
_OUTPUTS_CACHE: dict[str, int] = {}


def output_count(name: str) -> int:
    """How many values besides the ``CUresult`` a ``cuda.bindings.driver`` function returns, read
    from its docstring's ``Returns`` section (so a failure can be returned with the right shape)."""
    if name in _OUTPUTS_CACHE:
        return _OUTPUTS_CACHE[name]
    doc = getattr(getattr(d, name, None), "__doc__", "") or ""
    lines = doc.split("\n")
    count = 0
    for i in range(len(lines) - 1):
        if lines[i].strip() == "Returns" and set(lines[i + 1].strip()) == {"-"}:
            base = len(lines[i]) - len(lines[i].lstrip())
            for line in lines[i + 2 :]:
                if not line.strip():
                    continue
                lead = len(line) - len(line.lstrip())
                if lead < base:
                    break
                if lead == base:
                    if line.strip() in ("See Also", "Notes", "Examples") or set(line.strip()) == {"-"}:
                        break
                    count += 1
            break
    _OUTPUTS_CACHE[name] = max(count - 1, 0)  # the first entry is the CUresult itself
    return _OUTPUTS_CACHE[name]


# ------------------------------------------------------------------------------- a session
@contextlib.contextmanager
def fake_driver_session() -> Iterator[FakeDriver]:
    """A :class:`FakeDriver` installed over ``cuda.bindings.driver`` for the block, with rawgraph's
    process-wide state (device, loaded kernels, stream checks, held replays) emptied on entry and
    put back on exit.

    That state holds driver handles: a device, a context, modules, borrowed streams. A handle from
    the real driver must never reach the fake, nor one of the fake's the real driver, so the real
    driver's are set aside for the block and the fake's are released (into the fake) before it is
    uninstalled. Kernels loaded in the block are therefore loaded again after it.

    Yields
    ------
    FakeDriver
        The installed fake: ``exec_kernel_args``, ``exec_memory``, ``read``, ``live``, ``launch_log``
        tell a test what the library did to the driver.
    """
    import rawgraph.graphs.keepalive as keepalive
    import rawgraph.runtime._capturing as capturing
    import rawgraph.runtime.device as device
    import rawgraph.runtime.module as module
    import rawgraph.runtime.rawkernel as rawkernel
    import rawgraph.runtime.resource as resource
    import rawgraph.runtime.stream as stream

    gc.collect()  # nothing of an earlier real-driver test may be released into the fake
    saved = (
        device._init_state,
        dict(device._devices),
        dict(module._kernels),
        dict(rawkernel._loaded),
        list(keepalive._held),
    )
    stream._checked.clear()
    stream._wrappers.clear()
    device._init_state = None
    device._devices.clear()
    module._kernels.clear()
    rawkernel._loaded.clear()
    keepalive._held.clear()
    fake = FakeDriver()
    fake.install()
    try:
        yield fake
    finally:
        gc.collect()
        for rec in capturing.active():  # a capture the block left open: forgotten with the fake
            capturing.end(rec)
        resource.flush_deferred()
        stream._checked.clear()
        stream._wrappers.clear()
        for k in [*module._kernels.values(), *rawkernel._loaded.values()]:
            k.module.close()
        for dev in device._devices.values():
            dev._finalizer.detach()  # the fake's context: nothing to release in the real driver
        keepalive._held.clear()
        fake.uninstall()
        device._init_state = saved[0]
        device._devices.clear()
        device._devices.update(saved[1])
        module._kernels.clear()
        module._kernels.update(saved[2])
        rawkernel._loaded.clear()
        rawkernel._loaded.update(saved[3])
        keepalive._held[:] = saved[4]
