#!/usr/bin/env python3
"""Fault and corruption tests of the shard store, end to end through
sd-verify and the test writer (tests/shard_writer.c):
  - a writer killed with SIGKILL at random points, many times: the shard
    always opens, sd-verify finds nothing wrong, a rerun completes the set;
  - a read-only sd-verify running while the writer commits;
  - a full map with growth disabled, and a full disk (RLIMIT_FSIZE): a clear
    error and an intact, verifiable shard;
  - bit flips, truncations and extensions written through LMDB, and bit
    flips in the file at live record bytes: sd-verify reports every damaged
    record and --repair deletes exactly those (and the records whose text
    embedding it deleted), leaving a clean shard that a rerun completes;
  - a damaged index (bindex and names entries removed): --repair rebuilds it
    and keeps every record;
  - two records of one name: reported, --repair keeps the one the names
    index leads to;
  - names entries leading to a record of another name: reported (also
    through --manifest), --repair drops them and keeps every record;
  - report-only problems: a record of a newer format version (kept by
    --repair, unlike one whose version field is damaged) and an empty_text
    meta naming a missing embedding;
  - LMDB's lock file on a full disk (a clear error, not SIGBUS) and in a
    directory the user may not write (read without it, with a warning);
  - a shard file cut short: refused with a clear error (exit 3) by sd-verify
    (which still checks the next shard), --repair and sd-pack merge (run
    from beside sd-verify), never SIGBUS;
  - one flipped bit in an LMDB page (a B-tree page's header or nodes, a meta
    page): sd-verify never crashes (no signal, no sanitizer report) and
    reports damaged_page; --repair leaves a clean shard holding only
    records of the original, and a rerun of the writer completes it; a
    damaged root or directory page of the newest snapshot is salvaged from
    the snapshot before it (all but the last commit's records).
usage: e2e_shard.py SD_VERIFY SHARD_WRITER"""
import glob
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time

VERIFY, WRITER = sys.argv[1], sys.argv[2]
failures = 0
N = 3000
KILL_N = 80000


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print("FAIL:", what, file=sys.stderr)
    return ok


def verify(shard, *args):
    """Run sd-verify with a report; returns (exit code, report, stderr)."""
    rep = shard + ".report.json"
    if os.path.exists(rep):
        os.unlink(rep)
    p = subprocess.run([VERIFY, "-q", "-j2", "--examples", "100000", "--report", rep, shard, *args],
                       capture_output=True, text=True)
    report = json.load(open(rep)) if os.path.exists(rep) else None
    return p.returncode, report, p.stderr


def write(shard, n, *flags, **kw):
    return subprocess.run([WRITER, "write", shard, str(n), *flags], capture_output=True, text=True, **kw)


def report_keys(report):
    """(db, hex key) of every record-level problem in a report."""
    out = set()
    for ex in report["shards"][0]["examples"]:
        k = ex.get("key")
        if k is None or ex["db"] == "index":
            continue
        if len(k) != 32 or any(c not in "0123456789abcdef" for c in k):
            k = k.encode().hex()
        out.add((ex["db"], k))
    return out


def test_kills(d):
    shard = os.path.join(d, "kill.shard")
    rng = random.Random(4)
    killed = 0
    # first commit before the kills: a shard killed before its first commit
    # is empty and sd-verify rightly refuses it (exit 3, "empty shard")
    check(write(shard, 16, "16").returncode == 0, "first records")
    for i in range(30):
        flags = ["8"] + (["nosync"] if i % 2 else [])
        p = subprocess.Popen([WRITER, "write", shard, str(KILL_N), *flags], stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.005, 0.1))
        p.send_signal(signal.SIGKILL)
        rc = p.wait()
        killed += rc == -signal.SIGKILL
        vrc, rep, err = verify(shard)
        if not check(vrc == 0, "after kill %d: sd-verify exit %d: %s" % (i, vrc, err.strip()[-300:])):
            break
    check(killed >= 20, "only %d of 30 writers were killed mid-run" % killed)
    vrc, rep, err = verify(shard)
    before = rep["shards"][0]["records"] if rep else -1
    done = write(shard, KILL_N, "64", "nosync")
    check(done.returncode == 0, "final rerun: " + done.stderr)
    vrc, rep, err = verify(shard)
    check(vrc == 0 and rep["shards"][0]["records"] == KILL_N, "after rerun: %d %s" % (vrc, err))
    print("kills: %d SIGKILLs mid-write (%d records stored by then), shard verified after each;"
          " rerun completed %d records" % (killed, before, KILL_N))


def test_concurrent_reader(d):
    shard = os.path.join(d, "conc.shard")
    check(write(shard, 50, "8").returncode == 0, "first records")
    p = subprocess.Popen([WRITER, "write", shard, str(N), "4", "slow"], stderr=subprocess.PIPE)
    runs = 0
    while p.poll() is None or runs == 0:
        if os.path.exists(shard):
            vrc, rep, err = verify(shard)
            check(vrc == 0, "concurrent verify: %d %s" % (vrc, err))
            runs += 1
    check(p.wait() == 0, "slow writer failed")
    check(runs >= 3, "only %d concurrent verifies" % runs)
    print("concurrent: %d read-only verifies during the write, all clean" % runs)


