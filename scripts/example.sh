#!/bin/bash
# Build sdtk (optimised) and run the example pipeline on the bundled example
# data (examples/Makefile): sd-meta -> sd-bucket -> per-GPU parts ->
# sd-latents (one shard per part) -> sd-verify.
# Usage: scripts/example.sh [make arguments, e.g. -j2 PARTS=4]
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSDTK_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)"
make -C examples "$@"
