#!/usr/bin/env python3
"""Golden files for loss masks (sd-train --masked-loss, trainer/data_mask.c), run by hand,
not in CI:
    SDTK_PHOTOS=/work/photos python3 tests/golden/make_mask_golden.py [train] [photos]
(needs torch, diffusers, safetensors, numpy, PIL from PyPI).

train: tests/golden/unet/sd1/masked.safetensors, the masked loss of sd-scripts on the tiny sd1
    UNet (tests/golden/unet/sd1, made by make_unet_golden.py), in float64: two samples of 16x16
    latents, epsilon target, each with an alpha mask of the image's size (128x128, values k/255
    as sd-scripts makes them from an 8-bit alpha channel: alpha.astype(float32) / 255). The loss
    is computed as sd-scripts' train_network.py does with --masked_loss: F.mse_loss(reduction
    "none"), then library/custom_train_functions.py apply_masked_loss (the mask interpolated to
    the loss's size with mode "area", loss * mask), then mean over [1, 2, 3], then the mean.
    Written: the inputs (x0, ctx, noise, t, alpha_masks), the reduced mask (mask_latent, float32
    [2, 16, 16]: torch's area interpolation of the alpha masks), the loss, and every parameter's
    gradient as statistics (grad_stats [P, 3] float64: L2 norm, projection on the fixed vector
    of make_unet_golden.rvec, largest magnitude; names one per line in the metadata entry
    `names`).

photos: tests/golden/masks/photos.npz, sd-scripts' masks at the latent size for the cases of
    tests/mask_alpha.py: RGBA PNGs made from the wallpaper photos (which have no transparency)
    with a generated alpha channel, taken through sd-scripts' caching path
    (library/train_util.py trim_and_resize_if_required: utils.resize_image with cv2's
    INTER_AREA when both sides shrink, PIL's LANCZOS otherwise, then the crop; the alpha channel
    as alpha.astype(float32) / 255) and apply_masked_loss' area interpolation to the latent
    size (1/8). cv2 is not installed here: INTER_AREA is the float transcription of
    tests/e2e_image.py (area_resize), rounded to 8 bits as cv2 stores it. Keys case<i>, float32
    [crop_h / 8, crop_w / 8]."""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DConditionModel
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unet")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_unet_golden import rvec  # noqa: E402


def apply_masked_loss(loss, alpha_masks):
    """sd-scripts' apply_masked_loss for the alpha-mask case, transcribed: the masks [B, H, W]
    (0..1) get a channel axis, are interpolated to the loss's size with mode "area" and
    multiply the loss."""
    mask_image = alpha_masks.to(dtype=loss.dtype).unsqueeze(1)
    mask_image = F.interpolate(mask_image, size=loss.shape[2:], mode="area")
    return loss * mask_image


