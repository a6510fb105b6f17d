#!/usr/bin/env python3
"""sd-train --fused-backward (issue 28): each tensor updated during the
backward from a scratch of the largest op's size. The final weights, EMA and
optimizer state after a few steps are byte-identical to the whole-buffer
path with the same clipping (none, or per tensor: --clip-per-tensor) for
AdamW (fp32 and bf16 moments), AdamW8bit and Adafactor, fp32 and bf16
weights; a fused run killed after a checkpoint and rerun ends byte-identical
to an uninterrupted one; the memory plan's gradients are the scratch (the
largest op's weight and bias); a non-finite gradient stops without saving;
what it cannot do is refused (exit 2).
Usage: e2e_fused.py SD_TRAIN TEST_TRAIN UNET_DIR [TEST...]"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from train_ckpt import ckpt_bytes, latest

TRAIN = MAKE = UNET = None
ARGS = ["--batch", "2", "--steps", "4", "--save-every", "2", "--keep", "0", "--seed", "3", "--lr", "1e-3",
        "--ema-decay", "0.99", "-j", "2", "-q"]
OPTIMIZERS = (("adamw", []), ("adamw-bf16-moments", ["--adam-moments", "bf16"]),
              ("adamw8bit", ["--optimizer", "adamw8bit"]),
              ("adafactor", ["--optimizer", "adafactor", "--adafactor-beta1", "0.9"]))


def run(*args, ok=(0,)):
    """Run sd-train; returns (code, stdout, stderr); asserts the code."""
    p = subprocess.run([TRAIN] + [str(a) for a in args], capture_output=True)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def read_st(path):
    """A safetensors file's header and data."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()


def strip_meta(state):
    """A state file's bytes without its metadata (which names the run's options)."""
    n = struct.unpack("<Q", state[:8])[0]
    head = json.loads(state[8:8 + n])
    head.pop("__metadata__", None)
    return json.dumps(head, sort_keys=True).encode() + state[8 + n:]


