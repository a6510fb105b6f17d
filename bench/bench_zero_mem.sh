#!/bin/bash
# ZeRO-1 and ZeRO-2 memory per rank on this machine's CPU (issue 28; run by
# hand, never in tests): SD 1.5's architecture at half width (as
# bench_mem_plan.sh: block_out_channels 128, 256, 512, 512; 142M parameters,
# random weights from --unet-config) at 256x256, batch 1, AdamW, 2 steps,
# one thread per process: one process, then mpirun -np 2 with --zero1 and
# with --zero2; then Adafactor in one process and with --zero2 (shared by
# whole tensors). For each: the memory plan of rank 0 (its gradients,
# optimizer state and total) and every rank's peak RSS (/usr/bin/time -v
# around each rank). Needs about 5 GB of memory and a few minutes on 2 cores.
# Results: bench/RESULTS.md, "Memory plan".
# usage: bench/bench_zero_mem.sh BUILD_DIR [STEPS]
#        (a Release build with MPI, sd-train and bench_mem_shard)
set -eu
B=$(realpath "${1:-build}")
STEPS=${2:-2}
command -v mpirun >/dev/null || { echo "bench_zero_mem: no mpirun (apt-get install openmpi-bin)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat > "$T/sd15_half.json" << 'JSON'
{"_class_name": "UNet2DConditionModel", "in_channels": 4, "out_channels": 4, "sample_size": 32,
 "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "cross_attention_dim": 768,
 "attention_head_dim": 8, "norm_num_groups": 32,
 "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]}
JSON
"$B/bench/bench_mem_shard" "$T/mid.shard" 256 256 768 0 4
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPI=(mpirun --oversubscribe --allow-run-as-root -np 2)
ARGS=(--unet-config "$T/sd15_half.json" -j 1 "$T/mid.shard")
# each rank under /usr/bin/time -v, its report named by its rank
cat > "$T/timed.sh" << EOF
#!/bin/sh
exec /usr/bin/time -v -o "\$TIMED.\${OMPI_COMM_WORLD_RANK:-0}" "$B/tools/sd-train" "\$@"
EOF
chmod +x "$T/timed.sh"
plan() { # the plan's gradients, optimizer and total in bytes
    python3 -c 'import json, sys
p = json.load(sys.stdin)
print(p["gradients"], p["optimizer"], p["total"])'
}
rss() { echo $(( $(sed -n 's/.*Maximum resident set size (kbytes): //p' "$1") * 1024 )); }
echo "ZeRO memory per rank, SD 1.5 half width, 256x256, batch 1, adamw, $STEPS steps, 1 thread per process"
echo "CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
printf '| %-22s | %13s | %13s | %13s | %13s | %13s |\n' run "plan grads" "plan optim" "plan total" \
    "rank 0 RSS" "rank 1 RSS"
read -r g o t < <("$B/tools/sd-train" --memory-plan "${ARGS[@]}" | plan)
TIMED="$T/one" "$T/timed.sh" -o "$T/out-one" -q --steps "$STEPS" "${ARGS[@]}"
printf '| %-22s | %13d | %13d | %13d | %13d | %13s |\n' "1 process" "$g" "$o" "$t" "$(rss "$T/one.0")" "-"
for z in zero1 zero2; do
    read -r g o t < <("${MPI[@]}" "$B/tools/sd-train" --memory-plan "--$z" "${ARGS[@]}" | plan)
    "${MPI[@]}" -x TIMED="$T/$z" "$T/timed.sh" "--$z" -o "$T/out-$z" -q --steps "$STEPS" "${ARGS[@]}"
    printf '| %-22s | %13d | %13d | %13d | %13d | %13d |\n' "2 ranks --$z" "$g" "$o" "$t" "$(rss "$T/$z.0")" \
        "$(rss "$T/$z.1")"
done
# Adafactor (shared by whole tensors): one process, then 2 ranks with --zero2
AF=(--optimizer adafactor "${ARGS[@]}")
read -r g o t < <("$B/tools/sd-train" --memory-plan "${AF[@]}" | plan)
TIMED="$T/af" "$T/timed.sh" -o "$T/out-af" -q --steps "$STEPS" "${AF[@]}"
printf '| %-22s | %13d | %13d | %13d | %13d | %13s |\n' "adafactor, 1 process" "$g" "$o" "$t" "$(rss "$T/af.0")" "-"
read -r g o t < <("${MPI[@]}" "$B/tools/sd-train" --memory-plan --zero2 "${AF[@]}" | plan)
"${MPI[@]}" -x TIMED="$T/afz2" "$T/timed.sh" --zero2 -o "$T/out-afz2" -q --steps "$STEPS" "${AF[@]}"
printf '| %-22s | %13d | %13d | %13d | %13d | %13d |\n' "adafactor, --zero2" "$g" "$o" "$t" "$(rss "$T/afz2.0")" \
    "$(rss "$T/afz2.1")"
