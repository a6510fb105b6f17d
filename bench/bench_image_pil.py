#!/usr/bin/env python3
"""kohya-style image pipeline in PIL, for bench_image.sh: open, convert RGB,
resize with sd-scripts' rule (cv2 INTER_AREA when both sides shrink, PIL
LANCZOS otherwise), crop the record's box, to float CHW in [-1, 1].
cv2 is not in Debian's CI set, so INTER_AREA is PIL's BOX filter, which is the
same pixel-area average for downscaling.
usage: bench_image_pil.py time JOBS.tsv          images/s, one thread
       bench_image_pil.py compare JOBS.tsv IMAGE_DUMP   mean abs diff vs sdtk"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image


def jobs(path):
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        yield f[0], int(f[1]), int(f[2]), [int(x) for x in f[3:9]]


def kohya_rgb8(path, off, size, p):
    """sd-scripts' load_image + trim_and_resize_if_required, centre crop given."""
    if off or size >= 0:
        import io
        with open(path, "rb") as fh:
            fh.seek(off)
            im = Image.open(io.BytesIO(fh.read(size)))
    else:
        im = Image.open(path)
    im = im.convert("RGB")
    rw, rh, l, t, r, b = p
    w, h = im.size
    flt = Image.BOX if (w >= rw and h >= rh) else Image.LANCZOS
    im = im.resize((rw, rh), flt)
    return np.asarray(im)[t:b, l:r]


def main():
    mode, tsv = sys.argv[1], sys.argv[2]
    js = list(jobs(tsv))
    if mode == "time":
        passes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
        t0 = time.perf_counter()
        for _ in range(passes):
            for path, off, size, p in js:
                a = kohya_rgb8(path, off, size, p)
                x = a.transpose(2, 0, 1).astype(np.float32) / 127.5 - 1.0  # ToTensor + Normalize(0.5, 0.5)
                del x
        s = time.perf_counter() - t0
        n = len(js) * passes
        print("PIL kohya-style 1 thread: %d images in %.2f s = %.2f images/s" % (n, s, n / s))
        return
    exe = sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        d = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        maes = []
        for i, (path, off, size, p) in enumerate(js):
            out = os.path.join(tmp, "o.raw")
            d.stdin.write("\t".join(str(x) for x in [path, off, size] + p + [0, "rgb8", out]) + "\n")
            d.stdin.flush()
            ans = d.stdout.readline().strip()
            if ans != "ok":
                print("sdtk failed:", ans)
                continue
            rw, rh, l, t, r, b = p
            ours = np.fromfile(out, np.uint8).reshape(b - t, r - l, 3).astype(int)
            maes.append(np.abs(ours - kohya_rgb8(path, off, size, p).astype(int)).mean())
        d.stdin.close()
        d.wait()
        m = np.array(maes)
        print("sdtk vs kohya-style (INTER_AREA=BOX down / LANCZOS up, no ICC, alpha dropped): %d images, mean abs diff"
              " (0..255) mean %.3f, median %.3f, p90 %.3f, max %.3f" % (len(m), m.mean(), np.median(m), np.percentile(m, 90), m.max()))


if __name__ == "__main__":
    main()
