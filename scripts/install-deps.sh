#!/bin/bash
# Install the Debian 12 packages sdtk needs to build, test and run its examples.
# Idempotent: installs only what is missing. Needs root when something is missing.
# Usage: scripts/install-deps.sh [--fuzz]   (--fuzz adds clang for the libFuzzer targets)
set -eu
pkgs="build-essential cmake pkg-config python3 python3-numpy python3-pil file libxxhash-dev libarchive-dev libutf8proc-dev liblmdb-dev lmdb-utils libvips-dev liblcms2-dev libjpeg-dev libwebp-dev libdeflate-dev libopenblas-dev libopenmpi-dev openmpi-bin
      gnome-backgrounds plasma-workspace-wallpapers ukui-wallpapers lomiri-wallpapers"
[ "${1:-}" = "--fuzz" ] && pkgs="$pkgs clang libclang-rt-14-dev"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: need root to install:$missing" >&2
  exit 1
fi
echo "install-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends $missing >/dev/null
