"""Reading back every node of any ``CUgraph``, whoever built it (rawgraph, PyTorch, CuPy, by hand).

:func:`read_graph` enumerates a graph's nodes (``cuGraphGetNodes``, ``cuGraphNodeGetType``), their
dependencies (from ``cuGraphGetEdges``, which also says which edges are programmatic) and decodes
each node by type into a dataclass: kernel, memcpy, memset, host, event record/wait, child graph
(read recursively), memory alloc/free, conditional (bodies read recursively), empty, and anything
else as :class:`OtherNode`.

Kernel nodes are decoded without knowing the kernel: the function's parameter layout comes from
``cuFuncGetParamInfo`` (offset and size of each parameter in the device-side layout, asked for
index 0, 1, ... until ``CUDA_ERROR_INVALID_VALUE``), its name from ``cuFuncGetName``, and the raw
parameter bytes are copied out of the driver's copy of the node's ``kernelParams`` (or its
``extra`` buffer). A node that names its kernel by ``CUkernel`` only (``func`` 0, ``kern`` set:
launched from a library) is resolved with ``cuKernelGetFunction`` in the current context.

What is read is the *graph's* copy of the parameters. An exec's parameters cannot be read back
(the driver has no ``cuGraphExec*GetParams``): after ``cuGraphExec*SetParams`` only the caller
knows what the exec holds (see :mod:`rawgraph.updates.rebind`, which keeps its own copy).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver

from ..runtime.errors import call, cuda_error
from ..runtime.module import read_param_layout

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_INVALID_VALUE = driver.CUresult.CUDA_ERROR_INVALID_VALUE
_T = driver.CUgraphNodeType
# cuFuncGetParamInfo's answers meaning "no layout for this function" (read_layout degrades to None)
_NO_LAYOUT = frozenset(
    {
        driver.CUresult.CUDA_ERROR_NOT_SUPPORTED,
        driver.CUresult.CUDA_ERROR_INVALID_HANDLE,
        driver.CUresult.CUDA_ERROR_NOT_FOUND,
        driver.CUresult.CUDA_ERROR_NOT_PERMITTED,
    }
)

# CU_LAUNCH_PARAM_END / _BUFFER_POINTER / _BUFFER_SIZE: the keys of a kernel node's ``extra`` array.
_EXTRA_END, _EXTRA_BUFFER, _EXTRA_SIZE = 0, 1, 2

KIND_NAMES: dict[int, str] = {
    int(_T.CU_GRAPH_NODE_TYPE_KERNEL): "kernel",
    int(_T.CU_GRAPH_NODE_TYPE_MEMCPY): "memcpy",
    int(_T.CU_GRAPH_NODE_TYPE_MEMSET): "memset",
    int(_T.CU_GRAPH_NODE_TYPE_HOST): "host",
    int(_T.CU_GRAPH_NODE_TYPE_GRAPH): "graph",
    int(_T.CU_GRAPH_NODE_TYPE_EMPTY): "empty",
    int(_T.CU_GRAPH_NODE_TYPE_WAIT_EVENT): "event_wait",
    int(_T.CU_GRAPH_NODE_TYPE_EVENT_RECORD): "event_record",
    int(_T.CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL): "ext_semas_signal",
    int(_T.CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT): "ext_semas_wait",
    int(_T.CU_GRAPH_NODE_TYPE_MEM_ALLOC): "mem_alloc",
    int(_T.CU_GRAPH_NODE_TYPE_MEM_FREE): "mem_free",
    int(_T.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP): "batch_mem_op",
    int(_T.CU_GRAPH_NODE_TYPE_CONDITIONAL): "conditional",
}


@dataclass(frozen=True)
class ParamInfo:
    """One kernel parameter in the device-side layout (``cuFuncGetParamInfo``).

    See Also
    --------
    cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    index: int
    offset: int
    size: int


