"""Streams and events (``cuStreamCreate``, ``cuEventCreate``)."""

from __future__ import annotations

from cuda.bindings import driver

from .device import Device, get_device
from .errors import call, cuda_error
from .resource import Resource

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY


class Stream(Resource):
    """A CUDA stream owned by this object (``cuStreamCreate`` / ``cuStreamDestroy``).

    Non-blocking by default (``CU_STREAM_NON_BLOCKING``): it does not synchronise with the legacy
    NULL stream, which is also what stream capture needs. :meth:`legacy` gives a non-owning handle
    to the legacy stream itself (never capturable).

    Parameters
    ----------
    non_blocking : bool, default True
    device : Device, optional
    """

    def __init__(self, non_blocking: bool = True, device: Device | None = None):
        self.device = (device or get_device()).activate()
        flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else driver.CUstream_flags.CU_STREAM_DEFAULT
        self.handle = call(driver.cuStreamCreate, int(flags))
        self.non_blocking = non_blocking
        self.is_legacy = False
        self._own(driver.cuStreamDestroy, self.handle)

    @classmethod
    def legacy(cls, device: Device | None = None) -> "Stream":
        """The legacy NULL stream (handle 0). Not owned; ``close()`` does nothing."""
        self = cls.__new__(cls)
        self.device = device or get_device()
        self.handle = driver.CUstream(0)
        self.non_blocking = False
        self.is_legacy = True
        self._own(lambda: None)
        return self

    def synchronize(self) -> None:
        """Block until all work on the stream is done (``cuStreamSynchronize``)."""
        self._check_open()
        call(driver.cuStreamSynchronize, self.handle)

    def query(self) -> bool:
        """True when all work on the stream is done (``cuStreamQuery``)."""
        self._check_open()
        (err,) = driver.cuStreamQuery(self.handle)
        if err == _NOT_READY:
            return False
        if err != _SUCCESS:
            raise cuda_error(err, "cuStreamQuery")
        return True

    def wait(self, event: "Event") -> None:
        """Make later work on this stream wait for ``event`` (``cuStreamWaitEvent``)."""
        self._check_open()
        call(driver.cuStreamWaitEvent, self.handle, event.handle, 0)

    def is_capturing(self) -> bool:
        """``cuStreamIsCapturing`` != NONE."""
        status = call(driver.cuStreamIsCapturing, self.handle)
        return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE

    def __int__(self) -> int:
        return int(self.handle)

    def __repr__(self) -> str:
        kind = "legacy" if self.is_legacy else ("non-blocking" if self.non_blocking else "blocking")
        return f"<Stream {kind} 0x{int(self.handle):x}>"


class Event(Resource):
    """A CUDA event (``cuEventCreate`` / ``cuEventDestroy``); timing on unless ``timing=False``."""

    def __init__(self, timing: bool = True, device: Device | None = None):
        (device or get_device()).activate()
        flags = 0 if timing else int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.handle = call(driver.cuEventCreate, flags)
        self._own(driver.cuEventDestroy, self.handle)

    def record(self, stream: Stream) -> "Event":
        """``cuEventRecord`` on ``stream``."""
        call(driver.cuEventRecord, self.handle, stream.handle)
        return self

    def synchronize(self) -> None:
        call(driver.cuEventSynchronize, self.handle)

    def query(self) -> bool:
        """True once the work before the record has finished (``cuEventQuery``)."""
        (err,) = driver.cuEventQuery(self.handle)
        if err == _NOT_READY:
            return False
        if err != _SUCCESS:
            raise cuda_error(err, "cuEventQuery")
        return True

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (``cuEventElapsedTime``; both recorded, ~0.5 us resolution)."""
        return float(call(driver.cuEventElapsedTime, self.handle, end.handle))
