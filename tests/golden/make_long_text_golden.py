#!/usr/bin/env python3
"""Golden outputs for prompts over 75 tokens (sd-latents --max-tokens 150/225),
made by a transcription of kohya-ss/sd-scripts (written here from reading
library/strategy_base.py TokenizeStrategy._get_input_ids and
library/train_util.py get_hidden_states / pool_workaround /
get_hidden_states_sdxl, commit 48d368f) on tiny encoders, with transformers'
CLIPTokenizer and CLIPTextModel(WithProjection) in float64.

The encoders are tests/tiny_clip.py's numpy-made ones (make_long_text_models:
the real 49408-token vocabulary; width 4, so the full outputs stay small);
the SHA-256 of each model.safetensors is recorded, and tests/e2e_long_text.py
makes them again with the same code and checks the hashes before comparing.
The captions are booru tag lists from bench/gen_danbooru.py (ASCII, no '&' or
'!', so transformers 5's tokenizer gives the ids sdtk's does; asserted), 50 of
them from 20 to over 225 tokens.

Run by hand (torch, transformers: /tmp/fm-venv):
  /tmp/fm-venv/bin/python tests/golden/make_long_text_golden.py
Writes tests/golden/long_text/: captions.json (captions, token counts, hashes,
shapes) and one little-endian float32 file per variant and length:
sd1_150.f32 [50, 152, 4], sd1_225.f32 [50, 227, 4], sdxl_150.f32 and
sdxl_225.f32 [50, T*4 + T*4 + 4] per caption (hidden1, hidden2, pooled),
sd2_225.f32 [50, 227, 4] (SD 2.x: the OpenCLIP tokenizer's "!" padding)."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)
from tiny_clip import LONG_SEEDS, LONG_WIDTH, make_long_text_models  # noqa: E402

OUT = os.path.join(HERE, "long_text")
WIDTH = LONG_WIDTH


def captions(n=50):
    """Booru captions ('tag one, tag two, ...') of spread lengths: gen_danbooru
    posts' tag strings, some cut short, some two posts' tags joined."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "posts.jsonl")
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gen_danbooru.py"), "400", p, "30"], check=True)
        tags = []
        for line in open(p):
            try:
                post = json.loads(line)
            except ValueError:
                continue
            if "tag_string" in post:
                tags.append([t.replace("_", " ") for t in post["tag_string"].split()])
    caps = []
    for i in range(n):
        a, b = tags[2 * i], tags[2 * i + 1]
        if i % 5 == 0:
            t = a[: 4 + i % 7]       # under 75 tokens: the later chunks are padding only
        elif i % 5 in (1, 2):
            t = a                    # about 75..150
        elif i % 5 == 3:
            t = a + b[: len(b) // 2]  # about 150..225
        else:
            t = a + b                # about 200..300: 225 truncates most
        c = ", ".join(t)
        assert c.isascii() and "&" not in c and "!" not in c, c
        caps.append(c)
    return caps


def input_ids(tokenizer, text, max_length):
    """TokenizeStrategy._get_input_ids (unweighted) for max_length = N + 2:
    pad/truncate to max_length, then 77-long chunks BOS + 75 + last id; for a
    tokenizer whose pad is not EOS (SD 2.x, SDXL's second) a chunk ending in
    a token gets EOS last, and one starting with pad gets EOS first."""
    ids = tokenizer(text, padding="max_length", truncation=True, max_length=max_length,
                    return_tensors="pt").input_ids
    mml = 77
    if max_length <= mml:
        return ids
    ids = ids.squeeze(0)
    chunks = []
    for i in range(1, max_length - mml + 2, mml - 2):
        c = torch.cat((ids[0].unsqueeze(0), ids[i: i + mml - 2], ids[-1].unsqueeze(0)))
        if tokenizer.pad_token_id != tokenizer.eos_token_id:
            if c[-2] != tokenizer.eos_token_id and c[-2] != tokenizer.pad_token_id:
                c[-1] = tokenizer.eos_token_id
            if c[1] == tokenizer.pad_token_id:
                c[1] = tokenizer.eos_token_id
        chunks.append(c)
    return torch.stack(chunks)  # n, 77


def join(hidden, max_token_length):
    """get_hidden_states' join (its v1 branch; the v2 branch's fix-up
    compares a tensor with the EOS token's string, never true, so it is the
    same): the first BOS, rows 1..75 of each chunk, the last chunk's last
    row. hidden: b, n*77, w."""
    parts = [hidden[:, 0].unsqueeze(1)]
    for i in range(1, max_token_length, 77):
        parts.append(hidden[:, i: i + 75])
    parts.append(hidden[:, -1].unsqueeze(1))
    return torch.cat(parts, dim=1)


def sd1_states(tok, enc, caps, max_tokens):
    """get_hidden_states (clip_skip None, SD 1.x): last_hidden_state of
    each chunk, joined."""
    ids = torch.stack([input_ids(tok, c, max_tokens + 2) for c in caps])  # b, n, 77
    b = ids.shape[0]
    with torch.no_grad():
        h = enc(ids.reshape(-1, 77))[0]
    return join(h.reshape(b, -1, h.shape[-1]), max_tokens)


def sd2_states(tok, enc, caps, max_tokens):
    """get_hidden_states with args.v2: its fix-up for a chunk that starts
    with EOS compares input_ids[j, 1] with tokenizer.eos_token, a string,
    which a tensor never equals, so it joins as SD 1.x does; the chunks
    differ (pad "!" = 0, mended ends)."""
    for c in caps[:3]:
        assert not bool(input_ids(tok, c, max_tokens + 2)[0, 1] == tok.eos_token)
    return sd1_states(tok, enc, caps, max_tokens)


def pool_workaround(enc, last, ids, eos):
    """The end token's row (the first EOS: argmax of the mask), projected."""
    idx = torch.argmax((ids == eos).int(), dim=1)
    return enc.text_projection(last[torch.arange(last.shape[0]), idx])


def sdxl_states(tok1, tok2, enc1, enc2, caps, max_tokens):
    """get_hidden_states_sdxl: encoder 1's hidden_states[11] (the
    penultimate layer of CLIP-L's 12; [-2] of these 2-layer models),
    encoder 2's penultimate, the pooled output from encoder 2's last
    hidden state at the first EOS, joined; pool2[::n]."""
    ids1 = torch.stack([input_ids(tok1, c, max_tokens + 2) for c in caps])
    ids2 = torch.stack([input_ids(tok2, c, max_tokens + 2) for c in caps])
    b = ids1.shape[0]
    ids1, ids2 = ids1.reshape(-1, 77), ids2.reshape(-1, 77)
    with torch.no_grad():
        h1 = enc1(ids1, output_hidden_states=True, return_dict=True)["hidden_states"][-2]
        out2 = enc2(ids2, output_hidden_states=True, return_dict=True)
        h2 = out2["hidden_states"][-2]
        pool2 = pool_workaround(enc2, out2["last_hidden_state"], ids2, tok2.eos_token_id)
    n = max_tokens // 75
    h1 = join(h1.reshape(b, -1, h1.shape[-1]), max_tokens)
    h2 = join(h2.reshape(b, -1, h2.shape[-1]), max_tokens)
    return h1, h2, pool2[::n]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    os.makedirs(OUT, exist_ok=True)
    caps = captions()
    with tempfile.TemporaryDirectory() as tmp:
        sd1, sdxl, sd2 = make_long_text_models(tmp, os.path.join(HERE, "tokenizer"))
        hashes = {k: sha256(os.path.join(d, sub, "model.safetensors"))
                  for k, d, sub in (("sd1/text_encoder", sd1, "text_encoder"),
                                    ("sdxl/text_encoder", sdxl, "text_encoder"),
                                    ("sdxl/text_encoder_2", sdxl, "text_encoder_2"),
                                    ("sd2/text_encoder", sd2, "text_encoder"))}
        tok = CLIPTokenizer.from_pretrained(os.path.join(sd1, "tokenizer"))
        tok1 = CLIPTokenizer.from_pretrained(os.path.join(sdxl, "tokenizer"))
        tok2 = CLIPTokenizer.from_pretrained(os.path.join(sdxl, "tokenizer_2"))
        tok2.pad_token_id = 0  # as SdxlTokenizeStrategy sets it
        tokv2 = CLIPTokenizer.from_pretrained(os.path.join(sd2, "tokenizer"))
        assert tok.pad_token_id == tok.eos_token_id == 49407 and tok2.pad_token_id == tokv2.pad_token_id == 0
        encv2 = CLIPTextModel.from_pretrained(os.path.join(sd2, "text_encoder")).double().eval()
        enc = CLIPTextModel.from_pretrained(os.path.join(sd1, "text_encoder")).double().eval()
        enc1 = CLIPTextModel.from_pretrained(os.path.join(sdxl, "text_encoder")).double().eval()
        enc2 = CLIPTextModelWithProjection.from_pretrained(os.path.join(sdxl, "text_encoder_2")).double().eval()
        tokens = [len(tok(c).input_ids) - 2 for c in caps]
        for n in (150, 225):
            h = sd1_states(tok, enc, caps, n)
            assert h.shape == (len(caps), n + 2, WIDTH)
            h.numpy().astype("<f4").tofile(os.path.join(OUT, "sd1_%d.f32" % n))
            h1, h2, p = sdxl_states(tok1, tok2, enc1, enc2, caps, n)
            flat = torch.cat([h1.reshape(len(caps), -1), h2.reshape(len(caps), -1), p], dim=1)
            flat.numpy().astype("<f4").tofile(os.path.join(OUT, "sdxl_%d.f32" % n))
        # SD 2.x (a diffusers text_encoder holds the 23 layers it uses: its last_hidden_state,
        # as sd-scripts' v2 model), at 225 only: the same join as SD 1.x, other padding
        sd2_states(tokv2, encv2, caps, 225).numpy().astype("<f4").tofile(os.path.join(OUT, "sd2_225.f32"))
    meta = {"source": "kohya-ss/sd-scripts 48d368fa557731ad0488c07304dfeba8c07910eb, transcribed",
            "width": WIDTH, "seeds": LONG_SEEDS, "sha256": hashes, "tokens": tokens, "captions": caps}
    with open(os.path.join(OUT, "captions.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print("tokens per caption: min %d max %d; over 75: %d, over 150: %d, over 225: %d"
          % (min(tokens), max(tokens), sum(t > 75 for t in tokens), sum(t > 150 for t in tokens),
             sum(t > 225 for t in tokens)))


if __name__ == "__main__":
    main()
