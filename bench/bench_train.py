#!/usr/bin/env python3
"""PyTorch side of bench_train.sh: `make DIR` writes a real-size SD 1.5
UNet2DConditionModel with seeded random weights (DIR/unet/, the diffusers
layout sdtk loads) and the fixed inputs (x0, noise [1, 4, 64, 64], text
embeddings [1, 77, 768] as raw fp32); `make DIR sdxl` the SDXL base UNet
(2.6B parameters, 10 GB) with text embeddings [1, 77, 2048], the pooled
embedding [1, 1280] (text.f32) and the time ids [1, 6] (tids.f32), and a
file DIR/sdxl that marks it (BENCH_LATENT=128 makes and times 128x128
latents, 1024x1024 images; BENCH_CKPT=1 times with gradient checkpointing;
BENCH_BATCH=N times batches of N copies of the sample, as bench_train does);
`time DIR THREADS STEPS` times
training steps on them as sdtk does them: x_t from the DDPM scaled_linear
schedule at t = 500, the UNet, MSE against the noise, backward, gradient
clipping at 1, torch.optim.AdamW (lr 1e-4, weight decay 1e-2), zero_grad;
CPU fp32 eager (or `time DIR THREADS STEPS cuda [tf32|bf16]` on the GPU), after
one warm-up step. Needs torch and diffusers."""
import os
import sys
import time

import numpy as np
import torch
from diffusers import DDPMScheduler, UNet2DConditionModel

H = W = int(os.environ.get("BENCH_LATENT", "64"))  # latent side (64: 512x512 images, 128: 1024x1024)
B = int(os.environ.get("BENCH_BATCH", "1"))  # copies of the sample in a batch
TCTX, CROSS, CROSS_XL, POOLED_XL = 77, 768, 2048, 1280


def sdxl_unet():
    """diffusers' SDXL base UNet configuration (stabilityai/stable-diffusion-xl-base-1.0)."""
    return UNet2DConditionModel(
        sample_size=128, cross_attention_dim=CROSS_XL, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816)


def make(d, kind="sd15"):
    torch.manual_seed(0)
    xl = kind == "sdxl"
    u = sdxl_unet() if xl else UNet2DConditionModel(sample_size=64, cross_attention_dim=CROSS, attention_head_dim=8)
    u.save_pretrained(os.path.join(d, "unet"), safe_serialization=True)
    rng = np.random.default_rng(0)
    files = [("x0", (1, 4, H, W)), ("noise", (1, 4, H, W)), ("ctx", (1, TCTX, CROSS_XL if xl else CROSS))]
    if xl:
        files.append(("text", (1, POOLED_XL)))
        open(os.path.join(d, "sdxl"), "w").close()
    for name, shape in files:
        rng.standard_normal(shape).astype(np.float32).tofile(os.path.join(d, name + ".f32"))
    if xl:  # original size, crop top-left, target size of the image the latents come from
        np.array([[8 * H, 8 * W, 0, 0, 8 * H, 8 * W]], np.float32).tofile(os.path.join(d, "tids.f32"))


def load(d, name, shape):
    return torch.from_numpy(np.fromfile(os.path.join(d, name + ".f32"), np.float32).reshape(shape))


def timed(d, threads, steps, device="cpu", mode=""):
    tf32 = mode == "tf32"
    # bf16: torch.autocast (bf16 matrix products, fp32 weights, optimizer
    # and loss), what accelerate's and kohya's --mixed_precision bf16 do
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16")
    torch.set_num_threads(threads)
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    u = UNet2DConditionModel.from_pretrained(os.path.join(d, "unet")).float().train().to(device)
    xl = os.path.exists(os.path.join(d, "sdxl"))
    if os.environ.get("BENCH_CKPT"):
        u.enable_gradient_checkpointing()
    sched = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)
    opt = torch.optim.AdamW(u.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    x0, noise = load(d, "x0", (1, 4, H, W)).repeat(B, 1, 1, 1), load(d, "noise", (1, 4, H, W)).repeat(B, 1, 1, 1)
    ctx = load(d, "ctx", (1, TCTX, CROSS_XL if xl else CROSS)).repeat(B, 1, 1)
    added = {"text_embeds": load(d, "text", (1, POOLED_XL)).repeat(B, 1).to(device),
             "time_ids": load(d, "tids", (1, 6)).repeat(B, 1).to(device)} if xl else None
    t = torch.tensor([500] * B)
    gpu = device != "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    best = 1e30
    for s in range(steps + 1):
        sync()
        a = time.perf_counter()
        xt = sched.add_noise(x0, noise, t).to(device)  # host inputs, as sd-train has them
        with amp:
            pred = u(xt, t.to(device), encoder_hidden_states=ctx.to(device), added_cond_kwargs=added).sample
        loss = torch.nn.functional.mse_loss(pred.float(), noise.to(device))
        loss.backward()
        sync()
        b = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(u.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        c = time.perf_counter()
        print("pytorch step %d%s: %.2f s (forward+backward %.2f s, clip+AdamW %.2f s), loss %.6f"
              % (s, "" if s else " (warm-up)", c - a, b - a, c - b, loss.item()), flush=True)
        if s:
            best = min(best, c - a)
    print("pytorch best %.3f s" % best)
    if gpu:
        print("pytorch device memory peak %.1f MiB" % (torch.cuda.max_memory_allocated() / 1048576))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], *(sys.argv[3:4] or ["sd15"]))
    else:
        timed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *(sys.argv[5:6] or ["cpu"]),
              sys.argv[6] if len(sys.argv) > 6 else "")
