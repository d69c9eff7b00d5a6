"""Feeding replays new data without a copy: re-bind kernel-node arguments in the exec.

:class:`ExecUpdateManager` knows, from the capture-time node map, which (node, argument) pairs
read or write each named buffer (``x`` -> every argument that reads the input, ``out`` -> those
that write the output). ``bind(name, array)``:

1. validates the array (shape, dtype, device, contiguity, size) -- a refused bind changes nothing;
2. writes the new pointer into the persistent argument buffers of the affected nodes only;
3. compares the new pointer with each node's shadow -- the argument buffer that holds exactly what
   the exec holds (the driver has no getter for exec node parameters) -- and calls
   ``cuGraphExecKernelNodeSetParams`` only for nodes whose arguments actually changed, through the
   shadow core (:mod:`rawgraph.updates.shadow`), which puts every node back if one is refused.

The checks are in :mod:`rawgraph.updates.validate`, the scalar and grid setters in
:mod:`rawgraph.updates.setters`.

Only the recorded launches are updated. Foreign nodes (``graph.foreign_nodes``: a CuPy kernel, a
memset launched straight on the capturing stream) and recorded non-kernel nodes (``graph.other_nodes``:
memcpys, conditionals) are read once, and a buffer one of them holds an address in cannot be bound
away from its captured address (:class:`~rawgraph.runtime.errors.ForeignNodeError`): that node would go on
using the old buffer. A node whose parameters the driver does not give back (a conditional's body on
driver 580) cannot be checked: the manager warns (:class:`~rawgraph.runtime.errors.RawgraphWarning`) and
binds.

A replay after ``bind`` reads the new array where it lies. The manager keeps each array it bound
alive until the replays that may read it have finished (an event recorded on each stream used),
so a caching allocator (CuPy's pool, PyTorch's) cannot hand that memory out while a graph still
reads it.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from cuda.bindings import driver

from ..runtime.errors import ArrayError, ClosedError, RawgraphError, RawgraphWarning
from ..graphs.graph import Graph, GraphExec
from ..runtime import resource as _resource
from ..runtime.launch import KernelArgs
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array
from .addresses import foreign_holders
from .setters import ParamSetters, _locked
from .shadow import ExecShadow, KernelShadow, finalizers, refuse_device_updatable
from .validate import Binding, BindingChecks

if TYPE_CHECKING:
    from .validate import _Checked, _Slot

__all__ = ["Binding", "ExecUpdateManager"]

_SUCCESS = driver.CUresult.CUDA_SUCCESS


def captured_object(view: DeviceArray) -> Any:
    """The array a plan's buffer stands for, as ``rebind`` matches it by identity: the view's owner
    when the owner is exactly that memory (the DeviceBuffer or tensor passed), else the view
    itself (a part of a larger allocation: that allocation was never passed to a kernel)."""
    owner = view.owner
    if isinstance(owner, DeviceBuffer) or hasattr(type(owner), "__cuda_array_interface__"):
        try:
            whole = as_device_array(owner)
        except RawgraphError:  # closed, strided: not this view's memory as a whole
            return view
        if (whole.ptr, whole.nbytes) == (view.ptr, view.nbytes):
            return owner
    return view


class ExecUpdateManager(BindingChecks, ParamSetters):
    """Named buffer bindings over one graph exec.

    Parameters
    ----------
    graph : Graph
        A graph with a plan and node map: from :func:`~rawgraph.graphs.capture.capture_plan`, or any
        :class:`~rawgraph.Capture` whose launches named their arrays (``Capture.run`` of a plan,
        :class:`~rawgraph.RawKernel` calls).
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

    Notes
    -----
    Threads: every call that changes the bindings (``bind``, ``bind_many``, ``prepare``,
    ``apply``, ``set_params``, a scalar setter, ``adopt``, ``close``) holds one lock, so calls from
    several threads run one after another and the shadow parameters always equal what the exec
    holds. ``launch`` takes no lock: which bindings a replay sees when another thread binds at the
    same moment is the caller's ordering to choose.
    """

    def __init__(self, graph: Graph, exec: GraphExec, names: Sequence[str] | None = None):
        if exec.graph is not graph:
            raise ValueError("exec was not instantiated from this graph")
        refuse_device_updatable(exec)  # before the foreign-node scan below calls the driver
        plan = graph.plan
        if plan is None:
            raise ValueError("graph has no launch plan: capture it with capture_plan, or launch into the "
                             "Capture through RawKernel calls or Capture.run so its arrays are named")
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
        self._bound_obj = {name: captured_object(plan.buffers[name]) for name in names}
        self._roles = {name: {r for _, _, r in self.bindings[name]} for name in names}
        self._pin_epoch = -1
        self._pin_foreign(*foreign_holders(graph, self._bound_ptr))
        self._write_names = [n for n in names if "write" in self._roles[n]]
        # The exec's shadow (rawgraph.updates.shadow): per node, persistent arguments (copies:
        # binding never disturbs the eager plan) and the CUDA_KERNEL_NODE_PARAMS pointing at them,
        # built once; the streams the exec was launched on (by this manager or anyone else:
        # GraphExec.launch notes them) and the arrays replaced while replays on them may be queued.
        self._shadow = shadow = ExecShadow(exec, graph.device, self._BATCH)
        nodes = [KernelShadow.of_launch(n.handle, n.launch, n.captured_args) for n in graph.nodes]
        for node in nodes:
            shadow.add_kernel(node)
        self._args: list[KernelArgs] = [node.args for node in nodes if node.args is not None]
        self._params = shadow.params
        self._handles = shadow.handles
        # Per binding, the argument slots it rewrites grouped by node, as ctypes views into the
        # persistent argument buffers (a .value store costs less than a NumPy item store).
        self._node_slots: dict[str, list[tuple[int, list[_Slot]]]] = {}
        for name in names:
            grouped: dict[int, list[_Slot]] = {}
            for i, arg, _ in self.bindings[name]:
                slot = self._args[i]._storage.ctypes.data + self._args[i].offsets[arg]
                grouped.setdefault(i, []).append(ctypes.c_uint64.from_address(slot))
            self._node_slots[name] = list(grouped.items())
        # Per node, every bindable slot in one fixed order, and where each name's slots sit in it;
        # _node_now caches the pointers those slots hold (None: not known, read the slots).
        canon: dict[int, list[_Slot]] = {}
        self._slot_index: dict[str, list[tuple[int, list[int]]]] = {}
        for name in names:
            per = []
            for i, views in self._node_slots[name]:
                slots = canon.setdefault(i, [])
                per.append((i, list(range(len(slots), len(slots) + len(views)))))
                slots.extend(views)
            self._slot_index[name] = per
        self._node_views = {node: tuple(views) for node, views in canon.items()}
        self._node_now: dict[int, tuple[int, ...] | None] = {node: None for node in canon}
        self._writers = any("write" in r for r in self._roles.values()) and len(names) > 1
        # (names..., ids...) of a set of arrays bound together -> its Binding (see bind_many)
        self._cache: dict[tuple[Any, ...], Binding] = {}
        # resource.release_count when the exec and graph were last seen open
        self._checked_at = -1
        # name -> {id(array): (weakref, ptr, nbytes, owner finalizer or None, address reader or None)}
        self._checked: dict[str, dict[int, _Checked]] = {name: {} for name in names}
        self._device = graph.device
        # Per binding, the nodes it rewrites (what bind pushes when its pointer changes).
        self._name_nodes = {name: [node for node, _views in self._node_slots[name]] for name in names}
        self._streams = shadow.streams
        self._keep = shadow.keep
        # One thread at a time changes the shadow parameters and the exec (see _locked).
        self._lock = threading.RLock()
        # Liveness of what a driver call here names: the exec (its handle) and the graph (its node
        # handles). A destroyed handle can be reused by the next exec, so a call on it could rewrite
        # another graph's parameters: every entry point checks these first.
        self._alive = (exec._finalizer, graph._finalizer)
        self._closed = False

    def _pin_foreign(self, holders: dict[str, list[str]], unreadable: list[str]) -> None:
        """Pin each name a node the manager does not update points into (``foreign_holders``)."""
        self._pin_epoch += 1
        self._pinned = {name: (self._bound_ptr[name][0], where) for name, where in holders.items()}
        if unreadable:
            warnings.warn(f"rawgraph: {len(unreadable)} foreign node(s) of this graph cannot be read "
                          f"({', '.join(unreadable[:4])}): if they use a bound buffer, binding it away leaves them "
                          f"on the old one", RawgraphWarning, stacklevel=3)

    @property
    def update_calls(self) -> int:
        """How many ``cuGraphExecKernelNodeSetParams`` calls took (the shadow's count)."""
        return self._shadow.pushes

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("ExecUpdateManager is closed")
        if not self._alive[0].alive:
            raise ClosedError("the GraphExec this manager updates is closed")
        if not self._alive[1].alive:
            raise ClosedError("the Graph whose node handles this manager names is closed")

    # -- binding --------------------------------------------------------------------------
    def bound(self, name: str) -> DeviceArray:
        """The array ``name`` is bound to now (a view; ``owner`` is the object passed to bind)."""
        shape, dtype = self._specs[name]
        return DeviceArray(self._bound_ptr[name][0], shape, dtype, self._bound_obj[name])

    def bind(self, name: str, array: Any) -> int:
        """Point every node argument bound to ``name`` at ``array``; returns driver updates made.

        The hot path of a replay loop: an array bound before (still alive, same object, at the
        same address) costs a dict lookup, an address read for an array whose memory can move (a
        torch tensor), an overlap check, one in-place pointer write per argument and one
        ``cuGraphExecKernelNodeSetParams`` per node that reads it -- none when the pointer did not
        change. Anything else goes through :meth:`bind_many`, which validates it.
        """
        with self._lock:  # inline, not @_locked: this is the per-replay path
            if self._closed or self._checked_at != _resource.release_count:
                self._check_usable()
                self._checked_at = _resource.release_count
            cache = self._checked.get(name)
            hit = cache.get(id(array)) if cache is not None else None
            # (the hit test of BindingChecks._resolve, inline: a dead or closed array, or one whose
            # memory moved while the object stayed, goes through the full check)
            if hit is None or hit[0]() is not array or (hit[3] is not None and not hit[3].alive) \
                    or (hit[4] is not None and hit[4](array) != hit[1]):
                return self.bind_many({name: array})
            ptr, nbytes = hit[1], hit[2]
            if self._writers:
                self._check_overlap_one(name, ptr, nbytes)
            pushed = 0
            if ptr != self._bound_ptr[name][0]:
                # The shadow core's kernel-node push, inline: this path is measured per replay
                # (issue 22's no-regression rule), and a call into ExecShadow.push cost 0.27 us
                # of host time here on the H100. Rollback stays the core's.
                shadow = self._shadow
                shadow.device.ensure_current()  # a SetParams on a thread with no context crashes
                setparams = driver.cuGraphExecKernelNodeSetParams
                exe, handles, params = shadow.handle, shadow.handles, shadow.params
                node_now = self._node_now
                for node, views in self._node_slots[name]:
                    for v in views:
                        v.value = ptr
                    node_now[node] = None
                    (err,) = setparams(exe, handles[node], params[node])
                    if err != _SUCCESS:
                        # the bound pointer back into the slots (_unbind), the nodes pushed before it too
                        raise shadow.roll_back(self._name_nodes[name], pushed, err, self._unbind, name)
                    pushed += 1
                shadow.pushes += pushed
                self._bound_ptr[name] = (ptr, nbytes)
            old_obj = self._bound_obj[name]
            if old_obj is not array:
                self._bound_obj[name] = array
                self._retire(old_obj)
            return pushed

    def _unbind(self, name: str) -> None:
        """Undo of a refused bind: the slots of ``name`` get its bound pointer back."""
        ptr = self._bound_ptr[name][0]
        for node, views in self._node_slots[name]:
            for v in views:
                v.value = ptr
            self._node_now[node] = None

    @_locked
    def bind_many(self, arrays: dict[str, Any]) -> int:
        """Bind several names at once, all validated before anything changes.

        Each node is pushed once (``cuGraphExecKernelNodeSetParams``) however many of its
        arguments change; a node none of whose arguments change is not pushed. If the driver
        refuses a push half-way, every argument and every node already pushed is put back, so
        the exec runs exactly its old bindings.

        A set of arrays bound before (the same objects, still alive) is not checked again: its
        :class:`Binding` is kept per set (weakly, so the cache keeps no array alive), and binding
        it costs one lookup, one identity check per array and the pushes. The overlap check is
        part of that when the set names every bindable buffer; otherwise it runs against the
        current bindings every time. :meth:`prepare` + :meth:`apply` skip the lookup too.

        Returns
        -------
        int
            Number of ``cuGraphExecKernelNodeSetParams`` calls made (0 when nothing changed).
        """
        if self._closed or self._checked_at != _resource.release_count:
            self._check_usable()
            self._checked_at = _resource.release_count
        values = tuple(arrays.values())
        key = (*arrays, *map(id, values))
        binding = self._cache.get(key)
        if binding is None or not binding.matches(values):
            binding = self._make_binding(arrays, values)
            self._remember(key, binding, values)
        elif self._writers and not binding.complete:
            self._check_overlap_with(binding)
        return self._apply(binding, values)

    @_locked
    def rebind(self, old: Any, new: Any) -> int:
        """Move every name bound to ``old`` over to ``new`` (one :meth:`bind_many`); returns the
        driver updates made.

        ``old`` is the array object that was captured or bound last (matched by identity), or
        any array with the same address and size. The allocation a captured view is part of is
        neither (two halves of one buffer captured as two arguments are two arrays, and the
        buffer matches neither). For graphs whose arrays were named at capture
        (a :class:`~rawgraph.RawKernel` call names each by its C parameter), this is binding by
        the array itself, with no name to know.

        Raises
        ------
        KeyError
            ``old`` is not bound to any name of this manager.
        """
        names = [n for n, obj in self._bound_obj.items() if obj is old]
        if not names:
            view = as_device_array(old, "old")
            names = [n for n, (ptr, nbytes) in self._bound_ptr.items() if (ptr, nbytes) == (view.ptr, view.nbytes)]
        if not names:
            raise KeyError(f"{type(old).__name__} is bound to none of {sorted(self.bindings)}")
        return self.bind_many({n: new for n in names})

    @_locked
    def prepare(self, arrays: dict[str, Any]) -> Binding:
        """Validate a set of arrays once and return it as a :class:`Binding` for :meth:`apply`.

        The binding holds its arrays (strongly: they stay alive while it exists, so nothing it
        names can be freed under it) and the argument slots they go to. Everything
        :meth:`bind_many` would refuse is refused here, before anything changes.
        """
        self._check_usable()
        values = tuple(arrays.values())
        binding = self._make_binding(arrays, values)
        binding.values = binding.holds = values
        binding.alive = finalizers(values)
        binding.checked_at = _resource.release_count
        return binding

    @_locked
    def apply(self, binding: Binding) -> int:
        """Bind a :class:`Binding` from :meth:`prepare` (``cuGraphExecKernelNodeSetParams`` per
        node whose slots hold other pointers); returns the pushes made.

        The cheapest way to re-point a replay at one of a few sets of arrays: no validation and no
        lookup, one identity check per node, the changed slots and the pushes. A binding whose
        array (a DeviceBuffer) was closed since it was made is refused with :class:`ClosedError`,
        one whose array's memory moved (a torch tensor after ``set_``) with :class:`ArrayError`.
        """
        if binding.manager is not self:
            raise ValueError("this Binding was prepared by another ExecUpdateManager")
        values = binding.values
        if values is None:
            raise ValueError("only a Binding from prepare() can be applied")
        if self._closed or binding.checked_at != _resource.release_count:
            self._check_usable()
            if not binding._still_open():
                raise ClosedError("an array of this Binding was closed after it was prepared")
        if binding.moves:
            moved = binding.moved(values)
            if moved is not None:  # its pointer would be the freed or reused memory the array left
                raise ArrayError(f"the array bound to {moved!r} by this Binding moved since it was prepared "
                                 "(the same object at another address): prepare the binding again")
        if binding.pin_epoch != self._pin_epoch:  # prepared before adopt() read new foreign nodes
            self._check_pins(binding, self._pin_epoch)
        if self._writers and not binding.complete:
            self._check_overlap_with(binding)
        return self._apply(binding, values)

    def _apply(self, binding: Binding, values: tuple[Any, ...]) -> int:
        """Write a binding's pointers into the nodes whose slots differ and push those nodes.

        Per node, the pointers its slots hold are cached as a tuple (the very tuple of the binding
        that put them there, so the common check is one identity test); on a refused push every
        node is put back (_unapply, then the shadow pushes the nodes the driver took again).
        """
        shadow = self._shadow  # its kernel-node push inline, as in bind()
        shadow.device.ensure_current()  # a SetParams on a thread with no context crashes
        setparams = driver.cuGraphExecKernelNodeSetParams
        exe, handles, params = shadow.handle, shadow.handles, shadow.params
        node_now = self._node_now
        changed: list[int] = []
        olds: list[tuple[int, ...]] = []
        for node, full, idx, vals, views, writes in binding.nodes:
            now = node_now[node]
            if now is full and now is not None:
                continue  # this binding's pointers are there already
            if now is None:
                now = tuple(v.value for v in views)
            if full is not None:
                if full == now:
                    node_now[node] = full
                    continue
                new = full
                for view, a in writes:
                    view.value = a
            else:
                merged = list(now)
                for i, val in zip(idx, vals):
                    merged[i] = val
                new = tuple(merged)
                if new == now:
                    node_now[node] = new
                    continue
                for view, a in zip(views, new):
                    view.value = a
            changed.append(node)
            olds.append(now)
            node_now[node] = new
            (err,) = setparams(exe, handles[node], params[node])
            if err != _SUCCESS:
                raise shadow.roll_back(changed, len(changed) - 1, err, self._unapply, (changed, olds))
        if changed:
            shadow.pushes += len(changed)
        self._bound_ptr.update(binding.entries)
        bound_obj = self._bound_obj
        if self._streams:  # replayed: a replaced array may still be read by queued replays
            replaced = []
            for name, obj in zip(binding.names, values):
                old = bound_obj[name]
                if old is not obj:
                    bound_obj[name] = obj  # first: the exec holds it now, whatever retiring does
                    replaced.append(old)
            self._retire_all(replaced)
        else:
            bound_obj.update(zip(binding.names, values))
        return len(changed)

    def _unapply(self, log: tuple[list[int], list[tuple[int, ...]]]) -> None:
        """Undo of a refused apply: each changed node's slots get the pointers they held."""
        for node, old in zip(*log):
            for view, a in zip(self._node_views[node], old):
                view.value = a
            self._node_now[node] = old

    def launch(self, stream: Any) -> None:
        """Replay the exec on ``stream`` (``cuGraphLaunch``; any stream-like object) with the
        current bindings. The stream is remembered, so arrays re-bound later stay alive until
        the replays on it have finished."""
        if self._closed or self._checked_at != _resource.release_count:
            self._check_usable()
            self._checked_at = _resource.release_count
        self.exec.launch(stream)  # notes the stream in exec.streams

    replay = launch

    # -- keeping bound memory alive -------------------------------------------------------
    # A replaced array may still be read by replays in flight. It is kept in ``_pending`` until an
    # event recorded after those replays completes. One event per used stream covers a whole batch
    # of retired arrays, so re-binding costs no driver call on most binds.
    _BATCH = 32

    def _retire(self, old: Any) -> None:
        self._shadow.retire(old)  # nothing held when the exec was never launched

    def _retire_all(self, objs: list[Any]) -> None:
        self._shadow.retire_all(objs)

    def collect(self) -> int:
        """Cover retired arrays with an event per stream the exec was launched on
        (``cuEventRecord``), release those whose replays have finished (``cuEventQuery``).

        Returns how many arrays are still held.
        """
        with self._lock:
            return self._keep.collect()

    @property
    def retained(self) -> list[Any]:
        """Objects no longer bound but kept alive for replays that may still read them."""
        return self._keep.retained

    # -- whole-graph update ---------------------------------------------------------------
    @_locked
    def adopt(self, graph: Graph) -> None:
        """Take over the parameters of ``graph`` after ``exec.update(graph)`` succeeded.

        The exec's nodes now hold ``graph``'s arguments; the shadows and bindings follow, and the
        original graph's node handles stay the ones ``cuGraphExecKernelNodeSetParams`` names.
        """
        if len(graph.nodes) != len(self.graph.nodes):
            raise ValueError("graph has a different number of nodes")
        plan = graph.plan
        if plan is None:
            raise ValueError("graph has no launch plan; capture it with capture_plan")
        # Everything that can fail (reading the new graph's other nodes) before anything changes.
        pins = foreign_holders(graph, {name: (plan.buffers[name].ptr, plan.buffers[name].nbytes) for name in self.bindings})
        for i, node in enumerate(graph.nodes):
            self._args[i]._storage[:] = np.frombuffer(node.captured_args, dtype=np.uint64)
        self._node_now = {n: None for n in self._node_now}
        replaced = []
        for name in self.bindings:
            view = plan.buffers[name]
            self._bound_ptr[name] = (view.ptr, view.nbytes)
            obj = captured_object(view)
            if self._bound_obj[name] is not obj:
                replaced.append(self._bound_obj[name])
                self._bound_obj[name] = obj
        self._keep_graph = graph  # its plan owns the buffers now bound
        # The exec's foreign nodes now hold this graph's values: pin again, and forget arrays
        # checked against the old pins.
        self._pin_foreign(*pins)
        for cache in self._checked.values():
            cache.clear()
        self._cache.clear()
        self._retire_all(replaced)  # last: a fence that cannot be recorded leaves the adoption whole

    def close(self) -> None:
        """Wait for every queued replay that may read a retired array, drop them and the pooled
        events (``cuEventRecord`` + ``cuEventSynchronize``; a stream closed since its launch is
        waited for through its tail event); later binds and launches raise :class:`ClosedError`.
        Safe twice; never stops half-way (a failed wait keeps the arrays and warns). The exec and
        graph are not closed."""
        with self._lock:
            self._closed = True
            self._keep.close()
            for cache in self._checked.values():
                cache.clear()
            self._cache.clear()

    def __enter__(self) -> "ExecUpdateManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
