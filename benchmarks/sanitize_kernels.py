"""Every kernel form once, at odd sizes, each checked against float64 NumPy (row routing, row
gathers and scatters, and Philox numbers included): the target that
``benchmarks/device_run.sh sanitize`` runs under compute-sanitizer's racecheck, synccheck and
initcheck (memcheck runs the GPU test suite).

Odd sizes put tails in every loop (batch, K and N not multiples of the tiles); hand-picked cuts
reach the cluster split forms and both GEMM tiles and slice counts, which the automatic cut
would only choose for large products, and issue 23's fp32 GEMM (``kernels/sgemm.cu``) through
its four paths: no split, a cluster split, in-CTA K slices (with and without a split), row tables
and pointer slots; the tensor-core GEMM (``kernels/tf32x3.cu``, ``precision="tf32x3"``) through
the same paths, every warp tile and both accumulation forms, and every cut the dispatcher serves
at the serving grid; on compute capability 9.0 its warpgroup form (``kernels/tf32x3_wgmma.cu``)
through the same paths, one and two warpgroups, cluster splits, both run forms and every cut of its
table. Exit status 1 if any result is wrong.

    PYTHONPATH=. python3 benchmarks/sanitize_kernels.py
"""

from __future__ import annotations

import sys
from dataclasses import astuple

import numpy as np

from rawgraph import DeviceBuffer, LaunchPlan, Stream, TinyBlock, capture_plan, get_device, ops
from rawgraph.control.rng import PhiloxGenerator, dropout_constants, reference_keep, reference_numbers, uniform24
from rawgraph.ops import (
    SgemmCut,
    Tf32x3Cut,
    WgmmaCut,
    gemm_shape,
    matvec_shape,
    sgemm_shape,
    tf32x3_shape,
    tf32x3_wgmma_shape,
)
from rawgraph.runtime.memory import POISON_BITS, DeviceArray


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


