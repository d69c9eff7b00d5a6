"""Forbidden calls during capture: a typed error naming the call, the capture ended, the stream usable."""

import numpy as np
import pytest

from helpers import random_input, rel_err
from rawgraph import (
    Capture,
    CaptureError,
    CaptureMode,
    CaptureRefusedError,
    DeviceBuffer,
    Stream,
    TinyBlock,
    capture_plan,
    get_device,
    ops,
)

pytestmark = pytest.mark.gpu


def _usable_afterwards(stream, rng):
    """The stream is not capturing, runs eager work, and captures again."""
    assert not stream.is_capturing()
    model = TinyBlock(64, 2, 1)
    xh = random_input(rng, (2, 64))
    x, out = DeviceBuffer.from_numpy(xh), DeviceBuffer((2, 64))
    out.poison(stream)
    model.forward(x, out, stream)
    stream.synchronize()
    assert rel_err(out.to_numpy(), model.reference(xh)) < 1e-5
    graph = capture_plan(model.plan(x, out), stream)
    out.poison(stream)
    graph.instantiate().launch(stream)
    assert rel_err(out.to_numpy(), model.reference(xh)) < 1e-5


def _capture_with(stream, body, mode=CaptureMode.GLOBAL):
    dev = get_device()
    empty = ops.empty(dev)
    with Capture(stream, mode) as cap:
        cap.launch(empty)
        body()
    return cap


FORBIDDEN = {
    "cuStreamSynchronize": lambda s: s.synchronize(),
    "cuCtxSynchronize": lambda s: get_device().synchronize(),
    "cuMemAlloc": lambda s: DeviceBuffer(1024),
    # Legacy-stream work only conflicts with a *blocking* capturing stream (which would
    # implicitly synchronise with it); the test captures on one for this case.
    "cuLaunchKernel": lambda s: ops.empty(get_device())(Stream.legacy()),
}


@pytest.mark.parametrize("call_name", list(FORBIDDEN))
def test_forbidden_call_names_the_cause_and_leaves_the_stream_usable(rng, call_name):
    stream = Stream(non_blocking=call_name != "cuLaunchKernel")
    with pytest.raises(CaptureError) as info:
        _capture_with(stream, lambda: FORBIDDEN[call_name](stream))
    assert call_name in str(info.value)
    assert info.value.name.startswith("CUDA_ERROR_STREAM_CAPTURE")
    assert info.value.hint
    _usable_afterwards(stream, rng)
    stream.close()


def test_legacy_work_beside_a_non_blocking_capture_is_allowed(stream, rng):
    # A non-blocking stream does not synchronise with the legacy stream, so nothing implicit joins
    # the capture: the driver allows it, and the graph holds only the recorded node.
    cap = _capture_with(stream, lambda: ops.empty(get_device())(Stream.legacy()))
    assert cap.graph.node_count() == 1
    _usable_afterwards(stream, rng)


def test_relaxed_mode_allows_allocation(stream, rng):
    held = []
    cap = _capture_with(stream, lambda: held.append(DeviceBuffer(1024)), CaptureMode.RELAXED)
    assert cap.graph is not None and cap.graph.node_count() == 1
    _usable_afterwards(stream, rng)


def test_python_error_in_body_ends_the_capture(stream, rng):
    with pytest.raises(ZeroDivisionError):
        _capture_with(stream, lambda: 1 / 0)
    _usable_afterwards(stream, rng)


def test_capturing_twice_is_refused(stream, rng):
    with Capture(stream):
        with pytest.raises(CaptureRefusedError, match="already capturing"):
            Capture(stream).__enter__()
    _usable_afterwards(stream, rng)


def test_work_outside_the_recorder_is_detected(stream, rng):
    from rawgraph import RawgraphError

    dev = get_device()
    with pytest.raises(RawgraphError, match="outside Capture.launch"):
        with Capture(stream) as cap:
            cap.launch(ops.empty(dev))
            ops.empty(dev)(stream)  # launched straight on the stream, not recorded
    _usable_afterwards(stream, rng)
