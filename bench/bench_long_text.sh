#!/bin/bash
# Long-prompt text caching benchmark (run by hand, not in ctest): the real
# CLIP ViT-L/14 text encoder architecture (SD 1.x) with random weights, N
# booru captions of about 150..300 tokens, `sd-latents --text-only
# --max-tokens 75|150|225` (tokenize, encode every 77-token chunk, join,
# store; its own captions/s figure) against sd-scripts' path on transformers
# (bench_long_text.py: the golden script's transcription, 8 captions per
# call), fp32 on THREADS threads, one after the other in the same run.
# Results: bench/RESULTS.md, "Long prompts (CPU)".
# usage: bench/bench_long_text.sh BUILD_DIR [N] [THREADS] [PYTHON]
#        (a Release build; PYTHON with torch + transformers, default python3)
set -eu
B=$(realpath "${1:-build}")
N=${2:-32}
TH=${3:-1}
PY=${4:-python3}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" "$HERE/bench_long_text.py" make "$T" "$N"
"$B/tools/sd-meta" -q "$T/ds" | "$B/tools/sd-bucket" -q --plan kohya -r 64x64 --min-bucket 64 --steps 32 - > "$T/b.jsonl"
"$B/tools/sd-latents" -q --vae "$HERE/../tests/golden/vae/sd" --dtype fp32 -o "$T/bare.shard" "$T/b.jsonl"
echo "CLIP ViT-L/14 (random weights), $N booru captions; CPU: $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1 /proc/loadavg)"
for mt in 75 150 225; do
  cp "$T/bare.shard" "$T/s$mt.shard"
  "$B/tools/sd-latents" --text "$T" --text-only --max-tokens "$mt" -j "$TH" -o "$T/s$mt.shard" "$T/captions.jsonl" \
    2>&1 | grep -o "[0-9]* embeddings computed ([0-9.]* captions/s)" | sed "s/^/sdtk, $mt tokens, $TH thread(s): /"
  "$PY" "$HERE/bench_long_text.py" time "$T" "$N" "$TH" "$mt" 2
done
