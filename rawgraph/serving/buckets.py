"""Bucket graphs: one captured graph per batch-size bucket, over one set of weights and one
scratch arena, padding each batch up to its bucket.

The rules this module keeps (``docs/semantics.md``, "Buckets, padding and graph memory"):

- Every bucket graph reads the same persistent input and writes the same persistent output,
  ``(largest bucket, width)`` each; bucket ``b`` uses their first ``b`` rows.
- Padding rows (``n`` real rows in a bucket of ``b``) are zeroed before the replay. The block is
  row-wise (each output row depends on its own input row only), so padding can never change a
  real row; zeroing keeps whatever was there (NaN from a poisoned buffer) out of the padding's
  outputs too.
- Buckets replay one at a time on a stream, so their scratch is one arena sized for the largest
  bucket (``scratch="arena"``). Runs on another stream than the last are ordered after it
  (``cuEventRecord`` on the old stream, ``cuStreamWaitEvent`` on the new one), so two buckets of
  one arena never run at the same time. ``scratch="graph"`` allocates the scratch inside each
  graph instead (memory nodes): the driver's pool reuses its pages across graphs launched into
  one stream. ``scratch="private"`` gives every bucket its own workspace (the baseline).
- Above the largest bucket, batches run in chunks of the largest bucket (the fallback, counted in
  :attr:`BucketGraphs.stats`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.capture import Capture
from ..graphs.graph import Graph, GraphExec
from ..runtime.device import Device
from ..runtime.errors import ClosedError, DTypeError, LayoutError, ShapeError, call
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array
from ..runtime.stream import Event, Stream, as_stream
from .lifecycle import WarmUp, close_all, instantiate_uploaded
from .protocol import RowwiseModel, check_model
from .sizes import check_sizes, pick_bucket, vllm_sizes

SCRATCH_MODES = ("arena", "graph", "private")


def _nbytes(workspace: Any) -> int:
    return int(getattr(workspace, "nbytes", 0)) if workspace is not None else 0


def graph_scratch(cap: Capture, layout: dict[str, tuple[tuple[int, ...], Any]]) -> tuple[int, dict[str, DeviceArray]]:
    """One allocation inside the capture (``cuMemAllocAsync``: a memory node) holding every
    scratch array of ``layout`` (name -> (shape, dtype)), each 256-byte aligned; returns its
    address (for the matching ``cap.mem_free``) and the arrays. Each is empty with no owner:
    graph memory is only valid while a replay runs between the node and its free.

    See Also
    --------
    cuMemAllocAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC__ASYNC.html
    """
    offsets, total = {}, 0
    for name, (shape, dtype) in layout.items():
        offsets[name] = total
        total += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 256) * 256
    ptr = cap.mem_alloc(max(total, 256))
    views = {
        name: DeviceArray(ptr + offsets[name], tuple(int(d) for d in shape), np.dtype(dtype), None)
        for name, (shape, dtype) in layout.items()
    }
    return ptr, views


def check_rows(x: Any, n: Any, width: int, what: str = "x") -> DeviceArray:
    """``x`` as a float32 ``(rows >= n, width)`` contiguous device array and ``n`` a positive int,
    refused with a typed error otherwise (before anything reaches the GPU)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ShapeError(f"n must be >= 1, got {n}")
    xa = as_device_array(x, what)
    if xa.dtype != np.float32:
        raise DTypeError(f"{what} has dtype {xa.dtype}, the block runs float32")
    if len(xa.shape) != 2 or xa.shape[1] != width:
        raise ShapeError(f"{what} has shape {xa.shape}, expected (rows, {width})")
    if xa.shape[0] < n:
        raise ShapeError(f"{what} has {xa.shape[0]} rows, fewer than n = {n}")
    if xa.ptr % 4:
        raise LayoutError(f"{what} address 0x{xa.ptr:x} is not 4-byte aligned")
    return xa


