"""Probe: conditional graph nodes (IF, IF/ELSE, WHILE, SWITCH) through the driver API.

    PYTHONPATH=. python3 benchmarks/probes/conditional_nodes.py [--rounds 200]

CPU part (runs anywhere NVRTC does): compiles the probe kernels, which call the device-runtime
builtin ``cudaGraphSetConditional``, to an sm_90 CUBIN *without* -rdc, and lists the CUBIN's
undefined symbols (the builtin stays an undefined ``FUNC`` that the driver resolves at load time).

GPU part: builds one graph per conditional type with explicit nodes
(``cuGraphConditionalHandleCreate`` + ``cuGraphAddNode`` with ``CU_GRAPH_NODE_TYPE_CONDITIONAL``),
fills each body with one kernel node, launches with several device-side condition values and
reads back which body ran; then the same IF node added during stream capture
(``cuStreamGetCaptureInfo`` -> ``cuGraphAddNode`` -> ``cuStreamUpdateCaptureDependencies``, body
captured with ``cuStreamBeginCaptureToGraph``); ``cuGraphClone``, ``cuGraphExecUpdate`` and
``cuGraphExecKernelNodeSetParams`` on a body node; and event timings of the node's cost.

Exit status: 0 when it ran to the end (whatever the driver refused: refusals are findings),
2 when there is no GPU (after the CPU part), 1 on an unexpected Python error.
"""

from __future__ import annotations

import argparse
import os
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

# cudaGraphSetConditional lives in the device runtime. NVRTC declares the device-runtime API only
# when compiling with -rdc; without it the call is "identifier undefined". cuda.core's tests
# (cuda_core/tests/helpers/graph_kernels.py) declare the builtin themselves, the way
# cuda_device_runtime_api.h does: extern "C" __device__ __cudart_builtin__ ... CUDARTAPI. We do
# the same; the CUBIN then carries an undefined cudaGraphSetConditional that the driver binds.
SOURCE = r"""
extern "C" __device__ __cudart_builtin__ void CUDARTAPI
cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

// The condition for the next conditional node, read from device memory at run time.
extern "C" __global__ void set_cond(cudaGraphConditionalHandle h, const unsigned int* value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(h, *value);
}

// A body marker: counters[slot] += 1 (one thread; bodies run one at a time).
extern "C" __global__ void bump(unsigned int* counters, unsigned int slot) {
    if (threadIdx.x == 0 && blockIdx.x == 0) counters[slot] += 1u;
}

// WHILE: the prologue sets the first condition (remaining > 0); the body decrements, counts the
// iteration and sets the condition for the next check.
extern "C" __global__ void while_prologue(cudaGraphConditionalHandle h, const unsigned int* remaining) {
    if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(h, *remaining > 0u ? 1u : 0u);
}
extern "C" __global__ void while_body(cudaGraphConditionalHandle h, unsigned int* remaining, unsigned int* iterations) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned int r = *remaining;
        r = r ? r - 1u : 0u;
        *remaining = r;
        *iterations += 1u;
        cudaGraphSetConditional(h, r > 0u ? 1u : 0u);
    }
}

extern "C" __global__ void noop() {}
"""
# The same call with no declaration: NVRTC refuses it without -rdc, accepts it with -rdc.
UNDECLARED = 'extern "C" __global__ void x(cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, 1u); }\n'
KERNELS = ("set_cond", "bump", "while_prologue", "while_body", "noop")

NODE_T = driver.CUgraphNodeType
COND_T = driver.CUgraphConditionalNodeType
ASSIGN_DEFAULT = int(driver.CU_GRAPH_COND_ASSIGN_DEFAULT)
SET_DEPS = driver.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES
MODE_GLOBAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL


