"""Exec updates (``rawgraph.updates``): the rebinder, the manager, the indirect graph, the shadow."""

from __future__ import annotations

from typing import Any

from ._base import Mutation, does_nothing, during_call, unlocked_after_init

REBIND = "tests/test_rebind_gpu.py"
THREADS = "tests/test_threads_gpu.py"
FAULTS = "tests/test_fault_injection_cpu.py::test_every_injected_failure_is_typed_recovered_and_leaks_nothing"


def _fault(slug: str) -> str:
    return f"{FAULTS}[{slug}]"


class _KeepsNothing:
    """A keep-alive whose ``retire_all`` lets everything go at once; the rest is the real one."""

    def __init__(self, real: Any):
        self._real = real

    def retire_all(self, objs: Any) -> None:
        list(objs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _rebound_buffer_not_held(original: Any) -> Any:
    """``AddressRebinder._move`` without noting the buffer moved in (``_rebound``): nothing holds it
    for the replays that read it."""

    def _move(self: Any, old: Any, new: Any, device_buffers: Any) -> Any:
        matches = original(self, old, new, device_buffers)
        self._rebound = [e for e in self._rebound if e[2] is not new]
        return matches

    return _move


def _close_drops_pending(original: Any) -> Any:
    """``ExecUpdateManager.close`` that first forgets the retired arrays no fence covers yet."""

    def close(self: Any) -> None:
        self._shadow.keep._pending.clear()
        original(self)

    return close


def _roll_back_without_re_push(original: Any) -> Any:
    """``ExecShadow.roll_back`` that puts the shadow back and names the refused node, but never
    pushes the old values again to the nodes the driver already took (the exec left half-applied)."""
    from rawgraph.runtime.errors import cuda_error

    def roll_back(self: Any, nodes: Any, k: int, err: Any, undo: Any, log: Any) -> BaseException:
        exc = cuda_error(err, self._call(nodes[k])[1])
        if undo is not None:
            undo(log)
        return exc

    return roll_back


def _manager_retires_first(original: Any) -> Any:
    """``ExecUpdateManager._apply`` as if it retired the replaced arrays before noting the new
    ones: when retiring raises (a fence not recorded), the names still read as bound to the old
    arrays although the exec holds the new ones."""

    def _apply(self: Any, binding: Any, values: Any) -> int:
        before = {name: self._bound_obj[name] for name in binding.names}
        try:
            return original(self, binding, values)
        except BaseException:
            self._bound_obj.update(before)
            raise

    return _apply


def _indirect_retires_first(original: Any) -> Any:
    """``IndirectGraph.apply`` as if it retired the old pair before noting the new one: when
    retiring raises, ``_bound`` still names the old pair although the table holds the new one."""

    def apply(self: Any, binding: Any) -> None:
        before = self._bound
        try:
            original(self, binding)
        except BaseException:
            self._bound = before
            raise

    return apply


def _allocation_probe_swallows(original: Any) -> Any:
    """``allocation_of`` taking any driver failure for "no allocation"."""
    from rawgraph.runtime.errors import CudaError

    def allocation_of(ptr: int) -> Any:
        try:
            return original(ptr)
        except CudaError:
            return None

    return allocation_of


def _manager_pushes_other_nodes(original: Any) -> Any:
    """``ExecUpdateManager._apply`` that, after its push, also pushes kernel-node parameters into
    the graph's recorded non-kernel nodes (its conditional nodes)."""

    def _apply(self: Any, binding: Any, values: Any) -> int:
        from cuda.bindings import driver

        pushed = original(self, binding, values)
        if pushed:
            for other, _kind, _detail in getattr(self.graph, "other_nodes", ()):
                driver.cuGraphExecKernelNodeSetParams(self.exec.handle, other, self._shadow.params[0])
        return pushed

    return _apply


MUTATIONS = [
    Mutation(
        name="rebinder_apply_without_liveness_check",
        why="AddressRebinder.apply reaches cuGraphExecKernelNodeSetParams after its exec was closed "
        "(apply runs with its own _check_usable a no-op)",
        tests=(f"{REBIND}::test_the_rebinder_refuses_a_closed_exec_or_graph_before_the_driver",),
        target="rawgraph.updates.rebind:AddressRebinder.apply",
        mutate=during_call("_check_usable", lambda _self, _method: lambda: None),
        kind="wrap",
    ),
    Mutation(
        name="rebinder_does_not_hold_a_rebound_buffer",
        why="AddressRebinder.move keeps no reference to the buffer the exec now points into",
        tests=(f"{REBIND}::test_the_rebinder_holds_a_moved_in_buffer_until_the_replays_that_read_it_have_run",),
        target="rawgraph.updates.rebind:AddressRebinder._move",
        mutate=_rebound_buffer_not_held,
        kind="wrap",
    ),
    Mutation(
        name="rebinder_drops_an_applied_buffer_at_once",
        why="AddressRebinder.apply lets the previous binding's buffers go with a replay that reads them "
        "queued (its keep-alive's retire_all keeps nothing, for apply only)",
        tests=(f"{REBIND}::test_the_rebinder_holds_a_moved_in_buffer_until_the_replays_that_read_it_have_run",),
        target="rawgraph.updates.rebind:AddressRebinder.apply",
        mutate=during_call("_keep", lambda _self, keep: _KeepsNothing(keep)),
        kind="wrap",
    ),
    Mutation(
        name="prepare_skips_child_graphs",
        why="prepare() moves a range a child graph reads (the child keeps the old buffer): the nested "
        "matches are never found",
        tests=(f"{REBIND}::test_prepare_refuses_a_range_a_child_graph_reads",),
        target="rawgraph.updates.rebind:AddressRebinder._nested_matches",
        mutate=does_nothing(returning=[]),
        kind="replace",
    ),
    Mutation(
        name="manager_close_drops_pending_arrays",
        why="ExecUpdateManager.close() drops retired arrays no event covers yet, replay still queued",
        tests=(
            "tests/test_manager_gpu.py::test_manager_close_waits_for_a_queued_replay_before_dropping_what_it_reads",
        ),
        target="rawgraph.updates.manager:ExecUpdateManager.close",
        mutate=_close_drops_pending,
        kind="wrap",
    ),
    Mutation(
        name="manager_without_lock",
        why="two threads' binds push into one manager's exec at once (its lock locks nothing)",
        tests=(f"{THREADS}::test_two_threads_binding_one_manager_leave_shadow_and_exec_agreeing",),
        target="rawgraph.updates.manager:ExecUpdateManager.__init__",
        mutate=unlocked_after_init,
        kind="wrap",
    ),
    Mutation(
        name="rebinder_without_lock",
        why="two threads' applies push into one rebinder's exec at once (its lock locks nothing)",
        tests=(f"{THREADS}::test_two_threads_applying_one_rebinder_leave_held_and_exec_agreeing",),
        target="rawgraph.updates.rebind:AddressRebinder.__init__",
        mutate=unlocked_after_init,
        kind="wrap",
    ),
    Mutation(
        name="indirect_graph_without_lock",
        why="two threads' applies run inside one IndirectGraph at once (its lock locks nothing)",
        tests=(f"{THREADS}::test_two_threads_applying_one_indirect_graph_leave_table_and_bound_agreeing",),
        target="rawgraph.updates.indirect:IndirectGraph.__init__",
        mutate=unlocked_after_init,
        kind="wrap",
    ),
    Mutation(
        name="s3-rebinder-half-applied",
        why="the shadow's rollback (which every update path pushes through) no longer puts back the "
        "nodes it pushed when a later push fails",
        tests=(
            _fault("rebinder_rebind"),
            _fault("rebinder_prepare_apply"),
            "tests/test_shadow_cpu.py::test_a_push_refused_at_the_kth_node_leaves_exec_and_shadow_equal",
        ),
        target="rawgraph.updates.shadow:ExecShadow.roll_back",
        mutate=_roll_back_without_re_push,
        kind="replace",
    ),
    Mutation(
        name="s3-manager-retire-before-bookkeeping",
        why="bind_many retires the replaced array before noting the new one: a failed fence leaves the "
        "old one as bound",
        tests=(_fault("manager_bind_many_at_the_keep_alive_batch"),),
        target="rawgraph.updates.manager:ExecUpdateManager._apply",
        mutate=_manager_retires_first,
        kind="wrap",
    ),
    Mutation(
        name="s3-indirect-retire-before-bookkeeping",
        why="IndirectGraph.apply retires the old pair before noting the new one the table already holds",
        tests=(_fault("indirectgraph_apply_at_the_keep_alive_batch"),),
        target="rawgraph.updates.indirect:IndirectGraph.apply",
        mutate=_indirect_retires_first,
        kind="wrap",
    ),
    Mutation(
        name="s3-allocation-probe-hides-driver-errors",
        why="allocation_of takes any cuMemGetAddressRange failure for 'no allocation': the bounds check is skipped",
        tests=(_fault("rebinder_rebind"),),
        target="rawgraph.updates.addresses:allocation_of",
        mutate=_allocation_probe_swallows,
        kind="wrap",
    ),
    Mutation(
        name="s5-manager-pushes-the-conditional-node",
        why="the exec-update manager also pushes the graph's recorded non-kernel nodes (its conditionals)",
        tests=(
            "tests/test_conditional_gpu.py::test_exec_update_leaves_conditional_graphs_alone_but_body_kernels_rebind",
        ),
        target="rawgraph.updates.manager:ExecUpdateManager._apply",
        mutate=_manager_pushes_other_nodes,
        kind="wrap",
    ),
]
