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
(the pipeline's 8-bit output). Families: sd15 (epsilon) and sd21v
(v_prediction, the SD 2.x UNet and an OpenCLIP-style encoder)."""
import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from diffusers import (AutoencoderKL, DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel)
from transformers import CLIPTextModel, CLIPTokenizer

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


def pipeline(d):
    """StableDiffusionPipeline from the folder's parts (no safety checker)."""
    tok = CLIPTokenizer(os.path.join(d, "tokenizer", "vocab.json"), os.path.join(d, "tokenizer", "merges.txt"),
                        pad_token=open(os.path.join(d, "tokenizer", "pad")).read(), model_max_length=77)
    return StableDiffusionPipeline(
        vae=AutoencoderKL.from_pretrained(os.path.join(d, "vae"), torch_dtype=torch.float32).float(),
        text_encoder=CLIPTextModel.from_pretrained(os.path.join(d, "text_encoder"), torch_dtype=torch.float32).float(),
        tokenizer=tok, unet=UNet2DConditionModel.from_pretrained(os.path.join(d, "unet"), torch_dtype=torch.float32).float(),
        scheduler=DDIMScheduler.from_config(dict(e2e_sample.SCHEDULER)), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False)


def main():
    e2e_sample.GOLDEN = HERE
    out = os.path.join(HERE, "sample")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fam, (unet, vae, encoders, pred) in FAMILIES.items():
            d = os.path.join(tmp, fam)
            e2e_sample.make_model(d, unet, vae, encoders, pred)
            with open(os.path.join(d, "tokenizer", "pad"), "w") as f:
                f.write(encoders[0][3])
            pipe = pipeline(d)
            for name, (cls, extra) in SAMPLERS.items():
                pipe.scheduler = cls.from_config(dict(e2e_sample.SCHEDULER, prediction_type=pred, **extra))
                img = pipe(CASE["prompt"], negative_prompt=CASE["negative"], num_inference_steps=CASE["steps"],
                           guidance_scale=CASE["cfg"], width=CASE["width"], height=CASE["height"],
                           generator=torch.Generator().manual_seed(CASE["seed"]), output_type="np").images[0]
                rgb = (img * 255).round().astype(np.uint8)
                Image.fromarray(rgb).save(os.path.join(out, "%s_%s.png" % (fam, name)))
                print(fam, name, rgb.mean(), rgb.std())


if __name__ == "__main__":
    main()
