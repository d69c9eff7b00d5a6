"""Address scanning: which words of which nodes hold an address inside a range.

The pure part of rebinding by address (:mod:`rawgraph.updates.rebind`) and of the exec-update
manager's guard against foreign nodes: scanning parameter bytes for values inside a range
(:func:`scan_words`), taking a range from any buffer (:func:`as_range`), the allocation that holds
an address (:func:`allocation_of`, :func:`check_allocation`), the nodes nobody updates that point
into a span (:func:`foreign_holders`), and what a match is (:class:`Match`, :class:`WordHit`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.nodes import ConditionalInfo, KernelInfo, MemcpyInfo, MemsetInfo, ParamInfo, read_graph, walk
from ..runtime.errors import RawgraphError, RawgraphWarning, cuda_error

_SUCCESS = driver.CUresult.CUDA_SUCCESS
WORD = 8


class RebindError(RawgraphError, ValueError):
    """A rebind was refused (nothing matched, too small, allocation boundary, unreachable pointer)."""


class LayoutMismatchError(RebindError):
    """A kernel's parameter layout differs from the one the caller said to expect."""


class UnconfirmedMatchWarning(RawgraphWarning):
    """A matching word sits where the parameter layout cannot confirm it is one pointer."""


class InteriorPointerWarning(RawgraphWarning):
    """A pointer into the middle of a range that is only part of a larger allocation (a pooled
    tensor): it may belong to another tensor that once lived there (allocator reuse)."""


# --------------------------------------------------------------------------- pure scanning
@dataclass(frozen=True)
class WordHit:
    """One 8-byte word of a parameter blob whose value lies in a range.

    ``layout_offset`` is the word's offset in the device-side layout; ``param`` the index of the
    parameter containing its first byte (None in padding or without layout); ``offset`` its byte
    offset in that parameter (in the blob when ``param`` is None).
    """

    layout_offset: int
    value: int
    param: int | None
    offset: int
    confirmed: bool


def scan_words(blob: bytes, layout: Sequence[ParamInfo] | None, lo: int, hi: int) -> list[WordHit]:
    """Every 8-byte-aligned word of ``blob`` (little-endian) with ``lo <= value < hi``.

    No GPU needed: this is the pure part of matching.
    """
    n = len(blob) // WORD
    if n == 0:
        return []
    words = np.frombuffer(bytes(blob[: n * WORD]), dtype="<u8")
    idx = np.nonzero((words >= np.uint64(lo)) & (words < np.uint64(hi)))[0]
    hits = []
    for i in idx.tolist():
        off = i * WORD
        param = next((p for p in layout or () if p.offset <= off < p.offset + p.size), None)
        confirmed = param is not None and param.size >= WORD and off + WORD <= param.offset + param.size
        hits.append(
            WordHit(
                off,
                int(words[i]),
                None if param is None else param.index,
                off - (param.offset if param is not None else 0),
                confirmed,
            )
        )
    return hits


def as_range(obj: Any) -> tuple[int, int]:
    """``(base, nbytes)`` of a buffer: a ``(ptr, nbytes)`` tuple, a rawgraph buffer/array, a torch
    tensor (``data_ptr``), a CuPy array (``data.ptr``) or anything with ``__cuda_array_interface__``
    (contiguous)."""
    if isinstance(obj, tuple) and len(obj) == 2:
        base, size = int(obj[0]), int(obj[1])
    elif hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise RebindError("a non-contiguous tensor is not one address range")
        base, size = int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size())
    elif hasattr(obj, "ptr") and hasattr(obj, "nbytes"):  # DeviceBuffer, DeviceArray
        base, size = int(obj.ptr), int(obj.nbytes)
    elif hasattr(obj, "data") and hasattr(obj.data, "ptr") and hasattr(obj, "nbytes"):  # CuPy
        base, size = int(obj.data.ptr), int(obj.nbytes)
    elif hasattr(obj, "__cuda_array_interface__"):
        cai = obj.__cuda_array_interface__
        if cai.get("strides") is not None:
            raise RebindError("a strided array is not one address range")
        count = 1
        for s in cai["shape"]:
            count *= int(s)
        base, size = int(cai["data"][0]), count * np.dtype(cai["typestr"]).itemsize
    else:
        raise TypeError(f"cannot take an address range from {type(obj).__name__}; pass (ptr, nbytes)")
    if base <= 0 or size <= 0:
        raise RebindError(f"empty or null range (0x{base:x}, {size} bytes)")
    return base, size


def allocation_of(ptr: int) -> tuple[int, int] | None:
    """``(base, size)`` of the allocation holding ``ptr`` (``cuMemGetAddressRange``), or None
    where the driver knows none (host memory, or an address in no allocation: the driver's
    ``CUDA_ERROR_NOT_FOUND`` / ``..._INVALID_VALUE``). Any other failure raises
    :class:`~rawgraph.runtime.errors.CudaError`: taken for "no allocation", it would skip the bounds check.

    See Also
    --------
    cuMemGetAddressRange : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """
    err, base, size = driver.cuMemGetAddressRange(driver.CUdeviceptr(int(ptr)))
    if err in (driver.CUresult.CUDA_ERROR_NOT_FOUND, driver.CUresult.CUDA_ERROR_INVALID_VALUE):
        return None
    if err != _SUCCESS:
        raise cuda_error(err, "cuMemGetAddressRange")
    return int(base), int(size)


