"""The matmul family (``kernels/matmul.cu`` and the fp32 GEMM ``kernels/sgemm.cu``), the
fp32-accurate tensor-core GEMM (``kernels/tf32x3.cu``, ``precision="tf32x3"``; its warpgroup form
``kernels/tf32x3_wgmma.cu`` for compute capability 9.0, launched from its measured table
:data:`TF32X3_WGMMA_CUTS` or an explicit :class:`WgmmaCut` shape) and the one-kernel block
(``kernels/block.cu``): the cut chosen per shape, operands checked, arguments packed once."""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import NamedTuple, TypeVar

import numpy as np

from ..runtime.device import Device
from ..runtime.errors import LayoutError, ShapeError
from ..runtime.launch import ArgUse, KernelArgs, Launch
from ..runtime.memory import DeviceArray, check_array
from ..runtime.module import get_kernel

THREADS = 256  # matmul.cu's RG_THREADS
EPILOGUES = {"none": 0, "relu": 1, "add": 2}
_F32 = np.dtype(np.float32)

# The GEMM pays where it re-reads x, not W: for many batch rows and a W too large for L2 to serve
# matvec's once-per-8-rows re-reads (measured: matvec wins at 1024 x 1024 even at batch 64, the
# GEMM at 4096 x 4096; see benchmarks/NOTES.md).
GEMM_MIN_BATCH = 32
GEMM_MIN_ELEMENTS = 1 << 22  # K * N (16 MB of W)
GEMM_MID_ELEMENTS = 1 << 20  # K * N (4 MB of W): the GEMM also wins above MATVEC_MAX_BATCH_L2 rows
MATVEC_MAX_BATCH_L2 = 64
GEMM_TILE_M, GEMM_TILE_N = 64, 64  # matmul.cu's RG_GM_BM; the default column tile (BN is a template argument)
GEMM_KC = 16  # matmul.cu's RG_GM_KC
GEMM_STAGES = 3  # matmul.cu's RG_GM_STAGES
# The matmul and block kernels' `flags` bits (kernels/rawgraph.cuh): successor launched at the
# start; x / y / r read through a pointer slot (the indirect launch path).
FLAG_EARLY, FLAG_IND_X, FLAG_IND_Y, FLAG_IND_R = 1, 2, 4, 8
INDIRECT_FLAGS = {"x": FLAG_IND_X, "y": FLAG_IND_Y, "r": FLAG_IND_R}
# Row routing (matmul kernels only): row m of x / r / y is row rows[m] of that buffer, `rows` being
# the kernels' int32 table argument (gather from and scatter to request slots, in the matmuls).
FLAG_ROWS_X, FLAG_ROWS_R, FLAG_ROWS_Y = 16, 32, 64
ROW_FLAGS = {"x": FLAG_ROWS_X, "r": FLAG_ROWS_R, "y": FLAG_ROWS_Y}
EARLY_MAX_W_BYTES = 8 << 20  # successor launched at the start for W up to 8 MB, after the K loop above
MAX_SPLIT = 8  # portable cluster size
XS_FLOATS = 4096  # matmul.cu's RG_XS_FLOATS
UNROLL = 8  # matmul.cu's RG_UNROLL
MATVEC_TILES = {4: (128, 64, 32, 16), 1: (32, 16, 8)}  # column tiles per load width
# The fp32 GEMM (kernels/sgemm.cu) is chosen per exact (M, K, N) from a measured table: one row per
# product, its cut in named columns (those of SgemmCut). matmul_shape consults it first; a shape
# not in it, or whose operands or device the cut cannot serve, gets the matmul.cu rule below.
# benchmarks/gemm_sweep.py prints rows in this form (its fastest cut per shape, each checked
# against float64 and run twice bit for bit); where each row came from, with its timing, is in
# benchmarks/NOTES.md ("The SGEMM_CUTS table"). Rows are sorted by (K, N, M), one per key.
SGEMM_ROW_STEP = 8  # the table's row grid: M between two entries takes the upper entry's cut
SGEMM_TABLE = """
      m     k     n  bm   bn  bk  stages  split  slices  minb  tm
     16  1024  1024  16   64  32       3      8       2     1   4
     24  1024  1024  16   64  32       3      8       2     1   4
     32  1024  1024  16   64  32       3      8       2     1   4
     40  1024  1024  16   64  16       3      8       2     1   4
     48  1024  1024  16   64  16       3      8       2     1   4
     56  1024  1024  32   64  32       3      8       2     1   4
     64  1024  1024  32   64  32       3      8       2     1   4
     72  1024  1024  32  128  32       3      4       2     1   4
     80  1024  1024  32  128  32       3      4       2     1   4
     88  1024  1024  32  128  32       3      4       2     1   4
     96  1024  1024  32  128  32       3      4       2     1   4
    104  1024  1024  32   64  32       3      8       1     1   4
    112  1024  1024  32   64  32       3      8       1     1   4
    120  1024  1024  32   64  32       3      8       1     1   4
    128  1024  1024  32   64  32       3      8       1     1   4
    136  1024  1024  48  128  32       3      4       2     1   4
    144  1024  1024  48  128  32       3      4       2     1   4
    152  1024  1024  64  128  32       3      8       1     1   8
    160  1024  1024  64  128  32       3      8       1     1   8
    168  1024  1024  64  128  32       3      8       1     1   8
    176  1024  1024  64  128  32       3      8       1     1   8
    184  1024  1024  64  128  32       3      8       1     1   8
    192  1024  1024  64  128  32       3      8       1     1   8
    200  1024  1024  32  128  16       3      4       2     1   8
    208  1024  1024  32  128  16       3      4       2     1   8
    216  1024  1024  32  128  16       3      4       2     1   8
    224  1024  1024  32  128  16       3      4       2     1   8
    232  1024  1024  64   64  16       3      2       4     1   8
    240  1024  1024  64   64  16       3      2       4     1   8
    248  1024  1024  64   64  16       3      2       4     1   8
    256  1024  1024  64   64  16       3      2       4     1   8
     64  4096  4096  64   64  32       3      2       4     1   8
     72  4096  4096  80   64  32       3      2       2     1   4
     80  4096  4096  80   64  32       3      2       2     1   4
     88  4096  4096  32   64  32       3      2       2     1   4
     96  4096  4096  32   64  32       3      2       2     1   4
    104  4096  4096  64  128  32       3      2       2     1   8
    112  4096  4096  64  128  32       3      2       2     1   8
    120  4096  4096  64  128  32       3      2       2     1   8
    128  4096  4096  64  128  32       3      2       2     1   8
    136  4096  4096  48   64  16       3      8       1     1   4
    144  4096  4096  48   64  16       3      8       1     1   4
    152  4096  4096  32  128  16       4      8       2     1   8
    160  4096  4096  32  128  16       4      8       2     1   8
    168  4096  4096  64   64  16       3      2       2     1   8
    176  4096  4096  64   64  16       3      2       2     1   8
    184  4096  4096  64   64  16       3      2       2     1   8
    192  4096  4096  64   64  16       3      2       2     1   8
    200  4096  4096  64  128  32       3      2       1     1   8
    208  4096  4096  64  128  32       3      2       1     1   8
    216  4096  4096  64  128  32       3      2       1     1   8
    224  4096  4096  64  128  32       3      2       1     1   8
    232  4096  4096  64  128  32       3      2       1     1   8
    240  4096  4096  64  128  32       3      2       1     1   8
    248  4096  4096  64  128  32       3      2       1     1   8
    256  4096  4096  64  128  32       3      2       1     1   8
"""
SGEMM_MAX_THREADS_PER_SM = 2048  # sm_80 .. sm_90: __launch_bounds__' MINB * threads must fit

# ops.matmul's `precision`: "fp32" runs the fp32 kernels (matvec, gemm, sgemm: FMA in fp32);
# "tf32x3" the tensor-core GEMM of kernels/tf32x3.cu, whose error against float64 is that of an
# fp32 GEMM (each operand split into two tf32 values, three products), falling back to the fp32
# kernels where its layout rules exclude it.
PRECISIONS = ("fp32", "tf32x3")
# What a precision argument accepts: one of PRECISIONS, or "auto" (auto_precision's choice per product).
PRECISION_CHOICES = ("auto", *PRECISIONS)
TF32X3_WARP_ROWS = (16, 32, 48, 64)  # a warp's rows: 1..4 m16 tiles (tf32x3.cu's WM)
TF32X3_WARP_COLS = (32, 64)  # a warp's columns: one or two groups of four n8 tiles (WN)
TF32X3_MAX_WARP_TILES = 4  # (WM / 16) * (WN / 32) at most: 32 accumulators a thread each, 128 in all
# The warpgroup form (kernels/tf32x3_wgmma.cu): wgmma is an sm_90a instruction, so exactly this
# compute capability; a warpgroup of 128 threads computes 64 rows x BN.
WGMMA_COMPUTE_CAPABILITY = (9, 0)
WGMMA_ROWS_PER_WARPGROUP, WGMMA_WARPGROUP_THREADS = 64, 128
WGMMA_ROW_TILES = (64, 128)  # one or two warpgroups
WGMMA_MAX_BN = 128  # acc + run: BN fp32 registers a thread
WGMMA_MAX_BK = 64
# runs=2 (two accumulation runs in flight): a third BN / 2 register set. Measured with ptxas (sm_90a):
# no spills for bn <= 64 at any bk, and bn 96 at bk 32, within 255 registers (minb x threads <= 256);
# runs of flush >= 2 k8 steps, an even number a stage (else ptxas serializes the wgmma's).
WGMMA_RUNS = (1, 2)
WGMMA_RUNS2_MAX_THREADS_PER_SM = 256


def has_clusters(device: Device) -> bool:
    """Thread-block clusters and programmatic dependent launch need compute capability 9.0."""
    return device.info.compute_capability >= (9, 0)


