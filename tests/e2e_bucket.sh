#!/usr/bin/env bash
# End-to-end run of sd-bucket on a small JSONL with good and bad records:
# outputs, skip counts, order, split balance, determinism and exit codes.
set -u
BIN=$(realpath "${1:?usage: e2e_bucket.sh path/to/sd-bucket}")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# check NAME ACTUAL EXPECTED
check() { [ "$2" == "$3" ] || fail "$1: got '$2', want '$3'"; }

cd "$T" || exit 1
# --- images built byte by byte -------------------------------------------
# JPEG 1920x1080: SOI, SOF0 (height 0x0438, width 0x0780), some padding
printf '\xff\xd8\xff\xc0\x00\x11\x08\x04\x38\x07\x80\x03\x01\x11\x00\x02\x11\x01\x03\x11\x01\xff\xda\x00\x08\x03\x01\x00\x02\x00\x00' > wide.jpg
head -c 2000 /dev/zero >> wide.jpg
# GIF 640x480: a frame of that size (libnsgif, as libvips reads GIFs, ignores a 640x480 screen and a GIF without a frame does not load)
printf 'GIF89a\x80\x02\xe0\x01\x00\x00\x00,\x00\x00\x00\x00\x80\x02\xe0\x01\x00\x02\x02\x4c\x01\x00;' > small.gif
# PNG 1x1 (the classic RGBA one; IHDR CRC 1f15c489)
printf '\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\x00IEND\xaeB`\x82' > one.png
: > empty.jpg
printf '\xff\xd8\xff\xe0\x00\x10JF' > trunc.jpg
echo "just some text" > notes.jpg
mkdir -p shard && cp wide.jpg shard/000001.jpg && tar --format=ustar -cf shard.tar -C shard 000001.jpg
jsize=$(stat -c %s wide.jpg)

cat > in.jsonl <<EOF
{"v":1,"key":"k01","image":"x/a.jpg","width":1920,"height":1080,"caption":"a \"quoted\" caption","extra":{"n":[1,2.50,null],"s":"é"}}
{"v":1,"key":"k02","image":"wide.jpg"}
{"v":1,"key":"k03","image":"small.gif","split":"val"}
{"v":1,"key":"k04","image":"missing.jpg"}
{"v":1,"key":"k05","image":"empty.jpg"}
{"v":1,"key":"k06","image":"trunc.jpg"}
{"v":1,"key":"k07","image":"notes.jpg"}
{"v":1,"key":"k08","image":"huge.jpg","width":100000,"height":100000}
this is not json

{"v":1,"key":"k10","caption":"no image"}
{"v":1,"key":"k11","image":"shard.tar","member":"000001.jpg","offset":512,"size":$jsize}
{"v":1,"key":"k12","image":"one.png"}
{"v":1,"key":"k13","image":"x/b.jpg","width":832,"height":1216,"bucket":[1,2],"crop":"old"}
EOF

# --- plain run ------------------------------------------------------------
printf 'partial\n' > out.jsonl.tmp.Ab12Cd  # a killed run's temporary output: named, not removed
"$BIN" -q in.jsonl -o out.jsonl --report rep.json --plot plot.svg 2> err.txt
check "exit code" $? 0
check "leftover named" "$(grep -c 'out.jsonl.tmp.Ab12Cd: a temporary output left by an earlier run' err.txt)" 1
check "leftover kept" "$(cat out.jsonl.tmp.Ab12Cd)" partial
rm -f out.jsonl.tmp.Ab12Cd
check "records out" "$(wc -l < out.jsonl)" 6
check "order" "$(grep -o '"key":"k[0-9]*"' out.jsonl | tr -d '\n')" '"key":"k01""key":"k02""key":"k03""key":"k11""key":"k12""key":"k13"'
check "unknown fields kept" "$(head -1 out.jsonl | grep -c '"caption":"a \\"quoted\\" caption","extra":{"n":\[1,2.50,null\],"s":"é"}')" 1
check "kohya 1920x1080" "$(grep '"k01"' out.jsonl | grep -o '"bucket".*')" '"bucket":[1344,768],"resize":[1365,768],"crop":[10,0,1354,768],"kohya_crop_ltrb":[0,6.0,1344,762.0]}'
check "size from JPEG header" "$(grep '"k02"' out.jsonl | grep -o '"width":1920,"height":1080,"original_size":\[1920,1080\],"bucket":\[1344,768\]')" '"width":1920,"height":1080,"original_size":[1920,1080],"bucket":[1344,768]'
check "size from GIF header" "$(grep -c '"k03".*"split":"val","width":640,"height":480' out.jsonl)" 1
check "size from tar member" "$(grep -c '"k11".*"width":1920,"height":1080' out.jsonl)" 1
check "tiny PNG upscaled" "$(grep -o '"k12".*"bucket":\[1024,1024\]' out.jsonl | wc -l)" 1
check "old fields replaced" "$(grep '"k13"' out.jsonl | grep -o '"bucket":[^]]*]' | tr -d '\n')" '"bucket":[832,1216]'
check "old crop dropped" "$(grep -c '"crop":"old"' out.jsonl)" 0
for reason in "image file not found" "image file empty or truncated" "not a supported image" \
              "image dimensions out of range" "malformed JSON" "missing image field"; do
    n=$(grep -o "\"$reason\":[0-9]*" rep.json | cut -d: -f2)
    want=1
    [ "$reason" == "image file empty or truncated" ] && want=2
    check "report count '$reason'" "${n:-0}" "$want"
