#!/usr/bin/env python3
"""The PyTorch side of bench_sample.sh (run by hand; needs torch, diffusers
and transformers from PyPI; nothing is downloaded).

  bench_sample.py make DIR     a real-size SD 1.5 diffusers folder with
                               seeded random weights, built from SD 1.5's
                               configs: unet/ (UNet2DConditionModel,
                               320/640/1280/1280, 8 heads, cross 768),
                               text_encoder/ (CLIP ViT-L/14's text model:
                               width 768, 12 layers, 12 heads, quick_gelu),
                               tokenizer/ (the real CLIP vocabulary from
                               tests/golden/tokenizer), vae/ (AutoencoderKL
                               128/256/512/512, scaling 0.18215),
                               scheduler/scheduler_config.json (SD 1.5's);
                               and DIR/z.f32, a fixed [1, 4, 64, 64] latent
  bench_sample.py prompt STEPS the image below as a prompts.jsonl line for
                               sd-sample (stdout)
  bench_sample.py pipe DIR THREADS [STEPS]
                               StableDiffusionPipeline, DPMSolverMultistep
                               (DPM++ 2M) from the folder's scheduler config,
                               512x512, STEPS (default 20) steps, CFG 7, a
                               negative prompt,
                               seed 1 (a CPU generator), fp32, after a
                               one-step warm-up; prints the seconds of the
                               call and of its parts (text encoder, each
                               UNet call, decode) and writes the 8-bit image
                               to DIR/torch.png
  bench_sample.py decode DIR THREADS REPS
                               AutoencoderKL.decode(z / scaling_factor) of
                               DIR/z.f32, REPS timed runs after a warm-up:
                               best and median; the image to DIR/torch_img.f32
  bench_sample.py compare A.png B.png | A.f32 B.f32
                               how far two results are apart"""
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = {"prompt": "a red bicycle leaning on a wall, photo", "negative": "blurry, low quality", "seed": 1, "steps": 20,
       "cfg": 7, "sampler": "dpmpp_2m", "width": 512, "height": 512}
# SD 1.5's scheduler/scheduler_config.json
SCHEDULER = {"_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012,
             "beta_schedule": "scaled_linear", "num_train_timesteps": 1000, "set_alpha_to_one": False,
             "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None, "clip_sample": False,
             "prediction_type": "epsilon"}


def make(d):
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel
    torch.manual_seed(0)
    UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).save_pretrained(
        os.path.join(d, "unet"), safe_serialization=True)
    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                         num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                         projection_dim=768, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    CLIPTextModel(cfg).save_pretrained(os.path.join(d, "text_encoder"), safe_serialization=True)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        norm_num_groups=32, latent_channels=4, sample_size=512, scaling_factor=0.18215)
    vae.save_pretrained(os.path.join(d, "vae"), safe_serialization=True)
    tok = os.path.join(d, "tokenizer")
    os.makedirs(tok, exist_ok=True)
    for n in ("vocab.json", "merges.txt"):
        with gzip.open(os.path.join(HERE, "..", "tests", "golden", "tokenizer", n + ".gz"), "rb") as f, \
                open(os.path.join(tok, n), "wb") as g:
            g.write(f.read())
    with open(os.path.join(tok, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}, f, indent=2)
    os.makedirs(os.path.join(d, "scheduler"), exist_ok=True)
    with open(os.path.join(d, "scheduler", "scheduler_config.json"), "w") as f:
        json.dump(SCHEDULER, f, indent=2)
    np.random.default_rng(2).standard_normal((1, 4, 64, 64)).astype(np.float32).tofile(os.path.join(d, "z.f32"))


def timer(fn, into):
    """fn wrapped so that each call's seconds are appended to into."""
    def run(*a, **k):
        t = time.perf_counter()
        r = fn(*a, **k)
        into.append(time.perf_counter() - t)
        return r
    return run


