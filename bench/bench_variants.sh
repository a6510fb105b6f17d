#!/bin/bash
# Caption variants (issue 30), run by hand: N Danbooru-like posts
# (bench/gen_danbooru.py) through sd-meta with --caption-variants K (the tags
# after the rating shuffled, 10% of them dropped) against K = 1: records and
# variants made per second; then each output's captions attached by
# sd-latents --text-only, with the tiny CLIP encoder of the tests
# (tests/tiny_clip.py: the real tokenizer, width 32, 2 layers), to a shard of
# N latent records (tests/shard_writer.c): captions looked up, distinct
# embeddings stored, and the text and variants databases' bytes per record
# (LMDB pages x page size) for K variants against one embedding per record.
# usage: bench/bench_variants.sh BUILD_DIR [N] [K]   (a Release build with the
#        tests built: shard_writer; python3 with numpy, or PYTHON=path)
# Results: bench/RESULTS.md, "Caption variants".
set -euo pipefail
PY=${PYTHON:-python3}
B=$(realpath "${1:-build}")
N=${2:-100000}
K=${3:-8}
here=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" "$here/gen_danbooru.py" "$N" "$T/posts.jsonl"
"$PY" - "$T/enc" "$here/../tests" << 'PY'
import os, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from tiny_clip import make_encoder, make_tokenizer
make_tokenizer(os.path.join(sys.argv[1], "tokenizer"), os.path.join(sys.argv[2], "golden", "tokenizer"))
make_encoder(os.path.join(sys.argv[1], "text_encoder"), np.random.default_rng(3), 32)
PY
now() { date +%s.%N; }
opts=(-q --template '{rating}, {tags}' -j 2)
cat "$T/posts.jsonl" > /dev/null
t0=$(now); "$B/tools/sd-meta" "${opts[@]}" "$T/posts.jsonl" -o "$T/k1.jsonl" 2>/dev/null || true; t1=$(now)
"$B/tools/sd-meta" "${opts[@]}" --caption-variants "$K" --variant-shuffle --keep-tokens 1 --tag-dropout 0.1 \
    "$T/posts.jsonl" -o "$T/kK.jsonl" 2>/dev/null || true
t2=$(now)
# the records renamed rec000000... (what shard_writer names its records), one per line
"$PY" - "$T" << 'PY'
import json, sys
t = sys.argv[1]
for name in ("k1", "kK"):
    with open("%s/%s.jsonl" % (t, name)) as f, open("%s/%s.names.jsonl" % (t, name), "w") as g:
        for i, line in enumerate(f):
            r = json.loads(line)
            out = {"key": "rec%06d" % i, "caption": r["caption"]}
            if "captions" in r:
                out["captions"] = r["captions"]
            g.write(json.dumps(out) + "\n")
PY
recs=$(wc -l < "$T/k1.names.jsonl")
"$B/tests/shard_writer" write "$T/s1.shard" "$recs" 5000 notext nosync > /dev/null
cp "$T/s1.shard" "$T/sK.shard"
t3=$(now); "$B/tools/sd-latents" --text "$T/enc" --text-only -o "$T/s1.shard" "$T/k1.names.jsonl" 2> "$T/l1.log"; t4=$(now)
"$B/tools/sd-latents" --text "$T/enc" --text-only -o "$T/sK.shard" "$T/kK.names.jsonl" 2> "$T/lK.log"; t5=$(now)
"$PY" - "$T" "$recs" "$K" "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" "$N" << 'PY'
import json, re, subprocess, sys
t, recs, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0, t1, t2, t3, t4, t5 = map(float, sys.argv[4:10])
def db_bytes(shard, db):
    env = subprocess.run(["mdb_stat", "-n", "-e", shard], capture_output=True, text=True).stdout
    out = subprocess.run(["mdb_stat", "-n", "-s", db, shard], capture_output=True, text=True).stdout
    if not out:
        return 0, 0
    get = lambda w, o=out: int(re.search(w + r": (\d+)", o).group(1))
    return get("Entries"), (get("Branch pages") + get("Leaf pages") + get("Overflow pages")) * get("Page size", env)
with open(t + "/kK.names.jsonl") as f:
    nvar = sum(len(json.loads(l).get("captions", [1])) for l in f)
print("%d posts -> %d records; sd-meta K=1 %.2f s (%.0f records/s), K=%d %.2f s (%.0f records/s, %.0f variants/s, "
      "%.2f variants/record)" % (int(sys.argv[10]), recs, t1 - t0, recs / (t1 - t0), k, t2 - t1, recs / (t2 - t1),
                                 nvar / (t2 - t1), nvar / recs))
for name, dt in (("1", t4 - t3), (str(k), t5 - t4)):
    log = open("%s/l%s.log" % (t, "1" if name == "1" else "K")).read()
    m = re.search(r"text: (\d+) captions looked up, (\d+) embeddings computed", log)
    nt, bt = db_bytes("%s/s%s.shard" % (t, "1" if name == "1" else "K"), "text")
    nv, bv = db_bytes("%s/s%s.shard" % (t, "1" if name == "1" else "K"), "variants")
    print("K=%s: --text-only %.1f s, %s captions looked up, %s embeddings computed; text db %d entries, %.0f bytes/record; "
          "variants db %d entries, %.0f bytes/record; text+variants %.0f bytes/record"
          % (name, dt, m.group(1) if m else "?", m.group(2) if m else "?", nt, bt / recs, nv, bv / recs, (bt + bv) / recs))
PY