done
check "report totals" "$(grep -o '"records_in":[0-9]*,"records_out":[0-9]*,"skipped":[0-9]*' rep.json)" '"records_in":13,"records_out":6,"skipped":7'
check "plot is svg" "$(head -c 4 plot.svg)" "<svg"
check "plot has bucket label" "$(grep -c '>1344x768<' plot.svg)" 1
if command -v python3 > /dev/null; then
    python3 -c 'import json,sys; json.load(open(sys.argv[1])); [json.loads(l) for l in open(sys.argv[2])]' rep.json out.jsonl \
        || fail "report or output is not valid JSON"
    python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' plot.svg || fail "plot is not well-formed XML"
fi

# skip messages name file:line
"$BIN" in.jsonl -o /dev/null 2> err.txt
check "skip message file:line" "$(grep -c 'skip in.jsonl:9 ' err.txt)" 1
check "skip message for missing" "$(grep -c 'skip in.jsonl:4 .*missing.jpg' err.txt)" 1

# a FIFO where an image should be is skipped, not read (which would block forever);
# a strip whose resize would pass the image pipeline's 65535 limit is skipped here, not
# written for sd-latents to refuse; a UTF-8 BOM before line 1 is not part of the record
mkfifo pipe.png
python3 -c 'import zlib,struct,sys
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
sys.stdout.buffer.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1000, 1, 8, 2, 0, 0, 0)) + chunk(b"IEND", b""))' > strip.png
printf '\xef\xbb\xbf{"v":1,"key":"b1","image":"wide.jpg"}\n{"v":1,"key":"p1","image":"pipe.png"}\n{"v":1,"key":"s1","image":"strip.png"}\n' > odd.jsonl
timeout 60 "$BIN" -r 256x256 odd.jsonl -o odd.out 2> odd.err
check "fifo, strip, BOM: exit" $? 0
check "BOM line read" "$(grep -c '"key":"b1"' odd.out)" 1
check "fifo named" "$(grep -c 'pipe.png: not a regular file (a FIFO)' odd.err)" 1
check "strip refused" "$(grep -c 'resize over 65535 pixels a side' odd.err)" 2
check "only the BOM line out" "$(wc -l < odd.out)" 1
rm -f pipe.png

# a record whose width/height are wrong (a producer's json, a stale dump) is bucketed as they say;
# --read-sizes reads every header instead (sd-latents names it as the remedy), for files and tar members
printf '{"v":1,"key":"w1","image":"wide.jpg","width":480,"height":640}\n{"v":1,"key":"w2","image":"shard.tar","member":"000001.jpg","offset":512,"size":%s,"width":480,"height":640}\n' "$jsize" > wrong.jsonl
check "wrong sizes trusted" "$("$BIN" -q wrong.jsonl | grep -c '"width":480,"height":640')" 2
"$BIN" -q --read-sizes wrong.jsonl > read.jsonl
check "exit code --read-sizes" $? 0
check "--read-sizes: header sizes" "$(grep -c '"width":1920,"height":1080,"original_size":\[1920,1080\],"bucket":\[1344,768\]' read.jsonl)" 2

