"""Shared helpers for the probe scripts in this folder (not part of rawgraph's API).

Every probe prints one fact per line so a batch log can be grepped:

    STEP <name>: OK [detail]            a driver/NVRTC/nvJitLink call that worked
    STEP <name>: FAIL <ERROR_NAME> ...  one that returned an error (the exact enum name)
    STEP <name>: EXC <Type>: <text>     one that raised in Python (binding refused the arguments...)
    FACT <key> = <value>                a value read back
    CHECK <name>: PASS|MISMATCH ...     a result compared with what was expected
    TIME <name>: median=.. p10=.. p90=.. us (n=..)
    NO GPU: <reason>                    the probe stopped where it needs a GPU (exit status 2)

Nothing here raises on an expected failure: callers get ``None`` back and the line says why.
"""

from __future__ import annotations

import glob
import os
import platform
import struct
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from cuda.bindings import driver, nvrtc

import rawgraph
from rawgraph.runtime.errors import NvrtcError, error_name

# The sgemm cut as text (BM,BN,BK,STAGES,S,KS,MINB[,TM]): benchmarks/gemm_sweep.py owns the format.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_sweep import parse_cut as parse_cut  # noqa: E402  (re-exported: the probes import it from here)

_SUCCESS = driver.CUresult.CUDA_SUCCESS
NO_GPU_EXIT = 2


# --------------------------------------------------------------------------------------- output
def fact(key: str, value: Any) -> None:
    print(f"FACT {key} = {value}", flush=True)


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"CHECK {name}: {'PASS' if ok else 'MISMATCH'}{' ' + detail if detail else ''}", flush=True)
    return ok


def note(text: str) -> None:
    print(f"NOTE {text}", flush=True)


