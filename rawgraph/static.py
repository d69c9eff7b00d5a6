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

from .capture import DEFAULT_CAPTURE_MODE, CaptureMode, capture_plan
from .errors import DTypeError, ShapeError, call
from .graph import Graph, GraphExec
from .memory import DeviceBuffer, as_device_array
from .model import TinyBlock
from .stream import Stream


class StaticGraph:
    """A TinyBlock captured on static input/output buffers.

    Parameters
    ----------
    model : TinyBlock
    stream : Stream
        Used for warm-up, capture and upload.
    mode : CaptureMode
    flags : int
        ``cuGraphInstantiate`` flags.

    Attributes
    ----------
    static_input, static_output : DeviceBuffer
        Their addresses never change.
    graph : Graph
    exec : GraphExec
    """

    def __init__(self, model: TinyBlock, stream: Stream, mode: CaptureMode = DEFAULT_CAPTURE_MODE, flags: int = 0):
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

    def copy_in(self, src: Any, stream: Stream) -> None:
        """Copy ``src`` into the static input on ``stream`` (``cuMemcpyDtoDAsync``).

        Raises
        ------
        ShapeError, DTypeError, LayoutError, NotOnDeviceError
            When ``src`` is not a contiguous float32 device array of the captured shape.
        """
        view = as_device_array(src, "src")
        if view.dtype != np.float32:
            raise DTypeError(f"static input is float32, got {view.dtype}")
        if view.shape != self.static_input.shape:
            raise ShapeError(
                f"static input was captured with shape {self.static_input.shape}, got {view.shape}; "
                "capture another graph (bucket) for this shape"
            )
        call(driver.cuMemcpyDtoDAsync, self.static_input.ptr, view.ptr, self._nbytes, stream.handle)

    def replay(self, stream: Stream) -> None:
        """``cuGraphLaunch`` of the captured exec."""
        self.exec.launch(stream)

    def __call__(self, src: Any, stream: Stream) -> DeviceBuffer:
        """Copy in, replay; returns the static output (valid once ``stream`` has caught up)."""
        self.copy_in(src, stream)
        self.exec.launch(stream)
        return self.static_output

    def close(self) -> None:
        self.exec.close()
        self.graph.close()
        self.static_input.close()
        self.static_output.close()

    def __enter__(self) -> "StaticGraph":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
