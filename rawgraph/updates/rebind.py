"""Rebinding by address: move every pointer into one buffer to another buffer, in any graph's exec.

For a graph rawgraph did not build there is no node map saying which argument is ``x``. What there
is: every kernel node's parameter bytes and layout (:mod:`rawgraph.graphs.nodes`), and every memcpy /
memset node's addresses. :class:`AddressRebinder` scans them for values inside a buffer's address
range and moves each match by the same delta (``new + (value - old)``), so a pointer into the
middle of the buffer stays at the same offset in the new one.

Rules (each refused before the driver is called, with the reason):

* the range must match something (a buffer nothing points at is almost always the wrong buffer);
* the new buffer must be at least as large as the old range;
* the old and the new range must each lie inside one allocation (``cuMemGetAddressRange``): a
  range that runs past the end of its allocation would move pointers of a neighbour;
* device-side buffers the caller names (``device_buffers=``: e.g. a workspace holding pointers the
  kernels dereference) are scanned too; a pointer found there cannot be moved by parameter edits,
  so the rebind is refused. Nothing else in device memory can be seen: a pointer the kernel
  computes or keeps in a buffer not named is out of reach (see ``docs/semantics.md``).

A range that is only part of a larger allocation (a tensor of a pooled allocator) and is pointed
into at an interior offset raises :class:`InteriorPointerWarning`: the allocator may have given
that address to another tensor earlier in the capture, and its extent is not visible in the
parameters (the new buffer must then be as large as that tensor).

A match is *confirmed* when the 8-byte word lies inside one parameter of at least 8 bytes of a
known layout (``cuFuncGetParamInfo``); otherwise (a word across two parameters, in padding, or no
layout) a :class:`UnconfirmedMatchWarning` names it, and it is still moved.

The driver has no getter for an exec's parameters, so the rebinder keeps a copy of what every
node of the exec holds, in the shadow core (:mod:`rawgraph.updates.shadow`): a persistent
parameter buffer per kernel node (and the memcpy / memset parameters), edited in place and pushed
with ``cuGraphExecKernelNodeSetParams`` / ``cuGraphExecMemcpyNodeSetParams`` /
``cuGraphExecMemsetNodeSetParams``, changed nodes only, rolled back whole when one is refused.
The scanning itself (:func:`scan_words`, :func:`as_range`, allocation bounds, :class:`Match`) is
in :mod:`rawgraph.updates.addresses`.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np
from cuda.bindings import driver

from ..graphs.nodes import KernelInfo, MemcpyInfo, MemsetInfo, NodeInfo, read_graph, walk
from ..runtime.device import Device
from ..runtime.errors import ClosedError, call
from .addresses import WORD, Match, as_range, check_allocation, scan_words

# Re-exported: the rebinder's errors, warnings and scan results are part of its interface.
from .addresses import InteriorPointerWarning as InteriorPointerWarning
from .addresses import LayoutMismatchError as LayoutMismatchError
from .addresses import RebindError as RebindError
from .addresses import UnconfirmedMatchWarning as UnconfirmedMatchWarning
from .addresses import WordHit as WordHit
from .addresses import allocation_of as allocation_of
from .addresses import foreign_holders as foreign_holders
from .shadow import ExecShadow, KernelShadow
from .validate import BaseBinding

_memmove = ctypes.memmove


class _KernelState(KernelShadow):
    """What rawgraph knows the exec holds for one kernel node: its shadow (a persistent, editable
    copy of the parameter bytes, :class:`~rawgraph.updates.shadow.KernelShadow`), what it held at
    capture, and the same words as bytes (``held``): comparing and copying bytes objects costs
    tens of nanoseconds where NumPy calls on a 20-word array cost a microsecond each, and an
    apply runs once per replay."""

    info: KernelInfo
    node: int
    slot: int
    original: bytes  # the parameter bytes as captured
    words: np.ndarray  # the shadow's 8-byte words of the device-side layout, as the exec holds them
    original_words: np.ndarray  # as captured (read-only)
    held: bytes  # the same words as bytes
    original_blob: bytes

    @classmethod
    def of_bytes(cls, blob: bytes, offsets: Sequence[int] | None, fields: dict[str, Any]) -> _KernelState:
        """A node read from any graph: its parameter bytes, the offset of each parameter
        (``cuFuncGetParamInfo``; None: no layout, handed back through ``extra``) and the other
        fields of its ``CUDA_KERNEL_NODE_PARAMS`` (func, kern, ctx, grid, block, shared_mem)."""
        n = len(blob)
        storage = np.zeros(max(1, (n + WORD - 1) // WORD), dtype=np.uint64)
        storage.view(np.uint8)[:n] = np.frombuffer(blob, dtype=np.uint8)
        base = int(storage.ctypes.data)
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = fields["func"]
        p.kern = fields["kern"]
        p.ctx = fields["ctx"]
        p.gridDimX, p.gridDimY, p.gridDimZ = fields["grid"]
        p.blockDimX, p.blockDimY, p.blockDimZ = fields["block"]
        p.sharedMemBytes = fields["shared_mem"]
        refs: tuple[Any, ...]
        if offsets is not None:
            # kernelParams: one pointer per parameter into the persistent copy.
            table = np.array([base + o for o in offsets] or [0], dtype=np.uintp)
            p.kernelParams = int(table.ctypes.data)
            p.extra = 0
            refs = (table,)
        else:
            # No layout (an ``extra``-launched node): hand the whole buffer back the same way.
            size = ctypes.c_size_t(n)
            extra = np.array([1, base, 2, ctypes.addressof(size), 0], dtype=np.uintp)
            p.kernelParams = 0
            p.extra = int(extra.ctypes.data)
            refs = (size, extra)
        return cls(fields["handle"], p, storage, n, None, refs)

    @classmethod
    def of_info(cls, info: KernelInfo) -> _KernelState:
        assert info.params is not None
        offsets = None if info.layout is None else [q.offset for q in info.layout]
        st = cls.of_bytes(
            bytes(info.params),
            offsets,
            {
                "handle": info.handle,
                "func": info.func_field,
                "kern": info.kern,
                "ctx": info.ctx,
                "grid": info.grid,
                "block": info.block,
                "shared_mem": info.shared_mem,
            },
        )
        assert isinstance(st, cls)
        st.info, st.node = info, info.id
        st.original = bytes(info.params)
        st.words = st.storage
        st.original_words = st.storage.copy()
        st.original_words.setflags(write=False)
        st.held = st.original_blob = st.original_words.tobytes()
        return st

    def write(self, blob: bytes) -> bytes | None:
        """Put ``blob`` (the whole layout) into the shadow; returns what it held (None: the same)."""
        before = self.held
        if blob == before:
            return None
        if len(blob) != len(before):  # a binding not made by prepare(): never write past the buffer
            raise RebindError(
                f"node {self.info.index} ({self.info.name}): {len(blob)} parameter bytes given, its "
                f"layout holds {len(before)}"
            )
        _memmove(self.address, blob, len(blob))
        self.held = blob
        return before

    def restore(self, before: bytes) -> None:
        _memmove(self.address, before, len(before))
        self.held = before

    def moved(self) -> bool:
        return self.held != self.original_blob


# What a memory node held before a write: (addresses, srcDevice, dstDevice) of a memcpy, (addresses, dst)
# of a memset.
_Before: TypeAlias = "tuple[dict[str, int], int, int] | tuple[dict[str, int], int]"


class _MemState:
    """A memcpy / memset node: the parameters read from the graph (edited in place) and the
    addresses the exec holds now and held at capture."""

    slot: int

    def __init__(self, info: NodeInfo, params: Any):
        self.info = info
        self.params = params
        self.node = info.id
        if isinstance(info, MemcpyInfo):
            self.original = {"src": info.src, "dst": info.dst}
        else:
            assert isinstance(info, MemsetInfo)
            self.original = {"dst": info.dst}
        self.current = dict(self.original)

    def write(self, sides: dict[str, int]) -> _Before | None:
        """Move the node's addresses to ``sides`` in its parameters; returns what they were."""
        want = dict(self.current)
        want.update(sides)
        if want == self.current:
            return None
        p = self.params
        before: _Before
        if isinstance(self.info, MemcpyInfo):
            before = (self.current, int(p.srcDevice), int(p.dstDevice))
            # The start address is base + X/Y/Z offsets: move the base by the start's delta.
            p.srcDevice = before[1] + (want["src"] - self.current["src"])
            p.dstDevice = before[2] + (want["dst"] - self.current["dst"])
        else:
            before = (self.current, int(p.dst))
            p.dst = want["dst"]
        self.current = want
        return before

    def restore(self, before: _Before) -> None:
        if len(before) == 3:  # a memcpy's (write's shape for this node's kind)
            self.current, self.params.srcDevice, self.params.dstDevice = before
        else:
            self.current, self.params.dst = before

    def moved(self) -> bool:
        return self.current != self.original


