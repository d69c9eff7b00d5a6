#!/usr/bin/env bash
# The CPU tests under the oldest NVRTC the package accepts (pyproject: cuda-toolkit[nvrtc] >= 13.0),
# which is also the device's: a kernel that only a newer NVRTC compiles fails here, not on the GPU.
# Fetches nvidia-cuda-nvrtc's wheel (PyPI) into a temporary folder and preloads its libnvrtc, so
# cuda.bindings.nvrtc uses it in place of the installed one. The tests that build host programs
# with AddressSanitizer (the emulators) are left out: ASan refuses a preloaded library.
#
#   bash benchmarks/nvrtc_floor.sh                 # every CPU test (about 8 minutes here)
#   bash benchmarks/nvrtc_floor.sh tests/test_tf32x3_wgmma_cpu.py
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${NVRTC_FLOOR:-13.0.88}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir" "nvidia-cuda-nvrtc==$VERSION"
(cd "$dir" && python3 -m zipfile -e ./*.whl .)
lib=$(dirname "$(find "$dir" -name 'libnvrtc.so.*' | head -1)")
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LD_PRELOAD=$lib/libnvrtc.so.13
export RAWGRAPH_CACHE_DIR=$dir/cache
python3 -c "from cuda.bindings import nvrtc; print('NVRTC', *nvrtc.nvrtcVersion()[1:])"
python3 -m pytest -q -p no:cacheprovider -k "not emulat and not sdist and not wheel and not docs_build and not typing" \
  "${@:-tests}"
