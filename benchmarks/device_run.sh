#!/usr/bin/env bash
# One device call: GPU tests, the kernel benchmark and the launch-path benchmark, logs under $OUT.
#   bash benchmarks/device_run.sh [tests] [kernels] [kernels-sweep] [quick] [full] [seed] [profile] [sweep4096]
# Each stage has its own time limit, so a hang in one still brings back the others' logs.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
stages=${*:-tests kernels quick}
{ date -u; nvidia-smi -L; python3 -c 'import cuda.bindings, torch, cupy; print("cuda-bindings", cuda.bindings.__version__, "torch", torch.__version__, "cupy", cupy.__version__)'; } >"$OUT/env.txt" 2>&1
for stage in $stages; do
  start=$(date +%s)
  case $stage in
    tests) timeout 300 python3 -m pytest -q -rs --timeout=120 -p no:cacheprovider >"$OUT/gpu_tests.txt" 2>&1 ;;
    kernels) timeout 200 python3 -m rawgraph.bench.kernel_times --out "$OUT" >"$OUT/kernel.log" 2>&1 ;;
    kernels-sweep) timeout 240 python3 -m rawgraph.bench.kernel_times --sweep --out "$OUT" >"$OUT/kernel.log" 2>&1 ;;
    quick) timeout 200 python3 -m rawgraph.bench.launch_paths --quick --out "$OUT" >"$OUT/launch_quick.log" 2>&1 ;;
    full) timeout 400 python3 -m rawgraph.bench.launch_paths --out "$OUT" >"$OUT/launch_full.log" 2>&1 ;;
    seed) timeout 100 python3 benchmarks/seed_experiment.py >"$OUT/seed.txt" 2>&1 ;;
    profile)  # occupancy of every w4096 b64 GEMM cut, then the same launches under Nsight Compute
      timeout 60 python3 benchmarks/profile_matmul.py --kernel gemm --launches 5 >"$OUT/occupancy.txt" 2>&1
      timeout 150 ncu --clock-control none -k regex:gemm --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis python3 benchmarks/profile_matmul.py --kernel gemm >"$OUT/ncu_gemm.txt" 2>&1 ;;
    sweep4096) timeout 150 python3 -m rawgraph.bench.kernel_times --sweep --width 4096 --out "$OUT/w4096" >"$OUT/kernel_4096.log" 2>&1 ;;
  esac
  echo "stage $stage: rc=$? $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"
done
tail -3 "$OUT/gpu_tests.txt" 2>/dev/null
grep -E "MISSED|met|FAILED|Error|error" "$OUT"/*.log 2>/dev/null | head -40
