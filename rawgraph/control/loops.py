"""Conditional nodes at work over any row-wise model: a depth decided on the device, an early exit.

Both take a model keeping the row-wise protocol (:mod:`rawgraph.serving.protocol`: ``plan(x,
out)``, ``batch``, ``width``, ``device``); neither knows which model it runs.

:class:`DepthLoop` runs a WHILE over the model's layers. A *layered* model also offers

``layers`` : int
    The most layers one replay may run.
``layer_plan(x, out, layer) -> LaunchPlan``
    One layer, the one whose index is the ``uint32`` at device array ``layer`` when the plan
    runs (read on the device at every iteration); ``x`` and ``out`` fixed. The model owns
    whatever the plan needs (a :class:`~rawgraph.TinyBlock` copies the layer's weights into
    fixed buffers it keeps).

A model without ``layer_plan`` is one layer applied again and again: each iteration runs
``plan(cur, nxt)``, and ``max_depth`` must be given.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.builder import BuiltGraph, GraphBuilder
from ..graphs.capture import Capture
from ..graphs.conditional import (
    THREADS,
    ConditionalHandle,
    _capture_info,
    _grid,
    _launch,
    add_conditional,
    capture_conditional,
    capture_handle,
    make_handle,
)
from ..runtime.errors import RawgraphError, ShapeError, call
from ..runtime.launch import Launch
from ..runtime.memory import DeviceBuffer, as_device_array, check_array
from ..runtime.resource import Resource
from ..runtime.stream import Stream


def _close_all(owned: list) -> None:
    for obj in owned:
        obj.close()


def _check_model(model: Any, what: str) -> None:
    missing = [n for n in ("plan", "batch", "width", "device") if not hasattr(model, n)]
    if missing:
        raise TypeError(
            f"{what} needs a model with plan(x, out), batch, width and device "
            f"(rawgraph.serving.protocol); {type(model).__name__} has no {', '.join(missing)}"
        )
    check = getattr(model, "_check_open", None)
    if check is not None:
        check()


class DepthLoop(Resource):
    """A model whose depth is read from device memory at every replay (a WHILE over layers).

    One exec serves every depth ``0..max_depth`` with no re-instantiation and no parameter
    update: write the depth into :attr:`depth` (host :meth:`set_depth`, or any kernel) before a
    replay. Depth ``d`` runs ``d`` layers; depth 0 copies ``x`` to ``out``. For a
    :class:`~rawgraph.TinyBlock` the result has the bits of a plain ``d``-layer block with the same
    weights (``tests/test_conditional_gpu.py``).

    The graph::

        memcpy x -> cur;  rg_depth_init (counter = 0, cond = depth > 0)
        WHILE cond:
            <one layer>       model.layer_plan(cur, nxt, counter), or model.plan(cur, nxt)
            rg_layer_advance  cur = nxt; counter += 1; cond = counter < depth
        memcpy cur -> out

    Owns the activations, the counter and depth words (``cuMemFree``), and the graph and exec
    (``cuGraphDestroy`` / ``cuGraphExecDestroy``); not the model.

    Parameters
    ----------
    model : row-wise model
        Its ``batch`` and ``width`` give the shape of ``x`` and ``out``. Layered (see the module
        docstring) or not.
    x, out : device arrays
        ``(batch, width)`` float32, read / written at every replay.
    max_depth : int, optional
        Default (and at most) ``model.layers`` for a layered model; required otherwise.
    capture : bool, default False
        Build the graph by stream capture (the body on a second stream) instead of the builder.
    stream : Stream, optional
        For capture and the set-up copies (default: a private one).

    See Also
    --------
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuGraphDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphExecDestroy : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    device: Any
    width: int
    max_depth: int
    batch: int
    cur: DeviceBuffer
    nxt: DeviceBuffer
    counter: DeviceBuffer
    depth: DeviceBuffer
    body_plan: Any
    graph: Any | BuiltGraph

    def __init__(
        self,
        model: Any,
        x: Any,
        out: Any,
        max_depth: int | None = None,
        capture: bool = False,
        stream: Stream | None = None,
    ):
        _check_model(model, "DepthLoop")
        layered = hasattr(model, "layer_plan")
        top = int(model.layers) if layered else None
        if max_depth is None:
            if top is None:
                raise TypeError(
                    f"{type(model).__name__} has no layer_plan: give max_depth (the times its plan repeats)"
                )
            max_depth = top
        if (
            isinstance(max_depth, bool)
            or not isinstance(max_depth, (int, np.integer))
            or max_depth < 1
            or (top is not None and max_depth > top)
        ):
            raise ShapeError(f"max_depth must be an int in 1..{top if top is not None else 'any'}, got {max_depth!r}")
        self.model = model
        self.device = model.device.activate()
        self.width, self.max_depth, self.batch = int(model.width), int(max_depth), int(model.batch)
        owned: list[Any] = []
        self._own(_close_all, owned, name="cuGraphExecDestroy + cuGraphDestroy + cuMemFree (DepthLoop)")
        w, b = self.width, self.batch
        self.x = check_array(as_device_array(x, "x"), (b, w), np.float32, "x", self.device)
        self.out = check_array(as_device_array(out, "out"), (b, w), np.float32, "out", self.device)
        self.cur, self.nxt = (
            DeviceBuffer((b, w), np.float32, self.device),
            DeviceBuffer((b, w), np.float32, self.device),
        )
        owned.extend([self.cur, self.nxt])
        self.counter = DeviceBuffer(1, np.uint32, self.device)
        self.depth = DeviceBuffer(1, np.uint32, self.device)
        owned.extend([self.counter, self.depth])
        own_stream = stream is None
        s = stream if stream is not None else Stream(device=self.device)
        try:
            self.set_depth(self.max_depth, s)
            self.body_plan = (
                model.layer_plan(self.cur, self.nxt, self.counter) if layered else model.plan(self.cur, self.nxt)
            )
            self.graph = self._capture(s) if capture else self._build()
            owned.append(self.graph)
            self.exec = self.graph.instantiate()
            owned.insert(0, self.exec)
        finally:
            if own_stream:
                s.close()

    def _launches(self, cond: ConditionalHandle) -> tuple[Launch, Launch]:
        dev = self.device
        init = _launch(
            dev,
            "rg_depth_init",
            [("h", "u64"), ("counter", "ptr"), ("depth", "ptr"), ("max_depth", "i32")],
            {"h": int(cond), "counter": self.counter.ptr, "depth": self.depth.ptr, "max_depth": self.max_depth},
        )
        m = self.batch * self.width
        advance = _launch(
            dev,
            "rg_layer_advance",
            [
                ("h", "u64"),
                ("cur", "ptr"),
                ("nxt", "ptr"),
                ("n", "i32"),
                ("counter", "ptr"),
                ("depth", "ptr"),
                ("max_depth", "i32"),
            ],
            {
                "h": int(cond),
                "cur": self.cur.ptr,
                "nxt": self.nxt.ptr,
                "n": m,
                "counter": self.counter.ptr,
                "depth": self.depth.ptr,
                "max_depth": self.max_depth,
            },
            _grid(m, dev),
            THREADS,
        )
        return init, advance

    def _build(self) -> BuiltGraph:
        nbytes = self.batch * self.width * 4
        with GraphBuilder(self.device) as g:
            cond = make_handle(g)
            init, advance = self._launches(cond)
            first = g.memcpy(self.cur, self.x, nbytes)
            k = g.kernel(init, deps=first)
            loop = add_conditional(g, "while", cond, deps=k)
            body = loop.bodies[0]
            layer = body.run(self.body_plan, pdl=False)
            body.kernel(advance, deps=layer[-1])
            g.memcpy(self.out, self.cur, nbytes, deps=loop.node)
            self.loop = loop
            return g.build()

    def _capture(self, s: Stream) -> Any:
        nbytes = self.batch * self.width * 4
        with Stream(device=self.device) as body_stream:
            cap = Capture(s)
            with cap:
                cond = capture_handle(cap)
                init, advance = self._launches(cond)
                _dtod(cap, self.cur.ptr, self.x.ptr, nbytes)
                cap.launch(init)
                loop = capture_conditional(cap, "while", cond)
                with loop.capture_body(0, body_stream) as body:
                    # plain edges in the body, as the builder path makes them: a model's PDL chain
                    # (TinyBlock on sm_90) is never captured into a conditional body
                    body.run(self.body_plan, pdl=False)
                    body.launch(advance)
                _dtod(cap, self.out.ptr, self.cur.ptr, nbytes)
            self.loop = loop
            graph = cap.captured
            graph.plan = self.body_plan
            return graph

    def set_depth(self, depth: int, stream: Any) -> None:
        """Write the depth the next replays run (``cuMemcpyHtoDAsync`` + stream sync); values
        above ``max_depth`` run ``max_depth`` layers.

        See Also
        --------
        cuMemcpyHtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        self._check_open()
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
            raise ValueError(f"depth must be an int >= 0, got {depth!r}")
        self.depth.copy_from_host(np.array([min(int(depth), 0xFFFFFFFF)], np.uint32), stream)

    def launch(self, stream: Any) -> None:
        """One replay (``cuGraphLaunch``) at the depth now in :attr:`depth`.

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        self.exec.launch(stream)


