#!/bin/bash
# Unpack the CLIP tokenizer golden files into a temp dir and run test_clip_tok;
# the same tables also as a tokenizer.json (transformers 5's only file: the
# model's vocab, here sorted by token, and merges as pairs) in tmp/tj.
set -eu
bin=$1; src=$(dirname "$0")/golden/tokenizer
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for f in vocab.json merges.txt corpus.jsonl; do zcat "$src/$f.gz" > "$tmp/$f"; done
mkdir "$tmp/tj"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
vocab = json.load(open(d + "/vocab.json", encoding="utf-8"))
merges = open(d + "/merges.txt", encoding="utf-8").read().strip().split("\n")[1:]
model = {"type": "BPE", "dropout": None, "unk_token": "<|endoftext|>", "continuing_subword_prefix": "",
         "end_of_word_suffix": "</w>", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
         "vocab": dict(sorted(vocab.items())), "merges": [m.split(" ") for m in merges[:48894]]}
added = [{"id": vocab[t], "content": t, "special": True} for t in ("<|startoftext|>", "<|endoftext|>")]
json.dump({"version": "1.0", "added_tokens": added, "model": model}, open(d + "/tj/tokenizer.json", "w"),
          ensure_ascii=False)
PY
"$bin" "$tmp" "$tmp/tj"
