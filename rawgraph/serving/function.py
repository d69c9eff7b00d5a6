"""A row-wise model from a function: your own kernels served with no protocol class to write.

:class:`FunctionModel` turns a function ``fn(x, out, scratch, rows, stream)`` that launches
:class:`~rawgraph.RawKernel` kernels on ``stream`` into a model keeping the row-wise protocol
(:mod:`rawgraph.serving.protocol`), so bucket graphs, slot pools, the device-shaped exec and the
control loops serve it::

    def rmsnorm(x, out, scratch, rows, stream):          # weights: closed over
        t, n = scratch["t"], rows * width
        norm(rows, 128, (x, g, t, width, rows, eps), stream=stream)
        residual(-(-n // 256), 256, (t, x, s, out, n), stream=stream)

    model = FunctionModel(rmsnorm, width, scratch={"t": width}, reference=rmsnorm_float64)
    with BucketGraphs(model, sizes=[1, 2, 4, 8]) as bg:
        bg.run(x, 3)

One mechanism: a plan is the function's own calls, recorded. :meth:`FunctionModel.plan` calls
``fn`` on a private stream inside a :class:`~rawgraph.Capture` (relaxed mode: no other thread is
held back), where each RawKernel call becomes a :class:`~rawgraph.Launch` and nothing runs; the
arrays are named ``x``, ``out``, the scratch names, and the others (the weights) by their C
parameters. The launches are the plan; the graph recorded on the way is destroyed.

What the device-shaped exec and row-count rebinding ask of a model (``row_count_arg``,
``row_grid``) is found by recording ``fn`` twice more when the model is made, at
:data:`PROBE_ROWS` (128 and 257) rows on buffers of its own, freed after:

- the row-count argument of a launch is the integer argument holding ``rows * factor`` at both
  row counts (the function passes ``rows``, or a multiple of it, to each kernel it bounds);
- its row grid is the one grid axis that moved, if exactly one ``k`` (rows per block) gives
  ``ceil(rows / k)`` blocks at both row counts: 128 and 257 single out every ``k`` up to 19 and
  every power of two up to 128. Otherwise (no axis moved, several did, no ``k`` or several fit)
  the launch has no row grid, and a device-shaped exec keeps its captured grid, which covers every
  row count (its row-count argument still bounds the work): a guess could only be wrong.

The rules a function keeps, each refused with :class:`FunctionModelError` (a ``TypeError``, as
for a model that does not keep the protocol) when it is broken:

- it launches at least one kernel, only kernels (a copy or memset on the stream would be missing
  from the plan), all on the ``stream`` it is given, one of them writing ``out``;
- it launches the same kernels in the same order at every row count (a function that picks
  kernels by batch size needs the class form, ``examples/buckets_own_model_class.py``);
- each row-count argument holds ``rows * factor`` at every row count (checked at every plan:
  :class:`~rawgraph.RowCountBuckets` writes ``n * factor`` into it unchecked).

Lifetimes: the model that was made (the root) owns the recording stream and whatever ``owns``
gives it (the weights the function closes over); :meth:`~FunctionModel.with_batch` views share
them, and every plan refuses once any array it uses (weights included) or its model is closed.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..graphs.capture import Capture, CaptureMode
from ..runtime.device import Device, get_device
from ..runtime.errors import ClosedError, DTypeError, EmptyCaptureWarning, RawgraphError, ShapeError
from ..runtime.launch import Launch, LaunchPlan
from ..runtime.memory import DeviceArray, as_device_array
from ..runtime.resource import Resource
from ..runtime.stream import Stream
from .lifecycle import close_all
from .protocol import RowScratch

__all__ = ["FunctionModel", "FunctionModelError", "PROBE_ROWS", "row_count_candidates", "row_grid_of"]

# 257 = 2 * 128 + 1: ceil(rows / k) at both singles out every k up to 19 and each power of two up
# to 128 (tests/test_function_model_cpu.py). Small enough that the probe buffers stay small.
PROBE_ROWS = (128, 257)
# What a device-shaped head can write into a row-count argument: a 4- or 8-byte integer.
_INT_KINDS = ("i32", "u32", "i64", "u64")
_RESERVED = ("x", "out")  # the plan's input and output names: no scratch array may take them


class FunctionModelError(RawgraphError, TypeError):
    """A function that cannot be served as a row-wise model (see :mod:`rawgraph.serving.function`):
    it launches nothing, does other work on the stream, never writes ``out``, launches other
    kernels at another row count, or passes a row count that is not ``rows * factor``."""


# ----------------------------------------------------------------- what two recordings tell (no GPU)
def row_count_candidates(a: Launch, b: Launch, rows_a: int, rows_b: int) -> list[tuple[str, int]]:
    """``(name, factor)`` of each integer argument holding ``rows * factor`` (factor >= 1) in both
    ``a``, recorded at ``rows_a`` rows, and ``b``, the same launch recorded at ``rows_b``."""
    found = []
    for name, kind in a.args.spec:
        if kind not in _INT_KINDS:
            continue
        va, vb = int(a.args[name]), int(b.args[name])
        if vb > 0 and vb % rows_b == 0 and va == rows_a * (vb // rows_b):
            found.append((name, vb // rows_b))
    return found


def row_grid_of(grid_a: Sequence[int], grid_b: Sequence[int], rows_a: int, rows_b: int) -> tuple[int, int] | None:
    """``(axis, k)``: the one grid axis that differs between two recordings, and the one ``k``
    giving ``ceil(rows / k)`` blocks at both row counts; None when no axis or several moved, or
    no ``k`` or several fit (the grid does not follow the rows in whole blocks, or the two row
    counts cannot tell which)."""
    moved = [ax for ax in range(3) if grid_a[ax] != grid_b[ax]]
    if len(moved) != 1:
        return None
    ax = moved[0]
    fits = [
        k for k in range(1, max(rows_a, rows_b) + 1) if -(-rows_a // k) == grid_a[ax] and -(-rows_b // k) == grid_b[ax]
    ]
    return (ax, fits[0]) if len(fits) == 1 else None


class _Rule:
    """What the probes found for one kernel: its row count, its row grid, or why it has no
    single answer (``conflict``, raised when asked)."""

    __slots__ = ("count", "grid", "conflict")

    def __init__(self, count: tuple[str, int] | None, grid: tuple[int, int] | None, conflict: str | None = None):
        self.count, self.grid, self.conflict = count, grid, conflict

    def key(self) -> tuple:
        return self.count, self.grid, self.conflict


def _close_owned(owned: list) -> None:
    close_all(reversed(owned))  # the last made first
    owned.clear()


def _release(stream: Stream, owned: list) -> None:
    _close_owned(owned)
    stream.close()
    if stream.tail is not None:  # only captures ever ran on it: its tail has nothing to wait for
        stream.tail.close()


# ---------------------------------------------------------------------------------- the recorder
class _Shared(Resource):
    """What every batch view of one model shares: the function, its layout and reference, the
    recording stream (one recording at a time: ``lock``), what the probes found, and what
    ``owns`` handed over. Closed by the root model, or when the last view is collected."""

    def __init__(self, fn: Callable, width: int, layout: dict[str, int], reference: Callable | None, device: Device):
        self.fn, self.width, self.layout, self.ref, self.device = fn, width, layout, reference, device
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self._owned: list[Any] = []
        self.stream = Stream(device=device)
        self._own(_release, self.stream, self._owned, name="FunctionModel.close")
        self.lock = threading.Lock()

    def take(self, owns: Sequence[Any]) -> None:
        """Close ``owns`` with the model (in reverse order, then the recording stream)."""
        self._owned.extend(owns)

    def record(
        self, rows: int, x: DeviceArray, out: DeviceArray, scratch: dict[str, DeviceArray]
    ) -> tuple[list[Launch], dict[str, DeviceArray]]:
        """The launches ``fn`` makes for ``rows`` rows over these arrays, and the arrays they use
        by name (``x`` and ``out`` always among them)."""
        named = {"x": x, "out": out, **scratch}
        with self.lock, warnings.catch_warnings():
            warnings.simplefilter("ignore", EmptyCaptureWarning)  # refused below, by name
            cap = Capture(self.stream, CaptureMode.RELAXED)
            with cap:
                cap.name_buffers(named)  # so the function's arrays keep the plan's names
                self.fn(x, out, dict(scratch), rows, cap.stream)
        graph = cap.captured
        try:
            other = [kind for _h, kind, _d in graph.other_nodes] + [f.type for f in graph.foreign_nodes]
            launches = [node.launch for node in graph.nodes]
        finally:
            graph.close()
        if other:
            raise FunctionModelError(
                f"{self.name} did work on the stream other than RawKernel launches "
                f"({', '.join(other)}): a plan holds kernel launches only"
            )
        if not launches:
            raise FunctionModelError(
                f"{self.name} launched no kernel on the stream it was given (at {rows} rows): "
                "call each RawKernel with stream=stream"
            )
        if not any(u.buffer == "out" and u.role == "write" for l in launches for u in l.uses.values()):
            raise FunctionModelError(f"{self.name}: no kernel it launched writes out through a non-const pointer")
        used = {u.buffer for l in launches for u in l.uses.values()} | set(_RESERVED)
        return launches, {n: cap.buffers[n] for n in used}

    def probe(self) -> None:
        """Record ``fn`` at both :data:`PROBE_ROWS` and keep what they tell: the kernels in order,
        each kernel's :class:`_Rule`, and the bytes of the arrays that are neither rows nor scratch."""
        lo, hi = PROBE_ROWS
        bufs = RowScratch(hi, {"x": self.width, "out": self.width, **self.layout}, self.device)
        try:
            runs = []
            for rows in PROBE_ROWS:
                views = bufs.views(rows)
                runs.append(self.record(rows, views.pop("x"), views.pop("out"), views))
        finally:
            bufs.close()  # nothing ran: the launches only hold its addresses, never used again
        (a, _), (b, buffers) = runs
        if [l.kernel for l in a] != [l.kernel for l in b]:
            raise FunctionModelError(
                f"{self.name} launches {_names(a)} at {lo} rows but {_names(b)} at {hi}: "
                "a function model launches the same kernels at every row count"
            )
        self.kernels = [l.kernel for l in b]
        self.rules: dict[int, tuple[Any, _Rule]] = {}
        for la, lb in zip(a, b):
            found = row_count_candidates(la, lb, lo, hi)
            rule = _Rule(
                found[0] if len(found) == 1 else None,
                row_grid_of(la.grid, lb.grid, lo, hi),
                None
                if len(found) < 2
                else f"{lb.kernel.name} takes the row count in {len(found)} arguments "
                f"({', '.join(n for n, _ in found)}); the protocol rebinds one",
            )
            have = self.rules.get(id(lb.kernel))
            if have is not None and have[1].key() != rule.key():
                rule = _Rule(
                    None,
                    None,
                    f"{self.name} launches {lb.kernel.name} twice with different row counts "
                    "or row grids; the protocol answers per kernel",
                )
            self.rules[id(lb.kernel)] = (lb.kernel, rule)  # the kernel held: its id stays its own
        rest = {(v.ptr, v.nbytes) for n, v in buffers.items() if n not in _RESERVED and n not in self.layout}
        self.weights_nbytes = sum(nbytes for _ptr, nbytes in rest)

    def rule(self, launch: Launch) -> _Rule | None:
        """The probes' rule for ``launch``'s kernel (None: not one of this function's kernels)."""
        got = self.rules.get(id(launch.kernel))
        if got is None or got[0] is not launch.kernel:
            return None
        if got[1].conflict is not None:
            raise FunctionModelError(
                f"{got[1].conflict}: write this model as a class (examples/buckets_own_model_class.py)"
            )
        return got[1]