# ------------------------------------------------------------------------------- CPU part
def cpu_part(arch: str) -> CompiledImage | None:
    C.section(f"NVRTC: cudaGraphSetConditional without -rdc ({arch})")
    # Without the declaration: the exact error NVRTC gives (expected to fail).
    C.compile_cubin(UNDECLARED, "cond_undeclared.cu", arch)
    img = C.compile_cubin(SOURCE, "probe_conditional.cu", arch)
    if img is not None:
        info = C.report_elf("conditional_cubin", img.image)
        C.check(
            "conditional_cubin defines every probe kernel",
            all(k in info["defined_funcs"] for k in KERNELS),
            str(sorted(info["defined_funcs"])),
        )
        C.check(
            "conditional_cubin leaves cudaGraphSetConditional undefined (driver resolves it)",
            any(n == "cudaGraphSetConditional" for n, _, _ in info["undefined"]),
        )
    # With -rdc NVRTC declares the device runtime itself: the undeclared form compiles too.
    C.compile_cubin(UNDECLARED, "cond_undeclared_rdc.cu", arch, ("-std=c++17", "-rdc=true"))
    # The struct the driver fills in: field names of this cuda.bindings.
    p = driver.CUgraphNodeParams()
    C.fact("CUgraphNodeParams.fields", [a for a in dir(p) if not a.startswith("_")])
    C.fact("CUDA_CONDITIONAL_NODE_PARAMS.fields", [a for a in dir(p.conditional) if not a.startswith("_")])
    C.fact("CUgraphConditionalNodeType", [t.name for t in COND_T])
    C.fact("CU_GRAPH_COND_ASSIGN_DEFAULT", ASSIGN_DEFAULT)
    return img


# ------------------------------------------------------------------------------ GPU helpers
class Probe:
    """Holds the device, kernels, buffers and everything the driver must not outlive."""

    def __init__(self, dev, img: CompiledImage):
        self.dev = dev
        self.ctx = dev.context
        self.module = Module(img, dev)
        self.k = {name: Kernel(self.module, name, name) for name in KERNELS}
        self.stream = Stream()
        self.counters = DeviceBuffer(8, np.uint32)
        self.value = DeviceBuffer(1, np.uint32)
        self.remaining = DeviceBuffer(1, np.uint32)
        self.iterations = DeviceBuffer(1, np.uint32)
        self.keep: list = []  # KernelArgs and node params the driver read from
        self.graphs: list = []
        self.execs: list = []

    def args(self, spec, **values) -> KernelArgs:
        a = KernelArgs(spec)
        a.update(values)
        self.keep.append(a)
        return a

    def set_u32(self, buf: DeviceBuffer, v: int) -> None:
        buf.copy_from_host(np.array([v] * buf.size, dtype=np.uint32), stream=self.stream)

    def read(self, buf: DeviceBuffer) -> list[int]:
        return [int(v) for v in buf.to_numpy(stream=self.stream)]

    def new_graph(self, name: str):
        g = C.step(f"{name} cuGraphCreate", driver.cuGraphCreate, 0, quiet=True)
        if g is not None:
            self.graphs.append(g)
        return g

    def node(self, name, graph, deps, kernel, **values):
        spec = {
            "set_cond": [("h", "u64"), ("value", "ptr")],
            "bump": [("counters", "ptr"), ("slot", "i32")],
            "while_prologue": [("h", "u64"), ("remaining", "ptr")],
            "while_body": [("h", "u64"), ("remaining", "ptr"), ("iterations", "ptr")],
            "noop": [],
        }[kernel]
        return C.add_kernel_node(f"{name}/{kernel}", graph, list(deps), self.k[kernel], self.args(spec, **values))

    def handle(self, name, graph, default=0, flags=ASSIGN_DEFAULT):
        return C.step(
            f"{name} cuGraphConditionalHandleCreate(default={default}, flags={flags})",
            driver.cuGraphConditionalHandleCreate,
            graph,
            self.ctx,
            default,
            flags,
        )

    def cond_params(self, handle, ctype, size):
        p = driver.CUgraphNodeParams()
        p.type = NODE_T.CU_GRAPH_NODE_TYPE_CONDITIONAL
        p.conditional.handle = handle
        p.conditional.type = ctype
        p.conditional.size = size
        p.conditional.ctx = self.ctx
        self.keep.append(p)
        return p

    def add_cond(self, name, graph, deps, handle, ctype, size):
        """``cuGraphAddNode`` of a conditional node; returns (node, [body graphs]) or (None, [])."""
        p = self.cond_params(handle, ctype, size)
        node = C.step(
            f"{name} cuGraphAddNode(CONDITIONAL {ctype.name} size={size})",
            driver.cuGraphAddNode,
            graph,
            list(deps),
            None,
            len(deps),
            p,
        )
        if node is None:
            return None, []
        bodies = list(p.conditional.phGraph_out)  # driver-owned array, `size` entries
        C.fact(f"{name}.phGraph_out", [hex(int(b)) for b in bodies])
        return node, bodies

    def instantiate(self, name, graph, flags=0):
        exe = C.step(f"{name} cuGraphInstantiate", driver.cuGraphInstantiate, graph, flags)
        if exe is None:
            # Ask again with params to learn the instantiate result and the failing node.
            ip = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
            ip.flags = flags
            st, res = C.raw_step("", driver.cuGraphInstantiateWithParams, graph, ip)
            C.fact(
                f"{name}.instantiate_result",
                f"{st} result_out={getattr(ip.result_out, 'name', ip.result_out)} errNode=0x{int(ip.hErrNode_out):x}",
            )
            if st == "OK":
                driver.cuGraphExecDestroy(res[1])
            return None
        self.execs.append(exe)
        return exe

    def launch(self, name, exe) -> bool:
        ok = C.step(f"{name} cuGraphLaunch", driver.cuGraphLaunch, exe, self.stream.handle, quiet=True)
        if ok is None:
            return False
        return (
            C.step(f"{name} cuStreamSynchronize", driver.cuStreamSynchronize, self.stream.handle, quiet=True)
            is not None
        )

    def node_types(self, graph) -> list[str]:
        r = C.step("cuGraphGetNodes(count)", driver.cuGraphGetNodes, graph, 0, quiet=True)
        if r is None:
            return []
        n = int(r[1])
        r = C.step("cuGraphGetNodes", driver.cuGraphGetNodes, graph, n, quiet=True) if n else None
        if r is None:
            return []
        out = []
        for nd in list(r[0] or [])[:n]:
            t = C.step("cuGraphNodeGetType", driver.cuGraphNodeGetType, nd, quiet=True)
            out.append(t.name.replace("CU_GRAPH_NODE_TYPE_", "") if t is not None else "?")
        return out

    def close(self):
        for e in self.execs:
            driver.cuGraphExecDestroy(e)
        for g in self.graphs:
            driver.cuGraphDestroy(g)
        self.execs, self.graphs = [], []


