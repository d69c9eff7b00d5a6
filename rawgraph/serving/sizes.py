"""Bucket size lists and the bucket a batch of ``n`` rows goes to (no GPU needed)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..runtime.errors import ShapeError


def vllm_sizes(max_batch: int) -> list[int]:
    """vLLM's default capture sizes up to ``max_batch``: 1, 2, 4, then every 8 up to 248, then
    every 16 (``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)``), cut at ``max_batch``,
    with ``max_batch`` itself added when the list would stop short of it."""
    if max_batch < 1:
        raise ShapeError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_batch + 1, 16))
    sizes = [s for s in sizes if s <= max_batch]
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def powers_of_two(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch`` (added when it is not a power of two itself)."""
    if max_batch < 1:
        raise ShapeError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def check_sizes(sizes: Sequence[int]) -> list[int]:
    """Sorted, distinct, positive ints; refuses anything else."""
    out = []
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ShapeError(f"bucket sizes must be positive ints, got {s!r}")
        out.append(int(s))
    if not out:
        raise ShapeError("at least one bucket size is needed")
    return sorted(set(out))


def pick_bucket(sizes: Sequence[int], n: int) -> int | None:
    """The smallest size >= ``n`` in the sorted list ``sizes`` (``bisect_left``), or None when
    ``n`` is above the largest."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def padding_waste(sizes: Sequence[int], counts: Sequence[int]) -> float:
    """Share of computed rows nobody asked for, over batches of ``counts`` rows (each at most the
    largest size; larger ones run in chunks of the largest bucket)."""
    asked = computed = 0
    top = sizes[-1]
    for n in counts:
        asked += n
        full, rest = divmod(n, top)
        computed += full * top + (pick_bucket(sizes, rest) or 0 if rest else 0)
    return 0.0 if computed == 0 else 1.0 - asked / computed
