#!/usr/bin/env python3
"""Golden files for the VAE encoder (libcore/models/vae*.c), run by hand, not in CI:
    python3 tests/golden/make_vae_golden.py
(needs torch, diffusers, safetensors, numpy from PyPI).

For two tiny AutoencoderKL configs with random weights it writes, under
tests/golden/vae/<name>/:
  vae/config.json + vae/diffusion_pytorch_model.safetensors   diffusers layout
      (fp32; encoder, quant_conv and post_quant_conv only: the decoder is
      dropped to keep the files small, the loader must ignore what it does
      not use, as post_quant_conv shows)
  single.safetensors   the same weights in the original ldm single-file
      layout (first_stage_model.encoder.down.0.block.0.*, mid.attn_1 q/k/v/
      proj_out as 1x1 conv weights [C, C, 1, 1]), stored as fp16 (the "sd"
      config) or bf16 ("sdxl"), plus a stray UNet tensor and, for "sdxl", a
      conditioner.embedders tensor so the loader can tell an SDXL checkpoint
  expected.safetensors input x [2, 3, H, W] in [-1, 1] and the posterior's
      mean and std (std = exp(0.5 * clamp(logvar, -30, 20))) as diffusers
      computes them in float64 from the same fp32 weights

Weights are rounded to values that fp16 and bf16 both represent exactly
(8 significant bits, nothing below fp16's smallest normal), so the fp16/bf16 single files and
the fp32 folder hold bit-identical weights and must give the same moments.

"sd" is SD-shaped (4 down blocks, 2 resnets each, the SD 1.x/2.x scaling
factor 0.18215); "sdxl" is SDXL-shaped (SDXL's scaling factor 0.13025,
3 down blocks, 1 resnet each; its single file carries SDXL's conditioner
keys, so the scaling factor can be told from the file alone).

"old_names" is the "sdxl" vae/ folder with the attention names diffusers
used before 0.14 (see make_old_names)."""
import json
import os
import shutil

import numpy as np
import torch
from diffusers import AutoencoderKL
from safetensors.torch import load_file, save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vae")

CONFIGS = {
    "sd": dict(block_out_channels=(8, 16, 32, 32), layers_per_block=2, norm_num_groups=4,
               latent_channels=4, scaling_factor=0.18215, use_quant_conv=True, size=(40, 32),
               single_dtype=torch.float16, single_prefix="first_stage_model."),
    "sdxl": dict(block_out_channels=(8, 16, 16), layers_per_block=1, norm_num_groups=2,
                 latent_channels=4, scaling_factor=0.13025, use_quant_conv=True, size=(24, 40),
                 single_dtype=torch.bfloat16, single_prefix="first_stage_model."),
}


def round_weights(sd):
    """Round every weight to 8 significant bits so fp16 and bf16 hold it
    exactly (the random weights are far from fp16's range limits)."""
    out = {}
    for k, v in sd.items():
        b = v.float().to(torch.bfloat16).float()
        b = torch.where(b.abs() < 2.0 ** -14, torch.zeros_like(b), b)  # no fp16 subnormals
        assert torch.equal(b.half().float(), b), k
        out[k] = b.contiguous()
    return out


def ldm_name(k):
    """Map a diffusers encoder key to its original ldm (CompVis) name."""
    k = k.replace("encoder.down_blocks.", "encoder.down.")
    k = k.replace(".resnets.", ".block.")
    k = k.replace(".downsamplers.0.conv.", ".downsample.conv.")
    k = k.replace(".conv_shortcut.", ".nin_shortcut.")
    k = k.replace("encoder.mid_block.block.0.", "encoder.mid.block_1.")
    k = k.replace("encoder.mid_block.block.1.", "encoder.mid.block_2.")
    k = k.replace("encoder.mid_block.attentions.0.group_norm.", "encoder.mid.attn_1.norm.")
    k = k.replace("encoder.mid_block.attentions.0.to_q.", "encoder.mid.attn_1.q.")
    k = k.replace("encoder.mid_block.attentions.0.to_k.", "encoder.mid.attn_1.k.")
    k = k.replace("encoder.mid_block.attentions.0.to_v.", "encoder.mid.attn_1.v.")
    k = k.replace("encoder.mid_block.attentions.0.to_out.0.", "encoder.mid.attn_1.proj_out.")
    k = k.replace("encoder.conv_norm_out.", "encoder.norm_out.")
    return k