# --------------------------------------------------------------------------- explicit graphs
def explicit_graph(P: Probe, label: str, ctype, size: int):
    """set_cond(h, *value) -> conditional(size) with body i = bump(counters, i)."""
    g = P.new_graph(label)
    if g is None:
        return None
    h = P.handle(label, g)
    if h is None:
        return None
    pre = P.node(label, g, [], "set_cond", h=int(h), value=P.value.ptr)
    if pre is None:
        return None
    node, bodies = P.add_cond(label, g, [pre], h, ctype, size)
    if node is None:
        return None
    body_nodes = []
    for i, body in enumerate(bodies):
        body_nodes.append(P.node(f"{label}.body{i}", body, [], "bump", counters=P.counters.ptr, slot=i))
    C.fact(f"{label}.node_types", P.node_types(g))
    exe = P.instantiate(label, g)
    return {"graph": g, "exec": exe, "handle": h, "node": node, "bodies": bodies, "body_nodes": body_nodes}


def run_branches(P: Probe, label: str, built, values, expected):
    """Launch with each condition value; print which body slots ran; compare with ``expected``."""
    if built is None or built["exec"] is None:
        C.note(f"{label}: not launched (build or instantiate failed above)")
        return
    for v, want in zip(values, expected, strict=True):
        P.set_u32(P.counters, 0)
        P.set_u32(P.value, v)
        if not P.launch(f"{label} value={v}", built["exec"]):
            return
        got = P.read(P.counters)[: max(1, len(built["bodies"]))]
        ran = [i for i, c in enumerate(got) if c]
        C.check(f"{label} value={v}", ran == want, f"bodies run={ran} expected={want} counters={got}")