@dataclass(frozen=True)
class MatmulShape:
    """How one matmul launch is cut: see ``kernels/matmul.cu``.

    kernel: ``"matvec"`` or ``"gemm"``; vec: floats per W load (4 = 16-byte loads); tc: output
    columns per CTA; bt: batch rows per CTA; split: CTAs of a cluster sharing K (1 = no cluster);
    grid: (column tiles, split, batch tiles); per_sm: at most this many CTAs resident on one SM
    (0 = no cap), enforced by asking for otherwise unused dynamic shared memory (see
    :func:`residency_pad`); slices: GEMM only, groups of 256 threads in a CTA that split its K
    range again (1 or 2).

    ``"sgemm"`` (``kernels/sgemm.cu``, built by :func:`sgemm_shape`): ``bt`` is the row tile BM,
    ``tc`` the column tile BN, ``split`` the cluster size S, ``slices`` the in-CTA K slices KS
    (each of (BM / TM) * (BN / 8) threads); ``bk`` (K rows per pipeline stage), ``stages``,
    ``minb`` (``__launch_bounds__``' minimum CTAs per SM) and ``tm`` (output rows per thread, 8
    or 4) are its own; 0 for the other kernels.

    ``"tf32x3"`` (``kernels/tf32x3.cu``, built by :func:`tf32x3_shape`): ``bt``, ``tc``, ``split``,
    ``slices``, ``bk``, ``stages`` and ``minb`` as for sgemm; ``wm`` x ``wn`` is a warp's piece of
    the tile (each slice has (BM / WM) x (BN / WN) warps) and ``flush`` the k8 steps per
    tensor-core accumulation run (0: the two-accumulator form); 0 for the other kernels.

    ``"tf32x3_wgmma"`` (``kernels/tf32x3_wgmma.cu``, built by :func:`tf32x3_wgmma_shape`): ``bt``,
    ``tc``, ``split``, ``bk``, ``stages``, ``minb`` and ``flush`` as for tf32x3; one warpgroup (128
    threads) per 64 rows of ``bt``; ``slices`` 1, ``wm`` and ``wn`` 0; ``runs`` the accumulation runs in
    flight (1 or 2; 1 for every other kernel).
    """

    kernel: str
    vec: int
    tc: int
    bt: int
    split: int
    grid: tuple[int, int, int]
    per_sm: int = 0
    slices: int = 1
    bk: int = 0
    stages: int = 0
    minb: int = 0
    tm: int = 0
    wm: int = 0
    wn: int = 0
    flush: int = 0
    runs: int = 1

    def __post_init__(self) -> None:
        if self.kernel == "sgemm" and self.tm not in (4, 8):
            raise ShapeError(f"an sgemm shape needs tm (output rows per thread) 8 or 4, got {self.tm}")
        if self.kernel == "tf32x3" and (self.wm not in TF32X3_WARP_ROWS or self.wn not in TF32X3_WARP_COLS):
            raise ShapeError(
                f"a tf32x3 shape needs a warp tile of {TF32X3_WARP_ROWS} x {TF32X3_WARP_COLS}, "
                f"got {self.wm} x {self.wn}"
            )

    @property
    def bm(self) -> int:
        """Output rows per CTA (the GEMMs' row tile; matvec's batch tile)."""
        return self.bt

    @property
    def bn(self) -> int:
        """Output columns per CTA."""
        return self.tc

    @property
    def threads(self) -> int:
        if self.kernel == "sgemm":
            return self.slices * (self.bt // self.tm) * (self.tc // 8)
        if self.kernel == "tf32x3":
            return self.slices * (self.bt // self.wm) * (self.tc // self.wn) * 32
        if self.kernel == "tf32x3_wgmma":
            return WGMMA_WARPGROUP_THREADS * (self.bt // WGMMA_ROWS_PER_WARPGROUP)
        return THREADS * self.slices

    @property
    def ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pick_split(ctas: int, k: int, min_rows: int, target: float, clusters: bool) -> int:
    """Smallest power-of-two split that reaches ``target`` CTAs, keeping >= min_rows rows of K each."""
    split = 1
    if not clusters:
        return split
    while split < MAX_SPLIT and ctas * split < target and k // (2 * split) >= min_rows:
        split *= 2
    return split


def matvec_shape(
    batch: int,
    k: int,
    n: int,
    multiprocessors: int,
    vec: int,
    clusters: bool,
    tc: int | None = None,
    split: int | None = None,
) -> MatmulShape:
    """The matvec cut: 16-byte loads when allowed, batch tile up to 8.

    Aim for D CTAs: enough that each thread has about one group (8) of loads in flight, at most
    two CTAs per SM. Without a K split when a column tile of at least 32 (64 for 8 batch rows)
    reaches D -- a cluster costs a barrier and a DSMEM reduction, which dominates small products;
    else the widest tile (the narrowest, for W over 8 MB) and the smallest split that reach it.
    The rule is fitted to ``rawgraph bench kernels --sweep`` (measured: see ``benchmarks/NOTES.md``).
    """
    bt = 1
    while bt < min(batch, 8):
        bt *= 2
    tiles = [t for t in MATVEC_TILES[vec] if bt * t <= 512]
    batch_tiles = _cdiv(batch, bt)
    rows_per_step = lambda t: 8 * (32 // (t // vec))  # noqa: E731  (rows of K one block step covers)
    if tc is not None and tc not in tiles:
        raise ShapeError(f"matvec column tile {tc} not available for vec={vec}, bt={bt} (choose from {tiles})")
    if split is not None and (split not in (1, 2, 4, 8) or (split > 1 and not clusters)):
        raise ShapeError(f"split {split} needs clusters (sm_90) and must be 1, 2, 4 or 8")
    if tc is None or split is None:
        want = max(1, min(2 * multiprocessors, _cdiv(k * _cdiv(n, vec) * batch_tiles, THREADS * UNROLL)))
        reach = 0.9 * want
        streaming = k * n * 4 > EARLY_MAX_W_BYTES
        narrowest = (64 if bt == 8 and not streaming else 32) if vec == 4 else tiles[-1]
        fits = [t for t in tiles if t <= max(n, tiles[-1])] or tiles[-1:]
        cands = [(t, 1) for t in fits if t >= narrowest] or [(fits[-1], 1)]
        if streaming:
            # W streams from DRAM: many narrow column tiles and a small split beat wide tiles on
            # big clusters (measured at 4096 x 4096, batch 1 and 8: see benchmarks/NOTES.md).
            cands.reverse()
        pick = next(((t, 1) for t, _ in cands if _cdiv(n, t) * batch_tiles >= reach), None)
        if pick is None and clusters:
            for t, _ in cands:
                s_ = 1
                while s_ < MAX_SPLIT and _cdiv(n, t) * batch_tiles * s_ < reach and k // (2 * s_) >= rows_per_step(t):
                    s_ *= 2
                if _cdiv(n, t) * batch_tiles * s_ >= reach:
                    pick = (t, s_)
                    break
        if pick is None and not clusters:  # no split to be had: narrower tiles instead
            pick = next(((t, 1) for t in fits if _cdiv(n, t) * batch_tiles >= reach), (fits[-1], 1))
        if pick is None:  # cannot reach D: the narrowest tile, split as far as K allows
            t = cands[-1][0]
            s_ = 1
            while clusters and s_ < MAX_SPLIT and k // (2 * s_) >= rows_per_step(t):
                s_ *= 2
            pick = (t, s_)
        tc = pick[0] if tc is None else tc
        split = pick[1] if split is None else split
    return MatmulShape("matvec", vec, tc, bt, split, (_cdiv(n, tc), split, batch_tiles))


def gemm_shape(
    batch: int,
    k: int,
    n: int,
    multiprocessors: int,
    clusters: bool,
    split: int | None = None,
    tile_n: int = GEMM_TILE_N,
    per_sm: int = 0,
    slices: int = 2,
) -> MatmulShape:
    """The GEMM cut: 64 x ``tile_n`` (64 or 128) output tiles, K split over a cluster of ``split``
    CTAs and again over ``slices`` groups of 256 threads inside each CTA.

    By default two slices (16 warps, so one CTA fills an SM) and the smallest split that gives
    about one CTA per SM. One CTA per SM is what balances: clusters are placed per GPC and a
    GPU's GPCs may differ in SM count, so a grid of several CTAs per SM can leave some SMs with
    1.5x the work of others (measured: see ``benchmarks/NOTES.md``). Fitted to
    ``rawgraph bench kernels --sweep``.
    """
    if tile_n not in (64, 128):
        raise ShapeError(f"gemm column tile must be 64 or 128, got {tile_n}")
    if slices not in (1, 2):
        raise ShapeError(f"gemm slices must be 1 or 2, got {slices}")
    base = _cdiv(n, tile_n) * _cdiv(batch, GEMM_TILE_M)
    if split is None:
        # Each slice keeps at least one stage of K rows.
        split = _pick_split(base, k // slices, GEMM_KC, 0.9 * multiprocessors, clusters)
    elif split not in (1, 2, 4, 8) or (split > 1 and not clusters):
        raise ShapeError(f"split {split} needs clusters (sm_90) and must be 1, 2, 4 or 8")
    if per_sm < 0:
        raise ShapeError(f"per_sm must be 0 (no cap) or a positive CTA count, got {per_sm}")
    grid = (_cdiv(n, tile_n), split, _cdiv(batch, GEMM_TILE_M))
    return MatmulShape("gemm", 4, tile_n, GEMM_TILE_M, split, grid, per_sm, slices)


@dataclass(frozen=True)
class TileCut:
    """What every cut of rawgraph's tiled GEMMs (``kernels/sgemm.cu``, ``kernels/tf32x3.cu``) names:
    BM x BN output tiles (``bm``, ``bn``); K in steps of ``bk`` through ``stages`` cp.async stages,
    split over a cluster of ``split`` CTAs and again over ``slices`` groups of threads inside each
    CTA; ``minb`` is ``__launch_bounds__``' minimum CTAs per SM. Each kernel's record adds how its
    threads cover a tile."""

    bm: int
    bn: int
    bk: int
    stages: int
    split: int = 1
    slices: int = 1
    minb: int = 1


_Cut = TypeVar("_Cut", bound=TileCut)  # a cut table's record type


@dataclass(frozen=True, order=True)
class SgemmCut(TileCut):
    """The template arguments of a ``kernels/sgemm.cu`` cut (see its header): one row of
    :data:`SGEMM_TABLE`, named as its columns (:class:`TileCut`'s, then ``tm``).

    Each slice has (BM / TM) x (BN / 8) threads, each computing ``tm`` x 8 outputs (``tm`` 8 or
    4). What the kernel cannot be is refused by :func:`sgemm_shape`.
    """

    tm: int = 8

    @property
    def threads(self) -> int:
        return self.slices * (self.bm // self.tm) * (self.bn // 8)


def table_columns(cut_type: type[TileCut]) -> tuple[str, ...]:
    """The header of a cut table of ``cut_type`` records: ``m k n``, then the record's fields."""
    return ("m", "k", "n", *cut_type.__dataclass_fields__)


SGEMM_TABLE_COLUMNS = table_columns(SgemmCut)


def parse_cut_table(text: str, cut_type: type[_Cut]) -> dict[tuple[int, int, int], _Cut]:
    """The ``(M, K, N) -> cut`` map of a table in :data:`SGEMM_TABLE`'s form: a header row of
    :func:`table_columns`, then one row of integers per product, blank lines ignored.

    Raises
    ------
    ValueError
        A header other than ``table_columns(cut_type)``, a row that is not one integer per column,
        or a second row for the same ``(M, K, N)``.
    """
    columns = table_columns(cut_type)
    what = cut_type.__name__
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if not lines or tuple(lines[0]) != columns:
        raise ValueError(
            f"a {what} table starts with the header {' '.join(columns)!r}, got {' '.join(lines[0]) if lines else ''!r}"
        )
    out: dict[tuple[int, int, int], _Cut] = {}
    for row in lines[1:]:
        try:
            values = [int(v) for v in row]
        except ValueError:
            values = []
        if len(values) != len(columns):
            raise ValueError(
                f"{what} table row {' '.join(row)!r}: expected {len(columns)} integers ({' '.join(columns)})"
            )
        key = (values[0], values[1], values[2])
        if key in out:
            raise ValueError(f"{what} table: a second row for (M, K, N) = {key}")
        out[key] = cut_type(*values[3:])
    return out


def format_cut_table(cuts: dict[tuple[int, int, int], _Cut], cut_type: type[_Cut]) -> str:
    """``cuts`` as :data:`SGEMM_TABLE` holds them (what :func:`parse_cut_table` reads back): the
    header, then one row per ``(M, K, N)`` sorted by (K, N, M), right-aligned columns."""
    columns = table_columns(cut_type)
    rows = [columns] + [
        tuple(str(v) for v in (*key, *astuple(cuts[key])))
        for key in sorted(cuts, key=lambda key: (key[1], key[2], key[0]))
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return "\n".join("    " + "  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)


def parse_sgemm_table(text: str) -> dict[tuple[int, int, int], SgemmCut]:
    """:func:`parse_cut_table` of :class:`SgemmCut` rows (:data:`SGEMM_TABLE`'s form)."""
    return parse_cut_table(text, SgemmCut)


def format_sgemm_table(cuts: dict[tuple[int, int, int], SgemmCut]) -> str:
    """:func:`format_cut_table` of :class:`SgemmCut` rows."""
    return format_cut_table(cuts, SgemmCut)


def table_entry(
    table: dict[tuple[int, int, int], _Cut], cut_type: type[_Cut], name: str, batch: int, k: int, n: int, step: int
) -> _Cut | None:
    """A cut table's entry for (batch, K, N): the exact one, else that of the next multiple of
    ``step`` rows (the table's row grid: the same row tiles); None without one.

    Raises
    ------
    ShapeError
        The entry is not a ``cut_type`` (a table edited by hand).
    """
    key = (batch, k, n)
    cut = table.get(key)
    if cut is None and batch % step:
        key = (_cdiv(batch, step) * step, k, n)
        cut = table.get(key)
    if cut is not None and not isinstance(cut, cut_type):
        raise ShapeError(f"{name}[{key}] = {cut!r}: expected {cut_type.__name__}, got {type(cut).__name__}")
    return cut


# The table as matmul_shape reads it, parsed once.
SGEMM_CUTS: dict[tuple[int, int, int], SgemmCut] = parse_sgemm_table(SGEMM_TABLE)


def sgemm_shape(batch: int, k: int, n: int, cut: SgemmCut, *, clusters: bool = True) -> MatmulShape:
    """A cut of ``kernels/sgemm.cu`` for a (batch, K, N) product: BM x BN output tiles, K in steps
    of ``cut.bk`` through ``cut.stages`` cp.async stages, K split over a cluster of ``cut.split``
    CTAs and again over ``cut.slices`` groups of ``cut.threads`` / ``cut.slices`` threads inside each
    CTA (see :class:`SgemmCut`). Grid (ceil(N / BN), S, ceil(M / BM)). What the kernel's
    static_asserts and the launch forbid raises :class:`ShapeError` here (operand layout is
    :func:`matmul`'s check)."""
    if not isinstance(cut, SgemmCut):
        raise TypeError(f"sgemm_shape takes an SgemmCut, got {cut!r}")
    bm, bn, bk, stages, split, slices, minb, tm = astuple(cut)
    if min(batch, k, n) < 1:
        raise ShapeError(f"matmul needs batch, K, N >= 1, got {(batch, k, n)}")
    if tm not in (4, 8):
        raise ShapeError(f"sgemm rows per thread TM must be 8 or 4, got {tm}")
    if bm < 4 * tm or bm % (4 * tm) or bn < 64 or bn % 64:
        raise ShapeError(
            f"sgemm tiles need BM % {4 * tm} == 0 and BN % 64 == 0 (a warp covers {4 * tm} x 64 "
            f"at TM = {tm}), got {bm} x {bn}"
        )
    if bk < 4 or bk % 4:
        raise ShapeError(f"sgemm K step BK must be a positive multiple of 4, got {bk}")
    if stages < 2:
        raise ShapeError(f"sgemm needs at least 2 pipeline stages, got {stages}")
    if not 1 <= split <= MAX_SPLIT or (split > 1 and not clusters):
        raise ShapeError(f"sgemm split {split} must be 1..{MAX_SPLIT}; above 1 it needs clusters (sm_90)")
    if not 1 <= slices <= 8:
        raise ShapeError(f"sgemm K slices per CTA must be 1..8, got {slices}")
    threads = cut.threads
    if threads > 1024:
        raise ShapeError(f"sgemm cut {bm} x {bn} with {slices} slices needs {threads} threads per CTA (at most 1024)")
    if minb < 1 or minb * threads > SGEMM_MAX_THREADS_PER_SM:
        raise ShapeError(f"sgemm MINB {minb} x {threads} threads exceeds {SGEMM_MAX_THREADS_PER_SM} threads per SM")
    grid = (_cdiv(n, bn), split, _cdiv(batch, bm))
    if grid[2] > 65535:
        raise ShapeError(f"sgemm grid z {grid[2]} (batch {batch} / BM {bm}) exceeds 65535")
    return MatmulShape("sgemm", 4, bn, bm, split, grid, 0, slices, bk, stages, minb, tm)


def sgemm_cut(shape: MatmulShape) -> SgemmCut:
    """The template arguments of an ``"sgemm"`` shape."""
    if shape.kernel != "sgemm":
        raise ShapeError(f"not an sgemm shape: {shape}")
    return SgemmCut(shape.bt, shape.tc, shape.bk, shape.stages, shape.split, shape.slices, shape.minb, shape.tm)


def sgemm_smem_bytes(bm: int, bn: int, bk: int, stages: int, split: int, slices: int) -> int:
    """sgemm.cu's ``sgemm_smem_floats`` x 4: ``slices`` x ``stages`` of a BM x BK x tile (rows
    padded to BK + 4 floats) and a BK x BN W tile, or, when K is cut (S * KS > 1) and that is
    larger, the ``slices`` partial BM x BN tiles (rows padded to BN + 4) that reuse them."""
    pipe = slices * stages * (bm * (bk + 4) + bk * bn)
    part = slices * bm * (bn + 4) if split * slices > 1 else 0
    return 4 * max(pipe, part)


def gemm_smem_bytes(shape: MatmulShape) -> int:
    """Dynamic shared memory of a matmul launch: 0 for matvec (static only); for the GEMM
    ``slices`` x 3 stages of a 64 x 16 x slice (rows padded to 20 floats) and a 16 x ``tc`` W
    slice (matmul.cu's RG_GM_*); for sgemm :func:`sgemm_smem_bytes`."""
    if shape.kernel == "sgemm":
        return sgemm_smem_bytes(shape.bt, shape.tc, shape.bk, shape.stages, shape.split, shape.slices)
    if shape.kernel == "tf32x3":
        return tf32x3_smem_bytes(shape.bt, shape.tc, shape.bk, shape.stages, shape.split, shape.slices)
    if shape.kernel == "tf32x3_wgmma":
        return tf32x3_wgmma_smem_bytes(shape.bt, shape.tc, shape.bk, shape.stages, shape.split, shape.runs)
    if shape.kernel != "gemm":
        return 0
    return shape.slices * GEMM_STAGES * (GEMM_TILE_M * (GEMM_KC + 4) + GEMM_KC * shape.tc) * 4


def residency_pad(device: Device, used_smem: int, per_sm: int) -> int:
    """Extra dynamic shared memory (bytes) that leaves room for at most ``per_sm`` CTAs on one SM.

    CUDA has no launch option that caps residency; a CTA's shared memory does, so the launch asks
    for enough that ``per_sm + 1`` CTAs (``used_smem``, static and dynamic, + the pad + the
    driver's reserve each) no longer fit.
    """
    info = device.info
    if per_sm <= 0:
        return 0
    if not info.smem_per_sm:
        raise ShapeError("this device reports no shared memory per SM; cannot cap residency")
    fixed = used_smem + info.smem_reserved_per_block
    pad = max(0, -(-(info.smem_per_sm // (per_sm + 1) + 1 - fixed) // 1024) * 1024)
    if per_sm * (fixed + pad) > info.smem_per_sm or used_smem + pad > info.smem_per_block_optin:
        raise ShapeError(f"cannot cap residency at {per_sm} CTAs/SM with {used_smem} B of shared memory per CTA")
    return pad


def sgemm_fits(shape: MatmulShape, clusters: bool, smem_limit: int = 0) -> bool:
    """Whether this device can launch an sgemm cut: clusters (sm_90) if it splits K over a
    cluster, and at most ``smem_limit`` bytes of dynamic shared memory per CTA when that is given."""
    return (shape.split == 1 or clusters) and (not smem_limit or gemm_smem_bytes(shape) <= smem_limit)


def table_sgemm_shape(batch: int, k: int, n: int, clusters: bool = True, smem_limit: int = 0) -> MatmulShape | None:
    """The :data:`SGEMM_CUTS` cut :func:`matmul_shape` launches for a (batch, K, N) product.

    The exact ``(batch, K, N)`` entry, else that of the next multiple of :data:`SGEMM_ROW_STEP`
    rows, built by :func:`sgemm_shape` at ``batch`` rows; None where there is no entry or where
    this device cannot run its cut (:func:`sgemm_fits`). Operand layout is not checked here.

    Raises
    ------
    ShapeError
        A malformed entry (not an :class:`SgemmCut`, or a cut the kernel cannot be).
    """
    # The table steps SGEMM_ROW_STEP rows; a count in between takes the next step's cut, which runs
    # the same row tiles: the matmul.cu rule is far slower at such counts (measured: see
    # benchmarks/NOTES.md, "The SGEMM_CUTS table").
    cut = table_entry(SGEMM_CUTS, SgemmCut, "SGEMM_CUTS", batch, k, n, SGEMM_ROW_STEP)
    if cut is None:
        return None
    sg = sgemm_shape(batch, k, n, cut, clusters=True)
    return sg if sgemm_fits(sg, clusters, smem_limit) else None


@dataclass(frozen=True)
class Tf32x3Cut(TileCut):
    """The template arguments of a ``kernels/tf32x3.cu`` cut (see its header): :class:`TileCut`'s,
    then how warps cover a tile.

    Each slice has (BM / WM) x (BN / WN) warps, each computing ``wm`` x ``wn`` of the tile;
    ``flush``: k8 steps per tensor-core accumulation run, each added into fp32 sums with
    round-to-nearest (the tensor core's own accumulation rounds toward zero, a bias that grows with
    the run), or 0 for big*big and the corrections accumulated over the whole K part in two sets.
    What the kernel cannot be is refused by :func:`tf32x3_shape`.
    """

    wm: int = 64
    wn: int = 32
    flush: int = 2

    @property
    def threads(self) -> int:
        return self.slices * (self.bm // self.wm) * (self.bn // self.wn) * 32


# The tf32x3 cut per exact (M, K, N), consulted before :func:`tf32x3_default_cut`: what
# benchmarks/tf32x3_sweep.py prints (its fastest cut per shape that passed the accuracy checks).
# An M between two entries takes the next multiple of TF32X3_ROW_STEP rows' entry.
TF32X3_ROW_STEP = 8
TF32X3_CUTS: dict[tuple[int, int, int], Tf32x3Cut] = {}


class Tf32x3Rows(NamedTuple):
    """Products of ``first`` .. ``last`` rows (multiples of :data:`TF32X3_ROW_STEP`) with
    K = N = ``width`` where ``precision="auto"`` runs tf32x3."""

    width: int
    first: int
    last: int


# precision="auto" runs tf32x3 exactly where benchmarks/tf32x3_sweep.py measured the cut
# matmul_shape launches at precision="tf32x3" on a device of this compute capability (the
# TF32X3_WGMMA_CUTS entry, else the mma.sync cut) faster than the one it launches at "fp32", with an
# error against float64 no worse than cuBLAS fp32's on the same inputs; every other shape and device
# runs fp32, the kernels bit-exact to themselves. Per shape the decision is the newest run's that
# measured it: the whole grid (M = 64 .. 256 by 8, K = N = 1024, 2048, 4096) with the mma.sync cuts,
# eight of its shapes with wgmma cuts, the whole grid with wgmma cuts, then with every one-wave wgmma
# cut of a searched space, twice (the second space wider). The runs and their figures are in benchmarks/NOTES.md;
# tests/test_precision_cpu.py derives these rows from the committed runs and fails when a kernel's
# cut at a measured shape is no longer the one measured.
TF32X3_AUTO_COMPUTE_CAPABILITY = (9, 0)
TF32X3_AUTO_ROWS = (Tf32x3Rows(1024, 64, 256), Tf32x3Rows(2048, 64, 256), Tf32x3Rows(4096, 64, 256))


def auto_precision(batch: int, k: int, n: int, compute_capability: tuple[int, int]) -> str:
    """``"tf32x3"`` where :data:`TF32X3_AUTO_ROWS` lists the product (rows rounded up to the next
    multiple of :data:`TF32X3_ROW_STEP`) on a device of :data:`TF32X3_AUTO_COMPUTE_CAPABILITY`,
    else ``"fp32"``."""
    if tuple(compute_capability) != TF32X3_AUTO_COMPUTE_CAPABILITY or k != n:
        return "fp32"
    rows = _cdiv(batch, TF32X3_ROW_STEP) * TF32X3_ROW_STEP
    return "tf32x3" if any(r.width == k and r.first <= rows <= r.last for r in TF32X3_AUTO_ROWS) else "fp32"


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISION_CHOICES`, else a ``ValueError`` naming them
    (what the matmul ops and the models refuse before anything is allocated)."""
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {PRECISION_CHOICES}, got {precision!r}")
    return precision


def resolve_precision(precision: str, batch: int, k: int, n: int, device: Device) -> str:
    """``precision`` itself when it is one of :data:`PRECISIONS`, :func:`auto_precision`'s choice
    for ``"auto"``; a ``ValueError`` for anything else."""
    if check_precision(precision) == "auto":
        return auto_precision(batch, k, n, device.info.compute_capability)
    return precision


def tf32x3_shape(batch: int, k: int, n: int, cut: Tf32x3Cut, *, clusters: bool = True) -> MatmulShape:
    """A cut of ``kernels/tf32x3.cu`` for a (batch, K, N) product: grid (ceil(N / BN), S,
    ceil(M / BM)), ``cut.threads`` threads. What the kernel's static_asserts and the launch forbid
    raises :class:`ShapeError` here (operand layout is :func:`matmul`'s check)."""
    c = cut
    if min(batch, k, n) < 1:
        raise ShapeError(f"matmul needs batch, K, N >= 1, got {(batch, k, n)}")
    if c.wm not in TF32X3_WARP_ROWS or c.wn not in TF32X3_WARP_COLS:
        raise ShapeError(f"tf32x3 warp tiles are {TF32X3_WARP_ROWS} x {TF32X3_WARP_COLS}, got {c.wm} x {c.wn}")
    if (c.wm // 16) * (c.wn // 32) > TF32X3_MAX_WARP_TILES:
        raise ShapeError(
            f"tf32x3 warp tile {c.wm} x {c.wn} needs more than {32 * TF32X3_MAX_WARP_TILES} accumulators a thread"
        )
    if c.bm < c.wm or c.bm % c.wm or c.bn < c.wn or c.bn % c.wn:
        raise ShapeError(f"tf32x3 tile {c.bm} x {c.bn} is not whole warp tiles of {c.wm} x {c.wn}")
    if c.bk < 8 or c.bk % 8:
        raise ShapeError(f"tf32x3 K step BK must be a positive multiple of 8, got {c.bk}")
    if c.flush < 0 or (c.flush and (c.bk // 8) % c.flush):
        raise ShapeError(
            f"tf32x3 accumulation runs of {c.flush} k8 steps must end with a stage of BK {c.bk} "
            f"(BK / 8 a multiple of flush), or flush 0"
        )
    if c.stages < 2:
        raise ShapeError(f"tf32x3 needs at least 2 pipeline stages, got {c.stages}")
    if not 1 <= c.split <= MAX_SPLIT or (c.split > 1 and not clusters):
        raise ShapeError(f"tf32x3 split {c.split} must be 1..{MAX_SPLIT}; above 1 it needs clusters (sm_90)")
    if not 1 <= c.slices <= 8:
        raise ShapeError(f"tf32x3 K slices per CTA must be 1..8, got {c.slices}")
    if c.threads > 1024:
        raise ShapeError(f"tf32x3 cut {c} needs {c.threads} threads per CTA (at most 1024)")
    if c.minb < 1 or c.minb * c.threads > SGEMM_MAX_THREADS_PER_SM:
        raise ShapeError(
            f"tf32x3 MINB {c.minb} x {c.threads} threads exceeds {SGEMM_MAX_THREADS_PER_SM} threads per SM"
        )
    grid = (_cdiv(n, c.bn), c.split, _cdiv(batch, c.bm))
    if grid[2] > 65535:
        raise ShapeError(f"tf32x3 grid z {grid[2]} (batch {batch} / BM {c.bm}) exceeds 65535")
    return MatmulShape(
        "tf32x3", 4, c.bn, c.bm, c.split, grid, 0, c.slices, c.bk, c.stages, c.minb, 0, c.wm, c.wn, c.flush
    )


def tf32x3_cut(shape: MatmulShape) -> Tf32x3Cut:
    """The template arguments of a ``"tf32x3"`` shape."""
    if shape.kernel != "tf32x3":
        raise ShapeError(f"not a tf32x3 shape: {shape}")
    return Tf32x3Cut(
        shape.bt,
        shape.tc,
        shape.bk,
        shape.stages,
        shape.split,
        shape.slices,
        shape.minb,
        shape.wm,
        shape.wn,
        shape.flush,
    )


def tf32x3_smem_bytes(bm: int, bn: int, bk: int, stages: int, split: int, slices: int) -> int:
    """tf32x3.cu's ``tf32x3_smem_floats`` x 4: ``slices`` x ``stages`` of a BM x BK x tile (rows
    padded to BK + 4 floats) and a BK x BN W tile (rows padded to BN + 8), or, when K is cut
    (S * KS > 1) and that is larger, the ``slices`` partial BM x BN tiles (rows padded to BN + 4)
    that reuse them."""
    pipe = slices * stages * (bm * (bk + 4) + bk * (bn + 8))
    part = slices * bm * (bn + 4) if split * slices > 1 else 0
    return 4 * max(pipe, part)


def tf32x3_first_flush(k: int) -> int:
    """The k8 steps per tensor-core accumulation run the first-guess rules of both tf32x3 kernels
    take: 1 up to K = 512, else 2 (why: :func:`tf32x3_default_cut`)."""
    return 1 if k <= 512 else 2


def tf32x3_default_cut(
    batch: int, k: int, n: int, multiprocessors: int, clusters: bool = True, smem_limit: int = 0
) -> Tf32x3Cut:
    """The tf32x3 cut for a product :data:`TF32X3_CUTS` has no entry for.

    Row tiles of at most 128 rows, as few as cover M, each a multiple of 32 (16 for M <= 16), so
    that little of a tile is padding (M = 72: one tile of 96, not two of 64); 2 x 4 warps of
    (BM / 2) x 32 (a warp of 64 x 32 splits 24 values for 48 mma's); 64 columns instead of 128
    where even a split of 8 would leave SMs idle at 128. Then the smallest power-of-two cluster
    split reaching 0.9 CTAs per SM with at least 4 stages of K each (one CTA per SM: 256 threads at
    up to 255 registers), BK 32, and as many stages (up to 4) as the K part has plus one, fewer if
    shared memory is short; tensor-core runs (``flush``) of 2 k8 steps, of 1 up to K = 512: where
    K is short the split operands' own rounding dominates the error, and runs of 2 leave it within a
    few percent of an FFMA loop's (cuBLAS fp32's), while runs of 1 stay clearly below at the same
    speed. A first guess for the sweep to correct, not a measured rule.
    """
    rows = _cdiv(batch, 128)
    bm = 16 if batch <= 16 else min(128, 32 * _cdiv(_cdiv(batch, rows), 32))
    wm = 16 if bm == 16 else bm // 2
    bn = 128
    if n <= 64 or _cdiv(n, 128) * _cdiv(batch, bm) * (MAX_SPLIT if clusters else 1) < 0.9 * multiprocessors:
        bn = 64
    bk = 32
    split = _pick_split(_cdiv(n, bn) * _cdiv(batch, bm), k, 4 * bk, 0.9 * multiprocessors, clusters)
    kc = _cdiv(_cdiv(k, split), bk) * bk
    stages = max(2, min(4, kc // bk + 1))
    while stages > 2 and smem_limit and tf32x3_smem_bytes(bm, bn, bk, stages, split, 1) > smem_limit:
        stages -= 1
    return Tf32x3Cut(bm, bn, bk, stages, split, 1, 1, wm, 32, tf32x3_first_flush(k))


# -- the warpgroup form of tf32x3 (kernels/tf32x3_wgmma.cu) -----------------------------------------


@dataclass(frozen=True)
class WgmmaCut(TileCut):
    """The template arguments of a ``kernels/tf32x3_wgmma.cu`` cut (see its header): :class:`TileCut`'s
    (``slices`` must stay 1: the K split is the cluster's only) and ``flush``, the k8 steps per
    tensor-core accumulation run (at least 1: each run is added into fp32 sums with round to
    nearest, as tf32x3.cu's ``flush > 0``). ``bm`` is 64 or 128 (one or two warpgroups of 64
    rows), ``bn`` a multiple of 32 up to 128, ``bk`` a multiple of 8 up to 64 that ``flush`` k8
    steps divide, ``stages`` at least 3. ``runs``: accumulation runs in flight, 1 (a warpgroup
    waits for each run before adding it) or 2 (the next run is issued into a second accumulator
    before the previous one is waited for and added: a third BN / 2 register set and a third split
    buffer; ``bn`` at most 64, or 96 with ``bk`` 32, ``flush`` >= 2 with an even number of runs a
    stage, ``minb`` x threads <= 256, ``split`` 1). What the kernel cannot be is refused by
    :func:`tf32x3_wgmma_shape`.

    Compute capability 9.0 only: :func:`matmul_shape` launches the :data:`TF32X3_WGMMA_CUTS` entry
    of a product at ``precision="tf32x3"`` on such a device, and a caller may pass any such shape to
    :func:`matmul` (with ``precision="tf32x3"``)."""

    flush: int = 1
    runs: int = 1

    @property
    def threads(self) -> int:
        return WGMMA_WARPGROUP_THREADS * (self.bm // WGMMA_ROWS_PER_WARPGROUP)


# The warpgroup cut per (M, K, N) that matmul_shape launches at precision="tf32x3" on a device of
# WGMMA_COMPUTE_CAPABILITY, before TF32X3_CUTS and the mma.sync rule: what benchmarks/tf32x3_sweep.py
# --table prints from the runs with wgmma rows, per shape the newest run's fastest wgmma cut where
# that cut passed the accuracy gate and beat the mma.sync cut launched there (the runs are in
# benchmarks/NOTES.md). Rows sorted by (K, N, M); M between two entries takes the next multiple of
# TF32X3_ROW_STEP rows' entry.
TF32X3_WGMMA_TABLE = """
      m     k     n   bm   bn  bk  stages  split  slices  minb  flush  runs
     64  1024  1024   64   96  32       4      8       1     1      2     1
     72  1024  1024  128   96  32       4      8       1     1      2     1
     80  1024  1024  128   96  32       4      8       1     1      2     1
     88  1024  1024  128   96  32       4      8       1     1      2     1
     96  1024  1024  128   96  32       4      8       1     1      2     1
    104  1024  1024  128   96  32       4      8       1     1      2     1
    112  1024  1024  128   96  32       4      8       1     1      2     1
    120  1024  1024  128   96  32       4      8       1     1      2     1
    128  1024  1024  128   96  32       4      8       1     1      2     1
    136  1024  1024   64  128  16       4      8       1     1      2     1
    144  1024  1024   64  128  16       4      8       1     1      2     1
    152  1024  1024   64  128  16       4      8       1     1      2     1
    160  1024  1024   64  128  16       4      8       1     1      2     1
    168  1024  1024   64  128  16       4      8       1     1      2     1
    176  1024  1024   64  128  16       4      8       1     1      2     1
    184  1024  1024   64  128  16       4      8       1     1      2     1
    192  1024  1024   64  128  16       4      8       1     1      2     1
    200  1024  1024  128  128  16       4      6       1     1      2     1
    208  1024  1024  128  128  16       4      6       1     1      2     1
    216  1024  1024  128  128  16       4      6       1     1      2     1
    224  1024  1024  128  128  16       4      6       1     1      2     1
    232  1024  1024  128  128  16       4      6       1     1      2     1
    240  1024  1024  128  128  16       4      6       1     1      2     1
    248  1024  1024  128  128  16       4      6       1     1      2     1
    256  1024  1024  128  128  16       4      6       1     1      2     1
     64  2048  2048   64   64  32       4      6       1     1      2     1
     72  2048  2048  128  128  32       4      6       1     1      2     1
     80  2048  2048  128  128  32       4      6       1     1      2     1
     88  2048  2048  128  128  32       4      6       1     1      2     1
     96  2048  2048  128  128  32       4      6       1     1      2     1
    104  2048  2048  128  128  32       4      6       1     1      2     1
    112  2048  2048  128  128  32       4      6       1     1      2     1
    120  2048  2048  128  128  16       4      6       1     1      2     1
    128  2048  2048  128  128  32       4      6       1     1      2     1
    136  2048  2048   64  128  16       4      4       1     1      2     1
    144  2048  2048   64  128  16       4      4       1     1      2     1
    152  2048  2048   64  128  16       4      4       1     1      2     1
    160  2048  2048   64  128  16       4      4       1     1      2     1
    168  2048  2048   64  128  16       4      4       1     1      2     1
    176  2048  2048   64  128  16       4      4       1     1      2     1
    184  2048  2048   64  128  16       4      4       1     1      2     1
    192  2048  2048   64  128  16       4      4       1     1      2     1
    200  2048  2048  128  128  32       4      3       1     1      2     1
    208  2048  2048  128  128  32       4      3       1     1      2     1
    216  2048  2048  128  128  32       4      3       1     1      2     1
    224  2048  2048  128  128  32       4      3       1     1      2     1
    232  2048  2048  128  128  32       4      3       1     1      2     1
    240  2048  2048  128  128  32       4      3       1     1      2     1
    248  2048  2048  128  128  32       4      3       1     1      2     1
    256  2048  2048  128  128  32       4      3       1     1      2     1
     64  4096  4096   64  128  16       4      6       1     1      2     1
     72  4096  4096  128  128  32       4      3       1     1      2     1
     80  4096  4096  128  128  32       4      3       1     1      2     1
     88  4096  4096  128  128  32       4      3       1     1      2     1
     96  4096  4096  128  128  32       4      3       1     1      2     1
    104  4096  4096  128  128  32       4      3       1     1      2     1
    112  4096  4096  128  128  32       4      3       1     1      2     1
    120  4096  4096  128  128  32       4      3       1     1      2     1
    128  4096  4096  128  128  32       4      3       1     1      2     1
    136  4096  4096  128  128  32       4      2       1     1      2     1
    144  4096  4096  128  128  32       4      2       1     1      2     1
    152  4096  4096  128  128  32       4      2       1     1      2     1
    160  4096  4096  128  128  32       4      2       1     1      2     1
    168  4096  4096  128  128  32       4      2       1     1      2     1
    176  4096  4096  128  128  32       4      2       1     1      2     1
    184  4096  4096  128  128  32       4      2       1     1      2     1
    192  4096  4096  128  128  32       4      2       1     1      2     1
    200  4096  4096  128  128  32       4      2       1     1      2     1
    208  4096  4096  128  128  32       4      2       1     1      2     1
    216  4096  4096  128  128  32       4      2       1     1      2     1
    224  4096  4096  128  128  32       4      2       1     1      2     1
    232  4096  4096  128  128  32       4      2       1     1      2     1
    240  4096  4096  128  128  32       4      2       1     1      2     1
    248  4096  4096  128  128  32       4      2       1     1      2     1
    256  4096  4096  128  128  32       4      2       1     1      2     1
"""
TF32X3_WGMMA_CUTS: dict[tuple[int, int, int], WgmmaCut] = parse_cut_table(TF32X3_WGMMA_TABLE, WgmmaCut)


def wgmma_available(device: Device) -> bool:
    """Whether ``device`` can run the warpgroup kernel: compute capability exactly 9.0 (sm_90a)."""
    return tuple(device.info.compute_capability) == WGMMA_COMPUTE_CAPABILITY


def tf32x3_wgmma_smem_bytes(bm: int, bn: int, bk: int, stages: int, split: int, runs: int = 1) -> int:
    """tf32x3_wgmma.cu's ``tf32x3_wgmma_smem_floats`` x 4: ``runs + 1`` split-B buffers (big and
    small, BN x BK each) and ``stages`` raw stages of a BM x BK x tile (rows padded to BK + 4 floats)
    and a BK x BN W tile, or, for a cluster split and when larger, the BM x BN partial tile (rows
    padded to BN + 4) that reuses them."""
    pipe = 2 * (runs + 1) * bn * bk + stages * (bm * (bk + 4) + bk * bn)
    part = bm * (bn + 4) if split > 1 else 0
    return 4 * max(pipe, part)


def tf32x3_wgmma_shape(batch: int, k: int, n: int, cut: WgmmaCut, *, clusters: bool = True) -> MatmulShape:
    """A cut of ``kernels/tf32x3_wgmma.cu`` for a (batch, K, N) product: grid (ceil(N / BN), S,
    ceil(M / BM)), ``cut.threads`` threads. What the kernel's static_asserts and the launch forbid
    raises :class:`ShapeError` naming the field (operand layout and the device are :func:`matmul`'s
    checks)."""
    if not isinstance(cut, WgmmaCut):
        raise TypeError(f"tf32x3_wgmma_shape takes a WgmmaCut, got {cut!r}")
    c = cut
    if min(batch, k, n) < 1:
        raise ShapeError(f"matmul needs batch, K, N >= 1, got {(batch, k, n)}")
    if c.bm not in WGMMA_ROW_TILES:
        raise ShapeError(f"tf32x3_wgmma bm must be one of {WGMMA_ROW_TILES} (warpgroups of 64 rows), got {c.bm}")
    if c.bn < 32 or c.bn % 32 or c.bn > WGMMA_MAX_BN:
        raise ShapeError(f"tf32x3_wgmma bn must be a multiple of 32 from 32 to {WGMMA_MAX_BN}, got {c.bn}")
    if c.bk < 8 or c.bk % 8 or c.bk > WGMMA_MAX_BK:
        raise ShapeError(f"tf32x3_wgmma bk must be a multiple of 8 from 8 to {WGMMA_MAX_BK}, got {c.bk}")
    if c.flush < 1 or (c.bk // 8) % c.flush:
        raise ShapeError(
            f"tf32x3_wgmma flush must be >= 1 and divide the bk / 8 = {c.bk // 8} k8 steps of a stage, got {c.flush}"
        )
    if c.stages < 3:
        raise ShapeError(f"tf32x3_wgmma stages must be at least 3, got {c.stages}")
    if not 1 <= c.split <= MAX_SPLIT or (c.split > 1 and not clusters):
        raise ShapeError(f"tf32x3_wgmma split {c.split} must be 1..{MAX_SPLIT}; above 1 it needs clusters (sm_90)")
    if c.slices != 1:
        raise ShapeError(f"tf32x3_wgmma slices must be 1 (K is split over the cluster only), got {c.slices}")
    if c.minb < 1 or c.minb * c.threads > SGEMM_MAX_THREADS_PER_SM:
        raise ShapeError(
            f"tf32x3_wgmma minb {c.minb} x {c.threads} threads exceeds {SGEMM_MAX_THREADS_PER_SM} threads per SM"
        )
    if c.runs not in WGMMA_RUNS:
        raise ShapeError(f"tf32x3_wgmma runs must be one of {WGMMA_RUNS}, got {c.runs}")
    if c.runs == 2:
        if not (c.bn <= 64 or (c.bn == 96 and c.bk <= 32)):
            raise ShapeError(
                f"tf32x3_wgmma runs 2 needs bn <= 64, or bn 96 with bk 32 (a third bn / 2 register set "
                f"spills beyond), got bn {c.bn} bk {c.bk}"
            )
        if c.flush < 2 or (c.bk // 8 // c.flush) % 2:
            raise ShapeError(
                f"tf32x3_wgmma runs 2 needs flush >= 2 and an even number of runs a stage (bk / 8 / flush), "
                f"got flush {c.flush} with bk {c.bk} (ptxas serializes the wgmma's otherwise)"
            )
        if c.split != 1:
            raise ShapeError(
                f"tf32x3_wgmma runs 2 needs split 1 (ptxas serializes the cluster-split kernels' wgmma's), "
                f"got split {c.split}"
            )
        if c.minb * c.threads > WGMMA_RUNS2_MAX_THREADS_PER_SM:
            raise ShapeError(
                f"tf32x3_wgmma runs 2 needs minb x threads <= {WGMMA_RUNS2_MAX_THREADS_PER_SM} (255 registers a "
                f"thread), got minb {c.minb} x {c.threads}"
            )
    grid = (_cdiv(n, c.bn), c.split, _cdiv(batch, c.bm))
    if grid[2] > 65535:
        raise ShapeError(f"tf32x3_wgmma grid z {grid[2]} (batch {batch} / bm {c.bm}) exceeds 65535")
    return MatmulShape(
        "tf32x3_wgmma", 4, c.bn, c.bm, c.split, grid, 0, 1, c.bk, c.stages, c.minb, 0, 0, 0, c.flush, c.runs
    )


def tf32x3_wgmma_cut(shape: MatmulShape) -> WgmmaCut:
    """The template arguments of a ``"tf32x3_wgmma"`` shape."""
    if shape.kernel != "tf32x3_wgmma":
        raise ShapeError(f"not a tf32x3_wgmma shape: {shape}")
    return WgmmaCut(shape.bt, shape.tc, shape.bk, shape.stages, shape.split, 1, shape.minb, shape.flush, shape.runs)


def wgmma_first_stages(bm: int, bn: int, bk: int, split: int, smem_limit: int = 0) -> int:
    """The stages a first-guess one-run warpgroup cut takes: 4, or 3 where 4 would need more than
    ``smem_limit`` bytes of dynamic shared memory (when that is given)."""
    return 3 if smem_limit and tf32x3_wgmma_smem_bytes(bm, bn, bk, 4, split) > smem_limit else 4


def tf32x3_wgmma_default_cut(
    batch: int, k: int, n: int, multiprocessors: int, clusters: bool = True, smem_limit: int = 0, runs: int = 1
) -> WgmmaCut:
    """A first guess at a warpgroup cut for a product (not measured; :func:`matmul_shape` never
    uses it): two warpgroups (128 rows) unless one tile of 64 covers M, 128 columns, or 64 where
    even a split of 8 would leave SMs idle at 128; the smallest power-of-two cluster split reaching
    0.9 CTAs per SM with at least 4 stages of K each; 4 stages (3 if shared memory is short) of BK
    32 for two warpgroups, 16 for one (so that two CTAs fit an SM's shared memory: a warpgroup
    waits for its wgmma's at the end of every run, and another warpgroup's fill the tensor cores
    meanwhile); runs of 1 k8 step up to K = 512, else 2 (tf32x3_default_cut's accuracy rule).

    ``runs=2`` (two accumulation runs in flight) where K > 512: 64 columns (the third register
    set), BK 32 and 3 stages for either row tile (runs of 2, two a stage; two 64-row CTAs still fit
    an SM), no cluster split (that form has none); at K <= 512 (runs of 1, which that form does not allow) the ``runs=1`` cut."""
    if runs not in WGMMA_RUNS:
        raise ValueError(f"runs must be one of {WGMMA_RUNS}, got {runs}")
    bm = 64 if batch <= 64 else 128
    two = runs == 2 and k > 512
    bn = 128
    if two or n <= 64 or _cdiv(n, 128) * _cdiv(batch, bm) * (MAX_SPLIT if clusters else 1) < 0.9 * multiprocessors:
        bn = 64
    bk = 32 if two or bm == 128 else 16
    if two:
        return WgmmaCut(bm, bn, bk, 3, 1, 1, 1, 2, 2)
    split = _pick_split(_cdiv(n, bn) * _cdiv(batch, bm), k, 4 * bk, 0.9 * multiprocessors, clusters)
    return WgmmaCut(bm, bn, bk, wgmma_first_stages(bm, bn, bk, split, smem_limit), split, 1, 1, tf32x3_first_flush(k))


def tf32x3_matmul_shape(
    batch: int,
    k: int,
    n: int,
    multiprocessors: int,
    w_aligned16: bool = True,
    x_aligned16: bool = True,
    clusters: bool = True,
    smem_limit: int = 0,
    wgmma: bool = False,
) -> MatmulShape | None:
    """The tf32x3 cut :func:`matmul_shape` launches at ``precision="tf32x3"``. With ``wgmma`` (a
    device that runs the warpgroup kernel, :func:`wgmma_available`): the :data:`TF32X3_WGMMA_CUTS`
    entry of the product. Else, or where there is none: the exact :data:`TF32X3_CUTS` entry. Either
    table's entry is that of the next multiple of :data:`TF32X3_ROW_STEP` rows when the row count
    has none, and is taken where this device can run it (clusters if it splits, at most
    ``smem_limit`` bytes of dynamic shared memory when that is given). Else
    :func:`tf32x3_default_cut`'s. None where the kernels' layout rules exclude the operands (K or N
    not a multiple of 4, x or W not 16-byte aligned).

    Raises
    ------
    ShapeError
        A table entry that is not of its table's cut type, or a cut the kernel cannot be.
    """
    if k % 4 or n % 4 or not (w_aligned16 and x_aligned16):
        return None
    if wgmma:
        wcut = table_entry(TF32X3_WGMMA_CUTS, WgmmaCut, "TF32X3_WGMMA_CUTS", batch, k, n, TF32X3_ROW_STEP)
        if wcut is not None:
            shape = tf32x3_wgmma_shape(batch, k, n, wcut, clusters=True)
            if sgemm_fits(shape, clusters, smem_limit):
                return shape
    cut = table_entry(TF32X3_CUTS, Tf32x3Cut, "TF32X3_CUTS", batch, k, n, TF32X3_ROW_STEP)
    if cut is not None:
        shape = tf32x3_shape(batch, k, n, cut, clusters=True)
        if sgemm_fits(shape, clusters, smem_limit):
            return shape
    return tf32x3_shape(
        batch, k, n, tf32x3_default_cut(batch, k, n, multiprocessors, clusters, smem_limit), clusters=clusters
    )


def matmul_shape(
    batch: int,
    k: int,
    n: int,
    multiprocessors: int,
    w_aligned16: bool = True,
    x_aligned16: bool = True,
    clusters: bool = True,
    smem_limit: int = 0,
    precision: str = "fp32",
    wgmma: bool = False,
) -> MatmulShape:
    """Choose the kernel and its cut for a (batch, K, N) product on ``multiprocessors`` SMs.

    The choice depends only on the shape, W's and x's alignment and the device, never on the
    epilogue, so the fused and unfused forms of a block run the same sums (and round alike).
    An exact (batch, K, N) entry of :data:`SGEMM_CUTS`, else the entry of the next multiple of
    :data:`SGEMM_ROW_STEP` rows, comes first, where its cut can run here
    (aligned operands, clusters if it splits, at most ``smem_limit`` bytes of dynamic shared
    memory per CTA when that is given); a malformed entry raises :class:`ShapeError`.

    ``precision="tf32x3"``: :func:`tf32x3_matmul_shape`'s cut (``wgmma``: the device runs the
    warpgroup kernel, :func:`wgmma_available`), or where the tf32x3 kernels' layout rules exclude
    the operands, the fp32 cut above (at least as accurate).
    """
    if min(batch, k, n) < 1:
        raise ShapeError(f"matmul needs batch, K, N >= 1, got {(batch, k, n)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "tf32x3":
        tx = tf32x3_matmul_shape(batch, k, n, multiprocessors, w_aligned16, x_aligned16, clusters, smem_limit, wgmma)
        if tx is not None:
            return tx
    gemm_ok = k % 4 == 0 and n % 4 == 0 and w_aligned16 and x_aligned16
    if gemm_ok:
        sg = table_sgemm_shape(batch, k, n, clusters, smem_limit)
        if sg is not None:
            return sg
    if batch >= GEMM_MIN_BATCH and k * n >= GEMM_MIN_ELEMENTS and gemm_ok:
        return gemm_shape(batch, k, n, multiprocessors, clusters)
    if batch > MATVEC_MAX_BATCH_L2 and k * n >= GEMM_MID_ELEMENTS and gemm_ok and clusters:
        # W in L2 (1024 x 1024 and up to 16 MB), more than 64 rows: matvec's re-reads of W per 8
        # rows lose to the GEMM (measured at w1024: see benchmarks/NOTES.md). Which GEMM cut wins
        # depends on the row tiles.
        tiles = _cdiv(batch, GEMM_TILE_M)
        if tiles <= 2:
            return gemm_shape(batch, k, n, multiprocessors, clusters, split=8, tile_n=64, slices=1)
        if tiles == 3:
            return gemm_shape(batch, k, n, multiprocessors, clusters, split=4, tile_n=128, slices=2)
        return gemm_shape(batch, k, n, multiprocessors, clusters)
    vec = 4 if (n % 4 == 0 and w_aligned16) else 1
    return matvec_shape(batch, k, n, multiprocessors, vec, clusters)


def matmul_file(shape: MatmulShape) -> str:
    """The ``kernels/`` source (``get_kernel``'s file) of a cut: ``"sgemm"``, ``"tf32x3"``,
    ``"tf32x3_wgmma"`` or ``"matmul"``."""
    return shape.kernel if shape.kernel in ("sgemm", "tf32x3", "tf32x3_wgmma") else "matmul"


def matmul_expr(epilogue: str, shape: MatmulShape) -> str:
    """The kernel's name expression (spelled as ``benchmarks/gemm_sweep.py`` spells sgemm cuts)."""
    e = EPILOGUES[epilogue]
    if shape.kernel == "sgemm":
        tm = "" if shape.tm == 8 else f", {shape.tm}"  # TM = 8 is the template's default
        if shape.split > 1:
            return (
                f"sgemm_split_kernel<{e}, {shape.bt}, {shape.tc}, {shape.bk}, {shape.stages}, {shape.split}, "
                f"{shape.slices}, {shape.minb}{tm}>"
            )
        return (
            f"sgemm_kernel<{e}, {shape.bt}, {shape.tc}, {shape.bk}, {shape.stages}, {shape.slices}, {shape.minb}{tm}>"
        )
    if shape.kernel == "tf32x3":
        c = tf32x3_cut(shape)
        split = f"{c.split}, " if c.split > 1 else ""
        return (
            f"tf32x3_{'split_' if c.split > 1 else ''}kernel<{e}, {c.bm}, {c.bn}, {c.bk}, {c.stages}, {split}"
            f"{c.slices}, {c.minb}, {c.wm}, {c.wn}, {c.flush}>"
        )
    if shape.kernel == "tf32x3_wgmma":
        w = tf32x3_wgmma_cut(shape)
        runs = "" if w.runs == 1 else f", {w.runs}"  # RUNS = 1 is the template's default
        if w.split > 1:
            return (
                f"tf32x3_wgmma_split_kernel<{e}, {w.bm}, {w.bn}, {w.bk}, {w.stages}, {w.split}, {w.minb}, "
                f"{w.flush}{runs}>"
            )
        return f"tf32x3_wgmma_kernel<{e}, {w.bm}, {w.bn}, {w.bk}, {w.stages}, {w.minb}, {w.flush}{runs}>"
    if shape.kernel == "gemm":
        if shape.split > 1:
            return f"gemm_split_kernel<{e}, {shape.tc}, {shape.split}, {shape.slices}>"
        return f"gemm_kernel<{e}, {shape.tc}, {shape.slices}>"
    if shape.split > 1:
        return f"matvec_split_kernel<{e}, {shape.vec}, {shape.tc}, {shape.bt}, {shape.split}>"
    return f"matvec_kernel<{e}, {shape.vec}, {shape.tc}, {shape.bt}>"


def matmul(
    device: Device,
    buffers: dict[str, DeviceArray],
    x: str,
    w: str,
    y: str,
    epilogue: str = "none",
    r: str | None = None,
    label: str = "",
    shape: MatmulShape | None = None,
    precision: str = "fp32",
) -> Launch:
    """``y = epilogue(x @ w)`` (``epilogue`` none, relu, or add with residual ``r``); names index ``buffers``.

    ``shape`` overrides the automatic cut (tests and the kernel benchmark sweep it); it is checked
    against the operands like everything else here. ``precision`` (:data:`PRECISION_CHOICES`):
    ``"fp32"`` (the default) chooses among the fp32 kernels; ``"tf32x3"`` the tensor-core GEMM of
    ``kernels/tf32x3.cu`` (an error against float64 no worse than cuBLAS fp32's at K >= 256;
    ``docs/gemm.md`` says at which shapes it is faster), where its layout rules allow
    (:func:`matmul_shape`; on compute capability 9.0 the warpgroup kernel ``kernels/tf32x3_wgmma.cu``
    where :data:`TF32X3_WGMMA_CUTS` has the product); ``"auto"`` whichever of the two
    :func:`auto_precision` picks for this product on this device (the models' default). A tf32x3
    ``shape`` needs ``precision="tf32x3"``; so does a ``"tf32x3_wgmma"`` shape
    (:func:`tf32x3_wgmma_shape`: compute capability 9.0 only).
    """
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {sorted(EPILOGUES)}, got {epilogue!r}")
    check_precision(precision)
    if shape is not None and shape.kernel in ("tf32x3", "tf32x3_wgmma") and precision != "tf32x3":
        raise ValueError(f"a {shape.kernel} shape runs tensor-core products: pass precision='tf32x3'")
    if (epilogue == "add") != (r is not None):
        raise ValueError("a residual r is given exactly when epilogue == 'add'")
    xa, wa, ya = buffers[x], buffers[w], buffers[y]
    if len(xa.shape) != 2 or len(wa.shape) != 2:
        raise ShapeError(f"matmul needs 2-D x and W, got {xa.shape} and {wa.shape}")
    batch, k = xa.shape
    n = wa.shape[1]
    check_array(xa, (batch, k), _F32, x)
    check_array(wa, (k, n), _F32, w)
    check_array(ya, (batch, n), _F32, y)
    if r is not None:
        check_array(buffers[r], (batch, n), _F32, r)
    clusters = has_clusters(device)
    optin = device.info.smem_per_block_optin
    if shape is None:
        precision = resolve_precision(precision, batch, k, n, device)
        shape = matmul_shape(
            batch,
            k,
            n,
            device.info.multiprocessors,
            wa.ptr % 16 == 0,
            xa.ptr % 16 == 0,
            clusters,
            optin,
            precision,
            wgmma_available(device),
        )
    else:
        if shape.kernel == "tf32x3_wgmma" and not wgmma_available(device):
            raise ShapeError(
                f"the tf32x3_wgmma kernel needs compute capability {WGMMA_COMPUTE_CAPABILITY} (sm_90a wgmma); "
                f"this device is {device.info.compute_capability}"
            )
        _check_shape(shape, batch, k, n, xa, wa, clusters, optin)
    kernel = get_kernel(matmul_file(shape), matmul_expr(epilogue, shape), device)
    smem = gemm_smem_bytes(shape)
    if shape.kernel in ("sgemm", "tf32x3", "tf32x3_wgmma") and optin and kernel.static_smem + smem > optin:
        raise ShapeError(
            f"{kernel.name} needs {kernel.static_smem + smem} B of shared memory per CTA; this device allows {optin}"
        )
    smem += residency_pad(device, kernel.static_smem + smem, shape.per_sm)
    if smem:
        kernel.allow_dynamic_smem(smem)
    args = KernelArgs(
        [
            ("x", "ptr"),
            ("W", "ptr"),
            ("y", "ptr"),
            ("r", "ptr"),
            ("B", "i32"),
            ("K", "i32"),
            ("N", "i32"),
            ("flags", "i32"),
            ("rows", "ptr"),
        ]
    )
    # FLAG_EARLY: matvec, sgemm (as benchmarks/gemm_sweep.py times it) and tf32x3 (both forms) launch their
    # successor at the start for W up to 8 MB; matmul.cu's gemm after its K loop.
    early = int(shape.kernel in ("matvec", "sgemm", "tf32x3", "tf32x3_wgmma") and k * n * 4 <= EARLY_MAX_W_BYTES)
    args.update(
        {
            "x": xa.ptr,
            "W": wa.ptr,
            "y": ya.ptr,
            "r": buffers[r].ptr if r else 0,
            "B": batch,
            "K": k,
            "N": n,
            "flags": early,
            "rows": 0,
        }
    )
    uses = {"x": ArgUse(x, "read"), "W": ArgUse(w, "read"), "y": ArgUse(y, "write")}
    if r:
        uses["r"] = ArgUse(r, "read")
    name = {"none": "matmul", "relu": "matmul_relu", "add": "matmul_add"}[epilogue]
    return Launch(kernel, shape.grid, (shape.threads, 1, 1), args, uses, smem, label or name)


def routes_rows(launch: Launch) -> bool:
    """Whether ``launch`` runs one of rawgraph's own matmul kernels (``kernels/matmul.cu``,
    ``kernels/sgemm.cu``, ``kernels/tf32x3.cu``, ``kernels/tf32x3_wgmma.cu``), the only ones whose ``rows`` argument is a row
    table (a user's kernel with an argument of that name is not: writing a table pointer into it
    would corrupt the launch)."""
    name = launch.kernel.name
    if name.startswith(("sgemm_kernel<", "sgemm_split_kernel<")):
        file = "sgemm"
    elif name.startswith(("tf32x3_kernel<", "tf32x3_split_kernel<")):
        file = "tf32x3"
    elif name.startswith(("tf32x3_wgmma_kernel<", "tf32x3_wgmma_split_kernel<")):
        file = "tf32x3_wgmma"
    elif name.startswith(("matvec_kernel<", "matvec_split_kernel<", "gemm_kernel<", "gemm_split_kernel<")):
        file = "matmul"
    else:
        return False
    return get_kernel(file, name, launch.kernel.module.device) is launch.kernel


def _check_shape(
    shape: MatmulShape,
    batch: int,
    k: int,
    n: int,
    xa: DeviceArray,
    wa: DeviceArray,
    clusters: bool,
    smem_limit: int = 0,
) -> None:
    """Refuse a hand-picked cut the kernel cannot run correctly on these operands (and, for sgemm
    and both tf32x3 forms, a cut needing more than ``smem_limit`` bytes of shared memory per CTA, when that is
    given)."""
    if shape.split > 1 and not clusters:
        raise ShapeError(f"split {shape.split} needs thread-block clusters (compute capability 9.0)")
    tiled = {
        "sgemm": lambda: sgemm_shape(batch, k, n, sgemm_cut(shape), clusters=clusters),
        "tf32x3": lambda: tf32x3_shape(batch, k, n, tf32x3_cut(shape), clusters=clusters),
        "tf32x3_wgmma": lambda: tf32x3_wgmma_shape(batch, k, n, tf32x3_wgmma_cut(shape), clusters=clusters),
    }
    if shape.kernel in tiled:  # the cp.async tile kernels: 16-byte rows of x and W
        if k % 4 or n % 4 or xa.ptr % 16 or wa.ptr % 16:
            raise LayoutError(f"the {shape.kernel} kernel needs K % 4 == 0, N % 4 == 0 and 16-byte aligned x and W")
        want = tiled[shape.kernel]()
        if smem_limit and gemm_smem_bytes(shape) > smem_limit:
            raise ShapeError(
                f"{shape.kernel} cut {matmul_expr('none', shape)} needs {gemm_smem_bytes(shape)} B of dynamic "
                f"shared memory per CTA; this device allows {smem_limit}"
            )
    elif shape.kernel == "gemm":
        if k % 4 or n % 4 or xa.ptr % 16 or wa.ptr % 16:
            raise LayoutError("the gemm kernel needs K % 4 == 0, N % 4 == 0 and 16-byte aligned x and W")
        want = gemm_shape(batch, k, n, 1, clusters, shape.split, shape.tc, shape.per_sm, shape.slices)
    elif shape.kernel == "matvec":
        if shape.vec == 4 and (n % 4 or wa.ptr % 16):
            raise LayoutError("16-byte W loads (vec=4) need N % 4 == 0 and a 16-byte aligned W")
        want = matvec_shape(batch, k, n, 1, shape.vec, clusters, shape.tc, shape.split)
    else:
        raise ValueError(f"unknown matmul kernel {shape.kernel!r}")
    if want != shape:
        raise ShapeError(f"matmul shape {shape} does not fit batch={batch}, K={k}, N={n} (expected {want})")


BLOCK_MAX_WIDTH = 256  # kernels/block.cu's RG_BLOCK_MAXW
BLOCK_CLUSTER = 8  # CTAs per cluster of the single-kernel block


def block_fits(width: int, device: Device | None = None) -> bool:
    """Whether the single-kernel block (``kernels/block.cu``) handles this width (and device)."""
    ok = 1 <= width <= BLOCK_MAX_WIDTH and width % 4 == 0
    return ok and (device is None or has_clusters(device))


def block(
    device: Device,
    buffers: dict[str, DeviceArray],
    x: str,
    w1: str,
    w2: str,
    y: str,
    label: str = "",
    cluster: int = BLOCK_CLUSTER,
) -> Launch:
    """``y = relu(x @ w1) @ w2 + x`` in one kernel (width <= 256, width % 4 == 0; sm_90 clusters of
    ``cluster`` CTAs, 4 or 8)."""
    if cluster not in (4, 8):
        raise ValueError(f"the single-kernel block runs on clusters of 4 or 8 CTAs, got {cluster}")
    xa, w1a, w2a, ya = buffers[x], buffers[w1], buffers[w2], buffers[y]
    if len(xa.shape) != 2:
        raise ShapeError(f"block needs a 2-D x, got {xa.shape}")
    batch, width = xa.shape
    if not block_fits(width):
        raise ShapeError(f"the single-kernel block needs width <= {BLOCK_MAX_WIDTH} and a multiple of 4, got {width}")
    if not has_clusters(device):
        raise ShapeError("the single-kernel block needs thread-block clusters (compute capability 9.0)")
    check_array(xa, (batch, width), _F32, x)
    check_array(w1a, (width, width), _F32, w1, align=16)
    check_array(w2a, (width, width), _F32, w2, align=16)
    check_array(ya, (batch, width), _F32, y)
    bt = 1
    while bt < min(batch, 4):
        bt *= 2
    kernel = get_kernel("block", f"block_kernel<{bt}, {cluster}>", device)
    args = KernelArgs(
        [("x", "ptr"), ("W1", "ptr"), ("W2", "ptr"), ("y", "ptr"), ("B", "i32"), ("W", "i32"), ("flags", "i32")]
    )
    args.update({"x": xa.ptr, "W1": w1a.ptr, "W2": w2a.ptr, "y": ya.ptr, "B": batch, "W": width, "flags": 0})
    uses = {"x": ArgUse(x, "read"), "W1": ArgUse(w1, "read"), "W2": ArgUse(w2, "read"), "y": ArgUse(y, "write")}
    return Launch(kernel, (cluster, -(-batch // bt), 1), (THREADS, 1, 1), args, uses, 0, label or "block")
