#!/usr/bin/env python3
"""End-to-end tests of sd-meta: every source kind and every rule, run through
the real binary on fixtures built here (real photos from $SDTK_PHOTOS for the
image-bearing sources), including the bad inputs the tool must survive."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import unittest

import meta_util
from meta_util import read, skipped, write

SD_META = None
PHOTOS = os.environ.get("SDTK_PHOTOS")


def photo(i):
    """Path of the i-th real photo (sorted), or None without a corpus."""
    names = sorted(os.listdir(PHOTOS))
    return os.path.join(PHOTOS, names[i % len(names)])


def run(args, stdin=None, cwd=None):
    """Run sd-meta; returns (exit code, records, stderr)."""
    p = subprocess.run([SD_META] + args, input=stdin, capture_output=True, cwd=cwd)
    out = p.stdout.decode()
    recs = [json.loads(l) for l in out.splitlines() if l.strip()]
    return p.returncode, recs, p.stderr.decode()


class Base(meta_util.Base):
    def img(self, path, i=0):
        """Put a real photo (or, without the corpus, a small fake JPEG) at path."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if PHOTOS:
            shutil.copy(photo(i), path)
        else:
            write(path, b"\xff\xd8\xff\xe0" + bytes(100))


class FolderSources(Base):
    def test_flat_folder_with_bad_inputs(self):
        d = self.p("ds")
        self.img(self.p("ds", "a.jpg"), 0)
        write(self.p("ds", "a.txt"), "1girl, long_hair, ^_^, smile\n")
        write(self.p("ds", "a.caption"), "A girl smiling.\n")
        self.img(self.p("ds", "sub", "b.png"), 1)
        write(self.p("ds", "sub", "b.caption"), "only a caption")
        self.img(self.p("ds", "c.webp"), 2)                   # no caption file at all
        self.img(self.p("ds", "d.jpg"), 3)
        write(self.p("ds", "d.txt"), b"bad \xff\xfe bytes")   # not UTF-8
        self.img(self.p("ds", "e.jpg"), 4)
        write(self.p("ds", "e.txt"), "  \n")                  # empty
        self.img(self.p("ds", "a.png"), 5)                    # same key as a.jpg
        write(self.p("ds", "a.png.txt"), "x")
        write(self.p("ds", "zero.jpg"), b"")                  # empty image file
        write(self.p("ds", "zero.txt"), "tag")
        os.symlink("..", self.p("ds", "sub", "loop"))         # symlink loop
        os.symlink("missing.jpg", self.p("ds", "dangling.jpg"))
        rc, recs, err = run([d])
        self.assertEqual(rc, 0, err)
        keys = [r["key"] for r in recs]
        self.assertEqual(keys, ["a", "sub/b"])
        a = recs[0]
        self.assertEqual(a["caption"], "A girl smiling., 1girl, long hair, ^_^, smile")
        self.assertEqual(a["tags"]["general"], ["1girl", "long hair", "^_^", "smile"])
        self.assertEqual(a["image"], os.path.join(d, "a.jpg"))
        self.assertEqual(a["split"], "train")
        self.assertEqual(recs[1]["caption"], "only a caption")
        self.assertNotIn("tags", recs[1])
        self.assertEqual(skipped(err, "missing caption"), 1)
        self.assertEqual(skipped(err, "caption not UTF-8"), 1)
        self.assertEqual(skipped(err, "empty caption"), 1)
        self.assertEqual(skipped(err, "duplicate key"), 1)
        self.assertEqual(skipped(err, "empty image file"), 1)
        self.assertEqual(skipped(err, "directory visited twice (symlink loop)"), 1)
        self.assertEqual(skipped(err, "broken symlink"), 1)
        self.assertIn("d.txt", err)  # the bad file is named
        rc, _, _ = run([d, "--strict"])
        self.assertEqual(rc, 1)

    def test_multi_line_caption_files(self):
        """A .txt over several lines is one tag list (line breaks separate tags, as commas do:
        a tag a line, or lines of tags), a .caption over several lines one caption (lines joined
        by a space); a tag on its own line is still the whole tag (a rule deletes it)."""
        self.img(self.p("ml", "a.jpg"), 0)
        write(self.p("ml", "a.txt"), "1girl, solo\r\nlong_hair, smile\n\nbad_tag\n")
        self.img(self.p("ml", "b.jpg"), 1)
        write(self.p("ml", "b.caption"), "A girl\r\n  smiling at\n\nthe camera.\n")
        write(self.p("bl.json"), json.dumps({"replace_tags": {"bad_tag": ""}}))
        rc, recs, err = run([self.p("ml"), "--rules", self.p("bl.json")])
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0]["tags"]["general"], ["1girl", "solo", "long hair", "smile"])
        self.assertEqual(recs[0]["caption"], "1girl, solo, long hair, smile")
        self.assertEqual(recs[1]["caption"], "A girl smiling at the camera.")

    def test_images_captions_tree(self):
        self.img(self.p("t", "images", "x", "1.jpg"), 6)
        self.img(self.p("t", "images", "2.png"), 7)
        write(self.p("t", "captions", "x", "1.txt"), "cat, sitting")
        write(self.p("t", "captions", "2.caption"), "a dog")
        self.img(self.p("t", "images", "3.jpg"), 8)
        rc, recs, err = run([self.p("t")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(r["key"], r["caption"]) for r in recs], [("2", "a dog"), ("x/1", "cat, sitting")])
        self.assertEqual(skipped(err, "missing caption"), 1)
        # a flat folder read as a tree is a fatal error naming what is missing, not a run of 0 records
        rc, _, err = run(["--source", "tree", self.p("t", "images")])
        self.assertEqual(rc, 3, err)
        self.assertIn("no images/ directory", err)

    def test_metadata_tree(self):
        self.img(self.p("m", "img", "p1.jpg"), 9)
        write(self.p("m", "meta", "a", "p1.json"), json.dumps({"tags": ["blue_sky", "cloud"], "score": 7, "path": "img/p1.jpg", "aesthetic": 6.5}))
        write(self.p("m", "meta", "p2.json"), json.dumps({"tags": "a, b", "score": 1, "path": "img/none.jpg"}))
        write(self.p("m", "meta", "p3.json"), "{broken")
        rc, recs, err = run(["--source", "metatree", self.p("m")])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(recs), 1)
        self.assertEqual(recs[0]["key"], "img/p1")
        self.assertEqual(recs[0]["score"], 7)
        self.assertEqual(recs[0]["extra"], {"aesthetic": 6.5})
        self.assertEqual(recs[0]["caption"], "blue sky, cloud")
        self.assertEqual(skipped(err, "missing image"), 1)
        self.assertEqual(skipped(err, "malformed JSON"), 1)

    def test_pretty_printed_metadata_stays_one_line(self):
        """A metadata .json written with indent (gallery-dl, json.dump(indent=2)), LF or CRLF,
        gives one JSONL line per record: its passed-through members are re-serialised, not
        copied with their line breaks; a compact file's members still come out as written."""
        self.img(self.p("m", "img", "a.jpg"), 0)
        self.img(self.p("m", "img", "b.jpg"), 1)
        self.img(self.p("m", "img", "c.jpg"), 2)
        src = {"site": "foo", "ids": [1, 2], "note": "x y"}
        write(self.p("m", "meta", "a.json"), json.dumps({"tags": "cat", "path": "img/a.jpg", "src": src}, indent=2))
        write(self.p("m", "meta", "b.json"), json.dumps({"tags": "dog", "path": "img/b.jpg", "src": src}, indent=1)
              .replace("\n", "\r\n"))
        write(self.p("m", "meta", "c.json"), '{"tags": "owl", "path": "img/c.jpg", "n": 1.50, "s": "\\u00e9"}')
        p = subprocess.run([SD_META, "--source", "metatree", self.p("m")], capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.split(b"\n")
        self.assertEqual(lines[-1], b"")
        self.assertEqual(len(lines), 4, p.stdout)  # 3 records, each one line, no CR anywhere
        self.assertNotIn(b"\r", p.stdout)
        recs = [json.loads(l) for l in lines[:-1]]
        self.assertEqual([(r["key"], r["extra"]) for r in recs[:2]], [("img/a", {"src": src}), ("img/b", {"src": src})])
        self.assertIn(b'"extra":{"n": 1.50,"s": "\\u00e9"}', lines[2])  # compact: the source's own text
        # a booru line with stray CRs between tokens: its members are re-serialised too
        write(self.p("cr.jsonl"), b'{"id": 5, "tag_string_general": "a", "x":\r 1, "y": [1,\r2]}\n')
        p = subprocess.run([SD_META, self.p("cr.jsonl")], capture_output=True)
        self.assertEqual(p.stdout.count(b"\n"), 1, p.stdout)
        self.assertNotIn(b"\r", p.stdout)
        self.assertEqual(json.loads(p.stdout)["extra"], {"x": 1, "y": [1, 2]})


DANBOORU = {
    "id": 1234, "md5": "abc", "file_ext": "jpg", "rating": "s", "score": 15, "fav_count": 20,
    "image_width": 1920, "image_height": 1080,
    "tag_string_general": "1girl long_hair smile ^_^ open_mouth",
    "tag_string_character": "hatsune_miku", "tag_string_copyright": "vocaloid",
    "tag_string_artist": "some_artist", "tag_string_meta": "highres commentary",
    "source": "https://example.com/x", "pwatermark": 0.1,
}
E621 = {
    "id": 77, "rating": "e", "score": {"up": 10, "down": -2, "total": 8}, "fav_count": 3,
    "file": {"width": 800, "height": 600, "ext": "png", "md5": "ffe"},
    "tags": {"general": ["solo", "fur"], "species": ["canine"], "artist": ["bob"], "character": [], "meta": ["hi_res"]},
}


def post(**kw):
    d = dict(DANBOORU)
    d.update(kw)
    return d


class BooruSources(Base):
    def dump(self, posts, extra_lines=()):
        path = self.p("posts.jsonl")
        lines = [json.dumps(x).encode() for x in posts] + [l if isinstance(l, bytes) else l.encode() for l in extra_lines]
        write(path, b"\n".join(lines) + b"\n")
        return path

    def test_danbooru_fields_and_defaults(self):
        path = self.dump([post()])
        rc, recs, err = run([path])
        self.assertEqual(rc, 0, err)
        r = recs[0]
        self.assertEqual(r["key"], "1234")
        self.assertEqual((r["width"], r["height"]), (1920, 1080))
        self.assertEqual(r["rating"], "sensitive")
        self.assertEqual(r["score"], 15)
        self.assertEqual(r["tags"]["character"], ["hatsune miku"])
        self.assertEqual(r["tags"]["general"], ["1girl", "long hair", "smile", "^_^", "open mouth"])
        # default order: character, copyright, artist, general, meta
        self.assertEqual(r["caption"], "hatsune miku, vocaloid, some artist, 1girl, long hair, smile, ^_^, open mouth, highres, commentary")
        self.assertEqual(r["extra"], {"fav_count": 20, "source": "https://example.com/x", "pwatermark": 0.1})
        self.assertNotIn("image", r)

    def test_e621(self):
        path = self.dump([E621])
        rc, recs, err = run([path])
        self.assertEqual(rc, 0, err)
        r = recs[0]
        self.assertEqual((r["key"], r["rating"], r["score"], r["width"]), ("77", "explicit", 8, 800))
        self.assertEqual(r["tags"], {"general": ["solo", "fur"], "artist": ["bob"], "species": ["canine"], "meta": ["hi res"]})
        self.assertEqual(r["caption"], "bob, canine, solo, fur, hi res")

    def test_danbooru2021_and_gelbooru_layouts(self):
        """Danbooru2021 dumps (tags an array of {name, category} objects, numbers as text) and
        Gelbooru posts (tags one space-separated string, rating a word, width/height) give
        their tags; neither is taken for e621 (which skipped every post as "empty caption")."""
        d21 = {"id": "11", "md5": "m1", "rating": "q", "score": "7", "image_width": "800", "image_height": "600",
               "file_ext": "jpg", "pools": [],
               "tags": [{"id": "1", "name": "1girl", "category": "0"}, {"id": "2", "name": "some_artist", "category": "1"},
                        {"id": "3", "name": "vocaloid", "category": 3}, {"id": "4", "name": "hatsune_miku", "category": "4"},
                        {"id": "5", "name": "highres", "category": "5"}]}
        gel = {"id": 12, "md5": "m2", "rating": "sensitive", "score": 3, "width": 640, "height": 480,
               "image": "m2.png", "tags": "1girl  long_hair solo"}
        gel_old = {"id": 13, "md5": "m3", "rating": "safe", "tags": "cat"}
        rc, recs, err = run([self.dump([d21, gel, gel_old])])
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "empty caption"), 0)
        a, b, c = recs
        self.assertEqual(a["tags"], {"general": ["1girl"], "artist": ["some artist"], "copyright": ["vocaloid"],
                                     "character": ["hatsune miku"], "meta": ["highres"]})
        self.assertEqual((a["key"], a["rating"], a["score"], a["width"], a["height"]), ("11", "questionable", 7, 800, 600))
        self.assertEqual(a["extra"], {"pools": []})  # the tags array is not passed through again
        self.assertEqual(b["tags"], {"general": ["1girl", "long hair", "solo"]})
        self.assertEqual((b["key"], b["rating"], b["width"], b["height"]), ("12", "sensitive", 640, 480))
        self.assertEqual(b["extra"], {"image": "m2.png"})
        self.assertEqual((c["caption"], c["rating"]), ("cat", "safe"))
        self.assertEqual(len(recs), 3)

    def test_bad_lines_are_reported_with_line_numbers(self):
        path = self.dump([post(id=1), post(id=2)], ["{not json", "", "[1,2]", json.dumps(post(id=None, md5=None)),
                                                    json.dumps(post(id=1)), b"{\"id\": \"\xff\"}"])
        rc, recs, err = run([path])
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["key"] for r in recs], ["1", "2"])
        self.assertEqual(skipped(err, "malformed JSON"), 2)  # broken line and the non-UTF-8 one
        self.assertEqual(skipped(err, "record is not a JSON object"), 1)
        self.assertEqual(skipped(err, "post has no id or md5"), 1)
        self.assertEqual(skipped(err, "duplicate key"), 1)
        self.assertIn("posts.jsonl:3", err)
        self.assertIn("posts.jsonl:7", err)

    def test_json_array_and_stdin(self):
        path = self.p("posts.json")
        write(path, json.dumps([post(id=5), E621]))
        rc, recs, err = run([path])
        self.assertEqual([r["key"] for r in recs], ["5", "77"], err)
        rc, recs, err = run(["-"], stdin=(json.dumps(post(id=9)) + "\n").encode())
        self.assertEqual([r["key"] for r in recs], ["9"], err)

    def test_image_pattern_and_missing_images(self):
        self.img(self.p("img", "0234", "1234.jpg"), 0)
        path = self.dump([post(), post(id=99)])
        rc, recs, err = run([path, "--image-pattern", "{id%1000:04d}/{id}.{file_ext}", "--image-root", self.p("img")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["image"] for r in recs], [self.p("img", "0234", "1234.jpg")])
        self.assertEqual(skipped(err, "missing image"), 1)
        rc, recs, err = run([path, "--image-pattern", "{md5}.{ext}", "--no-check-images"])
        self.assertEqual([r["image"] for r in recs], ["abc.jpg", "abc.jpg"])
        rc, recs, err = run([path, "--image-pattern", "{nope}.jpg", "--no-check-images"])
        self.assertEqual(skipped(err, "image pattern field missing"), 2)


