"""TinyBlock: ``layers`` residual blocks ``y = relu(x @ W1) @ W2 + x`` as a launch plan.

Two forms of the same arithmetic:

- ``unfused``: 4 kernels per block (matmul, relu, matmul, add) -- the same operations as the
  PyTorch reference ``torch.relu(x @ w1) @ w2 + x``;
- ``fused``: 2 kernels per block (matmul_relu, matmul_add);
- ``block``: 1 kernel per block (``kernels/block.cu``, a cluster of 8 CTAs), for width <= 256
  and a multiple of 4, on compute capability 9.0.

On compute capability 9.0 the launches of a plan are chained with programmatic dependent launch
(``pdl``, see :class:`~rawgraph.runtime.launch.LaunchPlan`): each kernel's weight loads and launch overlap
the kernel before it. ``pdl=False`` gives plain stream order, for comparison.

``unfused`` and ``fused`` round identically (relu is exact and the residual is one fp32 add in
either form); ``block`` sums in another order, so it agrees with them to float tolerance only.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .. import ops
from ..runtime.device import Device, get_device
from ..runtime.errors import LayoutError, ShapeError
from ..runtime.launch import ArgUse, KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from ..runtime.module import get_kernel
from ..runtime.resource import Resource
from ..runtime.stream import Stream
from ..serving.protocol import RowScratch

FORMS = ("unfused", "fused", "block")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ShapeError(f"{name} must be >= 1, got {value}")
    return int(value)


def _close_all(owned: list) -> None:
    for obj in owned:
        obj.close()


def reference_forward(x: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The block in float64 NumPy: the reference every path is checked against."""
    y = np.asarray(x, dtype=np.float64)
    for w1, w2 in weights:
        h = y @ w1.astype(np.float64)
        y = np.maximum(h, 0.0) @ w2.astype(np.float64) + y
    return y


SCRATCH = ("h", "a", "z", "act0", "act1")


