#!/usr/bin/env python3
"""End-to-end tests of sd-pack: kohya npz -> shard -> kohya npz round trips
(fp32 bit-identical, fp16 equal to numpy's float16 rounding), resumable
import, split -> merge, compact, info, export-tar members loaded with numpy,
the bad cache files the importer must report and skip, full-path metadata
keys, the two crop conventions, and shards made by tests/shard_writer with
damaged indexes, corrupt text embeddings, duplicate names, names entries
leading to another record, the empty caption's embedding (empty_text) and
the text encoder setup (text_encoder) through merge/compact/split,
inputs that are also outputs, and existing outputs (refused without --force,
never replaced while a writer holds them, LMDB's lock file of a replaced
shard removed), UTF-8 record names in tars, the import walk's limits (names over 511
bytes, directory loops), imports into shards made otherwise, export layouts that contradict
the scaling factor, and skip counts and record names in the messages.
Usage: e2e_pack.py SD_PACK SD_VERIFY SHARD_WRITER  (needs numpy)"""
import fcntl
import glob
import io
import json
import os
import re
import resource
import shutil
import signal
import struct
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

try:
    import numpy as np
except ImportError:  # the suite needs numpy (python3-numpy); skip, do not fail
    print("numpy not available: skipping")
    sys.exit(77)

SD_PACK = SD_VERIFY = WRITER = None


def get_crop_ltrb(bucket, size):
    """sd-scripts' BucketManager.get_crop_ltrb(bucket_reso, image_size), as
    it is written there (Python floats and floor division)."""
    bucket_ar = bucket[0] / bucket[1]
    image_ar = size[0] / size[1]
    if bucket_ar > image_ar:
        resized_width = bucket[1] * image_ar
        resized_height = bucket[1]
    else:
        resized_width = bucket[0]
        resized_height = bucket[0] / image_ar
    crop_left = (bucket[0] - resized_width) // 2
    crop_top = (bucket[1] - resized_height) // 2
    return crop_left, crop_top, crop_left + resized_width, crop_top + resized_height


def cut_box(bucket, size):
    """The box sd-scripts cuts from the resized image: select_bucket's
    scale (cover the bucket, int(x + 0.5)), then the centred trim."""
    ar = size[0] / size[1]
    scale = bucket[1] / size[1] if ar > bucket[0] / bucket[1] else bucket[0] / size[0]
    rw, rh = int(size[0] * scale + 0.5), int(size[1] * scale + 0.5)
    left, top = max(rw - bucket[0], 0) // 2, max(rh - bucket[1], 0) // 2
    return [left, top, left + bucket[0], top + bucket[1]]