@dataclass
class NodeInfo:
    """What every node has.

    Attributes
    ----------
    handle : CUgraphNode
    kind : str
        ``"kernel"``, ``"memcpy"``, ``"memset"``, ``"host"``, ``"graph"`` (child graph),
        ``"empty"``, ``"event_wait"``, ``"event_record"``, ``"mem_alloc"``, ``"mem_free"``,
        ``"conditional"``, or another name for types rawgraph does not decode.
    index : int
        Position in ``cuGraphGetNodes`` order within its graph.
    graph : int
        The graph holding the node (``0`` top level is not special: this is the handle).
    depth : int
        0 for nodes of the graph read, 1 inside a child graph or conditional body, ...
    dependencies : list of int
        Handles of the nodes this one waits for (same graph).
    edge_types : list of str
        ``"default"`` or ``"programmatic"`` per dependency.

    See Also
    --------
    cuGraphGetNodes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    handle: Any
    kind: str
    index: int
    graph: int
    depth: int
    dependencies: list[int] = field(default_factory=list)
    edge_types: list[str] = field(default_factory=list)

    @property
    def id(self) -> int:
        return int(self.handle)


@dataclass
class KernelInfo(NodeInfo):
    """A kernel node decoded generically.

    Attributes
    ----------
    function : int
        The ``CUfunction`` the node runs (resolved from ``kern`` with ``cuKernelGetFunction`` when
        the node names a ``CUkernel`` only).
    kern : int
        The node's ``CUkernel`` (0 when it names a ``CUfunction``).
    func_field : int
        The node's own ``func`` field as read (0 for library kernels named by ``kern``).
    name : str
        ``cuFuncGetName`` (mangled for C++ kernels), or ``""`` if the driver gave none.
    grid, block : tuple of int
    shared_mem : int
    ctx : int
    layout : list of ParamInfo or None
        ``None`` when ``cuFuncGetParamInfo`` is not available or failed: then the bytes cannot
        be split into parameters (see ``layout_error``).
    params : bytes or None
        The device-side parameter bytes (each parameter at its layout offset; padding zero).
    via : str
        ``"kernelParams"``, ``"extra"``, or ``"none"`` (not read).
    layout_error : str

    See Also
    --------
    cuKernelGetFunction : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html
    cuFuncGetName, cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    function: int = 0
    kern: int = 0
    func_field: int = 0
    name: str = ""
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_mem: int = 0
    ctx: int = 0
    layout: list[ParamInfo] | None = None
    params: bytes | None = None
    via: str = "none"
    layout_error: str = ""

    def param_bytes(self, index: int) -> bytes:
        """The bytes of parameter ``index`` (needs the layout)."""
        if self.layout is None or self.params is None:
            raise ValueError(f"kernel {self.name}: parameter layout unavailable ({self.layout_error})")
        p = self.layout[index]
        return self.params[p.offset : p.offset + p.size]

    def param_at(self, offset: int) -> ParamInfo | None:
        """The parameter whose bytes contain layout offset ``offset`` (None in padding or unknown)."""
        for p in self.layout or ():
            if p.offset <= offset < p.offset + p.size:
                return p
        return None


