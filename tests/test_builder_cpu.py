"""Builder pieces that need no GPU: every byte of every driver struct the builder and the
conditional nodes fill (issue 21, item 11), the allocation address read while its struct is alive
(the PYTHONMALLOC=debug failure of item 11), and the hold that keeps what queued replays call into
past their exec (item 6), driven through fake streams and fences."""

import ctypes
import gc
import os
import struct
import subprocess
import sys
import textwrap
import types
import weakref
from pathlib import Path

import pytest
from cuda.bindings import driver

from rawgraph.graphs import builder
from rawgraph.graphs import conditional as cn
from rawgraph.runtime.errors import ClosedError, ReleaseWarning
from rawgraph.runtime.launch import KernelArgs, Launch
from rawgraph.runtime.resource import Resource

ROOT = Path(__file__).resolve().parent.parent
_SUCCESS = driver.CUresult.CUDA_SUCCESS


def _raw(obj, size):
    """The struct's bytes as the driver would read them (``getPtr`` is the address passed to it)."""
    return bytes((ctypes.c_ubyte * size).from_address(int(obj.getPtr())))


# -- item 11: every byte of every struct -------------------------------------------------------------
# Layouts from cuda.h (x86-64); each test packs the bytes it expects, reserved and padding included,
# and compares the whole struct: a field left to chance, or a value written to the wrong place, differs.


def _memcpy_side(ptr, host, nbytes):
    mtype = int(driver.CUmemorytype.CU_MEMORYTYPE_HOST if host else driver.CUmemorytype.CU_MEMORYTYPE_DEVICE)
    # XInBytes, Y, Z, LOD, memoryType (+4 padding), Host, Device, Array, reserved, Pitch, Height
    return struct.pack("<4QI4x6Q", 0, 0, 0, 0, mtype, ptr if host else 0, 0 if host else ptr, 0, 0, nbytes, 1)


@pytest.mark.parametrize("src_host,dst_host", [(False, False), (True, False), (False, True)])
def test_memcpy_params_set_every_byte(src_host, dst_host):
    src, dst, n = 0x7F0000001000, 0x7F0000A02000, 4096 + 12
    p = builder.memcpy_params(dst, dst_host, src, src_host, n)
    want = _memcpy_side(src, src_host, n) + _memcpy_side(dst, dst_host, n) + struct.pack("<3Q", n, 1, 1)
    assert len(want) == 200
    assert _raw(p, 200) == want
    assert (p.srcMemoryType == driver.CUmemorytype.CU_MEMORYTYPE_HOST) == src_host
    assert int(p.dstDevice) == (0 if dst_host else dst) and int(p.dstHost or 0) == (dst if dst_host else 0)


def test_memset_params_set_every_byte():
    p = builder.memset_params(0x7F0000003000, 0xDEADBEEF, 4, 1000)
    assert _raw(p, 40) == struct.pack("<2Q2I2Q", 0x7F0000003000, 4000, 0xDEADBEEF, 4, 1000, 1)


def test_host_params_set_every_byte():
    p = builder.host_params(0x7F00DEAD0000)
    assert _raw(p, 16) == struct.pack("<2Q", 0x7F00DEAD0000, 0)