# stdin gives the same output as a file
"$BIN" -q < in.jsonl > out_stdin.jsonl
cmp -s out.jsonl out_stdin.jsonl || fail "stdin output differs from file output"

# --- exit codes -------------------------------------------------------------
"$BIN" -q --strict in.jsonl -o /dev/null 2> /dev/null
check "--strict with skips" $? 1
head -3 in.jsonl | "$BIN" -q --strict > /dev/null 2>&1
check "--strict without skips" $? 0
"$BIN" --bogus in.jsonl > /dev/null 2>&1
check "unknown option" $? 2
"$BIN" --plan nope in.jsonl > /dev/null 2>&1
check "bad plan" $? 2
"$BIN" --split 3 in.jsonl > /dev/null 2>&1
check "split without -o" $? 2
"$BIN" --split 3 -o 'part.jsonl' in.jsonl > /dev/null 2>&1
check "split -o without %d" $? 2
# --split 0 (PARTS=0 in a Makefile) is a usage error, not one file named part-%d.jsonl
"$BIN" --split 0 -o 'zero-%d.jsonl' in.jsonl > /dev/null 2> zero.err
check "split 0" $? 2
check "split 0 names the range" "$(grep -c 'must be 1..10000' zero.err)" 1
check "split 0 writes nothing" "$(ls zero-* 2>/dev/null | wc -l)" 0
"$BIN" -r 1024 in.jsonl > /dev/null 2>&1
check "bad resolution" $? 2
"$BIN" --plan list --buckets 512x in.jsonl > /dev/null 2>&1
check "bad bucket list" $? 2
"$BIN" -q no-such-input.jsonl > /dev/null 2>&1
check "missing input file" $? 3
# no record bucketed (an empty input, every record skipped): exit 1, -o and the parts left as
# they were, the reasons counted; --allow-empty writes the empty output
echo old > kept.jsonl
: > none.jsonl
"$BIN" -q none.jsonl -o kept.jsonl 2> none.err
check "empty input" $? 1
check "empty input names it" "$(grep -c 'the input holds no records; -o not written' none.err)" 1
grep '"k05"' in.jsonl > allbad.jsonl
"$BIN" allbad.jsonl -o kept.jsonl 2> allbad.err
check "every record skipped" $? 1
check "every record skipped: the reason counted" "$(grep -c '1  image file empty or truncated' allbad.err)" 1
check "every record skipped: -o kept" "$(cat kept.jsonl)" old
echo old > keep-0.jsonl
"$BIN" -q --split 2 -o 'keep-%d.jsonl' allbad.jsonl 2> /dev/null
check "every record skipped, --split" $? 1
check "every record skipped, --split: parts kept" "$(cat keep-0.jsonl)$(ls keep-* | wc -l)" old1
"$BIN" -q --allow-empty allbad.jsonl -o kept.jsonl
check "--allow-empty" $? 0
check "--allow-empty writes the empty output" "$(wc -c < kept.jsonl)" 0
"$BIN" --help > help.txt
check "--help" $? 0
grep -q -- '--split' help.txt || fail "--help lacks --split"
"$BIN" --version > /dev/null
check "--version" $? 0

# --- split balance and determinism ------------------------------------------
awk 'BEGIN { srand(7); for (i = 0; i < 3000; i++) {
        w = int(200 + rand() * 3800); h = int(200 + rand() * 3800);
        if (i % 5 == 0) { w = 1920; h = 1080 }
        printf "{\"key\":\"r%05d\",\"image\":\"img/%05d.jpg\",\"width\":%d,\"height\":%d}\n", i, i, w, h } }' > many.jsonl
