#!/bin/bash
# Run a caption fuzz program (the replay driver in ctest, or the libFuzzer
# binary from scripts/fuzz.sh) with the real CLIP vocabulary: unpack
# tests/golden/tokenizer into a temp dir and point SDTK_FUZZ_CLIP_DIR at it.
# Usage: fuzz_caption.sh PROGRAM [ARGS...]
set -eu
src=$(dirname "$0")/../golden/tokenizer
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for f in vocab.json merges.txt; do zcat "$src/$f.gz" > "$tmp/$f"; done
SDTK_FUZZ_CLIP_DIR=$tmp "$@"
