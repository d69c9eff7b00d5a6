"""The checks of a scalar or grid edit of one kernel node
(:meth:`~rawgraph.updates.manager.ExecUpdateManager.set_params` and its scalar setters): what a
launch would refuse is refused here too, before the shadow changes."""

from __future__ import annotations

from typing import Any

from ..runtime.errors import ArgumentError, ShapeError
from ..runtime.launch import ARG_DTYPES, MAX_GRID, KernelArgs, check_scalar, launch_dims

__all__ = ["check_grid", "restore_scalars", "stored_scalar"]


def check_grid(grid: Any, cluster: tuple[int, int, int]) -> tuple[int, int, int]:
    """``grid`` as the three ints a node is given, or :class:`ShapeError`: an int or 1 to 3 positive
    ints (as a launch takes them), within :data:`MAX_GRID`, and whole clusters of a kernel compiled
    with fixed cluster dimensions (``cluster``; 0: none)."""
    try:
        g = launch_dims(grid, "grid", MAX_GRID)  # the rule a launch keeps, as a ShapeError here
    except ArgumentError as exc:
        raise ShapeError(str(exc)) from None
    if any(c and d % c for d, c in zip(g, cluster)):
        raise ShapeError(f"grid {g} is not a multiple of the kernel's cluster dimensions {cluster}")
    return g


def stored_scalar(kind: str, value: Any, what: str) -> Any:
    """``value`` checked as a launch checks it (:func:`~rawgraph.runtime.launch.check_scalar`: an
    :class:`ArgumentError` before anything changes) and converted to the argument's C type: what the
    shadow will hold, so a value equal to the one held is seen as no change."""
    check_scalar(kind, value, what)
    return ARG_DTYPES[kind].type(value)


def restore_scalars(log: tuple[KernelArgs, Any, dict[str, Any], tuple[int, int, int]]) -> None:
    """Undo of a refused scalar or grid push: the node's old argument values and grid."""
    args, params, old_values, old_grid = log
    args.update(old_values)
    params.gridDimX, params.gridDimY, params.gridDimZ = old_grid
