"""Megatron-style split of the TinyBlock over ``world`` ranks: the arithmetic, no GPU.

The block is ``y = relu(x @ W1) @ W2 + x`` with ``W1`` of ``(K, H)`` and ``W2`` of ``(H, N)``
(``K == N == width`` for the residual). Rank ``r`` holds the columns ``cols_r`` of ``W1`` and the
same rows ``rows_r`` of ``W2`` and computes ``z_r = relu(x @ W1[:, cols_r]) @ W2[rows_r, :]``.
Because relu acts element-wise on the hidden columns, the hidden units split cleanly, and
``sum_r z_r = relu(x @ W1) @ W2``: one all-reduce (sum) of the ``z_r`` and then ``+ x`` gives the
one-GPU block. Only the order of the float additions differs, so the float32 results agree to
rounding (checked in float64 by :func:`check_split`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import ShapeError

SPLIT_POLICIES = ("even", "uneven")


@dataclass(frozen=True)
class Shard:
    """The hidden units one rank holds: ``W1[:, start:stop]`` and ``W2[start:stop, :]``."""

    rank: int
    world: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def cols(self) -> slice:
        return slice(self.start, self.stop)


def _count(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ShapeError(f"{name} must be >= {low}, got {value}")
    return int(value)


def shards(hidden: int, world: int, policy: str = "even", multiple: int = 1) -> list[Shard]:
    """The split of ``hidden`` units over ``world`` ranks.

    Parameters
    ----------
    hidden : int
        ``H``, the columns of ``W1`` (rows of ``W2``).
    world : int
        Ranks.
    policy : {"even", "uneven"}
        ``"even"`` refuses an ``H`` that ``world * multiple`` does not divide (every rank the same
        shapes: the same kernels, the same graph, the same cost); ``"uneven"`` gives the first
        ``H mod world`` ranks one more unit each (in steps of ``multiple``).
    multiple : int, default 1
        Each shard a multiple of this many units (4: the matmul kernels' 16-byte loads of a row).

    Raises
    ------
    ShapeError
        ``H`` cannot be split so (fewer units than ranks, or not divisible under ``"even"``).
    """
    hidden, world, multiple = _count("hidden", hidden), _count("world", world), _count("multiple", multiple)
    if policy not in SPLIT_POLICIES:
        raise ValueError(f"policy must be one of {SPLIT_POLICIES}, got {policy!r}")
    if hidden % multiple:
        raise ShapeError(f"hidden {hidden} is not a multiple of {multiple}")
    units = hidden // multiple
    if units < world:
        raise ShapeError(
            f"hidden {hidden} has {units} unit(s) of {multiple}: fewer than {world} ranks, so a rank would hold nothing"
        )
    if policy == "even" and units % world:
        raise ShapeError(
            f"hidden {hidden} does not split evenly over {world} ranks (in units of {multiple}); "
            f"pass policy='uneven' to give the first ranks one unit more"
        )
    base, extra = divmod(units, world)
    out, start = [], 0
    for r in range(world):
        n = (base + (1 if r < extra else 0)) * multiple
        out.append(Shard(r, world, start, start + n))
        start += n
    return out


def shard_weights(w1: np.ndarray, w2: np.ndarray, shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``shard.rank``'s ``(W1[:, cols], W2[rows, :])`` as contiguous copies (a column block
    of ``W1`` is strided in row-major memory; the kernels want dense operands)."""
    if w1.ndim != 2 or w2.ndim != 2 or w1.shape[1] != w2.shape[0]:
        raise ShapeError(f"W1 {w1.shape} and W2 {w2.shape} do not chain (W1 is K x H, W2 is H x N)")
    if shard.stop > w1.shape[1]:
        raise ShapeError(f"shard [{shard.start}, {shard.stop}) runs past H = {w1.shape[1]}")
    return np.ascontiguousarray(w1[:, shard.cols]), np.ascontiguousarray(w2[shard.cols, :])


def partial(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, shard: Shard) -> np.ndarray:
    """``z_r = relu(x @ W1[:, cols_r]) @ W2[rows_r, :]`` in float64 (what rank r computes)."""
    a, b = shard_weights(np.asarray(w1, np.float64), np.asarray(w2, np.float64), shard)
    return np.maximum(np.asarray(x, np.float64) @ a, 0.0) @ b


def split_forward(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, world: int, policy: str = "even") -> np.ndarray:
    """The tensor-parallel block in float64: ``sum_r z_r + x`` (the all-reduce is the sum)."""
    parts = [partial(x, w1, w2, s) for s in shards(w1.shape[1], world, policy)]
    return np.sum(parts, axis=0) + np.asarray(x, np.float64)


def block_forward(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """The one-GPU block in float64: ``relu(x @ W1) @ W2 + x``."""
    x64 = np.asarray(x, np.float64)
    return np.maximum(x64 @ np.asarray(w1, np.float64), 0.0) @ np.asarray(w2, np.float64) + x64


def check_split(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, world: int, policy: str = "even") -> float:
    """Relative error (Frobenius) between :func:`split_forward` and :func:`block_forward`; float64
    rounding only (around 1e-16), since the split changes nothing but the order of additions."""
    ref = block_forward(x, w1, w2)
    got = split_forward(x, w1, w2, world, policy)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), np.finfo(np.float64).tiny))
