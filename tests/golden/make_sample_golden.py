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
also sdxl_noneg_euler without a negative prompt, conditioned on zeros)."""
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

if __name__ == "__main__":
    main()
