#!/usr/bin/env bash
# sd-bucket's header-only sizes on real photos ($SDTK_PHOTOS), checked
# against an independent reader: PIL (with the EXIF orientation swap, for JPEG, PNG and WebP) when
# python3 has it, else file(1) for the formats it prints sizes for. Also reads
# the same photos as members of an uncompressed tar by offset.
set -u
BIN=$(realpath "${1:?usage: e2e_bucket_photos.sh path/to/sd-bucket}")
if [ -z "${SDTK_PHOTOS:-}" ]; then
    echo "SKIP: SDTK_PHOTOS not set"
    exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

find "$SDTK_PHOTOS" -maxdepth 1 -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' -o -iname '*.webp' \
    -o -iname '*.gif' -o -iname '*.bmp' \) | sort > "$T/list.txt"
n=$(wc -l < "$T/list.txt")
if [ "$n" -eq 0 ]; then
    echo "SKIP: no photos in $SDTK_PHOTOS"
    exit 77
fi
awk '{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "{\"key\":\"p%d\",\"image\":\"%s\"}\n", NR, $0 }' "$T/list.txt" > "$T/in.jsonl"
"$BIN" -q --strict -j 2 "$T/in.jsonl" -o "$T/out.jsonl" || fail "sd-bucket failed or skipped photos (exit $?)"
[ "$(wc -l < "$T/out.jsonl")" -eq "$n" ] || fail "expected $n records out"
# "path W H" as sd-bucket saw them (display orientation)
sed -E 's/.*"image":"([^"]*)".*"width":([0-9]+),"height":([0-9]+).*/\1 \2 \3/' "$T/out.jsonl" | sort > "$T/ours.txt"

if python3 -c 'import PIL' 2> /dev/null; then
    ref=PIL
    python3 - "$T/list.txt" > "$T/ref.txt" << 'EOF'
import sys
from PIL import Image
for p in open(sys.argv[1]).read().split("\n"):
    if not p:
        continue
    with Image.open(p) as im:
        w, h = im.size
        o = im.getexif().get(0x0112, 1)  # JPEG APP1, PNG eXIf, WebP EXIF: sd-bucket reads all three
        if o in (5, 6, 7, 8):
            w, h = h, w
    print(p, w, h)
EOF
    sort -o "$T/ref.txt" "$T/ref.txt"
else
    ref="file(1)"
    # JPEG "precision 8, WxH", PNG "W x H", WebP "VP8 encoding, WxH"; photos with a
    # rotating EXIF orientation or no size in file's output are left out
    while read -r p; do
        d=$(file -b "$p")
        case "$d" in *orientation=*left-top* | *orientation=*right-top* | *orientation=*right-bottom* | *orientation=*left-bottom*) continue ;; esac
        s=$(echo "$d" | grep -oE '(precision [0-9]+, |encoding, )[0-9]+x[0-9]+|[0-9]+ x [0-9]+' | grep -oE '[0-9]+ ?x ?[0-9]+$' | head -1 | tr -d ' ')
        [ -n "$s" ] && echo "$p ${s%x*} ${s#*x}"
    done < "$T/list.txt" | sort > "$T/ref.txt"
fi
nref=$(wc -l < "$T/ref.txt")
[ "$nref" -gt 0 ] || fail "reference ($ref) sized no photos"
missing=$(join -v1 "$T/ref.txt" "$T/ours.txt" | wc -l)
diffs=$(join "$T/ref.txt" "$T/ours.txt" | awk '$2 != $4 || $3 != $5' | tee "$T/diffs.txt" | wc -l)
[ "$diffs" -eq 0 ] || { fail "$diffs size mismatches against $ref"; head -5 "$T/diffs.txt" >&2; }
[ "$missing" -eq 0 ] || fail "$missing photos sized by $ref missing from our output"

# the same photos as tar members, read by offset
if python3 -c 'import tarfile' 2> /dev/null; then
    head -20 "$T/list.txt" > "$T/some.txt"
    python3 - "$T/some.txt" "$T/shard.tar" > "$T/tar.jsonl" << 'EOF'
import json, sys, tarfile, os
paths = [p for p in open(sys.argv[1]).read().split("\n") if p]
with tarfile.open(sys.argv[2], "w", format=tarfile.USTAR_FORMAT) as t:
    for i, p in enumerate(paths):
        t.add(p, arcname="%06d%s" % (i, os.path.splitext(p)[1]))
with tarfile.open(sys.argv[2]) as t:
    for i, m in enumerate(t.getmembers()):
        print(json.dumps({"key": "t%d" % i, "src": paths[i], "image": sys.argv[2], "member": m.name,
                          "offset": m.offset_data, "size": m.size}))
EOF
    "$BIN" -q --strict "$T/tar.jsonl" -o "$T/tar_out.jsonl" || fail "tar members: sd-bucket failed (exit $?)"
    sed -E 's/.*"src":"([^"]*)".*"width":([0-9]+),"height":([0-9]+).*/\1 \2 \3/' "$T/tar_out.jsonl" | sort > "$T/tar_ours.txt"
    join "$T/tar_ours.txt" "$T/ours.txt" | awk '$2 != $4 || $3 != $5 { bad++ } END { exit bad > 0 }' ||
        fail "tar member sizes differ from file sizes"
    [ "$(wc -l < "$T/tar_ours.txt")" -eq "$(wc -l < "$T/some.txt")" ] || fail "tar members missing from output"
fi

if [ $fails -ne 0 ]; then
    echo "e2e_bucket_photos: $fails failure(s)"
    exit 1
fi
echo "e2e_bucket_photos: ok ($n photos, $nref checked against $ref)"
