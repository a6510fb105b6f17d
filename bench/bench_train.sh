#!/bin/bash
# UNet training-step benchmark (run by hand, not in ctest): one step
# (forward + MSE + backward + clipping + AdamW) of the real-size SD 1.5 UNet
# at 64x64 latents, batch 1, 77 text tokens, random weights (the same file
# for both), sdtk's trainer vs PyTorch CPU fp32 eager (diffusers
# UNet2DConditionModel + torch.optim.AdamW) in the same run, one process at
# a time; then where sdtk's time goes per op class (conv, attention, linear,
# norm, elementwise, optimizer; bench_train times each backend call). The
# warm-up losses of both must agree (same weights, inputs and timestep).
# Each process needs about 16 GB of memory (weights, gradients, two AdamW
# moments: 4 x 3.4 GB, plus activations).
# Results: bench/RESULTS.md, "Training step (CPU)".
# usage: bench/bench_train.sh BUILD_DIR [THREADS] [STEPS] [ROUNDS] [MODE]
#        (after building bench_train in a Release build; needs python3 with
#        torch + diffusers). ROUNDS (default 1) alternates PyTorch and sdtk
#        that many times and takes each side's best step over all rounds, so
#        a busy spell on a shared machine does not hit one side only. MODE is
#        bench_train's device string, e.g. cpu:ckpt for gradient
#        checkpointing (default cpu).
set -eu
B=$(realpath "${1:-build}")
TH=${2:-$(nproc)}
STEPS=${3:-2}
ROUNDS=${4:-1}
MODE=${5:-cpu}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$HERE/bench_train.py" make "$T"
echo "UNet training step, SD 1.5 architecture, 64x64 latents, batch 1, $TH threads, best of $STEPS after a warm-up, $ROUNDS round(s), sdtk $MODE; CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r: load average $(cut -d' ' -f1-3 /proc/loadavg)"
    python3 "$HERE/bench_train.py" time "$T" "$TH" "$STEPS" | tee "$T/torch$r.txt"
    "$B/bench/bench_train" "$T/unet" "$T/x0.f32" "$T/noise.f32" "$T/ctx.f32" 64 64 77 "$TH" "$STEPS" "$MODE" |
        tee "$T/sdtk$r.txt"
done
python3 - "$T" "$ROUNDS" << 'PY'
import re, sys
T, rounds = sys.argv[1], int(sys.argv[2])
tt = [open("%s/torch%d.txt" % (T, r)).read() for r in range(1, rounds + 1)]
st = [open("%s/sdtk%d.txt" % (T, r)).read() for r in range(1, rounds + 1)]
tb = min(float(re.search(r"pytorch best ([\d.]+)", t).group(1)) for t in tt)
sb = min(float(re.search(r"sdtk best ([\d.]+)", s).group(1)) for s in st)
tl = float(re.search(r"warm-up\): .*loss ([\d.]+)", tt[0]).group(1))
sl = float(re.search(r"sdtk warm-up loss ([\d.]+)", st[0]).group(1))
print("pytorch best %.3f s, sdtk best %.3f s over %d round(s)" % (tb, sb, rounds))
print("ratio sdtk/pytorch speed (best step of each): %.2fx   warm-up loss pytorch %.6f sdtk %.6f" % (tb / sb, tl, sl))
PY
