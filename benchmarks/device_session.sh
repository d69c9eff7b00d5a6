#!/usr/bin/env bash
# A device session in two calls, each within the device tool's 600 s per call. Run from a
# `git archive HEAD` copy (e.g. .snap, carried), with OUT set by the tool:
#
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh tests   # call 1
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh bench   # call 2
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh serving # call 3 (issue 23)
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh gemm    # GPU tests + GEMM sweep
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh race    # SWITCH probe; racecheck, K-slice sgemm; ncu w4096
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh switch  # GPU tests, racecheck, ncu, buckets, slots
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh final   # the same as closing
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh small   # GEMM sweep w1024 M 8..56; deeper w4096
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh check   # racecheck; w4096 b1 kernel times
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh strategies  # buckets, slots, choose
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh stalls  # sgemm tests, ncu stall reasons, sweep at the weak shapes
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh recheck # GPU tests, buckets, slots, the --cut probes
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh smallm  # capture-cost probe; ncu stalls at w1024 M 40-128
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh closing # GPU tests, 4 sanitizers, buckets, slots, choose, launch paths
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh tm4     # GEMM grid with TM = 4 and fitted row tiles; GPU tests
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh deep    # 60 cuts a shape at the shapes cuBLAS still leads
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh grid    # the table's cut at every shape against cuBLAS
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh near    # named cuts near the best where cuBLAS leads by a little
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh floors  # slots' worst buckets by kernel; w4096 b1 against copy bandwidth
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh memcheck # every GPU test file under memcheck
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh suite   # GPU tests, the plugin's, then memcheck (8 chunks at once; CHUNKS=0: a process a file)
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh tf32ncu # ncu on the tf32x3 cut and cuBLAS at the shapes short of its targets
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh wgmmagrid # GPU tests; the tf32x3 grid with wgmma rows
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh wgmmasearch # the grid with every one-wave wgmma cut; ncu at w4096 M 256
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh suitesearch # GPU tests, then that grid with what is left
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh tf32suite   # GPU tests, w4096 b1, memcheck, ncu at the tf32x3 misses
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh tf32bench   # section 3's benches, synccheck, initcheck, racecheck
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT bash benchmarks/device_session.sh tf32sanitize # the four sanitizer tools
#   RAWGRAPH_COMMIT=<hash> OUT=$OUT CUTLASS_PROBE=<binary> bash benchmarks/device_session.sh cutlass  # cuBLAS's kernels, its design built publicly; GPU tests
#
# tests: every GPU test (`-m gpu`), the doctor over every graph they make, then the CPU tests in
#   parallel (pytest-xdist, present on the device): run serially in one process the whole suite no
#   longer fits one call (cut at 84-86 % after 330-440 s, 2026-12-06). Then the device-shaped
#   probe while time is left.
# bench: the device-shaped probe with a cluster and a no-cluster cut, bench choose, bench buckets,
#   the GEMM sweep, each time-boxed to what is left of BUDGET seconds; everything packed.
set -u
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
BUDGET=${BUDGET:-575}
left() { echo $(( BUDGET - $(el) )); }
# every GPU test (`-m gpu`) within $1 seconds, then extra pytest arguments; the log is gpu_tests.txt
gpu_tests() {
  local limit=$1; shift
  PYTHONFAULTHANDLER=1 timeout "$limit" python3 -m pytest -m gpu -rs --timeout=120 -p no:cacheprovider "$@" \
    >"$OUT/gpu_tests.txt" 2>&1
  echo "tests rc=$? at $(el)s"
  grep -E " (FAILED|ERROR)|^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -40; tail -3 "$OUT/gpu_tests.txt"
}
# The serving benches, each within $1 seconds (logs buckets.log, slots.log, choose.log)
bench_buckets() {
  timeout "$1" python3 -m rawgraph.bench.buckets --out "$OUT" >"$OUT/buckets.log" 2>&1
  echo "buckets rc=$? at $(el)s"; grep -E "switch|device|MISSED|met" "$OUT/buckets.log" | tail -34
}
bench_slots() {  # $2: steps (default 3000)
  timeout "$1" python3 -m rawgraph.bench.slots --steps "${2:-3000}" --out "$OUT" >"$OUT/slots.log" 2>&1
  echo "slots rc=$? at $(el)s"; grep -vE "^p50 by bucket" "$OUT/slots.log" | tail -34
}
bench_choose() {
  timeout "$1" python3 -m rawgraph.bench.choose --steps 400 --rounds 5 --out "$OUT" >"$OUT/choose.log" 2>&1
  echo "choose rc=$? at $(el)s"; tail -10 "$OUT/choose.log"
}
# Launch paths within $1 seconds: the small-work floor (w128 b1), and one layer at serving sizes
launch_w128() {
  timeout "$1" python3 -m rawgraph.bench.launch_paths --width 128 --batch 1 --layers 1 --out "$OUT" \
    --name launch_paths_w128 >"$OUT/launch_w128.log" 2>&1
  echo "launch w128 rc=$? at $(el)s"; grep -E "met|MISSED" "$OUT/launch_w128.log" | tail -16
}
launch_serving() {
  timeout "$1" python3 -m rawgraph.bench.launch_paths --width 1024 4096 --batch 64 128 256 --layers 1 \
    --out "$OUT" --name launch_paths_serving >"$OUT/launch_serving.log" 2>&1
  echo "launch paths rc=$? at $(el)s"; tail -12 "$OUT/launch_serving.log"
}
# compute-sanitizer's tools ($3...) over every kernel form and table cut: each one while more than
# $1 + 25 seconds are left, within what leaves $1 seconds and at most $2
sanitize() {
  local keep=$1 cap=$2 t; shift 2
  for tool in "$@"; do
    if [ "$(left)" -gt $(( keep + 25 )) ]; then
      t=$(( $(left) - keep )); [ $t -gt "$cap" ] && t=$cap
      timeout $t compute-sanitizer --tool "$tool" python3 benchmarks/sanitize_kernels.py >"$OUT/sanitize_$tool.txt" 2>&1
      echo "$tool rc=$? at $(el)s"; grep -E "ERROR SUMMARY|FAIL|RACECHECK SUMMARY" "$OUT/sanitize_$tool.txt" | tail -3
    fi
  done
}
# ncu on ops.matmul(precision="tf32x3") and cuBLAS fp32 at each "M:K" shape (K = N) while more than
# 40 seconds are left: one log per shape, ncu_tf32x3_m<M>_k<K>.txt
ncu_tf32x3() {
  local mk m k
  for mk in "$@"; do
    m=${mk%%:*}; k=${mk##*:}
    if [ "$(left)" -gt 40 ]; then
      timeout $(( $(left) - 20 )) ncu --launch-count 6 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
        --section LaunchStats --metrics "${STALLS}l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum" \
        python3 benchmarks/probes/sgemm_ncu.py --m "$m" --k "$k" --precision tf32x3 >"$OUT/ncu_tf32x3_m${m}_k${k}.txt" 2>&1
      echo "ncu tf32x3 m$m k$k rc=$? at $(el)s"; grep -E "CHECK|Duration|Issue Slots Busy|Compute \(SM\)|DRAM Throughput" "$OUT/ncu_tf32x3_m${m}_k${k}.txt" | head -12
    fi
  done
}
# the checkout first; what the caller put on the path after it (wheels carried to /tmp/site)
export PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH}
# ncu's stall reasons per issued instruction (stages stalls and smallm)
STALLS=$(for r in barrier short_scoreboard long_scoreboard math_pipe_throttle mio_throttle not_selected wait \
  dispatch_stall lg_throttle no_instruction branch_resolving selected; do
  printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," $r; done)
(nvidia-smi -L; date; python3 -c "import cuda.bindings, torch, cupy; print('cuda-bindings', cuda.bindings.__version__, 'torch', torch.__version__, 'cupy', cupy.__version__)") >"$OUT/env.txt" 2>&1
case "${1:-tests}" in
  tests)
    # the files no GPU has run yet first (so a cut run still shows them), then every other GPU test
    FIRST=${FIRST_FILES:-"tests/test_slots_gpu.py tests/test_device_shaped_gpu.py tests/test_update_gpu.py tests/test_sgemm_gpu.py"}
    gpu_tests "${TESTS_LIMIT:-500}" -v --durations=25 $FIRST tests
    # then the CPU tests on this machine too (the whole suite in one call): in parallel where
    # pytest-xdist is installed (they touch no GPU), after the GPU tests so nothing overlaps them
    if [ "$(left)" -gt 60 ]; then
      XD=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
      timeout $(( $(left) - 15 )) python3 -m pytest -m "not gpu" -q -rs $XD -p no:cacheprovider \
        >"$OUT/cpu_tests_on_device.txt" 2>&1
      echo "cpu tests rc=$? at $(el)s"; tail -2 "$OUT/cpu_tests_on_device.txt"
    fi
    if [ "$(left)" -gt 40 ]; then
      timeout $(( $(left) - 10 )) python3 benchmarks/probes/device_shaped_cost.py --rounds 40 >"$OUT/probe_device_shaped.txt" 2>&1
      echo "probe rc=$? at $(el)s"; tail -12 "$OUT/probe_device_shaped.txt" | cut -c1-260
    fi ;;
  gemm)  # every GPU test (no CPU tests), then the GEMM sweep with what is left
    gpu_tests "${TESTS_LIMIT:-300}" -q --durations=15 tests
    timeout $(( $(left) - 15 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm" --budget-s $(( $(left) - 75 )) \
      >"$OUT/gemm.log" 2>&1
    echo "gemm rc=$? at $(el)s"; tail -8 "$OUT/gemm.log" | cut -c1-220 ;;
  bench)
    timeout 90 python3 benchmarks/probes/device_shaped_cost.py --rounds 40 --passes 1 \
      --cut 64,64,32,3,1,4,1 --cut 64,64,32,3,2,4,1 --no-pdl --no-grid >"$OUT/probe_device_shaped_cuts.txt" 2>&1
    echo "probe rc=$? at $(el)s"; grep -E "^(TIME|FACT|STEP)" "$OUT/probe_device_shaped_cuts.txt" | tail -24 | cut -c1-260
    bench_choose 120
    [ "$(left)" -gt 150 ] && bench_buckets $(( $(left) - 90 ))
    if [ "$(left)" -gt 70 ]; then
      timeout $(( $(left) - 15 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm" --budget-s $(( $(left) - 60 )) \
        >"$OUT/gemm.log" 2>&1
      echo "gemm rc=$? at $(el)s"; tail -6 "$OUT/gemm.log"
    fi ;;
  serving)  # issue 23's re-runs once SGEMM_CUTS holds the sweep's cuts: every GPU test, launch
    # paths at serving batch sizes, the sanitizer's four tools over every kernel form and table cut,
    # then the slots trace while time is left
    gpu_tests "${TESTS_LIMIT:-170}" -q tests
    launch_serving 200
    sanitize 20 100 memcheck racecheck synccheck initcheck
    [ "$(left)" -gt 120 ] && bench_slots $(( $(left) - 15 )) ;;
  race)  # issue 25: the SWITCH-band probe (every variant); issue 23: racecheck over every kernel
    # form and table cut (sgemm slices now pass their barriers equally often), ncu on the w4096 cut
    timeout 200 python3 benchmarks/probes/switch_bands.py --rounds 40 >"$OUT/probe_switch_bands.txt" 2>&1
    echo "switch probe rc=$? at $(el)s"; grep -E "^FACT|ratio" "$OUT/probe_switch_bands.txt" | cut -c1-230 | tail -40
    timeout 150 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_kernels.py >"$OUT/sanitize_racecheck.txt" 2>&1
    echo "racecheck rc=$? at $(el)s"; grep -E "ERROR SUMMARY|FAIL|RACECHECK SUMMARY" "$OUT/sanitize_racecheck.txt" | tail -3
    # every gemm-named launch of the probe (ours and cuBLAS's, warm-up included), no name filter
    for m in 256 128; do
      if [ "$(left)" -gt 50 ]; then
        timeout $(( $(left) - 20 )) ncu --launch-count 12 --section SpeedOfLight \
          --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
          --section MemoryWorkloadAnalysis --section LaunchStats python3 benchmarks/probes/sgemm_ncu.py --m $m --k 4096 \
          >"$OUT/ncu_sgemm_m${m}_k4096.txt" 2>&1
        echo "ncu m$m rc=$? at $(el)s"; grep -E "CHECK|FACT|^  [a-zA-Z_]+.*\(|Compute \(SM\) Throughput|Issue Slots Busy|Duration|WARNING" "$OUT/ncu_sgemm_m${m}_k4096.txt" | head -30
      fi
    done ;;
  switch)  # issue 25's SWITCH strategy and issue 23's re-runs: every GPU test, racecheck over every
    # kernel form and table cut, ncu on the w4096 cut, then bench buckets, slots and choose while time is left
    gpu_tests "${TESTS_LIMIT:-220}" -q tests
    timeout 120 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_kernels.py >"$OUT/sanitize_racecheck.txt" 2>&1
    echo "racecheck rc=$? at $(el)s"; grep -E "ERROR SUMMARY|FAIL|RACECHECK SUMMARY" "$OUT/sanitize_racecheck.txt" | tail -3
    timeout 40 ncu --launch-count 12 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
      python3 benchmarks/probes/sgemm_ncu.py --m 256 --k 4096 >"$OUT/ncu_sgemm_m256_k4096.txt" 2>&1
    echo "ncu rc=$? at $(el)s"; grep -E "CHECK|FACT|sgemm|Kernel2|Compute \(SM\) Throughput|Issue Slots Busy|WARNING" "$OUT/ncu_sgemm_m256_k4096.txt" | head -20
    [ "$(left)" -gt 100 ] && bench_buckets $(( $(left) - 60 ))
    [ "$(left)" -gt 70 ] && bench_slots $(( $(left) - 15 )) 2000 ;;
  small)  # issue 23: the sweep below the table (w1024, M = 8..56: the bucket sizes the matvec serves),
    # then a deeper search (more cuts timed) at w4096 M = 128 and 256
    timeout 200 python3 benchmarks/gemm_sweep.py --widths 1024 --rows 8:56:8 --max-cands 40 --out "$OUT/gemm_small" \
      --budget-s 150 >"$OUT/gemm_small.log" 2>&1
    echo "small rc=$? at $(el)s"; grep -E "^M=|SGEMM|\(" "$OUT/gemm_small.log" | cut -c1-200 | tail -20
    timeout $(( $(left) - 15 )) python3 benchmarks/gemm_sweep.py --widths 4096 --rows 128 256 --max-cands 90 \
      --out "$OUT/gemm_deep" --budget-s $(( $(left) - 60 )) >"$OUT/gemm_deep.log" 2>&1
    echo "deep rc=$? at $(el)s"; grep -E "^M=" "$OUT/gemm_deep.log" | cut -c1-200 | tail -6 ;;
  check)  # racecheck over every kernel form and table cut; w4096 b1 against copy bandwidth
    timeout 120 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_kernels.py >"$OUT/sanitize_racecheck.txt" 2>&1
    echo "racecheck rc=$? at $(el)s"; grep -cE "^ok" "$OUT/sanitize_racecheck.txt"; grep -E "RACECHECK SUMMARY|FAIL" "$OUT/sanitize_racecheck.txt" | tail -3
    timeout 90 python3 -m rawgraph.bench.kernel_times --width 4096 --batch 1 --out "$OUT" >"$OUT/kernel_times_w4096_b1.log" 2>&1
    echo "kernel times rc=$? at $(el)s"; tail -8 "$OUT/kernel_times_w4096_b1.log" ;;
  strategies)  # the serving strategies only: bench buckets, slots, choose
    bench_buckets 150; bench_slots 100; bench_choose 100 ;;
  stalls)  # issue 23: the sgemm GPU tests, ncu with stall reasons on the w4096 M = 256 table cut
    # (and CUT_B, when given) beside cuBLAS, then a sweep at the weak shapes with EXTRA_CUTS timed too
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_sgemm_gpu.py >"$OUT/gpu_tests_sgemm.txt" 2>&1
    echo "sgemm tests rc=$? at $(el)s"; grep -E "(FAILED|ERROR)" "$OUT/gpu_tests_sgemm.txt" | head; tail -1 "$OUT/gpu_tests_sgemm.txt"
    timeout 120 ncu --launch-count 8 --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
      --section Occupancy --section LaunchStats --metrics "${STALLS%,}" python3 benchmarks/probes/sgemm_ncu.py --m 256 --k 4096 \
      --cut ${CUT_A:-64,128,32,3,2,1,1} ${CUT_B:+--cut $CUT_B} >"$OUT/ncu_stalls_m256_k4096.txt" 2>&1
    echo "ncu rc=$? at $(el)s"; grep -E "CHECK|FACT|Duration|Issue Slots Busy|Registers Per|stalled_(dispatch|no_inst|short|barrier)|  void|  Kernel2" "$OUT/ncu_stalls_m256_k4096.txt" | cut -c1-120 | head -60
    timeout $(( $(left) - 15 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm" --widths 4096 1024 --rows ${ROWS:-256 128 104} \
      --max-cands ${CANDS:-20} ${EXTRA_CUTS:-} --budget-s $(( $(left) - 70 )) >"$OUT/gemm.log" 2>&1
    echo "gemm rc=$? at $(el)s"; tail -30 "$OUT/gemm.log" | cut -c1-200 ;;
  recheck)  # every GPU test, bench buckets and slots, then the two probes that take --cut run
    # with one (sgemm_ncu under ncu, device_shaped_cost) while time is left
    gpu_tests "${TESTS_LIMIT:-200}" -q tests
    bench_buckets 150; bench_slots 100
    timeout 60 ncu --launch-count 4 --section SpeedOfLight python3 benchmarks/probes/sgemm_ncu.py --m 256 --k 4096 \
      --cut ${CUT_A:-64,128,32,3,2,1,1} >"$OUT/ncu_sgemm_cut.txt" 2>&1
    echo "ncu rc=$? at $(el)s"; grep -E "CHECK|FACT|Duration|  void|  Kernel2" "$OUT/ncu_sgemm_cut.txt" | cut -c1-120 | head -20
    if [ "$(left)" -gt 50 ]; then
      timeout $(( $(left) - 15 )) python3 benchmarks/probes/device_shaped_cost.py --rounds 20 --passes 1 \
        --cut 64,64,32,3,2,4,1 --no-pdl --no-grid >"$OUT/probe_device_shaped_cut.txt" 2>&1
      echo "probe rc=$? at $(el)s"; grep -E "^(TIME|FACT|STEP)" "$OUT/probe_device_shaped_cut.txt" | tail -12 | cut -c1-200
    fi ;;
  smallm)  # issue 23 at w1024: where set-up's capture time goes (cProfile), then ncu with stall
    # reasons on the table's cut and cuBLAS at M = 40, 64, 128
    timeout 120 python3 benchmarks/probes/capture_cost.py >"$OUT/probe_capture_cost.txt" 2>&1
    echo "capture probe rc=$? at $(el)s"; grep -E "^FACT" "$OUT/probe_capture_cost.txt"
    for m in ${SMALL_ROWS:-64 40 128}; do
      if [ "$(left)" -gt 40 ]; then
        timeout $(( $(left) - 20 )) ncu --launch-count 6 --section SpeedOfLight --section SchedulerStats --section Occupancy \
          --section LaunchStats --metrics "${STALLS%,}" python3 benchmarks/probes/sgemm_ncu.py --m $m --k 1024 \
          >"$OUT/ncu_stalls_m${m}_k1024.txt" 2>&1
        echo "ncu m$m rc=$? at $(el)s"; grep -E "CHECK|Duration|Registers Per|Achieved Occ|stalled_(dispatch|no_inst|short|long|barrier|wait)|  void|  Kernel2" "$OUT/ncu_stalls_m${m}_k1024.txt" | cut -c1-110 | head -70
      fi
    done ;;
  final|closing)  # a session's last call: every GPU test, the sanitizer's four tools over every
    # kernel form and table cut, bench buckets, slots and choose, launch paths at w128 b1 and at
    # serving sizes (`final`, the older name, once ran the sanitizers after the benches)
    gpu_tests "${TESTS_LIMIT:-200}" -q tests
    sanitize 190 110 memcheck racecheck synccheck initcheck
    bench_buckets 100; bench_slots 60; bench_choose 40; launch_w128 60
    [ "$(left)" -gt 60 ] && launch_serving $(( $(left) - 10 )) ;;
  tm4)  # issue 23: the whole GEMM grid swept with 4 x 8 thread tiles and row tiles fitted to M
    # among the candidates (30 a shape), then every GPU test
    timeout 200 python3 benchmarks/gemm_sweep.py --out "$OUT/gemm" --max-cands ${CANDS:-30} --budget-s 170 \
      >"$OUT/gemm.log" 2>&1
    echo "gemm rc=$? at $(el)s"; grep -E "REQUIRED|TARGET|checks" "$OUT/gemm.log" | cut -c1-300
    gpu_tests $(( $(left) - 15 )) -q tests ;;
  deep)  # issue 23: 60 cuts a shape where the tm4 sweep left cuBLAS ahead or close (w1024 104-128,
    # w4096 64 and 104-144) and below the grid (w1024 16-56, the buckets' small sizes), with 4 x 8
    # tiles over two row tiles named explicitly at w4096
    timeout 150 python3 benchmarks/gemm_sweep.py --out "$OUT/gemm_deep1024" --widths 1024 --rows 16:56:8 104:128:8 \
      --max-cands 60 --budget-s 130 >"$OUT/gemm_deep1024.log" 2>&1
    echo "gemm w1024 rc=$? at $(el)s"; grep -E "^ +[0-9]+ +1024 " "$OUT/gemm_deep1024.log" | cut -c1-150
    timeout $(( $(left) - 10 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm_deep4096" --widths 4096 \
      --rows 64 104:144:8 --max-cands 60 --budget-s $(( $(left) - 50 )) --cut 64,64,32,3,2,2,1,4 --cut 64,64,16,3,2,2,1,4 \
      --cut 64,64,32,3,2,1,2,4 --cut 64,128,32,3,2,1,1,4 --cut 32,128,32,3,2,2,1,4 --cut 64,64,32,3,2,4,1,4 \
      >"$OUT/gemm_deep4096.log" 2>&1
    echo "gemm w4096 rc=$? at $(el)s"; grep -E "^ +[0-9]+ +4096 " "$OUT/gemm_deep4096.log" | cut -c1-150 ;;
  grid)  # issue 23: the table's cut at every shape of the grid and below it (w1024 16-56) against
    # cuBLAS, with a few model cuts beside it (the committed table's own figures)
    timeout $(( $(left) - 10 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm_grid" --rows 16:256:8 --widths 1024 \
      --max-cands ${CANDS:-4} --budget-s 120 >"$OUT/gemm_grid1024.log" 2>&1
    echo "gemm w1024 rc=$? at $(el)s"; grep -E "REQUIRED|TARGET|checks" "$OUT/gemm_grid1024.log" | cut -c1-300
    timeout $(( $(left) - 10 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm_grid4096" --widths 4096 \
      --max-cands ${CANDS:-4} --budget-s $(( $(left) - 40 )) >"$OUT/gemm_grid4096.log" 2>&1
    echo "gemm w4096 rc=$? at $(el)s"; grep -E "REQUIRED|TARGET|checks" "$OUT/gemm_grid4096.log" | cut -c1-300 ;;
  near)  # issue 23: named cuts around the best ones where cuBLAS still leads by 1-3 % (w1024 120-128,
    # w4096 136-144) or 7 % (w4096 64): more stages, other K steps, 16-row tiles
    timeout 100 python3 benchmarks/gemm_sweep.py --out "$OUT/gemm_near1024" --widths 1024 --rows 120 128 --max-cands 1 \
      --cut 32,64,16,3,8,1,1,4 --cut 32,64,16,4,8,1,1,4 --cut 32,64,32,4,8,1,1,4 --cut 32,64,16,5,8,1,1,4 \
      --cut 16,64,32,3,8,1,1,4 --cut 16,64,16,3,8,2,1,4 --cut 32,64,8,5,8,1,1,4 --cut 32,64,32,3,6,1,1,4 \
      --cut 32,64,32,3,4,2,1,4 --cut 32,64,32,3,8,2,1,4 --cut 64,64,32,3,8,1,1,4 --cut 32,64,32,5,8,1,1,4 \
      >"$OUT/gemm_near1024.log" 2>&1
    echo "gemm w1024 rc=$? at $(el)s"; grep -E "^ +[0-9]+ +1024 " "$OUT/gemm_near1024.log" | cut -c1-170
    timeout $(( $(left) - 10 )) python3 benchmarks/gemm_sweep.py --out "$OUT/gemm_near4096" --widths 4096 --rows 64 136 144 \
      --max-cands 1 --cut 48,64,16,4,8,1,1,4 --cut 48,64,8,5,8,1,1,4 --cut 48,64,16,3,8,1,2,4 --cut 48,128,16,3,8,1,1,4 \
      --cut 16,64,32,3,8,2,1,4 --cut 16,128,32,3,4,2,1,4 --cut 32,64,32,3,4,2,1,4 --cut 64,64,16,4,2,4,1 \
      --cut 64,64,16,3,2,4,1,4 --cut 32,128,16,3,2,4,1,4 >"$OUT/gemm_near4096.log" 2>&1
    echo "gemm w4096 rc=$? at $(el)s"; grep -E "^ +[0-9]+ +4096 " "$OUT/gemm_near4096.log" | cut -c1-170 ;;
  cutlass)  # issue 23's floor: which kernels cuBLAS runs per shape, and cuBLAS's own SIMT design built
    # from the open CUTLASS source with the public nvcc ($CUTLASS_PROBE, benchmarks/probes/cutlass/build.sh)
    # timed beside cublasSgemm with PyTorch's libcublas; then every GPU test
    timeout 60 python3 benchmarks/probes/cutlass/cublas_kernels.py >"$OUT/cublas_kernels.txt" 2>&1
    echo "cublas_kernels rc=$? at $(el)s"; grep -c FACT "$OUT/cublas_kernels.txt"
    lib=$(python3 -c "import nvidia, os; print(next((os.path.join(p, 'cu13/lib') for p in nvidia.__path__ if os.path.exists(os.path.join(p, 'cu13/lib/libcublas.so.13'))), ''))" 2>/dev/null)
    if [ -z "${CUTLASS_PROBE:-}" ] || [ -z "$lib" ]; then
      echo "cutlass_simt skipped: CUTLASS_PROBE='${CUTLASS_PROBE:-}' (build.sh's binary), libcublas.so.13 dir='$lib'"
    else
      LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 150 "$CUTLASS_PROBE" >"$OUT/cutlass_simt.txt" 2>&1
      echo "cutlass_simt rc=$? at $(el)s"; grep -E "FAIL" "$OUT/cutlass_simt.txt" | head
    fi
    gpu_tests $(( $(left) - 10 )) -q tests ;;
  floors)  # issue 23's slots and w4096 b1 targets: what the slots trace's worst buckets are made of
    # (each strategy's step by kernel, under the PyTorch profiler), then the w4096 b1 matvec against copy bandwidth
    timeout 200 python3 benchmarks/probes/slots_floor.py >"$OUT/probe_slots_floor.txt" 2>&1
    echo "slots_floor rc=$? at $(el)s"; grep -E "^(TIME|FLOOR|NO GPU)" "$OUT/probe_slots_floor.txt"
    timeout 90 python3 -m rawgraph.bench.kernel_times --width 4096 --batch 1 --out "$OUT" >"$OUT/kernel_times_w4096_b1.log" 2>&1
    echo "kernel times rc=$? at $(el)s"; tail -8 "$OUT/kernel_times_w4096_b1.log" ;;
  gpu)  # every GPU test, nothing else
    gpu_tests "${TESTS_LIMIT:-250}" -q tests ;;
  tf32ncu)  # issue 46's misses under ncu: the cut precision="tf32x3" launches and cuBLAS's kernels
    # side by side, with the stall reasons and local-memory traffic ($NCU_SHAPES: "M:K ...")
    ncu_tf32x3 ${NCU_SHAPES:-64:4096 128:4096 160:4096 64:2048 64:1024} ;;
  wave)  # one call for a whole session's GPU checks, most needed first: every GPU test but the wgmma
    # file, the trace at w128 b1, the no-regression launch paths against $OLD_TREE, then the wgmma
    # smoke probe and (if it passed) the wgmma tests in their own process, so a fault there cannot
    # take the suite's context
    gpu_tests "${TESTS_LIMIT:-300}" -q --durations=10 --ignore=tests/test_tf32x3_wgmma_gpu.py tests
    timeout 60 python3 -m rawgraph trace --width 128 --batch 1 --layers 1 --form fused --steps 5 --out "$OUT/trace" \
      --name trace_w128_b1 >"$OUT/trace.log" 2>&1
    echo "trace rc=$? at $(el)s"; tail -12 "$OUT/trace.log"
    if [ "$(left)" -gt 120 ] && [ -n "${OLD_TREE:-}" ]; then
      REGRESS_LIMIT=${REGRESS_LIMIT:-45} bash benchmarks/device_run.sh regress >/dev/null 2>&1
      echo "regress at $(el)s"; grep -E "^(gpu|path|graph |graph_update|graph_indirect |micro:manager)" "$OUT/compare_paths.txt" 2>/dev/null
    fi
    if [ "$(left)" -gt 40 ]; then
      timeout $(( $(left) - 15 )) python3 benchmarks/probes/wgmma_smoke.py >"$OUT/wgmma_smoke.txt" 2>&1; smoke=$?
      echo "wgmma smoke rc=$smoke at $(el)s"; grep -E "CHECK|TIME" "$OUT/wgmma_smoke.txt" | head -8
      if [ $smoke = 0 ] && [ "$(left)" -gt 30 ]; then
        timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider tests/test_tf32x3_wgmma_gpu.py >"$OUT/wgmma_tests.txt" 2>&1
        echo "wgmma tests rc=$? at $(el)s"; grep -E "^(FAILED|ERROR)" "$OUT/wgmma_tests.txt" | head -5; tail -1 "$OUT/wgmma_tests.txt"
      fi
    fi ;;
  wgmmagrid)  # every GPU test (the routed wgmma launches among them), then the tf32x3 sweep over the
    # whole grid with wgmma rows (no two-run form), and the TF32X3_WGMMA_TABLE it gives
    gpu_tests "${TESTS_LIMIT:-280}" -q --durations=10 tests
    timeout $(( $(left) - 20 )) python3 benchmarks/tf32x3_sweep.py --alternates 2 --wgmma-alternates 4 --no-wgmma-runs2 \
      --budget-s $(( $(left) - 45 )) --out "$OUT/tf32x3" >"$OUT/tf32x3.log" 2>&1
    echo "tf32x3 sweep rc=$? at $(el)s"; grep -c "^M=" "$OUT/tf32x3.log"; sed -n '/^TF32X3_WGMMA_TABLE/,/^"""$/p' "$OUT/tf32x3.log" ;;
  wgmmasearch)  # the tf32x3 grid with every one-wave wgmma cut of the search (no mma.sync
    # alternates), the table it gives, then ncu on the cut precision="tf32x3" launches at w4096 M 256
    timeout $(( $(left) - 80 )) python3 benchmarks/tf32x3_sweep.py --alternates 0 --wgmma-alternates 0 --no-wgmma-runs2 \
      --wgmma-search --widths 4096 2048 1024 --budget-s $(( $(left) - 110 )) --out "$OUT/tf32x3" >"$OUT/tf32x3.log" 2>&1
    echo "tf32x3 sweep rc=$? at $(el)s"; grep -c "^M=" "$OUT/tf32x3.log"; sed -n '/^TF32X3_WGMMA_TABLE/,/^"""$/p' "$OUT/tf32x3.log"
    ncu_tf32x3 256:4096 ;;
  suitesearch)  # every GPU test at HEAD, then wgmmasearch's sweep (widest first) with what is left
    gpu_tests "${TESTS_LIMIT:-330}" -q --durations=10 tests
    timeout $(( $(left) - 15 )) python3 benchmarks/tf32x3_sweep.py --alternates 0 --wgmma-alternates 0 --no-wgmma-runs2 \
      --wgmma-search --widths 4096 2048 1024 --budget-s $(( $(left) - 45 )) --out "$OUT/tf32x3" >"$OUT/tf32x3.log" 2>&1
    echo "tf32x3 sweep rc=$? at $(el)s"; grep -c "^M=" "$OUT/tf32x3.log"; grep -E "not run|budget" "$OUT/tf32x3.log" | tail -2 ;;
  tf32suite)  # issue 46's closing checks, first call: every GPU test (the table's routing; 285-316 s warm, ~355 cold), w4096 b1
    # against copy bandwidth, memcheck over every kernel form and table cut, then ncu at the shapes
    # short of the targets, as time allows
    gpu_tests "${TESTS_LIMIT:-400}" -q --durations=10 tests
    timeout 60 python3 -m rawgraph.bench.kernel_times --width 4096 --batch 1 --out "$OUT" >"$OUT/kernel_times_w4096_b1.log" 2>&1
    echo "kernel times rc=$? at $(el)s"; tail -6 "$OUT/kernel_times_w4096_b1.log"
    sanitize 10 110 memcheck
    ncu_tf32x3 ${NCU_SHAPES:-64:4096 128:4096 160:4096 64:2048 64:1024} ;;
  tf32sanitize)  # the four compute-sanitizer tools over every kernel form and table cut (200 s
    # each at most): what tf32suite and tf32bench had no time left for
    sanitize 10 200 memcheck racecheck synccheck initcheck ;;
  tf32bench)  # issue 46's closing checks, second call: section 3 with precision="auto" (launch paths
    # at serving sizes, bench buckets, slots), then synccheck, initcheck (a few seconds each) and
    # racecheck (about 125 s) as time allows
    launch_serving 150; bench_buckets 100; bench_slots 100
    sanitize 10 200 synccheck initcheck racecheck ;;
  section3)  # the tf32x3 GEMM's sweep with its wgmma rows, then what it buys with precision="auto"
    # (the models' default): launch paths at serving sizes, bench buckets and slots
    timeout 170 python3 benchmarks/tf32x3_sweep.py --quick --wgmma-alternates 2 --out "$OUT/tf32x3" >"$OUT/tf32x3.log" 2>&1
    echo "tf32x3 sweep rc=$? at $(el)s"; grep -E "verdict|MISSED|met" "$OUT/tf32x3.log" | tail -16
    [ "$(left)" -gt 200 ] && launch_serving 150
    [ "$(left)" -gt 130 ] && bench_buckets 100
    [ "$(left)" -gt 80 ] && bench_slots $(( $(left) - 15 )) ;;
  suite)  # every GPU test; the pytest plugin's tests (its gpu marker runs here); then memcheck over
    # every GPU test file, 8 chunks at once, with what is left of BUDGET
    gpu_tests "${TESTS_LIMIT:-270}" -q --durations=20 tests
    timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/test_testing_plugin_cpu.py >"$OUT/plugin_tests.txt" 2>&1
    echo "plugin rc=$? at $(el)s"; tail -1 "$OUT/plugin_tests.txt"
    MEMCHECK_PARALLEL=1 MEMCHECK_LIMIT=$(( $(left) - 25 )) OUT="$OUT/mc" bash benchmarks/memcheck_gpu_tests.sh ${CHUNKS:-8} >"$OUT/mc.log" 2>&1
    echo "memcheck rc=$? at $(el)s"; grep "^chunk [0-9]*: rc" "$OUT/mc/sanitize_memcheck_files.txt" | cut -c1-220 ;;
  memcheck)  # every GPU test file under memcheck, each log naming the files and tests it covered
    MEMCHECK_LIMIT=${MEMCHECK_LIMIT:-$(( (BUDGET - 20) / ${CHUNKS:-4} ))} bash benchmarks/memcheck_gpu_tests.sh ${CHUNKS:-4} ${RUN_CHUNKS:-}
    echo "memcheck rc=$? at $(el)s" ;;
  *) echo "usage: device_session.sh tests|gemm|bench|serving|race|switch|final|small|check|strategies|stalls|recheck|smallm|closing|tm4|deep|grid|near|cutlass|floors|gpu|suite|tf32ncu|memcheck|wave|section3|wgmmagrid|wgmmasearch|suitesearch|tf32suite|tf32bench|tf32sanitize" >&2; exit 2 ;;
esac
tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
echo "packed at $(el)s"
