"""Graphs (``rawgraph.graphs``): capture, the builder, node reads, the hold of what replays call."""

from __future__ import annotations

from typing import Any

from ._base import Mutation, does_nothing, edit_source

BUILDER_GPU = "tests/test_builder_gpu.py"
BUILDER_CPU = "tests/test_builder_cpu.py"
FAULTS = "tests/test_fault_injection_cpu.py::test_every_injected_failure_is_typed_recovered_and_leaks_nothing"


def _fault(slug: str) -> str:
    return f"{FAULTS}[{slug}]"


def _instantiate_without_hold(original: Any) -> Any:
    """``BuiltGraph.instantiate`` as a plain ``Graph.instantiate``: the exec does not hold the
    host callbacks (and embedded execs) its queued replays call."""
    from rawgraph.graphs.graph import Graph

    def instantiate(self: Any, flags: int = 0) -> Any:
        return Graph.instantiate(self, flags)

    return instantiate


def _kernel_nodes_without_deps(original: Any) -> Any:
    """``GraphBuilder.kernel`` whose kernel node records no dependencies (``KernelNode.deps``)."""

    def kernel(self: Any, launch: Any, deps: Any = ()) -> Any:
        node = original(self, launch, deps)
        self.kernel_nodes[-1].deps = ()
        return node

    return kernel


def _address_read_after_free(original: Any) -> Any:
    """``allocation_address`` reading ``dptr`` from a struct nothing holds any more (cuda-bindings'
    ``dptr`` is a view into it: under ``PYTHONMALLOC=debug`` it reads 0xdd..)."""
    call = original.__globals__["call"]
    driver = original.__globals__["driver"]
    error = original.__globals__["RawgraphError"]

    def allocation_address(node: Any) -> int:
        ptr = int(call(driver.cuGraphMemAllocNodeGetParams, node).dptr)
        if ptr == 0:
            raise error("cuGraphMemAllocNodeGetParams returned a null address")
        return ptr

    return allocation_address


def _layout_probe_swallows(original: Any) -> Any:
    """``read_layout`` taking any driver failure for "this function has no layout"."""
    from rawgraph.runtime.errors import CudaError

    def read_layout(function: Any) -> Any:
        try:
            return original(function)
        except CudaError as exc:
            return None, f"{exc.call}: {exc.name}"

    return read_layout


def _name_probe_swallows(original: Any) -> Any:
    """``function_name`` taking any ``cuFuncGetName`` failure for "no name"."""
    from rawgraph.runtime.errors import CudaError

    def function_name(function: Any) -> str:
        try:
            return original(function)
        except CudaError:
            return ""

    return function_name


def _node_kept_without_its_pdl_edge(original: Any) -> Any:
    """``GraphBuilder._add_with_edges`` adding (and recording) the node first and its programmatic
    edges after, with no undo: a failed edge leaves the node in the graph, unordered after its
    producer."""

    def _add_with_edges(self: Any, kind: str, edges: Any, add: Any, programmatic_ok: bool = False) -> Any:
        pdl = [h for h, k in edges if k == "programmatic"]
        if not pdl or not programmatic_ok:  # nothing to add after, or refused as before
            return original(self, kind, edges, add, programmatic_ok)
        node = original(self, kind, [(h, k) for h, k in edges if k != "programmatic"], add, programmatic_ok)
        for src in pdl:
            self._programmatic_edge(src, node.handle)
        return node

    return _add_with_edges


