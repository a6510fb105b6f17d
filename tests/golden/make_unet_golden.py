#!/usr/bin/env python3
"""Golden files for the UNet (libcore/models/unet*.c) and the trainer's math
(trainer/), run by hand, not in CI:
    python3 tests/golden/make_unet_golden.py [unet] [train] [train_sdxl]
(needs torch, diffusers, safetensors, numpy from PyPI).

For three tiny UNet2DConditionModel configs with random weights it writes,
under tests/golden/unet/<name>/:
  unet/config.json + unet/diffusion_pytorch_model.safetensors   diffusers
      layout, weights stored as fp16
  single.safetensors   (sd1, sdxl) the same weights in the original ldm
      single-file layout (model.diffusion_model.input_blocks.1.0.in_layers.0
      ...), stored as bf16, plus a stray VAE tensor the loader must ignore;
      checked here against diffusers' own ldm -> diffusers converter
  expected.safetensors the inputs (noisy latents x, timesteps t, text
      embeddings ctx; for sdxl the pooled text embedding and the six size
      ids), a target, the UNet output and the MSE loss against the target,
      and the loss gradient of every parameter: its L2 norm, its dot product
      with a fixed pseudo-random vector and its largest magnitude
      (grad_stats [P, 3] float64, names in the metadata entry grad_names, one
      per line) plus a few gradients in full (grad.<name>). diffusers
      computes all of it in float64 from the same weights (its timestep
      embedding stays float32, as in any dtype).

  sd1/train.safetensors  the training math on the sd1 model (see
      make_train): losses, gradient norms and parameter changes after AdamW
      steps, as diffusers' train_text_to_image.py computes them
  sdxl/train.safetensors  the same 3 clipped AdamW steps on the sdxl model
      (make_train_sdxl), with its text_time conditioning

Weights are rounded to 8 significant bits so fp16 and bf16 hold them
exactly: both files describe the same model.

sd1:  SD 1.x-shaped: 3 blocks (CrossAttn, CrossAttn, Down), 2 resnets per
      block, conv projections, 2 heads.
sd2:  SD 2.x-shaped: linear projections, heads per block (2, 4),
      upcast_attention, cross_attention_dim 12.
sdxl: SDXL-shaped: (Down, CrossAttn, CrossAttn), transformer depth
      (1, 1, 2) (so the mid block and the first up block have 2), heads
      (1, 2, 4), linear projections, text_time conditioning."""
import json
import os
import shutil

import numpy as np
import torch
from diffusers import UNet2DConditionModel
from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unet")

