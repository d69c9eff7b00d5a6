"""An NCCL communicator through CuPy's binding (``cupy.cuda.nccl``), usable inside rawgraph captures.

Why CuPy's binding: CuPy is already a core dependency of rawgraph, and ``cupy.cuda.nccl`` (present
in CuPy 14) wraps ``ncclGetUniqueId``, ``ncclCommInitRank``, ``ncclAllReduce`` and
``ncclCommDestroy``; the only thing it needs is the NCCL library itself, which CuPy 14's PyPI
wheels load from the ``nvidia-nccl-cu13`` wheel (``pip install "nvidia-nccl-cu13>=2.27.7,<3"``,
the ``multi`` extra of rawgraph). No new Python package, no NCCL build. ``ncclMemAlloc`` and
``ncclCommRegister``, which CuPy does not wrap, are called through ``ctypes`` on the same library.

In a graph
----------
:meth:`NcclComm.all_reduce` launches ``ncclAllReduce`` on a rawgraph :class:`~rawgraph.Stream`'s
handle. Inside a :class:`~rawgraph.Capture` the driver records NCCL's kernel (or, on one rank, a
memcpy) as a node rawgraph did not record: ``graph.foreign_nodes``. Replaying the graph replays
the collective, which makes every launch of the exec a collective: every rank must launch its
exec the same number of times, in the same order as its other collectives. The exec-update
manager pins the buffers those nodes hold (``rawgraph.updates.addresses.foreign_holders``): a
bind that would move them raises :class:`~rawgraph.runtime.errors.ForeignNodeError`, because
NCCL's node would keep the old address (and on other ranks NCCL may have registered it).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from ..runtime.device import Device, get_device
from ..runtime.errors import RawgraphError
from ..runtime.memory import DeviceArray, as_device_array
from ..runtime.resource import Resource
from ..runtime.stream import stream_handle
from .launch import RankEnv, Rendezvous

NCCL_PIP = 'pip install "nvidia-nccl-cu13>=2.27.7,<3"  (or: pip install "rawgraph[multi]")'
UNIQUE_ID_BYTES = 128


class NcclUnavailableError(RawgraphError, ImportError):
    """NCCL cannot be loaded (``cupy.cuda.nccl.available`` is False): install the NCCL wheel."""


class NcclError(RawgraphError, RuntimeError):
    """An NCCL call failed (the message names the call and NCCL's error string)."""


def nccl_module() -> Any:
    """``cupy.cuda.nccl`` once NCCL is loaded, else :class:`NcclUnavailableError` with the fix."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CuPy warns on import when the library is missing
            from cupy.cuda import nccl
    except Exception as exc:  # CuPy itself missing or broken
        raise NcclUnavailableError(f"cupy.cuda.nccl cannot be imported ({exc}); {NCCL_PIP}") from exc
    if not getattr(nccl, "available", False) or not hasattr(nccl, "NcclCommunicator"):
        raise NcclUnavailableError(f"CuPy found no NCCL library; {NCCL_PIP}")
    return nccl


def nccl_available() -> tuple[bool, str]:
    """(True, version) or (False, why): for tests and benchmarks to skip cleanly."""
    try:
        nccl = nccl_module()
    except NcclUnavailableError as exc:
        return False, str(exc)
    try:
        return True, str(nccl.get_version())
    except Exception:
        return True, "unknown"


def unique_id_to_bytes(uid: Any) -> bytes:
    """CuPy's unique id (bytes in CuPy 14; a tuple of 128 signed C ``char`` values before) as 128 bytes."""
    vals = [int(v) % 256 for v in uid]
    if len(vals) != UNIQUE_ID_BYTES:
        raise NcclError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(vals)}")
    return bytes(vals)


def unique_id_from_bytes(data: bytes) -> tuple[int, ...]:
    """128 bytes back to CuPy's form (signed ``char`` values)."""
    if len(data) != UNIQUE_ID_BYTES:
        raise NcclError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(data)}")
    return tuple(int(v) for v in np.frombuffer(bytes(data), dtype=np.int8))


