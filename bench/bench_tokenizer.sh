#!/bin/bash
# CLIP tokenizer captions/s on one core: sdtk vs transformers' CLIPTokenizerFast (Rust) and
# CLIPTokenizer (slow, Python) on the golden corpus repeated to >= 200k captions.
# Needs: pip install "transformers<5" ftfy tokenizers. Usage: bench/bench_tokenizer.sh BUILD_DIR
# Results: bench/RESULTS.md, "Tokenizer".
set -eu
build=${1:-build}; src=$(cd "$(dirname "$0")/.." && pwd)/tests/golden/tokenizer
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
zcat "$src/vocab.json.gz" > "$tmp/vocab.json"; zcat "$src/merges.txt.gz" > "$tmp/merges.txt"
# captions with newlines are joined by spaces so that one line is one caption
zcat "$src/corpus.jsonl.gz" | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if "text" in r: print(r["text"].replace("\n", " ").replace("\r", " "))' > "$tmp/captions.txt"
n=$(wc -l < "$tmp/captions.txt"); rep=$(( (200000 + n - 1) / n ))
taskset -c 0 "$build/bench/bench_tokenizer" "$tmp" "$tmp/captions.txt" "$rep"
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false taskset -c 0 python3 - "$tmp" "$rep" <<'PY' 2>&1 | grep -v PyTorch
import sys, time
from transformers import CLIPTokenizer, CLIPTokenizerFast
d, rep = sys.argv[1], int(sys.argv[2])
caps = open(d + "/captions.txt", encoding="utf-8").read().split("\n")[:-1] * rep
fast = CLIPTokenizerFast(d + "/vocab.json", d + "/merges.txt")
t = time.perf_counter(); fast(caps); dt = time.perf_counter() - t
print(f"transformers fast (Rust, batch call, 1 thread): {len(caps)} captions in {dt:.3f} s: {len(caps)/dt:.0f} captions/s")
slow = CLIPTokenizer(d + "/vocab.json", d + "/merges.txt")
sub = caps[:20000]
t = time.perf_counter(); [slow(c) for c in sub]; dt = time.perf_counter() - t
print(f"transformers slow (Python+ftfy): {len(sub)} captions in {dt:.3f} s: {len(sub)/dt:.0f} captions/s")
PY
