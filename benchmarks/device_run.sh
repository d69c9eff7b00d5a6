#!/usr/bin/env bash
# One device call: GPU tests, the kernel benchmark and the launch-path benchmark, logs under $OUT.
#   bash benchmarks/device_run.sh [tests] [kernels] [kernels-sweep] [quick] [full] [seed] [profile] [sweep4096]
#                                 [sanitize] [memcheck] [kernelcheck] [soak] [probes] [torchprobe] [buckets] [slots]
#                                 [kernels1024] [devlaunch] [control] [forkjoin] [rebindpaths] [newtests] [pack]
#                                 [memcheck-all] [debugmalloc] [bitecheck] [regress] [gemmquick]
# Each stage has its own time limit, so a hang in one still brings back the others' logs.
# RAWGRAPH_COMMIT names the commit measured in every results JSON (the device copy has no .git).
set -u
# absolute: tests start interpreters in other folders; the caller's path (carried wheels) after it
export PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export RAWGRAPH_COMMIT=${RAWGRAPH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-out}
mkdir -p "$OUT"
stages=${*:-tests kernels quick}
{ date -u; nvidia-smi -L; python3 -c 'import cuda.bindings, torch, cupy; print("cuda-bindings", cuda.bindings.__version__, "torch", torch.__version__, "cupy", cupy.__version__)'; } >"$OUT/env.txt" 2>&1
for stage in $stages; do
  start=$(date +%s)
  case $stage in
    tests)  # -v: a stage cut off by its limit still shows which test was running
      PYTHONFAULTHANDLER=1 timeout ${TESTS_LIMIT:-420} python3 -m pytest -v -rs --durations=15 --timeout=120 -p no:cacheprovider \
        >"$OUT/gpu_tests.txt" 2>&1 ;;
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
    sanitize) bash "$0" memcheck kernelcheck ;;
    memcheck|memcheck-all)  # every GPU test file under memcheck, each log naming the files and tests it covered
      bash benchmarks/memcheck_gpu_tests.sh ${MEMCHECK_CHUNKS:-4} ${RUN_CHUNKS:-} | tee -a "$OUT/env.txt" ;;
    debugmalloc)  # the GPU suite with fresh allocations filled with 0xCD: struct fields never set show up
      PYTHONMALLOC=debug PYTHONFAULTHANDLER=1 timeout 400 python3 -m pytest -q -rs -m gpu --timeout=150 -p no:cacheprovider \
        >"$OUT/gpu_tests_debugmalloc.txt" 2>&1 ;;
    bitecheck)  # the known bugs put back (the mutations of benchmarks/mutations/): each case's tests must
      # fail. BITE_MODULES picks modules; BITE_ARGS passes more (--gpu: only the cases needing the device)
      timeout ${BITE_LIMIT:-500} python3 benchmarks/bite_check.py --out "$OUT" ${BITE_MODULES:+--module $BITE_MODULES} \
        ${BITE_ARGS:-} >"$OUT/bite_check.log" 2>&1 ;;
    kernelcheck)  # every kernel form at odd sizes under all four tools
      for tool in memcheck racecheck synccheck initcheck; do
        timeout 150 compute-sanitizer --tool $tool python3 benchmarks/sanitize_kernels.py >"$OUT/sanitize_$tool.txt" 2>&1
        echo "  $tool: rc=$? $(grep -h 'ERROR SUMMARY' "$OUT/sanitize_$tool.txt" | tail -1)" | tee -a "$OUT/env.txt"
      done ;;
    torchprobe) timeout 60 python3 benchmarks/probes/torch_graph.py >"$OUT/probe_torch_graph.txt" 2>&1 ;;
    buckets) timeout 200 python3 -m rawgraph.bench.buckets --out "$OUT" >"$OUT/buckets.log" 2>&1 ;;
    slots) timeout 300 python3 -m rawgraph.bench.slots --out "$OUT" >"$OUT/slots.log" 2>&1 ;;
    kernels1024)  # every cut of the w1024 products at the batch sizes continuous batching visits
      timeout 200 python3 -m rawgraph.bench.kernel_times --sweep --width 1024 --batch 72 96 128 192 256 --out "$OUT/w1024" \
        >"$OUT/kernel_1024.log" 2>&1 ;;
    devlaunch) timeout 120 python3 -m rawgraph.bench.device_launch --out "$OUT" >"$OUT/device_launch.log" 2>&1 ;;
    control) timeout 150 python3 -m rawgraph.bench.control --out "$OUT" >"$OUT/control.log" 2>&1 ;;
    forkjoin) timeout 120 python3 -m rawgraph.bench.forkjoin --out "$OUT" >"$OUT/forkjoin.log" 2>&1 ;;
    rebindpaths)  # the torch_graph_rebind row beside torch_graph_copy, w128, one layer
      timeout 300 python3 -m rawgraph bench paths --quick --no-micro --layers 1 --width 128 --batch 1 8 \
        --name launch_paths_rebind --out "$OUT" >"$OUT/launch_rebind.log" 2>&1 ;;
    newtests)  # only the test files added since the last full run
      PYTHONFAULTHANDLER=1 timeout 200 python3 -m pytest -q -rs --timeout=60 -p no:cacheprovider $NEW_TESTS \
        >"$OUT/gpu_new_tests.txt" 2>&1 ;;
    regress)  # no-regression check of a redesign: w128 b1, one layer, the tree at $OLD_TREE (an older
      # checkout, e.g. git archive of the base commit, carried) and this one, in the order
      # old new new old ... (pairs side by side, a steady drift cancels), then the paired table
      order=()
      for t in ${REGRESS_RUNS:-old new new old old new new old old new new old}; do
        if [ $t = old ]; then d=${OLD_TREE:?set OLD_TREE}; c=${OLD_COMMIT:-old}; else d=$(pwd); c=$RAWGRAPH_COMMIT; fi
        n=$(ls -d /tmp/paths_$t* 2>/dev/null | wc -l)
        (cd "$d" && RAWGRAPH_COMMIT=$c PYTHONPATH=$(pwd) timeout ${REGRESS_LIMIT:-90} python3 -m rawgraph.bench.launch_paths \
          --quick --layers 1 --width 128 --batch 1 --no-cupy --out /tmp/paths_$t$n --name paths) >"$OUT/paths_$t$n.log" 2>&1
        rc=$?; echo "  regress $t$n: rc=$rc" | tee -a "$OUT/env.txt"
        [ $rc = 0 ] && order+=("$t=/tmp/paths_$t$n/paths.json")
      done
      cp /tmp/paths_new0/paths.json "$OUT/launch_paths_w128_new.json" 2>/dev/null
      cp /tmp/paths_old0/paths.json "$OUT/launch_paths_w128_old.json" 2>/dev/null
      python3 benchmarks/compare_paths.py "${order[@]}" --json "$OUT/compare_paths.json" >"$OUT/compare_paths.txt" 2>&1 ;;
    gemmquick)  # issue 23's fp32 GEMM candidates at six shapes against the current cut and cuBLAS
      timeout ${GEMM_LIMIT:-120} python3 benchmarks/gemm_sweep.py --quick --out /tmp/gemm >"$OUT/gemm.log" 2>&1
      cp /tmp/gemm/gemm_sweep.json "$OUT/" 2>/dev/null ;;
    pack)  # everything under $OUT as one archive (the device tool brings back at most 8 files)
      tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/" ;;
    soak) timeout 420 python3 benchmarks/soak.py --out "$OUT" >"$OUT/soak.log" 2>&1 ;;
    probes) for p in benchmarks/probes/*.py; do
        timeout 120 python3 "$p" >"$OUT/probe_$(basename "$p" .py).txt" 2>&1; echo "  probe $p: rc=$?" | tee -a "$OUT/env.txt"
      done ;;
  esac
  echo "stage $stage: rc=$? $(( $(date +%s) - start )) s" | tee -a "$OUT/env.txt"
done
tail -3 "$OUT/gpu_tests.txt" "$OUT/gpu_new_tests.txt" "$OUT/gpu_tests_debugmalloc.txt" 2>/dev/null
tail -2 "$OUT/bite_check.log" 2>/dev/null
grep -h "ERROR SUMMARY" "$OUT"/sanitize_*.txt 2>/dev/null
grep -E "MISSED|met|FAILED|Error|error" "$OUT"/*.log 2>/dev/null | head -40
