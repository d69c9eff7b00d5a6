"""Issue 21, section 3: the bugs fault injection found, each put back; the fault-injection test of
the operation that found it must fail (``tests/test_fault_injection_cpu.py``, CPU fake driver).

Only the serving cases are left here as text edits (that code is being refactored); the others
are mutations in ``benchmarks/mutations/``, the form new cases are written in."""

T = "tests/test_fault_injection_cpu.py::test_every_injected_failure_is_typed_recovered_and_leaks_nothing"


def _t(slug: str) -> str:
    return f"{T}[{slug}]"


CASES = [
    dict(
        name="s3-slots-join-waits-for-the-stream",
        why="SlotPool.join of a host row synchronizes the stream again (issue 23: a join costs no stream-wide wait)",
        tests=["tests/test_slots_cpu.py::test_a_host_row_joins_with_no_wait_and_the_callers_row_is_free_at_once"],
        edits=[
            (
                "rawgraph/serving/slots.py",
                "            call(driver.cuMemcpyHtoDAsync, dst, staged.ctypes.data, staged.nbytes, stream.handle)\n",
                "            call(driver.cuMemcpyHtoDAsync, dst, staged.ctypes.data, staged.nbytes, stream.handle)\n"
                "            stream.synchronize()\n",
            )
        ],
    ),
    dict(
        name="s3-closed-bucketgraphs-untyped",
        why="a closed BucketGraphs refuses run() with a plain RawgraphError instead of ClosedError",
        tests=[_t("close_bucketgraphs")],
        edits=[
            (
                "rawgraph/serving/buckets.py",
                'raise ClosedError("BucketGraphs is closed")',
                'raise ValueError("BucketGraphs is closed")',
            )
        ],
    ),
]
