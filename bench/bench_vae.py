#!/usr/bin/env python3
"""The PyTorch side of bench_vae.sh (run by hand; needs torch + diffusers
from PyPI).

  bench_vae.py make DIR        the real SD VAE architecture (diffusers
                               AutoencoderKL defaults of SD 1.x/2.x/SDXL:
                               blocks 128/256/512/512, 2 resnets each, 32
                               norm groups) with seeded random weights,
                               written as DIR/vae/{config.json,
                               diffusion_pytorch_model.safetensors}, and a
                               fixed 512x512 input DIR/x.f32 (raw fp32)
  bench_vae.py time DIR THREADS REPS
                               encode DIR/x.f32 with torch fp32 on THREADS
                               threads, REPS timed runs after one warm-up;
                               prints the best and the median seconds and
                               writes the mean to DIR/torch_mean.f32
  bench_vae.py gpu DIR BATCH REPS [tf32|bf16|bf16w]
                               the same on cuda:0 for a batch of BATCH
                               copies (fp32; cuDNN TF32 off unless tf32,
                               matmul TF32 off; bf16: autocast; bf16w: the
                               model in bf16), host batch in and mean out
                               included as sd-latents would do; prints
                               best/median seconds per batch, images/s"""
import os
import statistics
import sys
import time

import numpy as np
import torch
from diffusers import AutoencoderKL


def build():
    torch.manual_seed(0)
    nb = 4
    return AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                         down_block_types=("DownEncoderBlock2D",) * nb,
                         up_block_types=("UpDecoderBlock2D",) * nb,
                         norm_num_groups=32, latent_channels=4, sample_size=512).eval()


def make(d):
    m = build()
    with torch.no_grad():  # spread the weights so activations are not tiny
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    m.save_pretrained(os.path.join(d, "vae"), safe_serialization=True)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, size=(1, 3, 512, 512)).astype(np.float32)
    x.tofile(os.path.join(d, "x.f32"))


def time_it(d, threads, reps):
    torch.set_num_threads(threads)
    m = AutoencoderKL.from_pretrained(os.path.join(d, "vae")).eval()
    x = torch.from_numpy(np.fromfile(os.path.join(d, "x.f32"), dtype=np.float32).reshape(1, 3, 512, 512))
    ts = []
    with torch.inference_mode():
        mean = m.encode(x).latent_dist.mean  # warm-up (oneDNN primitive creation)
        for _ in range(reps):
            t = time.perf_counter()
            mean = m.encode(x).latent_dist.mean
            ts.append(time.perf_counter() - t)
    mean.numpy().astype(np.float32).tofile(os.path.join(d, "torch_mean.f32"))
    print("pytorch %s fp32, %d thread(s): best %.3f s, median %.3f s" % (torch.__version__, threads, min(ts),
                                                                         statistics.median(ts)))


def time_gpu(d, batch, reps, mode):
    # tf32: TF32 tensor cores; bf16: torch.autocast (bf16 products, fp32
    # weights); bf16w: the whole model in bf16 (vae.to(bfloat16), as kohya
    # and diffusers' scripts hold a half VAE)
    tf32 = mode == "tf32"
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16")
    wdt = torch.bfloat16 if mode == "bf16w" else torch.float32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    m = AutoencoderKL.from_pretrained(os.path.join(d, "vae")).eval().cuda().to(wdt)
    x1 = np.fromfile(os.path.join(d, "x.f32"), dtype=np.float32).reshape(1, 3, 512, 512)
    x = torch.from_numpy(np.repeat(x1, batch, axis=0))
    ts = []
    with torch.inference_mode(), amp:
        for r in range(reps + 2):  # two warm-ups: cudnn.benchmark's search
            torch.cuda.synchronize()
            t = time.perf_counter()
            mean = m.encode(x.cuda().to(wdt)).latent_dist.mean.float().cpu()
            torch.cuda.synchronize()
            if r >= 2:
                ts.append(time.perf_counter() - t)
    mean[:1].numpy().astype(np.float32).tofile(os.path.join(d, "torch_mean.f32"))
    med = statistics.median(ts)
    print("pytorch %s cuda %s, batch %d: best %.4f s, median %.4f s, %.2f images/s (peak %d MiB)"
          % (torch.__version__, mode or "fp32", batch, min(ts), med, batch / med,
             torch.cuda.max_memory_allocated() >> 20))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "gpu":
        time_gpu(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "")
    else:
        time_it(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
