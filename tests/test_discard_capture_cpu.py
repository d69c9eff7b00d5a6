"""Abandoning a capture (``rawgraph.runtime.stream.discard_capture``) on the CPU fake driver
(tests/fakedriver.py): the one rule both abandoning paths share -- a stream closed while it
captures (``_destroy_stream``) and a Capture whose stream was closed in its body
(``_end_live_capture``) -- ends the capture, discards its graph, and reports a
``cuStreamEndCapture`` result the path does not accept as a ReleaseWarning, quietly at exit."""

from __future__ import annotations

import linecache
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cuda.bindings import driver
from fault_cases import fake_session

from rawgraph.runtime.errors import ReleaseWarning

R = driver.CUresult
TESTS = Path(__file__).resolve().parent
# Every result a path may meet, and which of them each path takes as no failure.
RESULTS = (
    R.CUDA_SUCCESS,
    R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    R.CUDA_ERROR_ILLEGAL_STATE,
    R.CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
    R.CUDA_ERROR_UNKNOWN,
)
DESTROY_ACCEPTS = {R.CUDA_SUCCESS, R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED}
LIVE_ACCEPTS = DESTROY_ACCEPTS | {R.CUDA_ERROR_ILLEGAL_STATE}


def _begin(stream: Any) -> None:
    """Start a driver capture on ``stream`` behind rawgraph's back (no Capture, no record)."""
    (err,) = driver.cuStreamBeginCapture(stream.handle, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    assert err == R.CUDA_SUCCESS


def _end_answers(mp: pytest.MonkeyPatch, fake: Any, code: Any) -> list[int]:
    """Make ``cuStreamEndCapture`` really end the capture (so nothing stays capturing) and answer
    ``code``; a graph it made is destroyed unless the answer is success, as the driver returns none
    on failure. Returns the list of graphs handed back to the caller."""
    real = driver.cuStreamEndCapture
    handed: list[int] = []

    def end(handle: Any) -> tuple:
        err, graph = real(handle)
        if code == R.CUDA_SUCCESS and err == R.CUDA_SUCCESS:
            handed.append(int(graph))
            return err, graph
        if graph is not None and int(graph):
            fake.api["cuGraphDestroy"](graph)
        return code, None

    mp.setattr(driver, "cuStreamEndCapture", end)
    return handed


def _release_warnings(seen: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, ReleaseWarning)]


def _warned_from(seen: list[warnings.WarningMessage]) -> list[tuple[str, str]]:
    """Where each ReleaseWarning is attributed (its stacklevel's frame): the file's name and the
    source line, so a frame one level off in the same file does not pass."""
    return [
        (Path(w.filename).name, linecache.getline(w.filename, w.lineno).strip())
        for w in seen
        if issubclass(w.category, ReleaseWarning)
    ]


@pytest.fixture
def session() -> Iterator[tuple[Any, pytest.MonkeyPatch]]:
    # the patch is undone before the fake driver is uninstalled (an undo after it would put the
    # fake's entries back into cuda.bindings.driver)
    with fake_session() as (fake, _hook), pytest.MonkeyPatch.context() as mp:
        yield fake, mp


@pytest.mark.parametrize("code", RESULTS, ids=lambda c: c.name)
def test_discard_capture_warns_for_what_the_caller_does_not_accept(session, code):
    from rawgraph import Stream
    from rawgraph.runtime.stream import discard_capture

    fake, mp = session
    accept = (R.CUDA_ERROR_ILLEGAL_STATE,)
    with Stream() as s:
        for abandoning in (None, "testing the rule"):
            _begin(s)
            handed = _end_answers(mp, fake, code)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                assert discard_capture(s.handle, abandoning, accept=accept) == code
            mp.undo()
            assert fake.streams[s.ptr].seq is None  # the capture is over either way
            assert all(g not in fake.graphs for g in handed), "the graph of a discarded capture was kept"
            assert len(handed) == (code == R.CUDA_SUCCESS)
            if abandoning is None or code in (R.CUDA_SUCCESS,) + accept:
                assert _release_warnings(seen) == []  # no warning without a name, or for an accepted result
            else:
                assert _release_warnings(seen) == [
                    f"rawgraph: cuStreamEndCapture failed while testing the rule: {code.name}"
                ]


