"""Your own kernel: compile it, launch it, capture it, rebind its input with no copy, replay."""

import numpy as np

import rawgraph as rg

SRC = r"""extern "C" __global__ void axpb(float a, const float* x, float b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}"""
n = 1 << 20
axpb = rg.RawKernel(SRC, "axpb")  # NVRTC, cached; types from the declaration
with rg.Stream() as s:
    x0, x1 = (rg.DeviceBuffer.from_numpy(np.random.rand(n).astype(np.float32), stream=s) for _ in range(2))
    y = rg.DeviceBuffer((n,))
    grid, block = (n + 255) // 256, 256
    axpb(grid, block, (2.0, x0, 1.0, y, n), stream=s)  # an eager launch
    with rg.Capture(s) as cap:  # the same call, recorded with its arrays
        axpb(grid, block, (2.0, x0, 1.0, y, n), stream=s)
    upd = rg.ExecUpdateManager(cap.graph, cap.graph.instantiate())
    upd.rebind(x0, x1)  # the replay now reads x1: no copy
    upd.launch(s)
    assert np.allclose(y.to_numpy(s), 2 * x1.to_numpy(s) + 1)
    print("replayed on x1 with no copy,", upd.update_calls, "node update")
