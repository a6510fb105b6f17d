#!/usr/bin/env python3
"""End-to-end tests of sd-train's samples (--sample-prompts): a tiny SD 1.x
model folder (the golden UNet and VAE, a numpy-made text encoder: as
e2e_sample.py makes it) trained on test_train's generated shard. The
samples appear at the right steps (every --sample-every steps, at
checkpoints by default, at the end) in the right folders; a PNG rendered
by sd-train at a checkpoint's step equals, pixel for pixel, what sd-sample
renders from that checkpoint's unet/ (and unet_ema/) with the same prompt
line; the EMA samples differ from the others; the TensorBoard event file
holds them as image summaries (PNG bytes, size, colorspace); a run with
samples, stopped and resumed, ends with the same weights, EMA, state and
losses as one without; bad prompt lines, an image that cannot be made and
a model without a VAE are warnings and counts, and training goes on;
pruned checkpoints take their samples with them; a stop request during the
samples skips the rest of them; --save-full's --base-model conditions them
when --sample-model is not given; under mpirun (2 ranks, when
built with MPI) rank 0 alone renders them, equal to sd-sample's.
Usage: e2e_train_samples.py SD_TRAIN SD_SAMPLE TEST_TRAIN GOLDEN_DIR HAVE_MPI"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    from PIL import Image
    import e2e_sample
except ImportError as e:  # pragma: no cover
    print("skipped: %s" % e)
    sys.exit(77)
from e2e_train import crc32c, masked, pb_fields
from train_ckpt import ckpt_bytes, latest

TRAIN = SAMPLE = MAKE = GOLDEN = HAVE_MPI = None
BASE = ["--batch", "2", "--save-every", "2", "--keep", "0", "--seed", "5", "--lr", "5e-3", "--ema-decay", "0.9",
        "-j", "2", "-q"]
PROMPTS = [{"prompt": "a red bicycle", "negative": "blurry", "seed": 1, "steps": 3, "cfg": 7, "sampler": "euler_a",
            "width": 64, "height": 64},
           {"prompt": "a cat", "seed": 2, "steps": 3, "cfg": 1, "sampler": "ddim", "width": 32, "height": 64}]


def run(*args, ok=(0,), exe=None):
    """Run sd-train (or exe); returns (code, stderr); asserts the code."""
    p = subprocess.run([exe or TRAIN] + [str(a) for a in args], capture_output=True)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stderr.decode()


def pixels(path):
    with Image.open(path) as im:
        im.load()
        return np.asarray(im), im.text.get("parameters", "")


def tb_images(path):
    """{tag: [(step, height, width, colorspace, png bytes)]} of an event file, CRCs checked."""
    with open(path, "rb") as f:
        data = f.read()
    out, i = {}, 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked(crc32c(data[i:i + 8])), "length CRC"
        rec = data[i + 12:i + 12 + n]
        assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked(crc32c(rec)), "data CRC"
        i += 16 + n
        step = 0
        for f, _, v in pb_fields(rec):
            if f == 2:
                step = v
            elif f == 5:
                for _, _, value in pb_fields(v):
                    fields = {ff: vv for ff, _, vv in pb_fields(value)}
                    if 4 in fields:  # Value.image
                        img = {ff: vv for ff, _, vv in pb_fields(fields[4])}
                        out.setdefault(fields[1].decode(), []).append((step, img[1], img[2], img[3], img[4]))
    return out


class TrainSamples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        t = cls.tmp.name
        e2e_sample.GOLDEN = GOLDEN
        cls.model = os.path.join(t, "model")
        e2e_sample.make_model(cls.model, "sd1", "sd", [(8, "quick_gelu", 0, "<|endoftext|>")])
        cls.shard = os.path.join(t, "cache.shard")
        subprocess.run([MAKE, "--make-shard", cls.shard], check=True)
        cls.prompts = e2e_sample.jsonl(os.path.join(t, "prompts.jsonl"), PROMPTS)
        # the reference: 4 steps without samples
        cls.ref = os.path.join(t, "ref")
        run("--unet", cls.model, "-o", cls.ref, "--steps", "4", "--metrics", cls.ref + ".jsonl", *BASE, cls.shard)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, *names):
        return os.path.join(self.tmp.name, *names)

    def losses(self, metrics):
        with open(metrics) as f:
            return [(l["step"], l["loss"]) for l in map(json.loads, f) if "loss" in l]

    def folder(self, name, unet):
        """A model folder of the tiny model's parts with unet/ from a checkpoint, for sd-sample."""
        d = self.path(name)
        os.makedirs(d)
        for part in ("text_encoder", "tokenizer", "vae", "scheduler"):
            os.symlink(os.path.join(self.model, part), os.path.join(d, part))
        os.symlink(os.path.abspath(unet), os.path.join(d, "unet"))
        return d

    def test_samples_resume_and_match_sd_sample(self):
        """Samples at steps 2 (the first run's end), 3 (--sample-every 3) and 4 (a checkpoint and the end);
        the run, stopped at 2 and resumed, ends as the reference without samples; sd-sample from
        checkpoint-4 gives the same pixels; EMA samples differ; TensorBoard holds the images."""
        out, tb, m = self.path("s"), self.path("s.tb"), self.path("s.jsonl")
        args = ["--unet", self.model, "-o", out, "--metrics", m, "--tensorboard", tb, "--sample-prompts",
                self.prompts, "--sample-every", "3"] + BASE
        _, err = run(*args, "--steps", "2", self.shard)
        _, err = run(*args, "--steps", "4", self.shard)
        # the training is the reference's, byte for byte, and so are its losses
        self.assertTrue(ckpt_bytes(out, 4) == ckpt_bytes(self.ref, 4), "samples changed the training")
        self.assertEqual(self.losses(m), self.losses(self.ref + ".jsonl"))
        # where the images are
        for sub in ("samples", "samples-ema"):
            self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoint-2", sub))), ["00000.png", "00001.png"])
            self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoint-4", sub))), ["00000.png", "00001.png"])
            self.assertEqual(sorted(os.listdir(os.path.join(out, sub))), ["step-3"])
            self.assertEqual(sorted(os.listdir(os.path.join(out, sub, "step-3"))), ["00000.png", "00001.png"])
        a, info = pixels(os.path.join(out, "checkpoint-4", "samples", "00000.png"))
        b, _ = pixels(os.path.join(out, "checkpoint-4", "samples", "00001.png"))
        self.assertEqual((a.shape, b.shape), ((64, 64, 3), (64, 32, 3)))
        self.assertEqual(info.split(", Version:")[0], "a red bicycle\nNegative prompt: blurry\nSteps: 3, Sampler: "
                         "Euler a, CFG scale: 7, Seed: 1, Size: 64x64, Model: checkpoint-4")
        self.assertIn("Model: step-3-ema", pixels(os.path.join(out, "samples-ema", "step-3", "00000.png"))[1])
        # the strong check: sd-sample from checkpoint-4's unet/ and unet_ema/ renders the same pixels
        for unet, sub in (("unet", "samples"), ("unet_ema", "samples-ema")):
            d = self.folder("f-" + unet, os.path.join(out, "checkpoint-4", unet))
            o = self.path("o-" + unet)
            run("--model", d, "--prompts", self.prompts, "-o", o, "-q", exe=SAMPLE)
            for i in range(2):
                want, _ = pixels(os.path.join(o, "%05d.png" % i))
                got, _ = pixels(os.path.join(out, "checkpoint-4", sub, "%05d.png" % i))
                self.assertTrue(np.array_equal(got, want), "%s/%05d.png differs from sd-sample's" % (sub, i))
        ema, _ = pixels(os.path.join(out, "checkpoint-4", "samples-ema", "00000.png"))
        self.assertFalse(np.array_equal(a, ema), "the EMA samples are the training weights'")
        step3, _ = pixels(os.path.join(out, "samples", "step-3", "00000.png"))
        self.assertFalse(np.array_equal(a, step3), "step 3 and step 4 render the same picture")
        # TensorBoard: each image at its steps, its PNG the file's bytes
        files = sorted(os.listdir(tb))
        imgs = {}
        for f in files:
            for tag, rows in tb_images(os.path.join(tb, f)).items():
                imgs.setdefault(tag, []).extend(rows)
        self.assertEqual(sorted(imgs), ["samples/00000", "samples/00001", "samples_ema/00000", "samples_ema/00001"])
        for tag, rows in imgs.items():
            self.assertEqual([r[0] for r in rows], [2, 3, 4], tag)
        step, h, w, cs, png = imgs["samples/00001"][1]
        self.assertEqual((h, w, cs), (64, 32, 3))
        with open(os.path.join(out, "samples", "step-3", "00001.png"), "rb") as f:
            self.assertEqual(png, f.read())

    def test_long_prompt_shards(self):
        """Shards of sd-latents --max-tokens 150 (their text_encoder identity ends in |tok150): the samples
        are conditioned at 150 tokens, the sequence length the UNet trains on, and equal sd-sample
        --max-tokens 150 from the checkpoint pixel for pixel (not the 75-token rendering)."""
        shard = self.path("tok150.shard")
        subprocess.run([MAKE, "--make-shard-tok150", shard], check=True)
        p = e2e_sample.jsonl(self.path("long.jsonl"), [dict(PROMPTS[0], prompt=e2e_sample.LONG_PROMPT)])
        out = self.path("l")
        _, err = run("--unet", self.model, "-o", out, "--sample-prompts", p, "--steps", "2",
                     *[a for a in BASE if a != "-q"], shard)
        self.assertIn("at 150 tokens, as the shards", err)
        got, _ = pixels(os.path.join(out, "checkpoint-2", "samples", "00000.png"))
        d = self.folder("l-folder", os.path.join(out, "checkpoint-2", "unet"))
        for n, same in ((150, True), (75, False)):
            o = self.path("l-sd-sample-%d" % n)
            run("--model", d, "--prompts", p, "-o", o, "-q", "--max-tokens", str(n), exe=SAMPLE)
            want, _ = pixels(os.path.join(o, "00000.png"))
            self.assertEqual(np.array_equal(got, want), same, "sd-sample --max-tokens %d" % n)

    def test_bf16_weights(self):
        """--weight-dtype bf16 (issue 28): the samples read the bf16 weights (widened into the
        gradient buffer while they render), so sd-sample from the checkpoint's unet/ gives the same
        pixels, and the training is the bf16 run's without samples, byte for byte."""
        bf = ["--unet", self.model, "--weight-dtype", "bf16", "--steps", "2"] + BASE
        ref, out = self.path("bf16-ref"), self.path("bf16-s")
        run(*bf, "-o", ref, self.shard)
        run(*bf, "-o", out, "--sample-prompts", self.prompts, self.shard)
        self.assertTrue(ckpt_bytes(out, 2) == ckpt_bytes(ref, 2), "samples changed the bf16 training")
        d = self.folder("f-bf16", os.path.join(out, "checkpoint-2", "unet"))
        o = self.path("o-bf16")
        run("--model", d, "--prompts", self.prompts, "-o", o, "-q", exe=SAMPLE)
        for i in range(2):
            want, _ = pixels(os.path.join(o, "%05d.png" % i))
            got, _ = pixels(os.path.join(out, "checkpoint-2", "samples", "%05d.png" % i))
            self.assertTrue(np.array_equal(got, want), "samples/%05d.png differs from sd-sample's" % i)

    def test_bad_lines_failures_and_pruning(self):
        """Bad lines are named and skipped, an image of a size the UNet cannot take fails alone, the others
        are written at every step (into the checkpoint at 2 and 4, into samples/step-N at 1 and 3), pruned
        checkpoints take their samples along and so does --keep for the step folders before the oldest
        checkpoint kept, and the losses are the reference's."""
        p = e2e_sample.jsonl(self.path("bad.jsonl"), [PROMPTS[1], "{not json", dict(PROMPTS[1], sampler="plms"),
                                                      dict(PROMPTS[1], width=72)])
        out, m = self.path("b"), self.path("b.jsonl")
        _, err = run("--unet", self.model, "-o", out, "--metrics", m, "--sample-prompts", p, "--steps", "4",
                     "--sample-every", "1", *BASE, "--keep", "1", self.shard)
        self.assertIn("%s:2: bad JSON" % p, err)
        self.assertIn("%s:3: unknown sampler" % p, err)
        self.assertIn("00003.png (%s line 4)" % p, err)
        self.assertIn("multiples of 32", err)
        self.assertIn("samples: 8 written, 8 failed", err)
        self.assertIn("2 prompt line(s) skipped (bad JSON 1, unknown sampler 1", err)
        self.assertNotIn("not removed", err)
        # checkpoint-2 pruned with its samples, and samples/step-1, step-3 (before checkpoint-4) with it
        self.assertEqual(sorted(os.listdir(out)), ["checkpoint-4", "latest"])
        for sub in ("samples", "samples-ema"):
            self.assertEqual(os.listdir(os.path.join(out, "checkpoint-4", sub)), ["00000.png"])
        self.assertEqual(self.losses(m), self.losses(self.ref + ".jsonl"))

    def test_model_without_vae(self):
        """A sample model without a VAE: a warning at the start, no samples, training as without."""
        d = self.path("novae")
        os.makedirs(d)
        for part in ("text_encoder", "tokenizer", "scheduler", "unet"):
            os.symlink(os.path.join(self.model, part), os.path.join(d, part))
        out, m = self.path("n"), self.path("n.jsonl")
        _, err = run("--unet", self.model, "-o", out, "--metrics", m, "--sample-prompts", self.prompts,
                     "--sample-model", d, "--steps", "2", *BASE[:-1], self.shard)
        self.assertIn("no samples in this run; training goes on", err)
        self.assertIn("samples: 0 written, 4 failed (model unusable 4", err)
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-2", "samples")))
        self.assertEqual(self.losses(m), self.losses(self.ref + ".jsonl")[:2])

    def test_stop_during_samples(self):
        """SIGTERM while a checkpoint's samples render: the remaining images are skipped, the run ends with
        exit 0 at that checkpoint, without the end's samples."""
        slow = e2e_sample.jsonl(self.path("slow.jsonl"), [dict(PROMPTS[0], steps=40, sampler="euler")] * 3)
        out = self.path("stop")
        p = subprocess.Popen([TRAIN, "--unet", self.model, "-o", out, "--sample-prompts", slow, "--steps", "6"] + BASE +
                             [self.shard], stderr=subprocess.PIPE)
        t0 = time.time()
        first = os.path.join(out, "checkpoint-2", "samples", "00000.png")
        while not os.path.exists(first) and p.poll() is None and time.time() - t0 < 120:
            time.sleep(0.005)
        p.send_signal(signal.SIGTERM)  # the second image is being rendered
        _, err = p.communicate()
        err = err.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(latest(out), 2, err)
        self.assertIn("step 2: stop requested: the step's remaining samples are skipped", err)
        self.assertLess(len(os.listdir(os.path.join(out, "checkpoint-2", "samples"))), 3)
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-2", "samples-ema")))

    @unittest.skipUnless(shutil.which("mpirun"), "no mpirun")
    def test_two_ranks(self):
        """2 MPI ranks: rank 0 renders each image once, the same pixels as sd-sample from the checkpoint."""
        if HAVE_MPI not in ("ON", "1", "TRUE"):
            self.skipTest("sd-train built without MPI")
        out = self.path("mpi")
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", TRAIN, "--unet", self.model, "-o", out,
               "--sample-prompts", self.prompts, "--steps", "2", "--batch", "1", "--save-every", "2", "--seed", "5",
               "--lr", "5e-3", "-j", "1", "-q", self.shard]
        # Open MPI's dlopen'ed components leave allocations LeakSanitizer cannot attribute (as e2e_train_mpi)
        env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
                   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
        p = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoint-2", "samples"))), ["00000.png", "00001.png"])
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-2", "samples-ema")))
        d = self.folder("f-mpi", os.path.join(out, "checkpoint-2", "unet"))
        o = self.path("o-mpi")
        run("--model", d, "--prompts", self.prompts, "-o", o, "-q", exe=SAMPLE)
        for i in range(2):
            want, _ = pixels(os.path.join(o, "%05d.png" % i))
            got, _ = pixels(os.path.join(out, "checkpoint-2", "samples", "%05d.png" % i))
            self.assertTrue(np.array_equal(got, want), "samples/%05d.png differs from sd-sample's" % i)

    def test_base_model_conditions(self):
        """--save-full's --base-model is the samples' model when --sample-model is not given."""
        out = self.path("base")
        _, err = run("--unet", os.path.join(self.model, "unet"), "--save-full", "--base-model", self.model, "-o", out,
                     "--sample-prompts", self.prompts, "--steps", "1", *BASE, self.shard)
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoint-1", "samples"))), ["00000.png", "00001.png"])

    def test_usage(self):
        """A missing prompts file, or no model to condition the prompts: usage errors before any work."""
        out = self.path("u")
        _, err = run("--unet", self.model, "-o", out, "--sample-prompts", self.path("none.jsonl"), self.shard, ok=(2,))
        self.assertIn("none.jsonl: No such file", err)
        _, err = run("--unet", os.path.join(self.model, "unet"), "-o", out, "--sample-prompts", self.prompts,
                     self.shard, ok=(2,))
        self.assertIn("--sample-model PATH", err)
        _, err = run("--unet", self.model, "-o", out, "--sample-every", "-1", "--sample-prompts", self.prompts,
                     self.shard, ok=(2,))
        self.assertIn("--sample-every", err)
        # a --sample-model that does not exist is named as such (it was taken for a single file)
        _, err = run("--unet", self.model, "-o", out, "--sample-prompts", self.prompts, "--sample-model",
                     self.path("nonexistent"), self.shard, ok=(2,))
        self.assertIn("nonexistent: No such file or directory", err)
        self.assertNotIn("--sample-tokenizer", err)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    TRAIN, SAMPLE, MAKE, GOLDEN, HAVE_MPI = sys.argv[1:6]
    unittest.main(argv=sys.argv[:1] + sys.argv[6:], verbosity=2)
