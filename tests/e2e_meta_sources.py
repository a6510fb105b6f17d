#!/usr/bin/env python3
"""End-to-end tests of sd-meta's source readers on streams and of the rule
checks: pipes, FIFOs and stdin read once (JSON lines or a JSON array),
kohya detection with awkward keys, where-conditions on true/false/null,
out-of-range integer rules, long shuffled captions, --image-pattern syntax
how array and kohya entries are named in messages, names that are not
UTF-8, missing tar shards, escaped parentheses in tag rules, UTF-8 BOMs,
where-conditions on the key and directories that cannot be searched."""
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import unittest

import meta_util
from meta_util import skipped, write

SD_META = None


def run(args, stdin=None, timeout=60, pass_fds=()):
    """Run sd-meta; returns (exit code, records, stderr). A run that does not
    finish in time is killed and reported as exit code None."""
    p = subprocess.Popen([SD_META] + args, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=pass_fds)
    try:
        out, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, [], err.decode() + "\n(timed out)"
    recs = [json.loads(l) for l in out.decode().splitlines() if l.strip()]  # strict UTF-8, as FORMATS promises
    return p.returncode, recs, err.decode()


def post(i, **kw):
    d = {"id": i, "rating": "g", "tag_string_general": "a b c"}
    d.update(kw)
    return d


def jsonl(posts):
    return "".join(json.dumps(x) + "\n" for x in posts).encode()


def feed(path, data):
    """Write data into a FIFO from a thread (opening blocks until sd-meta
    opens the other end); a reader that closes early does not stop the test."""
    def go():
        try:
            with open(path, "wb") as f:
                f.write(data)
        except (BrokenPipeError, OSError):
            pass
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


class Base(meta_util.Base):
    prefix = "sdmeta-src-"


