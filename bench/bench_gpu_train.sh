#!/bin/bash
# sd-train on a GPU (run by hand on a machine with an NVIDIA GPU; docs/GPU.md):
# 1. the same run on the CPU and on cuda:0 — a tiny UNet (CONFIG) trained
#    STEPS steps from scratch on SHARD with the same seed — compared step by
#    step (loss) and at the end (every weight); with MP=bf16 the GPU run
#    is in mixed precision (sd-train --mixed-precision bf16);
# 2. one training step of the real-size SD 1.5 UNet (random weights, 64x64
#    latents, batch 1) on the GPU, sdtk vs PyTorch eager (diffusers) in the
#    same run, strict fp32, TF32 and bf16 mixed precision (MODES, default
#    all three; PyTorch under torch.autocast for bf16); sdtk with attention
#    through cuBLAS (the default) and on its flash kernel (--attn-flash).
#    BENCH_BATCH=8 times batches of 8, as both bench_train and
#    bench_train.py read it.
# Results: bench/RESULTS.md, "GPU (H100)".
# usage: bench/bench_gpu_train.sh BUILD_DIR SHARD CONFIG [STEPS]   (python3
#        with torch, diffusers, numpy, safetensors)
set -u
B=$(realpath "${1:-build}")
SHARD=$2
CONFIG=$3
STEPS=${4:-40}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "== sd-train, tiny UNet ($CONFIG), $STEPS steps on $SHARD: CPU vs cuda:0${MP:+ (mixed precision $MP)}"
for dev in cpu cuda:0; do
    d=$T/run-${dev%%:*}
    t0=$(date +%s%N)
    "$B/tools/sd-train" --device $dev $([ $dev != cpu ] && [ -n "${MP:-}" ] && echo --mixed-precision $MP) \
        --unet-config "$CONFIG" -o "$d" \
        --steps "$STEPS" --batch 2 --lr 1e-3 --seed 3 --init-seed 1 --metrics "$d.jsonl" -q "$SHARD" || echo "$dev: sd-train failed"
    echo "$dev: $(( ($(date +%s%N) - t0) / 1000000 )) ms wall"
done
python3 - "$T" "$STEPS" << 'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file
t, steps = sys.argv[1], sys.argv[2]
try:
    a = [json.loads(l)["loss"] for l in open(t + "/run-cpu.jsonl")]
    b = [json.loads(l)["loss"] for l in open(t + "/run-cuda.jsonl")]
    d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print("losses: %d steps each, first %.6f / %.6f, last %.6f / %.6f (cpu / cuda), max relative difference %.2e"
          % (len(a), a[0], b[0], a[-1], b[-1], d))
    f = "/checkpoint-%s/unet/diffusion_pytorch_model.safetensors" % steps
    wa, wb = load_file(t + "/run-cpu" + f), load_file(t + "/run-cuda" + f)
    e = max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)
    m = max(float(np.abs(wa[k]).max()) for k in wa)
    print("final weights: %d tensors, max |cpu - cuda| %.2e (max |w| %.2e)" % (len(wa), e, m))
except Exception as ex:
    print("no comparison:", ex)
PY
echo "== one training step, SD 1.5 UNet, 64x64, batch ${BENCH_BATCH:-1}: sdtk vs PyTorch on cuda:0"
python3 "$HERE/bench_train.py" make "$T" || exit 1
for mode in ${MODES:-strict tf32 bf16}; do
    dev=cuda:0
    [ $mode != strict ] && dev=cuda:0:$mode
    python3 "$HERE/bench_train.py" time "$T" 1 5 cuda $([ $mode != strict ] && echo $mode) | tee "$T/torch.txt"
    "$B/bench/bench_train" "$T/unet" "$T/x0.f32" "$T/noise.f32" "$T/ctx.f32" 64 64 77 16 5 $dev | tee "$T/sdtk.txt"
    # the same with attention on the flash kernel (sd-train --attn-flash)
    fdev=$dev:flash
    [ $mode != strict ] && fdev=$dev+flash
    "$B/bench/bench_train" "$T/unet" "$T/x0.f32" "$T/noise.f32" "$T/ctx.f32" 64 64 77 16 5 $fdev | tee "$T/sdtk_flash.txt"
    for f in sdtk sdtk_flash; do
    echo "  $f:"
    python3 - "$T/torch.txt" "$T/$f.txt" << 'PY'
import re, sys
try:
    tt, st = open(sys.argv[1]).read(), open(sys.argv[2]).read()
    tb = float(re.search(r"pytorch best ([\d.]+)", tt).group(1))
    sb = float(re.search(r"sdtk best ([\d.]+)", st).group(1))
    tf = min(float(x) for x in re.findall(r"pytorch step [1-9]\d*: [\d.]+ s \(forward\+backward ([\d.]+)", tt))
    sf = min(float(x) for x in re.findall(r"sdtk step [1-9]\d*: [\d.]+ s \(forward\+backward ([\d.]+)", st))
    tl = float(re.search(r"warm-up\): .*loss ([\d.]+)", tt).group(1))
    sl = float(re.search(r"sdtk warm-up loss ([\d.]+)", st).group(1))
    print("  sdtk/pytorch speed: whole step %.2fx, forward+backward %.2fx (%.3f vs %.3f s); warm-up loss %.6f vs %.6f"
          % (tb / sb, tf / sf, sf, tf, sl, tl))
except Exception as e:
    print("  no comparison:", e)
PY
    done
done