CONFIGS = {
    "sd1": dict(
        model=dict(sample_size=16, block_out_channels=(8, 16, 16), layers_per_block=2, cross_attention_dim=8,
                   attention_head_dim=2, norm_num_groups=4,
                   down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")),
        tokens=5, single=True, seed=1,
        full=["conv_in.weight", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight",
              "time_embedding.linear_1.weight", "up_blocks.2.resnets.2.conv_shortcut.weight"]),
    "sd2": dict(
        model=dict(sample_size=16, block_out_channels=(8, 16), layers_per_block=1, cross_attention_dim=12,
                   attention_head_dim=(2, 4), norm_num_groups=4, use_linear_projection=True, upcast_attention=True,
                   down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
        tokens=4, single=False, seed=2,
        full=["up_blocks.1.attentions.1.proj_in.weight", "mid_block.attentions.0.transformer_blocks.0.ff.net.0.proj.weight"]),
    "sdxl": dict(
        model=dict(sample_size=16, block_out_channels=(8, 16, 16), layers_per_block=1, cross_attention_dim=16,
                   attention_head_dim=(1, 2, 4), norm_num_groups=4, use_linear_projection=True,
                   transformer_layers_per_block=(1, 1, 2),
                   down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                   up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                   addition_embed_type="text_time", addition_time_embed_dim=4,
                   projection_class_embeddings_input_dim=6 * 4 + 8),
        tokens=6, single=True, seed=3, pooled=8,
        full=["add_embedding.linear_1.weight", "mid_block.attentions.0.transformer_blocks.1.attn1.to_v.weight"]),
}


def round_weights(sd):
    """8 significant bits, nothing below fp16's smallest normal: exact in
    fp16 and bf16."""
    out = {}
    for k, v in sd.items():
        b = v.float().to(torch.bfloat16).float()
        b = torch.where(b.abs() < 2.0 ** -14, torch.zeros_like(b), b)
        assert torch.equal(b.half().float(), b), k
        out[k] = b.contiguous()
    return out


def ldm_names(model):
    """diffusers name -> original ldm name, walked from the model's own
    structure (input_blocks count resnets and downsamplers in order; output
    blocks put the upsampler after the attention when there is one)."""
    m = {"conv_in": "input_blocks.0.0", "time_embedding.linear_1": "time_embed.0",
         "time_embedding.linear_2": "time_embed.2", "add_embedding.linear_1": "label_emb.0.0",
         "add_embedding.linear_2": "label_emb.0.2", "conv_norm_out": "out.0", "conv_out": "out.2",
         "mid_block.resnets.0": "middle_block.0", "mid_block.attentions.0": "middle_block.1",
         "mid_block.resnets.1": "middle_block.2"}
    k = 1
    for i, blk in enumerate(model.down_blocks):
        for j in range(len(blk.resnets)):
            m[f"down_blocks.{i}.resnets.{j}"] = f"input_blocks.{k}.0"
            if getattr(blk, "attentions", None):
                m[f"down_blocks.{i}.attentions.{j}"] = f"input_blocks.{k}.1"
            k += 1
        if blk.downsamplers:
            m[f"down_blocks.{i}.downsamplers.0.conv"] = f"input_blocks.{k}.0.op"
            k += 1
    k = 0
    for i, blk in enumerate(model.up_blocks):
        has_attn = bool(getattr(blk, "attentions", None))
        for j in range(len(blk.resnets)):
            m[f"up_blocks.{i}.resnets.{j}"] = f"output_blocks.{k}.0"
            if has_attn:
                m[f"up_blocks.{i}.attentions.{j}"] = f"output_blocks.{k}.1"
            if blk.upsamplers and j == len(blk.resnets) - 1:
                m[f"up_blocks.{i}.upsamplers.0.conv"] = f"output_blocks.{k}.{2 if has_attn else 1}.conv"
            k += 1
    res = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
           "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}

    def name(key):
        for d in sorted(m, key=len, reverse=True):
            if key.startswith(d + "."):
                rest = key[len(d) + 1:]
                if ".resnets." in d or d.startswith("mid_block.resnets"):
                    head, _, tail = rest.partition(".")
                    rest = res[head] + "." + tail
                return m[d] + "." + rest
        raise KeyError(key)
    return name


def rvec(n):
    """The fixed projection vector of the C test: r_i = ((i * 2654435761 +
    12345) mod 2^32) / 2^32 - 0.5."""
    i = np.arange(n, dtype=np.uint64)
    u = (i * np.uint64(2654435761) + np.uint64(12345)) & np.uint64(0xFFFFFFFF)
    return u.astype(np.float64) / 2.0 ** 32 - 0.5


def make(name, cfg):
    torch.manual_seed(cfg["seed"])
    model = UNet2DConditionModel(**cfg["model"])
    # random weights of a realistic spread: norms' 1/0 init would hide a
    # swapped gamma and beta, so every tensor is perturbed
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    state = round_weights(model.state_dict())
    model.load_state_dict(state)
    model = model.double()

    g = torch.Generator().manual_seed(100 + cfg["seed"])
    n, tok = 2, cfg["tokens"]
    x = torch.randn(n, 4, 16, 16, generator=g).float()
    t = torch.tensor([999, 37])
    ctx = torch.randn(n, tok, cfg["model"]["cross_attention_dim"], generator=g).float()
    target = torch.randn(n, 4, 16, 16, generator=g).float()
    extra = {}
    added = None
    if "pooled" in cfg:
        text = torch.randn(n, cfg["pooled"], generator=g).float()
        tids = torch.tensor([[16.0, 16.0, 0.0, 0.0, 16.0, 16.0], [1024.0, 768.0, 32.0, 8.0, 832.0, 1216.0]])
        extra = {"text": text, "tids": tids}
        added = {"text_embeds": text.double(), "time_ids": tids.double()}

    out = model(x.double(), t, encoder_hidden_states=ctx.double(), added_cond_kwargs=added).sample
    loss = ((out - target.double()) ** 2).mean()
    loss.backward()

    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "unet"))
    conf = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(model.config).items()
            if not k.startswith("_")}
    conf["_class_name"] = "UNet2DConditionModel"
    with open(os.path.join(d, "unet", "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
    save_file({k: v.half() for k, v in state.items()}, os.path.join(d, "unet", "diffusion_pytorch_model.safetensors"))

    if cfg["single"]:
        ldm = ldm_names(model)
        single = {"model.diffusion_model." + ldm(k): v for k, v in state.items()}
        # diffusers' own converter must read these names back to the same state
        back = convert_ldm_unet_checkpoint(single, dict(model.config))
        assert set(back) == set(state), set(back) ^ set(state)
        for k in state:
            assert torch.equal(back[k].reshape(state[k].shape), state[k]), k
        single = {k: v.to(torch.bfloat16).contiguous() for k, v in single.items()}
        single["first_stage_model.encoder.conv_in.weight"] = torch.zeros(8, 3, 3, 3, dtype=torch.bfloat16)
        save_file(single, os.path.join(d, "single.safetensors"))

    names = sorted(k for k, _ in model.named_parameters())
    params = dict(model.named_parameters())
    stats = np.zeros((len(names), 3))
    for i, k in enumerate(names):
        gr = params[k].grad.detach().numpy().astype(np.float64).reshape(-1)
        stats[i] = [np.sqrt((gr * gr).sum()), (gr * rvec(gr.size)).sum(), np.abs(gr).max()]
    tensors = {"x": x, "t": t.float(), "ctx": ctx, "target": target, "out": out.detach().float().contiguous(),
               "loss": loss.detach().reshape(1), "grad_stats": torch.from_numpy(stats)}
    tensors.update(extra)
    for k in cfg["full"]:
        tensors["grad." + k] = params[k].grad.detach().float().contiguous()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "expected.safetensors"),
              metadata={"grad_names": "\n".join(names)})
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, loss {loss.item():.6f}")


