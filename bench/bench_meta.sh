#!/bin/bash
# sd-meta throughput on Danbooru-like posts against a plain Python reference
# doing the same work (bench/meta_ref.py). Run by hand on an idle machine,
# with a Release or RelWithDebInfo build (not sanitizers):
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j
#   bench/bench_meta.sh [N] [BUILD_DIR]       (N posts, default 1000000)
# Goals (issue 2): >= 300k records/s on 2 cores; >= 20x Python per core.
# Results: bench/RESULTS.md, "sd-meta".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
n=${1:-1000000}
build=${2:-$here/../build}
meta=$build/tools/sd-meta
out=$here/out
mkdir -p "$out"
posts=$out/danbooru_$n.jsonl
rules=$here/rules_danbooru.json
pat='{id}.{file_ext}'
[ -x "$meta" ] || { echo "no $meta: build first" >&2; exit 2; }
if [ ! -s "$posts" ]; then
    echo "generating $n posts -> $posts"
    python3 "$here/gen_danbooru.py" "$n" "$posts.tmp" && mv "$posts.tmp" "$posts"
fi

# 1. correctness: both implementations on the first 10k posts must agree
head -n 10000 "$posts" > "$out/check.jsonl"
"$meta" -q --rules "$rules" --image-pattern "$pat" --no-check-images -j 1 "$out/check.jsonl" \
    > "$out/check_sdmeta.jsonl" 2>/dev/null
python3 "$here/meta_ref.py" "$rules" "$out/check.jsonl" "$out/check_ref.jsonl" "$pat" 2>/dev/null
python3 "$here/compare.py" "$out/check_sdmeta.jsonl" "$out/check_ref.jsonl" || echo "WARNING: sd-meta and the reference disagree (see above)"

# 2. timing (input in the page cache, output discarded)
cat "$posts" > /dev/null
records=$(wc -l < "$posts")
mb=$(( $(stat -c %s "$posts") / 1048576 ))
seconds() { local t0 t1; t0=$(date +%s.%N); "$@"; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
run_meta() { "$meta" -q --rules "$rules" --image-pattern "$pat" --no-check-images -j "$1" "$posts" >/dev/null 2>/dev/null; }
run_ref() { python3 "$here/meta_ref.py" "$rules" "$posts" /dev/null "$pat" 2>/dev/null; }
t2=$(seconds run_meta 2)
t1=$(seconds run_meta 1)
tp=$(seconds run_ref)
rate() { echo "$records / $1" | bc -l | xargs printf '%.0f'; }
r2=$(rate "$t2"); r1=$(rate "$t1"); rp=$(rate "$tp")
ratio=$(echo "$r1 / $rp" | bc -l | xargs printf '%.1f')
printf '%s posts (%s MiB), %s cores on this machine\n' "$records" "$mb" "$(nproc)"
printf '  sd-meta -j2 : %8.2f s  %9s records/s\n' "$t2" "$r2"
printf '  sd-meta -j1 : %8.2f s  %9s records/s (per core)\n' "$t1" "$r1"
printf '  python ref  : %8.2f s  %9s records/s\n' "$tp" "$rp"
printf '  per core vs python: %sx\n' "$ratio"
ok() { [ "$1" = 1 ] && echo "met" || echo "NOT met"; }
printf 'goal >= 300000 records/s on 2 cores: %s\n' "$(ok "$(echo "$r2 >= 300000" | bc)")"
printf 'goal >= 20x python per core:        %s\n' "$(ok "$(echo "$ratio >= 20" | bc)")"
