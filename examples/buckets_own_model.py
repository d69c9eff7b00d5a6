"""Bucket graphs, a slot pool and one device-shaped exec over an RMSNorm written as a function
of your own kernels: no protocol class to write.

``rms_norm_scale(x, out, scratch, rows, stream)`` launches two :class:`rawgraph.RawKernel` kernels::

    t   = x / sqrt(mean(x^2) + eps) * g      rms_scale: one CTA per row, bounded by ``nrows``
    out = t * s + x                          scale_residual: elementwise, bounded by ``n``

:class:`rawgraph.serving.FunctionModel` makes it a row-wise model: every plan is the function's
own launches, recorded, and the row-count arguments and row grids that ``RowCountBuckets`` and
``DeviceShapedGraph`` rebind are found by recording it at two row counts. The same model as a
protocol class is ``buckets_own_model_class.py``. Importable (``make_model``, ``serve``); run as a
script it serves a few batch sizes through plain and row-count bucket graphs, a device-shaped exec
and a slot pool, and checks every result against the float64 reference.
"""

from __future__ import annotations

import sys

import numpy as np

import rawgraph as rg
from rawgraph.serving import FunctionModel

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


def make_model(
    width: int, seed: int = 0, s: float = 0.5, eps: float = 1e-6, device: rg.Device | None = None
) -> FunctionModel:
    """``out = x / sqrt(mean(x^2) + eps) * g * s + x`` row by row, ``g = 1 + 0.1 N(0, 1)`` from
    ``seed``: a weight the function closes over and the model owns (closed with it)."""
    g_host = (1.0 + 0.1 * np.random.default_rng(seed).standard_normal(width)).astype(np.float32)
    g = rg.DeviceBuffer.from_numpy(g_host, device)
    norm, residual = rg.RawKernel(SRC, "rms_scale", device=device), rg.RawKernel(SRC, "scale_residual", device=device)

    def rms_norm_scale(x, out, scratch, rows, stream):
        t, n = scratch["t"], rows * width
        norm(rows, 128, (x, g, t, width, rows, eps), stream=stream)  # one CTA per row
        residual(-(-n // 256), 256, (t, x, s, out, n), stream=stream)  # one thread per value

    def reference(x):  # float64, row by row
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g_host * s + x

    return FunctionModel(rms_norm_scale, width, scratch={"t": width}, reference=reference, device=device, owns=[g])


def serve(model, rng: np.random.Generator) -> tuple[float, str]:
    """Plain and row-count bucket graphs, a device-shaped exec and a slot pool over any row-wise
    ``model``: the largest |error| against its float64 reference, and the pool's gather."""
    width, worst = model.width, 0.0

    def check(got: np.ndarray, want: np.ndarray) -> None:
        nonlocal worst
        worst = max(worst, float(np.abs(got - want).max()))

    with rg.Stream() as s:
        for buckets in (rg.BucketGraphs, rg.RowCountBuckets):  # the latter bounds kernels to n rows
            with buckets(model, sizes=[1, 2, 4, 8, 16], stream=s) as bg:
                for n in (1, 3, 8, 13):
                    xh = rng.standard_normal((n, width), dtype=np.float32)
                    with rg.DeviceBuffer.from_numpy(xh, stream=s) as x:
                        check(bg.run(x, n).to_numpy(s), model.reference(xh))
        with rg.DeviceShapedGraph(model, max_batch=16, stream=s) as dsg:  # one exec, shaped to n on the device
            for n in (5, 16, 1):
                xh = rng.standard_normal((n, width), dtype=np.float32)
                with rg.DeviceBuffer.from_numpy(xh, stream=s) as x:
                    check(dsg.run(n, s, x=x).to_numpy(s), model.reference(xh))
        rows = [rng.standard_normal(width, dtype=np.float32) for _ in range(5)]
        with rg.SlotPool(model, max_slots=8, sizes=[4, 8], stream=s) as pool:
            slots = [pool.join(r) for r in rows]
            for _ in range(3):
                pool.step()
            for slot, r in zip(slots, rows):
                want = r.astype(np.float64)[None]
                for _ in range(3):
                    want = model.reference(want)
                check(pool.leave(slot), want[0])
            return worst, pool.gather


def main() -> int:
    if not rg.gpu_available():
        print(f"buckets_own_model.py needs a GPU: {rg.driver_status()[1]}", file=sys.stderr)
        return 2
    rng = np.random.default_rng()
    model = make_model(256, seed=int(rng.integers(1 << 30)))
    worst, gather = serve(model, rng)
    model.close()
    assert worst < 1e-4, f"max |error| {worst:.3g} against the float64 reference"
    print(
        f"rms_norm_scale as a FunctionModel: plain and row-count buckets, a device-shaped exec and a slot pool "
        f"(gather={gather}) match float64 to {worst:.1e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
