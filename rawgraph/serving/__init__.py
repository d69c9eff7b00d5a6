"""Serving many batch sizes from graphs: bucket sizes, bucket graphs over one set of weights and
one scratch arena, graph memory pools, and the driver-level alternatives that re-shape a graph
instead of capturing one per size. Every class takes any model keeping the row-wise protocol
(``protocol``).

Reads bottom-up: ``protocol`` (what a model must offer, shared scratch) -> ``function`` (a
model from a function that launches your kernels, no class to write) -> ``sizes`` (bucket
lists, no GPU) -> ``graphmem`` (the driver's graph memory pool) -> ``lifecycle`` (instantiate +
upload, close in order) -> ``buckets`` (:class:`BucketGraphs`) -> ``reshape`` (row-count
rebinding, one re-shaped graph) -> ``slots`` (continuous batching over fixed slots and an index
table) -> ``shape_table`` (a device-shaped graph's bands and its head's table, no GPU) ->
``device_shaped`` (one exec whose grids and row counts a kernel sets on the device) ->
``choose`` (the fastest of these for a sample of a batch-size trace, measured). Nothing here is
imported by the modules below it in :mod:`rawgraph`."""

from .buckets import BucketGraphs
from .choose import Choice, ChooseError, choose_strategy, regret
from .device_shaped import DeviceShapedError, DeviceShapedGraph
from .function import FunctionModel, FunctionModelError
from .graphmem import graph_memory, trim_graph_memory
from .reshape import ReshapedGraph, RowCountBuckets
from .sizes import pick_bucket, powers_of_two, vllm_sizes
from .slots import PendingRow, SlotError, SlotPool

__all__ = [
    "BucketGraphs",
    "Choice",
    "ChooseError",
    "choose_strategy",
    "regret",
    "DeviceShapedError",
    "DeviceShapedGraph",
    "FunctionModel",
    "FunctionModelError",
    "graph_memory",
    "trim_graph_memory",
    "ReshapedGraph",
    "RowCountBuckets",
    "pick_bucket",
    "powers_of_two",
    "vllm_sizes",
    "PendingRow",
    "SlotError",
    "SlotPool",
]