def pipe(d, threads, steps):
    import torch
    from diffusers import (AutoencoderKL, DPMSolverMultistepScheduler, StableDiffusionPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTextModel, CLIPTokenizer
    torch.set_num_threads(threads)
    tok = os.path.join(d, "tokenizer")
    p = StableDiffusionPipeline(
        vae=AutoencoderKL.from_pretrained(os.path.join(d, "vae")).eval(),
        text_encoder=CLIPTextModel.from_pretrained(os.path.join(d, "text_encoder")).eval(),
        tokenizer=CLIPTokenizer(os.path.join(tok, "vocab.json"), os.path.join(tok, "merges.txt"),
                                pad_token="<|endoftext|>", model_max_length=77),
        unet=UNet2DConditionModel.from_pretrained(os.path.join(d, "unet")).eval(),
        scheduler=DPMSolverMultistepScheduler.from_config(SCHEDULER), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)
    p.set_progress_bar_config(disable=True)
    parts = {"text": [], "unet": [], "decode": []}
    p.text_encoder.forward = timer(p.text_encoder.forward, parts["text"])
    p.unet.forward = timer(p.unet.forward, parts["unet"])
    p.vae.decode = timer(p.vae.decode, parts["decode"])

    def call(steps, out):
        return p(JOB["prompt"], negative_prompt=JOB["negative"], num_inference_steps=steps,
                 guidance_scale=JOB["cfg"], width=JOB["width"], height=JOB["height"],
                 generator=torch.Generator().manual_seed(JOB["seed"]), output_type=out).images
    with torch.inference_mode():
        call(1, "latent")  # warm-up: oneDNN primitives, first touches of the weights
        for v in parts.values():
            v.clear()
        t = time.perf_counter()
        img = call(steps, "np")[0]
        total = time.perf_counter() - t
    u = parts["unet"]
    text, unet, dec = sum(parts["text"]), sum(u), sum(parts["decode"])
    print("pytorch %s fp32, %d thread(s): total %.3f s: text %.3f s, UNet %d calls of batch 2 %.3f s (%.3f s each, "
          "fastest %.3f, slowest %.3f), rest %.3f s, decode %.3f s"
          % (torch.__version__, threads, total, text, len(u), unet, unet / len(u), min(u), max(u),
             total - text - unet - dec, dec))
    from PIL import Image
    Image.fromarray((img * 255).round().astype(np.uint8)).save(os.path.join(d, "torch.png"))


def decode(d, threads, reps):
    import torch
    from diffusers import AutoencoderKL
    torch.set_num_threads(threads)
    m = AutoencoderKL.from_pretrained(os.path.join(d, "vae")).eval()
    z = torch.from_numpy(np.fromfile(os.path.join(d, "z.f32"), np.float32).reshape(1, 4, 64, 64))
    ts = []
    with torch.inference_mode():
        img = m.decode(z / m.config.scaling_factor).sample  # warm-up
        for _ in range(reps):
            t = time.perf_counter()
            img = m.decode(z / m.config.scaling_factor).sample
            ts.append(time.perf_counter() - t)
    img.numpy().astype(np.float32).tofile(os.path.join(d, "torch_img.f32"))
    print("pytorch %s VAE decode fp32, %d thread(s), 64x64 latents -> 512x512: best %.3f s, median %.3f s"
          % (torch.__version__, threads, min(ts), statistics.median(ts)))


def compare(a, b):
    if a.endswith(".png"):
        from PIL import Image
        x, y = (np.asarray(Image.open(p).convert("RGB"), dtype=np.int16) for p in (a, b))
        diff = np.abs(x - y)
        print("  images: %.2f%% of pixels within 1 level, %.2f%% within 8, largest difference %d (means %.1f / %.1f)"
              % (100 * (diff <= 1).mean(), 100 * (diff <= 8).mean(), diff.max(), x.mean(), y.mean()))
    else:
        x, y = np.fromfile(a, np.float32), np.fromfile(b, np.float32)
        print("  decoded images: max |difference| %.2e (largest |value| %.2e)" % (np.abs(x - y).max(), np.abs(x).max()))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2])
    elif cmd == "prompt":
        print(json.dumps(dict(JOB, steps=int(sys.argv[2]))))
    elif cmd == "pipe":
        pipe(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else JOB["steps"])
    elif cmd == "decode":
        decode(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        compare(sys.argv[2], sys.argv[3])
