"""Testing your own graph code with rawgraph's pytest plugin (see docs/testing.md).

    python -m pytest -p rawgraph.testing docs/testing/test_my_graph.py

Without a GPU the first test runs on the CPU fake driver and the second is skipped, with the
reason the driver gave; on a GPU both run.
"""

import struct

import numpy as np
import pytest

import rawgraph as rg

SRC = r"""
extern "C" __global__ void axpb(float a, const float* x, float b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}"""
N = 4096


def capture_axpb(stream, x, y):
    """The code under test: a graph of y = 2 x + 1 over x, and the manager that re-binds it."""
    axpb = rg.RawKernel(SRC, "axpb")
    with rg.Capture(stream) as cap:
        axpb((N + 255) // 256, 256, (2.0, x, 1.0, y, N), stream=stream)
    return rg.ExecUpdateManager(cap.graph, cap.graph.instantiate())


def test_rebind_points_the_exec_at_the_new_input(fake_driver, stream):
    """On the CPU: the kernel compiles with NVRTC and loads into the fake driver, which keeps what
    the exec holds for each node; the test reads the argument values back from there."""
    with rg.DeviceBuffer((N,)) as x0, rg.DeviceBuffer((N,)) as x1, rg.DeviceBuffer((N,)) as y:
        upd = capture_axpb(stream, x0, y)
        (node,) = upd.graph.nodes

        def held():  # (a, x, b, y, n) as the exec holds them
            a, x, b, out, n = fake_driver.exec_kernel_args(upd.exec.handle, node.handle)
            return struct.unpack("<f", a)[0], struct.unpack("<Q", x)[0], struct.unpack("<Q", out)[0]

        assert held() == (2.0, x0.ptr, y.ptr)
        assert upd.rebind(x0, x1) == 1  # one node reads x0
        assert held() == (2.0, x1.ptr, y.ptr)
        upd.launch(stream)
        assert fake_driver.launch_log[-1][0] == "graph"  # replayed (kernels do not run on the fake)
        upd.close()
        upd.exec.close()
        upd.graph.close()


@pytest.mark.gpu
def test_replay_after_rebind_reads_the_new_input(stream):
    """On a GPU: the same graph replayed, its output checked."""
    rng = np.random.default_rng(0)
    with (
        rg.DeviceBuffer.from_numpy(rng.random(N, dtype=np.float32), stream=stream) as x0,
        rg.DeviceBuffer.from_numpy(rng.random(N, dtype=np.float32), stream=stream) as x1,
        rg.DeviceBuffer((N,)) as y,
    ):
        upd = capture_axpb(stream, x0, y)
        upd.rebind(x0, x1)
        upd.launch(stream)
        np.testing.assert_allclose(y.to_numpy(stream), 2 * x1.to_numpy(stream) + 1, rtol=1e-6)
        upd.close()
        upd.exec.close()
        upd.graph.close()
