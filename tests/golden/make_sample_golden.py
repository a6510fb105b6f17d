#!/usr/bin/env python3
"""Golden images for sd-sample (tests/e2e_sample.py, test_matches_diffusers),
run by hand, not in CI:
    python3 tests/golden/make_sample_golden.py
(needs torch, diffusers, transformers from PyPI; numpy, PIL).

Builds the tiny model folders tests/e2e_sample.py builds (the same
make_model: the golden UNets and VAE, numpy-made CLIP encoders with the
real tokenizer, SD 1.5's scheduler_config.json) and renders one prompt
with a negative prompt, CFG 7, 10 steps, 64x64, seed 1 with diffusers'
StableDiffusionPipeline in fp32 on the CPU, a CPU torch.Generator seeded
so (the noise sd-sample draws), each sampler swapped in with from_config
as the diffusers docs do. Writes tests/golden/sample/<family>_<sampler>.png
(the pipeline's 8-bit output). Families: sd15 (epsilon), sd21v
(v_prediction, the SD 2.x UNet and an OpenCLIP-style encoder) and sdxl
(StableDiffusionXLPipeline: two encoders, pooled output, size time ids;
also sdxl_noneg_euler without a negative prompt, conditioned on zeros).

Prompts over 75 tokens (sd-sample --max-tokens 150/225): for each of
e2e_sample.LONG_CASES, e2e_sample.LONG_PROMPT (about 120 tokens) and the
negative prompt are encoded as kohya-ss/sd-scripts does for
--max_token_length (make_long_text_golden.py's transcription: 77-long
chunks, each through the encoder alone, joined; SDXL's pooled output from
the first chunk), with the hidden state each pipeline conditions on (SD 1.x
and 2.x: last_hidden_state; SDXL: both encoders' penultimate layer and the
second's text_embeds), and passed to the pipeline as prompt_embeds (and
negative_/pooled_ ones); written as <family>_long<N>_<sampler>.png."""
import json
import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from diffusers import (AutoencoderKL, DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline,
                       UNet2DConditionModel)
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import e2e_sample  # noqa: E402

SAMPLERS = {
    "ddim": (DDIMScheduler, {}),
    "euler": (EulerDiscreteScheduler, {}),
    "euler_a": (EulerAncestralDiscreteScheduler, {}),
    "dpmpp_2m": (DPMSolverMultistepScheduler, {}),
    "dpmpp_2m_karras": (DPMSolverMultistepScheduler, {"use_karras_sigmas": True}),
}
FAMILIES = e2e_sample.GOLDEN_FAMILIES
CASE = e2e_sample.GOLDEN_CASE


def tokenizer(d, sub, pad):
    return CLIPTokenizer(os.path.join(d, sub, "vocab.json"), os.path.join(d, sub, "merges.txt"), pad_token=pad,
                         model_max_length=77)


def load(cls, path):
    return cls.from_pretrained(path, torch_dtype=torch.float32).float()


def pipeline(d, encoders, sched):
    """The family's pipeline from the folder's parts (no safety checker, no
    watermark)."""
    parts = dict(vae=load(AutoencoderKL, os.path.join(d, "vae")),
                 text_encoder=load(CLIPTextModel, os.path.join(d, "text_encoder")),
                 tokenizer=tokenizer(d, "tokenizer", encoders[0][3]),
                 unet=load(UNet2DConditionModel, os.path.join(d, "unet")), scheduler=DDIMScheduler.from_config(sched))
    if len(encoders) == 2:
        return StableDiffusionXLPipeline(text_encoder_2=load(CLIPTextModelWithProjection,
                                                             os.path.join(d, "text_encoder_2")),
                                         tokenizer_2=tokenizer(d, "tokenizer_2", encoders[1][3]),
                                         add_watermarker=False, **parts)
    return StableDiffusionPipeline(safety_checker=None, feature_extractor=None, requires_safety_checker=False,
                                   **parts)


