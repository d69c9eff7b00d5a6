"""Probe: device-updatable kernel nodes (CUDA 12.4+) from rawgraph's NVRTC kernels (issue 25).

    PYTHONPATH=. python3 benchmarks/probes/device_updatable.py [--rounds 1000]

Kernels: kernels/device_update.cu (rg_du_update_rows, rg_du_update_table, rg_du_rows, rg_du_mark).
Uses only cuda.bindings (driver, nvrtc, nvjitlink) and numpy. Lines as in README.md: STEP (a call:
OK / FAIL <CUresult name> (<text>) / EXC), FACT, CHECK (PASS / MISMATCH), TIME, NOTE, RESULT,
SUMMARY, and `NO GPU: <reason>` (then the exit status is still 0).

CPU part (no GPU needed; the device's sm_XY, else sm_90 or $PROBE_ARCH):
  nvrtc undeclared  a call with no declaration: NVRTC's exact error (why the .cu declares them).
  nvrtc nonrdc      device_update.cu -> CUBIN without -rdc. Expected OK, EXEC, and the undefined
                    symbols cudaGraphKernelNode{SetParam,SetEnabled,SetGridDim,UpdatesApply}, for the
                    driver to bind at cuModuleLoadData (as it binds cudaGraphLaunch).
  rdc_devrt         -rdc CUBIN + libcudadevrt.a linked by nvJitLink (a NOTE says why when skipped).
                    FACT rdc_devrt.undefined: whether libcudadevrt defines any of the four.
GPU part, each case in its own interpreter (a fault in one case cannot spoil the next):
  run <build> <image>  graph: updater -> rows target (-> or beside it) mark, target and mark
      device-updatable. Builds: explicit (cuGraphAddKernelNode + cuGraphKernelNodeSetAttribute; FACT:
      is devNode written back into the value given to Set, or only readable by GetAttribute?),
      capture (cuLaunchKernelEx with the attribute; FACT: devNode in config.attrs after the launch vs
      GetAttribute on the captured node), explicit_pdl / capture_pdl (programmatic updater -> target
      edge; the updater fences, then triggers), table (rg_du_update_table: handles read from device
      memory, one UpdatesApply per node). Modes: direct (SetGridDim, SetParam, SetEnabled x2), apply
      (one UpdatesApply of 4), apply1 (one UpdatesApply per update: says which field fails). For each
      n (written by cuMemcpyHtoDAsync between replays) one CHECK: rc (cudaSuccess per call), grid seen
      == ceil(n/4), n seen, exactly those blocks ran, y = 2x+1 on rows < n and untouched beyond,
      target disabled at n = 0, mark ran iff n >= 100 (table: n > 0). n = -1 makes no update: FACT
      persist says whether the last device update stays in force on later replays.
      RESULT run <build> <image> mode=<m>: ok = every CHECK passed = that path works on this driver.
  rules     on a graph with updatable nodes, OK or the exact error of: a second cuGraphInstantiate,
            cuGraphInstantiateWithParams, cuGraphExecUpdate (own graph, another updatable graph, a
            plain exec), opting out (deviceUpdatable=0), cuGraphKernelNodeCopyAttributes both ways,
            cuGraphClone and instantiating the clone, DEVICE_LAUNCH, re-instantiating after
            cuGraphExecDestroy of the first exec, cuGraphDestroyNode, and cuLaunchKernelEx with the
            attribute on a stream that is not capturing (documented as an error).
  noupload  launch never uploaded; then uploaded; then host cuGraphExecKernelNodeSetParams without
            re-upload (cuda.h: an upload is required, host updates overwrite device ones): FACTs of
            the grid and n that ran, or the error.
  time      events, --rounds replays each, medians in us: updater making no update (baseline),
            device update apply / direct, host cuGraphExecKernelNodeSetParams + cuGraphUpload +
            launch (updatable exec), plain exec alone and with host SetParams + launch (what
            ReshapedGraph does). Device update cost = apply minus baseline; [host] = CPU time of the
            calls. Same device for all rows.
"""

from __future__ import annotations

import argparse  # noqa: E401
import ctypes
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
from cuda.bindings import driver as D
from cuda.bindings import nvrtc

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kernels", "device_update.cu")
W, RPB, MAXB, GATE, THREADS = 64, 4, 128, 100, 128  # row width, rows per block, max blocks, mark gate
MAXR = RPB * MAXB
SENT, SEEN0 = np.float32(-7.0), -7
MODES = {"direct": 0, "apply": 1, "apply1": 2}
NS = [300, 1, 4, 5, 37, 0, 512, 129, -1, 2, 64]
ATTR = D.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
NATTR = getattr(D.CUkernelNodeAttrID, "CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE", ATTR)
PSS = D.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
U64, I32 = ctypes.c_uint64, ctypes.c_int32


