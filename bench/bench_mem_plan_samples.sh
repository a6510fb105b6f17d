#!/bin/bash
# The memory plan with --sample-prompts against measured peak RSS (run by
# hand, not in ctest): SD 1.5's UNet at half width (bench_mem_plan.sh's
# sd15_half, random weights from --unet-config) trained one step at
# 256x256, batch 1, AdamW, on a generated shard, and sampled at the end
# with SD 1.5's VAE decoder at full size (random weights, diffusers'
# AutoencoderKL defaults for SD) and a one-layer 768-wide text encoder:
# one line at 512x512 and at 768x768, CFG 7 (a guidance batch of 2), one
# DPM++ 2M step. For each: --memory-plan's total and its samples part,
# the peak RSS of a run without samples and of one with them (/usr/bin/time
# -v), and plan / measured. Needs torch + diffusers + transformers (PYTHON)
# to make the model, about 5 GB of memory and a few minutes on 2 cores.
# Results: bench/RESULTS.md, "Memory plan with samples".
# usage: bench/bench_mem_plan_samples.sh BUILD_DIR [THREADS]
#        (a Release build with sd-train and bench_mem_shard)
set -eu
B=$(realpath "${1:-build}")
TH=${2:-2}
PY=${PYTHON:-python3}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat > "$T/sd15_half.json" << 'JSON'
{"_class_name": "UNet2DConditionModel", "in_channels": 4, "out_channels": 4, "sample_size": 32,
 "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "cross_attention_dim": 768,
 "attention_head_dim": 8, "norm_num_groups": 32,
 "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]}
JSON
"$PY" - "$T/model" "$HERE/../tests/golden/tokenizer" << 'PY'
import gzip, json, os, sys
import torch
from diffusers import AutoencoderKL
from transformers import CLIPTextConfig, CLIPTextModel
d, tokdir = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2, down_block_types=("DownEncoderBlock2D",) * 4,
              up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32, latent_channels=4, sample_size=512,
              scaling_factor=0.18215).save_pretrained(os.path.join(d, "vae"), safe_serialization=True)
CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=1,
                             num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                             bos_token_id=0, eos_token_id=2, pad_token_id=1)).save_pretrained(
    os.path.join(d, "text_encoder"), safe_serialization=True)
os.makedirs(os.path.join(d, "tokenizer"))
for n in ("vocab.json", "merges.txt"):
    with gzip.open(os.path.join(tokdir, n + ".gz"), "rb") as f, open(os.path.join(d, "tokenizer", n), "wb") as g:
        g.write(f.read())
with open(os.path.join(d, "tokenizer", "special_tokens_map.json"), "w") as f:
    json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>"}, f)
PY
"$B/bench/bench_mem_shard" "$T/mid.shard" 256 256 768 0 4
echo "memory plan with samples vs peak RSS, $TH threads; CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
COMMON=(--unet-config "$T/sd15_half.json" -j "$TH" --steps 1 --sample-model "$T/model")
total() { python3 -c 'import json, sys; p = json.load(sys.stdin); print(p["total"], p["samples"])'; }
peak() { echo $(( $(sed -n 's/.*Maximum resident set size (kbytes): //p' "$1") * 1024 )); }
read -r plan0 _ < <("$B/tools/sd-train" "${COMMON[@]}" --memory-plan "$T/mid.shard" | total)
/usr/bin/time -v -o "$T/time0" "$B/tools/sd-train" "${COMMON[@]}" -o "$T/out0" -q "$T/mid.shard"
rss0=$(peak "$T/time0")
printf '| %-40s | %14s | %14s | %14s | %6s |\n' configuration "plan bytes" "of it samples" "peak RSS bytes" ratio
printf '| %-40s | %14d | %14d | %14d | %6.3f |\n' "no samples" "$plan0" 0 "$rss0" "$(python3 -c "print($plan0 / $rss0)")"
for s in 512 768; do
    echo "{\"prompt\": \"a photo\", \"negative\": \"blurry\", \"steps\": 1, \"width\": $s, \"height\": $s}" > "$T/p$s.jsonl"
    read -r plan samples < <("$B/tools/sd-train" "${COMMON[@]}" --sample-prompts "$T/p$s.jsonl" --memory-plan \
                             "$T/mid.shard" | total)
    /usr/bin/time -v -o "$T/time$s" "$B/tools/sd-train" "${COMMON[@]}" --sample-prompts "$T/p$s.jsonl" \
        -o "$T/out$s" -q "$T/mid.shard"
    rss=$(peak "$T/time$s")
    printf '| %-40s | %14d | %14d | %14d | %6.3f |\n' "samples at ${s}x${s}, CFG 7" "$plan" "$samples" "$rss" \
        "$(python3 -c "print($plan / $rss)")"
    echo "  plan without the samples part / measured: $(python3 -c "print(round(($plan - $samples) / $rss, 3))")"
done
