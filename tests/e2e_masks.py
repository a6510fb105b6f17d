#!/usr/bin/env python3
"""End-to-end tests of loss masks (issue 30): a shard written by the previous release
(tests/fixtures/v1.shard) still verifies and trains, and --masked-loss on it (no masks) is refused
(exit 2) naming the shard, while shards where only some records have a mask are trained with a
warning counting the others (plain loss); sd-latents --masks alpha on RGBA pictures made from the wallpaper
photos stores the masks sd-scripts computes (tests/golden/masks/photos.npz, from
tests/golden/make_mask_golden.py), read back through sd-pack export-kohya; --masks files takes
NAME_mask.png beside the image, and a mask of another size than its image, an unreadable mask
and a mask without an image are reported per record, counted, and the run goes on; a shard whose
masks are all 0 trains with loss 0 under --masked-loss; sd-verify reports a mask outside 0..1
and --repair drops that record.
Usage: e2e_masks.py SD_META SD_BUCKET SD_LATENTS SD_VERIFY SD_PACK SD_TRAIN SHARD_WRITER"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    from PIL import Image
except ImportError:
    print("numpy or PIL not available: skipping")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mask_alpha import CASES, rgba_from_photo  # noqa: E402
from tiny_clip import make_encoder, make_tokenizer  # noqa: E402
from train_ckpt import ckpt_bytes  # noqa: E402

META = BUCKET = LATENTS = VERIFY = PACK = TRAIN = WRITER = None
VAE = os.path.join(HERE, "golden", "vae", "sd")
UNET = os.path.join(HERE, "golden", "unet", "sd1")


def sh(*args, ok=(0,), stdin=None):
    """Run a command; returns (code, stdout, stderr); asserts the code."""
    p = subprocess.run([str(a) for a in args], capture_output=True, input=stdin)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def counted(err, reason):
    """The count sd-latents' final summary prints for a skip reason (0 when absent)."""
    for line in err.splitlines():
        m = re.match(r"^sd-latents[^:]*:\s+(\d+)\s+(.*)$", line)
        if m and m.group(2) == reason:
            return int(m.group(1))
    return 0


def losses(path):
    """The loss of every metrics line."""
    with open(path) as f:
        return [json.loads(l)["loss"] for l in f if l.strip()]


