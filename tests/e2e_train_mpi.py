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
Exit 77 (skipped) when mpirun is missing or sd-train was built without MPI.
Usage: e2e_train_mpi.py SD_TRAIN TEST_TRAIN UNET_DIR HAVE_MPI"""
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
        self.assertEqual(files(again, STEPS), files(self.two, STEPS))

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
        self.assertEqual(files(out, STEPS), files(self.two, STEPS))

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
        self.assertEqual(files(r, STEPS), files(z, STEPS))

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
        self.assertEqual(files(r, STEPS), files(z, STEPS))

    def test_zero1_several_blocks(self):
        """ZeRO-1 over more than one reduction block (SD_DIST_BLOCK = 4M values): a from-scratch
        UNet of 8.5M weights (the tiny config with 64/128/128 channels) spans three, so every
        rank owns a segment of each and the checkpoint gathers them block by block. With fp32
        and with bf16 moments the sharded run's checkpoint equals the all-reduce run's, and a
        bf16 ZeRO-1 run resumed from its step-2 checkpoint ends byte-identical."""
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
        self.assertEqual(files(r, 4), files(z, 4))

    def test_world_size_note(self):
        out = os.path.join(self.tmp.name, "regrow")
        shutil.copytree(os.path.join(self.two, "checkpoint-2"), os.path.join(out, "checkpoint-2"))
        with open(os.path.join(out, "latest"), "w") as f:
            f.write("checkpoint-2\n")
        p = subprocess.run([TRAIN, "--unet", UNET, "-o", out, "--batch", "2", "--accum", "1"] + COMMON +
                           [self.shard], capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn("made with 2 rank(s), this run has 1", p.stderr.decode())


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
