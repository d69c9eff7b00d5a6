#!/usr/bin/env bash
# One device call that fits a session's few minutes: the whole GPU suite, the redesign's regress
# stage (OLD_TREE: a `git archive 66a84c8` carried as ../.snap_old), then the doctor, choose and
# buckets benchmarks and the quick GEMM sweep while BUDGET seconds last, everything packed.
# Run from a `git archive HEAD` copy (e.g. .snap, carried): RAWGRAPH_COMMIT=<hash> OUT=$OUT BUDGET=560 bash benchmarks/device_session.sh
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
export TESTS_LIMIT=${TESTS_LIMIT:-330}
bash benchmarks/device_run.sh tests >/dev/null 2>&1
echo "tests done at $(el)s"
grep -E " (FAILED|ERROR)" $OUT/gpu_tests.txt | head -40; tail -1 $OUT/gpu_tests.txt
if [ $(el) -lt 400 ]; then
  OLD_TREE=$(cd "${OLD_TREE:-../.snap_old}" && pwd) OLD_COMMIT=66a84c8 REGRESS_LIMIT=40 REGRESS_RUNS="old new old new" bash benchmarks/device_run.sh regress >/dev/null 2>&1
  grep -E "graph_update|manager_bind|graph |graph_indirect|torch_graph" $OUT/compare_paths.txt
fi
echo "regress done at $(el)s"
left=$(( ${BUDGET:-560} - $(el) ))
dl=$(( left < 60 ? left : 60 ))
if [ $left -gt 25 ]; then timeout $dl python3 -m rawgraph.bench.doctor --out $OUT >$OUT/doctor_bench.log 2>&1; echo "doctor bench rc=$? at $(el)s"; tail -15 $OUT/doctor_bench.log; fi
left=$(( ${BUDGET:-560} - $(el) ))
if [ $left -gt 50 ]; then timeout $(( left < 90 ? left : 90 )) python3 -m rawgraph.bench.choose --out $OUT >$OUT/choose.log 2>&1; echo "choose rc=$? at $(el)s"; tail -9 $OUT/choose.log; fi
left=$(( ${BUDGET:-560} - $(el) - 15 ))
if [ $left -gt 60 ]; then timeout $left python3 -m rawgraph.bench.buckets --out $OUT >$OUT/buckets.log 2>&1; echo "buckets rc=$? at $(el)s"; tail -30 $OUT/buckets.log; fi
left=$(( ${BUDGET:-560} - $(el) - 10 ))
if [ $left -gt 80 ]; then GEMM_LIMIT=$left bash benchmarks/device_run.sh gemmquick >/dev/null 2>&1; echo "gemmquick at $(el)s"; tail -14 $OUT/gemm.log; fi
bash benchmarks/device_run.sh pack >/dev/null 2>&1; echo "packed at $(el)s"