def out(kind, text):
    print(f"{kind} {text}", flush=True)


def name(code):
    return getattr(code, "name", str(code))


def step(label, fn, *args, quiet=False):
    """A driver call: prints OK / FAIL <name> (<text>) / EXC; returns its value(s), True, or None."""
    try:
        res = fn(*args)
    except Exception as exc:  # the binding refused the arguments, or the driver lacks the symbol
        return out("STEP", f"{label}: EXC {type(exc).__name__}: {exc}")
    res = res if isinstance(res, tuple) else (res,)
    if res[0] != D.CUresult.CUDA_SUCCESS:
        text = D.cuGetErrorString(res[0])[1] if isinstance(res[0], D.CUresult) else b""
        return out("STEP", f"{label}: FAIL {name(res[0])} ({(text or b'').decode()})")
    if not quiet:
        out("STEP", f"{label}: OK")
    return True if len(res) == 1 else (res[1] if len(res) == 2 else res[1:])


def cuda_error(code):
    if code < 0:
        return {-1: "not called", -2: "not written"}.get(code, str(code))
    try:
        from cuda.bindings import runtime

        return runtime.cudaError_t(code).name
    except Exception:
        return f"cudaError {code}"


# ------------------------------------------------------------------------------ compiling
def nvrtc_compile(src, label, opts):
    _, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"device_update.cu", 0, [], [])
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = b" " * nvrtc.nvrtcGetProgramLogSize(prog)[1]
        nvrtc.nvrtcGetProgramLog(prog, log)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            out("STEP", f"nvrtc {label} {' '.join(opts)}: FAIL {name(err)}")
            for line in log.rstrip(b"\0 ").decode(errors="replace").strip().splitlines()[:8]:
                print(f"    | {line}", flush=True)
            return None
        buf = b" " * nvrtc.nvrtcGetCUBINSize(prog)[1]
        nvrtc.nvrtcGetCUBIN(prog, buf)
        out("STEP", f"nvrtc {label} {' '.join(opts)} -> CUBIN: OK ({len(buf)} bytes)")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def elf_report(label, image):
    """ELF type and undefined symbols of a CUBIN, read here (no cuobjdump)."""
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    undef = set()
    for s in (s for s in secs if s[1] == 2):  # SHT_SYMTAB
        strtab = secs[s[6]][4]
        for j in range(s[5] // 24):
            st_name, _info, _o, shndx, _v, _s = struct.unpack_from("<IBBHQQ", image, s[4] + j * 24)
            if shndx == 0 and st_name:
                undef.add(image[strtab + st_name : image.index(b"\0", strtab + st_name)].decode())
    out("FACT", f"{label}.elf_type = {({1: 'REL', 2: 'EXEC'}).get(struct.unpack_from('<H', image, 16)[0], '?')}")
    out("FACT", f"{label}.undefined = {', '.join(sorted(undef)) or 'none'}")


def find_cudadevrt():
    """libcudadevrt.a: cuda.pathfinder, $CUDA_HOME, /usr/local/cuda*, pip wheels (the
    nvidia-cuda-runtime 13.x wheel ships it as nvidia/cu13/lib/libcudadevrt.a)."""
    found = []
    try:
        import cuda.pathfinder as pf

        found.append(pf.find_static_lib("cudadevrt"))
    except Exception as exc:
        out("FACT", f"cudadevrt.pathfinder = {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    pats = [
        os.path.join(os.environ[v], "lib*", "libcudadevrt.a") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)
    ]
    pats += ["/usr/local/cuda*/lib*/libcudadevrt.a", "/usr/local/cuda*/targets/*/lib/libcudadevrt.a"]
    pats += [os.path.join(p, "nvidia", "*", "lib", "libcudadevrt.a") for p in sys.path if p.endswith("-packages")]
    found += [p for pat in pats for p in sorted(glob.glob(pat))]
    found = list(dict.fromkeys(os.path.realpath(p) for p in found if p and os.path.isfile(p)))
    out("FACT", f"cudadevrt.candidates = {found or 'none'}")
    return found[0] if found else None