def explicit_part(P: Probe):
    C.section("explicit graphs: IF, IF/ELSE (size 2), SWITCH (size 3), WHILE")
    b = explicit_graph(P, "IF", COND_T.CU_GRAPH_COND_TYPE_IF, 1)
    run_branches(P, "IF", b, [0, 1, 7], [[], [0], [0]])
    b2 = explicit_graph(P, "IF_ELSE", COND_T.CU_GRAPH_COND_TYPE_IF, 2)
    run_branches(P, "IF_ELSE", b2, [0, 1, 7], [[1], [0], [0]])
    sw = explicit_graph(P, "SWITCH", COND_T.CU_GRAPH_COND_TYPE_SWITCH, 3)
    run_branches(P, "SWITCH", sw, [0, 1, 2, 3, 100], [[0], [1], [2], [], []])

    # WHILE: prologue sets (remaining > 0); body decrements and re-arms.
    g = P.new_graph("WHILE")
    wh = None
    if g is not None:
        h = P.handle("WHILE", g)
        pre = P.node("WHILE", g, [], "while_prologue", h=int(h), remaining=P.remaining.ptr) if h is not None else None
        if pre is not None:
            node, bodies = P.add_cond("WHILE", g, [pre], h, COND_T.CU_GRAPH_COND_TYPE_WHILE, 1)
            if node is not None:
                P.node(
                    "WHILE.body0",
                    bodies[0],
                    [],
                    "while_body",
                    h=int(h),
                    remaining=P.remaining.ptr,
                    iterations=P.iterations.ptr,
                )
                exe = P.instantiate("WHILE", g)
                wh = exe
                for n in (0, 1, 5, 40):
                    P.set_u32(P.iterations, 0)
                    P.set_u32(P.remaining, n)
                    if exe is None or not P.launch(f"WHILE remaining={n}", exe):
                        break
                    it = P.read(P.iterations)[0]
                    C.check(
                        f"WHILE remaining={n}", it == n, f"iterations={it} remaining_after={P.read(P.remaining)[0]}"
                    )

    # Sizes the documentation disallows (WHILE 2, IF 3, SWITCH 0): what the driver answers.
    g = P.new_graph("bad_sizes")
    if g is not None:
        h = P.handle("bad_sizes", g)
        if h is not None:
            P.add_cond("WHILE size=2", g, [], h, COND_T.CU_GRAPH_COND_TYPE_WHILE, 2)
            P.add_cond("IF size=3", g, [], h, COND_T.CU_GRAPH_COND_TYPE_IF, 3)
            P.add_cond("SWITCH size=0", g, [], h, COND_T.CU_GRAPH_COND_TYPE_SWITCH, 0)
    return b, wh


def clone_update_part(P: Probe, built):
    C.section("cuGraphClone / cuGraphExecUpdate / cuGraphExecKernelNodeSetParams with a conditional node")
    if built is None or built["exec"] is None:
        C.note("IF graph unavailable; skipped")
        return
    clone = C.step("cuGraphClone(graph with IF node)", driver.cuGraphClone, built["graph"])
    if clone is not None:
        P.graphs.append(clone)
        C.fact("clone.node_types", P.node_types(clone))
        exe = P.instantiate("clone", clone)
        if exe is not None:
            P.set_u32(P.counters, 0)
            P.set_u32(P.value, 1)
            if P.launch("clone value=1", exe):
                C.check("clone runs its IF body", P.read(P.counters)[0] == 1, f"counters={P.read(P.counters)[:3]}")
    # Whole-graph update with the graph the exec came from (topology identical by construction).
    st, res = C.raw_step("", driver.cuGraphExecUpdate, built["exec"], built["graph"])
    info = res[1] if res is not None and len(res) > 1 else None
    result = getattr(getattr(info, "result", None), "name", None)
    C.fact("cuGraphExecUpdate(exec, its own graph)", f"{st} resultInfo.result={result}")
    # Re-point the IF body's kernel node in the exec: slot 0 -> slot 3.
    body_node = built["body_nodes"][0] if built["body_nodes"] else None
    if body_node is not None:
        a = P.args([("counters", "ptr"), ("slot", "i32")], counters=P.counters.ptr, slot=3)
        ok = C.step(
            "cuGraphExecKernelNodeSetParams(exec, IF body node, slot=3)",
            driver.cuGraphExecKernelNodeSetParams,
            built["exec"],
            body_node,
            C.kernel_node_params(P.k["bump"], a),
        )
        if ok is not None:
            P.set_u32(P.counters, 0)
            P.set_u32(P.value, 1)
            if P.launch("IF after body SetParams", built["exec"]):
                got = P.read(P.counters)
                C.check(
                    "exec body node re-pointed (counters[3] bumped, [0] not)",
                    got[3] == 1 and got[0] == 0,
                    f"counters={got[:4]}",
                )
        # And the conditional node itself: cuGraphExecNodeSetParams (documented unsupported).
        p = P.cond_params(built["handle"], COND_T.CU_GRAPH_COND_TYPE_IF, 1)
        C.step(
            "cuGraphExecNodeSetParams(exec, conditional node)",
            driver.cuGraphExecNodeSetParams,
            built["exec"],
            built["node"],
            p,
        )


