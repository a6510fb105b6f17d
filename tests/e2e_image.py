#!/usr/bin/env python3
"""Image pipeline end to end: fixtures built here with PIL (and a hand-made
16-bit PNG), run through tests/image_dump (sd_image_load_*), checked for exact
sizes, crop boxes, flips, EXIF rotation, alpha on white, grey/16-bit/CMYK to
sRGB, tar members by offset, clear errors and bomb refusal; the direct
decoders (PNG pixels exact, every filter type in runs and mixes at odd
sizes, the area resize against a float INTER_AREA, JPEG DCT-scaled decode,
ICC profiles) and the files they leave to libvips; enlargements against
PIL's LANCZOS byte for byte (pixel centres: the 8x8 column case). Every
job runs twice, with the AVX2 loops and without (image_dump --portable):
the bytes must be the same.
With --photos: every photo in $SDTK_PHOTOS at two bucket-style plans against
PIL's decode of the same box resized by a float INTER_AREA when both sides
shrink, by PIL's LANCZOS otherwise, and three photos shrunk to a quarter
and taken back up against PIL's LANCZOS (>= 99% of values within 1 level)
(exit 77 when SDTK_PHOTOS is not set).
Usage: e2e_image.py [--photos] IMAGE_DUMP"""
import io
import math
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib

import numpy as np
from PIL import Image, ImageOps

FAILS = []


def check(ok, what):
    if not ok:
        FAILS.append(what)
        print("FAIL:", what, file=sys.stderr)


class Dump:
    """One image_dump process fed job lines; returns arrays or error text."""

    def __init__(self, cmd, tmp):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.tmp = tmp
        self.n = 0

    def run(self, path, rw, rh, box=None, flip=0, offset=0, size=-1, fmt="rgb8"):
        l, t, r, b = box or (0, 0, rw, rh)
        self.n += 1
        out = os.path.join(self.tmp, "out%d.raw" % self.n)
        job = "\t".join(str(x) for x in (path, offset, size, rw, rh, l, t, r, b, flip, fmt, out))
        self.p.stdin.write(job + "\n")
        self.p.stdin.flush()
        ans = self.p.stdout.readline().strip()
        if ans != "ok":
            return ans
        if fmt == "chw":
            return np.fromfile(out, dtype=np.float32).reshape(3, b - t, r - l)
        a = np.fromfile(out, dtype=np.uint8)
        check(a.size == (r - l) * (b - t) * 3, "%s: output size %d != %dx%dx3" % (path, a.size, r - l, b - t))
        return a.reshape(b - t, r - l, 3)

    def close(self):
        self.p.stdin.close()
        check(self.p.wait() == 0, "image_dump exit status")


class Twin:
    """Two image_dump processes, one held to the portable loops: each job
    runs on both and the answers (pixels, or error text) must be equal."""

    def __init__(self, exe, tmp):
        os.mkdir(os.path.join(tmp, "portable"))
        self.fast, self.portable = Dump([exe], tmp), Dump([exe, "--portable"], os.path.join(tmp, "portable"))

    def run(self, path, rw, rh, **kw):
        a, b = self.fast.run(path, rw, rh, **kw), self.portable.run(path, rw, rh, **kw)
        same = type(a) is type(b) and (a == b if isinstance(a, str) else a.tobytes() == b.tobytes())
        check(same, "%s %dx%d %s: AVX2 and portable loops differ" % (path, rw, rh, kw))
        return a

    def close(self):
        self.fast.close()
        self.portable.close()


