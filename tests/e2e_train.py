#!/usr/bin/env python3
"""End-to-end tests of sd-train on a generated shard (test_train
--make-shard) with the tiny golden SD1 UNet: a run killed with SIGKILL
after a checkpoint and rerun (it resumes from -o DIR/latest) ends with
weights, EMA weights and training state byte-identical to an uninterrupted run; SIGTERM
saves a checkpoint and exits 0, and the rerun again ends identical;
metrics lines are written; the checkpoint's unet/ loads back (a second run
from it trains on); a model from --unet-config alone trains and its loss
falls; bad usage exits 2; a killed save's temporary files never reach a
checkpoint; several copies started by a launcher without an MPI world are refused.
Usage: e2e_train.py SD_TRAIN TEST_TRAIN UNET_DIR [TEST...]"""
import json
import math
import struct
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from train_ckpt import ckpt_bytes, latest

TRAIN = MAKE = UNET = None
COMMON = ["--batch", "2", "--accum", "2", "--steps", "10", "--save-every", "2", "--keep", "0", "--seed", "5",
          "--lr", "1e-3", "--lr-schedule", "cosine", "--warmup", "2", "--dropout", "0.2", "--snr-gamma", "5",
          "--prediction", "v_prediction", "--ema-decay", "0.99", "-j", "1", "-q"]


def run(*args, ok=(0,)):
    """Run sd-train; returns (code, stderr); asserts the code."""
    p = subprocess.run([TRAIN] + [str(a) for a in args], capture_output=True)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stderr.decode()


