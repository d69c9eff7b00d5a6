"""Launch builders for the kernels in ``kernels/``: launch shape, checked operands, named arguments.

Each builder validates its operands once, at plan time, and returns a :class:`~rawgraph.launch.Launch`
whose arguments are already packed. Nothing here runs per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .device import Device
from .errors import ShapeError
from .kernels import get_kernel
from .launch import ArgUse, KernelArgs, Launch
from .memory import DeviceArray, check_array

THREADS = 256  # matmul.cu's RG_THREADS
EPILOGUES = {"none": 0, "relu": 1, "add": 2}
_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class MatmulShape:
    """How one ``matmul_kernel`` launch is cut: see ``kernels/matmul.cu``.

    vec: floats per W load (4 = 16-byte loads); tc: output columns per block; bt: batch rows per
    block; grid: (batch tiles, column tiles).
    """

    vec: int
    tc: int
    bt: int
    grid: tuple[int, int]


def matmul_shape(batch: int, k: int, n: int, multiprocessors: int, w_aligned16: bool = True) -> MatmulShape:
    """Choose the tile for a (batch, K, N) product on a GPU with ``multiprocessors`` SMs.

    16-byte loads when every W row starts 16-byte aligned (N % 4 == 0 and an aligned base). Batch
    tile up to 8 rows. Column tile: the widest that still gives at least one block per SM (wide
    tiles mean longer coalesced rows), else the narrowest, so small N still spreads over SMs.
    """
    if min(batch, k, n) < 1:
        raise ShapeError(f"matmul needs batch, K, N >= 1, got {(batch, k, n)}")
    vec = 4 if (n % 4 == 0 and w_aligned16) else 1
    bt = 1
    while bt < min(batch, 8):
        bt *= 2
    batch_tiles = -(-batch // bt)
    widths = [tc for tc in (128, 64, 32, 16, 8) if tc // vec <= 32 and bt * tc <= 512]
    tc = widths[-1]
    for cand in widths:
        if batch_tiles * -(-n // cand) >= multiprocessors:
            tc = cand
            break
    return MatmulShape(vec, tc, bt, (batch_tiles, -(-n // tc)))


def matmul_expr(epilogue: str, shape: MatmulShape) -> str:
    return f"matmul_kernel<{EPILOGUES[epilogue]}, {shape.vec}, {shape.tc}, {shape.bt}>"


def matmul(
    device: Device,
    buffers: dict[str, DeviceArray],
    x: str,
    w: str,
    y: str,
    epilogue: str = "none",
    r: str | None = None,
    label: str = "",
) -> Launch:
    """``y = epilogue(x @ w)`` (``epilogue`` none, relu, or add with residual ``r``); names index ``buffers``."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {sorted(EPILOGUES)}, got {epilogue!r}")
    if (epilogue == "add") != (r is not None):
        raise ValueError("a residual r is given exactly when epilogue == 'add'")
    xa, wa, ya = buffers[x], buffers[w], buffers[y]
    if len(xa.shape) != 2 or len(wa.shape) != 2:
        raise ShapeError(f"matmul needs 2-D x and W, got {xa.shape} and {wa.shape}")
    batch, k = xa.shape
    n = wa.shape[1]
    check_array(xa, (batch, k), _F32, x)
    check_array(wa, (k, n), _F32, w)
    check_array(ya, (batch, n), _F32, y)
    if r is not None:
        check_array(buffers[r], (batch, n), _F32, r)
    shape = matmul_shape(batch, k, n, device.info.multiprocessors, wa.ptr % 16 == 0)
    kernel = get_kernel("matmul", matmul_expr(epilogue, shape), device)
    args = KernelArgs([("x", "ptr"), ("W", "ptr"), ("y", "ptr"), ("r", "ptr"), ("B", "i32"), ("K", "i32"), ("N", "i32")])
    args.update({"x": xa.ptr, "W": wa.ptr, "y": ya.ptr, "r": buffers[r].ptr if r else 0, "B": batch, "K": k, "N": n})
    uses = {"x": ArgUse(x, "read"), "W": ArgUse(w, "read"), "y": ArgUse(y, "write")}
    if r:
        uses["r"] = ArgUse(r, "read")
    name = {"none": "matmul", "relu": "matmul_relu", "add": "matmul_add"}[epilogue]
    return Launch(kernel, (shape.grid[0], shape.grid[1], 1), (THREADS, 1, 1), args, uses, 0, label or name)


BLOCK_MAX_WIDTH = 256  # kernels/block.cu's RG_BLOCK_MAXW


