"""What the exec-update manager checks before anything changes: the arrays a bind names (shape,
dtype, device, layout, overlap, pinned by a foreign node) and the :class:`Binding` it makes of a
checked set. :class:`BindingChecks` is the part of
:class:`~rawgraph.updates.manager.ExecUpdateManager` that refuses; it never touches the exec.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from ..runtime import resource as _resource
from ..runtime.errors import ArrayError, ForeignNodeError, LayoutError
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from .shadow import BaseBinding, finalizers

if TYPE_CHECKING:
    from typing import TypeAlias

    from ..runtime.device import Device
    from .manager import ExecUpdateManager

    # One argument slot of a node's persistent buffer, as the ctypes word a bind stores a pointer in.
    _Slot: TypeAlias = ctypes.c_uint64
    # (name, (ptr, nbytes)) per array of a binding
    _Entry: TypeAlias = tuple[str, tuple[int, int]]
    # Per node a binding touches: (node, full, idx, vals, views, writes); see Binding.__init__.
    _NodeWrite: TypeAlias = tuple[int, tuple[int, ...] | None, tuple[int, ...], tuple[int, ...], tuple[_Slot, ...],
                                 tuple[tuple[_Slot, int], ...]]
    # (index, address reader, pointer checked) per array whose memory can move
    _Move: TypeAlias = tuple[int, Callable[[Any], int], int]
    # A checked array: (weak reference, ptr, nbytes, owner's finalizer or None, address reader or None)
    _Checked: TypeAlias = tuple[weakref.ref[Any], int, int, weakref.finalize[..., Any] | None,
                               Callable[[Any], int] | None]


def address_reader(obj: Any) -> Callable[[Any], int] | None:
    """How to read ``obj``'s device address again, for an array whose memory can move while the
    object stays (a torch tensor after ``t.set_(...)`` or ``t.data = other``); None for one whose
    address is fixed for its life.

    A cache of checked arrays keyed by identity compares this address on every hit: a stale
    address would point the exec at memory that may be freed. Fixed: a DeviceBuffer, a DeviceArray
    (frozen) and a CuPy array (its ``data`` pointer is read-only). A torch tensor is read with
    ``Tensor.data_ptr``, another ``__cuda_array_interface__`` object through its interface's
    pointer, a DLPack producer by exporting it again.
    """
    if isinstance(obj, (DeviceBuffer, DeviceArray)):
        return None
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        data_ptr: Callable[[Any], int] = torch.Tensor.data_ptr
        return data_ptr
    if hasattr(type(obj), "__cuda_array_interface__"):
        return _interface_address
    return _exported_address


def _interface_address(obj: Any) -> int:
    ptr: int = obj.__cuda_array_interface__["data"][0]
    return ptr


def _exported_address(obj: Any) -> int:
    return as_device_array(obj).ptr


class Binding(BaseBinding):
    """A validated set of arrays for one :class:`~rawgraph.updates.manager.ExecUpdateManager`,
    ready to push.

    Made by :meth:`ExecUpdateManager.prepare` (which holds its arrays strongly: drop the binding
    to let them go) or kept internally by :meth:`ExecUpdateManager.bind_many` (weakly: the cache
    keeps nothing alive). Applying it (:meth:`ExecUpdateManager.apply`) writes its pointers into
    the argument slots of the nodes whose slots hold something else and pushes those nodes.

    Attributes
    ----------
    names : tuple of str
        The bindings it sets, in order.
    complete : bool
        It names every bindable buffer of its manager (its overlap check then holds whatever else
        is bound, so it is not repeated).
    """

    __slots__ = ("names", "entries", "nodes", "complete", "values", "refs", "pin_epoch", "moves")

    names: tuple[str, ...]
    entries: tuple[_Entry, ...]
    nodes: tuple[_NodeWrite, ...]
    complete: bool
    values: tuple[Any, ...] | None
    refs: tuple[weakref.ref[Any], ...]
    pin_epoch: int
    moves: tuple[_Move, ...]

    def __init__(self, manager: Any, entries: tuple[_Entry, ...], nodes: tuple[_NodeWrite, ...], complete: bool,
                 moves: tuple[_Move, ...] = ()):
        super().__init__(manager)
        self.checked_at = -1  # nothing named was seen open yet (prepare and the cache set it)
        self.names = tuple(name for name, _ in entries)
        # (name, (ptr, nbytes)) per array
        self.entries = entries
        # per node touched: (node, full, idx, vals, views, writes). ``full``: the pointers of
        # every bindable slot of the node when the set covers them all (else None, and
        # ``idx``/``vals`` say which slots it sets to what); ``views``: those slots; ``writes``:
        # (slot, pointer) pairs when ``full`` is known.
        self.nodes = nodes
        self.complete = complete
        self.values = None  # the arrays, held strongly (prepare: also its ``holds``)
        self.refs = ()  # weak references to them (the bind_many cache)
        # the manager's pin epoch its entries were checked against (see ExecUpdateManager.adopt)
        self.pin_epoch = manager._pin_epoch
        # (index, address_reader, pointer checked) per array whose memory can move
        self.moves = moves

    @property
    def manager(self) -> ExecUpdateManager:
        manager: ExecUpdateManager = self.owner
        return manager

    def matches(self, values: tuple[Any, ...]) -> bool:
        """The same live objects as when validated (weak identity; no closed DeviceBuffer), each
        still at the address it was checked at."""
        if len(values) != len(self.refs):
            return False
        for ref, obj in zip(self.refs, values):
            if ref() is not obj:
                return False
        return self.is_open() and not (self.moves and self.moved(values))

    def moved(self, values: tuple[Any, ...]) -> str | None:
        """The name of an array whose memory moved since it was checked, else None."""
        for i, read, ptr in self.moves:
            if read(values[i]) != ptr:
                return self.names[i]
        return None

    def __repr__(self) -> str:
        return f"Binding({', '.join(self.names)}; {len(self.nodes)} nodes)"


class BindingChecks:
    """The manager's refusals: every one runs before anything changes."""

    bindings: dict[str, list[tuple[int, str, str]]]
    _specs: dict[str, tuple[tuple[int, ...], np.dtype[Any]]]  # (shape, dtype) per name
    _device: Device
    _pinned: dict[str, tuple[int, list[str]]]
    _checked: dict[str, dict[int, _Checked]]  # per name, by id() of the array
    _bound_ptr: dict[str, tuple[int, int]]
    _write_names: list[str]
    _roles: dict[str, set[str]]
    _writers: bool
    _slot_index: dict[str, list[tuple[int, list[int]]]]
    _node_views: dict[int, tuple[_Slot, ...]]
    _cache: dict[tuple[Any, ...], Binding]  # (names..., ids...) -> its Binding

    def _resolve(self, name: str, array: Any) -> tuple[int, int]:
        """``(ptr, nbytes)`` of a checked array (shape, dtype, layout, device).

        An array already checked is remembered per (name, object) -- by weak reference, so the
        cache keeps nothing alive -- with its address and how to read that again
        (:func:`address_reader`), and re-binding it costs a dict lookup and, for an array whose
        memory can move, one address read. A closed DeviceBuffer or an array whose memory moved
        fails the lookup and goes through the full check.
        """
        if name not in self.bindings:
            raise KeyError(f"unknown binding {name!r}; bindable: {sorted(self.bindings)}")
        cache = self._checked[name]
        hit = cache.get(id(array))
        if hit is not None and hit[0]() is array and (hit[3] is None or hit[3].alive) \
                and (hit[4] is None or hit[4](array) == hit[1]):
            return hit[1], hit[2]
        shape, dtype = self._specs[name]
        view = check_array(as_device_array(array, name), shape, dtype, name, self._device)
        if view.readonly and "write" in self._roles[name]:  # the rule RawKernel keeps at launch
            raise ArrayError(f"{name!r} is read-only memory (its producer exported it so), but a kernel of this "
                             "graph writes through that argument: bind writable memory")
        pinned = self._pinned.get(name)
        if pinned is not None and view.ptr != pinned[0]:
            raise ForeignNodeError(
                f"cannot bind {name!r} to another buffer: {', '.join(pinned[1][:4])} of this graph holds an address "
                f"in it, and the manager updates only the launches it recorded, so that node would keep using "
                f"the old buffer; move every address at once with rawgraph.updates.rebind.AddressRebinder")
        try:
            ref = weakref.ref(array)
        except TypeError:  # not weak-referenceable: checked every time
            return view.ptr, view.nbytes
        owner = view.owner
        alive = owner._finalizer if isinstance(owner, DeviceBuffer) else None
        if len(cache) > 1024:
            cache.clear()
        cache[id(array)] = (ref, view.ptr, view.nbytes, alive, address_reader(array))
        return view.ptr, view.nbytes

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

    def _check_overlap(self, spans: dict[str, tuple[int, int]]) -> None:
        for wname in self._write_names:
            wp, wn = spans[wname]
            for rname, (rp, rn) in spans.items():
                if rname != wname and wp < rp + rn and rp < wp + wn:
                    raise LayoutError(f"{wname} (written) overlaps {rname}")

    def _check_overlap_with(self, binding: Binding) -> None:
        spans = dict(self._bound_ptr)
        spans.update(binding.entries)
        self._check_overlap(spans)

    def _check_pins(self, binding: Binding, epoch: int) -> None:
        """A binding prepared before adopt() read new foreign nodes: check it against the new pins."""
        for name, (ptr, _n) in binding.entries:
            pinned = self._pinned.get(name)
            if pinned is not None and ptr != pinned[0]:
                raise ForeignNodeError(f"this Binding moves {name!r}, which {', '.join(pinned[1][:4])} of the "
                                       f"adopted graph holds an address in; the manager cannot move that node")
        binding.pin_epoch = epoch

    def _make_binding(self, arrays: dict[str, Any], values: tuple[Any, ...]) -> Binding:
        """Validate a set of arrays (refusing before anything changes) and precompute its slots."""
        entries = tuple((name, self._resolve(name, a)) for name, a in arrays.items())
        if self._writers:
            spans = dict(self._bound_ptr)
            spans.update(entries)
            self._check_overlap(spans)
        want: dict[int, list[int | None]] = {}
        for name, (ptr, _nb) in entries:
            for node, positions in self._slot_index[name]:
                w = want.setdefault(node, [None] * len(self._node_views[node]))
                for i in positions:
                    w[i] = ptr
        nodes: list[_NodeWrite] = []
        for node, w in want.items():
            full = tuple(w) if None not in w else None
            idx = tuple(i for i, v in enumerate(w) if v is not None)
            views = self._node_views[node]
            writes = tuple(zip(views, full)) if full is not None else ()
            # (no None in full, writes or vals: full only when every slot is set, vals only at set slots)
            nodes.append(cast("_NodeWrite", (node, full, idx, tuple(w[i] for i in idx), views, writes)))
        moves = tuple((i, read, ptr) for i, (a, (_name, (ptr, _nb))) in enumerate(zip(values, entries))
                      if (read := address_reader(a)) is not None)
        return Binding(self, entries, tuple(nodes), set(arrays) >= set(self.bindings), moves)

    def _remember(self, key: tuple[Any, ...], binding: Binding, values: tuple[Any, ...]) -> None:
        try:
            binding.refs = tuple(weakref.ref(a) for a in values)
        except TypeError:  # an array that cannot be weakly referenced: checked every time
            return
        binding.alive = finalizers(values)
        binding.checked_at = _resource.release_count
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = binding
