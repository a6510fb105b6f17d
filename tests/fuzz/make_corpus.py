#!/usr/bin/env python3
"""Regenerate the seed corpora of the fuzz targets (deterministic, tiny).

corpus_tar/: WebDataset shards in the three tar dialects libarchive sees in
practice (ustar, pax with long names, GNU long links) plus one gzip shard.
corpus_booru/: Danbooru and e621 post lines and a few JSON edge cases.
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


if __name__ == "__main__":
    main()