class Rules(Base):
    def go(self, posts, *args, rules=None):
        path = self.p("posts.jsonl")
        write(path, "".join(json.dumps(x) + "\n" for x in posts))
        a = [path] + list(args)
        if rules is not None:
            write(self.p("rules.json"), json.dumps(rules))
            a += ["--rules", self.p("rules.json")]
        rc, recs, err = run(a)
        self.assertIn(rc, (0, 1), err)
        return recs, err

    def test_blacklist_rating_scores(self):
        posts = [post(id=1), post(id=2, tag_string_general="comic solo"), post(id=3, rating="e"),
                 post(id=4, score=2), post(id=5, score=2, tag_string_general="masterpiece solo"), post(id=6, score=-10,
                 tag_string_general="masterpiece")]
        recs, err = self.go(posts, rules={"blacklist_tags": ["Comic"], "ratings": ["general", "sensitive"],
                                          "abs_min_score": 0, "min_score": 10, "tag_bonus_scores": {"masterpiece": 50}})
        self.assertEqual([r["key"] for r in recs], ["1", "5"])
        self.assertEqual(recs[1]["score"], 52)  # bonus applied
        self.assertEqual(skipped(err, "blacklisted tag"), 1)
        self.assertEqual(skipped(err, "rating not allowed"), 1)
        self.assertEqual(skipped(err, "score below min_score"), 1)
        self.assertEqual(skipped(err, "score below abs_min_score"), 1)  # id 6: bonus would lift it, abs check is first

    def test_where_conditions(self):
        posts = [post(id=1, pwatermark=0.2, aesthetic=7), post(id=2, pwatermark=0.9, aesthetic=7),
                 post(id=3, aesthetic=7, pwatermark=None), {k: v for k, v in post(id=4).items() if k != "pwatermark"},
                 post(id=5, pwatermark=0.1, aesthetic=5)]
        recs, err = self.go(posts, "--where", "pwatermark<=0.5", "--where", "aesthetic>6", "--where", "image_width >= 512")
        self.assertEqual([r["key"] for r in recs], ["1"])
        self.assertEqual(skipped(err, "where pwatermark<=0.5"), 1)
        self.assertEqual(skipped(err, "where pwatermark<=0.5: field missing"), 2)  # null and absent
        self.assertEqual(skipped(err, "where aesthetic>6: field missing") + skipped(err, "where aesthetic>6"), 1)
        recs, err = self.go([post(id=1), post(id=2, rating="g")], "--where", "rating==sensitive")
        self.assertEqual([r["key"] for r in recs], ["1"])

    def test_min_size(self):
        recs, err = self.go([post(id=1), post(id=2, image_width=300)], "--min-side", "512")
        self.assertEqual([r["key"] for r in recs], ["1"])
        self.assertEqual(skipped(err, "below min_side"), 1)
        recs, err = self.go([post(id=1), post(id=2, image_width=300)], "--min-pixels", str(1920 * 1080))
        self.assertEqual([r["key"] for r in recs], ["1"])

    def test_rewrites_and_caption(self):
        rules = {"replace_tags": {"open_mouth": "open mouth!", "highres": ""}, "replace_substrings": {"some ": "by="},
                 "non_caption_tags": ["commentary"], "score_tags": [10, 100, 1000], "tag_order": ["artist", "general", "meta"],
                 "rating_words": {"sensitive": "rating: sensitive"}, "artist_prefix": "@",
                 "caption_template": "{score_tag}, {rating}, {tags}"}
        recs, err = self.go([post(tag_string_general="1girl pokemon_(creature) ^_^ o_o open_mouth")], "--escape-parens", rules=rules)
        r = recs[0]
        # underscores only in tags longer than 3 chars; whole-tag replacement before substrings
        self.assertEqual(r["tags"]["general"], ["1girl", "pokemon \\(creature\\)", "^_^", "o_o", "open mouth!"])
        self.assertEqual(r["tags"]["artist"], ["by=artist"])
        self.assertEqual(r["tags"]["meta"], ["commentary"])  # highres removed, commentary kept as a tag
        self.assertEqual(r["caption"], "scr10, rating: sensitive, @by=artist, 1girl, pokemon \\(creature\\), ^_^, o_o, open mouth!")
        recs, err = self.go([post()], "--keep-underscores", "--template", "{character} | {copyright}")
        self.assertEqual(recs[0]["caption"], "hatsune_miku | vocaloid")

    def test_empty_parts_of_template_vanish(self):
        recs, err = self.go([post(tag_string_general="", tag_string_character="", tag_string_copyright="",
                                   tag_string_artist="", tag_string_meta="solo")], "--template", "{caption}, {score_tag}, {tags}, {rating}")
        self.assertEqual(recs[0]["caption"], "solo, sensitive")

    def test_shuffle_is_deterministic_and_keeps_tokens(self):
        posts = [post(id=i, tag_string_general=" ".join(f"tag{j}" for j in range(20))) for i in range(1, 30)]
        a, _ = self.go(posts, "--shuffle-tags", "1", "--keep-tokens", "3", "--seed", "7")
        b, _ = self.go(posts, "--shuffle-tags", "1", "--keep-tokens", "3", "--seed", "7")
        c, _ = self.go(posts, "--shuffle-tags", "1", "--keep-tokens", "3", "--seed", "8")
        plain, _ = self.go(posts)
        self.assertEqual([r["caption"] for r in a], [r["caption"] for r in b])
        self.assertNotEqual([r["caption"] for r in a], [r["caption"] for r in c])
        for r, p0 in zip(a, plain):
            t, u = r["caption"].split(", "), p0["caption"].split(", ")
            self.assertEqual(t[:3], u[:3])
            self.assertEqual(sorted(t), sorted(u))
        self.assertTrue(any(r["caption"] != p0["caption"] for r, p0 in zip(a, plain)))
        half, _ = self.go(posts, "--shuffle-tags", "0.5", "--keep-tokens", "3")
        changed = sum(r["caption"] != p0["caption"] for r, p0 in zip(half, plain))
        self.assertTrue(3 <= changed <= 26, changed)

    def test_validation_split(self):
        posts = [post(id=i) for i in range(1, 101)]
        recs, _ = self.go(posts, "--val-every", "10")
        self.assertEqual([r["key"] for r in recs if r["split"] == "val"], [str(i) for i in range(10, 101, 10)])
        a, _ = self.go(posts, "--val-fraction", "0.2")
        b, _ = self.go(posts[::-1], "--val-fraction", "0.2")  # order does not matter, the key does
        va = {r["key"] for r in a if r["split"] == "val"}
        self.assertEqual(va, {r["key"] for r in b if r["split"] == "val"})
        self.assertTrue(5 <= len(va) <= 40, len(va))

    def test_bad_rules_are_usage_errors(self):
        write(self.p("r.json"), json.dumps({"min_scor": 3}))
        rc, _, err = run([self.p("r.json"), "--rules", self.p("r.json")])
        self.assertEqual(rc, 2)
        self.assertIn("unknown key 'min_scor'", err)
        rc, _, err = run(["x", "--where", "nonsense"])
        self.assertEqual(rc, 2)
        # a full disk on stdout is named, with the reason
        write(self.p("c", "a.txt"), "a caption")
        self.img(self.p("c", "a.jpg"), 0)
        with open("/dev/full", "w") as full:
            p = subprocess.run([SD_META, self.p("c")], stdout=full, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 3)
        self.assertIn("standard output: writing the output failed: No space left on device", p.stderr.decode())
        # an empty template would empty every caption (and skip every record)
        write(self.p("e.json"), json.dumps({"caption_template": ""}))
        rc, _, err = run([self.p("e.json"), "--rules", self.p("e.json")])
        self.assertEqual(rc, 2)
        self.assertIn("'caption_template' is empty", err)


