#!/bin/bash
# Build sdtk (optimised) and run the example pipeline on the bundled example
# data (examples/Makefile): sd-meta -> sd-bucket -> per-GPU parts ->
# sd-latents (one shard per part, with text embeddings) -> sd-verify ->
# sd-train (a tiny UNet, 300 steps; checks the loss falls and the checkpoint loads).
# Usage: scripts/example.sh [make arguments, e.g. -j2 PARTS=4]
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSDTK_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)"
make -C examples "$@"
