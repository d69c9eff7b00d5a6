"""Graph-safe random numbers: a Philox4x32-10 generator whose seed and offset live in device memory.

A captured kernel node holds its argument *values*, so a seed or offset passed as an argument
would be replayed unchanged: every replay would draw the same numbers. Here the kernels
(``kernels/philox.cu``) take the address of a 16-byte device state ``{seed, offset}`` and read it
when they run, and every plan that draws ends with ``philox_advance``, one thread adding the
number of 4-word blocks the plan drew to ``offset``. So:

- each replay of a graph draws the numbers after the previous replay's (and eager runs advance
  the same state the same way, so eager and replay agree for the same starting state);
- graphs sharing one :class:`PhiloxGenerator` continue each other's sequence in the order they
  run, which is stream order when they are launched into one stream (graphs on different streams
  that share a generator must be ordered by events, or they would read the same offset);
- :meth:`PhiloxGenerator.set_state` (a stream-ordered host write) resets the sequence.

PyTorch does the same for CUDA graphs (``register_generator_state``): its generator keeps seed and
offset in device memory during capture and the graph adds a per-capture increment each replay.

The numbers are Philox4x32-10 (Random123; cuRAND's ``Philox4_32_10``) with key = the 64-bit seed
as two 32-bit words (low first) and counter = ``{lo32(c), hi32(c), 0, 0}`` for block
``c = offset + skip + b``; word ``j`` of block ``b`` is number ``4 b + j`` of a draw.
:func:`philox4x32_10` and :func:`reference_numbers` compute the same in NumPy (checked against the
Random123 known-answer vectors in ``tests/test_philox_cpu.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.device import Device, get_device
from ..runtime.errors import RawgraphError, ShapeError
from ..runtime.launch import ArgUse, KernelArgs, Launch, LaunchPlan
from ..runtime.memory import DeviceArray, DeviceBuffer, as_device_array, check_array
from ..runtime.module import get_kernel
from ..runtime.resource import Resource

M0, M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
ROUNDS = 10
THREADS = 256
UNIFORM_BITS = 24  # uniforms are (number >> 8) / 2^24: exact in float32
_U64 = 1 << 64
_MASK32 = np.uint64(0xFFFFFFFF)


# -- the NumPy reference ---------------------------------------------------------------------
def philox4x32_10(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of each row of ``counters`` (``(n, 4)`` uint32) under ``key`` (two uint32).

    Vectorised over rows with uint64 products (32 x 32 bits fit), so it is exact; returns ``(n, 4)``
    uint32.
    """
    c = np.asarray(counters, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (c[:, i].copy() for i in range(4))
    k0, k1 = np.uint64(int(key[0]) & 0xFFFFFFFF), np.uint64(int(key[1]) & 0xFFFFFFFF)
    m0, m1 = np.uint64(M0), np.uint64(M1)
    for r in range(ROUNDS):
        if r:
            k0 = (k0 + np.uint64(W0)) & _MASK32
            k1 = (k1 + np.uint64(W1)) & _MASK32
        p0, p1 = m0 * c0, m1 * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK32
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def _check_u64(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= int(value) < _U64:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return int(value)


def blocks_for(n: int) -> int:
    """Philox blocks (4 numbers each) a draw of ``n`` numbers uses: what it advances the offset by."""
    return (int(n) + 3) // 4


def reference_numbers(seed: int, offset: int, n: int) -> np.ndarray:
    """The ``n`` uint32 numbers a draw makes from state ``(seed, offset)`` (with ``skip`` folded
    into ``offset``), as ``kernels/philox.cu`` makes them."""
    seed, offset = _check_u64("seed", seed), _check_u64("offset", offset)
    nb = blocks_for(n)
    c = np.uint64(offset) + np.arange(nb, dtype=np.uint64)  # wraps mod 2^64 like the device
    counters = np.zeros((nb, 4), dtype=np.uint64)
    counters[:, 0] = c & _MASK32
    counters[:, 1] = c >> np.uint64(32)
    return philox4x32_10(counters, (seed & 0xFFFFFFFF, seed >> 32)).reshape(-1)[:n]


def uniform24(numbers: np.ndarray) -> np.ndarray:
    """float32 uniforms in [0, 1) from uint32 numbers: ``(v >> 8) / 2^24``, as the device does."""
    return (np.asarray(numbers, dtype=np.uint32) >> np.uint32(8)).astype(np.float32) * np.float32(
        1.0 / (1 << UNIFORM_BITS)
    )


def dropout_constants(p: float) -> tuple[int, float]:
    """``(threshold, scale)`` for drop probability ``p``: an element is kept where
    ``number >> 8 >= threshold`` (``threshold = round(p * 2^24)``), and kept elements are multiplied
    by ``scale = 1 / (1 - threshold / 2^24)`` (float32), so the expectation is unchanged."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)):
        raise TypeError(f"p must be a float, got {type(p).__name__}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"drop probability p must be in [0, 1), got {p}")
    threshold = int(round(float(p) * (1 << UNIFORM_BITS)))
    if threshold >= 1 << UNIFORM_BITS:
        raise ValueError(f"p={p} rounds to dropping everything (threshold 2^24); use p < 1 - 2^-25")
    scale = float(np.float32(1.0 / (1.0 - threshold / (1 << UNIFORM_BITS))))
    return threshold, scale


def reference_keep(seed: int, offset: int, n: int, p: float) -> np.ndarray:
    """The keep mask (bool, ``n``) of a dropout drawn from ``(seed, offset)``."""
    threshold, _ = dropout_constants(p)
    return (reference_numbers(seed, offset, n) >> np.uint32(8)) >= threshold


def reference_noisy_forward(
    x: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]], seed: int, offset: int, p: float
) -> np.ndarray:
    """float64 reference of :func:`noisy_plan`: per layer ``i``, ``a = relu(y @ W1)``, then
    ``a *= keep_i * scale`` with ``keep_i`` drawn at ``offset + i * blocks_for(a.size)``, then
    ``y = a @ W2 + y``."""
    y = np.asarray(x, dtype=np.float64)
    _, scale = dropout_constants(p)
    nb = blocks_for(y.size)
    for i, (w1, w2) in enumerate(weights):
        a = np.maximum(y @ w1.astype(np.float64), 0.0)
        keep = reference_keep(seed, (offset + i * nb) % _U64, a.size, p).reshape(a.shape)
        a = np.where(keep, a * scale, 0.0)
        y = a @ w2.astype(np.float64) + y
    return y


# -- the device generator --------------------------------------------------------------------
def _grid(blocks: int, device: Device) -> tuple[int, int, int]:
    # One thread per Philox block, grid-stride beyond 8 CTAs per SM (as the elementwise kernels).
    return (max(1, min(-(-blocks // THREADS), device.info.multiprocessors * 8)), 1, 1)


class PhiloxGenerator(Resource):
    """A Philox4x32-10 stream whose state ``{seed, offset}`` (two uint64) lives in device memory.

    Owns a 16-byte :class:`~rawgraph.runtime.memory.DeviceBuffer` (``cuMemAlloc`` / ``cuMemFree`` on
    ``close()``). Kernels built here read the state when they run, never at capture; the offset
    counts 4-number blocks and is advanced by the ``philox_advance`` node a plan ends with.

    Parameters
    ----------
    seed, offset : int
        Initial state, each in ``[0, 2**64)``.
    stream : stream-like
        Where the initial state is written (stream-ordered, then waited for).
    device : Device, optional

    See Also
    --------
    cuMemAlloc : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    cuMemFree : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
    """

    device: Device
    state: DeviceBuffer

    def __init__(self, seed: int, stream: Any, offset: int = 0, device: Device | None = None):
        self.device = (device or get_device()).activate()
        self.state = DeviceBuffer((2,), np.uint64, self.device)
        self._own(self.state.close, name="cuMemFree (generator state)")
        self.set_state(seed, stream, offset)

    # -- state --------------------------------------------------------------------------
    def set_state(self, seed: int, stream: Any, offset: int = 0) -> None:
        """Write ``(seed, offset)`` to the device state: ``cuMemcpyHtoDAsync`` on ``stream``
        after its queued work (so replays queued before it draw from the old state, those after
        from the new), then ``cuStreamSynchronize``. Refused on a capturing stream.

        See Also
        --------
        cuMemcpyHtoDAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        cuStreamSynchronize : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html
        """
        self._check_open()
        value = np.array([_check_u64("seed", seed), _check_u64("offset", offset)], dtype=np.uint64)
        self.state.copy_from_host(value, stream)

    def get_state(self, stream: Any) -> tuple[int, int]:
        """``(seed, offset)`` read on ``stream`` after its queued work (``cuMemcpyDtoHAsync``).

        See Also
        --------
        cuMemcpyDtoHAsync : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html
        """
        self._check_open()
        seed, offset = self.state.to_numpy(stream)
        return int(seed), int(offset)

    def state_view(self) -> DeviceArray:
        self._check_open()
        return self.state.view()

    # -- launches ------------------------------------------------------------------------
    def draw(self, out: Any, kind: str = "uint32", skip: int = 0, buffer: str = "out") -> Launch:
        """``philox_draw``: ``out[i]`` = number ``i`` of blocks ``offset + skip ...`` (``kind="uint32"``,
        a uint32 array) or its uniform in [0, 1) (``kind="uniform"``, a float32 array). Does not
        advance the offset: end the plan with :meth:`advance` (or use :meth:`draw_plan`)."""
        self._check_open()
        if kind not in ("uint32", "uniform"):
            raise ValueError(f"kind must be 'uint32' or 'uniform', got {kind!r}")
        arr = as_device_array(out, buffer)
        dtype = np.uint32 if kind == "uint32" else np.float32
        arr = check_array(arr, arr.shape, dtype, buffer, self.device)
        if arr.size == 0:
            raise ShapeError(f"{buffer} is empty: nothing to draw")
        args = KernelArgs([("state", "ptr"), ("skip", "u64"), ("out", "ptr"), ("n", "i64"), ("kind", "i32")])
        args.update(
            {
                "state": self.state.ptr,
                "skip": _check_u64("skip", skip),
                "out": arr.ptr,
                "n": arr.size,
                "kind": 0 if kind == "uint32" else 1,
            }
        )
        uses = {"state": ArgUse("rng_state", "read"), "out": ArgUse(buffer, "write")}
        return Launch(
            get_kernel("philox", "philox_draw", self.device),
            _grid(blocks_for(arr.size), self.device),
            (THREADS, 1, 1),
            args,
            uses,
            0,
            f"philox_draw[{kind}]",
        )

    def advance(self, blocks: int) -> Launch:
        """``philox_advance``: one thread adds ``blocks`` to the device offset when it runs."""
        self._check_open()
        args = KernelArgs([("state", "ptr"), ("blocks", "u64")])
        args.update({"state": self.state.ptr, "blocks": _check_u64("blocks", blocks)})
        return Launch(
            get_kernel("philox", "philox_advance", self.device),
            (1, 1, 1),
            (1, 1, 1),
            args,
            {"state": ArgUse("rng_state", "write")},
            0,
            "philox_advance",
        )

    def dropout(
        self, buffers: dict[str, DeviceArray], x: str, y: str, p: float, skip: int = 0, label: str = ""
    ) -> Launch:
        """``philox_dropout``: ``y = x * scale`` where kept, else 0 (``y`` may be ``x``); see
        :func:`dropout_constants`. Does not advance the offset."""
        self._check_open()
        threshold, scale = dropout_constants(p)
        xa, ya = buffers[x], buffers[y]
        check_array(xa, xa.shape, np.float32, x, self.device)
        check_array(ya, xa.shape, np.float32, y, self.device)
        args = KernelArgs(
            [
                ("state", "ptr"),
                ("skip", "u64"),
                ("x", "ptr"),
                ("y", "ptr"),
                ("n", "i64"),
                ("threshold", "i32"),
                ("scale", "f32"),
            ]
        )
        args.update(
            {
                "state": self.state.ptr,
                "skip": _check_u64("skip", skip),
                "x": xa.ptr,
                "y": ya.ptr,
                "n": xa.size,
                "threshold": threshold,
                "scale": scale,
            }
        )
        uses = {"state": ArgUse("rng_state", "read"), "x": ArgUse(x, "read"), "y": ArgUse(y, "write")}
        return Launch(
            get_kernel("philox", "philox_dropout", self.device),
            _grid(blocks_for(xa.size), self.device),
            (THREADS, 1, 1),
            args,
            uses,
            0,
            label or "philox_dropout",
        )

    def draw_plan(self, out: Any, kind: str = "uint32", pdl: bool = False) -> LaunchPlan:
        """``[draw(out), advance(blocks_for(out.size))]``: eager runs and graph replays of it each
        draw the next ``out.size`` numbers of the stream."""
        arr = as_device_array(out, "out")
        draw = self.draw(arr, kind)
        guards = [self._finalizer] + ([arr.owner._finalizer] if isinstance(arr.owner, Resource) else [])
        return LaunchPlan(
            [draw, self.advance(blocks_for(arr.size))],
            {"out": arr, "rng_state": self.state_view()},
            (),
            ("out",),
            guards,
            pdl=pdl,
        )

    def __repr__(self) -> str:
        return f"<PhiloxGenerator{' closed' if self.closed else ''}>"


def noisy_plan(model: Any, x: Any, out: Any, gen: PhiloxGenerator, *, p: float) -> LaunchPlan:
    """The TinyBlock's launch plan with dropout on each layer's hidden activation.

    ``model`` must have the ``unfused`` form (matmul, relu, matmul, add per layer): after each
    layer's relu a ``philox_dropout`` node drops elements of ``a`` in place (drop probability
    ``p``, kept ones scaled by ``1/(1-p)``), layer ``i`` at blocks ``offset + i * nb`` with
    ``nb = blocks_for(batch * width)``; the plan ends with ``philox_advance(layers * nb)``. The
    plain plan is untouched: dropout is off unless this plan is asked for. Buffers are the
    model plan's plus ``rng_state``; PDL as the model chooses (the Philox kernels wait like the
    others). :func:`reference_noisy_forward` is its float64 reference.

    Raises
    ------
    ValueError
        ``p`` outside [0, 1), or a form without a separate relu kernel.
    """
    if getattr(model, "form", None) != "unfused":
        raise ValueError(
            f"noisy_plan needs the 'unfused' form (a separate relu kernel to follow), got {getattr(model, 'form', None)!r}"
        )
    gen._check_open()
    if gen.device.ordinal != model.device.ordinal:
        raise ValueError(f"the generator lives on device {gen.device.ordinal}, the model on {model.device.ordinal}")
    dropout_constants(p)  # refuse a bad p before building anything
    base = model.plan(x, out)
    n = model.batch * model.width
    nb = blocks_for(n)
    buffers = dict(base.buffers)
    buffers["rng_state"] = gen.state_view()
    launches: list[Launch] = []
    layer = 0
    for launch in base.launches:
        launches.append(launch)
        if launch.label.endswith(".relu"):
            launches.append(gen.dropout(buffers, "a", "a", p, skip=layer * nb, label=f"L{layer}.dropout"))
            layer += 1
    if layer != model.layers:
        raise RawgraphError(f"found {layer} relu launches in a {model.layers}-layer unfused plan")
    launches.append(gen.advance(layer * nb))
    return LaunchPlan(launches, buffers, base.inputs, base.outputs, list(base._guards) + [gen._finalizer], pdl=base.pdl)
