"""Bucket graphs and slots over a row-wise model made of your own kernels (issue 22, item 3).

``RMSNormScale`` keeps rawgraph's row-wise model protocol (``rawgraph/serving/protocol.py``)
with two :class:`rawgraph.RawKernel` kernels and nothing of rawgraph's own::

    t   = x / sqrt(mean(x^2) + eps) * g      rms_scale: one CTA per row, bounded by ``nrows``
    out = t * s + x                          scale_residual: elementwise, bounded by ``n``

so its plan has two launches and one scratch array (``t``). Every serving and control class
(``BucketGraphs``, ``RowCountBuckets``, ``ReshapedGraph``, ``SlotPool``, ``DepthLoop``,
``NormGate``) runs it as it runs a ``TinyBlock``. Importable (``tests/test_protocol_gpu.py`` uses
the class); run as a script it serves a few batch sizes through bucket graphs and a slot pool and
checks them against the float64 reference.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np

import rawgraph as rg
from rawgraph.serving.protocol import RowScratch

SRC = r"""
extern "C" __global__ void __launch_bounds__(128) rms_scale(const float* __restrict__ x, const float* __restrict__ g,
                                                            float* __restrict__ t, int width, int nrows, float eps) {
    __shared__ float part[32];
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {   // rows past nrows: nothing to do
        const float* xr = x + (long long)r * width;
        float acc = 0.0f;
        for (int c = threadIdx.x; c < width; c += blockDim.x) acc += xr[c] * xr[c];
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
        __syncthreads();
        if (threadIdx.x < 32) {
            float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (threadIdx.x == 0) part[0] = v;
        }
        __syncthreads();
        const float inv = rsqrtf(part[0] / (float)width + eps);
        __syncthreads();                                    // everyone has read part[0]
        for (int c = threadIdx.x; c < width; c += blockDim.x) t[(long long)r * width + c] = xr[c] * inv * g[c];
    }
}
extern "C" __global__ void scale_residual(const float* __restrict__ t, const float* __restrict__ x, float s,
                                          float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = t[i] * s + x[i];
}
"""
THREADS_ROW, THREADS_EW = 128, 256


def _close_all(owned: list) -> None:
    for obj in reversed(owned):
        obj.close()
    owned.clear()


class RMSNormScale:
    """``out = x / sqrt(mean(x^2) + eps) * g * s + x`` row by row, for ``(batch, width)`` float32.

    Parameters
    ----------
    width, batch : int
    seed : int
        ``g`` is ``1 + 0.1 * N(0, 1)`` from this seed (host NumPy, copied once).
    s, eps : float
    device : rawgraph.Device, optional
    workspace : RowScratch, None or False
        The scratch ``t``: the first ``batch`` rows of this one, a new one (None), or none
        (False: every :meth:`plan` is given ``scratch``).
    """

    def __init__(self, width: int, batch: int, seed: int = 0, s: float = 0.5, eps: float = 1e-6,
                 device: Any = None, workspace: Any = None, _shared: "RMSNormScale | None" = None):
        for name, v in (("width", width), ("batch", batch)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise rg.ShapeError(f"{name} must be a positive int, got {v!r}")
        if workspace is True:
            raise TypeError("workspace must be a RowScratch, None (allocate one) or False (none)")
        self.width, self.batch = int(width), int(batch)
        self.s, self.eps = float(s), float(eps)
        self._owned: list[Any] = []
        self._finalizer = weakref.finalize(self, _close_all, self._owned)
        if _shared is None:  # the weights and kernels: this model's, shared by every with_batch
            self.device = (device or rg.get_device()).activate()
            self.seed = int(seed)
            self.g_host = (1.0 + 0.1 * np.random.default_rng(self.seed).standard_normal(self.width)).astype(np.float32)
            self.g = rg.DeviceBuffer.from_numpy(self.g_host, self.device)
            self._owned.append(self.g)
            self.norm_k = rg.RawKernel(SRC, "rms_scale", device=self.device)
            self.residual_k = rg.RawKernel(SRC, "scale_residual", device=self.device)
            self._weights_alive = self._finalizer
            self._root: RMSNormScale | None = None
        else:
            _shared._check_open()
            if _shared.width != self.width:
                raise rg.ShapeError(f"shared weights have width {_shared.width}, the model {self.width}")
            self.device, self.seed, self.g_host, self.g = _shared.device, _shared.seed, _shared.g_host, _shared.g
            self.norm_k, self.residual_k = _shared.norm_k, _shared.residual_k
            self._weights_alive = _shared._weights_alive
            self._root = _shared._root or _shared  # the weights' owner lives while this model does
        if isinstance(workspace, RowScratch):
            workspace._check_open()
            if workspace.rows < self.batch or workspace.layout.get("t") != self.width:
                raise rg.ShapeError(f"workspace of {workspace.rows} rows {workspace.layout} cannot hold a "
                                    f"{self.batch} x {self.width} batch")
        elif workspace is None:
            workspace = RowScratch(self.batch, {"t": self.width}, self.device)
            self._owned.append(workspace)
        elif workspace is not False:
            raise TypeError(f"workspace must be a RowScratch, None or False, got {type(workspace).__name__}")
        self.workspace = workspace or None

    # -- the row-wise model protocol ---------------------------------------------------------
    def _check_open(self) -> None:
        if not self._finalizer.alive or not self._weights_alive.alive:
            raise rg.ClosedError("RMSNormScale is closed")

    def with_batch(self, batch: int, workspace: Any = None) -> "RMSNormScale":
        self._check_open()
        return type(self)(self.width, batch, s=self.s, eps=self.eps, workspace=workspace, _shared=self)

    def make_workspace(self, rows: int) -> RowScratch:
        self._check_open()
        return RowScratch(rows, {"t": self.width}, self.device)

    def scratch_layout(self, batch: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {"t": ((int(batch), self.width), np.dtype(np.float32))}

    @property
    def weights_nbytes(self) -> int:
        return self.g.nbytes

    def row_count_arg(self, launch: Any) -> tuple[str, int] | None:
        """``nrows`` of rms_scale (rows), ``n`` of scale_residual (rows x width values)."""
        if launch.kernel is self.norm_k.kernel:
            return "nrows", 1
        if launch.kernel is self.residual_k.kernel:
            return "n", self.width
        return None

    def row_grid(self, launch: Any) -> tuple[int, int] | None:
        """rms_scale's grid is one block per row on axis 0; scale_residual's follows the values."""
        return (0, 1) if launch.kernel is self.norm_k.kernel else None

    def _array(self, a: Any, what: str) -> rg.DeviceArray:
        v = rg.as_device_array(a, what)
        if v.dtype != np.float32:
            raise rg.DTypeError(f"{what} has dtype {v.dtype}, the model runs float32")
        if tuple(v.shape) != (self.batch, self.width):
            raise rg.ShapeError(f"{what} has shape {tuple(v.shape)}, expected {(self.batch, self.width)}")
        return v

    def plan(self, x: Any, out: Any, scratch: dict[str, Any] | None = None) -> rg.LaunchPlan:
        """Two launches over the buffers ``x``, ``g``, ``t`` (scratch) and ``out``."""
        self._check_open()
        xa, oa = self._array(x, "x"), self._array(out, "out")
        if scratch is None:
            if self.workspace is None:
                raise ValueError("this model has no workspace (workspace=False): pass scratch to plan()")
            t = self.workspace.views(self.batch)["t"]
        else:
            if set(scratch) != {"t"}:
                raise KeyError(f"scratch must name exactly ('t',), got {sorted(scratch)}")
            t = self._array(scratch["t"], "t")
        n = self.batch * self.width
        launches = [
            self.norm_k.launch(self.batch, THREADS_ROW, (xa, self.g, t, self.width, self.batch, self.eps)),
            self.residual_k.launch(-(-n // THREADS_EW), THREADS_EW, (t, xa, self.s, oa, n)),
        ]
        buffers = {"x": xa, "g": self.g.view(), "t": t, "out": oa}
        return rg.LaunchPlan(launches, buffers, ("x",), ("out",), [self._finalizer, self._weights_alive])

    def reference(self, x: np.ndarray) -> np.ndarray:
        x64 = np.asarray(x, dtype=np.float64)
        t = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.eps) * self.g_host.astype(np.float64)
        return t * self.s + x64

    def close(self) -> None:
        """Free what this model made (a shared workspace stays with its owner); plans built from it
        (and, for the model that made the weights, from every ``with_batch`` of it) then refuse."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"<RMSNormScale width={self.width} batch={self.batch}>"


