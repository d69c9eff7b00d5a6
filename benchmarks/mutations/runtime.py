"""The runtime (``rawgraph.runtime``): streams, the device's context, launches, modules, probes."""

from __future__ import annotations

from typing import Any

from ._base import Mutation, does_nothing, during_call, edit_source

FAULTS = "tests/test_fault_injection_cpu.py::test_every_injected_failure_is_typed_recovered_and_leaks_nothing"


def _fault(slug: str) -> str:
    return f"{FAULTS}[{slug}]"


def _pdl_failure_misnamed(original: Any) -> Any:
    """``LaunchPlan.run`` whose failed ``cuLaunchKernelEx`` (a PDL launch) is reported as
    ``cuLaunchKernel`` (the exception renamed in place: the one a capture noted is the same)."""
    from rawgraph.runtime.errors import CudaError

    def run(self: Any, stream: Any) -> None:
        try:
            original(self, stream)
        except CudaError as exc:
            if exc.call == "cuLaunchKernelEx":
                exc.call = "cuLaunchKernel"
                exc.args = (str(exc).replace("cuLaunchKernelEx", "cuLaunchKernel", 1),)
            raise

    return run


def _pointer_probe_swallows(original: Any) -> Any:
    """``_pointer_attribute`` taking any ``cuPointerGetAttribute`` failure for host memory (an out
    of memory becomes NotOnDeviceError)."""
    driver = original.__globals__["driver"]

    def _pointer_attribute(attr: Any, ptr: int) -> Any:
        err, value = driver.cuPointerGetAttribute(attr, ptr)
        return value if err == driver.CUresult.CUDA_SUCCESS else None

    return _pointer_attribute


def _cluster_probe_swallows(original: Any) -> Any:
    """``Kernel.__init__`` taking a failed cluster-dimension query for "no cluster": the kernel is
    made (and cached for the process) with ``cluster_dims == (0, 0, 0)``. The attribute queries
    before it (registers, shared memory) still raise: a failure after ``max_dynamic_smem`` was set
    came from the cluster query."""
    from rawgraph.runtime.errors import CudaError

    def __init__(self: Any, module: Any, name: str, symbol: str) -> None:
        try:
            original(self, module, name, symbol)
        except CudaError as exc:
            if exc.call != "cuFuncGetAttribute" or not hasattr(self, "max_dynamic_smem"):
                raise
            self.cluster_dims = (0, 0, 0)

    return __init__


def _legacy_stream_elsewhere(original: Any) -> Any:
    """``Stream._borrowed`` that hands the driver a new non-blocking stream for a borrowed legacy
    (NULL) stream instead of the NULL stream itself."""
    g = original.__globals__
    driver, call, legacy = g["driver"], g["call"], g["LEGACY_HANDLES"]

    def _borrowed(cls: Any, handle: int, device: Any, non_blocking: bool, source: Any) -> Any:
        self = original(cls, handle, device, non_blocking, source)
        if handle in legacy:
            self.handle = call(driver.cuStreamCreate, int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
        return self

    return _borrowed


MUTATIONS = [
    Mutation(
        name="fence_records_on_a_closed_stream",
        why="StreamSet.fence records an event on a stream launched on and closed later (ClosedError on "
        "bind); source edit: the closed-stream branch sits inside fence's loop, no helper of its own",
        tests=("tests/test_manager_gpu.py::test_a_stream_closed_after_a_launch_breaks_no_later_bind_or_close",),
        target="rawgraph.runtime.stream:StreamSet.fence",
        mutate=edit_source("s.closed", "False", after="for ptr, s in list(self.streams.items()):"),
        kind="source-edit",
    ),
    Mutation(
        name="exec_update_without_a_current_context",
        why="a manager/rebinder/reshape update from a fresh thread reaches the driver with no context "
        "(Device.ensure_current does nothing; the test runs it in a child interpreter)",
        tests=("tests/test_threads_gpu.py::test_exec_updates_from_a_thread_with_no_current_context_do_not_crash",),
        target="rawgraph.runtime.device:Device.ensure_current",
        mutate=does_nothing(),
        kind="replace",
    ),
    Mutation(
        name="s3-pdl-launch-misnamed",
        why="a failed PDL launch is reported as cuLaunchKernel, not the cuLaunchKernelEx that failed",
        tests=(_fault("capture_capture_plan"),),
        target="rawgraph.runtime.launch:LaunchPlan.run",
        mutate=_pdl_failure_misnamed,
        kind="wrap",
    ),
    Mutation(
        name="s3-pointer-probe-hides-driver-errors",
        why="pointer_device takes any cuPointerGetAttribute failure for host memory (an OOM becomes NotOnDeviceError)",
        tests=(_fault("manager_bind_many"),),
        target="rawgraph.runtime.device:_pointer_attribute",
        mutate=_pointer_probe_swallows,
        kind="replace",
    ),
    Mutation(
        name="s3-closed-module-calls-the-driver",
        why="Module.function on a closed module calls cuModuleGetFunction with the dead handle "
        "(function runs with its own _check_open a no-op)",
        tests=(_fault("close_module"),),
        target="rawgraph.runtime.module:Module.function",
        mutate=during_call("_check_open", lambda _self, _method: lambda: None),
        kind="wrap",
    ),
    Mutation(
        name="s3-cluster-dims-probe-hides-driver-errors",
        why="Kernel() takes any failed cluster-dimension query for 'no cluster': an OOM caches dims (0, 0, 0)",
        tests=(_fault("module_load_get_kernels"),),
        target="rawgraph.runtime.module:Kernel.__init__",
        mutate=_cluster_probe_swallows,
        kind="wrap",
    ),
    Mutation(
        name="s5-borrowed-legacy-stream-launches-elsewhere",
        why="a borrowed legacy stream hands the driver a new non-blocking stream instead of the NULL stream",
        tests=("tests/test_interop_gpu.py::test_borrowed_default_streams_launch_but_never_capture",),
        target="rawgraph.runtime.stream:Stream._borrowed",
        mutate=_legacy_stream_elsewhere,
        kind="wrap",
    ),
]