def test_full(d):
    shard = os.path.join(d, "full.shard")
    p = write(shard, 20000, "16", "nogrow", "map=262144")
    check(p.returncode == 3 and "full" in p.stderr, "nogrow: %d %s" % (p.returncode, p.stderr))
    vrc, rep, err = verify(shard)
    check(vrc == 0 and rep["shards"][0]["records"] > 0, "after full map: %d %s" % (vrc, err))
    print("full map:", p.stderr.strip(), "->", rep["shards"][0]["records"], "records intact")

    shard = os.path.join(d, "disk.shard")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    p = write(shard, 20000, "16", preexec_fn=limit)
    check(p.returncode == 3 and "commit failed" in p.stderr, "fsize: %d %s" % (p.returncode, p.stderr))
    vrc, rep, err = verify(shard)
    n = rep["shards"][0]["records"] if rep else -1
    check(vrc == 0 and n > 0, "after full disk: %d %s" % (vrc, err))
    print("full disk:", p.stderr.strip(), "->", n, "records intact")
    p = write(shard, 20000, "64")
    vrc, rep, err = verify(shard)
    check(p.returncode == 0 and vrc == 0 and rep["shards"][0]["records"] == 20000, "rerun after full disk")


def messages_whole(err):
    """No problem message has an empty field ("SHARD: : why", "name : why")."""
    return not any(": : " in line or " name : " in line or line.endswith(" name") for line in err.splitlines())


def latent_keys(shard):
    """Hex keys of the latent records stored in a shard."""
    out = subprocess.run([WRITER, "locate", shard], capture_output=True, text=True)
    return {line.split()[2] for line in out.stdout.splitlines()}


def corrupt_round(shard, damaged, what, refs=frozenset()):
    """Verify must report every damaged record; repair must delete exactly
    the damaged latent records and those referencing a damaged text
    embedding (refs), keep every other record and verify clean; rewrite."""
    vrc, rep, err = verify(shard)
    found = report_keys(rep) if rep else set()
    missed = damaged - found
    check(vrc == 1 and not missed, "%s: exit %d, %d of %d damaged records not reported" % (what, vrc, len(missed), len(damaged)))
    check(messages_whole(err), "%s: a message with an empty field: %s" % (what, err))
    before = latent_keys(shard)
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["problems_after_repair"] == 0, "%s: repair: %d %s" % (what, vrc, err))
    deleted = before - latent_keys(shard)
    expected = {k for db, k in damaged if db == "latents"} | set(refs)
    check(deleted == expected, "%s: repair deleted %d records, expected %d (%d intact records lost)"
          % (what, len(deleted), len(expected), len(deleted - expected)))
    vrc, rep, err = verify(shard)
    check(vrc == 0, "%s: after repair: %d %s" % (what, vrc, err))
    p = write(shard, 600, "32")
    vrc, rep, err = verify(shard)
    check(p.returncode == 0 and vrc == 0 and rep["shards"][0]["records"] == 600, "%s: rewrite after repair" % what)
    return len(damaged) - len(missed)


def test_corruption(d):
    shard = os.path.join(d, "corrupt.shard")
    check(write(shard, 600, "32").returncode == 0, "write")
    tried = detected = 0
    for r in range(5):
        out = subprocess.run([WRITER, "corrupt", shard, "40", str(r + 1)], capture_output=True, text=True)
        lines = [tuple(line.split()) for line in out.stdout.splitlines()]
        damaged = {x for x in lines if x[0] != "ref"}
        refs = {x[1] for x in lines if x[0] == "ref"}
        tried += len(damaged)
        detected += corrupt_round(shard, damaged, "lmdb round %d" % r, refs)
    print("corruption through LMDB (bit flips in header/payload, truncations, extensions): %d/%d detected" % (detected, tried))
    ftried = fdetected = 0
    rng = random.Random(9)
    for r in range(3):
        out = subprocess.run([WRITER, "locate", shard], capture_output=True, text=True)
        recs = [line.split() for line in out.stdout.splitlines()]
        damaged = set()
        with open(shard, "r+b") as f:
            for off, length, key in rng.sample(recs, 30):
                pos = int(off) + rng.randrange(int(length))
                f.seek(pos)
                b = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([b ^ (1 << rng.randrange(8))]))
                damaged.add(("latents", key))
        ftried += len(damaged)
        fdetected += corrupt_round(shard, damaged, "file round %d" % r)
    print("bit flips in the file at live record bytes: %d/%d detected" % (fdetected, ftried))


