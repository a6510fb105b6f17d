#!/usr/bin/env python3
"""End-to-end tests of sd-meta's source readers on streams and of the rule
checks: pipes, FIFOs and stdin read once (JSON lines or a JSON array),
kohya detection with awkward keys, where-conditions on true/false/null,
out-of-range integer rules, long shuffled captions, --image-pattern syntax
and how array and kohya entries are named in messages."""
import json
import os
import subprocess
import sys
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
    recs = [json.loads(l) for l in out.decode().splitlines() if l.strip()]
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


if __name__ == "__main__":
    SD_META = sys.argv.pop(1)
    unittest.main(verbosity=1)
