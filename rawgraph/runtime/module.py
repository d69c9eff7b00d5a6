"""Finding the ``.cu`` sources, and loading compiled kernels into the device (``cuModuleLoadData``).

Sources live in the top-level ``kernels/`` folder of the checkout; the wheel ships them as the
data package ``rawgraph/kernels``. ``$RAWGRAPH_KERNEL_DIR`` overrides both.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver

from .compiler import DEFAULT_OPTIONS, CompiledImage, KernelCache, compile_source
from .device import Device, driver_cuda_version, get_device
from .errors import call, cuda_error
from .resource import Resource

KERNEL_DIR_ENV = "RAWGRAPH_KERNEL_DIR"
_SUCCESS = driver.CUresult.CUDA_SUCCESS


def kernel_dir() -> Path:
    """Folder holding the ``.cu`` sources (env override, installed wheel, then source checkout)."""
    env = os.environ.get(KERNEL_DIR_ENV)
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent  # rawgraph/ (this file is rawgraph/runtime/module.py)
    here = package
    for candidate in (package / "kernels", package.parent / "kernels"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"rawgraph kernel sources not found next to {here} (looked in rawgraph/kernels and ../kernels); "
        f"set {KERNEL_DIR_ENV}"
    )


def kernel_files() -> list[str]:
    """Names of the available sources, e.g. ``["elementwise", "init", "matmul"]``."""
    return sorted(p.stem for p in kernel_dir().glob("*.cu"))


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([A-Za-z0-9_.-]+\.cuh)"[ \t]*$', re.M)


def kernel_source(name: str) -> str:
    """Text of ``kernels/<name>.cu`` with its local ``#include "x.cuh"`` lines spliced in.

    NVRTC compiles one string; splicing here (rather than handing NVRTC the headers) puts the
    headers' text into the source that the kernel cache hashes, so editing a header recompiles.
    Each header is spliced once per source (later includes of it become empty).
    """
    folder = kernel_dir()
    seen: set[str] = set()

    def splice(match: re.Match[str]) -> str:
        header = match.group(1)
        if header in seen:
            return f"// {header}: already included"
        seen.add(header)
        path = folder / header
        if not path.is_file():
            raise FileNotFoundError(f"{name}.cu includes {header!r}, which is not in {folder}")
        return _INCLUDE.sub(splice, path.read_text())

    return _INCLUDE.sub(splice, (folder / f"{name}.cu").read_text())


class Module(Resource):
    """A loaded module (``cuModuleLoadData`` / ``cuModuleUnload``).

    See Also
    --------
    cuModuleLoadData, cuModuleUnload : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html
    """

    device: Device
    compiled: CompiledImage
    handle: Any  # driver.CUmodule

    def __init__(self, compiled: CompiledImage, device: Device | None = None):
        self.device = (device or get_device()).activate()
        self.compiled = compiled
        image = compiled.image if compiled.fmt == "cubin" else compiled.image.rstrip(b"\0") + b"\0"
        buf = np.frombuffer(image, dtype=np.uint8)  # the driver copies the image during the call
        self.handle = call(driver.cuModuleLoadData, buf.ctypes.data)
        self._own(driver.cuModuleUnload, self.handle)

    def function(self, symbol: str) -> driver.CUfunction:
        """``cuModuleGetFunction``; with lazy loading this is also where the kernel gets loaded.
        Raises :class:`~rawgraph.runtime.errors.ClosedError` (before the driver is called) after ``close()``.

        See Also
        --------
        cuModuleGetFunction : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html
        """
        self._check_open()
        return call(driver.cuModuleGetFunction, self.handle, symbol.encode())


class Kernel:
    """One ``__global__`` function ready to launch: the function handle and its module.

    Attributes
    ----------
    name : str
        The name expression (``"relu"``, ``"gemm_split_kernel<1, 4>"``).
    handle : CUfunction
    registers, static_smem : int
        From ``cuFuncGetAttribute``, for reports.

    See Also
    --------
    cuFuncGetAttribute : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    module: Module
    name: str
    symbol: str
    handle: Any  # driver.CUfunction
    registers: int
    static_smem: int
    max_dynamic_smem: int
    cluster_dims: tuple[int, int, int]

    def __init__(self, module: Module, name: str, symbol: str):
        self.module = module
        self.name = name
        self.symbol = symbol
        self.handle = module.function(symbol)
        attr = driver.CUfunction_attribute
        self.registers = int(call(driver.cuFuncGetAttribute, attr.CU_FUNC_ATTRIBUTE_NUM_REGS, self.handle))
        self.static_smem = int(call(driver.cuFuncGetAttribute, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.handle))
        self.max_dynamic_smem = int(
            call(driver.cuFuncGetAttribute, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.handle)
        )
        # Cluster dimensions compiled in with __cluster_dims__ (0 = none): a grid must be a
        # multiple of them, which exec updates check before the driver would refuse.
        # (Read raw: devices without clusters may refuse the attribute, CUDA_ERROR_INVALID_VALUE
        # or ..._NOT_SUPPORTED, which means none. Any other failure raises: this kernel is cached
        # for the process, and dims taken as 0 by mistake would group it with unclustered ones.)
        dims = []
        for a in (
            attr.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
            attr.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
            attr.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
        ):
            err, value = driver.cuFuncGetAttribute(a, self.handle)
            if err not in (
                driver.CUresult.CUDA_SUCCESS,
                driver.CUresult.CUDA_ERROR_INVALID_VALUE,
                driver.CUresult.CUDA_ERROR_NOT_SUPPORTED,
            ):
                raise cuda_error(err, "cuFuncGetAttribute")
            dims.append(int(value) if err == driver.CUresult.CUDA_SUCCESS else 0)
        self.cluster_dims = (dims[0], dims[1], dims[2])

    def allow_dynamic_smem(self, nbytes: int) -> None:
        """Let launches ask for up to ``nbytes`` of dynamic shared memory
        (``cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)``; needed above 48 KB).
        Only ever raised, so a plan built earlier with a smaller request stays valid.

        See Also
        --------
        cuFuncSetAttribute : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
        """
        if nbytes > self.max_dynamic_smem:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            call(driver.cuFuncSetAttribute, self.handle, attr, int(nbytes))
            self.max_dynamic_smem = int(nbytes)

    @property
    def short_name(self) -> str:
        return self.name.split("<", 1)[0]

    def __repr__(self) -> str:
        return f"<Kernel {self.name}: {self.registers} regs, {self.static_smem} B smem>"


