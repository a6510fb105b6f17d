#!/usr/bin/env python3
"""End-to-end tests of sd-sample: tiny model folders made of the golden
UNets and VAEs (tests/golden/unet, tests/golden/vae) and tiny numpy-made
CLIP text encoders with the real tokenizer; two prompts at 64x64 with 4
steps for every sampler: the PNGs exist at the right size, their
`parameters` chunk reads back (PIL) as A1111's infotext, the same seed
gives the same bytes (also with another thread count), another seed other
pixels; SDXL (two encoders, pooled, size conditioning) and SD 2.x
v-prediction folders run; bad input: a missing prompts file, bad JSON
lines (named by line number, skipped, counted), an unknown sampler, sizes
not multiples of 8, components of different families, a UNet whose
latents turn non-finite (each image fails alone, the run goes on).
Usage: e2e_sample.py SD_SAMPLE GOLDEN_DIR"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    from PIL import Image
    from tiny_clip import make_encoder, make_tokenizer, save_safetensors
except ImportError as e:  # pragma: no cover
    print("skipped: %s" % e)
    sys.exit(77)

SAMPLE = GOLDEN = None
# tests/golden/make_sample_golden.py renders these with diffusers
GOLDEN_FAMILIES = {"sd15": ("sd1", "sd", [(8, "quick_gelu", 0, "<|endoftext|>")], "epsilon"),
                   "sd21v": ("sd2", "sd", [(12, "gelu", 0, "!")], "v_prediction"),
                   "sdxl": ("sdxl", "sd", [(8, "quick_gelu", 0, "<|endoftext|>"), (8, "gelu", 8, "!")], "epsilon")}
GOLDEN_CASE = {"prompt": "a red bicycle", "negative": "blurry, low quality", "seed": 1, "steps": 10, "cfg": 7,
               "width": 64, "height": 64}
SAMPLERS = ["ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras"]
# prompts over 75 tokens (--max-tokens 150 / 225): a booru tag list of about 120 CLIP tokens
LONG_PROMPT = ", ".join(["1girl", "solo", "long hair", "looking at viewer", "smile", "open mouth", "blue eyes",
                         "brown hair", "shirt", "long sleeves", "hat", "holding", "jewelry", "standing", "white shirt",
                         "outdoors", "sky", "day", "cloud", "water", "tree", "blue sky", "ocean", "beach", "sunlight",
                         "grass", "flower", "wind", "scenery", "horizon", "sand", "palm tree", "straw hat",
                         "sundress", "bracelet", "necklace", "earrings", "waves", "footprints", "seashell",
                         "sun hat", "hand on headwear", "from side", "full body", "barefoot", "wading",
                         "lens flare", "depth of field", "masterpiece", "best quality"])
# (family, sampler, max tokens): the golden images tests/golden/make_sample_golden.py renders from
# sd-scripts' chunked embeddings (prompt_embeds), one per family
LONG_CASES = [("sd15", "dpmpp_2m", 150), ("sd21v", "euler", 225), ("sdxl", "euler_a", 150)]
A1111 = {"ddim": "DDIM", "euler": "Euler", "euler_a": "Euler a", "dpmpp_2m": "DPM++ 2M",
         "dpmpp_2m_karras": "DPM++ 2M"}


# SD 1.5's and 2.1's scheduler_config.json (what diffusers reads when a
# pipeline swaps samplers in with from_config; sd-sample reads prediction_type)
SCHEDULER = {"_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012,
             "beta_schedule": "scaled_linear", "num_train_timesteps": 1000, "set_alpha_to_one": False,
             "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None, "clip_sample": False}

# and what SDXL's adds (its file says "leading" spacing for every sampler)
SDXL_SCHEDULER = {"_class_name": "EulerDiscreteScheduler", "interpolation_type": "linear", "sample_max_value": 1.0,
                  "timestep_spacing": "leading", "use_karras_sigmas": False}


def sh(*args, ok=(0,)):
    """Run a command; returns (code, stderr); asserts the code."""
    p = subprocess.run([str(a) for a in args], capture_output=True)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stderr.decode()


def read_st(path):
    """A safetensors file of fp32/fp16 tensors as a dict of fp32 arrays."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        dt = {"F32": "<f4", "F16": "<f2"}[v["dtype"]]
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype=dt).reshape(v["shape"]).astype(np.float32)
    return out


