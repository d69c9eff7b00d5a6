"""Issue 21, section 2, items 1, 2, 3, 4, 5, 10 and 12: each edit puts one fixed hole of the core back.

Run with ``PYTHONPATH=. python3 benchmarks/bite_check.py --only NAME``; these need the H200.
Only the serving cases are left here as text edits (that code is being refactored); the others
are mutations in ``benchmarks/mutations/``, the form new cases are written in.
"""

NULL_LOCK = '__import__("contextlib").nullcontext()'

CASES = [
    dict(
        name="stream_order_skips_a_closed_stream",
        why="item 5: StreamOrder orders nothing after a closed stream (cuStreamDestroy returns with work queued)",
        tests=["tests/test_lifetimes_gpu.py::test_a_run_on_a_new_stream_waits_for_one_queued_on_a_closed_stream"],
        edits=[
            (
                "rawgraph/serving/buckets.py",
                "            elif last.tail is not None:\n                s.wait(last.tail)\n",
                "",
            )
        ],
    ),
    dict(
        name="reshape_unchecked_n",
        why="item 10: ReshapedGraph.reshape(0) raises a bare KeyError",
        tests=["tests/test_buckets_gpu.py::test_reshaped_graph_refuses_bad_sizes_and_a_partly_overlapping_x"],
        edits=[
            (
                "rawgraph/serving/reshape.py",
                '            raise ClosedError("ReshapedGraph is closed")\n        self._check_n(n)\n        sig',
                '            raise ClosedError("ReshapedGraph is closed")\n        sig',
            )
        ],
    ),
    dict(
        name="reshape_run_without_overlap_check",
        why="item 10: ReshapedGraph.run copies a partly overlapping x (an undefined cuMemcpyDtoDAsync)",
        tests=["tests/test_buckets_gpu.py::test_reshaped_graph_refuses_bad_sizes_and_a_partly_overlapping_x"],
        edits=[
            (
                "rawgraph/serving/reshape.py",
                "        if src != dst and src < dst + self.input.nbytes and dst < src + nbytes:\n",
                "        if False:\n",
            )
        ],
    ),
    dict(
        name="slot_pool_without_lock",
        why="item 12: two threads' joins run inside the SlotPool at once (one slot picked twice)",
        tests=["tests/test_threads_gpu.py::test_two_threads_joining_a_slot_pool_never_pick_one_slot"],
        edits=[
            (
                "rawgraph/serving/slots.py",
                "        self._lock = threading.Lock()\n",
                f"        self._lock = {NULL_LOCK}\n",
            )
        ],
    ),
]
