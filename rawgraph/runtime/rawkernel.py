"""Your own kernel in one call: CUDA source to a callable launch that capture records.

``RawKernel(source, "saxpy")`` compiles the source with NVRTC for the device (through the same
cache as rawgraph's kernels), loads it, reads the parameter layout from the driver
(``cuFuncGetParamInfo``: each parameter's offset and size) and the C types from the
``__global__`` declaration (:func:`rawgraph.runtime.signature.parse_signature`, or types given by hand).
Calling it checks every argument against its C type, packs them and launches
(``cuLaunchKernel``). On a stream a :class:`~rawgraph.Capture` is capturing, the call is recorded
in the capture's node map with the array each pointer argument holds, so the graph can be
rebound afterwards with no launch plan written by hand::

    k = RawKernel(src, "saxpy")
    with Capture(stream) as cap:
        k(grid, block, (2.0, x, y, n), stream=stream)
    exe = cap.graph.instantiate()
    upd = ExecUpdateManager(cap.graph, exe)
    upd.rebind(x, x2)      # or upd.bind("x", x2): the C parameter's name

On a machine without the GPU (a CPU CI), ``RawKernel(src, "saxpy", arch="sm_90")`` or
:func:`check_kernel` does all of this but the loading: the declaration is read, the source
compiled for that architecture, and the parameter layout read from the CUBIN itself and checked
against the declaration; such a kernel cannot be launched (:class:`CompileOnlyError`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from . import _capturing
from .compiler import DEFAULT_OPTIONS, CompiledImage, KernelCache, compile_source
from .cubin import cubin_kernels
from .device import Device, get_device
from .errors import ArgumentError, CaptureRefusedError, RawgraphError, SignatureError, cuda_error
from .launch import ARG_DTYPES, MAX_BLOCK, MAX_GRID, ArgUse, KernelArgs, Launch, arg_dtype, check_scalar, launch_dims
from .memory import DeviceArray, as_device_array
from .module import Kernel, Module, param_layout
from .signature import KINDS, Param, parse_signature
from .stream import capture_info, stream_handle

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE

# One loaded kernel per (device, source, name, options, format) for the process, as for the
# kernels in kernels/: a module stays loaded while any graph may hold a node of it.
_loaded: dict[tuple[int, str, str, tuple[str, ...]], Kernel] = {}
_load_lock = threading.Lock()


def _pointee(ctype: str) -> np.dtype | None:
    """The element dtype a pointer parameter's C type points at (``const float*`` -> float32),
    or None when it is not one scalar type (``void*``, ``float4*``, ``float**``, a struct)."""
    words = ctype.replace("*", " * ").split()
    if words.count("*") != 1 or words[-1] != "*":
        return None
    base = " ".join(w for w in words[:-1] if w not in ("const", "volatile"))
    kind = KINDS.get(base)
    return ARG_DTYPES[kind] if kind is not None else None


def _kind_of(t: str) -> str:
    """A kind of :data:`~rawgraph.runtime.launch.ARG_DTYPES` from a kind or a C type given by hand."""
    t = " ".join(str(t).split())
    if t in ARG_DTYPES or t.startswith(("i32[", "u8[")):
        arg_dtype(t)  # refuses a malformed array kind
        return t
    if t.endswith("*"):
        return "ptr"
    if t in KINDS:
        return KINDS[t]
    raise SignatureError(f"unknown argument type {t!r}: give a kind ({sorted(ARG_DTYPES)}, 'u8[N]') or a C type")


class CompileOnlyError(RawgraphError, ValueError):
    """A kernel compiled with ``RawKernel(..., arch=)`` (no driver, nothing loaded) was launched;
    refused before any driver call."""


def _compile_kernel(
    source: str, name: str, arch: str, opts: tuple[str, ...], cache: KernelCache | bool
) -> CompiledImage:
    """The CUBIN of kernel ``name`` for ``arch``, through the cache. Always a name expression:
    only NVRTC knows the symbol of a C++ (mangled), namespaced or templated kernel; an
    ``extern "C"`` one lowers to its own name."""
    base = name.split("<", 1)[0].split("::")[-1].strip()
    return compile_source(source, f"{base}.cu", arch, [name], opts, "cubin", cache)


class RawKernel:
    """A ``__global__`` function compiled from source, launched by calling it.

    Parameters
    ----------
    source : str
        CUDA C++ source holding the kernel (``extern "C"``, C++ linkage, in a namespace, or a
        template).
    name : str
        The kernel's name as C++ names it: ``"saxpy"``, ``"ns::saxpy"``, or a template
        instantiation (``"scale<4>"``). NVRTC resolves it (a name expression) to the symbol loaded.
    options : sequence of str
        Extra NVRTC options (``-std=c++17`` and the architecture are always given).
    types : sequence of str, optional
        The C type (``"const float*"``, ``"int"``) or kind (``"ptr"``, ``"f32"``) of each
        parameter, when the declaration cannot be read (macros, a template's by-value ``T``).
    device : Device, optional
        The device to compile for and load on (default the current one).
    cache : KernelCache or bool
        The compiled-image cache (default the one rawgraph's kernels use).
    arch : str, optional
        Compile only, for this architecture (``"sm_90"``), with no driver and no GPU: the
        declaration is read, the source compiled to a CUBIN and the parameter layout read from
        the CUBIN itself (:func:`~rawgraph.runtime.cubin.cubin_kernels`) and checked against
        the declaration as a loaded kernel's is. Nothing is loaded, and launching raises
        :class:`CompileOnlyError` before any driver call. Not with ``device``.

    Attributes
    ----------
    kernel : Kernel
        The loaded function (``handle``, ``registers``, ...); :class:`CompileOnlyError` for a
        kernel compiled with ``arch=``.
    device : Device or None
        None for a kernel compiled with ``arch=``.
    arch : str
        The architecture compiled for.
    params : list of Param
        Name, C type, kind and role (pointers: ``read`` for ``const``, else ``write``) of each
        parameter.
    spec : list of (name, kind)
        The argument layout packed for each launch.
    layout : list of (offset, size)
        Each parameter's byte offset and size as the kernel takes it (the driver's
        ``cuFuncGetParamInfo``, or the CUBIN's own record with ``arch=``).

    Raises
    ------
    NvrtcError
        The source does not compile (the log is in the error);
        :class:`~rawgraph.runtime.compiler.MissingHeadersError` when it includes a CUDA toolkit
        header no installed package provides.
    SignatureError
        The declaration cannot be read and no ``types`` were given, or the types disagree with
        the sizes the kernel takes.

    See Also
    --------
    cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    device: Device | None
    name: str
    arch: str
    params: list[Param]
    spec: list[tuple[str, str]]
    layout: list[tuple[int, int]]

    def __init__(
        self,
        source: str,
        name: str,
        options: Sequence[str] = (),
        types: Sequence[str] | None = None,
        device: Device | None = None,
        cache: KernelCache | bool = True,
        arch: str | None = None,
    ):
        if not isinstance(source, str) or not isinstance(name, str) or not name:
            raise TypeError("RawKernel(source, name): both are strings")
        if arch is not None and (not isinstance(arch, str) or device is not None):
            raise TypeError("RawKernel: arch= (compile only) is a string like 'sm_90', and not given with device=")
        # The declaration first: a kernel name not in the source is refused before NVRTC and
        # the driver (cuModuleGetFunction would only say CUDA_ERROR_NOT_FOUND).
        parsed = parse_signature(source, name) if types is None else None
        self.name = name
        opts = tuple(DEFAULT_OPTIONS) + tuple(str(o) for o in options if str(o) not in DEFAULT_OPTIONS)
        self._kernel: Kernel | None = None
        if arch is not None:
            # Compile only: nothing here may reach the driver (a CPU machine has none to load).
            self.device, self.arch = None, arch
            compiled = _compile_kernel(source, name, arch, opts, cache)
            symbol = compiled.lowered[name]
            found = cubin_kernels(compiled.image).get(symbol)
            if found is None:
                raise SignatureError(f"{name}: the CUBIN NVRTC made has no kernel {symbol!r}")
            layout = found.params
        else:
            self.device = (device or get_device()).activate()
            self.arch = self.device.arch
            key = (self.device.ordinal, source, name, opts)
            kernel = _loaded.get(key)
            if kernel is None:
                with _load_lock:
                    kernel = _loaded.get(key)
                    if kernel is None:
                        compiled = _compile_kernel(source, name, self.device.arch, opts, cache)
                        kernel = Kernel(Module(compiled, self.device), name, compiled.lowered[name])
                        _loaded[key] = kernel
            self._kernel = kernel
            layout = param_layout(kernel.handle)
        self.layout = layout
        params = self._params(source, name, types, layout) if parsed is None else parsed
        # An unnamed C parameter (``float*``) still needs a name to pack and bind it by.
        self.params = [p if p.name else Param(f"arg{i}", p.ctype, p.kind, p.role) for i, p in enumerate(params)]
        if len(self.params) != len(layout):
            raise SignatureError(f"{name}: the declaration has {len(self.params)} parameters, the kernel {len(layout)}")
        self.spec = []
        for p, (_off, size) in zip(self.params, layout):
            kind = p.kind if p.kind != "struct" else f"u8[{size}]"
            if kind is None:
                raise SignatureError(
                    f"{name}: parameter {p.name!r} has type {p.ctype!r} (a template parameter): give types="
                )
            if arg_dtype(kind).itemsize != size:
                raise SignatureError(
                    f"{name}: parameter {p.name!r} ({p.ctype}) is {arg_dtype(kind).itemsize} bytes "
                    f"as read, but the kernel takes {size}"
                )
            self.spec.append((p.name, kind))
        # What each pointer parameter points at, to refuse an array of another element type, and
        # whether the kernel only reads through it (``read``: const pointee), the one place a
        # read-only array may go.
        self._pointees = {p.name: _pointee(p.ctype) for p in self.params if p.kind == "ptr"}
        self._roles = {p.name: p.role or "write" for p in self.params if p.kind == "ptr"}  # a pointer always has one
        # Launches reuse one argument buffer: the driver copies the values during cuLaunchKernel.
        self._args = KernelArgs(self.spec)
        self._lock = threading.Lock()

    @property
    def kernel(self) -> Kernel:
        """The loaded function; :class:`CompileOnlyError` for a kernel compiled with ``arch=``."""
        return self._check_loaded()

    def _check_loaded(self) -> Kernel:
        if self._kernel is None:
            raise CompileOnlyError(
                f"{self.name} was compiled for {self.arch} only (RawKernel(..., arch=)): nothing "
                "is loaded to launch; construct it without arch= on a machine with the GPU"
            )
        return self._kernel

    @staticmethod
    def _params(source: str, name: str, types: Sequence[str] | None, layout: list[tuple[int, int]]) -> list[Param]:
        if types is not None:
            types = list(types)
            if len(types) != len(layout):
                raise SignatureError(f"{name} takes {len(layout)} arguments; {len(types)} types were given")
            try:
                names = [p.name for p in parse_signature(source, name)]
            except SignatureError:
                names = []
            if len(names) != len(types):
                names = [f"arg{i}" for i in range(len(types))]
            out = []
            for n, t in zip(names, types):
                kind = _kind_of(t)
                const = "const" in str(t).split("*")[0].split()
                out.append(Param(n, str(t), kind, ("read" if const else "write") if kind == "ptr" else None))
            return out
        return parse_signature(source, name)

    # -- arguments --------------------------------------------------------------------------
    def _pack(self, args: Sequence[Any], into: KernelArgs) -> list[tuple[str, DeviceArray]]:
        """Check every argument against its parameter and write it into ``into``; returns the
        pointer arguments' arrays (parameter name, array)."""
        if not isinstance(args, (tuple, list)):
            raise ArgumentError(f"{self.name}: args must be a tuple of the kernel's arguments")
        if len(args) != len(self.spec):
            raise ArgumentError(
                f"{self.name} takes {len(self.spec)} arguments ({', '.join(n for n, _ in self.spec)}), got {len(args)}"
            )
        arrays: list[tuple[str, DeviceArray]] = []
        for (pname, kind), value in zip(self.spec, args):
            what = f"{self.name} argument {pname!r}"
            if kind == "ptr":
                view = self._pointer_arg(pname, value, what)
                into[pname] = view.ptr
                arrays.append((pname, view))
            elif kind.startswith("u8["):
                n = arg_dtype(kind).itemsize
                raw = value.tobytes() if isinstance(value, (np.void, np.ndarray)) else value
                if not isinstance(raw, (bytes, bytearray, memoryview)) or len(memoryview(raw).cast("B")) != n:
                    raise ArgumentError(
                        f"{what} is a {n}-byte struct: pass bytes or a NumPy structured "
                        f"scalar of {n} bytes, got {type(value).__name__}"
                    )
                into.array(pname)[:] = np.frombuffer(bytes(raw), dtype=np.uint8)
            elif kind.startswith("i32["):
                n = arg_dtype(kind).shape[0]
                if (
                    not (isinstance(value, (tuple, list)) or (isinstance(value, np.ndarray) and value.ndim == 1))
                    or len(value) != n
                ):
                    raise ArgumentError(f"{what} takes {n} int32 values (a list, tuple or 1-D array)")
                for j, v in enumerate(value):  # each element as an int argument of its own
                    check_scalar("i32", v, f"{what}[{j}]")
                into.array(pname)[:] = value
            else:
                check_scalar(kind, value, what)
                into[pname] = value
        return arrays

    def _pointer_arg(self, pname: str, value: Any, what: str) -> DeviceArray:
        """The device array ``value`` passed for pointer parameter ``pname``, checked: a device
        array (not a raw address), writable where the kernel may write through it, of the element
        type the parameter points at (bytes match anything)."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            raise ArgumentError(
                f"{what} is a pointer: pass a device array (a raw address can be "
                "wrapped as rawgraph.DeviceArray(ptr, shape, dtype, owner))"
            )
        try:
            view = as_device_array(value, what)
        except (RawgraphError, ValueError, TypeError) as exc:  # host, strided, closed, bad DLPack
            raise ArgumentError(str(exc)) from None
        if view.readonly and self._roles[pname] != "read":
            raise ArgumentError(
                f"{what} is read-only memory, but the kernel may write through it "
                f"({self._ctype(pname)} {pname}): pass writable memory, or make the "
                "parameter a const pointer"
            )
        want = self._pointees.get(pname)
        # Bytes are raw memory on either side (a byte array for any pointer, any array
        # for a char pointer); another element type is one the kernel would misread.
        if (
            want is not None
            and 1 not in (view.dtype.itemsize, want.itemsize)
            and not (want.kind == view.dtype.kind and want.itemsize == view.dtype.itemsize)
        ):
            raise ArgumentError(
                f"{what} points at {want.name} ({self._ctype(pname)}), got an array of {view.dtype.name}"
            )
        return view

    def _ctype(self, pname: str) -> str:
        return next(p.ctype for p in self.params if p.name == pname)

    # -- launching --------------------------------------------------------------------------
    def launch(
        self,
        grid: Any,
        block: Any,
        args: Sequence[Any],
        stream: Any = None,
        shared_mem: int = 0,
        names: dict[str, str] | None = None,
    ) -> Launch:
        """Build the :class:`~rawgraph.Launch` for these arguments without running it: its own
        argument buffer and, for each pointer argument, which array it uses (named by its C
        parameter, or by ``names``). What a call records inside a capture."""
        self._check_loaded()  # a compile-only kernel is refused before any driver call
        launch, _arrays = self._launch(grid, block, args, shared_mem, names, None)
        return launch

    def _launch(
        self, grid: Any, block: Any, args: Sequence[Any], shared_mem: int, names: dict[str, str] | None, capture: Any
    ) -> tuple[Launch, dict[str, DeviceArray]]:
        g, b, names = self._config(grid, block, shared_mem, names)
        kargs = KernelArgs(self.spec)
        arrays = self._pack(args, kargs)
        uses: dict[str, ArgUse] = {}
        buffers: dict[str, DeviceArray] = {}
        for pname, view in arrays:
            if capture is None:
                bname = names.get(pname, pname)
            else:
                bname = capture.buffer_name(view, names.get(pname, pname))
                if pname in names and bname != names[pname]:
                    # An explicit name is a promise to bind by it: never rename it quietly.
                    raise ArgumentError(
                        f"{self.name}: names= asks {pname!r} to be {names[pname]!r}, but in this "
                        f"capture "
                        + (
                            f"that array is already {bname!r}"
                            if bname in capture.buffers
                            else f"{names[pname]!r} is another array"
                        )
                    )
            if bname in buffers and (buffers[bname].ptr, buffers[bname].nbytes) != (view.ptr, view.nbytes):
                raise ArgumentError(f"{self.name}: names= gives the name {bname!r} to two different arrays")
            buffers[bname] = view
            uses[pname] = ArgUse(bname, self._roles[pname])
        launch = Launch(self.kernel, g, b, kargs, uses, shared_mem=int(shared_mem), label=self.name)
        return launch, buffers

    def _config(
        self, grid: Any, block: Any, shared_mem: Any, names: dict[str, str] | None
    ) -> tuple[tuple[int, int, int], tuple[int, int, int], dict[str, str]]:
        """Grid, block, shared memory and ``names=`` checked (before any driver call)."""
        g, b = launch_dims(grid, "grid", MAX_GRID), launch_dims(block, "block", MAX_BLOCK)
        if b[0] * b[1] * b[2] > 1024:
            raise ArgumentError(f"{self.name}: block {b} has more than 1024 threads")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise ArgumentError(f"shared_mem must be an int >= 0, got {shared_mem!r}")
        names = dict(names) if names else {}
        if names:  # most calls name nothing: no set built per launch
            unknown = set(names) - set(self._roles)  # the pointer parameters
            if unknown:
                raise ArgumentError(f"{self.name}: names= gives {sorted(unknown)}, which are not pointer parameters")
            if any(not isinstance(v, str) or not v for v in names.values()):
                raise ArgumentError(f"{self.name}: names= maps parameter names to non-empty strings")
        if shared_mem > 48 * 1024:
            self.kernel.allow_dynamic_smem(int(shared_mem))
        return g, b, names

    def __call__(
        self,
        grid: Any,
        block: Any,
        args: Sequence[Any],
        stream: Any = None,
        shared_mem: int = 0,
        names: dict[str, str] | None = None,
    ) -> None:
        """Launch on ``stream`` (any stream-like object; default the legacy stream) with ``args``
        in the kernel's parameter order (``cuLaunchKernel``).

        Arrays: anything :func:`~rawgraph.as_device_array` takes (``DeviceBuffer``, CuPy, torch,
        DLPack, ``__cuda_array_interface__``); memory its producer marked read-only only for a
        ``const`` pointer parameter. Scalars are checked against their C type, and each of the
        ``N`` values of an ``i32[N]`` argument as an ``int``; a struct by value is bytes or a NumPy
        structured scalar of its size. On a stream a rawgraph
        :class:`~rawgraph.Capture` is capturing, the launch goes through ``Capture.launch`` and the
        node map records which array each pointer argument holds (``names`` renames them: C
        parameter name -> the name to bind it by).

        Raises
        ------
        ArgumentError
            An argument, grid or block that does not fit (before any driver call).
        CompileOnlyError
            The kernel was compiled with ``arch=`` (before any driver call).
        """
        kernel = self._check_loaded()  # a compile-only kernel is refused before any driver call
        h = stream_handle(stream) if stream is not None else 0
        if _capturing._active and int(h):  # a CUstream object is truthy even for handle 0
            status, cid, _g, _d = capture_info(h)
            rec = _capturing.record_of(cid) if status == _ACTIVE else None
            recorder = rec.owner() if rec is not None and rec.owner is not None else None
            if rec is not None and recorder is not None:
                if rec.ident != threading.get_ident():
                    # The node map is read and written by the capturing thread: two threads
                    # recording at once would pair a node with the other's launch.
                    raise CaptureRefusedError(
                        f"{self.name}: the stream is being captured by thread {rec.thread!r}; launch into "
                        "that capture from the thread that opened it"
                    )
                launch, buffers = self._launch(grid, block, args, shared_mem, names, recorder)
                recorder.launch(launch, stream, buffers=buffers)
                return
        g, b, _names = self._config(grid, block, shared_mem, names)
        with self._lock:  # one argument buffer: a second thread must not repack it mid-launch
            self._pack(args, self._args)
            (err,) = driver.cuLaunchKernel(kernel.handle, *g, *b, int(shared_mem), h, self._args.address, 0)
        if err != _SUCCESS:
            raise cuda_error(err, f"cuLaunchKernel({self.name})")

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.ctype} {p.name}".strip() for p in self.params)
        return f"<RawKernel {self.name}({sig}){' compiled for ' + self.arch + ' only' if self._kernel is None else ''}>"


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel as :func:`check_kernel` reports it.

    Attributes
    ----------
    name, ctype : str
        As declared (``argN`` for an unnamed one), or as given in ``types``.
    kind : str
        What a launch packs: a scalar kind (``"f32"``, ``"f16"``, ...), ``"ptr"``, ``"i32[N]"``,
        or ``"u8[N]"`` for a struct passed by value.
    role : str or None
        Pointers: ``"read"`` (const pointee) or ``"write"``.
    offset, size : int
        Byte offset and size in the kernel's parameter buffer, from the compiled kernel.
    """

    name: str
    ctype: str
    kind: str
    role: str | None
    offset: int
    size: int


def check_kernel(
    source: str,
    name: str,
    arch: str = "sm_90",
    types: Sequence[str] | None = None,
    options: Sequence[str] = (),
    cache: KernelCache | bool = True,
) -> list[KernelParam]:
    """Compile kernel ``name`` of ``source`` for ``arch`` and check it as :class:`RawKernel` would,
    with no driver and no GPU (``RawKernel(..., arch=arch)``): for a CPU CI that tests kernels.

    The declaration is read (or ``types`` used), the source compiled to a CUBIN, and each
    parameter's size in the CUBIN checked against its C type; includes of the CUDA toolkit's
    headers are found as for a launch.

    Returns
    -------
    list of KernelParam
        Each parameter's name, C type, kind, role, offset and size, in order.

    Raises
    ------
    NvrtcError
        The source does not compile (:class:`~rawgraph.runtime.compiler.MissingHeadersError`: a
        toolkit header no installed package provides).
    SignatureError
        The declaration cannot be read (give ``types``), or disagrees with the compiled kernel.
    """
    k = RawKernel(source, name, options, types, cache=cache, arch=arch)
    return [
        KernelParam(p.name, p.ctype, kind, p.role, offset, size)
        for p, (_n, kind), (offset, size) in zip(k.params, k.spec, k.layout)
    ]