def main() -> int:
    if not rg.gpu_available():
        print(f"buckets_own_model.py needs a GPU: {rg.driver_status()[1]}", file=sys.stderr)
        return 2
    width, rng = 256, np.random.default_rng()
    model = RMSNormScale(width, 1, seed=int(rng.integers(1 << 30)))
    worst = 0.0
    with rg.Stream() as s:
        for buckets in (rg.BucketGraphs, rg.RowCountBuckets):  # the latter bounds kernels to n rows
            with buckets(model, sizes=[1, 2, 4, 8, 16], stream=s) as bg:
                for n in (1, 3, 8, 13):
                    xh = rng.standard_normal((n, width), dtype=np.float32)
                    x = rg.DeviceBuffer.from_numpy(xh, stream=s)
                    assert bg.run(x, n).shape == (n, width)      # the n rows, a view of bg.output
                    got = bg.output.to_numpy(s)[:n]
                    worst = max(worst, float(np.abs(got - model.reference(xh)).max()))
                    x.close()
        rows = [rng.standard_normal(width, dtype=np.float32) for _ in range(5)]
        with rg.SlotPool(model, max_slots=8, sizes=[4, 8], stream=s) as pool:
            slots = [pool.join(r) for r in rows]
            for _ in range(3):
                pool.step()
            for slot, r in zip(slots, rows):
                want = r.astype(np.float64)[None]
                for _ in range(3):
                    want = model.reference(want)
                worst = max(worst, float(np.abs(pool.leave(slot) - want[0]).max()))
            gather = pool.gather
    model.close()
    assert worst < 1e-4, f"max |error| {worst:.3g} against the float64 reference"
    print(f"RMSNormScale: plain and row-count buckets and a slot pool (gather={gather}) match float64 to {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