@dataclass
class MemcpyInfo(NodeInfo):
    """A memcpy node (``cuGraphMemcpyNodeGetParams``, a ``CUDA_MEMCPY3D``).

    ``src`` / ``dst`` are the start addresses including the X/Y/Z offsets: device (or unified)
    addresses when the memory type is ``device``/``unified``, host pointers for ``host``, 0 for
    arrays (``src_array`` / ``dst_array``). ``nbytes`` = width x height x planes (the copy's
    ``WidthInBytes``, ``Height``, ``Depth``; ``depth`` is the node's nesting depth, as for every node).

    See Also
    --------
    cuGraphMemcpyNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    src: int = 0
    dst: int = 0
    src_type: str = ""
    dst_type: str = ""
    width: int = 0
    height: int = 0
    planes: int = 0
    src_pitch: int = 0
    dst_pitch: int = 0
    src_height: int = 0  # rows per 2-D slice of each side (srcHeight / dstHeight), for 3-D copies
    dst_height: int = 0
    src_array: int = 0
    dst_array: int = 0

    @property
    def nbytes(self) -> int:
        return self.width * max(self.height, 1) * max(self.planes, 1)

    @property
    def direction(self) -> str:
        short = {"host": "H", "device": "D", "unified": "U", "array": "A"}
        return f"{short.get(self.src_type, '?')}to{short.get(self.dst_type, '?')}"


@dataclass
class MemsetInfo(NodeInfo):
    """A memset node: ``height`` rows of ``width`` elements of ``element_size`` bytes at ``dst``."""

    dst: int = 0
    value: int = 0
    element_size: int = 0
    width: int = 0
    height: int = 0
    pitch: int = 0

    @property
    def nbytes(self) -> int:
        return self.width * self.element_size * max(self.height, 1)


@dataclass
class HostInfo(NodeInfo):
    """A host node: the function pointer and its user data (``cuGraphHostNodeGetParams``).

    See Also
    --------
    cuGraphHostNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    fn: int = 0
    user_data: int = 0


@dataclass
class EventInfo(NodeInfo):
    """An event record or wait node (``cuGraphEventRecordNodeGetEvent`` / ``...WaitNodeGetEvent``).

    See Also
    --------
    cuGraphEventRecordNodeGetEvent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    event: int = 0


@dataclass
class ChildGraphInfo(NodeInfo):
    """A child graph node: the embedded graph (owned by the node) and its nodes, read recursively."""

    child: int = 0
    nodes: list[NodeInfo] = field(default_factory=list)


@dataclass
class MemAllocInfo(NodeInfo):
    """A memory allocation node: the address it returns (fixed for the graph) and its size."""

    dptr: int = 0
    bytesize: int = 0


@dataclass
class MemFreeInfo(NodeInfo):
    """A memory free node: the address it frees."""

    dptr: int = 0


@dataclass
class ConditionalInfo(NodeInfo):
    """A conditional node (``cuGraphNodeGetParams``): IF / WHILE / SWITCH, its handle, and the body
    graphs (one per branch), read recursively. ``error`` is set when the driver gave no params.

    See Also
    --------
    cuGraphNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    cond_type: str = ""
    cond_handle: int = 0
    size: int = 0
    bodies: list[int] = field(default_factory=list)
    body_nodes: list[list[NodeInfo]] = field(default_factory=list)
    error: str = ""


@dataclass
class EmptyInfo(NodeInfo):
    """An empty node (a join point)."""


@dataclass
class OtherNode(NodeInfo):
    """A node type rawgraph does not decode (external semaphores, batch memory ops, newer types)."""

    type_name: str = ""
    error: str = ""


# --------------------------------------------------------------------------------- helpers
def _int(value: Any) -> int:
    try:
        return int(value)
    except Exception:  # a handle object without __int__ (never seen; safe default)
        return 0


def _raw(fn: Any, *args: Any) -> tuple[Any, tuple[Any, ...]]:
    """Call a driver function; ``(err, values)`` with no raise (``err`` a name for a missing symbol)."""
    try:
        result = fn(*args)
    except RuntimeError as exc:  # "Function ... not found": the installed driver lacks the call
        return f"missing: {exc}", ()
    return result[0], tuple(result[1:])


def _memtype(params: Any, attr: str) -> str:
    try:
        return str(getattr(params, attr).name).replace("CU_MEMORYTYPE_", "").lower()
    except Exception:  # 0 or a value the enum does not know
        return ""


