"""The shadow-parameter core: what one exec's nodes hold, as the library believes it.

The driver has no getter for an exec's node parameters, so every update path keeps its own copy
of them: the *shadow*. :class:`ExecShadow` is that copy for one exec, and the one place that
changes the exec:

* per node, the parameters ``cuGraphExecKernelNodeSetParams`` is given (``params``: a
  ``CUDA_KERNEL_NODE_PARAMS`` whose ``kernelParams`` point at a persistent, packed argument buffer,
  :class:`KernelShadow`), edited in place by its owner;
* :meth:`ExecShadow.push` gives the exec the nodes whose shadow changed, nothing else. If the
  driver refuses the k-th push, the owner's undo puts the old values back into the shadow and
  the k-1 nodes the driver already took are pushed again with them: the exec and the shadow stay
  equal, and the exec runs all of its old values, never a mix;
* the streams the exec was launched on (``GraphExec.streams``, or its own
  :class:`~rawgraph.runtime.stream.StreamSet` for a raw handle) and a
  :class:`~rawgraph.graphs.keepalive.KeepAlive` over them: an object an update moved the exec away
  from is held until the replays queued before the update have run.

The core takes no lock: each owner (manager, rebinder, re-shaped graph, slot pool, indirect graph)
holds its own lock around every call that edits the shadow and pushes, so one lock per owner, as
before. :class:`BaseBinding` is the one family of prepared bindings, with one liveness rule.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.keepalive import KeepAlive
from ..runtime import resource as _resource
from ..runtime.device import Device, _here
from ..runtime.errors import DeviceUpdatableError, cuda_error
from ..runtime.launch import KernelArgs
from ..runtime.memory import DeviceBuffer
from ..runtime.stream import StreamSet

_SUCCESS = driver.CUresult.CUDA_SUCCESS
WORD = 8
_SETPARAMS = "cuGraphExecKernelNodeSetParams"


class KernelShadow:
    """One kernel node's persistent parameters: a packed argument buffer (``storage``, 8-byte
    words) and the ``CUDA_KERNEL_NODE_PARAMS`` (``params``) whose ``kernelParams`` point into it.
    Built once; the owner edits the buffer (and the grid) in place before a push. The driver
    copies the values during the SetParams call; the buffer stays for the next edit.

    Attributes
    ----------
    handle : CUgraphNode
    params : CUDA_KERNEL_NODE_PARAMS
    storage : numpy.ndarray of uint64
    address, size : int
        Where the argument bytes lie and how many there are.
    args : KernelArgs or None
        The named arguments (:meth:`of_launch`), None for raw bytes (:meth:`of_bytes`).
    """

    __slots__ = ("handle", "params", "storage", "address", "size", "args", "_refs")

    handle: Any  # driver.CUgraphNode
    params: Any  # driver.CUDA_KERNEL_NODE_PARAMS
    storage: np.ndarray
    address: int
    size: int
    args: KernelArgs | None

    def __init__(
        self,
        handle: Any,
        params: Any,
        storage: np.ndarray,
        size: int,
        args: KernelArgs | None = None,
        refs: tuple[Any, ...] = (),
    ):
        self.handle = handle
        self.params = params
        self.storage = storage
        self.address = int(storage.ctypes.data)
        self.size = size
        self.args = args
        self._refs = refs  # what params point at besides storage (the kernelParams table)

    @classmethod
    def of_launch(cls, handle: Any, launch: Any, captured: bytes) -> KernelShadow:
        """A node rawgraph recorded: its launch's argument spec filled with the captured bytes."""
        args = KernelArgs.from_bytes(launch.args.spec, captured)
        return cls(handle, launch.node_params(args), args._storage, len(captured), args)

    @classmethod
    def of_bytes(cls, blob: bytes, offsets: Sequence[int] | None, fields: dict[str, Any]) -> KernelShadow:
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

    def current(self) -> bytes:
        """The argument bytes as the shadow holds them."""
        return self.storage.view(np.uint8)[: self.size].tobytes()


# undo(log): put the shadow of every node of a failed push back as it was before it was edited
Undo = Callable[[Any], None]


