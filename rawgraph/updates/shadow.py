"""The kernel-parameter rebinding of one exec, top to bottom.

The driver has no getter for an exec's node parameters, so every update path keeps its own copy
of them, the *shadow*, and changes the exec only through it:

1. where a node's parameters live (:class:`KernelShadow`): a persistent, packed argument buffer
   and the ``CUDA_KERNEL_NODE_PARAMS`` whose ``kernelParams`` point into it, built once from the
   capture's node map and edited in place;
2. which words a bind changes (:class:`ArgumentSlots`): per bindable name the 8-byte argument
   words its pointer goes to, per node those words in one fixed order, and what a prepared set of
   pointers writes into each node (:class:`NodeWrite`);
3. the push (:meth:`ExecShadow.push`): ``cuGraphExecKernelNodeSetParams`` for the nodes whose
   shadow changed, nothing else; the one push loop of the package, every update path calls it;
4. the rollback (:meth:`ExecShadow.roll_back`): when the driver refuses the k-th push, the
   owner's undo puts the shadow back and the k-1 nodes the driver took are pushed again, so the
   exec runs all of its old values, never a mix;
5. the keep-alive (``ExecShadow.keep``, :class:`~rawgraph.graphs.keepalive.KeepAlive` over the
   streams the exec was launched on): an object the exec was moved away from is held until the
   replays queued before the move have run.

The core takes no lock: each owner (manager, rebinder, re-shaped graph, slot pool, indirect graph)
holds its own lock around every call that edits the shadow and pushes. What a bind refuses before
anything here changes is in :mod:`rawgraph.updates.validate`; the owner of rawgraph's own graphs is
:class:`~rawgraph.updates.manager.ExecUpdateManager`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from cuda.bindings import driver

from ..graphs.keepalive import KeepAlive
from ..runtime.device import Device, _here
from ..runtime.errors import DeviceUpdatableError, cuda_error
from ..runtime.launch import KernelArgs
from ..runtime.stream import StreamSet

_SUCCESS = driver.CUresult.CUDA_SUCCESS
WORD = 8
_SETPARAMS = "cuGraphExecKernelNodeSetParams"


class KernelShadow:
    """One kernel node's persistent parameters: a packed argument buffer (``storage``, 8-byte
    words) and the ``CUDA_KERNEL_NODE_PARAMS`` (``params``) whose ``kernelParams`` point into it.
    Built once; the owner edits the buffer (and the grid) in place before a push. The driver
    copies the values during the SetParams call; the buffer stays for the next edit.

    ``handle``: the node; ``address``, ``size``: where the argument bytes lie and how many there
    are; ``args``: the named arguments (:meth:`of_launch`), None for a node read back from any
    graph (:mod:`rawgraph.updates.rebind`).
    """

    __slots__ = ("handle", "params", "storage", "address", "size", "args", "_refs")

    def __init__(
        self,
        handle: Any,
        params: Any,
        storage: np.ndarray,
        size: int,
        args: KernelArgs | None = None,
        refs: tuple[Any, ...] = (),
    ):
        self.handle: Any = handle  # driver.CUgraphNode
        self.params: Any = params  # driver.CUDA_KERNEL_NODE_PARAMS
        self.storage: np.ndarray = storage
        self.address: int = int(storage.ctypes.data)
        self.size: int = size
        self.args: KernelArgs | None = args
        self._refs = refs  # what params point at besides storage (the kernelParams table)

    @classmethod
    def of_launch(cls, handle: Any, launch: Any, captured: bytes) -> KernelShadow:
        """A node rawgraph recorded: its launch's argument spec filled with the captured bytes."""
        args = KernelArgs.from_bytes(launch.args.spec, captured)
        return cls(handle, launch.node_params(args), args._storage, len(captured), args)

    def current(self) -> bytes:
        """The argument bytes as the shadow holds them."""
        return self.storage.view(np.uint8)[: self.size].tobytes()


# undo(log): put the shadow of every node of a failed push back as it was before it was edited
Undo = Callable[[Any], None]


