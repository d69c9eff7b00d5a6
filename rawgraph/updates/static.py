"""The static-address path (what PyTorch's CUDA graphs do), at driver level.

Static input and output buffers are captured once; every replay reads the same input address and
writes the same output address. New data is copied into the static input first
(``cuMemcpyDtoDAsync`` on the replay stream), then the exec is launched. A source of another
shape, dtype or size is refused at the copy boundary, before anything reaches the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings import driver

from ..graphs.capture import DEFAULT_CAPTURE_MODE, CaptureMode, capture_plan
from ..graphs.graph import Graph, GraphExec
from ..runtime.errors import DTypeError, ShapeError, call
from ..runtime.launch import LaunchPlan
from ..runtime.memory import DeviceBuffer, as_device_array
from ..runtime.stream import Stream, stream_handle


class StaticGraph:
    """A model captured on static input/output buffers (PyTorch's way: copy in, replay).

    Parameters
    ----------
    model : row-wise model
        Any object with ``plan(x, out)``, ``batch``, ``width`` and ``device``
        (:mod:`rawgraph.serving.protocol`), e.g. a :class:`~rawgraph.TinyBlock`.
    stream : Stream
        Used for warm-up, capture and upload.
    mode : CaptureMode
    flags : int
        ``cuGraphInstantiate`` flags.

    Attributes
    ----------
    static_input, static_output : DeviceBuffer
        Their addresses never change. ``static_output`` is what :meth:`__call__` hands back, so
        it belongs to whoever holds it: :meth:`close` does not free it (as in PyTorch, outputs
        stay valid after the graph is destroyed); it is freed with its last reference.
    graph : Graph
    exec : GraphExec

    See Also
    --------
    cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """

    model: Any  # a row-wise model (rawgraph.serving.protocol)
    static_input: DeviceBuffer
    static_output: DeviceBuffer
    plan: LaunchPlan

    def __init__(self, model: Any, stream: Stream, mode: CaptureMode = DEFAULT_CAPTURE_MODE, flags: int = 0):
        shape = (model.batch, model.width)
        self.model = model
        self.static_input = DeviceBuffer(shape, np.float32, model.device)
        self.static_output = DeviceBuffer(shape, np.float32, model.device)
        # Never capture on uninitialised memory: warm-up reads the input.
        self.static_input.poison(stream)
        self.plan = model.plan(self.static_input, self.static_output)
        self.graph: Graph = capture_plan(self.plan, stream, mode)
        self.exec: GraphExec = self.graph.instantiate(flags)
        self.exec.upload(stream)
        self._nbytes = self.static_input.nbytes

    def copy_in(self, src: Any, stream: Any) -> None:
        """Copy ``src`` into the static input on ``stream`` (``cuMemcpyDtoDAsync``).

        Raises
        ------
        ShapeError, DTypeError, LayoutError, NotOnDeviceError
            When ``src`` is not a contiguous float32 device array of the captured shape.

        See Also
        --------
        cuMemcpyDtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        view = as_device_array(src, "src")
        if view.dtype != np.float32:
            raise DTypeError(f"static input is float32, got {view.dtype}")
        if view.shape != self.static_input.shape:
            raise ShapeError(
                f"static input was captured with shape {self.static_input.shape}, got {view.shape}; "
                "capture another graph (bucket) for this shape"
            )
        call(driver.cuMemcpyDtoDAsync, self.static_input.ptr, view.ptr, self._nbytes, stream_handle(stream))

    def replay(self, stream: Any) -> None:
        """``cuGraphLaunch`` of the captured exec.

        See Also
        --------
        cuGraphLaunch : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        self.exec.launch(stream)

    def __call__(self, src: Any, stream: Any) -> DeviceBuffer:
        """Copy in, replay; returns the static output (valid once ``stream`` has caught up)."""
        self.copy_in(src, stream)
        self.exec.launch(stream)
        return self.static_output

    @property
    def closed(self) -> bool:
        return self.exec.closed

    def close(self) -> None:
        """Destroy the exec and the graph and free the static input; safe twice.

        ``static_output`` is left to its holders (see the class notes). Replays still queued
        finish first: the driver defers the exec's destruction, and the input is freed with
        ``cuMemFree``, which waits for them.

        See Also
        --------
        cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        self.exec.close()
        self.graph.close()
        self.static_input.close()

    def __enter__(self) -> StaticGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