def _undo(log: list[tuple[Any, Any]]) -> None:
    """Undo of a refused push: every node state edited gets what it held back."""
    for st, before in reversed(log):
        st.restore(before)


def _side(kind: str) -> str:
    """The address a memory match names: ``memcpy.src`` -> ``src``; ``memcpy.dst`` and ``memset`` -> ``dst``."""
    return "src" if kind == "memcpy.src" else "dst"


class AddressBinding(BaseBinding):
    """A prepared, complete assignment for an exec (see :meth:`AddressRebinder.prepare`).

    ``kernels``: node id -> the whole parameter layout as 8-byte words; ``memory``: node id ->
    its addresses. Nodes not named hold their captured values once the binding is applied.
    ``moves``: (old base, size, new base) relative to the captured graph; ``owner``: the token of
    the rebinder that prepared it (its node ids name that rebinder's exec); ``holds``: the new
    buffers' objects (the binding keeps them alive, the rebinder while bound).
    """

    __slots__ = ("kernels", "memory", "moves", "blobs", "nodes")

    kernels: dict[int, np.ndarray]
    memory: dict[int, dict[str, int]]
    moves: tuple[tuple[int, int, int], ...]
    blobs: dict[int, bytes]
    nodes: frozenset[int]

    def __init__(
        self,
        kernels: dict[int, np.ndarray],
        memory: dict[int, dict[str, int]],
        moves: tuple[tuple[int, int, int], ...],
        owner: object = None,
        holds: tuple[Any, ...] = (),
    ):
        super().__init__(owner, holds)
        self.kernels = kernels
        self.memory = memory
        self.moves = moves
        # Fixed once prepared: apply pushes these bytes, so the arrays must not change under them.
        for words in kernels.values():
            words.setflags(write=False)
        self.blobs = {node: words.tobytes() for node, words in kernels.items()}  # what apply pushes
        self.nodes = frozenset(kernels) | frozenset(memory)  # every node it names

    def __repr__(self) -> str:
        return f"AddressBinding({len(self.kernels)} kernel nodes, {len(self.memory)} memory nodes, moves={self.moves})"


