"""Adopting graphs rawgraph did not build: PyTorch's, CuPy's, or any raw ``CUgraph``.

An :class:`AdoptedGraph` is a :class:`~rawgraph.graphs.graph.Graph` that does not own its handle: it
never calls ``cuGraphDestroy`` and keeps the owner (the ``torch.cuda.CUDAGraph``, the
``cupy.cuda.Graph``) alive instead, since the owner destroys the graph when it goes. rawgraph then
instantiates its *own* exec of it (``Graph.instantiate``) and moves the captured static inputs and
outputs to new buffers by address (:class:`~rawgraph.updates.rebind.AddressRebinder`): no copy into a
static buffer per replay.

Neither torch nor CuPy is imported by rawgraph: :func:`from_torch` and :func:`from_cupy` take the
object the caller already has.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver

from ..graphs.graph import Graph, GraphExec
from ..runtime.device import Device, get_device
from ..runtime.errors import RawgraphError
from .rebind import AddressRebinder

TORCH_MIN = (2, 8)


def _drop(holder: list[Any]) -> None:
    # The release of an adopted graph: let go of the owner (it destroys the graph, not us).
    holder.clear()


class AdoptedGraph(Graph):
    """A foreign ``CUgraph``, not owned: ``close()`` drops the reference to ``owner``, nothing else.

    Parameters
    ----------
    handle : CUgraph or int
    owner : object
        What owns (and will destroy) the graph; kept alive while this object is open.
    device : Device, optional
    source : str
        Where it came from, for reports (``"torch"``, ``"cupy"``, ``"raw"``).
    """

    def __init__(self, handle: Any, owner: Any = None, device: Device | None = None, source: str = "raw"):
        value = int(handle)
        if value == 0:
            raise RawgraphError("cannot adopt a null CUgraph")
        # Graph's own set-up (no node map: rawgraph recorded nothing), then its release call
        # (cuGraphDestroy) replaced by letting go of the owner.
        super().__init__(driver.CUgraph(value), [], (device or get_device()).activate())
        self._finalizer.detach()
        self.source = source
        self._holder = [owner]
        self._own(_drop, self._holder, name="adopted graph (not destroyed)")

    @property
    def owner(self) -> Any:
        return self._holder[0] if self._holder else None

    def rebinder(self, flags: int = 0) -> AddressRebinder:
        """Instantiate rawgraph's own exec (``cuGraphInstantiate``) and return an
        :class:`AddressRebinder` over it (it owns the exec, ``rebinder.exec``: closing the
        rebinder closes it).

        See Also
        --------
        cuGraphInstantiate : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        exe = self.instantiate(flags)
        try:
            return AddressRebinder(self, exe, device=self.device, own_exec=True)
        except BaseException:
            exe.close()
            raise

    def __repr__(self) -> str:
        return f"<AdoptedGraph from {self.source} 0x{int(self.handle):x}{' closed' if self.closed else ''}>"


def adopt(handle: Any, owner: Any = None, device: Device | None = None) -> AdoptedGraph:
    """Adopt any raw ``CUgraph`` (``owner`` is kept alive and destroys it; rawgraph never does)."""
    return AdoptedGraph(handle, owner, device, "raw")


def _version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def from_torch(cuda_graph: Any, device: Device | None = None) -> AdoptedGraph:
    """Adopt a ``torch.cuda.CUDAGraph`` captured with ``keep_graph=True``.

    ``torch.cuda.CUDAGraph(keep_graph=True)`` (PyTorch >= 2.8) keeps the ``cudaGraph_t`` after
    capture and ``raw_cuda_graph()`` returns it; torch destroys it in ``reset()`` or when the
    ``CUDAGraph`` goes, so the adopted graph keeps ``cuda_graph`` alive. Do not ``reset()`` it
    while the adopted graph or an exec of it is in use.

    Raises
    ------
    RawgraphError
        torch older than 2.8, or a graph captured without ``keep_graph=True``.
    """
    import importlib

    try:
        torch: Any = importlib.import_module("torch")  # optional: only here, never at import time
    except ImportError:
        torch = None
    version = str(getattr(torch, "__version__", "0.0")) if torch is not None else "not installed"
    if torch is None or _version(version) < TORCH_MIN:
        raise RawgraphError(
            f"adopting a torch graph needs PyTorch >= {TORCH_MIN[0]}.{TORCH_MIN[1]} "
            f"(CUDAGraph(keep_graph=True) and raw_cuda_graph()); found {version}"
        )
    if not hasattr(cuda_graph, "raw_cuda_graph"):
        raise RawgraphError(f"expected a torch.cuda.CUDAGraph, got {type(cuda_graph).__name__}")
    try:
        raw = cuda_graph.raw_cuda_graph()
    except Exception as exc:  # torch refuses when the graph was not kept, or not captured yet
        raise RawgraphError(
            f"raw_cuda_graph() failed ({exc}); capture with torch.cuda.CUDAGraph(keep_graph=True)"
        ) from exc
    if not int(raw):
        raise RawgraphError(
            "raw_cuda_graph() returned a null graph; capture with torch.cuda.CUDAGraph(keep_graph=True)"
        )
    return AdoptedGraph(raw, cuda_graph, device, "torch")


def from_cupy(graph: Any, device: Device | None = None) -> AdoptedGraph:
    """Adopt a ``cupy.cuda.Graph`` (from ``Stream.end_capture()``): its ``graph`` attribute is the
    ``cudaGraph_t`` (CuPy 13/14), which CuPy destroys when the ``Graph`` goes; kept alive here."""
    raw = getattr(graph, "graph", None)
    if raw is None:
        raise RawgraphError(f"expected a cupy.cuda.Graph (with a .graph handle), got {type(graph).__name__}")
    return AdoptedGraph(int(raw), graph, device, "cupy")


__all__ = ["AdoptedGraph", "GraphExec", "adopt", "from_cupy", "from_torch"]
