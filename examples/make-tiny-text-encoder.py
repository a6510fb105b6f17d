#!/usr/bin/env python3
"""Write a tiny random SD 1.x-style text encoder for the example pipeline:
DIR/text_encoder/ (a transformers CLIPTextModel folder: config.json and
model.safetensors, width 32, 2 layers, the real 49408-token vocabulary) and
DIR/tokenizer/ (the real CLIP BPE tokenizer from tests/golden/tokenizer).
sd-latents --text DIR caches its embeddings, so sd-train has its
conditioning; the numbers mean nothing (random weights, fixed seed), like
those of the tiny test VAE. Needs numpy only.
Usage: make-tiny-text-encoder.py OUT_DIR [TOKENIZER_GOLDEN_DIR]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from tiny_clip import make_encoder, make_tokenizer  # noqa: E402

WIDTH, LAYERS, HEADS = 32, 2, 2


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    golden = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "tokenizer")
    make_tokenizer(os.path.join(out, "tokenizer"), golden)
    make_encoder(os.path.join(out, "text_encoder"), np.random.default_rng(8), WIDTH, layers=LAYERS, heads=HEADS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
