#!/usr/bin/env python3
"""kohya-style image pipeline, for bench_image.sh. sd-scripts' load_image
(PIL open, convert("RGB") only when the mode is not RGB, which also drops
alpha) and trim_and_resize_if_required (cv2 INTER_AREA when both sides
shrink, PIL LANCZOS otherwise), the record's crop box, then ToTensor +
Normalize(0.5, 0.5) to float CHW.
Two variants of the area resize:
  pil  PIL's BOX filter on the PIL image (cv2 is not in Debian's CI set).
       Same weights as INTER_AREA for integer factors; for fractional ones
       BOX takes whole pixels whose centres fall in the box where INTER_AREA
       weights edge pixels by the part covered. Skips kohya's full-size
       np.array copy before the resize.
  cv2  exactly sd-scripts: np.array of the full image, cv2.resize INTER_AREA,
       with cv2.setNumThreads(1) so it is one core like the others (only
       when the cv2 module is importable).
usage: bench_image_pil.py time JOBS.tsv PASSES [pil|cv2]   images/s, one thread,
                                                            then CPU time per format
       bench_image_pil.py compare JOBS.tsv IMAGE_DUMP       mean abs diff vs sdtk"""
import io
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

try:
    import cv2

    cv2.setNumThreads(1)
except ImportError:
    cv2 = None


def jobs(path):
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        yield f[0], int(f[1]), int(f[2]), [int(x) for x in f[3:9]]


def file_format(path, off):
    """jpeg, png, webp or other, from the first bytes (as sdtk's header reader names them)."""
    with open(path, "rb") as fh:
        fh.seek(off)
        b = fh.read(12)
    if b[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if b[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if b[:4] == b"RIFF" and b[8:12] == b"WEBP":
        return "webp"
    return "other"


def load(path, off, size):
    """sd-scripts' load_image, reading a tar member in place when given."""
    if off or size >= 0:
        with open(path, "rb") as fh:
            fh.seek(off)
            im = Image.open(io.BytesIO(fh.read(size)))
    else:
        im = Image.open(path)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return im


def kohya_rgb8(path, off, size, p, kind="pil"):
    """load_image + trim_and_resize_if_required with the record's crop box."""
    im = load(path, off, size)
    rw, rh, l, t, r, b = p
    w, h = im.size
    shrink = w > rw and h > rh  # sd-scripts' rule for INTER_AREA
    if kind == "cv2":
        a = np.array(im, np.uint8)
        if (w, h) != (rw, rh):
            a = cv2.resize(a, (rw, rh), interpolation=cv2.INTER_AREA) if shrink else \
                np.asarray(Image.fromarray(a).resize((rw, rh), Image.LANCZOS))
        return a[t:b, l:r]
    if (w, h) != (rw, rh):
        im = im.resize((rw, rh), Image.BOX if shrink else Image.LANCZOS)
    return np.asarray(im)[t:b, l:r]


def main():
    mode, tsv = sys.argv[1], sys.argv[2]
    js = list(jobs(tsv))
    if mode == "time":
        passes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
        kind = sys.argv[4] if len(sys.argv) > 4 else "pil"
        if kind == "cv2" and cv2 is None:
            print("kohya-style with cv2: skipped (no cv2 module)")
            return
        fmts = [file_format(path, off) for path, off, size, p in js]
        by_fmt = {}  # format -> [images, CPU seconds]
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(passes):
            for (path, off, size, p), fmt in zip(js, fmts):
                c1 = time.process_time()
                a = kohya_rgb8(path, off, size, p, kind)
                x = a.transpose(2, 0, 1).astype(np.float32) / 127.5 - 1.0  # ToTensor + Normalize(0.5, 0.5)
                del x
                e = by_fmt.setdefault(fmt, [0, 0.0])
                e[0] += 1
                e[1] += time.process_time() - c1
        s, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = len(js) * passes
        name = "kohya-style %s 1 thread" % ("PIL BOX" if kind == "pil" else "cv2 INTER_AREA")
        print("%s: %d images in %.2f s = %.2f images/s; %.2f CPU s = %.2f images per CPU-second"
              % (name, n, s, n / s, cpu, n / cpu))
        for fmt in ("jpeg", "png", "webp", "other"):
            if fmt in by_fmt and by_fmt[fmt][1] > 0:
                k, c = by_fmt[fmt]
                print("%s %s: %d images, %.3f CPU s = %.2f images per CPU-second" % (name, fmt, k, c, k / c))
        return
    exe = sys.argv[3]
    kinds = ["pil"] + (["cv2"] if cv2 is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        d = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        maes = {k: [] for k in kinds}
        for path, off, size, p in js:
            out = os.path.join(tmp, "o.raw")
            d.stdin.write("\t".join(str(x) for x in [path, off, size] + p + [0, "rgb8", out]) + "\n")
            d.stdin.flush()
            ans = d.stdout.readline().strip()
            if ans != "ok":
                print("sdtk failed:", ans)
                continue
            rw, rh, l, t, r, b = p
            ours = np.fromfile(out, np.uint8).reshape(b - t, r - l, 3).astype(int)
            for k in kinds:
                maes[k].append(np.abs(ours - kohya_rgb8(path, off, size, p, k).astype(int)).mean())
        d.stdin.close()
        d.wait()
        for k in kinds:
            m = np.array(maes[k])
            print("sdtk vs kohya-style %s (LANCZOS up, no ICC, alpha dropped): %d images, mean abs diff (0..255) mean %.3f,"
                  " median %.3f, p90 %.3f, max %.3f" % ("PIL BOX" if k == "pil" else "cv2 INTER_AREA", len(m), m.mean(),
                                                       np.median(m), np.percentile(m, 90), m.max()))


if __name__ == "__main__":
    main()
