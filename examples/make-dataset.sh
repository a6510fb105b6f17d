#!/bin/bash
# Build the example dataset: the Debian wallpaper photos as a kohya-style flat
# folder, each image with a .txt of tags made from its package and file name
# (e.g. /usr/share/backgrounds/gnome/blobs-l.jpg -> "wallpaper, gnome, blobs l"),
# and every third one with a .caption sentence too. Deterministic.
# Usage: make-dataset.sh OUTDIR
set -eu
out=${1:?usage: make-dataset.sh OUTDIR}
tmp="$out.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
i=0
find /usr/share/backgrounds /usr/share/wallpapers -type f \
  \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' -o -iname '*.webp' \) -size +100k 2>/dev/null | sort |
while read -r f; do
  i=$((i + 1))
  n=$(printf %03d $i)
  ext=$(printf '%s' "${f##*.}" | tr 'A-Z' 'a-z')
  cp "$f" "$tmp/$n.$ext"
  rel=${f#/usr/share/}
  case "$rel" in
  wallpapers/*/contents/*) coll=plasma; name=$(printf '%s' "$rel" | cut -d/ -f2) ;;
  */*/*) coll=$(printf '%s' "$rel" | cut -d/ -f2); name=$(basename "${f%.*}") ;;
  *) coll=desktop; name=$(basename "${f%.*}") ;;
  esac
  name=$(printf '%s' "$name" | tr 'A-Z_-' 'a-z  ' | tr -s ' ')
  printf 'wallpaper, %s, %s\n' "$coll" "$name" > "$tmp/$n.txt"
  if [ $((i % 3)) = 0 ]; then printf 'A desktop wallpaper called %s.\n' "$name" > "$tmp/$n.caption"; fi
done
[ -n "$(ls -A "$tmp")" ] || { echo "make-dataset: no wallpapers found; run scripts/install-deps.sh" >&2; exit 1; }
rm -rf "$out"
mv "$tmp" "$out"
echo "make-dataset: $(ls "$out" | grep -vc '\.txt$\|\.caption$') images in $out" >&2
