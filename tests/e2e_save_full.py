#!/usr/bin/env python3
"""End-to-end tests of sd-train --save-full: tiny model folders (the golden
UNets and VAE, numpy-made CLIP encoders, as tests/e2e_sample.py makes them);
sd-train writes full.safetensors and full_ema.safetensors (SD 1.x), which
sdtk's single-file loaders read back equal to their sources, tensor for
tensor (full_ckpt_tool compare), also in fp16; sd-sample from the file
gives the pixels of the folder; SD 2.x and SDXL files from the same writer
(full_ckpt_tool write) read back equal too, and written again from such a
file as the base they are the same bytes; the names and shapes of every
file match diffusers' own conversion (golden/full_ckpt/*.txt, made by
tests/golden/make_full_ckpt_golden.py); bad base models and options are
refused naming the file.
Usage: e2e_save_full.py SD_TRAIN TEST_TRAIN FULL_CKPT_TOOL SD_SAMPLE GOLDEN_DIR"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np  # noqa: F401 (e2e_sample's helpers need it)
    from PIL import Image
    import e2e_sample
except ImportError as e:  # pragma: no cover
    print("skipped: %s" % e)
    sys.exit(77)

TRAIN = MAKE = TOOL = SAMPLE = GOLDEN = None
FAMILIES = {"sd1": ("sd1", [(8, "quick_gelu", 0, "<|endoftext|>")]),
            "sd2": ("sd2", [(12, "gelu", 0, "!")]),
            "sdxl": ("sdxl", [(4, "quick_gelu", 0, "<|endoftext|>"), (12, "gelu", 8, "!")])}
# (SDXL's encoders of two widths, 4 + 12 = the golden UNet's 16, as CLIP-L and
# bigG differ: diffusers tells embedders.0 from .1 by the width when loading)
# what diffusers' conversion does not write and sdtk's does, as the original
# SD 1.5 / SDXL releases hold it (A1111 and ComfyUI take it, diffusers skips it)
EXTRA = {"sd1": {"cond_stage_model.transformer.text_model.embeddings.position_ids I64 1,77"},
         "sd2": set(),
         "sdxl": {"conditioner.embedders.0.transformer.text_model.embeddings.position_ids I64 1,77"}}


def sh(*args, ok=(0,)):
    """Run a command; returns (code, stdout + stderr); asserts the code."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s%s" % (" ".join(map(str, args)), p.returncode, p.stdout, p.stderr))
    return p.returncode, p.stdout + p.stderr


def names(path):
    """The file's tensors as 'name DTYPE shape' lines, dtype left out
    except for the integer position ids."""
    _, out = sh(TOOL, "names", path)
    got = set()
    for line in out.splitlines():
        name, dt, shape = (line.split(" ") + [""])[:3]
        got.add("%s I64 %s" % (name, shape) if dt == "I64" else "%s %s" % (name, shape))
    return got


