#!/usr/bin/env bash
# Build cutlass_simt.cu (see its header). CUTLASS_DIR: a CUTLASS checkout (its include/ is used);
# CUBLAS_DIR: holds include/cublas_v2.h and lib/libcublas.so.13 (e.g. the nvidia-cublas wheel's
# nvidia/cu13); OUT: the binary. Further arguments go to nvcc (e.g. -maxrregcount=202).
set -euo pipefail
CUTLASS_DIR=$1 CUBLAS_DIR=$2 OUT=$3; shift 3
NVCC=${NVCC:-nvcc}
"$NVCC" -std=c++17 -arch=sm_90 -O3 "$@" -I"$CUTLASS_DIR/include" -I"$CUBLAS_DIR/include" -L"$CUBLAS_DIR/lib" \
  -l:libcublas.so.13 -o "$OUT" "$(dirname "$0")/cutlass_simt.cu"
