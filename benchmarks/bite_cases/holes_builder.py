"""Issue 21, section 2, items 6, 7, 8, 9 and 11: each edit puts one fixed hole back.

Run with ``PYTHONPATH=. python3 benchmarks/bite_check.py --only NAME``; the GPU cases need the H200.
"""

OWN = "tests/test_ownership_gpu.py"
CPU = "tests/test_builder_cpu.py"

CASES = [
    dict(
        name="host_callback_not_held_past_the_exec",
        why="item 6: an exec of a built graph no longer holds its host callbacks past its destruction",
        tests=[f"{OWN}::test_a_host_callback_outlives_builder_graph_and_exec_destroyed_with_a_replay_queued"],
        edits=[
            (
                "rawgraph/graphs/builder.py",
                "        held = self.held_by_replays()\n        if held:\n            hold_for_replays(exe, held)\n        return exe\n",
                "        return exe\n",
            )
        ],
    ),
    dict(
        name="exec_release_without_fence",
        why="item 6: the release hold_for_replays installs destroys the exec without fencing and holding",
        tests=[
            f"{CPU}::test_a_destroyed_exec_holds_what_its_replays_call_until_their_fence_fires",
            f"{CPU}::test_garbage_collection_of_the_exec_holds_too_and_a_never_launched_exec_holds_nothing",
            f"{OWN}::test_a_host_callback_outlives_builder_graph_and_exec_destroyed_with_a_replay_queued",
        ],
        edits=[
            (
                "rawgraph/graphs/keepalive.py",
                "    _hold(streams, device, objs)  # first: the fence must follow every launch that was queued\n",
                "",
            )
        ],
    ),
    dict(
        name="launcher_of_closed_target_launches",
        why="item 7: a launcher exec goes to cuGraphLaunch although its target DeviceGraph is closed",
        tests=[f"{OWN}::test_a_launcher_of_a_closed_device_graph_is_refused_before_the_driver"],
        edits=[
            (
                "rawgraph/control/device_launch.py",
                "        _check_targets(self.targets)\n        super().launch(stream)\n",
                "        super().launch(stream)\n",
            )
        ],
    ),
    dict(
        name="closed_target_destroyed_under_a_queued_launcher",
        why="item 7: closing a DeviceGraph destroys its exec at once, with a launcher replay still queued",
        tests=[f"{OWN}::test_closing_a_device_graph_with_a_launcher_replay_queued_is_safe"],
        edits=[
            (
                "rawgraph/control/device_launch.py",
                "    if not launchers[0]:\n        exe.close()\n",
                "    exe.close()\n",
            )
        ],
    ),
    dict(
        name="body_capture_keeps_deferred_releases",
        why="item 8: BodyCapture ends its capture without running the releases it deferred",
        tests=[f"{OWN}::test_a_body_capture_runs_the_releases_it_deferred"],
        edits=[
            (
                "rawgraph/graphs/conditional.py",
                "        try:\n            err, graph = driver.cuStreamEndCapture(self.stream.handle)\n        finally:\n",
                "        err, graph = driver.cuStreamEndCapture(self.stream.handle)\n        if False:\n",
            )
        ],
    ),
    dict(
        name="built_kernel_nodes_without_deps",
        why="item 9: built kernel nodes record no dependencies, so verify_edges raises on a correct graph",
        tests=[
            f"{OWN}::test_verify_edges_passes_on_a_built_graph_and_catches_an_edge_behind_its_back",
            f"{OWN}::test_verify_edges_passes_on_a_built_plan_with_programmatic_edges",
        ],
        edits=[
            (
                "rawgraph/graphs/builder.py",
                "kn = KernelNode(None, len(self.kernel_nodes), launch, snapshot, tuple(int(h) for h, _k in edges))",
                "kn = KernelNode(None, len(self.kernel_nodes), launch, snapshot)",
            )
        ],
    ),
    dict(
        name="alloc_address_read_after_free",
        why="item 11: the mem-alloc address is read from a struct cuda-bindings already freed (0xdd.. under "
        "PYTHONMALLOC=debug)",
        tests=[
            f"{CPU}::test_allocation_address_reads_dptr_while_the_struct_is_alive",
            f"{OWN}::test_graph_memory_nodes_build_and_run_under_the_debug_allocator",
        ],
        edits=[
            (
                "rawgraph/graphs/params.py",
                "    params = call(driver.cuGraphMemAllocNodeGetParams, node)\n    ptr = int(params.dptr)\n"
                "    del params  # only now may the struct go\n",
                "    ptr = int(call(driver.cuGraphMemAllocNodeGetParams, node).dptr)\n",
            )
        ],
    ),
]
