"""Probe: device-side graph launch (a kernel calling ``cudaGraphLaunch``) from NVRTC code.

    PYTHONPATH=. python3 benchmarks/probes/device_launch.py [--rounds 200] [--sizes 1,4,16,64]

CPU part (no GPU needed):
  * the special stream handles, read from every ``cuda_device_runtime_api.h`` found on disk;
  * NVRTC: the launcher kernel without a declaration (the exact error), without -rdc with the
    declaration (a CUBIN whose ``cudaGraphLaunch`` is an undefined symbol), with -rdc to CUBIN,
    PTX and LTO-IR; the undefined symbols of each CUBIN (parsed here, no cuobjdump);
  * every ``libcudadevrt.a`` on disk (cuda.pathfinder, CUDA_HOME, /usr/local/cuda*, wheels);
  * nvJitLink (if ``libnvJitLink.so`` loads): links of the -rdc outputs alone and with
    libcudadevrt.a, for real, and the undefined symbols left in each linked CUBIN.

GPU part, each case in its own child process (a kernel fault or a sticky error in one variant
cannot spoil the next; the parent prints each child's lines under a ``=== child`` header):
  * ``instantiate``: CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH through cuGraphInstantiate and
    cuGraphInstantiateWithParams, with the other flags, on graphs of kernel / memset / memcpy /
    empty / child-graph / conditional nodes; cuGraphUpload; host launch of the device exec;
  * ``run`` per build variant: load the launcher CUBIN, device-launch an uploaded graph as tail
    launch, fire-and-forget and fire-and-forget-as-sibling, check by values that it ran and
    whether graph-internal and stream-ordered work after the launcher saw it;
  * ``time`` (first variant that worked): events, medians, graphs of 1/4/16/64 kernel nodes:
    host cuGraphLaunch vs a one-node outer graph that device-launches them;
  * ``plainstream``: the launcher started by cuLaunchKernel (not from a graph): the error code.

Exit status: 0 when it ran to the end, 2 without a GPU (after the CPU part), 1 on a Python error.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from cuda.bindings import driver  # noqa: E402

from rawgraph.runtime.compiler import CompiledImage  # noqa: E402
from rawgraph.runtime.launch import KernelArgs  # noqa: E402
from rawgraph.runtime.memory import DeviceBuffer  # noqa: E402
from rawgraph.runtime.module import Kernel, Module  # noqa: E402
from rawgraph.runtime.stream import Stream  # noqa: E402
from rawgraph.runtime.timing import device_us  # noqa: E402

# The special cudaStream_t values device code passes to cudaGraphLaunch
# (cuda_device_runtime_api.h: cudaStreamGraphTailLaunch, ...FireAndForget, ...AsSibling).
TAIL = 0x0100000000000000
FIRE = 0x0200000000000000
SIBLING = 0x0300000000000000
MODES = {"tail": TAIL, "fire_and_forget": FIRE, "sibling": SIBLING}

WORK_SOURCE = r"""
extern "C" __global__ void bump(unsigned int* counter) {
    if (threadIdx.x == 0 && blockIdx.x == 0) counter[0] += 1u;
}
extern "C" __global__ void snapshot(const unsigned int* counter, unsigned int* snap) {
    if (threadIdx.x == 0 && blockIdx.x == 0) snap[0] = counter[0];
}
extern "C" __global__ void noop() {}
"""

# cudaGraphLaunch from device code, declared as cuda_device_runtime_api.h does (NVRTC declares the
# device runtime API itself only under -rdc; repeating the declaration there is harmless).
LAUNCH_SOURCE = r"""
extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI
cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);

