#!/bin/bash
# sd-latents throughput on a GPU (run by hand on a machine with an NVIDIA
# GPU; docs/GPU.md): every photo of IMAGES (a flat folder with captions)
# listed COPIES times under other keys, bucketed at 512x512, cached with
# VAE on cuda:0 at --batch BATCH with all CPU cores decoding, strict fp32,
# TF32 and bf16 mixed precision (MODES), in images/s of wall time (model load included; the stages line
# of sd-latents says where the time went). With OTHER, a second sd-latents
# binary (an older build, say) runs the same jobs in alternation, and the
# two shards of each mode are compared record by record (bit for bit).
# usage: bench/bench_gpu_pipeline.sh BUILD_DIR IMAGES VAE [COPIES [BATCH [OTHER]]]
#        (DEV=cpu runs it on the CPU, strict only: a check of the script)
# Results: bench/RESULTS.md, "GPU (H100)".
set -u
DEV=${DEV:-cuda:0}
B=$(realpath "${1:-build}")
IMAGES=$2
VAE=$3
COPIES=${4:-16}
BATCH=${5:-8}
OTHER=${6:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$B/tools/sd-meta" "$IMAGES" -o "$T/meta.jsonl" 2> /dev/null || exit 1
"$B/tools/sd-bucket" --resolution 512x512 -o "$T/one.jsonl" -q "$T/meta.jsonl" || exit 1
python3 - "$T/one.jsonl" "$T/buckets.jsonl" "$COPIES" << 'PY'
import json, sys
src, dst, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(l) for l in open(src)]
with open(dst, "w") as f:
    for c in range(copies):
        for r in recs:
            r = dict(r, key="%s-%03d" % (r["key"], c))
            f.write(json.dumps(r) + "\n")
PY
n=$(wc -l < "$T/buckets.jsonl")
echo "== sd-latents, $n records ($COPIES copies of each photo of $IMAGES), batch $BATCH, VAE $VAE, $(nproc) threads"
for mode in ${MODES:-strict $([ "$DEV" = cpu ] || echo tf32 bf16)}; do
    for round in 1 2; do
        for bin in "$B/tools/sd-latents" ${OTHER:+"$OTHER"}; do
            tag=$([ "$bin" = "$B/tools/sd-latents" ] && echo this || echo other)
            out=$T/$mode-$tag.shard
            rm -rf "$out"
            t0=$(date +%s%N)
            flag=$([ $mode = tf32 ] && echo --tf32; [ $mode = bf16 ] && echo --mixed-precision bf16)
            "$bin" --device "$DEV" $flag --vae "$VAE" --batch "$BATCH" --seed 5 \
                -o "$out" "$T/buckets.jsonl" 2> "$T/log" || { echo "$mode $tag: sd-latents failed"; tail -3 "$T/log"; }
            ms=$(( ($(date +%s%N) - t0) / 1000000 ))
            echo "$mode $tag round $round: $ms ms, $(python3 -c "print('%.1f' % ($n * 1000 / $ms))") images/s; $(grep -o 'stages: .*' "$T/log" | tail -1)"
        done
    done
    if [ -n "$OTHER" ]; then
        for tag in this other; do
            mkdir -p "$T/x-$mode-$tag" && "$B/tools/sd-pack" export-tar "$T/$mode-$tag.shard" -o "$T/x-$mode-$tag/p-%d.tar" -q &&
                (cd "$T/x-$mode-$tag" && tar xf p-0.tar && rm p-*.tar)
        done
        if diff -rq "$T/x-$mode-this" "$T/x-$mode-other" > /dev/null; then
            echo "$mode: the two binaries' records are bit-identical ($(ls "$T/x-$mode-this" | wc -l) files)"
        else
            echo "$mode: the two binaries' records DIFFER"
        fi
    fi
done
