"""Issue 21, section 2, items 1, 2, 3, 4, 5, 10 and 12: each edit puts one fixed hole of the core back.

Run with ``PYTHONPATH=. python3 benchmarks/bite_check.py --only NAME``; these need the H200.
"""

NULL_LOCK = '__import__("contextlib").nullcontext()'

CASES = [
    dict(
        name="rebinder_apply_without_liveness_check",
        why="item 1: AddressRebinder.apply reaches cuGraphExecKernelNodeSetParams after its exec was closed",
        tests=["tests/test_rebind_gpu.py::test_the_rebinder_refuses_a_closed_exec_or_graph_before_the_driver"],
        edits=[
            (
                "rawgraph/updates/rebind.py",
                "            self._check_usable()\n            if binding.owner is not self._token:",
                "            if binding.owner is not self._token:",
            )
        ],
    ),
    dict(
        name="rebinder_does_not_hold_a_rebound_buffer",
        why="item 1: rebind() keeps no reference to the buffer the exec now points into",
        tests=[
            "tests/test_rebind_gpu.py::test_the_rebinder_holds_a_moved_in_buffer_until_the_replays_that_read_it_have_run"
        ],
        edits=[
            ("rawgraph/updates/rebind.py", "            self._rebound.append((nb, size, new))\n", "            pass\n")
        ],
    ),
    dict(
        name="rebinder_drops_an_applied_buffer_at_once",
        why="item 1: apply() lets the previous binding's buffers go with a replay that reads them queued",
        tests=[
            "tests/test_rebind_gpu.py::test_the_rebinder_holds_a_moved_in_buffer_until_the_replays_that_read_it_have_run"
        ],
        edits=[
            ("rawgraph/updates/rebind.py", "                self._keep.retire_all(gone)\n", "                pass\n")
        ],
    ),
    dict(
        name="prepare_skips_child_graphs",
        why="item 2: prepare() moves a range a child graph reads (the child keeps the old buffer)",
        tests=["tests/test_rebind_gpu.py::test_prepare_refuses_a_range_a_child_graph_reads"],
        edits=[
            (
                "rawgraph/updates/rebind.py",
                "            nested = self._nested_matches(lo, hi)\n",
                "            nested = []\n",
            )
        ],
    ),
    dict(
        name="manager_close_drops_pending_arrays",
        why="item 3: ExecUpdateManager.close() drops retired arrays no event covers yet, replay still queued",
        tests=["tests/test_manager_gpu.py::test_manager_close_waits_for_a_queued_replay_before_dropping_what_it_reads"],
        edits=[
            (
                "rawgraph/updates/manager.py",
                "            self._shadow.keep.close()\n",
                "            self._shadow.keep._pending.clear()\n            self._shadow.keep.close()\n",
            )
        ],
    ),
    dict(
        name="fence_records_on_a_closed_stream",
        why="item 4: a stream launched on and closed later gets an event recorded on it (ClosedError on bind)",
        tests=["tests/test_lifetimes_gpu.py::test_a_stream_closed_after_a_launch_breaks_no_later_bind_or_close"],
        edits=[
            (
                "rawgraph/runtime/stream.py",
                "            for ptr, s in list(self.streams.items()):\n                if s.closed:\n"
                "                    if s.tail is not None and not s.tail.query():",
                "            for ptr, s in list(self.streams.items()):\n                if False:\n"
                "                    if s.tail is not None and not s.tail.query():",
            )
        ],
    ),
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
    dict(
        name="manager_without_lock",
        why="item 12: two threads' binds push into one manager's exec at once",
        tests=["tests/test_threads_gpu.py::test_two_threads_binding_one_manager_leave_shadow_and_exec_agreeing"],
        edits=[
            (
                "rawgraph/updates/manager.py",
                "        self._lock = threading.RLock()\n",
                f"        self._lock = {NULL_LOCK}\n",
            )
        ],
    ),
    dict(
        name="rebinder_without_lock",
        why="item 12: two threads' applies push into one rebinder's exec at once",
        tests=["tests/test_threads_gpu.py::test_two_threads_applying_one_rebinder_leave_held_and_exec_agreeing"],
        edits=[
            (
                "rawgraph/updates/rebind.py",
                "        self._lock = threading.RLock()\n",
                f"        self._lock = {NULL_LOCK}\n",
            )
        ],
    ),
    dict(
        name="indirect_graph_without_lock",
        why="item 12: two threads' applies run inside one IndirectGraph at once",
        tests=[
            "tests/test_threads_gpu.py::test_two_threads_applying_one_indirect_graph_leave_table_and_bound_agreeing"
        ],
        edits=[
            (
                "rawgraph/updates/indirect.py",
                "        self._lock = threading.Lock()  # apply: the wait, the two stores and the keep-alive together\n",
                f"        self._lock = {NULL_LOCK}\n",
            )
        ],
    ),
    dict(
        name="exec_update_without_a_current_context",
        why="a manager/rebinder/reshape update from a fresh thread reaches SetParams with no context (a crash)",
        tests=["tests/test_threads_gpu.py::test_exec_updates_from_a_thread_with_no_current_context_do_not_crash"],
        edits=[
            (
                "rawgraph/runtime/device.py",
                '        if getattr(_here, "context", None) is not self.context:\n            self.activate()\n',
                "        return\n",
            )
        ],
    ),
]
