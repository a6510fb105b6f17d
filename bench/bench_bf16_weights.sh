#!/bin/bash
# bf16 weights against fp32 (run by hand, not in ctest; issue 28): the
# example pipeline's tiny UNet (examples/tiny-unet.json) trained from random
# weights, 300 steps, with the example's options (batch 1, lr 1e-3, seed 0,
# init seed 0), on the example's shards, in four configurations: fp32
# weights + AdamW (today's default), and --weight-dtype bf16 with AdamW,
# 8-bit AdamW and Adafactor; then --grad-dtype bf16 (the gradient buffer
# in bf16 too: kohya's --full_bf16) with bf16 weights + AdamW, bf16
# weights + 8-bit AdamW and fp32 weights + AdamW. For each: the mean loss
# of steps 1-50 and of
# steps 251-300 (the final window), that window against fp32's (the bar for
# bf16 + AdamW: within 5%), wall time and peak RSS (/usr/bin/time -v).
# Every configuration draws the same samples, timesteps and noise (the data
# and noise streams do not depend on the weights).
# Results: bench/RESULTS.md, "bf16 weights".
# usage: [CONFIGS="fp32-adamw ..."] bench/bench_bf16_weights.sh BUILD_DIR [THREADS] SHARD...
#        (CONFIGS: a subset of the names below, fp32-adamw always first)
#        (the shards: `make -C examples shards`, OUT's part-*.shard)
set -eu
B=$(realpath "${1:?usage: $0 BUILD_DIR [THREADS] SHARD...}")
shift
TH=2
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then TH=$1; shift; fi
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [THREADS] SHARD..." >&2; exit 2; }
HERE=$(dirname "$(realpath "$0")")
CONFIG="$HERE/../examples/tiny-unet.json"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
run() { # name, then sd-train options
    local name=$1
    shift
    /usr/bin/time -v -o "$T/$name.time" "$B/tools/sd-train" --unet-config "$CONFIG" -o "$T/$name" --steps 300 \
        --batch 1 --lr 1e-3 --seed 0 --init-seed 0 --save-every 300 --keep 1 -j "$TH" -q \
        --metrics "$T/$name.jsonl" "$@" "${SHARDS[@]}"
}
SHARDS=("$@")
ALL="fp32-adamw bf16-adamw bf16-adamw8bit bf16-adafactor bf16-adamw-g16 bf16-adamw8bit-g16 fp32-adamw-g16"
CONFIGS=${CONFIGS:-$ALL}
for name in $CONFIGS; do
    case " $ALL " in *" $name "*) ;; *) echo "CONFIGS: names from $ALL, not '$name'" >&2; exit 2 ;; esac
done
for name in fp32-adamw $CONFIGS; do
    case $name in
    fp32-adamw) [ -e "$T/fp32-adamw.jsonl" ] || run fp32-adamw ;;
    bf16-adamw) run bf16-adamw --weight-dtype bf16 ;;
    bf16-adamw8bit) run bf16-adamw8bit --weight-dtype bf16 --optimizer adamw8bit ;;
    bf16-adafactor) run bf16-adafactor --weight-dtype bf16 --optimizer adafactor ;;
    bf16-adamw-g16) run bf16-adamw-g16 --weight-dtype bf16 --grad-dtype bf16 ;;
    bf16-adamw8bit-g16) run bf16-adamw8bit-g16 --weight-dtype bf16 --optimizer adamw8bit --grad-dtype bf16 ;;
    fp32-adamw-g16) run fp32-adamw-g16 --grad-dtype bf16 ;;
    esac
done
# shellcheck disable=SC2086 # the names are words
python3 - "$T" fp32-adamw $CONFIGS << 'PY'
import json, os, re, sys
t = sys.argv[1]
def losses(name):
    by = {}
    with open(os.path.join(t, name + ".jsonl")) as f:
        for line in f:
            r = json.loads(line)
            by[r["step"]] = r["loss"]
    return [by[s] for s in sorted(by)]
def timev(name):
    txt = open(os.path.join(t, name + ".time")).read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", txt).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", txt).group(1)
    return wall, rss
base = None
print("%-18s %10s %10s %8s %9s %10s" % ("config", "loss1-50", "loss251-300", "vs fp32", "wall", "peak MiB"))
for name in dict.fromkeys(sys.argv[2:]):
    l = losses(name)
    assert len(l) == 300, (name, len(l))
    first, last = sum(l[:50]) / 50, sum(l[-50:]) / 50
    base = last if base is None else base
    wall, rss = timev(name)
    print("%-18s %10.4f %10.4f %+7.2f%% %9s %10.1f" % (name, first, last, 100 * (last / base - 1), wall, rss / 1024))
PY
