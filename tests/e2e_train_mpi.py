#!/usr/bin/env python3
"""End-to-end tests of sd-train under mpirun (Open MPI, 2 ranks on this
machine, oversubscribed): the tiny golden SD1 UNet trained on the generated
shard by 2 ranks (batch 2 each) ends with the weights of one process with
the same global batch (batch 2, accumulation 2) within fp32 reduction-order
tolerance; two 2-rank runs are byte-identical (the gradient sum visits the
ranks in a fixed order); SIGKILL of one rank mid-run makes mpirun stop the
other and exit non-zero within a bounded time, and the rerun resumes from
the last checkpoint every rank completed and ends byte-identical to an
uninterrupted 2-rank run. ZeRO-1 (with fp32 and bf16 AdamW moments, also over
several reduction blocks) matches the all-reduce run and resumes byte-identically.
Ranks that would not train the same run stop at once, naming the rank: a usage error on one
rank (exit 2 on all), another checkpoint or other shards on one rank; rank 0 writing a
checkpoint longer than SD_DIST_TIMEOUT does not stop the others; --epochs resumed with
another world size ends after the epochs; the skipped-record summary counts every rank's.
--grad-dtype bf16 is refused under mpirun (exit 2).
sd-train --memory-plan --zero1 on 2 ranks prints one plan (rank 0's) whose optimizer bytes are
rank 0's share of the AdamW moments; with --zero2 the gradients are rank 0's share too (also
Adafactor's by whole tensors, on CPU and GPU ranks). ZeRO-2
(gradients reduce-scattered during the backward) ends byte-identical to ZeRO-1, also with skipped
batches, within fp32 rounding with accumulation, resumes byte-identically, and refuses what it
cannot do. 8-bit AdamW and Adafactor under ZeRO-1/ZeRO-2 on device ranks (the CPU table marked
is_device, in test_train) match CPU ranks byte for byte, also resumed.
Exit 77 (skipped) when mpirun is missing or sd-train was built without MPI.
Usage: e2e_train_mpi.py SD_TRAIN TEST_TRAIN UNET_DIR HAVE_MPI"""
import json
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

from train_ckpt import ckpt_bytes as files, latest

TRAIN = MAKE = UNET = None
MPIRUN = shutil.which("mpirun")
# fp32, 4 AdamW steps at lr 1e-3 from the same weights: the two runs add the
# same per-batch gradients in another order ((g0 + g1) on two ranks against
# g0 then + g1 in one process), so they differ by a few ulps of the gradient;
# AdamW divides by |g|. Measured (12 steps, lr 1e-3, v-prediction, min-SNR,
# dropout, EMA): 3.9e-7 largest absolute difference of the weights (which
# reach 1.3), 2.0e-5 normwise on each tensor's change; the test allows 25x.
TOL_ABS = 1e-5
TOL_CHANGE = 5e-4
STEPS = 12
COMMON = ["--steps", str(STEPS), "--seed", "5", "--lr", "1e-3", "--lr-schedule", "cosine", "--warmup", "2",
          "--dropout", "0.2", "--prediction", "v_prediction", "--snr-gamma", "5", "--ema-decay", "0.99",
          "-j", "1", "-q"]


def mpi(n, *args, wait=True):
    """sd-train under mpirun -np n (oversubscribed, root allowed)."""
    cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(n), TRAIN] + [str(a) for a in args]
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    if not wait:
        return subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env, start_new_session=True)
    p = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
    if p.returncode != 0:
        raise AssertionError("%s -> %d\n%s" % (" ".join(cmd), p.returncode, p.stderr.decode()))
    return p.stderr.decode()


def mpi_raw(n, *args, env=None, timeout=120):
    """sd-train (or a wrapper script) under mpirun -np n, any exit: (code, stderr, seconds)."""
    cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(n)] + [str(a) for a in args]
    full = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", **(env or {}))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, env=full, timeout=timeout)
    return p.returncode, p.stderr.decode(), time.time() - t0


def rank_wrapper(path, rank1, rank0=""):
    """A script for mpirun to start in place of sd-train: rank 1 runs it with the extra
    arguments rank1 (shell words) before the common ones, rank 0 with rank0 (a command may
    precede sd-train there: TRAIN stands for it)."""
    first0 = rank0 if "TRAIN" in rank0 else "TRAIN " + rank0
    with open(path, "w") as f:
        f.write('#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec %s %s "$@"; fi\nexec %s "$@"\n' %
                (shlex.quote(TRAIN), rank1, first0.replace("TRAIN", shlex.quote(TRAIN))))
    os.chmod(path, 0o755)
    return path


def state_meta(path):
    """The metadata of a state.safetensors."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def st_load(path):
    """A safetensors file as {name: float32 array} and its metadata."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    meta = head.pop("__metadata__", {})
    out = {}
    for k, v in head.items():
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "BF16":
            out[k] = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            out[k] = np.frombuffer(raw, dtype={"F32": np.float32, "F16": np.float16}[v["dtype"]]).astype(np.float32)
    return out, meta


def same_files(a, b):
    """Whether two checkpoints' byte lists are equal, without unittest's diff of megabytes (which
    takes minutes when they differ): the files that differ named."""
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y] if len(a) == len(b) else ["count"]


