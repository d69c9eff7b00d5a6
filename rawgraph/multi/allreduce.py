"""rawgraph's own one-shot all-reduce for small messages, over CUDA IPC peer mappings.

Each rank owns a data buffer (the partial sum ``z_r`` is written straight into it) and a signal
buffer (barrier flags and epochs), both ``cuMemAlloc``. Their IPC handles
(``cuIpcGetMemHandle``, 64 bytes each) go to every other rank through the launcher's rendezvous
folder; each rank maps its peers' buffers (``cuIpcOpenMemHandle`` with
``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS``) and uploads two tables of device pointers, one entry per
rank. ``kernels/allreduce.cu`` (``rg_allreduce_oneshot``) then sums every rank's data into a
local ``out`` in one kernel, with a flag barrier before (peers' data ready) and after (no rank
overwrites its data while a peer reads it) and a per-block epoch counter on the device, so the
same captured node replays any number of times with unchanged arguments.

Why ``cuIpcGetMemHandle`` rather than ``cuMemCreate`` + ``cuMemExportToShareableHandle`` (POSIX
fd) + ``cuMemImportFromShareableHandle`` + ``cuMemMap``/``cuMemSetAccess``: the legacy IPC handle
is 64 plain bytes, so it travels through the same rendezvous files as the NCCL id, while a file
descriptor needs a Unix socket (``socket.send_fds``) between every pair of ranks and a
granularity-aligned reservation per peer; the one-shot kernel needs nothing the cuMem path adds
(multicast objects, NVLS). The cost: IPC needs every rank's GPU visible in each process (the
launcher keeps them visible unless ``--isolate``) and peer access between the GPUs.

The launch is made straight on the stream (``cuLaunchKernel``), not through
:meth:`Capture.launch <rawgraph.graphs.capture.Capture.launch>`: inside a capture it becomes a
foreign node, like NCCL's. The exec-update manager therefore pins the data buffer and ``out``
(their addresses are the kernel's arguments): moving the data buffer would leave the peers reading
the old one, which no update on this rank can fix.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from cuda.bindings import driver

from ..runtime import resource as _resource
from ..runtime.device import Device, get_device
from ..runtime.errors import RawgraphError, ShapeError, call
from ..runtime.launch import KernelArgs, Launch
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from ..runtime.module import get_kernel
from ..runtime.resource import Resource
from ..runtime.stream import Stream
from .launch import Rendezvous

MAX_WORLD = 8  # RG_AR_MAX_WORLD in kernels/allreduce.cu
THREADS = 512
IPC_HANDLE_BYTES = 64
DEFAULT_TIMEOUT_NS = 10_000_000_000  # a peer 10 s late is dead: the kernel gives up and flags it
_made = 0  # PeerAllReduce objects made with peers in this process (names their rendezvous key)


class PeerAllReduceError(RawgraphError, RuntimeError):
    """The one-shot all-reduce was refused (world too large, message too big) or a barrier timed
    out on the device (a peer never arrived)."""


def signal_words(max_blocks: int) -> int:
    """uint32 words of one signal buffer: start and end flags per (block, rank), an epoch per
    block, one error word (the layout ``kernels/allreduce.cu`` reads)."""
    return 2 * max_blocks * MAX_WORLD + max_blocks + 1


def _handle_bytes(h: Any) -> bytes:
    """The 64 bytes of a ``CUipcMemHandle`` (cuda.bindings 13 exposes no field: read its memory)."""
    return ctypes.string_at(h.getPtr(), IPC_HANDLE_BYTES)


def _handle_from_bytes(raw: bytes) -> Any:
    """A ``CUipcMemHandle`` holding ``raw`` (written into the struct's own memory)."""
    if len(raw) != IPC_HANDLE_BYTES:
        raise PeerAllReduceError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(raw)}")
    h = driver.CUipcMemHandle()
    ctypes.memmove(h.getPtr(), raw, IPC_HANDLE_BYTES)
    return h