def section(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def _cu_message(code: Any) -> str:
    try:
        err, text = driver.cuGetErrorString(code)
        if err == _SUCCESS and text:
            return text.decode()
    except Exception:
        pass
    return ""


def step(name: str, fn: Callable[..., Any], *args: Any, quiet: bool = False) -> Any:
    """Call a ``cuda.bindings.driver`` function; print OK/FAIL/EXC; return its values or None.

    The values are unpacked as :func:`rawgraph.runtime.errors.check` does: nothing -> True (so a caller
    can tell success from failure), one value -> it, several -> a tuple.
    """
    try:
        result = fn(*args)
    except Exception as exc:  # a binding that refuses its arguments, or a symbol the driver lacks
        print(f"STEP {name}: EXC {type(exc).__name__}: {exc}", flush=True)
        return None
    if not isinstance(result, tuple):
        result = (result,)
    code = result[0]
    if code != _SUCCESS:
        print(f"STEP {name}: FAIL {error_name(code)} ({_cu_message(code)})", flush=True)
        return None
    if not quiet:
        print(f"STEP {name}: OK", flush=True)
    if len(result) == 1:
        return True
    return result[1] if len(result) == 2 else result[1:]


def raw_step(name: str, fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """Like :func:`step` but returns ``(status, result_tuple)`` with status "OK", an error name or
    "EXC ..."; prints nothing (for loops where the failure itself is the answer)."""
    try:
        result = fn(*args)
    except Exception as exc:
        return f"EXC {type(exc).__name__}: {exc}", None
    if not isinstance(result, tuple):
        result = (result,)
    if result[0] != _SUCCESS:
        return error_name(result[0]), result
    return "OK", result


def guarded(name: str, fn: Callable[[], Any]) -> Any:
    """Run a block of probe code; an unexpected Python exception is printed with its traceback
    (``STEP <name>: EXC ...``) instead of ending the probe."""
    try:
        return fn()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - a probe reports everything
        print(f"STEP {name}: EXC {type(exc).__name__}: {exc}", flush=True)
        for line in traceback.format_exc().rstrip().splitlines():
            print(f"    | {line}", flush=True)
        return None


# ------------------------------------------------------------------------------- environment
def env_report() -> None:
    """Versions of everything a probe's answer depends on (no GPU needed)."""
    import cuda.bindings

    fact("python", platform.python_version())
    fact("cuda.bindings", cuda.bindings.__version__)
    try:
        import cuda.pathfinder

        fact("cuda.pathfinder", getattr(cuda.pathfinder, "__version__", "?"))
    except Exception as exc:
        fact("cuda.pathfinder", f"not importable ({type(exc).__name__})")
    fact("rawgraph", rawgraph.__version__)
    try:
        fact("nvrtc", ".".join(map(str, rawgraph.nvrtc_version())))
    except Exception as exc:
        fact("nvrtc", f"unavailable ({type(exc).__name__}: {exc})")
    ok, reason = rawgraph.driver_status()
    fact("driver_status", f"{ok} ({reason})")
    if ok:
        err, v = driver.cuDriverGetVersion()
        fact("driver_cuda_version", f"{v // 1000}.{(v % 1000) // 10} ({v})")


def gpu_device():
    """rawgraph's device 0 (primary context current), or None after printing ``NO GPU``."""
    ok, reason = rawgraph.driver_status()
    if not ok:
        return None
    try:
        dev = rawgraph.get_device()
    except Exception as exc:
        print(f"NO GPU: {type(exc).__name__}: {exc}", flush=True)
        return None
    fact("device", repr(dev))
    return dev


def exit_no_gpu() -> None:
    ok, reason = rawgraph.driver_status()
    print(f"NO GPU: {reason} -- the GPU part of this probe did not run", flush=True)
    sys.exit(NO_GPU_EXIT)


def target_arch(dev=None) -> str:
    """The device's ``sm_XY``; ``sm_90`` (the H200) when there is no GPU here."""
    return dev.arch if dev is not None else os.environ.get("PROBE_ARCH", "sm_90")


# ---------------------------------------------------------------------------------- NVRTC
def nvrtc_compile(source: str, name: str, options: Sequence[str], output: str) -> tuple[bytes | None, str]:
    """Raw NVRTC compile returning ``(image, log)``; ``output`` is ``CUBIN``, ``PTX`` or ``LTOIR``.

    rawgraph.compile_source covers CUBIN and PTX (use it where it fits); LTO-IR needs this.
    On failure the image is None and the log holds NVRTC's result name and its whole log.
    """
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None, f"nvrtcCreateProgram: {nvrtc.nvrtcResult(int(err)).name}"
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        logbuf = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, logbuf)
        log = logbuf.rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, f"{nvrtc.nvrtcResult(int(err)).name}\n{log}"
        get_size = getattr(nvrtc, f"nvrtcGet{output}Size")
        get = getattr(nvrtc, f"nvrtcGet{output}")
        err, size = get_size(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, f"nvrtcGet{output}Size: {nvrtc.nvrtcResult(int(err)).name}"
        buf = b" " * size
        (err,) = get(prog, buf)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, f"nvrtcGet{output}: {nvrtc.nvrtcResult(int(err)).name}"
        return bytes(buf), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str] = ("-std=c++17",)):
    """rawgraph.compile_source to CUBIN (no cache); prints the step; returns the CompiledImage or None."""
    try:
        img = rawgraph.compile_source(source, name, arch, options=tuple(options), fmt="cubin", cache=False)
    except NvrtcError as exc:
        print(f"STEP nvrtc {name} {' '.join(options)} -> cubin {arch}: FAIL {exc.name}", flush=True)
        for line in (exc.log or "").strip().splitlines()[:12]:
            print(f"    | {line}", flush=True)
        return None
    print(f"STEP nvrtc {name} {' '.join(options)} -> cubin {arch}: OK ({len(img.image)} bytes)", flush=True)
    if img.log.strip():
        for line in img.log.strip().splitlines()[:6]:
            print(f"    | {line}", flush=True)
    return img


# ----------------------------------------------------------------------------------- ELF
_ELF_TYPES = {0: "NONE", 1: "REL", 2: "EXEC", 3: "DYN", 4: "CORE"}
_SYM_TYPES = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 3: "SECTION", 4: "FILE", 10: "GNU_IFUNC"}
_SYM_BINDS = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK"}