def raw_st(path):
    """A safetensors file as {name: (dtype, shape, bytes)}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}


def write_raw_st(path, tensors):
    """{name: (dtype, shape, bytes)} as a safetensors file."""
    header, blobs, off = {}, [], 0
    for k, (dt, shape, b) in tensors.items():
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_model(d, unet, vae, encoders, pred="epsilon"):
    """A diffusers folder: golden unet/ and vae/ (only the SD-shaped golden
    VAE holds a decoder; SDXL's VAE differs in weights, not shapes), tiny encoders
    [(width, act, proj, pad)], scheduler/scheduler_config.json."""
    rng = np.random.default_rng(7)
    shutil.copytree(os.path.join(GOLDEN, "unet", unet, "unet"), os.path.join(d, "unet"))
    shutil.copytree(os.path.join(GOLDEN, "vae", vae, "vae"), os.path.join(d, "vae"))
    for i, (width, act, proj, pad) in enumerate(encoders):
        sfx = "_2" if i else ""
        make_tokenizer(os.path.join(d, "tokenizer" + sfx), os.path.join(GOLDEN, "tokenizer"), pad)
        make_encoder(os.path.join(d, "text_encoder" + sfx), rng, width, act, proj)
    os.makedirs(os.path.join(d, "scheduler"))
    with open(os.path.join(d, "scheduler", "scheduler_config.json"), "w") as f:
        json.dump(dict(SCHEDULER, prediction_type=pred, **(SDXL_SCHEDULER if len(encoders) == 2 else {})), f)


def jsonl(path, rows):
    """Rows (dicts, or raw strings for bad lines) as a JSONL file."""
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def pixels(path):
    im = Image.open(path)
    im.load()
    return im


class Sample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sdsample-")
        cls.sd1 = os.path.join(cls.tmp, "sd1")
        make_model(cls.sd1, "sd1", "sd", [(8, "quick_gelu", 0, "<|endoftext|>")])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, name):
        return os.path.join(self.tmp, name)

    def test_every_sampler(self):
        """Two prompts per sampler: files, sizes, infotext, reproducibility."""
        for s in SAMPLERS:
            with self.subTest(sampler=s):
                rows = [{"prompt": "a red bicycle", "negative": "blurry, low quality", "seed": 1, "steps": 4,
                         "cfg": 7, "sampler": s, "width": 64, "height": 64},
                        {"prompt": "a cat: sitting", "seed": 2, "steps": 4, "cfg": 7.5, "sampler": s, "width": 64,
                         "height": 64},
                        {"prompt": "a red bicycle", "negative": "blurry, low quality", "seed": 1, "steps": 4,
                         "cfg": 7, "sampler": s, "width": 64, "height": 64}]
                p = jsonl(self.out("p-%s.jsonl" % s), rows)
                d = self.out("o-" + s)
                sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, "-j", "2", "-q")
                self.assertEqual(sorted(os.listdir(d)), ["00000.png", "00001.png", "00002.png", "contact.png"])
                a, b, c = (pixels(os.path.join(d, "%05d.png" % i)) for i in range(3))
                for im in (a, b, c):
                    self.assertEqual((im.size, im.mode), ((64, 64), "RGB"))
                sched = ", Schedule type: Karras" if s == "dpmpp_2m_karras" else ""
                self.assertEqual(a.text["parameters"].split(", Version:")[0],
                                 "a red bicycle\nNegative prompt: blurry, low quality\nSteps: 4, Sampler: %s%s, "
                                 "CFG scale: 7, Seed: 1, Size: 64x64, Model: sd1" % (A1111[s], sched))
                self.assertEqual(b.text["parameters"].split(", Version:")[0],
                                 "a cat: sitting\nSteps: 4, Sampler: %s%s, CFG scale: 7.5, Seed: 2, Size: 64x64, "
                                 "Model: sd1" % (A1111[s], sched))
                with open(os.path.join(d, "00000.png"), "rb") as f0, open(os.path.join(d, "00002.png"), "rb") as f2:
                    self.assertEqual(f0.read(), f2.read(), "same seed and settings, same bytes")
                self.assertFalse(np.array_equal(np.asarray(a), np.asarray(b)), "another seed, other pixels")
                self.assertGreater(np.asarray(a).std(), 1.0, "not a flat image")
                self.assertEqual(pixels(os.path.join(d, "contact.png")).size, (128, 128))
        # the thread count changes nothing
        d1 = self.out("o-j1")
        sh(SAMPLE, "--model", self.sd1, "--prompts", self.out("p-euler_a.jsonl"), "-o", d1, "-j", "1", "-q")
        for i in range(3):
            with open(os.path.join(d1, "%05d.png" % i), "rb") as f, \
                    open(os.path.join(self.out("o-euler_a"), "%05d.png" % i), "rb") as g:
                self.assertEqual(f.read(), g.read())

    def test_matches_diffusers(self):
        """10 steps, CFG 7, a negative prompt, every sampler, SD 1.x epsilon,
        SD 2.x v and SDXL (and SDXL without a negative prompt): within 1
        level of diffusers' StableDiffusion(XL)Pipeline
        (tests/golden/make_sample_golden.py) on >= 99.9% of the pixels."""
        for fam, (unet, vae, enc, pred) in GOLDEN_FAMILIES.items():
            m = self.out("g-" + fam)
            make_model(m, unet, vae, enc, pred)
            rows = [dict(GOLDEN_CASE, sampler=s) for s in SAMPLERS]
            names = ["%s_%s" % (fam, s) for s in SAMPLERS]
            if len(enc) == 2:  # SDXL without a negative prompt: zeros, as diffusers
                rows.append({k: v for k, v in dict(GOLDEN_CASE, sampler="euler").items() if k != "negative"})
                names.append(fam + "_noneg_euler")
            p = jsonl(self.out("p-g-%s.jsonl" % fam), rows)
            d = self.out("o-g-" + fam)
            sh(SAMPLE, "--model", m, "--prompts", p, "-o", d, "-q")
            for i, name in enumerate(names):
                with self.subTest(case=name):
                    a = np.asarray(pixels(os.path.join(d, "%05d.png" % i)), dtype=np.int16)
                    b = np.asarray(pixels(os.path.join(GOLDEN, "sample", name + ".png")), dtype=np.int16)
                    diff = np.abs(a - b)
                    self.assertGreaterEqual((diff <= 1).mean(), 0.999, "max difference %d" % diff.max())

    def test_long_prompts_match_diffusers(self):
        """--max-tokens 150 / 225: a prompt of about 120 tokens chunked and joined as sd-latents caches
        captions (sd-scripts' scheme), within 1 level of diffusers fed sd-scripts' chunked embeddings
        (tests/golden/make_sample_golden.py) on >= 99.9% of pixels, for SD 1.x, SD 2.x-v (its "!"
        padding) and SDXL (the first chunk's pooled output); 75 tokens cuts the prompt (warned) and
        gives other pixels."""
        for fam, sampler, n in LONG_CASES:
            unet, vae, enc, pred = GOLDEN_FAMILIES[fam]
            m = self.out("gl-" + fam)
            make_model(m, unet, vae, enc, pred)
            p = jsonl(self.out("p-gl-%s.jsonl" % fam), [dict(GOLDEN_CASE, prompt=LONG_PROMPT, sampler=sampler)])
            d = self.out("o-gl-%s-%d" % (fam, n))
            code, err = sh(SAMPLE, "--model", m, "--prompts", p, "-o", d, "--max-tokens", str(n))
            self.assertNotIn("is cut", err)
            d75 = self.out("o-gl-%s-75" % fam)
            code, err = sh(SAMPLE, "--model", m, "--prompts", p, "-o", d75)
            self.assertIn("is cut to its first 75", err)
            with self.subTest(family=fam, max_tokens=n):
                a = np.asarray(pixels(os.path.join(d, "00000.png")), dtype=np.int16)
                b = np.asarray(pixels(os.path.join(GOLDEN, "sample", "%s_long%d_%s.png" % (fam, n, sampler))),
                               dtype=np.int16)
                diff = np.abs(a - b)
                self.assertGreaterEqual((diff <= 1).mean(), 0.999, "max difference %d" % diff.max())
                c = np.asarray(pixels(os.path.join(d75, "00000.png")), dtype=np.int16)
                self.assertGreater(np.abs(a - c).max(), 8, "--max-tokens changed nothing")
        sh(SAMPLE, "--model", m, "--prompt", "x", "--max-tokens", "100", "-o", self.out("o-gl-bad"), ok=(2,))

    def test_single_file_checkpoint(self):
        """One file with the UNet (model.diffusion_model.*), the VAE
        (first_stage_model.*) and the encoder (cond_stage_model.transformer.*)
        as A1111 loads them gives the pixels of a folder holding the same
        tensors; without --tokenizer it is a clear error."""
        folder = self.out("sf-folder")
        make_model(folder, "sd1", "sd", [(8, "quick_gelu", 0, "<|endoftext|>")])
        unet = os.path.join(GOLDEN, "unet", "sd1", "single.safetensors")
        vae = os.path.join(GOLDEN, "vae", "sd", "single.safetensors")
        shutil.copy(unet, os.path.join(folder, "unet", "diffusion_pytorch_model.safetensors"))
        shutil.copy(vae, os.path.join(folder, "vae", "diffusion_pytorch_model.safetensors"))
        t = {k: v for k, v in raw_st(unet).items() if k.startswith("model.diffusion_model.")}
        t.update({k: v for k, v in raw_st(vae).items() if k.startswith("first_stage_model.")})
        t.update({"cond_stage_model.transformer." + k: v
                  for k, v in raw_st(os.path.join(folder, "text_encoder", "model.safetensors")).items()})
        single = self.out("tiny-sd1.safetensors")
        write_raw_st(single, t)
        args = ["--prompt", "a cat", "--negative", "dog", "--steps", "3", "--width", "64", "--height", "64", "-q"]
        sh(SAMPLE, "--model", folder, "-o", self.out("sf-o1"), *args)
        sh(SAMPLE, "--model", single, "--tokenizer", folder, "--unet-config", os.path.join(folder, "unet", "config.json"),
           "--vae-config", os.path.join(folder, "vae", "config.json"),
           "--text-config", os.path.join(folder, "text_encoder", "config.json"), "-o", self.out("sf-o2"), *args)
        a, b = (pixels(os.path.join(self.out(d), "00000.png")) for d in ("sf-o1", "sf-o2"))
        self.assertEqual(a.tobytes(), b.tobytes())
        self.assertIn("Model: tiny-sd1,", b.text["parameters"])
        code, err = sh(SAMPLE, "--model", single, "--prompt", "x", "-o", self.out("sf-o3"), ok=(3,))
        self.assertIn("--tokenizer", err)

    def test_flags_and_defaults(self):
        """--prompt with flags; the default size is the UNet's sample_size x 8."""
        d = self.out("o-flags")
        sh(SAMPLE, "--model", self.sd1, "--prompt", "caf\u00e9 \u2615", "--seed", "5", "--steps", "2",
           "--sampler", "euler", "--cfg", "1", "-o", d, "-q")
        im = pixels(os.path.join(d, "00000.png"))
        self.assertEqual(im.size, (128, 128))
        self.assertTrue(im.text["parameters"].startswith("caf\u00e9 \u2615\nSteps: 2, Sampler: Euler, CFG scale: 1, "
                                                         "Seed: 5, Size: 128x128, Model: sd1"), im.text)
        code, err = sh(SAMPLE, "--help")
        for word in ("--prompts", "dpmpp_2m_karras", "default 20", "default 7", "Examples"):
            self.assertIn(word, err + subprocess.run([SAMPLE, "--help"], capture_output=True, text=True).stdout)

    def test_sdxl_and_sd2_v(self):
        """SDXL (two encoders, pooled, time ids) and SD 2.x v-prediction run."""
        sdxl = self.out("sdxl")
        make_model(sdxl, "sdxl", "sd", [(8, "quick_gelu", 0, "<|endoftext|>"), (8, "gelu", 8, "!")])
        sd2 = self.out("sd2")
        make_model(sd2, "sd2", "sd", [(12, "gelu", 0, "!")], pred="v_prediction")
        for m in (sdxl, sd2):
            d = self.out("o-" + os.path.basename(m))
            p = jsonl(self.out("p-" + os.path.basename(m)), [
                {"prompt": "a house", "seed": 3, "steps": 4, "width": 64, "height": 64},
                {"prompt": "a house", "negative": "fog", "seed": 3, "steps": 4, "width": 64, "height": 64}])
            code, err = sh(SAMPLE, "--model", m, "--prompts", p, "-o", d)
            self.assertIn("SDXL" if m == sdxl else "v prediction", err)
            a, b = (np.asarray(pixels(os.path.join(d, "%05d.png" % i))) for i in range(2))
            self.assertEqual(a.shape, (64, 64, 3))
            self.assertFalse(np.array_equal(a, b), "the negative prompt changes the image")

    def test_bad_lines_are_named_skipped_counted(self):
        d = self.out("o-bad")
        p = jsonl(self.out("p-bad.jsonl"), [
            {"prompt": "ok one", "steps": 2, "width": 64, "height": 64},
            "{not json",
            "",
            {"prompt": "x", "sampler": "plms"},
            {"prompt": "x", "width": 60},
            {"prompt": 3},
            "[1, 2]",
            {"prompt": "ok two", "steps": 2, "width": 64, "height": 64},
            {"promt": "a cat", "steps": 2, "width": 64, "height": 64},
            {"steps": 2, "width": 64, "height": 64}])
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d)
        self.assertEqual(code, 0)
        self.assertIn("p-bad.jsonl:2: bad JSON", err)
        self.assertIn("p-bad.jsonl:4: unknown sampler", err)
        self.assertIn("plms", err)
        self.assertIn("p-bad.jsonl:5: size not a multiple of 8", err)
        self.assertIn("p-bad.jsonl:6: field", err)
        self.assertIn("p-bad.jsonl:7: bad JSON", err)
        # a misspelt key is named with its line, not rendered unconditional in silence
        self.assertIn('p-bad.jsonl:9: unknown field ("promt" is not one of prompt', err)
        # no "prompt" at all: rendered unconditional, with a warning naming the line
        self.assertIn('p-bad.jsonl:10: no "prompt": rendered with the empty prompt', err)
        self.assertIn("3 image(s) written", err)
        self.assertIn("6 line(s) skipped (bad JSON 2, unknown sampler 1, size not a multiple of 8 1, other fields 2)",
                      err)
        # the file names follow the lines, so each image is found by its line
        self.assertEqual(sorted(os.listdir(d)), ["00000.png", "00007.png", "00009.png", "contact.png"])
        code, _ = sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, "--strict", "--overwrite", ok=(1,))

    def test_outputs_already_there(self):
        """An earlier run's images are never replaced silently: refused (exit 2) before the model is
        loaded; --overwrite renders them again, --skip-existing keeps them and renders the missing ones
        (a killed run goes on), the contact sheet showing all."""
        d = self.out("o-again")
        rows = [{"prompt": "a red bicycle", "seed": i, "steps": 2, "width": 64, "height": 64} for i in range(3)]
        p = jsonl(self.out("p-again.jsonl"), rows)
        sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, "-q")
        names = ["00000.png", "00001.png", "00002.png", "contact.png"]
        def files():
            out = {}
            for n in sorted(os.listdir(d)):
                with open(os.path.join(d, n), "rb") as f:
                    out[n] = f.read()
            return out
        first = files()
        self.assertEqual(sorted(first), names)
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, ok=(2,))
        self.assertIn("00000.png exists (3 of this run's 3 image(s) are there, and a contact sheet): not replaced",
                      err)
        self.assertNotIn("model ", err)  # refused before the model is loaded
        self.assertEqual(files(), first)
        # a contact sheet alone is an output too
        only = self.out("o-sheet")
        os.makedirs(only)
        shutil.copy(os.path.join(d, "contact.png"), only)
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", only, ok=(2,))
        self.assertIn("contact.png exists (an earlier run's contact sheet)", err)
        # what a run killed after its first image leaves: the missing ones rendered, the kept one not
        # touched, the sheet of all three as an uninterrupted run's
        for n in ("00001.png", "00002.png", "contact.png"):
            os.remove(os.path.join(d, n))
        with open(os.path.join(d, "00000.png"), "ab") as f:  # marks the kept file (after IEND: still a PNG)
            f.write(b"kept")
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, "--skip-existing")
        self.assertIn("2 image(s) written to %s, 1 kept from before, 0 failed" % d, err)
        got = files()
        self.assertEqual(got["00000.png"], first["00000.png"] + b"kept")
        for n in ("00001.png", "00002.png", "contact.png"):
            self.assertEqual(got[n], first[n], n)
        # all there: nothing to render, no model loaded (a missing one is not even looked for)
        code, err = sh(SAMPLE, "--model", self.out("no-such-model"), "--prompts", p, "-o", d, "--skip-existing")
        self.assertIn("0 image(s) written to %s, 3 kept from before" % d, err)
        self.assertEqual(files()["contact.png"], first["contact.png"])
        # --overwrite: every image rendered again, the same bytes as the first run's
        sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, "--overwrite", "-q")
        self.assertEqual(files(), first)
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompts", p, "-o", d, "--overwrite", "--skip-existing",
                       ok=(2,))
        self.assertIn("pick one", err)

    def test_usage_and_fatal_errors(self):
        d = self.out("o-err")
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompts", self.out("missing.jsonl"), "-o", d, ok=(3,))
        self.assertIn("missing.jsonl", err)
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompt", "x", "--sampler", "plms", "-o", d, ok=(2,))
        self.assertIn("plms", err)
        code, err = sh(SAMPLE, "--model", self.sd1, "--prompt", "x", "--width", "100", "-o", d, ok=(2,))
        self.assertIn("multiples of 8", err)
        sh(SAMPLE, "--model", self.sd1, "-o", d, ok=(2,))
        sh(SAMPLE, "--prompt", "x", "-o", d, ok=(2,))
        # an SD 2.x-width encoder with an SD 1.x UNet: named, fatal
        mixed = self.out("mixed")
        make_model(mixed, "sd1", "sd", [(12, "gelu", 0, "!")])
        code, err = sh(SAMPLE, "--model", mixed, "--prompt", "x", "-o", d, ok=(3,))
        self.assertIn("cross_attention_dim is 8", err)

    def test_non_finite_latents_fail_the_image_alone(self):
        """A UNet predicting huge values: each image fails naming the step;
        the run goes on to the next and ends with the summary."""
        m = self.out("nan")
        make_model(m, "sd1", "sd", [(8, "quick_gelu", 0, "<|endoftext|>")])
        f = os.path.join(m, "unet", "diffusion_pytorch_model.safetensors")
        t = read_st(f)
        t["conv_out.bias"][:] = 3e38
        save_safetensors(f, t)
        d = self.out("o-nan")
        p = jsonl(self.out("p-nan.jsonl"), [{"prompt": "a", "steps": 3, "width": 64, "height": 64},
                                             {"prompt": "b", "steps": 3, "width": 64, "height": 64}])
        # a failed image exits 1 (not only with --strict); with no image written, no contact sheet
        code, err = sh(SAMPLE, "--model", m, "--prompts", p, "-o", d, ok=(1,))
        self.assertIn("00000.png (%s line 1)" % p, err)
        self.assertIn("00001.png (%s line 2)" % p, err)
        self.assertIn("step", err)
        self.assertIn("0 image(s) written", err)
        self.assertIn("2 failed", err)
        self.assertEqual(sorted(os.listdir(d)), [])
        sh(SAMPLE, "--model", m, "--prompts", p, "-o", d, "--strict", ok=(1,))


if __name__ == "__main__":
    SAMPLE, GOLDEN = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