class Kohya(Base):
    def test_read_and_write_kohya(self):
        self.img(self.p("k", "a.jpg"), 0)
        self.img(self.p("k", "sub", "b.png"), 1)
        meta = {"a": {"caption": "a cat", "tags": "cat, cute_face", "train_resolution": [512, 512]},
                "sub/b": {"tags": "dog"}, "gone": {"caption": "x"}, "bad": "str"}
        write(self.p("k", "meta_cap_dd.json"), json.dumps(meta))
        rc, recs, err = run([self.p("k", "meta_cap_dd.json")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(r["key"], r["caption"]) for r in recs], [("a", "a cat, cat, cute face"), ("sub/b", "dog")])
        self.assertEqual(recs[0]["image"], self.p("k", "a.jpg"))
        self.assertEqual(skipped(err, "missing image"), 1)
        self.assertEqual(skipped(err, "kohya entry is not an object"), 1)
        out = self.p("out.json")
        rc, _, err = run([self.p("k", "meta_cap_dd.json"), "--format", "kohya", "-o", out])
        self.assertEqual(rc, 0, err)
        back = json.loads(read(out))
        # sd-scripts trains on caption + ", " + tags: the finished caption goes in whole, tags empty
        self.assertEqual(back, {"a": {"caption": "a cat, cat, cute face", "tags": ""},
                                "sub/b": {"caption": "dog", "tags": ""}})
        # a tag the rules keep out of the caption does not come back through kohya's tags
        write(self.p("nc.json"), json.dumps({"non_caption_tags": ["cute face"]}))
        rc, _, err = run([self.p("k", "meta_cap_dd.json"), "--rules", self.p("nc.json"), "--format", "kohya",
                          "-o", out])
        self.assertEqual(rc, 0, err)
        for v in json.loads(read(out)).values():
            kohya_caption = v["caption"] + (", " + v["tags"] if v["tags"] else "")
            self.assertNotIn("cute face", kohya_caption)
        self.assertEqual([f for f in os.listdir(self.dir) if ".tmp." in f], [])


    def test_kohya_output_leaves_out_what_sd_scripts_cannot_use(self):
        """--format kohya: val records stay out of the metadata (it has no split, so sd-scripts
        would train on them), counted apart from skips; a booru image that is not KEY.EXT under
        --image-root gets its path as the key (sd-scripts opens a key as a path first, as with
        its --full_path); images inside tars are skipped with the reason."""
        self.img(self.p("ds", "a.jpg"), 0)
        self.img(self.p("ds", "b.jpg"), 1)
        self.img(self.p("ds", "c.jpg"), 2)
        for k in "abc":
            write(self.p("ds", k + ".txt"), "tag " + k)
        out = self.p("k.json")
        rc, _, err = run([self.p("ds"), "--val-every", "2", "--format", "kohya", "-o", out, "--strict"])
        self.assertEqual(rc, 0, err)  # a val record is no skip
        self.assertEqual(json.loads(read(out)), {"a": {"caption": "tag a", "tags": ""}, "c": {"caption": "tag c", "tags": ""}})
        self.assertIn("1 val records left out of the kohya metadata", err)
        rc, _, err = run([self.p("ds"), "--val-fraction", "1", "--format", "kohya", "-o", out])
        self.assertEqual((rc, json.loads(read(out))), (0, {}), err)
        self.assertIn("3 val records left out", err)

        self.img(self.p("dan", "0001", "1001.png"), 3)
        self.img(self.p("dan", "1002.png"), 4)
        posts = self.p("posts.jsonl")
        write(posts, json.dumps(post(id=1001, file_ext="png")) + "\n" + json.dumps(post(id=1002, file_ext="png")) + "\n")
        for pat, want in (("{id%1000:04d}/{id}.{file_ext}", self.p("dan", "0001", "1001.png")), ("{id}.{file_ext}", "1002")):
            rc, _, err = run([posts, "--image-pattern", pat, "--image-root", self.p("dan"), "--format", "kohya", "-o", out])
            self.assertEqual(rc, 0, err)
            self.assertEqual(list(json.loads(read(out))), [want])
            if want == "1002":  # sd-scripts' lookup: the key as a path, else IMAGE_DIR/KEY.EXT
                self.assertTrue(os.path.exists(os.path.join(self.p("dan"), want + ".png")))
            else:
                self.assertTrue(os.path.exists(want))

        with tarfile.open(self.p("s.tar"), "w") as t:
            for name, data in (("x.jpg", b"\xff\xd8\xff" + bytes(300)), ("x.txt", b"cap")):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        rc, _, err = run([self.p("s.tar"), "--format", "kohya", "-o", out])
        self.assertEqual(rc, 1, err)  # every record skipped: exit 1, -o left as it was
        rc, _, err = run([self.p("s.tar"), "--format", "kohya", "-o", out, "--allow-empty"])
        self.assertEqual((rc, json.loads(read(out))), (0, {}), err)
        self.assertEqual(skipped(err, "image inside a tar (sd-scripts reads image files only)"), 1)

    def test_bmp_is_refused_as_sd_bucket_refuses_it(self):
        """A .bmp image (any case), from a folder, a kohya file or a tar, is skipped as 'not a
        supported image' with sd-bucket's words (libvips reads BMP only through ImageMagick,
        which sdtk blocks), counted: no record that the next tool drops. --no-check-images
        (a caption-only kohya import) keeps it."""
        d = self.p("bmp")
        write(self.p("bmp", "a.bmp"), b"BM" + bytes(60))
        write(self.p("bmp", "a.txt"), "cat")
        write(self.p("bmp", "B.BMP"), b"BM" + bytes(60))
        write(self.p("bmp", "B.txt"), "dog")
        self.img(self.p("bmp", "c.jpg"), 0)
        write(self.p("bmp", "c.txt"), "cow")
        rc, recs, err = run([d])
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["key"] for r in recs], ["c"])
        self.assertEqual(skipped(err, "not a supported image"), 2)
        self.assertIn("skip %s (BMP: libvips reads it only through ImageMagick, which sdtk blocks as untrusted; "
                      "convert it to PNG): not a supported image" % self.p("bmp", "a.bmp"), err)
        self.assertIn(self.p("bmp", "B.BMP"), err)
        meta = self.p("bmp", "meta_cap_dd.json")
        write(meta, json.dumps({"a": {"caption": "cat"}, "c": {"caption": "cow"}}))
        rc, recs, err = run([meta])
        self.assertEqual(([r["key"] for r in recs], skipped(err, "not a supported image")), (["c"], 1), err)
        self.assertIn(self.p("bmp", "a.bmp") + ": BMP: libvips", err)
        rc, recs, err = run(["--no-check-images", meta])
        self.assertEqual([r["key"] for r in recs], ["a", "c"], err)
        tp = self.p("bmp.tar")
        with tarfile.open(tp, "w") as tf:
            for name, data in (("0001.bmp", b"BM" + bytes(60)), ("0001.txt", b"x"), ("0002.jpg", b"\xff\xd8\xff" + bytes(300)),
                               ("0002.txt", b"y")):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
        rc, recs, err = run([tp])
        self.assertEqual(([r["key"] for r in recs], skipped(err, "not a supported image")), (["0002"], 1), err)
        self.assertIn("skip %s[0001.bmp]: not a supported image" % tp, err)

    def test_image_lookup_as_sd_scripts(self):
        """A key finds its image with upper-case extensions too, and of several the first in
        sorted order (sd-scripts' glob_images sorts: a.jpg before a.png); sd-meta's own kohya
        output of a folder with .JPG files reads back."""
        self.img(self.p("up", "IMG_0001.JPG"), 0)
        write(self.p("up", "IMG_0001.txt"), "cat")
        self.img(self.p("up", "b.png"), 1)
        self.img(self.p("up", "b.jpg"), 2)
        write(self.p("up", "b.txt"), "dog")
        meta = self.p("up", "meta_cap_dd.json")
        rc, _, err = run([self.p("up"), "--format", "kohya", "-o", meta])
        self.assertEqual(rc, 0, err)
        rc, recs, err = run([meta])
        self.assertEqual(rc, 0, err)
        self.assertEqual({r["key"]: os.path.basename(r["image"]) for r in recs}, {"IMG_0001": "IMG_0001.JPG", "b": "b.jpg"})
        self.assertEqual(skipped(err, "missing image"), 0)

    def test_empty_captions_are_skipped(self):
        """An entry whose caption comes out empty (no caption, no tags, or every tag removed by
        the rules) is skipped as "empty caption", whatever the source."""
        self.img(self.p("e", "a.jpg"), 0)
        self.img(self.p("e", "b.jpg"), 1)
        self.img(self.p("e", "c.jpg"), 2)
        write(self.p("e", "meta_cap_dd.json"), json.dumps({"a": {"caption": ""}, "b": {"caption": "", "tags": ""},
                                                           "c": {"tags": "solo"}}))
        write(self.p("rm.json"), json.dumps({"replace_tags": {"solo": ""}}))
        rc, recs, err = run([self.p("e", "meta_cap_dd.json"), "--rules", self.p("rm.json")])
        self.assertEqual(rc, 1, err)  # every record skipped: an error
        self.assertEqual(recs, [])
        self.assertEqual(skipped(err, "empty caption"), 3)
        posts = self.p("p.jsonl")
        write(posts, json.dumps({"id": 5, "md5": "ab", "tag_string_general": "", "tag_string_character": ""}) + "\n")
        rc, recs, err = run([posts])
        self.assertEqual((rc, recs), (1, []), err)
        self.assertEqual(skipped(err, "empty caption"), 1)


