"""What serving and control need of a model: the row-wise model protocol, and a scratch arena.

Bucket graphs, row-count rebinding, re-shaped graphs, slot pools, the depth loop and the norm
gate run any object that keeps this protocol; :class:`~rawgraph.models.TinyBlock` is one,
``examples/buckets_own_model_class.py`` (an RMSNorm made of the user's own
:class:`~rawgraph.RawKernel` kernels) is another. Nothing here knows either. A model that is a
function launching such kernels needs no class: :class:`~rawgraph.serving.function.FunctionModel`
keeps the protocol for it (``examples/buckets_own_model.py``).

The protocol
------------
A model maps a ``(batch, width)`` float32 input ``x`` to a ``(batch, width)`` float32 output
``out``, **row-wise**: output row ``i`` depends on input row ``i`` only (and on weights shared by
every row). That is what makes padding a batch up to a bucket harmless, and what lets slots gather
rows through a table.

Required:

``width``, ``batch`` : int
    Features per row; rows of ``x`` and ``out``.
``device`` : Device
``plan(x, out, scratch=None) -> LaunchPlan``
    The launches reading ``x`` and writing ``out``, with ``inputs == ("x",)`` and
    ``outputs == ("out",)``; ``scratch`` (a dict of name -> device array, see
    ``scratch_layout``) replaces the model's own scratch (memory allocated inside a capture).
``with_batch(batch, workspace=None) -> model``
    The same model (same weights) for another batch size. ``workspace``: one made by
    ``make_workspace`` (use its first ``batch`` rows), ``None`` (allocate its own) or ``False``
    (none: every ``plan`` is given ``scratch``).
``make_workspace(rows) -> object or None``
    Scratch for any batch size up to ``rows``, shared by models that never run at the same time
    (bucket graphs replayed one at a time on one stream). ``None`` when the model needs none.
``scratch_layout(batch) -> dict``
    Name -> ``(shape, dtype)`` of each scratch array a ``batch``-row plan uses.
``reference(x) -> numpy.ndarray``
    The float64 NumPy result for a host input (what tests compare against).
``close()``

Optional (a class without them still runs everywhere, without the capability):

``row_count_arg(launch) -> (name, factor) or None``
    Which scalar argument of one of its plan's launches bounds the rows it touches, and the
    factor from rows to that value (``("n", width)`` for an elementwise kernel over
    ``rows * width`` values). Needed by :class:`~rawgraph.serving.RowCountBuckets` and
    :class:`~rawgraph.serving.DeviceShapedGraph`.
``row_grid(launch) -> (axis, rows_per_block) or None``
    Which grid axis of one of its plan's launches runs along the rows, and how many rows one
    block covers there: a ``batch``-row plan's launch then has ``ceil(batch / rows_per_block)``
    blocks on ``axis`` (0, 1 or 2). ``None``: the grid does not follow the rows (a grid-stride
    elementwise kernel, bounded by its row-count argument alone). Needed by
    :class:`~rawgraph.serving.DeviceShapedGraph`, whose head kernel sets that axis to cover
    exactly the live rows; a model without it gets no grid change (its row-count arguments
    still bound the work).
``weights_nbytes`` : int
    Bytes of weights shared by every batch size (memory accounting only).
``_check_open()``
    Raise :class:`~rawgraph.runtime.errors.ClosedError` once closed.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..runtime.device import Device, get_device
from ..runtime.errors import ShapeError
from ..runtime.launch import Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer
from ..runtime.resource import Resource

REQUIRED = ("width", "batch", "device", "plan", "with_batch", "make_workspace", "scratch_layout", "reference", "close")


@runtime_checkable
class RowwiseModel(Protocol):
    """The row-wise model protocol (see the module docstring)."""

    width: int
    batch: int
    device: Device

    def plan(self, x: Any, out: Any, scratch: dict[str, DeviceArray] | None = None) -> LaunchPlan: ...

    def with_batch(self, batch: int, workspace: Any = None) -> RowwiseModel: ...

    def make_workspace(self, rows: int) -> Any: ...

    def scratch_layout(self, batch: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]: ...

    def reference(self, x: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


def check_model(model: Any, what: str = "model") -> Any:
    """``model`` if it keeps the protocol and is open; else a ``TypeError`` naming what it lacks
    (or the model's own ``ClosedError``), before anything is allocated."""
    missing = [name for name in REQUIRED if not hasattr(model, name)]
    if missing:
        raise TypeError(
            f"{what} ({type(model).__name__}) does not keep the row-wise model protocol "
            f"(rawgraph.serving.protocol): it has no {', '.join(missing)}"
        )
    width = model.width
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise TypeError(f"{what}.width must be a positive int, got {width!r}")
    check = getattr(model, "_check_open", None)
    if check is not None:
        check()
    return model


def row_count_arg(model: Any, launch: Launch) -> tuple[str, int]:
    """The model's answer to which argument of ``launch`` bounds its rows (see the protocol);
    a ``TypeError`` when the model cannot say."""
    ask = getattr(model, "row_count_arg", None)
    found = ask(launch) if ask is not None else None
    if found is None:
        raise TypeError(
            f"{type(model).__name__} names no row-count argument of {launch.kernel.name} "
            "(row_count_arg): its plans cannot be re-bounded to the live rows"
        )
    name, factor = found
    if name not in launch.args.names():
        raise TypeError(f"{type(model).__name__}.row_count_arg names {name!r}, not an argument of {launch.kernel.name}")
    return str(name), int(factor)


def row_grid(model: Any, launch: Launch) -> tuple[int, int] | None:
    """The model's answer to which grid axis of ``launch`` runs along its rows (see the
    protocol): ``(axis, rows_per_block)``, or None when the model has no ``row_grid`` or says
    the grid does not follow the rows; a ``TypeError`` for an answer that is not one."""
    ask = getattr(model, "row_grid", None)
    found = ask(launch) if ask is not None else None
    if found is None:
        return None
    try:
        axis, rows_per_block = found
    except (TypeError, ValueError):
        raise TypeError(
            f"{type(model).__name__}.row_grid must give (axis, rows_per_block) or None, got {found!r}"
        ) from None
    for name, v in (("axis", axis), ("rows_per_block", rows_per_block)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{type(model).__name__}.row_grid gave a non-int {name} {v!r} for {launch.kernel.name}")
    if not 0 <= axis <= 2 or rows_per_block < 1:
        raise TypeError(
            f"{type(model).__name__}.row_grid gave axis {axis}, rows_per_block {rows_per_block} for "
            f"{launch.kernel.name}: the axis must be 0, 1 or 2 and a block must cover >= 1 row"
        )
    return int(axis), int(rows_per_block)


class RowScratch(Resource):
    """Named float32 scratch arrays of ``rows`` rows each: ``layout`` maps a name to the columns
    of that array (``cuMemAlloc`` / ``cuMemFree``, one allocation per name).

    :meth:`views` gives the first ``batch`` rows of each, so one ``RowScratch`` serves every
    batch size up to ``rows``. Models that share one must not run at the same time.
    """

    rows: int
    layout: dict[str, int]
    device: Device

    def __init__(self, rows: int, layout: dict[str, int], device: Device | None = None):
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise ShapeError(f"rows must be a positive int, got {rows!r}")
        if not layout or any(
            isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1 for c in layout.values()
        ):
            raise ShapeError(f"layout must map names to positive column counts, got {layout!r}")
        self.rows = int(rows)
        self.layout = {str(k): int(v) for k, v in layout.items()}
        self.device = (device or get_device()).activate()
        owned: list[DeviceBuffer] = []
        self._own(_close_all, owned, name="cuMemFree (scratch)")
        self.buffers: dict[str, DeviceBuffer] = {}
        for name, cols in self.layout.items():
            buf = DeviceBuffer((self.rows, cols), np.float32, self.device)
            owned.append(buf)
            self.buffers[name] = buf

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def views(self, batch: int) -> dict[str, DeviceArray]:
        """The first ``batch`` rows of each array."""
        self._check_open()
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or not 1 <= batch <= self.rows:
            raise ShapeError(f"this scratch holds {self.rows} rows, asked for {batch!r}")
        return {
            name: DeviceArray(b.ptr, (int(batch), self.layout[name]), b.dtype, b) for name, b in self.buffers.items()
        }


def _close_all(owned: list) -> None:
    for obj in owned:
        obj.close()
