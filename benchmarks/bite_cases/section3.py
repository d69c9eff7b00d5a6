"""Issue 21, section 3: the bugs fault injection found, each put back; the fault-injection test of
the operation that found it must fail (``tests/test_fault_injection_cpu.py``, CPU fake driver)."""

T = "tests/test_fault_injection_cpu.py::test_every_injected_failure_is_typed_recovered_and_leaks_nothing"


def _t(slug: str) -> str:
    return f"{T}[{slug}]"


CASES = [
    dict(
        name="s3-capture-enter-leaves-the-stream-capturing",
        why="Capture.__enter__ no longer ends the capture when cuStreamGetCaptureInfo fails after cuStreamBeginCapture",
        tests=[_t("capture_capture_plan")],
        edits=[
            (
                "rawgraph/graphs/capture.py",
                "        try:\n            self._id = capture_info(self.stream.handle)[1]\n        except BaseException:\n",
                "        try:\n            self._id = capture_info(self.stream.handle)[1]\n        except ZeroDivisionError:\n",
            )
        ],
    ),
    dict(
        name="s3-capture-end-diagnosis-skips-the-end",
        why="Capture._end lets a failed unjoined-stream query escape before cuStreamEndCapture",
        tests=[_t("capture_fork_join_capture_branches")],
        edits=[
            (
                "rawgraph/graphs/capture.py",
                "            except Exception as e:  # a query failed: the capture must still end, then fail with it\n",
                "            except ZeroDivisionError as e:\n",
            )
        ],
    ),
    dict(
        name="s3-pdl-launch-misnamed",
        why="a failed PDL launch is reported as cuLaunchKernel, not the cuLaunchKernelEx that failed",
        tests=[_t("capture_capture_plan")],
        edits=[
            (
                "rawgraph/runtime/launch.py",
                '"cuLaunchKernel" if cfg is None else "cuLaunchKernelEx"',
                '"cuLaunchKernel"',
            )
        ],
    ),
    dict(
        name="s3-rebinder-half-applied",
        why="the shadow core (which AddressRebinder._push pushes through) no longer puts back the nodes it "
        "pushed when a later push fails",
        tests=[
            _t("rebinder_rebind"),
            _t("rebinder_prepare_apply"),
            "tests/test_shadow_cpu.py::test_a_push_refused_at_the_kth_node_leaves_exec_and_shadow_equal",
        ],
        edits=[
            (
                "rawgraph/updates/shadow.py",
                "        for node in reversed(nodes[:k]):\n",
                "        for node in reversed(nodes[:0]):\n",
            )
        ],
    ),
    dict(
        name="s3-manager-retire-before-bookkeeping",
        why="bind_many retires the replaced array before noting the new one: a failed fence leaves the old one as bound",
        tests=[_t("manager_bind_many_at_the_keep_alive_batch")],
        edits=[
            (
                "rawgraph/updates/manager.py",
                "                    bound_obj[name] = obj  # first: the exec holds it now, whatever retiring does\n"
                "                    replaced.append(old)\n            self._shadow.keep.retire_all(replaced)\n",
                "                    self._shadow.keep.retire_all([old])\n                    bound_obj[name] = obj\n",
            )
        ],
    ),
    dict(
        name="s3-indirect-retire-before-bookkeeping",
        why="IndirectGraph.apply retires the old pair before noting the new one the table already holds",
        tests=[_t("indirectgraph_apply_at_the_keep_alive_batch")],
        edits=[
            (
                "rawgraph/updates/indirect.py",
                "                old, self._bound = self._bound, binding.holds\n"
                "                self._keep.retire(old)\n",
                "                self._keep.retire(self._bound)\n                self._bound = binding.holds\n",
            )
        ],
    ),
    dict(
        name="s3-slots-join-waits-for-the-stream",
        why="SlotPool.join of a host row synchronizes the stream again (issue 23: a join costs no stream-wide wait)",
        tests=["tests/test_slots_cpu.py::test_a_host_row_joins_with_no_wait_and_the_callers_row_is_free_at_once"],
        edits=[
            (
                "rawgraph/serving/slots.py",
                "                call(driver.cuMemcpyHtoDAsync, dst, staged.ctypes.data, staged.nbytes, self.stream.handle)\n",
                "                call(driver.cuMemcpyHtoDAsync, dst, staged.ctypes.data, staged.nbytes, self.stream.handle)\n"
                "                self.stream.synchronize()\n",
            )
        ],
    ),
    dict(
        name="s3-pointer-probe-hides-driver-errors",
        why="pointer_device takes any cuPointerGetAttribute failure for host memory (an OOM becomes NotOnDeviceError)",
        tests=[_t("manager_bind_many")],
        edits=[
            (
                "rawgraph/runtime/device.py",
                "    if err == driver.CUresult.CUDA_ERROR_INVALID_VALUE:\n        return None\n",
                "    if err != driver.CUresult.CUDA_SUCCESS:\n        return None\n",
            )
        ],
    ),
    dict(
        name="s3-layout-probe-hides-driver-errors",
        why="read_layout takes any cuFuncGetParamInfo failure for 'no layout': the rebinder is blind to that node",
        tests=[_t("adopt_a_raw_graph_rebinder")],
        edits=[("rawgraph/graphs/nodes.py", "    if read.err in _NO_LAYOUT:\n", "    if read.err != _SUCCESS:\n")],
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
    dict(
        name="s3-closed-module-calls-the-driver",
        why="Module.function on a closed module calls cuModuleGetFunction with the dead handle",
        tests=[_t("close_module")],
        edits=[
            (
                "rawgraph/runtime/module.py",
                "        self._check_open()\n        return call(driver.cuModuleGetFunction,",
                "        return call(driver.cuModuleGetFunction,",
            )
        ],
    ),
]

CASES += [
    dict(
        name="s3-cluster-dims-probe-hides-driver-errors",
        why="Kernel() takes any failed cluster-dimension query for 'no cluster': an OOM caches dims (0, 0, 0)",
        tests=[_t("module_load_get_kernels")],
        edits=[
            (
                "rawgraph/runtime/module.py",
                '                raise cuda_error(err, "cuFuncGetAttribute")\n',
                "                pass\n",
            )
        ],
    ),
    dict(
        name="s3-allocation-probe-hides-driver-errors",
        why="allocation_of takes any cuMemGetAddressRange failure for 'no allocation': the bounds check is skipped",
        tests=[_t("rebinder_rebind")],
        edits=[
            (
                "rawgraph/updates/addresses.py",
                '    if err != _SUCCESS:\n        raise cuda_error(err, "cuMemGetAddressRange")\n',
                "    if err != _SUCCESS:\n        return None\n",
            )
        ],
    ),
    dict(
        name="s3-name-probe-hides-driver-errors",
        why="function_name takes any cuFuncGetName failure for 'no name': the kernel escapes name-based checks",
        tests=[_t("adopt_a_raw_graph_rebinder")],
        edits=[("rawgraph/graphs/nodes.py", '        raise cuda_error(err, "cuFuncGetName")\n', '        return ""\n')],
    ),
]
CASES += [
    dict(
        name="s3-builder-keeps-a-node-without-its-pdl-edge",
        why="GraphBuilder leaves a kernel node in the graph (and out of its node map) when its programmatic edge fails",
        tests=[_t("builder_kernel_node_with_a_pdl_edge_builder_kept")],
        edits=[
            (
                "rawgraph/graphs/builder.py",
                "            driver.cuGraphDestroyNode(handle)\n            raise\n",
                "            self._record(handle, kind)\n            raise\n",
            )
        ],
    )
]
