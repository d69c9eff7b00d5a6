#!/usr/bin/env bash
# Issue 23 at w1024: is the fully unrolled kq loop of kernels/sgemm.cu (37 KB of SASS at BK = 32)
# worth its instruction-cache misses where a CTA runs its K loop only a few times? (ncu at
# w1024 M = 128, 2026-12-06: 0.60 "no instruction" stalls per issued instruction.) Makes two
# copies of kernels/ whose kq loop is unrolled 4 and 2 times, then sweeps the w1024 shapes with
# the current kernel and each copy, interleaved twice (base, u4, u2, base, u4, u2), through
# RAWGRAPH_KERNEL_DIR. Run from the repository root with OUT set (the device tool's), e.g.
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/unroll_variants.sh
set -u
export PYTHONPATH=$(pwd)
ROWS=${ROWS:-"24 40 56 64 104 128 256"}
for u in 4 2; do
  rm -rf /tmp/kernels_u$u && cp -r kernels /tmp/kernels_u$u
  # the '#pragma unroll' line right above the kq loop gets a factor
  python3 - "$u" /tmp/kernels_u$u/sgemm.cu <<'PY'
import sys
u, path = sys.argv[1], sys.argv[2]
src = open(path).read()
loop = "        for (int kq = 0; kq < BK && st < nst; kq += 4) {"
old = "#pragma unroll\n" + loop
assert src.count(old) == 1, "the kq loop moved: update unroll_variants.sh"
open(path, "w").write(src.replace(old, f"#pragma unroll {u}\n" + loop))
PY
  [ $? -eq 0 ] || { echo "could not make the unroll-$u copy" >&2; exit 1; }
done
S=$(date +%s)
for pass in 1 2; do
  for v in base u4 u2; do
    dir=kernels
    [ $v = u4 ] && dir=/tmp/kernels_u4; [ $v = u2 ] && dir=/tmp/kernels_u2
    RAWGRAPH_KERNEL_DIR=$(cd "$dir" && pwd) timeout 150 python3 benchmarks/gemm_sweep.py --widths 1024 --rows $ROWS \
      --max-cands ${CANDS:-6} --repeats 7 --out "$OUT/unroll_${v}_$pass" --budget-s 100 >"$OUT/unroll_${v}_$pass.log" 2>&1
    echo "$v pass $pass rc=$? at $(( $(date +%s) - S ))s"
    grep -E "^M=" "$OUT/unroll_${v}_$pass.log" | grep -v epilogues | cut -c1-150
  done
done