# --------------------------------------------------------------------------- stream capture
def _capture_info(label, sh):
    """``cuStreamGetCaptureInfo`` (v3 in 13.x): (status, id, graph, deps, edges, count), trimmed."""
    info = C.step(f"cuStreamGetCaptureInfo(s) {label}", driver.cuStreamGetCaptureInfo, sh)
    if info is None:
        return None
    status, cid, cgraph, deps, edges, n = info
    deps = list(deps or [])[:n]  # the arrays may be longer than the count: trim (as cuda.core does)
    edges = list(edges)[:n] if edges else None
    C.fact(
        f"capture_info {label}",
        f"status={status.name} id={int(cid)} graph=0x{int(cgraph):x} ndeps={n} "
        f"deps={[hex(int(d)) for d in deps]} edges="
        f"{None if edges is None else [(int(e.type), int(e.from_port), int(e.to_port)) for e in edges]}",
    )
    return status, cgraph, deps, edges


def _capture_body(P: Probe, s2, sh) -> bool:
    """Inside an open capture on ``sh``: set_cond -> IF node (added by hand) -> bump slot 2."""
    info = _capture_info("#1 (after begin)", sh)
    if info is None:
        return False
    h = P.handle("capture", info[1])
    if h is None:
        return False
    a = P.args([("h", "u64"), ("value", "ptr")], h=int(h), value=P.value.ptr)
    if (
        C.step(
            "cuLaunchKernel(set_cond) into capture",
            driver.cuLaunchKernel,
            P.k["set_cond"].handle,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            sh,
            a.address,
            0,
        )
        is None
    ):
        return False
    info = _capture_info("#2 (after set_cond)", sh)
    if info is None:
        return False
    _status, cgraph, deps, edges = info
    p = P.cond_params(h, COND_T.CU_GRAPH_COND_TYPE_IF, 1)
    node = C.step(
        "cuGraphAddNode(capturing graph, deps, edges, CONDITIONAL IF)",
        driver.cuGraphAddNode,
        cgraph,
        deps,
        edges,
        len(deps),
        p,
    )
    if node is None:
        return False
    if (
        C.step(
            "cuStreamUpdateCaptureDependencies(s, [cond node], None, 1, SET)",
            driver.cuStreamUpdateCaptureDependencies,
            sh,
            [node],
            None,
            1,
            SET_DEPS,
        )
        is None
    ):
        return False
    body = p.conditional.phGraph_out[0]
    # The body is captured on a second stream: `s` itself is capturing.
    if (
        C.step(
            "cuStreamBeginCaptureToGraph(s2, body, no deps, GLOBAL)",
            driver.cuStreamBeginCaptureToGraph,
            s2.handle,
            body,
            None,
            None,
            0,
            MODE_GLOBAL,
        )
        is None
    ):
        return False
    b = P.args([("counters", "ptr"), ("slot", "i32")], counters=P.counters.ptr, slot=0)
    C.step(
        "cuLaunchKernel(bump slot 0) into the body capture",
        driver.cuLaunchKernel,
        P.k["bump"].handle,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        s2.handle,
        b.address,
        0,
    )
    bg = C.step("cuStreamEndCapture(s2)", driver.cuStreamEndCapture, s2.handle)
    if bg is not None:
        C.fact("body capture returned the body graph itself", int(bg) == int(body))
        C.fact("body.node_types", P.node_types(body))
    after = P.args([("counters", "ptr"), ("slot", "i32")], counters=P.counters.ptr, slot=2)
    C.step(
        "cuLaunchKernel(bump slot 2) after the conditional",
        driver.cuLaunchKernel,
        P.k["bump"].handle,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        sh,
        after.address,
        0,
    )
    _capture_info("#3 (after the node that follows)", sh)
    return True