class BlockWeights(Resource):
    """The weights of ``layers`` residual blocks: one set, shared by every batch size.

    ``W1[i]``, ``W2[i]`` are ``(width, width)`` float32, uniform in ``[-sqrt(3/width),
    sqrt(3/width))`` (variance 1/width), made on the device from ``seed`` (``kernels/init.cu``),
    so the same seed gives the same weights anywhere. Frees them on ``close()`` (``cuMemFree``).

    Parameters
    ----------
    width, layers : int
    seed : int, default 0
    device : Device, optional

    See Also
    --------
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """

    width: int
    layers: int
    seed: int
    device: Device

    def __init__(self, width: int, layers: int = 1, seed: int = 0, device: Device | None = None):
        self.width = _positive_int("width", width)
        self.layers = _positive_int("layers", layers)
        self.seed = int(seed)
        self.device = (device or get_device()).activate()
        owned: list[DeviceBuffer] = []
        self._own(_close_all, owned, name="cuMemFree (weights)")
        w = self.width
        self.pairs: list[tuple[DeviceBuffer, DeviceBuffer]] = []
        for _ in range(self.layers):
            pair = (DeviceBuffer((w, w), np.float32, self.device), DeviceBuffer((w, w), np.float32, self.device))
            owned.extend(pair)
            self.pairs.append(pair)
        scale = float(np.sqrt(3.0 / w))
        with Stream(device=self.device) as s:
            for i, (w1, w2) in enumerate(self.pairs):
                for j, buf in enumerate((w1, w2)):
                    ops.fill_uniform(self.device, buf.view(), (self.seed << 24) ^ (2 * i + j), scale)(s)
            s.synchronize()

    @property
    def nbytes(self) -> int:
        return sum(w1.nbytes + w2.nbytes for w1, w2 in self.pairs)

    def numpy(self, stream: Any = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Host copies of every (W1, W2), read on ``stream`` (default: a private stream).

        Stream-ordered, never a context-wide fence: safe while other threads capture. Nothing in
        a plan writes the weights, so reading them needs no wait for other streams' work.
        """
        self._check_open()
        if stream is not None:
            return [(w1.to_numpy(stream), w2.to_numpy(stream)) for w1, w2 in self.pairs]
        with Stream(device=self.device) as own:
            return [(w1.to_numpy(own), w2.to_numpy(own)) for w1, w2 in self.pairs]


class Workspace(RowScratch):
    """Per-batch scratch (activations) of a block: ``h``, ``a``, ``z``, ``act0``, ``act1``, each
    ``(rows, width)`` float32 (``cuMemAlloc`` / ``cuMemFree``).

    One workspace can serve every batch size up to ``rows``: :meth:`views` gives the first
    ``batch`` rows of each buffer. Plans that share a workspace must not run at the same time
    (they would write the same scratch): run them one after another on one stream, as bucket
    graphs do.

    See Also
    --------
    cuMemAlloc : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """

    width: int

    def __init__(self, rows: int, width: int, device: Device | None = None):
        self.width = _positive_int("width", width)
        super().__init__(_positive_int("rows", rows), {name: self.width for name in SCRATCH}, device)


class TinyBlock(Resource):
    """Weights and scratch for ``layers`` residual blocks on one device.

    Parameters
    ----------
    width : int
        Feature width (K = N of every matmul).
    batch : int
        Rows of x.
    layers : int, default 1
    seed : int, default 0
        Weights are uniform in ``[-sqrt(3/width), sqrt(3/width))`` (variance 1/width), made on the
        device from the seed (``kernels/init.cu``).
    form : {"unfused", "fused", "block"}
    device : Device, optional
    pdl : bool, optional
        Chain launches with programmatic dependent launch; default: where the device has it (9.0+).
    precision : {"auto", "fp32", "tf32x3"}, default "auto"
        The matmuls' arithmetic (:data:`rawgraph.ops.PRECISION_CHOICES`): the fp32 kernels, the
        fp32-accurate tensor-core GEMM, or per product whichever :func:`rawgraph.ops.auto_precision`
        picks (tf32x3 only where it was measured faster at an error no worse than cuBLAS fp32's).
        Form ``"block"`` is one fp32 kernel: it takes ``"auto"`` or ``"fp32"``.
    weights : BlockWeights, optional
        Share these weights (``width``, ``layers`` and ``seed`` then come from them) instead of
        making new ones; they stay owned by whoever made them.
    workspace : Workspace or False, optional
        Use (the first ``batch`` rows of) this scratch instead of allocating ``(batch, width)``
        scratch; not owned either. ``False``: no scratch at all, every :meth:`plan` is given its
        own (memory allocated inside a capture, say).

    Attributes
    ----------
    weights : list of (DeviceBuffer, DeviceBuffer)
        ``(W1, W2)`` per layer (``block_weights.pairs``).
    block_weights : BlockWeights
    workspace : Workspace
    """

    width: int
    batch: int
    layers: int
    seed: int
    device: Device
    pdl: bool
    precision: str
    weights: list[tuple[DeviceBuffer, DeviceBuffer]]

    def __init__(
        self,
        width: int,
        batch: int,
        layers: int = 1,
        seed: int = 0,
        form: str = "unfused",
        device: Device | None = None,
        pdl: bool | None = None,
        weights: BlockWeights | None = None,
        workspace: Workspace | None | bool = None,
        precision: str = "auto",
    ):
        ops.check_precision(precision)
        if form == "block" and precision == "tf32x3":
            raise ValueError("form 'block' is one fp32 kernel: precision must be 'auto' or 'fp32'")
        if weights is not None:
            weights._check_open()
            if weights.width != width:
                raise ShapeError(f"shared weights have width {weights.width}, the model {width}")
            layers, seed, device = weights.layers, weights.seed, device or weights.device
        self.width = _positive_int("width", width)
        self.batch = _positive_int("batch", batch)
        self.layers = _positive_int("layers", layers)
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if form == "block" and not ops.block_fits(self.width):
            raise ShapeError(f"form 'block' needs width <= {ops.BLOCK_MAX_WIDTH} and a multiple of 4, got {self.width}")
        self.form = form
        self.precision = precision
        self.seed = int(seed)
        self.device = (device or get_device()).activate()
        if form == "block" and not ops.has_clusters(self.device):
            raise ShapeError("form 'block' needs thread-block clusters (compute capability 9.0)")
        if pdl and not ops.has_clusters(self.device):
            raise ValueError("programmatic dependent launch needs compute capability 9.0")
        self.pdl = ops.has_clusters(self.device) if pdl is None else bool(pdl)
        if workspace is True:
            raise TypeError("workspace must be a Workspace, None (allocate one) or False (none)")
        if isinstance(workspace, Workspace):
            workspace._check_open()
            if workspace.width != self.width or workspace.rows < self.batch:
                raise ShapeError(
                    f"workspace of {workspace.rows} x {workspace.width} cannot hold a {self.batch} x {self.width} batch"
                )
        owned: list[Resource] = []
        self._own(_close_all, owned, name="cuMemFree (model)")
        self._owned = owned
        if weights is None:
            weights = BlockWeights(self.width, self.layers, self.seed, self.device)
            owned.append(weights)
        if workspace is None:
            workspace = Workspace(self.batch, self.width, self.device)
            owned.append(workspace)
        self.block_weights = weights
        self.workspace: Workspace | None = workspace if isinstance(workspace, Workspace) else None
        self.weights = weights.pairs
        self._plans: dict[tuple[int, int], LaunchPlan] = {}

    def with_batch(self, batch: int, workspace: Workspace | None | bool = None) -> TinyBlock:
        """The same block (same weights, form, PDL choice and precision) for another batch size;
        its scratch is ``workspace`` if given, else its own."""
        return TinyBlock(
            self.width,
            batch,
            form=self.form,
            device=self.device,
            pdl=self.pdl,
            weights=self.block_weights,
            workspace=workspace,
            precision=self.precision,
        )

    # -- the row-wise model protocol (rawgraph.serving.protocol) ---------------------------
    def make_workspace(self, rows: int) -> Workspace:
        """Scratch for every batch size up to ``rows`` (for :meth:`with_batch`)."""
        self._check_open()
        return Workspace(rows, self.width, self.device)

    def scratch_layout(self, batch: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Name -> (shape, dtype) of the scratch a ``batch``-row plan uses."""
        return {name: ((int(batch), self.width), np.dtype(np.float32)) for name in SCRATCH}

    @property
    def weights_nbytes(self) -> int:
        return self.block_weights.nbytes

    def row_count_arg(self, launch: Any) -> tuple[str, int] | None:
        """The argument bounding a launch's rows: ``B`` of the matmul and block kernels, ``n``
        (rows x width values) of relu and add."""
        names = launch.args.names()
        if "B" in names:
            return "B", 1
        if launch.kernel.short_name in ("relu", "add") and "n" in names:
            return "n", self.width
        return None

    def row_grid(self, launch: Any) -> tuple[int, int] | None:
        """The grid axis along the rows and the rows per block (``rawgraph.serving.protocol``):
        the matmul kernels tile batch rows on axis 2 (``bt`` rows for ``matvec_kernel`` /
        ``matvec_split_kernel``, ``GEMM_TILE_M`` for the GEMMs, BM -- the second template
        argument -- for the sgemm and tf32x3 kernels and their split forms), the block kernel on
        axis 1 (its ``bt``); relu and add are grid-stride (None)."""
        name = launch.kernel.name
        m = re.fullmatch(r"\s*(\w+)\s*<([^>]*)>\s*", name)
        if m is None:
            return None
        base, targs = m.group(1), [t.strip() for t in m.group(2).split(",")]
        if base in ("matvec_kernel", "matvec_split_kernel") and len(targs) >= 4:
            return 2, int(targs[3])
        if base in ("gemm_kernel", "gemm_split_kernel"):
            return 2, ops.GEMM_TILE_M
        bm_second = ("sgemm", "tf32x3", "tf32x3_wgmma")
        if base in {f"{k}{form}" for k in bm_second for form in ("_kernel", "_split_kernel")} and len(targs) >= 2:
            return 2, int(targs[1])
        if base == "block_kernel" and len(targs) == 2:
            return 1, int(targs[0])
        return None

    # -- plans ----------------------------------------------------------------------------
    def check_io(self, x: Any, out: Any) -> tuple[DeviceArray, DeviceArray]:
        """Validate an input and an output array for this model (shape, dtype, layout, device)."""
        shape = (self.batch, self.width)
        xa = check_array(as_device_array(x, "x"), shape, np.float32, "x", self.device)
        oa = check_array(as_device_array(out, "out"), shape, np.float32, "out", self.device)
        if xa.ptr < oa.ptr + oa.nbytes and oa.ptr < xa.ptr + xa.nbytes:
            raise LayoutError("x and out overlap; the residual reads x while out is written")
        return xa, oa

    def plan(self, x: Any, out: Any, scratch: dict[str, DeviceArray] | None = None) -> LaunchPlan:
        """The launch plan reading ``x`` and writing ``out``, validated once here.

        Buffer names in the plan: ``x``, ``out``, ``W1[i]``, ``W2[i]``, ``h``, ``a``, ``z``,
        ``act0``, ``act1`` (block outputs ping-pong between ``act0`` and ``act1``). ``scratch``
        replaces the workspace's views (e.g. memory allocated inside a capture); each must be a
        ``(batch, width)`` float32 device array.
        """
        self._check_open()
        xa, oa = self.check_io(x, out)
        bufs: dict[str, DeviceArray] = {"x": xa, "out": oa}
        if scratch is None:
            if self.workspace is None:
                raise ValueError("this model has no workspace (workspace=False): pass scratch to plan()")
            bufs.update(self.workspace.views(self.batch))
        else:
            if set(scratch) != set(SCRATCH):
                raise KeyError(f"scratch must name exactly {SCRATCH}, got {sorted(scratch)}")
            for name, view in scratch.items():
                bufs[name] = check_array(as_device_array(view, name), (self.batch, self.width), np.float32, name)
        for i, (w1, w2) in enumerate(self.weights):
            bufs[f"W1[{i}]"], bufs[f"W2[{i}]"] = w1.view(), w2.view()
        launches = []
        dev, p = self.device, self.precision
        for i in range(self.layers):
            src = "x" if i == 0 else f"act{(i - 1) % 2}"
            dst = "out" if i == self.layers - 1 else f"act{i % 2}"
            if self.form == "unfused":
                launches += [
                    ops.matmul(dev, bufs, src, f"W1[{i}]", "h", label=f"L{i}.matmul1", precision=p),
                    ops.relu(dev, bufs, "h", "a", label=f"L{i}.relu"),
                    ops.matmul(dev, bufs, "a", f"W2[{i}]", "z", label=f"L{i}.matmul2", precision=p),
                    ops.add(dev, bufs, "z", src, dst, label=f"L{i}.add"),
                ]
            elif self.form == "block":
                launches.append(ops.block(dev, bufs, src, f"W1[{i}]", f"W2[{i}]", dst, label=f"L{i}.block"))
            else:
                launches += [
                    ops.matmul(dev, bufs, src, f"W1[{i}]", "a", "relu", label=f"L{i}.matmul_relu", precision=p),
                    ops.matmul(dev, bufs, "a", f"W2[{i}]", dst, "add", r=src, label=f"L{i}.matmul_add", precision=p),
                ]
        guards = (
            [self._finalizer, self.block_weights._finalizer]
            + ([self.workspace._finalizer] if self.workspace is not None else [])
            + [a.owner._finalizer for a in (xa, oa) if isinstance(a.owner, DeviceBuffer)]
        )
        return LaunchPlan(launches, bufs, ("x",), ("out",), guards, pdl=self.pdl)

    def layer_plan(self, x: Any, out: Any, layer: Any) -> LaunchPlan:
        """One layer of this block, picked on the device: the layer whose index is the ``uint32``
        at ``layer`` when the plan runs (what :class:`~rawgraph.control.DepthLoop` iterates).

        ``rg_select_layer`` (``kernels/control.cu``) copies that layer's ``W1`` and ``W2`` into
        fixed buffers, then the layer's own kernels run over them with plain edges (no PDL: a
        conditional body). A captured node reads fixed addresses, hence the copy
        (``2 * width^2 * 4`` bytes each way per layer); the arithmetic kernels are the plain
        plan's, so the bits match. The fixed weights, the pointer tables and the one-layer model
        are this model's (freed by :meth:`close`), made anew per call so two loops never share them.
        """
        self._check_open()
        la = check_array(as_device_array(layer, "layer"), (1,), np.uint32, "layer", self.device)
        fixed = BlockWeights(self.width, 1, seed=0, device=self.device)
        self._owned.append(fixed)
        one = TinyBlock(
            self.width,
            self.batch,
            form=self.form,
            device=self.device,
            pdl=False,
            weights=fixed,
            precision=self.precision,
        )
        self._owned.insert(0, one)
        tables = [
            DeviceBuffer.from_numpy(np.array([pair[i].ptr for pair in self.weights], np.uint64), self.device)
            for i in (0, 1)
        ]
        self._owned.extend(tables)
        n = self.width * self.width
        args = KernelArgs(
            [("w1_table", "ptr"), ("w2_table", "ptr"), ("counter", "ptr"), ("w1", "ptr"), ("w2", "ptr"), ("n", "i32")]
        )
        w1, w2 = fixed.pairs[0]
        args.update(
            {
                "w1_table": tables[0].ptr,
                "w2_table": tables[1].ptr,
                "counter": la.ptr,
                "w1": w1.ptr,
                "w2": w2.ptr,
                "n": n,
            }
        )
        uses = {"counter": ArgUse("layer", "read"), "w1": ArgUse("W1[0]", "write"), "w2": ArgUse("W2[0]", "write")}
        cols = n // 4 if n % 4 == 0 else n
        grid = (max(1, min(-(-cols // 256), 2 * self.device.info.multiprocessors)), 1, 1)
        select = Launch(
            get_kernel("control", "rg_select_layer", self.device), grid, (256, 1, 1), args, uses, 0, "select_layer"
        )
        body = one.plan(x, out)
        return LaunchPlan(
            [select, *body.launches],
            {**body.buffers, "layer": la},
            ("x",),
            ("out",),
            [*body._guards, self._finalizer],
            pdl=False,
        )

    def forward(self, x: Any, out: Any, stream: Stream) -> None:
        """Run eagerly on ``stream`` (plans are cached per (x, out) address pair)."""
        key = (as_device_array(x, "x").ptr, as_device_array(out, "out").ptr)
        plan = self._plans.get(key)
        if plan is None or not all(g.alive for g in plan._guards):
            plan = self._plans[key] = self.plan(x, out)
        plan.run(stream)

    @property
    def kernels_per_layer(self) -> int:
        return {"unfused": 4, "fused": 2, "block": 1}[self.form]

    # -- reference ------------------------------------------------------------------------
    def weights_numpy(self, stream: Any = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Host copies of every (W1, W2) (see :meth:`BlockWeights.numpy`)."""
        self._check_open()
        return self.block_weights.numpy(stream)

    def reference(self, x: np.ndarray, stream: Any = None) -> np.ndarray:
        """float64 NumPy result for a host input ``x`` (weights read as :meth:`weights_numpy` does)."""
        return reference_forward(x, self.weights_numpy(stream))

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Free the weights and scratch this model made (shared ones stay with their owner);
        plans built from this model then refuse to run."""
        self._plans.clear()
        self._finalizer()

    def __repr__(self) -> str:
        pdl = " pdl" if self.pdl else ""
        precision = "" if self.precision == "auto" else f" {self.precision}"
        return f"<TinyBlock width={self.width} batch={self.batch} layers={self.layers} {self.form}{pdl}{precision}>"
