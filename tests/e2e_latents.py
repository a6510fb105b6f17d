#!/usr/bin/env python3
"""End-to-end tests of sd-latents: sd-meta | sd-bucket | sd-latents on the
wallpaper photos ($SDTK_PHOTOS; synthetic PIL images otherwise) with the
tiny golden VAE, then sd-verify clean; kill -9 in the middle and rerun: the
shard holds exactly the full record set, byte-identical to an uninterrupted
run; 1 vs 2 threads identical; --shard i/N parts partition the set; changed
options are refused (a changed plan replaces its record); another VAE (weights or encoder config) is
refused; WebDataset members read in place give the same latents as the
files, and a member no longer at its recorded offset is skipped; bad images
and records are reported and counted and the run goes on; --seed without
--sample keeps the cache; --scale rewrites the meta; a duplicate key keeps
its first line.
Usage: e2e_latents.py SD_META SD_BUCKET SD_LATENTS SD_VERIFY VAE_DIR"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

META = BUCKET = LATENTS = VERIFY = VAE = None
RES = ["-r", "128x128", "--min-bucket", "64", "--steps", "32"]  # small: the tiny VAE under ASan stays fast


def sh(*args, ok=(0,), stdin=None):
    """Run a command; returns (code, stdout, stderr); asserts the code."""
    p = subprocess.run([str(a) for a in args], capture_output=True, input=stdin)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def dump(shard, db):
    """mdb_dump of one named database: its (key, value) hex lines."""
    _, out, _ = sh("mdb_dump", "-n", "-s", db, shard)
    lines = out.splitlines()
    return [l for l in lines[lines.index("HEADER=END") + 1:] if l != "DATA=END"]


def records(shard):
    """The record-bearing databases (not meta: it holds the creation time)."""
    return {db: dump(shard, db) for db in ("latents", "names", "buckets", "bindex")}


def entries(shard, db="latents"):
    """Number of entries of one database."""
    _, out, _ = sh("mdb_stat", "-n", "-s", db, shard)
    return int(re.search(r"Entries: (\d+)", out).group(1))


def summary(err):
    """The counts of sd-latents' final line."""
    m = re.search(r"(\d+) written \((\d+) replaced stale\), (\d+) already cached, (\d+) bad", err)
    return tuple(int(x) for x in m.groups()) if m else None


def meta_value(shard, key):
    """One `meta` entry as text."""
    _, out, _ = sh("mdb_dump", "-n", "-p", "-s", "meta", shard)
    lines = [l[1:] for l in out.splitlines()]
    return lines[lines.index(key) + 1]


def first_lines(src, dst, n):
    """The first n lines of src into dst."""
    with open(src) as f, open(dst, "w") as g:
        g.writelines(f.readlines()[:n])
    return dst


