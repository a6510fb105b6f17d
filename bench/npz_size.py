#!/usr/bin/env python3
"""Exact size of one kohya latent cache file (uncompressed np.savez of float32
latents [+ latents_flipped], original_size int64, crop_ltrb float64), for
SD 512^2 (4x64x64) and SDXL 1024^2 (4x128x128); also rounded up to 4 KiB
filesystem blocks, which is what each of these files costs on disk."""
import io

import numpy as np

for what, h, w in (("SD 512^2 4x64x64", 64, 64), ("SDXL 1024^2 4x128x128", 128, 128)):
    for flip in (0, 1):
        arrays = {"latents": np.zeros((4, h, w), np.float32),
                  "original_size": np.array([w * 8, h * 8], np.int64),
                  "crop_ltrb": np.array([0, 0, w * 8, h * 8], np.float64)}
        if flip:
            arrays["latents_flipped"] = np.zeros((4, h, w), np.float32)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        n = len(buf.getvalue())
        print("%-22s npz flip=%d: %d bytes (%d on disk in 4 KiB blocks)" % (what, flip, n, (n + 4095) // 4096 * 4096))
