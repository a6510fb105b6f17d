#!/bin/bash
# Build everything with warnings as errors under AddressSanitizer + UBSan and
# run the whole test suite (unit, end-to-end on real photos, fuzz replays).
# Usage: scripts/test.sh        (run from anywhere; installs missing packages as root)
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/photos.sh build-test/photos
# where nvcc is installed (CI) the CUDA backend must build: a missing cuBLAS/cuDNN is an error, not a skip
cuda=AUTO
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Debug -DSDTK_WERROR=ON -DSDTK_SANITIZE=ON -DSDTK_CUDA=$cuda >/dev/null
cmake --build build-test -j "$(nproc)"
export SDTK_PHOTOS="$PWD/build-test/photos"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd build-test && ctest --output-on-failure -j "$(nproc)"