def read_layout(function: Any) -> tuple[list[ParamInfo] | None, str]:
    """The parameter layout of a function found in a graph
    (:func:`~rawgraph.runtime.module.read_param_layout`: ``cuFuncGetParamCount`` where the driver
    has it, then ``cuFuncGetParamInfo``), the answers meaning "this function has no layout" given as
    a reason.

    Returns
    -------
    (layout, error)
        ``layout`` is None (and ``error`` says why) when the call is missing or the driver has no
        layout for this function (``CUDA_ERROR_NOT_SUPPORTED``, ``..._INVALID_HANDLE``,
        ``..._NOT_FOUND``, ``..._NOT_PERMITTED``).

    Raises
    ------
    CudaError
        Any other failure (out of memory, no context, a dead context): a layout read then is
        not "unavailable", and a rebinder built on it would be blind to the node's pointers.

    See Also
    --------
    cuFuncGetParamCount, cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """
    fn = driver.CUfunction(_int(function)) if not isinstance(function, driver.CUfunction) else function
    try:
        read = read_param_layout(fn)
    except RuntimeError as exc:  # "Function ... not found": the installed driver lacks a call
        return None, f"layout calls missing: {exc}"
    if read.err in _NO_LAYOUT:
        return None, f"{read.call}({len(read.layout)}): {driver.CUresult(read.err).name}"
    if read.err != _SUCCESS:
        raise cuda_error(read.err, read.call)
    return [ParamInfo(i, offset, size) for i, (offset, size) in enumerate(read.layout)], ""


def function_name(function: Any) -> str:
    """``cuFuncGetName`` as text ("" when the driver has none: the call is missing, or answers
    ``CUDA_ERROR_INVALID_VALUE`` or one of :func:`read_layout`'s "unavailable" codes). Any other
    failure raises :class:`~rawgraph.runtime.errors.CudaError` (a kernel without its name would escape
    name-based checks such as ``AddressRebinder(expect_layouts=...)``).

    See Also
    --------
    cuFuncGetName : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """
    err, vals = _raw(driver.cuFuncGetName, driver.CUfunction(_int(function)))
    if isinstance(err, str) or err == _INVALID_VALUE or err in _NO_LAYOUT:
        return ""
    if err != _SUCCESS:
        raise cuda_error(err, "cuFuncGetName")
    if not vals:
        return ""
    name = vals[0]
    return name.decode(errors="replace") if isinstance(name, (bytes, bytearray)) else str(name)


def _extra_buffer(extra: int) -> tuple[int, int]:
    """The argument buffer and its size from a ``CU_LAUNCH_PARAM_*`` ``extra`` array."""
    buf, size = 0, 0
    for i in range(0, 32, 2):
        key = ctypes.c_void_p.from_address(extra + 8 * i).value or 0
        if key == _EXTRA_END:
            break
        val = ctypes.c_void_p.from_address(extra + 8 * (i + 1)).value or 0
        if key == _EXTRA_BUFFER:
            buf = val
        elif key == _EXTRA_SIZE and val:
            size = ctypes.c_size_t.from_address(val).value
    return buf, size


def pack_params(layout: list[ParamInfo], table: int) -> bytes:
    """The device-side parameter bytes read through a ``kernelParams`` table (one pointer per
    parameter, each to that parameter's value), every parameter at its layout offset."""
    blob = bytearray(max((p.offset + p.size for p in layout), default=0))
    for p in layout:
        slot = ctypes.c_void_p.from_address(table + 8 * p.index).value or 0
        if slot and p.size:
            blob[p.offset : p.offset + p.size] = ctypes.string_at(slot, p.size)
    return bytes(blob)