def link_rdc(rdc_cubin, arch):
    """The -rdc CUBIN + libcudadevrt.a through nvJitLink; None (a NOTE says why) when it can't."""
    try:
        from cuda.bindings import nvjitlink as nj

        out("FACT", f"nvjitlink.version = {nj.version()}")
    except Exception as exc:
        return out(
            "NOTE", f"rdc_devrt skipped: nvJitLink unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
        )
    lib = find_cudadevrt()
    if lib is None:
        return out("NOTE", "rdc_devrt skipped: no libcudadevrt.a found")
    h = nj.create(1, [f"-arch={arch}"])
    try:
        nj.add_data(h, nj.InputType.CUBIN, rdc_cubin, len(rdc_cubin), "device_update_rdc.cubin")
        nj.add_file(h, nj.InputType.LIBRARY, lib)
        nj.complete(h)
        buf = bytearray(nj.get_linked_cubin_size(h))
        nj.get_linked_cubin(h, buf)
        out("STEP", f"nvjitlink rdc cubin + {lib}: OK ({len(buf)} bytes)")
        return bytes(buf)
    except Exception as exc:
        log = bytearray(nj.get_error_log_size(h))
        nj.get_error_log(h, log)
        out(
            "STEP",
            f"nvjitlink rdc cubin + {lib}: FAIL {type(exc).__name__}: {exc} | {log.rstrip(bytes(1)).decode(errors='replace')[:300]}",
        )
    finally:
        nj.destroy(h)


def cpu_part(arch, folder):
    out("FACT", f"nvrtc = {nvrtc.nvrtcVersion()[1:]}; target = {arch}")
    std = ["-std=c++17", f"--gpu-architecture={arch}"]
    nvrtc_compile(
        'extern "C" __global__ void k(cudaGraphDeviceNode_t n, int* rc) {'
        " rc[0] = (int)cudaGraphKernelNodeSetEnabled(n, false); }",
        "undeclared",
        std,
    )
    src, images = open(SOURCE).read(), {}
    images["nonrdc"] = nvrtc_compile(src, "nonrdc", std)
    rdc = nvrtc_compile(src, "rdc", std + ["-rdc=true"])
    if rdc:
        elf_report("rdc_unlinked", rdc)
        images["rdc_devrt"] = link_rdc(rdc, arch)
    for k, v in list(images.items()):
        if v is None:
            del images[k]
            continue
        elf_report(k, v)
        with open(os.path.join(folder, k + ".cubin"), "wb") as f:
            f.write(v)
    return images


