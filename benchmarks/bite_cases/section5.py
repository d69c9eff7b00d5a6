"""Issue 21, section 5: tests that passed with their feature broken, each now made to bite.

One case per item (two where one bug would leave a second way of breaking the feature unchecked);
every edit puts a real bug into the library, a kernel or a benchmark's checker, never into a test.
Only the serving cases are left here as text edits (that code is being refactored); the others
are mutations in ``benchmarks/mutations/``, the form new cases are written in.
"""

SLOTS = "rawgraph/serving/slots.py"
T_SLOTS = "tests/test_slots_gpu.py"

CASES = [
    # 1
    dict(
        name="s5-slots-join-skips-the-table-rule",
        why="join rewrites the pinned table without waiting for the queued step to have read it (_table_free deleted)",
        tests=[f"{T_SLOTS}::test_the_pinned_table_is_not_rewritten_under_a_queued_step"],
        edits=[
            (
                SLOTS,
                "            self._table_free()\n            self._rows.admit(chosen)\n",
                "            self._rows.admit(chosen)\n",
            )
        ],
    ),
    # 2
    dict(
        name="s5-slots-leave-pads-with-the-freed-slot",
        why="leave leaves the freed slot in the table as padding instead of the scratch slot",
        tests=[f"{T_SLOTS}::test_padding_slots_never_change_live_ones"],
        edits=[(SLOTS, "        self.table[last] = self.scratch_slot\n", "        self.table[last] = int(slot)\n")],
    ),
    dict(
        name="s5-slots-initial-padding-names-a-slot",
        why="the initial table pads with the last real slot instead of the scratch slot",
        tests=[f"{T_SLOTS}::test_padding_slots_never_change_live_ones"],
        edits=[(SLOTS, "        self.table[:] = self.scratch_slot\n", "        self.table[:] = max_slots - 1\n")],
    ),
    # 3
    dict(
        name="s5-slots-join-ignores-the-slot",
        why="join(slot=...) checks the slot, then takes the lowest free one",
        tests=[f"{T_SLOTS}::test_results_do_not_depend_on_slot_or_batch_position"],
        edits=[(SLOTS, "        chosen = int(slot)\n", "        chosen = self.free[-1]\n")],
    ),
    # 4
    dict(
        name="s5-graph-memory-trim-does-nothing",
        why="trim_graph_memory no longer calls cuDeviceGraphMemTrim",
        tests=["tests/test_buckets_gpu.py::test_graph_memory_is_reused_across_buckets_and_trimmed"],
        edits=[
            (
                "rawgraph/serving/graphmem.py",
                "    call(driver.cuDeviceGraphMemTrim, dev.handle)\n",
                "    pass  # the trim is forgotten\n",
            )
        ],
    ),
    # 5
    dict(
        name="s5-slots-refused-join-writes-its-row",
        why="join copies a host row into the slot before checking its dtype and shape",
        tests=[f"{T_SLOTS}::test_bad_slot_operations_are_refused_and_change_nothing"],
        edits=[
            (
                SLOTS,
                "        if isinstance(row, np.ndarray):\n            if row.dtype != np.float32:\n",
                "        if isinstance(row, np.ndarray):\n"
                "            host = np.ascontiguousarray(row)\n"
                "            call(driver.cuMemcpyHtoDAsync, dst, host.ctypes.data, min(host.nbytes, self.width * 4),\n"
                "                 stream.handle)\n"
                "            if row.dtype != np.float32:\n",
            )
        ],
    ),
]
