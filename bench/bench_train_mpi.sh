#!/bin/bash
# sd-train data parallel on this machine's CPU: 2 ranks (mpirun, one thread
# each) against 1 process (one thread) with the same global batch (4 = 2 x 2
# ranks x 1 against 2 x 1 x accumulation 2), the tiny golden SD1 UNet on the
# generated test shard. Prints images/s of each, the scaling efficiency
# (2-rank images/s over twice the 1-process figure) and the gradient sum's
# share of rank 0's training time; then the same 2 ranks with --zero1 (the
# moments sharded: reduce-scatter + all-gather instead of the all-reduce).
# By hand, never in tests.
# Usage: bench/bench_train_mpi.sh [BUILD_DIR] [STEPS]
# Results: bench/RESULTS.md, "Data parallel (CPU)".
set -eu
build=${1:-build}
steps=${2:-60}
here=$(cd "$(dirname "$0")/.." && pwd)
command -v mpirun >/dev/null || { echo "bench_train_mpi: no mpirun (apt-get install openmpi-bin)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tests/test_train" --make-shard "$tmp/c.shard" >/dev/null
common=(--unet "$here/tests/golden/unet/sd1" --steps "$steps" --seed 1 --batch 2 -j 1 --fresh)
# the last progress line: "... X it/s  Y img/s ..."
rate() { grep '^step ' "$1" | tail -1 | sed -E 's/.* ([0-9.]+) it\/s +([0-9.]+) img\/s.*/\1 \2/'; }
"$build/tools/sd-train" "${common[@]}" --accum 2 -o "$tmp/one" "$tmp/c.shard" 2>"$tmp/one.log"
mpirun --oversubscribe --allow-run-as-root -np 2 "$build/tools/sd-train" "${common[@]}" --accum 1 -o "$tmp/two" \
  "$tmp/c.shard" 2>"$tmp/two.log"
mpirun --oversubscribe --allow-run-as-root -np 2 "$build/tools/sd-train" "${common[@]}" --accum 1 --zero1 \
  -o "$tmp/zero1" "$tmp/c.shard" 2>"$tmp/zero1.log"
read -r its1 img1 < <(rate "$tmp/one.log")
read -r its2 img2 < <(rate "$tmp/two.log")
read -r itsz imgz < <(rate "$tmp/zero1.log")
same=$(cmp -s "$tmp/two/checkpoint-$steps/unet/diffusion_pytorch_model.safetensors" \
  "$tmp/zero1/checkpoint-$steps/unet/diffusion_pytorch_model.safetensors" && echo "bit-identical" || echo "DIFFERENT")
red=$(sed -nE 's/.*gradient sum over 2 ranks: ([0-9.]+) s.*/\1/p' "$tmp/two.log")
echo "cpus: $(nproc); UNet: tests/golden/unet/sd1; global batch 4; $steps steps"
python3 - "$its1" "$img1" "$its2" "$img2" "$red" "$steps" <<'PY'
import sys
its1, img1, its2, img2, red, steps = map(float, sys.argv[1:])
loop2 = steps / its2
print("1 process, 1 thread:  %.2f steps/s  %.1f img/s" % (its1, img1))
print("2 ranks, 1 thread each: %.2f steps/s  %.1f img/s" % (its2, img2))
print("scaling efficiency: %.0f%% (2-rank img/s / (2 x 1-process img/s))" % (100 * img2 / (2 * img1)))
print("gradient sum on rank 0: %.3f s of %.2f s training (%.1f%%, waiting for the other rank included)" %
      (red, loop2, 100 * red / loop2))
PY
echo "2 ranks with --zero1: $imgz img/s; final weights vs plain 2 ranks: $same"