def st_header(path):
    """A safetensors file's JSON header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def st_without_metadata(src, dst):
    """A copy of a safetensors file without its __metadata__ (as another tool writes one)."""
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    head.pop("__metadata__", None)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def final(out, step=10):
    """The reference run's checkpoint files: by default the last of COMMON's 10 steps."""
    return ckpt_bytes(out, step)


def state_meta(out, step):
    """The metadata of checkpoint-STEP's state file."""
    with open(os.path.join(out, "checkpoint-%d" % step, "state.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: an independent check of the writer's."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xFFFFFFFF


def pb_fields(b):
    """(field, wire type, value) of a protobuf message: varint, fixed64, bytes, fixed32."""
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((f, wt, v))
    return out


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def tb_scalars(*paths):
    """The TFRecord frames of event files read in turn, CRCs checked: the file_version, {tag: [(step, value)]}
    and the steps of the SessionLog START events. A START at step S drops the scalars read so far with a
    step >= S, as TensorBoard's reader does (EventAccumulator's purge of orphaned data)."""
    version, scalars, starts = None, {}, []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            (lc,) = struct.unpack("<I", data[i + 8:i + 12])
            assert lc == masked(crc32c(data[i:i + 8])), "length CRC"
            rec = data[i + 12:i + 12 + n]
            (dc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
            assert dc == masked(crc32c(rec)), "data CRC"
            i += 16 + n
            step = 0
            for f, wt, v in pb_fields(rec):
                if f == 2:
                    step = v
                elif f == 3:
                    version = v.decode()
                elif f == 5:
                    for sf, _, sv in pb_fields(v):
                        fields = {ff: vv for ff, _, vv in pb_fields(sv)}
                        scalars.setdefault(fields[1].decode(), []).append((step, struct.unpack("<f", fields[2])[0]))
                elif f == 7 and dict((ff, vv) for ff, _, vv in pb_fields(v)).get(1) == 1:
                    starts.append(step)
                    scalars = {t: [(st, x) for st, x in sv if st < step] for t, sv in scalars.items()}
    return version, scalars, starts


def tb_scalar_frame(step, tag, value):
    """One TFRecord frame holding Event{step, Summary{Value{tag, simple_value}}}, written here independently
    of tb_events.c, to stand for what a killed run logged after its checkpoint."""
    def key_bytes(field, b):
        return bytes([field << 3 | 2]) + vbytes(len(b)) + b
    def vbytes(v):
        out = b""
        while v >= 0x80:
            out += bytes([v & 0x7F | 0x80])
            v >>= 7
        return out + bytes([v])
    val = key_bytes(1, tag.encode()) + bytes([2 << 3 | 5]) + struct.pack("<f", value)
    rec = bytes([2 << 3 | 0]) + vbytes(step) + key_bytes(5, key_bytes(1, val))
    n = struct.pack("<Q", len(rec))
    return n + struct.pack("<I", masked(crc32c(n))) + rec + struct.pack("<I", masked(crc32c(rec)))


class Train(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.shard = os.path.join(cls.tmp.name, "cache.shard")
        subprocess.run([MAKE, "--make-shard", cls.shard], check=True)
        cls.ref = os.path.join(cls.tmp.name, "ref")
        run("--unet", UNET, "-o", cls.ref, "--metrics", os.path.join(cls.tmp.name, "m.jsonl"), *COMMON, cls.shard)
        cls.want = final(cls.ref)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def interrupted(self, name, sig):
        """Start a run, send sig once a checkpoint before the end exists,
        rerun to the end; the result must equal the reference run."""
        out = os.path.join(self.tmp.name, name)
        m, tb = out + ".jsonl", out + ".tb"
        p = subprocess.Popen([TRAIN, "--unet", UNET, "-o", out, "--metrics", m, "--tensorboard", tb] + COMMON +
                             [self.shard], stderr=subprocess.PIPE)
        t0 = time.time()
        while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
            time.sleep(0.005)
        p.send_signal(sig)
        _, err = p.communicate()
        stopped_at = latest(out)
        self.assertGreaterEqual(stopped_at, 2, err.decode())
        if sig == signal.SIGTERM:
            self.assertEqual(p.returncode, 0, err.decode())
        else:
            self.assertEqual(p.returncode, -signal.SIGKILL)
        self.assertLess(stopped_at, 10, "the run finished before the signal: nothing was tested")
        # what a run killed after its checkpoint leaves: lines for steps the resume redoes, the
        # last one cut short
        with open(m, "a") as f:
            f.write('{"step": %d, "loss": 1e9}\n{"step": %d, "lo' % (stopped_at + 1, stopped_at + 2))
        with open(m) as f:
            before = [l for l in f.read().splitlines() if not l.endswith("}") or json.loads(l)["step"] > stopped_at]
        first_tb = os.listdir(tb)
        self.assertEqual(len(first_tb), 1)
        with open(os.path.join(tb, first_tb[0]), "ab") as f:
            f.write(tb_scalar_frame(stopped_at + 1, "train/loss", 1e9))
        self.assertGreaterEqual(len(before), 2)
        time.sleep(1.1)  # the resumed run's event file gets a later name (its second), as after any real kill
        _, err = run("--unet", UNET, "-o", out, "--metrics", m, "--tensorboard", tb, *COMMON, self.shard)
        self.assertIn("moved to %s.superseded" % m, err)
        # each step once, with the uninterrupted run's losses; the earlier lines kept aside
        with open(m) as f:
            lines = [json.loads(l) for l in f]
        self.assertEqual([l["step"] for l in lines], list(range(1, 11)))
        with open(os.path.join(self.tmp.name, "m.jsonl")) as f:
            ref = [json.loads(l) for l in f]
        self.assertEqual([l["loss"] for l in lines], [l["loss"] for l in ref])
        with open(m + ".superseded") as f:
            self.assertEqual(f.read().splitlines(), before)
        # TensorBoard, reading the two event files in name order, shows each step once: the resumed
        # run's START at stopped_at + 1 drops what the first run logged from there on
        files = sorted(os.listdir(tb))
        self.assertEqual(len(files), 2, files)
        _, sc, starts = tb_scalars(*[os.path.join(tb, f) for f in files])
        self.assertEqual(starts, [0, stopped_at + 1])
        self.assertEqual([st for st, _ in sc["train/loss"]], list(range(1, 11)))
        for (_, v), l in zip(sc["train/loss"], lines):
            self.assertLessEqual(abs(v - l["loss"]), 1.2e-7 * abs(l["loss"]))
        got = final(out)
        self.assertTrue(got[0] == self.want[0], "weights differ from the uninterrupted run")
        self.assertTrue(got[1] == self.want[1], "EMA weights differ from the uninterrupted run")
        self.assertTrue(got[2] == self.want[2], "training state differs from the uninterrupted run")
        return stopped_at

    def test_kill_resume(self):
        self.interrupted("killed", signal.SIGKILL)

    def test_kill_resume_with_caption_variants(self):
        """Records with 2..5 caption variants (one drawn per record and epoch):
        the variants are trained on (other weights than the same shard without
        them), and a run killed with SIGKILL after a checkpoint and rerun ends
        byte-identical to an uninterrupted one."""
        shard = os.path.join(self.tmp.name, "variants.shard")
        subprocess.run([MAKE, "--make-shard-with-variants", shard], check=True)
        ref = os.path.join(self.tmp.name, "vref")
        _, err = run("--unet", UNET, "-o", ref, *[a for a in COMMON if a != "-q"], shard)
        # the start says so: 13 of the 14 records have 2..5 variants (tests/test_train.c)
        self.assertIn("caption variants: 13 of 14 records have them, 44 variants in all", err)
        self.assertIn("loss masks: none", err)
        want = final(ref)
        self.assertTrue(want[0] != self.want[0], "the caption variants were not trained on")
        out = os.path.join(self.tmp.name, "vkilled")
        p = subprocess.Popen([TRAIN, "--unet", UNET, "-o", out] + COMMON + [shard], stderr=subprocess.PIPE)
        t0 = time.time()
        while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
        _, err = p.communicate()
        stopped_at = latest(out)
        self.assertEqual(p.returncode, -signal.SIGKILL, err.decode())
        self.assertTrue(2 <= stopped_at < 10, "killed at step %d: nothing was tested" % stopped_at)
        run("--unet", UNET, "-o", out, *COMMON, shard)
        got = final(out)
        self.assertTrue(got[0] == want[0], "weights differ from the uninterrupted run")
        self.assertTrue(got[1] == want[1], "EMA weights differ from the uninterrupted run")
        self.assertTrue(got[2] == want[2], "training state differs from the uninterrupted run")

    def test_term_resume(self):
        self.interrupted("termed", signal.SIGTERM)

    def test_metrics(self):
        with open(os.path.join(self.tmp.name, "m.jsonl")) as f:
            lines = [json.loads(l) for l in f]
        self.assertEqual([l["step"] for l in lines], list(range(1, 11)))
        self.assertEqual(lines[0]["lr"], 0.0)  # warmup starts at 0, as diffusers
        self.assertTrue(all(l["images"] > 0 and l["loss"] > 0 for l in lines))

    def test_gradient_checkpointing(self):
        """--gradient-checkpointing recomputes blocks in the backward: the same training bit for
        bit (weights, EMA, state), and a run may switch it on or off when it resumes."""
        out = os.path.join(self.tmp.name, "ckpt-on")
        run("--unet", UNET, "-o", out, "--gradient-checkpointing", *COMMON, self.shard)
        self.assertEqual(final(out), self.want)
        out2 = os.path.join(self.tmp.name, "ckpt-off-from-4")
        run("--unet", UNET, "-o", out2, "--resume", os.path.join(out, "checkpoint-4"), *COMMON, self.shard)
        self.assertEqual(final(out2), self.want)

    def test_continue_from_checkpoint_unet(self):
        """A checkpoint's unet/ is a diffusers folder: train on from it."""
        out = os.path.join(self.tmp.name, "cont")
        run("--unet", os.path.join(self.ref, "checkpoint-10"), "-o", out, "--steps", "2", "-q", self.shard)
        self.assertEqual(latest(out), 2)

    def test_prediction_from_scheduler(self):
        """A model folder's scheduler/scheduler_config.json sets the target (SD 2.x 768-v models
        are v-prediction), for the folder or its unet/; --prediction wins, with a warning."""
        m = os.path.join(self.tmp.name, "model")
        shutil.copytree(os.path.join(UNET, "unet"), os.path.join(m, "unet"))
        os.makedirs(os.path.join(m, "scheduler"))
        cfg = os.path.join(m, "scheduler", "scheduler_config.json")
        with open(cfg, "w") as f:
            json.dump({"_class_name": "DDPMScheduler", "prediction_type": "v_prediction"}, f)
        for i, path in enumerate((m, os.path.join(m, "unet"))):
            out = os.path.join(self.tmp.name, "pred%d" % i)
            _, err = run("--unet", path, "-o", out, "--steps", "1", "-j", "1", self.shard)
            self.assertEqual(state_meta(out, 1)["prediction"], "v_prediction")
            self.assertIn("prediction v_prediction (from", err)
        out = os.path.join(self.tmp.name, "pred-given")
        _, err = run("--unet", m, "--prediction", "epsilon", "-o", out, "--steps", "1", "-j", "1", "-q", self.shard)
        self.assertEqual(state_meta(out, 1)["prediction"], "epsilon")
        self.assertIn("--prediction epsilon, but", err)
        out = os.path.join(self.tmp.name, "pred-none")  # the golden folder has no scheduler
        run("--unet", UNET, "-o", out, "--steps", "1", "-j", "1", "-q", self.shard)
        self.assertEqual(state_meta(out, 1)["prediction"], "epsilon")
        with open(cfg, "w") as f:
            json.dump({"prediction_type": "sample"}, f)
        _, err = run("--unet", m, "-o", os.path.join(self.tmp.name, "pred-x"), "--steps", "1", self.shard, ok=(2,))
        self.assertIn("prediction_type 'sample'", err)

    def test_from_scratch_loss_falls(self):
        out = os.path.join(self.tmp.name, "scratch")
        m = os.path.join(self.tmp.name, "scratch.jsonl")
        run("--unet-config", os.path.join(UNET, "unet", "config.json"), "--init-seed", "3", "-o", out,
            "--steps", "60", "--batch", "4", "--lr", "3e-3", "--metrics", m, "-q", self.shard)
        with open(m) as f:
            loss = [json.loads(l)["loss"] for l in f]
        first, last = sum(loss[:10]) / 10, sum(loss[-10:]) / 10
        print("from scratch: mean loss of steps 1-10 %.4f, 51-60 %.4f" % (first, last), file=sys.stderr)
        self.assertLess(last, 0.8 * first)

    def test_validation(self):
        """--val: the loss on a held-out shard at the start, every --val-every steps and at the
        end; it depends on the weights only (two seeds with lr 0 give the same values), it
        falls as the model trains, and it never changes the training itself."""
        vals = []
        for seed in (1, 2):
            out = os.path.join(self.tmp.name, "val%d" % seed)
            m = out + ".jsonl"
            run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "2", "--lr", "0", "--seed", seed,
                "--val", self.shard, "--val-every", "2", "--metrics", m, "-q", self.shard)
            with open(m) as f:
                rows = [r for r in map(json.loads, f) if "val_loss" in r]
            vals.append([(r["step"], r["val_loss"]) for r in rows])
            # the generated shard: 14 records, one with a NaN latent and one without its text (skipped):
            # every usable record exactly once
            self.assertEqual({r["val_images"] for r in rows}, {12})
        self.assertEqual([s for s, _ in vals[0]], [0, 2, 4])
        self.assertEqual(vals[0], vals[1])
        self.assertEqual(len(set(v for _, v in vals[0])), 1)  # lr 0: the weights never move
        # nor on the batch size: each record's timestep and noise come from its own stream (they were
        # drawn per batch, so batch 1..4 gave losses 1% apart); only the sums' rounding differs
        by_batch = []
        for batch in (1, 3, 4):
            m = os.path.join(self.tmp.name, "valb%d.jsonl" % batch)
            run("--unet", UNET, "-o", os.path.join(self.tmp.name, "valb%d" % batch), "--steps", "0", "--batch", batch,
                "--val", self.shard, "--metrics", m, "-j", "1", "-q", self.shard)
            with open(m) as f:
                by_batch.append([r["val_loss"] for r in map(json.loads, f) if "val_loss" in r][0])
        for v in by_batch + [vals[0][0][1]]:
            self.assertAlmostEqual(v, by_batch[0], delta=1e-5 * abs(by_batch[0]), msg=by_batch)
        out = os.path.join(self.tmp.name, "val-train")
        m = out + ".jsonl"
        run("--unet", UNET, "-o", out, "--val", self.shard, "--metrics", m, *COMMON, self.shard)
        with open(m) as f:
            v = [r["val_loss"] for r in map(json.loads, f) if "val_loss" in r]
        print("validation loss: start %.5f, end %.5f" % (v[0], v[-1]), file=sys.stderr)
        self.assertLess(v[-1], v[0])
        self.assertEqual(final(out), self.want)  # the same training (and state) as without --val
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--val", "/nonexistent.shard",
                        self.shard, ok=(3,))
        self.assertIn("nonexistent", err)

    def test_config(self):
        """--config FILE (grouped or flat keys) and --set KEY=VALUE: the file, then the command line,
        then --set; every checkpoint holds the effective options as train_config.json, and a run
        started from that file alone repeats the run byte for byte."""
        cfg = os.path.join(self.tmp.name, "cfg.json")
        with open(cfg, "w") as f:
            json.dump({"_comment": "grouped keys: the last part names the option",
                       "model": {"unet": UNET}, "optimizer": {"lr": 0.5, "weight_decay": 0.05},
                       "data": {"batch": 2}, "steps": 4, "ema": {"ema_decay": 0.9}, "seed": 7, "quiet": True}, f)
        out = os.path.join(self.tmp.name, "cfg-run")
        # the command line's --lr beats the file's, --set beats both
        run("--config", cfg, "--lr", "0.1", "--set", "optimizer.lr=2e-3", "-o", out, "-j", "1", self.shard)
        with open(os.path.join(out, "checkpoint-4", "train_config.json")) as f:
            eff = json.load(f)
        self.assertEqual(eff["lr"], 2e-3)
        self.assertEqual(eff["weight-decay"], 0.05)
        self.assertEqual((eff["batch"], eff["steps"], eff["seed"], eff["ema-decay"]), (2, 4, 7, 0.9))
        self.assertEqual(eff["_shards"], [self.shard])
        again = os.path.join(self.tmp.name, "cfg-again")
        run("--config", os.path.join(out, "checkpoint-4", "train_config.json"), "--set", "output=" + again,
            self.shard)
        self.assertEqual(final(again, 4), final(out, 4))
        for bad in ({"optimizer": {"no_such_option": 1}}, {"lr": True}, {"quiet": "yes"}, [1, 2]):
            with open(cfg, "w") as f:
                json.dump(bad, f)
            code, err = run("--config", cfg, "-o", out, self.shard, ok=(2,))
            self.assertIn(cfg, err)
        code, err = run("--config", "/nonexistent.json", "-o", out, self.shard, ok=(2,))
        code, err = run("--unet", UNET, "--set", "lr", "-o", out, self.shard, ok=(2,))
        self.assertIn("KEY=VALUE", err)
        # a false flag turns off an earlier source's; --set before "--" still applies; run control
        # (fresh, resume) is never written to the effective file
        with open(cfg, "w") as f:
            json.dump({"unet": UNET, "steps": 2, "batch": 2, "no_flip": True, "quiet": True}, f)
        out2 = os.path.join(self.tmp.name, "cfg-flag")
        run("--config", cfg, "--set", "no-flip=false", "--fresh", "-o", out2, "--", self.shard)
        with open(os.path.join(out2, "checkpoint-2", "train_config.json")) as f:
            eff = json.load(f)
        self.assertIs(eff["no-flip"], False)
        self.assertNotIn("fresh", eff)
        self.assertNotIn("resume", eff)

    def test_tensorboard(self):
        """--tensorboard DIR: an event file TensorBoard reads (read back here by an independent
        TFRecord/protobuf reader with the CRCs checked): loss, smoothed loss, lr and gradient norm
        every step and the validation loss, equal to the metrics file's values in float32."""
        out = os.path.join(self.tmp.name, "tb-run")
        tb = os.path.join(self.tmp.name, "tb", "logs")  # parents made as needed
        m = out + ".jsonl"
        run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "2", "--val", self.shard, "--val-every", "2",
            "--metrics", m, "--tensorboard", tb, "-q", self.shard)
        files = os.listdir(tb)
        self.assertEqual(len(files), 1)
        self.assertTrue(files[0].startswith("events.out.tfevents."))
        version, sc, starts = tb_scalars(os.path.join(tb, files[0]))
        self.assertEqual(version, "brain.Event:2")
        self.assertEqual(starts, [0])
        self.assertEqual(sorted(sc), ["train/grad_norm", "train/loss", "train/loss_smooth", "train/lr", "val/loss"])
        with open(m) as f:
            rows = [json.loads(l) for l in f]
        train = [r for r in rows if "loss" in r]
        val = [r for r in rows if "val_loss" in r]
        def same(tag, rows, key):  # float32 of the value against the metrics' 9-digit decimal of the double
            got = sc[tag]
            self.assertEqual([st for st, _ in got], [r["step"] for r in rows], tag)
            for (_, v), r in zip(got, rows):
                self.assertLessEqual(abs(v - r[key]), 1.2e-7 * abs(r[key]), tag)
        same("train/loss", train, "loss")
        same("train/grad_norm", train, "grad_norm")
        same("val/loss", val, "val_loss")
        self.assertEqual([st for st, _ in sc["val/loss"]], [0, 2, 4])
        # the finished run started again takes no step and validates nothing new: step 4's validation
        # is neither logged twice to TensorBoard nor to the metrics file
        time.sleep(1.1)  # a second event file
        run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "2", "--val", self.shard, "--val-every", "2",
            "--metrics", m, "--tensorboard", tb, "-q", self.shard)
        files = sorted(os.listdir(tb))
        self.assertEqual(len(files), 2)
        _, sc, starts = tb_scalars(*[os.path.join(tb, f) for f in files])
        self.assertEqual(starts, [0, 5])
        self.assertEqual([st for st, _ in sc["val/loss"]], [0, 2, 4])
        with open(m) as f:
            self.assertEqual([r["step"] for r in map(json.loads, f) if "val_loss" in r], [0, 2, 4])
        # a run of 0 steps (checkpoint-0) started again: step 0's baseline is not validated twice either
        out0 = os.path.join(self.tmp.name, "tb-run0")
        for _ in range(2):
            run("--unet", UNET, "-o", out0, "--steps", "0", "--batch", "2", "--val", self.shard, "--metrics",
                out0 + ".jsonl", "-q", self.shard)
        with open(out0 + ".jsonl") as f:
            self.assertEqual([r["step"] for r in map(json.loads, f) if "val_loss" in r], [0])

    def test_save_single(self):
        """--save-single: each checkpoint also holds unet.safetensors and unet_ema.safetensors with the
        original model.diffusion_model.* names and the config in their metadata; loaded back alone
        they give the same loss as the checkpoint's diffusers folders."""
        out = os.path.join(self.tmp.name, "single")
        run("--unet", UNET, "-o", out, "--steps", "2", "--batch", "2", "--ema-decay", "0.9", "--save-single",
            "--save-dtype", "bf16", "-q", self.shard)
        ck = os.path.join(out, "checkpoint-2")
        head = st_header(os.path.join(ck, "unet.safetensors"))
        names = [k for k in head if k != "__metadata__"]
        self.assertTrue(names and all(k.startswith("model.diffusion_model.") for k in names))
        self.assertTrue(all(head[k]["dtype"] == "BF16" for k in names))
        with open(os.path.join(ck, "unet", "config.json")) as f:
            self.assertEqual(head["__metadata__"]["unet_config"], f.read())
        for sub in ("unet", "unet_ema"):
            losses = []
            for model in (os.path.join(ck, sub), os.path.join(ck, sub + ".safetensors")):
                m = os.path.join(self.tmp.name, "single-%s-%d.jsonl" % (sub, len(losses)))
                _, err = run("--unet", model, "-o", os.path.join(self.tmp.name, "single-load-%s-%d" % (sub, len(losses))),
                             "--steps", "2", "--batch", "2", "--lr", "0", "--metrics", m, self.shard)
                self.assertNotIn("inferred", err)
                with open(m) as f:
                    losses.append([json.loads(l)["loss"] for l in f])
            self.assertEqual(losses[0], losses[1], sub)
        # a file without that metadata (another tool's): the config the weights imply guesses 32 norm
        # groups (this UNet has 4): the error names the file and says what to give
        bare = os.path.join(self.tmp.name, "bare.safetensors")
        st_without_metadata(os.path.join(ck, "unet.safetensors"), bare)
        code, err = run("--unet", bare, "-o", os.path.join(self.tmp.name, "single-nocfg"), "--steps", "1", "-q",
                        self.shard, ok=(3,))
        self.assertIn(bare + ": UNet config: 8 channels not divisible by 32 norm groups "
                      "(the config was inferred from the weights", err)
        self.assertIn("sd-train --unet-config", err)

    def test_single_file_keeps_its_heads(self):
        """A single file sd-train wrote for a model whose heads are not what the widths suggest (32
        channels, 2 heads of 16) loads as that model: its metadata carries the config. Without the
        metadata the config is inferred, 8 heads a block: a warning says what was guessed, and the
        loss shows it is another model."""
        cfg = os.path.join(self.tmp.name, "heads2.json")
        with open(os.path.join(UNET, "unet", "config.json")) as f:
            c = json.load(f)
        c.update(block_out_channels=[32, 32, 32], norm_num_groups=32, attention_head_dim=2)
        with open(cfg, "w") as f:
            json.dump(c, f)
        out = os.path.join(self.tmp.name, "heads2")
        run("--unet-config", cfg, "--init-seed", "3", "-o", out, "--steps", "0", "--save-single", "-q", self.shard)
        ck = os.path.join(out, "checkpoint-0")
        bare = os.path.join(self.tmp.name, "heads2-bare.safetensors")
        st_without_metadata(os.path.join(ck, "unet.safetensors"), bare)
        losses, errs = [], []
        for i, model in enumerate((os.path.join(ck, "unet"), os.path.join(ck, "unet.safetensors"), bare)):
            m = os.path.join(self.tmp.name, "heads2-%d.jsonl" % i)
            _, err = run("--unet", model, "-o", os.path.join(self.tmp.name, "heads2-load-%d" % i), "--steps", "2",
                         "--batch", "2", "--lr", "0", "--metrics", m, self.shard)
            with open(m) as f:
                losses.append([json.loads(l)["loss"] for l in f])
            errs.append(err)
        self.assertEqual(losses[0], losses[1])
        self.assertNotIn("inferred", errs[1])
        self.assertIn(bare + ": no config.json and no unet_config in the file's metadata: the UNet config is "
                      "inferred from the weights, which do not show attention_head_dim (guessed [8, 8, 8])", errs[2])
        self.assertNotEqual(losses[0], losses[2])

    def test_checkpoint_config_is_what_diffusers_writes(self):
        """A checkpoint's unet/config.json has every key diffusers' save_config writes, in its order
        and layout, _diffusers_version included, and floats as written (norm_eps 1e-05, not
        9.999999747378752e-06): the tiny golden UNet's config as diffusers 0.42.1 writes it."""
        out = os.path.join(self.tmp.name, "cfgtext")
        run("--unet", UNET, "-o", out, "--steps", "0", "-q", self.shard)
        with open(os.path.join(out, "checkpoint-0", "unet", "config.json")) as f:
            text = f.read()
        with open(os.path.join(os.path.dirname(UNET), "configs", "sd15.json")) as f:
            keys = list(json.load(f))
        got = json.loads(text)
        self.assertEqual(list(got), keys)
        self.assertEqual(got["_diffusers_version"], "0.42.1")
        self.assertIn('\n  "norm_eps": 1e-05,\n', text)
        self.assertIn('\n  "dropout": 0.0,\n', text)
        self.assertEqual(text, json.dumps(got, indent=2, sort_keys=True) + "\n")  # Python's layout
        with open(os.path.join(UNET, "unet", "config.json")) as f:
            src = json.load(f)
        for k, v in src.items():  # the golden UNet's own config, per-block values as lists
            if k in ("attention_head_dim", "transformer_layers_per_block", "layers_per_block") and isinstance(v, int):
                v = [v] * len(src["block_out_channels"])
            self.assertEqual(got[k], v, k)

    def test_fresh_keeps_its_checkpoints(self):
        """--fresh in a directory with a longer earlier run: --keep prunes only this run's
        checkpoints (never the one just written, which latest names), and leaves the
        earlier run's later steps alone."""
        out = os.path.join(self.tmp.name, "fresh")
        run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "2", "--save-every", "2", "--keep", "1", "-q",
            self.shard)
        self.assertEqual(sorted(os.listdir(out)), ["checkpoint-4", "latest"])
        run("--unet", UNET, "-o", out, "--steps", "2", "--batch", "2", "--keep", "1", "--fresh", "-q", self.shard)
        self.assertEqual(sorted(os.listdir(out)), ["checkpoint-2", "checkpoint-4", "latest"])
        self.assertEqual(latest(out), 2)

    def test_output_with_a_trailing_slash(self):
        """-o run/ (as the README writes it): the checkpoints are named run/checkpoint-N in the
        log, not run//checkpoint-N, and a rerun resumes from them."""
        out = os.path.join(self.tmp.name, "slash") + "/"
        _, err = run("--unet", UNET, "-o", out, "--steps", "2", "--batch", "2", "--save-every", "1", self.shard)
        self.assertIn("saved " + out + "checkpoint-2", err)
        self.assertNotIn("//", err.replace("://", ""))
        self.assertEqual(latest(out), 2)
        _, err = run("--unet", UNET, "-o", out, "--steps", "2", "--batch", "2", self.shard)
        self.assertNotIn("//", err.replace("://", ""))

    def test_foreign_checkpoints_left_alone(self):
        """checkpoint-N directories another tool wrote into -o (diffusers' scripts use the same
        names, with a unet/ of the same file names inside) are named at the start, neither
        counted nor removed by --keep, and a save of the same step sets the old one aside
        instead of deleting its weights. A checkpoint saved before the ownership mark existed
        (an sdtk state, no mark) is still the trainer's to prune."""
        out = os.path.join(self.tmp.name, "foreign")
        weights = {}
        for step in (1, 3, 4):
            d = os.path.join(out, "checkpoint-%d" % step, "unet")
            os.makedirs(d)
            for name in ("config.json", "diffusion_pytorch_model.safetensors"):
                with open(os.path.join(d, name), "w") as f:
                    f.write("someone's %s %d" % (name, step))
                weights[os.path.join("checkpoint-%d" % step, "unet", name)] = "someone's %s %d" % (name, step)
        with open(os.path.join(out, "checkpoint-3", "optimizer.bin"), "w") as f:
            f.write("opt")
        code, err = run("--unet", UNET, "-o", out, "--batch", "2", "--steps", "6", "--save-every", "2", "--keep", "1",
                        "-j", "1", "-q", self.shard)
        for step in (1, 3, 4):
            self.assertIn("checkpoint-%d: not a checkpoint of sd-train's" % step, err)
        kept = [n for n in os.listdir(out) if n.startswith("checkpoint-4.tmp-kept-")]
        self.assertEqual(len(kept), 1, os.listdir(out))
        for rel, text in weights.items():
            where = rel.replace("checkpoint-4", kept[0]) if rel.startswith("checkpoint-4") else rel
            with open(os.path.join(out, where)) as f:
                self.assertEqual(f.read(), text, where)
        self.assertEqual(sorted(n for n in os.listdir(out) if n not in kept),
                         ["checkpoint-1", "checkpoint-3", "checkpoint-6", "latest"])
        # an sdtk checkpoint without the mark (an older version's) still goes with --keep, and so
        # does one whose prune by an older version was killed after its state file went (its
        # train_config.json is left); an older version's killed save (checkpoint-N.tmp, unmarked,
        # its weights written) is cleared by the next save of that step, not set aside
        os.remove(os.path.join(out, "checkpoint-6", ".sdtk-checkpoint"))
        shutil.copytree(os.path.join(out, "checkpoint-6"), os.path.join(out, "checkpoint-5"))
        for name in (".sdtk-checkpoint", "state.safetensors"):
            f = os.path.join(out, "checkpoint-5", name)
            if os.path.exists(f):
                os.remove(f)
        shutil.copytree(os.path.join(out, "checkpoint-6", "unet"), os.path.join(out, "checkpoint-8.tmp", "unet"))
        code, err = run("--unet", UNET, "-o", out, "--batch", "2", "--steps", "8", "--save-every", "2", "--keep", "1",
                        "-j", "1", "-q", self.shard)
        self.assertNotIn("checkpoint-6: not a checkpoint", err)
        self.assertNotIn("checkpoint-5: not a checkpoint", err)
        self.assertNotIn("not the trainer's", err)
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-6")))
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-5")))
        self.assertEqual([n for n in os.listdir(out) if n.startswith("checkpoint-8.tmp")], [])
        self.assertTrue(os.path.exists(os.path.join(out, "checkpoint-8", ".sdtk-checkpoint")))

    def test_new_run_sets_an_earlier_runs_metrics_aside(self):
        """A new run given a metrics file that holds another run's lines (--fresh into the same
        -o, a --config round trip that carries the path) moves them to METRICS.superseded with
        a warning instead of appending a second copy of steps 1..N; --fresh with --resume is a
        usage error."""
        out, m = os.path.join(self.tmp.name, "again-metrics"), os.path.join(self.tmp.name, "again-metrics.jsonl")
        args = ["--unet", UNET, "-o", out, "--batch", "2", "--steps", "3", "-j", "1", "-q", "--metrics", m, self.shard]
        run(*args)
        code, err = run("--fresh", *args)
        self.assertIn("3 lines of an earlier run (this one is new, from step 0) moved to %s.superseded" % m, err)
        with open(m) as f:
            self.assertEqual([json.loads(l)["step"] for l in f], [1, 2, 3])
        with open(m + ".superseded") as f:
            self.assertEqual([json.loads(l)["step"] for l in f], [1, 2, 3])
        code, err = run("--fresh", "--resume", os.path.join(out, "checkpoint-3"), *args, ok=(2,))
        self.assertIn("--fresh starts over and --resume continues", err)

    def test_carry_is_a_resume_option(self):
        """Full or short last batches decide the data order: a checkpoint made with --no-carry
        resumes only with it (a clear error otherwise), and resumes fine with it."""
        out = os.path.join(self.tmp.name, "carry")
        run("--unet", UNET, "-o", out, "--steps", "2", "--batch", "4", "--no-carry", "-q", self.shard)
        code, err = run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "4", "-q", self.shard, ok=(3,))
        self.assertIn("--no-carry", err)
        run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "4", "--no-carry", "-q", self.shard)
        self.assertEqual(latest(out), 4)

    def test_epochs(self):
        """--epochs N becomes steps from the shard's buckets: 14 records in buckets of 5 and 9, batch
        2, accumulation 2: with full batches (the default) 7 batches an epoch, so 2 epochs are
        7 steps; with --no-carry 3 + 5 = 8 batches, 8 steps. The run ends there."""
        rest = COMMON[COMMON.index("--steps") + 2:]
        for extra, want in (([], 7), (["--no-carry"], 8)):
            out = os.path.join(self.tmp.name, "epochs%d" % want)
            code, err = run("--unet", UNET, "-o", out, "--batch", "2", "--accum", "2", "--epochs", "2", *extra,
                            *[a for a in rest if a != "-q"], self.shard)
            self.assertIn("= %d steps" % want, err)
            self.assertEqual(latest(out), want)
        # batch 16 is larger than both buckets: each is one short batch an epoch, 4 epochs = 8 steps,
        # and the saved cursor is at the end of the fourth epoch (epoch 3)
        out = os.path.join(self.tmp.name, "epochs-b16")
        code, err = run("--unet", UNET, "-o", out, "--batch", "16", "--epochs", "4", "-j", "1", self.shard)
        self.assertIn("= 8 steps", err)
        self.assertEqual(latest(out), 8)
        self.assertEqual(state_meta(out, 8)["epoch"], "3")

    def test_repeats(self):
        """SHARD@N counts each record N times an epoch (kohya's N_name folders): the 14
        records as @2 are 28, so one epoch at batch 2, accumulation 2 is (10 + 18) / 4 = 7
        steps, as two epochs of the plain shard; a bad count is refused, a file whose
        name holds '@' is taken whole."""
        rest = [a for a in COMMON[COMMON.index("--steps") + 2:] if a != "-q"]
        out = os.path.join(self.tmp.name, "rep")
        code, err = run("--unet", UNET, "-o", out, "--batch", "2", "--accum", "2", "--epochs", "1", *rest,
                        self.shard + "@2")
        self.assertIn("= 7 steps", err)
        self.assertIn("14 records, each 2 times an epoch", err)
        self.assertIn("28 records in 2 buckets", err)
        self.assertEqual(latest(out), 7)
        for bad in ("@0", "@x", "@10001", "@"):
            code, err = run("--unet", UNET, "-o", out + bad[1:], "--steps", "1", self.shard + bad, ok=(3,))
            self.assertTrue("repeat count" in err or "cannot open" in err or "No such file" in err, err)
        at = os.path.join(self.tmp.name, "with@3")
        shutil.copyfile(self.shard, at)
        code, err = run("--unet", UNET, "-o", out + "at", "--steps", "1", "--batch", "2", at)
        self.assertIn("14 records in 2 buckets", err)
        self.assertNotIn("more copies of records", err)
        # the same records in two shards (a copy here; parts of two split runs in practice) are warned
        # about; a repeat of one shard is not
        code, err = run("--unet", UNET, "-o", out + "two", "--steps", "1", "--batch", "2", self.shard, at)
        self.assertIn("14 more copies of records already in another shard", err)
        self.assertIn("split_set none", err)
        code, err = run("--unet", UNET, "-o", out + "rep3", "--steps", "1", "--batch", "2", self.shard + "@3")
        self.assertNotIn("more copies of records", err)

    def test_same_step_saved_again(self):
        """A finished run started again saves nothing (its checkpoint already holds the step,
        left byte for byte as it was); --fresh into the same directory replaces that checkpoint
        with the new run's, complete, and leaves no temporary directory behind."""
        out = os.path.join(self.tmp.name, "again")
        args = ["--unet", UNET, "-o", out, "--steps", "2", "--batch", "2", "--ema-decay", "0.99", "-j", "1", self.shard]
        run(*args)
        before = ckpt_bytes(out, 2)
        st = os.stat(os.path.join(out, "checkpoint-2", "state.safetensors"))
        code, err = run(*args)
        self.assertIn("checkpoint-2 already holds step 2", err)
        self.assertIn("--steps 2 is the step to train to, not a count of more steps", err)
        self.assertEqual(ckpt_bytes(out, 2), before)
        self.assertEqual(os.stat(os.path.join(out, "checkpoint-2", "state.safetensors")).st_mtime_ns, st.st_mtime_ns)
        run(*args, "--fresh", "--lr", "5e-3")
        after = ckpt_bytes(out, 2)
        self.assertNotEqual(after[0], before[0], "the new run's weights did not replace the old ones")
        self.assertEqual(sorted(os.listdir(out)), ["checkpoint-2", "latest"])
        self.assertEqual(latest(out), 2)
        # a copy set aside by a swap that a kill interrupted (filesystems without RENAME_EXCHANGE):
        # removed by the next save once checkpoint-2 is whole
        shutil.copytree(os.path.join(out, "checkpoint-2"), os.path.join(out, "checkpoint-2.old"))
        run("--unet", UNET, "-o", out, "--steps", "3", "--batch", "2", "--ema-decay", "0.99", "-j", "1", self.shard)
        self.assertNotIn("checkpoint-2.old", os.listdir(out))

    def test_stray_temp_files(self):
        """A save killed mid-write leaves checkpoint-N.tmp with temporary files (NAME.tmp.XXXXXX):
        the next save starts from an empty directory, so none of them ends up in checkpoint-N,
        and a file that is not the trainer's is set aside (checkpoint-N.tmp-kept-XXXXXX), never
        deleted. A checkpoint that took such files in before (older versions) is still pruned by
        --keep: the trainer's own temporary names go with it, a file of another name keeps it."""
        out = os.path.join(self.tmp.name, "stray")
        left = ["state.safetensors.tmp.AbC123", "unet/diffusion_pytorch_model.safetensors.tmp.q1W2e3", "junk"]
        for name in left:
            os.makedirs(os.path.dirname(os.path.join(out, "checkpoint-2.tmp", name)), exist_ok=True)
            with open(os.path.join(out, "checkpoint-2.tmp", name), "w") as f:
                f.write("partial")
        args = ["--unet", UNET, "-o", out, "--batch", "2", "-j", "1", "-q", self.shard]
        run(*args, "--steps", "2")
        ck = os.path.join(out, "checkpoint-2")
        found = sorted(os.path.relpath(os.path.join(d, f), ck) for d, _, fs in os.walk(ck) for f in fs)
        self.assertEqual(found, [".sdtk-checkpoint", "state.safetensors", "train_config.json", "unet/config.json",
                                 "unet/diffusion_pytorch_model.safetensors"])
        kept = [n for n in os.listdir(out) if n.startswith("checkpoint-2.tmp-kept-")]
        self.assertEqual(sorted(set(os.listdir(out)) - set(kept)), ["checkpoint-2", "latest"])
        self.assertEqual(len(kept), 1)
        self.assertEqual(os.listdir(os.path.join(out, kept[0])), ["junk"])
        shutil.rmtree(os.path.join(out, kept[0]))
        for name in ("state.safetensors.tmp.AbC123", "unet/config.json.tmp.zZ9yY8"):
            with open(os.path.join(ck, name), "w") as f:
                f.write("partial")
        code, err = run(*args, "--steps", "4", "--save-every", "2", "--keep", "1")
        self.assertNotIn("not removed", err)
        self.assertEqual(sorted(os.listdir(out)), ["checkpoint-4", "latest"])
        mine = os.path.join(out, "checkpoint-4", "notes.txt.tmp.abcdef")  # not a name of the trainer's
        with open(mine, "w") as f:
            f.write("keep me")
        code, err = run(*args, "--steps", "6", "--save-every", "2", "--keep", "1")
        self.assertIn("not removed", err)
        self.assertEqual(os.listdir(os.path.join(out, "checkpoint-4")), ["notes.txt.tmp.abcdef"])

    def test_unusable_output_found_first(self):
        """An -o that cannot hold checkpoints (here a path under a regular file) stops the run
        before any training, not at the first save (by default the end of the run)."""
        f = os.path.join(self.tmp.name, "a-file")
        with open(f, "w") as fh:
            fh.write("x")
        code, err = run("--unet", UNET, "-o", os.path.join(f, "run"), "--steps", "1000", "-j", "1", self.shard,
                        ok=(3,))
        self.assertIn(os.path.join(f, "run"), err)
        self.assertNotIn("parameters;", err)  # the model was never loaded
        # a metrics file that cannot be written (a full disk) is named once; training goes on
        out = os.path.join(self.tmp.name, "metrics-full")
        code, err = run("--unet", UNET, "-o", out, "--steps", "2", "--metrics", "/dev/full", "-j", "1", self.shard)
        self.assertEqual(err.count("writing the metrics failed"), 1, err)
        self.assertEqual(latest(out), 2)

    def test_saved_again_keeps_foreign_files(self):
        """A step saved again (--fresh into the same -o) swaps the new checkpoint in; files a user
        put into the old one are set aside, not deleted, however often the step is saved again."""
        out = os.path.join(self.tmp.name, "again-keep")
        args = ["--unet", UNET, "-o", out, "--batch", "2", "--steps", "2", "-j", "1", "-q", self.shard]
        run(*args)
        os.makedirs(os.path.join(out, "checkpoint-2", "samples"))
        with open(os.path.join(out, "checkpoint-2", "samples", "img.txt"), "w") as f:
            f.write("a sample")
        for _ in range(2):
            run("--fresh", *args)
        kept = [n for n in os.listdir(out) if n.startswith("checkpoint-2.tmp-kept-")]
        self.assertEqual(len(kept), 1, os.listdir(out))
        with open(os.path.join(out, kept[0], "samples", "img.txt")) as f:
            self.assertEqual(f.read(), "a sample")
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-2", "samples")))
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoint-2.tmp")))
        # a link where unet_ema/ would be leads to someone's model: never followed, never emptied
        mine = os.path.join(self.tmp.name, "my-model", "unet")
        shutil.copytree(os.path.join(UNET, "unet"), mine)
        os.symlink(mine, os.path.join(out, "checkpoint-2", "unet_ema"))
        for _ in range(2):
            run("--fresh", *args)
        self.assertEqual(sorted(os.listdir(mine)), sorted(os.listdir(os.path.join(UNET, "unet"))))

    def test_launcher_copies_refused(self):
        """A launcher that started several processes which do not form an MPI world (a build
        without MPI, SD_DIST=none, srun without an MPI plugin) would have each train the same run
        into the same output: refused, naming the variable. SLURM_NTASKS alone (a batch script,
        one process) and a step of one task run."""
        out = os.path.join(self.tmp.name, "copies")
        for env, var in (({"SD_DIST": "none", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"},
                          "OMPI_COMM_WORLD_SIZE=2"),
                         ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"},
                          "SLURM_STEP_NUM_TASKS=4")):
            p = subprocess.run([TRAIN, "--unet", UNET, "-o", out, "--steps", "1", "-q", self.shard],
                               capture_output=True, env=dict(os.environ, **env))
            self.assertEqual(p.returncode, 3, p.stderr.decode())
            self.assertIn("started as one of %s processes (%s)" % (var[-1], var), p.stderr.decode())
            self.assertFalse(os.path.exists(out))
        # SD_DIST=single: a sweep of runs of their own (each its own -o) asks for no world
        sweep = {"SD_DIST": "single", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"}
        for env in ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, {"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"},
                    sweep):
            p = subprocess.run([TRAIN, "--unet", UNET, "-o", out, "--steps", "1", "--fresh", "-q", self.shard],
                               capture_output=True, env=dict(os.environ, **env))
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            self.assertEqual(latest(out), 1)

    def test_resume_option_checks(self):
        """A checkpoint with an EMA resumes only with --ema-decay; options that change the steps
        from here (lr, schedule, min-SNR; the run's length only under a schedule that depends on
        it) are named in a warning with their old and new values."""
        out = os.path.join(self.tmp.name, "resume-opts")
        run("--unet", UNET, "-o", out, "--steps", "2", "--batch", "2", "--ema-decay", "0.99", "--lr-schedule",
            "cosine", "--warmup", "1", "-j", "1", "-q", self.shard)
        code, err = run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "2", "-j", "1", self.shard, ok=(3,))
        self.assertIn("keeps an EMA", err)
        code, err = run("--unet", UNET, "-o", out, "--steps", "4", "--batch", "2", "--ema-decay", "0.99",
                        "--lr-schedule", "cosine", "--warmup", "1", "--lr", "5e-2", "--snr-gamma", "5", "-j", "1",
                        self.shard)
        self.assertIn("resuming with other options", err)
        self.assertIn("lr 0.0001 -> 0.05", err)
        self.assertIn("snr-gamma 0 -> 5", err)
        self.assertIn("steps 2 -> 4", err)
        self.assertNotIn("warmup", err)
        self.assertEqual(latest(out), 4)
        # a longer run under the constant schedule (its length changes nothing) resumes without a word
        const = os.path.join(self.tmp.name, "resume-const")
        run("--unet", UNET, "-o", const, "--steps", "2", "--batch", "2", "-j", "1", "-q", self.shard)
        code, err = run("--unet", UNET, "-o", const, "--steps", "4", "--batch", "2", "-j", "1", self.shard)
        self.assertNotIn("resuming with other options", err)
        self.assertEqual(latest(const), 4)
        # other data: refused, naming the checkpoint's shards and this run's (not a fingerprint)
        code, err = run("--unet", UNET, "-o", const, "--steps", "6", "--batch", "2", "-j", "1", self.shard + "@2",
                        ok=(3,))
        self.assertIn("made from other training data (%s) than this run's (%s@2)" % (self.shard, self.shard), err)
        self.assertNotIn("fingerprint", err)

    def test_zero_terminal_snr(self):
        """--zero-terminal-snr trains (v-prediction, min-SNR 5; t = 999 itself is checked in
        test_train's test_zero_snr_step), the state records it, and a resume without it is refused
        with the reason."""
        out = os.path.join(self.tmp.name, "ztsnr")
        steps = ["--steps", "4"] + COMMON[COMMON.index("--steps") + 2:]
        run("--unet", UNET, "-o", out, "--zero-terminal-snr", "--metrics", os.path.join(out + ".jsonl"), *steps,
            self.shard)
        with open(out + ".jsonl") as f:
            losses = [json.loads(l)["loss"] for l in f if '"loss"' in l]
        self.assertEqual(len(losses), 4)
        self.assertTrue(all(x == x and 0 < x < 10 for x in losses), losses)
        with open(os.path.join(out, "checkpoint-4", "state.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            meta = json.loads(f.read(n))["__metadata__"]
        self.assertEqual(meta["zero_terminal_snr"], "1")
        code, err = run("--unet", UNET, "-o", out, "--steps", "6", *COMMON[COMMON.index("--steps") + 2:], self.shard,
                        ok=(3,))
        self.assertIn("--zero-terminal-snr", err)
        # the plain schedule's loss differs: the flag reached the schedule
        plain = os.path.join(self.tmp.name, "ztsnr-plain")
        run("--unet", UNET, "-o", plain, "--metrics", plain + ".jsonl", *steps, self.shard)
        with open(plain + ".jsonl") as f:
            base = [json.loads(l)["loss"] for l in f if '"loss"' in l]
        self.assertNotEqual(losses, base)

    def test_input_perturbation(self):
        """--input-perturbation 0.1 reaches the step (the weights differ from the plain run's) and
        keeps runs deterministic (two runs byte-identical)."""
        steps = ["--steps", "2"] + COMMON[COMMON.index("--steps") + 2:]
        outs = []
        for name, extra in (("ip-a", ["--input-perturbation", "0.1"]), ("ip-b", ["--input-perturbation", "0.1"]),
                            ("ip-off", [])):
            out = os.path.join(self.tmp.name, name)
            run("--unet", UNET, "-o", out, *extra, *steps, self.shard)
            outs.append(final(out, 2))
        self.assertEqual(outs[0], outs[1])
        self.assertNotEqual(outs[0][0], outs[2][0])

    def test_timestep_range(self):
        """--min-timestep 999 --max-timestep 1000 with --zero-terminal-snr and v-prediction under
        min-SNR 5: every sample is drawn at t = 999, whose weight is 0, so every step's loss and
        gradient norm are exactly 0 (with the full range they are not: test_zero_terminal_snr)."""
        out = os.path.join(self.tmp.name, "trange")
        steps = ["--steps", "3"] + COMMON[COMMON.index("--steps") + 2:]
        run("--unet", UNET, "-o", out, "--zero-terminal-snr", "--min-timestep", "999", "--max-timestep", "1000",
            "--metrics", out + ".jsonl", *steps, self.shard)
        with open(out + ".jsonl") as f:
            rows = [json.loads(l) for l in f if '"loss"' in l]
        self.assertEqual(len(rows), 3)
        self.assertTrue(all(r["loss"] == 0 and r["grad_norm"] == 0 for r in rows), rows)

    def unet_config(self, name, **changes):
        """The golden UNet's config.json with some keys changed, as a file of its own."""
        with open(os.path.join(UNET, "unet", "config.json")) as f:
            cfg = json.load(f)
        cfg.update(changes)
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def test_resume_under_another_unet_refused(self):
        """A resume whose UNet has the same parameter count but another architecture (attention
        heads here) is refused, naming the field and both values, instead of loading the
        weights into the wrong model; the checkpoint's own config resumes."""
        out = os.path.join(self.tmp.name, "arch")
        run("--unet-config", self.unet_config("arch-a.json"), "-o", out, "--steps", "2", "-j", "1", "-q", self.shard)
        code, err = run("--unet-config", self.unet_config("arch-b.json", attention_head_dim=4), "-o", out, "--steps",
                        "3", "-j", "1", "-q", self.shard, ok=(3,))
        self.assertIn("the checkpoint's UNet differs from this run's (attention_head_dim of block 0: 2 there, 4 here)",
                      err)
        self.assertEqual(latest(out), 2)
        run("--unet-config", self.unet_config("arch-a.json"), "-o", out, "--steps", "3", "-j", "1", "-q", self.shard)
        self.assertEqual(latest(out), 3)

    def test_shard_checked_against_unet(self):
        """A shard that does not fit the UNet is refused before training, naming the shard and both
        numbers: latents of other channels than in_channels, text embeddings of another width than
        cross_attention_dim, a shard without any text embedding (not after 1000 batches of skipped
        records)."""
        notext = os.path.join(self.tmp.name, "notext.shard")
        subprocess.run([MAKE, "--make-shard-without-text", notext], check=True)
        cases = ((self.unet_config("u-ch8.json", in_channels=8, out_channels=8), self.shard,
                  "%s: latent channels differ from the UNet's in_channels (latent channels 4, the UNet's "
                  "in_channels 8" % self.shard),
                 (self.unet_config("u-xa16.json", cross_attention_dim=16), self.shard,
                  "%s: text embedding width differs from the UNet's cross_attention_dim (width 8, the UNet's "
                  "cross_attention_dim 16" % self.shard),
                 (os.path.join(UNET, "unet", "config.json"), notext,
                  "%s: made without text embeddings: sd-latents --text, or --text-only to add them (every record "
                  "has no text embedding)" % notext))
        for i, (cfg, shard, says) in enumerate(cases):
            out = os.path.join(self.tmp.name, "misfit%d" % i)
            code, err = run("--unet-config", cfg, "-o", out, "--steps", "5", "-j", "1", shard, ok=(3,))
            self.assertIn(says, err)
            self.assertNotIn("1000 batches", err)
            self.assertFalse(os.path.exists(out))  # the -o the start-up probe made goes again
        # as --val too
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "misfit-val"), "--val", notext, "--steps",
                        "1", "-j", "1", self.shard, ok=(3,))
        self.assertIn("%s: made without text embeddings" % notext, err)
        # an -o that was there stays, with what it held
        keep = os.path.join(self.tmp.name, "misfit-keep")
        os.makedirs(keep)
        with open(os.path.join(keep, "notes.txt"), "w") as f:
            f.write("mine\n")
        run("--unet", UNET, "-o", keep, "--steps", "1", "-j", "1", notext, ok=(3,))
        self.assertEqual(os.listdir(keep), ["notes.txt"])
        # a failure after the shards were taken (a --resume that is not there) leaves no new -o either
        gone = os.path.join(self.tmp.name, "misfit-resume")
        run("--unet", UNET, "-o", gone, "--resume", os.path.join(self.tmp.name, "nosuch"), "--steps", "1", "-j", "1",
            self.shard, ok=(3,))
        self.assertFalse(os.path.exists(gone))

    def test_empty_shard_skipped(self):
        """A shard without latent records (an sd-latents --shard part that got none: no meta
        either) is skipped with a warning, first or not; only empty shards are an error."""
        empty = os.path.join(self.tmp.name, "empty.shard")
        subprocess.run([MAKE, "--make-empty-shard", empty], check=True)
        for i, shards in enumerate(([self.shard, empty], [empty, self.shard])):
            out = os.path.join(self.tmp.name, "with-empty%d" % i)
            code, err = run("--unet", UNET, "-o", out, "--steps", "1", "--batch", "2", "-j", "1", *shards)
            self.assertIn("%s: no latent records" % empty, err)
            self.assertIn("14 records in 2 buckets", err)
            self.assertEqual(latest(out), 1)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "only-empty"), "--steps", "1", empty, empty,
                        ok=(3,))
        self.assertIn("none of the shards holds latent records", err)

    def test_model_log_lines(self):
        """The model line gives diffusers' parameter count (the sum of the tensors' sizes, no
        padding) and, after a resume, says the weights came from the checkpoint; the graph plan
        is logged once at info level, the replans of later bucket changes only with -v."""
        with open(os.path.join(UNET, "unet", "diffusion_pytorch_model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
        params = sum(math.prod(v["shape"]) for k, v in head.items() if k != "__metadata__")
        out = os.path.join(self.tmp.name, "loglines")
        args = ["--unet-config", os.path.join(UNET, "unet", "config.json"), "-o", out, "--batch", "2", "-j", "1",
                self.shard]
        code, err = run(*args, "--steps", "6")
        self.assertIn("UNet new (seed 0), %d parameters;" % params, err)
        self.assertEqual(err.count("UNet graph,"), 1, err)
        code, err = run(*args, "--steps", "12", "-v")
        self.assertIn("resumed from", err)
        self.assertIn("UNet from the checkpoint, %d parameters;" % params, err)
        self.assertNotIn("UNet new", err)
        self.assertGreater(err.count("UNet graph,"), 1, err)  # 6 steps over 2 buckets replan

    def start_until_first_checkpoint(self, out, args):
        """sd-train started in the background with args, its stderr collected by a thread;
        returns (process, lines, reader) once out/latest names a checkpoint, still running."""
        p = subprocess.Popen([TRAIN] + args, stderr=subprocess.PIPE, text=True)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True)
        reader.start()
        t0 = time.time()
        while latest(out) < 1 and p.poll() is None and time.time() - t0 < 300:
            time.sleep(0.01)
        self.assertIsNone(p.poll(), "".join(lines))
        return p, lines, reader

    def test_second_trainer_on_one_output_refused(self):
        """A second sd-train into an -o another one is writing (a job started twice) is refused
        while the first runs, which finishes untouched; afterwards the same command resumes."""
        out = os.path.join(self.tmp.name, "twice")
        args = ["--unet", UNET, "-o", out, "--batch", "1", "--accum", "20", "--save-every", "1", "-j", "1",
                self.shard]
        p, lines, reader = self.start_until_first_checkpoint(out, ["--steps", "6"] + args)
        code, err = run("--steps", "6", *args, ok=(3,))
        self.assertIn("another sd-train is writing its checkpoints there", err)
        self.assertEqual(p.wait(timeout=600), 0, "".join(lines))
        reader.join(timeout=10)
        self.assertEqual(latest(out), 6)
        code, err = run("--steps", "7", *args)
        self.assertIn("resumed from", err)
        self.assertEqual(latest(out), 7)

    def test_checkpoints_without_latest_resume(self):
        """-o with checkpoints but no latest (a kill before the first latest was written, or it
        was removed): the run resumes from the newest whole one, with a warning, instead of
        starting over and replacing them; the result is the uninterrupted run's."""
        out = os.path.join(self.tmp.name, "nolatest")
        ref = os.path.join(self.tmp.name, "nolatest-ref")
        run("--unet", UNET, "-o", ref, *COMMON, self.shard)
        shutil.copytree(ref, out)
        os.remove(os.path.join(out, "latest"))
        for step in (6, 8, 10):
            shutil.rmtree(os.path.join(out, "checkpoint-%d" % step))
        os.makedirs(os.path.join(out, "checkpoint-6.tmp"))  # a save cut short: not whole, not taken
        shutil.copytree(os.path.join(ref, "checkpoint-6", "unet"), os.path.join(out, "checkpoint-8", "unet"))
        # checkpoint-8 holds only unet/ (a prune killed part way): without a state file it is not taken
        code, err = run("--unet", UNET, "-o", out, *[a if a != "-q" else "-v" for a in COMMON], self.shard)
        self.assertIn("has checkpoint-4 but no 'latest' file: resuming from it", err)
        self.assertIn("resumed from", err)
        self.assertEqual(final(out), final(ref))

    def test_damaged_latest_checkpoint_shows_the_way_on(self):
        """The checkpoint latest names cannot be read (its state file cut short, or gone): the
        run stops naming the file, and says which earlier whole checkpoint --resume can take
        (or --fresh); that one resumes."""
        out = os.path.join(self.tmp.name, "damaged")
        args = ["--unet", UNET, "-o", out, "--save-every", "1", "--keep", "0", "-j", "1", "-q", self.shard]
        run("--steps", "3", *args)
        state = os.path.join(out, "checkpoint-3", "state.safetensors")
        os.truncate(state, os.path.getsize(state) // 2)
        code, err = run("--steps", "4", *args, ok=(3,))
        self.assertIn("checkpoint-3/state.safetensors", err)
        self.assertIn("latest names checkpoint-3, which cannot be read; %s/checkpoint-2 is the newest whole "
                      "checkpoint before it: --resume %s/checkpoint-2 continues from there, --fresh starts over"
                      % (out, out), err)
        shutil.rmtree(os.path.join(out, "checkpoint-3"))
        code, err = run("--steps", "4", *args, ok=(3,))
        self.assertIn("--resume %s/checkpoint-2 continues from there" % out, err)
        with open(os.path.join(out, "latest"), "w") as f:
            f.write("junk\n")
        code, err = run("--steps", "4", *args, ok=(3,))
        self.assertIn("latest: not a checkpoint name", err)
        self.assertIn("latest names junk, which cannot be read; %s/checkpoint-2 is the newest whole" % out, err)
        code, err = run("--steps", "4", "--resume", os.path.join(out, "checkpoint-2"), *args)
        self.assertEqual(latest(out), 4)

    def test_interrupt_twice(self):
        """SIGINT is acknowledged at once, before the step (here 50 micro-batches) ends; a second
        SIGINT quits at once with 130, and the last checkpoint stays complete and resumable."""
        out = os.path.join(self.tmp.name, "int2")
        args = ["--unet", UNET, "-o", out, "--batch", "1", "--accum", "50", "--save-every", "1", "-j", "1",
                self.shard]
        p, lines, reader = self.start_until_first_checkpoint(out, ["--steps", "1000"] + args)
        p.send_signal(signal.SIGINT)
        t0 = time.time()
        while not any("stopping after this step" in l for l in lines) and p.poll() is None and time.time() - t0 < 60:
            time.sleep(0.01)
        self.assertTrue(any("stopping after this step and saving a checkpoint; Ctrl-C again to quit at once"
                            in l for l in lines), "no acknowledgement of the first SIGINT:\n" + "".join(lines))
        p.send_signal(signal.SIGINT)
        code = p.wait(timeout=60)
        reader.join(timeout=10)
        self.assertEqual(code, 130, "".join(lines))
        self.assertIn("interrupted again", "".join(lines))
        step = latest(out)
        self.assertGreaterEqual(step, 1)
        ck = os.path.join(out, "checkpoint-%d" % step)
        found = sorted(os.path.relpath(os.path.join(d, f), ck) for d, _, fs in os.walk(ck) for f in fs)
        self.assertEqual(found, [".sdtk-checkpoint", "state.safetensors", "train_config.json", "unet/config.json",
                                 "unet/diffusion_pytorch_model.safetensors"])
        code, err = run("--steps", step, *args)  # loads the checkpoint: nothing left to train
        self.assertIn("checkpoint-%d already holds step %d" % (step, step), err)

    def test_other_optimizers_resume_exactly(self):
        """--optimizer adamw8bit and adafactor (with a first moment): a run killed after a
        checkpoint and rerun ends byte-identical to an uninterrupted one; the state file names
        the optimizer and holds its buffers; a resume under another optimizer is refused naming
        both, as is Adafactor's first moment added on resume; the log counts the state's bytes."""
        args = ["--batch", "2", "--steps", "8", "--save-every", "2", "--keep", "0", "--seed", "3", "--lr", "1e-3",
                "--ema-decay", "0.99", "-j", "2", "-q"]
        for opt, extra, bufs in (("adamw8bit", [], {"opt.q8_m": "U8", "opt.q8_absmax_v": "F32", "opt.q8_m32": "F32"}),
                                 ("adafactor", ["--adafactor-beta1", "0.9"],
                                  {"opt.adafactor_row": "F32", "opt.adafactor_v": "F32", "opt.adafactor_m": "F32"})):
            with self.subTest(opt=opt):
                ref = os.path.join(self.tmp.name, opt + "-ref")
                run("--unet", UNET, "-o", ref, "--optimizer", opt, *extra, *args, self.shard)
                out = os.path.join(self.tmp.name, opt + "-killed")
                p = subprocess.Popen([TRAIN, "--unet", UNET, "-o", out, "--optimizer", opt] + extra + args +
                                     [self.shard], stderr=subprocess.PIPE)
                t0 = time.time()
                while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
                    time.sleep(0.005)
                p.kill()
                p.communicate()
                stopped_at = latest(out)
                self.assertGreaterEqual(stopped_at, 2)
                self.assertLess(stopped_at, 8, "the run finished before the kill: nothing was tested")
                _, err = run("--unet", UNET, "-o", out, "--optimizer", opt, *extra, *args[:-1], self.shard)
                self.assertIn("optimizer state (%s)" % opt, err)
                got, want = final(out, 8), final(ref, 8)
                self.assertTrue(got[0] == want[0], "weights differ from the uninterrupted run")
                self.assertTrue(got[1] == want[1], "EMA weights differ from the uninterrupted run")
                self.assertTrue(got[2] == want[2], "training state differs from the uninterrupted run")
                self.assertEqual(state_meta(ref, 8)["optimizer"], opt)
                with open(os.path.join(ref, "checkpoint-8", "state.safetensors"), "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    head = json.loads(f.read(n))
                self.assertNotIn("adam_m", head)
                for name, dt in bufs.items():
                    self.assertEqual(head[name]["dtype"], dt, name)
                # another optimizer (AdamW, the default, too) cannot continue this state
                other = "adafactor" if opt == "adamw8bit" else "adamw8bit"
                for o in (other, "adamw"):
                    _, err = run("--unet", UNET, "-o", ref, "--optimizer", o, "--steps", "10", "--batch", "2",
                                 "--seed", "3", "--ema-decay", "0.99", "-j", "1", self.shard, ok=(3,))
                    self.assertIn("made with --optimizer %s, this run has --optimizer %s" % (opt, o), err)
                self.assertEqual(latest(ref), 8)
        # AdamW's checkpoints (no optimizer in older states) are refused by the others too
        _, err = run("--unet", UNET, "-o", self.ref, "--optimizer", "adafactor", *COMMON[:-3], "-j", "1", self.shard,
                     ok=(3,))
        self.assertIn("made with --optimizer adamw, this run has --optimizer adafactor", err)
        _, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "adafactor-ref"), "--optimizer", "adafactor",
                     "--steps", "10", "--batch", "2", "--seed", "3", "--ema-decay", "0.99", "-j", "1", self.shard,
                     ok=(3,))
        self.assertIn("first moment", err)
        # what the other optimizers cannot do yet is refused up front
        for extra, why in ((["--optimizer", "adam"], "--optimizer: adamw, adamw8bit or adafactor"),
                           (["--optimizer", "adamw8bit", "--zero2"], "start it under mpirun -np N"),
                           (["--optimizer", "adafactor", "--adam-moments", "bf16"], "AdamW's"),
                           (["--adafactor-beta1", "0.9"], "--optimizer adafactor")):
            _, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), *extra, self.shard, ok=(2,))
            self.assertIn(why, err)

    def test_bf16_weights_resume_exactly(self):
        """--weight-dtype bf16 (issue 28): AdamW with fp32 and bf16 moments, AdamW8bit and
        Adafactor with a first moment (updated a group of whole tensors at a time): a run killed after a
        checkpoint and rerun ends byte-identical to an uninterrupted one (the stochastic rounding
        is keyed by seed, step and element); every saved weight is a bf16 value and the run is
        not the fp32 one; the state names the weight type; a resume across types warns and
        rounds (fp32 -> bf16) or widens (bf16 -> fp32); what bf16 cannot do yet is refused."""
        args = ["--batch", "2", "--steps", "8", "--save-every", "2", "--keep", "0", "--seed", "3", "--lr", "1e-3",
                "--ema-decay", "0.99", "-j", "2", "-q"]
        fp32 = os.path.join(self.tmp.name, "w32-ref")
        run("--unet", UNET, "-o", fp32, *args, self.shard)
        for name, opt in (("fp32", ["--adam-moments", "fp32"]), ("bf16", ["--adam-moments", "bf16"]),
                          ("adamw8bit", ["--optimizer", "adamw8bit"]),
                          ("adafactor", ["--optimizer", "adafactor", "--adafactor-beta1", "0.9"])):
            with self.subTest(optimizer=name):
                moments = name
                bf = ["--weight-dtype", "bf16"] + opt
                ref = os.path.join(self.tmp.name, "w16-ref-" + moments)
                run("--unet", UNET, "-o", ref, *bf, *args, self.shard)
                out = os.path.join(self.tmp.name, "w16-killed-" + moments)
                p = subprocess.Popen([TRAIN, "--unet", UNET, "-o", out] + bf + args + [self.shard],
                                     stderr=subprocess.PIPE)
                t0 = time.time()
                while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
                    time.sleep(0.005)
                p.kill()
                p.communicate()
                stopped_at = latest(out)
                self.assertGreaterEqual(stopped_at, 2)
                self.assertLess(stopped_at, 8, "the run finished before the kill: nothing was tested")
                run("--unet", UNET, "-o", out, *bf, *args, self.shard)
                got, want = final(out, 8), final(ref, 8)
                self.assertTrue(got[0] == want[0], "weights differ from the uninterrupted run")
                self.assertTrue(got[1] == want[1], "EMA weights differ from the uninterrupted run")
                self.assertTrue(got[2] == want[2], "training state differs from the uninterrupted run")
                self.assertEqual(state_meta(ref, 8)["weight_dtype"], "bf16")
                w = self.weights(ref, 8)
                self.assertTrue(all(x & 0xFFFF == 0 for x in w), "a saved weight is not a bf16 value")
                self.assertNotEqual(w, self.weights(fp32, 8))
        self.assertEqual(state_meta(fp32, 8)["weight_dtype"], "fp32")
        # across types: fp32 -> bf16 rounds once (every weight a bf16 value after), bf16 -> fp32 widens
        cross = os.path.join(self.tmp.name, "w32-to-16")
        _, err = run("--unet", UNET, "-o", cross, "--resume", os.path.join(fp32, "checkpoint-4"),
                     "--weight-dtype", "bf16", *args[:-1], self.shard)
        self.assertIn("the weights are fp32 there and bf16 in this run", err)
        self.assertTrue(all(x & 0xFFFF == 0 for x in self.weights(cross, 8)))
        back = os.path.join(self.tmp.name, "w16-to-32")
        _, err = run("--unet", UNET, "-o", back, "--resume", os.path.join(self.tmp.name, "w16-ref-fp32",
                     "checkpoint-4"), *args[:-1], self.shard)
        self.assertIn("the weights are bf16 there and fp32 in this run", err)
        self.assertFalse(all(x & 0xFFFF == 0 for x in self.weights(back, 8)))
        # half-precision folders: the state keeps the weights as BF16 (exact, no fp32 copy written or
        # held), and a run stopped at step 4 and continued ends as the uninterrupted one
        half = ["--weight-dtype", "bf16", "--save-dtype", "fp16", "--save-single"] + args
        ref16, cont = os.path.join(self.tmp.name, "w16-half-ref"), os.path.join(self.tmp.name, "w16-half-cont")
        run("--unet", UNET, "-o", ref16, *half, self.shard)
        run("--unet", UNET, "-o", cont, *half, "--steps", "4", self.shard)
        run("--unet", UNET, "-o", cont, *half, self.shard)
        self.assertEqual(final(cont, 8), final(ref16, 8))
        with open(os.path.join(ref16, "checkpoint-8", "state.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            self.assertEqual(json.loads(f.read(n))["params"]["dtype"], "BF16")
        self.assertTrue(os.path.exists(os.path.join(ref16, "checkpoint-8", "unet.safetensors")))
        for extra, why in ((["--weight-dtype", "fp16"], "--weight-dtype: fp32 or bf16"),
                           (["--weight-dtype", "bf16", "--zero1"], "one process only")):
            _, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), *extra, self.shard, ok=(2,))
            self.assertIn(why, err)

    def test_bf16_grads_resume_exactly(self):
        """--grad-dtype bf16 (issue 28): with --accum 2, validation and an EMA, on bf16 weights with
        AdamW8bit and on fp32 weights with AdamW, a run killed after a checkpoint and rerun ends
        byte-identical to an uninterrupted one (the gradients' rounding is keyed by seed, step and
        micro-batch); the run is not the fp32-gradient one; the log names the bf16 buffer; a resume
        with fp32 gradients names the change; what it cannot do is refused with exit 2."""
        args = ["--batch", "2", "--accum", "2", "--steps", "8", "--save-every", "2", "--keep", "0", "--seed", "3",
                "--lr", "1e-3", "--ema-decay", "0.99", "--val", self.shard, "--val-every", "3", "-j", "2", "-q"]
        for name, opt in (("w16-adamw8bit", ["--weight-dtype", "bf16", "--optimizer", "adamw8bit"]),
                          ("w32-adamw", [])):
            with self.subTest(run=name):
                g16 = ["--grad-dtype", "bf16"] + opt
                fp32 = os.path.join(self.tmp.name, "g32-ref-" + name)
                run("--unet", UNET, "-o", fp32, *opt, *args, self.shard)
                ref = os.path.join(self.tmp.name, "g16-ref-" + name)
                _, err = run("--unet", UNET, "-o", ref, *g16, *args[:-1], self.shard)
                self.assertRegex(err, r"gradients [0-9.]+ MiB \(bf16\)")
                out = os.path.join(self.tmp.name, "g16-killed-" + name)
                p = subprocess.Popen([TRAIN, "--unet", UNET, "-o", out] + g16 + args + [self.shard],
                                     stderr=subprocess.PIPE)
                t0 = time.time()
                while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
                    time.sleep(0.005)
                p.kill()
                p.communicate()
                stopped_at = latest(out)
                self.assertGreaterEqual(stopped_at, 2)
                self.assertLess(stopped_at, 8, "the run finished before the kill: nothing was tested")
                run("--unet", UNET, "-o", out, *g16, *args, self.shard)
                got, want = final(out, 8), final(ref, 8)
                self.assertTrue(got[0] == want[0], "weights differ from the uninterrupted run")
                self.assertTrue(got[1] == want[1], "EMA weights differ from the uninterrupted run")
                self.assertTrue(got[2] == want[2], "training state differs from the uninterrupted run")
                self.assertNotEqual(self.weights(ref, 8), self.weights(fp32, 8))
        # continued with fp32 gradients: allowed (the buffer is zero between steps), the change named
        _, err = run("--unet", UNET, "-o", ref, *args[:-1], "--steps", "9", self.shard)
        self.assertIn('grad-dtype "bf16" -> "fp32"', err)
        self.assertEqual(latest(ref), 9)
        for extra, why in ((["--grad-dtype", "fp16"], "--grad-dtype: fp32 or bf16"),
                           (["--grad-dtype", "bf16", "--fused-backward"], "means nothing"),
                           (["--grad-dtype", "bf16", "--device", "cuda:0"], "CPU only"),
                           (["--grad-dtype", "bf16", "--zero1"], "one process")):
            _, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), *extra, self.shard, ok=(2,))
            self.assertIn(why, err)

    def weights(self, out, step):
        """checkpoint-STEP's unet/ weights as the bits of their fp32 values."""
        path = os.path.join(out, "checkpoint-%d" % step, "unet", "diffusion_pytorch_model.safetensors")
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
            data = f.read()
        bits = []
        for name, t in sorted(head.items()):
            if name != "__metadata__":
                self.assertEqual(t["dtype"], "F32", name)
                a, b = t["data_offsets"]
                bits.extend(struct.unpack("<%dI" % ((b - a) // 4), data[a:b]))
        return bits

    def test_usage(self):
        code, err = run("-o", os.path.join(self.tmp.name, "x"), self.shard, ok=(2,))
        self.assertIn("--unet", err)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--prediction", "x0", self.shard,
                        ok=(2,))
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "/nonexistent.shard", ok=(3,))
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--device", "gpu0", self.shard,
                        ok=(2,))
        self.assertIn("--device", err)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--nccl", self.shard, ok=(2,))
        self.assertIn("--nccl", err)
        # mixed precision: a GPU mode, bf16 only (fp16 would need loss scaling), a known type
        for mp, why in (("bf16", "GPU mode"), ("fp16", "loss scaling"), ("fp8", "no or bf16")):
            code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--mixed-precision", mp,
                            *(["--device", "cuda:0"] if mp == "fp16" else []), self.shard, ok=(2,))
            self.assertIn(why, err)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--adam-moments", "fp16", self.shard,
                        ok=(2,))
        self.assertIn("--adam-moments: fp32 or bf16", err)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--min-timestep", "500",
                        "--max-timestep", "500", self.shard, ok=(2,))
        self.assertIn("--max-timestep", err)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--zero-terminal-snr", "--snr-gamma",
                        "5", self.shard, ok=(2,))
        self.assertIn("v_prediction", err)
        for opt, val in (("--beta1", "1"), ("--beta2", "1.5"), ("--beta1", "nan"), ("--adam-eps", "-1"),
                         ("--weight-decay", "-5"), ("--max-grad-norm", "-3")):
            code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), opt, val, self.shard, ok=(2,))
            self.assertIn(opt, err)
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--gpu-memory-limit", "8", self.shard,
                        ok=(2,))
        self.assertIn("--device cuda", err)
        # a GPU the machine does not have (none here, or not that many): a clear fatal error, no traceback
        code, err = run("--unet", UNET, "-o", os.path.join(self.tmp.name, "x"), "--device", "cuda:1000", self.shard,
                        ok=(3,))
        self.assertRegex(err, "CUDA|cuda")


if __name__ == "__main__":
    TRAIN, MAKE, UNET = sys.argv[1:4]
    unittest.main(argv=sys.argv[:1] + sys.argv[4:], verbosity=2)
