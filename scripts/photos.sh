#!/bin/bash
# Collect the real photos (JPEG/PNG/WebP, 1-15 MP) that Debian's wallpaper
# packages ship into DIR, named NNN.ext in a stable order. Used by tests,
# examples and benchmarks; the packages come from scripts/install-deps.sh.
# Usage: scripts/photos.sh DIR
set -eu
dir=${1:?usage: photos.sh DIR}
mkdir -p "$dir"
if [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
  echo "photos: $dir is not empty: kept as it is ($(ls "$dir" | wc -l) files)" >&2
  exit 0
fi
i=0
find /usr/share/backgrounds /usr/share/wallpapers -type f \
  \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' -o -iname '*.webp' \) -size +100k 2>/dev/null | sort |
while read -r f; do
  i=$((i + 1))
  ext=$(printf '%s' "${f##*.}" | tr 'A-Z' 'a-z')
  [ "$ext" = jpeg ] && ext=jpg
  cp "$f" "$dir/$(printf %03d $i).$ext"
done
n=$(ls "$dir" | wc -l)
[ "$n" -gt 0 ] || { echo "photos: no wallpapers found; run scripts/install-deps.sh" >&2; exit 1; }
echo "photos: $n photos in $dir" >&2
