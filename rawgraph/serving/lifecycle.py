"""Set-up and tear-down shared by the serving objects (bucket graphs, row-count buckets, slots).

Each of them captures one graph per size, instantiates and uploads it while timing every phase,
and at the end closes its execs, graphs, models and buffers in that order (an exec before the
graph it came from, both before the memory their nodes name).
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from ..graphs.graph import Graph, GraphExec
from ..runtime.stream import Stream


def instantiate_uploaded(graph: Graph, stream: Stream, setup: dict[str, float]) -> GraphExec:
    """``cuGraphInstantiate`` then ``cuGraphUpload`` on ``stream`` and a synchronize, so the first
    replay pays neither; the seconds each took are added to ``setup["instantiate"]`` and
    ``setup["upload"]``."""
    clock = time.perf_counter
    t0 = clock()
    exe = graph.instantiate()
    setup["instantiate"] += clock() - t0
    t0 = clock()
    exe.upload(stream)
    stream.synchronize()
    setup["upload"] += clock() - t0
    return exe


def close_all(*groups: Iterable[Any]) -> None:
    """``close()`` every object of every group, in order, skipping ``None``."""
    for group in groups:
        for obj in group:
            if obj is not None:
                obj.close()
