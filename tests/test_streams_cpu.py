"""Stream-like objects resolve to the right handle, and default streams are refused for capture
before any driver call (no GPU needed)."""

import pytest
from cuda.bindings import driver

from rawgraph import Capture, CaptureRefusedError
from rawgraph.runtime.stream import _handle_of


class Protocol:
    def __init__(self, handle, version=0):
        self.handle, self.version = handle, version

    def __cuda_stream__(self):
        return (self.version, self.handle)


class OldProtocol:  # early cuda.core exposed the tuple as a property
    __cuda_stream__ = (0, 0x5000)


class TorchLike:
    cuda_stream = 0x6000


class CupyLike:
    ptr = 0x7000


@pytest.mark.parametrize(
    "obj,handle",
    [
        (Protocol(0x4000), 0x4000),
        (OldProtocol(), 0x5000),
        (TorchLike(), 0x6000),
        (CupyLike(), 0x7000),
        (driver.CUstream(0x8000), 0x8000),
        (0x9000, 0x9000),
    ],
)
def test_every_stream_spelling_resolves_to_its_handle(obj, handle):
    assert _handle_of(obj) == handle


def test_unknown_protocol_versions_and_non_streams_are_refused():
    with pytest.raises(TypeError, match="protocol version 1"):
        _handle_of(Protocol(0x4000, version=1))
    for bad in ("7", 7.0, True, None, object()):
        with pytest.raises(TypeError, match="not a stream"):
            _handle_of(bad)


@pytest.mark.parametrize(
    "obj", [0, 1, 2, Protocol(0), Protocol(2), TorchLike.__new__(type("T", (), {"cuda_stream": 1})), driver.CUstream(0)]
)
def test_default_streams_are_refused_for_capture_before_the_driver(obj, monkeypatch):
    monkeypatch.setattr(driver, "cuStreamBeginCapture", lambda *a: pytest.fail("reached the driver"))
    with pytest.raises(CaptureRefusedError, match="legacy/NULL"):
        Capture(obj)


def test_a_borrowed_stream_dropped_per_launch_is_no_release():
    """A foreign stream is wrapped per launch; dropping the wrapper must not move
    resource.release_count (the manager's one-compare fast path keys on it), while a real
    release still does. On the CPU fake driver."""
    import gc

    from fault_cases import fake_session

    from rawgraph import Stream
    from rawgraph.runtime import resource
    from rawgraph.runtime.stream import stream_handle

    with fake_session():
        with Stream() as owner:
            before = resource.release_count
            for _ in range(5):
                assert int(stream_handle(CupyLikeOf(owner.ptr))) == owner.ptr
            gc.collect()
            assert resource.release_count == before, "dropped borrowed wrappers counted as releases"
            borrowed = Stream.from_external(owner.ptr)
            borrowed.close()
            assert borrowed.closed and not owner.closed  # closing a borrowed stream releases nothing
        assert resource.release_count == before + 1  # the owned stream's cuStreamDestroy counts


class CupyLikeOf:
    def __init__(self, ptr):
        self.ptr = ptr


def test_a_borrowed_stream_is_checked_once_and_its_wrapper_reused_while_held():
    """Launching on a foreign stream again and again: one cuStreamGetCtx for the handle, one
    wrapper while an exec's stream registry holds it, and the lender is never kept alive by the
    cache. On the CPU fake driver."""
    import gc
    import weakref

    from cuda.bindings import driver
    from fault_cases import fake_session

    from rawgraph import Stream
    from rawgraph.runtime.stream import StreamSet, as_stream, stream_handle

    # the patch is undone before the fake driver is uninstalled (an undo after it would restore the fake)
    with fake_session(), pytest.MonkeyPatch.context() as mp:
        with Stream() as owner:
            asked: list[int] = []
            real = driver.cuStreamGetCtx
            mp.setattr(driver, "cuStreamGetCtx", lambda h: asked.append(int(h)) or real(h))
            registry = StreamSet()
            lenders = [CupyLikeOf(owner.ptr) for _ in range(4)]  # torch makes a new object per current_stream()
            wrappers = []
            for lender in lenders:
                w = as_stream(lender)
                registry.note(w)
                wrappers.append(w)
            assert all(w is wrappers[0] for w in wrappers), "a held wrapper was not reused"
            assert registry.streams == {owner.ptr: wrappers[0]}
            assert asked == [owner.ptr]
            lender_ref = weakref.ref(lenders[-1])
            del lenders, wrappers, w, lender
            registry.clear()
            gc.collect()
            assert lender_ref() is None, "the wrapper cache kept a lender alive"
            fresh = as_stream(CupyLikeOf(owner.ptr))  # a new wrapper: the handle is known
            assert int(stream_handle(CupyLikeOf(owner.ptr))) == owner.ptr
            assert asked == [owner.ptr] and fresh.ptr == owner.ptr
            fresh.close()  # a closed wrapper is never handed out
            again = as_stream(CupyLikeOf(owner.ptr))
            assert again is not fresh and not again.closed
