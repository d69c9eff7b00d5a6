"""Scalar arguments and launch shape of an exec's nodes: the part of
:class:`~rawgraph.updates.manager.ExecUpdateManager` that edits a node's scalars and grid in its
shadow (:mod:`rawgraph.updates.shadow`) and pushes it, checked as :meth:`ParamSetters.set_params`
says."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, TypeVar, cast

from ..runtime.errors import ArgumentError, ShapeError
from ..runtime.launch import ARG_DTYPES, MAX_GRID, KernelArgs, check_scalar, launch_dims
from .shadow import ExecShadow


_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run ``method`` holding the manager's lock: the shadow parameters, the bound pointers and the
    exec change together, so two threads binding at once cannot leave them disagreeing."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_F, locked)  # same signature: it only wraps the call in the lock


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


def _restore_scalars(log: tuple[KernelArgs, Any, dict[str, Any], tuple[int, int, int]]) -> None:
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
    _alive: tuple[weakref.finalize[..., Any], weakref.finalize[..., Any]]  # the exec's and the graph's
    _closed: bool

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
        grid : int or tuple of int, optional
            New grid (an int or 1 to 3 positive ints, within :data:`MAX_GRID`). For a kernel
            compiled with fixed cluster dimensions each grid dimension must be a multiple of the
            cluster's.
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
            A pointer argument, or a value its C type cannot hold (:class:`ArgumentError`, as a
            launch refuses it).
        ShapeError
            A grid that is not 1 to 3 positive ints, is larger than :data:`MAX_GRID` or does not
            fit the kernel's cluster dimensions.

        Every refusal comes before anything changes: the shadow and the exec keep what they held.
        """
        self._check_usable()
        if not 0 <= node < len(self._args):
            raise KeyError(f"node {node} is not in this graph (0..{len(self._args) - 1})")
        args, params = self._args[node], self._params[node]
        kinds = dict(args.spec)
        # Everything is checked before the shadow changes: a refused call leaves the shadow equal
        # to the exec, so the next push of this node (any bind that moves one of its arrays)
        # carries none of it.
        values = {}
        for arg, value in scalars.items():
            if arg not in kinds:
                raise KeyError(f"node {node} ({self.graph.nodes[node].launch.kernel.name}) has no argument {arg!r}; "
                               f"it has {args.names()}")
            if kinds[arg] == "ptr":
                raise TypeError(f"{arg!r} is a pointer argument: rebind it with bind() so the array is checked")
            if kinds[arg] not in ARG_DTYPES:
                raise TypeError(f"{arg!r} ({kinds[arg]}) is passed by value as an array: edit it with "
                                "the launch's args.array() and set_params")
            values[arg] = stored_scalar(kinds[arg], value, repr(arg))
        new_grid = None if grid is None else check_grid(grid, self.graph.nodes[node].launch.kernel.cluster_dims)
        old_values = {arg: args[arg] for arg in values}
        old_grid = (params.gridDimX, params.gridDimY, params.gridDimZ)
        if all(old_values[a] == v for a, v in values.items()) and new_grid in (None, old_grid):
            return 0
        # Neither edit can fail now; a refused push puts both back (_restore_scalars).
        args.update(values)
        if new_grid is not None:
            params.gridDimX, params.gridDimY, params.gridDimZ = new_grid
        return self._shadow.push((node,), _restore_scalars, (args, params, old_values, old_grid))

    def scalar_setter(self, node: int, arg: str) -> Any:
        """A fast setter for one scalar argument of one node: the node and argument are checked
        here once (as :meth:`set_params` checks them), then each call ``setter(value)`` checks the
        value as :meth:`set_params` and a launch do (:class:`ArgumentError`, before anything
        changes), writes it and pushes the node only when it changed
        (``cuGraphExecKernelNodeSetParams``); returns the pushes made (0 or 1). For per-step
        updates such as a live row count."""
        self.set_params(node, None, **{arg: self._args[node][arg]})  # validates node, arg and kind
        kind, what = dict(self._args[node].spec)[arg], repr(arg)
        view = self._args[node]._views[arg]
        push = self._shadow.push
        nodes = (node,)
        alive = self._alive
        lock = self._lock

        def restore(old: Any) -> None:
            view[0] = old

        def setter(value: int | float) -> int:
            with lock:
                if self._closed or not (alive[0].alive and alive[1].alive):
                    self._check_usable()
                stored = stored_scalar(kind, value, what)
                if view[0] == stored:
                    return 0
                old = view[0].item()
                view[0] = stored
                return push(nodes, restore, old)

        return setter

    def node_params(self, node: int) -> dict[str, Any]:
        """What this manager last gave the exec for ``node``: grid and argument values (the
        driver has no getter for exec node parameters; this is the shadow it keeps)."""
        p, args = self._params[node], self._args[node]
        return {"grid": (p.gridDimX, p.gridDimY, p.gridDimZ), **{n: args[n] for n in args.names()}}