// mode: the special stream handle (tail / fire-and-forget / sibling); 0 launches nothing, so the
// same kernel is the baseline. rc[0]: cudaGraphLaunch's cudaError_t, -1 when nothing launched.
extern "C" __global__ void launch_graph(cudaGraphExec_t graph, unsigned long long mode, int* rc) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int r = -1;
        if (mode != 0ull) r = (int)cudaGraphLaunch(graph, (cudaStream_t)mode);
        rc[0] = r;
    }
}
"""
# The same call with no declaration and the header's macro: what NVRTC says without -rdc.
UNDECLARED = r"""
extern "C" __global__ void launch_graph(cudaGraphExec_t graph, int* rc) {
    rc[0] = (int)cudaGraphLaunch(graph, cudaStreamGraphTailLaunch);
}
"""

STD = "-std=c++17"
# Build variants of the launcher, in the order `time` and `plainstream` prefer them.
VARIANTS = (
    "nonrdc_cubin",  # rawgraph's normal path: NVRTC -> CUBIN, no -rdc, no link
    "rdc_cubin_nvjitlink_devrt",  # -rdc CUBIN + libcudadevrt.a, nvJitLink
    "rdc_ptx_nvjitlink_devrt",  # -rdc PTX + libcudadevrt.a, nvJitLink (cuda.core's test path)
    "rdc_ltoir_nvjitlink_devrt",  # -rdc -dlto LTO-IR + libcudadevrt.a, nvJitLink -lto
    "rdc_cubin_nvjitlink",  # -rdc CUBIN linked alone (no libcudadevrt)
    "rdc_cubin_culink_devrt",  # -rdc CUBIN + libcudadevrt.a, driver cuLink* (needs a context)
    "rdc_cubin_unlinked",  # the relocatable CUBIN handed to cuModuleLoadData as is
)

FLAG = driver.CUgraphInstantiate_flags
DEVICE_LAUNCH = int(FLAG.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
UPLOAD = int(FLAG.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
AUTO_FREE = int(FLAG.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
PRIORITY = int(FLAG.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)


# ------------------------------------------------------------------------------- building
class Builder:
    """Builds the launcher image of each variant once per process (prints every step)."""

    def __init__(self, arch: str, gpu: bool):
        self.arch = arch
        self.gpu = gpu
        self._cache: dict = {}
        self._nj = "unset"
        self._devrt = None

    def nj(self):
        if self._nj == "unset":
            self._nj = C.nvjitlink_module()
            if self._nj is not None:
                import rawgraph

                linker, compiler = tuple(self._nj.version()), tuple(rawgraph.nvrtc_version())
                if linker < compiler:
                    # Seen on the CPU machine with nvJitLink 13.0 and NVRTC 13.5: "bad input" for the
                    # CUBIN, "Unsupported .version 9.5" for the PTX, ERROR_OUTDATED_LIBRARY for LTO-IR.
                    C.note(
                        f"nvJitLink {linker} is older than NVRTC {compiler}: linking NVRTC's output is expected to fail"
                    )
        return self._nj

    def devrt(self):
        if self._devrt is None:
            self._devrt = C.find_cudadevrt()
            if self._devrt:
                C.fact("libcudadevrt used", self._devrt[0])
        return self._devrt[0] if self._devrt else None

    def rdc(self, output: str):
        key = ("rdc", output)
        if key not in self._cache:
            if output == "CUBIN":
                img = C.compile_cubin(LAUNCH_SOURCE, "launch_rdc.cu", self.arch, (STD, "-rdc=true"))
                self._cache[key] = img.image if img else None
            else:
                target = self.arch.replace("sm_", "compute_") if output == "PTX" else self.arch
                opts = [STD, "-rdc=true", f"--gpu-architecture={target}"] + (["-dlto"] if output == "LTOIR" else [])
                data, log = C.nvrtc_compile(LAUNCH_SOURCE, f"launch_rdc_{output.lower()}.cu", opts, output)
                status = "OK" if data is not None else "FAIL " + log.splitlines()[0]
                print(
                    f"STEP nvrtc launch_rdc.cu {' '.join(opts)} -> {output}: {status}"
                    f"{f' ({len(data)} bytes)' if data else ''}",
                    flush=True,
                )
                self._cache[key] = data
        return self._cache[key]

    def image(self, variant: str) -> bytes | None:
        if variant in self._cache:
            return self._cache[variant]
        out = None
        if variant == "nonrdc_cubin":
            img = C.compile_cubin(LAUNCH_SOURCE, "launch_nonrdc.cu", self.arch)
            out = img.image if img else None
        elif variant == "rdc_cubin_unlinked":
            out = self.rdc("CUBIN")
        elif variant.endswith("_nvjitlink") or "_nvjitlink_" in variant:
            kind = variant.split("_")[1]  # cubin / ptx / ltoir
            data = self.rdc(kind.upper())
            nj = self.nj()
            lib = self.devrt() if variant.endswith("_devrt") else None
            if data is not None and nj is not None and (lib or not variant.endswith("_devrt")):
                inputs = [(kind, data)] + ([("library", lib)] if lib else [])
                opts = [f"-arch={self.arch}"] + (["-lto"] if kind == "ltoir" else [])
                out = C.nvjitlink_link(nj, variant, inputs, opts)
            elif nj is None:
                C.note(f"{variant}: nvJitLink unavailable")
            elif variant.endswith("_devrt") and not lib:
                C.note(f"{variant}: no libcudadevrt.a found")
        elif variant == "rdc_cubin_culink_devrt":
            if not self.gpu:
                C.note(f"{variant}: cuLink* needs a GPU context; built on the GPU only")
            else:
                out = culink(self.rdc("CUBIN"), self.devrt())
        if out is not None and variant != "rdc_cubin_unlinked":
            C.report_elf(variant, out)
        self._cache[variant] = out
        return out


def culink(cubin: bytes | None, lib: str | None) -> bytes | None:
    """Link with the driver's JIT linker: cuLinkCreate / cuLinkAddData / cuLinkAddFile / cuLinkComplete."""
    if cubin is None or lib is None:
        C.note(f"cuLink: missing input (rdc cubin {'ok' if cubin else 'missing'}, libcudadevrt {lib})")
        return None
    J = driver.CUjit_option
    info, err = bytearray(8192), bytearray(8192)  # the binding passes bytearrays as char* buffers
    opts = [
        J.CU_JIT_INFO_LOG_BUFFER,
        J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        J.CU_JIT_ERROR_LOG_BUFFER,
        J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        J.CU_JIT_LOG_VERBOSE,
    ]
    state = C.step(
        "cuLinkCreate(log buffers)", driver.cuLinkCreate, len(opts), opts, [info, len(info), err, len(err), 1]
    )
    if state is None:
        return None
    try:
        data = np.frombuffer(cubin, dtype=np.uint8)
        ok = C.step(
            "cuLinkAddData(CU_JIT_INPUT_CUBIN, rdc cubin)",
            driver.cuLinkAddData,
            state,
            driver.CUjitInputType.CU_JIT_INPUT_CUBIN,
            data.ctypes.data,
            len(cubin),
            b"launch_rdc.cubin",
            0,
            None,
            None,
        )
        if ok is not None:
            ok = C.step(
                f"cuLinkAddFile(CU_JIT_INPUT_LIBRARY, {lib})",
                driver.cuLinkAddFile,
                state,
                driver.CUjitInputType.CU_JIT_INPUT_LIBRARY,
                lib.encode(),
                0,
                None,
                None,
            )
        res = C.step("cuLinkComplete", driver.cuLinkComplete, state) if ok is not None else None
        for label, buf in (("info", info), ("error", err)):
            text = bytes(buf).split(b"\0", 1)[0].decode(errors="replace").strip()
            for line in text.splitlines()[:8]:
                print(f"    | cuLink {label}: {line}", flush=True)
        if res is None:
            return None
        ptr, size = res
        out = ctypes.string_at(int(ptr), int(size))  # owned by the link state: copy before destroy
        C.fact("cuLink output bytes", len(out))
        return out
    finally:
        driver.cuLinkDestroy(state)


