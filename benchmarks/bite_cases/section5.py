"""Issue 21, section 5: tests that passed with their feature broken, each now made to bite.

One case per item (two where one bug would leave a second way of breaking the feature unchecked);
every edit puts a real bug into the library, a kernel or a benchmark's checker, never into a test.
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
                "            self._table_free()\n            self._free.remove(chosen)\n",
                "            self._free.remove(chosen)\n",
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
        edits=[(SLOTS, "            chosen = int(slot)\n", "            chosen = self._free[-1]\n")],
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
                "            if isinstance(row, np.ndarray):\n                if row.dtype != np.float32:\n",
                "            if isinstance(row, np.ndarray):\n"
                "                host = np.ascontiguousarray(row)\n"
                "                call(driver.cuMemcpyHtoDAsync, dst, host.ctypes.data, min(host.nbytes, self.width * 4),\n"
                "                     self.stream.handle)\n"
                "                if row.dtype != np.float32:\n",
            )
        ],
    ),
    # 6
    dict(
        name="s5-manager-pushes-the-conditional-node",
        why="the exec-update manager also pushes the graph's recorded non-kernel nodes (its conditionals)",
        tests=[
            "tests/test_conditional_gpu.py::test_exec_update_leaves_conditional_graphs_alone_but_body_kernels_rebind"
        ],
        edits=[
            (
                "rawgraph/updates/manager.py",
                "        pushed = self._shadow.push(changed, slots.put_back, (changed, olds)) if changed else 0\n",
                "        pushed = self._shadow.push(changed, slots.put_back, (changed, olds)) if changed else 0\n"
                "        if changed:\n"
                "            from cuda.bindings import driver\n"
                '            for other, _kind, _detail in getattr(self.graph, "other_nodes", ()):\n'
                "                driver.cuGraphExecKernelNodeSetParams(self.exec.handle, other, self._shadow.params[changed[0]])\n",
            )
        ],
    ),
    # 7
    dict(
        name="s5-device-launch-modes-swapped",
        why="fire_and_forget and sibling launch with each other's cudaStream_t",
        tests=["tests/test_device_launch_gpu.py::test_a_kernel_launches_the_device_graph"],
        edits=[
            (
                "rawgraph/control/device_launch.py",
                'MODES: dict[str, int] = {"tail": TAIL, "fire_and_forget": FIRE_AND_FORGET, "sibling": SIBLING}',
                'MODES: dict[str, int] = {"tail": TAIL, "fire_and_forget": SIBLING, "sibling": FIRE_AND_FORGET}',
            )
        ],
    ),
    dict(
        name="s5-device-launch-fire-and-forget-is-a-tail-launch",
        why="fire_and_forget launches with cudaStreamGraphTailLaunch",
        tests=["tests/test_device_launch_gpu.py::test_a_kernel_launches_the_device_graph"],
        edits=[
            (
                "rawgraph/control/device_launch.py",
                'MODES: dict[str, int] = {"tail": TAIL, "fire_and_forget": FIRE_AND_FORGET, "sibling": SIBLING}',
                'MODES: dict[str, int] = {"tail": TAIL, "fire_and_forget": TAIL, "sibling": SIBLING}',
            )
        ],
    ),
    # 8
    dict(
        name="s5-philox-set-state-corrupts-the-seed",
        why="PhiloxGenerator.set_state writes seed ^ 1 to the device (the sanitize check must use the host's seed)",
        tests=["tests/test_rng_gpu.py::test_the_sanitize_philox_check_uses_the_seed_the_host_set"],
        edits=[
            (
                "rawgraph/control/rng.py",
                'value = np.array([_check_u64("seed", seed), _check_u64("offset", offset)], dtype=np.uint64)',
                'value = np.array([_check_u64("seed", seed) ^ 1, _check_u64("offset", offset)], dtype=np.uint64)',
            )
        ],
    ),
    dict(
        name="s5-count-mismatch-counts-every-element",
        why="the count_mismatch kernel (the soak's verdict) counts every element, equal or not",
        tests=[
            "tests/test_interop_gpu.py::test_the_mismatch_counter_the_soak_relies_on_counts_exactly",
            "tests/test_interop_gpu.py::test_soak_replays_are_checked_against_float64",
        ],
        edits=[("kernels/elementwise.cu", "        bad += a[i] != b[i];\n", "        bad += 1;\n")],
    ),
    # 9
    dict(
        name="s5-fused-form-drops-its-relu",
        why="the fused TinyBlock's first matmul loses its relu epilogue: eager and replays agree, float64 does not",
        tests=["tests/test_interop_gpu.py::test_soak_replays_are_checked_against_float64"],
        edits=[
            (
                "rawgraph/models/tinyblock.py",
                'ops.matmul(dev, bufs, src, f"W1[{i}]", "a", "relu", label=f"L{i}.matmul_relu")',
                'ops.matmul(dev, bufs, src, f"W1[{i}]", "a", "none", label=f"L{i}.matmul_relu")',
            )
        ],
    ),
    # 10
    dict(
        name="s5-borrowed-legacy-stream-launches-elsewhere",
        why="a borrowed legacy stream hands the driver a new non-blocking stream instead of the NULL stream",
        tests=["tests/test_interop_gpu.py::test_borrowed_default_streams_launch_but_never_capture"],
        edits=[
            (
                "rawgraph/runtime/stream.py",
                "        self.handle = driver.CUstream(handle)\n        self.ptr = int(handle)\n",
                "        self.handle = (call(driver.cuStreamCreate, int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))\n"
                "                       if handle in LEGACY_HANDLES else driver.CUstream(handle))\n"
                "        self.ptr = int(handle)\n",
            )
        ],
    ),
    # 11
    dict(
        name="s5-dropout-admits-p-1",
        why="dropout_constants lets p = 1 past the range check (refused later, with another message)",
        tests=["tests/test_rng_gpu.py::test_noisy_plan_refusals"],
        edits=[
            ("rawgraph/control/rng.py", "    if not 0.0 <= float(p) < 1.0:\n", "    if not 0.0 <= float(p) <= 1.0:\n")
        ],
    ),
    dict(
        name="s5-noisy-plan-closed-generator-untyped",
        why="noisy_plan refuses a closed generator with a bare RuntimeError instead of ClosedError",
        tests=["tests/test_rng_gpu.py::test_noisy_plan_refusals"],
        edits=[
            (
                "rawgraph/control/rng.py",
                "    gen._check_open()\n    if gen.device.ordinal != model.device.ordinal:\n",
                '    if gen.closed:\n        raise RuntimeError("the generator is closed")\n'
                "    if gen.device.ordinal != model.device.ordinal:\n",
            )
        ],
    ),
]