def __getattr__(name: str) -> Any:
    # ``rawgraph.updates.rebind.Binding``, this module's old name for AddressBinding, still resolves
    # (with a warning) without a module attribute that would shadow ``rawgraph.Binding``.
    if name == "Binding":
        warnings.warn(
            "rawgraph.updates.rebind.Binding is deprecated: it is AddressBinding", DeprecationWarning, stacklevel=2
        )
        return AddressBinding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AddressRebinder:
    """Find and move addresses in a graph's exec (any graph: rawgraph's, PyTorch's, CuPy's).

    Parameters
    ----------
    graph : Graph, AdoptedGraph, CUgraph or int
        The graph ``exec`` was instantiated from (node handles name its nodes).
    exec : GraphExec, CUgraphExec or int
        The exec to update. It must hold the graph's parameters when the rebinder is made (just
        instantiated, or updated only through this rebinder since): execs cannot be read back.
    expect_layouts : dict of kernel name -> list of (offset, size), optional
        Layouts the caller's own description of these kernels gives; a kernel whose
        ``cuFuncGetParamInfo`` layout differs makes construction fail (:class:`LayoutMismatchError`).
    device : Device, optional
        Its context is made current (library kernels are resolved in it) and used for memory
        nodes' updates; default the current rawgraph device.
    own_exec : bool, default False
        Close ``exec`` in :meth:`close` (what :meth:`AdoptedGraph.rebinder` asks for).

    See Also
    --------
    cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html

    Notes
    -----
    Ownership rules, the manager's:

    * a closed rebinder, or one whose :class:`~rawgraph.graphs.graph.GraphExec` or
      :class:`~rawgraph.graphs.graph.Graph` was closed, refuses every operation with
      :class:`~rawgraph.runtime.errors.ClosedError` before any driver call (a destroyed handle can be
      reused by the next exec: a SetParams on it would rewrite another graph). Raw handles
      (``CUgraphExec``, ``int``) cannot be checked: their owner must outlive the rebinder;
    * the objects passed as ``new`` (a torch tensor, a CuPy array, a rawgraph buffer) are held
      while the exec points into them, then until the replays queued before they were moved away
      have run (:class:`~rawgraph.graphs.keepalive.KeepAlive` over the streams the exec was launched on:
      ``exec.streams`` of a GraphExec, else the streams :meth:`launch` was given). A base address
      given as an ``int`` holds nothing;
    * one thread at a time: every operation holds the rebinder's lock.

    Raises
    ------
    LayoutMismatchError

    State: 21 instance attributes: the graph, exec and device it rebinds, the node map read back
    (kernels, memory nodes, unreadable and nested ones), the exec's shadow with its streams and
    keep-alive, the buffers moved in and the binding applied last (what the exec may point into now),
    the nodes whose values differ from the captured ones, and the lock. What needs releasing is in
    one holder, the shadow's keep-alive, which :meth:`close` drains.
    """

    device: Device
    graph: Any  # a Graph, or a raw CUgraph
    exec: Any  # a GraphExec, or a raw CUgraphExec
    nodes: list[NodeInfo]

    def __init__(
        self,
        graph: Any,
        exec: Any,
        expect_layouts: dict[str, Sequence[tuple[int, int]]] | None = None,
        device: Any = None,
        own_exec: bool = False,
    ):
        from ..runtime.device import get_device

        # Liveness of what the driver calls name (rawgraph owners only: raw handles carry none).
        self._alive = tuple(
            f for f in (getattr(exec, "_finalizer", None), getattr(graph, "_finalizer", None)) if f is not None
        )
        self._closed = False
        self._own_exec = own_exec
        self._lock = threading.RLock()
        self._check_usable()
        self.device = (device or getattr(graph, "device", None) or get_device()).activate()
        self.graph = graph
        self.exec = exec
        # The exec's shadow (rawgraph.updates.shadow): every kernel, memcpy and memset node's
        # parameters as the exec holds them, the streams it was launched on (exec.streams of a
        # GraphExec, else those launch() was given) and the keep-alive over them.
        self._shadow = shadow = ExecShadow(exec, self.device)
        self._exec_handle = shadow.handle
        self._streams = shadow.streams
        self._keep = shadow.keep
        # Objects the exec may point into now: (base, size, object) of each rebind's new buffer,
        # and the objects of the binding applied last.
        self._rebound: list[tuple[int, int, Any]] = []
        self._applied: tuple[Any, ...] = ()
        self.nodes = read_graph(graph)
        self.kernels: dict[int, _KernelState] = {}
        self.memory: dict[int, _MemState] = {}
        self.unreadable: list[KernelInfo] = []
        self._token = object()  # names this rebinder in its Bindings (an id() can be reused)
        self._dirty: set[int] = set()  # nodes whose exec values differ from the captured ones
        self._last_alloc: tuple[int, int] | None = None  # allocation of the last range checked
        self._shadow_nodes(shadow)
        self._nested = [n for n in walk(self.nodes) if n.depth > 0]
        if self.unreadable:
            names = ", ".join(
                f"{i.index}:{i.name or '?'} ({i.layout_error or 'no parameter bytes'})" for i in self.unreadable[:4]
            )
            warnings.warn(
                f"rawgraph: the parameters of {len(self.unreadable)} kernel node(s) could not be read "
                f"({names}): addresses there can be neither found nor moved",
                UnconfirmedMatchWarning,
                stacklevel=2,
            )
        if expect_layouts:
            self.check_layouts(expect_layouts)

    def _shadow_nodes(self, shadow: ExecShadow) -> None:
        """Read every kernel, memcpy and memset node's parameters (``cuGraphMemcpyNodeGetParams``,
        ``cuGraphMemsetNodeGetParams``; a kernel's come with the node map) into :attr:`kernels`
        and :attr:`memory`, each with its slot in the exec's shadow; a kernel whose parameters
        could not be read goes to :attr:`unreadable` instead.

        See Also
        --------
        cuGraphMemcpyNodeGetParams, cuGraphMemsetNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        for info in self.nodes:
            if isinstance(info, KernelInfo):
                if info.params is None:
                    self.unreadable.append(info)
                    continue
                st = self.kernels[info.id] = _KernelState.of_info(info)
                st.slot = shadow.add_kernel(st, info.name)
            elif isinstance(info, MemcpyInfo):
                ms = self.memory[info.id] = _MemState(info, call(driver.cuGraphMemcpyNodeGetParams, info.handle))
                ms.slot = shadow.add(
                    info.handle, ms.params, setter=(self._set_memcpy, "cuGraphExecMemcpyNodeSetParams")
                )
            elif isinstance(info, MemsetInfo):
                ms = self.memory[info.id] = _MemState(info, call(driver.cuGraphMemsetNodeGetParams, info.handle))
                ms.slot = shadow.add(
                    info.handle, ms.params, setter=(self._set_memset, "cuGraphExecMemsetNodeSetParams")
                )

    # -- ownership ----------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("AddressRebinder is closed")
        for f in self._alive:
            if not f.alive:
                raise ClosedError("the GraphExec or Graph this rebinder updates is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pushes(self) -> int:
        """SetParams calls that took (kernel and memory nodes; the shadow's count)."""
        return self._shadow.pushes

    def _set_memcpy(self, exe: Any, node: Any, params: Any) -> Any:
        return driver.cuGraphExecMemcpyNodeSetParams(exe, node, params, self.device.context)

    def _set_memset(self, exe: Any, node: Any, params: Any) -> Any:
        return driver.cuGraphExecMemsetNodeSetParams(exe, node, params, self.device.context)

    @property
    def retained(self) -> list[Any]:
        """Objects moved away from but held for replays that may still read them."""
        return self._keep.retained

    def collect(self) -> int:
        """Release moved-away objects whose replays have finished (``cuEventRecord`` /
        ``cuEventQuery`` per stream); returns how many are still held.

        See Also
        --------
        cuEventRecord, cuEventQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        with self._lock:
            return self._keep.collect()

    def close(self) -> None:
        """Wait for the queued replays that may read a moved-away buffer, then let go of every
        held object (``cuEventRecord`` + ``cuEventSynchronize`` per stream); the exec too when the
        rebinder owns it. Later operations raise :class:`ClosedError`. Safe twice; a failed wait
        keeps the objects and warns (:class:`~rawgraph.runtime.errors.ReleaseWarning`).

        See Also
        --------
        cuEventRecord, cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._keep.close()
            self._rebound, self._applied = [], ()
            if self._own_exec and hasattr(self.exec, "close"):
                self.exec.close()

    def __enter__(self) -> AddressRebinder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _still_pointed_at(self, lo: int, size: int) -> bool:
        """Whether any node value the exec holds now lies in ``[lo, lo + size)``."""
        hi = lo + size
        for st in self.kernels.values():
            if scan_words(st.current(), st.info.layout, lo, hi):
                return True
        return any(lo <= v < hi for ms in self.memory.values() for v in ms.current.values())

    # -- inspection ---------------------------------------------------------------------------
    def check_layouts(self, expect: dict[str, Sequence[tuple[int, int]]]) -> None:
        """Refuse (:class:`LayoutMismatchError`) when a kernel named in ``expect`` has another
        parameter layout than given (``(offset, size)`` per parameter)."""
        for info in walk(self.nodes):
            if not isinstance(info, KernelInfo) or info.name not in expect:
                continue
            want = [(int(o), int(s)) for o, s in expect[info.name]]
            have = None if info.layout is None else [(p.offset, p.size) for p in info.layout]
            if have != want:
                raise LayoutMismatchError(
                    f"node {info.index} ({info.name}): the driver's parameter layout is {have}, expected {want}; "
                    f"rebinding by address would edit the wrong bytes"
                )

    def _kernel_matches(self, info: KernelInfo, blob: bytes, lo: int, hi: int, reachable: bool) -> list[Match]:
        return [
            Match(
                info.id,
                info.index,
                "kernel",
                info.name,
                h.param,
                h.offset,
                h.layout_offset,
                h.value,
                h.confirmed,
                reachable,
            )
            for h in scan_words(blob, info.layout, lo, hi)
        ]

    def _memory_matches(
        self, info: NodeInfo, lo: int, hi: int, reachable: bool, addresses: dict[str, int] | None = None
    ) -> list[Match]:
        """Matches of a memcpy / memset node; ``addresses`` overrides the ones read from the graph
        (what the exec holds now, or held at capture)."""
        out = []
        if isinstance(info, MemcpyInfo):
            addr = addresses or {"src": info.src, "dst": info.dst}
            for side, kind in (("src", info.src_type), ("dst", info.dst_type)):
                if kind in ("device", "unified") and lo <= addr[side] < hi:
                    out.append(
                        Match(info.id, info.index, f"memcpy.{side}", "", None, 0, 0, addr[side], True, reachable)
                    )
        elif isinstance(info, MemsetInfo):
            dst = (addresses or {"dst": info.dst})["dst"]
            if lo <= dst < hi:
                out.append(Match(info.id, info.index, "memset", "", None, 0, 0, dst, True, reachable))
        return out

    def find(self, buffer: Any, warn: bool = True) -> list[Match]:
        """Every place the exec holds an address in ``buffer``'s range (what a rebind would move).

        Parameters
        ----------
        buffer : (ptr, nbytes), rawgraph buffer/array, torch tensor, CuPy array
        warn : bool
            Emit :class:`UnconfirmedMatchWarning` for matches the layout cannot confirm.
        """
        self._check_usable()
        lo, size = as_range(buffer)
        hi = lo + size
        out: list[Match] = []
        for info in self.nodes:
            if info.id in self.kernels:
                assert isinstance(info, KernelInfo)
                out += self._kernel_matches(info, self.kernels[info.id].current(), lo, hi, True)
            elif info.id in self.memory:
                st = self.memory[info.id]
                out += self._memory_matches(st.info, lo, hi, True, st.current)
        for info in self._nested:  # read only: exec updates cannot reach them
            if isinstance(info, KernelInfo) and info.params is not None:
                out += self._kernel_matches(info, info.params, lo, hi, False)
            else:
                out += self._memory_matches(info, lo, hi, False)
        if warn:
            for m in out:
                if not m.confirmed:
                    warnings.warn(
                        f"rawgraph: match not confirmed by the parameter layout: {m}",
                        UnconfirmedMatchWarning,
                        stacklevel=2,
                    )
        return out

    @staticmethod
    def scan_device_buffers(buffers: Iterable[Any], buffer: Any) -> list[tuple[int, int, int]]:
        """Pointers into ``buffer``'s range stored in device memory: ``(buffer index, byte offset,
        value)`` for every 8-byte-aligned word of each of ``buffers`` (copied to the host with
        ``cuMemcpyDtoH``; synchronous). Parameter edits cannot move these.

        See Also
        --------
        cuMemcpyDtoH : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        lo, size = as_range(buffer)
        hits = []
        for i, b in enumerate(buffers):
            base, n = as_range(b)
            host = np.zeros(n // WORD, dtype="<u8")
            if host.size:
                call(driver.cuMemcpyDtoH, host.ctypes.data, driver.CUdeviceptr(base), host.size * WORD)
            for j in np.nonzero((host >= np.uint64(lo)) & (host < np.uint64(lo + size)))[0].tolist():
                hits.append((i, j * WORD, int(host[j])))
        return hits

    # -- rebinding ----------------------------------------------------------------------------
    @staticmethod
    def _warn_interior(lo: int, size: int, alloc: tuple[int, int] | None, values: Iterable[int]) -> None:
        if alloc is None or alloc == (lo, size):
            return  # a whole allocation: a pointer into its middle is that buffer at an offset
        inner = sorted({v - lo for v in values if v != lo})
        if inner:
            warnings.warn(
                f"rawgraph: [0x{lo:x}, +{size}) is part of a larger allocation [0x{alloc[0]:x}, +{alloc[1]}) and the "
                f"exec holds pointers into its middle (offsets {inner[:8]}): if another tensor of the pool once "
                f"started there, it moves too",
                InteriorPointerWarning,
                stacklevel=3,
            )

    def _check_move(self, old: tuple[int, int], new: Any, device_buffers: Iterable[Any] = ()) -> tuple[int, int, int]:
        lo, size = old
        nb, nsize = as_range(new) if not isinstance(new, int) else (int(new), size)
        if nsize < size:
            raise RebindError(
                f"the new buffer holds {nsize} bytes, the range moved {size}: pointers at its end would land outside it"
            )
        self._last_alloc = check_allocation(lo, size, "old range")
        check_allocation(nb, size, "new range")
        hits = self.scan_device_buffers(device_buffers, old) if device_buffers else []
        if hits:
            i, off, val = hits[0]
            raise RebindError(
                f"device buffer {i} holds a pointer into the range at byte {off} (0x{val:x}): kernels "
                f"read it from device memory, which rebinding parameters cannot reach "
                f"({len(hits)} such word(s))"
            )
        return lo, size, nb

    def move(self, old: Any, new: Any, device_buffers: Iterable[Any] = ()) -> list[Match]:
        """Move every address in ``old``'s range to the same offset in ``new`` and push the changed
        nodes (``cuGraphExecKernelNodeSetParams`` / ``cuGraphExecMemcpyNodeSetParams`` /
        ``cuGraphExecMemsetNodeSetParams``).

        Parameters
        ----------
        old : range-like
            The range as the exec holds it now (after earlier rebinds).
        new : range-like or int
            The new buffer (or its base address: then taken as large as ``old``).
        device_buffers : iterable of range-like
            Device memory the kernels read pointers from (workspaces); scanned first.

        Returns
        -------
        list of Match
            What was moved (values before the move).

        Raises
        ------
        RebindError
            Nothing matches, the new buffer is smaller, a range crosses its allocation's end, a match
            is inside a child graph / conditional body, or a device buffer holds a pointer into it.

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        cuGraphExecMemcpyNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        cuGraphExecMemsetNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        with self._lock:
            return self._move(old, new, device_buffers)

    def rebind(self, old: Any, new: Any, device_buffers: Iterable[Any] = ()) -> list[Match]:
        """Deprecated name of :meth:`move` (``ExecUpdateManager.rebind`` moves bindings by array and
        returns a count; this moves an address range and returns the matches)."""
        warnings.warn(
            "AddressRebinder.rebind is deprecated: use AddressRebinder.move", DeprecationWarning, stacklevel=2
        )
        return self.move(old, new, device_buffers)

    def _move(self, old: Any, new: Any, device_buffers: Iterable[Any]) -> list[Match]:
        self._check_usable()
        self.device.ensure_current()  # the allocation checks need a context on this thread
        lo, size = as_range(old)
        lo, size, nb = self._check_move((lo, size), new, device_buffers)
        matches = self.find((lo, size))
        if not matches:
            raise RebindError(
                f"no kernel parameter, memcpy or memset of this exec holds an address in "
                f"[0x{lo:x}, +{size}): nothing to rebind (wrong buffer, or one the kernels "
                f"reach another way)"
            )
        unreachable = [m for m in matches if not m.reachable]
        if unreachable:
            raise RebindError(
                f"{unreachable[0]} is inside a child graph or conditional body: exec updates "
                f"cannot reach it ({len(unreachable)} such match(es))"
            )
        self._warn_interior(lo, size, self._last_alloc, (m.value for m in matches))
        delta = nb - lo
        kernels: dict[int, np.ndarray] = {}
        memory: dict[int, dict[str, int]] = {}
        for m in matches:
            if m.node in self.kernels:
                words = kernels.setdefault(m.node, self.kernels[m.node].words.copy())
                words[m.layout_offset // WORD] = np.uint64(m.value + delta)
            else:
                memory.setdefault(m.node, dict(self.memory[m.node].current))[_side(m.kind)] = m.value + delta
        self._push(kernels, memory, restore_others=False)
        # Hold the new buffer; let go (after the queued replays) of whatever nothing points into now.
        if not isinstance(new, int):
            self._rebound.append((nb, size, new))
        self._release_unpointed()
        return matches

    def _release_unpointed(self) -> None:
        keep: list[tuple[int, int, Any]] = []
        gone: list[tuple[int, int, Any]] = []
        for entry in self._rebound:
            (keep if self._still_pointed_at(entry[0], entry[1]) else gone).append(entry)
        self._rebound = keep
        self._keep.retire_all(e[2] for e in gone)

    def prepare(self, moves: dict[Any, Any] | Sequence[tuple[Any, Any]]) -> AddressBinding:
        """A complete assignment relative to the *captured* graph: each ``old`` range (as captured)
        goes to its ``new`` buffer (range-like or base address); every range not named holds its
        captured address once the binding is applied.

        Checked once here (the same rules as :meth:`rebind`: a range that a child graph or a
        conditional body points into is refused, exec updates cannot reach it); :meth:`apply` then
        only writes words and pushes the nodes whose values differ from what the exec holds. The
        binding holds the new buffers' objects.

        Raises
        ------
        RebindError
            As :meth:`rebind`.
        ClosedError
            The rebinder, its exec or graph is closed.
        """
        with self._lock:
            return self._prepare(moves)

    def _prepare(self, moves: dict[Any, Any] | Sequence[tuple[Any, Any]]) -> AddressBinding:
        self._check_usable()
        self.device.ensure_current()  # the allocation checks need a context on this thread
        items = list(moves.items()) if isinstance(moves, dict) else list(moves)
        kernels: dict[int, np.ndarray] = {}
        memory: dict[int, dict[str, int]] = {}
        done = []
        for old, new in items:
            lo, size = as_range(old)
            lo, size, nb = self._check_move((lo, size), new)
            hi, delta, found = lo + size, nb - lo, 0
            alloc, values = self._last_alloc, []
            for node, st in self.kernels.items():
                for h in scan_words(st.original, st.info.layout, lo, hi):
                    values.append(h.value)
                    words = kernels.setdefault(node, st.original_words.copy())
                    words[h.layout_offset // WORD] = np.uint64(h.value + delta)
                    found += 1
            for node, ms in self.memory.items():
                for m in self._memory_matches(ms.info, lo, hi, True, ms.original):
                    memory.setdefault(node, dict(ms.original))[_side(m.kind)] = m.value + delta
                    found += 1
            if not found:
                raise RebindError(
                    f"nothing in the captured graph holds an address in [0x{lo:x}, +{size}): nothing to rebind"
                )
            nested = self._nested_matches(lo, hi)
            if nested:
                raise RebindError(
                    f"{nested[0]} is inside a child graph or conditional body: exec updates "
                    f"cannot reach it ({len(nested)} such match(es))"
                )
            self._warn_interior(lo, size, alloc, values)
            done.append((lo, size, nb))
        holds = tuple(new for _, new in items if not isinstance(new, int))
        return AddressBinding(kernels, memory, tuple(done), self._token, holds)

    def _nested_matches(self, lo: int, hi: int) -> list[Match]:
        """Matches in child graphs and conditional bodies (as captured: updates never reach them)."""
        out: list[Match] = []
        for info in self._nested:
            if isinstance(info, KernelInfo) and info.params is not None:
                out += self._kernel_matches(info, info.params, lo, hi, False)
            else:
                out += self._memory_matches(info, lo, hi, False)
        return out

    def apply(self, binding: AddressBinding) -> None:
        """Write a prepared binding into the exec: its nodes get its values, nodes an earlier
        rebind changed and this binding does not name go back to their captured values; only
        nodes whose values change are pushed."""
        with self._lock:
            self._check_usable()
            if binding.owner is not self._token:
                raise RebindError(
                    "this binding was prepared by another AddressRebinder: its node ids and captured "
                    "values belong to that rebinder's graph and exec"
                )
            if not binding.is_open():
                raise ClosedError("a buffer of this binding was closed after it was prepared")
            self._push(binding.kernels, binding.memory, restore_others=True, blobs=binding.blobs, named=binding.nodes)
            # Every range now holds the binding's address or its captured one: what earlier
            # rebinds and bindings moved in is no longer pointed at (unless named again).
            now = binding.holds
            if self._applied is not now or self._rebound:
                keep_ids = {id(o) for o in now}
                gone = [o for o in self._applied if id(o) not in keep_ids]
                gone += [o for _, _, o in self._rebound if id(o) not in keep_ids]
                self._applied, self._rebound = now, []
                self._keep.retire_all(gone)

    def _push(
        self,
        kernels: dict[int, np.ndarray],
        memory: dict[int, dict[str, int]],
        restore_others: bool,
        blobs: dict[int, bytes] | None = None,
        named: frozenset[int] | None = None,
    ) -> None:
        """Write the new values into the node states and push the changed ones through the shadow
        (a push refused half-way puts every node this call changed back: the exec runs all of
        its old bindings, never a mix)."""
        if blobs is None:
            blobs = {node: words.tobytes() for node, words in kernels.items()}
        todo: list[tuple[Any, Any]] = []  # (node state, what to give it), in push order
        if restore_others and self._dirty:
            for node in self._dirty - (named if named is not None else (blobs.keys() | memory.keys())):
                if node in self.kernels:
                    todo.append((self.kernels[node], self.kernels[node].original_blob))
                else:
                    todo.append((self.memory[node], self.memory[node].original))
        todo += [(self.kernels[node], blob) for node, blob in blobs.items()]
        todo += [(self.memory[node], sides) for node, sides in memory.items()]
        log: list[tuple[Any, Any]] = []  # (node state, what it held before this call)
        slots: list[int] = []
        try:
            for st, value in todo:
                before = st.write(value)
                if before is not None:
                    log.append((st, before))
                    slots.append(st.slot)
        except BaseException:
            _undo(log)  # a refused write (a forged binding): nothing was pushed yet
            raise
        self._shadow.push(slots, _undo, log)
        for st, _before in log:
            if st.moved():
                self._dirty.add(st.node)
            else:
                self._dirty.discard(st.node)

    def held(self, node: Any) -> bytes:
        """The parameter bytes rawgraph pushed to (or found in) the exec for a kernel node: the
        exec itself cannot be read back."""
        self._check_usable()
        return self.kernels[int(node)].current()

    def launch(self, stream: Any) -> None:
        """``cuGraphLaunch`` of the exec on ``stream`` (noted, so buffers moved away later stay
        alive until this replay has run).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_usable()
        if hasattr(self.exec, "launch"):
            self.exec.launch(stream)  # notes the stream in exec.streams (our StreamSet)
            return
        from ..runtime.stream import as_stream

        s = as_stream(stream)
        call(driver.cuGraphLaunch, self._exec_handle, s.handle)
        self._shadow.note(s)