def cpu_part(arch: str, gpu: bool) -> Builder:
    C.section("special stream handles for device-side cudaGraphLaunch")
    C.fact("TAIL (cudaStreamGraphTailLaunch)", hex(TAIL))
    C.fact("FIRE (cudaStreamGraphFireAndForget)", hex(FIRE))
    C.fact("SIBLING (cudaStreamGraphFireAndForgetAsSibling)", hex(SIBLING))
    pat = re.compile(r"#define\s+(cudaStreamGraph\w+|cudaStreamTailLaunch|cudaStreamFireAndForget)\s+(.*)")
    headers = C.find_headers("cuda_device_runtime_api.h")
    for h in headers:
        with open(h, errors="replace") as f:
            for m in pat.finditer(f.read()):
                C.fact(f"header {h}", f"{m.group(1)} {m.group(2).split('/*')[0].strip()}")
    if not headers:
        C.note("no cuda_device_runtime_api.h on disk; values above are from the CUDA 13.0 header")

    C.section(f"NVRTC: the work kernels and the launcher kernel ({arch})")
    C.compile_cubin(WORK_SOURCE, "work.cu", arch)
    C.compile_cubin(UNDECLARED, "launch_undeclared.cu", arch)
    b = Builder(arch, gpu)
    b.image("nonrdc_cubin")
    rdc = b.rdc("CUBIN")
    if rdc is not None:
        C.report_elf("rdc_cubin", rdc)
    b.rdc("PTX")
    b.rdc("LTOIR")

    C.section("libcudadevrt.a and nvJitLink on this machine")
    b.devrt()
    b.nj()
    for v in (
        "rdc_cubin_nvjitlink",
        "rdc_cubin_nvjitlink_devrt",
        "rdc_ptx_nvjitlink_devrt",
        "rdc_ltoir_nvjitlink_devrt",
    ):
        b.image(v)
    return b