def _kernel(base: dict[str, Any], node: Any) -> KernelInfo:
    p = call(driver.cuGraphKernelNodeGetParams, node)
    func, kern = _int(p.func), _int(p.kern)
    function = func
    if not function and kern:
        # A library kernel (cuLibraryGetKernel): the node names the CUkernel; its CUfunction in the
        # current context carries the name and the parameter layout.
        err, vals = _raw(driver.cuKernelGetFunction, driver.CUkernel(kern))
        function = _int(vals[0]) if err == _SUCCESS and vals else 0
    info = KernelInfo(
        **base,
        function=function,
        kern=kern,
        func_field=func,
        grid=(int(p.gridDimX), int(p.gridDimY), int(p.gridDimZ)),
        block=(int(p.blockDimX), int(p.blockDimY), int(p.blockDimZ)),
        shared_mem=int(p.sharedMemBytes),
        ctx=_int(p.ctx),
    )
    if not function:
        info.layout_error = "no CUfunction (cuKernelGetFunction failed in this context)"
        return info
    info.name = function_name(function)
    info.layout, info.layout_error = read_layout(function)
    table, extra = _int(p.kernelParams), _int(p.extra)
    if table and info.layout is not None:
        info.params, info.via = pack_params(info.layout, table), "kernelParams"
    elif extra:
        buf, size = _extra_buffer(extra)
        if buf and size:
            info.params, info.via = ctypes.string_at(buf, size), "extra"
    elif table:
        info.layout_error = info.layout_error or "kernelParams set but no layout to read it with"
    elif info.layout == []:
        info.params, info.via = b"", "kernelParams"
    return info


def _memcpy(base: dict[str, Any], node: Any) -> MemcpyInfo:
    p = call(driver.cuGraphMemcpyNodeGetParams, node)
    st, dt = _memtype(p, "srcMemoryType"), _memtype(p, "dstMemoryType")

    def start(side: str, kind: str) -> int:
        if kind == "array":
            return 0
        addr = _int(getattr(p, f"{side}Host")) if kind == "host" else _int(getattr(p, f"{side}Device"))
        pitch, height = int(getattr(p, f"{side}Pitch")), int(getattr(p, f"{side}Height"))
        x, y, z = int(getattr(p, f"{side}XInBytes")), int(getattr(p, f"{side}Y")), int(getattr(p, f"{side}Z"))
        return addr + x + y * pitch + z * pitch * height if addr else 0

    return MemcpyInfo(
        **base,
        src=start("src", st),
        dst=start("dst", dt),
        src_type=st,
        dst_type=dt,
        width=int(p.WidthInBytes),
        height=int(p.Height),
        planes=int(p.Depth),
        src_pitch=int(p.srcPitch),
        dst_pitch=int(p.dstPitch),
        src_height=int(p.srcHeight),
        dst_height=int(p.dstHeight),
        src_array=_int(p.srcArray),
        dst_array=_int(p.dstArray),
    )


def _memset(base: dict[str, Any], node: Any) -> MemsetInfo:
    p = call(driver.cuGraphMemsetNodeGetParams, node)
    return MemsetInfo(
        **base,
        dst=_int(p.dst),
        value=int(p.value),
        element_size=int(p.elementSize),
        width=int(p.width),
        height=int(p.height),
        pitch=int(p.pitch),
    )


_COND_TYPES = {0: "IF", 1: "WHILE", 2: "SWITCH"}


def _conditional_ctypes(node: Any) -> tuple[str, int, int, list[int]] | str:
    """``cuGraphNodeGetParams`` straight from libcuda, for a binding that cannot reach it.

    ``CUgraphNodeParams``: type (4 bytes), 12 reserved, a 232-byte union, 8 reserved; its
    ``conditional`` member: handle (u64), type (u32), size (u32), phGraph_out (CUgraph*), ctx.
    Returns (type, handle, size, bodies), or why it could not be read."""
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuGraphNodeGetParams
    except (OSError, AttributeError):
        return "missing: libcuda exports no cuGraphNodeGetParams (it is newer than this driver)"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    buf = (ctypes.c_uint8 * 256)()
    rc = fn(_int(node), ctypes.addressof(buf))
    if rc != 0:
        return f"cuGraphNodeGetParams returned {driver.CUresult(rc).name}"
    raw = bytes(buf)
    handle = int.from_bytes(raw[16:24], "little")
    ctype = _COND_TYPES.get(int.from_bytes(raw[24:28], "little"), "?")
    size = int.from_bytes(raw[28:32], "little")
    arr = int.from_bytes(raw[32:40], "little")
    bodies = [ctypes.c_uint64.from_address(arr + 8 * i).value for i in range(size)] if arr else []
    return ctype, handle, size, bodies