def quadrants(w, h):
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2 :] = (0, 255, 0)
    a[h // 2 :, : w // 2] = (0, 0, 255)
    a[h // 2 :, w // 2 :] = (255, 255, 255)
    return a


def png16(path, arr, colour):
    """A 16-bit PNG (PIL cannot write 16-bit RGB): colour type 2 or 0."""
    h, w = arr.shape[:2]
    raw = b"".join(b"\0" + arr[y].astype(">u2").tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_header_only(path, w, h):
    """A PNG whose IHDR claims w x h, with a tiny IDAT: a decompression bomb's header."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def area_resize(a, rw, rh):
    """OpenCV's INTER_AREA in float: output pixel i averages the source span
    [i * s, (i + 1) * s), edge pixels weighted by the part covered."""
    def axis(x, dst, ax):
        src = x.shape[ax]
        s = src / dst
        i = np.arange(dst)
        lo, hi = i * s, (i + 1) * s
        j0 = np.floor(lo).astype(int)
        out = 0
        for k in range(int(np.ceil(s)) + 1):
            j = j0 + k
            w = (np.clip(np.minimum(j + 1, hi) - np.maximum(j, lo), 0, None) / s).astype(np.float32)
            t = np.take(x, np.minimum(j, src - 1), axis=ax).astype(np.float32)
            out = out + t * (w[:, None, None] if ax == 0 else w[None, :, None])
        return out
    return np.floor(axis(axis(a, rh, 0), rw, 1) + 0.5).clip(0, 255).astype(np.uint8)


def noise(h, w, c, seed):
    """Smooth gradients plus noise: every PNG filter type gets used."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = (x * 255 // max(w - 1, 1) + y * 128 // max(h - 1, 1))[..., None] + rng.integers(-40, 40, (h, w, c))
    return np.clip(base + np.arange(c) * 50, 0, 255).astype(np.uint8)


def png_filtered(path, a, types):
    """An 8-bit PNG of a (h x w x c) whose row y is filtered with types[y]
    (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth), written by hand so that every
    filter and every run of them is certain to be there."""
    h, w, c = a.shape
    x = a.reshape(h, w * c).astype(int)
    rows, prev = [], np.zeros(w * c, int)
    for y in range(h):
        r = x[y]
        left = np.concatenate([np.zeros(c, int), r[:-c]])
        upleft = np.concatenate([np.zeros(c, int), prev[:-c]])
        pa, pb, pc = np.abs(prev - upleft), np.abs(left - upleft), np.abs(left + prev - 2 * upleft)
        paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        pred = [0, left, prev, (left + prev) // 2, paeth][types[y]]
        rows.append(bytes([types[y]]) + ((r - pred) & 255).astype(np.uint8).tobytes())
        prev = r

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, {1: 0, 2: 4, 3: 2, 4: 6}[c], 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
                + chunk(b"IEND", b""))


def on_white(a):
    """What the pipeline makes of 8-bit pixels with or without alpha: RGB,
    grey replicated, alpha flattened onto white with its exact rounding."""
    c = a.shape[2]
    rgb = np.repeat(a[..., :1], 3, 2).astype(int) if c <= 2 else a[..., :3].astype(int)
    if c in (2, 4):
        t = (255 - rgb) * a[..., -1:].astype(int) + 128
        rgb = 255 - ((t + (t >> 8)) >> 8)
    return rgb.astype(np.uint8)


def unfilter_exact(d, tmp):
    """PNG unfiltering: rows in runs of one type (Paeth pairs among them)
    and in random mixes, widths from 1 pixel, every channel count; at the
    same size the pipeline must give the pixels back exactly."""
    rng = np.random.default_rng(11)
    for c in (1, 2, 3, 4):
        for w, h in ((1, 1), (1, 6), (2, 5), (3, 9), (5, 2), (17, 13), (64, 31)):
            a = noise(h, w, c, w * h + c)
            a[..., -1] = rng.integers(0, 256, (h, w)) if c in (2, 4) else a[..., -1]
            for name, types in (("runs", [4, 4, 4, 1, 1, 3, 3, 4, 4, 0, 2, 2, 4] * 3), ("mixed", list(rng.integers(0, 5, h)))):
                p = os.path.join(tmp, "f%d_%dx%d_%s.png" % (c, w, h, name))
                png_filtered(p, a, types[:h])
                got = d.run(p, w, h)
                check(isinstance(got, np.ndarray) and np.array_equal(got, on_white(a)),
                      "PNG %d channels %dx%d filters %s: pixels exact" % (c, w, h, name))
                got = d.run(p, w, h, box=(0, h // 2, w, h), flip=1)
                check(isinstance(got, np.ndarray) and np.array_equal(got, on_white(a)[h // 2:, ::-1]),
                      "PNG %d channels %dx%d filters %s: lower half flipped exact" % (c, w, h, name))


def direct_decoders(d, tmp):
    """The JPEG/PNG/WebP paths that bypass libvips, and their fallbacks."""
    unfilter_exact(d, tmp)
    # PNG: pixels exact at identity for every 8-bit colour type (alpha on white, as the pipeline means it)
    for mode, c in (("RGB", 3), ("RGBA", 4), ("L", 1), ("LA", 2)):
        a = noise(37, 53, c, c)
        if c in (2, 4):
            a[..., -1] = np.where(np.arange(53)[None, :] % 3 == 0, 255, a[..., -1])
        p = os.path.join(tmp, "n_%s.png" % mode)
        Image.fromarray(a[..., 0] if c == 1 else a, mode).save(p)
        got = d.run(p, 53, 37)
        rgb = np.repeat(a[..., :1], 3, 2) if c <= 2 else a[..., :3]
        if c in (2, 4):
            al = a[..., -1:].astype(int)
            rgb = 255 - ((255 - rgb.astype(int)) * al + 127) // 255
        check(isinstance(got, np.ndarray) and np.abs(got.astype(int) - rgb).max() <= 1, "PNG %s pixels exact" % mode)
    # the area resize: fractional factors, crop and flip, against the float reference
    a = noise(203, 301, 3, 7)
    p = os.path.join(tmp, "n_big.png")
    Image.fromarray(a).save(p)
    for rw, rh, box, flip in ((120, 81, (0, 0, 120, 81), 0), (150, 101, (7, 3, 140, 99), 1), (301, 100, (0, 0, 301, 100), 0),
                              (1, 1, (0, 0, 1, 1), 0)):
        ref = area_resize(a, rw, rh)[box[1]:box[3], box[0]:box[2]]
        if flip:
            ref = ref[:, ::-1]
        got = d.run(p, rw, rh, box=box, flip=flip)
        check(isinstance(got, np.ndarray) and np.abs(got.astype(int) - ref).max() <= 1,
              "area resize 301x203 -> %dx%d box %s flip %d within 1 level of INTER_AREA" % (rw, rh, box, flip))
    # JPEG: decoded at a DCT scale still >= the resize size, then the area resize
    sm = np.kron(noise(30, 40, 3, 3), np.ones((40, 40, 1), np.uint8))  # 1600 x 1200
    jp = os.path.join(tmp, "smooth.jpg")
    Image.fromarray(sm).save(jp, quality=95)
    full = np.asarray(Image.open(jp).convert("RGB"))
    for rw, rh in ((400, 300), (199, 149), (801, 601), (1600, 1200)):
        got = d.run(jp, rw, rh)
        diff = np.abs(got.astype(int) - area_resize(full, rw, rh)).mean() if isinstance(got, np.ndarray) else 99
        check(diff < 1.0, "JPEG %dx%d: mean abs diff %.2f vs full decode + INTER_AREA < 1.0" % (rw, rh, diff))
    gp = os.path.join(tmp, "grey.jpg")
    Image.fromarray(noise(64, 96, 1, 5)[..., 0], "L").save(gp, quality=95)
    got = d.run(gp, 48, 32)
    check(isinstance(got, np.ndarray) and (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()
          and np.abs(got[..., 0].astype(int) - area_resize(np.asarray(Image.open(gp))[..., None], 48, 32)[..., 0]).mean() < 1.0,
          "grey JPEG -> equal RGB, area-resized")
    # an embedded ICC profile is applied (sRGB to sRGB: pixels within a level or two)
    from PIL import ImageCms
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    for ext in ("png", "jpg"):
        plain, tagged = os.path.join(tmp, "plain." + ext), os.path.join(tmp, "tagged." + ext)
        Image.fromarray(a).save(plain, quality=95)
        Image.fromarray(a).save(tagged, quality=95, icc_profile=srgb)
        x, y = d.run(plain, 150, 101), d.run(tagged, 150, 101)
        check(isinstance(y, np.ndarray) and np.abs(x.astype(int) - y).mean() < 2.0, "%s with an sRGB ICC profile loads, pixels kept" % ext)
    # WebP scaled on decode, lossless: close to the area reference; with alpha onto white
    wp = os.path.join(tmp, "n.webp")
    Image.fromarray(a).save(wp, lossless=True)
    got = d.run(wp, 150, 101, box=(10, 10, 140, 90))
    diff = np.abs(got.astype(int) - area_resize(a, 150, 101)[10:90, 10:140]).mean() if isinstance(got, np.ndarray) else 99
    check(diff < 1.5, "WebP scaled on decode: mean abs diff %.2f vs INTER_AREA < 1.5" % diff)
    wa = os.path.join(tmp, "na.webp")
    rgba = np.dstack([a, np.full(a.shape[:2], 0, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(wa, lossless=True, exact=True)
    check(near(d.run(wa, 150, 101), (255, 255, 255), 0), "transparent WebP -> white")
    al = (np.arange(301)[None, :] * 255 // 300 + np.zeros((203, 1), int)).astype(np.uint8)
    flat = (255 - ((255 - a.astype(int)) * al[..., None] + 127) // 255).astype(np.uint8)
    Image.fromarray(np.dstack([a, al]), "RGBA").save(wa, lossless=True, exact=True)
    got = d.run(wa, 150, 101)
    diff = np.abs(got.astype(int) - area_resize(flat, 150, 101)).mean() if isinstance(got, np.ndarray) else 99
    check(diff < 1.0, "semi-transparent WebP scaled: mean abs diff %.2f vs flatten + INTER_AREA < 1.0" % diff)
    # left to libvips: a transparency key, a palette, upscales; all still load
    tp = os.path.join(tmp, "trns.png")
    Image.fromarray(a).save(tp, transparency=(0, 0, 0))
    check(isinstance(d.run(tp, 150, 101), np.ndarray), "RGB PNG with a tRNS key loads (libvips)")
    check(isinstance(d.run(p, 602, 300), np.ndarray), "upscale loads (libvips)")
    # a damaged IDAT (CRC mismatch) is left to libvips, which reports it
    raw = bytearray(open(p, "rb").read())
    at = raw.index(b"IDAT") + 40
    raw[at] ^= 0xFF
    bad = os.path.join(tmp, "badcrc.png")
    open(bad, "wb").write(bytes(raw))
    e = d.run(bad, 150, 101)
    check(isinstance(e, str) and e.startswith("err") and bad in e, "PNG with a bad IDAT CRC -> error naming it: %s" % e)


def pil_lanczos(a, rw, rh, box=None, flip=0):
    """kohya's pil_resize: PIL's LANCZOS to rw x rh, then the box, mirrored on flip."""
    l, t, r, b = box or (0, 0, rw, rh)
    ref = np.asarray(Image.fromarray(a).resize((rw, rh), Image.LANCZOS))[t:b, l:r]
    return ref[:, ::-1] if flip else ref


def centroid(a, axis):
    """Where the brightness of the red channel lies along an axis (0: x, 1: y)."""
    w = a[..., 0].astype(float).sum(axis)
    return float((w * np.arange(w.size)).sum() / w.sum())


def enlargements(d, tmp):
    """A side that grows is resized as PIL's LANCZOS (kohya's pil_resize):
    pixel centres kept in place (libvips' upsizing was bicubic and shifted
    half an output pixel right and down), and the same bytes as PIL for
    enlargements, stretches and one side up with the other down, crops and
    flips included."""
    col = np.zeros((8, 8, 3), np.uint8)
    col[:, 3] = 255
    cp = os.path.join(tmp, "column.png")
    Image.fromarray(col).save(cp)
    a = d.run(cp, 16, 16)
    cx = centroid(a, 0) if isinstance(a, np.ndarray) else -1
    check(abs(cx - 6.5) < 0.05, "8x8, white column at x=3, to 16x16: centroid x %.3f, PIL's 6.5" % cx)
    rp = os.path.join(tmp, "row.png")
    Image.fromarray(col.transpose(1, 0, 2).copy()).save(rp)
    a = d.run(rp, 16, 16)
    cy = centroid(a, 1) if isinstance(a, np.ndarray) else -1
    check(abs(cy - 6.5) < 0.05, "8x8, white row at y=3, to 16x16: centroid y %.3f, PIL's 6.5" % cy)
    src = noise(37, 53, 3, 13)
    np_ = os.path.join(tmp, "small.png")
    Image.fromarray(src).save(np_)
    for rw, rh, box, flip in ((16 * 53 // 8, 16 * 37 // 8, None, 0), (101, 80, (5, 7, 99, 80), 1), (53, 111, None, 0),
                              (160, 37, (0, 0, 150, 37), 1), (60, 20, None, 0), (20, 60, (1, 2, 19, 59), 1),
                              (1000, 700, (900, 600, 1000, 700), 0)):
        a = d.run(np_, rw, rh, box=box, flip=flip)
        ref = pil_lanczos(src, rw, rh, box, flip)
        diff = int(np.abs(a.astype(int) - ref).max()) if isinstance(a, np.ndarray) else a
        check(diff == 0, "enlargement 53x37 -> %dx%d box %s flip %d: PIL LANCZOS's bytes (max diff %s)"
              % (rw, rh, box, flip, diff))
    # extreme shapes: one pixel, a side that grows while the other shrinks 500x
    rng = np.random.default_rng(5)
    for (w, h), rw, rh in (((1, 1), 5, 7), ((3, 2000), 4, 10), ((2000, 3), 1, 4), ((9, 5), 64, 1)):
        src = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
        ep = os.path.join(tmp, "edge%dx%d.png" % (w, h))
        Image.fromarray(src).save(ep)
        a = d.run(ep, rw, rh)
        diff = int(np.abs(a.astype(int) - pil_lanczos(src, rw, rh)).max()) if isinstance(a, np.ndarray) else a
        check(diff == 0, "enlargement %dx%d -> %dx%d: PIL LANCZOS's bytes (max diff %s)" % (w, h, rw, rh, diff))
    # an EXIF-rotated JPEG is turned upright at its own size, then enlarged
    ex = Image.Exif()
    ex[0x0112] = 6
    rp = os.path.join(tmp, "rot6.jpg")
    Image.fromarray(noise(30, 40, 3, 4)).save(rp, quality=95, exif=ex)
    upright = np.asarray(ImageOps.exif_transpose(Image.open(rp)).convert("RGB"))
    a = d.run(rp, 45, 60, box=(5, 0, 45, 60), flip=1)
    diff = int(np.abs(a.astype(int) - pil_lanczos(upright, 45, 60, (5, 0, 45, 60), 1)).max()) if isinstance(a, np.ndarray) else a
    check(diff == 0, "EXIF-rotated 40x30 JPEG -> 45x60: PIL LANCZOS's bytes of the upright image (max diff %s)" % diff)


def near(a, colour, tol):
    return np.abs(a.astype(int) - np.array(colour)).max() <= tol


def synthetic(d, tmp):
    q = quadrants(200, 100)
    qp = os.path.join(tmp, "quad.png")
    Image.fromarray(q).save(qp)

    # identity plan: pixels exact; crop of one quadrant; flip
    a = d.run(qp, 200, 100)
    check(isinstance(a, np.ndarray) and (a == q).all(), "identity resize+crop is exact")
    a = d.run(qp, 200, 100, box=(100, 0, 200, 50))
    check(isinstance(a, np.ndarray) and near(a, (0, 255, 0), 0), "crop of the green quadrant is all green")
    a = d.run(qp, 200, 100, box=(60, 30, 150, 90), flip=1)
    check(isinstance(a, np.ndarray) and (a == q[30:90, 60:150][:, ::-1]).all(), "crop + flip equals numpy's")

    # exact output sizes: down, up, stretched by a pixel, odd sizes
    for rw, rh in ((100, 50), (37, 19), (101, 49), (333, 167), (640, 321), (1, 1)):
        a = d.run(qp, rw, rh)
        check(isinstance(a, np.ndarray) and a.shape == (rh, rw, 3), "size %dx%d from 200x100: %s" % (rw, rh, getattr(a, "shape", a)))
    a = d.run(qp, 100, 50)
    check(near(a[12, 25], (255, 0, 0), 2) and near(a[12, 75], (0, 255, 0), 2) and near(a[37, 25], (0, 0, 255), 2)
          and near(a[37, 75], (255, 255, 255), 2), "quadrant centres keep their colours after a 2x shrink")

    # big JPEG: shrink-on-load (>= 4x) still gives exact sizes and the right box
    big = np.kron(quadrants(8, 6), np.ones((400, 400, 1), np.uint8))  # 3200 x 2400
    bp = os.path.join(tmp, "big.jpg")
    Image.fromarray(big).save(bp, quality=95)
    for rw, rh in ((400, 300), (401, 299), (203, 151), (100, 75), (1217, 913)):
        a = d.run(bp, rw, rh)
        check(isinstance(a, np.ndarray) and a.shape == (rh, rw, 3), "JPEG size %dx%d: %s" % (rw, rh, getattr(a, "shape", a)))
    a = d.run(bp, 400, 300, box=(0, 0, 40, 40))
    check(isinstance(a, np.ndarray) and near(a, (255, 0, 0), 8), "JPEG 8x shrink: top-left box is red")

    # a gradient against PIL's LANCZOS of the same size
    g = np.tile(np.linspace(0, 255, 512).astype(np.uint8)[None, :, None], (64, 1, 3))
    gp = os.path.join(tmp, "grad.png")
    Image.fromarray(g).save(gp)
    ref = np.asarray(Image.fromarray(g).resize((200, 25), Image.LANCZOS)).astype(int)
    a = d.run(gp, 200, 25)
    check(np.abs(a.astype(int) - ref).mean() < 1.0, "gradient 512->200 within 1 level of PIL LANCZOS")

    enlargements(d, tmp)

    # EXIF orientation 6: stored 200x100, displayed 100x200 (rotated 90 clockwise)
    ep = os.path.join(tmp, "exif6.jpg")
    ex = Image.Exif()
    ex[0x0112] = 6
    Image.fromarray(q).save(ep, quality=95, exif=ex)
    up = np.asarray(ImageOps.exif_transpose(Image.open(ep)).convert("RGB")).astype(int)
    a = d.run(ep, 100, 200)
    check(isinstance(a, np.ndarray) and a.shape == (200, 100, 3) and np.abs(a - up).mean() < 2.0,
          "EXIF orientation 6 rotated upright like PIL's exif_transpose")
    check(isinstance(a, np.ndarray) and near(a[20, 80], (255, 0, 0), 12), "orientation 6: red ends top-right")

    # alpha: transparent black becomes white, half-transparent blue blends with white
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[:, :32] = (255, 0, 0, 255)
    rgba[:32, 32:] = (0, 0, 0, 0)
    rgba[32:, 32:] = (0, 0, 255, 128)
    ap = os.path.join(tmp, "alpha.png")
    Image.fromarray(rgba, "RGBA").save(ap)
    a = d.run(ap, 64, 64)
    check(near(a[:, :32], (255, 0, 0), 0) and near(a[:32, 32:], (255, 255, 255), 0) and near(a[32:, 32:], (127, 127, 255), 1),
          "alpha flattened onto white")
    a = d.run(ap, 32, 32)
    check(near(a[:13, 20:], (255, 255, 255), 1), "alpha flattened onto white after a shrink")
    lap = os.path.join(tmp, "la.png")
    Image.fromarray(np.dstack([np.full((16, 16), 50, np.uint8), np.full((16, 16), 0, np.uint8)]), "LA").save(lap)
    check(near(d.run(lap, 16, 16), (255, 255, 255), 0), "grey+alpha PNG transparent -> white")
    pp = os.path.join(tmp, "pal.png")
    Image.fromarray(rgba, "RGBA").convert("P").save(pp, transparency=0)
    check(isinstance(d.run(pp, 64, 64), np.ndarray), "palette PNG with transparency loads")

    # grey and 16-bit
    lp = os.path.join(tmp, "grey.png")
    Image.fromarray(np.full((40, 30), 100, np.uint8), "L").save(lp)
    check(near(d.run(lp, 30, 40), (100, 100, 100), 1), "8-bit grey -> equal RGB")
    g16 = os.path.join(tmp, "grey16.png")
    png16(g16, np.full((40, 30), 40000, np.uint16), 0)
    check(near(d.run(g16, 30, 40), (156, 156, 156), 2), "16-bit grey -> 8-bit (40000/257)")
    c16 = os.path.join(tmp, "rgb16.png")
    png16(c16, np.tile(np.array([60000, 30000, 0], np.uint16), (40, 30, 1)), 2)
    check(near(d.run(c16, 15, 20), (233, 117, 0), 2), "16-bit RGB -> 8-bit sRGB")

    # CMYK JPEG (PIL writes Adobe-inverted CMYK): red stays red through the CMYK profile
    cp = os.path.join(tmp, "cmyk.jpg")
    Image.new("CMYK", (48, 48), (0, 255, 255, 0)).save(cp, quality=95)
    a = d.run(cp, 48, 48)
    check(isinstance(a, np.ndarray) and a.shape == (48, 48, 3), "CMYK JPEG loads as 3-band: %s" % (a if isinstance(a, str) else ""))
    if isinstance(a, np.ndarray):
        m = a.reshape(-1, 3).mean(0)
        check(m[0] > 180 and m[1] < 90 and m[2] < 90, "CMYK red converts to sRGB red, got %s" % m)

    # untagged CMYK as PIL's convert("RGB") maps it (naively, black to black): libvips' fallback
    # press profile, taken without black point compensation, lifted black to about (30,33,43).
    # A JPEG at its size, EXIF-rotated and shrunk (libvips' paths), and a TIFF (a format imghdr
    # does not parse).
    ck = noise(40, 56, 4, 21)
    ck[:8, :8] = (0, 0, 0, 255)  # K only: black
    ck[8:16, :8] = (0, 0, 0, 0)  # no ink: white
    for ext, kw in (("jpg", {"quality": 95}), ("tif", {})):
        ckp = os.path.join(tmp, "cmyk_noise." + ext)
        Image.fromarray(ck, "CMYK").save(ckp, **kw)
        ref = np.asarray(Image.open(ckp).convert("RGB")).astype(int)
        a = d.run(ckp, 56, 40)
        ok = isinstance(a, np.ndarray)
        check(ok and np.abs(a - ref).max() <= 1, "untagged CMYK %s within 1 level of PIL's convert: %s" % (
            ext, np.abs(a - ref).max() if ok else a))
        check(ok and a[2:6, 2:6].max() <= 3 and a[10:14, 2:6].min() >= 252,
              "untagged CMYK %s: black stays black, white white: %s %s" % (ext, a[3, 3] if ok else a, a[11, 3] if ok else ""))
        a = d.run(ckp, 28, 20)
        lz = np.asarray(Image.open(ckp).convert("RGB").resize((28, 20), Image.LANCZOS)).astype(int)
        check(isinstance(a, np.ndarray) and np.abs(a - lz).mean() < 2.0, "untagged CMYK %s halved near PIL's: %s" % (
            ext, np.abs(a - lz).mean() if isinstance(a, np.ndarray) else a))
    ex6 = Image.Exif()
    ex6[0x0112] = 6
    ckp = os.path.join(tmp, "cmyk_exif6.jpg")
    Image.fromarray(ck, "CMYK").save(ckp, quality=95, exif=ex6)
    ref = np.asarray(ImageOps.exif_transpose(Image.open(ckp)).convert("RGB")).astype(int)
    a = d.run(ckp, 40, 56)
    check(isinstance(a, np.ndarray) and a.shape == ref.shape and np.abs(a - ref).max() <= 1,
          "untagged CMYK JPEG with EXIF orientation 6: upright, as PIL: %s" % (a if isinstance(a, str) else ""))

    # 32-bit samples (integers, float grey) have no range to take to 8 bits: refused saying so,
    # not clipped to white; float RGB (scRGB to libvips, 0..1 linear) is converted
    for fmt, bits, name in ((1, 32, "32-bit unsigned integer"), (2, 32, "32-bit signed integer"),
                            (3, 32, "32-bit float")):
        tp32 = os.path.join(tmp, "s%d.tif" % fmt)
        vals = np.full((6, 8), 40000 if fmt < 3 else 0.5)
        open(tp32, "wb").write(tiff_samples(vals[..., None], fmt))
        e = d.run(tp32, 8, 6)
        check(isinstance(e, str) and e.startswith("err unsupported") and name + " samples" in e and tp32 in e,
              "grey TIFF with %s samples refused: %s" % (name, e if isinstance(e, str) else "loaded"))
    tpf = os.path.join(tmp, "rgbf.tif")
    open(tpf, "wb").write(tiff_samples(np.tile([0.2140, 0.0, 1.0], (6, 8, 1)), 3))
    check(near(d.run(tpf, 8, 6), (128, 0, 255), 1), "float RGB TIFF (linear 0..1) -> sRGB")

    # WebP
    wp = os.path.join(tmp, "q.webp")
    Image.fromarray(q).save(wp, lossless=True)
    check((d.run(wp, 200, 100) == q).all(), "lossless WebP identity exact")

    # float CHW in [-1, 1]
    f = d.run(qp, 200, 100, box=(0, 0, 4, 2), fmt="chw")
    check(isinstance(f, np.ndarray) and np.allclose(f[:, 0, 0], [1.0, -1.0, -1.0]) and f.shape == (3, 2, 4), "CHW floats of red")
    f = d.run(lp, 30, 40, box=(0, 0, 1, 1), fmt="chw")
    check(abs(float(f[1, 0, 0]) - (100 / 127.5 - 1)) < 1e-6, "CHW value = x/127.5 - 1")

    # a tar member read in place by offset and size
    tp = os.path.join(tmp, "shard.tar")
    with tarfile.open(tp, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, src in (("0001.txt", lp), ("0001.png", qp), ("0002.jpg", bp)):
            tf.add(src, arcname=name)
    with tarfile.open(tp) as tf:
        mem = {m.name: m for m in tf.getmembers()}
    m = mem["0001.png"]
    a = d.run(tp, 200, 100, box=(60, 30, 150, 90), offset=m.offset_data, size=m.size)
    check(isinstance(a, np.ndarray) and (a == q[30:90, 60:150]).all(), "tar member by offset == the file: %s" % (a if isinstance(a, str) else ""))
    m = mem["0002.jpg"]
    check((d.run(tp, 400, 300, offset=m.offset_data, size=m.size) == d.run(bp, 400, 300)).all(), "JPEG tar member == file")
    e = d.run(tp, 100, 100, offset=mem["0002.jpg"].offset_data + 7, size=1000)
    check(isinstance(e, str) and e.startswith("err") and tp in e, "wrong offset -> error naming the shard: %s" % e)

    # bad files: errors name the file
    data = open(bp, "rb").read()
    trunc = os.path.join(tmp, "trunc.jpg")
    open(trunc, "wb").write(data[: len(data) // 2])
    e = d.run(trunc, 400, 300)
    check(isinstance(e, str) and e.startswith("err") and trunc in e, "truncated JPEG -> error naming it: %s" % e)
    ptr = os.path.join(tmp, "trunc.png")
    open(ptr, "wb").write(open(qp, "rb").read()[:200])
    e = d.run(ptr, 200, 100)
    check(isinstance(e, str) and e.startswith("err") and ptr in e, "truncated PNG -> error naming it: %s" % e)
    # damaged entropy-coded data inside a whole JPEG (a marker where scan data should be):
    # libjpeg only warns and libvips would decode the rest grey; refused, with libjpeg's
    # reason. A JPEG with only extra bytes before a marker (harmless) still decodes.
    noisy = os.path.join(tmp, "noisy.jpg")
    Image.fromarray(noise(240, 320, 3, 9)).save(noisy, quality=90)
    raw = bytearray(open(noisy, "rb").read())
    sos = raw.index(b"\xff\xda")
    raw[sos + 400:sos + 402] = b"\xff\xd0"
    bad = os.path.join(tmp, "corrupt.jpg")
    open(bad, "wb").write(bytes(raw))
    e = d.run(bad, 160, 120)
    check(isinstance(e, str) and e.startswith("err") and bad in e and "corrupt JPEG data (libjpeg: " in e,
          "corrupt JPEG data -> refused naming it: %s" % (e if isinstance(e, str) else "decoded"))
    # the same damage in JPEGs the direct decoder leaves to libvips (EXIF-rotated,
    # upscaled, CMYK) is refused too: libvips alone would decode the rest grey
    def damaged(img, path, **kw):
        img.save(path, quality=90, **kw)
        raw = bytearray(open(path, "rb").read())
        sos = raw.index(b"\xff\xda")
        raw[sos + 400:sos + 402] = b"\xff\xd0"
        open(path, "wb").write(bytes(raw))
        return path
    ex6 = Image.Exif()
    ex6[0x0112] = 6
    for what, path, rw, rh in (
            ("EXIF-rotated", damaged(Image.fromarray(noise(240, 320, 3, 9)), os.path.join(tmp, "corrupt6.jpg"),
                                     exif=ex6), 120, 160),
            ("upscaled", bad, 480, 360),
            ("CMYK", damaged(Image.fromarray(noise(240, 320, 4, 9), "CMYK"), os.path.join(tmp, "corruptk.jpg")),
             160, 120)):
        e = d.run(path, rw, rh)
        check(isinstance(e, str) and e.startswith("err") and path in e and "corrupt JPEG data (libjpeg: " in e,
              "corrupt %s JPEG (libvips path) -> refused naming it: %s" % (what, e if isinstance(e, str) else "decoded"))
    raw = bytearray(open(noisy, "rb").read())
    eoi = raw.rindex(b"\xff\xd9")
    extra = os.path.join(tmp, "extra.jpg")
    open(extra, "wb").write(bytes(raw[:eoi]) + b"\x00\x00\x00" + bytes(raw[eoi:]))
    a = d.run(extra, 160, 120)
    check(isinstance(a, np.ndarray) and a.shape == (120, 160, 3), "extra bytes before EOI still decode: %s"
          % (a if isinstance(a, str) else ""))
    # libvips' reasons, not "unknown libvips error": a PNG whose first chunk is garbage
    # (Pillow's broken.png: libpng's complaint arrives only as a warning), and a truncated PNG
    # decoded after JPEGs whose harmless warnings libvips left in its error buffer (once
    # they were the whole message: another image's words, cut at 256 bytes)
    garbage = os.path.join(tmp, "garbage.png")
    open(garbage, "wb").write(b"\x89PNG\r\n\x1a\n" + bytes((i * 89 + 7) % 256 for i in range(600)))
    e = d.run(garbage, 64, 64)
    check(isinstance(e, str) and garbage in e and "unknown libvips error" not in e and "invalid chunk type" in e
          and "IHDR" in e, "PNG with a garbage first chunk -> libpng's and the header's reasons: %s" % e)
    unk = os.path.join(tmp, "unknown.img")  # no format libvips sniffs: it offers ImageMagick, blocked
    open(unk, "wb").write(b"\x00\x01" + bytes(range(256)) * 2)
    e = d.run(unk, 64, 64)
    check(isinstance(e, str) and unk in e and "magickload would read it, a loader sdtk blocks as untrusted" in e,
          "a file of no format sdtk reads -> says the loader left is blocked: %s" % e)
    def chunk(t, data):
        return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)
    noidat = os.path.join(tmp, "noidat.png")  # IHDR then IEND (Pillow's apng/syntax_num_frames_zero.png)
    open(noidat, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 32, 16, 8, 2, 0, 0, 0))
                             + chunk(b"IEND", b""))
    e = d.run(noidat, 32, 16)
    check(isinstance(e, str) and noidat in e and "unknown libvips error" not in e and "IEND" in e,
          "PNG without image data -> libpng's reason: %s" % e)
    raw = open(noisy, "rb").read()
    dqt = raw.index(b"\xff\xdb")
    xdb = os.path.join(tmp, "xdb.jpg")  # 4 stray bytes before the DQT marker: libjpeg warns, decodes
    open(xdb, "wb").write(raw[:dqt] + b"\0\0\0\0" + raw[dqt:])
    for _ in range(3):
        check(isinstance(d.run(xdb, 160, 120), np.ndarray), "JPEG with stray bytes before a marker decodes")
    tpng = os.path.join(tmp, "trunc_noise.png")
    buf = io.BytesIO()
    Image.fromarray(noise(203, 301, 3, 7)).save(buf, "PNG")
    open(tpng, "wb").write(buf.getvalue()[:len(buf.getvalue()) // 2])
    e = d.run(tpng, 150, 101)
    check(isinstance(e, str) and tpng in e and "VipsJpeg" not in e and "png" in e.split(tpng)[1].lower(),
          "truncated PNG after warned JPEGs -> its own reason only: %s" % e)
    junk = os.path.join(tmp, "junk.jpg")
    open(junk, "wb").write(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    e = d.run(junk, 64, 64)
    check(isinstance(e, str) and e.startswith("err") and junk in e, "corrupt JPEG -> error naming it: %s" % e)
    empty = os.path.join(tmp, "empty.png")
    open(empty, "wb").close()
    e = d.run(empty, 64, 64)
    check(isinstance(e, str) and "empty" in e and empty in e, "empty file -> error: %s" % e)
    e = d.run(os.path.join(tmp, "missing.png"), 64, 64)
    check(isinstance(e, str) and e.startswith("err not found"), "missing file -> not found: %s" % e)
    e = d.run(qp, 200, 100, box=(0, 0, 201, 100))
    check(isinstance(e, str) and "crop" in e and qp in e, "crop outside the resized image refused: %s" % e)

    direct_decoders(d, tmp)

    # decompression bombs: refused from the header, before decoding
    bomb = os.path.join(tmp, "bomb.png")
    png_header_only(bomb, 20000, 20000)
    e = d.run(bomb, 512, 512)
    check(isinstance(e, str) and "decompression bomb" in e and bomb in e, "PNG claiming 20000x20000 refused: %s" % e)
    tif = os.path.join(tmp, "bomb.tif")
    open(tif, "wb").write(tiff_header_only(15000, 15000))
    e = d.run(tif, 512, 512)
    check(isinstance(e, str) and "decompression bomb" in e, "TIFF (libvips header path) claiming 15000x15000 refused: %s" % e)


def tiff_header_only(w, h):
    """A little-endian grey TIFF whose IFD claims w x h, with 16 bytes of data."""
    tags = [(256, 4, w), (257, 4, h), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, 8), (277, 3, 1), (278, 4, h), (279, 4, 16)]
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", t, ty, 1, v) for t, ty, v in tags) + b"\0\0\0\0"
    return b"II*\0" + struct.pack("<I", 24) + b"\0" * 16 + ifd


def tiff_samples(a, sample_format):
    """A little-endian uncompressed TIFF of a (h x w x c, c 1 or 3) with 32-bit samples:
    SampleFormat 1 (unsigned), 2 (signed) or 3 (IEEE float)."""
    h, w, c = a.shape
    data = a.astype({1: "<u4", 2: "<i4", 3: "<f4"}[sample_format]).tobytes()
    bps_at = 8 + len(data)  # the BitsPerSample triple for RGB, after the data
    tags = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, c, 32 if c == 1 else bps_at), (259, 3, 1, 1),
            (262, 3, 1, 1 if c == 1 else 2), (273, 4, 1, 8), (277, 3, 1, c), (278, 4, 1, h), (279, 4, 1, len(data)),
            (284, 3, 1, 1), (339, 3, 1, sample_format)]
    extra = struct.pack("<HHH", 32, 32, 32) + b"\0\0" if c == 3 else b""
    ifd_at = 8 + len(data) + len(extra)
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", t, ty, n, v) if ty == 4 or n > 2 else
                                                  struct.pack("<HHIHH", t, ty, n, v, 0) for t, ty, n, v in tags)
    return b"II*\0" + struct.pack("<I", ifd_at) + data + extra + ifd + b"\0\0\0\0"


def srgb_reference(path):
    """PIL's view of the photo as the pipeline means it: upright, ICC to sRGB,
    alpha on white, 8-bit RGB."""
    im = ImageOps.exif_transpose(Image.open(path))
    icc = im.info.get("icc_profile")
    if icc and im.mode in ("RGB", "RGBA"):
        from PIL import ImageCms
        src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        im = ImageCms.profileToProfile(im, src, ImageCms.createProfile("sRGB"), outputMode=im.mode)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = im.convert("RGBA")
        bg = Image.new("RGBA", im.size, (255, 255, 255, 255))
        im = Image.alpha_composite(bg, im)
    return im.convert("RGB")


def plan(w, h, area, step=64):
    """A bucket-like plan: scale to about `area` pixels keeping the aspect, crop
    the centre to multiples of `step`."""
    s = math.sqrt(area / (w * h))
    rw, rh = max(step, round(w * s)), max(step, round(h * s))
    bw, bh = rw // step * step, rh // step * step
    l, t = (rw - bw) // 2, (rh - bh) // 2
    return rw, rh, (l, t, l + bw, t + bh)


def photos(d):
    root = os.environ.get("SDTK_PHOTOS")
    if not root:
        print("SKIP: SDTK_PHOTOS not set")
        sys.exit(77)
    files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.lower().endswith((".jpg", ".jpeg", ".png", ".webp")))
    check(len(files) > 0, "photos found in " + root)
    quarter_and_back(d, files, d.fast.tmp)
    errs = []
    for i, f in enumerate(files):
        ref = srgb_reference(f)
        full = np.asarray(ref)
        areas = (1024 * 1024, 512 * 512) if i % 3 == 0 else (1024 * 1024,)
        for area in areas:
            rw, rh, box = plan(ref.width, ref.height, area)
            a = d.run(f, rw, rh, box=box, flip=i % 2)
            if not isinstance(a, np.ndarray):
                check(False, "%s: %s" % (f, a))
                continue
            if ref.width >= rw and ref.height >= rh:
                r = area_resize(full, rw, rh)[box[1]:box[3], box[0]:box[2]]
            else:
                r = np.asarray(ref.resize((rw, rh), Image.LANCZOS).crop(box))
            if i % 2:
                r = r[:, ::-1]
            mae = np.abs(a.astype(int) - r.astype(int)).mean()
            errs.append(mae)
            check(mae < TOL, "%s at %dx%d: mean abs diff %.2f vs the reference >= %.1f" % (f, rw, rh, mae, TOL))
    if errs:
        print("photos: %d loads, mean abs diff vs INTER_AREA (LANCZOS for upscales) of PIL's decode (0..255): mean %.3f,"
              " max %.3f" % (len(errs), float(np.mean(errs)), float(np.max(errs))))


def quarter_and_back(d, files, tmp):
    """Photos shrunk to a quarter (each side) and taken back up to their own
    size, as a small image in a bucket would be: sdtk's enlargement against
    PIL's LANCZOS of the same small file, on three boxes of each (corners,
    where the window is cut by the edge, and the centre; one flipped).
    One JPEG, one PNG and one WebP photo; the small files are PNG and, for
    one, a JPEG (the same libjpeg-turbo decode on both sides)."""
    picked = []
    for ext in ((".jpg", ".jpeg"), (".png",), (".webp",)):
        picked += [f for f in files if f.lower().endswith(ext)][:1]
    same = near1 = total = 0
    for i, f in enumerate(picked):
        ref = srgb_reference(f)
        w, h = ref.size
        small = os.path.join(tmp, "quarter%d.%s" % (i, "jpg" if i == 0 else "png"))
        ref.reduce(4).save(small, quality=95)
        up = Image.open(small).convert("RGB").resize((w, h), Image.LANCZOS)
        s = 384
        for box, flip in (((0, 0, s, s), 1), ((w - s, h - s, w, h), 0), ((w // 2 - s // 2, h // 2 - s // 2, w // 2 + s // 2, h // 2 + s // 2), 0)):
            a = d.run(small, w, h, box=box, flip=flip)
            if not isinstance(a, np.ndarray):
                check(False, "%s: %s" % (small, a))
                continue
            r = np.asarray(up.crop(box))
            if flip:
                r = r[:, ::-1]
            diff = np.abs(a.astype(int) - r.astype(int))
            same, near1, total = same + int((diff == 0).sum()), near1 + int((diff <= 1).sum()), total + diff.size
    check(len(picked) > 0 and total > 0, "quarter-size photos enlarged")
    if total:
        print("quarter and back up (%d photos): %.4f%% of values equal to PIL LANCZOS, %.4f%% within 1 level"
              % (len(picked), 100.0 * same / total, 100.0 * near1 / total))
        check(near1 >= 0.99 * total, "photos at a quarter taken back up: %.3f%% of values within 1 level of PIL LANCZOS"
              " (>= 99%%)" % (100.0 * near1 / total))


TOL = 3.0  # mean abs difference per channel, 0..255 units, vs the reference of the same box


def main():
    args = sys.argv[1:]
    want_photos = "--photos" in args
    exe = [a for a in args if a != "--photos"][0]
    with tempfile.TemporaryDirectory() as tmp:
        d = Twin(exe, tmp)
        if want_photos:
            photos(d)
        else:
            synthetic(d, tmp)
        d.close()
    print("e2e_image%s: %d failures" % (" --photos" if want_photos else "", len(FAILS)))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