# --------------------------------------------------------------------------------- GPU cases
class Gpu:
    def __init__(self, dev, builder: Builder):
        self.dev = dev
        self.b = builder
        work = C.compile_cubin(WORK_SOURCE, "work.cu", dev.arch)
        if work is None:
            raise SystemExit("work kernels did not compile")
        self.wmod = Module(work, dev)
        self.k = {n: Kernel(self.wmod, n, n) for n in ("bump", "snapshot", "noop")}
        self.stream = Stream()
        self.counter = DeviceBuffer(1, np.uint32)
        self.snap_graph = DeviceBuffer(1, np.uint32)
        self.snap_stream = DeviceBuffer(1, np.uint32)
        self.rc = DeviceBuffer(1, np.int32)
        self.keep: list = []
        self.graphs: list = []
        self.execs: list = []

    # small helpers ------------------------------------------------------------------------
    def args(self, spec, **values):
        a = KernelArgs(spec)
        a.update(values)
        self.keep.append(a)
        return a

    def set(self, buf, v):
        buf.copy_from_host(np.array([v], dtype=buf.dtype), stream=self.stream)

    def get(self, buf) -> int:
        return int(buf.to_numpy(stream=self.stream)[0])

    def graph(self, name):
        g = C.step(f"{name} cuGraphCreate", driver.cuGraphCreate, 0, quiet=True)
        if g is not None:
            self.graphs.append(g)
        return g

    def bump_chain(self, name, n):
        g = self.graph(name)
        prev = []
        for i in range(n):
            node = C.add_kernel_node(
                f"{name}[{i}]", g, prev, self.k["bump"], self.args([("c", "ptr")], c=self.counter.ptr)
            )
            if node is None:
                return None
            prev = [node]
        return g

    def instantiate(self, name, graph, flags=0, upload_stream=None, with_params=True):
        """Instantiate (WithParams by default, to read result_out); print flags; own the exec."""
        if not with_params:
            exe = C.step(f"{name} cuGraphInstantiate(flags=0x{flags:x})", driver.cuGraphInstantiate, graph, flags)
        else:
            ip = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
            ip.flags = flags
            if upload_stream is not None:
                ip.hUploadStream = upload_stream.handle
            exe = C.step(
                f"{name} cuGraphInstantiateWithParams(flags=0x{flags:x}{', upload stream' if upload_stream else ''})",
                driver.cuGraphInstantiateWithParams,
                graph,
                ip,
            )
            C.fact(f"{name}.result_out", getattr(ip.result_out, "name", ip.result_out))
        if exe is not None:
            self.execs.append(exe)
            fl = C.step(f"{name} cuGraphExecGetFlags", driver.cuGraphExecGetFlags, exe, quiet=True)
            C.fact(f"{name}.exec_flags", None if fl is None else hex(int(fl)))
        return exe

    def sync(self, name="") -> bool:
        return (
            C.step(f"cuStreamSynchronize {name}", driver.cuStreamSynchronize, self.stream.handle, quiet=True)
            is not None
        )

    def host_launch_check(self, name, exe, per_launch):
        self.set(self.counter, 0)
        if C.step(f"{name} host cuGraphLaunch", driver.cuGraphLaunch, exe, self.stream.handle) is None or not self.sync(
            name
        ):
            return
        got = self.get(self.counter)
        C.check(f"{name} ran from the host", got == per_launch, f"counter={got} expected={per_launch}")

    def load_launcher(self, variant):
        image = self.b.image(variant)
        if image is None:
            print(f"RESULT load {variant}: no image", flush=True)
            return None
        try:
            mod = Module(CompiledImage(image, "cubin", self.dev.arch), self.dev)
            k = Kernel(mod, "launch_graph", "launch_graph")
        except Exception as exc:
            print(
                f"STEP cuModuleLoadData/cuModuleGetFunction({variant}): FAIL {getattr(exc, 'name', type(exc).__name__)}: {exc}",
                flush=True,
            )
            print(f"RESULT load {variant}: failed", flush=True)
            return None
        print(f"STEP cuModuleLoadData({variant}) + cuModuleGetFunction(launch_graph): OK ({k!r})", flush=True)
        self.keep.append(mod)
        return k

    def outer(self, name, launcher, inner_exec, mode):
        """Outer graph: launch_graph(inner, mode, rc) -> snapshot(counter -> snap_graph)."""
        g = self.graph(name)
        a = self.args(
            [("g", "u64"), ("mode", "u64"), ("rc", "ptr")],
            g=int(inner_exec) if inner_exec else 0,
            mode=mode,
            rc=self.rc.ptr,
        )
        n1 = C.add_kernel_node(f"{name} launcher", g, [], launcher, a)
        if n1 is None:
            return None
        s = self.args([("c", "ptr"), ("s", "ptr")], c=self.counter.ptr, s=self.snap_graph.ptr)
        if C.add_kernel_node(f"{name} snapshot", g, [n1], self.k["snapshot"], s) is None:
            return None
        return self.instantiate(name, g, 0, with_params=False)

    def stream_snapshot(self):
        a = self.args([("c", "ptr"), ("s", "ptr")], c=self.counter.ptr, s=self.snap_stream.ptr)
        return C.step(
            "cuLaunchKernel(snapshot) after the outer graph",
            driver.cuLaunchKernel,
            self.k["snapshot"].handle,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            self.stream.handle,
            a.address,
            0,
            quiet=True,
        )

    def close(self):
        for e in self.execs:
            driver.cuGraphExecDestroy(e)
        for g in self.graphs:
            driver.cuGraphDestroy(g)


