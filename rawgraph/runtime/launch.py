"""Persistent packed kernel arguments, single launches, and launch plans.

``cuLaunchKernel`` takes ``kernelParams``: an array of pointers, one per kernel argument, each
pointing at that argument's value. :class:`KernelArgs` lays the values out once in one host buffer
and keeps the pointer array next to them, so a launch passes one integer (the array's address)
and nothing is packed or allocated per call. Values are edited in place (``args["x"] = ptr``).

The host memory must outlive every launch and capture that reads it: the driver reads it during
the call (freed argument memory showed up as ``CUDA_ERROR_MISALIGNED_ADDRESS``, driver 580), so a
:class:`Launch` owns its :class:`KernelArgs` and a :class:`LaunchPlan` owns its launches.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from cuda.bindings import driver

from .errors import ArgumentError, ClosedError, cuda_error
from .memory import DeviceArray
from .module import Kernel
from .stream import stream_handle

_SUCCESS = driver.CUresult.CUDA_SUCCESS

# Argument kinds and their C types: size and alignment are the dtype's itemsize.
ARG_DTYPES: dict[str, np.dtype] = {
    "ptr": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "i16": np.dtype(np.int16),
    "u16": np.dtype(np.uint16),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "i64": np.dtype(np.int64),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
FLOAT_KINDS = frozenset({"f16", "f32", "f64"})
# Worked out once, not per call: a scalar setter checks every value it is given.
# A finite float rounds to infinity in its kind from halfway past the largest finite value up
# (round to nearest even: an f16 takes |x| < 65520, which rounds to at most 65504).
# (The step below the largest value equals the step above it: both lie in the top binade.)
_FLOAT_LIMIT = {
    k: 1.5 * float(m) - 0.5 * float(np.nextafter(m, m.dtype.type(0))) if k != "f64" else math.inf
    for k in FLOAT_KINDS
    for m in (np.finfo(ARG_DTYPES[k]).max,)
}
_INT_RANGE = {
    k: (int(np.iinfo(d).min), int(np.iinfo(d).max)) for k, d in ARG_DTYPES.items() if k != "ptr" and d.kind in "iu"
}


def arg_dtype(kind: str) -> np.dtype:
    """The dtype of an argument kind: a scalar kind of :data:`ARG_DTYPES`, ``"i32[N]"`` for a
    by-value array (a struct of ``N`` int32 in C: size ``4 N``, aligned to 4), or ``"u8[N]"`` for
    a struct of ``N`` bytes passed by value (its bytes as given; the driver copies ``N`` bytes
    from the slot, so the slot needs no alignment of its own)."""
    if kind in ARG_DTYPES:
        return ARG_DTYPES[kind]
    for prefix, base in (("i32[", np.int32), ("u8[", np.uint8)):
        if (
            kind.startswith(prefix)
            and kind.endswith("]")
            and kind[len(prefix) : -1].isdigit()
            and int(kind[len(prefix) : -1]) > 0
        ):
            return np.dtype((base, (int(kind[len(prefix) : -1]),)))
    raise ValueError(f"unknown kind {kind!r} (use one of {sorted(ARG_DTYPES)}, 'i32[N]' or 'u8[N]')")


# The driver's largest grid and block, per dimension, on every GPU since compute capability 3.0
# (``cuLaunchKernel``'s limits; a grid of 2**32 does not even fit CUDA_KERNEL_NODE_PARAMS' unsigned
# fields). A block also holds at most 1024 threads in all.
MAX_GRID = ((1 << 31) - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)


def launch_dims(v: Any, what: str, largest: tuple[int, int, int]) -> tuple[int, int, int]:
    """``v`` (an int or 1 to 3 ints, as ``cuLaunchKernel`` takes a grid or a block) as three
    positive ints within ``largest`` (:data:`MAX_GRID`, :data:`MAX_BLOCK`); else
    :class:`ArgumentError` naming ``what``, before anything reaches the driver.

    See Also
    --------
    cuLaunchKernel : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """
    if isinstance(v, (int, np.integer)):
        t: tuple[Any, ...] = (v,)
    elif isinstance(v, (tuple, list)):
        t = tuple(v)
    else:
        raise ArgumentError(f"{what} must be an int or 1 to 3 ints, got {v!r}")
    if not 1 <= len(t) <= 3 or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in t):
        raise ArgumentError(f"{what} must be an int or 1 to 3 ints, got {v!r}")
    g = tuple(int(d) for d in t) + (1,) * (3 - len(t))
    if min(g) < 1:
        raise ArgumentError(f"{what} must be positive, got {v!r}")
    if any(d > top for d, top in zip(g, largest)):
        raise ArgumentError(f"{what} {g} is larger than the driver allows ({largest})")
    return g[0], g[1], g[2]


def check_scalar(kind: str, value: Any, what: str) -> None:
    """Refuse a value its C parameter cannot hold, before anything reaches the driver.

    Integer kinds take Python or NumPy integers (not bools, not floats) within the type's range;
    ``bool`` takes a Python or NumPy bool only; float kinds take any real number their type can
    hold: ``inf`` and ``nan`` as given, but not a finite value that would round to infinity
    (``1e39`` for an ``f32``), and not arrays or strings.

    Raises
    ------
    ArgumentError
        Naming ``what`` (the argument), its kind and the value.
    """
    if kind in FLOAT_KINDS:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise ArgumentError(f"{what} ({kind}) takes a number, got {type(value).__name__}")
        try:
            f = float(value)
        except OverflowError:
            raise ArgumentError(f"{what} ({kind}) cannot hold {value}: too large for a float") from None
        # The value is rounded to the type when packed: refused only if that rounding gives infinity.
        if abs(f) >= _FLOAT_LIMIT[kind] and math.isfinite(f):
            raise ArgumentError(
                f"{what} ({kind}) cannot hold {value}: it would become infinite "
                f"(largest {float(np.finfo(ARG_DTYPES[kind]).max):g})"
            )
        return
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"{what} (bool) takes True or False, got {type(value).__name__} {value!r}")
        return
    if kind not in ARG_DTYPES or kind == "ptr":
        raise ArgumentError(f"{what} ({kind}) is not a scalar argument")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{what} ({kind}) takes an int, got {type(value).__name__} {value!r}")
    lo, hi = _INT_RANGE[kind]
    if not lo <= int(value) <= hi:
        raise ArgumentError(f"{what} ({kind}) cannot hold {value} (range {lo}..{hi})")


class _Layout:
    """Where each argument of one spec sits in the packed buffer: worked out once per spec (a
    plan builds hundreds of launches of a few kernels) and shared by every buffer of that spec."""

    __slots__ = ("spec", "offsets", "slots", "arrays", "words", "relative")

    spec: tuple[tuple[str, str], ...]
    offsets: MappingProxyType[str, int]  # byte offset of each argument's slot
    slots: dict[str, tuple[int, int, np.dtype[Any]]]  # (offset, size, element dtype) per argument
    arrays: frozenset[str]  # the arguments passed by value as arrays (i32[N], u8[N])
    words: int
    relative: np.ndarray

    def __init__(self, spec: tuple[tuple[str, str], ...]):
        self.spec = spec
        names = [n for n, _ in spec]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate argument names in {names}")
        offset, offsets, slots = 0, {}, {}
        for name, kind in spec:
            try:
                dt = arg_dtype(kind)
            except ValueError as e:
                raise ValueError(f"argument {name!r}: {e}") from None
            align = dt.base.itemsize
            offset = (offset + align - 1) // align * align
            offsets[name] = offset
            slots[name] = (offset, dt.itemsize, dt.base)
            offset += dt.itemsize
        self.offsets = MappingProxyType(offsets)
        self.slots = slots
        self.arrays = frozenset(n for n, k in spec if k not in ARG_DTYPES)
        self.words = max(1, (offset + 7) // 8)  # uint64 storage: every slot aligned to its size
        self.relative = np.array([offsets[n] for n, _ in spec] or [0], dtype=np.uintp)


# Keyed by the spec as given (when hashable) and by its normalised form.
_LAYOUTS: dict[tuple[Any, ...], _Layout] = {}


def _layout_of(spec: Iterable[tuple[str, str]]) -> _Layout:
    key = tuple(spec)  # once: an iterator is read a single time
    try:
        layout = _LAYOUTS.get(key)
        hashable = True
    except TypeError:  # unhashable entries (lists): normalise, then look up
        layout, hashable = None, False
    if layout is None:
        norm = tuple((str(n), str(k)) for n, k in key)
        layout = _LAYOUTS.get(norm) or _Layout(norm)
        _LAYOUTS[norm] = layout
        if hashable:
            _LAYOUTS[key] = layout
    return layout


class _Views(dict[str, np.ndarray]):
    """Each argument's slot as a NumPy view, made the first time it is asked for (most launches
    set each argument once, through :meth:`KernelArgs.update`)."""

    __slots__ = ("_raw", "_slots")

    def __init__(self, storage: np.ndarray, slots: dict[str, tuple[int, int, np.dtype[Any]]]):
        super().__init__()
        self._raw = storage.view(np.uint8)
        self._slots = slots

    def __missing__(self, name: str) -> np.ndarray:
        offset, size, base = self._slots[name]  # KeyError for a name the spec lacks
        view = self[name] = self._raw[offset : offset + size].view(base)
        return view


class KernelArgs:
    """Kernel arguments packed once into a persistent host buffer.

    Parameters
    ----------
    spec : sequence of (name, kind)
        In the kernel's parameter order; ``kind`` is ``ptr``, a scalar kind of
        :data:`ARG_DTYPES` (``bool``, ``i8`` .. ``u64``, ``f16``, ``f32``, ``f64``), ``i32[N]`` (an int32
        array passed by value, e.g. a row table; read and written through :meth:`array`) or
        ``u8[N]`` (a struct of ``N`` bytes passed by value).

    Attributes
    ----------
    address : int
        Address of the ``void*[n]`` array to pass as ``kernelParams``.
    offsets : mapping
        Byte offset of each argument's slot in the value buffer (each aligned to its size);
        read-only, shared by every buffer of the same spec.
    """

    spec: tuple[tuple[str, str], ...]
    offsets: MappingProxyType[str, int]
    address: int

    def __init__(self, spec: Sequence[tuple[str, str]]):
        layout = _layout_of(spec)
        self.spec = layout.spec
        self.offsets = layout.offsets
        self._storage = np.zeros(layout.words, dtype=np.uint64)
        self._views = _Views(self._storage, layout.slots)
        self._arrays = layout.arrays
        self._pointers = layout.relative + np.uintp(self._storage.ctypes.data)
        self.address = int(self._pointers.ctypes.data)

    def __setitem__(self, name: str, value: Any) -> None:
        view = self._views[name]
        if name not in self._arrays:
            view[0] = value
        else:
            view[:] = value

    def __getitem__(self, name: str) -> Any:
        """A scalar argument's value; an ``i32[N]`` argument's values as a tuple."""
        view = self._views[name]
        return tuple(int(v) for v in view) if name in self._arrays else view[0].item()

    def array(self, name: str) -> np.ndarray:
        """The persistent storage of an argument as a writable NumPy view (for ``i32[N]``
        arguments: edit it in place, then launch or push)."""
        return self._views[name]

    @property
    def sizes(self) -> dict[str, int]:
        """Byte size of each argument."""
        return {n: arg_dtype(k).itemsize for n, k in self.spec}

    def update(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            self[k] = v

    def names(self) -> list[str]:
        return [n for n, _ in self.spec]

    def snapshot(self) -> bytes:
        """The packed values as bytes (what a launch or node-parameter push would copy)."""
        return self._storage.tobytes()

    @classmethod
    def from_bytes(cls, spec: Sequence[tuple[str, str]], data: bytes) -> KernelArgs:
        """A buffer with ``spec``'s layout holding the values of a :meth:`snapshot`."""
        args = cls(spec)
        args._storage[:] = np.frombuffer(data, dtype=np.uint64)
        return args

    def copy(self) -> KernelArgs:
        """A new buffer with the same layout and values (its own addresses)."""
        other = KernelArgs(self.spec)
        other._storage[:] = self._storage
        return other

    def __deepcopy__(self, memo: dict[int, Any]) -> KernelArgs:
        return self.copy()  # its own buffer and pointer table (a field-wise copy would point at ours)

    def __reduce__(self) -> tuple[Any, ...]:
        return (KernelArgs.from_bytes, (self.spec, self.snapshot()))

    def __repr__(self) -> str:
        vals = ", ".join(f"{n}={self[n]!r}" for n in self.names())
        return f"KernelArgs({vals})"