def _conditional(base: dict[str, Any], node: Any, depth: int, seen: set[int]) -> ConditionalInfo:
    err, vals = _raw(driver.cuGraphNodeGetParams, node)
    if isinstance(err, str):  # the binding has no such function on this driver: ask libcuda itself
        got = _conditional_ctypes(node)
        if isinstance(got, str):
            return ConditionalInfo(**base, error=f"cuGraphNodeGetParams: {got}")
        ctype, handle, size, bodies = got
        info = ConditionalInfo(**base, cond_type=ctype, cond_handle=handle, size=size, bodies=bodies)
        info.body_nodes = [_read(driver.CUgraph(b), depth + 1, seen) if b else [] for b in bodies]
        return info
    if err != _SUCCESS or not vals:
        return ConditionalInfo(**base, error=f"cuGraphNodeGetParams: {driver.CUresult(err).name}")
    c = vals[0].conditional
    try:
        ctype = str(c.type.name).replace("CU_GRAPH_COND_TYPE_", "")
    except Exception:
        ctype = "?"
    size = int(c.size)
    bodies = [_int(b) for b in list(c.phGraph_out)[:size]]
    info = ConditionalInfo(**base, cond_type=ctype, cond_handle=_int(c.handle), size=size, bodies=bodies)
    info.body_nodes = [_read(driver.CUgraph(b), depth + 1, seen) if b else [] for b in bodies]
    return info


def _node(node: Any, index: int, graph: int, depth: int, seen: set[int]) -> NodeInfo:
    ntype = call(driver.cuGraphNodeGetType, node)
    kind = KIND_NAMES.get(
        int(ntype), str(getattr(ntype, "name", int(ntype))).replace("CU_GRAPH_NODE_TYPE_", "").lower()
    )
    base = {"handle": node, "kind": kind, "index": index, "graph": graph, "depth": depth}
    if kind == "kernel":
        return _kernel(base, node)
    if kind == "memcpy":
        return _memcpy(base, node)
    if kind == "memset":
        return _memset(base, node)
    if kind == "host":
        p = call(driver.cuGraphHostNodeGetParams, node)
        return HostInfo(**base, fn=_int(p.fn), user_data=_int(p.userData))
    if kind == "event_record":
        return EventInfo(**base, event=_int(call(driver.cuGraphEventRecordNodeGetEvent, node)))
    if kind == "event_wait":
        return EventInfo(**base, event=_int(call(driver.cuGraphEventWaitNodeGetEvent, node)))
    if kind == "graph":
        child = call(driver.cuGraphChildGraphNodeGetGraph, node)
        return ChildGraphInfo(**base, child=_int(child), nodes=_read(child, depth + 1, seen))
    if kind == "mem_alloc":
        p = call(driver.cuGraphMemAllocNodeGetParams, node)
        return MemAllocInfo(**base, dptr=_int(p.dptr), bytesize=int(p.bytesize))
    if kind == "mem_free":
        return MemFreeInfo(**base, dptr=_int(call(driver.cuGraphMemFreeNodeGetParams, node)))
    if kind == "conditional":
        return _conditional(base, node, depth, seen)
    if kind == "empty":
        return EmptyInfo(**base)
    return OtherNode(**base, type_name=str(getattr(ntype, "name", int(ntype))))