"$BIN" -q -j 2 --split 7 --seed 3 -o 'part-%d.jsonl' --report split.json many.jsonl
check "split exit" $? 0
check "split total" "$(cat part-*.jsonl | wc -l)" 3000
check "split keeps every record once" "$(cat part-*.jsonl | grep -o '"key":"r[0-9]*"' | sort -u | wc -l)" 3000
# per-bucket counts per part differ by at most 1, and part totals too
for f in part-*.jsonl; do grep -o '"bucket":\[[0-9]*,[0-9]*\]' "$f" | sed "s|^|$f |"; done |
    awk '{ c[$2 " " $1]++; b[$2] = 1; p[$1] = 1; t[$1]++ }
         END { bad = 0
               for (k in b) { lo = -1; hi = 0
                   for (q in p) { n = c[k " " q] + 0; if (lo < 0 || n < lo) lo = n; if (n > hi) hi = n }
                   if (hi - lo > 1) bad++ }
               lo = -1; hi = 0; for (q in p) { if (lo < 0 || t[q] < lo) lo = t[q]; if (t[q] > hi) hi = t[q] }
               if (hi - lo > 1) bad++
               print bad }' > balance.txt
check "split balance violations" "$(cat balance.txt)" 0
check "split parts" "$(ls part-*.jsonl | wc -l)" 7
mkdir -p again && "$BIN" -q -j 1 --split 7 --seed 3 -o 'again/part-%d.jsonl' many.jsonl
for i in 0 1 2 3 4 5 6; do cmp -s part-$i.jsonl again/part-$i.jsonl || fail "split part $i differs between -j 2 and -j 1 runs"; done
mkdir -p seed && "$BIN" -q --split 7 --seed 4 -o 'seed/part-%d.jsonl' many.jsonl
same=1
for i in 0 1 2 3 4 5 6; do cmp -s part-$i.jsonl seed/part-$i.jsonl || same=0; done
check "another seed rotates differently" $same 0
# inside each part, the records of one bucket keep their input order (the
# split streams: a bucket's records wait only until a round of N is complete)
for f in part-*.jsonl; do
    sed 's/.*"key":"\(r[0-9]*\)".*"bucket":\[\([0-9]*\),\([0-9]*\)\].*/\2x\3 \1/' "$f" |
        awk '{ if (($1 in last) && last[$1] > $2) bad = 1; last[$1] = $2 } END { exit bad }' ||
        fail "$f: records of a bucket are not in input order"
done

# --- a failed --split leaves the earlier parts as they were --------------------
echo STALE > old-0.jsonl
echo STALE > old-1.jsonl
# the records of part 1 get long captions (over the file size limit at its commit), those of
# part 0 short ones: part 0 could be written, part 1 cannot, so all must stay as they were
rec() { printf '{"v":1,"key":"big%d","image":"b.jpg","width":1920,"height":1080,"caption":"%s"}\n' "$1" "$2"; }
for i in 1 2 3 4 5 6; do rec "$i" short; done > big.jsonl
"$BIN" -q --split 2 -o 'probe-%d.jsonl' big.jsonl
for i in 1 2 3 4 5 6; do
    if grep -q "\"big$i\"" probe-1.jsonl; then rec "$i" "$(head -c 200000 /dev/zero | tr '\0' x)"; else rec "$i" short; fi
done > big.jsonl
check "split probe: part 1 holds records" "$(grep -c big probe-1.jsonl)" 3
(trap '' XFSZ; ulimit -f 400; "$BIN" -q --split 2 -o 'old-%d.jsonl' big.jsonl > /dev/null 2>&1)
check "split that cannot write: exit 3" $? 3
check "split that cannot write: part 0 untouched" "$(cat old-0.jsonl)" STALE
check "split that cannot write: part 1 untouched" "$(cat old-1.jsonl)" STALE
check "split that cannot write: no temp files" "$(ls -a | grep -c 'old-.*\.tmp')" 0
# --- write errors name the file -------------------------------------------------
rec 1 "$(head -c 1200000 /dev/zero | tr '\0' y)" > huge.jsonl
(trap '' XFSZ; ulimit -f 400; "$BIN" -q --split 1 -o 'one-%d.jsonl' huge.jsonl > /dev/null 2> err.txt)
check "part that cannot be written: exit 3" $? 3
grep -q "one-0.jsonl: write failed: File too large" err.txt || fail "part write error does not name the part: $(cat err.txt)"
"$BIN" -q many.jsonl -o /dev/full 2> err.txt
check "output on a full device: exit 3" $? 3
grep -q "/dev/full: write failed: No space left on device" err.txt || fail "write error does not name the output: $(cat err.txt)"
head -2 in.jsonl | "$BIN" -q -o /dev/full 2> err.txt
check "small output on a full device: exit 3" $? 3
grep -q "/dev/full: write failed: No space left on device" err.txt || fail "write error at the close does not name the output: $(cat err.txt)"
# --- the split's manifest: the set's identity, every part's records/bytes/hash --------
if command -v python3 > /dev/null; then
    python3 - 'part-%d.jsonl.parts.json' 7 'again/part-%d.jsonl.parts.json' 'seed/part-%d.jsonl.parts.json' <<'PY' || fail "split manifest"