class Masks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sdmasks-")
        cls.model = os.path.join(cls.tmp, "model")  # a text encoder of the tiny UNet's cross-attention width
        make_tokenizer(os.path.join(cls.model, "tokenizer"), os.path.join(HERE, "golden", "tokenizer"))
        make_encoder(os.path.join(cls.model, "text_encoder"), np.random.default_rng(7), 8)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def p(self, *parts):
        return os.path.join(self.tmp, *parts)

    def test_previous_release_shard_trains_unchanged(self):
        s = self.p("v1.shard")
        shutil.copy(os.path.join(HERE, "fixtures", "v1.shard"), s)  # a reader writes FILE-lock beside it
        _, _, err = sh(VERIFY, s)
        self.assertIn("4 records, 3 text records", err)
        self.assertIn("0 problems", err)
        common = ["--unet", UNET, "--steps", "2", "-b", "2", "--seed", "3", "-q"]
        sh(TRAIN, *common, "-o", self.p("v1run"), s)
        self.assertEqual(len(ckpt_bytes(self.p("v1run"), 2, ema=False)), 2)
        # --masked-loss where no record has a mask would silently be the plain loss: a usage error
        # naming the shard, before anything is written
        _, _, err = sh(TRAIN, *common, "--masked-loss", "-o", self.p("v1masked"), s, ok=(2,))
        self.assertIn("--masked-loss: no record of %s has a loss mask" % s, err)
        self.assertFalse(os.path.exists(self.p("v1masked")))

    def test_alpha_masks_equal_sd_scripts_on_the_photos(self):
        root = os.environ.get("SDTK_PHOTOS")
        if not root:
            self.skipTest("SDTK_PHOTOS not set")
        photos = sorted(f for f in os.listdir(root) if f.lower().endswith((".jpg", ".png")))
        d = self.p("rgba")
        os.makedirs(d)
        lines = []
        for i, (pi, size, (rw, rh), box) in enumerate(CASES):
            path = os.path.join(d, "case%d.png" % i)
            rgba_from_photo(os.path.join(root, photos[pi]), size, i).save(path)
            lines.append(json.dumps({"v": 1, "key": "case%d" % i, "image": path, "caption": "c", "width": size[0],
                                     "height": size[1], "original_size": list(size),
                                     "bucket": [box[2] - box[0], box[3] - box[1]], "resize": [rw, rh],
                                     "crop": list(box)}))
        jl = self.p("rgba.jsonl")
        with open(jl, "w") as f:
            f.write("\n".join(lines) + "\n")
        s = self.p("rgba.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--masks", "alpha", "--sample", "--flip", "-o", s, jl)
        _, _, err = sh(VERIFY, s)
        self.assertIn("0 problems", err)
        sh(PACK, "export-kohya", s, "-o", self.p("rgba-out"), "--layout", "legacy", "-q")
        golden = np.load(os.path.join(HERE, "golden", "masks", "photos.npz"))
        worst = []
        for i, case in enumerate(CASES):
            with np.load(self.p("rgba-out", "case%d.npz" % i)) as z:
                got = z["alpha_mask"][::8, ::8]  # stored at the latent size, widened 8x8 on export
            want = golden["case%d" % i]
            self.assertEqual(got.shape, want.shape, i)
            diff = float(np.abs(got.astype(np.float64) - want).max())
            worst.append(diff)
            same_size = case[1] == case[2]
            # the reduction alone is exact; a resized alpha is within one 8-bit level of cv2's INTER_AREA /
            # PIL's LANCZOS per pixel, so within 1/255 after the 8x8 mean
            self.assertLessEqual(diff, 1e-6 if same_size else 1 / 255 + 1e-6, (i, diff))
        print("photos: mask vs sd-scripts, worst per case %s" % ", ".join("%.2e" % w for w in worst))

    def test_mask_files_and_bad_masks(self):
        d = self.p("files")
        os.makedirs(d)
        rng = np.random.default_rng(5)
        for name in ("good", "zero", "none", "wrongsize", "broken"):
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(os.path.join(d, name + ".png"))
            with open(os.path.join(d, name + ".txt"), "w") as f:
                f.write("a picture\n")
        good = rng.integers(0, 256, (64, 64), dtype=np.uint8)
        Image.fromarray(good, "L").save(os.path.join(d, "good_mask.png"))
        Image.fromarray(np.zeros((64, 64), np.uint8), "L").save(os.path.join(d, "zero_mask.png"))
        Image.fromarray(np.zeros((32, 64), np.uint8), "L").save(os.path.join(d, "wrongsize_mask.png"))
        with open(os.path.join(d, "broken_mask.png"), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\nnot really a png")
        Image.fromarray(good, "L").save(os.path.join(d, "orphan_mask.png"))
        _, meta, merr = sh(META, d)
        # sd-meta leaves out a NAME_mask.png beside its image; the orphan has no image, so it is a
        # picture without a caption
        self.assertRegex(merr, r"\b4\s+loss mask beside its image")
        self.assertNotIn("_mask", meta)
        _, jl, _ = sh(BUCKET, "-q", "--plan", "kohya", "-r", "64x64", "--min-bucket", "64", "--steps", "32", "-",
                      stdin=meta.encode())
        s = self.p("files.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.model, "--masks", "files", "-o", s, "-",
                       stdin=jl.encode())
        self.assertEqual(counted(err, "mask size differs from the image's"), 1, err)
        self.assertEqual(counted(err, "unreadable mask"), 1, err)
        self.assertEqual(counted(err, "mask without an image"), 1, err)
        self.assertIn("wrongsize_mask.png is 64x32, its image 64x64", err)
        self.assertIn("orphan_mask.png", err)
        self.assertIn("3 written", err)
        _, _, verr = sh(VERIFY, s)
        self.assertIn("0 problems", verr)
        # the stored mask is the mask file's 8x8 means (no resize: the reduction alone)
        sub = self.p("good-only.shard")
        good_line = [l for l in jl.splitlines() if json.loads(l)["key"] == "good"]
        sh(LATENTS, "-q", "--vae", VAE, "--masks", "files", "--sample", "-o", sub, "-",
           stdin=("\n".join(good_line) + "\n").encode())
        sh(PACK, "export-kohya", sub, "-o", self.p("good-out"), "--layout", "legacy", "-q")
        with np.load(self.p("good-out", "good.npz")) as z:
            got = z["alpha_mask"][::8, ::8]
        want = (good.astype(np.float32) / 255).reshape(8, 8, 8, 8).mean(axis=(1, 3))
        self.assertLessEqual(float(np.abs(got - want).max()), 1e-6)
        # all-zero masks: --masked-loss trains with loss 0, without it the loss is not 0
        zs = self.p("zero.shard")
        zero_line = [l for l in jl.splitlines() if json.loads(l)["key"] == "zero"]
        sh(LATENTS, "-q", "--vae", VAE, "--text", self.model, "--masks", "files", "-o", zs, "-",
           stdin=("\n".join(zero_line) + "\n").encode())
        common = ["--unet", UNET, "--steps", "2", "-q"]
        sh(TRAIN, *common, "--masked-loss", "--metrics", self.p("zm.jsonl"), "-o", self.p("zrun"), zs)
        _, _, err = sh(TRAIN, *common[:-1], "--metrics", self.p("zu.jsonl"), "-o", self.p("zrun-plain"), zs)
        # the start says what the shard holds (common[:-1]: without -q)
        self.assertIn("loss masks: 1 of 1 records have one; not used without --masked-loss", err)
        self.assertIn("caption variants: none (each record trains on its caption)", err)
        self.assertEqual(losses(self.p("zm.jsonl")), [0.0, 0.0])
        self.assertTrue(all(l > 0 for l in losses(self.p("zu.jsonl"))))
        # and the run over every record trains; the record without a mask gets the plain loss, said
        # at the start
        _, _, err = sh(TRAIN, *common[:-1], "--masked-loss", "-o", self.p("frun"), s)
        self.assertIn("loss masks: 2 of 3 records have one (--masked-loss)", err)
        self.assertIn("--masked-loss: 1 of 3 records have no loss mask (some in %s): they train on the plain, "
                      "unmasked loss" % s, err)
        # version 1 records of the previous release and version 2 ones in one shard: merged, verified,
        # trained on together
        v1 = self.p("v1-for-merge.shard")
        shutil.copy(os.path.join(HERE, "fixtures", "v1.shard"), v1)
        merged = self.p("merged.shard")
        sh(PACK, "merge", "-q", "-o", merged, v1, s)
        _, out, _ = sh(PACK, "info", "--json", merged)
        lat = json.loads(out)["latents"]
        self.assertEqual((lat["records"], lat["masks"]), (7, 2))
        _, _, verr = sh(VERIFY, merged)
        self.assertIn("0 problems", verr)
        _, _, err = sh(TRAIN, *common, "-b", "2", "--masked-loss", "-o", self.p("mrun"), merged)
        self.assertIn("--masked-loss: 5 of 7 records have no loss mask (some in %s)" % merged, err)  # -q: warnings
        # two shards, one without masks: named as such
        _, _, err = sh(TRAIN, *common, "--masked-loss", "-o", self.p("trun"), v1, s)
        self.assertIn("--masked-loss: 5 of 7 records have no loss mask (none in %s; some in %s)" % (v1, s), err)

    def test_verify_reports_a_mask_outside_0_1(self):
        s = self.p("w.shard")
        sh(WRITER, "write", s, "3", "3", "notext")
        sh(WRITER, "mask", s, "rec000001", "1.5")
        sh(WRITER, "mask", s, "rec000002", "0.25")
        code, _, err = sh(VERIFY, s, ok=(1,))
        self.assertIn("bad_mask", err)
        self.assertIn("128 of 128 values outside 0..1", err)
        self.assertIn(": 1 problems", err)
        sh(VERIFY, "--repair", s, ok=(0, 1))
        _, _, err = sh(VERIFY, s)
        self.assertIn("2 records", err)
        self.assertIn("0 problems", err)


if __name__ == "__main__":
    META, BUCKET, LATENTS, VERIFY, PACK, TRAIN, WRITER = sys.argv[1:8]
    del sys.argv[1:8]
    unittest.main(verbosity=2)