class Checker:
    """Prints one line per check and keeps the names of the failed ones."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def verdict(self, name: str, ok: bool, detail: str = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failures.append(name)

    def close_to(self, name: str, got: np.ndarray, ref: np.ndarray, tol: float = 1e-5) -> None:
        err = _rel(got, ref)
        self.verdict(name, bool(np.all(np.isfinite(got)) and err < tol), f"rel err {err:.2e}")


def check_count_mismatch(c: Checker, dev, s: Stream, rng: np.random.Generator, n: int = 1001) -> None:
    """``count_mismatch`` (the soak's verdict) on arrays that differ in a random subset only: one
    flipped bit anywhere in the word, +0 against -0 (equal floats, different bits), and the same
    NaN on both sides (equal bits, unequal floats). The count accumulates onto a nonzero start,
    and equal arrays add nothing."""
    ah = rng.standard_normal(n, dtype=np.float32)
    a_bits = ah.view(np.uint32)
    b_bits = a_bits.copy()
    pos = rng.permutation(n)
    flipped, zeros, nans = pos[: n // 3], pos[n // 3 : n // 3 + 5], pos[n // 3 + 5 : n // 3 + 14]
    b_bits[flipped] ^= np.uint32(1) << rng.integers(0, 32, size=flipped.size).astype(np.uint32)
    a_bits[zeros], b_bits[zeros] = 0x00000000, 0x80000000
    a_bits[nans] = b_bits[nans] = POISON_BITS
    want = int(np.count_nonzero(a_bits != b_bits))
    assert want == flipped.size + zeros.size  # the host side of the check
    start = int(rng.integers(1, 1 << 40))
    bufs = {
        "a": DeviceBuffer.from_numpy(a_bits.view(np.float32), stream=s),
        "b": DeviceBuffer.from_numpy(b_bits.view(np.float32), stream=s),
        "count": DeviceBuffer.from_numpy(np.array([start], np.uint64), stream=s),
    }
    views = {k: v.view() for k, v in bufs.items()}
    differ = ops.count_mismatch(dev, views, "a", "b", "count")
    same = ops.count_mismatch(dev, views, "a", "a", "count")
    counts = []
    for launch in (differ, same, differ):
        launch(s)
        counts.append(int(bufs["count"].to_numpy(s)[0]) - start)
    c.verdict(
        f"count_mismatch n{n}",
        counts == [want, want, 2 * want],
        f"{counts} past the start (expected {[want, want, 2 * want]})",
    )
    for b in bufs.values():
        b.close()


def check_philox(c: Checker, dev, s: Stream, rng: np.random.Generator, n: int = 1003) -> None:
    """Raw numbers, uniforms and dropout against the NumPy reference of the seed and offset the
    host asked for (never the state read back, which a state write that corrupts it would also
    give), first from the constructor's state, then after a ``set_state``."""
    seed, offset = int(rng.integers(1 << 62)), 3
    gen = PhiloxGenerator(seed, s, offset=offset)
    raw, uni = DeviceBuffer(n, np.uint32), DeviceBuffer(n)
    xh = rng.standard_normal(n, dtype=np.float32) + np.float32(3.0)
    bufs = {"x": DeviceBuffer.from_numpy(xh, stream=s), "y": DeviceBuffer(n)}
    launches = (
        gen.draw(raw),
        gen.draw(uni, "uniform", skip=1000),
        gen.dropout({k: b.view() for k, b in bufs.items()}, "x", "y", 0.3, skip=2000),
    )
    for when in ("constructor", "set_state"):
        if when == "set_state":
            seed, offset = int(rng.integers(1 << 63)) * 2 + 1, int(rng.integers(1 << 40))
            gen.set_state(seed, s, offset)
        for buf in (raw, uni, bufs["y"]):
            buf.poison(s)
        for launch in launches:
            launch(s)
        state = gen.get_state(s)
        c.verdict(f"philox state after {when}", state == (seed, offset), f"device {state}, host {(seed, offset)}")
        c.verdict(
            f"philox_draw uint32 n{n} ({when})",
            bool(np.array_equal(raw.to_numpy(s), reference_numbers(seed, offset, n))),
        )
        c.close_to(
            f"philox_draw uniform n{n} ({when})",
            uni.to_numpy(s),
            uniform24(reference_numbers(seed, offset + 1000, n)).astype(np.float64),
        )
        keep = reference_keep(seed, offset + 2000, n, 0.3)
        _threshold, scale = dropout_constants(0.3)
        c.close_to(
            f"philox_dropout n{n} ({when})",
            bufs["y"].to_numpy(s),
            np.where(keep, xh.astype(np.float64) * np.float32(scale), 0.0),
        )
    gen.close()


def main() -> int:
    dev = get_device()
    rng = np.random.default_rng(20261203)
    s = Stream()
    sm = dev.info.multiprocessors
    c = Checker()
    failures = c.failures
    check = c.close_to

    def matmul_case(name, batch, k, n, epilogue, shape=None, precision="fp32"):
        xh, wh, rh = (rng.standard_normal(sh, dtype=np.float32) for sh in ((batch, k), (k, n), (batch, n)))
        bufs = {
            "x": DeviceBuffer.from_numpy(xh, stream=s),
            "W": DeviceBuffer.from_numpy(wh, stream=s),
            "r": DeviceBuffer.from_numpy(rh, stream=s),
            "y": DeviceBuffer((batch, n)),
        }
        views = {key: b.view() for key, b in bufs.items()}
        bufs["y"].poison(s)
        launch = ops.matmul(
            dev, views, "x", "W", "y", epilogue, r="r" if epilogue == "add" else None, shape=shape, precision=precision
        )
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
    # sgemm (kernels/sgemm.cu): the epilogue straight from registers (no split: 64 x 64 tiles,
    # and 128 x 128 at MINB 2), a cluster split (S = 3: not a power of two; S = 8 with 8-row
    # stages), in-CTA K slices alone (KS = 2, 4) and with a split; M, K, N with tails
    # (K % 16 != 0, N % 64 != 0, M % BM != 0), every epilogue
    for batch, k, n, epilogue, cut in (
        (33, 1000, 996, "add", (64, 64, 16, 3, 1, 1, 1)),
        (70, 1004, 260, "relu", (128, 128, 8, 2, 1, 1, 2)),
        (37, 1000, 996, "none", (64, 128, 8, 4, 3, 1, 1)),
        (100, 1000, 132, "add", (32, 128, 16, 3, 8, 1, 1)),
        (70, 1000, 196, "relu", (32, 128, 16, 3, 1, 2, 1)),
        (65, 520, 260, "add", (64, 64, 32, 2, 1, 4, 1)),
        (33, 1000, 996, "add", (64, 128, 16, 3, 2, 2, 1)),
        # 4 x 8 outputs per thread (TM = 4): split, slices, none
        (40, 1000, 996, "add", (64, 64, 8, 5, 8, 1, 1, 4)),
        (70, 1004, 260, "relu", (16, 128, 16, 3, 1, 2, 2, 4)),
        (33, 1000, 196, "add", (48, 64, 16, 4, 1, 1, 1, 4)),
    ):
        matmul_case("sgemm", batch, k, n, epilogue, sgemm_shape(batch, k, n, SgemmCut(*cut)))
    # every cut the sweep's table (ops.SGEMM_CUTS) serves, on a shape with tails in M, K and N
    for cut in sorted(set(ops.SGEMM_CUTS.values())):
        matmul_case("sgemm table", 70, 1000, 996, "add", sgemm_shape(70, 1000, 996, cut))
    # tf32x3 (kernels/tf32x3.cu): the epilogue from registers (no split), cluster splits (S = 3 with
    # 48-row warps, S = 8 with 32 x 64 warps), in-CTA slices (2; 4 at BK 8), split and slices with
    # the two-accumulator form; tails in M, K and N; every epilogue
    for batch, k, n, epilogue, cut in (
        (33, 1000, 996, "add", Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32, flush=2)),
        (37, 1000, 996, "none", Tf32x3Cut(96, 128, 32, 4, split=3, wm=48, wn=32)),
        (100, 1000, 132, "relu", Tf32x3Cut(32, 128, 16, 3, split=8, wm=32, wn=64, flush=1)),
        (70, 1000, 196, "add", Tf32x3Cut(64, 64, 16, 3, slices=2, wm=32, wn=32)),
        (65, 520, 260, "relu", Tf32x3Cut(32, 64, 8, 2, slices=4, wm=16, wn=32, flush=1)),
        (33, 1000, 996, "add", Tf32x3Cut(64, 128, 32, 3, split=2, slices=2, wm=32, wn=32, flush=0)),
    ):
        matmul_case("tf32x3", batch, k, n, epilogue, tf32x3_shape(batch, k, n, cut), "tf32x3")
    # every cut the dispatcher serves at M = 8..256, K = N = 1024 / 2048 / 4096 (table and default rule)
    served = {
        ops.tf32x3_cut(ops.matmul_shape(m, w, w, sm, precision="tf32x3", smem_limit=dev.info.smem_per_block_optin))
        for w in (1024, 2048, 4096)
        for m in range(8, 257, 8)
    }
    for cut in sorted(served, key=lambda c: tuple(vars(c).values())):
        matmul_case("tf32x3 served", 70, 1000, 996, "add", tf32x3_shape(70, 1000, 996, cut), "tf32x3")

    # the warpgroup form of tf32x3 (kernels/tf32x3_wgmma.cu, compute capability 9.0 only): one and
    # two warpgroups, cluster splits of 3 and 8, BK 8 (one k8 step a stage), empty K parts, both
    # run forms; tails in M, K and N; every epilogue
    wgmma = ops.wgmma_available(dev)
    wgmma_cuts = (
        (33, 1000, 996, "add", WgmmaCut(64, 64, 16, 3, flush=2)),
        (70, 1004, 260, "relu", WgmmaCut(128, 128, 32, 4, flush=2)),
        (37, 1000, 996, "none", WgmmaCut(64, 96, 32, 4, split=3, flush=2)),
        (100, 1000, 132, "add", WgmmaCut(128, 32, 16, 3, split=8, flush=1)),
        (65, 520, 260, "relu", WgmmaCut(64, 64, 8, 3, flush=1)),
        (5, 36, 68, "add", WgmmaCut(64, 32, 8, 3, split=8, flush=1)),
        (33, 1000, 996, "add", WgmmaCut(64, 64, 32, 3, flush=2, runs=2)),
        (70, 1004, 260, "relu", WgmmaCut(128, 96, 32, 3, flush=2, runs=2)),
    )
    for batch, k, n, epilogue, cut in wgmma_cuts if wgmma else ():
        matmul_case("tf32x3 wgmma", batch, k, n, epilogue, tf32x3_wgmma_shape(batch, k, n, cut), "tf32x3")
    # every cut the warpgroup table (ops.TF32X3_WGMMA_CUTS) serves, on a shape with tails in M, K and N
    for cut in sorted(set(ops.TF32X3_WGMMA_CUTS.values()), key=astuple) if wgmma else ():
        matmul_case("tf32x3 wgmma table", 70, 1000, 996, "add", tf32x3_wgmma_shape(70, 1000, 996, cut), "tf32x3")
    if not wgmma:
        print(f"skip tf32x3 wgmma: compute capability {dev.info.compute_capability}, not 9.0", flush=True)

    # sgemm through pointer slots (the indirect launch path): x, y and r read from 8-byte slots,
    # y and r 4 bytes off 16-byte alignment (scalar epilogue stores); a split with slices
    def sgemm_indirect_case(batch, k, n, cut, precision="fp32"):
        xh, wh, rh = (rng.standard_normal(sh, dtype=np.float32) for sh in ((batch, k), (k, n), (batch, n)))
        bufs = {
            "x": DeviceBuffer.from_numpy(xh, stream=s),
            "W": DeviceBuffer.from_numpy(wh, stream=s),
            "r": DeviceBuffer.from_numpy(np.concatenate([np.zeros(1, np.float32), rh.ravel()]), stream=s),
            "y": DeviceBuffer(batch * n + 1),
        }
        r_off = DeviceArray(bufs["r"].ptr + 4, (batch, n), np.dtype(np.float32), bufs["r"])
        y_off = DeviceArray(bufs["y"].ptr + 4, (batch, n), np.dtype(np.float32), bufs["y"])
        views = {"x": bufs["x"].view(), "W": bufs["W"].view(), "r": r_off, "y": y_off}
        if isinstance(cut, WgmmaCut):
            shape = tf32x3_wgmma_shape(batch, k, n, cut)
        elif isinstance(cut, Tf32x3Cut):
            shape = tf32x3_shape(batch, k, n, cut)
        else:
            shape = sgemm_shape(batch, k, n, cut)
        launch = ops.matmul(dev, views, "x", "W", "y", "add", r="r", shape=shape, precision=precision)
        slots = DeviceBuffer.from_numpy(np.array([views[a].ptr for a in ("x", "y", "r")], np.uint64), stream=s)
        for i, arg in enumerate(("x", "y", "r")):
            launch.args[arg] = slots.ptr + 8 * i
            launch.args["flags"] = int(launch.args["flags"]) | ops.INDIRECT_FLAGS[arg]
        bufs["y"].poison(s)
        launch(s)
        got = bufs["y"].to_numpy(s).ravel()
        ref = xh.astype(np.float64) @ wh + rh
        check(f"sgemm indirect {launch.kernel.name} b{batch} k{k} n{n}", got[1:].reshape(batch, n), ref)
        if got[:1].view(np.uint32)[0] != POISON_BITS:
            print("FAIL sgemm indirect: the float before y was written", flush=True)
            failures.append("sgemm indirect before y")
        for b in (*bufs.values(), slots):
            b.close()

    sgemm_indirect_case(37, 1000, 260, SgemmCut(64, 64, 16, 3, split=2, slices=2))
    sgemm_indirect_case(5, 36, 68, SgemmCut(32, 64, 8, 2))
    sgemm_indirect_case(37, 1000, 260, Tf32x3Cut(64, 64, 16, 3, split=2, slices=2, wm=32, wn=32), "tf32x3")
    sgemm_indirect_case(5, 36, 68, Tf32x3Cut(16, 64, 8, 2, wm=16, wn=32, flush=1), "tf32x3")
    if wgmma:
        sgemm_indirect_case(37, 1000, 260, WgmmaCut(64, 64, 16, 3, split=2, flush=2), "tf32x3")
        sgemm_indirect_case(5, 36, 68, WgmmaCut(64, 32, 32, 3, flush=2, runs=2), "tf32x3")
    # the single-kernel block: clusters of 4 and 8, batch tails
    for batch, width, cluster in ((5, 132, 8), (1, 200, 4), (3, 36, 8)):
        xh = rng.standard_normal((batch, width), dtype=np.float32)
        w1h, w2h = (rng.standard_normal((width, width), dtype=np.float32) / np.float32(width**0.5) for _ in range(2))
        bufs = {
            "x": DeviceBuffer.from_numpy(xh, stream=s),
            "W1": DeviceBuffer.from_numpy(w1h, stream=s),
            "W2": DeviceBuffer.from_numpy(w2h, stream=s),
            "y": DeviceBuffer((batch, width)),
        }
        bufs["y"].poison(s)
        ops.block(dev, {k: v.view() for k, v in bufs.items()}, "x", "W1", "W2", "y", cluster=cluster)(s)
        x64 = xh.astype(np.float64)
        check(f"block b{batch} w{width} cluster {cluster}", bufs["y"].to_numpy(s), np.maximum(x64 @ w1h, 0) @ w2h + x64)
    # elementwise, the spin kernel, the mismatch counter
    n = 1001
    ah, bh = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    bufs = {
        "a": DeviceBuffer.from_numpy(ah, stream=s),
        "b": DeviceBuffer.from_numpy(bh, stream=s),
        "y": DeviceBuffer(n),
        "z": DeviceBuffer(n),
    }
    views = {k: v.view() for k, v in bufs.items()}
    bufs["y"].poison(s)
    bufs["z"].poison(s)
    plan = LaunchPlan(
        [ops.spin(dev, 1000), ops.relu(dev, views, "a", "y"), ops.add(dev, views, "a", "b", "z")], views, (), ()
    )
    plan.run(s)
    check("relu", bufs["y"].to_numpy(s), np.maximum(ah, 0).astype(np.float64))
    check("add", bufs["z"].to_numpy(s), ah.astype(np.float64) + bh)
    check_count_mismatch(c, dev, s, rng)

    # row routing inside the matmuls (the slot pool's fused gather): row m of x, r and y is row
    # table[m] of a larger state; every other row of y must keep its poison
    def routed_case(name, batch, k, shape_fn, precision="fp32"):
        states = 3 * batch + 1
        table = rng.permutation(states)[:batch].astype(np.int32)
        xh, wh, rh = (rng.standard_normal(sh, dtype=np.float32) for sh in ((states, k), (k, k), (states, k)))
        bufs = {
            "x": DeviceBuffer.from_numpy(xh, stream=s),
            "W": DeviceBuffer.from_numpy(wh, stream=s),
            "r": DeviceBuffer.from_numpy(rh, stream=s),
            "y": DeviceBuffer((states, k)),
            "t": DeviceBuffer.from_numpy(table, stream=s),
        }
        bufs["y"].poison(s)
        views = {key: bufs[key].view() for key in ("W",)}
        views.update({key: DeviceBuffer((batch, k)).view() for key in ("x", "r", "y")})  # shapes for the checks
        launch = ops.matmul(dev, views, "x", "W", "y", "add", r="r", shape=shape_fn(batch, k), precision=precision)
        for arg in ("x", "r", "y"):
            launch.args[arg] = bufs[arg].ptr
            launch.args["flags"] = int(launch.args["flags"]) | ops.ROW_FLAGS[arg]
        launch.args["rows"] = bufs["t"].ptr
        launch(s)
        got = bufs["y"].to_numpy(s)
        ref = xh[table].astype(np.float64) @ wh + rh[table]
        check(f"{name} {launch.kernel.name} rows b{batch} k{k}", got[table], ref)
        rest = np.setdiff1d(np.arange(states), table)
        if not np.all(got[rest].view(np.uint32) == POISON_BITS):
            print(f"FAIL {name}: rows outside the table were written", flush=True)
            failures.append(f"{name} untouched rows")

    routed_case("matvec", 5, 260, lambda b, k: matvec_shape(b, k, k, sm, 4, True))
    routed_case("gemm", 37, 264, lambda b, k: gemm_shape(b, k, k, sm, True, 2, 64, 0, 1))
    routed_case("sgemm", 37, 264, lambda b, k: sgemm_shape(b, k, k, SgemmCut(64, 64, 16, 3)))
    routed_case("sgemm", 70, 264, lambda b, k: sgemm_shape(b, k, k, SgemmCut(32, 128, 8, 3, split=3, slices=2)))
    routed_case("tf32x3", 37, 264, lambda b, k: tf32x3_shape(b, k, k, Tf32x3Cut(64, 64, 16, 3, wm=32, wn=32)), "tf32x3")
    routed_case(
        "tf32x3",
        70,
        264,
        lambda b, k: tf32x3_shape(b, k, k, Tf32x3Cut(32, 128, 8, 3, split=3, slices=2, wm=32, wn=32, flush=1)),
        "tf32x3",
    )
    if wgmma:
        wg = WgmmaCut(128, 64, 32, 3, split=3, flush=2)
        routed_case("tf32x3 wgmma", 70, 264, lambda b, k: tf32x3_wgmma_shape(b, k, k, wg), "tf32x3")
        wg2 = WgmmaCut(64, 64, 32, 3, flush=2, runs=2)
        routed_case("tf32x3 wgmma", 37, 264, lambda b, k: tf32x3_wgmma_shape(b, k, k, wg2), "tf32x3")
    # row gathers and scatters: through a device table and by value (two capacities), odd sizes
    for rows, width, states in ((13, 33, 40), (50, 17, 61)):
        table = rng.permutation(states)[:rows].astype(np.int32)
        sh = rng.standard_normal((states, width), dtype=np.float32)
        ch = rng.standard_normal((rows, width), dtype=np.float32)
        bufs = {
            "state": DeviceBuffer.from_numpy(sh, stream=s),
            "compact": DeviceBuffer.from_numpy(ch, stream=s),
            "g": DeviceBuffer((rows, width)),
            "g2": DeviceBuffer((rows, width)),
            "sc": DeviceBuffer.from_numpy(sh, stream=s),
            "sc2": DeviceBuffer.from_numpy(sh, stream=s),
            "t": DeviceBuffer.from_numpy(table, stream=s),
        }
        views = {key: b.view() for key, b in bufs.items()}
        bufs["g"].poison(s)
        bufs["g2"].poison(s)
        launches = [
            ops.gather_rows(dev, views, "state", "t", "g", rows),
            ops.scatter_rows(dev, views, "compact", "t", "sc", rows),
            ops.gather_rows_param(dev, views, "state", "g2", rows),
            ops.scatter_rows_param(dev, views, "compact", "sc2", rows),
        ]
        for launch in launches[2:]:
            launch.args.array("table")[:rows] = table
        for launch in launches:
            launch(s)
        scattered = sh.astype(np.float64)
        scattered[table] = ch
        check(f"gather_rows r{rows} w{width}", bufs["g"].to_numpy(s), sh[table].astype(np.float64))
        check(f"scatter_rows r{rows} w{width}", bufs["sc"].to_numpy(s), scattered)
        check(f"{launches[2].kernel.name} r{rows} w{width}", bufs["g2"].to_numpy(s), sh[table].astype(np.float64))
        check(f"{launches[3].kernel.name} r{rows} w{width}", bufs["sc2"].to_numpy(s), scattered)
    # Philox: raw numbers and uniforms against the NumPy reference, dropout with the same mask
    check_philox(c, dev, s, rng)
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
