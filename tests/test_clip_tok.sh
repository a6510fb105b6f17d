#!/bin/bash
# Unpack the CLIP tokenizer golden files into a temp dir and run test_clip_tok.
set -eu
bin=$1; src=$(dirname "$0")/golden/tokenizer
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for f in vocab.json merges.txt corpus.jsonl; do zcat "$src/$f.gz" > "$tmp/$f"; done
"$bin" "$tmp"