def refuse_device_updatable(exec: Any) -> None:
    """Raise :class:`~rawgraph.DeviceUpdatableError` for an exec whose graph holds device-updatable
    kernel nodes (:meth:`~rawgraph.graphs.graph.Graph.mark_device_updatable`): a host push
    (``cuGraphExecKernelNodeSetParams``) would override what the device wrote."""
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

    Parameters
    ----------
    exec : GraphExec, CUgraphExec or int
    device : Device
        Made current before a push (a SetParams on a thread with no context crashes).
    batch : int
        Retired objects collected before a fence is recorded (:class:`KeepAlive`).

    Attributes
    ----------
    handles, params : list
        Per node (in the order :meth:`add` was called): its handle and what a push gives the
        driver. An owner may edit ``params[i]`` in place or replace it (a re-shaped graph points
        a node at another size's parameters).
    pushes : int
        SetParams calls that took (a rolled-back transaction counts none).
    streams : StreamSet
        ``exec.streams`` of a :class:`~rawgraph.graphs.graph.GraphExec`, else the streams
        :meth:`note` was given.
    keep : KeepAlive
    """

    __slots__ = ("exec", "handle", "device", "handles", "params", "setters", "labels", "pushes", "streams", "keep")

    exec: Any  # a GraphExec, or a raw CUgraphExec (handle or int)
    handle: Any  # driver.CUgraphExec
    device: Device
    pushes: int
    streams: StreamSet
    keep: KeepAlive

    def __init__(self, exec: Any, device: Device, batch: int = 32):
        refuse_device_updatable(exec)
        self.exec = exec
        self.handle = getattr(exec, "handle", exec)
        self.device = device
        self.handles: list[Any] = []
        self.params: list[Any] = []
        # per node (call, name) for nodes that are not kernel nodes; None while every node is one
        self.setters: list[tuple[Callable[..., Any], str] | None] | None = None
        self.labels: list[str] = []
        self.pushes = 0
        streams = getattr(exec, "streams", None)
        self.streams = streams if isinstance(streams, StreamSet) else StreamSet()
        self.keep = KeepAlive(self.streams, device, batch)

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

    def retire(self, obj: Any) -> None:
        """Hold ``obj`` until the replays queued so far have run (nothing when never launched)."""
        self.keep.retire(obj)

    def retire_all(self, objs: Any) -> None:
        self.keep.retire_all(objs)

    def collect(self) -> int:
        return self.keep.collect()

    @property
    def retained(self) -> list[Any]:
        return self.keep.retained

    def close(self) -> None:
        """Wait for the replays that read a retired object, then drop them (never raises half-way)."""
        self.keep.close()


def finalizers(objs: Sequence[Any]) -> tuple[weakref.finalize[..., Any] | None, ...]:
    """The finalizer of each DeviceBuffer among ``objs`` (None for other objects)."""
    return tuple(a._finalizer if isinstance(a, DeviceBuffer) else None for a in objs)


class BaseBinding:
    """A prepared set of new values for one owner (manager, rebinder, indirect graph).

    The one liveness rule: a binding is applied only by the owner that prepared it, and only while
    every :class:`~rawgraph.runtime.memory.DeviceBuffer` it names is open. The check is one compare
    (``resource.release_count`` unchanged since it last passed) on the hot path, the finalizers
    otherwise.

    Attributes
    ----------
    owner : object
        What prepared it (the owner itself, or a token naming it).
    holds : tuple
        The objects it keeps alive (its new arrays; empty for a binding cached weakly).
    alive : tuple
        Finalizers of the DeviceBuffers among its objects (None for others).
    checked_at : int
        ``resource.release_count`` when every object named was last seen open.
    """

    __slots__ = ("owner", "holds", "alive", "checked_at", "__weakref__")

    owner: Any
    holds: tuple[Any, ...]
    alive: tuple[weakref.finalize[..., Any] | None, ...]
    checked_at: int

    def __init__(self, owner: Any, holds: tuple[Any, ...] = ()):
        self.owner = owner
        self.holds = holds
        self.alive = finalizers(holds)
        self.checked_at = _resource.release_count

    def _still_open(self) -> bool:
        for fin in self.alive:
            if fin is not None and not fin.alive:
                return False
        self.checked_at = _resource.release_count
        return True

    def is_open(self) -> bool:
        """Every DeviceBuffer it names is open (one compare when nothing was released since)."""
        return self.checked_at == _resource.release_count or self._still_open()