class Streams(Base):
    """A source that cannot be reopened is opened and read exactly once."""

    def pipe_path(self, data):
        """A /dev/fd path of a pipe fed from a thread, as bash's <(...) gives."""
        r, w = os.pipe()

        def go():
            try:
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            except OSError:
                pass
        threading.Thread(target=go, daemon=True).start()
        return r, "/dev/fd/%d" % r

    def test_process_substitution_loses_nothing(self):
        data = jsonl(post(i) for i in range(1000))  # ~50 KiB, well past any sniff buffer
        r, path = self.pipe_path(data)
        rc, recs, err = run([path, "-q"], pass_fds=(r,))
        os.close(r)
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], [str(i) for i in range(1000)])
        self.assertEqual(skipped(err, "malformed JSON"), 0, err)

    def test_named_fifo_jsonl_does_not_hang(self):
        fifo = self.p("posts.jsonl")
        os.mkfifo(fifo)
        feed(fifo, jsonl(post(i) for i in range(1000)))
        rc, recs, err = run([fifo, "-q"], timeout=30)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(recs), 1000)

    def test_named_fifo_json_array(self):
        # a .json name makes detection look for kohya's shape: it must not read the FIFO
        fifo = self.p("posts.json")
        os.mkfifo(fifo)
        feed(fifo, ("\n\n  " + json.dumps([post(i) for i in range(300)], indent=1)).encode())
        rc, recs, err = run([fifo, "-q"], timeout=30)
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], [str(i) for i in range(300)])

    def test_kohya_from_a_fifo_with_source_flag(self):
        write(self.p("img", "a.jpg"), b"\xff\xd8\xff\xe0" + bytes(100))
        fifo = self.p("meta_cap.json")
        os.mkfifo(fifo)
        feed(fifo, json.dumps({"a": {"caption": "a cat"}}).encode())
        rc, recs, err = run(["--source", "kohya", "--image-root", self.p("img"), fifo], timeout=30)
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["caption"]) for x in recs], [("a", "a cat")])

    def test_json_array_on_stdin(self):
        arr = json.dumps([post(1), post(2, tag_string_general="c")], indent=1).encode()
        rc, recs, err = run(["-"], stdin=b"\n \n" + arr)
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["1", "2"])
        self.assertEqual(skipped(err, "malformed JSON"), 0)

    def test_json_array_larger_than_a_block(self):
        # the reader hands out 8 MiB blocks: the array is the first block plus the rest
        posts = [post(i, tag_string_general="x" * 80) for i in range(100000)]
        arr = json.dumps(posts).encode()
        self.assertGreater(len(arr), 9 << 20)
        rc, recs, err = run(["-", "-q"], stdin=arr, timeout=300)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(recs), len(posts))
        self.assertEqual(recs[-1]["key"], str(len(posts) - 1))

    def test_regular_files_still_work(self):
        write(self.p("a.json"), json.dumps([post(5), post(6)]))
        write(self.p("b.jsonl"), jsonl([post(7)]))
        rc, recs, err = run([self.p("a.json"), self.p("b.jsonl")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["5", "6", "7"])
        write(self.p("bad.json"), "[1, 2")
        rc, _, err = run([self.p("bad.json")])
        self.assertEqual(rc, 3, err)
        self.assertIn("bad.json", err)


class KohyaDetection(Base):
    def meta(self, name, doc):
        write(self.p("ds", "a.jpg"), b"\xff\xd8\xff\xe0" + bytes(100))
        path = self.p("ds", name)
        write(path, doc if isinstance(doc, str) else json.dumps(doc))
        return path

    def test_first_key_with_colon_and_backslashes(self):
        # sd-scripts --full_path on Windows writes keys like "C:\\data\\x.png"
        path = self.meta("meta_cap.json", {"C:\\data\\x.png": {"caption": "w"}, "a": {"caption": "a cat"}})
        rc, recs, err = run([path, "-v"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["a"])
        self.assertIn("reading as kohya", err)

    def test_first_key_with_colon_space_and_escaped_quote(self):
        path = self.meta("m.json", '{\n  "img: \\"1\\"": {"caption": "w"},\n  "a": {"caption": "a cat"}\n}\n')
        rc, recs, err = run([path, "-v"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["a"])
        self.assertIn("reading as kohya", err)

    def test_posts_are_still_booru(self):
        path = self.meta("posts.json", '{"id": 1, "rating": "g", "tag_string_general": "a", "file": {"x": 1}}\n')
        rc, recs, err = run([path, "-v"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["1"])
        self.assertIn("reading as booru", err)


class WhereLiterals(Base):
    def go(self, *where):
        path = self.p("del.jsonl")
        write(path, jsonl([post(1, is_deleted=False, has_children=True, parent_id=None),
                           post(2, is_deleted=True, has_children=False, parent_id=1),
                           post(3, is_deleted="false", has_children=False),
                           post(4)]))
        args = [path]
        for w in where:
            args += ["--where", w]
        return run(args)

    def test_booleans_and_null(self):
        rc, recs, err = self.go("is_deleted==false")
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["1"])  # the string "false" is not false
        self.assertEqual(skipped(err, "where is_deleted==false"), 2)
        self.assertEqual(skipped(err, "where is_deleted==false: field missing"), 1)
        rc, recs, err = self.go("is_deleted != false")
        self.assertEqual([x["key"] for x in recs], ["2", "3"], err)
        rc, recs, err = self.go("has_children=true")
        self.assertEqual([x["key"] for x in recs], ["1"], err)
        rc, recs, err = self.go("parent_id==null")
        self.assertEqual([x["key"] for x in recs], ["1"], err)
        rc, recs, err = self.go("parent_id!=null")
        self.assertEqual([x["key"] for x in recs], ["2"], err)

    def test_quoted_literal_is_text(self):
        rc, recs, err = self.go("is_deleted=='false'")
        self.assertEqual([x["key"] for x in recs], ["3"], err)
        self.assertEqual(skipped(err, "where is_deleted=='false': not text"), 2)

    def test_wrong_type_is_not_reported_as_missing(self):
        rc, recs, err = self.go("is_deleted>0")
        self.assertEqual(recs, [], err)
        self.assertEqual(skipped(err, "where is_deleted>0: not a number"), 3)
        self.assertEqual(skipped(err, "where is_deleted>0: field missing"), 1)

    def test_orderings_of_literals_are_refused(self):
        for w in ("is_deleted<true", "is_deleted>=false", "parent_id<=null"):
            rc, recs, err = self.go(w)
            self.assertEqual(rc, 2, err)
            self.assertIn("only == and != compare true, false and null", err)
        write(self.p("rules.json"), json.dumps({"where": ["is_deleted<false"]}))
        rc, _, err = run([self.p("del.jsonl"), "--rules", self.p("rules.json")])
        self.assertEqual(rc, 2, err)


class IntegerRules(Base):
    def setUp(self):
        super().setUp()
        write(self.p("p.jsonl"), jsonl([post(1, tag_string_general="a b c d e f")]))

    def rules(self, doc):
        write(self.p("rules.json"), json.dumps(doc))
        return run([self.p("p.jsonl"), "--rules", self.p("rules.json")])

    def test_negative_keep_tokens_in_rules_file(self):
        rc, recs, err = self.rules({"shuffle_tag_p": 1, "keep_tokens": -3})
        self.assertEqual(rc, 2, err)
        self.assertEqual(recs, [])
        self.assertIn("rules.json", err)
        self.assertIn("'keep_tokens' must be an integer from 0", err)
        self.assertNotIn("runtime error", err)

    def test_other_integer_keys(self):
        for key, bad in (("keep_tokens", 1.5), ("seed", -1), ("seed", 2.0 ** 64), ("min_side", -5),
                         ("min_side", 1e10), ("min_pixels", -1), ("val_every", -2)):
            rc, _, err = self.rules({key: bad})
            self.assertEqual(rc, 2, (key, bad, err))
            self.assertIn("rules.json: rules: '%s' must be an integer" % key, err)
        rc, recs, err = self.rules({"keep_tokens": 2, "seed": 12345, "min_side": 0, "val_every": 0, "shuffle_tag_p": 1})
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0]["caption"].split(", ")[:2], ["a", "b"])

    def test_negative_flags_are_usage_errors(self):
        for flag in ("--keep-tokens", "--seed", "--min-side", "--min-pixels", "--val-every"):
            rc, recs, err = run([self.p("p.jsonl"), flag, "-3"])
            self.assertEqual(rc, 2, (flag, err))
            self.assertIn(flag + " must be an integer from 0", err)
        rc, recs, err = run([self.p("p.jsonl"), "--keep-tokens", "0", "--seed", "0", "--shuffle-tags", "1"])
        self.assertEqual(rc, 0, err)


class LongShuffle(Base):
    def test_every_token_survives_a_shuffle(self):
        tags = ["t%d" % i for i in range(600)]
        write(self.p("big.jsonl"), jsonl([post(1, tag_string_general=" ".join(tags))]))
        rc, recs, err = run([self.p("big.jsonl"), "--shuffle-tags", "1", "--keep-tokens", "2", "--template", "{tags}"])
        self.assertEqual(rc, 0, err)
        got = recs[0]["caption"].split(", ")
        self.assertEqual(len(got), 600)
        self.assertEqual(sorted(got), sorted(tags))
        self.assertEqual(got[:2], tags[:2])
        self.assertNotEqual(got, tags)


class ImagePattern(Base):
    def setUp(self):
        super().setUp()
        write(self.p("p.jsonl"), jsonl([post(1234, md5="abc", file_ext="jpg")]))

    def test_malformed_patterns_stop_at_startup(self):
        for pat in ("{id.jpg", "{}.jpg", "{id%0}.jpg", "{id%x}.jpg", "{id%}.jpg", "{id:99d}.jpg", "{id:4x}.jpg",
                    "{a{id}.jpg", "ok/{id}/{md5"):
            rc, recs, err = run([self.p("p.jsonl"), "--image-pattern", pat, "--no-check-images"])
            self.assertEqual(rc, 2, (pat, err))
            self.assertEqual(recs, [])
            self.assertIn("--image-pattern '%s'" % pat, err)
            self.assertNotIn("skip", err)

    def test_good_patterns_still_work(self):
        for pat, want in (("{id%1000:04d}/{id}.{file_ext}", "0234/1234.jpg"), ("{md5}.{ext}", "abc.jpg"),
                          ("{id:6}.png", "001234.png"), ("{id:d}.png", "1234.png"), ("x}{id}", "x}1234")):
            rc, recs, err = run([self.p("p.jsonl"), "--image-pattern", pat, "--no-check-images"])
            self.assertEqual(rc, 0, (pat, err))
            self.assertEqual(recs[0]["image"], want)


class EntryMessages(Base):
    def test_array_elements_are_entries_with_their_key(self):
        write(self.p("posts.json"), json.dumps([post(5), post(6, rating="e"), {"rating": "g"}], indent=2))
        rc, recs, err = run([self.p("posts.json"), "--ratings", "general", "-v"])
        self.assertEqual([x["key"] for x in recs], ["5"], err)
        self.assertIn("posts.json: entry 2 '6'", err)
        self.assertIn("posts.json: entry 3", err)
        self.assertNotIn("posts.json:2", err)
        self.assertNotIn("posts.json:3", err)

    def test_kohya_entries_are_entries_with_their_key(self):
        write(self.p("ds", "a.jpg"), b"\xff\xd8\xff\xe0" + bytes(100))
        write(self.p("ds", "meta.json"), json.dumps({"a": {"caption": "x"}, "gone": {"caption": "y"}, "bad": 3}))
        rc, recs, err = run([self.p("ds", "meta.json"), "-v"])
        self.assertEqual([x["key"] for x in recs], ["a"], err)
        self.assertIn("meta.json: entry 2 'gone'", err)
        self.assertIn("meta.json: entry 3 'bad'", err)
        self.assertNotIn("meta.json:2", err)
        # --no-check-images (captions for a latent cache whose images are gone, for
        # sd-latents --text-only): an entry without an image file goes out without `image`
        rc, recs, err = run([self.p("ds", "meta.json"), "--no-check-images"])
        self.assertEqual([(x["key"], x.get("image")) for x in recs], [("a", self.p("ds", "a.jpg")), ("gone", None)],
                         err)
        self.assertEqual(recs[1]["caption"], "y")


JPEG = b"\xff\xd8\xff\xe0" + bytes(100)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def make_tar(path, members, fmt=tarfile.GNU_FORMAT, encoding="utf-8"):
    """A tar of (name, bytes) members in the given order."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w", format=fmt, encoding=encoding) as t:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))


class NonUtf8Names(Base):
    """Records name keys, images and members in JSON, which is UTF-8: an
    entry whose name is not is skipped, counted, and named with its bytes
    escaped."""

    def test_folder_file_name(self):
        d = os.fsencode(self.p("f"))
        write(os.fsdecode(d + b"/caf\xe9.jpg"), JPEG)
        write(os.fsdecode(d + b"/caf\xe9.txt"), "x")
        write(self.p("f", "ok.jpg"), JPEG)
        write(self.p("f", "ok.txt"), "y")
        rc, recs, err = run([self.p("f"), "-v"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["ok"])
        self.assertEqual(skipped(err, "file name not UTF-8"), 1, err)
        self.assertIn("caf\\xe9.jpg", err)

    def test_folder_directory_name(self):
        d = os.fsencode(self.p("f"))
        write(os.fsdecode(d + b"/\xff\xfe/a.jpg"), JPEG)
        write(os.fsdecode(d + b"/\xff\xfe/a.txt"), "x")
        rc, recs, err = run([self.p("f"), "-v"])
        self.assertEqual((rc, recs), (1, []), err)  # every record skipped: exit 1
        self.assertEqual(skipped(err, "file name not UTF-8"), 1, err)
        self.assertIn("\\xff\\xfe/a.jpg", err)

    def test_latin1_tar_member(self):
        make_tar(self.p("l.tar"), [("caf\xe9.png", PNG), ("caf\xe9.txt", b"c"), ("ok.png", PNG), ("ok.txt", b"d")],
                 encoding="latin-1")
        rc, recs, err = run([self.p("l.tar"), "-v"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["member"], x["caption"]) for x in recs], [("ok", "ok.png", "d")])
        self.assertEqual(skipped(err, "tar member name not UTF-8"), 1, err)
        self.assertIn("l.tar[caf\\xe9]", err)


class TarSamples(Base):
    def test_caption_of_an_imageless_sample_stays_with_it(self):
        # a.txt has no image; b.png has no caption: b must not get a's
        make_tar(self.p("t.tar"), [("a.txt", b"caption of a"), ("b.png", PNG), ("c.png", PNG), ("c.txt", b"c")])
        rc, recs, err = run([self.p("t.tar")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["caption"]) for x in recs], [("c", "c")])
        self.assertEqual(skipped(err, "tar sample without image"), 1, err)
        self.assertEqual(skipped(err, "missing caption"), 1, err)


class MissingShards(Base):
    """A tar source that cannot be read stops the run (exit 3) and leaves
    the output as it was, like a missing directory; missing shards of a
    pattern are skipped as long as one shard could be read."""

    def setUp(self):
        super().setUp()
        self.out = self.p("keep.jsonl")
        write(self.out, '{"old":1}\n')

    def test_plain_path(self):
        rc, recs, err = run([self.p("nope.tar"), "-o", self.out])
        self.assertEqual(rc, 3, err)
        self.assertIn("nope.tar: cannot open: No such file or directory", err)
        self.assertEqual(meta_util.read(self.out), b'{"old":1}\n')

    def test_pattern_with_no_shard(self):
        rc, recs, err = run([self.p("dat", "{00000..00002}.tar"), "-o", self.out])
        self.assertEqual(rc, 3, err)
        self.assertIn("none of its 3 shards could be read", err)
        self.assertEqual(meta_util.read(self.out), b'{"old":1}\n')

    def test_pattern_with_some_shards(self):
        make_tar(self.p("dat", "00001.tar"), [("a.png", PNG), ("a.txt", b"x")])
        rc, recs, err = run([self.p("dat", "{00000..00002}.tar"), "-o", self.out])
        self.assertEqual(rc, 0, err)
        self.assertEqual(skipped(err, "unreadable tar shard"), 2, err)
        self.assertEqual([json.loads(l)["key"] for l in meta_util.read(self.out).splitlines()], ["a"])


class EscapedParens(Base):
    """Tags match rules whether or not their parentheses are escaped: as
    A1111 taggers write them in .txt files, or as --escape-parens makes them."""

    def folder(self, text):
        write(self.p("f", "e.jpg"), JPEG)
        write(self.p("f", "e.txt"), text)
        return self.p("f")

    def rules(self, doc):
        write(self.p("r.json"), json.dumps(doc))
        return self.p("r.json")

    def test_non_caption_with_escape_parens(self):
        for text in ("cat (animal), solo", "cat \\(animal\\), solo"):
            r = self.rules({"non_caption_tags": ["cat (animal)"], "escape_parens": True})
            rc, recs, err = run([self.folder(text), "--rules", r])
            self.assertEqual(rc, 0, err)
            self.assertEqual(recs[0]["caption"], "solo", text)
            self.assertEqual(recs[0]["tags"]["general"], ["cat \\(animal\\)", "solo"], text)

    def test_escaped_source_tags_match_every_rule(self):
        f = self.folder("cat \\(animal\\), solo")
        rc, recs, err = run([f, "--blacklist", "cat (animal)"])
        self.assertEqual((rc, recs), (1, []), err)  # every record skipped: exit 1
        self.assertEqual(skipped(err, "blacklisted tag"), 1, err)
        rc, recs, err = run([f, "--rules", self.rules({"replace_tags": {"Cat_(animal)": "cat"}})])
        self.assertEqual(recs[0]["tags"]["general"], ["cat", "solo"], err)
        rc, recs, err = run([f, "--rules", self.rules({"non_caption_tags": ["cat (animal)"]})])
        self.assertEqual(recs[0]["caption"], "solo", err)
        # a rule written escaped matches the plain tag too
        rc, recs, err = run([self.folder("cat (animal), solo"), "--blacklist", "cat \\(animal\\)"])
        self.assertEqual(recs, [], err)

    def test_bonus_on_an_escaped_booru_tag(self):
        write(self.p("p.jsonl"), jsonl([post(1, score=0, tag_string_general="cat_\\(animal\\) solo")]))
        r = self.rules({"tag_bonus_scores": {"cat (animal)": 5}, "min_score": 3})
        rc, recs, err = run([self.p("p.jsonl"), "--rules", r])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["score"]) for x in recs], [("1", 5)], err)


BOM = b"\xef\xbb\xbf"


class ByteOrderMark(Base):
    """A UTF-8 BOM at the start of a file (Windows editors write one) is not
    part of the first post, entry or caption."""

    def test_jsonl(self):
        write(self.p("d.jsonl"), BOM + jsonl([post(1), post(2)]))
        rc, recs, err = run([self.p("d.jsonl")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["1", "2"])
        self.assertEqual(skipped(err, "malformed JSON"), 0, err)

    def test_json_array(self):
        write(self.p("e.json"), BOM + json.dumps([post(1), post(2)], indent=1).encode())
        rc, recs, err = run([self.p("e.json")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["1", "2"])

    def test_kohya_json(self):
        write(self.p("ds", "a.jpg"), JPEG)
        write(self.p("ds", "meta_cap.json"), BOM + json.dumps({"a": {"caption": "a cat"}}).encode())
        rc, recs, err = run([self.p("ds", "meta_cap.json"), "-v"])
        self.assertEqual(rc, 0, err)
        self.assertIn("reading as kohya", err)
        self.assertEqual([(x["key"], x["caption"]) for x in recs], [("a", "a cat")])

    def test_tar_text_members(self):
        make_tar(self.p("t.tar"), [("a.png", PNG), ("a.txt", BOM + b"lowres, 1girl"),
                                   ("b.png", PNG), ("b.json", BOM + b'{"caption": "json cap"}')])
        rc, recs, err = run([self.p("t.tar")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["caption"]) for x in recs], [("a", "lowres, 1girl"), ("b", "json cap")])

    def test_caption_files_and_metadata_files(self):
        write(self.p("f", "a.jpg"), JPEG)
        write(self.p("f", "a.txt"), BOM + b"lowres, 1girl")
        write(self.p("f", "b.jpg"), JPEG)
        write(self.p("f", "b.txt"), BOM + b"solo, 1girl")
        write(self.p("f", "b.caption"), BOM + b"a girl")
        rc, recs, err = run([self.p("f"), "--blacklist", "lowres"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["caption"]) for x in recs], [("b", "a girl, solo, 1girl")], err)
        self.assertEqual(skipped(err, "blacklisted tag"), 1, err)
        write(self.p("mt", "a.jpg"), JPEG)
        write(self.p("mt", "m", "a.json"), BOM + json.dumps({"tags": ["x"], "path": "a.jpg"}).encode())
        rc, recs, err = run(["--source", "metatree", self.p("mt")])
        self.assertEqual([x["key"] for x in recs], ["a"], err)


class WhereKey(Base):
    """FORMATS lists key among the fields a condition can test, with a
    number as well as with text."""

    def test_numeric_key(self):
        write(self.p("p.jsonl"), jsonl([post(1), post(1001), post(3)]))
        rc, recs, err = run([self.p("p.jsonl"), "--where", "key==1001"])
        self.assertEqual([x["key"] for x in recs], ["1001"], err)
        rc, recs, err = run([self.p("p.jsonl"), "--where", "key!=1001"])
        self.assertEqual([x["key"] for x in recs], ["1", "3"], err)
        rc, recs, err = run([self.p("p.jsonl"), "--where", "key>=3"])
        self.assertEqual([x["key"] for x in recs], ["1001", "3"], err)
        rc, recs, err = run([self.p("p.jsonl"), "--where", "key=='3'"])
        self.assertEqual([x["key"] for x in recs], ["3"], err)

    def test_text_key_compared_with_a_number(self):
        write(self.p("f", "a.jpg"), JPEG)
        write(self.p("f", "a.txt"), "x")
        write(self.p("f", "0x10.jpg"), JPEG)
        write(self.p("f", "0x10.txt"), "x")
        rc, recs, err = run([self.p("f"), "--where", "key!=0"])
        self.assertEqual(recs, [], err)
        self.assertEqual(skipped(err, "where key!=0: not a number"), 2, err)


class UnreadableEntries(Base):
    """Images that cannot be reached are reported and counted, never lost
    without a word."""

    def test_directory_listed_but_not_searchable(self):
        # root searches any directory, so as root the run drops to nobody (setpriv)
        prefix = []
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                self.skipTest("running as root without setpriv")
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            os.chmod(self.dir, 0o755)
        write(self.p("d", "y.jpg"), JPEG)
        write(self.p("d", "y.txt"), "t")
        write(self.p("d", "locked", "z.jpg"), JPEG)
        write(self.p("d", "locked", "z.txt"), "t")
        os.chmod(self.p("d", "locked"), 0o644)
        try:
            p = subprocess.run(prefix + [SD_META, self.p("d"), "--strict"], capture_output=True, timeout=60)
        finally:
            os.chmod(self.p("d", "locked"), 0o755)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 1, err)  # --strict: something was skipped
        self.assertEqual([json.loads(l)["key"] for l in p.stdout.splitlines()], ["y"], err)
        self.assertEqual(skipped(err, "unreadable directory"), 1, err)
        self.assertIn("locked (cannot search it: Permission denied)", err)

    def test_path_too_long_to_stat(self):
        # reproducible as root: the directory opens, but DIR/NAME is longer than PATH_MAX
        d = self.p("d")
        os.mkdir(d)
        while len(d) < 3900:
            d = os.path.join(d, "p" * 200)
            os.mkdir(d)
        name = "n" * 250
        self.assertGreater(len(d) + 1 + len(name) + 4, 4096)
        fd = os.open(d, os.O_RDONLY)
        try:
            for ext, data in ((".jpg", JPEG), (".txt", b"t")):
                f = os.open(name + ext, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(f, data)
                os.close(f)
        finally:
            os.close(fd)
        rc, recs, err = run([self.p("d"), "-v"])
        self.assertEqual((rc, recs), (1, []), err)  # every record skipped: exit 1
        self.assertEqual(skipped(err, "unreadable directory entry"), 2, err)
        self.assertIn("File name too long", err)

    def tearDown(self):
        for dirpath, dirs, _ in os.walk(self.dir):
            for x in dirs:
                os.chmod(os.path.join(dirpath, x), 0o755)
        super().tearDown()


class DamagedTars(Base):
    """Damage inside a tar is reported and counted, never a silent loss: a
    wrecked header (libarchive steps over it), an empty image member, a
    caption with NUL bytes, a file that is no tar at all."""

    def damaged(self, blocks):
        """20 USTAR samples NNNN.jpg + NNNN.txt (2560 bytes each), the given
        512-byte blocks overwritten with garbage."""
        make_tar(self.p("t.tar"), [(f"{i:04d}.{e}", d) for i in range(20)
                                   for e, d in (("jpg", JPEG + b"\x55" * 531), ("txt", f"cap {i}".encode()))],
                 fmt=tarfile.USTAR_FORMAT)
        with tarfile.open(self.p("t.tar")) as t:  # the layout the offsets below assume
            self.assertEqual((t.getmember("0005.jpg").offset, t.getmember("0005.txt").offset), (12800, 14336))
        raw = bytearray(meta_util.read(self.p("t.tar")))
        for b in blocks:
            raw[b:b + 512] = b"B" * 512
        write(self.p("d.tar"), bytes(raw))
        return self.p("d.tar")

    def test_wrecked_sample_headers(self):
        rc, recs, err = run(["-j1", "--strict", self.damaged([5 * 2560, 5 * 2560 + 1536])])
        self.assertEqual(rc, 1, err)
        self.assertEqual(len(recs), 19)
        self.assertEqual(skipped(err, "damaged tar"), 1, err)
        self.assertIn("d.tar at byte 12800, after member '0004.txt'", err)

    def test_wrecked_image_header(self):
        rc, recs, err = run(["-j1", self.damaged([5 * 2560])])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(recs), 19)
        self.assertEqual(skipped(err, "damaged tar"), 1, err)
        self.assertEqual(skipped(err, "tar sample without image"), 1, err)

    def test_empty_image_member(self):
        make_tar(self.p("e.tar"), [("a.jpg", b""), ("a.txt", b"a"), ("b.jpg", JPEG), ("b.txt", b"b")])
        rc, recs, err = run([self.p("e.tar")])
        self.assertEqual([r["key"] for r in recs], ["b"], err)
        self.assertEqual(skipped(err, "empty image file"), 1, err)
        self.assertIn("e.tar[a.jpg]", err)
        self.assertEqual(skipped(err, "tar sample without image"), 0, err)

    def test_caption_member_with_nul_bytes(self):
        make_tar(self.p("n.tar"), [("a.jpg", JPEG), ("a.txt", "a cat".encode("utf-16-le")), ("b.jpg", JPEG),
                                   ("b.txt", b"b")])
        rc, recs, err = run([self.p("n.tar")])
        self.assertEqual([r["key"] for r in recs], ["b"], err)
        self.assertEqual(skipped(err, "caption contains NUL bytes (UTF-16?)"), 1, err)
        self.assertIn("n.tar[a.txt]", err)

    def test_utf8_member_names_are_no_damage(self):
        """libarchive warns (ARCHIVE_WARN) when a pax name cannot be converted to the C
        locale's charset and leaves the UTF-8 bytes as they are: that warning is not damage,
        and the names come through whatever the locale."""
        make_tar(self.p("u.tar"), [("猫.jpg", JPEG), ("猫.txt", b"cat"), ("é/dog.jpg", JPEG), ("é/dog.txt", b"dog")],
                 fmt=tarfile.PAX_FORMAT)
        for lc in ("C", "C.UTF-8"):
            env = dict(os.environ, LC_ALL=lc)
            p = subprocess.run([SD_META, "-j1", "--strict", self.p("u.tar")], capture_output=True, env=env)
            err = p.stderr.decode()
            self.assertEqual(p.returncode, 0, err)
            recs = [json.loads(l) for l in p.stdout.decode().splitlines()]
            self.assertEqual([(r["key"], r["member"], r["caption"]) for r in recs],
                             [("猫", "猫.jpg", "cat"), ("é/dog", "é/dog.jpg", "dog")], err)
            self.assertEqual(skipped(err, "damaged tar"), 0, err)

    def test_not_a_tar(self):
        write(self.p("empty.tar"), b"")
        write(self.p("text.tar"), b"hello\n" * 100)
        rc, recs, err = run([self.p("empty.tar")])
        self.assertEqual(rc, 3, err)
        self.assertIn("empty.tar: cannot open: empty file (not a tar)", err)
        rc, recs, err = run([self.p("text.tar")])
        self.assertEqual(rc, 3, err)
        self.assertIn("text.tar: cannot open: Unrecognized archive format", err)
        self.assertNotIn("multibyte", err)


class CaptionFiles(Base):
    """Caption files that cannot be read are skipped with the reason, and a
    FIFO named like one never blocks the run."""

    def test_fifo_directory_huge_and_utf16(self):
        d = self.p("ds")
        for n in "abcde":
            write(os.path.join(d, n + ".png"), PNG)
        os.mkfifo(os.path.join(d, "a.txt"))
        os.mkdir(os.path.join(d, "b.txt"))
        with open(os.path.join(d, "c.txt"), "wb") as f:
            f.truncate(65 << 20)
        write(os.path.join(d, "d.txt"), "a cat, a hat".encode("utf-16-le"))
        write(os.path.join(d, "e.txt"), "fine")
        rc, recs, err = run(["-v", d], timeout=20)
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["key"] for r in recs], ["e"])
        self.assertEqual(skipped(err, "unreadable caption file"), 3, err)
        self.assertIn("a.txt: not a regular file (a FIFO))", err)
        self.assertIn("b.txt: not a regular file (a directory))", err)
        self.assertIn("c.txt: too large (68157440 bytes, limit 67108864))", err)
        self.assertEqual(skipped(err, "caption contains NUL bytes (UTF-16?)"), 1, err)
        self.assertNotIn("Invalid argument", err)


class BooruKeys(Base):
    """Numeric ids are keys by their integer value, so 1001.0 and 1e3 are
    caught as duplicates; ids and tags with NUL bytes are refused."""

    def test_numeric_ids_and_nul_bytes(self):
        text = (b'{"id":1001,"tag_string":"a"}\n{"id":1001.0,"tag_string":"a"}\n{"id":1e3,"tag_string":"a"}\n'
                b'{"id":1000,"tag_string":"a"}\n{"id":1.5,"tag_string":"a"}\n{"id":1e300,"tag_string":"a"}\n'
                b'{"id":"x\\u0000y","tag_string":"a"}\n{"id":7,"tag_string":"a\\u0000b c"}\n'
                b'{"id":12345678901234567890123,"tag_string":"a"}\n')
        write(self.p("p.jsonl"), text)
        rc, recs, err = run([self.p("p.jsonl")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["key"] for r in recs], ["1001", "1000", "12345678901234567890123"])
        self.assertEqual(skipped(err, "duplicate key"), 2, err)
        self.assertEqual(skipped(err, "post id not an integer"), 2, err)
        self.assertEqual(skipped(err, "post id contains NUL bytes"), 1, err)
        self.assertEqual(skipped(err, "tag contains NUL bytes"), 1, err)
        self.assertIn("p.jsonl:5 (id 1.5)", err)


class FlagsOverrideRules(Base):
    """A flag given as 0 overrides the rules file (0 is a value, not "not
    given"); out-of-range fractions and thread counts are usage errors."""

    def setUp(self):
        super().setUp()
        write(self.p("p.jsonl"), jsonl([post(i, image_width=64, image_height=64) for i in range(1, 11)]))
        write(self.p("rules.json"), json.dumps({"min_side": 100, "min_pixels": 10 ** 6, "val_every": 2,
                                                "val_fraction": 1, "shuffle_tag_p": 1}))

    def test_zero_flags_override_the_rules_file(self):
        rc, recs, err = run([self.p("p.jsonl"), "-r", self.p("rules.json"), "--min-side", "0"])
        self.assertEqual((rc, len(recs)), (1, 0), err)  # min_pixels still drops them all (exit 1)
        rc, recs, err = run([self.p("p.jsonl"), "-r", self.p("rules.json"), "--min-side", "0", "--min-pixels", "0",
                             "--val-every", "0", "--val-fraction", "0", "--shuffle-tags", "0"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(recs), 10, err)
        self.assertEqual({r["split"] for r in recs}, {"train"})
        self.assertEqual({r["caption"] for r in recs}, {"a, b, c"})

    def test_out_of_range_values(self):
        for flag, val in (("--shuffle-tags", "-0.5"), ("--val-fraction", "-0.5"), ("--shuffle-tags", "1.5"),
                          ("--val-fraction", "nan")):
            rc, recs, err = run([self.p("p.jsonl"), flag, val])
            self.assertEqual(rc, 2, (flag, val, err))
            self.assertIn(flag + " must be in [0,1]", err)
        for val in ("-3", "1025"):
            rc, recs, err = run([self.p("p.jsonl"), "-j", val])
            self.assertEqual(rc, 2, (val, err))
            self.assertIn("--threads must be an integer from 0 to 1024", err)
        rc, recs, err = run([self.p("p.jsonl"), "-j", "0"])  # all cores, as -j 0 means in every tool
        self.assertEqual((rc, len(recs)), (0, 10), err)


class TemplateVariables(Base):
    """Unknown {names}, an unclosed '{' and a lone '}' in the caption template
    are errors when the rules are read; {{ and }} are literal braces."""

    def test_typos_are_usage_errors(self):
        write(self.p("p.jsonl"), jsonl([post(1)]))
        for t in ("{caption}, {tag}", "{caption", "a } b"):
            rc, recs, err = run([self.p("p.jsonl"), "-t", t])
            self.assertEqual((rc, recs), (2, []), (t, err))
        rc, recs, err = run([self.p("p.jsonl"), "-t", "{caption}, {tag}"])
        self.assertIn("unknown variable {tag} (known: {caption}, {tags}, {rating}, {score_tag}, {general}", err)
        write(self.p("rules.json"), json.dumps({"caption_template": "{ratng}, {tags}"}))
        rc, recs, err = run([self.p("p.jsonl"), "-r", self.p("rules.json")])
        self.assertEqual(rc, 2, err)
        self.assertIn("unknown variable {ratng}", err)

    def test_literal_braces(self):
        write(self.p("p.jsonl"), jsonl([post(1)]))
        rc, recs, err = run([self.p("p.jsonl"), "-t", "{{style}}, {tags}"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0]["caption"], "{style}, a, b, c")


class ProducerFiles(Base):
    """What webdataset's writers, img2dataset and sd-scripts' merge scripts
    write (issue 31, items 10-14)."""

    def test_compressed_tar_is_refused_with_the_reason(self):
        # the later stages pread images at their offsets in the shard: a .tar.gz has none
        make_tar(self.p("plain", "00000.tar"), [("a.png", PNG), ("a.txt", b"x")])
        os.makedirs(self.p("gz"))
        with open(self.p("plain", "00000.tar"), "rb") as f, gzip.open(self.p("gz", "00000.tar.gz"), "wb") as g:
            g.write(f.read())
        rc, recs, err = run([self.p("gz", "00000.tar.gz")])
        self.assertEqual((rc, recs), (3, []), err)
        self.assertIn("00000.tar.gz: compressed tar (gzip)", err)
        self.assertIn("unpack it", err)
        shutil.copy(self.p("plain", "00000.tar"), self.p("gz", "00001.tar"))
        rc, recs, err = run([self.p("gz", "{00000..00001}.tar{.gz,}")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["member"], "offset" in x) for x in recs], [("a", "a.png", True)], err)
        self.assertEqual(skipped(err, "compressed tar shard"), 1, err)

    def test_python_nan_and_infinity_keep_the_sample(self):
        # json.dumps writes NaN/Infinity by default (allow_nan); json.loads and webdataset read them
        meta = json.dumps({"caption": "c", "pwatermark": float("nan"), "aesthetic": float("inf"),
                           "low": float("-inf"), "n": [1.5, float("nan")]}).encode()
        self.assertIn(b"NaN", meta)
        make_tar(self.p("t.tar"), [("a.png", PNG), ("a.json", meta), ("b.png", PNG), ("b.json", b'{"caption": "d"}')])
        rc, recs, err = run([self.p("t.tar")])
        self.assertEqual(rc, 0, err)
        self.assertEqual([x["key"] for x in recs], ["a", "b"], err)
        self.assertEqual(recs[0]["extra"], {"pwatermark": None, "aesthetic": None, "low": None, "n": [1.5, None]})
        # a filter compares them as Python does: NaN fails every comparison, Infinity is large
        rc, recs, err = run([self.p("t.tar"), "--where", "aesthetic>6", "--where", "low<0"])
        self.assertEqual([x["key"] for x in recs], ["a"], err)
        rc, recs, err = run([self.p("t.tar"), "--where", "pwatermark<=0.5"])
        self.assertEqual([x["key"] for x in recs], [], err)
        self.assertEqual(skipped(err, "where pwatermark<=0.5"), 1, err)
        self.assertEqual(skipped(err, "where pwatermark<=0.5: field missing"), 1, err)
        # JSON lines and metadata files from Python tools too; strict JSON (and "nan" text) still refused
        write(self.p("p.jsonl"), jsonl([post(1, aesthetic=float("nan")), post(2)]) + b'{"id": 3, "x": nan}\n')
        rc, recs, err = run([self.p("p.jsonl")])
        self.assertEqual([(x["key"], x.get("extra", {}).get("aesthetic", 0)) for x in recs], [("1", None), ("2", 0)],
                         err)
        self.assertEqual(skipped(err, "malformed JSON"), 1, err)

    def test_crlf_caption_is_one_caption_from_every_source(self):
        cap = b"line one\r\nline two \r\n"
        make_tar(self.p("t.tar"), [("a.png", PNG), ("a.txt", cap), ("b.png", PNG),
                                   ("b.json", json.dumps({"caption": "line one\r\nline two"}).encode())])
        write(self.p("f", "a.jpg"), JPEG)
        write(self.p("f", "a.caption"), cap)
        write(self.p("k", "a.jpg"), JPEG)
        write(self.p("k", "meta_cap.json"), json.dumps({"a": {"caption": "line one\r\nline two"}}))
        got = []
        for src in (self.p("t.tar"), self.p("f"), self.p("k", "meta_cap.json")):
            rc, recs, err = run([src])
            self.assertEqual(rc, 0, err)
            got += [x["caption"] for x in recs]
        self.assertEqual(got, ["line one line two"] * 4)

    def test_kohya_tags_lose_their_bom(self):
        # sd-scripts' merge scripts read tag files as utf-8: a BOM stays inside the first tag
        write(self.p("k", "a.jpg"), JPEG)
        write(self.p("k", "b.jpg"), JPEG)
        write(self.p("k", "meta_cap_dd.json"), json.dumps({"a": {"caption": "\ufeffa cat", "tags": "\ufefflowres, cat"},
                                                           "b": {"tags": "\ufeffsolo, dog"}}))
        rc, recs, err = run(["--source", "kohya", self.p("k", "meta_cap_dd.json"), "--blacklist", "lowres"])
        self.assertEqual(rc, 0, err)
        self.assertEqual([(x["key"], x["caption"]) for x in recs], [("b", "solo, dog")], err)
        self.assertEqual(skipped(err, "blacklisted tag"), 1, err)

    def test_img2dataset_key_stays_in_extra(self):
        meta = json.dumps({"url": "http://x/a.png", "key": "000000001", "status": "success", "caption": "c",
                           "width": 8, "height": 8, "original_width": 16, "original_height": 16}).encode()
        make_tar(self.p("t.tar"), [("000000001.png", PNG), ("000000001.json", meta), ("000000001.txt", b"c")])
        rc, recs, err = run([self.p("t.tar")])
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0]["extra"], {"url": "http://x/a.png", "key": "000000001", "status": "success",
                                            "original_width": 16, "original_height": 16})


if __name__ == "__main__":
    SD_META = sys.argv.pop(1)
    unittest.main(verbosity=1)