class WebDataset(Base):
    def make_tar(self, path, samples, fmt=tarfile.PAX_FORMAT, extra=()):
        with tarfile.open(path, "w", format=fmt) as t:
            for name, data in list(samples) + list(extra):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))

    def samples(self, base, n, start=0):
        out = []
        for i in range(start, start + n):
            key = f"{base}{i:05d}"
            img = read(photo(i)) if PHOTOS else b"\xff\xd8\xff" + bytes([i]) * 300
            out += [(key + ".jpg", img), (key + ".txt", f"caption {i}\n".encode()),
                    (key + ".json", json.dumps({"url": f"http://x/{i}", "width": 640, "height": 480, "pwatermark": i / 10}).encode())]
        return out

    def test_shards_offsets_and_braces(self):
        for k, fmt in enumerate([tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT]):
            self.make_tar(self.p(f"s-{k:03d}.tar"), self.samples("", 3, 3 * k), fmt=fmt,
                          extra=[("__meta__.json", b"{}")])
        rc, recs, err = run([self.p("s-{000..001}.tar"), "--where", "pwatermark<0.45"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["key"] for r in recs], ["00000", "00001", "00002", "00003", "00004"])
        for r in recs:
            i = int(r["key"])
            self.assertEqual(r["caption"], f"caption {i}")
            self.assertEqual((r["width"], r["height"]), (640, 480))
            self.assertEqual(r["extra"], {"url": f"http://x/{i}", "pwatermark": i / 10})
            self.assertEqual(r["member"], r["key"] + ".jpg")
            want = read(photo(i)) if PHOTOS else b"\xff\xd8\xff" + bytes([i]) * 300
            with open(r["image"], "rb") as f:  # the offset/size locate the bytes in place
                f.seek(r["offset"])
                self.assertEqual(f.read(r["size"]), want)
        self.assertEqual(skipped(err, "where pwatermark<0.45"), 1)

    def test_long_names_gnu_and_cls(self):
        long = "d" * 120 + "/k"
        self.make_tar(self.p("g.tar"), [(long + ".png", b"\x89PNG" + bytes(600)), (long + ".cls", b"3")], fmt=tarfile.GNU_FORMAT)
        write(self.p("cls.json"), json.dumps({"3": "a photo of a cat"}))
        rc, recs, err = run([self.p("g.tar"), "--cls-map", self.p("cls.json")])
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0]["key"], long)
        self.assertEqual(recs[0]["caption"], "a photo of a cat")
        with open(recs[0]["image"], "rb") as f:
            f.seek(recs[0]["offset"])
            self.assertEqual(f.read(4), b"\x89PNG")

    def test_cls_labels(self):
        """--cls-map takes a JSON cls as a number or a numeric string and a .cls member's text;
        a label that is not an integer, or not in the map, is skipped with the reason (never
        mapped to class 0)."""
        write(self.p("cls.json"), json.dumps({"0": "zero", "3": "three"}))
        img = b"\xff\xd8\xff" + bytes(300)
        self.make_tar(self.p("c.tar"), [
            ("a.jpg", img), ("a.json", b'{"cls": "3"}'),
            ("b.jpg", img), ("b.json", b'{"cls": 3}'),
            ("c.jpg", img), ("c.cls", b"3\n"),
            ("d.jpg", img), ("d.cls", b"cat"),
            ("e.jpg", img), ("e.json", b'{"cls": "x"}'),
            ("f.jpg", img), ("f.cls", b"7"),
            ("g.jpg", img), ("g.json", b'{"cls": 2.5}'),
            ("h.jpg", img), ("h.cls", b" 03\n"),                 # an integer however written
            ("i.jpg", img), ("i.json", b'{"cls": 3.0}'),
            ("j.jpg", img), ("j.json", b'{"cls": "-0"}')])
        rc, recs, err = run([self.p("c.tar"), "--cls-map", self.p("cls.json")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(r["key"], r["caption"]) for r in recs],
                         [("a", "three"), ("b", "three"), ("c", "three"), ("h", "three"), ("i", "three"), ("j", "zero")])
        self.assertEqual(skipped(err, "bad cls"), 3)
        self.assertEqual(skipped(err, "cls not in the class map"), 1)
        self.assertIn("'cat'", err)
        # a map key no label could match (labels are looked up in plain decimal) is refused
        write(self.p("cls03.json"), json.dumps({"3": "three", "003": "padded"}))
        rc, recs, err = run([self.p("c.tar"), "--cls-map", self.p("cls03.json")])
        self.assertNotEqual(rc, 0, err)
        self.assertIn("key '003' is not a class number in plain decimal", err)

    def test_unsafe_and_truncated(self):
        self.make_tar(self.p("bad.tar"), self.samples("", 2), extra=[("../evil.jpg", b"x"), ("/abs.jpg", b"y"),
                                                                     ("lonely.txt", b"no image")])
        rc, recs, err = run([self.p("bad.tar")])
        self.assertEqual([r["key"] for r in recs], ["00000", "00001"], err)
        self.assertEqual(skipped(err, "unsafe tar member name"), 2)
        self.assertEqual(skipped(err, "tar sample without image"), 1)
        self.make_tar(self.p("t.tar"), self.samples("", 4))
        data = read(self.p("t.tar"))
        with tarfile.open(self.p("t.tar")) as t:  # cut inside the third sample's image
            m = t.getmember("00002.jpg")
            cut = m.offset_data + m.size // 2
        write(self.p("cut.tar"), data[:cut])
        rc, recs, err = run([self.p("{cut,missing}.tar")])  # of a pattern's shards, a missing one is skipped
        self.assertEqual(rc, 0, err)
        self.assertTrue(1 <= len(recs) < 4, recs)
        self.assertGreater(skipped(err, "truncated or corrupt tar") + skipped(err, "tar sample cut by truncation"), 0)
        self.assertEqual(skipped(err, "unreadable tar shard"), 1)
        self.assertIn("cut.tar", err)
        self.assertEqual(run([self.p("cut.tar"), self.p("missing.tar")])[0], 3)  # a plain path must open


