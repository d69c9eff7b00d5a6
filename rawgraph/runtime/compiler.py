"""Run-time compilation with NVRTC (``cuda.bindings.nvrtc``) and an on-disk cache.

CUBIN for the exact compute capability is the default: PTX from a newer NVRTC (13.5 from pip) is
refused by an older driver (CUDA 13.0 on our H200) with ``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``,
while a CUBIN is machine code the driver loads as is. PTX is available as an explicit option.

Cache entries are keyed by source, options, name expressions, NVRTC version, architecture and
format. Each file carries a header with the payload's SHA-256 and length, so a truncated or
corrupt entry is detected and recompiled, never loaded. Entries are written to a temporary file
and renamed into place, so concurrent processes never see (or make) a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from cuda.bindings import nvrtc

from .errors import NvrtcError, nvrtc_check

CACHE_ENV = "RAWGRAPH_CACHE_DIR"
_MAGIC = b"RGKCACHE"
_SCHEMA = 1
DEFAULT_OPTIONS = ("-std=c++17",)


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)`` (``nvrtcVersion``)."""
    return tuple(nvrtc_check(nvrtc.nvrtcVersion(), "nvrtcVersion"))  # type: ignore[return-value]


def supported_archs() -> list[int]:
    """Compute capabilities this NVRTC can compile CUBIN for, e.g. ``[75, 80, ..., 90, ...]``."""
    return [int(a) for a in nvrtc_check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")]


def default_cache_dir() -> Path:
    """``$RAWGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rawgraph/kernels``, else ``~/.cache/rawgraph/kernels``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rawgraph" / "kernels"


@dataclass(frozen=True)
class CompiledImage:
    """A compiled module image and what is needed to load it.

    Attributes
    ----------
    image : bytes
        CUBIN (ELF) or PTX text.
    fmt : str
        ``"cubin"`` or ``"ptx"``.
    arch : str
        ``"sm_90"`` and the like.
    lowered : dict
        Name expression (``"matvec_kernel<0, 4, 64, 4>"``) -> mangled symbol to load.
    log : str
        NVRTC's log (warnings), empty when clean.
    from_cache : bool
    """

    image: bytes
    fmt: str
    arch: str
    lowered: dict[str, str] = field(default_factory=dict)
    log: str = ""
    from_cache: bool = False


class KernelCache:
    """Directory of compiled images; see the module docstring for the format and guarantees."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def key(self, source: str, arch: str, fmt: str, names: Sequence[str], options: Sequence[str]) -> str:
        blob = json.dumps(
            {
                "schema": _SCHEMA,
                "source": source,
                "arch": arch,
                "fmt": fmt,
                "names": list(names),
                "options": list(options),
                "nvrtc": list(nvrtc_version()),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.bin"

    def load(self, key: str) -> CompiledImage | None:
        """The entry for ``key``, or None when missing, truncated or corrupt."""
        try:
            data = self.path(key).read_bytes()
        except OSError:
            return None
        try:
            if data[:8] != _MAGIC:
                return None
            (hlen,) = struct.unpack_from("<I", data, 8)
            header = json.loads(data[12 : 12 + hlen].decode())
            payload = data[12 + hlen :]
            if header["key"] != key or len(payload) != header["size"]:
                return None
            if hashlib.sha256(payload).hexdigest() != header["sha256"]:
                return None
            return CompiledImage(payload, header["fmt"], header["arch"], header["lowered"], header["log"], True)
        except (ValueError, KeyError, struct.error, UnicodeDecodeError, TypeError):
            return None

    def store(self, key: str, entry: CompiledImage) -> None:
        """Write atomically (temp file + ``os.replace``). A cache that can't be written only warns."""
        header = json.dumps(
            {
                "key": key,
                "size": len(entry.image),
                "sha256": hashlib.sha256(entry.image).hexdigest(),
                "fmt": entry.fmt,
                "arch": entry.arch,
                "lowered": entry.lowered,
                "log": entry.log,
            }
        ).encode()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + struct.pack("<I", len(header)) + header + entry.image)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path(key))
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as exc:
            warnings.warn(f"rawgraph kernel cache not written ({self.directory}): {exc}", RuntimeWarning, stacklevel=3)


def _program_log(prog: nvrtc.nvrtcProgram) -> str:
    size = nvrtc_check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = _out_buffer(size)
    nvrtc_check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\0 ").decode(errors="replace")


def _out_buffer(size: int) -> bytearray:
    """A fresh, writable buffer for NVRTC to fill.

    Never ``bytes``: NVRTC writes into the buffer it is given, and CPython keeps every one-byte
    ``bytes`` as one shared interpreter object, so an empty log (size 1, a lone NUL) written into a
    one-byte ``bytes`` would turn the interpreter's space byte into NUL for the whole process.
    """
    return bytearray(max(int(size), 1))


def _check_arch(arch: str, fmt: str) -> int:
    if not (arch.startswith("sm_") and arch[3:].rstrip("af").isdigit()):
        raise ValueError(f"arch must look like 'sm_90', got {arch!r}")
    cc = int(arch[3:].rstrip("af"))
    if cc not in supported_archs():
        major, minor = nvrtc_version()
        raise NvrtcError(
            "NVRTC_ERROR_INVALID_OPTION",
            f"NVRTC {major}.{minor} cannot compile for {arch} (supported: {supported_archs()})",
        )
    return cc


def compile_source(
    source: str,
    source_name: str,
    arch: str,
    names: Sequence[str] = (),
    options: Sequence[str] = DEFAULT_OPTIONS,
    fmt: str = "cubin",
    cache: KernelCache | None | bool = True,
) -> CompiledImage:
    """Compile CUDA C++ with NVRTC, through the cache.

    Parameters
    ----------
    source : str
        CUDA C++ source.
    source_name : str
        File name shown in diagnostics.
    arch : str
        Real architecture, e.g. ``"sm_90"``. For ``fmt="cubin"`` this is the machine code made;
        for ``fmt="ptx"`` the matching virtual architecture (``compute_90``) is used.
    names : sequence of str
        Name expressions (template instantiations, ``nvrtcAddNameExpression``) to instantiate and
        look up; their mangled names come back in ``lowered``.
    options : sequence of str
        Extra NVRTC options (the architecture option is added here).
    fmt : {"cubin", "ptx"}
    cache : KernelCache, True (default directory) or False/None (no cache)

    Raises
    ------
    NvrtcError
        Compilation failed; ``.log`` holds NVRTC's complete log.
    """
    if fmt not in ("cubin", "ptx"):
        raise ValueError(f"fmt must be 'cubin' or 'ptx', got {fmt!r}")
    _check_arch(arch, fmt)
    if cache is True:
        cache = KernelCache()
    all_options = list(options) + [
        f"--gpu-architecture={arch if fmt == 'cubin' else arch.replace('sm_', 'compute_')}"
    ]
    key = None
    if cache:
        key = cache.key(source, arch, fmt, names, all_options)
        hit = cache.load(key)
        if hit is not None:
            return hit
    entry = _compile(source, source_name, arch, names, all_options, fmt)
    if cache and key is not None:
        cache.store(key, entry)
    return entry


def _compile(source: str, source_name: str, arch: str, names: Sequence[str], options: list[str], fmt: str) -> CompiledImage:
    prog = nvrtc_check(
        nvrtc.nvrtcCreateProgram(source.encode(), source_name.encode(), 0, [], []),
        "nvrtcCreateProgram",
        source_name,
    )
    try:
        for expr in names:
            nvrtc_check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression", source_name)
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _program_log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(nvrtc.nvrtcResult(int(err)).name, "compilation failed", log, source_name)
        if fmt == "cubin":
            size = nvrtc_check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize", source_name)
            image = _out_buffer(size)
            nvrtc_check(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN", source_name)
        else:
            size = nvrtc_check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize", source_name)
            image = _out_buffer(size)
            nvrtc_check(nvrtc.nvrtcGetPTX(prog, image), "nvrtcGetPTX", source_name)
        lowered = {}
        for expr in names:
            sym = nvrtc_check(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), "nvrtcGetLoweredName", source_name)
            lowered[expr] = sym.decode() if isinstance(sym, bytes) else str(sym)
        return CompiledImage(bytes(image), fmt, arch, lowered, log, False)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
