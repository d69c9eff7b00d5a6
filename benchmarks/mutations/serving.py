"""Serving (``rawgraph.serving``): the slot pool's parts, bucket graphs, re-shaped execs, the
stream order across runs and the graph memory pool."""

from __future__ import annotations

from typing import Any

from ._base import Mutation, during_call, edit_source, unlocked_after_init

SLOTS_GPU = "tests/test_slots_gpu.py"
BUCKETS_GPU = "tests/test_buckets_gpu.py"
RESHAPE_REFUSALS = f"{BUCKETS_GPU}::test_reshaped_graph_refuses_bad_sizes_and_a_partly_overlapping_x"
FAULTS = "tests/test_fault_injection_cpu.py::test_every_injected_failure_is_typed_recovered_and_leaks_nothing"


def _fault(slug: str) -> str:
    return f"{FAULTS}[{slug}]"


def _closed_stream_forgotten(original: Any) -> Any:
    """``StreamOrder.enter`` that forgets a stream used before once it is closed: the new stream
    waits for nothing (not for the closed stream's tail event); an open one is ordered as before."""

    def enter(self: Any, stream: Any) -> Any:
        last = self._last
        if last is not None and last.closed:
            self._last = None
        return original(self, stream)

    return enter


def _closed_bucketgraphs_untyped(original: Any) -> Any:
    """``BucketGraphs.run`` refusing a closed object with a plain ValueError, not ClosedError."""

    def run(self: Any, x: Any, n: int, stream: Any = None) -> Any:
        if self._closed:
            raise ValueError("BucketGraphs is closed")
        return original(self, x, n, stream)

    return run


def _host_row_waits_for_the_stream(original: Any) -> Any:
    """``SlotState.write_row`` that synchronizes the stream after copying a host row."""
    import numpy as np

    def write_row(self: Any, slot: int, row: Any, stream: Any) -> None:
        original(self, slot, row, stream)
        if isinstance(row, np.ndarray):
            stream.synchronize()

    return write_row


def _host_row_written_before_its_checks(original: Any) -> Any:
    """``SlotState.write_row`` that copies a host row into the slot (at most ``width`` values)
    before its dtype and shape checks run: a refused row has already been written."""
    import numpy as np

    call, driver = original.__globals__["call"], original.__globals__["driver"]

    def write_row(self: Any, slot: int, row: Any, stream: Any) -> None:
        if isinstance(row, np.ndarray):
            host = np.ascontiguousarray(row)
            nbytes = min(host.nbytes, self.width * 4)
            call(driver.cuMemcpyHtoDAsync, self.row_ptr(slot), host.ctypes.data, nbytes, stream.handle)
        original(self, slot, row, stream)

    return write_row


def _leave_pads_with_the_freed_slot(original: Any) -> Any:
    """``SlotTable.retire`` that leaves the freed slot in the table entry that becomes padding
    (instead of the scratch slot)."""

    def retire(self: Any, slot: int) -> None:
        last = len(self.pos) - 1  # the entry that becomes padding
        original(self, slot)
        self.table[last] = int(slot)

    return retire


def _initial_padding_names_a_slot(original: Any) -> Any:
    """``SlotTable.__init__`` that fills the table with the last real slot, not the scratch slot."""

    def __init__(self: Any, table: Any, max_slots: int) -> None:
        original(self, table, max_slots)
        self.table[:] = max_slots - 1

    return __init__


def _choose_ignores_the_slot(original: Any) -> Any:
    """``SlotTable.choose`` that checks a requested slot, then returns the lowest free one."""

    def choose(self: Any, slot: Any = None) -> int:
        chosen = original(self, slot)
        return chosen if slot is None else self.free[-1]

    return choose


def _trim_forgotten(original: Any) -> Any:
    """``trim_graph_memory`` that reads the pool's figures without ``cuDeviceGraphMemTrim``."""
    get_device, graph_memory = original.__globals__["get_device"], original.__globals__["graph_memory"]

    def trim_graph_memory(device: Any = None) -> dict[str, int]:
        return graph_memory((device or get_device()).activate())

    return trim_graph_memory


