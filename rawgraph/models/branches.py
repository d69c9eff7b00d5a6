"""TwoBranchBlock: two independent half-width TinyBlocks, the worked example of fork/join capture.

``y = relu(x @ W1) @ W2 + x`` on the full width does not split into independent halves (every
output column reads every input column), so the variant is defined on its own terms: the input's
two column halves ``x = [x_a | x_b]`` each go through their own residual blocks of width
``width / 2``, with their own weights, and the output is ``y = [block_a(x_a) | block_b(x_b)]``.
The halves live in separate ``(batch, width / 2)`` buffers (the kernels read contiguous rows);
:func:`split` and :func:`concat` move between the two layouts on the host.

The two branches share nothing (weights, scratch, input, output), so they may run concurrently:
:meth:`TwoBranchBlock.capture` captures them fork/join (branch a on the capturing stream, branch b
on a side stream forked at the start and joined at the end) or linearly (the same launches in one
chain), and both graphs compute the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graphs.capture import DEFAULT_CAPTURE_MODE, CaptureMode, capture_branches
from ..graphs.graph import Graph
from ..runtime.device import Device, get_device
from ..runtime.errors import ShapeError
from ..runtime.launch import LaunchPlan
from ..runtime.resource import Resource
from ..runtime.stream import Stream
from .tinyblock import TinyBlock, reference_forward


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two column halves of a ``(batch, width)`` host array, each contiguous."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] % 2:
        raise ShapeError(f"split needs a 2-D array of even width, got shape {x.shape}")
    h = x.shape[1] // 2
    return np.ascontiguousarray(x[:, :h]), np.ascontiguousarray(x[:, h:])


def concat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[a | b]``: the inverse of :func:`split`."""
    return np.concatenate([np.asarray(a), np.asarray(b)], axis=1)


def _close_all(owned: list) -> None:
    for obj in owned:
        obj.close()


class TwoBranchBlock(Resource):
    """Two independent residual blocks of width ``width / 2`` over the column halves of x.

    Parameters
    ----------
    width : int
        Full width, even (each branch has ``width // 2``).
    batch : int
    layers : int, default 1
        Layers of each branch.
    seed : int, default 0
        Branch a's weights come from ``seed``, branch b's from ``seed + 1`` (distinct weights).
    form : {"unfused", "fused", "block"}, default "fused"
    device : Device, optional
    pdl : bool, optional
        Programmatic dependent launch inside each branch (default: where the device has it).
    precision : {"auto", "fp32", "tf32x3"}, default "auto"
        The branches' matmul arithmetic (:class:`TinyBlock`'s ``precision``).

    Attributes
    ----------
    a, b : TinyBlock
        The branches (owned: closed with this object).
    """

    width: int
    half: int
    device: Device
    a: TinyBlock
    b: TinyBlock
    batch: int
    layers: int
    form: str
    seed: int

    def __init__(
        self,
        width: int,
        batch: int,
        layers: int = 1,
        seed: int = 0,
        form: str = "fused",
        device: Device | None = None,
        pdl: bool | None = None,
        precision: str = "auto",
    ):
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 2 or width % 2:
            raise ShapeError(f"width must be an even int >= 2 (two halves), got {width!r}")
        self.width = int(width)
        self.half = self.width // 2
        self.device = (device or get_device()).activate()
        owned: list[TinyBlock] = []
        self._own(_close_all, owned, name="cuMemFree (two-branch block)")
        self.a = TinyBlock(
            self.half, batch, layers, seed=int(seed), form=form, device=self.device, pdl=pdl, precision=precision
        )
        owned.append(self.a)
        self.b = TinyBlock(
            self.half, batch, layers, seed=int(seed) + 1, form=form, device=self.device, pdl=pdl, precision=precision
        )
        owned.append(self.b)
        self.batch, self.layers, self.form, self.seed = self.a.batch, self.a.layers, form, int(seed)

    def plans(self, xa: Any, xb: Any, ya: Any, yb: Any) -> tuple[LaunchPlan, LaunchPlan]:
        """Branch a's plan (reads ``xa``, writes ``ya``) and branch b's (``xb`` -> ``yb``); each
        array is ``(batch, width // 2)`` float32 on the device, checked here."""
        self._check_open()
        return self.a.plan(xa, ya), self.b.plan(xb, yb)

    def forward(self, xa: Any, xb: Any, ya: Any, yb: Any, stream: Stream) -> None:
        """Run both branches eagerly, one after the other on ``stream``."""
        self._check_open()
        self.a.forward(xa, ya, stream)
        self.b.forward(xb, yb, stream)

    def capture(
        self,
        plans: tuple[LaunchPlan, LaunchPlan],
        stream: Any,
        fork: bool = True,
        mode: CaptureMode = DEFAULT_CAPTURE_MODE,
        warmup: bool = True,
    ) -> Graph:
        """Capture both branches into one graph (:func:`~rawgraph.graphs.capture.capture_branches`):
        fork/join (two independent chains) or, with ``fork=False``, linearly (one chain, a then
        b). Keep ``plans`` alive while the graph is used."""
        self._check_open()
        return capture_branches(plans, stream, fork=fork, mode=mode, warmup=warmup)

    def reference(self, x: np.ndarray, stream: Any = None) -> np.ndarray:
        """float64 NumPy result for a full-width host input ``x``: ``[block_a(x_a) | block_b(x_b)]``."""
        xa, xb = split(x)
        return concat(
            reference_forward(xa, self.a.weights_numpy(stream)), reference_forward(xb, self.b.weights_numpy(stream))
        )

    def close(self) -> None:
        """Free both branches' weights and scratch; their plans then refuse to run."""
        self._finalizer()

    def __repr__(self) -> str:
        return (
            f"<TwoBranchBlock width={self.width} (2 x {self.half}) batch={self.batch} layers={self.layers} {self.form}>"
        )
