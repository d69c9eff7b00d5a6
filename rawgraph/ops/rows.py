"""Row gathers and scatters through an int32 table (``kernels/elementwise.cu``, ``kernels/rows.cu``):
how a slot pool moves request rows when its matmuls do not route them themselves."""

from __future__ import annotations

import numpy as np

from ..runtime.device import Device
from ..runtime.errors import ShapeError
from ..runtime.launch import ArgUse, KernelArgs, Launch
from ..runtime.memory import DeviceArray, check_array
from ..runtime.module import get_kernel
from .pointwise import THREADS, _elementwise_grid

_F32 = np.dtype(np.float32)


def _rows_launch(
    device: Device, buffers: dict[str, DeviceArray], src: str, idx: str, dst: str, rows: int, gather: bool, label: str
) -> Launch:
    sa, ia, da = buffers[src], buffers[idx], buffers[dst]
    width = (da if gather else sa).shape[-1]
    if ia.dtype != np.int32 or ia.size < rows:
        raise ShapeError(f"{idx} must hold at least {rows} int32 row indices, got {ia.shape} {ia.dtype}")
    check_array(sa, sa.shape, _F32, src)
    check_array(da, da.shape, _F32, dst)
    if (da if gather else sa).shape[0] < rows:
        raise ShapeError(f"{'dst' if gather else 'src'} has fewer than {rows} rows")
    args = KernelArgs([("src", "ptr"), ("idx", "ptr"), ("dst", "ptr"), ("rows", "i32"), ("width", "i32")])
    args.update({"src": sa.ptr, "idx": ia.ptr, "dst": da.ptr, "rows": rows, "width": width})
    uses = {"src": ArgUse(src, "read"), "idx": ArgUse(idx, "read"), "dst": ArgUse(dst, "write")}
    name = "gather_rows" if gather else "scatter_rows"
    return Launch(
        get_kernel("elementwise", name, device),
        _elementwise_grid(rows * width, device),
        (THREADS, 1, 1),
        args,
        uses,
        0,
        label or name,
    )


def gather_rows(
    device: Device, buffers: dict[str, DeviceArray], src: str, idx: str, dst: str, rows: int, label: str = ""
) -> Launch:
    """``dst[i] = src[idx[i]]`` for ``i < rows`` (rows of ``src`` picked by an int32 table)."""
    return _rows_launch(device, buffers, src, idx, dst, rows, True, label)


def scatter_rows(
    device: Device, buffers: dict[str, DeviceArray], src: str, idx: str, dst: str, rows: int, label: str = ""
) -> Launch:
    """``dst[idx[i]] = src[i]`` for ``i < rows`` (rows written back through an int32 table)."""
    return _rows_launch(device, buffers, src, idx, dst, rows, False, label)


ROW_PARAM_CAPS = (16, 64, 256, 1024)  # kernels/rows.cu's instantiated RowTable capacities (4 KB at most)


def row_param_cap(rows: int) -> int:
    """The smallest by-value row-table capacity that holds ``rows`` entries."""
    for cap in ROW_PARAM_CAPS:
        if rows <= cap:
            return cap
    raise ShapeError(
        f"a by-value row table holds at most {ROW_PARAM_CAPS[-1]} rows (4 KB of kernel parameters), got {rows}"
    )


def _rows_param_launch(
    device: Device, buffers: dict[str, DeviceArray], src: str, dst: str, rows: int, gather: bool, label: str
) -> Launch:
    sa, da = buffers[src], buffers[dst]
    check_array(sa, sa.shape, _F32, src)
    check_array(da, da.shape, _F32, dst)
    batch = da if gather else sa
    if len(batch.shape) != 2 or batch.shape[0] < rows or rows < 1:
        raise ShapeError(f"{'dst' if gather else 'src'} must be 2-D with at least {rows} rows, got {batch.shape}")
    width = batch.shape[1]
    cap = row_param_cap(rows)
    name = "gather_rows_param" if gather else "scatter_rows_param"
    args = KernelArgs([("src", "ptr"), ("dst", "ptr"), ("rows", "i32"), ("width", "i32"), ("table", f"i32[{cap}]")])
    args.update({"src": sa.ptr, "dst": da.ptr, "rows": rows, "width": width})
    uses = {"src": ArgUse(src, "read"), "dst": ArgUse(dst, "write")}
    return Launch(
        get_kernel("rows", f"{name}<{cap}>", device),
        _elementwise_grid(rows * width, device),
        (THREADS, 1, 1),
        args,
        uses,
        0,
        label or name,
    )


def gather_rows_param(
    device: Device, buffers: dict[str, DeviceArray], src: str, dst: str, rows: int, label: str = ""
) -> Launch:
    """``dst[i] = src[table[i]]`` for ``i < rows``, the table passed by value: its ``table``
    argument (``args.array("table")``), changed per step with ``cuGraphExecKernelNodeSetParams``.

    See Also
    --------
    cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    return _rows_param_launch(device, buffers, src, dst, rows, True, label)


def scatter_rows_param(
    device: Device, buffers: dict[str, DeviceArray], src: str, dst: str, rows: int, label: str = ""
) -> Launch:
    """``dst[table[i]] = src[i]`` for ``i < rows``, the table passed by value (see
    :func:`gather_rows_param`)."""
    return _rows_param_launch(device, buffers, src, dst, rows, False, label)
