"""The class form of ``buckets_own_model.py``: the same RMSNorm, written as a protocol class.

``buckets_own_model.py`` serves it as a function (``rawgraph.serving.FunctionModel``); this
class is what that adapter saves you, and what a model needs when it does more than a function
model may (launch other kernels at other batch sizes, answer ``row_count_arg`` by hand).
``RMSNormScale`` keeps rawgraph's row-wise model protocol (``rawgraph/serving/protocol.py``)
with two :class:`rawgraph.RawKernel` kernels and nothing of rawgraph's own::

    t   = x / sqrt(mean(x^2) + eps) * g      rms_scale: one CTA per row, bounded by ``nrows``
    out = t * s + x                          scale_residual: elementwise, bounded by ``n``

so its plan has two launches and one scratch array (``t``). Every serving and control class
(``BucketGraphs``, ``RowCountBuckets``, ``ReshapedGraph``, ``SlotPool``, ``DepthLoop``,
``NormGate``, ``DeviceShapedGraph``) runs it as it runs a ``TinyBlock``. Importable (the protocol
tests use the class); run as a script it goes through the function form's checks (plain and
row-count bucket graphs, a device-shaped exec, a slot pool) against the float64 reference.
"""

from __future__ import annotations

import runpy
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np

import rawgraph as rg
from rawgraph.serving.protocol import RowScratch

# The function form beside this file (examples/ is no package: run from its path): the same two
# kernels, and the same serving checks for main().
_FUNCTION_FORM = runpy.run_path(str(Path(__file__).with_name("buckets_own_model.py")))
SRC = _FUNCTION_FORM["SRC"]
THREADS_ROW, THREADS_EW = 128, 256


def _close_all(owned: list) -> None:
    for obj in reversed(owned):
        obj.close()
    owned.clear()


