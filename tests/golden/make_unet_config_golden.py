#!/usr/bin/env python3
"""Golden config.json files for the UNet config writer (tests/test_unet.c
check_config_text), run by hand, not in CI:
    pip install diffusers torch
    python3 tests/golden/make_unet_config_golden.py

diffusers' UNet2DConditionModel.save_config output for three architectures,
the per-block values given as lists (how sdtk writes them): SD 1.5, SDXL
base, and a tiny one with other floats and switches (norm_eps 1e-6,
freq_shift 1, no mid block). The models are built on the meta device, so
nothing is allocated. sdtk's writer must reproduce each file byte for
byte: every key, sorted, indented, floats as Python prints them, and
_diffusers_version (libcore/models/unet_config.c names the release used here)."""
import os

import diffusers
import torch
from diffusers import UNet2DConditionModel

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unet", "configs")
CONFIGS = {
    "sd15": dict(sample_size=64, layers_per_block=[2, 2, 2, 2], attention_head_dim=[8, 8, 8, 8],
                 transformer_layers_per_block=[1, 1, 1, 1], cross_attention_dim=768),
    "sdxl": dict(sample_size=128, block_out_channels=[320, 640, 1280], layers_per_block=[2, 2, 2],
                 down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                 up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                 attention_head_dim=[5, 10, 20], transformer_layers_per_block=[1, 2, 10], cross_attention_dim=2048,
                 use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
                 projection_class_embeddings_input_dim=2816),
    "tiny": dict(block_out_channels=[8, 16], layers_per_block=[1, 2],
                 down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                 up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], attention_head_dim=[2, 4],
                 transformer_layers_per_block=[2, 1], cross_attention_dim=16, norm_num_groups=4, norm_eps=1e-6,
                 freq_shift=1, flip_sin_to_cos=False, upcast_attention=True, downsample_padding=0,
                 mid_block_type=None),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    print("diffusers", diffusers.__version__)
    for name, cfg in CONFIGS.items():
        with torch.device("meta"):
            model = UNet2DConditionModel(**cfg)
        d = os.path.join(OUT, name)
        model.save_config(d)
        os.replace(os.path.join(d, "config.json"), d + ".json")
        os.rmdir(d)
        print(name, os.path.getsize(d + ".json"), "bytes")


if __name__ == "__main__":
    main()
