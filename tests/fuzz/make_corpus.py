#!/usr/bin/env python3
"""Regenerate the seed corpora of the fuzz targets (deterministic, tiny).

corpus_tar/: WebDataset shards in the three tar dialects libarchive sees in
practice (ustar, pax with long names, GNU long links) plus one gzip shard.
corpus_booru/: Danbooru and e621 post lines and a few JSON edge cases.
corpus_npz/: kohya latents and te_outputs npz (stored and deflated), .npy
files with v1/v2/v3 headers (needs numpy).
Run from anywhere: python3 tests/fuzz/make_corpus.py
"""
import gzip
import io
import json
import os
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
JPEG = bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffd9")
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000100000000808020000009091683600000000")
WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00/\x03\x00\x00\x00\x00"


def shard(fmt, members):
    """A tar in the given format, cut right after the end-of-archive blocks."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1700000000
            info.uname = info.gname = "sd"
            tf.addfile(info, io.BytesIO(data))
        end = tf.offset
    return raw.getvalue()[: end + 1024]


def write(dirname, name, data):
    path = os.path.join(HERE, dirname, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def main():
    meta = json.dumps({"caption": "a red bicycle", "width": 640, "height": 480, "aesthetic": 6.1}).encode()
    write("corpus_tar", "ustar.tar", shard(tarfile.USTAR_FORMAT, [
        ("s/000001.jpg", JPEG), ("s/000001.txt", b"a cat on a sofa\n"),
        ("s/000002.webp", WEBP), ("s/000002.json", meta)]))
    longdir = "shard-" + "x" * 110 + "/"
    write("corpus_tar", "pax_long.tar", shard(tarfile.PAX_FORMAT, [
        (longdir + "k\u00e9y0003.png", PNG), (longdir + "k\u00e9y0003.cls", b"1")]))
    write("corpus_tar", "gnu_long.tar", shard(tarfile.GNU_FORMAT, [
        ("g/" + "n" * 120 + ".jpg", JPEG), ("g/" + "n" * 120 + ".json", b'{"caption": "x", "cls": 0}')]))
    write("corpus_tar", "ustar.tar.gz", gzip.compress(shard(tarfile.USTAR_FORMAT, [
        ("z/a.jpg", JPEG), ("z/a.txt", b"tags, more tags"), ("z/b.txt", b"no image")]), mtime=0))

    posts = {
        "danbooru.json": {"id": 4512345, "created_at": "2021-06-01T12:00:00.000-04:00", "score": 42,
                          "fav_count": 50, "rating": "s", "md5": "0123456789abcdef0123456789abcdef",
                          "image_width": 1200, "image_height": 1600, "file_ext": "jpg",
                          "tag_string_general": "1girl solo long_hair masterpiece smile sketch bad_tag",
                          "tag_string_character": "hatsune_miku", "tag_string_copyright": "vocaloid",
                          "tag_string_artist": "some_artist_(style)", "tag_string_meta": "highres absurdres",
                          "file": {"ext": "png"}, "source": "https://example.com/a\u00e9"},
        "e621.json": {"id": 99, "rating": "q", "score": {"up": 5, "down": -1, "total": 4},
                      "tags": {"general": ["anthro", "solo"], "species": ["fox"], "artist": ["x_(artist)"],
                               "meta": ["hi_res"], "lore": [], "invalid": ["a"]},
                      "file": {"width": 800, "height": 600, "ext": "png", "md5": "ff"}},
        "tag_string.json": {"md5": "abc", "tag_string": "a,b c", "rating": "g", "score": "12",
                            "file_ext": "webp", "id": "7"},
    }
    for name, post in posts.items():
        write("corpus_booru", name, json.dumps(post, ensure_ascii=False).encode())
    write("corpus_booru", "escapes.json",
          b'{"id": 1e3, "file_ext": "p\\u00e9g", "tag_string": "\\ud83d\\ude00 a\\tb \\"q\\"", "n": [1, -0.5e-3, true, false, null, {}]}')
    write("corpus_booru", "bad.json", b'{"id": 5, "tag_string": "a b", "score": 01}')


def npz_corpus():
    """Small kohya caches and .npy files for the npy/npz fuzz target."""
    import numpy as np
    rng = np.random.default_rng(1)
    lat = rng.standard_normal((4, 2, 3)).astype(np.float32)
    for name, save in (("latents_stored.npz", np.savez), ("latents_deflate.npz", np.savez_compressed)):
        raw = io.BytesIO()
        save(raw, latents=lat, original_size=np.array([24, 16]), crop_ltrb=np.array([0.5, 0, 23.5, 16]),
             latents_flipped=lat[:, :, ::-1].copy())
        write("corpus_npz", name, raw.getvalue())
    raw = io.BytesIO()
    np.savez(raw, latents=lat.astype(np.float16), original_size=np.array([24, 16]), crop_ltrb=np.array([0, 0, 24, 16]),
             alpha_mask=np.ones((16, 24), np.float32))
    write("corpus_npz", "latents_alpha.npz", raw.getvalue())
    raw = io.BytesIO()
    np.savez_compressed(raw, hidden_state1=np.zeros((77, 768), np.float16), hidden_state2=np.ones((77, 1280), np.float16),
             pool2=np.full(1280, 0.5, np.float16))
    write("corpus_npz", "te_outputs.npz", raw.getvalue())
    for version in ((1, 0), (2, 0), (3, 0)):
        raw = io.BytesIO()
        arr = np.arange(6, dtype=np.int64).reshape(2, 3)
        np.lib.format.write_array(raw, arr, version=version)
        write("corpus_npz", "v%d.npy" % version[0], raw.getvalue())
    raw = io.BytesIO()
    np.lib.format.write_array(raw, np.asfortranarray(np.ones((2, 2), np.float32)))
    write("corpus_npz", "fortran.npy", raw.getvalue())

    def npy(a):
        raw = io.BytesIO()
        np.lib.format.write_array(raw, a)
        assert b"\n--\n" not in raw.getvalue()
        return raw.getvalue()

    # fuzz_npz.c's wrapped layout: count-1, key set (+2: stored), bodies split by "\n--\n"
    sep = b"\n--\n"
    lat = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 2, 3)
    write("corpus_npz", "wrapped_latents", bytes([3, 2]) + sep.join(
        [npy(lat), npy(np.array([24, 16])), npy(np.array([0.5, 0, 23.5, 16])), npy(lat[:, :, ::-1].copy())]))
    write("corpus_npz", "wrapped_alpha", bytes([4, 0]) + sep.join(
        [npy(lat.astype(np.float16)), npy(np.array([24, 16])), npy(np.array([0, 0, 24, 16])), npy(lat),
         npy(np.ones((16, 24), np.float32))]))
    write("corpus_npz", "wrapped_te_small", bytes([2, 3]) + sep.join(   # wrong shapes: valid SDXL ones are too big
        [npy(np.zeros((77, 8), np.float16)), npy(np.zeros((77, 12), np.float16)), npy(np.zeros(12, np.float16))]))


if __name__ == "__main__":
    main()
    npz_corpus()
