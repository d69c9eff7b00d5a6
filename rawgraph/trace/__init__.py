"""A timeline of host launches against device work: where each step's time goes, node by node.

:class:`Tracer` is a context manager around any code that calls the driver through rawgraph:

- host spans of the driver calls rawgraph makes (``cuLaunchKernel``, ``cuLaunchKernelEx``,
  ``cuGraphLaunch``, ``cuGraphExecKernelNodeSetParams``, copies, syncs), timed by wrappers put on
  ``cuda.bindings.driver`` for the block only (:mod:`~rawgraph.trace.hooks`: nothing changes while
  no tracer is active);
- device spans of kernels, copies and memsets from CUPTI's activity API (``cupti-python``, the
  ``trace`` extra), joined to the host call that launched them and, for graph nodes, to rawgraph's
  node map; without CUPTI, CUDA events around each step (:mod:`~rawgraph.trace.activity`);
- paths and steps marked by the caller (NVTX ranges too, where ``nvtx`` is installed), doctor
  findings and verify results as instant events;
- afterwards: the Chrome Trace Event Format JSON (Perfetto, ``chrome://tracing``), the latency
  model fitted from it (:mod:`~rawgraph.trace.model`) and a PNG timeline
  (:mod:`~rawgraph.trace.timeline`).

``rawgraph trace`` runs the TinyBlock, or a row-wise model of the user's (``--callable
MODULE:NAME``), through every launch path under a tracer (:mod:`rawgraph.bench.trace`). How to
trace code of your own and how to read a trace: ``docs/trace.md``.
"""

from .activity import TraceError
from .model import LatencyModel, PathModel
from .records import DeviceSpan, HostSpan, Instant, PathMark
from .tracer import NodeLabel, TraceActiveError, Tracer, TraceWarning

__all__ = [
    "DeviceSpan",
    "HostSpan",
    "Instant",
    "LatencyModel",
    "NodeLabel",
    "PathMark",
    "PathModel",
    "TraceActiveError",
    "TraceError",
    "TraceWarning",
    "Tracer",
]
