#!/usr/bin/env python3
"""Golden file for torch's CPU randn stream (libcore/models/torch_randn.c),
run by hand, not in CI:
    python3 tests/golden/make_randn_golden.py
(needs torch, safetensors from PyPI).

For each seed, one torch.Generator().manual_seed(seed) draws, in order,
torch.randn(n) for every n of SIZES (float32): below 16 values torch takes
its double Box-Muller with a cached second value, from 16 its fp32 kernel
(the last 16 redrawn when n is not a multiple of 16), so the sequence
covers both paths, the cache carried across calls and the stream continued
as diffusers' ancestral samplers continue it. Also one SD-shaped draw,
torch.randn(1, 4, 32, 32) from manual_seed(1234), as a pipeline's initial
latents. Writes tests/golden/randn/expected.safetensors: seed<S> (all the
draws concatenated), sd_latents; the torch version and CPU capability in
the metadata (the fp32 kernel is torch's scalar one except on CPUs whose
best capability is AVX2, where the last bit can differ).
"""
import os

import torch
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "randn")
SEEDS = (0, 42, 2**32 + 7, 123456789)
SIZES = (3, 1, 16, 17, 5, 40, 256, 1000, 2)


def main():
    out = {}
    for s in SEEDS:
        g = torch.Generator().manual_seed(s)
        out["seed%d" % s] = torch.cat([torch.randn(n, generator=g) for n in SIZES]).contiguous()
    g = torch.Generator().manual_seed(1234)
    out["sd_latents"] = torch.randn(1, 4, 32, 32, generator=g).contiguous()
    os.makedirs(HERE, exist_ok=True)
    meta = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "sizes": ",".join(map(str, SIZES))}
    save_file(out, os.path.join(HERE, "expected.safetensors"), metadata=meta)
    print(meta, {k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
