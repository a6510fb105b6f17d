#!/bin/sh
# Shard store benchmark: bytes per sample vs kohya npz, sd-verify GB/s on a
# ~1.5 GB shard (warm page cache: dropping caches needs root), random-read
# samples/s. Usage: bench/bench_shard.sh BUILD_DIR [WORK_DIR]
# Results: bench/RESULTS.md, "sd-verify", "Shard reads" and "Cache size".
set -eu
build=$1
work=${2:-$(mktemp -d)}
mkdir -p "$work"
echo "== bytes per cached sample (shard)"
"$build/bench/bench_shard" size "$work"
echo "== bytes per cached sample (kohya npz)"
python3 "$(dirname "$0")/npz_size.py"
echo "== sd-verify throughput (SDXL 4x128x128 fp16 + flipped, 6000 records, warm cache)"
rm -f "$work/verify.shard"*
"$build/bench/bench_shard" make "$work/verify.shard" 6000 4 128 128 1
ls -l "$work/verify.shard"
cat "$work/verify.shard" >/dev/null
for j in 1 2; do "$build/tools/sd-verify" -j$j "$work/verify.shard" 2>&1 | tail -1; done
echo "== random reads (SD 4x64x64 fp16, 20000 records)"
rm -f "$work/read.shard"*
"$build/bench/bench_shard" make "$work/read.shard" 20000 4 64 64 0
"$build/bench/bench_shard" read "$work/read.shard" 20000 3 0
"$build/bench/bench_shard" read "$work/read.shard" 20000 3 1
