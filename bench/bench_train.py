#!/usr/bin/env python3
"""PyTorch side of bench_train.sh: `make DIR` writes a real-size SD 1.5
UNet2DConditionModel with seeded random weights (DIR/unet/, the diffusers
layout sdtk loads) and the fixed inputs (x0, noise [1, 4, 64, 64], text
embeddings [1, 77, 768] as raw fp32); `time DIR THREADS STEPS` times
training steps on them as sdtk does them: x_t from the DDPM scaled_linear
schedule at t = 500, the UNet, MSE against the noise, backward, gradient
clipping at 1, torch.optim.AdamW (lr 1e-4, weight decay 1e-2), zero_grad;
CPU fp32 eager, after one warm-up step. Needs torch and diffusers."""
import os
import sys
import time

import numpy as np
import torch
from diffusers import DDPMScheduler, UNet2DConditionModel

H = W = 64
TCTX, CROSS = 77, 768


def make(d):
    torch.manual_seed(0)
    u = UNet2DConditionModel(sample_size=64, cross_attention_dim=CROSS, attention_head_dim=8)
    u.save_pretrained(os.path.join(d, "unet"), safe_serialization=True)
    rng = np.random.default_rng(0)
    for name, shape in (("x0", (1, 4, H, W)), ("noise", (1, 4, H, W)), ("ctx", (1, TCTX, CROSS))):
        rng.standard_normal(shape).astype(np.float32).tofile(os.path.join(d, name + ".f32"))


def load(d, name, shape):
    return torch.from_numpy(np.fromfile(os.path.join(d, name + ".f32"), np.float32).reshape(shape))


def timed(d, threads, steps):
    torch.set_num_threads(threads)
    u = UNet2DConditionModel.from_pretrained(os.path.join(d, "unet")).float().train()
    sched = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)
    opt = torch.optim.AdamW(u.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    x0, noise, ctx = load(d, "x0", (1, 4, H, W)), load(d, "noise", (1, 4, H, W)), load(d, "ctx", (1, TCTX, CROSS))
    t = torch.tensor([500])
    best = 1e30
    for s in range(steps + 1):
        a = time.perf_counter()
        xt = sched.add_noise(x0, noise, t)
        pred = u(xt, t, encoder_hidden_states=ctx).sample
        loss = torch.nn.functional.mse_loss(pred, noise)
        loss.backward()
        b = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(u.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        c = time.perf_counter()
        print("pytorch step %d%s: %.2f s (forward+backward %.2f s, clip+AdamW %.2f s), loss %.6f"
              % (s, "" if s else " (warm-up)", c - a, b - a, c - b, loss.item()), flush=True)
        if s:
            best = min(best, c - a)
    print("pytorch best %.3f s" % best)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        timed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
