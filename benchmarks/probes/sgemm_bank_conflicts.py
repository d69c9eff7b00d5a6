"""Which sgemm cuts will ptxas make stall on register banks? (issue 23) A CPU-only screen of the SASS.

ncu's dispatch stalls per issued instruction, measured on an H100 at the w4096 M = 256 cut
``sgemm_split_kernel<0, 64, 128, 32, 3, 2, 1, 1>`` (``benchmarks/NOTES.md`` session 17), against
this probe's count for the same kernel (``benchmarks/results/bank_conflicts_2026-12-06_*.txt``):

    kernel                                     conflicting FFMAs   dispatch stalls / issue
    8 x 8 tile, FMAs in row order (d6e43ff)          21.0 %                0.39
    x transposed in shared memory (fca1921)          18.4 %                0.21
    8 x 16 tile (5e55354)                            43.7 %                0.88
    8 x 8 tile, FMAs in column order (now)           18.1 %                0.29

The count ranks the three 8 x 8 / 8 x 16 kernels as ncu does; the transposed kernel is the
exception. It is a screen, to decide what is worth a device call, not a prediction.

The count: an FFMA conflicts when two of its source registers that it reads from the register
file are equal mod 4 (taken as the bank). A source is not read from the register file when the
instruction before flagged the same register ``.reuse`` in the same operand slot (the flag keeps
the value in that slot's reuse cache for the next instruction). Predicated FFMAs count too. The
bank rule is an inference from these measurements, not a documented one. The count covers every
FFMA of the kernel; in sgemm.cu they are all in the K loop.

Each cut (``--cut``, or a full name expression with ``--expr``) of ``kernels/sgemm.cu`` (or of
``--kernel-dir``, as ``RAWGRAPH_KERNEL_DIR``) is compiled for sm_90 with NVRTC and disassembled
with ``nvdisasm``:

    PYTHONPATH=. python3 benchmarks/probes/sgemm_bank_conflicts.py
    PYTHONPATH=. python3 benchmarks/probes/sgemm_bank_conflicts.py --cut 64,128,32,3,2,1,1 --kernel-dir DIR

``nvdisasm`` comes from ``--nvdisasm``, the PATH, or the wheel ``nvidia-cuda-nvdisasm`` (``pip
install nvidia-cuda-nvdisasm``; not a dependency of rawgraph). Output: one ``FACT <expression>:
regs=.. sass=.. ffma=.. conflicts=..%`` line per kernel. Exit status 2 with a ``NOTE`` line when
there is no nvdisasm, 1 when NVRTC or nvdisasm fails (``FAIL`` line).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import parse_cut

# The table's w4096 M = 256 cut and a spread of the table's other kinds (split, slices, BK 8 / 16).
DEFAULT_CUTS = [
    (64, 128, 32, 3, 2, 1, 1),
    (64, 128, 32, 3, 2, 2, 1),
    (32, 128, 16, 3, 8, 2, 1),
    (64, 64, 16, 3, 2, 4, 1),
    (32, 128, 8, 3, 8, 2, 1),
]
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")
_REG = re.compile(r"-?\|?R(\d+)\|?(\.reuse)?")


def find_nvdisasm(given: str | None) -> str | None:
    """``given`` if it is a file, else ``nvdisasm`` on the PATH, else the one in the
    ``nvidia-cuda-nvdisasm`` wheel; None if there is none."""
    if given:
        return given if Path(given).is_file() else None
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for sub in ("cu13/bin/nvdisasm", "cuda_nvdisasm/bin/nvdisasm"):
            cand = Path(base) / sub
            if cand.is_file():
                return str(cand)
    return None


def ffma_conflicts(sass: str) -> tuple[int, int, int]:
    """Count in nvdisasm's text: (instructions, FFMAs, FFMAs with two register-file source reads
    in one bank mod 4), a source in the slot and register the previous instruction flagged
    ``.reuse`` being read from the reuse cache instead."""
    instructions = ffma = conflicts = 0
    cached: dict[int, int] = {}  # operand slot -> register the previous instruction kept
    for line in sass.splitlines():
        m = _INSTR.search(line)
        if not m:
            continue
        instructions += 1
        body = _PREDICATE.sub("", m.group(2))
        parts = body.split(None, 1)
        operands = [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []
        keep: dict[int, int] = {}
        reads = set()
        for slot, op in enumerate(operands[1:4]):  # the sources (operand 0 is the destination)
            r = _REG.match(op)
            if not r:
                continue
            reg = int(r.group(1))
            if r.group(2):
                keep[slot] = reg
            if cached.get(slot) != reg:
                reads.add(reg)
        if parts and parts[0].startswith("FFMA"):
            ffma += 1
            banks = [reg % 4 for reg in reads]
            if len(banks) != len(set(banks)):
                conflicts += 1
        cached = keep
    return instructions, ffma, conflicts


def main() -> int:
    """Compile, disassemble and count each kernel; print one FACT line each."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--cut",
        action="append",
        default=[],
        type=parse_cut,
        help="BM,BN,BK,STAGES,S,KS,MINB (repeatable; default: five of the table's kinds)",
    )
    p.add_argument(
        "--expr",
        action="append",
        default=[],
        help="a name expression of the kernel file, e.g. a variant's kernel (repeatable)",
    )
    p.add_argument("--kernel-dir", help="compile kernels from this directory (RAWGRAPH_KERNEL_DIR)")
    p.add_argument("--nvdisasm", help="path of nvdisasm")
    a = p.parse_args()
    if a.kernel_dir:
        os.environ["RAWGRAPH_KERNEL_DIR"] = a.kernel_dir
    from rawgraph.ops import SgemmCut, matmul_expr, sgemm_shape
    from rawgraph.runtime.compiler import DEFAULT_OPTIONS, compile_source
    from rawgraph.runtime.errors import NvrtcError
    from rawgraph.runtime.module import kernel_source

    tool = find_nvdisasm(a.nvdisasm)
    if tool is None:
        print("NOTE nvdisasm not found (--nvdisasm FILE, the PATH, or pip install nvidia-cuda-nvdisasm)")
        return 2
    names = [matmul_expr("none", sgemm_shape(c.bm, 4096, 4096, c)) for c in a.cut] + a.expr
    src = kernel_source("sgemm")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        for name in names or [matmul_expr("none", sgemm_shape(c[0], 4096, 4096, SgemmCut(*c))) for c in DEFAULT_CUTS]:
            try:
                img = compile_source(
                    src, "sgemm.cu", "sm_90", [name], options=list(DEFAULT_OPTIONS) + ["-Xptxas=-v"], cache=False
                )
            except NvrtcError as exc:
                print(f"FAIL {name}: NVRTC: {exc}")
                return 1
            cubin.write_bytes(bytes(img.image))
            run = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True)
            if run.returncode:
                print(f"FAIL {name}: nvdisasm exited {run.returncode}: {run.stderr.strip()[:300]}")
                return 1
            log = img.log if isinstance(img.log, str) else bytes(img.log).decode(errors="replace")
            regs = re.findall(r"Used (\d+) registers", log)
            n, f, c = ffma_conflicts(run.stdout)
            print(
                f"FACT {name}: regs={regs[0] if regs else '?'} sass={n} ffma={f} conflicts={100 * c / max(f, 1):.1f}%",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
