"""Set-up and tear-down shared by the serving objects (bucket graphs, row-count buckets, slots).

Each of them runs a size's launches once eagerly before capturing them (only while they
launch a kernel function no earlier size did: :class:`WarmUp`), captures one graph per size,
instantiates and uploads it while timing every phase, and at the end closes its execs, graphs,
models and buffers in that order (an exec before the graph it came from, both before the memory
their nodes name). What a pool or a device-shaped graph must release sits in one :class:`Held`, whose
one finalizer closes it in that order whether the owner is closed or dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from ..graphs.graph import Graph, GraphExec
from ..runtime.launch import Launch
from ..runtime.resource import Resource
from ..runtime.stream import Stream

_T = TypeVar("_T")


class WarmUp:
    """The eager run before each size's capture, once per kernel function.

    An eager run before a capture loads what the launches need and touches their memory outside
    the capture, and a kernel function that faults on its first run does so before any graph holds
    it. A run whose kernel functions (``CUfunction`` handles) have all run before in this object
    loads nothing new, so it is skipped: the 35 sizes of vLLM's list launch only a few distinct
    GEMM cuts between them. A skipped size is captured without an eager run of its own (the same
    functions at its own grid and row count): a fault particular to that size shows at its first
    replay instead.

    Parameters
    ----------
    setup : dict of str to float
        Seconds spent in the runs that were made are added to ``setup["warmup"]``.

    Attributes
    ----------
    runs, skipped : int
        How many calls ran their launches (and synchronized) and how many did not.
    """

    runs: int
    skipped: int

    def __init__(self, setup: dict[str, float]):
        self.setup = setup
        self.setup.setdefault("warmup", 0.0)
        self._seen: set[int] = set()
        self.runs = 0
        self.skipped = 0

    def __call__(self, launches: Iterable[Launch], stream: Stream) -> bool:
        """Run ``launches`` on ``stream`` and synchronize, unless each one's ``kernel.handle``
        ran before; returns whether they ran."""
        todo = list(launches)
        new = {int(launch.kernel.handle) for launch in todo} - self._seen
        if not new:
            self.skipped += 1
            return False
        t0 = time.perf_counter()
        for launch in todo:
            launch(stream)
        stream.synchronize()
        self.setup["warmup"] += time.perf_counter() - t0
        self._seen |= new
        self.runs += 1
        return True


def instantiate_uploaded(graph: Graph, stream: Stream, setup: dict[str, float]) -> GraphExec:
    """``cuGraphInstantiate`` then ``cuGraphUpload`` on ``stream`` and a synchronize, so the first
    replay pays neither; the seconds each took are added to ``setup["instantiate"]`` and
    ``setup["upload"]``.

    See Also
    --------
    cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    cuGraphUpload : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
    """
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


def _close_groups(groups: Sequence[list[Any]], newest_first: bool) -> None:
    for group in groups:
        close_all(reversed(group) if newest_first else list(group))


class Held(Resource):
    """What one serving object made that needs releasing, and its one finalizer.

    The objects sit in groups (lists): :meth:`close`, dropping the holder, or interpreter exit
    closes every group in the order given, each group's objects in the order they were added, or
    newest first with ``newest_first`` (an exec before its graph, both before the memory their
    nodes name), skipping ``None``; once. A group may be a list its owner keeps filling (a pool's
    pinned rows, made at the first use): the finalizer reads it when it runs.

    Parameters
    ----------
    name : str
        What a failed release is reported as (``ReleaseWarning``).
    groups : int or sequence of list, default 1
        How many empty groups to make, or the lists themselves.
    newest_first : bool, default False
    """

    groups: tuple[list[Any], ...]

    def __init__(self, name: str, groups: int | Sequence[list[Any]] = 1, newest_first: bool = False):
        self.groups = tuple([] for _ in range(groups)) if isinstance(groups, int) else tuple(groups)
        self._own(_close_groups, self.groups, bool(newest_first), name=name)

    def add(self, obj: _T, group: int = 0) -> _T:
        """Hold ``obj`` (``None`` is held as nothing) in ``group``; returns it. Refused with
        ``ClosedError`` once the holder is closed: nothing would release it."""
        self._check_open()
        self.groups[group].append(obj)
        return obj
