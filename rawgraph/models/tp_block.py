"""The TinyBlock split over ranks (Megatron style), its all-reduce inside the graph.

Rank ``r`` of ``world`` holds ``W1[:, cols_r]`` and ``W2[rows_r, :]`` (:mod:`rawgraph.multi.split`)
and runs, per step::

    a    = relu(x @ W1_r)          matmul with the relu epilogue   (rawgraph node)
    z    = a @ W2_r                matmul                           (rawgraph node)
    zsum = all_reduce_sum(z)       NCCL or the one-shot kernel      (foreign node)
    out  = zsum + x                add                              (rawgraph node)

Every rank makes the full weights from the same seed (``kernels/init.cu``, as
:class:`~rawgraph.models.tinyblock.BlockWeights`) and keeps its shard, so the sum over ranks
equals the one-GPU block up to float rounding. The all-reduce is out of place (``z`` -> ``zsum``):
on one rank NCCL then records a copy (an in-place one-rank all-reduce records nothing), so the
single-GPU graph has the same shape as the multi-GPU one.

New inputs reach a replay through rawgraph's own nodes: ``x`` is read only by the two recorded
launches, so :class:`~rawgraph.updates.manager.ExecUpdateManager` rebinds it; ``z`` and ``zsum``
are held by the collective's node, so a bind that moves them is refused
(:class:`~rawgraph.runtime.errors.ForeignNodeError`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..graphs.capture import Capture
from ..graphs.graph import Graph
from ..multi.split import Shard, block_forward, shard_weights, shards
from ..runtime.device import Device, get_device
from ..runtime.errors import ShapeError
from ..runtime.launch import LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from ..runtime.resource import Resource
from ..runtime.stream import Stream
from .tinyblock import BlockWeights

ALLREDUCE_KINDS = ("nccl", "custom")


def _close_all(owned: list) -> None:
    for obj in reversed(owned):
        obj.close()


class TPBlock(Resource):
    """One rank's part of a ``width``-wide block for batches of ``batch`` rows.

    Parameters
    ----------
    width, batch : int
    rank, world : int
    allreduce : {"nccl", "custom"}
        ``"nccl"``: ``comm`` (a :class:`~rawgraph.multi.comm.NcclComm`) sums ``z`` into ``zsum``
        (both :class:`~rawgraph.multi.comm.NcclBuffer`, registered); ``"custom"``: ``peer`` (a
        :class:`~rawgraph.multi.allreduce.PeerAllReduce` with room for ``batch * width`` floats)
        does, ``z`` being its peer-mapped data buffer.
    comm, peer : optional
        The collective for ``allreduce`` (owned by the caller; close the block first).
    seed : int, default 0
    device : Device, optional
    policy : {"even", "uneven"}
        How the hidden width splits (:func:`rawgraph.multi.split.shards`, units of 4 floats).
    precision : {"auto", "fp32", "tf32x3"}, default "auto"
        The shard matmuls' arithmetic (:class:`~rawgraph.TinyBlock`'s ``precision``; ``"auto"``
        runs fp32 on a shard narrower than the width, a product it was not measured on).

    ``close()`` frees the shards and scratch (``cuMemFree`` / ``ncclMemFree``); safe twice.

    See Also
    --------
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html

    Notes
    -----
    State: 18 instance attributes: the configuration (width, batch, rank, world, seed, shard,
    precision), the collective it was given (allreduce, comm, peer), the device buffers of its plan
    (w1, w2, a, z, zsum) and the full weights on the host for :meth:`reference`. Everything that
    needs releasing is in one holder (the owned list its finalizer frees).
    """

    width: int
    batch: int
    rank: int
    world: int
    comm: Any
    peer: Any
    seed: int
    device: Device
    w1: DeviceBuffer
    w2: DeviceBuffer
    a: DeviceBuffer
    z: DeviceArray
    zsum: DeviceArray
    precision: str

    def __init__(
        self,
        width: int,
        batch: int,
        rank: int,
        world: int,
        allreduce: str = "nccl",
        comm: Any = None,
        peer: Any = None,
        seed: int = 0,
        device: Device | None = None,
        policy: str = "even",
        precision: str = "auto",
    ):
        ops.check_precision(precision)
        if allreduce not in ALLREDUCE_KINDS:
            raise ValueError(f"allreduce must be one of {ALLREDUCE_KINDS}, got {allreduce!r}")
        if allreduce == "nccl" and comm is None:
            raise ValueError("allreduce='nccl' needs comm (rawgraph.multi.comm.NcclComm)")
        if allreduce == "custom" and peer is None:
            raise ValueError("allreduce='custom' needs peer (rawgraph.multi.allreduce.PeerAllReduce)")
        for name, v in (("width", width), ("batch", batch)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ShapeError(f"{name} must be an int >= 1, got {v!r}")
        self.width, self.batch, self.rank, self.world = int(width), int(batch), int(rank), int(world)
        self.allreduce, self.comm, self.peer, self.seed = allreduce, comm, peer, int(seed)
        self.precision = precision
        self.device = (device or get_device()).activate()
        self.shard: Shard = shards(self.width, self.world, policy, multiple=4)[self.rank]
        owned: list[Any] = []
        self._own(_close_all, owned, name="cuMemFree (tensor-parallel block)")
        full = BlockWeights(self.width, 1, self.seed, self.device)
        try:
            self._w1_full, self._w2_full = full.numpy()[0]
        finally:
            full.close()
        w1r, w2r = shard_weights(self._w1_full, self._w2_full, self.shard)
        self.w1 = DeviceBuffer.from_numpy(w1r, self.device)
        self.w2 = DeviceBuffer.from_numpy(w2r, self.device)
        self.a = DeviceBuffer((self.batch, self.shard.size), np.float32, self.device)
        owned.extend([self.w1, self.w2, self.a])
        shape = (self.batch, self.width)
        if allreduce == "nccl":
            from ..multi.comm import NcclBuffer

            zb, sb = NcclBuffer(comm, shape), NcclBuffer(comm, shape)
            owned.extend([zb, sb])
            self.z, self.zsum = zb.view(), sb.view()
        else:
            self.z = peer.data_view(shape)
            zs = DeviceBuffer(shape, np.float32, self.device)
            owned.append(zs)
            self.zsum = zs.view()

    # -- plans ----------------------------------------------------------------------------
    def plans(self, x: Any, out: Any) -> tuple[LaunchPlan, LaunchPlan]:
        """(before the all-reduce, after it): ``[matmul_relu, matmul]`` and ``[add]``."""
        self._check_open()
        shape = (self.batch, self.width)
        xa = check_array(as_device_array(x, "x"), shape, np.float32, "x", self.device)
        oa = check_array(as_device_array(out, "out"), shape, np.float32, "out", self.device)
        bufs: dict[str, DeviceArray] = {
            "x": xa,
            "out": oa,
            "W1r": self.w1.view(),
            "W2r": self.w2.view(),
            "a": self.a.view(),
            "z": self.z,
            "zsum": self.zsum,
        }
        dev = self.device
        first = LaunchPlan(
            [
                ops.matmul(dev, bufs, "x", "W1r", "a", "relu", label="tp.matmul_relu", precision=self.precision),
                ops.matmul(dev, bufs, "a", "W2r", "z", label="tp.matmul2", precision=self.precision),
            ],
            {k: bufs[k] for k in ("x", "W1r", "a", "W2r", "z")},
            ("x",),
            ("z",),
            [self._finalizer],
        )
        second = LaunchPlan(
            [ops.add(dev, bufs, "zsum", "x", "out", label="tp.add")],
            {k: bufs[k] for k in ("zsum", "x", "out")},
            ("x", "zsum"),
            ("out",),
            [self._finalizer],
        )
        return first, second

    def _reduce(self, stream: Any) -> None:
        if self.allreduce == "nccl":
            self.comm.all_reduce(self.z, self.zsum, stream)
        else:
            self.peer(self.batch * self.width, self.zsum, stream)

    def forward(self, x: Any, out: Any, stream: Stream) -> None:
        """Eager: two launches, the all-reduce, one launch (every rank must call it in step)."""
        first, second = self.plans(x, out)
        first.run(stream)
        self._reduce(stream)
        second.run(stream)

    def capture(self, x: Any, out: Any, stream: Stream, warmup: bool = True) -> Graph:
        """The step as one graph: rawgraph's launches recorded, the all-reduce a foreign node.

        ``warmup`` runs one eager step first and waits for it: NCCL's first collective on a
        communicator sets up connections and may allocate, which a global-mode capture forbids.
        """
        first, second = self.plans(x, out)
        if warmup:
            self.forward(x, out, stream)
            stream.synchronize()
        with Capture(stream) as cap:
            cap.run(first)
            self._reduce(stream)
            cap.run(second)
        assert cap.graph is not None
        return cap.graph

    # -- reference ------------------------------------------------------------------------
    def reference(self, x: np.ndarray) -> np.ndarray:
        """The one-GPU block in float64 on this rank's copy of the full weights."""
        return block_forward(x, self._w1_full, self._w2_full)

    def close(self) -> None:
        self._finalizer()

    def __repr__(self) -> str:
        return (
            f"<TPBlock width={self.width} batch={self.batch} rank {self.rank}/{self.world} "
            f"hidden[{self.shard.start}:{self.shard.stop}] {self.allreduce}>"
        )
