#!/usr/bin/env bash
# Every GPU test file under compute-sanitizer's memcheck, in chunks, each log naming what it covered.
#
#   OUT=<dir> bash benchmarks/memcheck_gpu_tests.sh [CHUNKS [RUN...]]  # CHUNKS: how many logs (default 4);
#                                                                  # RUN: which of them to run now (default all)
#
# The files are every tests/*_gpu.py found now (no hand-kept list can miss a new one), dealt out
# round-robin by size so the chunks take about the same time. Each log
# ($OUT/sanitize_memcheck_chunkN.txt) starts with a `files:` line listing its test files, then
# pytest's verbose output (one node id per test with its outcome), then memcheck's ERROR SUMMARY.
# $OUT/sanitize_memcheck_files.txt lists every file with its chunk, and closes with one line a
# chunk: its pytest summary and its ERROR SUMMARY.
#
# The split depends only on the files, so two calls on one commit (`4 1 2`, then `4 3 4`) cover
# every file between them.
#
# --report-api-errors no: many tests provoke driver errors on purpose (refusals the driver makes),
# which memcheck would otherwise count. MEMCHECK_LIMIT bounds each chunk in seconds (default 280);
# MEMCHECK_SKIP names test files (basenames) left out, each listed as "skipped:" in the summary;
# MEMCHECK_PARALLEL=1 runs the chunks at once (tests that measure free device memory skip there:
# they would see the other chunks' allocations; memcheck's findings are per process).
# CHUNKS 0: one chunk a file (each in its own process, MEMCHECK_JOBS at once, default 16), so a
# context one test leaves dead fails only the rest of that file.
set -u
OUT=${OUT:?set OUT to the folder for the logs}
chunks=${1:-4}
shift $(( $# > 0 ? 1 : 0 ))
run=${*:-$(seq 1 "$chunks")}
SANITIZER=${COMPUTE_SANITIZER:-compute-sanitizer}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
mapfile -t files < <(ls -S tests/*_gpu.py | grep -vxF -f <(for f in ${MEMCHECK_SKIP:-}; do echo "tests/$f"; done; echo /))
[ ${#files[@]} -gt 0 ] || { echo "memcheck: no tests/*_gpu.py found" >&2; exit 2; }
[ "$chunks" -gt 0 ] || { chunks=${#files[@]}; run=${*:-$(seq 1 "$chunks")}; }
declare -a chunk
for i in "${!files[@]}"; do
  c=$(( i % chunks + 1 ))
  chunk[$c]="${chunk[$c]:-} ${files[$i]}"
done
summary="$OUT/sanitize_memcheck_files.txt"
: >"$summary"
for f in ${MEMCHECK_SKIP:-}; do echo "skipped: tests/$f" >>"$summary"; done
for c in $(seq 1 "$chunks"); do
  for f in ${chunk[$c]:-}; do echo "chunk $c: $f" >>"$summary"; done
done
run_chunk() {  # $1: the chunk; its log, then one summary line
  local c=$1 log="$OUT/sanitize_memcheck_chunk$1.txt" rc
  echo "files:${chunk[$c]}" >"$log"
  RAWGRAPH_SANITIZER=1 timeout "${MEMCHECK_LIMIT:-280}" "$SANITIZER" --tool memcheck --report-api-errors no \
    python3 -m pytest -v -p no:cacheprovider -m gpu ${chunk[$c]} >>"$log" 2>&1
  rc=$?
  # logs are committed: no path of the machine that ran them (the checkout, the interpreter)
  sed -i -e "s#rootdir: $PWD#rootdir: <checkout>#" -e "s#$PWD/##g" -e "s# -- $(command -v python3)# -- <python>#" "$log"
  echo "chunk $c: rc=$rc | $(grep -E '^=+ .* in [0-9.]+s' "$log" | tail -1) | $(grep -h 'ERROR SUMMARY' "$log" | tail -1)" \
    >"$OUT/.memcheck_rc$c"
  return $rc
}
status=0
for c in $run; do
  [ -n "${chunk[$c]:-}" ] || continue
  if [ -n "${MEMCHECK_PARALLEL:-}" ]; then
    # one process per chunk at once (memcheck's cost is mostly host time); tests that measure the
    # device's free memory skip (RAWGRAPH_SHARED_GPU, tests/helpers.py)
    while [ "$(jobs -rp | wc -l)" -ge "${MEMCHECK_JOBS:-16}" ]; do wait -n; done
    RAWGRAPH_SHARED_GPU=1 run_chunk "$c" &
  else
    run_chunk "$c" || status=$?
  fi
done
wait
for c in $run; do
  f="$OUT/.memcheck_rc$c"
  [ -f "$f" ] || continue
  tee -a "$summary" <"$f"
  grep -q "^chunk $c: rc=0 " "$f" || status=1
  rm -f "$f"
done
exit $status