MUTATIONS = [
    Mutation(
        name="stream_order_skips_a_closed_stream",
        why="item 5: StreamOrder orders nothing after a closed stream (cuStreamDestroy returns with work queued)",
        tests=("tests/test_buckets_gpu.py::test_a_run_on_a_new_stream_waits_for_one_queued_on_a_closed_stream",),
        target="rawgraph.serving.buckets:StreamOrder.enter",
        mutate=_closed_stream_forgotten,
        kind="wrap",
    ),
    Mutation(
        name="reshape_unchecked_n",
        why="item 10: ReshapedGraph.reshape(0) raises a bare KeyError (reshape runs with its own _check_n a "
        "no-op; run's check is untouched)",
        tests=(RESHAPE_REFUSALS,),
        target="rawgraph.serving.reshape:ReshapedGraph.reshape",
        mutate=during_call("_check_n", lambda _self, _method: lambda _n: None),
        kind="wrap",
    ),
    Mutation(
        name="reshape_run_without_overlap_check",
        why="item 10: ReshapedGraph.run copies a partly overlapping x (an undefined cuMemcpyDtoDAsync); "
        "source edit: the overlap test sits inside run, no helper of its own",
        tests=(RESHAPE_REFUSALS,),
        target="rawgraph.serving.reshape:ReshapedGraph.run",
        mutate=edit_source("if src != dst and ", "if False and "),
        kind="source-edit",
    ),
    Mutation(
        name="slot_pool_without_lock",
        why="item 12: two threads' joins run inside the SlotPool at once (one slot picked twice; its lock "
        "locks nothing)",
        tests=("tests/test_threads_gpu.py::test_two_threads_joining_a_slot_pool_never_pick_one_slot",),
        target="rawgraph.serving.slots:SlotPool.__init__",
        mutate=unlocked_after_init,
        kind="wrap",
    ),
    Mutation(
        name="s3-slots-join-waits-for-the-stream",
        why="SlotPool.join of a host row synchronizes the stream again (issue 23: a join costs no stream-wide wait)",
        tests=("tests/test_slots_cpu.py::test_a_host_row_joins_with_no_wait_and_the_callers_row_is_free_at_once",),
        target="rawgraph.serving.slots:SlotState.write_row",
        mutate=_host_row_waits_for_the_stream,
        kind="wrap",
    ),
    Mutation(
        name="s3-closed-bucketgraphs-untyped",
        why="a closed BucketGraphs refuses run() with a plain RawgraphError instead of ClosedError",
        tests=(_fault("close_bucketgraphs"),),
        target="rawgraph.serving.buckets:BucketGraphs.run",
        mutate=_closed_bucketgraphs_untyped,
        kind="wrap",
    ),
    Mutation(
        name="s5-slots-join-skips-the-table-rule",
        why="join rewrites the pinned table without waiting for the queued step to have read it (join runs "
        "with its own _table_free a no-op; leave's is untouched)",
        tests=(f"{SLOTS_GPU}::test_the_pinned_table_is_not_rewritten_under_a_queued_step",),
        target="rawgraph.serving.slots:SlotPool.join",
        mutate=during_call("_table_free", lambda _self, _method: lambda: None),
        kind="wrap",
    ),
    Mutation(
        name="s5-slots-leave-pads-with-the-freed-slot",
        why="leave leaves the freed slot in the table as padding instead of the scratch slot",
        tests=(f"{SLOTS_GPU}::test_padding_slots_never_change_live_ones",),
        target="rawgraph.serving.slots:SlotTable.retire",
        mutate=_leave_pads_with_the_freed_slot,
        kind="wrap",
    ),
    Mutation(
        name="s5-slots-initial-padding-names-a-slot",
        why="the initial table pads with the last real slot instead of the scratch slot",
        tests=(f"{SLOTS_GPU}::test_padding_slots_never_change_live_ones",),
        target="rawgraph.serving.slots:SlotTable.__init__",
        mutate=_initial_padding_names_a_slot,
        kind="wrap",
    ),
    Mutation(
        name="s5-slots-join-ignores-the-slot",
        why="join(slot=...) checks the slot, then takes the lowest free one",
        tests=(f"{SLOTS_GPU}::test_results_do_not_depend_on_slot_or_batch_position",),
        target="rawgraph.serving.slots:SlotTable.choose",
        mutate=_choose_ignores_the_slot,
        kind="wrap",
    ),
    Mutation(
        name="s5-graph-memory-trim-does-nothing",
        why="trim_graph_memory no longer calls cuDeviceGraphMemTrim",
        tests=(f"{BUCKETS_GPU}::test_graph_memory_is_reused_across_buckets_and_trimmed",),
        target="rawgraph.serving.graphmem:trim_graph_memory",
        mutate=_trim_forgotten,
        kind="replace",
    ),
    Mutation(
        name="s5-slots-refused-join-writes-its-row",
        why="join copies a host row into the slot before checking its dtype and shape",
        tests=(f"{SLOTS_GPU}::test_bad_slot_operations_are_refused_and_change_nothing",),
        target="rawgraph.serving.slots:SlotState.write_row",
        mutate=_host_row_written_before_its_checks,
        kind="wrap",
    ),
]
