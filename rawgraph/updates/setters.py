"""The checks of a scalar or grid edit of one kernel node
(:meth:`~rawgraph.updates.manager.ExecUpdateManager.set_params` and its scalar setters): what a
launch would refuse is refused here too, before the shadow changes."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..runtime.errors import ArgumentError, ShapeError
from ..runtime.launch import ARG_DTYPES, MAX_GRID, KernelArgs, check_scalar, launch_dims

__all__ = ["ScalarUndo", "check_grid", "restore_scalars", "stored_scalar"]


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


class ScalarUndo(NamedTuple):
    """What a scalar or grid edit of one kernel node changed, to put back if its push is refused."""

    args: KernelArgs  # the node's argument buffer, edited in place
    params: Any  # its CUDA_KERNEL_NODE_PARAMS, whose grid was edited in place
    values: dict[str, Any]  # the arguments' values before the edit
    grid: tuple[int, int, int]  # the grid before the edit


def restore_scalars(log: ScalarUndo) -> None:
    """Undo of a refused scalar or grid push: the node's old argument values and grid."""
    log.args.update(log.values)
    log.params.gridDimX, log.params.gridDimY, log.params.gridDimZ = log.grid
