"""Stream capture (``cuStreamBeginCapture`` / ``cuStreamEndCapture``) with a node map.

Each launch made through :meth:`Capture.launch` is followed by ``cuStreamGetCaptureInfo``: in a
linear capture the stream's dependency set is then exactly the node the launch became. That is how
rawgraph knows which graph node holds which launch (and so which node argument reads which named
buffer) without guessing from node order afterwards. At the end, the graph's node count must equal
the number of launches recorded.

Capture mode
------------
The default is ``GLOBAL`` (PyTorch's default too): while any thread captures in global mode, every
thread's potentially unsafe calls (``cuMemAlloc``, synchronisation, legacy-stream work) fail loudly
instead of silently racing with the capture. ``THREAD_LOCAL`` restricts only the capturing thread,
for programs whose other threads must keep allocating while a graph is captured. ``RELAXED`` lifts
the checks; use it only when you know the unsafe calls cannot touch the captured work.
"""

from __future__ import annotations

import enum
from typing import Any

from cuda.bindings import driver

from .errors import CaptureError, CaptureRefusedError, ClosedError, RawgraphError, call, check
from .graph import Graph, KernelNode
from .launch import Launch, LaunchPlan
from .stream import Stream


class CaptureMode(enum.Enum):
    """``CUstreamCaptureMode``."""

    GLOBAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    THREAD_LOCAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    RELAXED = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


DEFAULT_CAPTURE_MODE = CaptureMode.GLOBAL
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


class Capture:
    """Context manager that captures work on ``stream`` into a :class:`~rawgraph.graph.Graph`.

    On a clean exit the graph is in :attr:`graph`. If the body raises (for example a forbidden
    ``cuStreamSynchronize`` or ``cuMemAlloc`` during a global-mode capture), the capture is ended,
    whatever graph the driver returns is destroyed, and the original error propagates: the stream
    is usable again afterwards.

    Parameters
    ----------
    stream : Stream
        A non-legacy stream (the legacy NULL stream cannot be captured: refused here, before the
        driver is called).
    mode : CaptureMode, default GLOBAL
    """

    def __init__(self, stream: Stream, mode: CaptureMode = DEFAULT_CAPTURE_MODE):
        if not isinstance(mode, CaptureMode):
            raise TypeError(f"mode must be a CaptureMode, got {mode!r}")
        if getattr(stream, "is_legacy", False) or int(stream.handle) in (0, 1, 2):
            raise CaptureRefusedError(
                "cannot capture the legacy/NULL (or per-thread default) stream; capture on a rawgraph.Stream()"
            )
        if stream.closed:
            raise ClosedError("Stream is closed")
        self.stream = stream
        self.mode = mode
        self.nodes: list[KernelNode] = []
        self.graph: Graph | None = None
        self._open = False

    def __enter__(self) -> "Capture":
        if self.stream.is_capturing():
            raise CaptureRefusedError("this stream is already capturing")
        call(driver.cuStreamBeginCapture, self.stream.handle, self.mode.value)
        self._open = True
        return self

    def launch(self, launch: Launch) -> KernelNode:
        """Launch into the capture and record the node it became (``cuStreamGetCaptureInfo``)."""
        if not self._open:
            raise RawgraphError("Capture.launch outside the with-block")
        launch(self.stream)
        status, _id, _graph, deps, _edges, ndeps = check(
            driver.cuStreamGetCaptureInfo(self.stream.handle), "cuStreamGetCaptureInfo"
        )
        if status != _ACTIVE:
            raise CaptureError(0, "CAPTURE_NOT_ACTIVE", f"capture status is {status.name}", "cuStreamGetCaptureInfo")
        if ndeps != 1:
            raise RawgraphError(
                f"expected one dependency after launching {launch.kernel.name} (a linear capture), found {ndeps}"
            )
        node = KernelNode(deps[0], len(self.nodes), launch, launch.args.snapshot())
        self.nodes.append(node)
        return node

    def run(self, plan: LaunchPlan) -> None:
        """Record every launch of ``plan`` in order."""
        plan.check_open()
        for launch in plan.launches:
            self.launch(launch)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._open = False
        err, handle = driver.cuStreamEndCapture(self.stream.handle)
        if exc_type is not None:
            if handle is not None and int(handle):
                driver.cuGraphDestroy(handle)
            if hasattr(exc, "add_note"):
                exc.add_note(
                    f"rawgraph: the capture on {self.stream!r} was ended ({driver.CUresult(int(err)).name}) "
                    "and its graph discarded; the stream is usable again"
                )
            return False
        if err != driver.CUresult.CUDA_SUCCESS:
            if handle is not None and int(handle):
                driver.cuGraphDestroy(handle)
            check((err,), "cuStreamEndCapture")
        graph = Graph(handle, self.nodes, self.stream.device)
        count = graph.node_count()
        if count != len(self.nodes):
            graph.close()
            raise RawgraphError(
                f"the captured graph has {count} nodes but {len(self.nodes)} launches were recorded: "
                "work was submitted to the stream outside Capture.launch"
            )
        self.graph = graph
        return False


def capture_plan(
    plan: LaunchPlan,
    stream: Stream,
    mode: CaptureMode = DEFAULT_CAPTURE_MODE,
    warmup: bool = True,
) -> Graph:
    """Capture ``plan`` on ``stream`` and return the graph with its node map.

    With ``warmup`` (the default) the plan first runs once eagerly and the stream is synchronised,
    so module loading, lazy function loading and first-touch costs happen before capture, not in it.
    """
    if warmup:
        plan.run(stream)
        stream.synchronize()
    with Capture(stream, mode) as cap:
        cap.run(plan)
    assert cap.graph is not None
    cap.graph.plan = plan  # the plan owns the argument buffers the nodes were captured from
    return cap.graph
