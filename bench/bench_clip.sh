#!/bin/bash
# CLIP text encoding benchmark (run by hand, not in ctest): the real CLIP
# ViT-L/14 text encoder architecture (SD 1.x's text_encoder) with random
# weights (the same file for both), a batch of N 77-token captions, sdtk's
# CPU engine vs PyTorch CPU fp32 in the same run on 1 and 2 threads, in
# captions/s (wall time, and per CPU-second of the process: the steadier
# figure on a shared VM); PyTorch also one caption per call. sdtk runs up to
# 8 captions through the model together (SD_CLIP_BATCH; its linear gives a
# row the same bits whatever the row count, so a caption's embedding never
# depends on its batch). Then the max abs difference of the two hidden states
# (a sanity check that both computed the same function).
# Results: bench/RESULTS.md, "CLIP text encoder (CPU)".
# ROUNDS > 1 alternates the two sides that many times per thread count (the
# VM's load drifts over a minute; a ratio taken within one round is steadier)
# and ends with every round's ratio and their median.
# usage: bench/bench_clip.sh BUILD_DIR [N] [REPS] [ROUNDS]   (after building
#        bench_clip in a Release build; needs python3 with torch + transformers)
set -eu
B=$(realpath "${1:-build}")
N=${2:-16}
REPS=${3:-3}
ROUNDS=${4:-1}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$HERE/bench_clip.py" make "$T" "$N"
echo "CLIP ViT-L/14 text encoder, $N captions x 77 tokens, $REPS timed runs each; CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for th in 1 2; do
  for round in $(seq "$ROUNDS"); do
    [ "$ROUNDS" -gt 1 ] && echo "round $round/$ROUNDS, $th thread(s), load $(cut -d' ' -f1 /proc/loadavg)"
    python3 "$HERE/bench_clip.py" time "$T" "$N" "$th" "$REPS" | tee "$T/torch$th.txt"
    "$B/bench/bench_clip" "$T" "$T/ids.i32" "$N" "$th" "$REPS" "$T/sdtk_hidden.f32" | tee "$T/sdtk$th.txt"
    python3 - "$T/torch$th.txt" "$T/sdtk$th.txt" "$T/torch_hidden.f32" "$T/sdtk_hidden.f32" "$T/ratios$th.txt" << 'PY'
import re, sys
import numpy as np
tt, st = open(sys.argv[1]).read(), open(sys.argv[2]).read()
tb = float(re.search(r"best ([\d.]+)", tt).group(1))
sb = float(re.search(r"best ([\d.]+)", st).group(1))
tc = float(re.search(r"cpu time best ([\d.]+)", tt).group(1))
sc = float(re.search(r"cpu time best ([\d.]+)", st).group(1))
a, b = np.fromfile(sys.argv[3], np.float32), np.fromfile(sys.argv[4], np.float32)
t1 = float(re.search(r"one caption per call: best ([\d.]+)", open(sys.argv[1]).read()).group(1))
print("  ratio sdtk/pytorch speed (best of each): %.2fx batched (%.2fx in cpu time), %.2fx one caption per call   "
      "max |hidden diff| %.2e (mean |value| %.2e)" % (tb / sb, tc / sc, t1 / sb, np.abs(a - b).max(), np.abs(a).mean()))
with open(sys.argv[5], "a") as f:
    f.write("%.4f %.4f\n" % (tb / sb, tc / sc))
PY
  done
  if [ "$ROUNDS" -gt 1 ]; then
    python3 - "$T/ratios$th.txt" "$th" << 'PY'
import statistics, sys
r = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
print("%s thread(s), %d rounds, sdtk/pytorch batched: %s; median %.2fx (cpu time median %.2fx)" % (
    sys.argv[2], len(r), " ".join("%.2fx" % w for w, _ in r), statistics.median(w for w, _ in r),
    statistics.median(c for _, c in r)))
PY
  fi
done
