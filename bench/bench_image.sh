#!/bin/bash
# Image pipeline benchmark (run by hand, not in ctest): records from a real
# `sd-meta | sd-bucket` run (kohya plan, 1024x1024) on the photos in
# $SDTK_PHOTOS (default /tmp/photos); sdtk decode + resize + crop + float CHW
# on 1 and 2 threads vs a kohya-style PIL pipeline on 1 thread, same run,
# then the mean abs difference of sdtk's pixels vs the kohya-style ones.
# usage: bench/bench_image.sh BUILD_DIR [PASSES]   (after building sd-meta,
#        sd-bucket, bench_image and image_dump)
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
python3 "$HERE/bench_image_pil.py" time "$T/jobs.tsv" "$PASSES"
"$B/bench/bench_image" 1 "$PASSES" < "$T/jobs.tsv"
"$B/bench/bench_image" 2 "$PASSES" < "$T/jobs.tsv"
python3 "$HERE/bench_image_pil.py" compare "$T/jobs.tsv" "$B/tests/image_dump"
