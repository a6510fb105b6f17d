#!/usr/bin/env python3
"""What loss masks cost in sd-latents (issue 30): N RGBA pictures (wallpaper photos resized to
WxH with a generated alpha channel, tests/mask_alpha.py) through sd-meta | sd-bucket, then
sd-latents with the tiny golden VAE, once plain and once with --masks alpha: wall seconds of
each and the record bytes (value sizes from mdb_dump). The peer figure is the bytes sd-scripts'
npz alpha_mask would hold for the same masks (float32 at the image's size).
Usage: bench_masks.py BUILD_DIR [N] [W] [H]   (SDTK_PHOTOS must name the photos)"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from mask_alpha import rgba_from_photo  # noqa: E402


def main():
    build = sys.argv[1]
    n, w, h = (int(x) for x in (sys.argv[2:] + ["16", "512", "512"][len(sys.argv) - 2:])[:3])
    tools = os.path.join(build, "tools")
    root = os.environ["SDTK_PHOTOS"]
    photos = sorted(f for f in os.listdir(root) if f.lower().endswith((".jpg", ".png")))
    tmp = tempfile.mkdtemp(prefix="bench-masks-")
    for i in range(n):
        rgba_from_photo(os.path.join(root, photos[i % len(photos)]), (w, h), i).save(os.path.join(tmp, "p%03d.png" % i))
        with open(os.path.join(tmp, "p%03d.txt" % i), "w") as f:
            f.write("a photo\n")
    meta = subprocess.run([os.path.join(tools, "sd-meta"), "-q", tmp], capture_output=True, check=True).stdout
    jl = subprocess.run([os.path.join(tools, "sd-bucket"), "-q", "--plan", "kohya", "-r", "%dx%d" % (w, h), "-"],
                        input=meta, capture_output=True, check=True).stdout
    vae = os.path.join(HERE, "..", "tests", "golden", "vae", "sd")
    res = {}
    for name, extra in (("plain", []), ("masks", ["--masks", "alpha"])):
        out = os.path.join(tmp, name + ".shard")
        t0 = time.time()
        subprocess.run([os.path.join(tools, "sd-latents"), "-q", "-j", "2", "--vae", vae, "-o", out] + extra + ["-"],
                       input=jl, check=True)
        secs = time.time() - t0
        dump = subprocess.run(["mdb_dump", "-n", "-s", "latents", out], capture_output=True, text=True).stdout
        vals = dump.split("HEADER=END\n", 1)[1].split("DATA=END")[0].split()[1::2]
        res[name] = (secs, sum(len(v) // 2 for v in vals) / len(vals))
    (ps, pb), (ms, mb) = res["plain"], res["masks"]
    print("%d RGBA %dx%d: sd-latents plain %.2f s, --masks alpha %.2f s (+%.0f%%); record %.0f B plain, %.0f B with "
          "mask (+%.0f B); kohya alpha_mask %d B" % (n, w, h, ps, ms, 100 * (ms / ps - 1), pb, mb, mb - pb, 4 * w * h))


if __name__ == "__main__":
    main()
