#!/usr/bin/env python3
"""Check the UNet's weight names and shapes at real sizes, by hand, not in CI
(needs torch and diffusers):
    python3 tests/golden/check_unet_names.py build/tests/test_unet

For the SD 1.5, SD 2.1 (768-v) and SDXL base UNet configs, `test_unet
--list-slots CONFIG` lists every parameter slot sdtk registers (diffusers
name, ldm name, shape) without allocating it. The script checks that
  - the diffusers names and shapes are exactly those of diffusers'
    UNet2DConditionModel built from the same config (on the meta device:
    no memory), and
  - the ldm names, fed (as model.diffusion_model.*) to diffusers' own
    single-file converter (convert_ldm_unet_checkpoint), come back as the
    same diffusers names with the same shapes."""
import json
import os
import subprocess
import sys
import tempfile

import torch
from diffusers import UNet2DConditionModel
from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

SD15 = dict(block_out_channels=[320, 640, 1280, 1280], layers_per_block=2, cross_attention_dim=768,
            attention_head_dim=8, sample_size=64)
SD21 = dict(block_out_channels=[320, 640, 1280, 1280], layers_per_block=2, cross_attention_dim=1024,
            attention_head_dim=[5, 10, 20, 20], use_linear_projection=True, upcast_attention=True, sample_size=96)
SDXL = dict(block_out_channels=[320, 640, 1280], layers_per_block=2, cross_attention_dim=2048,
            attention_head_dim=[5, 10, 20], use_linear_projection=True, transformer_layers_per_block=[1, 2, 10],
            down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
            addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816, sample_size=128)


def check(lister, name, cfg):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(dict(cfg, _class_name="UNet2DConditionModel"), f)
        path = f.name
    out = subprocess.run([lister, "--list-slots", path], capture_output=True, text=True, check=True).stdout
    os.unlink(path)
    ours = {}
    ldm = {}
    for line in out.splitlines():
        d, l, *shape = line.split()
        ours[d] = tuple(int(x) for x in shape)
        ldm["model.diffusion_model." + l] = torch.empty(ours[d], device="meta")
    with torch.device("meta"):
        model = UNet2DConditionModel(**cfg)
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == theirs, (name, set(ours) ^ set(theirs),
                            [k for k in ours if k in theirs and ours[k] != theirs[k]][:5])
    back = convert_ldm_unet_checkpoint(ldm, dict(model.config))
    back = {k: tuple(v.shape) for k, v in back.items()}
    assert back == theirs, (name, set(back) ^ set(theirs))
    print(f"{name}: {len(ours)} tensors, {sum(model.num_parameters() for _ in [0])} parameters: "
          "diffusers names and shapes equal; ldm names convert back to them")


def main():
    lister = sys.argv[1]
    for name, cfg in (("SD 1.5", SD15), ("SD 2.1-v", SD21), ("SDXL base", SDXL)):
        check(lister, name, cfg)


if __name__ == "__main__":
    main()