def make(name, cfg):
    torch.manual_seed({"sd": 1, "sdxl": 2}[name])
    nb = len(cfg["block_out_channels"])
    model = AutoencoderKL(
        block_out_channels=cfg["block_out_channels"], layers_per_block=cfg["layers_per_block"],
        down_block_types=("DownEncoderBlock2D",) * nb, up_block_types=("UpDecoderBlock2D",) * nb,
        norm_num_groups=cfg["norm_num_groups"], latent_channels=cfg["latent_channels"],
        scaling_factor=cfg["scaling_factor"], use_quant_conv=cfg["use_quant_conv"], sample_size=64)
    # Random weights of a realistic spread (init gives tiny norms' affine 1/0,
    # which would hide a swapped gamma/beta): perturb every tensor.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    state = round_weights({k: v for k, v in model.state_dict().items() if not k.startswith("decoder.")})
    model.load_state_dict(state, strict=False)
    model = model.double().eval()

    h, w = cfg["size"]
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(2, 3, h, w, generator=g) * 2 - 1).float()
    with torch.no_grad():
        post = model.encode(x.double()).latent_dist
    mean = post.mean.float().contiguous()
    std = post.std.float().contiguous()

    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "vae"))
    conf = dict(model.config)
    conf = {k: (list(v) if isinstance(v, tuple) else v) for k, v in conf.items() if not k.startswith("_")}
    conf["_class_name"] = "AutoencoderKL"
    with open(os.path.join(d, "vae", "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
    save_file(state, os.path.join(d, "vae", "diffusion_pytorch_model.safetensors"))

    single = {}
    for k, v in state.items():
        nk = ldm_name(k)
        if ".mid.attn_1." in nk and nk.endswith(".weight") and v.ndim == 2:
            v = v[:, :, None, None]
        single[cfg["single_prefix"] + nk] = v.to(cfg["single_dtype"]).contiguous()
    single["model.diffusion_model.conv_in.weight"] = torch.zeros(4, 4, 3, 3, dtype=cfg["single_dtype"])
    if name == "sdxl":
        single["conditioner.embedders.1.model.text_projection"] = torch.zeros(4, 4, dtype=cfg["single_dtype"])
    save_file(single, os.path.join(d, "single.safetensors"))
    save_file({"x": x.contiguous(), "mean": mean, "std": std}, os.path.join(d, "expected.safetensors"))
    print(name, "x", tuple(x.shape), "mean", tuple(mean.shape),
          "|mean| max %.3f, std range %.3f..%.3f" % (mean.abs().max(), std.min(), std.max()))


def make_old_names(src="sdxl", dst="old_names"):
    """vae/ of `src` again as diffusers saved it before 0.14 (the hub's SD 1.x
    and 2.x vae/ folders, sd-vae-ft-mse): the mid-block attention's to_q,
    to_k, to_v and to_out.0 named query, key, value and proj_attn (diffusers
    renames them on load, _convert_deprecated_attention_blocks). Same
    weights, so `src`'s expected.safetensors holds its moments; the test
    reads them from there. Checked here: diffusers loads it to the same
    weights."""
    ren = {"to_q.": "query.", "to_k.": "key.", "to_v.": "value.", "to_out.0.": "proj_attn."}
    base = "encoder.mid_block.attentions.0."
    sdir, ddir = os.path.join(HERE, src, "vae"), os.path.join(HERE, dst, "vae")
    shutil.rmtree(os.path.join(HERE, dst), ignore_errors=True)
    os.makedirs(ddir)
    shutil.copy(os.path.join(sdir, "config.json"), os.path.join(ddir, "config.json"))
    state = load_file(os.path.join(sdir, "diffusion_pytorch_model.safetensors"))
    old = {}
    for k, v in state.items():
        for now, was in ren.items():
            if k.startswith(base + now):
                k = base + was + k[len(base + now):]
        old[k] = v
    assert sum(k.startswith(base + "query.") or k.startswith(base + "proj_attn.") for k in old) == 4
    save_file(old, os.path.join(ddir, "diffusion_pytorch_model.safetensors"))
    a = AutoencoderKL.from_pretrained(sdir).state_dict()
    b = AutoencoderKL.from_pretrained(ddir).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith("encoder.") or k.startswith("quant_conv."))
    print(dst, "from", src, sorted(k for k in old if k.startswith(base)))


if __name__ == "__main__":
    for n, c in CONFIGS.items():
        make(n, c)
    make_old_names()
