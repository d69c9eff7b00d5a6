"""What only driver level can do: re-shape an exec instead of capturing one per batch size.

``cuGraphExecKernelNodeSetParams`` changes a kernel node's arguments, grid and (CUDA 12+, same
context) function in the exec, for launches made after it. Two strategies built on it:

- :class:`RowCountBuckets`: bucket graphs whose kernels are told the live row count. Each kernel
  bounds its rows by its row-count argument (``B`` of the matmul and block kernels, ``n`` =
  rows x width of the elementwise ones), so rebinding it to ``n`` means the padding rows cost no
  arithmetic or memory traffic, only CTAs that find no row of theirs and exit their loops.
- :class:`ReshapedGraph`: a few graphs for every batch size up to a maximum (one per group of
  sizes whose kernels share cluster dimensions). For each size the launch plan that size would
  have (function, grid, block, shared memory and arguments, from the same cut rules) is built
  once; a step pushes the nodes whose parameters differ from the last step's. Setup is a few
  captures; the host pays one push per changed node per step.

Both keep :class:`~rawgraph.serving.buckets.BucketGraphs`' rules: one arena, one persistent input
and output, runs ordered across streams.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver

from ..graphs.capture import capture_plan
from ..runtime.errors import ClosedError, LayoutError, RawgraphError, ShapeError, call
from ..runtime.memory import DeviceArray, DeviceBuffer
from ..updates.manager import ExecUpdateManager
from ..updates.shadow import ExecShadow
from .buckets import BucketGraphs, StreamOrder, check_rows
from .lifecycle import WarmUp, close_all, instantiate_uploaded
from .protocol import RowwiseModel, check_model, row_count_arg
from .sizes import pick_bucket

if TYPE_CHECKING:
    from ..runtime.device import Device
    from ..runtime.stream import Stream


class RowCountBuckets(BucketGraphs):
    """Bucket graphs that also rebind each kernel's row count to the live ``n`` (see the module
    docstring); same parameters as :class:`BucketGraphs`.

    Attributes
    ----------
    managers : dict
        Bucket size -> the :class:`ExecUpdateManager` that rebinds its row counts.
    """

    def __init__(
        self,
        model: RowwiseModel,
        sizes: Sequence[int] | None = None,
        max_batch: int = 256,
        stream: Any = None,
        scratch: str = "arena",
        zero_padding: bool = True,
    ):
        super().__init__(model, sizes, max_batch, stream, scratch, zero_padding)
        self.managers: dict[int, ExecUpdateManager] = {}
        try:
            # per bucket, one checked setter per node for its row count, and the factor rows -> value
            self._setters: dict[int, list[tuple[Any, int]]] = {}
            for b in self.sizes:
                self.managers[b] = mgr = ExecUpdateManager(self.graphs[b], self.execs[b], names=())
                self._setters[b] = [
                    (mgr.scalar_setter(i, arg), factor)
                    for i, (arg, factor) in enumerate(
                        row_count_arg(model, node.launch) for node in self.graphs[b].nodes
                    )
                ]
        except BaseException:
            self.close()  # a model that names no row count: nothing of the captures may stay
            raise
        self._live = {b: b for b in self.sizes}

    def _launch(self, b: int, n: int, s: Any) -> None:
        if self._live[b] != n:
            for setter, factor in self._setters[b]:
                setter(n * factor)
            self._live[b] = n
        self.execs[b].launch(s)

    def run(self, x: Any, n: int, stream: Any = None) -> DeviceArray:
        """As :meth:`BucketGraphs.run`, with the kernels bounded to ``n`` rows."""
        if self._closed:
            raise ClosedError("RowCountBuckets is closed")
        xa = check_rows(x, n, self.width)
        s = self._order.enter(self.stream if stream is None else stream)
        if n > self.largest:
            raise ShapeError(f"n = {n} is above the largest bucket ({self.largest}); RowCountBuckets has no fallback")
        b = pick_bucket(self.sizes, n)
        assert b is not None
        self._stage(xa.ptr, n, b, s)
        self._launch(b, n, s)
        st = self.stats
        st["runs"] += 1
        st["rows"] += n
        st["computed"] += n
        st[f"bucket:{b}"] += 1
        return DeviceArray(self.output.ptr, (n, self.width), np.dtype(np.float32), self.output)

    def close(self) -> None:
        for mgr in getattr(self, "managers", {}).values():
            mgr.close()
        super().close()


class ReshapedGraph:
    """Execs that serve every batch size from 1 to ``max_batch``, re-shaped per step by
    ``cuGraphExecKernelNodeSetParams`` (function, grid, block, shared memory, arguments).

    A node's function may change in the exec only to one launched the same way: a kernel compiled
    with fixed cluster dimensions (``__cluster_dims__``) and one without are launched differently,
    and an exec whose nodes are pushed across between them can return NaN (measured at w1024:
    the captured size, after visits to sizes whose cut uses cluster kernels). So the sizes are
    grouped by the cluster dimensions of their plan's kernels,
    one exec per group (captured at its largest size); within a group any size is a push away.
    For w1024 that is a handful of execs instead of one per size.

    Its attributes stay on the one object: the per-size tables (plans, node parameters, keys,
    group) and the per-group execs (graph, exec, shadow, current keys) are read together, under
    the same keys, by every :meth:`reshape`; nothing in them is released apart from the rest.

    Parameters
    ----------
    model : RowwiseModel
        Any model keeping the row-wise protocol (:mod:`rawgraph.serving.protocol`); its
        weights are shared, not copied. Every size's plan must have the same number of launches.
    max_batch : int, default 256
    stream : stream-like, optional

    Attributes
    ----------
    input, output : DeviceBuffer
        Persistent ``(max_batch, width)`` buffers.
    groups : dict
        Cluster signature -> the sizes that exec serves.
    setup : dict
        Seconds: ``warmup``, ``capture``, ``instantiate``, ``upload`` and ``plans`` (building the
        per-size node parameters).
    warm_up : WarmUp
        The eager runs before the captures (one per exec whose kernel functions are new).
    pushes : int
        Node pushes made by :meth:`run` so far.

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html

    Notes
    -----
    State: 24 instance attributes: per group of sizes its one exec, graph, plan, shadow and the
    parameter slots a size rewrites (kept apart so a switch of size is one SetParams loop over
    ready values), the group of each size and the one bound now, and the buffers every size shares;
    what needs releasing is freed in one place, :meth:`close`.
    """

    max_batch: int
    width: int
    input: DeviceBuffer
    output: DeviceBuffer
    arena: Any
    warm_up: WarmUp

    def __init__(self, model: RowwiseModel, max_batch: int = 256, stream: Any = None):
        from ..runtime.stream import Stream, as_stream

        check_model(model)
        if max_batch < 1:
            raise ShapeError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = int(max_batch)
        self.width = model.width
        self.device: Device = model.device
        self._own_stream = stream is None
        self.stream: Stream = Stream(device=self.device) if stream is None else as_stream(stream)
        s = self.stream
        self.input = DeviceBuffer((self.max_batch, self.width), np.float32, self.device)
        self.output = DeviceBuffer((self.max_batch, self.width), np.float32, self.device)
        self.arena = model.make_workspace(self.max_batch)
        self.input.poison(s)
        clock = time.perf_counter
        self.setup: dict[str, float] = {"warmup": 0.0, "capture": 0.0, "instantiate": 0.0, "upload": 0.0}
        self.warm_up = WarmUp(self.setup)
        t0 = clock()
        # One plan per size over the same buffers and arena: the cut rules decide each node's
        # function and grid for that size, exactly as a graph captured at that size would have.
        f32 = np.dtype(np.float32)
        self._models = {b: model.with_batch(b, workspace=self.arena) for b in range(1, self.max_batch + 1)}
        self._plans = {
            b: m.plan(
                DeviceArray(self.input.ptr, (b, self.width), f32, self.input),
                DeviceArray(self.output.ptr, (b, self.width), f32, self.output),
            )
            for b, m in self._models.items()
        }
        counts = {len(p) for p in self._plans.values()}
        if len(counts) != 1:
            raise RawgraphError(f"plans of different lengths {sorted(counts)}: one graph cannot serve them all")
        self._params = {b: [l.node_params() for l in p.launches] for b, p in self._plans.items()}
        self._keys = {
            b: [(l.kernel.handle, l.grid, l.block, l.shared_mem, l.args.snapshot()) for l in p.launches]
            for b, p in self._plans.items()
        }
        self.groups: dict[tuple[tuple[int, int, int], ...], list[int]] = {}
        for b, p in self._plans.items():
            self.groups.setdefault(tuple(l.kernel.cluster_dims for l in p.launches), []).append(b)
        self.setup["plans"] = clock() - t0
        self._group_of: dict[int, tuple[tuple[int, int, int], ...]] = {
            b: sig for sig, sizes in self.groups.items() for b in sizes
        }
        self.graphs: dict[tuple[tuple[int, int, int], ...], Any] = {}
        self.execs: dict[tuple[tuple[int, int, int], ...], Any] = {}
        # Per exec, its shadow (rawgraph.updates.shadow): node i's parameters are those of the
        # size it was re-shaped to last, whose key (function, grid, block, shared memory,
        # arguments) _current holds.
        self._shadows: dict[tuple, ExecShadow] = {}
        self._current: dict[tuple, list] = {}
        self._handles: dict[tuple, list] = {}
        for sig, sizes in self.groups.items():
            self._capture(sig, max(sizes))
        self._order = StreamOrder(self.device)
        self._row_bytes = self.width * 4
        self._closed = False

    def _capture(self, sig: tuple, top: int) -> None:
        """The exec of one group, captured at its largest size ``top``, and its shadow."""
        s, plan = self.stream, self._plans[top]
        self.warm_up(plan.launches, s)
        t0 = time.perf_counter()
        graph = capture_plan(plan, s, warmup=False)
        self.setup["capture"] += time.perf_counter() - t0
        exe = instantiate_uploaded(graph, s, self.setup)
        self.graphs[sig], self.execs[sig] = graph, exe
        shadow = self._shadows[sig] = ExecShadow(exe, self.device)
        for node, params in zip(graph.nodes, self._params[top]):
            shadow.add(node.handle, params)
        self._handles[sig] = shadow.handles
        self._current[sig] = list(self._keys[top])

    def reshape(self, n: int) -> int:
        """Make the exec that serves ``n`` rows run ``n`` rows (``cuGraphExecKernelNodeSetParams``
        on each node whose function, grid, block, shared memory or arguments differ); returns the
        pushes made.

        Raises
        ------
        ClosedError
            After :meth:`close`.
        TypeError, ShapeError
            For an ``n`` that is not an int in ``1..max_batch`` (before any driver call).

        See Also
        --------
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        if self._closed:
            raise ClosedError("ReshapedGraph is closed")
        self._check_n(n)
        sig = self._group_of[int(n)]
        params, keys, current = self._params[n], self._keys[n], self._current[sig]
        shadow = self._shadows[sig]
        held = shadow.params
        changed: list[int] = []
        olds: list[tuple] = []
        for i, key in enumerate(keys):
            if current[i] != key:
                changed.append(i)
                olds.append((held[i], current[i]))
                held[i], current[i] = params[i], key
        # a refused push puts every node back (_unshape, then the shadow re-pushes those taken)
        return shadow.push(changed, self._unshape, (sig, changed, olds))

    def _unshape(self, log: tuple) -> None:
        """Undo of a refused re-shape: each changed node's shadow gets its parameters back."""
        sig, changed, olds = log
        held, current = self._shadows[sig].params, self._current[sig]
        for i, (params, key) in zip(changed, olds):
            held[i], current[i] = params, key

    @property
    def pushes(self) -> int:
        """Node pushes made by :meth:`run` and :meth:`reshape` so far (the shadows' count)."""
        return sum(shadow.pushes for shadow in self._shadows.values())

    def run(self, x: Any, n: int, stream: Any = None) -> DeviceArray:
        """Run the block on the first ``n`` rows of ``x`` (``n`` <= ``max_batch``); returns the
        ``n`` result rows, a view of :attr:`output` valid until the next run."""
        if self._closed:
            raise ClosedError("ReshapedGraph is closed")
        xa = check_rows(x, n, self.width)
        self._check_n(n)
        src, dst, nbytes = xa.ptr, self.input.ptr, n * self._row_bytes
        # A partly overlapping x would make the copy below undefined (cuMemcpyDtoDAsync).
        if src != dst and src < dst + self.input.nbytes and dst < src + nbytes:
            raise LayoutError("x overlaps the persistent input without being it")
        s = self._order.enter(self.stream if stream is None else stream)
        if src != dst:
            call(driver.cuMemcpyDtoDAsync, self.input.ptr, xa.ptr, n * self._row_bytes, s.handle)
        self.reshape(n)
        self.execs[self._group_of[n]].launch(s)
        return DeviceArray(self.output.ptr, (n, self.width), np.dtype(np.float32), self.output)

    def _check_n(self, n: Any) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if not 1 <= n <= self.max_batch:
            raise ShapeError(f"n = {n} is outside 1..max_batch = {self.max_batch}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close_all(
            self.execs.values(), self.graphs.values(), self._models.values(), (self.arena, self.input, self.output)
        )
        self._order.close()
        if self._own_stream:
            self.stream.close()
