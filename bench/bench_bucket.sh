#!/usr/bin/env bash
# sd-bucket benchmarks (run by hand, not in ctest):
#  (a) header-only size reads per second on one core vs PIL Image.open().size,
#      on the photos in $SDTK_PHOTOS (default /tmp/photos) repeated to >= 10k reads;
#  (b) bucketing + an 8-way split of a generated 1M-record JSONL (records carry
#      width/height) on 2 threads.
# usage: bench/bench_bucket.sh BUILD_DIR   (after building sd-bucket and bench_imghdr)
# Results: bench/RESULTS.md, "Image headers" and "sd-bucket".
set -eu
B=$(realpath "${1:-build}")
PHOTOS=${SDTK_PHOTOS:-/tmp/photos}
READS=${READS:-10000}
RECORDS=${RECORDS:-1000000}
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

mapfile -t files < <(find "$PHOTOS" -maxdepth 1 -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' -o -iname '*.webp' \) | sort)
echo "== (a) header reads: ${#files[@]} photos from $PHOTOS, >= $READS reads, 1 core"
cat "${files[@]}" > /dev/null # warm the page cache for both readers
c=$("$B/bench/bench_imghdr" --reads "$READS" "${files[@]}")
echo "sdtk imghdr : $c"
if python3 -c 'import PIL' 2> /dev/null; then
    p=$(python3 "$HERE/bench_bucket_pil.py" --reads "$READS" "${files[@]}")
    echo "PIL         : $p"
    awk -v a="$c" -v b="$p" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "ratio       : %.1fx PIL per core\n", x[6] / y[6] }'
else
    echo "PIL         : not installed (pip install pillow)"
fi

echo "== (b) bucketing + split of $RECORDS records, 2 threads"
awk -v n="$RECORDS" 'BEGIN { srand(1); for (i = 0; i < n; i++) {
        w = int(256 + rand() * 5000); h = int(256 + rand() * 5000)
        printf "{\"v\":1,\"key\":\"%08d\",\"image\":\"shard-%04d.tar\",\"member\":\"%08d.jpg\",\"offset\":%d,\"size\":%d,\"width\":%d,\"height\":%d,\"caption\":\"a photo of something, number %d\",\"split\":\"train\"}\n", i, i / 10000, i, i * 1024, 200000, w, h, i } }' > "$T/in.jsonl"
bytes=$(stat -c %s "$T/in.jsonl")
sync  # the generated input must not be flushed to disk during the timed runs
cat "$T/in.jsonl" > /dev/null
for mode in plain split; do
    extra=(-o "$T/out.jsonl")
    [ $mode == split ] && extra=(--split 8 -o "$T/part-%d.jsonl")
    t0=$(date +%s.%N)
    "$B/tools/sd-bucket" -q -j 2 "${extra[@]}" --report "$T/rep.json" "$T/in.jsonl"
    t1=$(date +%s.%N)
    awk -v n="$RECORDS" -v b="$bytes" -v t0="$t0" -v t1="$t1" -v m="$mode" 'BEGIN {
        dt = t1 - t0; printf "sd-bucket %-5s: %d records in %.3f s = %.0f records/s (%.0f MB/s in), goal 500000: %.2fx\n",
        m, n, dt, n / dt, b / dt / 1e6, n / dt / 500000 }'
done