def block_fits(width: int) -> bool:
    """Whether the single-kernel block (``kernels/block.cu``) handles this width."""
    return 1 <= width <= BLOCK_MAX_WIDTH and width % 4 == 0


def block(device: Device, buffers: dict[str, DeviceArray], x: str, w1: str, w2: str, y: str, label: str = "") -> Launch:
    """``y = relu(x @ w1) @ w2 + x`` in one kernel (width <= 256, width % 4 == 0)."""
    xa, w1a, w2a, ya = buffers[x], buffers[w1], buffers[w2], buffers[y]
    if len(xa.shape) != 2:
        raise ShapeError(f"block needs a 2-D x, got {xa.shape}")
    batch, width = xa.shape
    if not block_fits(width):
        raise ShapeError(f"the single-kernel block needs width <= {BLOCK_MAX_WIDTH} and a multiple of 4, got {width}")
    check_array(xa, (batch, width), _F32, x)
    check_array(w1a, (width, width), _F32, w1, align=16)
    check_array(w2a, (width, width), _F32, w2, align=16)
    check_array(ya, (batch, width), _F32, y)
    bt = 1
    while bt < min(batch, 4):
        bt *= 2
    kernel = get_kernel("block", f"block_kernel<{bt}>", device)
    args = KernelArgs([("x", "ptr"), ("W1", "ptr"), ("W2", "ptr"), ("y", "ptr"), ("B", "i32"), ("W", "i32")])
    args.update({"x": xa.ptr, "W1": w1a.ptr, "W2": w2a.ptr, "y": ya.ptr, "B": batch, "W": width})
    uses = {"x": ArgUse(x, "read"), "W1": ArgUse(w1, "read"), "W2": ArgUse(w2, "read"), "y": ArgUse(y, "write")}
    return Launch(kernel, (-(-batch // bt), 1, 1), (THREADS, 1, 1), args, uses, 0, label or "block")


def _elementwise_grid(n: int, device: Device) -> tuple[int, int, int]:
    return (max(1, min(-(-n // THREADS), device.info.multiprocessors * 8)), 1, 1)


def relu(device: Device, buffers: dict[str, DeviceArray], x: str, y: str, label: str = "") -> Launch:
    """``y = relu(x)`` (NaN propagates)."""
    xa, ya = buffers[x], buffers[y]
    check_array(xa, xa.shape, _F32, x)
    check_array(ya, xa.shape, _F32, y)
    args = KernelArgs([("x", "ptr"), ("y", "ptr"), ("n", "i64")])
    args.update({"x": xa.ptr, "y": ya.ptr, "n": xa.size})
    uses = {"x": ArgUse(x, "read"), "y": ArgUse(y, "write")}
    return Launch(get_kernel("elementwise", "relu", device), _elementwise_grid(xa.size, device), (THREADS, 1, 1), args, uses, 0, label or "relu")


def add(device: Device, buffers: dict[str, DeviceArray], a: str, b: str, y: str, label: str = "") -> Launch:
    """``y = a + b``."""
    aa, ba, ya = buffers[a], buffers[b], buffers[y]
    check_array(aa, aa.shape, _F32, a)
    check_array(ba, aa.shape, _F32, b)
    check_array(ya, aa.shape, _F32, y)
    args = KernelArgs([("a", "ptr"), ("b", "ptr"), ("y", "ptr"), ("n", "i64")])
    args.update({"a": aa.ptr, "b": ba.ptr, "y": ya.ptr, "n": aa.size})
    uses = {"a": ArgUse(a, "read"), "b": ArgUse(b, "read"), "y": ArgUse(y, "write")}
    return Launch(get_kernel("elementwise", "add", device), _elementwise_grid(aa.size, device), (THREADS, 1, 1), args, uses, 0, label or "add")


def empty(device: Device) -> Launch:
    """One empty kernel, 1 block of 1 thread: the launch-cost floor."""
    return Launch(get_kernel("elementwise", "empty", device), (1, 1, 1), (1, 1, 1), KernelArgs([]), {}, 0, "empty")


def fill_uniform(device: Device, buf: DeviceArray, seed: int, scale: float) -> Launch:
    """Deterministic uniform values in ``[-scale, scale)`` from ``seed`` (``kernels/init.cu``)."""
    args = KernelArgs([("y", "ptr"), ("n", "i64"), ("seed", "u64"), ("scale", "f32")])
    args.update({"y": buf.ptr, "n": buf.size, "seed": seed & (2**64 - 1), "scale": scale})
    return Launch(get_kernel("init", "fill_uniform", device), _elementwise_grid(buf.size, device), (THREADS, 1, 1), args, {}, 0, "fill_uniform")
