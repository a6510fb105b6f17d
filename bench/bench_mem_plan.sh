#!/bin/bash
# Memory plan against measured peak RSS (run by hand, not in ctest; issue 28):
# for each configuration, sd-train --memory-plan's total, then a real run of
# a few steps under /usr/bin/time -v and its maximum resident set size, and
# the ratio plan / measured (within 10% is the bar). Models are random
# weights from --unet-config.
#
# PART small: the tiny golden SD1 UNet at 512x512 (64x64 latents) batch 2,
# and SD 1.5's architecture at half width (block_out_channels 128, 256, 512,
# 512; cross_attention_dim 768; 142M parameters) at 256x256 (32x32 latents)
# with AdamW, AdamW + EMA, 8-bit AdamW, and Adafactor with gradient
# checkpointing, then AdamW, 8-bit AdamW and Adafactor (checkpointed) with
# --weight-dtype bf16, then AdamW and bf16 Adafactor with --fused-backward,
# then bf16 weights + 8-bit AdamW with --grad-dtype bf16;
# then the SDXL base UNet's plans at 1024x1024, batch 1, checkpointed, for
# adamw, adamw8bit and adafactor with fp32 and bf16 weights, and bf16
# weights with --fused-backward or with --grad-dtype bf16 (no weights are allocated for a plan;
# nothing is trained), and the GPU plan of AdamW against --gpu-memory-limit
# 24 (not measured: no GPU ran it). About 3 GB of memory, 3 minutes on 2
# cores.
#
# PART sdxl: issue 28's three configurations of the real SDXL base UNet
# (diffusers' config, 2.57B parameters), batch 1, gradient checkpointing,
# SDXL-shaped embeddings (2048 + pooled 1280): (a) today's defaults (fp32
# weights, AdamW), (b) --weight-dtype bf16 --optimizer adamw8bit, the same
# with --fused-backward and with --grad-dtype bf16, and (c) --weight-dtype bf16 --optimizer adafactor
# --fused-backward. For each: the plan at 64x64 latents (512x512), one real
# step there under /usr/bin/time -v when the plan plus MARGIN_GIB (default
# 4) fits the host's MemAvailable at that moment (else "not run" with both
# figures: others on a shared machine keep their memory; (a), 39 GiB, and
# (b) without the fused backward, 20.2 GiB, need more than a 24 GiB host
# leaves), the ratio, and the plan at
# 128x128 (1024x1024) on the CPU and as it would be on a 24 GiB card: the
# CPU plan without the process, plus what a device plan adds for the same
# model and bucket (cuDNN's workspace cap for a 24 GiB card and the
# attention's score blocks: the fp32 AdamW GPU plan at --gpu-memory-limit
# 24 minus its CPU plan without the process), plus 1 GiB for the CUDA
# context, cuBLAS's and cuDNN's handles and the kernels, which no plan
# counts (docs/GPU.md counts the same 1 GiB for the VAE; `sd-train
# --memory-plan --device cuda:0 --gpu-memory-limit 24` now plans bf16
# weights and these optimizers directly, without a GPU: docs/GPU.md).
# Each real step takes about 2 minutes and 7 to 11 GiB at 2 threads and
# writes a 15 GB checkpoint into a temporary folder, removed after.
#
# PART all (the default): both. ONLY=TEXT runs only the SDXL configurations
# whose name contains TEXT (e.g. ONLY="bf16 gradients").
# Results: bench/RESULTS.md, "Memory plan"; the SDXL plans in docs/GPU.md.
# usage: [MARGIN_GIB=4] [ONLY=TEXT] bench/bench_mem_plan.sh BUILD_DIR [THREADS] [STEPS] [small|sdxl|all]
#        (after building sd-train and bench_mem_shard in a Release build)
set -eu
B=$(realpath "${1:-build}")
TH=${2:-2}
STEPS=${3:-2}
PART=${4:-all}
case $PART in small | sdxl | all) ;; *) echo "PART: small, sdxl or all, not '$PART'" >&2; exit 2 ;; esac
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
cat > "$T/sdxl.json" << 'JSON'
{"_class_name": "UNet2DConditionModel", "in_channels": 4, "out_channels": 4, "sample_size": 128,
 "block_out_channels": [320, 640, 1280], "layers_per_block": 2, "cross_attention_dim": 2048,
 "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
 "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
 "transformer_layers_per_block": [1, 2, 10], "attention_head_dim": [5, 10, 20], "use_linear_projection": true,
 "addition_embed_type": "text_time", "addition_time_embed_dim": 256, "projection_class_embeddings_input_dim": 2816,
 "norm_num_groups": 32}
