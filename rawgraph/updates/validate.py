"""What :class:`~rawgraph.updates.manager.ExecUpdateManager` refuses before anything changes, and
the records a checked bind is made of.

Pure functions over explicit arguments (no manager state): the full check of one array
(:func:`check_new_array`: shape, dtype, device, layout, writable, pinned by a foreign node), the
overlap of a written buffer with any other (:func:`check_overlap`, :func:`check_overlap_one`), how
to read an array's address again (:func:`address_reader`). The records: :class:`Checked` (an array
checked once, cached by identity), :class:`BaseBinding` (the one family of prepared bindings, with
one liveness rule) and :class:`Binding` (a checked set of arrays, ready to push: per node a
:class:`~rawgraph.updates.shadow.NodeWrite`). None of them touches the exec.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..runtime import resource as _resource
from ..runtime.errors import ArrayError, ForeignNodeError, LayoutError
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from .shadow import NodeWrite

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.device import Device
    from .manager import ExecUpdateManager

__all__ = [
    "BaseBinding",
    "Binding",
    "Checked",
    "Move",
    "address_reader",
    "check_new_array",
    "check_overlap",
    "check_overlap_one",
    "finalizers",
]


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


class Checked:
    """An array checked once for one name, remembered by identity (weakly: the cache keeps
    nothing alive). A hit holds while ``ref()`` is the array, its owner DeviceBuffer is open
    (``alive``) and, for memory that can move, ``reread(array)`` still gives ``ptr``."""

    __slots__ = ("ref", "ptr", "nbytes", "alive", "reread")

    ref: weakref.ref[Any]
    ptr: int
    nbytes: int
    alive: weakref.finalize[..., Any] | None
    reread: Callable[[Any], int] | None

    def __init__(
        self,
        ref: weakref.ref[Any],
        ptr: int,
        nbytes: int,
        alive: weakref.finalize[..., Any] | None,
        reread: Callable[[Any], int] | None,
    ):
        self.ref = ref
        self.ptr = ptr
        self.nbytes = nbytes
        self.alive = alive
        self.reread = reread


def check_new_array(
    array: Any,
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    device: Device,
    writes: bool,
    pinned: tuple[int, list[str]] | None,
) -> DeviceArray:
    """``array`` as the view a bind of ``name`` may point nodes at, or the typed refusal: wrong
    shape, dtype, device or layout (:func:`~rawgraph.runtime.memory.check_array`), read-only memory
    a kernel writes through (``writes``), or another address for a name a foreign node holds an
    address in (``pinned``: the captured pointer and the nodes)."""
    view = check_array(as_device_array(array, name), shape, dtype, name, device)
    if view.readonly and writes:  # the rule RawKernel keeps at launch
        raise ArrayError(
            f"{name!r} is read-only memory (its producer exported it so), but a kernel of this "
            "graph writes through that argument: bind writable memory"
        )
    if pinned is not None and view.ptr != pinned[0]:
        raise ForeignNodeError(
            f"cannot bind {name!r} to another buffer: {', '.join(pinned[1][:4])} of this graph holds an address "
            f"in it, and the manager updates only the launches it recorded, so that node would keep using "
            f"the old buffer; move every address at once with rawgraph.updates.rebind.AddressRebinder"
        )
    return view


def check_overlap(write_names: list[str], spans: dict[str, tuple[int, int]]) -> None:
    """:class:`LayoutError` when a buffer a kernel writes (``write_names``) overlaps any other of
    ``spans`` (name -> (ptr, nbytes)): the kernels would read what another one is writing."""
    for wname in write_names:
        wp, wn = spans[wname]
        for rname, (rp, rn) in spans.items():
            if rname != wname and wp < rp + rn and rp < wp + wn:
                raise LayoutError(f"{wname} (written) overlaps {rname}")


def check_overlap_one(
    write_names: list[str], bound: dict[str, tuple[int, int]], name: str, ptr: int, nbytes: int
) -> None:
    """:func:`check_overlap` of ``bound`` with ``name`` moved to ``(ptr, nbytes)``, without
    building the merged spans (the bind fast path)."""
    for wname in write_names:
        if wname == name:
            for other, (op, on) in bound.items():
                if other != name and ptr < op + on and op < ptr + nbytes:
                    raise LayoutError(f"{name} (written) overlaps {other}")
        else:
            wp, wn = bound[wname]
            if wp < ptr + nbytes and ptr < wp + wn:
                raise LayoutError(f"{wname} (written) overlaps {name}")


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


class Move(NamedTuple):
    """An array of a binding whose memory can move while the object stays: its position, how
    to read its address again, and the address it was checked at."""

    position: int
    reread: Callable[[Any], int]
    ptr: int


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
    entries : tuple
        ``(name, (ptr, nbytes))`` per array, in order.
    nodes : tuple of NodeWrite
        Per node it touches, what it writes there.
    complete : bool
        It names every bindable buffer of its manager (its overlap check then holds whatever else
        is bound, so it is not repeated).
    """

    __slots__ = ("names", "entries", "nodes", "complete", "values", "refs", "pin_epoch", "moves")

    names: tuple[str, ...]
    entries: tuple[tuple[str, tuple[int, int]], ...]
    nodes: tuple[NodeWrite, ...]
    complete: bool
    values: tuple[Any, ...] | None
    refs: tuple[weakref.ref[Any], ...]
    pin_epoch: int
    moves: tuple[Move, ...]

    def __init__(
        self,
        manager: Any,
        entries: tuple[tuple[str, tuple[int, int]], ...],
        nodes: tuple[NodeWrite, ...],
        complete: bool,
        moves: tuple[Move, ...] = (),
    ):
        super().__init__(manager)
        self.checked_at = -1  # nothing named was seen open yet (prepare and the cache set it)
        self.names = tuple(name for name, _ in entries)
        self.entries = entries
        self.nodes = nodes
        self.complete = complete
        self.values = None  # the arrays, held strongly (prepare: also its ``holds``)
        self.refs = ()  # weak references to them (the bind_many cache)
        # the manager's pin epoch its entries were checked against (see ExecUpdateManager.follow_update)
        self.pin_epoch = manager._pin_epoch
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