def capture_part(P: Probe):
    C.section("IF node added during stream capture, body captured with cuStreamBeginCaptureToGraph")
    s2 = Stream()
    P.keep.append(s2)
    sh = P.stream.handle
    if C.step("cuStreamBeginCapture(s, GLOBAL)", driver.cuStreamBeginCapture, sh, MODE_GLOBAL) is None:
        return
    body_ok = C.guarded("capture body", lambda: _capture_body(P, s2, sh))
    # Always end the captures, whatever failed, so the streams stay usable.
    if s2.is_capturing():
        C.fact("s2 capture ended late", C.raw_step("", driver.cuStreamEndCapture, s2.handle)[0])
    graph = C.step("cuStreamEndCapture(s)", driver.cuStreamEndCapture, sh)
    if graph is None:
        return
    P.graphs.append(graph)
    if not body_ok:
        return
    C.fact("captured.node_types", P.node_types(graph))
    exe = P.instantiate("captured", graph)
    if exe is not None:
        for v, want in ((0, [0, 0, 1]), (1, [1, 0, 1]), (9, [1, 0, 1])):
            P.set_u32(P.counters, 0)
            P.set_u32(P.value, v)
            if P.launch(f"captured value={v}", exe):
                got = P.read(P.counters)[:3]
                C.check(f"captured IF value={v}", got == want, f"counters[0..2]={got} expected={want}")

    # Negative: capture the body on the capturing stream itself (a separate capture, so a refusal
    # that invalidates it spoils nothing above).
    C.section("refusal: cuStreamBeginCaptureToGraph on a stream that is already capturing")
    if C.step("cuStreamBeginCapture(s, GLOBAL) [negative case]", driver.cuStreamBeginCapture, sh, MODE_GLOBAL) is None:
        return
    info = _capture_info("[negative]", sh)
    if info is not None:
        h = P.handle("negative", info[1])
        if h is not None:
            p = P.cond_params(h, COND_T.CU_GRAPH_COND_TYPE_IF, 1)
            node = C.step(
                "cuGraphAddNode(CONDITIONAL IF, no deps) [negative]", driver.cuGraphAddNode, info[1], [], None, 0, p
            )
            if node is not None:
                C.step(
                    "cuStreamBeginCaptureToGraph(s itself, body)",
                    driver.cuStreamBeginCaptureToGraph,
                    sh,
                    p.conditional.phGraph_out[0],
                    None,
                    None,
                    0,
                    MODE_GLOBAL,
                )
    st, res = C.raw_step("", driver.cuStreamIsCapturing, sh)
    C.fact("s capture status after the refusal", res[1].name if st == "OK" else st)
    r = C.raw_step("", driver.cuStreamEndCapture, sh)
    C.fact("cuStreamEndCapture(s) [negative]", r[0])
    if r[0] == "OK" and r[1][1] is not None and int(r[1][1]):
        P.graphs.append(r[1][1])


