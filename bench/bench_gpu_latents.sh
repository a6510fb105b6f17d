#!/bin/bash
# sd-latents on a GPU (run by hand on a machine with an NVIDIA GPU;
# docs/GPU.md): the images of IMAGES (a flat folder with captions) through
# sd-meta | sd-bucket | sd-latents --device cpu and --device cuda:0 with the
# same VAE and seed, each shard checked by sd-verify, then the latents of
# the two shards compared record by record (sd-pack export-tar, numpy).
# usage: bench/bench_gpu_latents.sh BUILD_DIR IMAGES VAE [BATCH [TEXT]]
#        (python3 with numpy; BATCH images per VAE batch, default 1; TEXT a
#        text-encoder model for --text, whose embeddings are compared too)
# Results: bench/RESULTS.md, "GPU (H100)".
set -u
B=$(realpath "${1:-build}")
IMAGES=$2
VAE=$3
BATCH=${4:-1}
TEXT=${5:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$B/tools/sd-meta" "$IMAGES" -o "$T/meta.jsonl" 2>/dev/null || exit 1
"$B/tools/sd-bucket" --resolution 512x512 -o "$T/buckets.jsonl" -q "$T/meta.jsonl" || exit 1
echo "== sd-latents on $(wc -l < "$T/buckets.jsonl") images of $IMAGES, VAE $VAE, batch $BATCH: cpu vs cuda:0"
for dev in cpu cuda:0; do
    d=${dev%%:*}
    t0=$(date +%s%N)
    "$B/tools/sd-latents" --device $dev --vae "$VAE" --dtype fp32 --seed 5 --batch "$BATCH" ${TEXT:+--text "$TEXT"} -o "$T/$d.shard" "$T/buckets.jsonl" \
        2> "$T/$d.log" || { echo "$dev: sd-latents failed"; cat "$T/$d.log"; }
    echo "$dev: $(( ($(date +%s%N) - t0) / 1000000 )) ms wall; $(tail -1 "$T/$d.log")"
    "$B/tools/sd-verify" --manifest "$T/buckets.jsonl" "$T/$d.shard" 2>&1 | tail -1
    mkdir -p "$T/$d" && "$B/tools/sd-pack" export-tar "$T/$d.shard" -o "$T/$d/x-%d.tar" -q && (cd "$T/$d" && tar xf x-0.tar)
done
python3 - "$T" << 'PY'
import glob, os, sys
import numpy as np
t = sys.argv[1]
files = sorted(os.path.basename(f) for f in glob.glob(t + "/cpu/*.npy"))
rows = []
for f in files:
    if not os.path.exists(t + "/cuda/" + f):
        print("missing on the GPU side:", f)
        continue
    a, b = np.load(t + "/cpu/" + f).astype(np.float64), np.load(t + "/cuda/" + f).astype(np.float64)
    d = np.abs(a - b)
    rows.append((d.max() / max(np.abs(a).max(), 1e-30), d.max(), np.abs(a).max(),
                 np.sqrt((d ** 2).mean() / max((a ** 2).mean(), 1e-30)), f, a.shape))
for kind in ("mean", "std", "latents", "te", "te1", "te2", "pool2"):
    r = [x for x in rows if ("." + kind + ".") in x[4]]
    if r:
        print("%-7s %3d arrays: max |cpu - cuda| / max |cpu| up to %.2e, relative rms error up to %.2e"
              % (kind, len(r), max(x[0] for x in r), max(x[3] for x in r)))
for x in sorted(rows, reverse=True)[:4]:
    print("  worst: %s %s max|d| %.3e max|cpu| %.3e rel %.2e rms %.2e" % (x[4], x[5], x[1], x[2], x[0], x[3]))
PY