def children(pid):
    """The pids of the sd-train processes below pid."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
            with open("/proc/%s/comm" % d) as f:
                comm = f.read().strip()
        except OSError:
            continue
        ppid = int(st.rsplit(")", 1)[1].split()[1])
        if ppid == pid and comm == "sd-train":
            found.append(int(d))
    return sorted(found)


class TrainMPI(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.shard = os.path.join(cls.tmp.name, "cache.shard")
        subprocess.run([MAKE, "--make-shard", cls.shard], check=True, capture_output=True)
        cls.two = os.path.join(cls.tmp.name, "two")
        mpi(2, "--unet", UNET, "-o", cls.two, "--batch", "2", "--accum", "1", "--save-every", "2", "--keep", "0",
            *COMMON, cls.shard)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_same_as_one_process(self):
        one = os.path.join(self.tmp.name, "one")
        p = subprocess.run([TRAIN, "--unet", UNET, "-o", one, "--batch", "2", "--accum", "2"] + COMMON + [self.shard],
                           capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        init, _ = st_load(os.path.join(UNET, "unet", "diffusion_pytorch_model.safetensors"))
        for sub in ("unet", "unet_ema"):
            a, _ = st_load(os.path.join(one, "checkpoint-%d" % STEPS, sub, "diffusion_pytorch_model.safetensors"))
            b, _ = st_load(os.path.join(self.two, "checkpoint-%d" % STEPS, sub, "diffusion_pytorch_model.safetensors"))
            self.assertEqual(sorted(a), sorted(b))
            worst_abs = max(float(np.abs(a[k] - b[k]).max()) for k in a)
            worst_rel = 0.0
            for k in a:
                da = a[k].astype(np.float64) - init[k]
                db = b[k].astype(np.float64) - init[k]
                if np.linalg.norm(da) > 0:
                    worst_rel = max(worst_rel, float(np.linalg.norm(da - db) / np.linalg.norm(da)))
            print("%s: 2 ranks vs 1 process: largest |diff| %.3g, normwise on the changes %.3g" %
                  (sub, worst_abs, worst_rel), file=sys.stderr)
            self.assertLess(worst_abs, TOL_ABS, sub)
            self.assertLess(worst_rel, TOL_CHANGE, sub)
        _, ma = st_load(os.path.join(one, "checkpoint-%d" % STEPS, "state.safetensors"))
        _, mb = st_load(os.path.join(self.two, "checkpoint-%d" % STEPS, "state.safetensors"))
        for k in ("step", "images", "epoch", "batch"):
            self.assertEqual(ma[k], mb[k], k)
        self.assertEqual(mb["world_size"], "2")

    def test_two_rank_runs_identical(self):
        again = os.path.join(self.tmp.name, "again")
        mpi(2, "--unet", UNET, "-o", again, "--batch", "2", "--accum", "1", *COMMON, self.shard)
        self.assertEqual(same_files(files(again, STEPS), files(self.two, STEPS)), [])

    def test_kill_one_rank_then_resume(self):
        out = os.path.join(self.tmp.name, "killed")
        args = ["--unet", UNET, "-o", out, "--batch", "2", "--accum", "1", "--save-every", "2", "--keep", "0"] + \
            COMMON + [self.shard]
        p = mpi(2, *args, wait=False)
        t0 = time.time()
        while latest(out) < 2 and p.poll() is None and time.time() - t0 < 120:
            time.sleep(0.002)
        ranks = children(p.pid)
        if p.poll() is not None or latest(out) >= STEPS or len(ranks) < 2:
            p.communicate()
            self.skipTest("the run ended before a rank could be killed (machine too fast)")
        os.kill(ranks[-1], signal.SIGKILL)
        t_kill = time.time()
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            self.fail("the other rank did not stop within 60 s of the kill")
        waited = time.time() - t_kill
        print("killed rank %d at checkpoint %d; mpirun exited %d after %.2f s" %
              (ranks[-1], latest(out), p.returncode, waited), file=sys.stderr)
        if p.returncode == 0 and latest(out) == STEPS:
            self.skipTest("the run finished before the kill took effect")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("signal 9", err.decode())
        # rerun: resumes from the last checkpoint every rank completed
        self.assertGreaterEqual(latest(out), 2)
        mpi(2, *args)
        self.assertEqual(same_files(files(out, STEPS), files(self.two, STEPS)), [])

    def test_zero1(self):
        """ZeRO-1 (moments sharded over the 2 ranks) against the plain all-reduce run: the same
        per-element arithmetic; only the gradient norm's sum is grouped by segment, so the weights
        may differ in the last bits (measured: see the printed figure). The checkpoint holds the
        whole moments, and a ZeRO-1 run resumed from one ends byte-identical to an uninterrupted one."""
        z = os.path.join(self.tmp.name, "zero1")
        args = ["--unet", UNET, "--batch", "2", "--accum", "1", "--save-every", "2", "--keep", "0", "--zero1"] + \
            COMMON + [self.shard]
        mpi(2, "-o", z, *args)
        worst = 0.0
        for sub in ("unet", "unet_ema"):
            a, _ = st_load(os.path.join(z, "checkpoint-%d" % STEPS, sub, "diffusion_pytorch_model.safetensors"))
            b, _ = st_load(os.path.join(self.two, "checkpoint-%d" % STEPS, sub, "diffusion_pytorch_model.safetensors"))
            self.assertEqual(sorted(a), sorted(b))
            worst = max(worst, max(float(np.abs(a[k] - b[k]).max()) for k in a))
        sa, ma = st_load(os.path.join(z, "checkpoint-%d" % STEPS, "state.safetensors"))
        sb, mb = st_load(os.path.join(self.two, "checkpoint-%d" % STEPS, "state.safetensors"))
        self.assertEqual(sorted(sa), sorted(sb))
        for k in ("adam_m", "adam_v"):
            scale = max(float(np.abs(sb[k]).max()), 1e-30)
            worst_m = float(np.abs(sa[k] - sb[k]).max()) / scale
            print("zero1 vs all-reduce: %s largest relative diff %.3g" % (k, worst_m), file=sys.stderr)
            self.assertLess(worst_m, 1e-5, k)
        print("zero1 vs all-reduce after %d steps: largest |weight diff| %.3g%s" %
              (STEPS, worst, " (bit-identical)" if worst == 0 else ""), file=sys.stderr)
        self.assertLess(worst, 1e-6)
        # resume a ZeRO-1 run from a checkpoint in the middle
        r = os.path.join(self.tmp.name, "zero1-resumed")
        shutil.copytree(os.path.join(z, "checkpoint-6"), os.path.join(r, "checkpoint-6"))
        with open(os.path.join(r, "latest"), "w") as f:
            f.write("checkpoint-6\n")
        mpi(2, "-o", r, *args)
        self.assertEqual(same_files(files(r, STEPS), files(z, STEPS)), [])

    def test_zero2(self):
        """ZeRO-2 (each tensor's gradient reduce-scattered during the backward into its owners'
        shares) against ZeRO-1: the same rank-order sums, the same segment-grouped norm and the same
        AdamW on the own segments, so with one micro-batch per rank and step the checkpoints are
        byte-identical. Batch 1: whole batches of the shard's two bad records are skipped, and a
        rank short of a round's share sends zeros (an idle pass; step 2 with this seed). With --accum 2 the
        micro-batches are summed over the ranks first and then accumulated (ZeRO-1: accumulated,
        then summed): a few fp32 ulps (measured 2.6e-7, allowed 1e-5 as the one-process test). A
        ZeRO-2 run resumed from its step-6 checkpoint ends byte-identical; so does one resumed by
        ZeRO-1 (the state is the same whole state). A non-finite loss stops both alike."""
        base = ["--unet", UNET, "--save-every", "6", "--keep", "0"] + COMMON + [self.shard]
        runs = {}
        for batch, accum in (("1", "1"), ("1", "2")):
            for z in ("--zero1", "--zero2"):
                out = os.path.join(self.tmp.name, "z2-%s-b%s-a%s" % (z[2:], batch, accum))
                mpi(2, "-o", out, z, "--batch", batch, "--accum", accum, *base)
                runs[z, batch, accum] = out
            one, two = runs["--zero1", batch, accum], runs["--zero2", batch, accum]
            if accum == "1":
                self.assertEqual(same_files(files(two, STEPS), files(one, STEPS)), [], (batch, accum))
                continue
            for sub in ("unet", "unet_ema"):
                a, _ = st_load(os.path.join(one, "checkpoint-%d" % STEPS, sub, "diffusion_pytorch_model.safetensors"))
                b, _ = st_load(os.path.join(two, "checkpoint-%d" % STEPS, sub, "diffusion_pytorch_model.safetensors"))
                worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
                print("zero2 vs zero1, --accum 2, %s: largest |weight diff| %.3g" % (sub, worst), file=sys.stderr)
                self.assertLess(worst, TOL_ABS, sub)
        z = runs["--zero2", "1", "1"]
        for how in ("--zero2", "--zero1"):
            r = os.path.join(self.tmp.name, "zero2-resumed" + how)
            shutil.copytree(os.path.join(z, "checkpoint-6"), os.path.join(r, "checkpoint-6"))
            with open(os.path.join(r, "latest"), "w") as f:
                f.write("checkpoint-6\n")
            mpi(2, "-o", r, how, "--batch", "1", "--accum", "1", *base)
            self.assertEqual(same_files(files(r, STEPS), files(z, STEPS)), [], how)
        # a step whose loss is not finite (lr 1e8: step 2's) stops both with exit 3 and the same
        # checkpoint of the state before it
        for how in ("--zero1", "--zero2"):
            code, err, _ = mpi_raw(2, TRAIN, "--unet", UNET, "-o", os.path.join(self.tmp.name, "nonfinite" + how), how,
                                   "--steps", "4", "--seed", "5", "--lr", "1e8", "--max-grad-norm", "0", "-j", "1",
                                   "-q", "--batch", "2", self.shard)
            self.assertEqual(code, 3, err)
            self.assertEqual(latest(os.path.join(self.tmp.name, "nonfinite" + how)), 1, err)
        self.assertEqual(same_files(files(os.path.join(self.tmp.name, "nonfinite--zero1"), 1, ema=False),
                                    files(os.path.join(self.tmp.name, "nonfinite--zero2"), 1, ema=False)), [])

    def test_zero_other_optimizers(self):
        """8-bit AdamW and Adafactor under ZeRO, shared by whole tensors (each rank owns a run of
        them, its state that run's layout): --zero1 sums the whole gradient as plain data
        parallelism and steps the own run, so it ends byte-identical to the plain 2-rank run (state
        file included: rank 0 gathers the runs' buffers); --zero2 reduces each tensor's gradient
        to its owner (rank-order sums; only the norm is grouped by share), measured equal here; a
        --zero2 run resumed from its step-2 checkpoint, by --zero2 or --zero1, ends byte-identical."""
        base = ["--unet", UNET, "--batch", "1", "--steps", "4", "--save-every", "2", "--keep", "0", "--seed", "5",
                "--lr", "1e-3", "--ema-decay", "0.99", "-j", "1", "-q", self.shard]
        for opt, extra in (("adafactor", ["--adafactor-beta1", "0.9"]), ("adamw8bit", [])):
            runs = {}
            for z in ("", "--zero1", "--zero2"):
                runs[z] = os.path.join(self.tmp.name, "other-%s%s" % (opt, z))
                mpi(2, "-o", runs[z], "--optimizer", opt, *extra, *([z] if z else []), *base)
            self.assertEqual(same_files(files(runs["--zero1"], 4), files(runs[""], 4)), [], opt)
            a, _ = st_load(os.path.join(runs["--zero1"], "checkpoint-4", "unet", "diffusion_pytorch_model.safetensors"))
            b, _ = st_load(os.path.join(runs["--zero2"], "checkpoint-4", "unet", "diffusion_pytorch_model.safetensors"))
            worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
            print("%s: zero2 vs zero1 largest |weight diff| %.3g" % (opt, worst), file=sys.stderr)
            self.assertLess(worst, TOL_ABS, opt)
            how = "--zero1" if opt == "adafactor" else "--zero2"
            r = os.path.join(self.tmp.name, "other-%s-resumed" % opt)
            shutil.copytree(os.path.join(runs["--zero2"], "checkpoint-2"), os.path.join(r, "checkpoint-2"))
            with open(os.path.join(r, "latest"), "w") as f:
                f.write("checkpoint-2\n")
            mpi(2, "-o", r, "--optimizer", opt, *extra, how, *base)
            self.assertEqual(same_files(files(r, 4), files(runs[how], 4)), [], (opt, how))

    def test_zero2_refused(self):
        """--zero2 with what it cannot do: one process, --fused-backward, per-tensor clipping, bf16
        weights, bf16 gradients; exit 2 with the reason, nothing written."""
        out = os.path.join(self.tmp.name, "zero2-refused")
        p = subprocess.run([TRAIN, "--zero2", "--unet", UNET, "-o", out, "--steps", "1", "-q", self.shard],
                           capture_output=True)
        self.assertEqual(p.returncode, 2, p.stderr.decode())
        self.assertIn("--zero2 shards the gradients over ranks: start it under mpirun -np N", p.stderr.decode())
        for extra, why in ((["--fused-backward"], "not with --fused-backward"),
                           (["--clip-per-tensor"], "not with --clip-per-tensor"),
                           (["--weight-dtype", "bf16"], "--weight-dtype bf16 runs"),
                           (["--grad-dtype", "bf16"], "--grad-dtype bf16 runs in one process only")):
            code, err, _ = mpi_raw(2, TRAIN, "--zero2", *extra, "--unet", UNET, "-o", out, "--steps", "1", "-q",
                                   self.shard)
            self.assertEqual(code, 2, err)
            self.assertIn(why, err)
        self.assertFalse(os.path.exists(out))

    def test_zero_device_tensor_runs(self):
        """8-bit AdamW and Adafactor under --zero1 and --zero2 on device ranks (the CPU table
        marked is_device, test_train --zero-device-mpi): each rank's device mirrors only its run
        of tensors (rank 1's starts past offset 0), steps it on device pointers, pulls it for the
        checkpoint's gather and pushes it after a resume: per rank byte-identical to CPU ranks."""
        out = os.path.join(self.tmp.name, "zero-device")
        os.makedirs(out)
        code, err, _ = mpi_raw(2, MAKE, "--zero-device-mpi", out, self.shard, timeout=300)
        self.assertEqual(code, 0, err)

    def test_zero1_bf16_moments(self):
        """--adam-moments bf16 with ZeRO-1: each rank rounds its segments with the bits of their
        global indices, so the sharded run matches the all-reduce run with bf16 moments as the fp32
        pair does (only where the gradient norm's last bits differ can a moment round the other
        way, by one bf16 spacing); the state file holds the gathered bf16 moments; a resumed run
        ends byte-identical to an uninterrupted one."""
        a = os.path.join(self.tmp.name, "bf16-allreduce")
        z = os.path.join(self.tmp.name, "bf16-zero1")
        args = ["--unet", UNET, "--batch", "2", "--accum", "1", "--save-every", "6", "--keep", "0",
                "--adam-moments", "bf16"] + COMMON + [self.shard]
        mpi(2, "-o", a, *args)
        mpi(2, "-o", z, "--zero1", *args)
        sa, _ = st_load(os.path.join(z, "checkpoint-%d" % STEPS, "state.safetensors"))
        sb, _ = st_load(os.path.join(a, "checkpoint-%d" % STEPS, "state.safetensors"))
        with open(os.path.join(z, "checkpoint-%d" % STEPS, "state.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
        self.assertEqual(head["adam_m"]["dtype"], "BF16")
        self.assertEqual(head["adam_v"]["dtype"], "BF16")
        for k in ("adam_m", "adam_v"):
            rel = float(np.linalg.norm(sa[k].astype(np.float64) - sb[k]) / max(np.linalg.norm(sb[k]), 1e-30))
            print("zero1 vs all-reduce, bf16 moments: %s normwise diff %.3g" % (k, rel), file=sys.stderr)
            self.assertLess(rel, 1e-3, k)
        wa, _ = st_load(os.path.join(z, "checkpoint-%d" % STEPS, "unet", "diffusion_pytorch_model.safetensors"))
        wb, _ = st_load(os.path.join(a, "checkpoint-%d" % STEPS, "unet", "diffusion_pytorch_model.safetensors"))
        worst = max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)
        print("zero1 vs all-reduce, bf16 moments: largest |weight diff| %.3g" % worst, file=sys.stderr)
        self.assertLess(worst, 1e-5)
        r = os.path.join(self.tmp.name, "bf16-zero1-resumed")
        shutil.copytree(os.path.join(z, "checkpoint-6"), os.path.join(r, "checkpoint-6"))
        with open(os.path.join(r, "latest"), "w") as f:
            f.write("checkpoint-6\n")
        mpi(2, "-o", r, "--zero1", *args)
        self.assertEqual(same_files(files(r, STEPS), files(z, STEPS)), [])

    def test_zero1_several_blocks(self):
        """ZeRO-1 over more than one reduction block (SD_DIST_BLOCK = 4M values): a from-scratch
        UNet of 8.5M weights (the tiny config with 64/128/128 channels) spans three, so every
        rank owns a segment of each and the checkpoint gathers them block by block. With fp32
        and with bf16 moments the sharded run's checkpoint equals the all-reduce run's, and a
        bf16 ZeRO-1 run resumed from its step-2 checkpoint ends byte-identical. ZeRO-2 with bf16
        moments, whose per-tensor reduce-scatters cut tensors at the blocks' and segments' ends,
        ends byte-identical to ZeRO-1."""
        with open(os.path.join(UNET, "unet", "config.json")) as f:
            cfg = json.load(f)
        cfg["block_out_channels"] = [64, 128, 128]
        path = os.path.join(self.tmp.name, "big.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        base = ["--unet-config", path, "--batch", "1", "--accum", "1", "--steps", "4", "--save-every", "2",
                "--keep", "0", "--seed", "3", "--lr", "1e-3", "--ema-decay", "0.99", "-j", "1", "-q", self.shard]
        for moments in ("fp32", "bf16"):
            a = os.path.join(self.tmp.name, "blocks-%s-allreduce" % moments)
            z = os.path.join(self.tmp.name, "blocks-%s-zero1" % moments)
            mpi(2, "-o", a, "--adam-moments", moments, *base)
            mpi(2, "-o", z, "--adam-moments", moments, "--zero1", *base)
            if moments == "bf16":  # ZeRO-2 over the three blocks: tensors straddle the blocks' ends
                z2 = os.path.join(self.tmp.name, "blocks-bf16-zero2")
                mpi(2, "-o", z2, "--adam-moments", moments, "--zero2", *base)
                self.assertEqual(same_files(files(z2, 4), files(z, 4)), [])
            sa, ma = st_load(os.path.join(z, "checkpoint-4", "state.safetensors"))
            sb, _ = st_load(os.path.join(a, "checkpoint-4", "state.safetensors"))
            self.assertGreater(int(ma["param_floats"]), 2 * 4 * 1024 * 1024)
            for k in ("adam_m", "adam_v"):
                self.assertEqual(len(sa[k]), int(ma["param_floats"]))
                rel = float(np.linalg.norm(sa[k].astype(np.float64) - sb[k]) / max(np.linalg.norm(sb[k]), 1e-30))
                print("%s moments, 3 blocks: zero1 vs all-reduce %s normwise diff %.3g" % (moments, k, rel),
                      file=sys.stderr)
                self.assertLess(rel, 1e-3 if moments == "bf16" else 1e-5, k)
                # every block's segments arrived: no stretch of the gathered moments left zero
                nz = np.flatnonzero(sa[k] != 0)
                self.assertLess(len(sa[k]) - (nz[-1] + 1) if len(nz) else len(sa[k]), 1000, k)
        r = os.path.join(self.tmp.name, "blocks-bf16-zero1-resumed")
        z = os.path.join(self.tmp.name, "blocks-bf16-zero1")
        shutil.copytree(os.path.join(z, "checkpoint-2"), os.path.join(r, "checkpoint-2"))
        with open(os.path.join(r, "latest"), "w") as f:
            f.write("checkpoint-2\n")
        mpi(2, "-o", r, "--adam-moments", "bf16", "--zero1", *base)
        self.assertEqual(same_files(files(r, 4), files(z, 4)), [])

    def test_usage_error_on_one_rank(self):
        """An option refused on rank 1 only (its --config file is missing there): every rank exits 2
        at once, rank 0 saying another rank's options were refused, instead of waiting for the
        hung-peer timeout in its first collective."""
        w = rank_wrapper(os.path.join(self.tmp.name, "usage1.sh"),
                         "--config " + shlex.quote(os.path.join(self.tmp.name, "missing.json")))
        code, err, secs = mpi_raw(2, w, "--unet", UNET, "-o", os.path.join(self.tmp.name, "usage1"), "--steps", "2",
                                  "-j", "1", self.shard, env={"SD_DIST_TIMEOUT": "60"})
        print("usage error on rank 1: exit %d after %.1f s" % (code, secs), file=sys.stderr)
        self.assertEqual(code, 2, err)
        self.assertIn("missing.json", err)
        self.assertIn("rank 0 of 2: another rank's options were refused", err)
        self.assertLess(secs, 30)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "usage1")))

    def test_grad16_refused(self):
        """--grad-dtype bf16 under mpirun: every rank exits 2 naming the reason (the sum over the
        ranks would need the gradient in fp32) before any work."""
        out = os.path.join(self.tmp.name, "g16")
        code, err, _ = mpi_raw(2, TRAIN, "--unet", UNET, "-o", out, "--grad-dtype", "bf16", "--steps", "2", "-j", "1",
                               self.shard)
        self.assertEqual(code, 2, err)
        self.assertIn("--grad-dtype bf16 runs in one process only", err)
        self.assertFalse(os.path.exists(out))
        # bf16 weights under plain mpirun: the same usage error, said once (rank 0), not a late exit 3
        code, err, _ = mpi_raw(2, TRAIN, "--unet", UNET, "-o", out, "--weight-dtype", "bf16", "--steps", "2", "-j", "1",
                               self.shard)
        self.assertEqual(code, 2, err)
        self.assertEqual(err.count("--weight-dtype bf16 runs in one process only"), 1, err)
        self.assertFalse(os.path.exists(out))

    def test_ranks_start_from_one_state(self):
        """Rank 1 with an output directory that lacks rank 0's checkpoint (it would start at step 0
        while rank 0 resumes at step 2), or with one more shard (other batches): the run stops
        before its first step with an error naming rank 1 and what differs; nothing is written."""
        shared = os.path.join(self.tmp.name, "agree-shared")
        shutil.copytree(os.path.join(self.two, "checkpoint-2"), os.path.join(shared, "checkpoint-2"))
        with open(os.path.join(shared, "latest"), "w") as f:
            f.write("checkpoint-2\n")
        before = files(shared, 2)
        w = rank_wrapper(os.path.join(self.tmp.name, "agree-out.sh"),
                         "-o " + shlex.quote(os.path.join(self.tmp.name, "agree-local")), "-o " + shlex.quote(shared))
        args = ["--unet", UNET, "--batch", "2", "--accum", "1", "--save-every", "2"] + COMMON + [self.shard]
        code, err, secs = mpi_raw(2, w, *args, env={"SD_DIST_TIMEOUT": "60"})
        print("rank 1 without the checkpoint: exit %d after %.1f s" % (code, secs), file=sys.stderr)
        self.assertNotEqual(code, 0)
        self.assertIn("rank 1 of 2 does not start from rank 0's state: its step is 0, rank 0's 2", err)
        self.assertLess(secs, 30)
        self.assertEqual(sorted(os.listdir(shared)), ["checkpoint-2", "latest"])
        self.assertEqual(same_files(files(shared, 2), before), [])
        extra = os.path.join(self.tmp.name, "agree-extra.shard")
        shutil.copyfile(self.shard, extra)
        w = rank_wrapper(os.path.join(self.tmp.name, "agree-shards.sh"), shlex.quote(extra))
        out = os.path.join(self.tmp.name, "agree-shards")
        code, err, secs = mpi_raw(2, w, "--unet", UNET, "-o", out, "--steps", "2", "-j", "1", "-q", self.shard,
                                  env={"SD_DIST_TIMEOUT": "60"})
        self.assertNotEqual(code, 0)
        self.assertRegex(err, r"rank 1 of 2 does not start from rank 0's state: its data fingerprint is [0-9a-f]{16}")
        self.assertFalse(os.path.exists(os.path.join(out, "latest")))

    def test_save_outlasts_timeout(self):
        """Rank 0's first fsync (inside the checkpoint's writing) held 8 s by strace, with
        SD_DIST_TIMEOUT=3: rank 1 waits for the save instead of stopping as a hung peer, the run
        exits 0 with the checkpoint whole."""
        strace = shutil.which("strace")
        if not strace:
            self.skipTest("no strace to slow the save down")
        delay = "%s -f --seccomp-bpf -qq -o /dev/null -e trace=fsync -e inject=fsync:delay_enter=8000000:when=1" % \
            shlex.quote(strace)
        probe = subprocess.run(delay.split() + ["true"], capture_output=True)
        if probe.returncode != 0:
            self.skipTest("strace cannot trace here: %s" % probe.stderr.decode().strip())
        w = rank_wrapper(os.path.join(self.tmp.name, "slow-save.sh"), "", delay + " TRAIN")
        for extra in ([], ["--zero1"]):
            out = os.path.join(self.tmp.name, "slow-save" + "".join(extra))
            code, err, secs = mpi_raw(2, w, "--unet", UNET, "-o", out, "--steps", "2", "--ema-decay", "0.99",
                                      "--batch", "2", "-j", "1", *extra, self.shard, env={"SD_DIST_TIMEOUT": "3"})
            print("rank 0's save held 8 s, timeout 3 s%s: exit %d after %.1f s" % (" ".join([""] + extra), code, secs),
                  file=sys.stderr)
            self.assertEqual(code, 0, err)
            self.assertNotIn("SD_DIST_TIMEOUT", err)
            self.assertGreater(secs, 8)
            self.assertEqual(latest(out), 2)
            self.assertEqual(state_meta(os.path.join(out, "checkpoint-2", "state.safetensors"))["step"], "2")

    def test_epochs_after_another_world_size(self):
        """--epochs 4 on 2 ranks (batch 2: 7 batches an epoch, 4 a step, 7 steps), resumed from its
        step-2 checkpoint by one process: the steps left are the batches the cursor has not reached
        (one a step), so the run ends exactly at the end of the fourth epoch, not 2 x 7 steps of
        one batch later; a warning names the LR schedule's new span."""
        out = os.path.join(self.tmp.name, "epochs-two")
        args = ["--unet", UNET, "--batch", "2", "--accum", "1", "--epochs", "4", "--save-every", "2", "--keep", "0",
                "--lr-schedule", "cosine", "--seed", "5", "-j", "1", self.shard]
        err = mpi(2, "-o", out, *args)
        self.assertIn("= 14 steps", err)
        end = state_meta(os.path.join(out, "checkpoint-14", "state.safetensors"))
        at2 = state_meta(os.path.join(out, "checkpoint-2", "state.safetensors"))
        self.assertEqual(at2["epoch"], "0")
        served = int(at2["batch"])  # batches consumed in 2 steps of 2 ranks (4, more if one was all skipped)
        one = os.path.join(self.tmp.name, "epochs-one")
        shutil.copytree(os.path.join(out, "checkpoint-2"), os.path.join(one, "checkpoint-2"))
        with open(os.path.join(one, "latest"), "w") as f:
            f.write("checkpoint-2\n")
        p = subprocess.run([TRAIN, "-o", one] + args, capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        want = 2 + 28 - served
        self.assertEqual(latest(one), want, p.stderr.decode())
        self.assertIn("the LR schedule spans %d steps instead of 14" % want, p.stderr.decode())
        got = state_meta(os.path.join(one, "checkpoint-%d" % want, "state.safetensors"))
        self.assertEqual(got["epoch"], "3")  # 28 batches: epochs of 8, 6, 8 and 6 (buckets of 5 and 9 carried)
        self.assertEqual((got["epoch"], got["batch"]), (end["epoch"], end["batch"]))
        # a later resume of that one-process run (same world as its checkpoint) keeps its plan:
        # it ends at the same step, not 4 x 7 one-batch steps from zero, with the same LR span
        again = os.path.join(self.tmp.name, "epochs-again")
        shutil.copytree(os.path.join(one, "checkpoint-10"), os.path.join(again, "checkpoint-10"))
        with open(os.path.join(again, "latest"), "w") as f:
            f.write("checkpoint-10\n")
        p = subprocess.run([TRAIN, "-o", again] + args, capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(latest(again), want, p.stderr.decode())
        self.assertIn("the checkpoint's plan of %d steps" % want, p.stderr.decode())
        self.assertEqual(same_files(files(again, want, ema=False), files(one, want, ema=False)), [])

    def test_skip_summary_counts_every_rank(self):
        """The generated shard has two records that are always skipped: the summary of 2 ranks
        (batch 2 each) counts every skip of both, as one process with the same global batch does."""
        def summary(err):
            return [l.split(": ", 1)[1] for l in err.splitlines() if re.match(r"sd-train: (records skipped, counted each time drawn: | +\d+ )", l)]
        args = ["--unet", UNET, "--steps", "6", "--batch", "2", "--seed", "5", "-j", "1", self.shard]
        two = mpi(2, "-o", os.path.join(self.tmp.name, "skips-two"), "--accum", "1", *args)
        p = subprocess.run([TRAIN, "-o", os.path.join(self.tmp.name, "skips-one"), "--accum", "2"] + args,
                           capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        one = summary(p.stderr.decode())
        print("skipped records, one process: %s" % one, file=sys.stderr)
        self.assertTrue(one and one[0].startswith("records skipped, counted each time drawn: "), p.stderr.decode())
        self.assertEqual(sorted(summary(two)), sorted(one), two)

    def test_no_world_refused(self):
        """SD_DIST=none under mpirun -np 2: each process would train the same run into the same
        output; both refuse, naming the launcher's variable, and nothing is written."""
        out = os.path.join(self.tmp.name, "no-world")
        code, err, _ = mpi_raw(2, "-x", "SD_DIST=none", TRAIN, "--unet", UNET, "-o", out, "--steps", "2", "-q",
                               self.shard)
        self.assertNotEqual(code, 0)
        self.assertIn("started as one of 2 processes (OMPI_COMM_WORLD_SIZE=2)", err)
        self.assertFalse(os.path.exists(out))

    def test_world_size_note(self):
        out = os.path.join(self.tmp.name, "regrow")
        shutil.copytree(os.path.join(self.two, "checkpoint-2"), os.path.join(out, "checkpoint-2"))
        with open(os.path.join(out, "latest"), "w") as f:
            f.write("checkpoint-2\n")
        p = subprocess.run([TRAIN, "--unet", UNET, "-o", out, "--batch", "2", "--accum", "1"] + COMMON +
                           [self.shard], capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn("made with 2 rank(s), this run has 1", p.stderr.decode())


class MemoryPlanMPI(unittest.TestCase):
    def test_zero1_plan_is_rank_0s_share(self):
        with tempfile.TemporaryDirectory() as tmp:
            shard = os.path.join(tmp, "cache.shard")
            subprocess.run([MAKE, "--make-shard", shard], check=True, capture_output=True)
            cfg = os.path.join(UNET, "unet", "config.json")
            base = ["--unet-config", cfg, "--memory-plan", "-j", "1", shard]
            one = json.loads(subprocess.run([TRAIN] + base, capture_output=True, check=True).stdout)
            cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", "2", TRAIN, "--zero1"] + base
            env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
            p = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            lines = p.stdout.decode().splitlines()
            self.assertEqual(len(lines), 1, lines)
            two = json.loads(lines[0])
            n = one["weights"] // 4  # floats of the flat buffer; one reduction block here
            self.assertLess(n, 1 << 22)
            self.assertEqual(one["optimizer"], 8 * n)
            self.assertEqual(two["optimizer"], 8 * (n // 2))  # rank 0: [0, n / 2) of the block
            self.assertIs(two["setup"]["zero1"], True)
            self.assertEqual(two["weights"], one["weights"])
            # --zero2: the gradients too are rank 0's share, plus the per-op scratch
            p = subprocess.run(cmd[:-len(base) - 1] + ["--zero2"] + base, capture_output=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            z2 = json.loads(p.stdout.decode())
            self.assertIs(z2["setup"]["zero2"], True)
            self.assertEqual(z2["optimizer"], two["optimizer"])
            self.assertEqual(z2["detail"]["gradient_share"], 4 * (n // 2))
            self.assertEqual(two["gradients"], one["gradients"])
            self.assertLess(z2["gradients"], 0.6 * one["gradients"])
            self.assertGreater(z2["detail"]["reduction_buffer"], 0)
            self.assertLess(z2["total"], two["total"])
            # rank 0 gathers the whole moments for each checkpoint: the peak of its run
            self.assertEqual(one["detail"]["save_gather"], 0)
            self.assertEqual(two["detail"]["save_gather"], 8 * n)
            self.assertEqual(z2["detail"]["save_gather"], 8 * n)
            # Adafactor by whole tensors: rank 0's run of the state, its run of the gradient
            af = ["--optimizer", "adafactor"] + base
            one_af = json.loads(subprocess.run([TRAIN] + af, capture_output=True, check=True).stdout)
            p = subprocess.run(cmd[:-len(base) - 1] + ["--zero2"] + af, capture_output=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            z2af = json.loads(p.stdout.decode())
            self.assertLess(z2af["optimizer"], one_af["optimizer"])
            self.assertGreater(z2af["optimizer"], 0)
            self.assertEqual(z2af["detail"]["save_gather"], one_af["optimizer"])
            self.assertLess(z2af["detail"]["gradient_share"], 0.75 * one_af["gradients"])
            # on GPU ranks too (planned without a device to ask): the same shares of the state
            # and gradients as on CPU ranks, on the device; no checkpoint gather there
            dev = ["--device", "cuda:0", "--gpu-memory-limit", "24"]
            p = subprocess.run(cmd[:-len(base) - 1] + ["--zero2"] + dev + af, capture_output=True, env=env,
                               timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            z2dev = json.loads(p.stdout.decode())
            self.assertEqual(z2dev["optimizer"], z2af["optimizer"])
            self.assertEqual(z2dev["detail"]["gradient_share"], z2af["detail"]["gradient_share"])
            self.assertEqual(z2dev["detail"]["save_gather"], 0)


if __name__ == "__main__":
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    TRAIN, MAKE, UNET, have = sys.argv[1:5]
    if not MPIRUN or have.upper() not in ("1", "ON", "TRUE", "YES"):
        print("skipped: %s" % ("no mpirun" if not MPIRUN else "sd-train built without MPI"), file=sys.stderr)
        sys.exit(77)
    sys.argv = sys.argv[:1] + sys.argv[5:]
    unittest.main(verbosity=2)