# ----------------------------------------------------------------------------------- timing
def timing_part(P: Probe, rounds: int):
    C.section(f"timing: CUDA events around each graph launch, median of {rounds} after warm-up")
    s = P.stream

    def build(label, fill):
        g = P.new_graph(label)
        if g is None or not fill(g):
            return None
        return P.instantiate(label, g)

    def one(g):
        return P.node("A", g, [], "noop") is not None

    def two(g):
        a = P.node("C", g, [], "noop")
        return a is not None and P.node("C", g, [a], "noop") is not None

    def if_body(kind):
        def fill(g):
            h = P.handle(f"B_{kind}", g)
            pre = P.node(f"B_{kind}", g, [], "set_cond", h=int(h), value=P.value.ptr) if h is not None else None
            if pre is None:
                return False
            node, bodies = P.add_cond(f"B_{kind}", g, [pre], h, COND_T.CU_GRAPH_COND_TYPE_IF, 1)
            if node is None:
                return False
            if kind == "kernel":
                return P.node(f"B_{kind}.body", bodies[0], [], "noop") is not None
            if kind == "emptynode":
                return (
                    C.step("cuGraphAddEmptyNode(body)", driver.cuGraphAddEmptyNode, bodies[0], [], 0, quiet=True)
                    is not None
                )
            return True  # "none": leave the body graph with no nodes at all

        return fill

    def timed(label, exe, value=None):
        if exe is None:
            C.note(f"{label}: no exec")
            return None
        if value is not None:
            P.set_u32(P.value, value)
        launch = driver.cuGraphLaunch
        h, sh = exe, s.handle

        def fn():
            (err,) = launch(h, sh)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(C.error_name(err))

        samples = C.guarded(f"time {label}", lambda: device_us(fn, s, rounds=rounds, warmup=20))
        return C.median_line(label, samples) if samples else None

    a = timed("1 kernel (noop)", build("A", one))
    c = timed("2 kernels (noop->noop)", build("C", two))
    bk = build("B_kernel", if_body("kernel"))
    b0 = timed("set_cond + IF{noop}, cond=0 (body skipped)", bk, 0)
    b1 = timed("set_cond + IF{noop}, cond=1 (body runs)", bk, 1)
    be = build("B_emptynode", if_body("emptynode"))
    timed("set_cond + IF{empty node}, cond=1", be, 1)
    bn = build("B_none", if_body("none"))
    timed("set_cond + IF{no nodes}, cond=1", bn, 1)
    if a and c and b0 and b1:
        C.fact(
            "cost: IF node, body skipped ~= (set_cond+IF,cond=0) - (1 kernel)", f"{b0['median'] - a['median']:.3f} us"
        )
        C.fact(
            "cost: IF node + noop body ~= (set_cond+IF,cond=1) - (2 kernels)", f"{b1['median'] - c['median']:.3f} us"
        )

    # WHILE per-iteration cost: body = while_body, iterations 1, 16, 64.
    g = P.new_graph("W")
    if g is None:
        return
    h = P.handle("W", g)
    pre = P.node("W", g, [], "while_prologue", h=int(h), remaining=P.remaining.ptr) if h is not None else None
    node, bodies = P.add_cond("W", g, [pre], h, COND_T.CU_GRAPH_COND_TYPE_WHILE, 1) if pre is not None else (None, [])
    if (
        node is None
        or P.node(
            "W.body", bodies[0], [], "while_body", h=int(h), remaining=P.remaining.ptr, iterations=P.iterations.ptr
        )
        is None
    ):
        return
    exe = P.instantiate("W", g)
    res = {}
    if exe is None:
        return
    # Each launch consumes `remaining`, so every timed step first copies the loop count in
    # (a 4-byte device-to-device copy, inside the events, the same for every n: it cancels in
    # the per-iteration slope below).
    for n in (1, 16, 64):
        host = np.array([n], dtype=np.uint32)
        seed = DeviceBuffer(1, np.uint32)
        seed.copy_from_host(host, stream=s)
        P.keep.append(seed)

        def fn(exe=exe, seed=seed):
            driver.cuMemcpyDtoDAsync(P.remaining.ptr, seed.ptr, 4, s.handle)
            (err,) = driver.cuGraphLaunch(exe, s.handle)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(C.error_name(err))

        samples = C.guarded(f"time WHILE n={n}", lambda: device_us(fn, s, rounds=rounds, warmup=20))
        if samples:
            res[n] = C.median_line(f"prologue + WHILE x{n} (memcpy 4 B inside the events)", samples)
    if 1 in res and 64 in res:
        per = (res[64]["median"] - res[1]["median"]) / 63
        C.fact("cost: one WHILE iteration (while_body kernel + re-check)", f"{per:.3f} us")


# ------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="timed launches per graph (default 200)")
    args = ap.parse_args(argv)
    C.section("environment")
    C.env_report()
    dev = C.gpu_device()
    arch = C.target_arch(dev)
    img = cpu_part(arch)
    if dev is None:
        C.exit_no_gpu()
    if img is None:
        C.note("probe kernels did not compile; nothing to run")
        return 0
    try:
        P = Probe(dev, img)  # cuModuleLoadData: where the driver binds cudaGraphSetConditional
    except Exception as exc:
        print(
            f"STEP cuModuleLoadData(conditional cubin) + setup: FAIL {getattr(exc, 'name', type(exc).__name__)}: {exc}",
            flush=True,
        )
        return 0
    print(
        "STEP cuModuleLoadData(conditional cubin, undefined cudaGraphSetConditional) + cuModuleGetFunction x5: OK",
        flush=True,
    )
    try:
        built, _ = C.guarded("explicit", lambda: explicit_part(P)) or (None, None)
        C.guarded("capture", lambda: capture_part(P))
        C.guarded("clone/update", lambda: clone_update_part(P, built))
        C.guarded("timing", lambda: timing_part(P, args.rounds))
        st = C.raw_step("", driver.cuCtxSynchronize)[0]
        C.fact("context after probe (cuCtxSynchronize)", st)
    finally:
        P.close()
    print("DONE conditional_nodes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
