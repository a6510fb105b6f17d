#!/bin/bash
# Image pipeline benchmark (run by hand, not in ctest): records from a real
# `sd-meta | sd-bucket` run (kohya plan, 1024x1024) on the photos in
# $SDTK_PHOTOS (default /tmp/photos); sdtk decode + resize + crop + float CHW
# on 1 and 2 threads vs a kohya-style PIL pipeline on 1 thread, same run
# (and sd-scripts' exact cv2 pipeline too when $PY has cv2), then the mean
# abs difference of sdtk's pixels vs the kohya-style ones. The closing lines
# give sdtk per core / PIL, by the wall clock and per CPU-second (the figure
# that holds when other work shares the machine).
# Then the ceiling: `bench_image 1 PASSES floor` runs only the decoder library
# work the pipeline cannot skip for each job (libjpeg-turbo at the DCT scale
# sdtk picks with every scanline read, libdeflate's inflate of a PNG's IDATs,
# libwebp decoding scaled to the resize size; files in memory first; no
# unfiltering, resize, crop, colour management or floats). Its CPU time is
# the "decoder floor": sdtk cannot go below it without faster decoders, so
# PIL's CPU time / the floor's is the most sdtk could reach per core (the
# "ceiling"), and "of ceiling" = the floor's CPU time / sdtk's is the part
# of it sdtk reaches (the rest of sdtk's time is its own work: unfiltering,
# resize, colour, floats, allocation). A table gives PIL, sdtk (1 thread)
# and the floor per format (the CPU time of each job, by its header's
# format; the "all" row is whole-process CPU time), with sdtk vs PIL and
# the ceiling per format. The three programs run one after another, so on a
# shared machine each ratio mixes moments of different load: repeat runs.
# The floor uses the system's libjpeg-turbo / libwebp / libdeflate (Debian
# 12: 2.1 / 1.2 / 1.14); PIL's wheel bundles its own, newer builds.
# usage: bench/bench_image.sh BUILD_DIR [PASSES]   (after building sd-meta,
#        sd-bucket, bench_image and image_dump; PY: Debian's /usr/bin/python3
#        by default (python3-pil with Debian's libjpeg-turbo 2.1 and libwebp
#        1.2, the decoders sdtk links), else python3; PY=VENV/bin/python for
#        a PyPI Pillow, whose wheel bundles newer decoders)
# Results: bench/RESULTS.md, "Image decode".
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
if [[ -z ${PY:-} ]]; then PY=python3; [[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3; fi
# the peer, named: Pillow's version and the decoder builds it runs
"$PY" -c 'from PIL import features as f; import PIL
print("peer: %s, Pillow %s, libjpeg-turbo %s, libwebp %s" % (__import__("sys").executable, PIL.__version__,
      f.version("libjpeg_turbo") or "?", f.version("webp") or "?"))'
pil=$("$PY" "$HERE/bench_image_pil.py" time "$T/jobs.tsv" "$PASSES" pil); echo "$pil"
cv=$("$PY" "$HERE/bench_image_pil.py" time "$T/jobs.tsv" "$PASSES" cv2); echo "$cv"
one=$("$B/bench/bench_image" 1 "$PASSES" < "$T/jobs.tsv" 2>/dev/null); echo "$one"
floor=$("$B/bench/bench_image" 1 "$PASSES" floor < "$T/jobs.tsv" 2>/dev/null); echo "$floor"
two=$("$B/bench/bench_image" 2 "$PASSES" < "$T/jobs.tsv" 2>/dev/null); echo "$two"
"$PY" "$HERE/bench_image_pil.py" compare "$T/jobs.tsv" "$B/tests/image_dump" 2>/dev/null
# field 1: images/s by the wall clock; field 2: images per CPU-second (the first line, the summary)
rates() { head -n 1 <<< "$1" | sed -E 's/.* = ([0-9.]+) images\/s.* = ([0-9.]+) images per CPU-second.*/\1 \2/'; }
# "images CPU-seconds" of one format's line (FORMAT given), "0 0" when absent
fmt_cpu() { grep -E " $2: [0-9]+ images, " <<< "$1" | sed -E 's/.*: ([0-9]+) images, ([0-9.]+) CPU s.*/\1 \2/' | grep . || echo "0 0"; }
read -r pw pc <<< "$(rates "$pil")"; read -r ow oc <<< "$(rates "$one")"; read -r tw tc <<< "$(rates "$two")"
awk -v pw="$pw" -v pc="$pc" -v ow="$ow" -v oc="$oc" -v tw="$tw" -v tc="$tc" 'BEGIN {
    printf "per core vs PIL: 1 thread %.2fx (wall), %.2fx (CPU); 2 threads %.2fx (wall, per thread), %.2fx (CPU)\n", ow / pw, oc / pc, tw / 2 / pw, tc / pc
    printf "scaling 1 -> 2 threads: %.2fx\n", tw / ow }'
if [[ $cv == *CPU-second* ]]; then
    read -r cw cc <<< "$(rates "$cv")"
    awk -v cw="$cw" -v cc="$cc" -v ow="$ow" -v oc="$oc" 'BEGIN {
        printf "per core vs cv2 (sd-scripts exact): 1 thread %.2fx (wall), %.2fx (CPU)\n", ow / cw, oc / cc }'
fi
# the decoder floor and the ceiling it sets, in all and per format (1 thread, CPU time)
read -r fw fc <<< "$(rates "$floor")"
awk -v pc="$pc" -v oc="$oc" -v fc="$fc" 'BEGIN {
    printf "ceiling per core (PIL CPU / decoder floor CPU): %.2fx; achieved on 1 thread %.2fx (CPU) = %.0f%% of it\n", fc / pc, oc / pc, 100 * oc / fc }'
echo "per format, 1 thread, images per CPU-second (floor: the decoder libraries alone; ceiling = floor / PIL):"
printf "%-6s %6s %8s %8s %8s %9s %8s %11s\n" format images PIL sdtk floor sdtk/PIL ceiling "of ceiling"
for f in jpeg png webp all; do
    if [[ $f == all ]]; then
        n=$(( $(head -n 1 <<< "$one" | sed -E 's/.*: ([0-9]+) images in.*/\1/') )); pr=$pc; sr=$oc; fr=$fc
    else
        read -r n pcs <<< "$(fmt_cpu "$pil" "$f")"; read -r _ scs <<< "$(fmt_cpu "$one" "$f")"; read -r _ fcs <<< "$(fmt_cpu "$floor" "$f")"
        [[ $n == 0 ]] && continue
        pr=$(awk -v n="$n" -v c="$pcs" 'BEGIN { print (c > 0 ? n / c : 0) }')
        sr=$(awk -v n="$n" -v c="$scs" 'BEGIN { print (c > 0 ? n / c : 0) }')
        fr=$(awk -v n="$n" -v c="$fcs" 'BEGIN { print (c > 0 ? n / c : 0) }')
    fi
    awk -v f="$f" -v n="$n" -v p="$PASSES" -v pr="$pr" -v sr="$sr" -v fr="$fr" 'BEGIN {
        if (pr <= 0 || sr <= 0 || fr <= 0) { printf "%-6s %6d   (missing figures)\n", f, n / p; exit }
        printf "%-6s %6d %8.2f %8.2f %8.2f %8.2fx %7.2fx %10.0f%%\n", f, n / p, pr, sr, fr, sr / pr, fr / pr, 100 * sr / fr }'
done