def cuda_error_name(code: int) -> str:
    if code == -1:
        return "not launched (mode 0)"
    if code == -2:
        return "rc not written: the launcher kernel did not run"
    try:
        from cuda.bindings import runtime

        return runtime.cudaError_t(code).name
    except Exception:
        return f"cudaError {code}"


def case_instantiate(G: Gpu):
    C.section("(a) instantiate for device launch")
    g = G.bump_chain("k2", 2)
    if g is None:
        return
    cases = [
        ("cuGraphInstantiate DEVICE_LAUNCH", DEVICE_LAUNCH, None, False),
        ("cuGraphInstantiate DEVICE_LAUNCH|UPLOAD (no stream to give)", DEVICE_LAUNCH | UPLOAD, None, False),
        ("WithParams DEVICE_LAUNCH", DEVICE_LAUNCH, None, True),
        ("WithParams DEVICE_LAUNCH|UPLOAD + hUploadStream", DEVICE_LAUNCH | UPLOAD, G.stream, True),
        ("WithParams DEVICE_LAUNCH|AUTO_FREE_ON_LAUNCH", DEVICE_LAUNCH | AUTO_FREE, None, True),
        ("WithParams DEVICE_LAUNCH|USE_NODE_PRIORITY", DEVICE_LAUNCH | PRIORITY, None, True),
        ("WithParams DEVICE_LAUNCH again (a second exec of the same graph)", DEVICE_LAUNCH, None, True),
    ]
    for name, flags, up, wp in cases:
        exe = G.instantiate(name, g, flags, up, wp)
        if exe is not None:
            C.step(f"{name} cuGraphUpload", driver.cuGraphUpload, exe, G.stream.handle)
            G.host_launch_check(name, exe, 2)

    C.section("(a) DEVICE_LAUNCH on graphs with other node types")
    ctx = G.dev.context

    def try_graph(name, fill, per_launch):
        gg = G.graph(name)
        if gg is None or not C.guarded(f"fill {name}", lambda: fill(gg)):
            return
        exe = G.instantiate(name, gg, DEVICE_LAUNCH)
        if exe is not None:
            C.step(f"{name} cuGraphUpload", driver.cuGraphUpload, exe, G.stream.handle, quiet=True)
            if per_launch is not None:
                G.host_launch_check(name, exe, per_launch)

    try_graph("empty graph", lambda gg: True, None)
    try_graph(
        "empty node only",
        lambda gg: C.step("cuGraphAddEmptyNode", driver.cuGraphAddEmptyNode, gg, [], 0) is not None,
        None,
    )

    def memset(gg):
        p = driver.CUDA_MEMSET_NODE_PARAMS()
        p.dst, p.value, p.elementSize, p.width, p.height, p.pitch = G.counter.ptr, 5, 4, 1, 1, 0
        G.keep.append(p)
        return C.step("cuGraphAddMemsetNode", driver.cuGraphAddMemsetNode, gg, [], 0, p, ctx) is not None

    try_graph("memset node (value 5)", memset, 5)

    def memcpy(gg):
        src = DeviceBuffer(1, np.uint32)
        src.copy_from_host(np.array([7], np.uint32), stream=G.stream)
        G.keep.append(src)
        p = driver.CUDA_MEMCPY3D()
        p.srcMemoryType = p.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice, p.dstDevice = src.ptr, G.counter.ptr
        p.WidthInBytes, p.Height, p.Depth = 4, 1, 1
        G.keep.append(p)
        return C.step("cuGraphAddMemcpyNode(DtoD 4 B)", driver.cuGraphAddMemcpyNode, gg, [], 0, p, ctx) is not None

    try_graph("memcpy node DtoD (value 7)", memcpy, 7)

    def child(gg):
        inner = G.bump_chain("child body", 3)
        return (
            inner is not None
            and C.step("cuGraphAddChildGraphNode", driver.cuGraphAddChildGraphNode, gg, [], 0, inner) is not None
        )

    try_graph("child graph node (3 bumps)", child, 3)

    def conditional(gg):
        h = C.step(
            "cuGraphConditionalHandleCreate(default 1, ASSIGN_DEFAULT)",
            driver.cuGraphConditionalHandleCreate,
            gg,
            ctx,
            1,
            int(driver.CU_GRAPH_COND_ASSIGN_DEFAULT),
        )
        if h is None:
            return False
        p = driver.CUgraphNodeParams()
        p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        p.conditional.handle, p.conditional.type = h, driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
        p.conditional.size, p.conditional.ctx = 1, ctx
        G.keep.append(p)
        node = C.step("cuGraphAddNode(CONDITIONAL IF)", driver.cuGraphAddNode, gg, [], None, 0, p)
        if node is None:
            return False
        body = p.conditional.phGraph_out[0]
        return C.add_kernel_node("IF body", body, [], G.k["bump"], G.args([("c", "ptr")], c=G.counter.ptr)) is not None

    try_graph("conditional IF node (default 1) with a bump body", conditional, 1)