@pytest.mark.parametrize("ordinal", [0, 3])
def test_mem_alloc_params_set_every_byte_of_the_pool_properties(ordinal):
    p = builder.mem_alloc_params(1 << 20, ordinal)
    pinned = int(driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED)
    none = int(driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)
    on_device = int(driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
    # CUmemPoolProps: allocType, handleTypes, location {type, id}, win32SecurityAttributes, maxSize,
    # usage, gpuDirectRDMACapable, reserved[53]; then accessDescs, accessDescCount, bytesize, dptr.
    pool = struct.pack("<2IIi2QHB53x", pinned, none, on_device, ordinal, 0, 0, 0, 0)
    assert len(pool) == 88
    assert _raw(p, 120) == pool + struct.pack("<4Q", 0, 0, 1 << 20, 0)
    assert p.poolProps.location.id == ordinal  # the union member written, `localized` left alone


@pytest.mark.parametrize("kind", ["default", "programmatic"])
def test_edge_data_sets_every_byte(kind):
    d = builder.edge_data(kind)
    want = (
        (builder.PORT_PROGRAMMATIC, 0, int(builder.DEP_PROGRAMMATIC))
        if kind == "programmatic"
        else (builder.PORT_DEFAULT, 0, int(builder.DEP_DEFAULT))
    )
    assert _raw(d, 8) == struct.pack("<3B5x", *want)
    with pytest.raises(ValueError):
        builder.edge_data("later")


def test_kernel_params_set_every_byte():
    args = KernelArgs([("x", "ptr"), ("n", "i32")])
    args.update({"x": 0x7F0000004000, "n": 77})
    kernel = types.SimpleNamespace(handle=driver.CUfunction(0x7F00000F0000), name="fake")
    launch = Launch(kernel, (5, 2, 1), (128, 2, 1), args, {}, 96, "fake")
    p = builder.kernel_params(launch)
    # func, grid, block, sharedMemBytes (+4), kernelParams, extra, kern, ctx
    want = struct.pack("<Q7I4x4Q", 0x7F00000F0000, 5, 2, 1, 128, 2, 1, 96, args.address, 0, 0, 0)
    assert _raw(p, 72) == want


def test_conditional_node_params_set_every_byte():
    cond = cn.ConditionalHandle(0xABC0001, 0x1234, None)
    ctx = driver.CUcontext(0x7F0000C0C000)
    p = cn._node_params(cond, "while", 1, types.SimpleNamespace(context=ctx))
    # CUgraphNodeParams: type, reserved0[3], a 232-byte union holding CUDA_CONDITIONAL_NODE_PARAMS
    # {handle, type, size, phGraph_out (the driver's output), ctx}, reserved2.
    conditional = struct.pack(
        "<Q2I2Q", 0xABC0001, int(driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE), 1, 0, 0x7F0000C0C000
    )
    want = struct.pack("<I12x", int(driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL)) + conditional
    want += bytes(232 - len(conditional)) + bytes(8)
    assert _raw(p, 256) == want


def test_allocation_address_reads_dptr_while_the_struct_is_alive():
    """``int(call(cuGraphMemAllocNodeGetParams, node).dptr)`` reads the struct after it was freed:
    under PYTHONMALLOC=debug (freed memory filled with 0xDD) that gave 0xdddddddddddddddd, which
    cuGraphAddMemcpyNode / cuGraphAddMemFreeNode then refused. The driver call is faked here the way
    cuda-bindings returns it: a fresh struct, referenced only by the result tuple."""
    code = textwrap.dedent(
        """
        from cuda.bindings import driver
        from rawgraph.graphs import builder

        ADDR = 0x7F0012345600

        def cuGraphMemAllocNodeGetParams(node):
            p = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
            p.bytesize, p.dptr = 4096, ADDR
            return (driver.CUresult.CUDA_SUCCESS, p)

        driver.cuGraphMemAllocNodeGetParams = cuGraphMemAllocNodeGetParams
        got = [builder.allocation_address(None) for _ in range(16)]
        assert got == [ADDR] * 16, [hex(g) for g in got]
        print("ok")
        """
    )
    env = dict(os.environ, PYTHONMALLOC="debug", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr[-3000:]


# -- item 6: the hold, with fake streams ----------------------------------------------------------------
class _Fence:
    def __init__(self, log):
        self.owned, self.fired, self.log = [], False, log

    def done(self):
        self.log.append("query")
        return self.fired


class _Streams:
    """Stands for an exec's StreamSet: truthy once launched; fence() records, synchronize() waits."""

    def __init__(self, log, launched=True, fence_fails=False, sync_fails=False):
        self.log, self.launched, self.fence_fails, self.sync_fails = log, launched, fence_fails, sync_fails
        self.fences = []

    def __bool__(self):
        return self.launched

    def fence(self, pool=None, device=None):
        self.log.append("fence")
        if self.fence_fails:
            raise RuntimeError("cuEventRecord failed")
        f = _Fence(self.log)
        self.fences.append(f)
        return f

    def synchronize(self):
        self.log.append("synchronize")
        if self.sync_fails:
            raise RuntimeError("cuStreamSynchronize failed")


class _FakeExec(Resource):
    def __init__(self, streams, log):
        self.streams = streams
        self.graph = types.SimpleNamespace(device=None)
        self._own(lambda: log.append("destroy") or (_SUCCESS,), name="cuGraphExecDestroy")


class _Callback:
    """Weak-referenceable stand-in for a HostCallback."""


def test_a_destroyed_exec_holds_what_its_replays_call_until_their_fence_fires():
    log = []
    streams = _Streams(log)
    exe = _FakeExec(streams, log)
    cb = _Callback()
    ref = weakref.ref(cb)
    builder.hold_for_replays(exe, [cb])
    del cb
    assert ref() is not None and not exe.closed
    exe.close()
    assert log.index("fence") < log.index("destroy")  # the fence covers every queued launch, then the destroy
    exe.close()  # safe twice: one release
    assert log.count("destroy") == 1 and exe.closed
    del exe
    gc.collect()
    assert ref() is not None, "released while a replay that may call it was still queued"
    assert builder.collect_held() >= 1 and ref() is not None  # the fence has not fired
    streams.fences[0].fired = True
    builder.collect_held()
    assert ref() is None  # nothing leaks once the replays have run
    with pytest.raises(ClosedError):
        builder.hold_for_replays(_closed_exec(log), [object()])


def _closed_exec(log):
    exe = _FakeExec(_Streams(log), log)
    exe.close()
    return exe


def test_garbage_collection_of_the_exec_holds_too_and_a_never_launched_exec_holds_nothing():
    log = []
    streams = _Streams(log)
    cb = _Callback()
    ref = weakref.ref(cb)
    exe = _FakeExec(streams, log)
    builder.hold_for_replays(exe, [cb])
    del exe, cb
    gc.collect()
    assert log.index("fence") < log.index("destroy") and ref() is not None
    streams.fences[0].fired = True
    builder.collect_held()
    assert ref() is None
    quiet = []
    idle = _FakeExec(_Streams(quiet, launched=False), quiet)
    cb2 = _Callback()
    ref2 = weakref.ref(cb2)
    builder.hold_for_replays(idle, [cb2])
    del cb2
    idle.close()
    assert quiet == ["destroy"] and ref2() is None  # no replay can call it: nothing to hold


def test_a_failed_fence_waits_instead_and_a_failed_wait_keeps_the_objects_and_warns():
    log = []
    exe = _FakeExec(_Streams(log, fence_fails=True), log)
    cb = _Callback()
    ref = weakref.ref(cb)
    builder.hold_for_replays(exe, [cb])
    del cb
    exe.close()
    assert log == ["fence", "synchronize", "destroy"] and ref() is None  # waited: nothing queued any more
    log2 = []
    exe2 = _FakeExec(_Streams(log2, fence_fails=True, sync_fails=True), log2)
    cb2 = _Callback()
    ref2 = weakref.ref(cb2)
    builder.hold_for_replays(exe2, [cb2])
    del cb2
    with pytest.warns(ReleaseWarning, match="stay referenced"):
        exe2.close()
    assert log2[-1] == "destroy"
    builder.collect_held()
    assert ref2() is not None and ref2() in builder.held_objects()  # a leak, never a call into freed memory