class StreamOrder:
    """Orders work on successive streams: the first use of a new stream waits for everything
    queued on the one used before (``cuEventRecord`` there, ``cuStreamWaitEvent`` here). Work on
    one stream is ordered already and costs nothing extra.

    The stream used before may have been closed since: ``cuStreamDestroy`` returns with its work
    still queued, so the new stream then waits for that stream's tail event (recorded by
    :meth:`rawgraph.runtime.stream.Stream.close`) instead.

    See Also
    --------
    cuEventRecord : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html
    cuStreamWaitEvent : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    cuStreamDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
    """

    def __init__(self, device: Any):
        self._event = Event(timing=False, device=device)
        self._last: Stream | None = None

    def enter(self, stream: Any) -> Stream:
        s = as_stream(stream)
        last = self._last
        if last is not None and (last.ptr != s.ptr or last is not s and last.closed):
            if not last.closed:
                self._event.record(last)
                s.wait(self._event)
            elif last.tail is not None:
                s.wait(last.tail)
        self._last = s
        return s

    def close(self) -> None:
        self._event.close()
        self._last = None


class BucketGraphs:
    """One graph per bucket size over a model's weights; ``run(x, n)`` replays the smallest
    bucket that holds ``n`` rows (see the module docstring for the rules).

    Its attributes stay on the one object: they are the documented results of one build (sizes,
    buffers, graphs, execs, setup seconds, memory) that :class:`~rawgraph.serving.reshape.RowCountBuckets`
    extends and the benchmarks read, and the run state (stream order, overflow buffer, stats) a
    ``run`` touches together; nothing in it is released apart from the rest.

    Parameters
    ----------
    model : RowwiseModel
        Any model keeping the row-wise protocol (:mod:`rawgraph.serving.protocol`), e.g. a
        :class:`~rawgraph.TinyBlock`; its weights are shared, never copied, and its own batch
        size does not matter.
    sizes : sequence of int, optional
        Bucket sizes; default :func:`~rawgraph.serving.sizes.vllm_sizes` of ``max_batch``.
    max_batch : int, default 256
        Used when ``sizes`` is not given.
    stream : stream-like, optional
        For capture, warm-up and upload (default: a new stream).
    scratch : {"arena", "graph", "private"}
    zero_padding : bool, default True
        Zero the padding rows before each replay (``cuMemsetD32Async``). Real rows are the same
        either way; without it the padding's outputs are whatever its inputs make of them.

    Attributes
    ----------
    sizes : list of int
    input, output : DeviceBuffer
        The persistent ``(largest bucket, width)`` buffers every graph reads and writes.
    setup : dict
        Seconds spent on ``warmup``, ``capture``, ``instantiate`` and ``upload`` (all buckets).
    warm_up : WarmUp
        The eager runs before the captures: ``runs`` of them made, ``skipped`` for sizes whose
        kernel functions had all run already.
    memory : dict
        Bytes: ``weights`` (shared, not counted in the rest), ``workspace``, ``io`` and
        ``graphs`` (device memory the execs took, from ``cuMemGetInfo``).
    stats : collections.Counter
        ``runs``, ``rows`` (asked for), ``computed`` (rows the graphs ran), ``fallback_runs``,
        ``fallback_chunks``, and ``bucket:<b>`` per bucket.

    See Also
    --------
    cuMemsetD32Async : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuMemGetInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html

    Notes
    -----
    State: 23 instance attributes, most of them read-only results a caller inspects (the graphs
    and execs per size, the sizes, the set-up times, the memory figures, the warm-up record, the
    run statistics) beside the buffers every bucket shares (arena, input, output, overflow) and the
    stream order of the run path; what needs releasing (execs, graphs, models, buffers, the order's
    event and an owned stream) is freed in one place, :meth:`close`.
    """

    sizes: list[int]
    largest: int
    width: int
    zero_padding: bool
    stream: Stream
    input: DeviceBuffer
    output: DeviceBuffer
    arena: Any | None
    setup: dict[str, float]
    warm_up: WarmUp
    memory: dict[str, int]

    def __init__(
        self,
        model: RowwiseModel,
        sizes: Sequence[int] | None = None,
        max_batch: int = 256,
        stream: Any = None,
        scratch: str = "arena",
        zero_padding: bool = True,
    ):
        if scratch not in SCRATCH_MODES:
            raise ValueError(f"scratch must be one of {SCRATCH_MODES}, got {scratch!r}")
        check_model(model)
        self.sizes = check_sizes(vllm_sizes(max_batch) if sizes is None else sizes)
        self.largest = self.sizes[-1]
        self.width = model.width
        self.device: Device = model.device
        self.scratch = scratch
        self.zero_padding = bool(zero_padding)
        self.model = model
        self._own_stream = stream is None
        self.stream = Stream(device=self.device) if stream is None else as_stream(stream)
        free0 = self.device.memory_info()[0]
        self.input = DeviceBuffer((self.largest, self.width), np.float32, self.device)
        self.output = DeviceBuffer((self.largest, self.width), np.float32, self.device)
        self.arena = model.make_workspace(self.largest) if scratch == "arena" else None
        self._models: dict[int, Any] = {}
        for b in self.sizes:
            # scratch "graph": no workspace at all, the plans get memory allocated in the capture
            self._models[b] = model.with_batch(
                b, workspace=self.arena if scratch == "arena" else False if scratch == "graph" else None
            )
        free1 = self.device.memory_info()[0]
        self.graphs: dict[int, Graph] = {}
        self.execs: dict[int, GraphExec] = {}
        self.setup = {"warmup": 0.0, "capture": 0.0, "instantiate": 0.0, "upload": 0.0}
        s = self.stream
        self.input.poison(s)  # never capture or warm up on uninitialised memory
        self.warm_up = WarmUp(self.setup)
        for b in reversed(self.sizes):  # largest first, as vLLM does
            self.graphs[b], self.execs[b] = self._capture(b)
        free2 = self.device.memory_info()[0]
        self.memory = {
            "weights": int(getattr(model, "weights_nbytes", 0)),
            "io": self.input.nbytes + self.output.nbytes,
            "workspace": (
                _nbytes(self.arena)
                if self.arena is not None
                else sum(_nbytes(getattr(m, "workspace", None)) for m in self._models.values())
            ),
            "allocated": free0 - free1,
            "graphs": free1 - free2,
        }
        self._order = StreamOrder(self.device)
        self._overflow: DeviceBuffer | None = None
        self._row_bytes = self.width * 4
        self.stats: Counter[str] = Counter()
        self._closed = False

    def _capture(self, b: int) -> tuple[Graph, GraphExec]:
        """Bucket ``b``'s graph (warmed up first unless its scratch is graph memory) and its
        uploaded exec."""
        clock, s, scratch = time.perf_counter, self.stream, self.scratch
        m = self._models[b]
        xv, ov = self._rows(self.input, b), self._rows(self.output, b)
        if scratch != "graph":
            plan = m.plan(xv, ov)
            self.warm_up(plan.launches, s)
        t0 = clock()
        with Capture(s) as cap:
            if scratch == "graph":
                ptr, views = graph_scratch(cap, m.scratch_layout(b))
                plan = m.plan(xv, ov, scratch=views)
            cap.run(plan)
            if scratch == "graph":
                cap.mem_free(ptr)
        graph = cap.graph
        assert graph is not None
        graph.plan = plan
        self.setup["capture"] += clock() - t0
        exe = instantiate_uploaded(graph, s, self.setup)
        if scratch == "graph":  # the first replay maps the graph's memory: count it as warm-up
            t0 = clock()
            exe.launch(s)
            s.synchronize()
            self.setup["warmup"] += clock() - t0
        return graph, exe

    @staticmethod
    def _rows(buf: DeviceBuffer, n: int) -> DeviceArray:
        return DeviceArray(buf.ptr, (n, buf.shape[1]), buf.dtype, buf)

    def bucket_for(self, n: int) -> int | None:
        """The bucket ``n`` rows run in, or None above the largest (then :meth:`run` chunks)."""
        return pick_bucket(self.sizes, n)

    def run(self, x: Any, n: int, stream: Any = None) -> DeviceArray:
        """Run the block on the first ``n`` rows of ``x``; returns the ``n`` result rows.

        ``x`` is ideally :attr:`input` itself (no copy); any other ``(rows >= n, width)`` float32
        device array is copied in first (``cuMemcpyDtoDAsync``). The result is a view of
        :attr:`output` (of an overflow buffer above the largest bucket), valid until the next
        run: copy it out, stream-ordered, before running again.

        Raises
        ------
        TypeError, ShapeError, DTypeError, LayoutError, NotOnDeviceError
            For a bad ``n`` or ``x``, before anything reaches the GPU.

        See Also
        --------
        cuMemcpyDtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        if self._closed:
            raise ClosedError("BucketGraphs is closed")
        xa = check_rows(x, n, self.width)
        s = self._order.enter(self.stream if stream is None else stream)
        if n > self.largest:
            return self._run_chunks(xa, n, s)
        b = pick_bucket(self.sizes, n)
        assert b is not None
        self._stage(xa.ptr, n, b, s)
        self.execs[b].launch(s)
        st = self.stats
        st["runs"] += 1
        st["rows"] += n
        st["computed"] += b
        st[f"bucket:{b}"] += 1
        return DeviceArray(self.output.ptr, (n, self.width), np.dtype(np.float32), self.output)

    def _stage(self, src: int, n: int, b: int, s: Stream) -> None:
        """Rows in (unless they are already in the input), padding zeroed."""
        rb, dst = self._row_bytes, self.input.ptr
        if src != dst:
            if src < dst + self.input.nbytes and dst < src + n * rb:
                raise LayoutError("x overlaps the persistent input without being it")
            call(driver.cuMemcpyDtoDAsync, dst, src, n * rb, s.handle)
        if self.zero_padding and b > n:
            call(driver.cuMemsetD32Async, dst + n * rb, 0, (b - n) * self.width, s.handle)

    def _run_chunks(self, xa: DeviceArray, n: int, s: Stream) -> DeviceArray:
        """The fallback above the largest bucket: chunks of at most the largest bucket, each
        staged through the persistent input and copied to an overflow buffer of ``n`` rows."""
        if self._overflow is None or self._overflow.shape[0] < n:
            old = self._overflow
            self._overflow = DeviceBuffer((n, self.width), np.float32, self.device)
            if old is not None:
                s.synchronize()  # queued chunks may still write the old buffer
                old.close()
        rb = self._row_bytes
        for start in range(0, n, self.largest):
            c = min(self.largest, n - start)
            b = pick_bucket(self.sizes, c)
            assert b is not None
            self._stage(xa.ptr + start * rb, c, b, s)
            self.execs[b].launch(s)
            call(driver.cuMemcpyDtoDAsync, self._overflow.ptr + start * rb, self.output.ptr, c * rb, s.handle)
            self.stats["fallback_chunks"] += 1
            self.stats["computed"] += b
        self.stats["runs"] += 1
        self.stats["fallback_runs"] += 1
        self.stats["rows"] += n
        return DeviceArray(self._overflow.ptr, (n, self.width), np.dtype(np.float32), self._overflow)

    def padding_waste(self) -> float:
        """Share of the rows computed so far that nobody asked for."""
        c = self.stats["computed"]
        return 0.0 if c == 0 else 1.0 - self.stats["rows"] / c

    def close(self) -> None:
        """Destroy every exec and graph and free the buffers this object made (the weights stay
        with the model); safe twice."""
        if self._closed:
            return
        self._closed = True
        close_all(
            self.execs.values(),
            self.graphs.values(),
            self._models.values(),
            (self.arena, self.input, self.output, self._overflow),
        )
        self._order.close()
        if self._own_stream:
            self.stream.close()

    def __enter__(self) -> BucketGraphs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