def _libnccl() -> ctypes.CDLL | None:
    """The NCCL library CuPy loaded (the wheel's copy, else the system's), for the calls CuPy does
    not wrap; None when it cannot be found."""
    candidates = []
    try:
        import nvidia.nccl  # the nvidia-nccl-cu13 wheel

        for base in getattr(nvidia.nccl, "__path__", []):
            candidates.append(os.path.join(base, "lib", "libnccl.so.2"))
    except ImportError:
        pass
    candidates.append("libnccl.so.2")
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _destroy(comm: Any) -> None:
    comm.destroy()


class NcclComm(Resource):
    """One rank's NCCL communicator (``ncclCommInitRank``), destroyed by ``close()``
    (``ncclCommDestroy``; safe twice).

    Parameters
    ----------
    rank, world : int
    unique_id : bytes
        The 128-byte id from rank 0's ``ncclGetUniqueId``, the same on every rank.
    device : Device, optional
        Made current first: NCCL binds the communicator to the CUDA runtime's current device,
        rawgraph's primary context on that device.

    Use :meth:`from_env` in a launched rank, :meth:`single` for a one-rank communicator.
    """

    nccl: Any
    rank: int
    world: int
    device: Device

    def __init__(self, rank: int, world: int, unique_id: bytes, device: Device | None = None):
        self.nccl = nccl_module()
        self.rank, self.world = int(rank), int(world)
        self.device = (device or get_device()).activate()
        import cupy

        cupy.cuda.runtime.setDevice(self.device.ordinal)
        uid = bytes(unique_id)
        if len(uid) != UNIQUE_ID_BYTES:
            raise NcclError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        try:
            try:
                # CuPy 14 takes the id as bytes; older CuPy as a tuple of signed chars. A wrong
                # form is a TypeError of the argument check, raised before NCCL is called.
                comm = self.nccl.NcclCommunicator(self.world, uid, self.rank)
            except TypeError:
                comm = self.nccl.NcclCommunicator(self.world, unique_id_from_bytes(uid), self.rank)
        except Exception as exc:
            raise NcclError(f"ncclCommInitRank (rank {self.rank} of {self.world}) failed: {exc}") from exc
        self._comm = comm
        self._own(_destroy, comm, name="ncclCommDestroy")

    @staticmethod
    def new_unique_id() -> bytes:
        """``ncclGetUniqueId`` as 128 bytes (rank 0 makes it; it names rank 0's bootstrap socket)."""
        return unique_id_to_bytes(nccl_module().get_unique_id())

    @classmethod
    def from_env(
        cls, env: RankEnv | None = None, device: Device | None = None, rendezvous: Rendezvous | None = None
    ) -> NcclComm:
        """The communicator of a rank started by ``python -m rawgraph.multi`` (or torchrun): rank 0
        makes the unique id and publishes it; the others read it from the rendezvous folder."""
        env = env or RankEnv.from_environ()
        device = device or get_device(env.device)
        if env.world == 1:
            return cls(0, 1, cls.new_unique_id(), device)
        rdzv = rendezvous or env.rendezvous_for()
        uid = rdzv.broadcast("nccl_id", cls.new_unique_id() if env.rank == 0 else None)
        return cls(env.rank, env.world, uid, device)

    @classmethod
    def single(cls, device: Device | None = None) -> NcclComm:
        """A one-rank communicator (the single-GPU tests)."""
        return cls(0, 1, cls.new_unique_id(), device)

    @property
    def handle(self) -> int:
        """The ``ncclComm_t`` as an integer (for ``ncclCommRegister``)."""
        return int(self._comm.comm)

    def all_reduce(self, send: Any, recv: Any, stream: Any) -> None:
        """``ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream)`` on ``stream``'s
        handle: eager, or recorded into the stream's capture as a foreign node.

        ``send`` and ``recv`` are float32 device arrays of one size (the same on every rank);
        ``recv`` may be ``send`` (in place). A one-rank communicator copies (a memcpy node) or,
        in place, does nothing at all.
        """
        self._check_open()
        s, r = as_device_array(send, "send"), as_device_array(recv, "recv")
        if s.dtype != np.float32 or r.dtype != np.float32:
            raise NcclError(f"all_reduce sums float32 buffers, got {s.dtype} and {r.dtype}")
        if s.size != r.size:
            raise NcclError(f"send has {s.size} elements, recv {r.size}")
        try:
            self._comm.allReduce(
                s.ptr, r.ptr, s.size, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, int(stream_handle(stream))
            )
        except Exception as exc:
            raise NcclError(f"ncclAllReduce ({s.size} floats, rank {self.rank}) failed: {exc}") from exc

    def check_async_error(self) -> None:
        """``ncclCommGetAsyncError``: a failure of an enqueued collective (a peer gone)."""
        self._check_open()
        try:
            self._comm.check_async_error()
        except Exception as exc:
            raise NcclError(f"NCCL reports an asynchronous error on rank {self.rank}: {exc}") from exc

    def abort(self) -> None:
        """``ncclCommAbort``: stop whatever this communicator has queued (a peer died); then closed."""
        if self._finalizer.alive:
            self._finalizer.detach()
            self._comm.abort()

    def __repr__(self) -> str:
        return f"<NcclComm rank {self.rank} of {self.world}{' closed' if self.closed else ''}>"