# ------------------------------------------------------------------------------- GPU side
def gpu_init():
    """((context, sm_XY, driver version), "") for device 0, its primary context current; or (None, why)."""
    try:
        (err,) = D.cuInit(0)
    except Exception as exc:
        return None, f"cuInit raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
    if err != D.CUresult.CUDA_SUCCESS:
        return None, f"cuInit: {name(err)}"
    err, dev = D.cuDeviceGet(0)
    if err != D.CUresult.CUDA_SUCCESS:
        return None, f"cuDeviceGet: {name(err)}"
    A = D.CUdevice_attribute
    cc = [
        D.cuDeviceGetAttribute(a, dev)[1]
        for a in (A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    ]
    ctx = D.cuDevicePrimaryCtxRetain(dev)[1]
    D.cuCtxSetCurrent(ctx)
    return (ctx, f"sm_{cc[0]}{cc[1]}", D.cuDriverGetVersion()[1]), ""


class Args:
    """A packed kernel argument array (void*[] of ctypes values)."""

    def __init__(self, *vals):
        self.vals = [t(v) for t, v in vals]
        self.ptrs = (ctypes.c_void_p * len(self.vals))(*[ctypes.addressof(v) for v in self.vals])
        self.address = ctypes.addressof(self.ptrs)


class Gpu:
    KERNELS = ("rg_du_update_rows", "rg_du_update_table", "rg_du_rows", "rg_du_mark")

    def __init__(self, image_path):
        self.keep, self.execs = [], []
        self.ctx = gpu_init()[0][0]
        img = np.frombuffer(open(image_path, "rb").read(), np.uint8)
        self.mod = step(f"cuModuleLoadData({os.path.basename(image_path)})", D.cuModuleLoadData, img.ctypes.data)
        self.fn = (
            {
                k: step(f"cuModuleGetFunction({k})", D.cuModuleGetFunction, self.mod, k.encode(), quiet=True)
                for k in self.KERNELS
            }
            if self.mod
            else {}
        )
        if not all(self.fn.values()) or not self.fn:
            out("RESULT", f"load {os.path.basename(image_path)}: failed")
            raise SystemExit(0)
        self.stream = D.cuStreamCreate(1)[1]
        info = step("cuFuncGetParamInfo(rg_du_rows, 2)", D.cuFuncGetParamInfo, self.fn["rg_du_rows"], 2, quiet=True)
        self.n_off = int(info[0]) if info else 16
        out("FACT", f"rg_du_rows parameter n: offset {self.n_off}, size {info[1] if info else '? (offset assumed)'}")
        self.x = (np.arange(MAXR * W, dtype=np.float32) % 97) * np.float32(0.25)
        sizes = dict(x=MAXR * W * 4, y=MAXR * W * 4, hits=MAXB * 4, seen=8, ctl=8, rc=64, mark=4, tab=256)
        self.buf = {k: int(D.cuMemAlloc(v)[1]) for k, v in sizes.items()}
        self.h2d("x", self.x)

    def h2d(self, k, arr):
        self.keep.append(arr)
        D.cuMemcpyHtoDAsync(self.buf[k], arr.ctypes.data, arr.nbytes, self.stream)

    def d2h(self, k, dtype, count):
        a = np.zeros(count, dtype)
        D.cuMemcpyDtoH(a.ctypes.data, self.buf[k], a.nbytes)
        return a

    def params(self, fn, grid, block, args):
        p = D.CUDA_KERNEL_NODE_PARAMS()
        p.func, p.gridDimX, p.gridDimY, p.gridDimZ = self.fn[fn], grid, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ, p.sharedMemBytes, p.kernelParams = block, 1, 1, 0, args.address
        self.keep.append((p, args))
        return p

    def rows_args(self, n=MAXR):
        b = self.buf
        return Args((U64, b["x"]), (U64, b["y"]), (I32, n), (I32, W), (I32, RPB), (U64, b["hits"]), (U64, b["seen"]))

    def upd_args(self, target, gated):
        return Args(
            (U64, target),
            (U64, gated),
            (U64, self.buf["ctl"]),
            (I32, RPB),
            (I32, MAXB),
            (U64, self.n_off),
            (I32, GATE),
            (U64, self.buf["rc"]),
        )

    def table_args(self, handles):
        tab = np.zeros(32, np.uint64)  # nodes @0, rows_per_block @32, max_blocks @40, n_offsets @64
        tab[0:2], tab[8:10] = handles, [self.n_off, 2**64 - 1]
        tab[4:6] = np.array([RPB, 0, MAXB, 1], np.int32).view(np.uint64)
        self.h2d("tab", tab)
        t = self.buf["tab"]
        return Args(
            (U64, t),
            (U64, t + 32),
            (U64, t + 40),
            (U64, t + 64),
            (I32, 2),
            (U64, self.buf["ctl"]),
            (I32, MAXR),
            (U64, self.buf["rc"]),
        )

    def updatable(self, node, label):
        """Opt a node in and return its devNode (FACT: where the driver hands it back)."""
        v = D.CUkernelNodeAttrValue()
        v.deviceUpdatableKernelNode.deviceUpdatable = 1
        if (
            step(
                f"{label} cuGraphKernelNodeSetAttribute(DEVICE_UPDATABLE=1)",
                D.cuGraphKernelNodeSetAttribute,
                node,
                NATTR,
                v,
            )
            is None
        ):
            return 0
        g = step(f"{label} cuGraphKernelNodeGetAttribute", D.cuGraphKernelNodeGetAttribute, node, NATTR, quiet=True)
        h_set, h_get = int(v.deviceUpdatableKernelNode.devNode), int(g.deviceUpdatableKernelNode.devNode) if g else 0
        out(
            "FACT",
            f"{label} devNode in the value given to Set = 0x{h_set:x}; from GetAttribute = 0x{h_get:x} "
            f"(deviceUpdatable={g.deviceUpdatableKernelNode.deviceUpdatable if g else '?'})",
        )
        return h_get or h_set

    def build_explicit(self, updatable=True, pdl=False, table=False):
        g = D.cuGraphCreate(0)[1]
        add = lambda what, p, deps=(): step(
            f"cuGraphAddKernelNode({what})", D.cuGraphAddKernelNode, g, list(deps), len(deps), p, quiet=True
        )
        tgt = add("rows", self.params("rg_du_rows", MAXB, THREADS, self.rows_args()))
        mark = add("mark", self.params("rg_du_mark", 1, 32, Args((U64, self.buf["mark"]))))
        h = (self.updatable(tgt, "explicit target"), self.updatable(mark, "explicit mark")) if updatable else (0, 0)
        upd = add(
            "updater",
            self.params("rg_du_update_table", 1, 32, self.table_args(h))
            if table
            else self.params("rg_du_update_rows", 1, 32, self.upd_args(*h)),
        )
        e = D.CUgraphEdgeData()
        if pdl:
            e.type = D.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            e.from_port = int(D.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
        step(
            f"cuGraphAddDependencies(updater -> rows, mark; {'programmatic' if pdl else 'default'})",
            D.cuGraphAddDependencies,
            g,
            [upd, upd],
            [tgt, mark],
            [e, e],
            2,
            quiet=not pdl,
        )
        return g, tgt, h

    def build_capture(self, pdl=False):
        s = self.stream
        step(
            "cuStreamBeginCapture", D.cuStreamBeginCapture, s, D.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        )
        a0 = self.upd_args(0, 0)  # handles unknown yet: set on the node after the capture
        self.keep.append(a0)
        step(
            "capture updater cuLaunchKernel",
            D.cuLaunchKernel,
            self.fn["rg_du_update_rows"],
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            s,
            a0.address,
            0,
            quiet=True,
        )
        upd_node, found = D.cuStreamGetCaptureInfo(s)[4][0], []
        for fn, grid, block, args in (
            ("rg_du_rows", MAXB, THREADS, self.rows_args()),
            ("rg_du_mark", 1, 32, Args((U64, self.buf["mark"]))),
        ):
            cfg = D.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (
                grid,
                1,
                1,
                block,
                1,
                1,
            )
            attrs = [D.CUlaunchAttribute() for _ in range(2 if pdl else 1)]
            attrs[0].id = ATTR
            attrs[0].value.deviceUpdatableKernelNode.deviceUpdatable = 1
            if pdl:
                attrs[1].id, attrs[1].value.programmaticStreamSerializationAllowed = PSS, 1
            cfg.hStream, cfg.attrs, cfg.numAttrs = s, attrs, len(attrs)
            self.keep += [cfg, attrs, args]
            step(
                f"capture {fn} cuLaunchKernelEx(DEVICE_UPDATABLE{'+PDL' if pdl else ''})",
                D.cuLaunchKernelEx,
                cfg,
                self.fn[fn],
                args.address,
                0,
            )
            h_cfg = int(cfg.attrs[0].value.deviceUpdatableKernelNode.devNode)
            node = D.cuStreamGetCaptureInfo(s)[4][0]
            v = step(
                f"capture {fn} cuGraphKernelNodeGetAttribute", D.cuGraphKernelNodeGetAttribute, node, NATTR, quiet=True
            )
            h_get = int(v.deviceUpdatableKernelNode.devNode) if v else 0
            out(
                "FACT",
                f"capture {fn} devNode in config.attrs after cuLaunchKernelEx = 0x{h_cfg:x}; "
                f"from GetAttribute on the captured node = 0x{h_get:x}",
            )
            found.append((node, h_get or h_cfg))
        g = step("cuStreamEndCapture", D.cuStreamEndCapture, s)
        h = (found[0][1], found[1][1])
        step(
            "updater cuGraphKernelNodeSetParams(the handles)",
            D.cuGraphKernelNodeSetParams,
            upd_node,
            self.params("rg_du_update_rows", 1, 32, self.upd_args(*h)),
        )
        n = D.cuGraphGetEdges(g, 0)[4]
        data = D.cuGraphGetEdges(g, n)[3] if n else []
        out(
            "FACT",
            f"capture edge types = {[{0: 'default', 1: 'programmatic'}.get(int(e.type), int(e.type)) for e in data]}",
        )
        return g, found[0][0], h

    def instantiate(self, g, label, upload=True):
        e = step(f"{label} cuGraphInstantiate", D.cuGraphInstantiate, g, 0)
        if e is not None:
            self.execs.append(e)
            if upload:
                step(f"{label} cuGraphUpload", D.cuGraphUpload, e, self.stream)
        return e

    def ctl(self, n, mode):
        self.h2d("ctl", np.array([n, mode], np.int32))
        D.cuStreamSynchronize(self.stream)

    def replay(self, exe, n, mode):
        """Reset the outputs, ctl = [n, mode], one launch, read everything back."""
        s, b = self.stream, self.buf
        for k, v, cnt in (
            ("y", int(SENT.view(np.uint32)), MAXR * W),
            ("hits", 0, MAXB),
            ("seen", SEEN0 & 0xFFFFFFFF, 2),
            ("rc", 0xFFFFFFFE, 16),
            ("mark", 0, 1),
        ):
            D.cuMemsetD32Async(b[k], v, cnt, s)
        self.h2d("ctl", np.array([n, mode], np.int32))
        if (
            step(f"cuGraphLaunch n={n}", D.cuGraphLaunch, exe, s, quiet=True) is None
            or step(f"cuStreamSynchronize n={n}", D.cuStreamSynchronize, s, quiet=True) is None
        ):
            return None
        return dict(
            y=self.d2h("y", np.float32, MAXR * W),
            hits=self.d2h("hits", np.uint32, MAXB),
            seen=list(self.d2h("seen", np.int32, 2)),
            rc=self.d2h("rc", np.int32, 8),
            mark=int(self.d2h("mark", np.uint32, 1)[0]),
        )

    def verify(self, r, n, rc_ok, gate):
        blocks, ran = min(max(-(-n // RPB), 1), MAXB), int(np.count_nonzero(r["hits"]))
        want_y = np.full(MAXR * W, SENT, np.float32)
        want_y[: n * W] = 2.0 * self.x[: n * W] + 1.0
        hits_ok = ran == 0 if n == 0 else bool((r["hits"][:blocks] == 1).all()) and ran == blocks
        y_ok = bool(np.array_equal(r["y"], want_y))
        ok = (
            rc_ok(r["rc"])
            and hits_ok
            and y_ok
            and r["seen"] == ([SEEN0] * 2 if n == 0 else [blocks, n])
            and r["mark"] == int(n >= gate)
        )
        rc = r["rc"]
        return ok, (
            f"rc={[cuda_error(int(c)) for c in rc[:4]]} set=(grid {rc[4]}, n {rc[5]}, calls {rc[6]}) "
            f"grid_seen={r['seen'][0]} (want {'disabled' if n == 0 else blocks}) n_seen={r['seen'][1]} "
            f"blocks_ran={ran} y={'ok' if y_ok else 'WRONG'} mark={r['mark']} (want {int(n >= gate)})"
        )


def case_run(G, build, image):
    pdl, table = build.endswith("_pdl"), build == "table"
    g, _tgt, h = G.build_capture(pdl) if build.startswith("capture") else G.build_explicit(pdl=pdl, table=table)
    exe = G.instantiate(g, build) if g is not None else None
    if exe is None or not all(h):
        return out("RESULT", f"run {build} {image}: failed (no exec or no device node handle)")
    for mname, mode in ({"apply": 1} if table else MODES).items():
        rc_ok = (
            (lambda rc: (rc[:2] == 0).all())
            if table
            else (lambda rc: rc[0] == 0)
            if mode == 1
            else (lambda rc: (rc[:4] == 0).all())
        )
        ok_all, last = True, None
        for n in NS:
            r = G.replay(exe, n, mode)
            if r is None:
                ok_all = False
                break
            if n < 0:
                out(
                    "FACT",
                    f"persist {build} mode={mname}: a replay making no update after n={last} ran grid "
                    f"{r['seen'][0]}, n {r['seen'][1]}, {int(np.count_nonzero(r['hits']))} blocks, mark {r['mark']} "
                    f"(kept: grid {min(max(-(-last // RPB), 1), MAXB)}; reset to the built node: {MAXB})",
                )
                continue
            ok, detail = G.verify(r, n, rc_ok, 1 if table else GATE)
            out("CHECK", f"{build} {image} mode={mname} n={n}: {'PASS' if ok else 'MISMATCH'} {detail}")
            ok_all, last = ok_all and ok, n
        st = step("cuCtxSynchronize", D.cuCtxSynchronize, quiet=True)
        out("RESULT", f"run {build} {image} mode={mname}: {'ok' if ok_all and st else 'failed'}")


def case_rules(G):
    g, tgt, _ = G.build_explicit()
    e1 = G.instantiate(g, "first", upload=False)
    step("second cuGraphInstantiate of the same graph", D.cuGraphInstantiate, g, 0)
    ip = D.CUDA_GRAPH_INSTANTIATE_PARAMS()
    step("cuGraphInstantiateWithParams of the same graph", D.cuGraphInstantiateWithParams, g, ip)
    out("FACT", f"WithParams result_out = {name(ip.result_out)}")
    for label, exe, graph in (
        ("exec <- its own graph", e1, g),
        ("exec <- another updatable graph", e1, None),
        ("plain exec <- updatable graph", None, g),
    ):
        graph = graph if graph is not None else G.build_explicit()[0]
        exe = exe if exe is not None else G.instantiate(G.build_explicit(updatable=False)[0], "plain", upload=False)
        try:
            err, info = D.cuGraphExecUpdate(exe, graph)
            out("STEP", f"cuGraphExecUpdate({label}): {name(err)} result={name(info.result)}")
        except Exception as exc:
            out("STEP", f"cuGraphExecUpdate({label}): EXC {type(exc).__name__}: {exc}")
    v = D.CUkernelNodeAttrValue()
    v.deviceUpdatableKernelNode.deviceUpdatable = 0
    step("opt out: cuGraphKernelNodeSetAttribute(deviceUpdatable=0)", D.cuGraphKernelNodeSetAttribute, tgt, NATTR, v)
    ptgt = G.build_explicit(updatable=False)[1]
    step("cuGraphKernelNodeCopyAttributes(plain <- updatable)", D.cuGraphKernelNodeCopyAttributes, ptgt, tgt)
    step("cuGraphKernelNodeCopyAttributes(updatable <- plain)", D.cuGraphKernelNodeCopyAttributes, tgt, ptgt)
    c = step("cuGraphClone(updatable graph)", D.cuGraphClone, g)
    if c is not None:
        G.instantiate(c, "the clone", upload=False)
    step(
        "cuGraphInstantiate(fresh updatable graph, DEVICE_LAUNCH)",
        D.cuGraphInstantiate,
        G.build_explicit()[0],
        int(D.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH),
    )
    if e1 is not None:
        G.execs.remove(e1)
        step("cuGraphExecDestroy(first exec)", D.cuGraphExecDestroy, e1)
        G.instantiate(g, "re-instantiate once the first exec is destroyed", upload=False)
    step("cuGraphDestroyNode(updatable node)", D.cuGraphDestroyNode, tgt)
    cfg, a = D.CUlaunchConfig(), D.CUlaunchAttribute()
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimY = cfg.blockDimZ = 1
    a.id, a.value.deviceUpdatableKernelNode.deviceUpdatable = ATTR, 1
    cfg.blockDimX, cfg.hStream, cfg.attrs, cfg.numAttrs = 32, G.stream, [a], 1
    args = Args((U64, G.buf["mark"]))
    step(
        "cuLaunchKernelEx(DEVICE_UPDATABLE) on a stream not capturing",
        D.cuLaunchKernelEx,
        cfg,
        G.fn["rg_du_mark"],
        args.address,
        0,
    )
    step("cuStreamSynchronize after it", D.cuStreamSynchronize, G.stream)


def case_noupload(G):
    g, tgt, _ = G.build_explicit()
    exe = G.instantiate(g, "never uploaded", upload=False)
    for label, n, host in (
        ("launch never uploaded, n=37", 37, None),
        ("after cuGraphUpload, n=37", 37, "upload"),
        ("host SetParams(grid 128, n 512), no re-upload, no device update", -1, "set"),
        ("then a device update n=5, still no re-upload", 5, None),
    ):
        if host == "upload":
            step("cuGraphUpload", D.cuGraphUpload, exe, G.stream)
        elif host == "set":
            step(
                "cuGraphExecKernelNodeSetParams(target)",
                D.cuGraphExecKernelNodeSetParams,
                exe,
                tgt,
                G.params("rg_du_rows", MAXB, THREADS, G.rows_args(MAXR)),
            )
        r = G.replay(exe, n, 1) if exe is not None else None
        if r is None:
            return out("FACT", f"noupload {label}: no exec, or the launch or sync failed (see STEP)")
        out(
            "FACT",
            f"noupload {label}: rc={cuda_error(int(r['rc'][0]))} grid_seen={r['seen'][0]} n_seen={r['seen'][1]} "
            f"blocks_ran={int(np.count_nonzero(r['hits']))}",
        )


def timed(G, label, rounds, exe, before=None):
    e0, e1 = D.cuEventCreate(0)[1], D.cuEventCreate(0)[1]
    dev, host = [], []
    for i in range(rounds + 20):  # 20 warm-up replays
        D.cuEventRecord(e0, G.stream)
        t = time.perf_counter_ns()
        if before:
            before(i)
        D.cuGraphLaunch(exe, G.stream)
        t = time.perf_counter_ns() - t
        D.cuEventRecord(e1, G.stream)
        D.cuEventSynchronize(e1)
        if i >= 20:
            dev.append(D.cuEventElapsedTime(e0, e1)[1] * 1000.0)
            host.append(t / 1000.0)
    for what, s in (("device", dev), ("host", host)):
        p = np.percentile(s, [50, 10, 90])
        out("TIME", f"{label} [{what}]: median={p[0]:.3f} p10={p[1]:.3f} p90={p[2]:.3f} us (n={len(s)})")
    step(f"{label}: cuCtxSynchronize", D.cuCtxSynchronize, quiet=True)


def case_time(G, rounds):
    g, tgt, _ = G.build_explicit()
    exe = G.instantiate(g, "updatable")
    gp, ptgt, _ = G.build_explicit(updatable=False)
    pexe = G.instantiate(gp, "plain")
    if exe is None or pexe is None:
        return
    hp = [G.params("rg_du_rows", -(-n // RPB), THREADS, G.rows_args(n)) for n in (300, 200)]  # alternated
    G.ctl(-1, 1)
    timed(G, "updatable exec, the updater makes no update (baseline)", rounds, exe)
    G.ctl(300, 1)
    timed(G, "device update: one UpdatesApply of 4 (grid, n, 2 enables)", rounds, exe)
    r = G.replay(exe, 300, 1)
    if r is not None:
        out(
            "CHECK",
            f"after timing: {'PASS' if r['seen'] == [75, 300] else 'MISMATCH'} grid_seen={r['seen'][0]} "
            f"n_seen={r['seen'][1]} (want 75 300)",
        )
    G.ctl(300, 0)
    timed(G, "device update: 4 direct calls", rounds, exe)
    G.ctl(-1, 1)
    timed(
        G,
        "host cuGraphExecKernelNodeSetParams + cuGraphUpload + launch (updatable exec)",
        rounds,
        exe,
        lambda i: (D.cuGraphExecKernelNodeSetParams(exe, tgt, hp[i & 1]), D.cuGraphUpload(exe, G.stream)),
    )
    timed(G, "plain exec, no update (baseline)", rounds, pexe)
    timed(
        G,
        "host cuGraphExecKernelNodeSetParams + launch (plain exec)",
        rounds,
        pexe,
        lambda i: D.cuGraphExecKernelNodeSetParams(pexe, ptgt, hp[i & 1]),
    )


def child(args):
    G = Gpu(args.image)
    image = os.path.basename(args.image).split(".")[0]
    cases = {
        "run": lambda: case_run(G, args.build, image),
        "rules": lambda: case_rules(G),
        "noupload": lambda: case_noupload(G),
        "time": lambda: case_time(G, args.rounds),
    }
    try:
        cases[args.case]()
    finally:
        for e in G.execs:
            D.cuGraphExecDestroy(e)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--build", default="explicit", help=argparse.SUPPRESS)
    ap.add_argument("--image", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        return child(args)
    import cuda.bindings

    out("FACT", f"python {sys.version.split()[0]}, cuda.bindings {cuda.bindings.__version__}, numpy {np.__version__}")
    gpu, reason = gpu_init()
    arch = gpu[1] if gpu else os.environ.get("PROBE_ARCH", "sm_90")
    if gpu:
        out("FACT", f"driver CUDA version = {gpu[2]}; device arch = {arch}")
    folder = tempfile.mkdtemp(prefix="rg_du_")
    try:
        images = cpu_part(arch, folder)
        if not gpu:
            out("NO GPU:", f"{reason} -- compile checked for {arch}; the GPU part did not run")
            return 0
        plan = [("run", b, "nonrdc") for b in ("explicit", "capture", "explicit_pdl", "capture_pdl", "table")]
        plan += [("run", "explicit", "rdc_devrt")] + [(c, "", "nonrdc") for c in ("rules", "noupload", "time")]
        results = []
        for case, build, image in plan:
            if image not in images:
                out("NOTE", f"{case} {build} {image}: skipped, no {image} image (see the compile lines)")
                continue
            argv = [
                "--case",
                case,
                "--build",
                build or "explicit",
                "--image",
                os.path.join(folder, image + ".cubin"),
                "--rounds",
                str(args.rounds),
            ]
            print(f"\n=== child: {case} {build} {image}", flush=True)
            try:
                r = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), *argv], capture_output=True, text=True, timeout=300
                )
                text, status = r.stdout + (("\n" + r.stderr) if r.stderr.strip() else ""), f"exit status {r.returncode}"
            except subprocess.TimeoutExpired as exc:
                text, status = exc.stdout.decode(errors="replace") if exc.stdout else "", "TIMEOUT after 300 s"
            print(text.rstrip(), flush=True)
            print(f"=== child {status}: {case} {build} {image}", flush=True)
            results += [ln[7:] for ln in text.splitlines() if ln.startswith("RESULT")]
        out("SUMMARY", "; ".join(results) or "no case reported a RESULT")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
