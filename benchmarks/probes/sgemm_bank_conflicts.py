"""Which sgemm cuts will ptxas make stall on register banks? (issue 23) A CPU-only screen of the SASS.

ncu's dispatch stalls per issued instruction follow a count that needs no GPU (H100, 2026-12-06,
``benchmarks/NOTES.md`` session 17): the share of FFMAs in the K loop with two source registers
equal mod 4 (one bank) and neither flagged ``.reuse`` (read from the operand reuse cache). At the
w4096 M = 256 cut ``sgemm_split_kernel<0, 64, 128, 32, 3, 2, 1, 1>``:

    kernel                                     conflicting FFMAs   dispatch stalls / issue
    8 x 8 tile, FMAs in row order (d6e43ff)           21 %                 0.39
    x transposed in shared memory (fca1921)           16 %                 0.21
    8 x 16 tile (5e55354)                             40 %                 0.88
    8 x 8 tile, FMAs in column order (now)            15 %                 0.29

So a kernel edit can be screened here before a device call. This compiles each name expression
of ``kernels/sgemm.cu`` (or of ``--kernel-dir``, as ``RAWGRAPH_KERNEL_DIR``) for sm_90 with NVRTC,
disassembles the CUBIN with ``nvdisasm`` and prints one line per cut:

    PYTHONPATH=. python3 benchmarks/probes/sgemm_bank_conflicts.py
    PYTHONPATH=. python3 benchmarks/probes/sgemm_bank_conflicts.py --cut 64,128,32,3,2,1,1 --kernel-dir /tmp/variant

``nvdisasm`` comes from ``--nvdisasm``, the PATH, or the wheel ``nvidia-cuda-nvdisasm`` (``pip
install nvidia-cuda-nvdisasm``: not a dependency of rawgraph). Output lines: ``FACT <cut>: regs=..
sass=.. ffma=.. conflicts=..%``; without nvdisasm, ``NOTE`` and exit status 2. The bank model
(4 banks, register number mod 4) is an inference from these measurements, not a documented rule.
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

# The table's w4096 M = 256 cut and a spread of the table's other kinds (split, slices, BK 8 / 16).
DEFAULT_CUTS = [(64, 128, 32, 3, 2, 1, 1), (64, 128, 32, 3, 2, 2, 1), (32, 128, 16, 3, 8, 2, 1),
                (64, 64, 16, 3, 2, 4, 1), (32, 128, 8, 3, 8, 2, 1)]
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_REG = re.compile(r"-?\|?R(\d+)\|?(\.reuse)?")


def find_nvdisasm(given: str | None) -> str | None:
    """``given``, else ``nvdisasm`` on the PATH, else the one in the ``nvidia-cuda-nvdisasm`` wheel."""
    if given:
        return given
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
            if cand.exists():
                return str(cand)
    return None


def ffma_conflicts(sass: str) -> tuple[int, int, int]:
    """(instructions, FFMAs, FFMAs with two non-reused source registers in one bank mod 4)."""
    instructions = ffma = conflicts = 0
    for line in sass.splitlines():
        m = _INSTR.search(line)
        if not m:
            continue
        instructions += 1
        text = m.group(2)
        if not text.startswith("FFMA"):
            continue
        ffma += 1
        operands = [o.strip() for o in text.split(None, 1)[1].split(",")]
        live = set()
        for op in operands[1:]:  # the sources (operand 0 is the destination)
            r = _REG.match(op)
            if r and not r.group(2):
                live.add(int(r.group(1)))
        banks = [r % 4 for r in live]
        if len(banks) != len(set(banks)):
            conflicts += 1
    return instructions, ffma, conflicts


def expr(cut: tuple[int, ...]) -> str:
    bm, bn, bk, st, s, ks, minb = cut
    if s == 1:
        return f"sgemm_kernel<0, {bm}, {bn}, {bk}, {st}, {ks}, {minb}>"
    return f"sgemm_split_kernel<0, {bm}, {bn}, {bk}, {st}, {s}, {ks}, {minb}>"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cut", action="append", default=[], type=lambda v: tuple(int(t) for t in v.split(",")),
                   help="BM,BN,BK,STAGES,S,KS,MINB (repeatable; default: five of the table's kinds)")
    p.add_argument("--kernel-dir", help="compile kernels from this directory (RAWGRAPH_KERNEL_DIR)")
    p.add_argument("--nvdisasm", help="path of nvdisasm")
    a = p.parse_args()
    if a.kernel_dir:
        os.environ["RAWGRAPH_KERNEL_DIR"] = a.kernel_dir
    from rawgraph.runtime.compiler import DEFAULT_OPTIONS, compile_source
    from rawgraph.runtime.module import kernel_source

    tool = find_nvdisasm(a.nvdisasm)
    if tool is None:
        print("NOTE nvdisasm not found (--nvdisasm, PATH, or pip install nvidia-cuda-nvdisasm)")
        return 2
    src = kernel_source("sgemm")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        for cut in a.cut or DEFAULT_CUTS:
            name = expr(cut)
            img = compile_source(src, "sgemm.cu", "sm_90", [name], options=list(DEFAULT_OPTIONS) + ["-Xptxas=-v"],
                                 cache=False)
            cubin.write_bytes(bytes(img.image))
            sass = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
            log = img.log if isinstance(img.log, str) else bytes(img.log).decode(errors="replace")
            regs = re.findall(r"Used (\d+) registers", log)
            n, f, c = ffma_conflicts(sass)
            print(f"FACT {name}: regs={regs[0] if regs else '?'} sass={n} ffma={f} "
                  f"conflicts={100 * c / max(f, 1):.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
