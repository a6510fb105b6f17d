#!/usr/bin/env python3
"""Write a tiny random SD 1.x-style text encoder for the example pipeline:
DIR/text_encoder/ (a transformers CLIPTextModel folder: config.json and
model.safetensors, width 32, 2 layers, the real 49408-token vocabulary) and
DIR/tokenizer/ (the real CLIP BPE tokenizer from tests/golden/tokenizer).
sd-latents --text DIR caches its embeddings, so sd-train has its
conditioning; the numbers mean nothing (random weights, fixed seed), like
those of the tiny test VAE. Needs numpy only.
Usage: make-tiny-text-encoder.py OUT_DIR [TOKENIZER_GOLDEN_DIR]"""
import gzip
import json
import os
import struct
import sys

import numpy as np

WIDTH, LAYERS, HEADS, VOCAB, POSITIONS = 32, 2, 2, 49408, 77


def save_safetensors(path, tensors):
    """A safetensors file of fp32 arrays: an 8-byte header length, the JSON
    header with byte offsets, then the raw little-endian data."""
    header, blobs, off = {}, [], 0
    for k, v in tensors.items():
        b = np.ascontiguousarray(v, dtype="<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def text_encoder(d, rng):
    os.makedirs(d, exist_ok=True)
    mlp = 2 * WIDTH
    cfg = {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model",
           "hidden_size": WIDTH, "intermediate_size": mlp, "num_attention_heads": HEADS,
           "num_hidden_layers": LAYERS, "max_position_embeddings": POSITIONS, "vocab_size": VOCAB,
           "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "eos_token_id": 2, "bos_token_id": 0,
           "projection_dim": WIDTH}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    def r(*s):
        return rng.standard_normal(s).astype(np.float32) * 0.2
    t = {"text_model.embeddings.token_embedding.weight": r(VOCAB, WIDTH),
         "text_model.embeddings.position_embedding.weight": r(POSITIONS, WIDTH),
         "text_model.final_layer_norm.weight": 1 + r(WIDTH), "text_model.final_layer_norm.bias": r(WIDTH)}
    for i in range(LAYERS):
        p = "text_model.encoder.layers.%d." % i
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[p + "self_attn.%s.weight" % n] = r(WIDTH, WIDTH)
            t[p + "self_attn.%s.bias" % n] = r(WIDTH)
        for n in ("layer_norm1", "layer_norm2"):
            t[p + n + ".weight"] = 1 + r(WIDTH)
            t[p + n + ".bias"] = r(WIDTH)
        t[p + "mlp.fc1.weight"], t[p + "mlp.fc1.bias"] = r(mlp, WIDTH), r(mlp)
        t[p + "mlp.fc2.weight"], t[p + "mlp.fc2.bias"] = r(WIDTH, mlp), r(WIDTH)
    save_safetensors(os.path.join(d, "model.safetensors"), t)


def tokenizer(d, golden):
    os.makedirs(d, exist_ok=True)
    for n in ("vocab.json", "merges.txt"):
        with gzip.open(os.path.join(golden, n + ".gz"), "rb") as f, open(os.path.join(d, n), "wb") as g:
            g.write(f.read())
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}, f, indent=2)


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    golden = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "tokenizer")
    tokenizer(os.path.join(out, "tokenizer"), golden)
    text_encoder(os.path.join(out, "text_encoder"), np.random.default_rng(8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
