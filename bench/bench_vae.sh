#!/bin/bash
# VAE encode benchmark (run by hand, not in ctest): the real SD VAE
# architecture with random weights (the same file for both), one 512x512
# image, sdtk's CPU engine vs PyTorch CPU fp32 in the same run on 1 and 2
# threads; then the max abs difference of the two means (a sanity check
# that both computed the same function).
# usage: bench/bench_vae.sh BUILD_DIR [REPS]   (after building bench_vae in a
#        Release build; needs python3 with torch + diffusers from PyPI)
# Results: bench/RESULTS.md, "VAE encode (CPU)".
set -eu
B=$(realpath "${1:-build}")
REPS=${2:-3}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$HERE/bench_vae.py" make "$T"
echo "VAE encoder, SD architecture, 512x512, $REPS timed runs each; CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for th in 1 2; do
    python3 "$HERE/bench_vae.py" time "$T" "$th" "$REPS" | tee "$T/torch$th.txt"
    "$B/bench/bench_vae" "$T/vae" "$T/x.f32" 512 512 "$th" "$REPS" "$T/sdtk_mean.f32" | tee "$T/sdtk$th.txt"
    python3 - "$T/torch$th.txt" "$T/sdtk$th.txt" "$T/torch_mean.f32" "$T/sdtk_mean.f32" << 'PY'
import re, sys
import numpy as np
tb = float(re.search(r"best ([\d.]+)", open(sys.argv[1]).read()).group(1))
sb = float(re.search(r"best ([\d.]+)", open(sys.argv[2]).read()).group(1))
a, b = np.fromfile(sys.argv[3], np.float32), np.fromfile(sys.argv[4], np.float32)
print("  ratio sdtk/pytorch speed (best of each): %.2fx   max |mean diff| %.2e (mean |value| %.2e)"
      % (tb / sb, np.abs(a - b).max(), np.abs(a).mean()))
PY
done