def test_discard_capture_is_quiet_while_the_interpreter_exits(session):
    from rawgraph import Stream
    from rawgraph.runtime import resource
    from rawgraph.runtime.stream import discard_capture

    fake, mp = session
    with Stream() as s:
        _begin(s)
        _end_answers(mp, fake, R.CUDA_ERROR_UNKNOWN)
        mp.setattr(resource, "_exiting", True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert discard_capture(s.handle, "exiting", accept=()) == R.CUDA_ERROR_UNKNOWN
        mp.undo()
        assert fake.streams[s.ptr].seq is None


@pytest.mark.parametrize("code", RESULTS, ids=lambda c: c.name)
def test_closing_a_capturing_stream_warns_for_results_it_does_not_accept(session, code):
    """``_destroy_stream``: the capture is ended and the stream destroyed whatever the end
    answered; success and an invalidated capture are quiet, anything else warns."""
    from rawgraph import Stream

    fake, mp = session
    s = Stream()
    _begin(s)
    _end_answers(mp, fake, code)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s.close()
    mp.undo()
    assert s.closed and s.ptr not in fake.streams
    if code in DESTROY_ACCEPTS:
        assert _release_warnings(seen) == []
    else:
        assert _release_warnings(seen) == [
            f"rawgraph: cuStreamEndCapture failed while closing a capturing stream: {code.name}"
        ]
        # attributed where it always was: the release call that ran the stream's destroy
        assert _warned_from(seen) == [("resource.py", "_run_release(name, fn, args)")]


@pytest.mark.parametrize("code", RESULTS, ids=lambda c: c.name)
def test_a_capture_whose_stream_was_closed_warns_for_results_it_does_not_accept(session, code):
    """``_end_live_capture``: a stream closed inside its own capture; the Capture ends the driver's
    capture at its exit and raises ClosedError; success, an invalidated capture and a stream no
    longer capturing (ILLEGAL_STATE) are quiet, anything else warns."""
    from rawgraph import Capture, ClosedError, Stream
    from rawgraph.runtime import _capturing

    fake, mp = session
    s = Stream()
    _end_answers(mp, fake, code)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ClosedError, match="closed during the capture"):
            with Capture(s) as cap:
                s.close()  # deferred inside the capture: the handle still captures at the exit
    mp.undo()
    assert cap.graph is None and _capturing.active() == []
    assert s.ptr not in fake.streams  # the deferred cuStreamDestroy ran after the capture ended
    if code in LIVE_ACCEPTS:
        assert _release_warnings(seen) == []
    else:
        assert _release_warnings(seen) == [
            f"rawgraph: cuStreamEndCapture failed while ending the capture of a closed stream: {code.name}"
        ]
        # the Capture's exit, where it always was
        assert _warned_from(seen) == [("capture.py", "return self._end(exc_type, exc, record)")]


@pytest.mark.parametrize("flags", [["-W", "error"], []], ids=["warnings-as-errors", "default-warnings"])
def test_a_stream_left_capturing_at_exit_is_closed_quietly(flags):
    """At interpreter exit the stream's finalizer ends the capture; a failing end there raises
    nothing and prints nothing, as every release at exit. In a child process on the fake driver."""
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS)!r})
        from fakedriver import FakeDriver
        FakeDriver().install()
        from cuda.bindings import driver
        from rawgraph import Stream
        kept = Stream()  # closed by its finalizer at exit, still capturing
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        assert driver.cuStreamBeginCapture(kept.handle, mode) == (driver.CUresult.CUDA_SUCCESS,)
        real = driver.cuStreamEndCapture

        def failing_end(handle):
            real(handle)
            os.write(1, b"ended\\n")  # print() may be gone this late
            return driver.CUresult.CUDA_ERROR_UNKNOWN, None

        driver.cuStreamEndCapture = failing_end
        print("ok", flush=True)
    """)
    r = subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120, cwd=TESTS.parent
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert r.stdout.split() == ["ok", "ended"], r.stdout  # the capture was ended at exit, not skipped