def render(pipe, negative):
    img = pipe(CASE["prompt"], negative_prompt=negative, num_inference_steps=CASE["steps"],
               guidance_scale=CASE["cfg"], width=CASE["width"], height=CASE["height"],
               generator=torch.Generator().manual_seed(CASE["seed"]), output_type="np").images[0]
    return (img * 255).round().astype(np.uint8)


def long_embeds(d, encoders, text, max_tokens):
    """text encoded as sd-scripts encodes a caption for --max_token_length
    max_tokens, with the pipeline's hidden states: (embeds [1, N + 2, w],
    pooled [1, p] or None)."""
    from make_long_text_golden import input_ids, join  # noqa: E402 (the sd-scripts transcription)
    n = max_tokens // 75
    hs, pooled = [], None
    for i, (_, _, _, pad) in enumerate(encoders):
        sfx = "_2" if i else ""
        tok = tokenizer(d, "tokenizer" + sfx, pad)
        if pad == "!":
            tok.pad_token_id = 0  # as sd-scripts' SDXL / SD 2.x strategies set it
        cls = CLIPTextModelWithProjection if i == 1 else CLIPTextModel
        enc = load(cls, os.path.join(d, "text_encoder" + sfx))
        ids = input_ids(tok, text, max_tokens + 2).reshape(-1, 77)
        with torch.no_grad():
            out = enc(ids, output_hidden_states=True, return_dict=True)
        h = out["hidden_states"][-2] if len(encoders) == 2 else out["last_hidden_state"]
        hs.append(join(h.reshape(1, n * 77, h.shape[-1]), max_tokens))
        if i == 1:
            pooled = out["text_embeds"][::n]  # the first chunk's (pool2[::n]); text_embeds: at the first EOS
    return torch.cat(hs, dim=-1), pooled


def render_long(pipe, d, encoders, sampler_cls, extra, sched, max_tokens):
    """One long-prompt golden: the pipeline fed the chunked embeddings."""
    pipe.scheduler = sampler_cls.from_config(dict(sched, **extra))
    pe, pp = long_embeds(d, encoders, e2e_sample.LONG_PROMPT, max_tokens)
    ne, npo = long_embeds(d, encoders, CASE["negative"], max_tokens)
    kw = dict(prompt_embeds=pe, negative_prompt_embeds=ne)
    if pp is not None:
        kw.update(pooled_prompt_embeds=pp, negative_pooled_prompt_embeds=npo)
    img = pipe(num_inference_steps=CASE["steps"], guidance_scale=CASE["cfg"], width=CASE["width"],
               height=CASE["height"], generator=torch.Generator().manual_seed(CASE["seed"]), output_type="np",
               **kw).images[0]
    return (img * 255).round().astype(np.uint8)


def main():
    e2e_sample.GOLDEN = HERE
    out = os.path.join(HERE, "sample")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fam, (unet, vae, encoders, pred) in FAMILIES.items():
            d = os.path.join(tmp, fam)
            e2e_sample.make_model(d, unet, vae, encoders, pred)
            with open(os.path.join(d, "scheduler", "scheduler_config.json")) as f:
                sched = json.load(f)
            pipe = pipeline(d, encoders, sched)
            for name, (cls, extra) in SAMPLERS.items():
                pipe.scheduler = cls.from_config(dict(sched, **extra))
                rgb = render(pipe, CASE["negative"])
                Image.fromarray(rgb).save(os.path.join(out, "%s_%s.png" % (fam, name)))
                print(fam, name, rgb.mean(), rgb.std())
            if len(encoders) == 2:  # no negative prompt: SDXL conditions on zeros
                pipe.scheduler = EulerDiscreteScheduler.from_config(sched)
                Image.fromarray(render(pipe, None)).save(os.path.join(out, "%s_noneg_euler.png" % fam))
            for lfam, name, n in e2e_sample.LONG_CASES:
                if lfam == fam:
                    cls, extra = SAMPLERS[name]
                    rgb = render_long(pipe, d, encoders, cls, extra, sched, n)
                    Image.fromarray(rgb).save(os.path.join(out, "%s_long%d_%s.png" % (fam, n, name)))
                    print(fam, "long", n, name, rgb.mean(), rgb.std())

if __name__ == "__main__":
    main()