def device_launch_once(G: Gpu, label, outer_exec, expect):
    """One outer launch + a stream-ordered snapshot; prints rc, counter and both snapshots."""
    for b in (G.counter, G.snap_graph, G.snap_stream):
        G.set(b, 0)
    G.set(G.rc, -2)
    if C.step(f"{label} cuGraphLaunch(outer)", driver.cuGraphLaunch, outer_exec, G.stream.handle, quiet=True) is None:
        return False
    G.stream_snapshot()
    if not G.sync(label):
        return False
    rc, cnt, sg, ss = G.get(G.rc), G.get(G.counter), G.get(G.snap_graph), G.get(G.snap_stream)
    C.fact(
        f"{label}",
        f"rc={rc} ({cuda_error_name(rc)}) counter={cnt} snapshot_in_outer_graph={sg} snapshot_on_stream_after={ss}",
    )
    return C.check(f"{label} device-launched graph ran", cnt == expect and rc == 0, f"counter={cnt} expected={expect}")


def case_run(G: Gpu, variant: str) -> bool:
    C.section(f"(c) device launch, launcher built as {variant}")
    launcher = G.load_launcher(variant)
    if launcher is None:
        return False
    g = G.bump_chain("inner", 1)
    inner = G.instantiate("inner DEVICE_LAUNCH", g, DEVICE_LAUNCH) if g is not None else None
    if inner is None or C.step("inner cuGraphUpload", driver.cuGraphUpload, inner, G.stream.handle) is None:
        return False
    G.sync("upload")
    any_ok = False
    for mode_name, mode in MODES.items():
        outer = G.outer(f"outer[{mode_name}]", launcher, inner, mode)
        if outer is None:
            continue
        ok = device_launch_once(G, f"{variant} {mode_name}", outer, 1)
        any_ok |= bool(ok)
        if ok:  # ten outer launches back to back, one sync
            G.set(G.counter, 0)
            for _ in range(10):
                driver.cuGraphLaunch(outer, G.stream.handle)
            if G.sync("x10"):
                got = G.get(G.counter)
                C.check(f"{variant} {mode_name} x10", got == 10, f"counter={got}")
    # The inner exec instantiated WITHOUT the device-launch flag, launched from the device.
    plain = G.instantiate("inner plain (no DEVICE_LAUNCH)", g, 0, with_params=False)
    if plain is not None:
        outer = G.outer("outer[fire, plain inner]", launcher, plain, FIRE)
        if outer is not None:
            device_launch_once(G, f"{variant} fire_and_forget of a non-device exec", outer, 1)
    st = C.raw_step("", driver.cuCtxSynchronize)[0]
    C.fact(f"{variant} context after run (cuCtxSynchronize)", st)
    print(f"RESULT run {variant}: {'ok' if any_ok and st == 'OK' else 'failed'}", flush=True)
    return any_ok


