"""Scalar arguments and launch shape of an exec's nodes: the part of
:class:`~rawgraph.updates.manager.ExecUpdateManager` that edits a node's scalars and grid in its
shadow (:mod:`rawgraph.updates.shadow`) and pushes it, checked as :meth:`ParamSetters.set_params`
says."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..runtime.errors import ShapeError
from ..runtime.launch import ARG_DTYPES, KernelArgs, check_scalar
from .shadow import ExecShadow


def _locked(method: Any) -> Any:
    """Run ``method`` holding the manager's lock: the shadow parameters, the bound pointers and the
    exec change together, so two threads binding at once cannot leave them disagreeing."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def _restore_scalars(log: tuple) -> None:
    args, params, old_values, old_grid = log
    args.update(old_values)
    params.gridDimX, params.gridDimY, params.gridDimZ = old_grid


class ParamSetters:
    """``set_params``, ``scalar_setter`` and ``node_params`` over the manager's shadow."""

    graph: Any
    _args: list[KernelArgs]
    _params: list[Any]
    _shadow: ExecShadow
    _lock: Any

    def _check_usable(self) -> None:  # (the manager's)
        raise NotImplementedError

    @_locked
    def set_params(self, node: int, grid: tuple[int, ...] | None = None, **scalars: int | float) -> int:
        """Change a node's scalar arguments and/or grid in the exec (``cuGraphExecKernelNodeSetParams``).

        The change takes effect for launches made after the call. Pointer arguments are not
        accepted here (:meth:`bind` validates what they point at); the block size is compiled
        into the kernels and not accepted either.

        Parameters
        ----------
        node : int
            Node index in capture order.
        grid : tuple of int, optional
            New grid (1 to 3 positive ints). For a kernel compiled with fixed cluster dimensions
            each grid dimension must be a multiple of the cluster's.
        **scalars
            New values of scalar arguments (any kind of :data:`~rawgraph.runtime.launch.ARG_DTYPES` but ``ptr``), by name.

        Returns
        -------
        int
            1 when the node was pushed, 0 when nothing changed.

        Raises
        ------
        KeyError
            Unknown node or argument.
        TypeError
            A pointer argument, or a value of the wrong type.
        ShapeError
            An empty grid, or one that does not fit the kernel's cluster dimensions.
        """
        self._check_usable()
        if not 0 <= node < len(self._args):
            raise KeyError(f"node {node} is not in this graph (0..{len(self._args) - 1})")
        args, params = self._args[node], self._params[node]
        kinds = dict(args.spec)
        for arg, value in scalars.items():
            if arg not in kinds:
                raise KeyError(f"node {node} ({self.graph.nodes[node].launch.kernel.name}) has no argument {arg!r}; "
                               f"it has {args.names()}")
            if kinds[arg] == "ptr":
                raise TypeError(f"{arg!r} is a pointer argument: rebind it with bind() so the array is checked")
            if kinds[arg] not in ARG_DTYPES:
                raise TypeError(f"{arg!r} ({kinds[arg]}) is passed by value as an array: edit it with "
                                "the launch's args.array() and set_params")
            check_scalar(kinds[arg], value, repr(arg))
        new_grid = None
        if grid is not None:
            new_grid = tuple(int(g) for g in (tuple(grid) + (1, 1))[:3])
            if len(tuple(grid)) > 3 or min(new_grid) < 1:
                raise ShapeError(f"grid must be 1 to 3 positive ints, got {grid}")
            cluster = self.graph.nodes[node].launch.kernel.cluster_dims
            if any(c and g % c for g, c in zip(new_grid, cluster)):
                raise ShapeError(f"grid {new_grid} is not a multiple of the kernel's cluster dimensions {cluster}")
        old_values = {arg: args[arg] for arg in scalars}
        old_grid = (params.gridDimX, params.gridDimY, params.gridDimZ)
        if all(old_values[a] == (np.float32(v) if kinds[a] == "f32" else v) for a, v in scalars.items()) and \
                (new_grid is None or new_grid == old_grid):
            return 0
        args.update(scalars)
        if new_grid is not None:
            params.gridDimX, params.gridDimY, params.gridDimZ = new_grid
        return self._shadow.push((node,), _restore_scalars, (args, params, old_values, old_grid))

    def scalar_setter(self, node: int, arg: str) -> Any:
        """A fast setter for one scalar argument of one node: checked here once (as
        :meth:`set_params` checks), then each call ``setter(value)`` writes the value and pushes
        the node only when it changed (``cuGraphExecKernelNodeSetParams``); returns the pushes
        made (0 or 1). For per-step updates such as a live row count."""
        self.set_params(node, None, **{arg: self._args[node][arg]})  # validates node, arg and kind
        view = self._args[node]._views[arg]
        push = self._shadow.push
        nodes = (node,)
        alive = self._alive  # type: ignore[attr-defined]
        lock = self._lock

        def restore(old: Any) -> None:
            view[0] = old

        def setter(value: int | float) -> int:
            with lock:
                if self._closed or not (alive[0].alive and alive[1].alive):  # type: ignore[attr-defined]
                    self._check_usable()
                if view[0] == value:
                    return 0
                old = view[0].item()
                view[0] = value
                return push(nodes, restore, old)

        return setter

    def node_params(self, node: int) -> dict[str, Any]:
        """What this manager last gave the exec for ``node``: grid and argument values (the
        driver has no getter for exec node parameters; this is the shadow it keeps)."""
        p, args = self._params[node], self._args[node]
        return {"grid": (p.gridDimX, p.gridDimY, p.gridDimZ), **{n: args[n] for n in args.names()}}