class _Shadow:
    """EMA shadow weights shaped like a module for param_stats."""

    def __init__(self, params):
        self.params = params

    def named_parameters(self):
        return self.params.items()


TRAIN = dict(ema_decay=0.9999, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, max_grad_norm=0.05, snr_gamma=5.0,
             steps=[[999, 37], [500, 1], [250, 750]], full=["conv_in.weight", "conv_norm_out.bias"])


def param_stats(model, before):
    """Per parameter (sorted names): L2 norm and projection of the change
    from `before`, and the change's largest magnitude."""
    names = sorted(k for k, _ in model.named_parameters())
    params = dict(model.named_parameters())
    stats = np.zeros((len(names), 3))
    for i, k in enumerate(names):
        dlt = (params[k].detach() - before[k]).numpy().astype(np.float64).reshape(-1)
        stats[i] = [np.sqrt((dlt * dlt).sum()), (dlt * rvec(dlt.size)).sum(), np.abs(dlt).max()]
    return names, stats


def make_train():
    """tests/golden/unet/sd1/train.safetensors: the training math of
    diffusers' train_text_to_image.py on the sd1 model, in float64.
    eps: 3 steps (epsilon target, clipping at max_grad_norm, AdamW with
    weight decay), given scaled latents x0, text ctx, and per step noise and
    timesteps; losses, gradient norms before clipping and the parameter
    change after the 3 steps (stats as grad_stats, full for a few), and the
    change of EMAModel's shadow weights (decay 0.9999, updated each step).
    v: from the same start, one step with v-prediction, min-SNR-gamma 5 and
    gradient accumulation over two micro-batches of one sample each."""
    from diffusers import DDPMScheduler
    from diffusers.training_utils import EMAModel, compute_snr
    import torch.nn.functional as F

    d = os.path.join(HERE, "sd1")
    sched = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          num_train_timesteps=1000)
    g = torch.Generator().manual_seed(200)
    x0 = (torch.randn(2, 4, 16, 16, generator=g) * 0.18215 * 5).float()
    ctx = torch.randn(2, 5, 8, generator=g).float()
    noise = [torch.randn(2, 4, 16, 16, generator=g).float() for _ in TRAIN["steps"]]
    ts = [torch.tensor(t) for t in TRAIN["steps"]]

    def load():
        m = UNet2DConditionModel.from_pretrained(os.path.join(d, "unet")).double()
        opt = torch.optim.AdamW(m.parameters(), lr=TRAIN["lr"], betas=TRAIN["betas"], eps=TRAIN["eps"],
                                weight_decay=TRAIN["weight_decay"])
        return m, opt, {k: v.detach().clone() for k, v in m.named_parameters()}

    def loss_of(m, pred, i, rows, weighted):
        sched.register_to_config(prediction_type=pred)
        x, n, t = x0[rows].double(), noise[i][rows].double(), ts[i][rows]
        noisy = sched.add_noise(x, n, t)
        target = n if pred == "epsilon" else sched.get_velocity(x, n, t)
        out = m(noisy, t, encoder_hidden_states=ctx[rows].double()).sample
        if not weighted:
            return F.mse_loss(out, target, reduction="mean")
        snr = compute_snr(sched, t).double()
        w = torch.stack([snr, TRAIN["snr_gamma"] * torch.ones_like(t, dtype=torch.float64)], dim=1).min(dim=1)[0]
        w = w / (snr + 1) if pred == "v_prediction" else w / snr
        per = F.mse_loss(out, target, reduction="none").mean(dim=[1, 2, 3]) * w
        return per.mean()

    out = {"x0": x0, "ctx": ctx}
    for i in range(len(ts)):
        out[f"noise{i}"] = noise[i]
        out[f"t{i}"] = ts[i].float()

    m, opt, before = load()
    ema = EMAModel(m.parameters(), decay=TRAIN["ema_decay"])
    losses, norms = [], []
    for i in range(len(ts)):
        opt.zero_grad()
        loss = loss_of(m, "epsilon", i, slice(0, 2), False)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), TRAIN["max_grad_norm"]).item())
        assert norms[-1] > TRAIN["max_grad_norm"], "clipping must be active"
        opt.step()
        ema.step(m.parameters())
        losses.append(loss.item())
    names, stats = param_stats(m, before)
    shadow = {k: p for (k, _), p in zip(m.named_parameters(), ema.shadow_params)}
    out["ema_stats"] = torch.from_numpy(param_stats(_Shadow(shadow), before)[1])
    out["eps_loss"] = torch.tensor(losses, dtype=torch.float64)
    out["eps_gnorm"] = torch.tensor(norms, dtype=torch.float64)
    out["eps_stats"] = torch.from_numpy(stats)
    params = dict(m.named_parameters())
    for k in TRAIN["full"]:
        out["eps_delta." + k] = (params[k].detach() - before[k]).float().contiguous()

    m, opt, before = load()
    opt.zero_grad()
    total = 0.0
    for r in range(2):
        loss = loss_of(m, "v_prediction", 0, slice(r, r + 1), True) / 2
        loss.backward()
        total += loss.item()
    vnorm = torch.nn.utils.clip_grad_norm_(m.parameters(), TRAIN["max_grad_norm"]).item()
    opt.step()
    _, vstats = param_stats(m, before)
    out["v_loss"] = torch.tensor([total], dtype=torch.float64)
    out["v_gnorm"] = torch.tensor([vnorm], dtype=torch.float64)
    out["v_stats"] = torch.from_numpy(vstats)
    meta = {"names": "\n".join(names), "lr": repr(TRAIN["lr"]), "weight_decay": repr(TRAIN["weight_decay"]),
            "max_grad_norm": repr(TRAIN["max_grad_norm"]), "snr_gamma": repr(TRAIN["snr_gamma"])}
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(d, "train.safetensors"), metadata=meta)
    print(f"train: eps losses {losses} grad norms {norms}; v loss {total:.6f} grad norm {vnorm:.6f}")


