"""Feeding replays new data without a copy: re-bind kernel-node arguments in the exec.

:class:`ExecUpdateManager` knows, from the capture-time node map, which (node, argument) pairs
read or write each named buffer (``x`` -> every argument that reads the input, ``out`` -> those
that write the output). ``bind(name, array)``:

1. validates the array (shape, dtype, device, contiguity, size) -- a refused bind changes nothing;
2. writes the new pointer into the persistent argument buffers of the affected nodes only;
3. compares the new pointer with each node's shadow -- the argument buffer that holds exactly what
   the exec holds (the driver has no getter for exec node parameters) -- and calls
   ``cuGraphExecKernelNodeSetParams`` only for nodes whose arguments actually changed.

A replay after ``bind`` reads the new array where it lies. The manager keeps each array it bound
alive until the replays that may read it have finished (an event recorded on each stream used),
so a caching allocator (CuPy's pool, PyTorch's) cannot hand that memory out while a graph still
reads it.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, Sequence

import numpy as np
from cuda.bindings import driver

from .errors import LayoutError, cuda_error
from .graph import Graph, GraphExec
from .launch import KernelArgs
from .memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from .stream import Event, Stream

_SUCCESS = driver.CUresult.CUDA_SUCCESS


class ExecUpdateManager:
    """Named buffer bindings over one graph exec.

    Parameters
    ----------
    graph : Graph
        A graph from :func:`~rawgraph.capture.capture_plan` (it carries the plan and node map).
    exec : GraphExec
        An exec instantiated from ``graph``.
    names : sequence of str, optional
        Bindable buffers; default the plan's inputs and outputs (``x``, ``out``).

    Attributes
    ----------
    bindings : dict
        name -> list of (node index, argument name, role).
    update_calls : int
        How many ``cuGraphExecKernelNodeSetParams`` calls were made.
    """

    def __init__(self, graph: Graph, exec: GraphExec, names: Sequence[str] | None = None):
        if exec.graph is not graph:
            raise ValueError("exec was not instantiated from this graph")
        plan = graph.plan
        if plan is None:
            raise ValueError("graph has no launch plan; capture it with capture_plan")
        self.graph = graph
        self.exec = exec
        names = tuple(names) if names is not None else plan.inputs + plan.outputs
        # capture_plan records launch i as node i; check it rather than assume it.
        if len(graph.nodes) != len(plan.launches) or not all(n.launch is l for n, l in zip(graph.nodes, plan.launches)):
            raise ValueError("the graph's node map does not follow its plan's launch order")
        self.bindings: dict[str, list[tuple[int, str, str]]] = {}
        for name in names:
            uses = plan.uses_of(name)
            if not uses:
                raise KeyError(f"no node argument uses buffer {name!r}")
            self.bindings[name] = list(uses)
        self._specs = {name: (plan.buffers[name].shape, plan.buffers[name].dtype) for name in names}
        self._bound_ptr = {name: (plan.buffers[name].ptr, plan.buffers[name].nbytes) for name in names}
        self._bound_obj = {name: plan.buffers[name].owner for name in names}
        self._roles = {name: {r for _, _, r in self.bindings[name]} for name in names}
        self._write_names = [n for n in names if "write" in self._roles[n]]
        # Per-node persistent arguments (copies: binding never disturbs the eager plan) and the
        # CUDA_KERNEL_NODE_PARAMS pointing at them, built once.
        self._args: list[KernelArgs] = []
        self._params: list[Any] = []
        for node in graph.nodes:
            args = KernelArgs.from_bytes(node.launch.args.spec, node.captured_args)
            self._args.append(args)
            self._params.append(self._node_params(node.launch, args))
        self._handles = [n.handle for n in graph.nodes]
        # Per binding, the (node, one-element view of the argument slot) pairs it rewrites, and the
        # same grouped by node for the single-name fast path.
        self._slots = {
            name: [(node, self._args[node]._views[arg]) for node, arg, _ in self.bindings[name]] for name in names
        }
        # (ctypes views of the same slots: a .value store costs less than a NumPy item store)
        self._node_slots: dict[str, list[tuple[int, list]]] = {}
        for name, pairs in self._slots.items():
            grouped: dict[int, list] = {}
            for node, view in pairs:
                grouped.setdefault(node, []).append(ctypes.c_uint64.from_address(view.ctypes.data))
            self._node_slots[name] = list(grouped.items())
        self._writers = any("write" in r for r in self._roles.values()) and len(names) > 1
        # name -> {id(array): (weakref, ptr, nbytes, owner finalizer or None)}
        self._checked: dict[str, dict[int, tuple]] = {name: {} for name in names}
        self.update_calls = 0
        self._streams: dict[int, Stream] = {}
        self._pending: list[Any] = []
        self._retired: list[tuple[list[Event], list[Any]]] = []
        self._events: list[Event] = []
        self._device = graph.device

    @staticmethod
    def _node_params(launch, args: KernelArgs) -> Any:
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = launch.kernel.handle
        p.gridDimX, p.gridDimY, p.gridDimZ = launch.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = launch.block
        p.sharedMemBytes = launch.shared_mem
        p.kernelParams = args.address
        return p

    # -- binding --------------------------------------------------------------------------
    def bound(self, name: str) -> DeviceArray:
        """The array ``name`` is bound to now (a view; ``owner`` is the object passed to bind)."""
        shape, dtype = self._specs[name]
        return DeviceArray(self._bound_ptr[name][0], shape, dtype, self._bound_obj[name])

    def _resolve(self, name: str, array: Any) -> tuple[int, int]:
        """``(ptr, nbytes)`` of a checked array (shape, dtype, layout, device).

        Arrays don't change shape or address, so one already checked is remembered per
        (name, object) -- by weak reference, so the cache keeps nothing alive -- and re-binding it
        costs a dict lookup. A closed DeviceBuffer fails the lookup and is refused by the full check.
        """
        if name not in self.bindings:
            raise KeyError(f"unknown binding {name!r}; bindable: {sorted(self.bindings)}")
        cache = self._checked[name]
        hit = cache.get(id(array))
        if hit is not None and hit[0]() is array and (hit[3] is None or hit[3].alive):
            return hit[1], hit[2]
        shape, dtype = self._specs[name]
        view = check_array(as_device_array(array, name), shape, dtype, name, self._device)
        try:
            ref = weakref.ref(array)
        except TypeError:  # not weak-referenceable: checked every time
            return view.ptr, view.nbytes
        owner = view.owner
        alive = owner._finalizer if isinstance(owner, DeviceBuffer) else None
        if len(cache) > 1024:
            cache.clear()
        cache[id(array)] = (ref, view.ptr, view.nbytes, alive)
        return view.ptr, view.nbytes

    def bind(self, name: str, array: Any) -> int:
        """Point every node argument bound to ``name`` at ``array``; returns driver updates made.

        The hot path of a replay loop: an array bound before (still alive, same object) costs a
        dict lookup, an overlap check, one in-place pointer write per argument and one
        ``cuGraphExecKernelNodeSetParams`` per node that reads it -- none when the pointer did not
        change. Anything else goes through :meth:`bind_many`, which validates it.
        """
        cache = self._checked.get(name)
        hit = cache.get(id(array)) if cache is not None else None
        if hit is None or hit[0]() is not array or (hit[3] is not None and not hit[3].alive):
            return self.bind_many({name: array})
        ptr, nbytes = hit[1], hit[2]
        if self._writers:
            self._check_overlap_one(name, ptr, nbytes)
        old = self._bound_ptr[name][0]
        pushed = 0
        if ptr != old:
            setparams = driver.cuGraphExecKernelNodeSetParams
            exe, handles, params = self.exec.handle, self._handles, self._params
            done: list[int] = []
            for node, views in self._node_slots[name]:
                for v in views:
                    v.value = ptr
                (err,) = setparams(exe, handles[node], params[node])
                if err != _SUCCESS:
                    self._undo_fast(name, old, done + [node])
                    raise cuda_error(err, "cuGraphExecKernelNodeSetParams")
                done.append(node)
            pushed = len(done)
            self.update_calls += pushed
            self._bound_ptr[name] = (ptr, nbytes)
        old_obj = self._bound_obj[name]
        if old_obj is not array:
            self._bound_obj[name] = array
            self._retire(old_obj)
        return pushed

    def _undo_fast(self, name: str, old: int, nodes: list[int]) -> None:
        """Put ``name``'s arguments back to ``old`` and give the driver the old values again."""
        for node, views in self._node_slots[name]:
            for v in views:
                v.value = old
        for node in nodes[:-1]:  # the failed one never took the new values
            driver.cuGraphExecKernelNodeSetParams(self.exec.handle, self._handles[node], self._params[node])

    def _check_overlap_one(self, name: str, ptr: int, nbytes: int) -> None:
        for wname in self._write_names:
            if wname == name:
                for other, (op, on) in self._bound_ptr.items():
                    if other != name and ptr < op + on and op < ptr + nbytes:
                        raise LayoutError(f"{name} (written) overlaps {other}")
            else:
                wp, wn = self._bound_ptr[wname]
                if wp < ptr + nbytes and ptr < wp + wn:
                    raise LayoutError(f"{wname} (written) overlaps {name}")

    def bind_many(self, arrays: dict[str, Any]) -> int:
        """Bind several names at once, all validated before anything changes.

        Returns
        -------
        int
            Number of ``cuGraphExecKernelNodeSetParams`` calls made (0 when nothing changed).
        """
        resolved = [(name, *self._resolve(name, a), a) for name, a in arrays.items()]
        if self._writers:
            self._check_overlap({**self._bound_ptr, **{n: (p, nb) for n, p, nb, _ in resolved}})
        # Invariant outside bind: each node's argument buffer holds exactly what the exec holds
        # (the shadow), so comparing pointers finds the nodes that need a push.
        changed: list[tuple[Any, int]] = []
        dirty: list[int] = []
        for name, ptr, _nb, _obj in resolved:
            for node, slot in self._slots[name]:
                old = int(slot[0])
                if old != ptr:
                    changed.append((slot, old))
                    slot[0] = ptr
                    if node not in dirty:
                        dirty.append(node)
        pushed: list[int] = []
        setparams = driver.cuGraphExecKernelNodeSetParams
        try:
            for node in dirty:
                (err,) = setparams(self.exec.handle, self._handles[node], self._params[node])
                if err != _SUCCESS:
                    raise cuda_error(err, "cuGraphExecKernelNodeSetParams")
                pushed.append(node)
        except BaseException:
            for slot, old in reversed(changed):
                slot[0] = old
            for node in pushed:  # the driver took the new values: give it the old ones back
                setparams(self.exec.handle, self._handles[node], self._params[node])
            raise
        self.update_calls += len(pushed)
        for name, ptr, nb, obj in resolved:
            self._bound_ptr[name] = (ptr, nb)
            old_obj = self._bound_obj[name]
            if old_obj is not obj:
                self._bound_obj[name] = obj
                self._retire(old_obj)
        return len(pushed)

    def _check_overlap(self, spans: dict[str, tuple[int, int]]) -> None:
        for wname in self._write_names:
            wp, wn = spans[wname]
            for rname, (rp, rn) in spans.items():
                if rname != wname and wp < rp + rn and rp < wp + wn:
                    raise LayoutError(f"{wname} (written) overlaps {rname}")

    # -- replay ---------------------------------------------------------------------------
    def launch(self, stream: Stream) -> None:
        """Replay the exec on ``stream`` (``cuGraphLaunch``) with the current bindings."""
        self.exec.launch(stream)
        self._streams[id(stream)] = stream

    replay = launch

    # -- keeping bound memory alive -------------------------------------------------------
    # A replaced array may still be read by replays in flight. It is kept in ``_pending`` until an
    # event recorded after those replays completes. One event per used stream covers a whole batch
    # of retired arrays, so re-binding costs no driver call on most binds.
    _BATCH = 32

    def _retire(self, old: Any) -> None:
        if not self._streams:
            return  # never replayed while bound: nothing can still read it
        self._pending.append(old)
        if len(self._pending) >= self._BATCH:
            self.collect()

    def collect(self) -> int:
        """Cover pending arrays with an event, release those whose replays have finished.

        Returns how many arrays are still held.
        """
        if self._pending:
            events = []
            for stream in self._streams.values():
                ev = self._events.pop() if self._events else Event(timing=False, device=self._device)
                events.append(ev.record(stream))
            self._retired.append((events, self._pending))
            self._pending = []
        keep = []
        for events, arrays in self._retired:
            if all(e.query() for e in events):
                self._events.extend(events)
            else:
                keep.append((events, arrays))
        self._retired = keep
        return len(self.retained)

    @property
    def retained(self) -> list[Any]:
        """Objects no longer bound but kept alive for replays that may still read them."""
        return [a for _, arrays in self._retired for a in arrays] + list(self._pending)

    # -- whole-graph update ---------------------------------------------------------------
    def adopt(self, graph: Graph) -> None:
        """Take over the parameters of ``graph`` after ``exec.update(graph)`` succeeded.

        The exec's nodes now hold ``graph``'s arguments; the shadows and bindings follow, and the
        original graph's node handles stay the ones ``cuGraphExecKernelNodeSetParams`` names.
        """
        if len(graph.nodes) != len(self.graph.nodes):
            raise ValueError("graph has a different number of nodes")
        for i, node in enumerate(graph.nodes):
            self._args[i]._storage[:] = np.frombuffer(node.captured_args, dtype=np.uint64)
        for name in self.bindings:
            view = graph.plan.buffers[name]
            self._bound_ptr[name] = (view.ptr, view.nbytes)
            if self._bound_obj[name] is not view.owner:
                self._retire(self._bound_obj[name])
                self._bound_obj[name] = view.owner
        self._keep_graph = graph  # its plan owns the buffers now bound

    def close(self) -> None:
        """Drop retained arrays (after waiting for their replays) and pooled events."""
        for events, _ in self._retired:
            for e in events:
                e.synchronize()
        self._retired.clear()
        self._pending.clear()
        for cache in self._checked.values():
            cache.clear()
        for e in self._events:
            e.close()
        self._events.clear()
