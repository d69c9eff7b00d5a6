"""Feeding replays new data without a copy: re-bind kernel-node arguments in the exec.

The mechanism, read top to bottom, is :mod:`rawgraph.updates.shadow` (where a node's parameters
live, which argument words a bind changes, the push, the rollback, the keep-alive) over the
capture's node map (``graph.nodes[i]``: launch ``i`` of the plan, its handle and captured argument
bytes). This module is its front door for rawgraph's own graphs: the bindable names (``x``,
``out``, or each array a :class:`~rawgraph.RawKernel` call named), the arrays already checked for
each (so a per-replay bind of a known array costs a lookup), the prepared :class:`Binding`, the
scalar and grid edits, and following a whole-graph update. An array bound away from stays alive
until the replays queued before the bind have finished, so a caching allocator (CuPy's pool,
PyTorch's) cannot hand it out while a graph still reads it.

What a bind refuses (shape, dtype, device, layout, overlap, a foreign node's pin) is checked
before anything changes, by the functions of :mod:`rawgraph.updates.validate`; the scalar and
grid checks are in :mod:`rawgraph.updates.setters`.

Only the recorded launches are updated. Foreign nodes (``graph.foreign_nodes``: a CuPy kernel, a
memset launched straight on the capturing stream) and recorded non-kernel nodes
(``graph.other_nodes``: memcpys, conditionals) are read once, and a buffer one of them holds an
address in cannot be bound away from its captured address
(:class:`~rawgraph.runtime.errors.ForeignNodeError`): that node would go on using the old buffer.
A node whose parameters the driver does not give back (a conditional's body on some drivers)
cannot be checked: the manager warns (:class:`~rawgraph.runtime.errors.RawgraphWarning`) and binds.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from ..graphs.graph import Graph, GraphExec
from ..runtime import resource as _resource
from ..runtime.errors import ArrayError, ClosedError, ForeignNodeError, RawgraphError, RawgraphWarning
from ..runtime.launch import ARG_DTYPES, KernelArgs
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array
from .addresses import foreign_holders
from .setters import ScalarUndo, check_grid, restore_scalars, stored_scalar
from .shadow import ArgumentSlots, ExecShadow, KernelShadow, NameSlots, refuse_device_updatable
from .validate import (
    Binding,
    Checked,
    Move,
    address_reader,
    check_new_array,
    check_overlap,
    check_overlap_one,
    finalizers,
)

__all__ = ["Binding", "ExecUpdateManager"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run ``method`` holding the manager's lock: the shadow parameters, the bound pointers and the
    exec change together, so two threads binding at once cannot leave them disagreeing."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_F, locked)  # same signature: it only wraps the call in the lock


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


class _Name:
    """One bindable name: what an array bound to it must be, the argument words its pointer goes
    to (``at``, the shadow's :class:`~rawgraph.updates.shadow.NameSlots`), and the arrays already
    checked for it."""

    __slots__ = ("shape", "dtype", "writes", "at", "checked", "pinned")

    def __init__(self, view: DeviceArray, writes: bool, at: NameSlots):
        self.shape, self.dtype = view.shape, view.dtype
        self.writes = writes  # a kernel writes through it (read-only memory is refused)
        self.at = at
        self.checked: dict[int, Checked] = {}  # by id() of the array
        self.pinned: tuple[int, list[str]] | None = None  # (captured ptr, foreign nodes holding an address in it)


class ExecUpdateManager:
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

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html

    Notes
    -----
    Threads: every call that changes the bindings (``bind``, ``bind_many``, ``prepare``,
    ``apply``, ``set_params``, a scalar setter, ``adopt``, ``close``) holds one lock, so calls from
    several threads run one after another and the shadow parameters always equal what the exec
    holds. ``launch`` takes no lock: which bindings a replay sees when another thread binds at the
    same moment is the caller's ordering to choose.

    State: 16 instance attributes, each read on a hot path where one more indirection would cost
    per replay; what needs releasing (the arrays held for queued replays, the pooled events) is in
    one holder, the shadow's keep-alive, which :meth:`close` drains.
    """

    # Retired arrays collected before a covering fence is recorded (KeepAlive's batch).
    _BATCH = 32

    def __init__(self, graph: Graph, exec: GraphExec, names: Sequence[str] | None = None):
        if exec.graph is not graph:
            raise ValueError("exec was not instantiated from this graph")
        refuse_device_updatable(exec)  # before the foreign-node scan below calls the driver
        plan = graph.plan
        if plan is None:
            raise ValueError(
                "graph has no launch plan: capture it with capture_plan, or launch into the "
                "Capture through RawKernel calls or Capture.run so its arrays are named"
            )
        # capture_plan records launch i as node i; check it rather than assume it.
        if len(graph.nodes) != len(plan.launches) or not all(n.launch is l for n, l in zip(graph.nodes, plan.launches)):
            raise ValueError("the graph's node map does not follow its plan's launch order")
        self.graph = graph
        self.exec = exec
        names = tuple(names) if names is not None else plan.inputs + plan.outputs
        self.bindings: dict[str, list[tuple[int, str, str]]] = {}
        for name in names:
            uses = plan.uses_of(name)
            if not uses:
                raise KeyError(f"no node argument uses buffer {name!r}")
            self.bindings[name] = list(uses)
        # Where each node's parameters live: persistent copies of the captured arguments (binding
        # never disturbs the eager plan) and the CUDA_KERNEL_NODE_PARAMS pointing at them, in the
        # exec's shadow with the streams it was launched on and the keep-alive over them.
        self._shadow = shadow = ExecShadow(exec, graph.device, self._BATCH)
        kernels = [KernelShadow.of_launch(n.handle, n.launch, n.captured_args) for n in graph.nodes]
        for node in kernels:
            shadow.add_kernel(node)
        self._args: list[KernelArgs] = [node.args for node in kernels if node.args is not None]
        # Which argument words each name's bind changes (the shadow's slot table), and what an array
        # bound to each name must be.
        self._slots = ArgumentSlots(self._args, {n: [(i, arg) for i, arg, _ in self.bindings[n]] for n in names})
        self._names = {
            name: _Name(plan.buffers[name], any(r == "write" for _, _, r in uses), self._slots.names[name])
            for name, uses in self.bindings.items()
        }
        # What each name is bound to now: (ptr, nbytes), and the object passed (held, for replays).
        self._bound_ptr = {name: (plan.buffers[name].ptr, plan.buffers[name].nbytes) for name in names}
        self._bound_obj = {name: captured_object(plan.buffers[name]) for name in names}
        # Names a kernel writes, when there is another name they could overlap (else none to check).
        self._write_names = [n for n in names if self._names[n].writes] if len(names) > 1 else []
        self._pin_epoch = -1
        self._pin_foreign(*foreign_holders(graph, self._bound_ptr))
        # (names..., ids...) of a set of arrays bound together -> its Binding (see bind_many)
        self._cache: dict[tuple[Any, ...], Binding] = {}
        # resource.release_count when the exec and graph were last seen open
        self._checked_at = -1
        self._keep_graph: Graph | None = None  # after follow_update(): the graph whose plan owns the bound buffers
        # One thread at a time changes the shadow parameters and the exec (see _locked).
        self._lock = threading.RLock()
        self._closed = False

    def _pin_foreign(self, holders: dict[str, list[str]], unreadable: list[str]) -> None:
        """Pin each name a node the manager does not update points into (``foreign_holders``)."""
        self._pin_epoch += 1
        for name, rec in self._names.items():
            where = holders.get(name)
            rec.pinned = None if where is None else (self._bound_ptr[name][0], where)
        if unreadable:
            warnings.warn(
                f"rawgraph: {len(unreadable)} foreign node(s) of this graph cannot be read "
                f"({', '.join(unreadable[:4])}): if they use a bound buffer, binding it away leaves them "
                f"on the old one",
                RawgraphWarning,
                stacklevel=3,
            )

    @property
    def _handles(self) -> list[Any]:
        """Per node, its handle (the shadow's list: what the consistency checks and benchmarks read)."""
        return self._shadow.handles

    @property
    def _params(self) -> list[Any]:
        """Per node, the ``CUDA_KERNEL_NODE_PARAMS`` a push gives the driver (the shadow's list)."""
        return self._shadow.params

    @property
    def update_calls(self) -> int:
        """How many ``cuGraphExecKernelNodeSetParams`` calls took (the shadow's count).

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        return self._shadow.pushes

    def _check_usable(self) -> None:
        """Refuse a closed manager, or an exec or graph closed under it: a destroyed handle can be
        reused by the next exec, so a call on it could rewrite another graph's parameters."""
        if self._closed:
            raise ClosedError("ExecUpdateManager is closed")
        if not self.exec._finalizer.alive:
            raise ClosedError("the GraphExec this manager updates is closed")
        if not self.graph._finalizer.alive:
            raise ClosedError("the Graph whose node handles this manager names is closed")

    # -- binding --------------------------------------------------------------------------
    def bound(self, name: str) -> DeviceArray:
        """The array ``name`` is bound to now (a view; ``owner`` is the object passed to bind)."""
        rec = self._names[name]
        return DeviceArray(self._bound_ptr[name][0], rec.shape, rec.dtype, self._bound_obj[name])

    def bind(self, name: str, array: Any) -> int:
        """Point every node argument bound to ``name`` at ``array``; returns driver updates made.

        The hot path of a replay loop: an array bound before (still alive, same object, at the
        same address) costs a dict lookup, an address read for an array whose memory can move (a
        torch tensor), an overlap check, one in-place pointer write per argument and one
        ``cuGraphExecKernelNodeSetParams`` per node that reads it -- none when the pointer did not
        change. Anything else goes through :meth:`bind_many`, which validates it.

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        with self._lock:  # inline, not @_locked: this is the per-replay path
            if self._closed or self._checked_at != _resource.release_count:
                self._check_usable()
                self._checked_at = _resource.release_count
            rec = self._names.get(name)
            hit = rec.checked.get(id(array)) if rec is not None else None
            # (the hit test of _resolve, inline: a dead or closed array, or one whose memory moved
            # while the object stayed, goes through the full check)
            if (
                hit is None
                or hit.ref() is not array
                or (hit.alive is not None and not hit.alive.alive)
                or (hit.reread is not None and hit.reread(array) != hit.ptr)
            ):
                return self.bind_many({name: array})
            ptr, nbytes = hit.ptr, hit.nbytes
            pushed = 0
            if ptr != self._bound_ptr[name][0]:
                # only a new address can overlap anew: the span of a name is fixed by its shape,
                # and the bound ones were checked when they were bound
                if self._write_names:
                    check_overlap_one(self._write_names, self._bound_ptr, name, ptr, nbytes)
                at, node_now = rec.at, self._slots.now  # type: ignore[union-attr]  # (a hit implies rec)
                for node, views in at.words:  # ArgumentSlots.point, inline: the per-replay path
                    for v in views:
                        v.value = ptr
                    node_now[node] = None
                pushed = self._shadow.push(at.nodes, self._slots.undo_point, (name, self._bound_ptr[name][0]))
                self._bound_ptr[name] = (ptr, nbytes)
            old_obj = self._bound_obj[name]
            if old_obj is not array:
                self._bound_obj[name] = array
                self._shadow.keep.retire(old_obj)  # nothing held when the exec was never launched
            return pushed

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

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
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
        elif self._write_names and not binding.complete:
            check_overlap(self._write_names, {**self._bound_ptr, **dict(binding.entries)})
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

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
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
                raise ArrayError(
                    f"the array bound to {moved!r} by this Binding moved since it was prepared "
                    "(the same object at another address): prepare the binding again"
                )
        if binding.pin_epoch != self._pin_epoch:  # prepared before follow_update() read new foreign nodes
            for name, (ptr, _n) in binding.entries:
                pinned = self._names[name].pinned
                if pinned is not None and ptr != pinned[0]:
                    raise ForeignNodeError(
                        f"this Binding moves {name!r}, which {', '.join(pinned[1][:4])} of the "
                        f"adopted graph holds an address in; the manager cannot move that node"
                    )
            binding.pin_epoch = self._pin_epoch
        if self._write_names and not binding.complete:
            check_overlap(self._write_names, {**self._bound_ptr, **dict(binding.entries)})
        return self._apply(binding, values)

    def _resolve(self, name: str, array: Any) -> tuple[int, int]:
        """``(ptr, nbytes)`` of a checked array (:func:`~rawgraph.updates.validate.check_new_array`).

        An array already checked is remembered per (name, object) -- by weak reference, so the
        cache keeps nothing alive -- with its address and how to read that again
        (:func:`~rawgraph.updates.validate.address_reader`): re-binding it costs a dict lookup and,
        for an array whose memory can move, one address read. A closed DeviceBuffer or an array
        whose memory moved fails the lookup and goes through the full check.
        """
        rec = self._names.get(name)
        if rec is None:
            raise KeyError(f"unknown binding {name!r}; bindable: {sorted(self.bindings)}")
        hit = rec.checked.get(id(array))
        if (
            hit is not None
            and hit.ref() is array
            and (hit.alive is None or hit.alive.alive)
            and (hit.reread is None or hit.reread(array) == hit.ptr)
        ):
            return hit.ptr, hit.nbytes
        view = check_new_array(array, name, rec.shape, rec.dtype, self._shadow.device, rec.writes, rec.pinned)
        try:
            ref = weakref.ref(array)
        except TypeError:  # not weak-referenceable: checked every time
            return view.ptr, view.nbytes
        owner = view.owner
        if len(rec.checked) > 1024:
            rec.checked.clear()
        rec.checked[id(array)] = Checked(
            ref,
            view.ptr,
            view.nbytes,
            owner._finalizer if isinstance(owner, DeviceBuffer) else None,
            address_reader(array),
        )
        return view.ptr, view.nbytes

    def _make_binding(self, arrays: dict[str, Any], values: tuple[Any, ...]) -> Binding:
        """Validate a set of arrays (refusing before anything changes) and precompute, per node,
        which of its bindable slots get which pointer."""
        entries = tuple((name, self._resolve(name, a)) for name, a in arrays.items())
        if self._write_names:
            check_overlap(self._write_names, {**self._bound_ptr, **dict(entries)})
        moves = tuple(
            Move(i, read, ptr)
            for i, (a, (_name, (ptr, _nb))) in enumerate(zip(values, entries))
            if (read := address_reader(a)) is not None
        )
        return Binding(self, entries, self._slots.plan(entries), set(arrays) >= set(self.bindings), moves)

    def _remember(self, key: tuple[Any, ...], binding: Binding, values: tuple[Any, ...]) -> None:
        """Cache a binding for :meth:`bind_many`, weakly (nothing kept alive by the cache)."""
        try:
            binding.refs = tuple(weakref.ref(a) for a in values)
        except TypeError:  # an array that cannot be weakly referenced: checked every time
            return
        binding.alive = finalizers(values)
        binding.checked_at = _resource.release_count
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = binding

    def _apply(self, binding: Binding, values: tuple[Any, ...]) -> int:
        """Write a binding's pointers into the nodes whose words differ
        (:meth:`ArgumentSlots.write <rawgraph.updates.shadow.ArgumentSlots.write>`) and push those
        nodes; on a refused push every changed node is put back and the nodes the driver took are
        pushed again."""
        slots = self._slots
        changed, olds = slots.write(binding.nodes)
        pushed = self._shadow.push(changed, slots.put_back, (changed, olds)) if changed else 0
        self._bound_ptr.update(binding.entries)
        bound_obj = self._bound_obj
        if self._shadow.streams:  # replayed: a replaced array may still be read by queued replays
            replaced = []
            for name, obj in zip(binding.names, values):
                old = bound_obj[name]
                if old is not obj:
                    bound_obj[name] = obj  # first: the exec holds it now, whatever retiring does
                    replaced.append(old)
            self._shadow.keep.retire_all(replaced)
        else:
            bound_obj.update(zip(binding.names, values))
        return pushed

    def launch(self, stream: Any) -> None:
        """Replay the exec on ``stream`` (``cuGraphLaunch``; any stream-like object) with the
        current bindings. The stream is remembered, so arrays re-bound later stay alive until
        the replays on it have finished.

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if self._closed or self._checked_at != _resource.release_count:
            self._check_usable()
            self._checked_at = _resource.release_count
        self.exec.launch(stream)  # notes the stream in exec.streams

    replay = launch

    # -- scalars and grid -----------------------------------------------------------------
    @_locked
    def set_params(self, node: int, grid: tuple[int, ...] | None = None, **scalars: int | float) -> int:
        """Change a node's scalar arguments and/or grid in the exec (``cuGraphExecKernelNodeSetParams``).

        The change takes effect for launches made after the call. Pointer arguments are not
        accepted here (:meth:`bind` validates what they point at); the block size is compiled
        into the kernels and not accepted either.

        Parameters
        ----------
        node : int
            Node index in capture order.
        grid : int or tuple of int, optional
            New grid (an int or 1 to 3 positive ints, within :data:`~rawgraph.runtime.launch.MAX_GRID`).
            For a kernel compiled with fixed cluster dimensions each grid dimension must be a
            multiple of the cluster's.
        **scalars
            New values of scalar arguments (any kind of :data:`~rawgraph.runtime.launch.ARG_DTYPES` but ``ptr``), by name.

        Returns
        -------
        int
            1 when the node was pushed, 0 when nothing changed.

        Raises
        ------
        KeyError
            Unknown node or argument.
        TypeError
            A pointer argument, or a value its C type cannot hold (:class:`ArgumentError`, as a
            launch refuses it).
        ShapeError
            A grid that is not 1 to 3 positive ints, is larger than ``MAX_GRID`` or does not
            fit the kernel's cluster dimensions.

        Every refusal comes before anything changes: the shadow and the exec keep what they held.

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        # (Over 60 lines with its reference docstring; the body is the checks in the order a launch
        # makes them, then one edit and one push: splitting it would split that order.)
        self._check_usable()
        if not 0 <= node < len(self._args):
            raise KeyError(f"node {node} is not in this graph (0..{len(self._args) - 1})")
        args, params = self._args[node], self._shadow.params[node]
        kinds = dict(args.spec)
        # Everything is checked before the shadow changes: a refused call leaves the shadow equal
        # to the exec, so the next push of this node (any bind that moves one of its arrays)
        # carries none of it.
        values = {}
        for arg, value in scalars.items():
            if arg not in kinds:
                raise KeyError(
                    f"node {node} ({self.graph.nodes[node].launch.kernel.name}) has no argument {arg!r}; "
                    f"it has {args.names()}"
                )
            if kinds[arg] == "ptr":
                raise TypeError(f"{arg!r} is a pointer argument: rebind it with bind() so the array is checked")
            if kinds[arg] not in ARG_DTYPES:
                raise TypeError(
                    f"{arg!r} ({kinds[arg]}) is passed by value as an array: edit it with "
                    "the launch's args.array() and set_params"
                )
            values[arg] = stored_scalar(kinds[arg], value, repr(arg))
        new_grid = None if grid is None else check_grid(grid, self.graph.nodes[node].launch.kernel.cluster_dims)
        old_values = {arg: args[arg] for arg in values}
        old_grid = (params.gridDimX, params.gridDimY, params.gridDimZ)
        if all(old_values[a] == v for a, v in values.items()) and new_grid in (None, old_grid):
            return 0
        # Neither edit can fail now; a refused push puts both back (restore_scalars).
        args.update(values)
        if new_grid is not None:
            params.gridDimX, params.gridDimY, params.gridDimZ = new_grid
        return self._shadow.push((node,), restore_scalars, ScalarUndo(args, params, old_values, old_grid))

    def scalar_setter(self, node: int, arg: str) -> Any:
        """A fast setter for one scalar argument of one node: the node and argument are checked
        here once (as :meth:`set_params` checks them), then each call ``setter(value)`` checks the
        value as :meth:`set_params` and a launch do (:class:`ArgumentError`, before anything
        changes), writes it and pushes the node only when it changed
        (``cuGraphExecKernelNodeSetParams``); returns the pushes made (0 or 1). For per-step
        updates such as a live row count.

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self.set_params(node, None, **{arg: self._args[node][arg]})  # validates node, arg and kind
        kind, what = dict(self._args[node].spec)[arg], repr(arg)
        view = self._args[node]._views[arg]
        push = self._shadow.push
        nodes = (node,)
        alive = (self.exec._finalizer, self.graph._finalizer)
        lock = self._lock

        def restore(old: Any) -> None:
            view[0] = old

        def setter(value: int | float) -> int:
            with lock:
                if self._closed or not (alive[0].alive and alive[1].alive):
                    self._check_usable()
                stored = stored_scalar(kind, value, what)
                if view[0] == stored:
                    return 0
                old = view[0].item()
                view[0] = stored
                return push(nodes, restore, old)

        return setter

    def node_params(self, node: int) -> dict[str, Any]:
        """What this manager last gave the exec for ``node``: grid and argument values (the
        driver has no getter for exec node parameters; this is the shadow it keeps)."""
        p, args = self._shadow.params[node], self._args[node]
        return {"grid": (p.gridDimX, p.gridDimY, p.gridDimZ), **{n: args[n] for n in args.names()}}

    # -- keeping bound memory alive -------------------------------------------------------
    def collect(self) -> int:
        """Cover retired arrays with an event per stream the exec was launched on
        (``cuEventRecord``), release those whose replays have finished (``cuEventQuery``).

        Returns how many arrays are still held.

        See Also
        --------
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        cuEventQuery : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        with self._lock:
            return self._shadow.keep.collect()

    @property
    def retained(self) -> list[Any]:
        """Objects no longer bound but kept alive for replays that may still read them."""
        return self._shadow.keep.retained

    # -- whole-graph update ---------------------------------------------------------------
    def adopt(self, graph: Graph) -> None:
        """Deprecated name of :meth:`follow_update` (:func:`rawgraph.adopt` wraps a graph made
        elsewhere; this follows an exec update)."""
        warnings.warn(
            "ExecUpdateManager.adopt is deprecated: use ExecUpdateManager.follow_update",
            DeprecationWarning,
            stacklevel=2,
        )
        self.follow_update(graph)

    @_locked
    def follow_update(self, graph: Graph) -> None:
        """Take over the parameters of ``graph`` after ``exec.update(graph)`` succeeded.

        The exec's nodes now hold ``graph``'s arguments; the shadows and bindings follow, and the
        original graph's node handles stay the ones ``cuGraphExecKernelNodeSetParams`` names.

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if len(graph.nodes) != len(self.graph.nodes):
            raise ValueError("graph has a different number of nodes")
        plan = graph.plan
        if plan is None:
            raise ValueError("graph has no launch plan; capture it with capture_plan")
        # Everything that can fail (reading the new graph's other nodes) before anything changes.
        pins = foreign_holders(
            graph, {name: (plan.buffers[name].ptr, plan.buffers[name].nbytes) for name in self.bindings}
        )
        for i, node in enumerate(graph.nodes):
            self._args[i]._storage[:] = np.frombuffer(node.captured_args, dtype=np.uint64)
            # the exec now runs graph's launch configuration too: a grid set_params gave the old
            # one must not come back with the next push of this node
            launch, p = node.launch, self._shadow.params[i]
            p.gridDimX, p.gridDimY, p.gridDimZ = launch.grid
            p.blockDimX, p.blockDimY, p.blockDimZ = launch.block
            p.sharedMemBytes = launch.shared_mem
        self._slots.forget()
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
        for rec in self._names.values():
            rec.checked.clear()
        self._cache.clear()
        self._shadow.keep.retire_all(replaced)  # last: a fence that cannot be recorded leaves the adoption whole

    def close(self) -> None:
        """Wait for every queued replay that may read a retired array, drop them and the pooled
        events (``cuEventRecord`` + ``cuEventSynchronize``; a stream closed since its launch is
        waited for through its tail event); later binds and launches raise :class:`ClosedError`.
        Safe twice; never stops half-way (a failed wait keeps the arrays and warns). The exec and
        graph are not closed.

        See Also
        --------
        cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        cuEventSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
        """
        with self._lock:
            self._closed = True
            self._shadow.keep.close()
            for rec in self._names.values():
                rec.checked.clear()
            self._cache.clear()

    def __enter__(self) -> ExecUpdateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
