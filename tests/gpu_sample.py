#!/usr/bin/env python3
"""sd-sample's goldens on a device (issue 29: "on a lent GPU the same within
the selftest's tolerances"): the tiny SD 1.x, SD 2.x-v and SDXL folders of
tests/e2e_sample.py, every sampler, 10 steps, CFG 7 with a negative prompt
(and SDXL without one), rendered with `sd-sample --device DEV` and with
`--device cpu`; each image must be within 1 level of diffusers' golden PNG
(tests/golden/sample/, tests/golden/make_sample_golden.py) and of the CPU's
image on >= 99.9% of its pixels, the test e2e_sample holds the CPU to.
Prints one line per image and the device's and the CPU's seconds, and with
--log FILE writes the same (with the commit, the date and nvidia-smi's
lines) as a raw log for docs/gpu-runs/.

  gpu_sample.py SD_SAMPLE GOLDEN_DIR [--device cuda:K|cpu] [--log FILE]

--device cpu (ctest gpu_sample_harness) runs the whole script with the CPU
as the device (rendered once: the CPU's images are the device's), and
checks the check: an image 2 levels off on 1% of its pixels must fail the
comparison. Exit 0 all passed, 1 a comparison failed,
77 skipped (no NVIDIA GPU listed by nvidia-smi, or an sd-sample built
without CUDA), anything else an error."""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    from PIL import Image
    import e2e_sample
except ImportError as e:  # pragma: no cover
    print("skipped: %s" % e)
    sys.exit(77)

SKIP = 77
# the share of pixels that must be within 1 level (e2e_sample's test_matches_diffusers)
WITHIN_1 = 0.999


def cases(enc):
    """The golden rows of a family and the golden PNG's name of each."""
    rows = [dict(e2e_sample.GOLDEN_CASE, sampler=s) for s in e2e_sample.SAMPLERS]
    names = list(e2e_sample.SAMPLERS)
    if len(enc) == 2:  # SDXL without a negative prompt: zeros, as diffusers
        rows.append({k: v for k, v in dict(e2e_sample.GOLDEN_CASE, sampler="euler").items() if k != "negative"})
        names.append("noneg_euler")
    return rows, names


def close(a, b):
    """(share of pixels within 1 level, largest difference) of two images."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return (d <= 1).mean(), int(d.max())


def render(sample, model, prompts, out, device):
    """sd-sample over prompts on device; (seconds, exit code, stderr)."""
    t = time.perf_counter()
    p = subprocess.run([sample, "--model", model, "--prompts", prompts, "-o", out, "--device", device, "-q",
                        "--no-contact-sheet"], capture_output=True, text=True)
    return time.perf_counter() - t, p.returncode, p.stderr


def header(device, sample):
    """The log's first lines: date, commit, the device as nvidia-smi lists it."""
    lines = ["# sd-sample goldens on %s, %s UTC" % (device, datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"))]
    here = os.path.dirname(os.path.abspath(__file__))
    for cmd in (["git", "-C", here, "log", "-1", "--format=commit %H %s"], [sample, "--version"],
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            lines += ["# " + x for x in (p.stdout + p.stderr).strip().splitlines()]
        except (OSError, subprocess.TimeoutExpired) as e:
            lines.append("# %s: %s" % (cmd[0], e))
    return lines


def has_gpu():
    """Whether nvidia-smi lists a GPU."""
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "GPU" in p.stdout


def check_the_check(img, golden):
    """An image 2 levels off on 1% of its pixels must fail (the comparison
    itself is alive); returns the problem or None."""
    bad = img.astype(np.int16).copy()
    flat = bad.reshape(-1)
    flat[:: 100] = np.where(flat[:: 100] < 128, flat[:: 100] + 2, flat[:: 100] - 2)
    share, _ = close(bad.astype(np.uint8), golden)
    return None if share < WITHIN_1 else "a perturbed image passed (%.4f within 1 level)" % share


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sample")
    ap.add_argument("golden")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--log")
    a = ap.parse_args()
    e2e_sample.GOLDEN = a.golden
    if a.device != "cpu" and not has_gpu():
        print("skipped: no NVIDIA GPU (nvidia-smi lists none); run it where one is, see docs/GPU.md")
        return SKIP
    out = header(a.device, a.sample)
    for line in out:
        print(line)

    def say(line):
        print(line, flush=True)
        out.append(line)
    failed = 0
    tmp = tempfile.mkdtemp(prefix="gpusample-")
    try:
        for fam, (unet, vae, enc, pred) in e2e_sample.GOLDEN_FAMILIES.items():
            model = os.path.join(tmp, fam)
            e2e_sample.make_model(model, unet, vae, enc, pred)
            rows, names = cases(enc)
            prompts = e2e_sample.jsonl(os.path.join(tmp, fam + ".jsonl"), rows)
            runs = {}
            for dev in (a.device, "cpu") if a.device != "cpu" else ("cpu",):
                d = os.path.join(tmp, "%s-%s" % (fam, dev.replace(":", "")))
                secs, code, err = render(a.sample, model, prompts, d, dev)
                if code and "without CUDA" in err:
                    print("skipped: %s" % err.strip())
                    return SKIP
                if code:
                    say("%s on %s: sd-sample exit %d\n%s" % (fam, dev, code, err))
                    return 2
                say("%s: %d images on %s in %.2f s (model load included)" % (fam, len(rows), dev, secs))
                runs[dev] = d
            devdir, cpudir = runs[a.device], runs["cpu"]  # the same folder in the harness
            for i, name in enumerate(names):
                png = "%05d.png" % i
                img = np.asarray(e2e_sample.pixels(os.path.join(devdir, png)))
                cpu = np.asarray(e2e_sample.pixels(os.path.join(cpudir, png)))
                gold = np.asarray(e2e_sample.pixels(os.path.join(a.golden, "sample", "%s_%s.png" % (fam, name))))
                g, gm = close(img, gold)
                c, cm = close(img, cpu)
                ok = g >= WITHIN_1 and c >= WITHIN_1
                failed += not ok
                say("%-22s vs diffusers %.4f within 1 level (largest %3d), vs CPU %.4f (largest %3d)  %s"
                    % ("%s_%s" % (fam, name), g, gm, c, cm, "pass" if ok else "FAIL"))
                if a.device == "cpu" and i == 0:
                    why = check_the_check(img, gold)
                    if why:
                        say("check of the check: " + why + "  FAIL")
                        failed += 1
        say("%s: %d image(s) failed (tolerance: >= %.1f%% of pixels within 1 level of diffusers' and of the CPU's)"
            % ("all passed" if not failed else "FAILED", failed, 100 * WITHIN_1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if a.log:
            with open(a.log, "w") as f:
                f.write("\n".join(out) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