@dataclass(frozen=True)
class ArgUse:
    """Which plan buffer a kernel argument points at, and whether the kernel reads or writes it."""

    buffer: str
    role: str  # "read" or "write"


_PDL = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@dataclass
class Launch:
    """One kernel launch with its persistent arguments.

    ``uses`` maps argument names to the named plan buffer they point at; capture turns this into
    the node map the exec-update manager rebinds.

    ``pdl`` makes the launch a programmatic dependent launch (``cuLaunchKernelEx`` with
    ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``; captured as a programmatic edge):
    it may start while the previous kernel on the stream still runs, and the kernel itself waits
    (``griddepcontrol.wait``) before touching anything that kernel wrote. Only for kernels written
    that way (every kernel in ``kernels/``) and a previous kernel that writes no weights: a
    :class:`LaunchPlan` sets it on all its launches but the first.

    See Also
    --------
    cuLaunchKernelEx : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: KernelArgs
    uses: dict[str, ArgUse] = field(default_factory=dict)
    shared_mem: int = 0
    label: str = ""
    pdl: bool = False

    def __post_init__(self) -> None:
        # The fields take 1 to 3 ints (or NumPy ints); normalised here to the three plain ints they are
        # annotated as, which the checker cannot follow through the padding.
        self.grid = tuple(int(g) for g in (tuple(self.grid) + (1, 1))[:3])  # type: ignore[assignment]
        self.block = tuple(int(b) for b in (tuple(self.block) + (1, 1))[:3])  # type: ignore[assignment]
        if min(self.grid) < 1 or min(self.block) < 1:
            raise ValueError(f"{self.kernel.name}: empty grid {self.grid} or block {self.block}")
        if self.block[0] * self.block[1] * self.block[2] > 1024:
            raise ValueError(f"{self.kernel.name}: block {self.block} has more than 1024 threads")
        self._config = None

    def config(self) -> Any:
        """The persistent ``CUlaunchConfig`` of a PDL launch (built once; ``hStream`` set per launch)."""
        if self._config is None:
            cfg = driver.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block
            cfg.sharedMemBytes = self.shared_mem
            attr = driver.CUlaunchAttribute()
            attr.id = _PDL
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            self._attr = attr  # the config points at it
            self._config = cfg
        return self._config

    def node_params(self, args: KernelArgs | None = None) -> Any:
        """This launch as ``CUDA_KERNEL_NODE_PARAMS`` (for ``cuGraphAddKernelNode`` and
        ``cuGraphExecKernelNodeSetParams``), its ``kernelParams`` pointing at ``args`` (default
        the launch's own persistent arguments), which must outlive every call that reads it.

        See Also
        --------
        cuGraphAddKernelNode : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        cuGraphExecKernelNodeSetParams : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html
        """
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = self.kernel.handle
        p.gridDimX, p.gridDimY, p.gridDimZ = self.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = self.block
        p.sharedMemBytes = self.shared_mem
        p.kernelParams = (self.args if args is None else args).address
        # Every field set: a struct's fresh memory is whatever the allocator left there (0xCD
        # under PYTHONMALLOC=debug), and the driver reads ``extra``, ``kern`` and ``ctx`` too.
        p.extra = 0
        p.kern = 0
        p.ctx = 0
        return p

    def packed(self) -> tuple[Any, ...]:
        """``cuLaunchKernel``'s arguments except the stream, precomputed for the hot path.

        See Also
        --------
        cuLaunchKernel : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
        """
        return (self.kernel.handle, *self.grid, *self.block, self.shared_mem, self.args.address)

    def __call__(self, stream: Any) -> None:
        """One ``cuLaunchKernel`` (``cuLaunchKernelEx`` when ``pdl``) on ``stream`` (any
        stream-like object) with the persistent arguments."""
        h = stream_handle(stream)
        if self.pdl:
            cfg = self.config()
            cfg.hStream = h
            (err,) = driver.cuLaunchKernelEx(cfg, self.kernel.handle, self.args.address, 0)
        else:
            f, gx, gy, gz, bx, by, bz, sm, a = self.packed()
            (err,) = driver.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sm, h, a, 0)
        if err != _SUCCESS:
            # Name the call that failed: a PDL launch goes through cuLaunchKernelEx.
            raise cuda_error(err, f"{'cuLaunchKernelEx' if self.pdl else 'cuLaunchKernel'}({self.kernel.name})")

    def describe(self) -> str:
        bound = ", ".join(f"{a}={u.buffer}" for a, u in self.uses.items())
        pdl = " pdl" if self.pdl else ""
        return f"{self.label or self.kernel.short_name} grid={self.grid} block={self.block}{pdl} [{bound}]"


class LaunchPlan:
    """An ordered list of launches over named buffers: what eager runs and what capture records.

    Parameters
    ----------
    launches : sequence of Launch
    buffers : dict of name -> DeviceArray
        Every buffer a launch argument points at, by the name used in ``Launch.uses``.
    inputs, outputs : sequence of str
        The buffers a caller feeds and reads (``x`` and ``out`` for TinyBlock).
    guards : iterable of weakref.finalize
        Owners whose closing makes the plan unusable (checked once per run, not per launch).
    pdl : bool, default False
        Chain the launches with programmatic dependent launch: every launch but the first gets
        ``Launch.pdl`` (the first waits for whatever came before it on the stream, which may have
        written the weights). Needs compute capability 9.0; the plan owns its launches, so it sets
        the flag on them. ``None`` leaves each launch's flag as it is (a plan describing launches
        already captured).
    """

    launches: list[Launch]
    pdl: bool
    buffers: dict[str, DeviceArray]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def __init__(
        self,
        launches: Sequence[Launch],
        buffers: dict[str, DeviceArray],
        inputs: Sequence[str] = ("x",),
        outputs: Sequence[str] = ("out",),
        guards: Iterable[weakref.finalize[..., Any]] = (),
        pdl: bool | None = False,
    ):
        self.launches = list(launches)
        if pdl and len({id(l) for l in self.launches}) != len(self.launches):
            # The flag lives on the Launch: a repeated first launch would become a PDL launch too.
            raise ValueError("a PDL plan needs its own Launch per step (a launch appears twice)")
        if pdl is not None:
            for i, launch in enumerate(self.launches):
                launch.pdl = bool(pdl) and i > 0
        self.pdl = any(l.pdl for l in self.launches) if pdl is None else bool(pdl)
        self.buffers = dict(buffers)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        for i, launch in enumerate(self.launches):
            for arg, use in launch.uses.items():
                if use.buffer not in self.buffers:
                    raise KeyError(
                        f"launch {i} ({launch.kernel.name}) argument {arg} uses unknown buffer {use.buffer!r}"
                    )
        # Per launch, what the hot loop needs: the PDL config (or None) and cuLaunchKernel's arguments.
        self._packed = [(l.config() if l.pdl else None, *l.packed()) for l in self.launches]
        self._guards = tuple(guards)

    def __len__(self) -> int:
        return len(self.launches)

    def check_open(self) -> None:
        for g in self._guards:
            if not g.alive:
                raise ClosedError("a buffer or model this plan uses has been closed")

    def run(self, stream: Any) -> None:
        """Launch every kernel in order on ``stream`` (any stream-like object): one
        ``cuLaunchKernel`` (``cuLaunchKernelEx`` for PDL launches) each, nothing else.

        See Also
        --------
        cuLaunchKernel, cuLaunchKernelEx : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
        """
        for g in self._guards:
            if not g.alive:
                raise ClosedError("a buffer or model this plan uses has been closed")
        h = stream_handle(stream)
        launch, launch_ex = driver.cuLaunchKernel, driver.cuLaunchKernelEx
        for cfg, f, gx, gy, gz, bx, by, bz, sm, a in self._packed:
            if cfg is None:
                (err,) = launch(f, gx, gy, gz, bx, by, bz, sm, h, a, 0)
            else:
                cfg.hStream = h  # the config is shared with Launch.__call__: always set it
                (err,) = launch_ex(cfg, f, a, 0)
            if err != _SUCCESS:
                raise cuda_error(err, "cuLaunchKernel" if cfg is None else "cuLaunchKernelEx")

    def uses_of(self, buffer: str) -> list[tuple[int, str, str]]:
        """``(launch index, argument, role)`` for every argument pointing at ``buffer``."""
        return [
            (i, arg, use.role)
            for i, launch in enumerate(self.launches)
            for arg, use in launch.uses.items()
            if use.buffer == buffer
        ]

    def describe(self) -> str:
        return "\n".join(f"{i:3d}: {l.describe()}" for i, l in enumerate(self.launches))