def _free_nccl(lib: Any, comm: Any, reg: int, ptr: int) -> None:
    if reg:
        lib.ncclCommDeregister(ctypes.c_void_p(comm.handle), ctypes.c_void_p(reg))
    lib.ncclMemFree(ctypes.c_void_p(ptr))


class NcclBuffer(Resource):
    """Device memory for collectives: ``ncclMemAlloc`` (cuMem memory NCCL can map into peers and
    capture without copies), registered with the communicator (``ncclCommRegister``) unless
    ``register=False``. ``close()``: ``ncclCommDeregister`` + ``ncclMemFree`` (safe twice); the
    communicator must still be open then (the buffer holds it).

    Every rank allocates its collective buffers in the same order and sizes, so NCCL's
    registration (and a graph's registered addresses) line up across ranks.
    """

    shape: tuple[int] | tuple[int, ...]
    nbytes: int
    registered: bool

    def __init__(self, comm: NcclComm, shape: int | tuple[int, ...], register: bool = True):
        comm._check_open()
        lib = _libnccl()
        if lib is None or not hasattr(lib, "ncclMemAlloc"):
            raise NcclUnavailableError(f"ncclMemAlloc not found in the NCCL library; {NCCL_PIP}")
        self.comm = comm
        self.shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        self.dtype = np.dtype(np.float32)
        self.nbytes = int(np.prod(self.shape)) * 4
        ptr = ctypes.c_void_p()
        rc = lib.ncclMemAlloc(ctypes.byref(ptr), ctypes.c_size_t(self.nbytes))
        if rc != 0 or not ptr.value:
            raise NcclError(f"ncclMemAlloc({self.nbytes}) failed: ncclResult {rc}")
        reg = ctypes.c_void_p()
        if register:
            rc = lib.ncclCommRegister(
                ctypes.c_void_p(comm.handle), ptr, ctypes.c_size_t(self.nbytes), ctypes.byref(reg)
            )
            if rc != 0:
                lib.ncclMemFree(ptr)
                raise NcclError(f"ncclCommRegister({self.nbytes} bytes) failed: ncclResult {rc}")
        self._ptr = int(ptr.value)
        self.registered = bool(reg.value)
        self._own(_free_nccl, lib, comm, int(reg.value or 0), self._ptr, name="ncclMemFree")

    @property
    def ptr(self) -> int:
        self._check_open()
        return self._ptr

    def view(self) -> DeviceArray:
        return DeviceArray(self.ptr, self.shape, self.dtype, self)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": "<f4", "data": (self.ptr, False), "version": 3, "strides": None}

    def __repr__(self) -> str:
        return f"<NcclBuffer {self.shape} float32{' registered' if self.registered else ''}>"


__all__ = [
    "NCCL_PIP",
    "NcclBuffer",
    "NcclComm",
    "NcclError",
    "NcclUnavailableError",
    "nccl_available",
    "nccl_module",
    "unique_id_from_bytes",
    "unique_id_to_bytes",
]
