#!/usr/bin/env python3
"""Golden folders for reading text encoders and tokenizers saved by
transformers 5 (tests/e2e_text.py test_transformers5_layout), run by hand,
not in CI:
    pip install "transformers>=5,<6" torch safetensors
    python3 tests/golden/make_text_t5_golden.py

Writes tests/golden/clip_text_t5/:
  hub/  an SDXL model's text parts in the layout the hub's folders have:
        text_encoder/ (CLIPTextModel, names under text_model.),
        text_encoder_2/ (CLIPTextModelWithProjection), both config.json +
        model.safetensors written with safetensors' save_file; tokenizer/ and
        tokenizer_2/ as vocab.json + merges.txt + special_tokens_map.json +
        tokenizer_config.json (tokenizer_2 pads with "!", as SDXL's).
  t5/   the same weights and tokenizers written by transformers 5's
        save_pretrained, what `pipe.save_pretrained()` gives today after
        diffusers' from_single_file (which builds each model from its config
        and gives it the weights): CLIPTextModel's names lose the text_model.
        prefix (CLIPTextModelWithProjection keeps it), the tokenizers are
        tokenizer.json + tokenizer_config.json only.
An SD 1.x model is the first encoder and tokenizer alone (the test copies
them); SDXL is all four.

The tokenizer is CLIP's, cut down: the 512 byte tokens, the first 40 merges
of CLIP's merges.txt (tests/golden/tokenizer/merges.txt.gz) and the two
special tokens, 554 ids, so the encoders stay small. Encoders: width 16
(quick_gelu) and 24 (gelu, projection 20), 2 layers, random weights rounded
to values fp16 holds, stored as fp16. About 200 KB in all."""
import gzip
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "clip_text_t5")
MERGES = 40


def write_hub_tokenizer(d, pad):
    """vocab.json (ids in order) + merges.txt as the hub's CLIP folders hold
    them, and the special tokens; pad is the pad token."""
    os.makedirs(d)
    with gzip.open(os.path.join(HERE, "tokenizer", "vocab.json.gz"), "rb") as f:
        full = json.loads(f.read())
    with gzip.open(os.path.join(HERE, "tokenizer", "merges.txt.gz"), "rb") as f:
        merges = f.read().decode("utf-8").strip().split("\n")[1:MERGES + 1]
    tokens = [t for t, i in sorted(full.items(), key=lambda kv: kv[1])[:512]]
    tokens += ["".join(m.split()) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    assert len(set(tokens)) == len(tokens)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(tokens)}, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": pad,
               "unk_token": "<|endoftext|>"}
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(dict(special, model_max_length=77, tokenizer_class="CLIPTokenizer"), f, indent=2)
    return len(tokens)


def make_encoder(seed, cls, vocab, **cfg):
    """A model with random weights of a realistic spread, every value one
    fp16 holds."""
    torch.manual_seed(seed)
    conf = CLIPTextConfig(vocab_size=vocab, max_position_embeddings=77, bos_token_id=vocab - 2,
                          eos_token_id=2, pad_token_id=1, **cfg)
    model = cls(conf)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.5 if "embedding" in name else 0.1))
            p.copy_(p.half().float())
    return model


def write_hub_encoder(d, model):
    """config.json + model.safetensors under the hub's names: text_model.*
    (and text_projection.weight outside it), fp16."""
    os.makedirs(d)
    state = {k: v.half().contiguous() for k, v in model.state_dict().items() if v.is_floating_point()}
    state = {(k if k.startswith(("text_model.", "text_projection.")) else "text_model." + k): v
             for k, v in state.items()}
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    conf = model.config.to_dict()
    conf["architectures"] = [type(model).__name__]
    conf["torch_dtype"] = "float16"
    for k in ("dtype", "transformers_version", "attn_implementation", "_attn_implementation_autoset"):
        conf.pop(k, None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)


def main():
    assert int(transformers.__version__.split(".")[0]) >= 5, "needs transformers 5"
    shutil.rmtree(OUT, ignore_errors=True)
    hub, t5 = os.path.join(OUT, "hub"), os.path.join(OUT, "t5")
    vocab = write_hub_tokenizer(os.path.join(hub, "tokenizer"), "<|endoftext|>")
    write_hub_tokenizer(os.path.join(hub, "tokenizer_2"), "!")
    write_hub_encoder(os.path.join(hub, "text_encoder"),
                      make_encoder(1, CLIPTextModel, vocab, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=2, hidden_act="quick_gelu"))
    write_hub_encoder(os.path.join(hub, "text_encoder_2"),
                      make_encoder(2, CLIPTextModelWithProjection, vocab, hidden_size=24, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=3, hidden_act="gelu",
                                   projection_dim=20))
    # what a user of transformers 5 gets from diffusers' from_single_file: a
    # model built from its config, given the weights, saved with
    # save_pretrained (from_pretrained of the hub folder then save_pretrained
    # would write the hub's names back)
    for sub, cls in (("text_encoder", CLIPTextModel), ("text_encoder_2", CLIPTextModelWithProjection)):
        src = cls.from_pretrained(os.path.join(hub, sub), dtype=torch.float16)
        model = cls(src.config).half()
        model.load_state_dict(src.state_dict(), strict=True)
        model.save_pretrained(os.path.join(t5, sub))
    for sub in ("tokenizer", "tokenizer_2"):
        CLIPTokenizer.from_pretrained(os.path.join(hub, sub)).save_pretrained(os.path.join(t5, sub))
    total = 0
    for root, _, files in sorted(os.walk(OUT)):
        for f in sorted(files):
            size = os.path.getsize(os.path.join(root, f))
            total += size
            print(os.path.relpath(os.path.join(root, f), OUT), size)
    print("total", total, "bytes")


if __name__ == "__main__":
    main()