def alpha_masks(n, size, seed):
    """8-bit alpha channels as sd-scripts reads them (alpha / 255 in float32): a soft disc whose
    centre and radius vary per sample, fully transparent and fully opaque parts included, and
    a little noise so every 8x8 block averages differently."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    out = []
    for i in range(n):
        cy, cx, r = rng.uniform(0.3, 0.7) * size, rng.uniform(0.3, 0.7) * size, rng.uniform(0.25, 0.45) * size
        d = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
        a = np.clip((r - d) / (0.2 * size) + 0.5, 0, 1) * 255 + rng.normal(0, 6, d.shape)
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
        out.append(a.astype(np.float32) / 255.0)
    return torch.from_numpy(np.stack(out))


def make_train():
    """tests/golden/unet/sd1/masked.safetensors (see the module's docstring)."""
    d = os.path.join(HERE, "sd1")
    sched = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, num_train_timesteps=1000)
    g = torch.Generator().manual_seed(300)
    x0 = (torch.randn(2, 4, 16, 16, generator=g) * 0.18215 * 5).float()
    ctx = torch.randn(2, 5, 8, generator=g).float()
    noise = torch.randn(2, 4, 16, 16, generator=g).float()
    t = torch.tensor([640, 90])
    masks = alpha_masks(2, 128, 301)
    m = UNet2DConditionModel.from_pretrained(os.path.join(d, "unet")).double()
    noisy = sched.add_noise(x0.double(), noise.double(), t)
    out = m(noisy, t, encoder_hidden_states=ctx.double()).sample
    loss = F.mse_loss(out, noise.double(), reduction="none")
    loss = apply_masked_loss(loss, masks)
    loss = loss.mean([1, 2, 3]).mean()
    loss.backward()
    names = sorted(k for k, _ in m.named_parameters())
    params = dict(m.named_parameters())
    stats = np.zeros((len(names), 3))
    for i, k in enumerate(names):
        gr = params[k].grad.numpy().astype(np.float64).reshape(-1)
        stats[i] = [np.sqrt((gr * gr).sum()), (gr * rvec(gr.size)).sum(), np.abs(gr).max()]
    reduced = F.interpolate(masks.double().unsqueeze(1), size=(16, 16), mode="area")[:, 0].float()
    unmasked = F.mse_loss(out, noise.double()).item()
    res = {"x0": x0, "ctx": ctx, "noise": noise, "t": t.float(), "alpha_masks": masks, "mask_latent": reduced,
           "loss": torch.tensor([loss.item()], dtype=torch.float64), "grad_stats": torch.from_numpy(stats)}
    save_file({k: v.contiguous() for k, v in res.items()}, os.path.join(d, "masked.safetensors"),
              metadata={"names": "\n".join(names)})
    print(f"masked: loss {loss.item():.8f} (unmasked {unmasked:.8f}), mask mean {masks.mean().item():.4f}")


def inter_area(a, rw, rh):
    """cv2.resize(..., INTER_AREA) of a uint8 plane, in float, rounded to uint8 (the
    transcription in tests/e2e_image.py area_resize: each output pixel the mean of the source
    span it covers, edge pixels weighted by the part covered)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from e2e_image import area_resize
    return area_resize(a[:, :, None], rw, rh)[:, :, 0]


def make_photos():
    """tests/golden/masks/photos.npz (see the module's docstring)."""
    from PIL import Image
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from mask_alpha import CASES, rgba_from_photo
    root = os.environ["SDTK_PHOTOS"]
    photos = sorted(f for f in os.listdir(root) if f.lower().endswith((".jpg", ".png")))
    out = {}
    for i, (pi, size, (rw, rh), (l, t, r, b)) in enumerate(CASES):
        im = rgba_from_photo(os.path.join(root, photos[pi]), size, i)
        rgba = np.asarray(im)
        w, h = size
        if (w, h) == (rw, rh):
            alpha = rgba[:, :, 3]
        elif w >= rw and h >= rh:
            alpha = inter_area(rgba[:, :, 3], rw, rh)
        else:  # PIL resizes an RGBA image's alpha as a plane of its own
            alpha = np.asarray(Image.fromarray(rgba[:, :, 3], "L").resize((rw, rh), Image.LANCZOS))
        alpha = alpha[t:b, l:r].astype(np.float32) / 255.0
        m = torch.from_numpy(alpha)[None, None]
        red = F.interpolate(m, size=(alpha.shape[0] // 8, alpha.shape[1] // 8), mode="area")[0, 0]
        out["case%d" % i] = red.numpy().astype(np.float32)
        print(f"photos case {i}: {photos[pi]} {size} -> {rw}x{rh} box {(l, t, r, b)}: mask {tuple(red.shape)} "
              f"mean {red.mean().item():.4f}")
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "masks")
    os.makedirs(d, exist_ok=True)
    np.savez(os.path.join(d, "photos.npz"), **out)


if __name__ == "__main__":
    what = sys.argv[1:] or ["train", "photos"]
    if "train" in what:
        make_train()
    if "photos" in what:
        make_photos()