def make_photos(d, n):
    """n photos: links to $SDTK_PHOTOS, else PIL-drawn JPEG/PNG/WebP."""
    src = os.environ.get("SDTK_PHOTOS")
    os.makedirs(d)
    if src and os.path.isdir(src):
        names = sorted(os.listdir(src))[:n]
        for f in names:
            os.symlink(os.path.join(os.path.abspath(src), f), os.path.join(d, f))
    else:
        from PIL import Image, ImageDraw
        names = []
        for i in range(n):
            w, h = [(640, 480), (480, 640), (800, 450), (500, 500)][i % 4]
            im = Image.new("RGB", (w, h), (i * 40 % 256, 90, 200 - i * 10 % 200))
            dr = ImageDraw.Draw(im)
            for k in range(12):
                dr.ellipse([k * w // 14, (k * 37 + i * 11) % h, k * w // 14 + w // 5, (k * 37 + i * 11) % h + h // 4],
                           fill=((k * 53) % 256, (i * 71 + k * 13) % 256, (k * 29) % 256))
            name = "img%03d.%s" % (i, ["jpg", "png", "webp"][i % 3])
            im.save(os.path.join(d, name))
            names.append(name)
    for f in names:
        with open(os.path.join(d, os.path.splitext(f)[0] + ".txt"), "w") as fh:
            fh.write("a photo\n")
    return names


class Latents(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sdlat-")
        cls.ds = os.path.join(cls.tmp, "ds")
        cls.names = make_photos(cls.ds, 91)
        cls.meta = os.path.join(cls.tmp, "meta.jsonl")
        cls.jsonl = os.path.join(cls.tmp, "b.jsonl")
        _, out, _ = sh(META, "-q", cls.ds)
        with open(cls.meta, "w") as f:
            f.write(out)
        sh(BUCKET, "-q", "--plan", "kohya", *RES, cls.meta, "-o", cls.jsonl)
        cls.n = sum(1 for _ in open(cls.jsonl))
        cls.full = os.path.join(cls.tmp, "full.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--batch", "2", "-j", "2", "-o", cls.full, cls.jsonl)
        cls.full_err = err
        cls.full_records = records(cls.full)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def test_full_run_verifies(self):
        self.assertEqual(self.n, len(self.names))
        self.assertEqual(summary(self.full_err), (self.n, 0, 0, 0), self.full_err)
        self.assertEqual(entries(self.full), self.n)
        self.assertEqual(len(self.full_records["names"]), 2 * self.n)  # key line + value line
        code, out, err = sh(VERIFY, "--manifest", self.jsonl, self.full)
        self.assertIn("0 problems", err)
        self.assertRegex(self.full_err, r"stages: decode [\d.]+ img/s .* encode [\d.]+ img/s .* write")

    def test_rerun_is_a_noop(self):
        s = self.path("rerun.shard")
        shutil.copy(self.full, s)
        _, _, err = sh(LATENTS, "--vae", VAE, "--batch", "2", "-o", s, self.jsonl)
        self.assertIn("nothing to do: %d records already cached" % self.n, err)
        self.assertEqual(records(s), self.full_records)

    def test_kill9_and_resume_equals_uninterrupted(self):
        s = self.path("killed.shard")
        p = subprocess.Popen([LATENTS, "-q", "--vae", VAE, "--batch", "2", "-j", "1", "-o", s, self.jsonl],
                             stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        part = 0
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(s):
                try:
                    part = entries(s)
                except AssertionError:
                    part = 0
                if part >= 6:
                    break
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        part = entries(s)
        self.assertGreater(part, 0)
        self.assertLess(part, self.n, "the run finished before the kill; the test proves nothing")
        code, _, err = sh(VERIFY, s, ok=(0,))
        _, _, err = sh(LATENTS, "--vae", VAE, "--batch", "2", "-j", "2", "-o", s, self.jsonl)
        w, rep, cached, bad = summary(err)
        self.assertEqual((w + cached, rep, bad), (self.n, 0, 0))
        self.assertEqual(cached, part)
        self.assertEqual(records(s), self.full_records)
        sh(VERIFY, "--manifest", self.jsonl, s)

    def test_thread_count_does_not_change_bytes(self):
        sub = self.path("sub.jsonl")
        with open(self.jsonl) as f, open(sub, "w") as g:
            g.writelines(f.readlines()[:10])
        a, b = self.path("j1.shard"), self.path("j2.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--batch", "2", "-j", "1", "-o", a, sub)
        sh(LATENTS, "-q", "--vae", VAE, "--batch", "2", "-j", "2", "-o", b, sub)
        self.assertEqual(records(a), records(b))
        self.assertEqual(entries(a), 10)

    def test_parts_partition_the_set(self):
        parts = [self.path("p%d.shard" % i) for i in range(3)]
        for i, s in enumerate(parts):
            sh(LATENTS, "-q", "--vae", VAE, "--batch", "2", "--shard", "%d/3" % i, "-o", s, self.jsonl)
        counts = [entries(s) for s in parts]
        self.assertEqual(sum(counts), self.n)
        self.assertTrue(all(c > 0 for c in counts), counts)
        full = set(self.full_records["latents"])
        got = set()
        for s in parts:
            got |= set(dump(s, "latents"))
        self.assertEqual(got, full)  # same keys, same bytes as one process

    def test_changed_options_are_refused(self):
        """A rerun whose records would differ in kind from the shard's (dtype, mode, flip,
        --sample's seed) is refused, exit 2, the shard untouched, naming both: a partial rerun
        used to leave fp16 and fp32, flipped and unflipped records under a meta naming only
        the last run's. Options that shape no record (threads, batch, --shard) are not
        refused; the meta's `parts` lists every part whose run wrote the shard, its options no
        `shard` of the last run. A changed plan (here original_size) still replaces its record."""
        sub = first_lines(self.jsonl, self.path("sub4.jsonl"), 4)
        two = first_lines(self.jsonl, self.path("sub2.jsonl"), 2)
        s = self.path("stale.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--shard", "0/2", "-o", s, sub)
        sh(LATENTS, "-q", "--vae", VAE, "--shard", "1/2", "-o", s, sub)
        self.assertEqual(entries(s), 4)
        with open(s, "rb") as f:
            before = f.read()
        for args, said in ((["--dtype", "fp32", "--flip"], "dtype fp16, flip false (its meta); this run's would have "
                                                            "dtype fp32, flip true"),
                           (["--sample", "--seed", "3"], "mode mean_std (its meta); this run's would have mode sample"),
                           (["--vae-activations", "bf16"], "vae_activations fp32 (its meta); this run's would have "
                                                           "vae_activations bf16")):
            _, _, err = sh(LATENTS, "--vae", VAE, *args, "-o", s, two, ok=(2,))
            self.assertIn("%s holds records made with %s" % (s, said), err)
            self.assertIn("or write to a new shard (-o)", err)
            with open(s, "rb") as f:
                self.assertEqual(f.read(), before, args)
        _, _, err = sh(LATENTS, "--vae", VAE, "-j", "1", "--batch", "3", "-o", s, sub)
        self.assertIn("nothing to do: 4 records already cached", err)
        self.assertEqual(json.loads(meta_value(s, "parts")), ["0/2", "1/2"])
        self.assertNotIn("shard", json.loads(meta_value(s, "options")))
        # --sample's seed shapes its records; without --sample it is 0 and not compared
        t = self.path("sample.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--sample", "--seed", "3", "-o", t, two)
        _, _, err = sh(LATENTS, "--vae", VAE, "--sample", "--seed", "4", "-o", t, sub, ok=(2,))
        self.assertIn("seed 3 (its meta); this run's would have seed 4", err)
        _, _, err = sh(LATENTS, "--vae", VAE, "--sample", "--seed", "3", "-o", t, sub)
        self.assertEqual(summary(err), (2, 0, 2, 0), err)
        # seeds over 2^53 are compared exactly, not as doubles (which make ...993 and ...992 one)
        u = self.path("bigseed.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--sample", "--seed", "9007199254740993", "-o", u, two)
        _, _, err = sh(LATENTS, "--vae", VAE, "--sample", "--seed", "9007199254740993", "-o", u, two)
        self.assertIn("nothing to do", err)
        _, _, err = sh(LATENTS, "--vae", VAE, "--sample", "--seed", "9007199254740992", "-o", u, two, ok=(2,))
        self.assertIn("seed 9007199254740993 (its meta); this run's would have seed 9007199254740992", err)
        # a changed plan is another record key: replaced, as before
        lines = open(sub).read().splitlines()
        r = json.loads(lines[0])
        r["original_size"] = [r["original_size"][0] + 1, r["original_size"][1]]
        moved = self.path("moved4.jsonl")
        with open(moved, "w") as f:
            f.write("\n".join([json.dumps(r)] + lines[1:]) + "\n")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, moved)
        self.assertEqual(summary(err), (1, 1, 3, 0), err)
        self.assertEqual(entries(s), 4)
        sh(VERIFY, "--manifest", moved, s)

    def test_vae_activations_are_part_of_the_key(self):
        """--vae-activations bf16 caches a record set that verifies clean, with other bytes and
        other keys than fp32's: a later fp32 run replaces every record, and the shard's options
        meta names the storage."""
        sub = self.path("sub6.jsonl")
        with open(self.jsonl) as f, open(sub, "w") as g:
            g.writelines(f.readlines()[:6])
        s = self.path("act16.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--vae-activations", "bf16", "-o", s, sub)
        self.assertEqual(summary(err), (6, 0, 0, 0), err)
        self.assertIn('"vae_activations": "bf16"', meta_value(s, "options"))
        sh(VERIFY, "--manifest", sub, s)
        act16 = dump(s, "latents")
        full = set(self.full_records["latents"])
        self.assertFalse(set(act16) & full)
        # into the bf16 shard an fp32 run is refused (its meta would lie); a new shard matches
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, sub, ok=(2,))
        self.assertIn("vae_activations bf16 (its meta); this run's would have vae_activations fp32", err)
        t = self.path("act32.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", t, sub)
        self.assertEqual(summary(err), (6, 0, 0, 0), err)
        self.assertTrue(set(dump(t, "latents")) <= full)
        for args in (["--vae-activations", "fp8"], ["--vae-activations", "fp16", "--device", "cuda:0"]):
            code, _, err = sh(LATENTS, "--vae", VAE, *args, "-o", self.path("act-usage.shard"), sub, ok=(2,))
            self.assertIn("--vae-activations", err)

    def test_other_vae_is_refused(self):
        s = self.path("other.shard")
        shutil.copy(self.full, s)
        other = os.path.join(os.path.dirname(VAE), "sdxl")
        code, _, err = sh(LATENTS, "--vae", other, "-o", s, self.jsonl, ok=(3,))
        self.assertIn("holds latents of another VAE", err)
        self.assertEqual(records(s), self.full_records)

    def test_bad_images_are_counted_and_skipped(self):
        d = self.path("bad")
        os.makedirs(d)
        src = [os.path.join(self.ds, f) for f in self.names[:3]]
        for f in src:
            shutil.copy(os.path.realpath(f), d)
        with open(os.path.join(d, "broken.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0" + b"\x00" * 300)  # a JPEG header, then nothing
        for f in os.listdir(d):
            if not f.endswith(".txt"):
                with open(os.path.join(d, os.path.splitext(f)[0] + ".txt"), "w") as fh:
                    fh.write("x\n")
        _, meta, _ = sh(META, "-q", "--no-check-images", d)
        bj = self.path("bad.jsonl")
        lines = [json.loads(l) for l in meta.splitlines()]
        out = []
        for r in lines:  # sd-bucket would skip the broken header; plan it by hand
            if r["key"] == "broken":
                r.update(original_size=[256, 256], bucket=[128, 128], resize=[128, 128], crop=[0, 0, 128, 128])
                out.append(json.dumps(r))
        _, good, _ = sh(BUCKET, "-q", "--plan", "kohya", *RES, "-", stdin=meta.encode())
        # a record whose width/height went stale: planned as a portrait of a landscape photo
        r = json.loads(good.splitlines()[0])
        bw, bh = r["bucket"]
        r.update(key="stretched", resize=[bw, bh * 3], crop=[0, bh, bw, 2 * bh])
        out.append(json.dumps(r))
        # numbers far outside any integer type: refused, never cast (UB)
        r = json.loads(good.splitlines()[0])
        r.update(key="huge", resize=[1e300, r["resize"][1]])
        out.append(json.dumps(r))
        r.update(key="far", resize=json.loads(good.splitlines()[0])["resize"], offset=1e30)
        out.append(json.dumps(r))
        with open(bj, "w") as f:
            f.write(good)
            f.write("\n".join(out + ['{"key": "nobucket", "image": "x.jpg"}', "{not json"]) + "\n")
        s = self.path("bad.shard")
        code, _, err = sh(LATENTS, "--vae", VAE, "-o", s, bj, ok=(0,))
        self.assertIn("broken", err)
        self.assertRegex(err, r"1\s+unreadable image")
        self.assertRegex(err, r"1\s+not bucketed")  # nobucket; huge has its plan, a bad one
        self.assertIn("(huge): resize [1e+300,%d]: out of range (max 10000000)" % r["resize"][1], err)
        self.assertRegex(err, r"1\s+bad offset/size")
        self.assertRegex(err, r"1\s+malformed JSON")
        self.assertRegex(err, r"1\s+record does not fit the image")
        self.assertIn("another aspect ratio", err)
        self.assertIn("wrong width/height in the record (rerun sd-bucket with --read-sizes)", err)  # what helps
        self.assertEqual(entries(s), 3)
        sh(LATENTS, "--strict", "--vae", VAE, "-o", s, bj, ok=(1,))
        # two --shard processes: each bad line is reported by one of them only
        errs = ""
        for i in range(2):
            _, _, e = sh(LATENTS, "--vae", VAE, "--shard", "%d/2" % i, "-o", self.path("bad%d.shard" % i), bj)
            errs += e
        for why in ("malformed JSON", "unreadable image", "record does not fit the image", "bad offset/size"):
            self.assertEqual(len(re.findall(r"\b1\s+" + why, errs)), 1, (why, errs))
        # the not-bucketed and bad-plan lines may fall to either process: counted once in all
        self.assertEqual(sum(int(n) for n in re.findall(r"\b(\d+)\s+not bucketed", errs)), 1, errs)
        self.assertEqual(sum(int(n) for n in re.findall(r"\b(\d+)\s+bad resize/crop", errs)), 1, errs)

    def test_verbose_names_every_skip(self):
        """-v names every skipped record, as sd-bucket's does; without it the first 10 of a reason
        are named and the 10th says that --verbose shows all."""
        d = self.path("verbose")
        os.makedirs(d)
        r = json.loads(open(self.jsonl).readline())
        bj = os.path.join(d, "b.jsonl")
        with open(bj, "w") as f:
            for i in range(13):
                f.write(json.dumps(dict(r, key="gone%02d" % i, image=os.path.join(d, "gone%02d.png" % i))) + "\n")
        for args, named in (([], 10), (["-v"], 13)):
            _, _, err = sh(LATENTS, *args, "--vae", VAE, "-j", "1", "-o", os.path.join(d, "s.shard"), bj)
            self.assertEqual(len(re.findall(r"skip gone\d\d ", err)), named, err)
            self.assertRegex(err, r"13\s+unreadable image")
            self.assertEqual("--verbose shows all" in err, not args, err)

    def test_samples_without_a_range_are_refused(self):
        """A float grey TIFF (32-bit samples with no range to take to 8 bits) is skipped as 'not
        a supported image', the kind of samples named, not clipped to white into the shard."""
        import numpy as np
        from PIL import Image
        d = self.path("f32")
        os.makedirs(d)
        tif = os.path.join(d, "f.tif")
        Image.fromarray(np.full((64, 64), 1000.0, np.float32), "F").save(tif)
        rec = {"v": 1, "key": "f", "image": tif, "caption": "c", "original_size": [64, 64], "bucket": [64, 64],
               "resize": [64, 64], "crop": [0, 0, 64, 64]}
        bj = os.path.join(d, "b.jsonl")
        with open(bj, "w") as f:
            f.write(json.dumps(rec) + "\n")
        _, _, err = sh(LATENTS, "--vae", VAE, "-j", "1", "-o", os.path.join(d, "s.shard"), bj)
        self.assertIn("32-bit float samples", err)
        self.assertRegex(err, r"\b1\s+not a supported image")
        self.assertEqual(summary(err), (0, 0, 0, 1), err)

    def test_bad_plan_says_what_is_wrong(self):
        """A record with its bucket, resize and crop present but wrong is not called "not bucketed",
        and its message says what is wrong (sd_image_plan_check's words where it applies)."""
        from PIL import Image
        d = self.path("badplan")
        os.makedirs(d)
        img = os.path.join(d, "a.png")
        Image.new("RGB", (400, 300), (200, 30, 30)).save(img)
        base = {"v": 1, "image": img, "caption": "c", "original_size": [400, 300], "bucket": [400, 296],
                "resize": [400, 300], "crop": [0, 2, 400, 298]}
        cases = (("negcrop", {"crop": [-8, 2, 392, 298]}, "crop [-8,2,392,298]: negative"),
                 ("fraccrop", {"crop": [0.5, 2, 400.5, 298]}, "crop [0.5,2,400.5,298]: not whole numbers"),
                 ("shortcrop", {"crop": [0, 2, 400]}, "crop has 3 numbers, not 4"),
                 ("negresize", {"resize": [-400, -300]}, "resize [-400,-300]: negative"),
                 ("bigresize", {"resize": [80000, 60000]}, "resize 80000x60000 out of range (each side 1..65535)"),
                 ("outcrop", {"crop": [100, 2, 500, 298]}, "crop [100,2,500,298] not inside the 400x300 resized image"),
                 ("strcrop", {"crop": "0,2,400,298"}, "crop is not an array of 4 numbers"),
                 ("badbucket", {"bucket": [400]}, "bucket has 1 numbers, not 2"),
                 ("sizes", {"bucket": [400, 288]}, "crop [0,2,400,298] is 400x296, the bucket 400x288"))
        jl = os.path.join(d, "plans.jsonl")
        with open(jl, "w") as f:
            for key, change, _ in cases:
                f.write(json.dumps(dict(base, key=key, **change)) + "\n")
            nocrop = dict(base, key="nocrop")
            del nocrop["crop"]
            f.write(json.dumps(nocrop) + "\n")
            f.write(json.dumps(dict(base, key="good")) + "\n")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", os.path.join(d, "plans.shard"), jl)
        for i, (key, _, why) in enumerate(cases):
            self.assertIn("%s:%d (%s): %s: " % (jl, i + 1, key, why), err)
        self.assertIn("(nocrop): no crop: not bucketed", err)
        self.assertRegex(err, r"\b1\s+not bucketed")
        self.assertRegex(err, r"\b7\s+bad resize/crop")
        self.assertRegex(err, r"\b1\s+bad bucket")
        self.assertRegex(err, r"\b1\s+crop size differs from bucket")
        self.assertEqual(summary(err), (1, 0, 0, 0), err)

    def test_fifo_image_and_bom(self):
        """An image path that is a FIFO (a file swapped after sd-meta, a hand-made list) is
        skipped as unreadable instead of blocking the run forever, and a UTF-8 byte order mark
        before the first record (a list saved by a Windows editor) is not part of it."""
        d = self.path("fifo")
        os.makedirs(d)
        os.mkfifo(os.path.join(d, "pipe.png"))
        r = json.loads(open(self.jsonl).readline())
        good = dict(r, image=os.path.realpath(os.path.join(self.tmp, r["image"])) if not os.path.isabs(r["image"])
                    else r["image"])
        lines = [json.dumps(dict(r, key="pipe", image=os.path.join(d, "pipe.png"))), json.dumps(good)]
        bj = os.path.join(d, "b.jsonl")
        with open(bj, "w", encoding="utf-8") as f:
            f.write("\ufeff" + "\n".join(lines) + "\n")
        s = os.path.join(d, "s.shard")
        p = subprocess.run([LATENTS, "--vae", VAE, "-j", "1", "-o", s, bj], capture_output=True, timeout=300)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("not a regular file (a FIFO)", err)
        self.assertRegex(err, r"1\s+unreadable image")
        self.assertNotIn("malformed JSON", err)
        self.assertEqual(entries(s), 1)
        code, out, err = sh(VERIFY, "--manifest", bj, s, ok=(0, 1))
        self.assertNotIn("no usable", err)  # line 1 read as a record despite its BOM
        self.assertIn("name pipe: manifest line 1: not in shard", err)  # the one record the FIFO kept out

    def test_libvips_warnings_stay_out_of_the_output(self):
        """libvips warns through GLib without naming the file ("profile incompatible with image"
        for a CMYK JPEG tagged with an RGB profile): such lines appear only with -v, as detail, and
        the image is still written (mapped as an untagged one)."""
        from PIL import Image, ImageCms
        d = self.path("cmyk")
        os.makedirs(d)
        srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
        Image.new("RGB", (160, 120), (200, 120, 30)).convert("CMYK").save(os.path.join(d, "cmyk.jpg"), icc_profile=srgb)
        with open(os.path.join(d, "cmyk.txt"), "w") as f:
            f.write("x\n")
        _, meta, _ = sh(META, "-q", d)
        _, bj, _ = sh(BUCKET, "-q", "--plan", "kohya", *RES, "-", stdin=meta.encode())
        with open(os.path.join(d, "b.jsonl"), "w") as f:
            f.write(bj)
        _, _, err = sh(LATENTS, "--vae", VAE, "-j", "1", "-o", os.path.join(d, "s.shard"), os.path.join(d, "b.jsonl"))
        self.assertNotIn("VIPS-WARNING", err)
        self.assertNotIn("profile incompatible", err)
        self.assertEqual(entries(os.path.join(d, "s.shard")), 1)
        _, _, err = sh(LATENTS, "-v", "--vae", VAE, "-j", "1", "-o", os.path.join(d, "v.shard"),
                       os.path.join(d, "b.jsonl"))
        self.assertIn("debug: VIPS: profile incompatible with image", err)

    def test_usage_errors_and_devices(self):
        s = self.path("usage.shard")
        for args in (["--batch", "0"], ["--device", "gpu"], ["--shard", "3/3"], ["-j", "-1"], ["--tf32"],
                     ["--cudnn-search"], ["--mixed-precision", "bf16"], ["--mixed-precision", "fp8", "--device", "cuda:0"],
                     ["--gpu-memory-limit", "8"], ["--gpu-memory-limit", "-1", "--device", "cuda:0"]):
            code, _, err = sh(LATENTS, "--vae", VAE, "-o", s, *args, self.jsonl, ok=(2,))
            self.assertIn("Try 'sd-latents --help'", err)
        sh(LATENTS, "-o", s, self.jsonl, ok=(2,))  # no --vae
        # value checks are usage errors (exit 2) before any model or image library is loaded
        for args, what in ((["--dtype", "fp8"], "--dtype fp8"), (["--scale", "inf"], "--scale"),
                           (["--scale", "nan"], "--scale"), (["--scale", "-1"], "--scale"),
                           (["--text", "/nonexistent", "--text-weights", "xx"], "--text-weights xx")):
            code, _, err = sh(LATENTS, "--vae", VAE, *args, "-o", s, self.jsonl, ok=(2,))
            self.assertIn(what, err)
            self.assertNotIn("VAE " + VAE, err)
        # no GPU here: cuda:K fails clearly (no driver / no device / no CUDA in the build)
        code, _, err = sh(LATENTS, "--vae", VAE, "--device", "cuda:0", "-o", s, self.jsonl, ok=(3,))
        self.assertRegex(err, r"CUDA|cuda")
        self.assertFalse(os.path.exists(s) and entries(s) > 0)

    def test_webdataset_members_read_in_place(self):
        d = self.path("wds")
        os.makedirs(d)
        tar = os.path.join(d, "00000.tar")
        picks = [f for f in self.names if f.lower().endswith((".jpg", ".jpeg"))][:3]
        with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as t:
            for i, f in enumerate(picks):
                t.add(os.path.realpath(os.path.join(self.ds, f)), arcname="s%03d.jpg" % i)
                cap = os.path.join(d, "c.txt")
                with open(cap, "w") as fh:
                    fh.write("a photo\n")
                t.add(cap, arcname="s%03d.txt" % i)
        _, meta, _ = sh(META, "-q", tar)
        _, bj, _ = sh(BUCKET, "-q", "--plan", "kohya", *RES, "-", stdin=meta.encode())
        s = self.path("wds.shard")
        sh(LATENTS, "-q", "--vae", VAE, "-o", s, "-", stdin=bj.encode())
        self.assertEqual(entries(s), len(picks))
        # same pixels, same plan -> same tensors as the folder run: compare
        # the payloads (values minus the 256-byte header and the name)
        vals = [l for l in dump(s, "latents")[1::2]]
        full = set(l[-4096:] for l in self.full_records["latents"][1::2])
        for v in vals:
            self.assertIn(v[-4096:], full)

    def test_vae_config_is_part_of_identity(self):
        """--vae-groups changes the latents, not the weights: another model_hash, so a shard made
        with other groups is refused; a shard whose model_hash is the weights' hash alone (made
        before the config joined it) is accepted and every record encoded again."""
        sub = first_lines(self.jsonl, self.path("sub_groups.jsonl"), 3)
        single = os.path.join(VAE, "single.safetensors")
        s = self.path("groups.shard")
        _, _, err = sh(LATENTS, "--vae", single, "--vae-groups", "8", "-o", s, sub)
        self.assertEqual(summary(err), (3, 0, 0, 0), err)
        code, _, err = sh(LATENTS, "--vae", single, "--vae-groups", "4", "-o", s, sub, ok=(3,))
        self.assertIn("holds latents of another VAE", err)
        # the folder (config.json: 4 groups) and the single file with --vae-groups 4: one VAE
        _, _, e1 = sh(LATENTS, "--vae", VAE, "-o", self.path("g4a.shard"), sub)
        _, _, e2 = sh(LATENTS, "--vae", single, "--vae-groups", "4", "-o", self.path("g4b.shard"), sub)
        mh = [re.search(r"model_hash ([0-9a-f]{16})", e).group(1) for e in (e1, e2)]
        self.assertEqual(mh[0], mh[1])
        self.assertEqual(dump(self.path("g4a.shard"), "latents"), dump(self.path("g4b.shard"), "latents"))
        # an older shard: model_hash was the weights' hash
        weights = re.search(r"weights \(hash ([0-9a-f]{16})\)", err).group(1)
        sh("mdb_load", "-T", "-n", "-s", "meta", s, stdin=("model_hash\n%s\n" % weights).encode())
        _, _, err = sh(LATENTS, "--vae", single, "--vae-groups", "4", "-o", s, sub)
        self.assertIn("made before model_hash covered the VAE's config", err)
        self.assertEqual(summary(err), (3, 3, 0, 0), err)
        self.assertEqual(meta_value(s, "model_hash"), mh[1])
        self.assertEqual(dump(s, "latents"), dump(self.path("g4b.shard"), "latents"))

    def test_guessed_scale_is_warned(self):
        sub = first_lines(self.jsonl, self.path("sub_scale.jsonl"), 1)
        single = os.path.join(VAE, "single.safetensors")
        _, _, err = sh(LATENTS, "--vae", single, "--vae-groups", "4", "-o", self.path("guess.shard"), sub)
        self.assertRegex(err, r"warning: .*scaling factor 0.18215 is a guess.*--scale")
        _, _, err = sh(LATENTS, "--vae", single, "--vae-groups", "4", "--scale", "0.18215", "-o",
                       self.path("guess2.shard"), sub)
        self.assertNotIn("is a guess", err)
        self.assertNotIn("is a guess", self.full_err)  # the folder's config.json gives it

    def test_scale_rerun_rewrites_the_meta(self):
        """The latents are stored unscaled: another --scale on a cached shard only rewrites the
        meta; a factor that is not --scale's never silently replaces the shard's."""
        s = self.path("scale.shard")
        shutil.copy(self.full, s)
        self.assertEqual(meta_value(s, "scaling_factor"), "0.18215")  # the shortest form, as sd-pack writes
        _, _, err = sh(LATENTS, "--vae", VAE, "--scale", "0.13025", "-o", s, self.jsonl)
        self.assertIn("nothing to do: %d records already cached" % self.n, err)
        self.assertIn("scaling_factor 0.18215 in the meta becomes 0.13025", err)
        self.assertEqual(meta_value(s, "scaling_factor"), "0.13025")
        self.assertEqual(records(s), self.full_records)
        code, _, err = sh(LATENTS, "--vae", VAE, "-o", s, self.jsonl, ok=(3,))
        self.assertIn("pass --scale 0.13025 to keep it", err)
        self.assertEqual(meta_value(s, "scaling_factor"), "0.13025")
        # the same factor in another spelling (older runs wrote 17 digits) is the same factor
        p = subprocess.run(["mdb_load", "-n", "-T", "-s", "meta", s],
                           input=b"scaling_factor\n0.18215000000000001\n", capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, self.jsonl)
        self.assertIn("nothing to do", err)
        self.assertNotIn("scaling_factor", err)

    def test_seed_without_sample_keeps_the_cache(self):
        s = self.path("seed.shard")
        shutil.copy(self.full, s)
        _, _, err = sh(LATENTS, "--vae", VAE, "--seed", "7", "-o", s, self.jsonl)
        self.assertIn("--seed 7 without --sample changes nothing", err)
        self.assertIn("nothing to do: %d records already cached" % self.n, err)
        self.assertEqual(records(s), self.full_records)

    def test_duplicate_key_keeps_the_first_line(self):
        """The first line of a key wins even when a later one falls in a bucket sorted before it."""
        with open(self.jsonl) as f:
            recs = [json.loads(l) for l in f]
        big = max(recs, key=lambda r: r["bucket"])
        small = min(recs, key=lambda r: r["bucket"])
        self.assertNotEqual(big["bucket"], small["bucket"])
        dup = self.path("dup.jsonl")
        with open(dup, "w") as f:
            f.write(json.dumps(dict(big, key="dup")) + "\n" + json.dumps(dict(small, key="dup")) + "\n")
        s = self.path("dup.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, dup)
        self.assertIn("%s:2: key dup seen before on line 1" % dup, err)
        self.assertRegex(err, r"1\s+duplicate key")
        bucket = dump(s, "buckets")[0].strip()
        self.assertEqual(bucket, "%08x%08x" % tuple(big["bucket"]))

    def test_bad_original_size_is_skipped(self):
        with open(self.jsonl) as f:
            r = json.loads(f.readline())
        bad = self.path("origsize.jsonl")
        with open(bad, "w") as f:
            for i, o in enumerate(([1e30, 5], [0, 5], "640x480", [640])):
                f.write(json.dumps(dict(r, key="o%d" % i, original_size=o)) + "\n")
            f.write(json.dumps(dict(r, key="none", original_size=None)) + "\n")  # null: the resize size
        s = self.path("origsize.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, bad)
        self.assertRegex(err, r"4\s+bad original_size")
        self.assertEqual(entries(s), 1)

    def test_bucket_without_workspace_is_skipped(self):
        """A bucket whose VAE workspace cannot be had (over --max-workspace, or over the machine's
        memory by default) skips its records, each named with the bucket and the size, before any
        of its images is decoded; the other buckets are encoded and the run ends as for any skip
        (0, 1 with --strict), where it used to stop with "cannot allocate the workspace"."""
        from PIL import Image
        d = self.path("ws")
        os.makedirs(d)
        Image.new("RGB", (32, 1024), (10, 200, 30)).save(os.path.join(d, "tall.png"))
        Image.new("RGB", (400, 300), (200, 30, 30)).save(os.path.join(d, "ok.png"))
        Image.new("RGB", (400, 400), (30, 30, 200)).save(os.path.join(d, "sq.png"))

        def rec(key, image, size, bucket, resize, crop):
            return json.dumps({"v": 1, "key": key, "image": os.path.join(d, image), "caption": "c",
                               "original_size": size, "bucket": bucket, "resize": resize, "crop": crop}) + "\n"

        jl = os.path.join(d, "ws.jsonl")
        with open(jl, "w") as f:
            f.write(rec("tall", "tall.png", [32, 1024], [64, 2048], [64, 2048], [0, 0, 64, 2048]))
            f.write(rec("huge", "sq.png", [400, 400], [65528, 65528], [65528, 65528], [0, 0, 65528, 65528]))
            for k in "abc":
                f.write(rec(k, "ok.png", [400, 300], [128, 96], [128, 96], [0, 0, 128, 96]))
        s = os.path.join(d, "cap.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--max-workspace", "8", "-o", s, jl)
        self.assertRegex(err, r"tall \(\S+tall.png\), bucket 64x2048: VAE workspace of \d+ MiB cannot be allocated "
                              r"\(over --max-workspace 8 MiB\)")
        self.assertRegex(err, r"huge \(\S+sq.png\), bucket 65528x65528: VAE workspace of \d+ MiB cannot be allocated")
        self.assertRegex(err, r"\b2\s+VAE workspace cannot be allocated")
        self.assertEqual(summary(err), (3, 0, 0, 2), err)
        self.assertEqual(entries(s), 3)
        sh(LATENTS, "--strict", "--vae", VAE, "--max-workspace", "8", "-o", s, jl, ok=(1,))
        # under the cap but the allocation itself fails (ASan builds: its allocation limit stands in
        # for `ulimit -v`, which ASan cannot run under): skipped with the allocator's reason
        env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") +
                   ":max_allocation_size_mb=8:allocator_may_return_null=1")
        p = subprocess.run([LATENTS, "--vae", VAE, "--max-workspace", "64", "-o", os.path.join(d, "alloc.shard"), jl],
                           capture_output=True, env=env)
        err = p.stderr.decode()
        if "AddressSanitizer" in err:
            self.assertEqual(p.returncode, 0, err)
            self.assertIn("bucket 64x2048: VAE workspace of 12 MiB cannot be allocated (VAE on cpu: cannot allocate "
                          "the workspace (12 MiB))", err)
            self.assertEqual(summary(err), (3, 0, 0, 2), err)
        # no cap given: a bucket needing more than the machine's memory is refused up front
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if ram > 300 << 30:
            self.skipTest("this machine has the memory for a 65528x65528 workspace")
        s = os.path.join(d, "default.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, jl)
        self.assertRegex(err, r"huge \(\S+sq.png\), bucket 65528x65528: VAE workspace of \d+ MiB cannot be allocated "
                              r"\(over the \d+ MiB of memory this process may use")
        self.assertEqual(summary(err), (4, 0, 0, 1), err)
        self.assertEqual(entries(s), 4)

    def test_moved_tar_members_are_skipped(self):
        """A tar rebuilt after sd-meta with its members in another order: the recorded offsets
        lead to other members' bytes, which must not be stored under these names. Short names,
        ustar prefix/name, GNU ././@LongLink and pax path= names are all checked, also a pax
        header that carries kilobytes of other records (extended attributes) beside path=."""
        cap = self.path("cap.txt")
        with open(cap, "w") as fh:
            fh.write("a photo\n")
        picks = [f for f in self.names if f.lower().endswith((".jpg", ".jpeg"))][:3]
        long_dir = "d" * 60 + "/" + "e" * 50
        layouts = (("short", tarfile.GNU_FORMAT, ""), ("prefix", tarfile.USTAR_FORMAT, long_dir + "/"),
                   ("gnu", tarfile.GNU_FORMAT, long_dir + "x" * 40), ("pax", tarfile.PAX_FORMAT, long_dir + "y" * 40),
                   ("paxattr", tarfile.PAX_FORMAT, long_dir + "z" * 40))

        def build(tar, fmt, stem, order):
            with tarfile.open(tar, "w", format=fmt) as t:
                for i in order:
                    img = os.path.realpath(os.path.join(self.ds, picks[i]))
                    ti = t.gettarinfo(img, arcname="%ss%03d.jpg" % (stem, i))
                    if stem.endswith("z" * 40):  # xattrs as bsdtar writes them, 3 kB beside path=
                        ti.pax_headers = {"SCHILY.xattr.user.note": "n" * 3000}
                    with open(img, "rb") as fh:
                        t.addfile(ti, fh)
                    t.add(cap, arcname="%ss%03d.txt" % (stem, i))

        for label, fmt, stem in layouts:
            d = self.path("moved_" + label)
            os.makedirs(d)
            tar = os.path.join(d, "00000.tar")
            build(tar, fmt, stem, range(len(picks)))
            _, meta, _ = sh(META, "-q", tar)
            _, bj, _ = sh(BUCKET, "-q", "--plan", "kohya", *RES, "-", stdin=meta.encode())
            self.assertEqual(len(bj.splitlines()), len(picks), label)
            s = os.path.join(d, "in_place.shard")
            _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, "-", stdin=bj.encode())
            self.assertEqual(summary(err), (len(picks), 0, 0, 0), (label, err))
            build(tar, fmt, stem, reversed(range(len(picks))))  # same files, another order
            s = os.path.join(d, "moved.shard")
            _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, "-", stdin=bj.encode())
            self.assertRegex(err, r"\b%d\s+tar member changed since sd-meta" % len(picks), (label, err))
            self.assertEqual(entries(s), 0, label)


class ExifExport(unittest.TestCase):
    """An EXIF-rotated JPEG (orientation 6: stored 96x64, displayed 64x96): its record says the
    file stores it transposed (flag 8), and export-kohya names its npz by the stored size, the
    one sd-scripts (imagesize, no EXIF) looks for (issue 31, item 15). SD_PACK: sd-pack."""

    def test_npz_named_by_the_stored_size(self):
        from PIL import Image
        tmp = tempfile.mkdtemp(prefix="sdlat-exif-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        ds = os.path.join(tmp, "ds")
        os.makedirs(ds)
        ex = Image.Exif()
        ex[0x0112] = 6
        Image.new("RGB", (96, 64), (200, 30, 30)).save(os.path.join(ds, "rot.jpg"), quality=90, exif=ex)
        Image.new("RGB", (96, 64), (30, 30, 200)).save(os.path.join(ds, "flat.jpg"), quality=90)
        for n in ("rot", "flat"):
            with open(os.path.join(ds, n + ".txt"), "w") as fh:
                fh.write("a photo\n")
        _, meta, _ = sh(META, "-q", ds)
        _, bj, _ = sh(BUCKET, "-q", "--plan", "kohya", *RES, "-", stdin=meta.encode())
        self.assertIn('"width":64,"height":96,"original_size":[64,96]', bj.splitlines()[1])  # rot, upright
        s = os.path.join(tmp, "s.shard")
        sh(LATENTS, "-q", "--sample", "--vae", VAE, "-o", s, "-", stdin=bj.encode())
        flags = {}
        for v in dump(s, "latents")[1::2]:  # the record header: u16 flags at byte 10, the name at 256
            raw = bytes.fromhex(v.strip())
            flags[raw[256:256 + int.from_bytes(raw[12:14], "little")].decode()] = int.from_bytes(raw[10:12], "little")
        self.assertEqual(flags, {"rot": 8, "flat": 0})
        code, _, err = sh(VERIFY, s)
        self.assertIn("0 problems", err)
        if not os.environ.get("SD_PACK"):
            self.skipTest("SD_PACK not set: the export half needs sd-pack")
        out = os.path.join(tmp, "kohya")
        sh(os.environ["SD_PACK"], "export-kohya", "-q", "--layout", "sd", "--force-layout", s, "-o", out)
        self.assertEqual(sorted(os.listdir(out)), ["flat_0096x0064_sd.npz", "rot_0096x0064_sd.npz"])


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    META, BUCKET, LATENTS, VERIFY, VAE = sys.argv[1:6]
    for tool in ("mdb_dump", "mdb_stat"):
        if not shutil.which(tool):
            sys.exit("%s missing (Debian package lmdb-utils; scripts/install-deps.sh installs it)" % tool)
    unittest.main(argv=sys.argv[:1] + sys.argv[6:], verbosity=2)
