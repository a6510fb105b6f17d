#!/usr/bin/env python3
"""End-to-end tests of sd-latents --text, the text-embedding cache: a
dataset whose captions repeat stores each distinct embedding once (the
empty caption's included), every latent record references its caption's
embedding, sd-verify checks records and references; a changed caption
gives a new embedding and replaces only that image's record; SDXL (two
encoders + pooled) and SD 1.x layouts; records with invalid UTF-8 are refused and counted;
--text-batch 32 (captions encoded together) stores the bytes --text-batch 1 does;
--text-weights fp16 on fp16-exact weights stores the fp32 records, bf16 on others new keys;
a SIGKILL in the caption pass keeps whole text records and the rerun equals an uninterrupted run;
folders saved by transformers 5 (no text_model. prefix, tokenizer.json only) cache what the hub layout does.

The text encoders are tiny random transformers-layout CLIP models written
here with numpy (the real 49408-token vocabulary, width 32, 2 layers), the
tokenizer is the real CLIP one from tests/golden/tokenizer. Their numbers
are checked against transformers elsewhere (tests/test_clip_text.c).
Usage: e2e_text.py SD_META SD_BUCKET SD_LATENTS SD_VERIFY VAE_DIR TOKENIZER_GOLDEN_DIR [SD_PACK SD_TRAIN]"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import signal
import tempfile
import time
import unittest

try:
    import numpy as np
    from PIL import Image
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tiny_clip import make_encoder, make_tokenizer as _make_tokenizer
except ImportError:
    print("numpy or PIL not available: skipping")
    sys.exit(77)

META = BUCKET = LATENTS = VERIFY = VAE = TOKDIR = PACK = TRAIN = None
PLAN = ["--plan", "kohya", "-r", "128x128", "--min-bucket", "64", "--steps", "32"]


def sh(*args, ok=(0,), stdin=None):
    """Run a command; returns (code, stdout, stderr); asserts the code."""
    p = subprocess.run([str(a) for a in args], capture_output=True, input=stdin)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def skipped_count(err, reason):
    """The count the final summary prints for a skip reason (0 when absent)."""
    for line in err.splitlines():
        m = re.match(r"^sd-latents[^:]*:\s+(\d+)\s+(.*)$", line)
        if m and m.group(2) == reason:
            return int(m.group(1))
    return 0


def entries(shard, db):
    _, out, _ = sh("mdb_stat", "-n", "-s", db, shard)
    return int(re.search(r"Entries: (\d+)", out).group(1))


def dump(shard, db):
    _, out, _ = sh("mdb_dump", "-n", "-s", db, shard)
    lines = out.splitlines()
    return [l for l in lines[lines.index("HEADER=END") + 1:] if l != "DATA=END"]


class Text(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sdtext-")
        rng = np.random.default_rng(3)
        cls.sd1 = os.path.join(cls.tmp, "sd1")
        make_tokenizer = lambda d, pad: _make_tokenizer(d, TOKDIR, pad)
        make_tokenizer(os.path.join(cls.sd1, "tokenizer"), "<|endoftext|>")
        make_encoder(os.path.join(cls.sd1, "text_encoder"), rng, 32, "quick_gelu", 0)
        cls.sdxl = os.path.join(cls.tmp, "sdxl")
        make_tokenizer(os.path.join(cls.sdxl, "tokenizer"), "<|endoftext|>")
        make_tokenizer(os.path.join(cls.sdxl, "tokenizer_2"), "!")
        make_encoder(os.path.join(cls.sdxl, "text_encoder"), rng, 32, "quick_gelu", 0)
        make_encoder(os.path.join(cls.sdxl, "text_encoder_2"), rng, 48, "gelu", 40)
        # 24 small images, 6 distinct captions (one empty), one invalid UTF-8
        cls.ds = os.path.join(cls.tmp, "ds")
        os.makedirs(cls.ds)
        for i in range(24):
            im = Image.new("RGB", (96 + 8 * (i % 3), 96), (i * 10 % 256, 80, 160))
            im.save(os.path.join(cls.ds, "i%02d.png" % i))
            with open(os.path.join(cls.ds, "i%02d.caption" % i), "w") as f:
                f.write("placeholder\n")
        cls.distinct = 5  # "" included; the invalid-UTF-8 caption's records are refused

    caps = [b"a cat", b"a dog, sitting", b"1girl, solo, smile", b"", "caf\u00e9 \u2615".encode(), b"bad \xff byte"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def bucketed(self, name, change=None):
        """sd-meta | sd-bucket, then captions set from caps (sd-meta itself
        skips empty and invalid-UTF-8 captions; a hand-made stream may not):
        image i gets caps[i % 6], or `change` for image 0."""
        _, meta, _ = sh(META, "-q", self.ds)
        _, out, _ = sh(BUCKET, "-q", *PLAN, "-", stdin=meta.encode())
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            for line in out.splitlines():
                r = json.loads(line)
                i = int(r["key"][1:])
                cap = change if (change is not None and i == 0) else self.caps[i % 6]
                r["caption"] = "@@CAPTION@@"
                f.write(json.dumps(r).encode().replace(b"@@CAPTION@@", cap) + b"\n")
        return path

    def test_sd1_dedup_and_references(self):
        jl = self.bucketed("sd1.jsonl")
        with open(jl, "rb") as f:
            good = [l for l in f if b"\xff" not in l]
        n = len(good)
        manifest = os.path.join(self.tmp, "sd1.manifest.jsonl")
        with open(manifest, "wb") as f:
            f.writelines(good)
        s = os.path.join(self.tmp, "sd1.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", s, jl)
        self.assertEqual(entries(s, "latents"), n)
        self.assertEqual(entries(s, "text"), self.distinct, err)  # "" is one of them
        m = re.search(r"text: (\d+) captions looked up, (\d+) embeddings computed", err)
        self.assertEqual(int(m.group(2)), self.distinct)
        # JSON text must be UTF-8: a record with a raw invalid byte is refused
        # by the parser (reported with its line, counted), not re-encoded
        self.assertIn("invalid UTF-8 in string", err)
        self.assertRegex(err, r"4\s+malformed JSON")
        _, _, verr = sh(VERIFY, "--manifest", manifest, s)
        self.assertIn("0 problems", verr)
        # every latent record's text reference is a stored text key
        texts = set(dump(s, "text")[0::2])
        for v in dump(s, "latents")[1::2]:
            ref = v.strip()[128:160]  # header bytes 64..79
            self.assertIn(" " + ref, texts)
        # a changed caption: one new embedding; its image's record keeps its key and latents and
        # refers to the new embedding, no image encoded again
        before, keys0 = self.by_name(s), dump(s, "latents")[0::2]
        jl2 = self.bucketed("sd1b.jsonl", change=b"a cat on a mat")
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", s, jl2)
        self.assertIn("1 records kept their latents and now refer to their new caption's embedding", err)
        self.assertNotIn(" written (", err)
        self.assertEqual(entries(s, "text"), self.distinct + 1)
        after = self.by_name(s)
        self.assertEqual(sorted(after), sorted(before))
        self.assertEqual([k for k in after if after[k][64:80] != before[k][64:80]], ["i00"])
        self.assertEqual(after["i00"][256:], before["i00"][256:])  # the same latents
        self.assertEqual(dump(s, "latents")[0::2], keys0)  # every record under its old key
        sh(VERIFY, s)
        # a run without --text keeps every record and its reference
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, jl2)
        self.assertIn("nothing to do: %d records already cached" % n, err)
        self.assertEqual(self.by_name(s), after)

    def test_sdxl_two_encoders_and_pooled(self):
        jl = self.bucketed("xl.jsonl")
        s = os.path.join(self.tmp, "xl.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sdxl, "--dtype", "bf16", "-o", s, jl)
        self.assertIn("SDXL", err)
        self.assertEqual(entries(s, "text"), self.distinct)
        sh(VERIFY, s)
        # text record: 3 tensors, hidden1 [77,32], hidden2 [77,48], pooled [40]
        v = bytes.fromhex(dump(s, "text")[1].strip())
        self.assertEqual(v[9], 3)
        tab = [v[96 + 32 * i: 128 + 32 * i] for i in range(3)]
        shapes = [(t[2], struct.unpack("<4I", t[4:20])) for t in tab]
        self.assertEqual(shapes, [(17, (77, 32, 0, 0)), (18, (77, 48, 0, 0)), (19, (40, 0, 0, 0))])
        self.assertTrue(all(t[0] == 2 for t in tab))  # bf16

    def test_batches_store_the_same_embeddings(self):
        # captions are encoded --text-batch at a time (several per pass
        # through the encoder, whatever the image --batch); the text records
        # must be the bytes one caption per call gives, with the same counts
        jl = self.bucketed("b.jsonl")
        for model, name in ((self.sd1, "sd1"), (self.sdxl, "sdxl")):
            runs = []
            for batch, tb in (("1", "1"), ("8", "32")):
                s = os.path.join(self.tmp, "b%s_%s.shard" % (batch, name))
                _, _, err = sh(LATENTS, "--vae", VAE, "--text", model, "--batch", batch, "--text-batch", tb,
                               "-o", s, jl)
                counts = re.search(r"text: (\d+) captions looked up, (\d+) embeddings computed", err).groups()
                runs.append((dump(s, "text"), counts))
            self.assertEqual(runs[0][1], runs[1][1], name)
            self.assertEqual(len(runs[0][0]), 2 * self.distinct, name)
            self.assertEqual(runs[0][0], runs[1][0], name)

    def test_16bit_encoder_weights(self):
        # --text-weights fp16 on a model whose weights fp16 holds exactly:
        # the same text records, keys and bytes, as fp32; bf16 on the
        # random fp32 model rounds, so its embeddings get their own keys
        jl = self.bucketed("w16.jsonl")
        exact = os.path.join(self.tmp, "sd1f16")
        shutil.copytree(os.path.join(self.sd1, "tokenizer"), os.path.join(exact, "tokenizer"))
        make_encoder(os.path.join(exact, "text_encoder"), np.random.default_rng(5), 32, "quick_gelu", 0,
                     f16_exact=True)
        runs = {}
        for model, wt in ((exact, "fp32"), (exact, "fp16"), (self.sd1, "fp32"), (self.sd1, "bf16")):
            s = os.path.join(self.tmp, "w16_%s_%s.shard" % (os.path.basename(model), wt))
            _, _, err = sh(LATENTS, "--vae", VAE, "--text", model, "--text-weights", wt, "-o", s, jl)
            if wt != "fp32":
                self.assertIn("encoder matrices held as " + wt, err)
                self.assertIn("exact" if model == exact else "rounded", err)
            sh(VERIFY, s)
            runs[(model, wt)] = dump(s, "text")
        self.assertEqual(runs[(exact, "fp16")], runs[(exact, "fp32")])
        self.assertEqual(len(runs[(self.sd1, "bf16")]), 2 * self.distinct)
        keys = lambda d: set(d[0::2])
        self.assertFalse(keys(runs[(self.sd1, "bf16")]) & keys(runs[(self.sd1, "fp32")]))
        # a GPU keeps fp32 weights; unknown types are refused
        code, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "--text-weights", "fp16", "--device", "cuda:0",
                          "-o", os.path.join(self.tmp, "w16x.shard"), jl, ok=(2,))
        self.assertIn("--text-weights fp16 is for the CPU", err)
        code, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "--text-weights", "fp8",
                          "-o", os.path.join(self.tmp, "w16y.shard"), jl, ok=(2,))  # a usage error
        self.assertIn("--text-weights fp8", err)

    def test_kill9_in_the_caption_pass(self):
        # captions come first, one LMDB transaction per --text-batch: a
        # SIGKILL while they are being stored leaves whole text records and
        # no image record; the rerun ends equal to an uninterrupted run
        ds = os.path.join(self.tmp, "many")
        os.makedirs(ds)
        n = 120
        for i in range(n):
            Image.new("RGB", (64, 64), (i, 2 * i % 256, 90)).save(os.path.join(ds, "m%03d.png" % i))
            with open(os.path.join(ds, "m%03d.txt" % i), "w") as f:
                f.write("caption number %d, %s\n" % (i, "a tree" if i % 2 else "a lake"))
        _, meta, _ = sh(META, "-q", ds)
        _, out, _ = sh(BUCKET, "-q", *PLAN, "-", stdin=meta.encode())
        jl = os.path.join(self.tmp, "many.jsonl")
        with open(jl, "w") as f:
            f.write(out)
        full = os.path.join(self.tmp, "many_full.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--text", self.sd1, "-o", full, jl)
        s = os.path.join(self.tmp, "many_killed.shard")
        p = subprocess.Popen([LATENTS, "-q", "--vae", VAE, "--text", self.sd1, "--text-batch", "1", "-j", "1",
                              "-o", s, jl], stderr=subprocess.DEVNULL)
        deadline, part = time.time() + 300, 0
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(s):
                try:
                    part = entries(s, "text")
                except (AssertionError, AttributeError):
                    part = 0
                if part >= 10:
                    break
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.wait()
        part = entries(s, "text")
        self.assertGreater(part, 0)
        self.assertLess(part, n + 1, "the caption pass finished before the kill; the test proves nothing")
        self.assertEqual(entries(s, "latents"), 0)
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", s, jl)
        m = re.search(r"text: (\d+) captions looked up, (\d+) embeddings computed", err)
        self.assertEqual(int(m.group(2)), n + 1 - part)  # the empty caption's record is among the stored
        for db in ("text", "latents"):
            self.assertEqual(dump(s, db), dump(full, db), db)
        sh(VERIFY, s)

    def test_tokenizer_is_part_of_the_key(self):
        """The same encoder with a tokenizer that pads with '!' gives other ids, so other
        embeddings: a rerun into the same shard stores new text records (under new keys)
        instead of finding the old ones."""
        jl = self.bucketed("tok.jsonl")
        s = os.path.join(self.tmp, "tok.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--text", self.sd1, "-o", s, jl)
        before = set(dump(s, "text")[0::2])
        pad = os.path.join(self.tmp, "padtok")
        _make_tokenizer(os.path.join(pad, "tokenizer"), TOKDIR, "!")
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "--tokenizer", pad, "-o", s, jl)
        self.assertNotIn("nothing to do", err)
        after = set(dump(s, "text")[0::2])
        self.assertEqual(len(after - before), self.distinct, err)

    def test_standalone_encoder_file_is_one_encoder(self):
        """A text encoder on its own (transformers' names in one file) is an SD 1.x/2.x
        encoder, never taken for SDXL's pair; it gives the folder's embeddings."""
        jl = self.bucketed("one.jsonl")
        one = os.path.join(self.tmp, "one")  # width 64, one head: what a file alone implies
        make_encoder(os.path.join(one, "text_encoder"), np.random.default_rng(5), 64, "quick_gelu", 0, heads=1)
        shutil.copytree(os.path.join(self.sd1, "tokenizer"), os.path.join(one, "tokenizer"))
        a, b = os.path.join(self.tmp, "folder.shard"), os.path.join(self.tmp, "file.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--text", one, "-o", a, jl)
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", os.path.join(one, "text_encoder", "model.safetensors"),
                       "--tokenizer", one, "-o", b, jl)
        self.assertIn("SD 1.x, 1 encoder(s)", err)
        self.assertEqual(dump(a, "text"), dump(b, "text"))

    @staticmethod
    def by_name(shard):
        """Latent records of a shard by name: {name: value bytes}."""
        recs = {}
        for v in dump(shard, "latents")[1::2]:
            b = bytes.fromhex(v.strip())
            n = struct.unpack("<H", b[12:14])[0]
            recs[b[256:256 + n].decode()] = b
        return recs

    def test_text_only_attaches_to_records_made_without(self):
        """--text-only: a shard made without --text gets each record's caption embedding
        by name: the text records (keys and bytes) a --text run stores, each record's
        latents and header as they were but for the reference and header checksum;
        sd-verify clean; a rerun does nothing; unknown names are counted; another
        encoder setup is refused."""
        jl = self.bucketed("att.jsonl")
        full, bare = os.path.join(self.tmp, "att_full.shard"), os.path.join(self.tmp, "att_bare.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--text", self.sd1, "-o", full, jl)
        sh(LATENTS, "-q", "--vae", VAE, "-o", bare, jl)
        before = self.by_name(bare)
        self.assertEqual(entries(bare, "text"), 0)
        n = len(before)
        with open(jl, "ab") as f:  # a caption line for a record the shard does not hold
            f.write(b'{"key": "nosuch", "caption": "a cat"}\n')
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", bare, jl)
        self.assertIn("text embeddings attached to %d records (0 had another one), 0 already attached" % n, err)
        self.assertEqual(skipped_count(err, "no latent record of this name"), 1, err)
        # a line without a caption (or with null) leaves the record's embedding as it is, counted,
        # rather than blanking it to the empty caption's
        names = sorted(before)[:2]
        attached = self.by_name(bare)
        nocap = os.path.join(self.tmp, "nocap.jsonl")
        with open(nocap, "w") as f:
            f.write('{"key": "%s"}\n{"key": "%s", "caption": null}\n' % tuple(names))
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", bare, nocap)
        self.assertEqual(skipped_count(err, "no caption (the record keeps its embedding; \"caption\": \"\" sets the "
                                            "empty one)"), 2, err)
        self.assertEqual(self.by_name(bare), attached)
        self.assertEqual(dump(bare, "text"), dump(full, "text"))
        after, ref = self.by_name(bare), self.by_name(full)
        self.assertEqual(sorted(after), sorted(before))
        for name, v in after.items():
            self.assertEqual(v[64:80], ref[name][64:80], name)  # the caption's embedding, as --text stores it
            self.assertEqual(v[:64] + v[80:248] + v[256:], before[name][:64] + before[name][80:248] + before[name][256:])
            self.assertNotEqual(v[248:256], before[name][248:256])  # the header checksum covers the reference
        _, _, verr = sh(VERIFY, bare)
        self.assertIn("0 problems", verr)
        # rerun: nothing to do, nothing changed; --strict counts the unknown name
        code, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "--strict", "-o", bare, jl, ok=(1,))
        self.assertIn("attached to 0 records (0 had another one), %d already attached" % n, err)
        self.assertEqual(self.by_name(bare), after)
        # another encoder setup is refused: the trainer takes a shard as one setup
        code, _, err = sh(LATENTS, "--text", self.sdxl, "--text-only", "-o", bare, jl, ok=(3,))
        self.assertIn("another text encoder setup", err)
        self.assertEqual(self.by_name(bare), after)
        # usage: --text-only needs --text and runs no VAE; the shard must exist
        for args in (["--text-only"], ["--text-only", "--text", self.sd1, "--vae", VAE],
                     ["--text-only", "--text", self.sd1, "--flip"]):
            sh(LATENTS, *args, "-o", bare, jl, ok=(2,))
        code, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", os.path.join(self.tmp, "none.shard"), jl,
                          ok=(3,))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "none.shard")))

    def test_text_only_makes_an_sd1_kohya_import_whole(self):
        """sd-scripts caches no text-encoder outputs for SD 1.x: an imported cache has
        latents alone, which sd-train cannot use; --text-only with the captions
        (sd-meta's kohya reader of meta_cap_dd.json) gives every record its embedding,
        and sd-train then trains on the shard."""
        if not PACK:
            self.skipTest("no sd-pack and sd-train given")
        kd = os.path.join(self.tmp, "kohya_sd1")
        os.makedirs(kd)
        rng = np.random.default_rng(11)
        meta = {}
        for i in range(5):
            w, h = (96, 64) if i % 2 else (64, 96)  # latents 12x8: the tiny UNet's 3 levels need multiples of 4
            np.savez(os.path.join(kd, "k%d_%04dx%04d_sd.npz" % (i, w, h)),
                     latents=rng.standard_normal((4, h // 8, w // 8)).astype(np.float32),
                     original_size=np.array([w * 2, h * 2]), crop_ltrb=np.array([0, 0, w, h]))
            meta["k%d" % i] = {"caption": "a photo of thing %d" % (i % 3), "tags": ""}
        mj = os.path.join(self.tmp, "meta_cap_dd.json")
        with open(mj, "w") as f:
            json.dump(meta, f)
        s = os.path.join(self.tmp, "kohya_sd1.lmdb")
        sh(PACK, "import-kohya", kd, "-o", s, "-q")
        self.assertEqual((entries(s, "latents"), entries(s, "text")), (5, 0))
        unet = os.path.join(self.tmp, "unet_ca32.json")  # the tiny golden UNet, cross-attending to width 32
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "unet", "sd1", "unet",
                               "config.json")) as f:
            cfg = json.load(f)
        cfg["cross_attention_dim"] = 32
        with open(unet, "w") as f:
            json.dump(cfg, f)
        train = lambda out, ok: sh(TRAIN, "--unet-config", unet, "--steps", "2", "-o", os.path.join(self.tmp, out), s,
                                   ok=ok)
        _, _, err = train("kohya_run0", (3,))
        self.assertIn("record has no text embedding", err)
        _, lines, _ = sh(META, "-q", "--source", "kohya", "--no-check-images", mj)
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", s, "-", stdin=lines.encode())
        self.assertIn("text embeddings attached to 5 records", err)
        self.assertNotIn("still have no text embedding", err)
        self.assertEqual(entries(s, "text"), 4)  # 3 distinct captions and the empty one
        _, _, verr = sh(VERIFY, s)
        self.assertIn("0 problems", verr)
        texts = set(dump(s, "text")[0::2])
        for v in self.by_name(s).values():
            self.assertIn(" " + v[64:80].hex(), texts)
        _, _, err = train("kohya_run1", (0,))
        self.assertIn("step 2/2", err)

    def test_text_only_matches_kohya_keys_by_path(self):
        """An imported cache in subfolders names its records cats/c0, dogs/d0, ...; sd-scripts'
        keys are stems or, with --full_path, image paths. --text-only matches a key that names
        no record as import-kohya --meta does: the longest run of trailing path components
        shared, the image extension left out; a key two records match equally well is skipped
        as ambiguous, naming both."""
        if not PACK:
            self.skipTest("no sd-pack given")
        kd = os.path.join(self.tmp, "kohya_sub")
        rng = np.random.default_rng(12)
        for sub, stem in (("cats", "c0"), ("cats", "c1"), ("dogs", "d0"), ("cats", "x"), ("dogs", "x"),
                          ("dogs", "d1")):
            os.makedirs(os.path.join(kd, sub), exist_ok=True)
            np.savez(os.path.join(kd, sub, "%s_0064x0064_sd.npz" % stem),
                     latents=rng.standard_normal((4, 8, 8)).astype(np.float32),
                     original_size=np.array([64, 64]), crop_ltrb=np.array([0, 0, 64, 64]))
        s = os.path.join(self.tmp, "kohya_sub.lmdb")
        sh(PACK, "import-kohya", kd, "-o", s, "-q")
        self.assertEqual(sorted(self.by_name(s)), ["cats/c0", "cats/c1", "cats/x", "dogs/d0", "dogs/d1", "dogs/x"])
        meta = {"/data/kd2/cats/c0.png": "a cat", "c1": "another cat", "d0.jpg": "a dog", "x": "an x",
                "nosuch": "nothing", "dogs/d1": "the exact name"}
        mj = os.path.join(self.tmp, "meta_sub.json")
        with open(mj, "w") as f:
            json.dump({k: {"caption": c} for k, c in meta.items()}, f)
        _, lines, _ = sh(META, "-q", "--source", "kohya", "--no-check-images", mj)
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", s, "-", stdin=lines.encode())
        self.assertIn("text embeddings attached to 4 records", err)
        self.assertIn("3 keys matched to records by path", err)
        self.assertEqual(skipped_count(err, "ambiguous record name"), 1, err)
        self.assertIn("key x matches records cats/x and dogs/x equally well", err)
        self.assertEqual(skipped_count(err, "no latent record of this name"), 1, err)
        self.assertIn("2 latent records still have no text embedding", err)
        # each record got its own key's caption: compare with a run on the exact names
        exact = os.path.join(self.tmp, "kohya_sub_exact.lmdb")
        sh(PACK, "import-kohya", kd, "-o", exact, "-q")
        named = {"cats/c0": "a cat", "cats/c1": "another cat", "dogs/d0": "a dog", "dogs/d1": "the exact name"}
        jl = "".join(json.dumps({"key": k, "caption": c}) + "\n" for k, c in named.items())
        sh(LATENTS, "--text", self.sd1, "--text-only", "-o", exact, "-", stdin=jl.encode())
        got, want = self.by_name(s), self.by_name(exact)
        for name in named:
            self.assertEqual(got[name][64:80], want[name][64:80], name)
        for name in ("cats/x", "dogs/x"):
            self.assertEqual(got[name][64:80], bytes(16), name)
        _, _, verr = sh(VERIFY, s)
        self.assertIn("0 problems", verr)
        # a rerun finds the same records and has nothing to do
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", s, "-", stdin=lines.encode())
        self.assertIn("attached to 0 records (0 had another one), 4 already attached", err)

    def test_lost_empty_caption_embedding_is_stored_again(self):
        """The empty caption's embedding (conditioning dropout) gone from a shard whose
        records are all cached (sd-verify --repair deletes a damaged one): a --text rerun
        stores it again, where it used to say "nothing to do" and leave it missing; so does a
        --text-only rerun, where every record was attached already, and one whose shard lost the
        text meta itself while its records still refer to their embeddings."""
        jl = self.bucketed("lost.jsonl")
        s = os.path.join(self.tmp, "lost_full.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--text", self.sd1, "-o", s, jl)
        _, meta, _ = sh("mdb_dump", "-n", "-s", "meta", s)
        lines = meta.splitlines()
        empty = bytes.fromhex(lines[lines.index(" " + b"empty_text".hex()) + 1].strip()).decode()
        _, everything, _ = sh("mdb_dump", "-n", "-a", s)

        def copy_without(name, database, keys):
            """s again as name, without the entries of database whose hex keys are given
            (through mdb_dump / mdb_load)."""
            out, db, skip = [], None, False
            for l in everything.splitlines():
                if l.startswith("database="):
                    db = l.split("=", 1)[1]
                if skip:  # the value line of a dropped key
                    skip = False
                    continue
                if db == database and l.strip() in keys:
                    skip = True
                    continue
                out.append(l)
            path = os.path.join(self.tmp, name)
            subprocess.run(["mdb_load", "-n", "-f", "/dev/stdin", path], input="\n".join(out) + "\n", text=True,
                           check=True)
            return path
        # the same shard without that one text record
        cut = copy_without("lost_cut.shard", "text", {empty})
        self.assertEqual(entries(cut, "text"), entries(s, "text") - 1)
        _, verr = sh(VERIFY, cut, ok=(1,))[1:]
        self.assertIn("empty_text_missing", verr)
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", cut, jl)
        self.assertIn("the empty caption's embedding (for conditioning dropout) is missing: stored again", err)
        self.assertEqual(dump(cut, "text"), dump(s, "text"))
        _, _, verr = sh(VERIFY, cut)
        self.assertIn("0 problems", verr)
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", cut, jl)
        self.assertIn("nothing to do", err)
        self.assertNotIn("stored again", err)
        # the same through --text-only, whose rerun had every record attached: it stores it again too
        cut2 = copy_without("lost_cut2.shard", "text", {empty})
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", cut2, jl)
        self.assertIn("the empty caption's embedding (for conditioning dropout) is missing: stored again", err)
        self.assertIn("attached to 0 records", err)
        self.assertEqual(dump(cut2, "text"), dump(s, "text"))
        _, _, verr = sh(VERIFY, cut2)
        self.assertIn("0 problems", verr)
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", cut2, jl)
        self.assertNotIn("stored again", err)
        # the text meta itself gone (a salvage that took the meta from before the attach) while every
        # record still refers to its embedding: a --text-only rerun writes it again
        cut3 = copy_without("lost_cut3.shard", "meta", {b"empty_text".hex(), b"text_encoder".hex()})
        _, meta3, _ = sh("mdb_dump", "-n", "-s", "meta", cut3)
        self.assertNotIn(b"empty_text".hex(), meta3)
        _, _, err = sh(LATENTS, "--text", self.sd1, "--text-only", "-o", cut3, jl)
        self.assertIn("its text meta (empty_text, text_encoder) is missing while records refer to these embeddings: "
                      "stored again", err)
        def meta_of(dump):  # {key: value} of an mdb_dump of the meta database
            rows = [bytes.fromhex(l.strip()).decode() for l in dump.splitlines() if l.startswith(" ")]
            return dict(zip(rows[::2], rows[1::2]))
        _, meta3, _ = sh("mdb_dump", "-n", "-s", "meta", cut3)
        for k in ("empty_text", "text_encoder"):
            self.assertEqual(meta_of(meta3)[k], meta_of(meta)[k], k)
        self.assertEqual(dump(cut3, "text"), dump(s, "text"))

    def test_export_kohya_of_mean_std_says_why_nothing(self):
        """sd-pack export-kohya of a default (mean+std) shard writes nothing, since kohya caches
        hold one sample per image: it says so and how to make one it can export. And
        --vae-groups that a config.json overrides is said to be unused."""
        if not PACK:
            self.skipTest("no sd-pack given")
        jl = self.bucketed("ms.jsonl")
        s = os.path.join(self.tmp, "ms.shard")
        sh(LATENTS, "-q", "--vae", VAE, "-o", s, jl)
        _, _, err = sh(PACK, "export-kohya", s, "-o", os.path.join(self.tmp, "ms_out"))
        self.assertIn("nothing exported: every record holds the posterior's mean and std", err)
        self.assertIn("sd-latents --sample", err)
        # --vae-groups beside a config.json that gives the groups: said to be unused
        _, _, err = sh(LATENTS, "--vae", VAE, "--vae-groups", "3", "-o", s, jl)
        self.assertIn("its config.json says norm_num_groups 4; --vae-groups 3 is for weights without one", err)

    def test_two_parts_into_one_shard_are_said(self):
        """--shard 0/2 and then 1/2 into one -o (one file given to two GPUs' runs): allowed, the
        shard holding both parts, but the second run says so."""
        jl = self.bucketed("parts.jsonl")
        s = os.path.join(self.tmp, "parts.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--shard", "0/2", "-o", s, jl)
        self.assertNotIn("was written by --shard", err)
        _, _, err = sh(LATENTS, "--vae", VAE, "--shard", "1/2", "-o", s, jl)
        self.assertIn("was written by --shard 0/2; this run is --shard 1/2: the shard will hold the records of both "
                      "parts", err)
        # a whole-input run into it, or a part rerun into a merge of the parts, is no mistake: no word
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", s, jl)
        self.assertNotIn("was written by --shard", err)
        if PACK:
            p0, p1, m = (os.path.join(self.tmp, n) for n in ("part0.shard", "part1.shard", "merged.shard"))
            sh(LATENTS, "-q", "--vae", VAE, "--shard", "0/2", "-o", p0, jl)
            sh(LATENTS, "-q", "--vae", VAE, "--shard", "1/2", "-o", p1, jl)
            sh(PACK, "merge", "-q", "-o", m, p0, p1)
            _, _, err = sh(LATENTS, "--vae", VAE, "--shard", "1/2", "-o", m, jl)
            self.assertNotIn("was written by --shard", err)

    def test_damaged_record_is_encoded_again_not_retexted(self):
        """A record whose payload is damaged and whose caption changed is encoded again:
        giving it the new reference would rebuild it with a fresh checksum over the
        damaged bytes and hide the damage from sd-verify and sd-train for good."""
        jl = self.bucketed("dmg.jsonl")
        s = os.path.join(self.tmp, "dmg.shard")
        sh(LATENTS, "-q", "--vae", VAE, "--text", self.sd1, "-o", s, jl)
        good = self.by_name(s)["i01"]
        with open(s, "rb") as f:
            data = bytearray(f.read())
        at = data.find(good[256:])
        self.assertGreater(at, 0)
        data[at + len(good[256:]) - 3] ^= 0x40  # a byte of the last tensor
        with open(s, "wb") as f:
            f.write(data)
        code, _, err = sh(VERIFY, s, ok=(1,))
        self.assertIn("payload checksum mismatch", err)
        jl2 = self.bucketed("dmg2.jsonl", change=b"a cat on a mat")  # i00's caption changes
        with open(jl2, "rb") as f:  # i01's caption changes too (the first "caption" member is read)
            data = f.read().replace(b'"key": "i01", ', b'"key": "i01", "caption": "i01 edited", ', 1)
        with open(jl2, "wb") as f:
            f.write(data)
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", s, jl2)
        self.assertIn("record i01 is damaged", err)
        self.assertIn("1 records kept their latents", err)  # i00, undamaged
        self.assertRegex(err, r"1 written \(1 replaced stale\)")  # i01, encoded again
        _, _, verr = sh(VERIFY, s)
        self.assertIn("0 problems", verr)
        self.assertEqual(self.by_name(s)["i01"][256:], good[256:])  # the same latents, encoded again

    def test_root_resolves_relative_image_paths(self):
        """Records whose image paths are relative (sd-bucket --root) are found with
        sd-latents --root from any directory (without it: every image unreadable, and no
        usable record is said plainly); the record keys do not depend on the root."""
        jl = self.bucketed("root.jsonl")
        rel = os.path.join(self.tmp, "rel.jsonl")
        with open(jl, "rb") as f, open(rel, "wb") as g:
            for line in f:
                if b"\xff" not in line:
                    g.write(line.replace((self.ds + "/").encode(), b"ds/"))
        a, b = os.path.join(self.tmp, "root_a.shard"), os.path.join(self.tmp, "root_b.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", a, rel)  # cwd is not self.tmp
        self.assertRegex(err, r"0 written \(0 replaced stale\), 0 already cached, \d+ bad")
        # (under taskset -c 0, where the machine has more CPUs: the default -j is the one CPU allowed)
        pin = ["taskset", "-c", "0"] if shutil.which("taskset") and os.cpu_count() > 1 else []
        _, _, err = sh(*pin, LATENTS, "--vae", VAE, "--root", self.tmp, "-o", b, rel)
        self.assertRegex(err, r"(\d+) written .* 0 bad")
        if pin:
            self.assertIn("batch 1, 1 threads", err)
        full = os.path.join(self.tmp, "root_full.shard")
        sh(LATENTS, "-q", "--vae", VAE, "-o", full, jl)
        self.assertEqual(dump(b, "latents"), dump(full, "latents"))
        # an input whose every record is skipped is an error, exit 1 without --strict (it said
        # "nothing to do: 0 records already cached", later warned and exited 0)
        nb = os.path.join(self.tmp, "notbucketed.jsonl")
        _, meta, _ = sh(META, "-q", self.ds)
        with open(nb, "w") as f:
            f.write(meta)
        code, _, err = sh(LATENTS, "--vae", VAE, "-o", os.path.join(self.tmp, "nb.shard"), nb, ok=(1,))
        self.assertIn("every record of the input was skipped", err)
        self.assertIn("not bucketed", err)
        self.assertNotIn("nothing to do", err)
        # an empty input is not an error: a part of a split may hold no record
        empty = os.path.join(self.tmp, "empty.jsonl")
        open(empty, "w").close()
        _, _, err = sh(LATENTS, "--vae", VAE, "-o", os.path.join(self.tmp, "empty.shard"), empty)
        self.assertIn("no record in the input", err)

    def test_transformers5_layout(self):
        """What transformers 5 saves (tests/golden/clip_text_t5, made by make_text_t5_golden.py):
        CLIPTextModel weights without the text_model. prefix, tokenizers as tokenizer.json +
        tokenizer_config.json only. SD 1.x (the first encoder alone) and SDXL cache the same text
        records, keys and bytes, as the hub layout of the same weights, and the same latent records."""
        golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "clip_text_t5")
        jl = self.bucketed("t5.jsonl")
        for variant, parts in (("sd1", ("text_encoder", "tokenizer")), ("sdxl", None)):
            dumps = []
            for layout in ("hub", "t5"):
                model = os.path.join(golden, layout)
                if parts:
                    model = os.path.join(self.tmp, "%s-%s" % (variant, layout))
                    for p in parts:
                        shutil.copytree(os.path.join(golden, layout, p), os.path.join(model, p))
                s = os.path.join(self.tmp, "%s-%s.shard" % (variant, layout))
                _, _, err = sh(LATENTS, "--vae", VAE, "--text", model, "-o", s, jl)
                self.assertIn("SDXL" if variant == "sdxl" else "SD 1.x", err)
                self.assertEqual(entries(s, "text"), self.distinct, err)
                dumps.append((dump(s, "text"), dump(s, "latents")))
            self.assertEqual(dumps[0], dumps[1], variant)

    def test_missing_tokenizer_is_a_clear_error(self):
        jl = self.bucketed("t.jsonl")
        bad = os.path.join(self.tmp, "notok")
        shutil.copytree(os.path.join(self.sd1, "text_encoder"), os.path.join(bad, "text_encoder"))
        code, _, err = sh(LATENTS, "--vae", VAE, "--text", bad, "-o", os.path.join(self.tmp, "x.shard"), jl, ok=(3,))
        self.assertIn("tokenizer", err)


    def variants_stream(self, name, extra):
        """The bucketed stream (usable records only) with sd-meta's "captions":
        image i gets its caption first, then extra(i)."""
        jl = self.bucketed(name + ".base.jsonl")
        path = os.path.join(self.tmp, name)
        with open(jl, "rb") as f, open(path, "wb") as g:
            for line in f:
                if b"\xff" in line:
                    continue
                r = json.loads(line)
                r["captions"] = [r["caption"]] + extra(int(r["key"][1:]))
                g.write((json.dumps(r) + "\n").encode())
        return path

    def test_caption_variants(self):
        """sd-meta --caption-variants' "captions": each distinct variant embedded
        once, a variants entry per record (its text_ref first, every key stored);
        changed variants rewrite the entry alone; sd-verify finds a variant whose
        embedding is gone and --repair keeps the record; sd-pack merge and split
        keep the variants."""
        extra = lambda i: ["%s, v%d" % (self.caps[i % 6].decode(), k) for k in range(1 + i % 3)] + ["a cat"]
        jl = self.variants_stream("var.jsonl", extra)
        with open(jl) as f:
            recs = [json.loads(l) for l in f]
        texts = {c for r in recs for c in [r["caption"]] + r["captions"]} | {""}
        s = os.path.join(self.tmp, "var.shard")
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "--text-batch", "5", "-o", s, jl)
        m = re.search(r"text: (\d+) captions looked up, (\d+) embeddings computed", err)
        self.assertEqual(int(m.group(2)), len(texts), err)
        self.assertEqual(entries(s, "text"), len(texts))
        self.assertEqual(entries(s, "variants"), len(recs))
        by_key = dict(zip(dump(s, "latents")[0::2], dump(s, "latents")[1::2]))
        stored = set(dump(s, "text")[0::2])
        var = dict(zip(dump(s, "variants")[0::2], dump(s, "variants")[1::2]))
        for k, v in var.items():
            refs = [v.strip()[i:i + 32] for i in range(0, len(v.strip()), 32)]
            self.assertEqual(refs[0], by_key[k].strip()[128:160])  # the first is the record's text_ref
            self.assertTrue(all(" " + r in stored for r in refs))
            b = bytes.fromhex(by_key[k].strip())
            i = int(b[256:256 + struct.unpack("<H", b[12:14])[0]].decode()[1:])
            self.assertEqual(len(refs), len({self.caps[i % 6].decode()} | set(extra(i))))
        _, _, verr = sh(VERIFY, s)
        self.assertIn("0 problems", verr)
        # sd-pack info counts them (it did not show the variants at all)
        nrefs = sum(len(v.strip()) // 32 for v in var.values())
        _, out, _ = sh(PACK, "info", "--json", s)
        lat = json.loads(out.splitlines()[0])["latents"]
        self.assertEqual((lat["with_variants"], lat["variants"]), (len(var), nrefs))
        _, out, _ = sh(PACK, "info", s)
        self.assertIn("caption variants on %d (%d variants)" % (len(var), nrefs), out)
        # --text-only on a shard made without --text attaches the same variants
        bare = os.path.join(self.tmp, "var.bare")
        sh(LATENTS, "--vae", VAE, "-o", bare, jl)
        self.assertEqual(entries(bare, "variants"), 0)
        sh(LATENTS, "--text", self.sd1, "--text-only", "-o", bare, jl)
        self.assertEqual(dump(bare, "variants"), dump(s, "variants"))
        self.assertEqual(dump(bare, "text"), dump(s, "text"))
        # a rerun with other variants for i00: its entry alone is rewritten, no image encoded
        lat0 = dump(s, "latents")
        jl2 = self.variants_stream("var2.jsonl", lambda i: extra(i) + (["a new variant"] if i == 0 else []))
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", s, jl2)
        self.assertIn("1 records kept their latents and caption and now refer to their new caption variants", err)
        self.assertEqual(dump(s, "latents"), lat0)
        var2 = dict(zip(dump(s, "variants")[0::2], dump(s, "variants")[1::2]))
        self.assertEqual(sum(var2[k] != var[k] for k in var), 1)
        self.assertEqual(entries(s, "text"), len(texts) + 1)
        _, _, err = sh(LATENTS, "--vae", VAE, "--text", self.sd1, "-o", s, jl2)
        self.assertIn("nothing to do", err)
        # sd-pack merge and split keep every entry and the embeddings they name
        if PACK:
            mg = os.path.join(self.tmp, "var.merged")
            sh(PACK, "merge", "-q", "-o", mg, s)
            self.assertEqual(dump(mg, "variants"), dump(s, "variants"))
            self.assertEqual(dump(mg, "text"), dump(s, "text"))
            parts = os.path.join(self.tmp, "var-part-%d.shard")
            sh(PACK, "split", "-q", "-n", "2", "-o", parts, s)
            got = []
            for p in range(2):
                got += dump(parts % p, "variants")
                _, _, verr = sh(VERIFY, parts % p)
                self.assertIn("0 problems", verr)
            self.assertEqual(sorted(zip(got[0::2], got[1::2])), sorted(var2.items()))
        # a variant whose embedding is gone: reported; --repair keeps the record and its other variants
        k0 = sorted(var2)[0]
        bad = var2[k0].strip()[:-32] + "ff" * 16
        head = [l for l in subprocess.run(["mdb_dump", "-n", "-s", "variants", s], capture_output=True,
                                          text=True).stdout.splitlines()]
        load = os.path.join(self.tmp, "var.load")
        with open(load, "w") as f:
            f.write("\n".join(head[:head.index("HEADER=END") + 1] + [k0, " " + bad, "DATA=END"]) + "\n")
        sh("mdb_load", "-n", "-s", "variants", "-f", load, s)
        code, _, verr = sh(VERIFY, s, ok=(1,))
        self.assertRegex(verr, r"1\s+variant_missing")
        _, _, verr = sh(VERIFY, "--repair", s, ok=(1,))  # problems were found (and repaired)
        self.assertIn("1 problems (repaired)", verr)
        fixed = dict(zip(dump(s, "variants")[0::2], dump(s, "variants")[1::2]))
        self.assertEqual(fixed[k0].strip(), var2[k0].strip()[:-32])
        self.assertEqual(dump(s, "latents"), lat0)
        _, _, verr = sh(VERIFY, s)
        self.assertIn("0 problems", verr)


if __name__ == "__main__":
    if len(sys.argv) < 7:
        sys.exit(__doc__)
    META, BUCKET, LATENTS, VERIFY, VAE, TOKDIR = sys.argv[1:7]
    if len(sys.argv) > 8 and not sys.argv[7].startswith("-"):
        PACK, TRAIN = sys.argv.pop(7), sys.argv.pop(7)
    unittest.main(argv=sys.argv[:1] + sys.argv[7:], verbosity=2)