JSON
gib() { python3 -c 'import json, sys
p = json.load(sys.stdin)
g = lambda k: "%.2f" % (p[k] / 2**30)
print(" ".join("%s %s" % (k, g(k)) for k in ("weights", "gradients", "optimizer", "activations", "workspace", "total")),
      "fits", p["fits"], "(%s %.1f GiB)" % (p["limit_from"], p["limit"] / 2**30))'; }
# The small configurations, measured, and the SDXL plans at 1024x1024.
small() {
    TINY="$HERE/../tests/golden/unet/sd1/unet/config.json"
    "$B/bench/bench_mem_shard" "$T/tiny.shard" 512 512 8 0 4
    "$B/bench/bench_mem_shard" "$T/mid.shard" 256 256 768 0 4
    "$B/bench/bench_mem_shard" "$T/xl.shard" 1024 1024 2048 1280 2
    echo "memory plan vs peak RSS, $TH threads, $STEPS steps; CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    printf '| %-44s | %14s | %14s | %6s |\n' configuration "plan bytes" "peak RSS bytes" ratio
    i=0
    measure() { # NAME CONFIG SHARD ARGS...
        local name=$1 cfg=$2 shard=$3
        shift 3
        i=$((i + 1))
        local plan rss
        plan=$("$B/tools/sd-train" --unet-config "$cfg" --memory-plan -j "$TH" "$@" "$shard" |
               python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])')
        /usr/bin/time -v -o "$T/time$i" "$B/tools/sd-train" --unet-config "$cfg" -o "$T/out$i" -j "$TH" -q \
            --steps "$STEPS" "$@" "$shard"
        rss=$(( $(sed -n 's/.*Maximum resident set size (kbytes): //p' "$T/time$i") * 1024 ))
        printf '| %-44s | %14d | %14d | %6.3f |\n' "$name" "$plan" "$rss" "$(python3 -c "print($plan / $rss)")"
    }
    measure "tiny SD1, 512^2, batch 2, adamw" "$TINY" "$T/tiny.shard" --batch 2
    measure "SD1.5 half width, 256^2, adamw" "$T/sd15_half.json" "$T/mid.shard"
    measure "SD1.5 half width, 256^2, adamw + EMA" "$T/sd15_half.json" "$T/mid.shard" --ema-decay 0.999
    measure "SD1.5 half width, 256^2, adamw8bit" "$T/sd15_half.json" "$T/mid.shard" --optimizer adamw8bit
    measure "SD1.5 half width, 256^2, adafactor, ckpt" "$T/sd15_half.json" "$T/mid.shard" --optimizer adafactor \
        --gradient-checkpointing
    measure "SD1.5 half width, 256^2, bf16 weights, adamw" "$T/sd15_half.json" "$T/mid.shard" --weight-dtype bf16
    measure "SD1.5 half width, 256^2, bf16 w, adamw8bit" "$T/sd15_half.json" "$T/mid.shard" --weight-dtype bf16 \
        --optimizer adamw8bit
    measure "SD1.5 half width, 256^2, bf16 w, adafactor, ckpt" "$T/sd15_half.json" "$T/mid.shard" --weight-dtype bf16 \
        --optimizer adafactor --gradient-checkpointing
    measure "SD1.5 half width, 256^2, adamw, fused" "$T/sd15_half.json" "$T/mid.shard" --fused-backward
    measure "SD1.5 half width, 256^2, bf16 w, adafactor, ckpt, fused" "$T/sd15_half.json" "$T/mid.shard" \
        --weight-dtype bf16 --optimizer adafactor --gradient-checkpointing --fused-backward
    measure "SD1.5 half width, 256^2, bf16 w, adamw8bit, bf16 grads" "$T/sd15_half.json" "$T/mid.shard" \
        --weight-dtype bf16 --optimizer adamw8bit --grad-dtype bf16
    echo
    echo "SDXL base UNet, 1024x1024 (128x128 latents), batch 1, gradient checkpointing: plans only (GiB)"
    for wd in fp32 bf16; do
        for opt in adamw adamw8bit adafactor; do
            echo -n "cpu $opt, --weight-dtype $wd: "
            "$B/tools/sd-train" --unet-config "$T/sdxl.json" --memory-plan --gradient-checkpointing --optimizer "$opt" \
                --weight-dtype "$wd" -j "$TH" "$T/xl.shard" | gib
        done
    done
    for opt in adamw8bit adafactor; do
        echo -n "cpu $opt, --weight-dtype bf16, --fused-backward: "
        "$B/tools/sd-train" --unet-config "$T/sdxl.json" --memory-plan --gradient-checkpointing --optimizer "$opt" \
            --weight-dtype bf16 --fused-backward -j "$TH" "$T/xl.shard" | gib
    done
    for opt in adamw8bit adafactor; do
        echo -n "cpu $opt, --weight-dtype bf16, --grad-dtype bf16: "
        "$B/tools/sd-train" --unet-config "$T/sdxl.json" --memory-plan --gradient-checkpointing --optimizer "$opt" \
            --weight-dtype bf16 --grad-dtype bf16 -j "$TH" "$T/xl.shard" | gib
    done
    for mom in fp32 bf16; do
        echo -n "cuda:0 adamw, --adam-moments $mom, --gpu-memory-limit 24: "
        "$B/tools/sd-train" --unet-config "$T/sdxl.json" --memory-plan --gradient-checkpointing --device cuda:0 \
            --gpu-memory-limit 24 --adam-moments "$mom" "$T/xl.shard" | gib
    done
}