def case_time(G: Gpu, variant: str, sizes, rounds: int):
    C.section(f"(c) timing: host cuGraphLaunch vs device launch (launcher {variant}), events, median of {rounds}")
    launcher = G.load_launcher(variant)
    if launcher is None:
        return
    warmup = 20
    table = []
    for n in sizes:
        g = G.bump_chain(f"chain{n}", n)
        if g is None:
            continue
        plain = G.instantiate(f"chain{n} plain", g, 0, with_params=False)
        dexec = G.instantiate(f"chain{n} DEVICE_LAUNCH", g, DEVICE_LAUNCH, with_params=False)
        if dexec is None or C.step("cuGraphUpload", driver.cuGraphUpload, dexec, G.stream.handle, quiet=True) is None:
            continue
        G.sync()
        outers = {m: G.outer(f"outer{n}[{m}]", launcher, dexec, v) for m, v in (("launcher_only", 0), *MODES.items())}
        row = {"n": n}
        runs = [("host_plain", plain, n), ("host_devexec", dexec, n)] + [
            (m, outers[m], 0 if m == "launcher_only" else n) for m in outers
        ]
        for name, exe, per in runs:
            if exe is None:
                continue
            G.set(G.counter, 0)
            sh = G.stream.handle

            def fn(exe=exe, sh=sh):
                (err,) = driver.cuGraphLaunch(exe, sh)
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(C.error_name(err))

            samples = C.guarded(f"time {name} n={n}", lambda: device_us(fn, G.stream, rounds=rounds, warmup=warmup))
            if not samples:
                continue
            s = C.median_line(f"n={n} {name}", samples)
            row[name] = s["median"]
            got = G.get(G.counter)
            want = (rounds + warmup) * per
            C.check(f"n={n} {name} ran every time", got == want, f"counter={got} expected={want}")
        table.append(row)
    cols = ["host_plain", "host_devexec", "launcher_only", *MODES]
    print("TABLE device launch (median us): n " + " ".join(cols), flush=True)
    for row in table:
        print("TABLE " + f"{row['n']} " + " ".join(f"{row[c]:.2f}" if c in row else "-" for c in cols), flush=True)


