#!/usr/bin/env python3
"""sd-train --memory-plan (issue 28): one JSON object with every category;
weights, gradients and optimizer state equal to the golden UNet's tensor
sizes (as the flat buffer pads them) times their dtype sizes; EMA as much as
the weights; checkpointing and a smaller batch plan fewer activation bytes;
a too-small --host-memory-limit gives fits false, and a normal run under it
stops before its first step with the plan in its message (no checkpoint);
an SD 1.5-size model is planned from --unet-config without allocating its
weights; bad options are usage errors.
a --val shard whose bucket is larger is planned for; its text token count
is read from the records.
Usage: e2e_memory_plan.py SD_TRAIN TEST_TRAIN UNET_CONFIG BENCH_MEM_SHARD [TEST...]"""
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import unittest

TRAIN = MAKE = CONFIG = SHARD_OF = None
CATEGORIES = ("weights", "gradients", "optimizer", "ema", "activations", "workspace", "process", "samples", "total")


def run(*args, ok=(0,)):
    """Run sd-train; returns (code, stdout, stderr); asserts the code."""
    p = subprocess.run([TRAIN] + [str(a) for a in args], capture_output=True)
    if p.returncode not in ok:
        raise AssertionError("%s -> %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def tensor_sizes(config):
    """(shape, values) of each tensor of the golden UNet beside its config."""
    path = os.path.join(os.path.dirname(config), "diffusion_pytorch_model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    out = []
    for name, t in head.items():
        if name == "__metadata__":
            continue
        shape = t["shape"]
        values = 1
        for d in shape:
            values *= d
        out.append((shape, values))
    return out


class MemoryPlan(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.shard = os.path.join(cls.tmp.name, "s.shard")
        subprocess.run([MAKE, "--make-shard", cls.shard], check=True)
        cls.tensors = tensor_sizes(CONFIG)
        cls.padded = sum((n + 15) // 16 * 16 for _, n in cls.tensors)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def plan(self, *extra, ok=(0,)):
        _, out, _ = run("--unet-config", CONFIG, "--memory-plan", "-j", "1", *extra, self.shard, ok=ok)
        lines = out.splitlines()
        self.assertEqual(len(lines), 1, out)
        return json.loads(lines[0])

    def test_categories(self):
        p = self.plan("--batch", "2")
        for k in CATEGORIES:
            self.assertIsInstance(p[k], int, k)
            self.assertGreaterEqual(p[k], 0, k)
        for k in ("weights", "gradients", "optimizer", "activations", "workspace", "process"):
            self.assertGreater(p[k], 0, k)
        self.assertEqual(p["device"], "cpu")
        self.assertIs(p["fits"], True)
        # the generated shard's buckets are 64x64 and 64x32 pixels; its text 5 tokens
        self.assertEqual(p["bucket"], {"width": 64, "height": 64, "latent": [8, 8], "batch": 2, "tokens": 5})
        parts = sum(p[k] for k in CATEGORIES[:-1])
        self.assertLessEqual(abs(p["total"] - parts), 64 * 16, p)  # the allocator's 64-byte rounding
        d = p["detail"]
        self.assertGreaterEqual(p["activations"], d["graph_activations"] + d["graph_activation_gradients"])

    def test_parameter_bytes(self):
        n, counted = self.padded, sum(v for _, v in self.tensors)
        p = self.plan()
        self.assertEqual(p["weights"], 4 * n)
        self.assertEqual(p["gradients"], 4 * n)
        self.assertEqual(p["optimizer"], 2 * 4 * n)  # AdamW's two fp32 moments
        self.assertEqual(p["ema"], 0)
        self.assertEqual(self.plan("--adam-moments", "bf16")["optimizer"], 2 * 2 * n)
        self.assertEqual(self.plan("--ema-decay", "0.99")["ema"], 4 * n)
        # Adafactor: row and column factors of every matrix and kernel, a
        # full second moment of the rest, and with beta1 a first moment of all
        fact = sum(v // s[-1] + v // s[-2] if len(s) >= 2 else v for s, v in self.tensors)
        af = self.plan("--optimizer", "adafactor")
        af1 = self.plan("--optimizer", "adafactor", "--adafactor-beta1", "0.9")
        self.assertEqual(af1["optimizer"] - af["optimizer"], 4 * counted)
        self.assertGreaterEqual(af["optimizer"], 4 * fact)
        self.assertLess(af["optimizer"], 4 * fact + 1000 * len(self.tensors))  # + the per-tensor views
        # AdamW8bit: one byte per value of both moments in blocks of 256 with an fp32 absmax each,
        # fp32 moments below 4096 values; + its maps and tables
        big = [v for _, v in self.tensors if v >= 4096]
        small = sum(v for _, v in self.tensors if v < 4096)
        q8 = 2 * sum(big) + 2 * 4 * sum((v + 255) // 256 for v in big) + 2 * 4 * small
        q = self.plan("--optimizer", "adamw8bit")["optimizer"]
        self.assertGreaterEqual(q, q8)
        self.assertLess(q, q8 + (1 << 20))

    def test_bf16_weights(self):
        """--weight-dtype bf16 (issue 28): 2 bytes per weight; the workspace adds what the run
        allocates for it: the largest op's weight and bias widened, and the update's chunk of
        65536 floats (the whole model when smaller); the other categories as with fp32."""
        n = self.padded
        f, b = self.plan("--batch", "2"), self.plan("--batch", "2", "--weight-dtype", "bf16")
        self.assertEqual(f["weights"], 4 * n)
        self.assertEqual(b["weights"], 2 * n)
        for k in ("gradients", "optimizer", "ema", "activations"):
            self.assertEqual(b[k], f[k], k)
        largest = max(v for _, v in self.tensors)
        extra = b["workspace"] - f["workspace"]
        self.assertGreaterEqual(extra, 4 * (largest + min(n, 65536)))
        self.assertLessEqual(extra, 4 * (2 * largest + min(n, 65536)))
        # Adafactor updates whole tensors: the chunk is at least the largest, plus the group's views
        af = self.plan("--batch", "2", "--optimizer", "adafactor")
        af16 = self.plan("--batch", "2", "--optimizer", "adafactor", "--weight-dtype", "bf16")
        self.assertEqual(af16["weights"], 2 * n)
        self.assertEqual(af16["optimizer"], af["optimizer"])
        self.assertGreaterEqual(af16["workspace"] - af["workspace"], 4 * (largest + min(n, max(65536, largest))))

    def test_activations_follow_batch_and_checkpointing(self):
        a2, a1 = self.plan("--batch", "2"), self.plan("--batch", "1")
        self.assertGreater(a2["activations"], a1["activations"])
        self.assertEqual(a2["weights"], a1["weights"])
        ck = self.plan("--batch", "2", "--gradient-checkpointing")
        self.assertLess(ck["activations"], a2["activations"])
        self.assertIs(ck["setup"]["gradient_checkpointing"], True)

    def test_does_not_fit(self):
        p = self.plan("--host-memory-limit", "0.001", ok=(1,))  # exit 1: a script can test it
        self.assertIs(p["fits"], False)
        self.assertEqual(p["limit"], int(0.001 * (1 << 30)))
        self.assertEqual(p["limit_from"], "--host-memory-limit")
        self.assertIs(self.plan("--host-memory-limit", "64")["fits"], True)

    def test_run_refused_before_first_step(self):
        out = os.path.join(self.tmp.name, "refused")
        metrics = os.path.join(self.tmp.name, "refused.jsonl")
        code, _, err = run("--unet-config", CONFIG, "-o", out, "--steps", "3", "-j", "1", "--host-memory-limit",
                           "0.001", "--metrics", metrics, self.shard, ok=(3,))
        self.assertIn("stopped before the first step", err)
        self.assertIn("need less (sd-train --memory-plan shows what each takes)", err)  # not cut at 255 bytes
        line = [l for l in err.splitlines() if "memory plan: {" in l]
        self.assertEqual(len(line), 1, err)
        p = json.loads(line[0].split("memory plan: ", 1)[1])
        self.assertIs(p["fits"], False)
        for k in CATEGORIES:
            self.assertIn(k, p)
        self.assertFalse(os.path.exists(os.path.join(out, "latest")))
        self.assertEqual([f for f in os.listdir(out) if f.startswith("checkpoint")] if os.path.isdir(out) else [], [])
        if os.path.exists(metrics):
            with open(metrics) as f:
                self.assertNotIn('"step"', f.read())
        # the same run with room trains
        code, _, err = run("--unet-config", CONFIG, "-o", out + "2", "--steps", "1", "-j", "1",
                           "--host-memory-limit", "64", self.shard)
        self.assertIn("memory plan:", err)
        self.assertTrue(os.path.exists(os.path.join(out + "2", "latest")))

    def test_large_model_without_weights(self):
        """SD 1.5's size (block_out_channels 320..1280: 3.4 GB of weights)
        planned from --unet-config alone: the process stays far below that."""
        with open(CONFIG) as f:
            cfg = json.load(f)
        cfg.update(block_out_channels=[320, 640, 1280, 1280], attention_head_dim=8, norm_num_groups=32,
                   down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
                   up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3)
        path = os.path.join(self.tmp.name, "big.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        # a fixed limit: whether 14 GB fit the host's available memory is not the question here
        _, out, _ = run("--unet-config", path, "--memory-plan", "-j", "1", "--host-memory-limit", "64", self.shard)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB: the largest child so far
        p = json.loads(out)
        self.assertGreater(p["weights"], 3 << 30)
        self.assertLess(after, 1 << 20, "the plan allocated the weights (%d KiB peak, before %d)" % (after, before))

    def test_bf16_start_is_not_planned(self):
        """--weight-dtype bf16 loads or initialises straight into bf16 (issue 28): the start holds
        no fp32 model beside the bf16 one, so even where the step is smallest (SD 1.5's size, fused
        backward, 8-bit AdamW) the total is the step's categories (it was fp32 + bf16 weights), and
        detail has no bf16_start; setup names the weights' dtype."""
        with open(CONFIG) as f:
            cfg = json.load(f)
        cfg.update(block_out_channels=[320, 640, 1280, 1280], attention_head_dim=8, norm_num_groups=32,
                   down_block_types=["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
                   up_block_types=["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3)
        path = os.path.join(self.tmp.name, "big16.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        _, out, _ = run("--unet-config", path, "--memory-plan", "-j", "1", "--weight-dtype", "bf16",
                        "--optimizer", "adamw8bit", "--fused-backward", "--gradient-checkpointing", self.shard)
        p = json.loads(out)
        parts = sum(p[k] for k in CATEGORIES[:-1])
        self.assertLessEqual(abs(p["total"] - parts), 64 * 64, p)  # the allocator's 64-byte rounding
        self.assertLess(p["total"] - p["process"], 3 * p["weights"], p)  # fp32 beside bf16 alone: 3x
        self.assertNotIn("bf16_start", p["detail"])
        self.assertEqual(p["setup"]["weight_dtype"], "bf16")
        self.assertEqual(self.plan()["setup"]["weight_dtype"], "fp32")

    def test_val_shard_with_a_larger_bucket(self):
        val = os.path.join(self.tmp.name, "val.shard")
        subprocess.run([SHARD_OF, val, "128", "96", "8", "0", "2"], check=True)
        plain = self.plan()
        p = self.plan("--val", val)
        self.assertEqual(p["bucket"], {"width": 128, "height": 96, "latent": [12, 16], "batch": 1, "tokens": 77})
        self.assertGreater(p["activations"], plain["activations"])
        self.assertEqual(p["weights"], plain["weights"])

    def test_no_limit_is_not_a_fit(self):
        """--device cuda:0 with no GPU to ask (and no --gpu-memory-limit): fits is null, not true."""
        code, out, err = run("--unet-config", CONFIG, "--memory-plan", "-j", "1", "--device", "cuda:0", self.shard,
                             ok=(0, 1, 3))
        if code == 3 and "this build has no CUDA backend" in err:
            self.skipTest("this build has no CUDA backend")
        self.assertNotEqual(code, 3, err)  # any other fatal error is a failure, not a skip
        p = json.loads(out.splitlines()[0])
        if p["limit_from"].startswith("none"):
            self.assertIsNone(p["fits"])
            self.assertEqual(code, 0)
        else:  # a GPU answered
            self.assertIsInstance(p["fits"], bool)

    def test_samples(self):
        """--sample-prompts: a sample step renders while the step's buffers stay allocated, so the plan
        adds its buffers (total = the plan without samples + samples): the VAE decoder's weights (its
        tensors, padded as the flat buffer pads them), every line's conditioning (77 tokens x the
        context width, twice with CFG), the UNet's inference graph and the decoder's workspace, which
        grow with the image (the decoder's about 4x for 4x the pixels); a limit between the two plans fits only
        without samples. bench/bench_mem_plan_samples.sh holds it against peak RSS."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import e2e_sample  # needs numpy and PIL, as the suite's Python does (scripts/install-deps.sh)
        e2e_sample.GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
        model = os.path.join(self.tmp.name, "sample-model")
        if not os.path.isdir(model):
            e2e_sample.make_model(model, "sd1", "sd", [(8, "quick_gelu", 0, "<|endoftext|>")])
        vae = tensor_sizes(os.path.join(model, "vae", "config.json"))
        with open(os.path.join(model, "vae", "diffusion_pytorch_model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
        dec = sum((v + 15) // 16 * 16 for k, (_, v) in zip(names, vae)
                  if k.startswith(("decoder.", "post_quant_conv.")))
        def prompts(name, rows):
            return e2e_sample.jsonl(os.path.join(self.tmp.name, name), rows)
        small = prompts("s64.jsonl", [{"prompt": "a", "width": 64, "height": 64},
                                      {"prompt": "b", "cfg": 1, "width": 64, "height": 64}])
        large = prompts("s128.jsonl", [{"prompt": "a", "width": 128, "height": 128},
                                       {"prompt": "b", "cfg": 1, "width": 64, "height": 64}])
        base = self.plan()
        self.assertEqual(base["samples"], 0)
        p = self.plan("--sample-prompts", small, "--sample-model", model)
        q = self.plan("--sample-prompts", large, "--sample-model", model)
        d, e = p["detail"], q["detail"]
        self.assertEqual(p["total"] - p["process"], base["total"] - base["process"] + p["samples"])  # VmRSS varies
        self.assertEqual(d["sample_vae_weights"], 4 * dec)
        self.assertEqual(d["sample_conditioning"], 4 * 77 * 8 * (2 + 1))
        self.assertEqual(d["sample_size"], [64, 64])
        self.assertEqual(e["sample_size"], [128, 128])
        self.assertGreaterEqual(p["samples"], sum(d[k] for k in ("sample_vae_weights", "sample_conditioning",
                                                                  "sample_unet", "sample_decode")))
        self.assertTrue(3.9 < e["sample_decode"] / d["sample_decode"] < 4.01, (d, e))  # all per pixel
        self.assertGreater(e["sample_unet"], d["sample_unet"])  # the graph's part; its op scratch less so
        # a limit the training step fits in, the samples do not
        limit = (base["total"] + q["total"]) / 2 / (1 << 30)
        self.assertIs(self.plan("--host-memory-limit", "%.9f" % limit)["fits"], True)
        self.assertIs(self.plan("--host-memory-limit", "%.9f" % limit, "--sample-prompts", large, "--sample-model",
                                model, ok=(1,))["fits"], False)

    def test_bad_options(self):
        _, _, err = run("--unet-config", CONFIG, "--memory-plan", "--host-memory-limit", "-1", self.shard, ok=(2,))
        self.assertIn("--host-memory-limit", err)
        _, _, err = run("--unet-config", CONFIG, "--memory-plan", "--host-memory-limit", "4", "--device", "cuda:0",
                        self.shard, ok=(2,))
        self.assertIn("--host-memory-limit is the CPU's", err)
        empty = os.path.join(self.tmp.name, "empty.shard")
        subprocess.run([MAKE, "--make-empty-shard", empty], check=True)
        _, _, err = run("--unet-config", CONFIG, "--memory-plan", empty, ok=(3,))
        self.assertIn("holds no latent records", err)
        # a plan refuses what the run refuses: --masked-loss on shards without a loss mask
        _, out, err = run("--unet-config", CONFIG, "--memory-plan", "--masked-loss", self.shard, ok=(2,))
        self.assertIn("--masked-loss: no record of", err)
        self.assertEqual(out, "")


if __name__ == "__main__":
    TRAIN, MAKE, CONFIG, SHARD_OF = sys.argv[1:5]
    unittest.main(argv=sys.argv[:1] + sys.argv[5:], verbosity=2)