class Fused(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.shard = os.path.join(cls.tmp.name, "cache.shard")
        subprocess.run([MAKE, "--make-shard", cls.shard], check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def train(self, name, *extra):
        out = os.path.join(self.tmp.name, name)
        run("--unet", UNET, "-o", out, *ARGS, *extra, self.shard)
        return ckpt_bytes(out, 4)

    def test_same_weights_as_unfused(self):
        """fused == whole-buffer update, bit for bit, with no clipping and with per-tensor clipping
        (a small --max-grad-norm, so it clips); per-tensor clipping is not the global one."""
        for wd in ("fp32", "bf16"):
            for name, opt in OPTIMIZERS:
                base = ["--weight-dtype", wd] + opt
                with self.subTest(weights=wd, optimizer=name):
                    tag = wd + "-" + name
                    plain = self.train("plain-" + tag, *base, "--max-grad-norm", "0")
                    fused = self.train("fused-" + tag, *base, "--max-grad-norm", "0", "--fused-backward")
                    self.assertTrue(plain[0] == fused[0], "weights differ from the unfused run")
                    self.assertTrue(plain[1] == fused[1], "EMA weights differ from the unfused run")
                    self.assertTrue(strip_meta(plain[2]) == strip_meta(fused[2]), "optimizer state differs")
                    clip = ["--max-grad-norm", "0.01"]
                    per = self.train("per-" + tag, *base, *clip, "--clip-per-tensor")
                    fclip = self.train("fclip-" + tag, *base, *clip, "--fused-backward")
                    self.assertTrue(per[0] == fclip[0], "clipped weights differ from the unfused run")
                    self.assertTrue(per[1] == fclip[1], "clipped EMA weights differ from the unfused run")
                    self.assertTrue(strip_meta(per[2]) == strip_meta(fclip[2]), "clipped optimizer state differs")
                    self.assertNotEqual(per[0], plain[0], "--max-grad-norm 0.01 did not clip")
                    if wd == "fp32" and name == "adamw":
                        glob = self.train("global-" + tag, *base, *clip)
                        self.assertNotEqual(glob[0], per[0], "per-tensor clipping equals the global one")

    def test_kill_resume(self):
        """A fused bf16 Adafactor run killed after a checkpoint and rerun ends byte-identical."""
        args = ARGS[:ARGS.index("--steps")] + ["--steps", "8"] + ARGS[ARGS.index("--steps") + 2:]
        bf = ["--weight-dtype", "bf16", "--optimizer", "adafactor", "--fused-backward"]
        ref = os.path.join(self.tmp.name, "resume-ref")
        run("--unet", UNET, "-o", ref, *bf, *args, self.shard)
        out = os.path.join(self.tmp.name, "resume-killed")
        p = subprocess.Popen([TRAIN, "--unet", UNET, "-o", out] + bf + args + [self.shard], stderr=subprocess.PIPE)
        t0 = time.time()
        while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
            time.sleep(0.002)
        p.kill()
        p.communicate()
        stopped = latest(out)
        self.assertGreaterEqual(stopped, 2)
        self.assertLess(stopped, 8, "the run finished before the kill: nothing was tested")
        run("--unet", UNET, "-o", out, *bf, *args, self.shard)
        self.assertTrue(ckpt_bytes(out, 8) == ckpt_bytes(ref, 8), "the resumed run differs")

    def plan(self, *extra):
        _, out, _ = run("--unet", UNET, "--memory-plan", "-j", "1", "-o", os.path.join(self.tmp.name, "p"), *extra,
                        self.shard)
        return json.loads(out)

    def test_memory_plan(self):
        """gradients: the largest op's weight and bias (here from the tensor names) in fp32, not the model;
        with --grad-dtype bf16 the model's at 2 bytes a value plus that scratch."""
        head, _ = read_st(os.path.join(UNET, "unet", "diffusion_pytorch_model.safetensors"))
        mods = {}
        for k, t in head.items():
            if k == "__metadata__":
                continue
            n = 1
            for d in t["shape"]:
                n *= d
            mod = k.rsplit(".", 1)[0]
            mods[mod] = mods.get(mod, 0) + n
        for wd in ("fp32", "bf16"):
            whole, fused = self.plan("--weight-dtype", wd), self.plan("--weight-dtype", wd, "--fused-backward")
            self.assertEqual(fused["gradients"], 4 * max(mods.values()))
            self.assertGreater(whole["gradients"], 10 * fused["gradients"])
            # the same arithmetic as the allocation: the total drops by exactly the difference (the
            # process's own RSS, read at planning time, set apart)
            self.assertEqual((whole["total"] - whole["process"]) - (fused["total"] - fused["process"]),
                             whole["gradients"] - fused["gradients"])
            self.assertTrue(fused["setup"]["fused_backward"])
            self.assertFalse(whole["setup"]["fused_backward"])
            # --grad-dtype bf16: the buffer at 2 bytes a value (padding too) and the fp32 op scratch
            g16 = self.plan("--weight-dtype", wd, "--grad-dtype", "bf16")
            self.assertEqual(g16["gradients"], whole["gradients"] // 2 + fused["gradients"])
            self.assertEqual((whole["total"] - whole["process"]) - (g16["total"] - g16["process"]),
                             whole["gradients"] - g16["gradients"])
            self.assertEqual(g16["setup"]["grad_dtype"], "bf16")
            self.assertEqual(whole["setup"]["grad_dtype"], "fp32")

    def test_nonfinite_gradient_not_saved(self):
        """conv_out zero with a huge bias and a huge norm scale before it: the loss is finite (in double),
        conv_out's weight gradient overflows. The fused run stops (exit 3) and saves nothing; the
        unfused run saves the state before the step, as before."""
        head, data = read_st(os.path.join(UNET, "unet", "diffusion_pytorch_model.safetensors"))
        poison = {"conv_out.weight": 0.0, "conv_out.bias": 1e18, "conv_norm_out.weight": 1e25}
        out_head, blobs, off = {}, [], 0
        for k, t in sorted(head.items()):
            if k == "__metadata__":
                continue
            a, b = t["data_offsets"]
            vals = struct.unpack("<%d%s" % ((b - a) // (2 if t["dtype"] == "F16" else 4),
                                            "e" if t["dtype"] == "F16" else "f"), data[a:b])
            if k in poison:
                vals = [poison[k]] * len(vals)
            blob = struct.pack("<%df" % len(vals), *vals)
            out_head[k] = {"dtype": "F32", "shape": t["shape"], "data_offsets": [off, off + len(blob)]}
            blobs.append(blob)
            off += len(blob)
        model = os.path.join(self.tmp.name, "poisoned")
        shutil.copytree(os.path.join(UNET, "unet"), os.path.join(model, "unet"))
        h = json.dumps(out_head).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(model, "unet", "diffusion_pytorch_model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        fused = os.path.join(self.tmp.name, "nan-fused")
        _, _, err = run("--unet", model, "-o", fused, *ARGS, "--fused-backward", self.shard, ok=(3,))
        self.assertIn("not saved", err)
        self.assertEqual(latest(fused), -1, "a half-updated state was saved")
        plain = os.path.join(self.tmp.name, "nan-plain")
        _, _, err = run("--unet", model, "-o", plain, *ARGS, self.shard, ok=(3,))
        self.assertIn("the checkpoint holds the state before it", err)
        self.assertEqual(latest(plain), 0)

    def test_refusals(self):
        """What the fused path cannot do: exit 2 with its reason."""
        out = os.path.join(self.tmp.name, "x")
        for extra, why in ((["--accum", "2"], "--accum > 1"), (["--device", "cuda:0", "--nccl"], "over NCCL"),
                           (["--zero1"], "one process only")):
            _, _, err = run("--unet", UNET, "-o", out, "--fused-backward", *extra, self.shard, ok=(2,))
            self.assertIn(why, err)
        _, _, err = run("--unet", UNET, "-o", out, "--clip-per-tensor", "--zero1", self.shard, ok=(2,))
        self.assertIn("--clip-per-tensor", err)
        # --device cuda is no longer refused: it runs, or a build without CUDA or a machine without a GPU says so
        _, _, err = run("--unet", UNET, "-o", out, "--fused-backward", "--device", "cuda:0", "--steps", "1",
                        self.shard, ok=(0, 3))
        self.assertNotIn("CPU only", err)


if __name__ == "__main__":
    TRAIN, MAKE, UNET = sys.argv[1:4]
    unittest.main(argv=sys.argv[:1] + sys.argv[4:])
