"""Past one GPU: the tensor-parallel split, the launcher, NCCL and a one-shot all-reduce in graphs.

Layer 4 (beside serving and control): imports runtime, ops, graphs and updates only. The
block built on it lives in :mod:`rawgraph.models.tp_block`. :mod:`.comm` (NCCL, through CuPy)
and :mod:`.allreduce` (CUDA IPC) are imported on demand: the launcher and the split arithmetic
need no GPU and no NCCL.
"""

from .launch import (
    LaunchError,
    LaunchInterrupted,
    RankEnv,
    RankFailedError,
    Rendezvous,
    RendezvousError,
    heartbeat,
    launch,
)
from .split import Shard, block_forward, check_split, shards, split_forward

__all__ = [
    "LaunchError",
    "LaunchInterrupted",
    "RankEnv",
    "RankFailedError",
    "Rendezvous",
    "RendezvousError",
    "Shard",
    "block_forward",
    "check_split",
    "heartbeat",
    "launch",
    "shards",
    "split_forward",
]