import ctypes, json, os, re, sys
xxh3 = ctypes.CDLL("libxxhash.so.0").XXH3_64bits
xxh3.restype, xxh3.argtypes = ctypes.c_uint64, [ctypes.c_char_p, ctypes.c_size_t]
m, n, again, seed = json.load(open(sys.argv[1])), int(sys.argv[2]), json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", m["set"]), m["set"]
assert m["pattern"] == "part-%d.jsonl" and len(m["parts"]) == n, m
for i, p in enumerate(m["parts"]):
    assert p["file"] == "part-%d.jsonl" % i, p
    assert p["bytes"] == os.path.getsize(p["file"]), p
    assert p["records"] == sum(1 for _ in open(p["file"])), p
    assert re.fullmatch(r"[0-9a-f]{16}", p["xxh3_64"]), p
    with open(p["file"], "rb") as f:  # recomputed by the system's libxxhash (XXH3-64, seed 0)
        data = f.read()
    assert p["xxh3_64"] == "%016x" % xxh3(data, len(data)), p
# the same bytes (-j 1 run) hash the same under another run's id; another seed's parts differ
assert again["set"] != m["set"], (again["set"], m["set"])
assert [p["xxh3_64"] for p in again["parts"]] == [p["xxh3_64"] for p in m["parts"]]
assert all(a["xxh3_64"] != b["xxh3_64"] for a, b in zip(seed["parts"], m["parts"]))
PY
fi
# a split that fails while writing keeps the earlier set's manifest, which still matches its parts
"$BIN" -q --split 2 -o 'fm-%d.jsonl' many.jsonl && cp 'fm-%d.jsonl.parts.json' fm.manifest
(trap '' XFSZ; ulimit -f 400; "$BIN" -q --split 2 -o 'fm-%d.jsonl' big.jsonl > /dev/null 2>&1)
check "failed split: exit 3" $? 3
check "failed split keeps the earlier manifest" "$(cmp -s 'fm-%d.jsonl.parts.json' fm.manifest; echo $?)" 0
# a pattern whose directory holds the number: the manifest goes beside part 0
mkdir -p rank-0 rank-1
"$BIN" -q --split 2 -o 'rank-%d/train.jsonl' many.jsonl
check "split into numbered directories" $? 0
check "manifest beside part 0" "$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(len(m["parts"]))' rank-0/train.jsonl.parts.json)" 2
# --- the renames of a split run back to back; a kill among them leaves no manifest ----
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
    mkdir -p tr
    "$BIN" -q --split 3 -o 'tr/p-%d.jsonl' many.jsonl
    ASAN_OPTIONS=detect_leaks=0 strace -f -o trace.txt -e trace=rename,renameat,renameat2,fsync,fdatasync \
        "$BIN" -q --split 3 --seed 9 -o 'tr/p-%d.jsonl' many.jsonl
    # no fsync between the first part's rename and the last one's (one directory fsync after them)
    check "split renames back to back" "$(awk '/rename.*tr\/p-[0-9]\.jsonl"/ { n++; if (n == 3) { print bad + 0; exit } }
        n > 0 && /fsync/ { bad++ }' trace.txt)" 0
    check "split renames every part" "$(grep -c 'rename.*tr/p-[0-9]\.jsonl"' trace.txt)" 3
    check "manifest after a whole split" "$(ls tr | grep -c 'parts.json$')" 1
    cp tr/p-0.jsonl tr0.old && cp tr/p-1.jsonl tr1.old
    (ASAN_OPTIONS=detect_leaks=0 strace -f -o /dev/null -e trace=rename -e inject=rename:signal=KILL:when=2 \
        "$BIN" -q --split 3 -o 'tr/p-%d.jsonl' many.jsonl; true) 2> /dev/null
    check "a kill between the renames: parts of two runs" "$(cmp -s tr/p-0.jsonl tr0.old; echo $?)$(cmp -s tr/p-1.jsonl tr1.old; echo $?)" 10
    check "a kill between the renames leaves no manifest" "$(ls tr | grep -c 'parts.json$')" 0