def check_allocation(base: int, size: int, what: str) -> tuple[int, int] | None:
    """Refuse a range that runs past the end of the allocation holding its first byte."""
    alloc = allocation_of(base)
    if alloc is None:
        warnings.warn(
            f"{what} 0x{base:x}: the driver knows no allocation there (cuMemGetAddressRange); "
            f"allocation bounds not checked",
            UnconfirmedMatchWarning,
            stacklevel=3,
        )
        return None
    a, n = alloc
    if base + size > a + n:
        raise RebindError(
            f"{what} [0x{base:x}, +{size}) runs {base + size - (a + n)} bytes past the end of its allocation "
            f"[0x{a:x}, +{n}): it overlaps another allocation, whose pointers would move too"
        )
    return alloc


# --------------------------------------------------------------------------- nodes nobody updates
def _span(start: int, width: int, height: int, planes: int, pitch: int, slice_height: int) -> int:
    """Bytes from ``start`` to the end of the last row a pitched copy or memset touches."""
    height, planes = max(height, 1), max(planes, 1)
    if pitch <= 0 or (height == 1 and planes == 1):
        return max(width, 1)
    rows = (planes - 1) * max(slice_height, height) + (height - 1)
    return rows * pitch + max(width, 1)


def foreign_holders(graph: Any, spans: dict[str, tuple[int, int]]) -> tuple[dict[str, list[str]], list[str]]:
    """Which nodes the exec-update manager does not update hold an address in each span (it pins
    those spans), and which of them cannot be read.

    Those nodes are ``graph.foreign_nodes`` (work the capture did not record) and the recorded
    non-kernel nodes ``graph.other_nodes``, child graphs and conditional bodies read through. A
    kernel node holds an address when an 8-byte-aligned word of its parameter bytes
    (``cuGraphKernelNodeGetParams``, all of them: a struct can carry a pointer too) lies in the
    span; a memcpy or memset node when the bytes from its first to its last touched byte (every
    row, at its pitch) overlap it. A kernel whose parameters, or a conditional whose bodies, the driver does not give back is
    listed as unreadable.

    Parameters
    ----------
    graph : Graph (its ``foreign_nodes`` and ``other_nodes``)
    spans : dict of name -> (ptr, nbytes)

    Returns
    -------
    holders : dict of name -> list of str
        Only names some such node points into; each entry describes the node.
    unreadable : list of str

    See Also
    --------
    cuGraphKernelNodeGetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
    kinds = {int(f.handle): "foreign" for f in graph.foreign_nodes}
    kinds.update({int(h): "recorded" for h, _kind, _detail in getattr(graph, "other_nodes", ())})
    if not kinds:
        return {}, []
    holders: dict[str, list[str]] = {}
    unreadable: list[str] = []

    def overlaps(start: int, nbytes: int, lo: int, size: int) -> bool:
        return start < lo + size and lo < start + nbytes

    for top in (info for info in read_graph(graph) if info.id in kinds):
        for info in walk([top]):
            label = f"{info.kind}{' ' + info.name if isinstance(info, KernelInfo) else ''}"
            where = f"{kinds[top.id]} node {info.index} ({label})"
            for name, (lo, size) in spans.items():
                if isinstance(info, KernelInfo):
                    hit = info.params is not None and bool(scan_words(info.params, None, lo, lo + size))
                elif isinstance(info, MemcpyInfo):
                    hit = any(
                        kind in ("device", "unified")
                        and overlaps(addr, _span(addr, info.width, info.height, info.planes, pitch, rows), lo, size)
                        for addr, kind, pitch, rows in (
                            (info.src, info.src_type, info.src_pitch, info.src_height),
                            (info.dst, info.dst_type, info.dst_pitch, info.dst_height),
                        )
                    )
                elif isinstance(info, MemsetInfo):
                    width = info.width * max(info.element_size, 1)
                    hit = overlaps(info.dst, _span(info.dst, width, info.height, 1, info.pitch, 0), lo, size)
                else:
                    hit = False
                if hit:
                    holders.setdefault(name, []).append(where)
            if (isinstance(info, KernelInfo) and info.params is None) or (
                isinstance(info, ConditionalInfo) and info.error
            ):
                unreadable.append(where)
    return holders, unreadable


# --------------------------------------------------------------------------- matches
@dataclass(frozen=True)
class Match:
    """A place in the exec that holds an address inside the range asked about.

    Attributes
    ----------
    node : int
        The node's handle.
    node_index : int
        Position among the graph's top-level nodes (``cuGraphGetNodes`` order).
    kind : str
        ``"kernel"``, ``"memcpy.src"``, ``"memcpy.dst"`` or ``"memset"``.
    name : str
        The kernel's name (``cuFuncGetName``); ``""`` for memory nodes.
    param : int or None
        Parameter index (None where the layout does not say).
    offset : int
        Byte offset within the parameter (within the parameter bytes when ``param`` is None).
    layout_offset : int
        Byte offset in the device-side parameter layout.
    value : int
        The address held now.
    confirmed : bool
    reachable : bool
        False for nodes inside child graphs or conditional bodies: exec updates reach only the
        top-level nodes, so such a match makes a rebind refuse.

    See Also
    --------
    cuGraphGetNodes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuFuncGetName : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    node: int
    node_index: int
    kind: str
    name: str
    param: int | None
    offset: int
    layout_offset: int
    value: int
    confirmed: bool = True
    reachable: bool = True

    def __str__(self) -> str:
        where = f"param {self.param} +{self.offset}" if self.param is not None else f"bytes +{self.layout_offset}"
        flag = "" if self.confirmed else " (unconfirmed)"
        return f"node {self.node_index} {self.kind} {self.name or ''} {where}: 0x{self.value:x}{flag}".replace(
            "  ", " "
        )