def tree_pages(path):
    """(page size, [page numbers]) of the pages of an LMDB file that look
    like B-tree pages: a header naming its own page, branch or leaf flags
    (some are free pages of older snapshots: flipping those is harmless)."""
    data = open(path, "rb").read()
    psize = struct.unpack_from("<I", data, 16 + 24)[0]  # the free DB's md_pad holds the page size
    pages = []
    for pg in range(2, len(data) // psize):
        pgno, flags = struct.unpack_from("<Q", data, pg * psize)[0], struct.unpack_from("<H", data, pg * psize + 10)[0]
        if pgno == pg and flags & 3 and not flags & 4:
            pages.append(pg)
    return psize, pages


def no_crash(p):
    """A tool that ended by itself, with no sanitizer report."""
    return p.returncode in (0, 1, 3) and "Sanitizer" not in p.stderr and "runtime error" not in p.stderr


def named_root(path, name):
    """Root page of a named database: the newest meta's main tree (one leaf
    in a small shard), the node whose key is name."""
    data = open(path, "rb").read()
    ps = struct.unpack_from("<I", data, 16 + 24)[0]
    meta = max((struct.unpack_from("<Q", data, i * ps + 16 + 128)[0], i) for i in range(2))[1] * ps
    main = struct.unpack_from("<Q", data, meta + 16 + 72 + 40)[0] * ps
    lower = struct.unpack_from("<H", data, main + 12)[0]
    for i in range((lower - 16) // 2):
        node = main + struct.unpack_from("<H", data, main + 16 + 2 * i)[0]
        ksize = struct.unpack_from("<H", data, node + 6)[0]
        if data[node + 8:node + 8 + ksize] == name.encode():
            return struct.unpack_from("<Q", data, node + 8 + ksize + 40)[0]
    return None


def test_damaged_root(d, base):
    """The latents tree's root page with its node bounds damaged: sd-verify
    reports damaged_page naming the page (exit 1) without reading a record,
    sd-pack merge refuses the input (exit 3, no output left), --repair
    salvages what it can and leaves a clean shard: every record hangs below
    that root, so the newest snapshot gives none, and the snapshot before it
    (LMDB's other meta page, its own root page) gives all but the last
    commit's (the writer's last batch: records 576..599). LMDB's directory of
    databases damaged in the newest snapshot: salvaged from the older one;
    damaged in both: refused, the file left as it was."""
    before_last = os.path.join(d, "before-last.shard")  # what the older snapshot holds
    check(write(before_last, 576, "32").returncode == 0, "write")
    want_keys = latent_keys(before_last)
    shard = os.path.join(d, "root.shard")
    data = bytearray(open(base, "rb").read())
    root = named_root(base, "latents")
    if not check(root is not None, "damaged root: no latents database found"):
        return
    struct.pack_into("<H", data, root * 4096 + 12, 0xFFFF)  # lower past upper and the page
    open(shard, "wb").write(data)
    want = "the latents database's page %d: its node bounds are damaged" % root
    vrc, rep, err = verify(shard)
    kinds_found = rep["shards"][0]["by_kind"] if rep else {}
    check(vrc == 1 and kinds_found == {"damaged_page": 1} and want in err,
          "damaged root: sd-verify exit %d, %s: %s" % (vrc, kinds_found, err[-300:]))
    pack = os.path.join(os.path.dirname(VERIFY), "sd-pack")
    p = subprocess.run([pack, "merge", "-q", "-o", os.path.join(d, "rm.shard"), shard], capture_output=True, text=True)
    left = [f for f in os.listdir(d) if f.startswith("rm.shard")]
    check(p.returncode == 3 and "damaged shard: " + want in p.stderr and not left,
          "damaged root: sd-pack merge exit %d, left %s: %s" % (p.returncode, left, p.stderr[-300:]))
    vrc, rep, err = verify(shard, "--repair")
    sal = rep["shards"][0].get("salvaged", {}) if rep else {}
    check(vrc == 1 and sal.get("records") == 576 and sal.get("from_older_snapshot", 0) >= 576
          and sal.get("older_snapshot") is True and sal.get("header_records") == 600 and sal.get("text_records", 0) > 0,
          "damaged root: --repair exit %d, salvaged %s: %s" % (vrc, sal, err[-300:]))
    vrc, rep, err = verify(shard)
    check(vrc == 0 and rep["shards"][0]["records"] == 576 and latent_keys(shard) == want_keys,
          "damaged root: after --repair exit %d: %s" % (vrc, err))
    left = [f for f in os.listdir(d) if ".salvage-" in f]
    check(not left, "damaged root: salvage left %s" % left)
    check(sal.get("kept") == shard + ".damaged" and open(shard + ".damaged", "rb").read() == data,
          "damaged root: the damaged file is not kept as root.shard.damaged: %s" % sal)
    # LMDB's directory of databases damaged in the newest snapshot: the older one's is its own
    # page, so the salvage takes everything from it
    data = bytearray(open(base, "rb").read())
    metas = sorted((struct.unpack_from("<Q", data, i * 4096 + 16 + 128)[0], i) for i in range(2))
    mains = [struct.unpack_from("<Q", data, i * 4096 + 16 + 72 + 40)[0] for _, i in metas]  # older, newest
    check(mains[0] != mains[1], "damaged directory: both snapshots share their main page %s" % mains)
    data[mains[1] * 4096] ^= 1  # the newest main tree's page names another page
    open(shard, "wb").write(data)
    vrc, rep, err = verify(shard, "--repair")
    sal = rep["shards"][0].get("salvaged", {}) if rep else {}
    check(vrc == 1 and sal.get("records") == 576 and sal.get("from_older_snapshot", 0) >= 576
          and sal.get("older_snapshot") is True, "damaged directory: --repair exit %d, salvaged %s: %s" %
          (vrc, sal, err[-300:]))
    vrc, rep, err = verify(shard)
    check(vrc == 0 and latent_keys(shard) == want_keys, "damaged directory: after --repair exit %d: %s" % (vrc, err))
    # damaged in both: nothing can be told apart, so --repair must not replace the file with
    # an empty shard; it says so and leaves the file as it is
    for f in glob.glob(shard + ".damaged*"):
        os.unlink(f)
    data[mains[0] * 4096] ^= 1
    open(shard, "wb").write(data)
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and "not salvaged: LMDB's directory of databases is damaged" in err and "too" in err
          and rep["shards"][0]["problems_after_repair"] == 1 and open(shard, "rb").read() == data
          and not os.path.exists(shard + ".damaged"),
          "damaged directory in both snapshots: --repair exit %d: %s" % (vrc, err[-300:]))


def damage_root(path, name):
    """Damage the node bounds of a named database's root page in the newest snapshot."""
    data = bytearray(open(path, "rb").read())
    root = named_root(path, name)
    struct.pack_into("<H", data, root * 4096 + 12, 0xFFFF)
    open(path, "wb").write(data)
    return data


def test_salvage_older_snapshot_edges(d):
    """The older snapshot's walk, in the cases a review found wrong: a last commit that raised
    format_version (the older snapshot's version must not clear the refusal); a bad record in
    both snapshots (dropped once, not twice), and the meta entries of a file whose newest meta
    tree is damaged (the original created, not the new file's own); a record with no name (the format allows it) in
    the older snapshot (the salvage used to stop on the empty name's lookup); records the last
    commit damaged that are sound in the older snapshot (taken from it); a newest snapshot whose
    only damage is its freelist (nothing hidden: the older one is not read)."""
    # format_version raised by the last commit, the shared latents root damaged: refused, unchanged
    s = os.path.join(d, "newer.shard")
    check(write(s, 100, "32").returncode == 0, "write")
    subprocess.run([WRITER, "meta", s, "format_version", "2"], check=True)
    data = damage_root(s, "latents")  # shared by both snapshots; the newest one's meta says version 2
    vrc, rep, err = verify(s, "--repair")
    check(vrc == 1 and "not salvaged: it holds a shard of a newer format" in err and open(s, "rb").read() == data,
          "newer format in the last commit: --repair exit %d: %s" % (vrc, err[-300:]))
    # one bad record in both snapshots, the newest meta root damaged: dropped once; the older
    # snapshot's created and format_version replace the new file's own
    s = os.path.join(d, "dropped.shard")
    check(write(s, 100, "32").returncode == 0, "write")
    subprocess.run([WRITER, "newver", s, "rec000005", "damaged"], check=True, capture_output=True)
    subprocess.run([WRITER, "meta", s, "note", "x"], check=True)
    damage_root(s, "meta")
    vrc, rep, err = verify(s, "--repair")
    sal = rep["shards"][0].get("salvaged", {}) if rep else {}
    # newver adds a 101st record, of a newer version with its header damaged: refused by the store
    check(sal.get("dropped") == 1 and sal.get("older_snapshot") is True and sal.get("records") == 100
          and sal.get("meta") == 2 and sal.get("from_older_snapshot") == 2,
          "bad record in both snapshots: --repair exit %d, salvaged %s: %s" % (vrc, sal, err[-300:]))
    # an unnamed record in the older snapshot, the newest latents root damaged: salvaged with it
    s = os.path.join(d, "unnamed.shard")
    check(write(s, 100, "32").returncode == 0, "write")
    subprocess.run([WRITER, "unnamed", s, "rec000001"], check=True)
    before = latent_keys(s)
    check(("55" * 16) in before and ("56" * 16) in before, "unnamed: the writer's two records are not there")
    damage_root(s, "latents")
    vrc, rep, err = verify(s, "--repair")
    sal = rep["shards"][0].get("salvaged", {}) if rep else {}
    kept = latent_keys(s)
    check(sal.get("records") == 101 and kept == before - {"56" * 16},
          "unnamed record: --repair exit %d, salvaged %s, %d records: %s" % (vrc, sal, len(kept), err[-300:]))
    # records damaged by the last commit (header, payload, length), sound in the older snapshot:
    # the newest copies are dropped, the older ones taken, every record kept
    s = os.path.join(d, "stale.shard")
    check(write(s, 100, "32").returncode == 0, "write")
    before = latent_keys(s)
    bad = subprocess.run([WRITER, "corrupt", s, "4", "7", "indexed"], capture_output=True, text=True, check=True)
    nbad = len(bad.stdout.split("\n")) - 1
    damage_root(s, "meta")  # the meta tree, untouched by that commit: damaged in both snapshots
    vrc, rep, err = verify(s, "--repair")
    sal = rep["shards"][0].get("salvaged", {}) if rep else {}
    check(nbad == 4 and sal.get("records") == 100 and sal.get("dropped") == 4 and sal.get("from_older_snapshot", 0) >= 4
          and latent_keys(s) == before, "records damaged by the last commit: --repair exit %d, salvaged %s: %s"
          % (vrc, sal, err[-300:]))
    # only the freelist damaged: salvaged from the newest snapshot alone
    s = os.path.join(d, "freelist.shard")
    check(write(s, 100, "32").returncode == 0, "write")
    subprocess.run([WRITER, "meta", s, "note", "x"], check=True)
    data = bytearray(open(s, "rb").read())
    meta = max((struct.unpack_from("<Q", data, i * 4096 + 16 + 128)[0], i) for i in range(2))[1] * 4096
    free_root = struct.unpack_from("<Q", data, meta + 16 + 24 + 40)[0]
    if check(free_root != 2 ** 64 - 1, "freelist: the shard has no freelist to damage"):
        data[free_root * 4096] ^= 1  # the freelist's root page names another page
        open(s, "wb").write(data)
        vrc, rep, err = verify(s, "--repair")
        sal = rep["shards"][0].get("salvaged", {}) if rep else {}
        check(sal.get("older_snapshot") is False and sal.get("records") == 100,
              "freelist damage: --repair exit %d, salvaged %s: %s" % (vrc, sal, err[-300:]))


def test_key_size(d, base):
    """A latents leaf node whose key size lost its bit (16 -> 0 bytes): LMDB
    reads it (its value shifted), but no key of 0 bytes can be named to
    delete it; the page walk calls it damage, and --repair's salvage copies
    every other record."""
    shard = os.path.join(d, "key.shard")
    data = bytearray(open(base, "rb").read())
    page = named_root(base, "latents")
    while page is not None and struct.unpack_from("<H", data, page * 4096 + 10)[0] & 1:  # down the first branch
        node = page * 4096 + struct.unpack_from("<H", data, page * 4096 + 16)[0]
        page = struct.unpack_from("<I", data, node)[0] | struct.unpack_from("<H", data, node + 4)[0] << 32
    node = page * 4096 + struct.unpack_from("<H", data, page * 4096 + 16)[0]
    if not check(struct.unpack_from("<H", data, node + 6)[0] == 16, "key size: the first leaf node's key is not 16 bytes"):
        return
    struct.pack_into("<H", data, node + 6, 0)
    open(shard, "wb").write(data)
    vrc, rep, err = verify(shard)
    check(vrc == 1 and "node 0 has a key of 0 bytes" in err, "key size: sd-verify exit %d: %s" % (vrc, err[-300:]))
    vrc, rep, err = verify(shard, "--repair")
    sal = rep["shards"][0].get("salvaged", {}) if rep else {}
    check(vrc == 1 and sal.get("records") == 599 and rep["shards"][0]["problems_after_repair"] == 0,
          "key size: --repair exit %d, salvaged %s: %s" % (vrc, sal, err[-300:]))
    vrc, rep, err = verify(shard)
    check(vrc == 0 and rep["shards"][0]["records"] == 599, "key size: after --repair exit %d: %s" % (vrc, err[-300:]))


def test_damaged_pages(d):
    base = os.path.join(d, "pages.shard")
    check(write(base, 600, "32").returncode == 0, "write")
    test_damaged_root(d, base)
    test_salvage_older_snapshot_edges(d)
    test_key_size(d, base)
    psize, pages = tree_pages(base)
    original = latent_keys(base)
    rng = random.Random(12)
    shard = os.path.join(d, "flip.shard")
    outcome = {"salvaged": 0, "records": 0, "harmless": 0, "refused": 0}
    trials = 120
    for i in range(trials):
        for f in (shard, shard + "-lock", shard + ".damaged"):
            if os.path.exists(f):
                os.unlink(f)
        data = bytearray(open(base, "rb").read())
        if i % 10 == 9:  # a meta page: its database roots, counts, last page, txnid
            pos = rng.randrange(2) * psize + 16 + rng.randrange(24, 136)
        else:
            pg = rng.choice(pages)
            pos = pg * psize + (rng.randrange(16) if i % 2 else rng.randrange(16, psize))
        data[pos] ^= 1 << rng.randrange(8)
        open(shard, "wb").write(data)
        what = "flip %d at byte %d (page %d, +%d)" % (i, pos, pos // psize, pos % psize)
        p = subprocess.run([VERIFY, "-q", shard], capture_output=True, text=True)
        if not check(no_crash(p), "%s: sd-verify: exit %d %s" % (what, p.returncode, p.stderr[-400:])):
            continue
        r = subprocess.run([VERIFY, "-q", "--repair", shard], capture_output=True, text=True)
        if not check(no_crash(r), "%s: --repair: exit %d %s" % (what, r.returncode, r.stderr[-400:])):
            continue
        if r.returncode == 3 or "not salvaged" in r.stderr:
            # LMDB's meta pages or its directory of databases damaged: refused, the file left as it was
            outcome["refused"] += 1
            check("error" in r.stderr and open(shard, "rb").read() == data,
                  "%s: --repair refused (exit %d) but changed the file: %s" % (what, r.returncode, r.stderr[-300:]))
            continue
        # salvaged: the page walk found damage; records: a flip in a key or
        # an index entry the record checks found; harmless: a free page's bytes
        outcome["salvaged" if "damaged pages" in r.stderr else "records" if p.returncode else "harmless"] += 1
        v = subprocess.run([VERIFY, "-q", shard], capture_output=True, text=True)
        check(v.returncode == 0, "%s: after --repair: exit %d %s" % (what, v.returncode, v.stderr[-400:]))
        kept = latent_keys(shard)
        check(kept <= original, "%s: %d records after --repair that the shard never held" % (what, len(kept - original)))
        if i % 20 == 0:
            w = write(shard, 600, "32")
            v = subprocess.run([VERIFY, "-q", shard], capture_output=True, text=True)
            check(w.returncode == 0 and v.returncode == 0 and latent_keys(shard) == original,
                  "%s: the writer's rerun after --repair: %s %s" % (what, w.stderr[-200:], v.stderr[-200:]))
    print("flipped bits in LMDB pages: %d trials: %d salvaged by --repair, %d repaired record by record, %d harmless, "
          "%d refused (meta pages or the directory of databases damaged); no crash" % (trials, outcome["salvaged"], outcome["records"], outcome["harmless"],
                                                  outcome["refused"]))


def test_index_repair(d):
    """Only the index is wrong: --repair rebuilds it and deletes nothing."""
    shard = os.path.join(d, "index.shard")
    check(write(shard, 300, "32").returncode == 0, "write")
    before = latent_keys(shard)
    lost = set()
    for db, n in (("bindex", 7), ("names", 5)):
        out = subprocess.run([WRITER, "unindex", shard, db, str(n)], capture_output=True, text=True)
        check(out.returncode == 0, "unindex %s: %s" % (db, out.stderr))
        lost |= {line.split()[1] for line in out.stdout.splitlines()}
    vrc, rep, err = verify(shard)
    kinds = rep["shards"][0]["by_kind"] if rep else {}
    check(vrc == 1 and kinds.get("index_missing") == 7 and kinds.get("name_missing") == 5,
          "damaged index: exit %d, problems %s" % (vrc, kinds))
    check(messages_whole(err) and "index.shard: bucket 64x64: count" in err, "damaged index: messages: %s" % err)
    indexed = {ex.get("key") for ex in rep["shards"][0]["examples"] if ex["db"] == "index"} if rep else set()
    check(lost <= indexed, "damaged index: %d records without an index entry not reported as index problems"
          % len(lost - indexed))
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["repaired_records"] == 0 and rep["shards"][0]["problems_after_repair"] == 0,
          "index repair: exit %d, %s" % (vrc, rep and rep["shards"][0]))
    check(latent_keys(shard) == before, "index repair deleted %d intact records" % len(before - latent_keys(shard)))
    vrc, rep, err = verify(shard)
    check(vrc == 0 and rep["shards"][0]["records"] == 300, "after index repair: %d %s" % (vrc, err))
    print("damaged index (%d entries removed): rebuilt by --repair, all 300 records kept" % len(lost))


def test_duplicate_names(d):
    """Two records of one name (the same image under two keys): reported,
    --repair deletes the copy the names index does not lead to."""
    shard = os.path.join(d, "dup.shard")
    check(write(shard, 40, "8").returncode == 0, "write")
    first = latent_keys(shard)
    check(write(shard, 10, "8", "keyseed=5", "dupnames").returncode == 0, "write duplicates")
    second = latent_keys(shard) - first
    vrc, rep, err = verify(shard)
    check(vrc == 1 and rep["shards"][0]["by_kind"] == {"duplicate_name": 10},
          "duplicate names: exit %d, %s" % (vrc, rep and rep["shards"][0]["by_kind"]))
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["problems_after_repair"] == 0, "duplicate names: repair %d %s" % (vrc, err))
    kept = latent_keys(shard)
    # the names index led to the later copies: they stay, the earlier ones of those 10 names go
    check(len(kept) == 40 and second <= kept, "duplicate names: %d records kept" % len(kept))
    vrc, rep, err = verify(shard)
    check(vrc == 0, "after duplicate repair: %d %s" % (vrc, err))
    print("duplicate names: 10 reported, --repair kept the indexed copy of each")
    # the indexed copy damaged: --repair deletes it and the sound copy takes the name (an index
    # problem), so every image keeps one record
    shard = os.path.join(d, "dup2.shard")
    check(write(shard, 10, "8").returncode == 0 and write(shard, 10, "8", "keyseed=5", "dupnames").returncode == 0,
          "write duplicates 2")
    p = subprocess.run([WRITER, "corrupt", shard, "4", "9", "indexed"], capture_output=True, text=True)
    check(p.returncode == 0 and len(p.stdout.split()) == 8, "corrupt 4 indexed copies: %s" % p.stderr)
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["problems_after_repair"] == 0, "damaged indexed copies: repair %d %s" % (vrc, err))
    kept = latent_keys(shard)
    check(len(kept) == 10, "damaged indexed copies: %d records kept, want 10 (one per image)" % len(kept))
    vrc, rep, err = verify(shard)
    check(vrc == 0, "after repairing damaged indexed copies: %d %s" % (vrc, err))


