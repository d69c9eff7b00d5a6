"""Elementwise launches (``kernels/elementwise.cu``, ``kernels/init.cu``): relu, add, the empty and
spin kernels, a bit-mismatch counter, deterministic uniform fill."""

from __future__ import annotations

import numpy as np

from ..runtime.device import Device
from ..runtime.launch import ArgUse, KernelArgs, Launch
from ..runtime.memory import DeviceArray, check_array
from ..runtime.module import get_kernel

THREADS = 256  # the elementwise kernels' block size
_F32 = np.dtype(np.float32)


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
    return Launch(
        get_kernel("elementwise", "relu", device),
        _elementwise_grid(xa.size, device),
        (THREADS, 1, 1),
        args,
        uses,
        0,
        label or "relu",
    )


def add(device: Device, buffers: dict[str, DeviceArray], a: str, b: str, y: str, label: str = "") -> Launch:
    """``y = a + b``."""
    aa, ba, ya = buffers[a], buffers[b], buffers[y]
    check_array(aa, aa.shape, _F32, a)
    check_array(ba, aa.shape, _F32, b)
    check_array(ya, aa.shape, _F32, y)
    args = KernelArgs([("a", "ptr"), ("b", "ptr"), ("y", "ptr"), ("n", "i64")])
    args.update({"a": aa.ptr, "b": ba.ptr, "y": ya.ptr, "n": aa.size})
    uses = {"a": ArgUse(a, "read"), "b": ArgUse(b, "read"), "y": ArgUse(y, "write")}
    return Launch(
        get_kernel("elementwise", "add", device),
        _elementwise_grid(aa.size, device),
        (THREADS, 1, 1),
        args,
        uses,
        0,
        label or "add",
    )


def empty(device: Device) -> Launch:
    """One empty kernel, 1 block of 1 thread: the launch-cost floor."""
    return Launch(get_kernel("elementwise", "empty", device), (1, 1, 1), (1, 1, 1), KernelArgs([]), {}, 0, "empty")


def spin(device: Device, ns: int) -> Launch:
    """One CTA of one thread that busy-waits ``ns`` nanoseconds on the device's clock."""
    if ns < 0:
        raise ValueError(f"spin time must be >= 0 ns, got {ns}")
    args = KernelArgs([("ns", "u64")])
    args["ns"] = int(ns)
    return Launch(get_kernel("elementwise", "spin", device), (1, 1, 1), (1, 1, 1), args, {}, 0, "spin")


def count_mismatch(
    device: Device, buffers: dict[str, DeviceArray], a: str, b: str, count: str, label: str = ""
) -> Launch:
    """``*count += number of 32-bit elements whose bits differ between a and b``."""
    aa, ba, ca = buffers[a], buffers[b], buffers[count]
    if aa.dtype.itemsize != 4 or ba.dtype != aa.dtype:
        raise ValueError("count_mismatch compares 32-bit elements of one dtype")
    check_array(ba, aa.shape, aa.dtype, b)
    check_array(ca, (1,), np.uint64, count, align=8)
    args = KernelArgs([("a", "ptr"), ("b", "ptr"), ("n", "i64"), ("count", "ptr")])
    args.update({"a": aa.ptr, "b": ba.ptr, "n": aa.size, "count": ca.ptr})
    uses = {"a": ArgUse(a, "read"), "b": ArgUse(b, "read"), "count": ArgUse(count, "write")}
    return Launch(
        get_kernel("elementwise", "count_mismatch", device),
        _elementwise_grid(aa.size, device),
        (THREADS, 1, 1),
        args,
        uses,
        0,
        label or "count_mismatch",
    )


def fill_uniform(device: Device, buf: DeviceArray, seed: int, scale: float) -> Launch:
    """Deterministic uniform values in ``[-scale, scale)`` from ``seed`` (``kernels/init.cu``)."""
    args = KernelArgs([("y", "ptr"), ("n", "i64"), ("seed", "u64"), ("scale", "f32")])
    args.update({"y": buf.ptr, "n": buf.size, "seed": seed & (2**64 - 1), "scale": scale})
    return Launch(
        get_kernel("init", "fill_uniform", device),
        _elementwise_grid(buf.size, device),
        (THREADS, 1, 1),
        args,
        {},
        0,
        "fill_uniform",
    )