class SaveFull(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sdfull-")
        e2e_sample.GOLDEN = GOLDEN
        cls.models = {}
        for fam, (unet, enc) in FAMILIES.items():
            d = os.path.join(cls.tmp, fam)
            e2e_sample.make_model(d, unet, "sd", enc)
            cls.models[fam] = d
        cls.shard = os.path.join(cls.tmp, "cache.shard")
        subprocess.run([MAKE, "--make-shard", cls.shard], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, name):
        return os.path.join(self.tmp, name)

    def train(self, out, *extra, ok=(0,)):
        return sh(TRAIN, "--unet", self.models["sd1"], "-o", out, "--steps", "2", "--batch", "2", "--lr", "1e-3",
                  "-j", "1", "-q", *extra, self.shard, ok=ok)

    def test_sd1_from_sd_train(self):
        """full.safetensors and full_ema.safetensors read back equal to the
        checkpoint's unet/ and unet_ema/ and the base's VAE and encoder, in
        fp32 and fp16; the names are diffusers'; sd-sample gives the folder's pixels."""
        base = self.models["sd1"]
        for dt in ("fp32", "fp16"):
            with self.subTest(dtype=dt):
                out = self.out("run-" + dt)
                self.train(out, "--save-full", "--save-dtype", dt, "--ema-decay", "0.9")
                ck = os.path.join(out, "checkpoint-2")
                for f, u in (("full.safetensors", "unet"), ("full_ema.safetensors", "unet_ema")):
                    _, log = sh(TOOL, "compare", os.path.join(ck, f), os.path.join(ck, u), base)
                    for part in ("unet", "vae encoder", "vae decoder", "text encoder"):
                        self.assertIn(part + ": ", log)
                    self.assertIn("read as transformers prefix cond_stage_model.transformer.text_model.", log)
                self.check_names("sd1", os.path.join(ck, "full.safetensors"))
        # sd-sample: the file against a folder of the same trained UNet and the base's other parts
        ck = os.path.join(self.out("run-fp32"), "checkpoint-2")
        folder = self.out("trained-sd1")
        os.makedirs(folder)
        for sub in ("vae", "text_encoder", "tokenizer", "scheduler"):
            os.symlink(os.path.join(base, sub), os.path.join(folder, sub))
        os.symlink(os.path.join(ck, "unet"), os.path.join(folder, "unet"))
        args = ["--prompt", "a cat", "--negative", "dog", "--steps", "3", "--width", "64", "--height", "64",
                "--sampler", "euler_a", "-q"]
        sh(SAMPLE, "--model", folder, "-o", self.out("px-folder"), *args)
        sh(SAMPLE, "--model", os.path.join(ck, "full.safetensors"), "--tokenizer", base,
           "--vae-config", os.path.join(base, "vae", "config.json"),
           "--text-config", os.path.join(base, "text_encoder", "config.json"), "-o", self.out("px-file"), *args)
        a, b = (Image.open(os.path.join(self.out(d), "00000.png")) for d in ("px-folder", "px-file"))
        self.assertEqual(a.size, (64, 64))
        self.assertEqual(a.tobytes(), b.tobytes(), "the full file renders the folder's pixels")

    def check_names(self, fam, path):
        """Every name and shape of diffusers' conversion, and nothing else
        but EXTRA."""
        gold = os.path.join(GOLDEN, "full_ckpt", fam + ".txt")
        with open(gold) as f:
            want = {line.strip() for line in f if line.strip()}
        got = names(path)
        self.assertEqual(sorted(want - got), [], "names diffusers writes that the file lacks")
        self.assertEqual(sorted(got - want - EXTRA[fam]), [], "names the file has that diffusers does not write")

    def test_sd2_and_sdxl(self):
        """The writer on SD 2.x (OpenCLIP names, fused in_proj) and SDXL
        (sgm embedders, text_projection transposed): read back equal, names
        as diffusers', bf16 too."""
        for fam, layout in (("sd2", "OpenCLIP prefix cond_stage_model.model."),
                            ("sdxl", "OpenCLIP prefix conditioner.embedders.1.model.")):
            for dt in ("fp32", "bf16"):
                with self.subTest(family=fam, dtype=dt):
                    m = self.models[fam]
                    f = self.out("%s-%s.safetensors" % (fam, dt))
                    sh(TOOL, "write", f, m, m, dt)
                    _, log = sh(TOOL, "compare", f, m, m)
                    self.assertIn(layout, log)
                    if fam == "sdxl":
                        self.assertIn("text encoder 2: ", log)
                    self.check_names(fam, f)

    def test_single_file_base(self):
        """A single file as the base (the VAE and encoders under their
        original names): the file written from it is the same bytes as the
        one written from the folder, for each family."""
        for fam in FAMILIES:
            with self.subTest(family=fam):
                m = self.models[fam]
                f, g = self.out("%s-base.safetensors" % fam), self.out("%s-again.safetensors" % fam)
                sh(TOOL, "write", f, m, m, "fp16")
                sh(TOOL, "write", g, m, f, "fp16", m)
                sh(TOOL, "compare", g, m, f, m)
                with open(f, "rb") as a, open(g, "rb") as b:
                    self.assertEqual(a.read(), b.read())

    def test_bad_base_models(self):
        """A base without its VAE or text encoder, or of another family, is
        refused before training, naming the file; the options are checked."""
        base = self.models["sd1"]
        novae = self.out("novae")
        shutil.copytree(base, novae)
        shutil.rmtree(os.path.join(novae, "vae"))
        code, err = self.train(self.out("bad-novae"), "--save-full", "--base-model", novae, ok=(3,))
        self.assertIn("base model %s: no usable VAE" % novae, err)
        self.assertFalse(os.path.exists(os.path.join(self.out("bad-novae"), "checkpoint-2")))
        notext = self.out("notext")
        shutil.copytree(base, notext)
        shutil.rmtree(os.path.join(notext, "text_encoder"))
        code, err = self.train(self.out("bad-notext"), "--save-full", "--base-model", notext, ok=(3,))
        self.assertIn("base model %s: no usable text encoder" % notext, err)
        code, err = self.train(self.out("bad-family"), "--save-full", "--base-model", self.models["sd2"], ok=(3,))
        self.assertIn("%s: its text encoder gives 12-wide embeddings, the UNet takes 8" % self.models["sd2"], err)
        lone = os.path.join(base, "unet")  # a unet/ folder alone (a checkpoint's): say how to name the model
        code, err = sh(TRAIN, "--unet", lone, "-o", self.out("bad-lone"), "--steps", "1", "--save-full", "-q",
                       self.shard, ok=(3,))
        self.assertIn("base model %s: no usable VAE" % lone, err)
        self.assertIn("name the model the UNet came from with --base-model PATH", err)
        code, err = sh(TOOL, "write", self.out("x.safetensors"), self.models["sdxl"], base, "fp32", ok=(2,))
        self.assertIn("no usable second text encoder", err)
        code, err = sh(TRAIN, "--unet-config", os.path.join(base, "unet", "config.json"), "-o", self.out("bad-new"),
                       "--save-full", self.shard, ok=(2,))
        self.assertIn("--base-model", err)
        code, err = self.train(self.out("bad-opt"), "--base-model", base, ok=(2,))
        self.assertIn("--save-full", err)


if __name__ == "__main__":
    TRAIN, MAKE, TOOL, SAMPLE, GOLDEN = sys.argv[1:6]
    unittest.main(argv=sys.argv[:1], verbosity=2)