def entries(shard, db):
    """Entries of one of the shard's databases (mdb_stat)."""
    out = subprocess.run(["mdb_stat", "-n", "-s", db, shard], capture_output=True, text=True).stdout
    m = [l for l in out.splitlines() if "Entries:" in l]
    return int(m[0].split()[-1]) if m else -1


def kinds(rep):
    return rep["shards"][0]["by_kind"] if rep else None


def test_misdirected_names(d):
    """A names entry leading to a record of another name passes no check: the
    entry is an index problem (--repair drops it, every record stays)."""
    shard = os.path.join(d, "misname.shard")
    check(write(shard, 20, "8").returncode == 0, "write")
    before = latent_keys(shard)
    for name, target in (("rec000003", "rec000004"), ("ghost", "rec000005")):
        p = subprocess.run([WRITER, "misname", shard, name, target], capture_output=True, text=True)
        check(p.returncode == 0, "misname %s: %s" % (name, p.stderr))
    vrc, rep, err = verify(shard)
    # rec000003's own record is then not found by its name either: name_misindexed
    check(vrc == 1 and kinds(rep) == {"name_wrong_record": 2, "name_misindexed": 1},
          "misdirected names: exit %d, %s" % (vrc, kinds(rep)))
    check("name ghost: name points to a record named 'rec000005'" in err and messages_whole(err),
          "misdirected names: messages: %s" % err)
    man = os.path.join(d, "misname.jsonl")
    with open(man, "w") as f:
        f.write("".join('{"key": "%s"}\n' % k for k in ("rec000001", "rec000003", "ghost")))
    vrc, rep, err = verify(shard, "--manifest", man)
    check(vrc == 1 and kinds(rep).get("manifest_wrong_record") == 2 and "manifest_missing" not in kinds(rep),
          "misdirected names in the manifest: exit %d, %s" % (vrc, kinds(rep)))
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["repaired_records"] == 0 and rep["shards"][0]["problems_after_repair"] == 0,
          "misdirected names: repair %d %s" % (vrc, rep and rep["shards"][0]))
    check(latent_keys(shard) == before, "misdirected names: repair lost records")
    vrc, rep, err = verify(shard, "--manifest", man)
    check(vrc == 1 and kinds(rep) == {"manifest_missing": 1},
          "after misdirected names repair: %d %s" % (vrc, kinds(rep)))


