#!/bin/bash
# Image pipeline benchmark (run by hand, not in ctest): records from a real
# `sd-meta | sd-bucket` run (kohya plan, 1024x1024) on the photos in
# $SDTK_PHOTOS (default /tmp/photos); sdtk decode + resize + crop + float CHW
# on 1 and 2 threads vs a kohya-style PIL pipeline on 1 thread, same run
# (and sd-scripts' exact cv2 pipeline too when $PY has cv2), then the mean
# abs difference of sdtk's pixels vs the kohya-style ones. The closing lines
# give sdtk per core / PIL, by the wall clock and per CPU-second (the figure
# that holds when other work shares the machine).
# usage: bench/bench_image.sh BUILD_DIR [PASSES]   (after building sd-meta,
#        sd-bucket, bench_image and image_dump; PY=python3 by default)
set -eu
B=$(realpath "${1:-build}")
PASSES=${2:-2}
PHOTOS=$(realpath "${SDTK_PHOTOS:-/tmp/photos}")
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir "$T/ds"
for f in "$PHOTOS"/*; do   # sd-meta wants a caption per image
    b=$(basename "$f"); ln -s "$f" "$T/ds/$b"; echo "a wallpaper photo" > "$T/ds/${b%.*}.txt"
done
"$B/tools/sd-meta" -q "$T/ds" > "$T/meta.jsonl"
"$B/tools/sd-bucket" -q --plan kohya -r 1024x1024 "$T/meta.jsonl" -o "$T/b.jsonl"
python3 - "$T/b.jsonl" > "$T/jobs.tsv" << 'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("\t".join(str(x) for x in [r["image"], r.get("offset", 0), r.get("size", -1)] + r["resize"] + r["crop"]))
PY
echo "records: $(wc -l < "$T/jobs.tsv") images from $PHOTOS, $PASSES passes; CPU: $(nproc) cores"
PY=${PY:-python3}
pil=$("$PY" "$HERE/bench_image_pil.py" time "$T/jobs.tsv" "$PASSES" pil); echo "$pil"
cv=$("$PY" "$HERE/bench_image_pil.py" time "$T/jobs.tsv" "$PASSES" cv2); echo "$cv"
one=$("$B/bench/bench_image" 1 "$PASSES" < "$T/jobs.tsv" 2>/dev/null); echo "$one"
two=$("$B/bench/bench_image" 2 "$PASSES" < "$T/jobs.tsv" 2>/dev/null); echo "$two"
"$PY" "$HERE/bench_image_pil.py" compare "$T/jobs.tsv" "$B/tests/image_dump" 2>/dev/null
# field 1: images/s by the wall clock; field 2: images per CPU-second
rates() { sed -E 's/.* = ([0-9.]+) images\/s.* = ([0-9.]+) images per CPU-second.*/\1 \2/' <<< "$1"; }
read -r pw pc <<< "$(rates "$pil")"; read -r ow oc <<< "$(rates "$one")"; read -r tw tc <<< "$(rates "$two")"
awk -v pw="$pw" -v pc="$pc" -v ow="$ow" -v oc="$oc" -v tw="$tw" -v tc="$tc" 'BEGIN {
    printf "per core vs PIL: 1 thread %.2fx (wall), %.2fx (CPU); 2 threads %.2fx (wall, per thread), %.2fx (CPU)\n", ow / pw, oc / pc, tw / 2 / pw, tc / pc
    printf "scaling 1 -> 2 threads: %.2fx\n", tw / ow }'
if [[ $cv == *CPU-second* ]]; then
    read -r cw cc <<< "$(rates "$cv")"
    awk -v cw="$cw" -v cc="$cc" -v ow="$ow" -v oc="$oc" 'BEGIN {
        printf "per core vs cv2 (sd-scripts exact): 1 thread %.2fx (wall), %.2fx (CPU)\n", ow / cw, oc / cc }'
fi