MUTATIONS = [
    Mutation(
        name="host_callback_not_held_past_the_exec",
        why="an exec of a built graph no longer holds its host callbacks past its destruction "
        "(BuiltGraph.instantiate is Graph.instantiate)",
        tests=(f"{BUILDER_GPU}::test_a_host_callback_outlives_builder_graph_and_exec_destroyed_with_a_replay_queued",),
        target="rawgraph.graphs.builder:BuiltGraph.instantiate",
        mutate=_instantiate_without_hold,
        kind="replace",
    ),
    Mutation(
        name="exec_release_without_fence",
        why="the release hold_for_replays installs destroys the exec without fencing and holding (_hold does nothing)",
        tests=(
            f"{BUILDER_CPU}::test_a_destroyed_exec_holds_what_its_replays_call_until_their_fence_fires",
            f"{BUILDER_CPU}::test_garbage_collection_of_the_exec_holds_too_and_a_never_launched_exec_holds_nothing",
            f"{BUILDER_GPU}::test_a_host_callback_outlives_builder_graph_and_exec_destroyed_with_a_replay_queued",
        ),
        target="rawgraph.graphs.keepalive:_hold",
        mutate=does_nothing(),
        kind="replace",
    ),
    Mutation(
        name="body_capture_keeps_deferred_releases",
        why="a conditional body capture ends without running the releases it deferred (conditional.py's "
        "flush_deferred does nothing; Capture's own is untouched)",
        tests=("tests/test_conditional_gpu.py::test_a_body_capture_runs_the_releases_it_deferred",),
        target="rawgraph.graphs.conditional:flush_deferred",
        mutate=does_nothing(returning=0),
        kind="replace",
        everywhere=False,
    ),
    Mutation(
        name="built_kernel_nodes_without_deps",
        why="built kernel nodes record no dependencies, so verify_edges raises on a correct graph",
        tests=(
            f"{BUILDER_GPU}::test_verify_edges_passes_on_a_built_graph_and_catches_an_edge_behind_its_back",
            f"{BUILDER_GPU}::test_verify_edges_passes_on_a_built_plan_with_programmatic_edges",
        ),
        target="rawgraph.graphs.builder:GraphBuilder.kernel",
        mutate=_kernel_nodes_without_deps,
        kind="wrap",
    ),
    Mutation(
        name="alloc_address_read_after_free",
        why="the mem-alloc address is read from a struct cuda-bindings already freed (0xdd.. under "
        "PYTHONMALLOC=debug; both tests run it in a child interpreter, which the plugin's hook mutates too)",
        tests=(
            f"{BUILDER_CPU}::test_allocation_address_reads_dptr_while_the_struct_is_alive",
            f"{BUILDER_GPU}::test_graph_memory_nodes_build_and_run_under_the_debug_allocator",
        ),
        target="rawgraph.graphs.params:allocation_address",
        mutate=_address_read_after_free,
        kind="replace",
    ),
    Mutation(
        name="s3-capture-enter-leaves-the-stream-capturing",
        why="Capture.__enter__ no longer ends the capture when cuStreamGetCaptureInfo fails after "
        "cuStreamBeginCapture (source edit: the handler sits inside __enter__, no helper of its own)",
        tests=(_fault("capture_capture_plan"),),
        target="rawgraph.graphs.capture:Capture.__enter__",
        mutate=edit_source("BaseException", "ZeroDivisionError", after="self._id = capture_info("),
        kind="source-edit",
    ),
    Mutation(
        name="s3-capture-end-diagnosis-skips-the-end",
        why="Capture._end lets a failed unjoined-stream query escape before cuStreamEndCapture (source "
        "edit: the handler sits inside _end, no helper of its own)",
        tests=(_fault("capture_fork_join_capture_branches"),),
        target="rawgraph.graphs.capture:Capture._end",
        mutate=edit_source("Exception", "ZeroDivisionError", after="unjoined = self._unjoined()"),
        kind="source-edit",
    ),
    Mutation(
        name="s3-layout-probe-hides-driver-errors",
        why="read_layout takes any cuFuncGetParamInfo failure for 'no layout': the rebinder is blind to that node",
        tests=(_fault("adopt_a_raw_graph_rebinder"),),
        target="rawgraph.graphs.nodes:read_layout",
        mutate=_layout_probe_swallows,
        kind="wrap",
    ),
    Mutation(
        name="s3-name-probe-hides-driver-errors",
        why="function_name takes any cuFuncGetName failure for 'no name': the kernel escapes name-based checks",
        tests=(_fault("adopt_a_raw_graph_rebinder"),),
        target="rawgraph.graphs.nodes:function_name",
        mutate=_name_probe_swallows,
        kind="wrap",
    ),
    Mutation(
        name="s3-builder-keeps-a-node-without-its-pdl-edge",
        why="GraphBuilder leaves a kernel node in the graph when its programmatic edge fails",
        tests=(_fault("builder_kernel_node_with_a_pdl_edge_builder_kept"),),
        target="rawgraph.graphs.builder:GraphBuilder._add_with_edges",
        mutate=_node_kept_without_its_pdl_edge,
        kind="wrap",
    ),
]
