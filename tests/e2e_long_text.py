#!/usr/bin/env python3
"""End-to-end tests of sd-latents --max-tokens 150/225 (prompts over 75
tokens, as kohya-ss/sd-scripts' --max_token_length) and of sd-train on such
embeddings:
- the 152/227-row embeddings of 50 booru captions (12 to 279 tokens) from
  tiny SD 1.x and SDXL encoders equal tests/golden/long_text/ (a
  transcription of sd-scripts' get_hidden_states / get_hidden_states_sdxl
  run on transformers, tests/golden/make_long_text_golden.py) within 1e-4,
  SDXL's pooled output included, and of SD 2.x ("!" padding) at 225;
- --max-tokens 75 stores what a run without the option stores, byte for
  byte; 150 gets other text keys and a text_encoder meta ending in |tok150;
  a shard holding one length refuses another; bad values are usage errors;
- sd-train trains a tiny UNet (cross_attention_dim 4) on a 150-token shard
  with conditioning dropout (the empty caption's embedding has 152 rows too)
  and validation, nothing skipped, and a tiny SDXL UNet on a 225-token
  shard; shards of two lengths in one run are refused with a message naming
  both, --allow-mixed or not; a --val shard of another length is refused as
  another setup, and validated on (the UNet planned again) with --allow-mixed.
The encoders are tests/tiny_clip.py's (make_long_text_models), made again
here from their seeds; the hashes of their weights are checked against the
golden's first, so the expected numbers are for the same weights.
Usage: e2e_long_text.py SD_META SD_BUCKET SD_LATENTS SD_VERIFY SD_TRAIN VAE_DIR GOLDEN_DIR UNET_CONFIG"""
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    from PIL import Image
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tiny_clip import make_long_text_models
except ImportError:
    print("numpy or PIL not available: skipping")
    sys.exit(77)

META = BUCKET = LATENTS = VERIFY = TRAIN = VAE = GOLDEN = UNET_CONFIG = None
PLAN = ["--plan", "kohya", "-r", "64x64", "--min-bucket", "64", "--steps", "32"]
ROLE_HIDDEN, ROLE_HIDDEN1, ROLE_HIDDEN2, ROLE_POOLED = 16, 17, 18, 19


def sh(*args, ok=(0,), stdin=None):
    """Run a command; returns (code, stdout, stderr); asserts the code."""
    p = subprocess.run([str(a) for a in args], capture_output=True, input=stdin)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def dump(shard, db):
    """mdb_dump's key and value lines of a named database."""
    _, out, _ = sh("mdb_dump", "-n", "-s", db, shard)
    lines = out.splitlines()
    return [l for l in lines[lines.index("HEADER=END") + 1:] if l != "DATA=END"]


def text_records(shard):
    """{record name: {role: float32 array}} of the text embedding each latent
    record refers to, read from the record bytes (FORMATS.md)."""
    texts = dict(zip((bytes.fromhex(k.strip()) for k in dump(shard, "text")[0::2]),
                     (bytes.fromhex(v.strip()) for v in dump(shard, "text")[1::2])))
    out = {}
    for v in dump(shard, "latents")[1::2]:
        b = bytes.fromhex(v.strip())
        name = b[256:256 + struct.unpack("<H", b[12:14])[0]].decode()
        t = texts[b[64:80]]
        poff = struct.unpack("<I", t[80:84])[0]
        tensors = {}
        for e in range(4):
            ent = t[96 + 32 * e: 128 + 32 * e]
            dtype, ndim, role = ent[0], ent[1], ent[2]
            if not ndim:
                continue
            shape = struct.unpack("<4I", ent[4:20])[:ndim]
            off, length = struct.unpack("<II", ent[20:28])
            assert dtype == 3, "fp32 expected"
            tensors[role] = np.frombuffer(t[poff + off: poff + off + length], "<f4").reshape(shape)
        out[name] = tensors
    return out


