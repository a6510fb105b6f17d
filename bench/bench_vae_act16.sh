#!/bin/bash
# 16-bit VAE activations (run by hand, not in ctest): the SD VAE encoder
# architecture with seeded random weights (bench_vae "random", no PyTorch
# needed), one 512x512 image, sdtk with fp32, bf16 and fp16 activation
# storage in the same run on 1 and 2 threads: seconds (best and median of
# REPS), the encoder's scratch (workspace) and the process's peak memory,
# then each 16-bit mode's latent mean against fp32's (max and mean abs
# difference, relative to the largest value).
# usage: bench/bench_vae_act16.sh BUILD_DIR [REPS]   (Release build with bench_vae)
# Results: bench/RESULTS.md, "VAE encode (CPU)".
set -eu
B=$(realpath "${1:-build}")
REPS=${2:-3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "VAE encoder, SD architecture (random weights), 512x512, $REPS timed runs each; CPU: $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for th in 1 2; do
    for mode in cpu cpu:bf16act cpu:fp16act; do
        tag=$(echo "$mode" | tr : _)
        /usr/bin/time -f "  peak memory %M KB" "$B/bench/bench_vae" random random 512 512 "$th" "$REPS" \
            "$T/$tag.f32" "$mode" 2>&1 | tee "$T/$tag-$th.txt"
    done
    python3 - "$T" "$th" << 'PY'
import re, sys
import numpy as np
d, th = sys.argv[1], sys.argv[2]
def med(tag):
    return float(re.search(r"median ([\d.]+)", open("%s/%s-%s.txt" % (d, tag, th)).read()).group(1))
a = np.fromfile(d + "/cpu.f32", np.float32)
for tag in ("cpu_bf16act", "cpu_fp16act"):
    b = np.fromfile("%s/%s.f32" % (d, tag), np.float32)
    print("  %s vs fp32, %s thread(s): median time %.2fx of fp32's; mean max |diff| %.2e (%.2e of max |value| %.2e), "
          "average |diff| %.2e (average |value| %.2e)" % (tag[4:], th, med(tag) / med("cpu"), np.abs(a - b).max(),
          np.abs(a - b).max() / np.abs(a).max(), np.abs(a).max(), np.abs(a - b).mean(), np.abs(a).mean()))
PY
done
