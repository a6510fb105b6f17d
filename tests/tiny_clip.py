"""Tiny random CLIP text encoders in the transformers layout and the real
CLIP tokenizer, written with numpy only: used by tests/e2e_text.py and by
examples/make-tiny-text-encoder.py (the example pipeline's conditioning).
The numbers mean nothing; the encoders' arithmetic is checked against
transformers by tests/test_clip_text.c."""
import gzip
import json
import os
import struct

import numpy as np

VOCAB, POSITIONS = 49408, 77


def save_safetensors(path, tensors):
    """A safetensors file of fp32 arrays (8-byte header length, the JSON
    header with byte offsets, the raw little-endian data), written to a
    temporary name and renamed."""
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


def make_encoder(d, rng, width, act="quick_gelu", proj=0, layers=2, heads=2, f16_exact=False):
    """A CLIPTextModel (CLIPTextModelWithProjection when proj) folder; with
    f16_exact every weight is a value fp16 holds exactly (stored as fp32)."""
    os.makedirs(d, exist_ok=True)
    mlp = 2 * width
    cfg = {"architectures": ["CLIPTextModelWithProjection" if proj else "CLIPTextModel"],
           "model_type": "clip_text_model", "hidden_size": width, "intermediate_size": mlp,
           "num_attention_heads": heads, "num_hidden_layers": layers, "max_position_embeddings": POSITIONS,
           "vocab_size": VOCAB, "hidden_act": act, "layer_norm_eps": 1e-5, "eos_token_id": 2, "bos_token_id": 0,
           "projection_dim": proj or width}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    def r(*s):
        v = rng.standard_normal(s).astype(np.float32) * 0.2
        return v.astype(np.float16).astype(np.float32) if f16_exact else v
    t = {"text_model.embeddings.token_embedding.weight": r(VOCAB, width),
         "text_model.embeddings.position_embedding.weight": r(POSITIONS, width),
         "text_model.final_layer_norm.weight": 1 + r(width), "text_model.final_layer_norm.bias": r(width)}
    for i in range(layers):
        p = "text_model.encoder.layers.%d." % i
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[p + "self_attn.%s.weight" % n] = r(width, width)
            t[p + "self_attn.%s.bias" % n] = r(width)
        for n in ("layer_norm1", "layer_norm2"):
            t[p + n + ".weight"] = 1 + r(width)
            t[p + n + ".bias"] = r(width)
        t[p + "mlp.fc1.weight"], t[p + "mlp.fc1.bias"] = r(mlp, width), r(mlp)
        t[p + "mlp.fc2.weight"], t[p + "mlp.fc2.bias"] = r(width, mlp), r(width)
    if proj:
        t["text_projection.weight"] = r(proj, width)
    save_safetensors(os.path.join(d, "model.safetensors"), t)


def make_tokenizer(d, golden, pad="<|endoftext|>"):
    """vocab.json + merges.txt from the golden .gz copies, and the pad token
    the encoder pads with (SD1/CLIP-L: end of text; OpenCLIP: "!")."""
    os.makedirs(d, exist_ok=True)
    for n in ("vocab.json", "merges.txt"):
        with gzip.open(os.path.join(golden, n + ".gz"), "rb") as f, open(os.path.join(d, n), "wb") as g:
            g.write(f.read())
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": pad,
                   "unk_token": "<|endoftext|>"}, f, indent=2)


LONG_WIDTH, LONG_SEEDS = 4, {"sd1": 150, "sdxl": 225, "sd2": 2}


def make_long_text_models(tmp, golden):
    """The tiny SD 1.x, SDXL and SD 2.x model folders (width 4, fixed seeds)
    of the long-prompt goldens: tests/golden/make_long_text_golden.py
    computes their expected outputs, tests/e2e_long_text.py makes them
    again and checks them. Returns (sd1, sdxl, sd2) folder paths."""
    sd1 = os.path.join(tmp, "sd1")
    make_tokenizer(os.path.join(sd1, "tokenizer"), golden, "<|endoftext|>")
    make_encoder(os.path.join(sd1, "text_encoder"), np.random.default_rng(LONG_SEEDS["sd1"]), LONG_WIDTH,
                 "quick_gelu", 0, layers=2, heads=2)
    sdxl = os.path.join(tmp, "sdxl")
    rng = np.random.default_rng(LONG_SEEDS["sdxl"])
    make_tokenizer(os.path.join(sdxl, "tokenizer"), golden, "<|endoftext|>")
    make_tokenizer(os.path.join(sdxl, "tokenizer_2"), golden, "!")
    make_encoder(os.path.join(sdxl, "text_encoder"), rng, LONG_WIDTH, "quick_gelu", 0, layers=2, heads=2)
    make_encoder(os.path.join(sdxl, "text_encoder_2"), rng, LONG_WIDTH, "gelu", LONG_WIDTH, layers=3, heads=2)
    sd2 = os.path.join(tmp, "sd2")  # GELU: SD 2.x, padded with "!" (id 0)
    make_tokenizer(os.path.join(sd2, "tokenizer"), golden, "!")
    make_encoder(os.path.join(sd2, "text_encoder"), np.random.default_rng(LONG_SEEDS["sd2"]), LONG_WIDTH, "gelu", 0,
                 layers=2, heads=2)
    return sd1, sdxl, sd2