def test_report_only(d):
    """--repair never deletes a record of a newer format version (one whose
    version field is damaged is a bad header, deleted), nor can it fix an
    empty_text naming a missing embedding: both stay reported, exit 1."""
    shard = os.path.join(d, "newver.shard")
    check(write(shard, 10, "8").returncode == 0, "write")
    newer = subprocess.run([WRITER, "newver", shard, "rec000001"], capture_output=True, text=True).stdout.split()
    damaged = subprocess.run([WRITER, "newver", shard, "rec000002", "damaged"], capture_output=True,
                             text=True).stdout.split()
    check(len(newer) == 2 and len(damaged) == 2, "newver: %s %s" % (newer, damaged))
    vrc, rep, err = verify(shard)
    check(vrc == 1 and kinds(rep) == {"newer_version": 1, "bad_header": 1}, "newer version: %d %s" % (vrc, kinds(rep)))
    check("the version field is damaged" in err, "damaged version field: %s" % err)
    before = latent_keys(shard)
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["repaired_records"] == 1 and rep["shards"][0]["problems_after_repair"] == 1,
          "newer version: repair %d %s" % (vrc, rep and rep["shards"][0]))
    check(latent_keys(shard) == before - {damaged[1]}, "newer version: repair deleted %s, want only the damaged one"
          % sorted(before - latent_keys(shard)))
    vrc, rep, err = verify(shard)
    check(vrc == 1 and kinds(rep) == {"newer_version": 1}, "after newer version repair: %d %s" % (vrc, kinds(rep)))
    # a newer record that is the one its name and bucket lead to keeps those index entries through
    # a --repair that rebuilds the indexes for another problem (a damaged record here)
    shard = os.path.join(d, "newver2.shard")
    check(write(shard, 10, "8").returncode == 0, "write")
    subprocess.run([WRITER, "newver", shard, "rec000003", "inplace"], check=True, capture_output=True)
    subprocess.run([WRITER, "newver", shard, "rec000004", "damaged"], check=True, capture_output=True)
    counts = lambda: (entries(shard, "bindex"), entries(shard, "names"))
    check(counts() == (10, 10), "newer in place: index %s" % (counts(),))
    vrc, rep, err = verify(shard, "--repair")
    check(vrc == 1 and rep["shards"][0]["problems_after_repair"] == 1 and counts() == (10, 10),
          "newer in place: repair %d %s, index %s" % (vrc, rep and rep["shards"][0], counts()))
    vrc, rep, err = verify(shard)
    check(vrc == 1 and kinds(rep) == {"newer_version": 1}, "newer in place after repair: %d %s" % (vrc, kinds(rep)))
    help_text = subprocess.run([VERIFY, "--help"], capture_output=True, text=True).stdout
    check("newer_version" in help_text and "never deleted" in help_text and "empty_text_missing" in help_text,
          "--help says what --repair leaves")
    # empty_text: sound when its embedding is stored, else reported, never repaired
    shard = os.path.join(d, "empty.shard")
    check(write(shard, 10, "8").returncode == 0, "write")
    p = subprocess.run([WRITER, "emptytext", shard, "sd1:test"], capture_output=True, text=True)
    vrc, rep, err = verify(shard)
    check(p.returncode == 0 and vrc == 0, "empty_text stored: %d %s" % (vrc, err))
    for value in ("00" * 15 + "01", "not-a-key"):
        subprocess.run([WRITER, "meta", shard, "empty_text", value], check=True)
        vrc, rep, err = verify(shard)
        ex = rep["shards"][0]["examples"] if rep else []
        check(vrc == 1 and kinds(rep) == {"empty_text_missing": 1} and ex and ex[0]["db"] == "meta"
              and "meta key empty_text: " in err, "empty_text %s: %d %s %s" % (value, vrc, kinds(rep), err))
        before = latent_keys(shard)
        vrc, rep, err = verify(shard, "--repair")
        check(vrc == 1 and rep["shards"][0]["repaired_records"] == 0 and rep["shards"][0]["problems_after_repair"] == 1
              and latent_keys(shard) == before, "empty_text %s: repair %d %s" % (value, vrc, rep and rep["shards"][0]))