def case_plainstream(G: Gpu, variant: str):
    C.section(f"launcher started by cuLaunchKernel on a stream (not from a graph), {variant}")
    launcher = G.load_launcher(variant)
    g = G.bump_chain("inner", 1)
    inner = G.instantiate("inner DEVICE_LAUNCH", g, DEVICE_LAUNCH) if g is not None else None
    if launcher is None or inner is None:
        return
    C.step("inner cuGraphUpload", driver.cuGraphUpload, inner, G.stream.handle)
    for mode_name, mode in MODES.items():
        G.set(G.counter, 0)
        G.set(G.rc, -2)
        a = G.args([("g", "u64"), ("mode", "u64"), ("rc", "ptr")], g=int(inner), mode=mode, rc=G.rc.ptr)
        C.step(
            f"cuLaunchKernel(launch_graph, {mode_name})",
            driver.cuLaunchKernel,
            launcher.handle,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            G.stream.handle,
            a.address,
            0,
        )
        st = C.raw_step("", driver.cuStreamSynchronize, G.stream.handle)[0]
        C.fact(f"plain stream {mode_name} cuStreamSynchronize", st)
        if st != "OK":
            break
        rc = G.get(G.rc)
        C.fact(f"plain stream {mode_name}", f"rc={rc} ({cuda_error_name(rc)}) counter={G.get(G.counter)}")


# ------------------------------------------------------------------------------------- main
def child_main(args) -> int:
    dev = C.gpu_device()
    if dev is None:
        C.exit_no_gpu()
    G = C.guarded("setup (work kernels, buffers)", lambda: Gpu(dev, Builder(dev.arch, True)))
    if G is None:
        return 0
    try:
        if args.case == "instantiate":
            C.guarded("instantiate", lambda: case_instantiate(G))
        elif args.case == "run":
            C.guarded(f"run {args.variant}", lambda: case_run(G, args.variant))
        elif args.case == "time":
            sizes = [int(s) for s in args.sizes.split(",") if s]
            C.guarded(f"time {args.variant}", lambda: case_time(G, args.variant, sizes, args.rounds))
        elif args.case == "plainstream":
            C.guarded(f"plainstream {args.variant}", lambda: case_plainstream(G, args.variant))
    finally:
        G.close()
    return 0


def run_child(argv: list[str], timeout: int) -> str:
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    print(f"\n=== child: {' '.join(argv)}", flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out = r.stdout + (("\n" + r.stderr) if r.stderr.strip() else "")
        print(out.rstrip(), flush=True)
        print(f"=== child exit status {r.returncode}: {' '.join(argv)}", flush=True)
        return out
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        print(out.rstrip(), flush=True)
        print(f"=== child TIMEOUT after {timeout} s: {' '.join(argv)}", flush=True)
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--sizes", default="1,4,16,64")
    ap.add_argument("--case", choices=("instantiate", "run", "time", "plainstream"), help=argparse.SUPPRESS)
    ap.add_argument("--variant", default=VARIANTS[0], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        return child_main(args)

    C.section("environment")
    C.env_report()
    dev = C.gpu_device()
    arch = C.target_arch(dev)
    cpu_part(arch, dev is not None)
    if dev is None:
        C.exit_no_gpu()
    run_child(["--case", "instantiate"], 180)
    working = []
    for v in VARIANTS:
        out = run_child(["--case", "run", "--variant", v], 180)
        if f"RESULT run {v}: ok" in out:
            working.append(v)
    C.fact("variants whose device launch worked", working or "none")
    if working:
        run_child(["--case", "time", "--variant", working[0], "--sizes", args.sizes, "--rounds", str(args.rounds)], 420)
        run_child(["--case", "plainstream", "--variant", working[0]], 120)
    print("DONE device_launch", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
