"""Alpha channels for the loss-mask tests (tests/e2e_masks.py) and their golden
(tests/golden/make_mask_golden.py), numpy only: the wallpaper photos have no
transparency (every alpha is 255), so the tests make RGBA PNGs from them with
these alphas. A case is a photo, the RGBA file's size and a plan (resize,
crop) as sd-bucket would write it."""
import numpy as np

# photo (index into the sorted SDTK_PHOTOS listing of .jpg/.png files), RGBA size, resize, crop box
CASES = [
    (0, (600, 400), (240, 160), (8, 16, 232, 144)),   # area shrink, centre crop
    (1, (640, 360), (320, 180), (0, 2, 320, 178)),    # area shrink by 2 (no 8-aligned crop offset)
    (2, (512, 512), (256, 256), (64, 64, 192, 192)),  # area shrink, square
    (3, (120, 80), (192, 128), (0, 0, 192, 128)),     # enlargement: PIL's LANCZOS
    (4, (256, 192), (256, 192), (0, 0, 256, 192)),    # as it is: the reduction alone
]


def alpha_pattern(w, h, seed):
    """An 8-bit alpha channel with hard and soft edges: a soft disc, a hard-edged
    transparent band and noise, so that resizing and 8x8 averaging both matter."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    cy, cx, r = h * rng.uniform(0.35, 0.65), w * rng.uniform(0.35, 0.65), min(w, h) * rng.uniform(0.25, 0.4)
    a = np.clip((r - np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)) / (0.15 * min(w, h)) + 0.5, 0, 1) * 255
    band = (xx > w * 0.7) & (xx < w * 0.8)
    a[band] = 0
    a += rng.normal(0, 10, a.shape)
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


def rgba_from_photo(photo, size, seed):
    """The RGBA picture of a case: the photo's pixels resized by PIL to size, with
    alpha_pattern as its alpha channel."""
    from PIL import Image
    with Image.open(photo) as im:
        rgb = np.asarray(im.convert("RGB").resize(size, Image.BILINEAR))
    a = alpha_pattern(size[0], size[1], seed)
    return Image.fromarray(np.dstack([rgb, a]), "RGBA")