class NodeWrite:
    """What one prepared set of pointers writes into one node's bindable words.

    ``full``: the pointer of every bindable word of the node, when the set gives them all (then
    ``writes`` pairs each word with its pointer); None when it gives some, and ``idx``/``vals`` say
    which words (positions in ``views``) get which pointer. ``views``: every bindable word of the
    node, in :class:`ArgumentSlots`' fixed order. (Slotted attributes, not a tuple subclass: an
    apply reads ``node`` and ``full`` per node per replay, and stops there when the node already
    holds them.)
    """

    __slots__ = ("node", "full", "idx", "vals", "views", "writes")

    def __init__(
        self,
        node: int,
        full: tuple[int, ...] | None,
        idx: tuple[int, ...],
        vals: tuple[int, ...],
        views: tuple[ctypes.c_uint64, ...],
    ):
        self.node: int = node
        self.full: tuple[int, ...] | None = full
        self.idx: tuple[int, ...] = idx
        self.vals: tuple[int, ...] = vals
        self.views: tuple[ctypes.c_uint64, ...] = views
        self.writes: tuple[tuple[ctypes.c_uint64, int], ...] = tuple(zip(views, full)) if full is not None else ()


class NameSlots:
    """Where one bindable name's pointer goes: per node, a ctypes view of each argument word
    holding it (``words``: a ``.value`` store is cheap), where those words sit in the node's fixed
    order (``positions``), and the nodes a bind that moves the name pushes (``nodes``)."""

    __slots__ = ("words", "positions", "nodes")

    def __init__(self, words: list[tuple[int, list[ctypes.c_uint64]]]):
        self.words: list[tuple[int, list[ctypes.c_uint64]]] = words
        self.positions: list[tuple[int, list[int]]] = []
        self.nodes: list[int] = [node for node, _views in words]


class ArgumentSlots:
    """Which argument words a bind changes, over the kernel nodes' shadows.

    ``names[name]``: the :class:`NameSlots` of each bindable name. ``views[node]``: every bindable
    word of a node, in one fixed order. ``now[node]``: the pointers those words hold, cached as a
    tuple (the very tuple of the :class:`NodeWrite` that put them there, so the common check is one
    identity test), None where the words must be read.
    """

    __slots__ = ("names", "views", "now")

    def __init__(self, args: Sequence[KernelArgs], uses: dict[str, list[tuple[int, str]]]):
        self.names: dict[str, NameSlots] = {}
        order: dict[int, list[ctypes.c_uint64]] = {}
        for name, pairs in uses.items():
            grouped: dict[int, list[ctypes.c_uint64]] = {}
            for node, arg in pairs:
                word = args[node]._storage.ctypes.data + args[node].offsets[arg]
                grouped.setdefault(node, []).append(ctypes.c_uint64.from_address(word))
            at = self.names[name] = NameSlots(list(grouped.items()))
            for node, words in at.words:
                slots = order.setdefault(node, [])
                at.positions.append((node, list(range(len(slots), len(slots) + len(words)))))
                slots.extend(words)
        self.views: dict[int, tuple[ctypes.c_uint64, ...]] = {node: tuple(words) for node, words in order.items()}
        self.now: dict[int, tuple[int, ...] | None] = dict.fromkeys(order)

    def point(self, name: str, ptr: int) -> None:
        """Every word of ``name`` gets ``ptr`` (a bind; with the old pointer, its undo)."""
        now = self.now
        for node, views in self.names[name].words:
            for v in views:
                v.value = ptr
            now[node] = None

    def undo_point(self, log: tuple[str, int]) -> None:
        self.point(*log)

    def plan(self, entries: Sequence[tuple[str, tuple[int, int]]]) -> tuple[NodeWrite, ...]:
        """Per node that ``entries`` (``(name, (ptr, nbytes))``) touch, what they write there."""
        want: dict[int, list[int | None]] = {}
        for name, (ptr, _nbytes) in entries:
            for node, positions in self.names[name].positions:
                w = want.setdefault(node, [None] * len(self.views[node]))
                for i in positions:
                    w[i] = ptr
        nodes = []
        for node, w in want.items():
            idx = tuple(i for i, v in enumerate(w) if v is not None)
            vals = tuple(cast(int, w[i]) for i in idx)  # (idx holds only the set positions)
            full = vals if len(idx) == len(w) else None
            nodes.append(NodeWrite(node, full, idx, vals, self.views[node]))
        return tuple(nodes)

    def write(self, writes: Sequence[NodeWrite]) -> tuple[list[int], list[tuple[int, ...]]]:
        """Write each node's pointers where its words hold others; returns the nodes changed (to
        push) and what their words held (the log :meth:`put_back` takes)."""
        now_of = self.now
        changed: list[int] = []
        olds: list[tuple[int, ...]] = []
        for nw in writes:
            node, full = nw.node, nw.full
            now = now_of[node]
            if now is full and now is not None:
                continue  # these pointers are there already
            if now is None:
                now = tuple(v.value for v in nw.views)
            if full is not None:
                if full == now:
                    now_of[node] = full
                    continue
                new = full
                for view, a in nw.writes:
                    view.value = a
            else:
                merged = list(now)
                for i, val in zip(nw.idx, nw.vals):
                    merged[i] = val
                new = tuple(merged)
                if new == now:
                    now_of[node] = new
                    continue
                for view, a in zip(nw.views, new):
                    view.value = a
            changed.append(node)
            olds.append(now)
            now_of[node] = new
        return changed, olds

    def put_back(self, log: tuple[list[int], list[tuple[int, ...]]]) -> None:
        """Undo of a refused :meth:`write`: each changed node's words get what they held."""
        for node, old in zip(*log):
            for view, a in zip(self.views[node], old):
                view.value = a
            self.now[node] = old

    def forget(self) -> None:
        """The words were rewritten behind the cache (a whole-graph update): read them again."""
        self.now = dict.fromkeys(self.now)