# (device ordinal, file, kernel name, image format, compile options) -> the loaded kernel
_kernels: dict[tuple[int, str, str, str, tuple[str, ...]], Kernel] = {}
_lock = threading.Lock()


def get_kernels(
    file: str,
    names: Sequence[str],
    device: Device | None = None,
    fmt: str = "cubin",
    options: Sequence[str] = DEFAULT_OPTIONS,
    cache: KernelCache | bool = True,
) -> list[Kernel]:
    """Compile ``kernels/<file>.cu`` for the device's architecture and return the named kernels.

    Plain ``extern "C"`` kernels are named as they are; template instantiations by their name
    expression. Kernels are cached per process; compiled images on disk (:class:`KernelCache`).
    """
    device = (device or get_device()).activate()
    keys = [(device.ordinal, file, n, fmt, tuple(options)) for n in names]
    missing = [n for n, k in zip(names, keys) if k not in _kernels]
    if missing:
        with _lock:
            missing = [n for n, k in zip(names, keys) if k not in _kernels]
            if missing:
                templated = [n for n in missing if "<" in n]
                compiled = compile_source(
                    kernel_source(file), f"{file}.cu", device.arch, templated, options, fmt, cache
                )
                module = Module(compiled, device)
                for n in missing:
                    sym = compiled.lowered.get(n, n)
                    _kernels[(device.ordinal, file, n, fmt, tuple(options))] = Kernel(module, n, sym)
    return [_kernels[k] for k in keys]


def get_kernel(file: str, name: str, device: Device | None = None, **kw: Any) -> Kernel:
    """One kernel; see :func:`get_kernels`."""
    return get_kernels(file, [name], device, **kw)[0]


# -- a loaded function's parameter layout ---------------------------------------------------------
# Drivers of CUDA 13.2 and later export cuFuncGetParamCount; older ones do not (a newer binding
# still names it, and calling it there raises).
PARAM_COUNT_DRIVER = 13020
# A kernel takes at most 32 KB of parameters: this bounds the index-by-index read.
MAX_PARAMS = 4096


@dataclass(frozen=True)
class LayoutRead:
    """What reading a kernel's parameter layout gave: ``(offset, size)`` of each parameter read,
    and ``err`` (``CUDA_SUCCESS`` when the layout is whole, else the answer of ``call``, the call
    that stopped the read)."""

    layout: list[tuple[int, int]]
    err: Any
    call: str


def read_param_layout(function: Any) -> LayoutRead:
    """Read the parameter layout of a loaded kernel without raising for a driver's answer.

    Where the driver has ``cuFuncGetParamCount`` (CUDA 13.2 on) the count comes first and exactly
    that many ``cuFuncGetParamInfo`` answers are asked for; on an older driver they are asked index
    by index until it answers ``CUDA_ERROR_INVALID_VALUE``, one past the last.

    See Also
    --------
    cuFuncGetParamCount : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """
    count = None
    get_count = getattr(driver, "cuFuncGetParamCount", None)  # bindings older than 13.2 lack it
    if get_count is not None and driver_cuda_version() >= PARAM_COUNT_DRIVER:
        err, n = get_count(function)
        if err != _SUCCESS:
            return LayoutRead([], err, "cuFuncGetParamCount")
        count = int(n)
    layout: list[tuple[int, int]] = []
    while len(layout) < (MAX_PARAMS if count is None else count):
        err, offset, size = driver.cuFuncGetParamInfo(function, len(layout))
        if count is None and err == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
            return LayoutRead(layout, _SUCCESS, "cuFuncGetParamInfo")
        if err != _SUCCESS:
            return LayoutRead(layout, err, "cuFuncGetParamInfo")
        layout.append((int(offset), int(size)))
    if count is None:  # no end in sight: not a layout
        return LayoutRead(layout, driver.CUresult.CUDA_ERROR_NOT_SUPPORTED, f"cuFuncGetParamInfo (> {MAX_PARAMS})")
    return LayoutRead(layout, _SUCCESS, "cuFuncGetParamInfo")


def param_layout(function: Any) -> list[tuple[int, int]]:
    """``(offset, size)`` of each parameter of a loaded kernel, in order (:func:`read_param_layout`);
    any failure raises :class:`~rawgraph.runtime.errors.CudaError` naming the call."""
    read = read_param_layout(function)
    if read.err != _SUCCESS:
        raise cuda_error(read.err, read.call)
    return read.layout