class Cli(Base):
    def test_exit_codes_and_help(self):
        p = subprocess.run([SD_META, "--help"], capture_output=True)
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"Usage: sd-meta", p.stdout)
        p = subprocess.run([SD_META, "--version"], capture_output=True)
        self.assertEqual(p.returncode, 0)
        self.assertEqual(run(["--bogus"])[0], 2)
        self.assertEqual(run([])[0], 2)
        self.assertEqual(run([self.p("nothing-here")])[0], 3)

    def test_output_file_is_atomic(self):
        write(self.p("posts.jsonl"), json.dumps(post()) + "\n")
        out = self.p("o", "meta.jsonl")
        os.makedirs(self.p("o"))
        write(out, "old contents\n")
        rc, _, _ = run([self.p("posts.jsonl"), "-o", out, "--rules", self.p("nope.json")])
        self.assertEqual(rc, 2)
        self.assertEqual(read(out), b"old contents\n")  # a failed run leaves the old file
        rc, _, err = run([self.p("posts.jsonl"), "-o", out])
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(read(out))["key"], "1234")
        self.assertEqual(os.listdir(self.p("o")), ["meta.jsonl"])
        # a killed run's temporary output is named (not removed: a run may be writing it)
        write(self.p("o", "meta.jsonl.tmp.Ab12Cd"), "partial\n")
        rc, _, err = run([self.p("posts.jsonl"), "-o", out])
        self.assertEqual(rc, 0, err)
        self.assertIn("meta.jsonl.tmp.Ab12Cd: a temporary output left by an earlier run", err)
        self.assertEqual(sorted(os.listdir(self.p("o"))), ["meta.jsonl", "meta.jsonl.tmp.Ab12Cd"])

    def test_output_file_mode_and_symlink(self):
        """A new -o file gets 0666 less the umask, a replaced one keeps its
        mode, and a symlink to a regular file stays a link to the new data."""
        import stat
        write(self.p("posts.jsonl"), json.dumps(post()) + "\n")
        new = self.p("new.jsonl")
        p = subprocess.run([SD_META, self.p("posts.jsonl"), "-o", new], capture_output=True,
                           preexec_fn=lambda: os.umask(0o027))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(stat.S_IMODE(os.stat(new).st_mode), 0o640)
        old = self.p("old.jsonl")
        write(old, "old\n")
        os.chmod(old, 0o600)
        self.assertEqual(run([self.p("posts.jsonl"), "-o", old])[0], 0)
        self.assertEqual(stat.S_IMODE(os.stat(old).st_mode), 0o600)
        self.assertEqual(json.loads(read(old))["key"], "1234")
        os.makedirs(self.p("data"))
        target = self.p("data", "meta.jsonl")
        write(target, "old\n")
        os.chmod(target, 0o664)
        os.symlink(os.path.join("data", "meta.jsonl"), self.p("link.jsonl"))
        rc, _, err = run([self.p("posts.jsonl"), "-o", self.p("link.jsonl")])
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.islink(self.p("link.jsonl")))
        self.assertEqual(json.loads(read(target))["key"], "1234")
        self.assertEqual(stat.S_IMODE(os.stat(target).st_mode), 0o664)
        self.assertEqual(sorted(os.listdir(self.p("data"))), ["meta.jsonl"])
        # a killed run's temporary file is beside the link's target: named there too
        write(target + ".tmp.aB3dE9", "partial\n")
        rc, _, err = run([self.p("posts.jsonl"), "-o", self.p("link.jsonl")])
        self.assertEqual(rc, 0, err)
        self.assertIn(target + ".tmp.aB3dE9: a temporary output left by an earlier run", err)

    def test_output_to_a_fifo_is_not_replaced(self):
        import stat
        import threading
        write(self.p("posts.jsonl"), json.dumps(post()) + "\n")
        fifo = self.p("pipe")
        os.mkfifo(fifo)
        got = []
        t = threading.Thread(target=lambda: got.append(read(fifo)))
        t.start()
        rc, _, err = run([self.p("posts.jsonl"), "-o", fifo])
        t.join(10)
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(got[0])["key"], "1234")
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))  # written through, not renamed over

    def test_threads_do_not_change_output(self):
        posts = [post(id=i, score=i % 30) for i in range(20000)]
        write(self.p("posts.jsonl"), "".join(json.dumps(x) + "\n" for x in posts))
        outs = []
        for j in ("1", "2", "3"):
            p = subprocess.run([SD_META, self.p("posts.jsonl"), "-j", j, "--min-score", "5", "-q"], capture_output=True)
            outs.append(p.stdout)
        self.assertEqual(outs[0], outs[1])
        self.assertEqual(outs[0], outs[2])
        self.assertEqual(len(outs[0].splitlines()), sum(1 for x in posts if x["score"] >= 5))