# The plan's total in bytes for an SDXL configuration: CONFIG SHARD ARGS...
total_of() {
    local cfg=$1 shard=$2
    shift 2
    "$B/tools/sd-train" --unet-config "$cfg" --memory-plan --gradient-checkpointing -j "$TH" "$@" "$shard" |
        python3 -c 'import json, sys; p = json.load(sys.stdin); print(p["total"], p["process"])'
}

sdxl() {
    "$B/bench/bench_mem_shard" "$T/xl64.shard" 512 512 2048 1280 2
    "$B/bench/bench_mem_shard" "$T/xl128.shard" 1024 1024 2048 1280 2
    local margin=$((${MARGIN_GIB:-4} << 30)) cuda=$((1 << 30)) extra p64 p128 pr128 gpu cpu cpr avail rss secs k=0
    read -r gpu _ < <(total_of "$T/sdxl.json" "$T/xl128.shard" --device cuda:0 --gpu-memory-limit 24)
    read -r cpu cpr < <(total_of "$T/sdxl.json" "$T/xl128.shard")
    extra=$((gpu - (cpu - cpr)))
    echo
    echo "SDXL base UNet, batch 1, gradient checkpointing, $TH threads, 1 step; GiB. A 24 GiB card: the CPU plan"
    echo "- process + $(python3 -c "print('%.2f' % ($extra / 2**30))") GiB device workspace (fp32 AdamW GPU plan at --gpu-memory-limit 24 minus its CPU plan)"
    echo "+ 1 GiB CUDA context and libraries"
    printf '| %-40s | %9s | %9s | %6s | %7s | %9s | %10s | %8s |\n' configuration "64² plan" "64² peak" ratio time \
        "128² plan" "128² 24GiB" "fits 24"
    while IFS='|' read -r name args; do
        k=$((k + 1))
        case $name in *"${ONLY:-}"*) ;; *) continue ;; esac
        # shellcheck disable=SC2086 # the options are words
        read -r p64 _ < <(total_of "$T/sdxl.json" "$T/xl64.shard" $args)
        # shellcheck disable=SC2086
        read -r p128 pr128 < <(total_of "$T/sdxl.json" "$T/xl128.shard" $args)
        avail=$(($(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo) * 1024))
        if ((p64 + margin <= avail)); then
            # shellcheck disable=SC2086
            /usr/bin/time -v -o "$T/xtime$k" "$B/tools/sd-train" --unet-config "$T/sdxl.json" -o "$T/xout$k" \
                --gradient-checkpointing -j "$TH" -q --steps 1 $args "$T/xl64.shard"
            rm -rf "$T/xout$k"
            rss=$(($(sed -n 's/.*Maximum resident set size (kbytes): //p' "$T/xtime$k") * 1024))
            secs=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$T/xtime$k")
        else
            rss=0
            secs="not run: MemAvailable $(python3 -c "print('%.1f' % ($avail / 2**30))") GiB"
        fi
        python3 -c '
import sys
name, p64, rss, secs, p128, pr128, extra, cuda = sys.argv[1:]
p64, rss, p128, pr128, extra, cuda = map(int, (p64, rss, p128, pr128, extra, cuda))
g = lambda b: "%.2f" % (b / 2**30)
card = p128 - pr128 + extra + cuda
print("| %-40s | %9s | %9s | %6s | %7s | %9s | %10s | %8s |" % (name, g(p64), g(rss) if rss else "-",
      "%.3f" % (p64 / rss) if rss else "-", secs, g(p128), g(card), "yes" if card <= 24 * 2**30 else "no"))
if rss:
    print("  bytes: plan %d, peak RSS %d" % (p64, rss))' "$name" "$p64" "$rss" "$secs" "$p128" "$pr128" "$extra" "$cuda"
    done << 'LIST'
(a) fp32 weights, adamw (defaults)|
(b) bf16 weights, adamw8bit|--weight-dtype bf16 --optimizer adamw8bit
(b) bf16 weights, adamw8bit, fused backward|--weight-dtype bf16 --optimizer adamw8bit --fused-backward
(b) bf16 weights, adamw8bit, bf16 gradients|--weight-dtype bf16 --optimizer adamw8bit --grad-dtype bf16
(c) bf16 weights, adafactor, fused backward|--weight-dtype bf16 --optimizer adafactor --fused-backward
LIST
}

if [ "$PART" != sdxl ]; then small; fi
if [ "$PART" != small ]; then sdxl; fi
