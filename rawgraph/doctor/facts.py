"""Driver facts about one address, and the allocators' views of it.

Everything the doctor decides about a pointer comes from here: the driver's pointer attributes
(``cuPointerGetAttributes``: memory type, buffer id, managed, mapped, range, device ordinal, the
stream-ordered pool that owns it), the allocation bounds (``cuMemGetAddressRange``), the pinned
host flags (``cuMemHostGetFlags``) and, when PyTorch is already imported, its caching allocator's
view (``torch.cuda.memory_snapshot()``: segments and blocks with their states). Nothing is
inferred from names.

:class:`PointerFacts` is plain data, so the classification in :mod:`rawgraph.doctor.check` runs
on facts made up by a test as well as on facts read from a GPU.
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from cuda.bindings import driver

from ..runtime.errors import cuda_error
from ._scan import allocation_of

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_A = driver.CUpointer_attribute
_MT = driver.CUmemorytype
# The attributes asked for in one cuPointerGetAttributes call, in this order.
ATTRIBUTES: tuple[Any, ...] = (
    _A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    _A.CU_POINTER_ATTRIBUTE_BUFFER_ID,
    _A.CU_POINTER_ATTRIBUTE_IS_MANAGED,
    _A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    _A.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    _A.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    _A.CU_POINTER_ATTRIBUTE_MAPPED,
    _A.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
)
_FIELDS = ("memory_type", "buffer_id", "is_managed", "device_ordinal", "range_start", "range_size", "mapped", "mempool")
_MEMTYPES = {
    int(_MT.CU_MEMORYTYPE_HOST): "host",
    int(_MT.CU_MEMORYTYPE_DEVICE): "device",
    int(_MT.CU_MEMORYTYPE_ARRAY): "array",
    int(_MT.CU_MEMORYTYPE_UNIFIED): "unified",
}
# Lowest and one past the highest value a word can hold to be taken for an address of a foreign
# kernel: below 4 GiB are sizes, counts and pairs of small ints; at or above 2^47 are doubles,
# random seeds and non-canonical x86-64 / AArch64 user addresses.
PLAUSIBLE_LO = 1 << 32
PLAUSIBLE_HI = 1 << 47


@dataclass
class PointerFacts:
    """What the driver says about one address.

    Attributes
    ----------
    address : int
    memory_type : str
        ``"device"``, ``"host"`` (pinned or registered), ``"unified"``, ``"array"``, or ``""``: no
        live allocation the driver knows (``cuPointerGetAttributes`` gave its null defaults).
    buffer_id : int
        ``CU_POINTER_ATTRIBUTE_BUFFER_ID``: unique in the process per allocation, so an address
        freed and allocated again has another id.
    is_managed, mapped : bool
    device_ordinal : int
    range_start, range_size : int
        The allocation holding the address (``cuMemGetAddressRange`` for device memory, else
        ``RANGE_START_ADDR`` / ``RANGE_SIZE``); 0 when unknown.
    mempool : int
        ``CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE``: the stream-ordered pool (``cuMemAllocAsync``,
        ``cudaMallocAsync``) that owns the memory, 0 for none.
    host_flags : int or None
        ``cuMemHostGetFlags`` for host memory allocated by ``cuMemHostAlloc`` / ``cuMemAllocHost``;
        None otherwise (registered memory, pageable memory, device memory).
    error : str
        Why some attribute could not be read ("" when all were).

    See Also
    --------
    cuPointerGetAttributes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html
    cuMemGetAddressRange, cuMemHostGetFlags : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuMemHostAlloc, cuMemAllocHost : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuMemAllocAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MALLOC_ASYNC.html
    """

    address: int
    memory_type: str = ""
    buffer_id: int = 0
    is_managed: bool = False
    device_ordinal: int = -1
    range_start: int = 0
    range_size: int = 0
    mapped: bool = False
    mempool: int = 0
    host_flags: int | None = None
    error: str = ""

    @property
    def live(self) -> bool:
        """The driver knows an allocation (or a pinned / registered host range) here."""
        return bool(self.memory_type)

    @property
    def host_kind(self) -> str:
        """``"pinned"`` (``cuMemHostAlloc``), ``"registered"`` (``cuMemHostRegister``) or
        ``"pageable"`` (unknown to the driver: pageable, or pinned memory already freed).

        See Also
        --------
        cuMemHostAlloc, cuMemHostRegister : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        if self.memory_type == "host":
            return "pinned" if self.host_flags is not None else "registered"
        return "pageable" if not self.memory_type else self.memory_type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_int(value: Any) -> int:
    """An attribute value as an integer (the binding hands back ints, bools, enums or handle objects)."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return _as_int(value[0]) if value else 0
    try:
        return int(value)
    except (TypeError, ValueError):
        getter = getattr(value, "getPtr", None)
        return int(getter()) if callable(getter) else 0


def _attributes(address: int) -> tuple[dict[str, int], str]:
    """The :data:`ATTRIBUTES` of ``address`` in one ``cuPointerGetAttributes`` call; one
    ``cuPointerGetAttribute`` per attribute where the binding refuses the combined call."""
    ptr = driver.CUdeviceptr(int(address))
    try:
        err, values = driver.cuPointerGetAttributes(len(ATTRIBUTES), list(ATTRIBUTES), ptr)
    except (RuntimeError, TypeError, ValueError) as exc:  # a binding that cannot marshal one attribute
        err, values = f"{type(exc).__name__}: {exc}", None
    if err == _SUCCESS and values is not None and len(values) == len(ATTRIBUTES):
        return {f: _as_int(v) for f, v in zip(_FIELDS, values)}, ""
    if err == driver.CUresult.CUDA_ERROR_DEINITIALIZED or err == driver.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        raise cuda_error(err, "cuPointerGetAttributes")
    # Per attribute: an address the driver does not know answers CUDA_ERROR_INVALID_VALUE here,
    # which is the same "no allocation" as the combined call's null defaults.
    out: dict[str, int] = {}
    notes = (
        []
        if err == driver.CUresult.CUDA_ERROR_INVALID_VALUE
        else [f"cuPointerGetAttributes: {getattr(err, 'name', err)}"]
    )
    for f, attr in zip(_FIELDS, ATTRIBUTES):
        try:
            e, v = driver.cuPointerGetAttribute(attr, ptr)
        except (RuntimeError, TypeError, ValueError) as exc:
            notes.append(f"{f}: {exc}")
            continue
        out[f] = _as_int(v) if e == _SUCCESS else 0
    return out, "; ".join(notes)


def pointer_facts(address: int) -> PointerFacts:
    """Everything the driver says about ``address`` (see :class:`PointerFacts`).

    Calls ``cuPointerGetAttributes`` (memory type, buffer id, managed, ordinal, range, mapped,
    pool), ``cuMemGetAddressRange`` for device memory and ``cuMemHostGetFlags`` for host memory.
    Needs the graph's context current.

    See Also
    --------
    cuPointerGetAttributes : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html
    cuMemGetAddressRange, cuMemHostGetFlags : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """
    values, error = _attributes(address)
    facts = PointerFacts(int(address), error=error)
    facts.memory_type = _MEMTYPES.get(values.get("memory_type", 0), "")
    facts.buffer_id = values.get("buffer_id", 0)
    facts.is_managed = bool(values.get("is_managed", 0))
    facts.device_ordinal = values.get("device_ordinal", -1) if facts.memory_type else -1
    facts.range_start = values.get("range_start", 0)
    facts.range_size = values.get("range_size", 0)
    facts.mapped = bool(values.get("mapped", 0))
    facts.mempool = values.get("mempool", 0)
    if facts.memory_type in ("device", "unified"):
        alloc = allocation_of(address)
        if alloc is not None:
            facts.range_start, facts.range_size = alloc
    elif facts.memory_type == "host":
        try:
            err, flags = driver.cuMemHostGetFlags(int(address))
        except (RuntimeError, TypeError) as exc:
            err, flags = None, 0
            facts.error = (facts.error + "; " if facts.error else "") + f"cuMemHostGetFlags: {exc}"
        facts.host_flags = int(flags) if err == _SUCCESS else None
    return facts


# --------------------------------------------------------------------------- PyTorch's allocator
@dataclass(frozen=True)
class TorchBlock:
    """One block of a segment of PyTorch's caching allocator (``torch.cuda.memory_snapshot()``).

    ``state`` is ``"active_allocated"`` (a live tensor holds it), ``"active_pending_free"`` (freed,
    waiting for streams that used it) or ``"inactive"`` (free, handed to the next allocation that
    fits). ``private`` is True for segments of a graph's private pool (``segment_pool_id`` not
    ``(0, 0)``): their free blocks are reserved for the graphs sharing the pool, so intermediates
    a graph freed during capture are expected there.
    """

    address: int
    size: int
    state: str
    segment: int
    segment_size: int
    private: bool
    pool: tuple[int, ...] = ()  # PyTorch's segment_pool_id


@dataclass
class TorchView:
    """PyTorch's caching-allocator view: every block of every segment, by address."""

    blocks: list[TorchBlock] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)

    @classmethod
    def from_snapshot(cls, segments: list[dict[str, Any]]) -> TorchView:
        """From the list ``torch.cuda.memory_snapshot()`` returns (or a made-up one in tests)."""
        blocks: list[TorchBlock] = []
        for seg in segments:
            base, total = int(seg.get("address", 0)), int(seg.get("total_size", 0))
            pool = tuple(seg.get("segment_pool_id", (0, 0)) or (0, 0))
            private = any(int(p) for p in pool)
            at = base
            for b in seg.get("blocks", ()):
                size = int(b.get("size", 0))
                start = int(b["address"]) if b.get("address") is not None else at
                blocks.append(TorchBlock(start, size, str(b.get("state", "")), base, total, private, pool))
                at = start + size
        blocks.sort(key=lambda b: b.address)
        return cls(blocks, [b.address for b in blocks])

    @classmethod
    def current(cls) -> TorchView | None:
        """The view now, when PyTorch is already imported and has CUDA (never imports it)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            if not torch.cuda.is_initialized():
                return None
            return cls.from_snapshot(torch.cuda.memory_snapshot())
        except Exception:  # a torch without the snapshot API, or one whose CUDA failed: no view
            return None

    def block_of(self, address: int) -> TorchBlock | None:
        """The block holding ``address``, or None outside every segment."""
        i = bisect.bisect_right(self._starts, int(address)) - 1
        if i < 0:
            return None
        b = self.blocks[i]
        return b if b.address <= address < b.address + b.size else None


__all__ = ["ATTRIBUTES", "PLAUSIBLE_HI", "PLAUSIBLE_LO", "PointerFacts", "TorchBlock", "TorchView", "pointer_facts"]
