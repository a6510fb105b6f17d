#!/usr/bin/env python3
"""The Python side of bench_long_text.sh (run by hand; torch + transformers).

  bench_long_text.py make DIR N   the real CLIP ViT-L/14 text encoder
                                  architecture with seeded random weights
                                  (bench_clip.py's) as DIR/text_encoder/, the
                                  CLIP tokenizer as DIR/tokenizer/, N booru
                                  captions (two gen_danbooru posts' tags
                                  each, about 150..300 tokens) as
                                  DIR/captions.jsonl, and N small images with
                                  the same keys in DIR/ds/
  bench_long_text.py time DIR N THREADS MAX_TOKENS REPS
                                  sd-scripts' path on transformers for N
                                  captions (tests/golden/make_long_text_golden.py's
                                  transcription of _get_input_ids and
                                  get_hidden_states): tokenize, encode the
                                  chunks 8 captions per call in fp32 on
                                  THREADS threads, join; best of REPS runs,
                                  in captions/s"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))


def make(d, n):
    import bench_clip
    from PIL import Image
    from make_long_text_golden import captions
    from tiny_clip import make_tokenizer
    bench_clip.make(d, 1)
    make_tokenizer(os.path.join(d, "tokenizer"), os.path.join(ROOT, "tests", "golden", "tokenizer"), "<|endoftext|>")
    caps = [c for c in captions(5 * n) if c.count(",") > 40][:n]  # the joined-posts ones
    os.makedirs(os.path.join(d, "ds"), exist_ok=True)
    with open(os.path.join(d, "captions.jsonl"), "w") as f:
        for i, c in enumerate(caps):
            f.write(json.dumps({"key": "c%03d" % i, "caption": c}) + "\n")
            Image.new("RGB", (64, 64), (i % 256, 90, 30)).save(os.path.join(d, "ds", "c%03d.png" % i))
            with open(os.path.join(d, "ds", "c%03d.caption" % i), "w") as g:
                g.write("x\n")


def time_it(d, n, threads, max_tokens, reps):
    import torch
    from transformers import CLIPTextModel, CLIPTokenizer
    from make_long_text_golden import sd1_states
    torch.set_num_threads(threads)
    tok = CLIPTokenizer.from_pretrained(os.path.join(d, "tokenizer"))
    enc = CLIPTextModel.from_pretrained(os.path.join(d, "text_encoder"), attn_implementation="sdpa").eval()
    with open(os.path.join(d, "captions.jsonl")) as f:
        caps = [json.loads(l)["caption"] for l in f][:n]
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(caps), 8):
                sd1_states(tok, enc, caps[i:i + 8], max_tokens)
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    print("transformers (sd-scripts' path), %d captions at %d tokens, %d thread(s): best %.2f s, %.2f captions/s"
          % (len(caps), max_tokens, threads, best, len(caps) / best))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        time_it(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