else
    echo "e2e_bucket: strace unusable here: rename-order checks skipped"
fi
# --- a split into fewer parts names the earlier split's higher-numbered parts ---------
mkdir -p st
"$BIN" -q --split 4 -o 'st/p-%d.jsonl' many.jsonl
"$BIN" -q --split 2 -o 'st/p-%d.jsonl' many.jsonl 2> err.txt
check "fewer parts: exit 0" $? 0
grep -q 'st/p-2.jsonl, st/p-3.jsonl (2 files) are from an earlier split into more parts, not this one.s 2: remove them before using st/p-\*.jsonl' err.txt ||
    fail "leftover parts of a larger split not named: $(cat err.txt)"
"$BIN" -q --split 4 -o 'st/p-%d.jsonl' many.jsonl 2> err.txt
check "no leftover warning when there are none" "$(grep -c 'earlier split' err.txt)" 0
# --- bucket sides must be multiples of 8; options a plan ignores are named ------
"$BIN" -q --steps 4 in.jsonl > /dev/null 2>&1
check "--steps 4" $? 2
"$BIN" --steps 12 in.jsonl > /dev/null 2> warn.txt
check "--steps 12" $? 2
grep -q "adjusted to multiples" warn.txt && fail "a refused plan's sizes were reported as adjusted"
"$BIN" --steps 16 --min-bucket 300 in.jsonl > /dev/null 2> warn.txt
grep -q "adjusted to multiples of 16: min 288" warn.txt || fail "a used plan's adjusted sizes are not reported"
"$BIN" -q --plan list --buckets 1001x563 in.jsonl > /dev/null 2>&1
check "list bucket 1001x563" $? 2
"$BIN" --plan sdxl -r 512x512 --steps 32 in.jsonl 2> warn.txt > /dev/null
grep -q -- "--resolution does nothing with --plan sdxl" warn.txt || fail "sdxl plan does not name the ignored -r"
grep -q -- "--steps does nothing with --plan sdxl" warn.txt || fail "sdxl plan does not name the ignored --steps"
"$BIN" in.jsonl 2> warn.txt > /dev/null
grep -q "does nothing" warn.txt && fail "default options warned as unused"
# --- a --report or --plot that cannot be written: refused before -o is published
rm -f pub.jsonl
"$BIN" -q in.jsonl -o pub.jsonl --report nodir/r.json 2> pub.err
check "unwritable --report: exit" $? 3
check "unwritable --report: -o not published" "$([ -e pub.jsonl ] && echo published || echo absent)" absent
check "unwritable --report: named" "$(grep -c 'nodir/r.json' pub.err)" 1
"$BIN" -q in.jsonl -o pub.jsonl --plot nodir/p.svg 2> pub.err
check "unwritable --plot: -o not published" "$([ -e pub.jsonl ] && echo published || echo absent)" absent
# --- other plans ------------------------------------------------------------
"$BIN" -q --plan sdxl in.jsonl | grep -q '"key":"k01".*"bucket":\[1344,768\]' || fail "sdxl plan 1920x1080"
"$BIN" -q --plan list --buckets 768x512,512x768 in.jsonl | grep '"k01"' | grep -q '"bucket":\[768,512\]' || fail "list plan"
"$BIN" -q --plan list --buckets 768x512,512x768 --report list.json in.jsonl > /dev/null
check "list plan's buckets in the report" "$(grep -c '"plan":{"name":"list","no_upscale":false,"buckets":\[\[512,768\],\[768,512\]\]}' list.json)" 1
"$BIN" -q --plan multires --min-res 512 --max-res 1024 in.jsonl -o mr.jsonl
check "multires skips below min-res" "$(grep -c '"k12"' mr.jsonl)" 0
"$BIN" -q --no-upscale in.jsonl | grep '"k03"' | grep -q '"bucket":\[640,448\],"resize":\[640,480\]' || fail "no-upscale keeps 640x480"

if [ $fails -ne 0 ]; then
    echo "e2e_bucket: $fails failure(s)"
    exit 1
fi
echo "e2e_bucket: ok"
