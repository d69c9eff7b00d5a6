"""Control (``rawgraph.control``): device-launched graphs and the Philox generator."""

from __future__ import annotations

from typing import Any

from ._base import Mutation

DEVICE_LAUNCH_GPU = "tests/test_device_launch_gpu.py"
DEVICE_LAUNCH = "tests/test_device_launch_gpu.py::test_a_kernel_launches_the_device_graph"


def _launch_without_target_check(original: Any) -> Any:
    """``LauncherExec.launch`` as a plain ``GraphExec.launch``: no check that its targets are open."""
    from rawgraph.graphs.graph import GraphExec

    def launch(self: Any, stream: Any) -> None:
        GraphExec.launch(self, stream)

    return launch


def _target_always_destroyed(original: Any) -> Any:
    """``_release_target`` that destroys the target's exec at once, launcher graph or not."""

    def _release_target(exe: Any, launchers: list[int]) -> None:
        exe.close()

    return _release_target


def _modes(**changes: str) -> Any:
    """A mutate of ``MODES``: a new table where each named mode launches as another mode does."""

    def mutate(original: dict[str, int]) -> dict[str, int]:
        return {mode: original[changes.get(mode, mode)] for mode in original}

    return mutate


def _seed_flipped_on_the_device(original: Any) -> Any:
    """``PhiloxGenerator.set_state`` writing ``seed ^ 1`` to the device (the host keeps its seed)."""

    def set_state(self: Any, seed: int, stream: Any, offset: int = 0) -> None:
        flipped = seed ^ 1 if isinstance(seed, int) and not isinstance(seed, bool) else seed
        original(self, flipped, stream, offset)

    return set_state


def _admits_p_1(original: Any) -> Any:
    """``dropout_constants`` letting ``p = 1`` past its range check: it is then refused by the later
    rounding check, with that check's message (p given as the largest float that rounds to 1)."""

    def dropout_constants(p: float) -> tuple[int, float]:
        if not isinstance(p, bool) and isinstance(p, (int, float)) and float(p) == 1.0:
            return original(1.0 - 2.0**-26)
        return original(p)

    return dropout_constants


def _closed_generator_untyped(original: Any) -> Any:
    """``noisy_plan`` refusing a closed generator with a bare RuntimeError, not ClosedError."""

    def noisy_plan(model: Any, x: Any, out: Any, gen: Any, *, p: float) -> Any:
        if getattr(model, "form", None) == "unfused" and gen.closed:
            raise RuntimeError("the generator is closed")
        return original(model, x, out, gen, p=p)

    return noisy_plan


MUTATIONS = [
    Mutation(
        name="launcher_of_closed_target_launches",
        why="a launcher exec goes to cuGraphLaunch although its target DeviceGraph is closed",
        tests=(f"{DEVICE_LAUNCH_GPU}::test_a_launcher_of_a_closed_device_graph_is_refused_before_the_driver",),
        target="rawgraph.control.device_launch:LauncherExec.launch",
        mutate=_launch_without_target_check,
        kind="replace",
    ),
    Mutation(
        name="closed_target_destroyed_under_a_queued_launcher",
        why="closing a DeviceGraph destroys its exec at once, with a launcher replay still queued",
        tests=(f"{DEVICE_LAUNCH_GPU}::test_closing_a_device_graph_with_a_launcher_replay_queued_is_safe",),
        target="rawgraph.control.device_launch:_release_target",
        mutate=_target_always_destroyed,
        kind="replace",
    ),
    Mutation(
        name="s5-device-launch-modes-swapped",
        why="fire_and_forget and sibling launch with each other's cudaStream_t",
        tests=(DEVICE_LAUNCH,),
        target="rawgraph.control.device_launch:MODES",
        mutate=_modes(fire_and_forget="sibling", sibling="fire_and_forget"),
        kind="constant",
    ),
    Mutation(
        name="s5-device-launch-fire-and-forget-is-a-tail-launch",
        why="fire_and_forget launches with cudaStreamGraphTailLaunch",
        tests=(DEVICE_LAUNCH,),
        target="rawgraph.control.device_launch:MODES",
        mutate=_modes(fire_and_forget="tail"),
        kind="constant",
    ),
    Mutation(
        name="s5-philox-set-state-corrupts-the-seed",
        why="PhiloxGenerator.set_state writes seed ^ 1 to the device (the sanitize check must use the host's seed)",
        tests=("tests/test_rng_gpu.py::test_the_sanitize_philox_check_uses_the_seed_the_host_set",),
        target="rawgraph.control.rng:PhiloxGenerator.set_state",
        mutate=_seed_flipped_on_the_device,
        kind="wrap",
    ),
    Mutation(
        name="s5-dropout-admits-p-1",
        why="dropout_constants lets p = 1 past the range check (refused later, with another message)",
        tests=("tests/test_rng_gpu.py::test_noisy_plan_refusals",),
        target="rawgraph.control.rng:dropout_constants",
        mutate=_admits_p_1,
        kind="wrap",
    ),
    Mutation(
        name="s5-noisy-plan-closed-generator-untyped",
        why="noisy_plan refuses a closed generator with a bare RuntimeError instead of ClosedError",
        tests=("tests/test_rng_gpu.py::test_noisy_plan_refusals",),
        target="rawgraph.control.rng:noisy_plan",
        mutate=_closed_generator_untyped,
        kind="wrap",
    ),
]