def _names(launches: Sequence[Launch]) -> list[str]:
    return [l.kernel.name for l in launches]


def _check_workspace(workspace: Any) -> None:
    if workspace is not None and workspace is not False and not isinstance(workspace, RowScratch):
        raise TypeError(f"workspace must be a RowScratch, None (allocate one) or False (none), got {workspace!r}")


def _positive(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ShapeError(f"{what} must be a positive int, got {v!r}")
    return int(v)


# ------------------------------------------------------------------------------------ the model
class FunctionModel:
    """A row-wise model (:mod:`rawgraph.serving.protocol`) whose plans are ``fn``'s own launches.

    Parameters
    ----------
    fn : callable
        ``fn(x, out, scratch, rows, stream)``: ``x`` and ``out`` are ``(rows, width)`` float32
        device arrays, ``scratch`` a dict of ``(rows, columns)`` float32 arrays (``scratch=``),
        ``rows`` an int; it calls its :class:`~rawgraph.RawKernel` kernels with ``stream=stream``
        (the rules it keeps: :mod:`rawgraph.serving.function`). Weights: close over them.
    width : int
    scratch : dict of str -> int, optional
        Columns per row of each float32 scratch array the function uses (not ``x`` or ``out``).
    reference : callable, optional
        ``reference(x)`` on a float64 ``(rows, width)`` host array: the float64 result.
    batch : int, default 1
    device : Device, optional
    workspace : RowScratch, None or False
        As the protocol's ``with_batch``: the first ``batch`` rows of this one, a new one
        (None), or none (False: every :meth:`plan` is given ``scratch``).
    owns : sequence
        Objects closed with this model (the weights the function closes over).

    Notes
    -----
    The protocol it keeps: ``width``, ``batch``, ``device``, :meth:`plan`, :meth:`with_batch`,
    :meth:`make_workspace`, :meth:`scratch_layout`, :meth:`reference`, :meth:`close`; and the
    optional :meth:`row_count_arg`, :meth:`row_grid`, :attr:`weights_nbytes`, :meth:`_check_open`.

    Raises
    ------
    FunctionModelError
        The function breaks one of its rules (when made: at the probes; later: at a plan).
    """

    fn: Callable[..., Any]
    width: int
    device: Device
    layout: dict[str, int]
    batch: int
    workspace: RowScratch | Any | None

    def __init__(
        self,
        fn: Callable,
        width: int,
        *,
        scratch: dict[str, int] | None = None,
        reference: Callable | None = None,
        batch: int = 1,
        device: Device | None = None,
        workspace: Any = None,
        owns: Sequence[Any] = (),
    ):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if reference is not None and not callable(reference):
            raise TypeError(f"reference must be callable or None, got {type(reference).__name__}")
        layout = {}
        for name, cols in (scratch or {}).items():
            if not isinstance(name, str) or not name or name in _RESERVED:
                raise ValueError(f"scratch names must be strings other than {_RESERVED}, got {name!r}")
            layout[name] = _positive(cols, f"scratch columns of {name!r}")
        width, batch = _positive(width, "width"), _positive(batch, "batch")
        _check_workspace(workspace)
        shared = _Shared(fn, width, layout, reference, (device or get_device()).activate())
        try:
            shared.probe()
            self._init(shared, batch, workspace)
        except BaseException:
            shared.close()  # what it made: a refused function keeps nothing (owns stays the caller's)
            raise
        shared.take(owns)
        self._root = True

    @classmethod
    def _view(cls, shared: _Shared, batch: int, workspace: Any) -> FunctionModel:
        m = cls.__new__(cls)
        m._init(shared, batch, workspace)
        m._root = False
        return m

    def _init(self, shared: _Shared, batch: int, workspace: Any) -> None:
        self._shared = shared
        self.fn, self.width, self.device, self.layout = shared.fn, shared.width, shared.device, shared.layout
        self.batch = _positive(batch, "batch")
        self._owned: list[Any] = []
        self._finalizer = weakref.finalize(self, _close_owned, self._owned)
        _check_workspace(workspace)
        if isinstance(workspace, RowScratch):
            workspace._check_open()
            if workspace.rows < self.batch or workspace.layout != self.layout:
                raise ShapeError(
                    f"workspace of {workspace.rows} rows {workspace.layout} cannot hold a "
                    f"{self.batch}-row batch of {self.layout}"
                )
        elif workspace is None:
            workspace = RowScratch(self.batch, self.layout, self.device) if self.layout else None
            if workspace is not None:
                self._owned.append(workspace)
        self.workspace = workspace or None

    # -- the row-wise model protocol ---------------------------------------------------------
    def _check_open(self) -> None:
        if not self._finalizer.alive or self._shared.closed:
            raise ClosedError(f"FunctionModel({self._shared.name}) is closed")

    def with_batch(self, batch: int, workspace: Any = None) -> FunctionModel:
        """The same function and weights for ``batch`` rows (protocol ``with_batch``)."""
        self._check_open()
        return FunctionModel._view(self._shared, batch, workspace)

    def make_workspace(self, rows: int) -> RowScratch | None:
        """Scratch for up to ``rows`` rows (protocol ``make_workspace``); None with no scratch."""
        self._check_open()
        return RowScratch(rows, self.layout, self.device) if self.layout else None

    def scratch_layout(self, batch: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Name -> ``((batch, columns), float32)`` (protocol ``scratch_layout``)."""
        return {name: ((int(batch), cols), np.dtype(np.float32)) for name, cols in self.layout.items()}

    @property
    def weights_nbytes(self) -> int:
        """Bytes of the arrays the function's kernels use besides ``x``, ``out`` and scratch."""
        return self._shared.weights_nbytes

    def row_count_arg(self, launch: Launch) -> tuple[str, int] | None:
        """The argument of ``launch`` that held ``rows * factor`` at both probes (protocol
        ``row_count_arg``); None when none did or the kernel is not the function's."""
        rule = self._shared.rule(launch)
        return None if rule is None else rule.count

    def row_grid(self, launch: Launch) -> tuple[int, int] | None:
        """The grid axis that followed the rows at both probes, and rows per block (protocol
        ``row_grid``); None when the grid did not follow them."""
        rule = self._shared.rule(launch)
        return None if rule is None else rule.grid

    def _array(self, a: Any, what: str, cols: int) -> DeviceArray:
        v = as_device_array(a, what)
        if v.dtype != np.float32:
            raise DTypeError(f"{what} has dtype {v.dtype}, the model runs float32")
        if tuple(v.shape) != (self.batch, cols):
            raise ShapeError(f"{what} has shape {tuple(v.shape)}, expected {(self.batch, cols)}")
        return v

    def plan(self, x: Any, out: Any, scratch: dict[str, Any] | None = None) -> LaunchPlan:
        """``fn``'s launches for this batch over ``x``, ``out`` and the scratch, recorded
        (protocol ``plan``: inputs ``("x",)``, outputs ``("out",)``)."""
        self._check_open()
        xa, oa = self._array(x, "x", self.width), self._array(out, "out", self.width)
        if scratch is None:
            if self.layout and self.workspace is None:
                raise ValueError("this model has no workspace (workspace=False): pass scratch to plan()")
            views = self.workspace.views(self.batch) if self.workspace is not None else {}
        else:
            if set(scratch) != set(self.layout):
                raise KeyError(f"scratch must name exactly {tuple(self.layout)}, got {sorted(scratch)}")
            views = {n: self._array(scratch[n], n, cols) for n, cols in self.layout.items()}
        shared = self._shared
        launches, buffers = shared.record(self.batch, xa, oa, views)
        if [l.kernel for l in launches] != shared.kernels:
            raise FunctionModelError(
                f"{shared.name} launches {_names(launches)} at {self.batch} rows but "
                f"{[k.name for k in shared.kernels]} at {PROBE_ROWS[1]}: a function model "
                "launches the same kernels at every row count"
            )
        for l in launches:
            rule = shared.rules[id(l.kernel)][1]  # a kernel of the probes: checked just above
            if rule.count is not None:
                name, factor = rule.count
                if l.args[name] != self.batch * factor:
                    raise FunctionModelError(
                        f"{l.kernel.name}: {name} holds {l.args[name]} at {self.batch} rows, not "
                        f"rows * {factor} as at {PROBE_ROWS}: a row count must be linear in rows"
                    )
        # Closing any owner of an array the plan uses (weights included) makes the plan refuse.
        guards = {
            id(g): g
            for g in [shared._finalizer, self._finalizer]
            + [v.owner._finalizer for v in buffers.values() if isinstance(v.owner, Resource)]
        }
        return LaunchPlan(launches, buffers, ("x",), ("out",), list(guards.values()))

    def reference(self, x: np.ndarray) -> np.ndarray:
        """``reference`` on ``x`` as float64 (protocol ``reference``)."""
        if self._shared.ref is None:
            raise TypeError(f"FunctionModel({self._shared.name}) was given no reference")
        x64 = np.asarray(x, dtype=np.float64)
        got = np.asarray(self._shared.ref(x64), dtype=np.float64)
        if got.shape != x64.shape:
            raise ShapeError(f"the reference gave shape {got.shape} for an input of {x64.shape}")
        return got

    def close(self) -> None:
        """Free this view's own workspace; the model that was made also closes the recording
        stream and what ``owns`` gave it, so every view and plan of it refuses. Safe twice."""
        self._finalizer()
        if self._root:
            self._shared.close()

    def __repr__(self) -> str:
        return f"<FunctionModel {self._shared.name} width={self.width} batch={self.batch}>"