class FolderMessages(Base):
    """What a folder run says about what it did not use: captions without a
    usable image, where a tree's captions were looked for, names with
    control bytes, a trailing slash, a folder with no images at all."""

    def test_captions_without_a_usable_image_are_counted(self):
        d = self.p("ds")
        self.img(self.p("ds", "a.jpg"))
        write(self.p("ds", "a.txt"), "a")
        write(self.p("ds", "b.gif"), b"GIF89a")
        write(self.p("ds", "b.txt"), "b")
        write(self.p("ds", "c.jfif"), b"\xff\xd8\xff")
        write(self.p("ds", "c.caption"), "c")
        write(self.p("ds", "orphan.txt"), "o")
        rc, recs, err = run(["--strict", d])
        self.assertEqual(rc, 0, err)  # not errors
        self.assertEqual([r["key"] for r in recs], ["a"])
        self.assertEqual(skipped(err, "caption without a usable image"), 3, err)
        self.assertIn("ignored (not errors; --verbose names them): 3", err)
        self.assertNotIn("b.txt", err)
        rc, recs, err = run(["-v", d])
        for name in ("b.txt", "c.caption", "orphan.txt"):
            self.assertIn("ignored " + os.path.join(d, name) + ": caption without a usable image", err)
        # --verbose names every one, however many (it stopped at 10)
        for i in range(12):
            write(self.p("ds", "more%02d.txt" % i), "m")
        rc, recs, err = run(["-v", d])
        self.assertEqual(err.count(": caption without a usable image"), 15, err)
        self.assertNotIn("not shown", err)

    def test_tree_names_where_it_looked(self):
        d = self.p("tree")
        self.img(self.p("tree", "images", "sub", "x.png"))
        os.makedirs(self.p("tree", "captions"))
        rc, recs, err = run(["--source", "tree", d])
        self.assertEqual(skipped(err, "missing caption"), 1, err)
        self.assertIn("(no " + os.path.join(d, "captions", "sub", "x") + ".txt or .caption)", err)

    def test_control_bytes_in_names_are_escaped(self):
        d = self.p("ds")
        self.img(self.p("ds", "ok.png"))
        write(self.p("ds", "ok.txt"), "ok")
        write(self.p("ds", "bad\nname\x1b[31m.png"), b"")  # empty image: skipped with its name
        rc, recs, err = run([d])
        self.assertEqual(skipped(err, "empty image file"), 1, err)
        self.assertIn("bad\\x0aname\\x1b[31m.png: empty image file", err)
        self.assertNotIn("\x1b", err)
        self.assertTrue(all(l.startswith("sd-meta:") for l in err.splitlines()), err)

    def test_trailing_slash(self):
        d = self.p("slash")
        self.img(self.p("slash", "ok.png"))
        write(self.p("slash", "ok.txt"), "ok")
        rc, recs, err = run([d + "//"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0]["image"], os.path.join(d, "ok.png"))

    def test_empty_folder_keeps_the_output(self):
        os.makedirs(self.p("empty"))
        out = self.p("meta.jsonl")
        write(out, "old\n")
        rc, recs, err = run([self.p("empty"), "-o", out])
        self.assertEqual(rc, 1, err)
        self.assertIn("no images found in " + self.p("empty"), err)
        self.assertIn("nothing found in the source; -o not written", err)
        self.assertEqual(read(out), b"old\n")
        rc, recs, err = run([self.p("empty"), "-o", out, "--allow-empty"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(read(out), b"")

    def test_every_record_skipped_keeps_the_output(self):
        """Images without captions (a plain folder, a kohya DreamBooth folder): every record
        skipped is an error, as an empty source is: exit 1, -o untouched, the counts printed."""
        for folder in ("plain", os.path.join("db", "5_sks dog")):
            self.img(self.p(folder, "a.jpg"), 0)
            self.img(self.p(folder, "b.jpg"), 1)
        out = self.p("meta.jsonl")
        write(out, "old\n")
        for src in (self.p("plain"), self.p("db")):
            rc, recs, err = run([src, "-o", out])
            self.assertEqual(rc, 1, err)
            self.assertIn("every record was skipped (reasons below); -o not written", err)
            self.assertEqual(skipped(err, "missing caption"), 2, err)
            self.assertEqual(read(out), b"old\n")
        rc, recs, err = run([self.p("plain")])  # stdout: nothing written, exit 1 too
        self.assertEqual((rc, recs), (1, []), err)
        rc, recs, err = run([self.p("plain"), "-o", out, "--allow-empty"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(read(out), b"")

    def test_loss_masks_are_ignored_not_skipped(self):
        """NAME_mask.png beside NAME.ext is a loss mask: ignored, counted, not a skipped record,
        so --strict still passes."""
        d = self.p("ds")
        self.img(self.p("ds", "a.jpg"), 0)
        write(self.p("ds", "a.txt"), "a")
        self.img(self.p("ds", "a_mask.png"), 1)
        rc, recs, err = run(["--strict", d])
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["key"] for r in recs], ["a"])
        self.assertIn("skipped 0", err)
        self.assertIn("ignored (not errors; --verbose names them): 1", err)
        self.assertEqual(skipped(err, "loss mask beside its image"), 1, err)
        self.assertNotIn("warning", err)

    def test_write_failure_reports_what_was_written(self):
        write(self.p("posts.jsonl"), "".join(json.dumps(post(id=i + 1)) + "\n" for i in range(4)))
        with open("/dev/full", "wb") as full:
            p = subprocess.run([SD_META, "-q", self.p("posts.jsonl")], stdout=full, stderr=subprocess.PIPE)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 3, err)
        self.assertIn("written 0 before the output failed (4 lost)", err)
        self.assertNotIn("written 4", err)


class Variants(Base):
    """--caption-variants K: distinct captions per record, deterministic."""

    def folder(self):
        d = self.p("ds")
        self.img(self.p("ds", "a.jpg"), 0)
        write(self.p("ds", "a.caption"), "1girl, solo, {red|blue|green} hair, smile, outdoors, tree\n"
                                         "a girl under a tree\n")
        self.img(self.p("ds", "b.jpg"), 1)
        write(self.p("ds", "b.caption"), "cat, {dog, sitting\n")
        self.img(self.p("ds", "c.jpg"), 2)
        write(self.p("ds", "c.caption"), "plain words\n")
        return d

    def test_default_unchanged_and_bad_k(self):
        d = self.folder()
        p0 = subprocess.run([SD_META, "-q", d], capture_output=True)
        p1 = subprocess.run([SD_META, "-q", d, "--caption-variants", "1"], capture_output=True)
        self.assertEqual(p0.stdout, p1.stdout)
        self.assertNotIn(b"captions", p0.stdout)
        for k in ("0", "65", "-1"):
            rc, _, err = run([d, "--caption-variants", k])
            self.assertEqual(rc, 2, err)
            self.assertIn("--caption-variants must be an integer from 1 to 64", err)
        rc, _, err = run([d, "--tag-dropout", "0.1"])
        self.assertEqual(rc, 2, err)
        rc, _, err = run([d, "--caption-variants", "4", "--tag-dropout", "1.5"])
        self.assertEqual(rc, 2, err)
        # kohya metadata holds one caption per image: variants refused, not dropped in silence
        rc, _, err = run([d, "--caption-variants", "4", "--format", "kohya", "-o", self.p("k.json")])
        self.assertEqual(rc, 2, err)
        self.assertIn("--caption-variants 4 with --format kohya", err)
        self.assertFalse(os.path.exists(self.p("k.json")))

    def test_wildcards_without_variants(self):
        """K = 1: a wildcard is trained as written, so each record holding one is noted and
        counted; a .txt tag list is not cut inside {...} (no '{red collar' pieces)."""
        d = self.folder()
        self.img(self.p("ds", "t.jpg"), 3)
        write(self.p("ds", "t.txt"), "dog, {red collar, sitting|blue collar}, smile\n")
        rc, recs, err = run([d])
        self.assertEqual(rc, 0, err)
        a, b, c, t = recs
        self.assertEqual(a["caption"], "1girl, solo, {red|blue|green} hair, smile, outdoors, tree a girl under a tree")
        self.assertEqual(t["tags"]["general"], ["dog", "{red collar, sitting|blue collar}", "smile"])
        self.assertEqual(t["caption"], "dog, {red collar, sitting|blue collar}, smile")
        self.assertRegex(err, r"2\s+wildcard \{a\|b\} without --caption-variants")  # a and t; not b's lone '{'
        self.assertIn("note " + os.path.join(d, "t.jpg") + " (key 't'; trained as written", err)
        # with variants, the canonical caption takes each wildcard's first choice, and no such note
        rc, recs, err = run([d, "--caption-variants", "4"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[3]["caption"], "dog, red collar, sitting, smile")
        self.assertNotIn("without --caption-variants", err)

    def test_variants(self):
        d = self.folder()
        args = [d, "--template", "{caption}", "--caption-variants", "8", "--variant-shuffle", "--keep-tokens", "1",
                "--tag-dropout", "0.2"]
        rc, recs, err = run(args + ["-j", "1"])
        self.assertEqual(rc, 0, err)
        rc3, recs3, _ = run(args + ["-j", "3"])
        self.assertEqual(recs, recs3)  # deterministic, any thread count
        a, b, c = recs
        caps = a["captions"]
        self.assertEqual(len(caps), 8)
        self.assertEqual(len(set(caps)), 8)  # duplicates merged
        # the first: the first line, each wildcard's first choice, tokens in order
        self.assertEqual(a["caption"], caps[0])
        self.assertEqual(caps[0], "1girl, solo, red hair, smile, outdoors, tree")
        self.assertEqual(caps[1], "a girl under a tree")  # each line is a caption
        allowed = {"solo", "red hair", "blue hair", "green hair", "smile", "outdoors", "tree"}
        for cap in caps[2:]:
            toks = cap.split(", ")
            if toks == ["a girl under a tree"]:
                continue
            self.assertEqual(toks[0], "1girl")  # keep_tokens 1
            self.assertNotIn("{", cap)
            self.assertLessEqual(set(toks[1:]), allowed)
            self.assertLessEqual(sum(t.endswith(" hair") for t in toks), 1)
        self.assertGreater(len({t for cap in caps for t in cap.split(", ") if t.endswith(" hair")}), 1)
        # an unclosed brace: kept as a literal, the record kept, named and counted
        self.assertTrue(all("{dog" in cap or "dog" not in cap for cap in b["captions"]))
        self.assertEqual(b["caption"], "cat, {dog, sitting")
        self.assertIn("note " + os.path.join(d, "b.jpg") + " (key 'b'", err)
        self.assertRegex(err, r"1\s+unclosed \{ in a caption")
        # nothing to vary: one caption
        self.assertEqual(c["captions"], ["plain words"])
        rc, other, _ = run(args + ["--variant-seed", "5"])
        self.assertEqual(other[0]["captions"][:2], caps[:2])
        self.assertNotEqual(other[0]["captions"], caps)


if __name__ == "__main__":
    SD_META = sys.argv.pop(1)
    if not PHOTOS:
        print("note: SDTK_PHOTOS not set; image-bearing fixtures use fake bytes", file=sys.stderr)
    unittest.main(verbosity=1)