def graph_edges(graph: Any) -> list[tuple[int, int, str]]:
    """``(from, to, type)`` for every edge of a graph (``cuGraphGetEdges`` with edge data).

    See Also
    --------
    cuGraphGetEdges : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    _f, _t, _d, n = call(driver.cuGraphGetEdges, graph, 0)
    if not n:
        return []
    frm, to, data, _n = call(driver.cuGraphGetEdges, graph, n)
    kinds = {
        int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT): "default",
        int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC): "programmatic",
    }
    out = []
    for a, b, d in zip(frm, to, data):
        t = int(d.type) if d is not None else 0
        out.append((int(a), int(b), kinds.get(t, str(t))))
    return out


def _read(graph: Any, depth: int, seen: set[int]) -> list[NodeInfo]:
    g = graph if isinstance(graph, driver.CUgraph) else driver.CUgraph(_int(graph))
    gid = int(g)
    if gid in seen:  # a graph cannot contain itself; guards against a corrupt handle loop
        raise ValueError(f"graph 0x{gid:x} reached twice while reading nodes")
    seen.add(gid)
    _nodes, count = call(driver.cuGraphGetNodes, g, 0)
    handles = list(call(driver.cuGraphGetNodes, g, count)[0])[: int(count)] if count else []
    infos = [_node(h, i, gid, depth, seen) for i, h in enumerate(handles)]
    by_id = {i.id: i for i in infos}
    for a, b, kind in graph_edges(g):
        if b in by_id:
            by_id[b].dependencies.append(a)
            by_id[b].edge_types.append(kind)
    return infos


def read_graph(graph: Any) -> list[NodeInfo]:
    """Every node of ``graph`` decoded by type (child graphs and conditional bodies inside their
    node's ``nodes`` / ``body_nodes``).

    Parameters
    ----------
    graph : CUgraph, int, or an object with a ``handle`` (rawgraph Graph, adopted graph)
        Library kernel nodes are resolved with ``cuKernelGetFunction`` in the *current* context:
        make the graph's context current first (``Device.activate()``).

    Returns
    -------
    list of NodeInfo
        In ``cuGraphGetNodes`` order, each its type's dataclass.

    See Also
    --------
    cuKernelGetFunction : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html
    cuGraphGetNodes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    handle = getattr(graph, "handle", graph)
    return _read(handle, 0, set())


def walk(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """``nodes`` and, depth first, every node inside their child graphs and conditional bodies."""
    out: list[NodeInfo] = []
    for n in nodes:
        out.append(n)
        if isinstance(n, ChildGraphInfo):
            out += walk(n.nodes)
        elif isinstance(n, ConditionalInfo):
            for body in n.body_nodes:
                out += walk(body)
    return out


def describe(info: NodeInfo) -> str:
    """One line naming the node and its main fields (for reports and DOT labels)."""
    if isinstance(info, KernelInfo):
        return f"kernel {info.name or '?'} grid={info.grid} block={info.block} smem={info.shared_mem}"
    if isinstance(info, MemcpyInfo):
        return f"memcpy {info.direction} {info.nbytes} B 0x{info.src:x} -> 0x{info.dst:x}"
    if isinstance(info, MemsetInfo):
        return f"memset 0x{info.dst:x} = 0x{info.value:x} x{info.width}x{info.height} ({info.element_size} B)"
    if isinstance(info, HostInfo):
        return f"host fn=0x{info.fn:x}"
    if isinstance(info, EventInfo):
        return f"{info.kind} event=0x{info.event:x}"
    if isinstance(info, ChildGraphInfo):
        return f"child graph 0x{info.child:x} ({len(info.nodes)} nodes)"
    if isinstance(info, MemAllocInfo):
        return f"mem_alloc 0x{info.dptr:x} {info.bytesize} B"
    if isinstance(info, MemFreeInfo):
        return f"mem_free 0x{info.dptr:x}"
    if isinstance(info, ConditionalInfo):
        return f"conditional {info.cond_type or '?'} handle=0x{info.cond_handle:x} bodies={len(info.bodies)}"
    if isinstance(info, OtherNode):
        return f"{info.type_name}"
    return info.kind


__all__ = [
    "ChildGraphInfo",
    "ConditionalInfo",
    "EmptyInfo",
    "EventInfo",
    "HostInfo",
    "KernelInfo",
    "MemAllocInfo",
    "MemFreeInfo",
    "MemcpyInfo",
    "MemsetInfo",
    "NodeInfo",
    "OtherNode",
    "ParamInfo",
    "describe",
    "function_name",
    "graph_edges",
    "pack_params",
    "read_graph",
    "read_layout",
    "walk",
]