def refuse_device_updatable(exec: Any) -> None:
    """Raise :class:`~rawgraph.DeviceUpdatableError` for an exec whose graph holds device-updatable
    kernel nodes (:meth:`~rawgraph.graphs.graph.Graph.mark_device_updatable`): a host push
    (``cuGraphExecKernelNodeSetParams``) would override what the device wrote.

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    graph = getattr(exec, "graph", None)
    if graph is not None and getattr(graph, "device_updatable", False):
        raise DeviceUpdatableError(
            "this exec holds device-updatable kernel nodes: host parameter pushes (ExecUpdateManager, "
            "AddressRebinder, slot pools, re-shaped graphs: cuGraphExecKernelNodeSetParams) would override "
            "the device's updates; change its shape through the kernel that updates it (DeviceShapedGraph)"
        )


class ExecShadow:
    """The shadow of one exec: its nodes' parameters, the push of changed nodes with rollback,
    the streams it was launched on and the keep-alive over them.

    ``exec``: a GraphExec, or a raw ``CUgraphExec``; ``device`` is made current before a push (a
    SetParams on a thread with no context crashes); ``batch``: retired objects collected before a
    fence is recorded. ``handles``, ``params``: per node, in the order :meth:`add` was called, its
    handle and what a push gives the driver (an owner edits ``params[i]`` in place, or replaces it:
    a re-shaped graph points a node at another size's parameters). ``pushes``: SetParams calls that
    took (a rolled-back one counts none). ``streams``: ``exec.streams`` of a GraphExec, else those
    :meth:`note` was given; ``keep``: the :class:`KeepAlive` over them.
    """

    __slots__ = ("exec", "handle", "device", "handles", "params", "setters", "labels", "pushes", "streams", "keep")

    def __init__(self, exec: Any, device: Device, batch: int = 32):
        refuse_device_updatable(exec)
        self.exec: Any = exec  # a GraphExec, or a raw CUgraphExec (handle or int)
        self.handle: Any = getattr(exec, "handle", exec)
        self.device: Device = device
        self.handles: list[Any] = []
        self.params: list[Any] = []
        # per node (call, name) for nodes that are not kernel nodes; None while every node is one
        self.setters: list[tuple[Callable[..., Any], str] | None] | None = None
        self.labels: list[str] = []
        self.pushes: int = 0
        streams = getattr(exec, "streams", None)
        self.streams: StreamSet = streams if isinstance(streams, StreamSet) else StreamSet()
        self.keep: KeepAlive = KeepAlive(self.streams, device, batch)

    def add(
        self, handle: Any, params: Any, label: str = "", setter: tuple[Callable[..., Any], str] | None = None
    ) -> int:
        """Register a node; returns its index. ``setter``: ``(call, name)`` pushing a node that is not
        a kernel node (``call(exec, handle, params)`` returns ``(err,)``)."""
        if setter is not None and self.setters is None:
            self.setters = [None] * len(self.handles)
        if self.setters is not None:
            self.setters.append(setter)
        self.handles.append(handle)
        self.params.append(params)
        self.labels.append(label)
        return len(self.handles) - 1

    def add_kernel(self, node: KernelShadow, label: str = "") -> int:
        """:meth:`add` for a kernel node's shadow (its handle and parameters)."""
        return self.add(node.handle, node.params, label)

    # -- pushing ------------------------------------------------------------------------------
    def push(self, nodes: Sequence[int], undo: Undo | None = None, log: Any = None) -> int:
        """Give the exec what the shadow now holds for ``nodes`` (already edited by the caller);
        returns the pushes made.

        If the driver refuses one, ``undo(log)`` puts the shadow of every node in ``nodes`` back,
        the nodes pushed before it get their old values again, and the typed error is raised:
        the exec and the shadow hold the old values, all of them.

        Every update path pushes here, the manager's per-replay ``bind`` and ``apply`` included:
        when every node is a kernel node the loop is one SetParams call per node and nothing else.

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        cuGraphExecMemcpyNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        cuGraphExecMemsetNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if not nodes:
            return 0
        device = self.device
        if getattr(_here, "context", None) is not device.context:  # Device.ensure_current, inline
            device.activate()  # a SetParams on a thread with no context crashes
        setparams = driver.cuGraphExecKernelNodeSetParams
        exe, handles, params, setters = self.handle, self.handles, self.params, self.setters
        if setters is None:  # every node a kernel node: the per-replay path, kept to the bone
            for node in nodes:
                (err,) = setparams(exe, handles[node], params[node])
                if err != _SUCCESS:
                    raise self.roll_back(nodes, nodes.index(node), err, undo, log)
        else:
            for k, node in enumerate(nodes):
                setter = setters[node]
                call = setparams if setter is None else setter[0]
                (err,) = call(exe, handles[node], params[node])
                if err != _SUCCESS:
                    raise self.roll_back(nodes, k, err, undo, log)
        self.pushes += len(nodes)
        return len(nodes)

    def _call(self, node: int) -> tuple[Callable[..., Any], str]:
        setter = self.setters[node] if self.setters is not None else None
        if setter is not None:
            return setter
        label = self.labels[node]
        return driver.cuGraphExecKernelNodeSetParams, f"{_SETPARAMS}({label})" if label else _SETPARAMS

    def roll_back(self, nodes: Sequence[int], k: int, err: Any, undo: Undo | None, log: Any) -> BaseException:
        """The k-th push of ``nodes`` was refused (the driver kept that node's old values): the
        shadow goes back, then the nodes before it (the driver took their new values) get the
        old ones again. Returns the error to raise (:meth:`push`, the one push loop, calls it)."""
        exc = cuda_error(err, self._call(nodes[k])[1])
        if undo is not None:
            undo(log)
        for node in reversed(nodes[:k]):
            call, _name = self._call(node)
            (again,) = call(self.handle, self.handles[node], self.params[node])
            if again != _SUCCESS and hasattr(exc, "add_note"):
                exc.add_note(f"rawgraph: putting node {node} back failed too ({again}); the exec holds its new values")
        return exc

    # -- keeping replaced objects alive -------------------------------------------------------
    def note(self, stream: Any) -> None:
        """Remember a stream the exec was launched on (a raw exec handle has no ``streams``)."""
        self.streams.note(stream)

    @property
    def retained(self) -> list[Any]:
        return self.keep.retained

    def close(self) -> None:
        """Wait for the replays that read a retired object, then drop them (never raises half-way)."""
        self.keep.close()