def _release(opened: list[int], owned: list[DeviceBuffer]) -> None:
    for ptr in opened:
        _resource.release("cuIpcCloseMemHandle", driver.cuIpcCloseMemHandle, driver.CUdeviceptr(ptr))
    for buf in owned:
        buf.close()


class PeerAllReduce(Resource):
    """A one-shot sum over ``world`` ranks' peer-mapped buffers (see the module docstring).

    Parameters
    ----------
    rank, world : int
    capacity : int
        Floats the data buffer holds (the largest message).
    rendezvous : Rendezvous or None
        The launch's rendezvous (None only for one rank).
    device : Device, optional
    max_blocks : int, default 2 * multiprocessors (at most)
        The grid of every launch; the same on every rank.

    Attributes
    ----------
    data : DeviceArray
        This rank's buffer, ``(capacity,)`` float32: write the partial sum here.

    ``close()`` waits for every rank at a barrier (so no peer still reads this rank's memory),
    then closes the peer mappings (``cuIpcCloseMemHandle``) and frees its buffers (``cuMemFree``);
    safe twice.
    """

    rank: int
    world: int
    capacity: int
    device: Device
    max_blocks: int
    timeout_ns: int

    def __init__(
        self,
        rank: int,
        world: int,
        capacity: int,
        rendezvous: Rendezvous | None = None,
        device: Device | None = None,
        max_blocks: int | None = None,
        timeout_ns: int = DEFAULT_TIMEOUT_NS,
    ):
        if not 1 <= world <= MAX_WORLD:
            raise PeerAllReduceError(f"the one-shot all-reduce handles 1 to {MAX_WORLD} ranks, got {world}")
        if world > 1 and rendezvous is None:
            raise PeerAllReduceError("more than one rank needs the launch's Rendezvous to swap IPC handles")
        if capacity < 1:
            raise ShapeError(f"capacity must be >= 1 float, got {capacity}")
        self.rank, self.world, self.capacity = int(rank), int(world), int(capacity)
        self.device = (device or get_device()).activate()
        self.max_blocks = int(max_blocks or min(2 * self.device.info.multiprocessors, 264))
        self.timeout_ns = int(timeout_ns)
        self._rdzv = rendezvous
        opened: list[int] = []
        owned: list[DeviceBuffer] = []
        self._own(_release, opened, owned, name="cuIpcCloseMemHandle/cuMemFree (peer all-reduce)")
        words = signal_words(self.max_blocks)
        self._data = DeviceBuffer((self.capacity,), np.float32, self.device)
        owned.append(self._data)
        self._signal = DeviceBuffer.from_numpy(np.zeros(words, np.uint32), self.device)
        owned.append(self._signal)
        data_ptrs, signal_ptrs = [self._data.ptr], [self._signal.ptr]
        if world > 1:
            assert rendezvous is not None
            mine = self._handle(self._data.ptr) + self._handle(self._signal.ptr)
            # A key every rank computes alike: the n-th PeerAllReduce of this process (ranks make them in step).
            global _made
            _made += 1
            handles = rendezvous.all_gather(f"ipc-{_made}-{self.capacity}", mine)
            data_ptrs, signal_ptrs = [], []
            for r, blob in enumerate(handles):
                if r == self.rank:
                    data_ptrs.append(self._data.ptr)
                    signal_ptrs.append(self._signal.ptr)
                    continue
                for half, dst in ((blob[:IPC_HANDLE_BYTES], data_ptrs), (blob[IPC_HANDLE_BYTES:], signal_ptrs)):
                    h = _handle_from_bytes(half)
                    flag = driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
                    ptr = int(call(driver.cuIpcOpenMemHandle, h, int(flag)))
                    opened.append(ptr)
                    dst.append(ptr)
            # Every signal buffer zeroed (above, before the handles left) before anyone signals.
            rendezvous.barrier("ipc-ready")
        self._tables = [DeviceBuffer.from_numpy(np.array(p, np.uint64), self.device) for p in (data_ptrs, signal_ptrs)]
        owned.extend(self._tables)
        self._kernel = get_kernel("allreduce", "rg_allreduce_oneshot", self.device)
        self._launches: dict[tuple[int, int], Launch] = {}

    @staticmethod
    def _handle(ptr: int) -> bytes:
        h = call(driver.cuIpcGetMemHandle, driver.CUdeviceptr(ptr))
        raw = _handle_bytes(h)
        if len(raw) != IPC_HANDLE_BYTES:
            raise PeerAllReduceError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(raw)}")
        return raw

    @property
    def data(self) -> DeviceArray:
        self._check_open()
        return DeviceArray(self._data.ptr, (self.capacity,), np.dtype(np.float32), self._data)

    def data_view(self, shape: tuple[int, ...]) -> DeviceArray:
        """The first ``prod(shape)`` floats of the data buffer as an array of ``shape``."""
        n = int(np.prod(shape))
        if n > self.capacity:
            raise ShapeError(f"{shape} needs {n} floats; the data buffer holds {self.capacity}")
        return DeviceArray(self._data.ptr, tuple(int(s) for s in shape), np.dtype(np.float32), self._data)

    def launch_for(self, n: int, out: Any) -> Launch:
        """The (persistent) launch summing the first ``n`` floats of every rank's data into ``out``."""
        self._check_open()
        oa = as_device_array(out, "out")
        check_array(oa, oa.shape, np.float32, "out", self.device)
        if not 1 <= n <= self.capacity or oa.size < n:
            raise ShapeError(f"n = {n} must be in [1, {self.capacity}] and fit out ({oa.size} floats)")
        key = (int(n), oa.ptr)
        launch = self._launches.get(key)
        if launch is None:
            args = KernelArgs(
                [
                    ("peer_data", "ptr"),
                    ("peer_signal", "ptr"),
                    ("out", "ptr"),
                    ("n", "i64"),
                    ("rank", "i32"),
                    ("world", "i32"),
                    ("max_blocks", "i32"),
                    ("timeout_us", "u32"),
                ]
            )
            args.update(
                {
                    "peer_data": self._tables[0].ptr,
                    "peer_signal": self._tables[1].ptr,
                    "out": oa.ptr,
                    "n": int(n),
                    "rank": self.rank,
                    "world": self.world,
                    "max_blocks": self.max_blocks,
                    "timeout_us": min(max(1, -(-self.timeout_ns // 1000)), 2**32 - 1),
                }
            )
            launch = Launch(self._kernel, (self.max_blocks, 1, 1), (THREADS, 1, 1), args, {}, 0, "allreduce_oneshot")
            self._launches[key] = launch
        return launch

    def __call__(self, n: int, out: Any, stream: Any) -> None:
        """Sum ``n`` floats over the ranks into ``out`` on ``stream`` (``cuLaunchKernel``; a foreign
        node when the stream captures). Every rank must make the same call, in the same order."""
        self.launch_for(n, out)(stream)

    def error(self, stream: Stream | None = None) -> bool:
        """Whether a barrier on this rank ever timed out (the device's error word)."""
        self._check_open()
        words = self._signal.to_numpy(stream)
        return bool(words[-1])

    def close(self) -> None:
        """Barrier with every rank (best effort: a dead peer cannot answer), then release."""
        if self._finalizer.alive and self.world > 1 and self._rdzv is not None:
            try:
                self._rdzv.barrier("ipc-close", timeout=30.0)
            except RawgraphError:
                pass  # a peer is gone: nothing reads our memory any more
        self._finalizer()

    def __repr__(self) -> str:
        return f"<PeerAllReduce rank {self.rank} of {self.world}, {self.capacity} floats{' closed' if self.closed else ''}>"
