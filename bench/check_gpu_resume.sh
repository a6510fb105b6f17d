#!/bin/bash
# sd-train on a GPU, repeatability and resume (run by hand on a machine with
# an NVIDIA GPU; docs/GPU.md): a tiny UNet (CONFIG) trained STEPS steps on
# SHARD on cuda:0 twice, then once killed with SIGKILL midway and resumed
# from its last checkpoint; the final weights of the three compared bit for
# bit (cmp of the checkpoints' safetensors); and a run whose gradient sums go
# through NCCL in a world of one (--nccl) against the plain run.
# usage: bench/check_gpu_resume.sh BUILD_DIR SHARD CONFIG [STEPS]
#        (DEV=cpu runs the same checks on the CPU, a check of the script)
# Results: bench/RESULTS.md, "GPU (H100)".
set -u
B=$(realpath "${1:-build}")
SHARD=$2
CONFIG=$3
STEPS=${4:-60}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
run() { # DIR [extra options]
    local d=$1
    shift
    "$B/tools/sd-train" --device "${DEV:-cuda:0}" --unet-config "$CONFIG" -o "$d" --steps "$STEPS" --batch 2 --lr 1e-3 \
        --seed 3 --init-seed 1 --save-every 5 --keep 0 -q "$@" "$SHARD"
}
run "$T/a" && run "$T/b" || { echo "sd-train failed"; exit 1; }
run "$T/c" &
pid=$!
while [ ! -e "$T/c/checkpoint-$((STEPS / 2))" ] && kill -0 $pid 2> /dev/null; do sleep 0.05; done
kill -9 $pid 2> /dev/null
wait $pid 2> /dev/null
last=$(cat "$T/c/latest" 2> /dev/null)
echo "killed at checkpoint ${last:-none} of $STEPS steps"
run "$T/c" || { echo "resume failed"; exit 1; }
f=checkpoint-$STEPS/unet/diffusion_pytorch_model.safetensors
cmp -s "$T/a/$f" "$T/b/$f" && echo "two uninterrupted ${DEV:-cuda:0} runs: final weights bit-identical" ||
    echo "two uninterrupted ${DEV:-cuda:0} runs: final weights DIFFER"
cmp -s "$T/a/$f" "$T/c/$f" && echo "killed + resumed vs uninterrupted: final weights bit-identical" ||
    echo "killed + resumed vs uninterrupted: final weights DIFFER"
if run "$T/n" --nccl 2> "$T/n.log"; then
    cmp -s "$T/a/$f" "$T/n/$f" && echo "--nccl (world of one) vs plain: final weights bit-identical" ||
        echo "--nccl (world of one) vs plain: final weights DIFFER"
else
    echo "--nccl run failed: $(tail -2 "$T/n.log")"
fi
# gradient checkpointing recomputes each block's forward in the backward
# through the same device ops: the same weights bit for bit
run "$T/g" --gradient-checkpointing && cmp -s "$T/a/$f" "$T/g/$f" &&
    echo "--gradient-checkpointing vs plain: final weights bit-identical" ||
    echo "--gradient-checkpointing vs plain: final weights DIFFER (or the run failed)"
# the EMA kept in host memory (--ema-on-cpu) against the EMA on the device:
# the trained weights must not change; the EMAs differ by the rounding of
# the host's and the device's update formula at most
e=checkpoint-$STEPS/unet_ema/diffusion_pytorch_model.safetensors
if run "$T/e" --ema-decay 0.9 && run "$T/h" --ema-decay 0.9 --ema-on-cpu; then
    cmp -s "$T/e/$f" "$T/h/$f" && echo "--ema-on-cpu vs EMA on the device: trained weights bit-identical" ||
        echo "--ema-on-cpu vs EMA on the device: trained weights DIFFER"
    python3 - "$T/e/$e" "$T/h/$e" "$T/e/$f" << 'PY'
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
a, c, w = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
d = max(float(np.abs(a[k].astype(np.float64) - c[k]).max()) for k in a)
m = max(float(np.abs(a[k]).max()) for k in a)
far = max(float(np.abs(a[k].astype(np.float64) - w[k]).max()) for k in a)
print("--ema-on-cpu vs EMA on the device: EMA weights max |diff| %.3e (max |ema| %.3e; EMA vs trained weights %.3e)"
      % (d, m, far))
PY
else
    echo "an EMA run failed"
fi
