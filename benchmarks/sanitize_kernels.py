"""Every kernel form once, at odd sizes, each checked against float64 NumPy: the target that
``benchmarks/device_run.sh sanitize`` runs under compute-sanitizer's racecheck, synccheck and
initcheck (memcheck runs the GPU test suite).

Odd sizes put tails in every loop (batch, K and N not multiples of the tiles); hand-picked cuts
reach the cluster split forms and both GEMM tiles and slice counts, which the automatic cut
would only choose for large products. Exit status 1 if any result is wrong.

    PYTHONPATH=. python3 benchmarks/sanitize_kernels.py
"""

from __future__ import annotations

import sys

import numpy as np

from rawgraph import DeviceBuffer, LaunchPlan, Stream, TinyBlock, capture_plan, get_device, ops
from rawgraph.ops import gemm_shape, matvec_shape


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def main() -> int:
    dev = get_device()
    rng = np.random.default_rng(20261203)
    s = Stream()
    sm = dev.info.multiprocessors
    failures = []

    def check(name: str, got: np.ndarray, ref: np.ndarray, tol: float = 1e-5) -> None:
        err = _rel(got, ref)
        ok = np.all(np.isfinite(got)) and err < tol
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e}", flush=True)
        if not ok:
            failures.append(name)

    def matmul_case(name, batch, k, n, epilogue, shape=None):
        xh, wh, rh = (rng.standard_normal(sh, dtype=np.float32) for sh in ((batch, k), (k, n), (batch, n)))
        bufs = {"x": DeviceBuffer.from_numpy(xh, stream=s), "W": DeviceBuffer.from_numpy(wh, stream=s),
                "r": DeviceBuffer.from_numpy(rh, stream=s), "y": DeviceBuffer((batch, n))}
        views = {key: b.view() for key, b in bufs.items()}
        bufs["y"].poison(s)
        launch = ops.matmul(dev, views, "x", "W", "y", epilogue, r="r" if epilogue == "add" else None, shape=shape)
        launch(s)
        ref = xh.astype(np.float64) @ wh
        ref = np.maximum(ref, 0) if epilogue == "relu" else ref + rh if epilogue == "add" else ref
        check(f"{name} {launch.kernel.name} b{batch} k{k} n{n}", bufs["y"].to_numpy(s), ref)

    # matvec: scalar loads (N odd), 16-byte loads, cluster splits, every epilogue
    matmul_case("matvec vec1", 3, 1001, 999, "relu")
    matmul_case("matvec vec4", 5, 1000, 1000, "add")
    for split in (2, 8):
        matmul_case("matvec split", 7, 1000, 1000, "none", matvec_shape(7, 1000, 1000, sm, 4, True, 64, split))
    # GEMM: both column tiles, one and two K slices, with and without a cluster split
    for tile, slices, split in ((64, 2, 2), (128, 1, 1), (64, 1, 4), (128, 2, 1)):
        matmul_case("gemm", 33, 1000, 996, "add", gemm_shape(33, 1000, 996, sm, True, split, tile, 0, slices))
    # the single-kernel block: clusters of 4 and 8, batch tails
    for batch, width, cluster in ((5, 132, 8), (1, 200, 4), (3, 36, 8)):
        xh = rng.standard_normal((batch, width), dtype=np.float32)
        w1h, w2h = (rng.standard_normal((width, width), dtype=np.float32) / np.float32(width**0.5) for _ in range(2))
        bufs = {"x": DeviceBuffer.from_numpy(xh, stream=s), "W1": DeviceBuffer.from_numpy(w1h, stream=s),
                "W2": DeviceBuffer.from_numpy(w2h, stream=s), "y": DeviceBuffer((batch, width))}
        bufs["y"].poison(s)
        ops.block(dev, {k: v.view() for k, v in bufs.items()}, "x", "W1", "W2", "y", cluster=cluster)(s)
        x64 = xh.astype(np.float64)
        check(f"block b{batch} w{width} cluster {cluster}", bufs["y"].to_numpy(s), np.maximum(x64 @ w1h, 0) @ w2h + x64)
    # elementwise, the mismatch counter, the spin kernel
    n = 1001
    ah, bh = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    bufs = {"a": DeviceBuffer.from_numpy(ah, stream=s), "b": DeviceBuffer.from_numpy(bh, stream=s), "y": DeviceBuffer(n),
            "z": DeviceBuffer(n), "count": DeviceBuffer.from_numpy(np.zeros(1, np.uint64), stream=s)}
    views = {k: v.view() for k, v in bufs.items()}
    plan = LaunchPlan([ops.spin(dev, 1000), ops.relu(dev, views, "a", "y"), ops.add(dev, views, "a", "b", "z"),
                       ops.count_mismatch(dev, views, "y", "z", "count")], views, (), ())
    plan.run(s)
    check("relu", bufs["y"].to_numpy(s), np.maximum(ah, 0).astype(np.float64))
    check("add", bufs["z"].to_numpy(s), ah.astype(np.float64) + bh)
    want = int(np.count_nonzero(np.maximum(ah, 0).view(np.uint32) != (ah + bh).view(np.uint32)))
    got = int(bufs["count"].to_numpy(s)[0])
    print(f"{'ok  ' if got == want else 'FAIL'} count_mismatch: {got} (expected {want})")
    if got != want:
        failures.append("count_mismatch")
    # a captured block of every form, replayed: graph launch paths under the tools too
    for form, width, batch in (("unfused", 33, 3), ("fused", 260, 5), ("block", 132, 2)):
        model = TinyBlock(width, batch, 2, seed=7, form=form)
        xh = rng.standard_normal((batch, width), dtype=np.float32)
        x, out = DeviceBuffer.from_numpy(xh, stream=s), DeviceBuffer((batch, width))
        exe = capture_plan(model.plan(x, out), s).instantiate()
        out.poison(s)
        exe.launch(s)
        check(f"graph {form} w{width} b{batch}", out.to_numpy(s), model.reference(xh, s))
    s.synchronize()
    print(f"sanitize_kernels: {len(failures)} failure(s)" + (f": {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
