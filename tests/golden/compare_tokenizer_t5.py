#!/usr/bin/env python3
"""The measurements behind docs/TOKENIZER.md's transformers 5 table, run by
hand, not in CI, once with each transformers:
    pip install "transformers<5" ftfy   # in one venv: prints the reference
    pip install "transformers>=5,<6"    # in another: prints what it gives
    python3 tests/golden/compare_tokenizer_t5.py > out-N.json
and, with transformers 5, `--corpus` counts the corpus captions of
tests/golden/tokenizer/corpus.jsonl.gz (transformers 4 slow + ftfy ids, what
sdtk gives) that transformers 5 tokenizes otherwise, and how many of those
carry the "fast" flag (transformers 4's fast tokenizer differs too). The
tokenizer is CLIP's (tests/golden/tokenizer, unpacked to a temp folder)."""
import gzip
import json
import os
import shutil
import sys
import tempfile

import transformers
from transformers import CLIPTokenizer

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
TEXTS = ["Tom &amp; Jerry", "\u201ccurly\u201d", "\ufb01", "\u01c5", "&nbsp;", "\uff21\uff22", "it\u2019s"]


def load():
    """CLIPTokenizer.from_pretrained of the unpacked golden vocabulary."""
    d = tempfile.mkdtemp()
    for n in ("vocab.json", "merges.txt"):
        with gzip.open(os.path.join(HERE, n + ".gz"), "rb") as f, open(os.path.join(d, n), "wb") as g:
            g.write(f.read())
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}, f)
    try:
        return CLIPTokenizer.from_pretrained(d)
    finally:
        shutil.rmtree(d)


def main():
    tok = load()
    if "--corpus" in sys.argv:
        n = differ = fast = 0
        with gzip.open(os.path.join(HERE, "corpus.jsonl.gz")) as f:
            for line in f:
                r = json.loads(line)
                if "text" not in r:
                    continue
                n += 1
                if tok(r["text"]).input_ids != r["ids"]:
                    differ += 1
                    fast += bool(r.get("fast"))
        print(json.dumps({"transformers": transformers.__version__, "captions": n, "differ": differ,
                          "of_them_fast": fast}))
        return
    out = {"transformers": transformers.__version__, "class": type(tok).__name__}
    for t in TEXTS:
        ids = tok(t).input_ids
        out[t] = " ".join(tok.convert_ids_to_tokens(ids)[1:-1])
    print(json.dumps(out, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
