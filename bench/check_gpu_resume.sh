#!/bin/bash
# sd-train on a GPU, repeatability and resume (run by hand on a machine with
# an NVIDIA GPU; docs/GPU.md): a tiny UNet (CONFIG) trained STEPS steps on
# SHARD on cuda:0 twice, then once killed with SIGKILL midway and resumed
# from its last checkpoint; the final weights of the three compared bit for
# bit (cmp of the checkpoints' safetensors); and a run whose gradient sums go
# through NCCL in a world of one (--nccl) against the plain run.
# usage: bench/check_gpu_resume.sh BUILD_DIR SHARD CONFIG [STEPS]
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
    "$B/tools/sd-train" --device cuda:0 --unet-config "$CONFIG" -o "$d" --steps "$STEPS" --batch 2 --lr 1e-3 \
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
cmp -s "$T/a/$f" "$T/b/$f" && echo "two uninterrupted cuda:0 runs: final weights bit-identical" ||
    echo "two uninterrupted cuda:0 runs: final weights DIFFER"
cmp -s "$T/a/$f" "$T/c/$f" && echo "killed + resumed vs uninterrupted: final weights bit-identical" ||
    echo "killed + resumed vs uninterrupted: final weights DIFFER"
if run "$T/n" --nccl 2> "$T/n.log"; then
    cmp -s "$T/a/$f" "$T/n/$f" && echo "--nccl (world of one) vs plain: final weights bit-identical" ||
        echo "--nccl (world of one) vs plain: final weights DIFFER"
else
    echo "--nccl run failed: $(tail -2 "$T/n.log")"
fi
