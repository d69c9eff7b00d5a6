"""What a device-shaped graph decides without a GPU: its bands of row counts and the head kernel's
table.

A :class:`~rawgraph.serving.device_shaped.DeviceShapedGraph` captures one plan per band of row
counts, each at its band's top (:class:`Bands`). With ``select="updates"`` its head kernel
(``rg_du_shape``, ``kernels/device_update.cu``) walks a table of one :class:`ShapeEntry` per
captured node, packed by :func:`pack_table` into the kernel's 48-byte ``rg_du_shape_entry``: the
grid axis along the rows and its rows per block, the row-count argument's offset, size and factor,
and the band the node runs for. Everything here is pure: it reads launches and a model's answers
(``row_count_arg``, ``row_grid``) and calls no driver function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..runtime.errors import ShapeError
from ..runtime.launch import Launch
from .protocol import row_count_arg, row_grid

__all__ = [
    "ENTRY_DTYPE",
    "Bands",
    "LaunchSignature",
    "ShapeEntry",
    "check_bands",
    "grid_for",
    "pack_table",
    "plan_bands",
    "plan_signature",
    "shape_entries",
]

# One entry of the head kernel's table: kernels/device_update.cu's rg_du_shape_entry (48 bytes).
ENTRY_DTYPE = np.dtype(
    [
        ("node", "<u8"),
        ("grid", "<u4", (3,)),
        ("axis", "<i4"),
        ("rows_per_block", "<i4"),
        ("param_offset", "<i4"),
        ("param_size", "<i4"),
        ("factor", "<i4"),
        ("lo", "<i4"),
        ("hi", "<i4"),
    ]
)
assert ENTRY_DTYPE.itemsize == 48

_INT_KINDS = {"i32": 4, "u32": 4, "i64": 8, "u64": 8}


@dataclass(frozen=True)
class ShapeEntry:
    """What the head kernel does to one node of the plan.

    index: the launch's position in the captured plans; grid: its captured grid (at its band's top
    row count); axis: the grid axis along the rows (-1: grid untouched) and rows_per_block; param:
    the row-count argument's name, its byte offset and size in the parameter buffer, and the factor
    rows -> value; lo, hi: the band of row counts ``n`` for which the node runs (``lo <= n <= hi``).
    """

    index: int
    label: str
    kernel: str
    grid: tuple[int, int, int]
    axis: int
    rows_per_block: int
    param: str
    param_offset: int
    param_size: int
    factor: int
    lo: int = 1
    hi: int = 2**31 - 1

    def runs(self, n: int, max_rows: int | None = None) -> bool:
        """Whether the head enables this node for ``n`` live rows: what ``rg_du_shape`` decides,
        which first clamps ``n`` to ``0..max_rows`` (the graph's ``max_batch``) when given."""
        if max_rows is not None:
            n = max(0, min(int(n), int(max_rows)))
        return 0 < n and self.lo <= n <= self.hi


def grid_for(entry: ShapeEntry, n: int) -> tuple[int, int, int]:
    """The grid the head gives ``entry``'s node for ``n`` live rows (what ``rg_du_shape``
    computes; ``n = 0`` keeps one block on the axis, the node being disabled then)."""
    g = list(entry.grid)
    if entry.axis >= 0:
        g[entry.axis] = max(1, min(-(-int(n) // entry.rows_per_block), entry.grid[entry.axis]))
    return (g[0], g[1], g[2])


class _RowCount(NamedTuple):
    """A launch's row-count argument: its name, its kind's size in bytes, and the factor."""

    name: str
    size: int
    factor: int


def _row_count(model: Any, launch: Launch, max_batch: int) -> _RowCount:
    """The row-count argument ``model`` names for ``launch``, checked against what it holds."""
    name, factor = row_count_arg(model, launch)
    kind = dict(launch.args.spec)[name]
    if kind not in _INT_KINDS:
        raise TypeError(f"{launch.kernel.name}: row-count argument {name} is a {kind}, not a 4- or 8-byte int")
    if factor < 1:
        raise ShapeError(f"{launch.kernel.name}: row-count factor {factor} must be >= 1")
    held = launch.args[name]
    if held != max_batch * factor:
        raise ShapeError(
            f"{launch.kernel.name}: row-count argument {name} holds {held}, expected "
            f"max_batch * factor = {max_batch} * {factor}"
        )
    if kind in ("i32", "u32") and max_batch * factor >= 2**31:
        raise ShapeError(f"{launch.kernel.name}: {max_batch} * {factor} does not fit its int32 {name}")
    return _RowCount(name, _INT_KINDS[kind], int(factor))


def _row_axis(model: Any, launch: Launch, max_batch: int) -> tuple[int, int]:
    """``(axis, rows_per_block)`` of ``launch``'s row grid (``(-1, 0)``: none), checked against
    its grid and its compiled-in cluster dimensions."""
    rg = row_grid(model, launch)
    if rg is None:
        return (-1, 0)
    axis, rpb = rg
    want = -(-max_batch // rpb)
    if launch.grid[axis] != want:
        raise ShapeError(
            f"{launch.kernel.name}: row_grid says axis {axis} with {rpb} rows per block, so "
            f"{want} blocks for {max_batch} rows, but the launch has grid {launch.grid}"
        )
    cluster = getattr(launch.kernel, "cluster_dims", (0, 0, 0))
    if cluster[axis] > 1:
        raise ShapeError(
            f"{launch.kernel.name}: its grid axis {axis} carries cluster dimension "
            f"{cluster[axis]}; a row count would not stay a multiple of it"
        )
    return (axis, rpb)


def shape_entries(
    model: Any, launches: Sequence[Launch], max_batch: int, lo: int = 1, start: int = 0
) -> list[ShapeEntry]:
    """One :class:`ShapeEntry` per launch of ``model``'s ``max_batch``-row plan (a band's top), checked against
    the launches: a row-grid axis must hold ``ceil(max_batch / rows_per_block)`` blocks and carry
    no compiled-in cluster dimension above 1, every launch must name an integer row-count
    argument (4 or 8 bytes) holding ``max_batch * factor``. The entries' band is
    ``lo..max_batch``; their indices start at ``start`` (the plan's place among the captured ones).

    Raises
    ------
    TypeError
        A launch whose row count the model cannot name, or an answer of the wrong form.
    ShapeError
        An answer the launch contradicts.
    """
    entries = []
    for i, launch in enumerate(launches):
        count = _row_count(model, launch, max_batch)
        axis, rpb = _row_axis(model, launch, max_batch)
        entries.append(
            ShapeEntry(
                start + i,
                launch.label,
                launch.kernel.name,
                tuple(launch.grid),  # type: ignore[arg-type]
                axis,
                rpb,
                count.name,
                int(launch.args.offsets[count.name]),
                count.size,
                count.factor,
                int(lo),
                int(max_batch),
            )
        )
    return entries


class LaunchSignature(NamedTuple):
    """What must match, launch by launch, for one captured plan to serve another row count bit
    for bit; ``grid`` has the row axis zeroed, and is None for a kernel with no row grid."""

    kernel: str
    block: tuple[int, ...]
    shared_mem: int
    pdl: bool
    grid: tuple[int, ...] | None


def plan_signature(model: Any, launches: Sequence[Launch]) -> tuple[LaunchSignature, ...]:
    """What must match for one captured plan to serve another row count bit for bit: per launch
    the kernel, block, dynamic shared memory, PDL, and the grid on every axis but the rows (the
    whole grid is left out of a kernel with no row grid: the head never changes it, so such a
    kernel must compute the same at any grid, as grid-stride kernels do)."""
    sig = []
    for launch in launches:
        rg = row_grid(model, launch)
        grid: tuple[int, ...] | None = None
        if rg is not None:
            g = list(launch.grid)
            g[rg[0]] = 0
            grid = tuple(g)
        sig.append(
            LaunchSignature(launch.kernel.name, tuple(launch.block), int(launch.shared_mem), bool(launch.pdl), grid)
        )
    return tuple(sig)


def plan_bands(signatures: Sequence[Any]) -> list[int]:
    """Band tops from the plan signatures of row counts 1, 2, ... (``signatures[n - 1]``): a new
    band starts wherever the signature changes; each band is served by the plan of its top."""
    if not signatures:
        raise ValueError("no signatures")
    tops = [n for n in range(1, len(signatures)) if signatures[n] != signatures[n - 1]]
    return tops + [len(signatures)]


def check_bands(bands: Any, max_batch: int) -> list[int]:
    """``bands`` (None: one band; a sequence of row counts) as sorted band tops ending at
    ``max_batch``; :class:`ShapeError` / :class:`TypeError` on anything else."""
    if bands is None:
        return [max_batch]
    if isinstance(bands, (str, bytes)) or not hasattr(bands, "__iter__"):
        raise TypeError(f"bands must be None, 'plans' or a sequence of row counts, got {bands!r}")
    tops = []
    for b in bands:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            raise TypeError(f"band tops must be ints, got {b!r}")
        if not 1 <= b <= max_batch:
            raise ShapeError(f"band top {b} is outside 1..max_batch = {max_batch}")
        tops.append(int(b))
    tops = sorted(set(tops))
    if not tops or tops[-1] != max_batch:
        tops.append(max_batch)
    return tops


@dataclass(frozen=True)
class Bands:
    """The bands of row counts a device-shaped graph captures one plan for: ``tops`` ascending,
    the last ``max_batch``; band ``i`` serves ``lo(i)..tops[i]`` and its plan is captured at
    ``tops[i]`` rows.

    Build one with :meth:`of` (the caller's ``bands=``, :func:`check_bands`) or
    :meth:`from_signatures` (``bands="plans"``, :func:`plan_bands`).
    """

    tops: tuple[int, ...]

    def __post_init__(self) -> None:
        tops = self.tops
        if not tops or tops[0] < 1 or any(b <= a for a, b in zip(tops, tops[1:])):
            raise ShapeError(f"band tops must be ascending row counts >= 1, got {tops!r}")

    @classmethod
    def of(cls, bands: Any, max_batch: int) -> Bands:
        """The caller's ``bands`` (None or a sequence of row counts) checked: see :func:`check_bands`."""
        return cls(tuple(check_bands(bands, max_batch)))

    @classmethod
    def from_signatures(cls, signatures: Sequence[Any]) -> Bands:
        """A band wherever the plan signature of row counts 1, 2, ... changes: see :func:`plan_bands`."""
        return cls(tuple(plan_bands(signatures)))

    def __len__(self) -> int:
        return len(self.tops)

    def index(self, n: int) -> int:
        """The band that serves ``n`` rows: the first whose top is ``>= n`` (the last above them
        all; the first for ``n = 0``)."""
        for i, top in enumerate(self.tops):
            if n <= top:
                return i
        return len(self.tops) - 1

    def lo(self, i: int) -> int:
        """The smallest row count band ``i`` serves."""
        return 1 if i == 0 else self.tops[i - 1] + 1


def pack_table(entries: Sequence[ShapeEntry], handles: Sequence[int]) -> np.ndarray:
    """The head kernel's table: ``entries`` with each node's device handle."""
    if len(handles) != len(entries):
        raise ValueError(f"{len(entries)} entries, {len(handles)} device node handles")
    table = np.zeros(len(entries), ENTRY_DTYPE)
    for row, e, h in zip(table, entries, handles):
        row["node"] = int(h)
        row["grid"] = e.grid
        row["axis"], row["rows_per_block"] = e.axis, e.rows_per_block
        row["param_offset"], row["param_size"], row["factor"] = e.param_offset, e.param_size, e.factor
        row["lo"], row["hi"] = e.lo, e.hi
    return table