def writer(*args):
    """Run tests/shard_writer; returns its stdout lines."""
    p = subprocess.run([WRITER] + [str(a) for a in args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def holds_lock(pid, path, kind):
    """Whether process pid holds a lock of kind on path, as /proc/locks lists
    it: FLOCK is a shard's writer lock (on the data file), POSIX the locks
    LMDB takes on its lock file (every process with the shard open)."""
    try:
        ino = str(os.stat(path).st_ino)
    except FileNotFoundError:
        return False
    with open("/proc/locks") as f:  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"
        return any(x[1] == kind and x[4] == str(pid) and x[5].split(":")[-1] == ino
                   for x in (line.split() for line in f) if len(x) > 5)


def wait_for(cond, what, timeout=60):
    """Poll cond until it is true; fail after timeout seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.01)


def last_txnid(shard):
    """LMDB's last committed transaction id in a shard file: the larger of its
    two meta pages' (LMDB 0.9 layout: page size at byte 40 of page 0, the
    transaction id at byte 144 of each meta page)."""
    with open(shard, "rb") as f:
        first = f.read(152)
        f.seek(struct.unpack_from("<I", first, 40)[0])
        second = f.read(152)
    return max(struct.unpack_from("<Q", m, 144)[0] for m in (first, second))


def run(*args):
    """Run sd-pack; returns (exit code, stdout, stderr)."""
    p = subprocess.run([SD_PACK] + [str(a) for a in args], capture_output=True)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def skipped(err, reason):
    """The count the final summary prints for a reason (0 when absent)."""
    for line in err.splitlines():
        m = re.match(r"^sd-pack[^:]*:\s+(\d+)\s+(.*)$", line)
        if m and m.group(2) == reason:
            return int(m.group(1))
    return 0


def npz_dict(path):
    """Keys (in file order), dtypes and values of an npz."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}, list(z.files)


def tree(d):
    """Relative paths of the npz files under d."""
    return sorted(os.path.relpath(p, d) for p in glob.glob(os.path.join(d, "**", "*.npz"), recursive=True))


class Pack(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sdpack-")
        self.rng = np.random.default_rng(7)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def p(self, *parts):
        return os.path.join(self.dir, *parts)

    def latents(self, path, w, h, flip=False, orig=None, crop=None, dtype=np.float32, **extra):
        """One kohya latents npz as sd-scripts' np.savez writes it: crop_ltrb
        is get_crop_ltrb(bucket, original size) unless crop is given."""
        lat = self.rng.standard_normal((4, h // 8, w // 8)).astype(dtype)
        kw = {}
        if flip:
            kw["latents_flipped"] = lat[:, :, ::-1].copy()
        orig = orig or (w * 3 + 7 * (w // 8 % 3), h * 3)
        crop = np.array(crop if crop is not None else get_crop_ltrb((w, h), orig))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(path, latents=lat, original_size=np.array(orig), crop_ltrb=crop, **kw, **extra)

    def te(self, path, tokens=77, dtype=np.float32, seed=None):
        """One SDXL te_outputs npz (seed: same seed, same content)."""
        rng = np.random.default_rng(seed) if seed is not None else self.rng
        np.savez(path, hidden_state1=rng.standard_normal((tokens, 768)).astype(dtype),
                 hidden_state2=rng.standard_normal((tokens, 1280)).astype(dtype),
                 pool2=rng.standard_normal(1280).astype(dtype))

    def kohya_dir(self, name="kd", n=6):
        """A small cache directory: flipped and plain latents, images wider and
        taller than their buckets, a subdirectory, te_outputs (two with
        identical content)."""
        d = self.p(name)
        sizes = [(64, 48), (48, 64), (64, 64), (32, 64), (64, 48), (64, 64)]
        for i in range(n):
            w, h = sizes[i % len(sizes)]
            stem = ("sub/img%02d" if i % 3 == 2 else "img%02d") % i
            orig = (w * 3 + 17 * (i % 2), h * 3 + 11 * (i % 3 == 1))
            self.latents(os.path.join(d, stem + ".npz"), w, h, flip=i % 2 == 0, orig=orig)
            if i != 3:
                self.te(os.path.join(d, stem + "_te_outputs.npz"), seed=99 if i in (1, 4) else None)
        return d

    def assert_same_tree(self, a, b, f16=False, exact=()):
        """Every npz in a equals the one in b: same keys in the same order,
        dtypes and values (with f16, float arrays of b as numpy float16, but
        the arrays named in exact as they are)."""
        self.assertEqual(tree(a), tree(b))
        for rel in tree(a):
            x, xk = npz_dict(os.path.join(a, rel))
            y, yk = npz_dict(os.path.join(b, rel))
            self.assertEqual(xk, yk, rel)
            for k in xk:
                want = y[k]
                if f16 and k not in ("original_size", "crop_ltrb") + tuple(exact):
                    want = want.astype(np.float16)
                    if x[k].dtype == np.float32:
                        want = want.astype(np.float32)
                self.assertEqual(x[k].dtype, want.dtype, (rel, k))
                self.assertEqual(x[k].shape, want.shape, (rel, k))
                self.assertTrue(np.array_equal(x[k], want), (rel, k))

    def verify(self, shard):
        p = subprocess.run([SD_VERIFY, "-q", shard], capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())

    def info(self, shard):
        rc, out, err = run("info", "--json", shard)
        self.assertEqual(rc, 0, err)
        return json.loads(out)

    # -- round trips ------------------------------------------------------

    def test_fp32_round_trip_is_identical(self):
        d = self.kohya_dir()
        shard = self.p("c.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.exists(shard + ".partial"))
        self.verify(shard)
        info = self.info(shard)
        self.assertEqual(info["latents"]["records"], 6)
        self.assertEqual(info["latents"]["flipped"], 3)
        self.assertEqual(info["latents"]["dtypes"], {"fp32": 6})
        self.assertEqual(info["text"]["records"], 4)  # 5 te files, two identical
        self.assertEqual(info["names"], 6)
        self.assertEqual(sorted((b["w"], b["h"], b["count"]) for b in info["buckets"]),
                         [(32, 64, 1), (48, 64, 1), (64, 48, 2), (64, 64, 2)])
        out = self.p("out")
        rc, _, err = run("export-kohya", shard, "-o", out, "-q")
        self.assertEqual(rc, 0, err)
        self.assert_same_tree(out, d)

    def test_alpha_mask_round_trip(self):
        """kohya's alpha_mask (float32 at the image's size, alpha / 255) is imported as the
        record's loss mask (record version 2) and exported back: npz -> import -> export equal,
        key order included; split, merge and compact keep it (their exports equal too), sd-verify
        finds no problem; an fp16 import keeps the mask fp32."""
        d = self.p("alpha")
        for i, (w, h) in enumerate([(64, 48), (48, 64), (64, 64), (32, 32)]):
            extra = {}
            if i != 3:  # one image without a mask: a version 1 record beside the masked ones
                a = self.rng.integers(0, 256, (h, w)).astype(np.uint8)
                extra["alpha_mask"] = a.astype(np.float32) / 255.0
            self.latents(os.path.join(d, "a%d.npz" % i), w, h, flip=i % 2 == 0, **extra)
        shard = self.p("alpha.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        self.verify(shard)
        self.assertEqual((self.info(shard)["latents"]["records"], self.info(shard)["latents"]["masks"]), (4, 3))
        rc, _, err = run("export-kohya", shard, "-o", self.p("alpha-out"), "--layout", "legacy", "-q")
        self.assertEqual(rc, 0, err)
        self.assert_same_tree(self.p("alpha-out"), d)
        self.assertIn("alpha_mask", npz_dict(self.p("alpha-out", "a0.npz"))[1])
        rc, _, err = run("split", "-n", "2", "-o", self.p("ap-%d.lmdb"), shard, "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("merge", "-o", self.p("am.lmdb"), self.p("ap-0.lmdb"), self.p("ap-1.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("compact", self.p("am.lmdb"), "-o", self.p("ac.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        self.verify(self.p("ac.lmdb"))
        rc, _, err = run("export-kohya", self.p("ac.lmdb"), "-o", self.p("alpha-out2"), "--layout", "legacy", "-q")
        self.assertEqual(rc, 0, err)
        self.assert_same_tree(self.p("alpha-out2"), d)
        rc, _, err = run("import-kohya", d, "-o", self.p("alpha16.lmdb"), "--dtype", "fp16", "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("export-kohya", self.p("alpha16.lmdb"), "-o", self.p("alpha-out16"), "--layout", "legacy",
                         "-q")
        self.assertEqual(rc, 0, err)
        self.assert_same_tree(self.p("alpha-out16"), d, f16=True, exact=("alpha_mask",))

    def test_scaling_factor_from_names_or_option(self):
        # legacy names with text-encoder outputs: SDXL assumed, with a warning
        d = self.kohya_dir()
        rc, _, err = run("import-kohya", d, "-o", self.p("l.lmdb"))
        self.assertEqual(rc, 0, err)
        self.assertIn("give --scale", err)
        self.assertEqual(self.info(self.p("l.lmdb"))["meta"]["scaling_factor"], "0.13025")
        # _sd names: SD 1.x/2.x, quietly; --scale overrides
        sd = self.p("sd")
        self.latents(os.path.join(sd, "a_0512x0512_sd.npz"), 64, 64, orig=(512, 512))
        rc, _, err = run("import-kohya", sd, "-o", self.p("s.lmdb"))
        self.assertEqual(rc, 0, err)
        self.assertNotIn("give --scale", err)
        self.assertEqual(self.info(self.p("s.lmdb"))["meta"]["scaling_factor"], "0.18215")
        rc, _, err = run("import-kohya", sd, "-o", self.p("t.lmdb"), "--scale", "0.5")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(self.p("t.lmdb"))["meta"]["scaling_factor"], "0.5")
        for bad in ("-1", "nan", "inf"):
            self.assertEqual(run("import-kohya", sd, "-o", self.p("u.lmdb"), "--scale", bad)[0], 2, bad)
        # SD and SDXL caches in one directory: one shard has one factor, so refused without --scale
        mixed = self.p("mixed")
        self.latents(os.path.join(mixed, "a_0512x0512_sdxl.npz"), 64, 64, orig=(512, 512))
        self.latents(os.path.join(mixed, "b_0512x0512_sd.npz"), 64, 64, orig=(512, 512))
        rc, _, err = run("import-kohya", mixed, "-o", self.p("m.lmdb"))
        self.assertEqual(rc, 3, err)
        self.assertIn("b_0512x0512_sd.npz is an SD 1.x/2.x cache", err)
        self.assertEqual(run("import-kohya", mixed, "-o", self.p("m.lmdb"), "--scale", "0.13025", "-q")[0], 0)
        # another factor in the shard is replaced by --scale only (its records were made with it)
        self.latents(os.path.join(sd, "b_0512x0512_sd.npz"), 64, 64, orig=(512, 512))
        rc, _, err = run("import-kohya", sd, "-o", self.p("t.lmdb"))
        self.assertEqual(rc, 3, err)
        self.assertIn("records scaling_factor 0.5, the cache names give 0.18215", err)
        self.assertEqual(self.info(self.p("t.lmdb"))["latents"]["records"], 1)
        rc, _, err = run("import-kohya", sd, "-o", self.p("t.lmdb"), "--scale", "0.5", "-q")
        self.assertEqual((rc, self.info(self.p("t.lmdb"))["latents"]["records"]), (0, 2), err)
        rc, _, err = run("import-kohya", sd, "-o", self.p("t.lmdb"), "--scale", "0.7")  # nothing new to import
        self.assertEqual(rc, 0, err)
        self.assertIn("scaling_factor 0.5 in the meta becomes 0.7", err)
        self.assertEqual(self.info(self.p("t.lmdb"))["meta"]["scaling_factor"], "0.7")
        # a shard imported before the factor was written gets it on the next run, with nothing new
        dump = subprocess.run(["mdb_dump", "-n", "-a", self.p("s.lmdb")], capture_output=True, check=True)
        lines, out, meta, skip = dump.stdout.decode().split("\n"), [], False, False
        for line in lines:
            if line.startswith("database="):
                meta = line == "database=meta"
            if skip:
                skip = False
                continue
            if meta and line == " " + b"scaling_factor".hex():  # keys and values in hex
                skip = True
                continue
            out.append(line)
        subprocess.run(["mdb_load", "-n", self.p("old.lmdb")], input="\n".join(out).encode(), check=True,
                       capture_output=True)
        self.assertNotIn("scaling_factor", self.info(self.p("old.lmdb"))["meta"])
        rc, _, err = run("import-kohya", sd, "-o", self.p("old.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(self.p("old.lmdb"))["meta"]["scaling_factor"], "0.18215")

    def test_export_layout_must_fit_the_scaling_factor(self):
        """_sd/_sdxl names say the model and a re-import takes the scaling_factor from them: a
        layout that contradicts the shard's factor is refused (exit 2, nothing written) unless
        --force-layout (the old export wrote _sdxl names for an SD 1.x shard, silently)."""
        d = self.p("sd")
        self.latents(os.path.join(d, "img_0192x0144_sd.npz"), 64, 48, orig=(192, 144))
        shard = self.p("sd.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("export-kohya", shard, "-o", self.p("x"), "--layout", "sdxl")
        self.assertEqual(rc, 2, err)
        self.assertIn("%s: scaling_factor 0.18215, but --layout sdxl names are read back as scaling_factor 0.13025"
                      % shard, err)
        self.assertFalse(os.path.exists(self.p("x")))
        for layout in ("sd", "legacy"):
            rc, _, err = run("export-kohya", shard, "-o", self.p(layout), "--layout", layout, "-q")
            self.assertEqual(rc, 0, err)
        rc, _, err = run("export-kohya", shard, "-o", self.p("x"), "--layout", "sdxl", "--force-layout", "-q")
        self.assertEqual((rc, tree(self.p("x"))), (0, ["img_0192x0144_sdxl.npz"]), err)
        # the layout recorded at import contradicting a --scale given then: refused as well
        shard2 = self.p("sd2.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard2, "--scale", "0.13025", "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("export-kohya", shard2, "-o", self.p("y"))
        self.assertEqual(rc, 2, err)
        self.assertIn("the layout it was imported with, sd names", err)
        self.assertIn("--force-layout", run("export-kohya", "--help")[1])

    def test_scale_zero_means_the_default(self):
        """--scale 0 is the default (the factor from the cache names), as sd-latents documents
        it; the old help did not say so while -1 was refused."""
        d = self.p("sd")
        self.latents(os.path.join(d, "img_0192x0144_sd.npz"), 64, 48, orig=(192, 144))
        rc, _, err = run("import-kohya", d, "-o", self.p("z.lmdb"), "--scale", "0", "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(self.p("z.lmdb"))["meta"]["scaling_factor"], "0.18215")
        rc, _, err = run("import-kohya", d, "-o", self.p("n.lmdb"), "--scale", "-1")
        self.assertEqual(rc, 2, err)
        self.assertIn("--scale must be a finite number > 0, or 0 for the default", err)
        self.assertIn("(default, or 0: 0.18215 for _sd names", run("import-kohya", "--help")[1])

    def test_fp16_import_equals_numpy_rounding(self):
        d = self.kohya_dir()
        shard = self.p("h.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "--dtype", "fp16", "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(shard)["latents"]["dtypes"], {"fp16": 6})
        out = self.p("out")
        rc, _, err = run("export-kohya", shard, "-o", out, "-q")
        self.assertEqual(rc, 0, err)
        # latents come back float32 (as kohya writes), te_outputs stay float16
        self.assert_same_tree(out, d, f16=True)
        want = 0
        for f in tree(d):
            if not f.endswith("_te_outputs.npz"):
                arrays, keys = npz_dict(os.path.join(d, f))
                want += arrays["latents"].size * 2 * (2 if "latents_flipped" in keys else 1)
        self.assertEqual(self.info(shard)["latents"]["payload_bytes"], want)  # fp16: 2 bytes a value

    def test_extend_keeps_one_dtype(self):
        """An import into a shard that already holds records keeps the shard's element type: a
        conflicting --dtype is refused (the shard untouched), no --dtype stores new files in the
        recorded type even when the files hold another."""
        d = self.kohya_dir("kd16")
        shard = self.p("one-dtype.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "--dtype", "fp16", "-q")
        self.assertEqual(rc, 0, err)
        self.latents(os.path.join(d, "late.npz"), 64, 64, orig=(192, 192))  # float32, like the rest
        before = self.info(shard)
        rc, _, err = run("import-kohya", d, "-o", shard, "--dtype", "fp32", "-q")
        self.assertEqual(rc, 3, err)
        self.assertIn("holds fp16 latents from an earlier run; --dtype fp32 would mix", err)
        self.assertEqual(self.info(shard), before)
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        info = self.info(shard)
        self.assertEqual(info["latents"]["records"], before["latents"]["records"] + 1)
        self.assertEqual(info["latents"]["dtypes"], {"fp16": before["latents"]["records"] + 1})

    def test_current_names_and_meta_captions(self):
        d = self.p("xl")
        self.latents(os.path.join(d, "a_1024x0768_sdxl.npz"), 64, 48, orig=(1024, 768))
        self.latents(os.path.join(d, "b_0640x0640_sdxl.npz"), 64, 64, flip=True, orig=(640, 640))
        self.latents(os.path.join(d, "c_0512x0512_sdxl.npz"), 32, 32, orig=(512, 512))
        for s in "abc":
            self.te(os.path.join(d, s + "_te_outputs.npz"), dtype=np.float16)
        meta = {"a": {"caption": "a cat", "train_resolution": [64, 48]},
                "/data/imgs/b.png": {"caption": "a cat", "train_resolution": [64, 64]},
                "c": {"caption": "a dog", "tags": "x, y", "train_resolution": [64, 64]}}
        with open(self.p("meta_lat.json"), "w") as f:
            json.dump(meta, f)
        shard = self.p("xl.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "--meta", self.p("meta_lat.json"))
        self.assertEqual(rc, 0, err)
        # c's latents are 32x32 px but the metadata says 64x64: a stale cache
        self.assertEqual(skipped(err, "latents size differs from meta train_resolution"), 1)
        self.assertIn("c_0512x0512_sdxl.npz", err)
        info = self.info(shard)
        self.assertEqual(info["latents"]["records"], 2)
        self.assertEqual(info["text"]["records"], 1)  # same caption "a cat": one embedding
        self.assertEqual(info["meta"]["kohya_layout"], "sdxl")
        # sd-scripts caches latents unscaled: the trainer needs the SDXL factor
        self.assertEqual(info["meta"]["scaling_factor"], "0.13025")
        # float32 latents, float16 te_outputs, no --dtype: each kind keeps its own
        self.assertEqual(json.loads(info["meta"]["dtypes"]), {"latent": "fp32", "text": "fp16"})
        out = self.p("out")
        rc, _, err = run("export-kohya", shard, "-o", out, "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(tree(out), ["a_1024x0768_sdxl.npz", "a_te_outputs.npz", "b_0640x0640_sdxl.npz",
                                     "b_te_outputs.npz"])
        x, _ = npz_dict(os.path.join(out, "a_1024x0768_sdxl.npz"))
        y, _ = npz_dict(os.path.join(d, "a_1024x0768_sdxl.npz"))
        self.assertTrue(np.array_equal(x["latents"], y["latents"]))
        self.assertEqual(npz_dict(os.path.join(out, "a_te_outputs.npz"))[0]["pool2"].dtype, np.float16)
        rc, _, err = run("export-kohya", shard, "-o", self.p("legacy"), "--layout", "legacy", "-q")
        self.assertEqual(rc, 0, err)
        self.assertIn("a.npz", tree(self.p("legacy")))

    # -- bad inputs --------------------------------------------------------

    def test_bad_files_are_reported_and_skipped(self):
        d = self.kohya_dir(n=2)
        with open(os.path.join(d, "img00.npz"), "rb") as f:
            good = f.read()
        with open(os.path.join(d, "trunc.npz"), "wb") as f:
            f.write(good[: len(good) // 2])
        with open(os.path.join(d, "notzip.npz"), "wb") as f:
            f.write(b"this is not a zip file at all\n" * 3)
        np.savez(os.path.join(d, "nolat.npz"), original_size=np.array([8, 8]), crop_ltrb=np.array([0, 0, 8, 8]))
        np.savez(os.path.join(d, "shape.npz"), latents=np.zeros((4, 8), np.float32), original_size=np.array([8, 8]),
                 crop_ltrb=np.array([0, 0, 8, 8]))
        np.savez(os.path.join(d, "fortran.npz"), latents=np.asfortranarray(np.zeros((4, 2, 3), np.float32)),
                 original_size=np.array([24, 16]), crop_ltrb=np.array([0, 0, 24, 16]))
        bad = np.zeros((4, 2, 2), np.float32)
        bad[0, 0, 0] = np.nan
        np.savez(os.path.join(d, "nan.npz"), latents=bad, original_size=np.array([16, 16]),
                 crop_ltrb=np.array([0, 0, 16, 16]))
        self.latents(os.path.join(d, "alpha.npz"), 16, 16, alpha_mask=np.ones((16, 16), np.float32))
        # masks of another size than the image, and with values outside 0..1: skipped, counted
        self.latents(os.path.join(d, "alphasize.npz"), 16, 16, alpha_mask=np.ones((8, 16), np.float32))
        self.latents(os.path.join(d, "alpharange.npz"), 16, 16, alpha_mask=np.full((16, 16), 1.5, np.float32))
        self.latents(os.path.join(d, "ltrb.npz"), 16, 16, orig=(64, 48), crop=[0, 0, 16, 16])  # not sd-scripts' value
        np.savez(os.path.join(d, "huge.npz"), latents=np.zeros((4, 2, 2), np.float32),
                 original_size=np.array([2 ** 63 - 1, 16], np.int64), crop_ltrb=np.array([0.0, 0, 16, 16]))
        self.latents(os.path.join(d, "badte.npz"), 16, 16)
        np.savez(os.path.join(d, "badte_te_outputs.npz"), hidden_state1=np.zeros((77, 512), np.float32),
                 hidden_state2=np.zeros((77, 1280), np.float32), pool2=np.zeros(1280, np.float32))
        self.te(os.path.join(d, "orphan_te_outputs.npz"))
        shard = self.p("c.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard)
        self.assertEqual(rc, 0, err)
        for reason, n in (("unreadable npz", 3), ("no latents array", 1), ("bad latents shape", 1),
                          ("NaN or Inf in latents", 1), ("bad alpha_mask", 1), ("alpha_mask values outside 0..1", 1),
                          ("bad te shape", 1), ("te_outputs without latents", 1), ("bad original_size", 1)):
            self.assertEqual(skipped(err, reason), n, (reason, err))
        # a crop_ltrb that is not sd-scripts' value: imported, kept as given (flag 4), with a warning
        self.assertIn("is not sd-scripts'", err)
        self.assertIn("stored as given", err)
        for name in ("trunc.npz", "notzip.npz", "nolat.npz", "shape.npz", "fortran.npz", "nan.npz",
                     "badte_te_outputs.npz", "orphan_te_outputs.npz", "ltrb.npz", "huge.npz", "alphasize.npz",
                     "alpharange.npz"):
            self.assertIn(name, err)
        self.assertIn("Fortran order", err)
        self.assertIn("alpha_mask is not (16, 16) float", err)
        self.assertEqual(self.info(shard)["latents"]["records"], 4)  # alpha.npz is imported with its mask
        # ... and exported with the file's own crop_ltrb back
        rc, _, err = run("export-kohya", shard, "-o", self.p("ltrb-out"), "--layout", "legacy", "-q")
        with np.load(self.p("ltrb-out", "ltrb.npz")) as z:
            self.assertEqual(z["crop_ltrb"].tolist(), [0.0, 0.0, 16.0, 16.0])
        self.verify(shard)
        rc, _, err = run("import-kohya", d, "-o", self.p("s.lmdb"), "--strict", "-q")
        self.assertEqual(rc, 1)

    def test_record_name_over_the_limit_is_a_skip(self):
        """A relative path giving a record name over 511 bytes (the names index key limit) is
        skipped naming the file, and the import goes on (it aborted, every rerun alike)."""
        d = self.p("long")
        long_rel = os.path.join("d" * 200, "e" * 200, "x" * 120)
        self.latents(os.path.join(d, long_rel + ".npz"), 64, 48)
        self.latents(os.path.join(d, "ok.npz"), 64, 48)
        shard = self.p("l.lmdb")
        for attempt in range(2):  # a rerun meets the file again: skipped again, not fatal
            rc, _, err = run("import-kohya", d, "-o", shard)
            self.assertEqual(rc, 0, err)
            self.assertEqual(skipped(err, "record name too long"), 1, err)
            self.assertIn("%s/%s.npz (record name 522 bytes, limit 511)" % (d, long_rel), err)
        self.assertEqual(self.info(shard)["latents"]["records"], 1)

    def test_directory_loops_are_not_followed(self):
        """A directory link back to an ancestor is reported and not followed (it imported one
        file 33 times: again/img, again/again/img, ...); a link elsewhere is followed once."""
        d, elsewhere = self.p("loopd"), self.p("elsewhere")
        self.latents(os.path.join(d, "img.npz"), 64, 48)
        self.latents(os.path.join(d, "sub", "deep.npz"), 64, 48)
        self.latents(os.path.join(elsewhere, "one.npz"), 64, 48)
        os.symlink(elsewhere, os.path.join(d, "other"))
        # one loop link per run: the two together made the old walk exponential (2^32 paths)
        for i, (link, to) in enumerate(((os.path.join(d, "again"), "."), (os.path.join(d, "sub", "up"), ".."))):
            os.symlink(to, link)
            shard = self.p("loop%d.lmdb" % i)
            rc, _, err = run("import-kohya", d, "-o", shard)
            self.assertEqual(rc, 0, err)
            self.assertEqual(skipped(err, "directory loop"), 1, err)
            self.assertIn("%s (leads back to %s; not followed)" % (link, d), err)
            rc, _, err = run("export-kohya", shard, "-o", self.p("out%d" % i), "--layout", "legacy", "-q")
            self.assertEqual(rc, 0, err)
            self.assertEqual(tree(self.p("out%d" % i)), ["img.npz", "other/one.npz", "sub/deep.npz"])
            os.unlink(link)

    def test_import_into_a_foreign_shard_is_refused(self):
        """import-kohya into an existing shard of sd-latents (a model_hash) mixed foreign latents
        in and overwrote its producer and options; now refused (exit 2, shard untouched) unless
        --allow-mixed, which keeps the shard's meta. A kohya import of the other family too."""
        d = self.p("kd")
        self.latents(os.path.join(d, "img_0192x0144_sdxl.npz"), 64, 48, orig=(192, 144))
        a = self.p("a.shard")
        writer("write", a, 6, 8)
        for k, v in (("producer", "sd-latents 0.1.0"), ("model_hash", "0123abcd"), ("options", '{"vae": "x"}')):
            writer("meta", a, k, v)
        with open(a, "rb") as f:
            before = f.read()
        rc, _, err = run("import-kohya", d, "-o", a)
        self.assertEqual(rc, 2, err)
        self.assertIn("%s: made by 'sd-latents 0.1.0' (model_hash 0123abcd, kohya_layout none)" % a, err)
        self.assertIn("--allow-mixed", err)
        with open(a, "rb") as f:
            self.assertEqual(f.read(), before)
        # a long path keeps the whole advice (an sd_error's 256 bytes used to cut it)
        deep = self.p("a_reasonably_long_directory_name_for_a_dataset", "another_level_of_nesting_for_datasets")
        os.makedirs(deep)
        b = os.path.join(deep, "sdxl_latents_cache_part0.shard")
        shutil.copy(a, b)
        rc, _, err = run("import-kohya", d, "-o", b)
        self.assertEqual(rc, 2, err)
        self.assertIn("or pass --allow-mixed to import anyway (the shard's meta is kept)", err)
        rc, _, err = run("import-kohya", d, "-o", a, "--allow-mixed", "--scale", "0.13025")
        self.assertEqual(rc, 0, err)
        self.assertIn("importing anyway (--allow-mixed)", err)
        meta = self.info(a)["meta"]
        self.assertEqual((meta["producer"], meta["options"], meta.get("kohya_layout")),
                         ("sd-latents 0.1.0", '{"vae": "x"}', None))
        self.assertEqual(self.info(a)["latents"]["records"], 7)
        # a kohya import of SD 1.x/2.x names does not take _sdxl names; one of _sdxl names does
        sd, d2 = self.p("sd"), self.p("kd2")
        self.latents(os.path.join(sd, "old_0192x0144_sd.npz"), 64, 48, orig=(192, 144))
        self.latents(os.path.join(d2, "two_0192x0144_sdxl.npz"), 64, 48, orig=(192, 144))
        for src, out in ((sd, "s.lmdb"), (d, "x.lmdb")):
            rc, _, err = run("import-kohya", src, "-o", self.p(out), "-q")
            self.assertEqual(rc, 0, err)
        rc, _, err = run("import-kohya", d2, "-o", self.p("s.lmdb"), "--scale", "0.13025")
        self.assertEqual(rc, 2, err)
        self.assertIn("it is a kohya import of the other model family", err)
        rc, _, err = run("import-kohya", d2, "-o", self.p("x.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(self.p("x.lmdb"))["latents"]["records"], 2)
        self.assertIn("allow-mixed", run("import-kohya", "--help")[1])

    def test_usage_errors(self):
        rc, out, _ = run("--help")
        self.assertEqual(rc, 0)
        self.assertIn("import-kohya", out)
        for cmd in ("info", "merge", "split", "compact", "import-kohya", "export-kohya", "export-tar"):
            rc, out, _ = run(cmd, "--help")
            self.assertEqual(rc, 0, cmd)
            self.assertIn("Usage: sd-pack " + cmd, out)
        self.assertEqual(run("frobnicate")[0], 2)
        self.assertEqual(run("merge", "a.lmdb")[0], 2)
        self.assertEqual(run("split", "-n", "2", "-o", "nopattern.lmdb", "a.lmdb")[0], 2)
        self.assertEqual(run("import-kohya", self.dir, "-o", self.p("x.lmdb"), "--dtype", "int8")[0], 2)
        self.assertEqual(run("export-tar", "a.lmdb", "-o", "x.tar")[0], 2)
        rc, _, err = run("info", self.p("missing.lmdb"))
        self.assertEqual(rc, 3)
        self.assertIn("missing.lmdb", err)

    # -- resume --------------------------------------------------------------

    def test_resume_after_partial_and_kill(self):
        d = self.kohya_dir(n=6)
        shard = self.p("r.lmdb")
        part = self.p("part")
        os.makedirs(part)
        for f in ("img00.npz", "img00_te_outputs.npz", "img01.npz"):
            shutil.copy(os.path.join(d, f), part)
        rc, _, err = run("import-kohya", part, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("import-kohya", d, "-o", shard)
        self.assertEqual(rc, 0, err)
        self.assertIn("2 already present", err)
        self.assertEqual(self.info(shard)["latents"]["records"], 6)
        # a bigger directory, killed once some batches are committed and others
        # not: the partial shard holds a strict subset, the final name does not
        # exist yet, and the rerun skips exactly what was committed
        big = self.p("big")
        for i in range(600):
            self.latents(os.path.join(big, "b%04d.npz" % i), 64, 64, flip=True)
        out = self.p("big.lmdb")
        committed = self.kill_mid_import(big, out, 600)
        self.assertFalse(os.path.exists(out))
        self.assertTrue(0 < committed < 600, committed)
        rc, _, err = run("import-kohya", big, "-o", out)
        self.assertEqual(rc, 0, err)
        self.assertIn("%d already present" % committed, err)
        self.assertEqual(self.info(out)["latents"]["records"], 600)
        self.assertFalse(os.path.exists(out + ".partial"))
        self.verify(out)

    def test_same_name_from_another_directory_is_refused(self):
        """import-kohya A then B into one shard: B's file named like one of A's is another image,
        not 'already present' (issue 31, item 16); the same directory again is a resume."""
        a, b = self.p("A"), self.p("B")
        self.latents(os.path.join(a, "img00.npz"), 64, 64, orig=(192, 192))
        self.latents(os.path.join(a, "img01.npz"), 64, 48, flip=True, orig=(200, 150))
        self.latents(os.path.join(b, "img00.npz"), 64, 64, orig=(192, 192))  # same name and size, other latents
        shutil.copy(os.path.join(a, "img01.npz"), b)  # the very same file
        self.latents(os.path.join(b, "img02.npz"), 48, 64, orig=(150, 200))
        shard = self.p("ab.lmdb")
        rc, _, err = run("import-kohya", a, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        for again in range(2):  # the second run resumes B: the refusal stands, nothing doubles
            rc, _, err = run("import-kohya", b, "-o", shard)
            self.assertEqual(rc, 0, err)
            self.assertEqual(skipped(err, "name already in the shard for other latents"), 1, err)
            self.assertIn("img00.npz: the shard's record 'img00' holds other latents", err)
            self.assertIn("%d already present" % (1 + again), err)
        self.assertEqual(self.info(shard)["latents"]["records"], 3)
        rc, _, err = run("import-kohya", a, "-o", shard, "--strict")
        self.assertEqual(rc, 0, err)
        self.assertIn("0 records (0 new text embeddings), 2 already present, 0 skipped", err)
        rc, _, err = run("import-kohya", b, "-o", shard, "--strict", "-q")
        self.assertEqual(rc, 1, err)

    def kill_mid_import(self, src, out, total):
        """Start an import, stop it (SIGSTOP) once its partial shard holds
        committed records, SIGKILL it while it holds fewer than total;
        returns the records committed by then. A stop can catch the importer
        holding one of LMDB's locks, which blocks a reader: such a look times
        out and the importer is let go on."""
        part = out + ".partial"

        def records():
            try:
                p = subprocess.run([SD_PACK, "info", "--json", part], capture_output=True, timeout=10)
            except subprocess.TimeoutExpired:
                return None
            return json.loads(p.stdout)["latents"]["records"] if p.returncode == 0 else 0

        for attempt in range(5):
            for f in (out, part, part + "-lock"):
                if os.path.exists(f):
                    os.unlink(f)
            p = subprocess.Popen([SD_PACK, "import-kohya", src, "-o", out, "-q"], stderr=subprocess.DEVNULL)
            while p.poll() is None:
                time.sleep(0.002)
                if not os.path.exists(part):
                    continue
                p.send_signal(signal.SIGSTOP)
                n = records()
                if n is not None and 0 < n < total:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                    return n
                p.send_signal(signal.SIGCONT)
            p.wait()
        self.fail("the import finished before it could be stopped mid-way (5 tries)")

    # -- split / merge / compact / tar ----------------------------------------

    def test_split_merge_compact(self):
        d = self.p("many")
        sizes = [(64, 48), (48, 64), (64, 64), (32, 32), (64, 32)]
        for i in range(53):
            w, h = sizes[(i * 7) % len(sizes)] if i % 11 else (64, 64)
            self.latents(os.path.join(d, "m%03d.npz" % i), w, h, flip=i % 2 == 0)
            self.te(os.path.join(d, "m%03d_te_outputs.npz" % i), tokens=77, dtype=np.float16, seed=i % 9)
        shard = self.p("all.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        whole = self.info(shard)
        self.assertEqual(whole["text"]["records"], 9)
        rc, _, err = run("split", "-n", "3", "-o", self.p("part-%d.lmdb"), shard, "-q")
        self.assertEqual(rc, 0, err)
        parts = [self.info(self.p("part-%d.lmdb" % i)) for i in range(3)]
        for b in whole["buckets"]:
            counts = [next((x["count"] for x in pi["buckets"] if (x["w"], x["h"]) == (b["w"], b["h"])), 0)
                      for pi in parts]
            self.assertEqual(sum(counts), b["count"])
            self.assertLessEqual(max(counts) - min(counts), 1, (b, counts))
        totals = [pi["latents"]["records"] for pi in parts]
        self.assertLessEqual(max(totals) - min(totals), 1)
        for i in range(3):
            self.verify(self.p("part-%d.lmdb" % i))  # every text reference resolves
        merged = self.p("merged.lmdb")
        rc, _, err = run("merge", "-o", merged, *[self.p("part-%d.lmdb" % i) for i in range(3)],
                         self.p("part-0.lmdb"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "duplicate record key (first kept)"), parts[0]["latents"]["records"])
        m = self.info(merged)
        self.assertEqual(m["latents"]["records"], 53)
        self.assertEqual(m["text"]["records"], 9)
        self.assertEqual(m["buckets"], whole["buckets"])
        self.verify(merged)
        compact = self.p("compact.lmdb")
        rc, _, err = run("compact", merged, "-o", compact, "-q")
        self.assertEqual(rc, 0, err)
        self.verify(compact)
        # identical record set: the exports of the original and the merged+compacted shard match
        for name, s in (("o1", shard), ("o2", compact)):
            rc, _, err = run("export-kohya", s, "-o", self.p(name), "-q")
            self.assertEqual(rc, 0, err)
        self.assert_same_tree(self.p("o1"), self.p("o2"))
        self.assert_same_tree(self.p("o1"), d)
        rc, _, err = run("merge", "-o", shard, shard)
        self.assertEqual(rc, 2)
        # more parts than are open at once (64): a second pass writes parts 64..69; every record in
        # exactly one part (the second pass wrote into the first pass's closed parts and crashed)
        rc, _, err = run("split", "-n", "70", "-o", self.p("p70-%d.lmdb"), shard, "-q")
        self.assertEqual(rc, 0, err)
        totals = [self.info(self.p("p70-%d.lmdb" % i))["latents"]["records"] for i in range(70)]
        self.assertEqual((sum(totals), max(totals) - min(totals)), (53, 1))

    def test_merge_refuses_caches_of_different_models(self):
        d = self.p("mm")
        for i in range(4):
            self.latents(os.path.join(d, "a%d.npz" % i), 64, 64)
        for name in ("x.lmdb", "y.lmdb"):
            rc, _, err = run("import-kohya", d, "-o", self.p(name), "-q")
            self.assertEqual(rc, 0, err)
        if not shutil.which("mdb_load"):
            self.skipTest("mdb_load (lmdb-utils) not installed")
        for name, h in (("x.lmdb", "vae-aaaa"), ("y.lmdb", "vae-bbbb")):  # stamp a model identity
            p = subprocess.run(["mdb_load", "-n", "-T", "-s", "meta", self.p(name)], input=b"model_hash\n" + h.encode() + b"\n",
                               capture_output=True)
            self.assertEqual(p.returncode, 0, p.stderr)
        rc, _, err = run("merge", "-o", self.p("xy.lmdb"), self.p("x.lmdb"), self.p("y.lmdb"))
        self.assertEqual(rc, 2, err)
        self.assertIn("different models", err)
        self.assertFalse(os.path.exists(self.p("xy.lmdb")))
        rc, _, err = run("merge", "--allow-mixed", "-o", self.p("xy.lmdb"), self.p("x.lmdb"), self.p("y.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("merge", "-o", self.p("xx.lmdb"), self.p("x.lmdb"), self.p("x.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        # compact has one input: --allow-mixed is merge's alone
        rc, _, err = run("compact", "--allow-mixed", self.p("x.lmdb"), "-o", self.p("xc.lmdb"))
        self.assertEqual(rc, 2, err)
        self.assertNotIn("allow-mixed", run("compact", "--help")[1])
        # a write error on stdout (a full disk) is an error, not a truncated listing and exit 0
        with open("/dev/full", "w") as full:
            p = subprocess.run([SD_PACK, "info", "--json", self.p("x.lmdb")], stdout=full, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("standard output: write failed", p.stderr.decode())
        # exit codes: each help gives its own line (info has no --strict; sd-verify's 1 means problems)
        self.assertIn("Exit codes: 0 ok, 2 usage error, 3 a shard cannot be read.", run("info", "--help")[1])
        self.assertIn("1 records skipped under --strict", run("merge", "--help")[1])
        vh = subprocess.run([SD_VERIFY, "--help"], capture_output=True, text=True).stdout
        self.assertIn("1 problems found", vh)
        self.assertNotIn("under --strict", vh)
        self.assertIn("allow-mixed", run("merge", "--help")[1])

    def test_export_tar_members_load_with_numpy(self):
        d = self.kohya_dir(n=6)
        shard = self.p("t.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q", "--dtype", "bf16")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("export-tar", shard, "-o", self.p("tars", "c-%05d.tar"), "--per-tar", "4")
        self.assertEqual(rc, 3, err)  # tars/ does not exist: a clear fatal error
        os.makedirs(self.p("tars"))
        shard32 = self.p("t32.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard32, "-q")
        self.assertEqual(rc, 0, err)
        rc, _, err = run("export-tar", shard32, "-o", self.p("tars", "c-%05d.tar"), "--per-tar", "4", "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(os.listdir(self.p("tars"))), ["c-00000.tar", "c-00001.tar"])
        seen = {}
        for t in sorted(os.listdir(self.p("tars"))):
            with tarfile.open(self.p("tars", t)) as tf:
                for m in tf.getmembers():
                    seen[m.name] = tf.extractfile(m).read()
        names = sorted({k.split(".")[0] for k in seen})
        self.assertEqual(names, ["img00", "img01", "img03", "img04", "sub/img02", "sub/img05"])
        for n in names:
            src, _ = npz_dict(os.path.join(d, n + ".npz"))
            lat = np.load(io.BytesIO(seen[n + ".latents.npy"]))
            self.assertEqual(lat.dtype, np.float32)
            self.assertTrue(np.array_equal(lat, src["latents"]))
            if "latents_flipped" in src:
                self.assertTrue(np.array_equal(np.load(io.BytesIO(seen[n + ".latents_flipped.npy"])),
                                               src["latents_flipped"]))
            meta = json.loads(seen[n + ".json"])
            self.assertEqual(meta["original_size"], src["original_size"].tolist())
            self.assertEqual(meta["crop_ltrb"], [float(x) for x in src["crop_ltrb"]])
            bucket = [src["latents"].shape[2] * 8, src["latents"].shape[1] * 8]
            self.assertEqual(meta["bucket"], bucket)
            self.assertEqual(meta["crop"], cut_box(bucket, meta["original_size"]))
            te_path = os.path.join(d, n + "_te_outputs.npz")
            if os.path.exists(te_path):
                te, _ = npz_dict(te_path)
                for member, key in (("te1", "hidden_state1"), ("te2", "hidden_state2"), ("pool2", "pool2")):
                    self.assertTrue(np.array_equal(np.load(io.BytesIO(seen[n + "." + member + ".npy"])), te[key]))
            else:
                self.assertNotIn(n + ".te1.npy", seen)
        # bf16 shards: numpy has no bfloat16, members are float32 holding the bf16 values
        rc, _, err = run("export-tar", shard, "-o", self.p("tars", "b-%d.tar"), "--per-tar", "100", "-q")
        self.assertEqual(rc, 0, err)
        with tarfile.open(self.p("tars", "b-0.tar")) as tf:
            lat = np.load(io.BytesIO(tf.extractfile("img00.latents.npy").read()))
        src, _ = npz_dict(os.path.join(d, "img00.npz"))
        bits = src["latents"].view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
        self.assertTrue(np.array_equal(lat, rounded))

    def test_export_tar_utf8_names(self):
        """Record names are UTF-8: export-tar writes them as they are whatever the locale
        (sd-pack never sets one; the old pax writer failed to convert them, exit 3, no tar)."""
        d = self.p("u8")
        self.latents(os.path.join(d, "猫.npz"), 64, 48)
        self.latents(os.path.join(d, "sub", "é" * 60 + ".npz"), 48, 64)  # a pax path, long and non-ASCII
        self.latents(os.path.join(d, "plain.npz"), 64, 64)
        shard = self.p("u8.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        os.makedirs(self.p("tars"))
        for i, env in enumerate(({"LC_ALL": "C"}, {"LC_ALL": "C.UTF-8"})):
            p = subprocess.run([SD_PACK, "export-tar", shard, "-o", self.p("tars", "u%d-%%d.tar" % i), "-q"],
                               env=dict(os.environ, **env), capture_output=True, text=True, errors="replace")
            self.assertEqual(p.returncode, 0, p.stderr)
            with tarfile.open(self.p("tars", "u%d-0.tar" % i), encoding="utf-8") as tf:
                got = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
            want = ["plain", "sub/" + "é" * 60, "猫"]
            self.assertEqual(sorted(n[:-5] for n in got if n.endswith(".json")), want)
            for n in want:
                self.assertEqual(json.loads(got[n + ".json"])["name"], n)
                src, _ = npz_dict(os.path.join(d, n + ".npz"))
                self.assertTrue(np.array_equal(np.load(io.BytesIO(got[n + ".latents.npy"])), src["latents"]))
            # standard pax: a header only where a name needs one (never hdrcharset=BINARY, which
            # GNU tar warns about on every member), and GNU tar reads the tar without a word
            with open(self.p("tars", "u%d-0.tar" % i), "rb") as f:
                raw = f.read()
            self.assertFalse(b"hdrcharset" in raw, "a hdrcharset pax record in the tar")
            need = sum(1 for n in got if not n.isascii() or len(n.encode()) > 100)
            self.assertEqual(raw.count(b"PaxHeader"), need, "a pax header for each non-ASCII member name only")
            if shutil.which("tar"):
                t = subprocess.run(["tar", "tf", self.p("tars", "u%d-0.tar" % i)], capture_output=True)
                self.assertEqual((t.returncode, t.stderr), (0, b""))

    # -- metadata keys ---------------------------------------------------------

    def test_meta_full_path_keys(self):
        """sd-scripts --full_path keys: each image takes the key of its own
        path (caption and train_resolution), never another directory's entry
        with the same base name; what cannot be told apart is skipped."""
        d = self.p("fp")
        for stem, seed in (("cats/001", 1), ("dogs/001", 2), ("cats/002", 3)):
            self.latents(os.path.join(d, stem + ".npz"), 64, 64)
            self.te(os.path.join(d, stem + "_te_outputs.npz"), seed=seed)
        meta = {"/data/km/cats/001.png": {"caption": "a cat", "train_resolution": [64, 64]},
                "/data/km/dogs/001.png": {"caption": "a dog", "train_resolution": [64, 48]},
                "/data/km/cats/002.png": {"caption": "a cat", "train_resolution": [64, 64]}}
        with open(self.p("meta.json"), "w") as f:
            json.dump(meta, f)
        shard = self.p("fp.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "--meta", self.p("meta.json"))
        self.assertEqual(rc, 0, err)
        # dogs/001's own entry says 64x48: stale, although cats/001's says 64x64
        self.assertEqual(skipped(err, "latents size differs from meta train_resolution"), 1, err)
        self.assertIn("dogs/001.npz", err)
        info = self.info(shard)
        self.assertEqual(info["latents"]["records"], 2)
        self.assertEqual(info["text"]["records"], 1)  # both cats: "a cat"
        # with dogs' entry current, dogs/001 gets its own caption and embedding
        meta["/data/km/dogs/001.png"]["train_resolution"] = [64, 64]
        with open(self.p("meta.json"), "w") as f:
            json.dump(meta, f)
        shard = self.p("fp2.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "--meta", self.p("meta.json"), "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(shard)["text"]["records"], 2)
        os.makedirs(self.p("tars"))
        rc, _, err = run("export-tar", shard, "-o", self.p("tars", "t-%d.tar"), "-q")
        self.assertEqual(rc, 0, err)
        with tarfile.open(self.p("tars", "t-0.tar")) as tf:
            te1 = {n: np.load(io.BytesIO(tf.extractfile(n + ".te1.npy").read())) for n in ("cats/001", "dogs/001")}
        for stem in ("cats/001", "dogs/001"):
            own, _ = npz_dict(os.path.join(d, stem + "_te_outputs.npz"))
            self.assertTrue(np.array_equal(te1[stem], own["hidden_state1"]), stem)
        # a flat directory cannot tell /x/cats/001.png from /x/dogs/001.png;
        # a stem key shared by two images' base names is as ambiguous
        flat = self.p("flat")
        self.latents(os.path.join(flat, "001.npz"), 64, 64)
        for sub in ("a", "b"):
            self.latents(os.path.join(flat, sub, "002.npz"), 64, 64)
        self.latents(os.path.join(flat, "003.npz"), 64, 64)
        with open(self.p("flat.json"), "w") as f:
            json.dump({"/x/cats/001.png": {"caption": "a cat"}, "/x/dogs/001.png": {"caption": "a dog"},
                       "002": {"caption": "two"}, "003": {"caption": "three"}}, f)
        rc, _, err = run("import-kohya", flat, "-o", self.p("flat.lmdb"), "--meta", self.p("flat.json"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "ambiguous metadata key"), 3, err)
        self.assertIn("/x/cats/001.png", err)
        self.assertIn("/x/dogs/001.png", err)
        self.assertEqual(self.info(self.p("flat.lmdb"))["latents"]["records"], 1)  # 003: a unique stem key

    # -- crop conventions --------------------------------------------------------

    def test_crop_conventions(self):
        """The shard stores the box sdtk cut from the resized image; kohya's
        crop_ltrb is the image fitted in the bucket. Import converts one to
        the other and export back, exactly as sd-scripts computes it."""
        d = self.p("crop")
        # 1920x1080 in 1344x768: resized to 1365x768, cut at x = 10
        self.latents(os.path.join(d, "wide.npz"), 1344, 768, orig=(1920, 1080))
        self.latents(os.path.join(d, "tall.npz"), 64, 128, orig=(333, 701))
        src, _ = npz_dict(os.path.join(d, "wide.npz"))
        self.assertEqual(src["crop_ltrb"].tolist(), [0, 6.0, 1344, 762.0])
        shard = self.p("crop.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        os.makedirs(self.p("tars"))
        rc, _, err = run("export-tar", shard, "-o", self.p("tars", "c-%d.tar"), "-q")
        self.assertEqual(rc, 0, err)
        with tarfile.open(self.p("tars", "c-0.tar")) as tf:
            meta = {n: json.loads(tf.extractfile(n + ".json").read()) for n in ("wide", "tall")}
        self.assertEqual(meta["wide"]["crop"], [10, 0, 1354, 768])
        self.assertEqual(meta["wide"]["crop_ltrb"], [0, 6.0, 1344, 762.0])
        self.assertEqual(meta["tall"]["crop"], cut_box((64, 128), (333, 701)))
        out = self.p("out")
        rc, _, err = run("export-kohya", shard, "-o", out, "-q")
        self.assertEqual(rc, 0, err)
        self.assert_same_tree(out, d)
        # records sdtk made (crop = the box it cut): crop_ltrb recomputed for kohya
        native = self.p("native.lmdb")
        writer("write", native, 6, 3)
        out = self.p("native")
        rc, _, err = run("export-kohya", native, "-o", out, "--strict")
        self.assertEqual(rc, 0, err)  # the tiny test text embeddings have no kohya file: not a skipped record
        self.assertIn("wrote 6 latents and 0 te_outputs npz files", err)
        self.assertIn("0 records skipped, 6 text embeddings not written", err)
        for i in range(6):
            x, keys = npz_dict(os.path.join(out, "rec%06d.npz" % i))
            bw = 64 + 64 * (i % 3)
            self.assertEqual(x["crop_ltrb"].dtype, np.float64)
            self.assertEqual(x["crop_ltrb"].tolist(), list(get_crop_ltrb((bw, 64), (bw * 2 + 30, 128))), i)
            self.assertEqual(x["original_size"].tolist(), [bw * 2 + 30, 128])

    # -- inputs that are outputs -----------------------------------------------

    def test_output_never_replaces_an_input(self):
        a = self.p("a.shard")
        writer("write", a, 20, 8)
        # the input is OUT.partial: merge/compact used to delete it first
        shutil.copy(a, self.p("cache.lmdb.partial"))
        rc, _, err = run("compact", self.p("cache.lmdb.partial"), "-o", self.p("cache.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(self.p("cache.lmdb"))["latents"]["records"], 20)
        self.assertEqual(self.info(self.p("cache.lmdb.partial"))["latents"]["records"], 20)
        self.assertEqual([f for f in glob.glob(self.p("cache.lmdb.partial-*")) if not f.endswith(".partial-lock")], [])
        # the output is an input under another path (hard link, symlink)
        os.link(a, self.p("hard.shard"))
        os.symlink(a, self.p("sym.shard"))
        for out in ("hard.shard", "sym.shard"):
            rc, _, err = run("merge", "-o", self.p(out), a, "-q")
            self.assertEqual(rc, 2, err)
            self.assertIn("is also an input", err)
        self.assertEqual(self.info(a)["latents"]["records"], 20)
        # split: a part name is the input
        shutil.copy(a, self.p("x-0.lmdb"))
        os.mkdir(self.p("x-1.lmdb"))
        rc, _, err = run("split", "-n", "2", "-o", self.p("x-%d.lmdb"), self.p("x-0.lmdb"))
        self.assertEqual(rc, 2, err)
        self.assertIn("is the input", err)
        self.assertEqual(self.info(self.p("x-0.lmdb"))["latents"]["records"], 20)
        # split: a later part fails after the first 64 are complete: no part
        # is renamed into place, the old file stays, no temporary file is left
        for i in range(64):
            os.mkdir(self.p("d%d" % i))
        shutil.copy(a, self.p("d0", "p.lmdb"))  # an old shard there, which --force may replace
        with open(a, "rb") as f:
            old = f.read()
        rc, _, err = run("split", "--force", "-n", "65", "-o", self.p("d%d", "p.lmdb"), a, "-q")
        self.assertEqual(rc, 3, err)
        with open(self.p("d0", "p.lmdb"), "rb") as f:
            self.assertEqual(f.read(), old)
        self.assertEqual(glob.glob(self.p("d*", "p.lmdb.partial*")), [])
        self.assertEqual(glob.glob(self.p("d*", "p.lmdb")), [self.p("d0", "p.lmdb")])

    # -- existing outputs: --force, writers, LMDB's lock file -------------------

    def start_writer(self, shard):
        """A process writing shard (tests/shard_writer, one record per commit,
        as sd-latents -o or import-kohya extend one) until killed; returns it
        once it holds the shard's writer lock."""
        w = subprocess.Popen([WRITER, "write", shard, str(10 ** 7), "1", "slow", "keyseed=9"],
                             stderr=subprocess.DEVNULL)
        self.addCleanup(w.wait)
        self.addCleanup(w.kill)
        wait_for(lambda: holds_lock(w.pid, shard, "FLOCK") or w.poll() is not None, "the writer's lock")
        self.assertIsNone(w.poll(), "the writer failed")
        return w

    def test_existing_output_needs_force(self):
        """merge, compact and split replace no existing file unless --force (sd-latents and
        import-kohya -o extend one, so -o EXISTING must not silently drop it); a rerun of a
        split into the same pattern is told that --force replaces its parts."""
        a, b, out = self.p("a.shard"), self.p("b.shard"), self.p("out.lmdb")
        writer("write", a, 20, 8)
        writer("write", b, 10, 8, "keyseed=2")
        rc, _, err = run("merge", "-o", out, a, "-q")
        self.assertEqual(rc, 0, err)
        for cmd in (["merge", "-o", out, b], ["compact", b, "-o", out]):
            rc, _, err = run(*cmd, "-q")
            self.assertEqual(rc, 2, err)
            self.assertIn("output %s exists: --force replaces it" % out, err)
            self.assertEqual(self.info(out)["latents"]["records"], 20)
        os.symlink(self.p("nowhere"), self.p("link.lmdb"))  # a dangling link is replaced too: refused
        rc, _, err = run("merge", "-o", self.p("link.lmdb"), a, "-q")
        self.assertEqual(rc, 2, err)
        self.assertIn("exists: --force replaces it", err)
        self.assertEqual(glob.glob(self.p("*.partial*")), [])
        for cmd, n in ((["merge", "--force", "-o", out, b], 10), (["compact", "--force", a, "-o", out], 20)):
            rc, _, err = run(*cmd, "-q")
            self.assertEqual(rc, 0, err)
            self.assertEqual(self.info(out)["latents"]["records"], n)
            self.verify(out)
        pat = self.p("s-%d.lmdb")
        rc, _, err = run("split", "-n", "2", "-o", pat, a, "-q")
        self.assertEqual(rc, 0, err)
        first = self.split_sets(pat, 2)
        for n, count in ((2, "2 of the 2 parts do"), (3, "2 of the 3 parts do")):
            rc, _, err = run("split", "-n", n, "-o", pat, b, "-q")
            self.assertEqual(rc, 2, err)
            self.assertIn("part %s exists (%s, as after an earlier split into this pattern): --force replaces "
                          "them" % (pat % 0, count), err)
        self.assertEqual(self.split_sets(pat, 2), first)
        self.assertFalse(os.path.exists(pat % 2))
        rc, _, err = run("split", "--force", "-n", "2", "-o", pat, b, "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(sum(self.info(pat % i)["latents"]["records"] for i in range(2)), 10)
        self.assertNotEqual(self.split_sets(pat, 2)[0][0], first[0][0])

    def test_export_tar_names_a_killed_exports_leftover(self):
        """A killed export-tar leaves TAR.tmp.XXXXXX: the rerun names it (and leaves it)."""
        a = self.p("ta.shard")
        writer("write", a, 10, 8)
        os.makedirs(self.p("tl"))
        left = self.p("tl", "t-0.tar.tmp.AbC123")
        open(left, "wb").close()
        rc, _, err = run("export-tar", a, "-o", self.p("tl", "t-%d.tar"))
        self.assertEqual(rc, 0, err)
        self.assertIn("t-0.tar.tmp.AbC123: a temporary output left by an earlier run", err)
        self.assertTrue(os.path.exists(left))

    def test_force_replaces_only_shards(self):
        """--force replaces a shard, never a file of another kind: a FIFO, a user's JSONL (or a
        device such as /dev/null, not tried here), for merge, compact and split alike."""
        a = self.p("fa.shard")
        writer("write", a, 10, 8)
        fifo, jl = self.p("out.fifo"), self.p("meta.jsonl")
        os.mkfifo(fifo)
        with open(jl, "w") as f:
            f.write('{"key": "x"}\n')
        for out in (fifo, jl):
            for cmd in (["merge", "--force", "-o", out, a], ["compact", "--force", a, "-o", out]):
                rc, _, err = run(*cmd, "-q")
                self.assertEqual(rc, 2, err)
                self.assertIn("%s: not a" % out, err)
                self.assertIn("not replaced, even with --force", err)
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        with open(jl) as f:
            self.assertEqual(f.read(), '{"key": "x"}\n')
        os.rename(jl, self.p("part-0.lmdb"))
        rc, _, err = run("split", "--force", "-n", "2", "-o", self.p("part-%d.lmdb"), a, "-q")
        self.assertEqual(rc, 2, err)
        self.assertIn("part-0.lmdb: not a shard file: not replaced, even with --force", err)
        self.assertFalse(os.path.exists(self.p("part-1.lmdb")))

    def test_output_being_written_is_never_replaced(self):
        """Not even --force replaces a shard another process is writing: the writer would go on
        into the unlinked file, its records lost, both tools exiting 0."""
        a, out = self.p("a.shard"), self.p("s-1.lmdb")
        writer("write", a, 20, 8)
        w = self.start_writer(out)
        ino = os.stat(out).st_ino
        for cmd in (["merge", "--force", "-o", out, a], ["compact", "--force", a, "-o", out],
                    ["split", "--force", "-n", "2", "-o", self.p("s-%d.lmdb"), a]):
            rc, _, err = run(*cmd, "-q")
            self.assertEqual(rc, 3, err)
            self.assertIn("%s is being written by another process (it holds the shard's writer lock)" % out, err)
            self.assertIn("even with --force", err)
        self.assertIsNone(w.poll())
        self.assertEqual(os.stat(out).st_ino, ino)
        self.assertFalse(os.path.exists(self.p("s-0.lmdb")))  # no part of the set replaced
        self.assertEqual(glob.glob(self.p("*.partial*")), [])

    def test_output_taken_while_running_is_not_replaced(self):
        """The publish checks again just before the rename, holding the writer lock across it: an
        output a writer created while the merge ran is refused without --force and, since it is
        being written, with it."""
        big = self.p("big.shard")
        writer("write", big, 20000, 512, "nosync")
        for i, force in enumerate(([], ["--force"])):
            out = self.p("out%d.lmdb" % i)
            p = subprocess.Popen([SD_PACK, "merge", "-q"] + force + ["-o", out, big], stderr=subprocess.PIPE,
                                 text=True)
            self.addCleanup(p.kill)  # a stopped merge, should the test fail
            wait_for(lambda: glob.glob(out + ".partial-*") or p.poll() is not None, "the merge's temporary file")
            os.kill(p.pid, signal.SIGSTOP)  # past its checks of out, not yet at the publish
            self.assertIsNone(p.poll(), "the merge ended before it could be stopped")
            w = self.start_writer(out)
            ino = os.stat(out).st_ino
            os.kill(p.pid, signal.SIGCONT)
            _, err = p.communicate()
            self.assertEqual(p.returncode, 3, err)
            self.assertIn("being written by another process" if force else
                          "%s: appeared while this run was writing it; not replaced (--force replaces it)" % out, err)
            self.assertIsNone(w.poll())
            self.assertEqual(os.stat(out).st_ino, ino)
            self.assertEqual(glob.glob(out + ".partial*"), [])
            w.kill()
            w.wait()

    def test_replaced_shard_gets_a_fresh_lmdb_lock_file(self):
        """LMDB's lock file OUT-lock holds the transaction id readers start from. While a reader
        of the replaced shard holds it, LMDB does not reset it for the new file, whose readers
        would take the old file's id and read the wrong meta page (its writers would corrupt it):
        the old lock file is removed with the replaced shard; its reader reads the old file on."""
        a, b, out = self.p("a.shard"), self.p("b.shard"), self.p("out.lmdb")
        writer("write", a, 20, 8)
        writer("write", b, 10, 8, "keyseed=2")
        self.assertEqual(run("merge", "-o", self.p("b.lmdb"), b, "-q")[0], 0)  # what merge --force -o out b commits
        self.assertEqual(run("merge", "-o", out, a, "-q")[0], 0)
        if last_txnid(out) % 2 == last_txnid(self.p("b.lmdb")) % 2:
            writer("meta", out, "parity", "1")  # one commit more: the old id names the new file's older meta page
        os.makedirs(self.p("tars"))
        os.mkfifo(self.p("tars", "t-0.tar"))  # export-tar blocks opening it, with out open and read
        r = subprocess.Popen([SD_PACK, "export-tar", out, "-o", self.p("tars", "t-%d.tar"), "-q"],
                             stderr=subprocess.PIPE)
        self.addCleanup(r.wait)
        self.addCleanup(r.kill)
        wait_for(lambda: holds_lock(r.pid, out + "-lock", "POSIX") or r.poll() is not None, "the reader")
        self.assertIsNone(r.poll())
        rc, _, err = run("merge", "--force", "-o", out, b, "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(out)["latents"]["records"], 10)
        self.verify(out)
        with open(self.p("tars", "t-0.tar"), "rb") as f:
            data = f.read()
        self.assertEqual(r.wait(), 0, r.stderr.read())
        r.stderr.close()
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            self.assertEqual(sum(m.name.endswith(".json") for m in tf.getmembers()), 20)

    # -- what the copies and exporters check ---------------------------------

    def assert_skips_name_records(self, err, shard, n):
        """n skip lines about shard name their record as the exporters do: 'NAME' (KEY HEX),
        not by the key alone."""
        named = re.findall(r"skip %s: record 'rec\d{6}' \([0-9a-f]{32}\): " % re.escape(shard), err)
        self.assertEqual(len(named), n, err)

    def test_corrupt_text_embedding_is_not_copied(self):
        a = self.p("a.shard")
        writer("write", a, 30, 8)
        lines = writer("corrupt", a, 1, 4, "text")
        refs = {x.split()[1] for x in lines if x.startswith("ref ")}
        self.assertTrue(0 < len(refs) < 30, lines)
        for cmd in (["merge", "-o", self.p("m.lmdb"), a], ["compact", a, "-o", self.p("c.lmdb")]):
            rc, _, err = run(*cmd)
            self.assertEqual(rc, 0, err)
            self.assertEqual(skipped(err, "text embedding corrupt"), len(refs), err)
            self.assert_skips_name_records(err, a, len(refs))
            out = cmd[2] if cmd[0] == "merge" else cmd[3]
            self.assertEqual(self.info(out)["latents"]["records"], 30 - len(refs))
            self.verify(out)
        rc, _, err = run("split", "-n", "2", "-o", self.p("s-%d.lmdb"), a)
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "text embedding corrupt"), len(refs), err)
        self.assert_skips_name_records(err, a, len(refs))
        self.assertEqual(sum(self.info(self.p("s-%d.lmdb" % i))["latents"]["records"] for i in range(2)),
                         30 - len(refs))
        for i in range(2):
            self.verify(self.p("s-%d.lmdb" % i))

    def test_merge_keeps_one_record_per_name(self):
        """The same images cached under other keys (another run's options):
        the first shard's records are kept, the names index leads to them."""
        a, b = self.p("a.shard"), self.p("b.shard")
        writer("write", a, 20, 8)
        writer("write", b, 25, 8, "keyseed=7")
        first = {line.split()[2] for line in writer("locate", a)}
        merged = self.p("m.lmdb")
        rc, _, err = run("merge", "-o", merged, a, b)
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "duplicate name (first kept)"), 20, err)
        self.assertEqual(self.info(merged)["latents"]["records"], 25)
        self.assertTrue(first <= {line.split()[2] for line in writer("locate", merged)})
        self.verify(merged)  # sd-verify also checks that no two records share a name
        # two copies of each name inside one input: compact keeps the one its names index
        # points at, whatever the key order (sd-verify --repair keeps the same one)
        c = self.p("c.shard")
        writer("write", c, 10, 8)
        writer("write", c, 10, 8, "keyseed=5", "dupnames")
        repaired = self.p("c-repaired.shard")
        shutil.copy(c, repaired)
        subprocess.run([SD_VERIFY, "-q", "--repair", repaired], capture_output=True)
        indexed = {line.split()[2] for line in writer("locate", repaired)}
        self.assertEqual(len(indexed), 10)
        out = self.p("c2.lmdb")
        rc, _, err = run("compact", c, "-o", out)
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "duplicate name (the indexed copy kept)"), 10, err)
        self.assertEqual({line.split()[2] for line in writer("locate", out)}, indexed)
        self.verify(out)

    def test_leftover_temporary_outputs_are_named(self):
        """A killed compact leaves OUT.partial-XXXXXX (each run takes a fresh name): the next
        run names it in a warning, and leaves it alone; one a live process holds is named as
        such."""
        a = self.p("a.shard")
        writer("write", a, 5, 8)
        left = self.p("o.lmdb.partial-Ab12Cd")
        with open(left, "wb") as f:
            f.write(b"x")
        live = self.p("o.lmdb.partial-Cd34Ef")  # one a running writer holds (its flock, as a shard writer's)
        with open(live, "wb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            rc, _, err = run("compact", a, "-o", self.p("o.lmdb"))
        self.assertEqual(rc, 0, err)
        self.assertIn("o.lmdb.partial-Ab12Cd: a temporary output left by an earlier run (killed: no process holds "
                      "it); remove it (and its -lock)", err)
        self.assertIn("o.lmdb.partial-Cd34Ef: a temporary output another run is writing now; left alone", err)
        self.assertNotIn("Cd34Ef: a temporary output left", err)
        self.assertTrue(os.path.exists(left) and os.path.exists(live))

    def test_export_kohya_names_a_killed_exports_leftovers(self):
        """A killed export-kohya leaves NAME.npz.tmp.XXXXXX files in its tree: the rerun names
        each (the first ten, then a count) and leaves them; the export itself is whole."""
        d = self.kohya_dir("kl")
        shard = self.p("kl.lmdb")
        rc, _, err = run("import-kohya", d, "-o", shard, "-q")
        self.assertEqual(rc, 0, err)
        out = self.p("kl-out")
        os.makedirs(os.path.join(out, "sub"))
        left = [os.path.join(out, "sub", "img%02d.npz.tmp.Ab%04d" % (i, i)) for i in range(12)]
        for f in left:
            open(f, "wb").close()
        rc, _, err = run("export-kohya", shard, "-o", out, "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(err.count(": a temporary output left by an earlier run"), 10, err)
        self.assertIn("%s: 12 such temporary files in all" % out, err)
        self.assertTrue(all(os.path.exists(f) for f in left))
        self.assertEqual(sorted(f for f in tree(out) if ".tmp." not in f), tree(d))

    def test_damaged_index_loses_nothing(self):
        """split and the exporters read the records, not only the indexes."""
        a = self.p("a.shard")
        writer("write", a, 20, 8)
        writer("unindex", a, "bindex", 1)
        writer("unindex", a, "names", 2)
        rc, _, err = run("split", "-n", "2", "-o", self.p("s-%d.lmdb"), a)
        self.assertEqual(rc, 0, err)
        self.assertIn("the bucket index does not match the records (20 readable records in 3 buckets; the index "
                      "holds 19 entries", err)
        self.assertEqual(sum(self.info(self.p("s-%d.lmdb" % i))["latents"]["records"] for i in range(2)), 20)
        os.makedirs(self.p("tars"))
        rc, _, err = run("export-tar", a, "-o", self.p("tars", "t-%d.tar"), "--per-tar", "100")
        self.assertEqual(rc, 0, err)
        self.assertIn("2 records are missing from the names index", err)
        with tarfile.open(self.p("tars", "t-0.tar")) as tf:
            names = sorted(m.name[:-5] for m in tf.getmembers() if m.name.endswith(".json"))
        self.assertEqual(names, ["rec%06d" % i for i in range(20)])
        rc, _, err = run("export-kohya", a, "-o", self.p("k"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(tree(self.p("k"))), 20)

    # -- the text identity (empty_text, text_encoder) and misdirected names -----

    def test_empty_text_embedding_travels(self):
        """sd-latents stores the empty caption's embedding unreferenced (only meta empty_text
        names it): merge, compact and split copy it, so conditioning dropout finds it."""
        a = self.p("a.shard")
        writer("write", a, 20, 8)
        empty = writer("emptytext", a, "sd1:test")[0]
        self.verify(a)
        outs = [self.p("m.lmdb"), self.p("c.lmdb"), self.p("s-0.lmdb"), self.p("s-1.lmdb")]
        for cmd in (["merge", "-o", outs[0], a], ["compact", a, "-o", outs[1]],
                    ["split", "-n", "2", "-o", self.p("s-%d.lmdb"), a]):
            rc, _, err = run(*cmd, "-q")
            self.assertEqual(rc, 0, err)
        for out in outs:
            info = self.info(out)
            self.assertEqual(info["meta"].get("empty_text"), empty, out)
            self.assertEqual(info["meta"].get("text_encoder"), "sd1:test", out)
            self.verify(out)  # sd-verify reports an empty_text whose embedding is missing
        self.assertEqual(self.info(outs[0])["text"]["records"], 6)  # 5 captions + the empty one
        # an input whose empty_text names a missing embedding: counted, and the output names
        # the next input's (sound) one instead of a record it does not hold
        x, y = self.p("x.shard"), self.p("y.shard")
        writer("write", x, 10, 8)
        writer("meta", x, "text_encoder", "sd1:test")
        writer("meta", x, "empty_text", "00" * 15 + "01")  # no such embedding
        writer("write", y, 10, 8, "keyseed=3")
        y_empty = writer("emptytext", y, "sd1:test")[0]
        rc, _, err = run("merge", "-o", self.p("xy.lmdb"), x, y)
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "empty_text embedding missing"), 1, err)
        missing = "00" * 15 + "01"
        self.assertIn("x.shard: meta empty_text names text embedding %s, which is not in the shard" % missing, err)
        self.assertEqual(self.info(self.p("xy.lmdb"))["meta"].get("empty_text"), y_empty)
        self.verify(self.p("xy.lmdb"))
        # alone, such an input gives an output without empty_text (sd-train then says none has one)
        rc, _, err = run("split", "-n", "2", "-o", self.p("t-%d.lmdb"), x)
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "empty_text embedding missing"), 1, err)
        for i in range(2):
            self.assertNotIn("empty_text", self.info(self.p("t-%d.lmdb" % i))["meta"])
            self.verify(self.p("t-%d.lmdb" % i))

    def test_merge_refuses_other_text_encoders(self):
        """Text embeddings of two encoder setups are not merged under one label (sd-train
        refuses them), unless --allow-mixed; latents without text embeddings fit any."""
        x, y, z, k = self.p("x.shard"), self.p("y.shard"), self.p("z.shard"), self.p("k.shard")
        writer("write", x, 6, 8)
        writer("emptytext", x, "sd1:one")
        writer("write", y, 6, 8, "keyseed=3")
        writer("emptytext", y, "sd1:other-skip")
        writer("write", z, 6, 8, "keyseed=4", "notext")  # no text embeddings, no text_encoder
        writer("write", k, 6, 8, "keyseed=5")  # text embeddings of an unknown setup (no text_encoder)
        rc, _, err = run("merge", "-o", self.p("xy.lmdb"), x, y)
        self.assertEqual(rc, 2, err)
        self.assertIn("%s has text_encoder 'sd1:other-skip' but %s has 'sd1:one'" % (y, x), err)
        self.assertFalse(os.path.exists(self.p("xy.lmdb")))
        rc, _, err = run("merge", "-o", self.p("xk.lmdb"), x, k)
        self.assertEqual(rc, 2, err)
        self.assertIn("has text_encoder '(none)'", err)
        rc, _, err = run("merge", "--allow-mixed", "-o", self.p("xy.lmdb"), x, y, "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.info(self.p("xy.lmdb"))["meta"]["text_encoder"], "sd1:one")
        for order in ((z, x), (x, z)):
            out = self.p("zx.lmdb")
            rc, _, err = run("merge", "--force", "-o", out, *order, "-q")
            self.assertEqual(rc, 0, err)
            self.assertEqual(self.info(out)["meta"].get("text_encoder"), "sd1:one", order)
            self.verify(out)
        self.assertIn("text_encoder", run("merge", "--help")[1])

    def test_misdirected_names_export_the_right_records(self):
        """A names entry leading to another record (a damaged index): no file holds that
        record's data under the entry's name, and no copy loses the record of that name."""
        a, clean = self.p("a.shard"), self.p("clean.shard")
        writer("write", a, 20, 8)
        shutil.copy(a, clean)
        writer("misname", a, "rec000003", "rec000004")  # its own record still there
        writer("misname", a, "ghost", "rec000005")  # no record of that name
        for name, s in (("k1", clean), ("k2", a)):
            rc, _, err = run("export-kohya", s, "-o", self.p(name))
            self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "name leads to another record"), 2, err)
        self.assertIn("name 'ghost' leads to record", err)
        self.assert_same_tree(self.p("k1"), self.p("k2"))  # rec000003.npz holds rec000003's latents
        os.makedirs(self.p("tars"))
        rc, _, err = run("export-tar", a, "-o", self.p("tars", "t-%d.tar"), "-q")
        self.assertEqual(rc, 0, err)
        with tarfile.open(self.p("tars", "t-0.tar")) as tf:
            names = sorted(m.name[:-5] for m in tf.getmembers() if m.name.endswith(".json"))
            meta = {m.name[:-5]: json.load(tf.extractfile(m)) for m in tf.getmembers() if m.name.endswith(".json")}
        self.assertEqual(names, ["rec%06d" % i for i in range(20)])
        self.assertEqual([meta[n]["bucket"] for n in names], [[64 + 64 * (i % 3), 64] for i in range(20)])
        for cmd in (["merge", "-o", self.p("m.lmdb"), a], ["compact", a, "-o", self.p("c.lmdb")]):
            rc, _, err = run(*cmd)
            self.assertEqual(rc, 0, err)
            self.assertEqual(self.info(self.p(cmd[0][0] + ".lmdb"))["latents"]["records"], 20, err)

    def test_final_progress_line_counts_every_skip(self):
        """The last progress line gave the skips as of the last record's update, one short when
        that record was skipped (merge a a: "8 records, 3 skipped", then "skipped: 4")."""
        a = self.p("a.shard")
        writer("write", a, 4, 8)
        writer("misname", a, "zzz", "rec000001")  # the last name in order leads to another record
        os.makedirs(self.p("tars"))
        for cmd in (["merge", "-o", self.p("m.lmdb"), a, a], ["export-kohya", a, "-o", self.p("k")],
                    ["export-tar", a, "-o", self.p("tars", "t-%d.tar")]):
            rc, _, err = run(*cmd)
            self.assertEqual(rc, 0, err)
            progress = re.findall(r"^sd-pack [\w-]+: \d+(?:/\d+)? records.*?, (\d+) skipped, ", err, re.M)
            summary = re.findall(r"^sd-pack [\w-]+: skipped: (\d+)$", err, re.M)
            self.assertEqual((progress[-1:], summary), (["4" if cmd[0] == "merge" else "1"],) * 2, err)

    # -- split sets: identity, renames, leftovers; write errors ------------------

    def split_sets(self, pattern, n):
        """The split_set meta entry of parts 0..n-1 as (run id, "i/N") pairs."""
        return [tuple(self.info(pattern % i)["meta"].get("split_set", " ").split(" ")) for i in range(n)]

    def test_split_parts_carry_their_set(self):
        a = self.p("a.shard")
        writer("write", a, 60, 8)
        rc, _, err = run("split", "-n", "3", "-o", self.p("s-%d.lmdb"), a, "-q")
        self.assertEqual(rc, 0, err)
        first = self.split_sets(self.p("s-%d.lmdb"), 3)
        self.assertEqual([x[1] for x in first], ["0/3", "1/3", "2/3"])
        self.assertEqual(len({x[0] for x in first}), 1, first)
        self.assertRegex(first[0][0], r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")
        # a split into fewer parts names the higher-numbered parts of the first one
        rc, _, err = run("split", "--force", "-n", "2", "-o", self.p("s-%d.lmdb"), a, "-q")
        self.assertEqual(rc, 0, err)
        self.assertIn("%s (1 file) is from an earlier split into more parts, not this one's 2: remove it before "
                      "using %s" % (self.p("s-2.lmdb"), self.p("s-*.lmdb")), err)
        second = self.split_sets(self.p("s-%d.lmdb"), 3)
        self.assertEqual([x[1] for x in second], ["0/2", "1/2", "2/3"])
        self.assertEqual(second[0][0], second[1][0])
        self.assertNotEqual(second[0][0], first[0][0])  # each run its own id
        rc, _, err = run("split", "--force", "-n", "3", "-o", self.p("s-%d.lmdb"), a, "-q")
        self.assertNotIn("earlier split", err)
        # a merge of parts is no part: split_set is not copied
        rc, _, err = run("merge", "-o", self.p("m.lmdb"), self.p("s-0.lmdb"), self.p("s-1.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        self.assertNotIn("split_set", self.info(self.p("m.lmdb"))["meta"])
        # a split of a part gets its own set
        rc, _, err = run("split", "-n", "2", "-o", self.p("t-%d.lmdb"), self.p("s-0.lmdb"), "-q")
        self.assertEqual(rc, 0, err)
        self.assertEqual([x[1] for x in self.split_sets(self.p("t-%d.lmdb"), 2)], ["0/2", "1/2"])

    def test_split_renames_back_to_back_and_a_kill_shows(self):
        if not shutil.which("strace") or subprocess.run(["strace", "-o", "/dev/null", "true"]).returncode:
            self.skipTest("strace unusable here")
        a, b = self.p("a.shard"), self.p("b.shard")
        writer("write", a, 60, 8)
        writer("write", b, 30, 8, "keyseed=2")
        rc, _, err = run("split", "-n", "3", "-o", self.p("s-%d.lmdb"), b, "-q")
        self.assertEqual(rc, 0, err)
        old = self.split_sets(self.p("s-%d.lmdb"), 3)
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")  # LeakSanitizer cannot run under ptrace
        trace = self.p("trace.txt")
        p = subprocess.run(["strace", "-f", "-o", trace, "-e", "trace=rename,renameat,renameat2,fsync,fdatasync",
                            SD_PACK, "split", "--force", "-q", "-n", "3", "-o", self.p("s-%d.lmdb"), a], env=env,
                           capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(trace) as f:
            calls = [line for line in f if "rename(" in line or "fsync(" in line]
        renames = [i for i, line in enumerate(calls) if re.search(r'rename\(.*s-\d\.lmdb"', line)]
        self.assertEqual(len(renames), 3, calls)
        between = [line for line in calls[renames[0]:renames[-1]] if "fsync" in line]
        self.assertEqual(between, [], "fsync between the parts' renames")
        new = self.split_sets(self.p("s-%d.lmdb"), 3)
        self.assertEqual(len({x[0] for x in new}), 1)
        # a kill after the first rename: part 0 from this run, 1 and 2 from the last, and split_set says so
        p = subprocess.run(["strace", "-f", "-o", "/dev/null", "-e", "trace=rename", "-e",
                            "inject=rename:signal=KILL:when=2", SD_PACK, "split", "--force", "-q", "-n", "3", "-o",
                            self.p("s-%d.lmdb"), b], env=env, capture_output=True)
        self.assertNotEqual(p.returncode, 0)
        mixed = self.split_sets(self.p("s-%d.lmdb"), 3)
        self.assertEqual(mixed[1:], new[1:])
        self.assertNotEqual(mixed[0][0], new[0][0])
        self.assertNotEqual(mixed[0][0], old[0][0])

    def test_export_tar_names_leftovers_and_write_errors(self):
        a = self.p("a.shard")
        writer("write", a, 20, 8)
        os.makedirs(self.p("tars"))
        rc, _, err = run("export-tar", a, "-o", self.p("tars", "t-%d.tar"), "--per-tar", "5", "-q")
        self.assertEqual(rc, 0, err)
        self.assertNotIn("earlier export", err)
        rc, _, err = run("export-tar", a, "-o", self.p("tars", "t-%d.tar"), "--per-tar", "100", "-q")
        self.assertEqual(rc, 0, err)
        names = ", ".join(self.p("tars", "t-%d.tar" % i) for i in (1, 2, 3))
        self.assertIn("%s (3 files) are from an earlier export into more tar files, not this one's 1: remove them "
                      "before using %s" % (names, self.p("tars", "t-*.tar")), err)
        # a tar over the file size limit (past the 1 MiB stdio buffer, so libarchive's own write
        # fails): the error says why, not only "Write error"
        writer("write", self.p("big.shard"), 1000)

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100 << 10, 100 << 10))

        p = subprocess.run([SD_PACK, "export-tar", self.p("big.shard"), "-o", self.p("tars", "b-%d.tar"), "-q"],
                           preexec_fn=limit, capture_output=True, text=True)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertRegex(p.stderr, r"b-0\.tar: writing .*: Write error: File too large")
        self.assertEqual(glob.glob(self.p("tars", "b-*")), [])

if __name__ == "__main__":
    SD_PACK, SD_VERIFY, WRITER = sys.argv[1], sys.argv[2], sys.argv[3]
    unittest.main(argv=[sys.argv[0]], verbosity=1)