def meta_of(shard):
    """The shard's meta database as {key: value}."""
    rows = dump(shard, "meta")
    return {bytes.fromhex(k.strip()).decode(): bytes.fromhex(v.strip()).decode()
            for k, v in zip(rows[0::2], rows[1::2])}


class LongText(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sdlong-")
        with open(os.path.join(GOLDEN, "long_text", "captions.json")) as f:
            cls.gold = json.load(f)
        cls.caps = cls.gold["captions"]
        cls.sd1, cls.sdxl, cls.sd2 = make_long_text_models(cls.tmp, os.path.join(GOLDEN, "tokenizer"))
        # 50 small images, then a shard of their latents without text (fp32)
        ds = os.path.join(cls.tmp, "ds")
        os.makedirs(ds)
        for i in range(len(cls.caps)):
            Image.new("RGB", (64, 64), (i * 5 % 256, 90, 200 - i)).save(os.path.join(ds, "c%02d.png" % i))
            with open(os.path.join(ds, "c%02d.caption" % i), "w") as f:
                f.write("placeholder\n")
        _, meta, _ = sh(META, "-q", ds)
        _, cls.bucketed, _ = sh(BUCKET, "-q", *PLAN, "-", stdin=meta.encode())
        cls.bare = os.path.join(cls.tmp, "bare.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--dtype", "fp32", "-o", cls.bare, "-", stdin=cls.bucketed.encode())
        cls.capjl = os.path.join(cls.tmp, "captions.jsonl")
        with open(cls.capjl, "w") as f:
            for i, c in enumerate(cls.caps):
                f.write(json.dumps({"key": "c%02d" % i, "caption": c}) + "\n")
        cls.made = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def shard(self, model, tokens):
        """A copy of the bare shard with the captions' embeddings attached
        (--text-only) at --max-tokens tokens (None: the option left out)."""
        key = (model, tokens)
        if key not in self.made:
            s = os.path.join(self.tmp, "%s_%s.shard" % (os.path.basename(model), tokens))
            shutil.copyfile(self.bare, s)
            opt = ["--max-tokens", tokens] if tokens else []
            sh(LATENTS, "-q", "--text", model, "--text-only", "--dtype", "fp32", *opt, "-o", s, self.capjl)
            self.made[key] = s
        return self.made[key]

    def test_weights_are_the_goldens(self):
        for rel, h in self.gold["sha256"].items():
            with open(os.path.join(self.tmp, rel, "model.safetensors"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), h,
                                 "%s: not the weights the golden was made with (numpy's generator changed?)" % rel)

    def check_golden(self, model, tokens, sdxl, name=None):
        self.test_weights_are_the_goldens()
        recs = text_records(self.shard(model, tokens))
        rows, w, n = tokens + 2, self.gold["width"], len(self.caps)
        name = name or ("sdxl" if sdxl else "sd1")
        want = np.fromfile(os.path.join(GOLDEN, "long_text", "%s_%d.f32" % (name, tokens)), "<f4")
        want = want.reshape(n, -1)
        worst = 0.0
        for i in range(n):
            t = recs["c%02d" % i]
            if sdxl:
                self.assertEqual(sorted(t), [ROLE_HIDDEN1, ROLE_HIDDEN2, ROLE_POOLED])
                self.assertEqual(t[ROLE_HIDDEN1].shape, (rows, w))
                self.assertEqual(t[ROLE_HIDDEN2].shape, (rows, w))
                got = np.concatenate([t[ROLE_HIDDEN1].ravel(), t[ROLE_HIDDEN2].ravel(), t[ROLE_POOLED].ravel()])
            else:
                self.assertEqual(sorted(t), [ROLE_HIDDEN])
                self.assertEqual(t[ROLE_HIDDEN].shape, (rows, w))
                got = t[ROLE_HIDDEN].ravel()
            err = float(np.abs(got - want[i]).max())
            self.assertLessEqual(err, 1e-4, "caption %d (%d tokens): max error %g" % (i, self.gold["tokens"][i], err))
            worst = max(worst, err)
        print("%s %d: max error %.2e over %d captions" % (name, tokens, worst, n))

    def test_sd1_150(self):
        self.check_golden(self.sd1, 150, False)

    def test_sd1_225(self):
        self.check_golden(self.sd1, 225, False)

    def test_sdxl_150(self):
        self.check_golden(self.sdxl, 150, True)

    def test_sdxl_225(self):
        self.check_golden(self.sdxl, 225, True)

    def test_sd2_225(self):
        self.check_golden(self.sd2, 225, False, "sd2")

    def test_75_is_todays_and_lengths_have_their_own_keys(self):
        plain, s75, s150 = self.shard(self.sd1, None), self.shard(self.sd1, 75), self.shard(self.sd1, 150)
        self.assertEqual(dump(s75, "text"), dump(plain, "text"))
        self.assertEqual(dump(s75, "latents"), dump(plain, "latents"))
        m75, m150 = meta_of(s75), meta_of(s150)
        self.assertEqual(m75["text_encoder"], meta_of(plain)["text_encoder"])
        self.assertNotIn("|tok", m75["text_encoder"])
        self.assertEqual(m150["text_encoder"], m75["text_encoder"] + "|tok150")
        self.assertEqual(set(dump(s150, "text")[0::2]) & set(dump(s75, "text")[0::2]), set())
        self.assertEqual(len(dump(s150, "text")) // 2, len(self.caps) + 1)  # and the empty caption's
        self.assertEqual({t[ROLE_HIDDEN].shape for t in text_records(s75).values()}, {(77, 4)})
        _, _, err = sh(VERIFY, s150)
        self.assertIn("0 problems", err)
        # one shard holds one length: attaching another is refused, nothing changed
        before = dump(s150, "text")
        _, _, err = sh(LATENTS, "-q", "--text", self.sd1, "--text-only", "--max-tokens", "225", "-o", s150,
                       self.capjl, ok=(3,))
        self.assertIn("another text encoder setup", err)
        self.assertEqual(dump(s150, "text"), before)

    def test_cut_captions_are_counted(self):
        """Captions longer than --max-tokens are cut as the encoders cut them: the run says how many
        (it said nothing)."""
        for tokens in (75, 225):
            s = os.path.join(self.tmp, "cut_%d.shard" % tokens)
            shutil.copyfile(self.bare, s)
            _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "--max-tokens", str(tokens), "-o", s, self.capjl)
            want = sum(1 for t in self.gold["tokens"] if t > tokens)
            if want:
                self.assertIn("text: %d captions had more than %d tokens and were cut" % (want, tokens), err)
            else:
                self.assertNotIn("were cut", err)

    def test_usage(self):
        for args, msg in ((["--text", self.sd1, "--text-only", "--max-tokens", "100"], "expected 75, 150 or 225"),
                          (["--vae", VAE, "--max-tokens", "150"], "--max-tokens needs --text")):
            _, _, err = sh(LATENTS, *args, "-o", os.path.join(self.tmp, "x.shard"), self.capjl, ok=(2,))
            self.assertIn(msg, err)
        _, out, _ = sh(LATENTS, "--help")
        self.assertIn("--max-tokens 225", out)

    def test_train_on_150_tokens(self):
        s = self.shard(self.sd1, 150)
        empty = meta_of(s)["empty_text"]
        texts = dict(zip(dump(s, "text")[0::2], dump(s, "text")[1::2]))
        self.assertIn(" " + empty, texts)  # the dropout embedding, 152 rows as the others
        self.assertEqual(struct.unpack("<I", bytes.fromhex(texts[" " + empty].strip())[100:104])[0], 152)
        out, m = os.path.join(self.tmp, "run150"), os.path.join(self.tmp, "run150.jsonl")
        _, _, err = sh(TRAIN, "--unet-config", UNET_CONFIG, "-o", out, "--steps", "4", "--batch", "4", "--lr", "1e-3",
                       "--dropout", "0.5", "--val", s, "--val-every", "2", "--metrics", m, "-j", "1", s)
        self.assertIn("step 4/4", err)
        self.assertNotIn("skipped", err.lower().replace("0 skipped", ""))
        with open(m) as f:
            rows = [json.loads(l) for l in f]
        losses = [r["loss"] for r in rows if "loss" in r]
        vals = [r for r in rows if "val_loss" in r]
        self.assertEqual(len(losses), 4)
        self.assertTrue(all(np.isfinite(losses)), losses)
        self.assertEqual({r["val_images"] for r in vals}, {len(self.caps)})
        self.assertTrue(os.path.isfile(os.path.join(out, "checkpoint-4", "unet", "diffusion_pytorch_model.safetensors")))

    def test_train_sdxl_on_225_tokens(self):
        """The SDXL path: both 227-row hidden states side by side (4 + 4) and the first chunk's
        pooled output into text_time."""
        with open(os.path.join(GOLDEN, "unet", "sdxl", "unet", "config.json")) as f:
            cfg = json.load(f)
        cfg["cross_attention_dim"] = 8
        cfg["projection_class_embeddings_input_dim"] = 4 + 6 * cfg["addition_time_embed_dim"]
        conf = os.path.join(self.tmp, "unet_sdxl_8.json")
        with open(conf, "w") as f:
            json.dump(cfg, f)
        s = self.shard(self.sdxl, 225)
        m = os.path.join(self.tmp, "runxl.jsonl")
        _, _, err = sh(TRAIN, "--unet-config", conf, "-o", os.path.join(self.tmp, "runxl"), "--steps", "2", "--batch",
                       "4", "--dropout", "0.5", "--metrics", m, "-j", "1", s)
        self.assertIn("step 2/2", err)
        with open(m) as f:
            losses = [json.loads(l)["loss"] for l in f]
        self.assertEqual(len(losses), 2)
        self.assertTrue(all(np.isfinite(losses)), losses)

    def test_two_lengths_in_one_run_refused(self):
        s75, s150 = self.shard(self.sd1, 75), self.shard(self.sd1, 150)
        for extra in ([], ["--allow-mixed"]):
            _, _, err = sh(TRAIN, "--unet-config", UNET_CONFIG, "-o", os.path.join(self.tmp, "mixed"), "--steps", "1",
                           *extra, s75, s150, ok=(3,))
            self.assertIn("%s: text embeddings of 150 caption tokens (152 rows), the first shard's of 75 (77 rows)"
                          % s150, err)
        # a held-out shard of another length: refused as another setup, taken with --allow-mixed
        # (the UNet is planned again for its length)
        _, _, err = sh(TRAIN, "--unet-config", UNET_CONFIG, "-o", os.path.join(self.tmp, "valmix"), "--steps", "1",
                       "--val", s75, s150, ok=(3,))
        self.assertIn("--val %s: made with another VAE or text encoder setup" % s75, err)
        m = os.path.join(self.tmp, "valmix.jsonl")
        sh(TRAIN, "--unet-config", UNET_CONFIG, "-o", os.path.join(self.tmp, "valmix"), "--steps", "2", "--batch", "4",
           "--allow-mixed", "--val", s75, "--val-every", "1", "--metrics", m, "-j", "1", s150)
        with open(m) as f:
            vals = [r for r in map(json.loads, f) if "val_loss" in r]
        self.assertEqual([r["val_images"] for r in vals], [len(self.caps)] * 3)
        self.assertTrue(all(np.isfinite([r["val_loss"] for r in vals])))


if __name__ == "__main__":
    META, BUCKET, LATENTS, VERIFY, TRAIN, VAE, GOLDEN = sys.argv[1:8]
    # the tiny golden SD 1.x UNet's config, cross-attending to the encoders' width 4
    with open(sys.argv[8]) as f:
        cfg = json.load(f)
    del sys.argv[1:9]
    cfg["cross_attention_dim"] = 4
    UNET_CONFIG = os.path.join(tempfile.mkdtemp(prefix="sdlong-unet-"), "config.json")
    with open(UNET_CONFIG, "w") as f:
        json.dump(cfg, f)
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(os.path.dirname(UNET_CONFIG), ignore_errors=True)