def test_truncated(d):
    """A shard file cut short (a copy interrupted) crashed sd-verify, --repair
    and sd-pack merge with SIGBUS; now it is refused with a clear error (exit
    3), sd-verify goes on to the next shard and reports both, merge leaves no
    partial output."""
    cut, good = os.path.join(d, "cut.shard"), os.path.join(d, "good.shard")
    check(write(cut, 20, "10").returncode == 0 and write(good, 20, "10").returncode == 0, "write")
    size = os.path.getsize(cut)
    os.truncate(cut, size // 2)
    want = "cut.shard: truncated shard: the file has %d bytes, LMDB's last used page ends at %d" % (size // 2, size)
    rep_path = os.path.join(d, "cut.report.json")
    p = subprocess.run([VERIFY, "-q", cut, good, "--report", rep_path], capture_output=True, text=True)
    shards = json.load(open(rep_path))["shards"] if os.path.exists(rep_path) else []
    check(p.returncode == 3 and want in p.stderr, "cut shard: sd-verify exit %d: %s" % (p.returncode, p.stderr[-300:]))
    check(len(shards) == 2 and not shards[0]["opened"] and want in shards[0].get("error", "")
          and shards[1]["opened"] and shards[1]["records"] == 20, "cut shard: report %s" % shards)
    p = subprocess.run([VERIFY, "-q", "--repair", cut], capture_output=True, text=True)
    check(p.returncode == 3 and want in p.stderr, "cut shard: --repair exit %d: %s" % (p.returncode, p.stderr[-300:]))
    pack = os.path.join(os.path.dirname(VERIFY), "sd-pack")
    if check(os.path.exists(pack), "cut shard: no sd-pack beside sd-verify (%s)" % pack):
        for extra in ([], ["--allow-mixed"]):
            p = subprocess.run([pack, "merge", "-q", *extra, "-o", os.path.join(d, "tm.shard"), good, cut],
                               capture_output=True, text=True)
            left = [f for f in os.listdir(d) if f.startswith("tm.shard")]
            check(p.returncode == 3 and want in p.stderr and not left, "cut shard: sd-pack merge %s: exit %d, left %s: %s"
                  % (extra, p.returncode, left, p.stderr[-300:]))
    # cut short and a freelist entry damaged to less than its 8-byte count: refused, not read past
    # its buffer (the freelist walk trusted the entry's size)
    dam = os.path.join(d, "damaged.shard")
    check(write(dam, 40, "4").returncode == 0, "write damaged")
    subprocess.run([WRITER, "corrupt", dam, "5", "1"], capture_output=True)
    data, ps = bytearray(open(dam, "rb").read()), 4096
    metas = [struct.unpack_from("<QQ", data, i * ps + 16 + 128)[0:1] + (i,) for i in range(2)]
    meta = max(metas)[1] * ps
    root = struct.unpack_from("<Q", data, meta + 16 + 24 + 40)[0]
    if check(root != 2 ** 64 - 1 and struct.unpack_from("<H", data, meta + 16 + 24 + 6)[0] == 1,
             "damaged: no one-level freelist to damage"):
        node = root * ps + struct.unpack_from("<H", data, root * ps + 16)[0]
        struct.pack_into("<HH", data, node, 0, 0)  # its first entry's data size: 0
        with open(dam, "wb") as f:
            f.write(data[:len(data) - ps])
        p = subprocess.run([VERIFY, "-q", dam], capture_output=True, text=True)
        check(p.returncode == 3 and "truncated shard" in p.stderr,
              "damaged freelist: sd-verify exit %d: %s" % (p.returncode, p.stderr[-300:]))
    # the first meta page's magic damaged (one bit): named as a damaged shard with an intact second
    # meta page, not as a file that was never a shard; a file that never was one still is that
    mp = os.path.join(d, "meta0.shard")
    data = bytearray(open(good, "rb").read())
    data[16] ^= 1
    open(mp, "wb").write(data)
    p = subprocess.run([VERIFY, "-q", "--repair", mp], capture_output=True, text=True)
    check(p.returncode == 3 and "damaged shard: its first LMDB meta page is damaged (the second, at byte 4096, is intact)"
          in p.stderr and open(mp, "rb").read() == data, "meta page 0: exit %d: %s" % (p.returncode, p.stderr[-300:]))
    open(mp, "wb").write(b'{"v": 1}\n' * 1000)
    p = subprocess.run([VERIFY, "-q", mp], capture_output=True, text=True)
    check(p.returncode == 3 and "not an LMDB shard file" in p.stderr, "not a shard: %s" % p.stderr[-300:])
    # a page past LMDB's last one (a writer killed before its commit leaves such) is no damage
    with open(good, "ab") as f:
        f.write(bytes(4096))
    vrc, rep, err = verify(good)
    check(vrc == 0, "shard with a page past LMDB's last: exit %d: %s" % (vrc, err))
    print("cut shard: refused by sd-verify (next shard still verified), --repair and sd-pack merge")


def test_lock_file_cases(d):
    """LMDB's PATH-lock: on a full disk (a 4 MiB tmpfs filled up) a reader that has to create
    it gets a clear error naming it, not SIGBUS; a reader that may not write it (another
    user's directory) reads without it, with a warning. Both need root (mount, setpriv): as
    another user they are skipped, said so on stderr."""
    src = os.path.join(d, "lockcase.shard")
    check(write(src, 200).returncode == 0, "lock cases: writer")
    if os.geteuid() != 0:
        print("e2e_shard: SKIPPED the lock-file cases (need root for mount and setpriv)", file=sys.stderr)
        return
    mnt = os.path.join(d, "mnt")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], capture_output=True).returncode:
        print("e2e_shard: SKIPPED the full-disk lock case (tmpfs cannot be mounted here)", file=sys.stderr)
    else:
        try:
            with open(src, "rb") as f, open(os.path.join(mnt, "f.shard"), "wb") as g:
                g.write(f.read())
            try:
                with open(os.path.join(mnt, "fill"), "wb") as g:
                    while True:
                        g.write(b"\0" * 65536)
            except OSError:
                pass
            vrc, rep, err = verify(os.path.join(mnt, "f.shard"))
            check(vrc == 3 and "f.shard-lock: no room for LMDB's lock file" in err,
                  "full disk lock file: exit %d, %s" % (vrc, err[-300:]))
        finally:
            subprocess.run(["umount", mnt])
    ro = os.path.join(d, "ro")
    os.makedirs(ro)
    os.chmod(d, 0o755)
    with open(src, "rb") as f, open(os.path.join(ro, "s.shard"), "wb") as g:
        g.write(f.read())
    for with_lock in (False, True):
        if with_lock:
            open(os.path.join(ro, "s.shard-lock"), "wb").close()
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", VERIFY, "-q",
                            os.path.join(ro, "s.shard")], capture_output=True, text=True)
        check(p.returncode == 0 and "reading" in p.stderr and "without LMDB's reader lock" in p.stderr,
              "another user's shard (lock file there: %s): exit %d, %s" % (with_lock, p.returncode, p.stderr[-300:]))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        test_kills(d)
        test_concurrent_reader(d)
        test_full(d)
        test_corruption(d)
        test_index_repair(d)
        test_duplicate_names(d)
        test_misdirected_names(d)
        test_report_only(d)
        test_truncated(d)
        test_damaged_pages(d)
        test_lock_file_cases(d)
        vrc, rep, err = verify(os.path.join(d, "missing.shard"))
        check(vrc == 3, "missing shard: exit %d" % vrc)
        open(os.path.join(d, "junk.shard"), "wb").write(os.urandom(20000))
        vrc, rep, err = verify(os.path.join(d, "junk.shard"))
        check(vrc == 3, "junk file: exit %d" % vrc)
    print("e2e_shard: %.1f s, %d failures" % (time.time() - t0, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
