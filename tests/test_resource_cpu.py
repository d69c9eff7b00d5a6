"""Release calls: a failure is reported once with the call's name, quietly only at exit (no GPU)."""

import gc
import subprocess
import sys
import textwrap
import warnings

import pytest
from cuda.bindings import driver

from rawgraph.runtime.errors import ReleaseWarning
from rawgraph.runtime.resource import Resource


class Owner(Resource):
    def __init__(self, result=None, raises=None, name="cuFakeDestroy"):
        self.calls = calls = []

        def release():
            calls.append(1)
            if raises:
                raise raises
            return result

        self._own(release, name=name)


def test_a_failing_driver_release_warns_once_with_its_name():
    owner = Owner((driver.CUresult.CUDA_ERROR_INVALID_HANDLE,))
    with pytest.warns(ReleaseWarning, match="cuFakeDestroy failed.*CUDA_ERROR_INVALID_HANDLE"):
        owner.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        owner.close()  # released once: the second close does nothing
    assert owner.calls == [1] and owner.closed


def test_a_raising_release_warns_and_success_is_silent():
    with pytest.warns(ReleaseWarning, match="cuFakeDestroy failed.*boom"):
        Owner(raises=RuntimeError("boom")).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Owner((driver.CUresult.CUDA_SUCCESS,)).close()
        Owner(None).close()


def test_garbage_collection_reports_a_failed_release():
    owner = Owner((driver.CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.warns(ReleaseWarning, match="CUDA_ERROR_INVALID_VALUE"):
        del owner
        gc.collect()


def test_releases_at_interpreter_exit_are_quiet():
    code = textwrap.dedent(
        """
        from cuda.bindings import driver
        from rawgraph.runtime.resource import Resource
        class Owner(Resource):
            def __init__(self):
                self._own(lambda: (driver.CUresult.CUDA_ERROR_DEINITIALIZED,), name="cuFakeDestroy")
        kept = [Owner() for _ in range(3)]
        """
    )
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_release_during_an_open_capture_waits_for_its_end():
    # A finalizer can fire inside a capture body (garbage collection); cuMemFree there would fail
    # and invalidate the capture, so the release is held until the capture ends.
    from rawgraph.runtime import _capturing, resource

    calls = []
    rec = _capturing.CaptureRecord(0x1234, "GLOBAL")
    _capturing.begin(rec)
    try:
        resource.release("fake_free", lambda: calls.append("freed") or (driver.CUresult.CUDA_SUCCESS,))
        assert calls == [] and resource.flush_deferred() == 0  # still capturing: held
    finally:
        _capturing.end(rec)
    assert resource.flush_deferred() == 1 and calls == ["freed"]
    # a thread-local capture on another thread does not hold this thread's releases
    rec = _capturing.CaptureRecord(0x1234, "THREAD_LOCAL")
    rec.ident = -1
    _capturing.begin(rec)
    try:
        resource.release("fake_free", lambda: calls.append("now") or (driver.CUresult.CUDA_SUCCESS,))
        assert calls == ["freed", "now"]
    finally:
        _capturing.end(rec)


def test_a_release_run_inside_the_registries_locks_does_not_deadlock():
    """Garbage collection can start inside ``with _capturing._lock`` or ``with
    resource._deferred_lock`` and run a finalizer on the same thread: its release asks whether a
    capture forbids it (taking the first lock) and defers itself (taking the second). In a child
    process, so that a deadlock fails the test instead of hanging the session."""
    code = textwrap.dedent("""
        from rawgraph.runtime import _capturing, resource
        ran = []
        record = _capturing.CaptureRecord(0x1234, "GLOBAL")  # a global capture forbids every release
        _capturing.begin(record)
        with _capturing._lock:
            resource.release("first", ran.append, 1)
        with resource._deferred_lock:
            resource.release("second", ran.append, 2)
        assert ran == []
        _capturing.end(record)
        assert resource.flush_deferred() == 2 and ran == [1, 2]
        print("ok")
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a release inside the capture registry's or the deferred list's lock deadlocked")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