def elf_summary(image: bytes) -> dict:
    """ELF type and symbols of a CUBIN (64-bit little-endian ELF), parsed here with no tool.

    Returns ``{"type": "EXEC"|"REL"|..., "undefined": [(name, type, bind)], "defined_funcs": [...]}``;
    ``{"type": "not ELF"}`` for anything else (PTX, LTO-IR).
    """
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return {"type": "not ELF", "undefined": [], "defined_funcs": []}
    e_type = struct.unpack_from("<H", image, 16)[0]
    e_shoff = struct.unpack_from("<Q", image, 0x28)[0]
    e_shentsize, e_shnum = struct.unpack_from("<HH", image, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        sh_name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize = struct.unpack_from(
            "<IIQQQQIIQQ", image, off
        )
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_entsize))
    undefined, defined = [], []
    for sh_type, sh_offset, sh_size, sh_link, sh_entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        str_off = sections[sh_link][1]
        for j in range(sh_size // (sh_entsize or 24)):
            st_name, st_info, _other, st_shndx, _value, _size = struct.unpack_from("<IBBHQQ", image, sh_offset + j * 24)
            end = image.index(b"\0", str_off + st_name)
            name = image[str_off + st_name : end].decode(errors="replace")
            kind = _SYM_TYPES.get(st_info & 0xF, str(st_info & 0xF))
            bind = _SYM_BINDS.get(st_info >> 4, str(st_info >> 4))
            if st_shndx == 0 and name:
                undefined.append((name, kind, bind))
            elif kind == "FUNC" and name:
                defined.append(name)
    return {"type": _ELF_TYPES.get(e_type, str(e_type)), "undefined": undefined, "defined_funcs": defined}


def report_elf(label: str, image: bytes) -> dict:
    info = elf_summary(image)
    und = [f"{n}({t},{b})" for n, t, b in info["undefined"]]
    fact(f"{label}.elf_type", info["type"])
    fact(f"{label}.undefined_symbols", ", ".join(und) if und else "none")
    return info


# --------------------------------------------------------------------- libraries on disk
def site_dirs() -> list[str]:
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.append(user)
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return list(dict.fromkeys(d for d in dirs if d and os.path.isdir(d)))


def find_cudadevrt() -> list[str]:
    """Every libcudadevrt.a candidate that exists, best first; prints where each came from."""
    found: list[str] = []
    try:
        import cuda.pathfinder as pf

        fn = getattr(pf, "find_static_lib", None)
        if fn is None:
            fact("cudadevrt.pathfinder", "cuda.pathfinder has no find_static_lib")
        else:
            try:
                p = fn("cudadevrt")
                fact("cudadevrt.pathfinder", p)
                found.append(str(p))
            except Exception as exc:
                fact("cudadevrt.pathfinder", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
    except Exception as exc:
        fact("cudadevrt.pathfinder", f"cuda.pathfinder not importable ({exc})")
    patterns = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            patterns += [os.path.join(os.environ[var], d, "libcudadevrt.a") for d in ("lib64", "lib")]
    patterns += [
        "/usr/local/cuda*/lib64/libcudadevrt.a",
        "/usr/local/cuda*/lib/libcudadevrt.a",
        "/usr/local/cuda*/targets/*/lib/libcudadevrt.a",
        "/usr/lib/x86_64-linux-gnu/libcudadevrt.a",
        "/opt/nvidia/**/libcudadevrt.a",
    ]
    for d in site_dirs() + [os.path.join(sys.prefix, "lib")]:
        patterns += [os.path.join(d, "nvidia", "*", sub, "libcudadevrt.a") for sub in ("lib", "lib64")]
    for pat in patterns:
        for p in sorted(glob.glob(pat, recursive=True)):
            if os.path.isfile(p):
                found.append(os.path.realpath(p))
    unique = list(dict.fromkeys(found))
    for p in unique:
        fact("cudadevrt.candidate", f"{p} ({os.path.getsize(p)} bytes)")
    if not unique:
        fact("cudadevrt.candidate", "none found")
    return unique


def find_headers(name: str) -> list[str]:
    """CUDA include files called ``name`` on disk (system toolkit and pip wheels)."""
    pats = ["/usr/local/cuda*/include", "/usr/local/cuda*/targets/*/include", "/usr/include"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            pats.append(os.path.join(os.environ[var], "include"))
    for d in site_dirs():
        pats.append(os.path.join(d, "nvidia", "*", "include"))
    out = []
    for pat in pats:
        for d in glob.glob(pat):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                out.append(os.path.realpath(p))
    return list(dict.fromkeys(out))


def nvjitlink_module():
    """``cuda.bindings.nvjitlink`` if libnvJitLink loads here, else None (printed either way)."""
    try:
        from cuda.bindings import nvjitlink

        version = nvjitlink.version()
    except Exception as exc:
        fact("nvjitlink", f"unavailable ({type(exc).__name__}: {str(exc).strip().splitlines()[0]})")
        return None
    fact("nvjitlink.version", ".".join(map(str, version)))
    try:
        import cuda.pathfinder as pf

        loaded = pf.load_nvidia_dynamic_lib("nvJitLink")
        fact("nvjitlink.library", getattr(loaded, "abs_path", loaded))
    except Exception as exc:
        fact("nvjitlink.library", f"? ({type(exc).__name__})")
    return nvjitlink


def nvjitlink_link(nj, name: str, inputs: Sequence[tuple[str, Any]], options: Sequence[str]) -> bytes | None:
    """Link with nvJitLink. ``inputs``: ``("cubin"|"ptx"|"ltoir", bytes)`` or ``("library", path)``.
    Prints the step with the error log on failure; returns the linked CUBIN or None."""
    kinds = {
        "cubin": nj.InputType.CUBIN,
        "ptx": nj.InputType.PTX,
        "ltoir": nj.InputType.LTOIR,
        "library": nj.InputType.LIBRARY,
        "object": nj.InputType.OBJECT,
    }
    try:
        handle = nj.create(len(options), list(options))
    except Exception as exc:
        print(f"STEP nvjitlink {name}: EXC create {type(exc).__name__}: {exc}", flush=True)
        return None
    try:
        try:
            for kind, data in inputs:
                if kind == "library":
                    nj.add_file(handle, kinds[kind], str(data))
                else:
                    nj.add_data(handle, kinds[kind], data, len(data), f"{name}.{kind}")
            nj.complete(handle)
        except Exception as exc:
            log = ""
            try:
                n = nj.get_error_log_size(handle)
                buf = bytearray(n)
                nj.get_error_log(handle, buf)
                log = buf.rstrip(b"\0").decode(errors="replace").strip()
            except Exception:
                pass
            print(f"STEP nvjitlink {name} {list(options)}: FAIL {type(exc).__name__}: {exc}", flush=True)
            for line in log.splitlines()[:10]:
                print(f"    | {line}", flush=True)
            return None
        n = nj.get_linked_cubin_size(handle)
        out = bytearray(n)
        nj.get_linked_cubin(handle, out)
        print(f"STEP nvjitlink {name} {list(options)}: OK ({n} bytes)", flush=True)
        return bytes(out)
    finally:
        try:
            nj.destroy(handle)
        except Exception:
            pass


# ------------------------------------------------------------------------------- graphs
def kernel_node_params(kernel, args, grid=(1, 1, 1), block=(1, 1, 1), shared=0):
    """A ``CUDA_KERNEL_NODE_PARAMS`` for a rawgraph Kernel and KernelArgs (keep ``args`` alive)."""
    p = driver.CUDA_KERNEL_NODE_PARAMS()
    p.func = kernel.handle
    p.gridDimX, p.gridDimY, p.gridDimZ = grid
    p.blockDimX, p.blockDimY, p.blockDimZ = block
    p.sharedMemBytes = shared
    p.kernelParams = args.address
    return p


def add_kernel_node(name: str, graph, deps: list, kernel, args, quiet: bool = True):
    """``cuGraphAddKernelNode``; returns the node or None (the step line says why)."""
    return step(
        f"{name} cuGraphAddKernelNode",
        driver.cuGraphAddKernelNode,
        graph,
        deps,
        len(deps),
        kernel_node_params(kernel, args),
        quiet=quiet,
    )


def median_line(name: str, samples: Sequence[float]) -> dict:
    from rawgraph.runtime.timing import stats

    s = stats(samples)
    print(
        f"TIME {name}: median={s['median']:.3f} p10={s['p10']:.3f} p90={s['p90']:.3f} us (n={len(samples)})", flush=True
    )
    return s


def model_args(p: Any, rounds: int) -> None:
    """The TinyBlock a serving probe measures, as ``argparse`` options: ``--width``, ``--layers``,
    ``--form``, ``--max-batch`` and ``--rounds`` (timed replays per figure)."""
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--form", default="fused")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=rounds)