def make_train_sdxl():
    """tests/golden/unet/sdxl/train.safetensors: the eps part of make_train
    on the SDXL-shaped model (text_time conditioning: pooled text embeds and
    the six time ids per sample), in float64: 3 steps with clipping active
    and AdamW; losses, gradient norms and every parameter's change."""
    from diffusers import DDPMScheduler
    import torch.nn.functional as F

    d = os.path.join(HERE, "sdxl")
    sched = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          num_train_timesteps=1000)
    m = UNet2DConditionModel.from_pretrained(os.path.join(d, "unet")).double()
    cfg = m.config
    pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
    g = torch.Generator().manual_seed(300)
    x0 = (torch.randn(2, 4, 16, 16, generator=g) * 0.13025 * 5).float()
    ctx = torch.randn(2, 6, cfg.cross_attention_dim, generator=g).float()
    text = torch.randn(2, pooled, generator=g).float()
    tids = torch.tensor([[1024, 768, 0, 64, 1024, 1024], [640, 1536, 32, 0, 768, 1280]], dtype=torch.float32)
    noise = [torch.randn(2, 4, 16, 16, generator=g).float() for _ in TRAIN["steps"]]
    ts = [torch.tensor(t) for t in TRAIN["steps"]]
    opt = torch.optim.AdamW(m.parameters(), lr=TRAIN["lr"], betas=TRAIN["betas"], eps=TRAIN["eps"],
                            weight_decay=TRAIN["weight_decay"])
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    out = {"x0": x0, "ctx": ctx, "text": text, "tids": tids}
    losses, norms = [], []
    for i in range(len(ts)):
        out[f"noise{i}"] = noise[i]
        out[f"t{i}"] = ts[i].float()
        opt.zero_grad()
        x, n, t = x0.double(), noise[i].double(), ts[i]
        pred = m(sched.add_noise(x, n, t), t, encoder_hidden_states=ctx.double(),
                 added_cond_kwargs={"text_embeds": text.double(), "time_ids": tids.double()}).sample
        loss = F.mse_loss(pred, n, reduction="mean")
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), TRAIN["max_grad_norm"]).item())
        assert norms[-1] > TRAIN["max_grad_norm"], "clipping must be active"
        opt.step()
        losses.append(loss.item())
    names, stats = param_stats(m, before)
    out["eps_loss"] = torch.tensor(losses, dtype=torch.float64)
    out["eps_gnorm"] = torch.tensor(norms, dtype=torch.float64)
    out["eps_stats"] = torch.from_numpy(stats)
    meta = {"names": "\n".join(names), "lr": repr(TRAIN["lr"]), "weight_decay": repr(TRAIN["weight_decay"]),
            "max_grad_norm": repr(TRAIN["max_grad_norm"])}
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(d, "train.safetensors"), metadata=meta)
    print(f"train sdxl: eps losses {losses} grad norms {norms}")


def main():
    import sys
    what = sys.argv[1:] or ["unet", "train", "train_sdxl"]
    if "unet" in what:
        for name, cfg in CONFIGS.items():
            make(name, cfg)
    if "train" in what:
        make_train()
    if "train_sdxl" in what:
        make_train_sdxl()


if __name__ == "__main__":
    main()