def _dtod(cap: Capture, dst: int, src: int, nbytes: int) -> None:
    """A device-to-device copy captured as a memcpy node (recorded in ``cap.other_nodes``)."""
    call(driver.cuMemcpyDtoDAsync, int(dst), int(src), int(nbytes), cap.stream.handle)
    _graph, deps, _e = _capture_info(cap)
    if len(deps) != 1:
        raise RawgraphError(f"expected one dependency after cuMemcpyDtoDAsync, found {len(deps)}")
    cap.other_nodes.append((deps[0], "memcpy", (int(dst), int(src), int(nbytes))))


class NormGate(Resource):
    """Run a model's plan only when ``||x||_2 >= threshold``, decided on the device (IF).

    The graph: ``memcpy x -> out``; ``rg_norm_gate`` (one CTA: the norm in float64, written to
    :attr:`norm`, cond = norm >= threshold); ``IF cond: plan (x -> out)``. Under the threshold the
    replay ends after the norm with ``out == x`` (an early exit); at or above it, ``out`` holds the
    model's output, the bits of the plan run eagerly.

    Parameters
    ----------
    model : row-wise model
        Any object with ``plan(x, out)`` and ``device`` (:mod:`rawgraph.serving.protocol`).
    x, out : device arrays of the model's shape
    threshold : float
    """

    device: Any
    threshold: float
    plan: Any
    norm: DeviceBuffer
    graph: BuiltGraph

    def __init__(self, model: Any, x: Any, out: Any, threshold: float):
        _check_model(model, "NormGate")
        self.device = model.device.activate()
        owned: list[Any] = []
        self._own(_close_all, owned, name="cuGraphExecDestroy + cuGraphDestroy + cuMemFree (NormGate)")
        self.model = model
        self.threshold = float(threshold)
        if not np.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {threshold}")
        self.plan = model.plan(x, out)
        xa, oa = self.plan.buffers["x"], self.plan.buffers["out"]
        self.norm = DeviceBuffer(1, np.float32, self.device)
        owned.append(self.norm)
        with GraphBuilder(self.device) as g:
            cond = make_handle(g)
            gate = _launch(
                self.device,
                "rg_norm_gate",
                [("h", "u64"), ("x", "ptr"), ("n", "i32"), ("threshold", "f32"), ("norm", "ptr")],
                {"h": int(cond), "x": xa.ptr, "n": xa.size, "threshold": self.threshold, "norm": self.norm.ptr},
                (1, 1, 1),
                THREADS,
            )
            c = g.memcpy(oa, xa, xa.nbytes)
            k = g.kernel(gate, deps=c)
            self.node = add_conditional(g, "if", cond, deps=k)
            self.node.bodies[0].run(self.plan, pdl=False)
            self.graph = g.build()
        owned.insert(0, self.graph)
        self.exec = self.graph.instantiate()
        owned.insert(0, self.exec)

    def launch(self, stream: Any) -> None:
        """One replay (``cuGraphLaunch``).

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self._check_open()
        self.exec.launch(stream)


__all__ = ["DepthLoop", "NormGate"]