class RMSNormScale:
    """``out = x / sqrt(mean(x^2) + eps) * g * s + x`` row by row, for ``(batch, width)`` float32.

    Parameters
    ----------
    width, batch : int
    seed : int
        ``g`` is ``1 + 0.1 * N(0, 1)`` from this seed (host NumPy, copied once).
    s, eps : float
    device : rawgraph.Device, optional
    workspace : RowScratch, None or False
        The scratch ``t``: the first ``batch`` rows of this one, a new one (None), or none
        (False: every :meth:`plan` is given ``scratch``).
    """

    def __init__(
        self,
        width: int,
        batch: int,
        seed: int = 0,
        s: float = 0.5,
        eps: float = 1e-6,
        device: Any = None,
        workspace: Any = None,
        _shared: RMSNormScale | None = None,
    ):
        for name, v in (("width", width), ("batch", batch)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise rg.ShapeError(f"{name} must be a positive int, got {v!r}")
        if workspace is True:
            raise TypeError("workspace must be a RowScratch, None (allocate one) or False (none)")
        self.width, self.batch = int(width), int(batch)
        self.s, self.eps = float(s), float(eps)
        self._owned: list[Any] = []
        self._finalizer = weakref.finalize(self, _close_all, self._owned)
        if _shared is None:  # the weights and kernels: this model's, shared by every with_batch
            self.device = (device or rg.get_device()).activate()
            self.seed = int(seed)
            self.g_host = (1.0 + 0.1 * np.random.default_rng(self.seed).standard_normal(self.width)).astype(np.float32)
            self.g = rg.DeviceBuffer.from_numpy(self.g_host, self.device)
            self._owned.append(self.g)
            self.norm_k = rg.RawKernel(SRC, "rms_scale", device=self.device)
            self.residual_k = rg.RawKernel(SRC, "scale_residual", device=self.device)
            self._weights_alive = self._finalizer
            self._root: RMSNormScale | None = None
        else:
            _shared._check_open()
            if _shared.width != self.width:
                raise rg.ShapeError(f"shared weights have width {_shared.width}, the model {self.width}")
            self.device, self.seed, self.g_host, self.g = _shared.device, _shared.seed, _shared.g_host, _shared.g
            self.norm_k, self.residual_k = _shared.norm_k, _shared.residual_k
            self._weights_alive = _shared._weights_alive
            self._root = _shared._root or _shared  # the weights' owner lives while this model does
        if isinstance(workspace, RowScratch):
            workspace._check_open()
            if workspace.rows < self.batch or workspace.layout.get("t") != self.width:
                raise rg.ShapeError(
                    f"workspace of {workspace.rows} rows {workspace.layout} cannot hold a "
                    f"{self.batch} x {self.width} batch"
                )
        elif workspace is None:
            workspace = RowScratch(self.batch, {"t": self.width}, self.device)
            self._owned.append(workspace)
        elif workspace is not False:
            raise TypeError(f"workspace must be a RowScratch, None or False, got {type(workspace).__name__}")
        self.workspace = workspace or None

    # -- the row-wise model protocol ---------------------------------------------------------
    def _check_open(self) -> None:
        if not self._finalizer.alive or not self._weights_alive.alive:
            raise rg.ClosedError("RMSNormScale is closed")

    def with_batch(self, batch: int, workspace: Any = None) -> RMSNormScale:
        self._check_open()
        return type(self)(self.width, batch, s=self.s, eps=self.eps, workspace=workspace, _shared=self)

    def make_workspace(self, rows: int) -> RowScratch:
        self._check_open()
        return RowScratch(rows, {"t": self.width}, self.device)

    def scratch_layout(self, batch: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {"t": ((int(batch), self.width), np.dtype(np.float32))}

    @property
    def weights_nbytes(self) -> int:
        return self.g.nbytes

    def row_count_arg(self, launch: Any) -> tuple[str, int] | None:
        """``nrows`` of rms_scale (rows), ``n`` of scale_residual (rows x width values)."""
        if launch.kernel is self.norm_k.kernel:
            return "nrows", 1
        if launch.kernel is self.residual_k.kernel:
            return "n", self.width
        return None

    def row_grid(self, launch: Any) -> tuple[int, int] | None:
        """rms_scale's grid is one block per row on axis 0; scale_residual's follows the values."""
        return (0, 1) if launch.kernel is self.norm_k.kernel else None

    def _array(self, a: Any, what: str) -> rg.DeviceArray:
        v = rg.as_device_array(a, what)
        if v.dtype != np.float32:
            raise rg.DTypeError(f"{what} has dtype {v.dtype}, the model runs float32")
        if tuple(v.shape) != (self.batch, self.width):
            raise rg.ShapeError(f"{what} has shape {tuple(v.shape)}, expected {(self.batch, self.width)}")
        return v

    def plan(self, x: Any, out: Any, scratch: dict[str, Any] | None = None) -> rg.LaunchPlan:
        """Two launches over the buffers ``x``, ``g``, ``t`` (scratch) and ``out``."""
        self._check_open()
        xa, oa = self._array(x, "x"), self._array(out, "out")
        if scratch is None:
            if self.workspace is None:
                raise ValueError("this model has no workspace (workspace=False): pass scratch to plan()")
            t = self.workspace.views(self.batch)["t"]
        else:
            if set(scratch) != {"t"}:
                raise KeyError(f"scratch must name exactly ('t',), got {sorted(scratch)}")
            t = self._array(scratch["t"], "t")
        n = self.batch * self.width
        launches = [
            self.norm_k.launch(self.batch, THREADS_ROW, (xa, self.g, t, self.width, self.batch, self.eps)),
            self.residual_k.launch(-(-n // THREADS_EW), THREADS_EW, (t, xa, self.s, oa, n)),
        ]
        buffers = {"x": xa, "g": self.g.view(), "t": t, "out": oa}
        return rg.LaunchPlan(launches, buffers, ("x",), ("out",), [self._finalizer, self._weights_alive])

    def reference(self, x: np.ndarray) -> np.ndarray:
        x64 = np.asarray(x, dtype=np.float64)
        t = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.eps) * self.g_host.astype(np.float64)
        return t * self.s + x64

    def close(self) -> None:
        """Free what this model made (a shared workspace stays with its owner); plans built from it
        (and, for the model that made the weights, from every ``with_batch`` of it) then refuse."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"<RMSNormScale width={self.width} batch={self.batch}>"


def main() -> int:
    if not rg.gpu_available():
        print(f"buckets_own_model_class.py needs a GPU: {rg.driver_status()[1]}", file=sys.stderr)
        return 2
    rng = np.random.default_rng()
    model = RMSNormScale(256, 1, seed=int(rng.integers(1 << 30)))
    worst, gather = _FUNCTION_FORM["serve"](model, rng)  # what the function form's script serves
    model.close()
    assert worst < 1e-4, f"max |error| {worst:.3g} against the float64 reference"
    print(
        f"RMSNormScale as a class: plain and row-count buckets, a device-shaped exec and a slot pool "
        f"(gather={gather}) match float64 to {worst:.1e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
