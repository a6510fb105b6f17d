#!/usr/bin/env python3
"""Golden values for the engine's CPU ops (libcore/engine/ops_*.c), run by hand,
not in CI:  python3 tests/golden/make_ops_golden.py   (needs torch, numpy,
safetensors from PyPI). Writes tests/golden/ops/ops.safetensors: for each
case small fp32 inputs, weights, an upstream gradient dy, the forward output
y and the autograd gradients, all named "<case>.<tensor>". Torch computes in
float64 from the fp32 inputs, so the expected values carry no fp32 rounding
of their own; tests/test_ops.c compares its fp32 results with them."""
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops")
os.makedirs(here, exist_ok=True)
rng = np.random.default_rng(5)
out = {}


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def case(name, fn, inputs):
    """Run fn on float64 leaf copies of inputs, backprop a random dy, store
    inputs, dy, y and every input's gradient under name."""
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in inputs.items()}
    y = fn(**leaves)
    dy = rand(*y.shape)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    for k, v in inputs.items():
        out[f"{name}.{k}"] = v
        out[f"{name}.d{k}"] = leaves[k].grad.numpy().astype(np.float32)
    out[f"{name}.dy"] = dy
    out[f"{name}.y"] = y.detach().numpy().astype(np.float32)


# conv2d: 3x3 pad 1; the VAE downsample (pad right/bottom by 1, stride 2);
# 1x1 shortcut; the UNet downsample (stride 2, pad 1).
case("conv3", lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1),
     {"x": rand(2, 3, 7, 6), "w": rand(4, 3, 3, 3), "b": rand(4)})
case("convdown", lambda x, w, b: F.conv2d(F.pad(x, (0, 1, 0, 1)), w, b, stride=2),
     {"x": rand(1, 2, 8, 7), "w": rand(3, 2, 3, 3), "b": rand(3)})
case("conv1x1", lambda x, w, b: F.conv2d(x, w, b),
     {"x": rand(2, 4, 5, 5), "w": rand(3, 4, 1, 1), "b": rand(3)})
case("convs2p1", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
     {"x": rand(1, 2, 7, 8), "w": rand(3, 2, 3, 3), "b": rand(3)})
# group norm: 6 channels in 3 groups, the VAE's eps
case("gn", lambda x, gamma, beta: F.group_norm(x, 3, gamma, beta, eps=1e-6),
     {"x": rand(2, 6, 4, 5) * 2 + 0.5, "gamma": rand(6), "beta": rand(6)})
# linear over [B, T, C] tokens
case("linear", lambda x, w, b: F.linear(x, w, b), {"x": rand(2, 5, 7), "w": rand(4, 7), "b": rand(4)})
case("silu", lambda x: F.silu(x), {"x": rand(2, 3, 4, 5) * 3})
case("up", lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), {"x": rand(1, 2, 3, 4)})
case("add", lambda a, b: a + b, {"a": rand(3, 4), "b": rand(3, 4)})
# attention [B, H, T, D]: self, causal self, cross (Tq != Tk)
case("attn", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
     {"q": rand(2, 2, 5, 4), "k": rand(2, 2, 5, 4), "v": rand(2, 2, 5, 4)})
case("attncausal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     {"q": rand(2, 2, 5, 4), "k": rand(2, 2, 5, 4), "v": rand(2, 2, 5, 4)})
case("attncross", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
     {"q": rand(1, 2, 3, 8), "k": rand(1, 2, 6, 8), "v": rand(1, 2, 6, 8)})
# causal with Tq != Tk: torch masks key j > query i (top-left aligned)
case("attncausalx", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     {"q": rand(1, 1, 4, 4), "k": rand(1, 1, 6, 4), "v": rand(1, 1, 6, 4)})


# Second layer of ops, appended after the first so the rng order (and with
# it every value above) is unchanged.
def timestep_emb(t, dim, flip, shift, scale, max_period):
    """diffusers' get_timestep_embedding in float64 (diffusers itself casts
    to float32, which would round t * freq for t near 1000)."""
    half = dim // 2
    freq = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / (half - shift))
    arg = scale * (t[:, None] * freq[None, :])
    emb = torch.cat([torch.sin(arg), torch.cos(arg)], dim=-1)
    if flip:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return F.pad(emb, (0, dim % 2))


def geglu(x):
    hidden, gate = x.chunk(2, dim=-1)
    return hidden * F.gelu(gate)


# layer norm over the last dim of [B, T, C] tokens, CLIP's eps
case("ln", lambda x, gamma, beta: F.layer_norm(x, (8,), gamma, beta, eps=1e-5),
     {"x": rand(2, 5, 8) * 2 + 0.5, "gamma": rand(8), "beta": rand(8)})
case("gelu", lambda x: F.gelu(x, approximate="none"), {"x": rand(2, 3, 4, 5) * 3})
case("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), {"x": rand(2, 3, 4, 5) * 3})
case("geglu", geglu, {"x": rand(2, 3, 10) * 2})
case("concat", lambda a, b: torch.cat([a, b], dim=1), {"a": rand(2, 3, 4, 5), "b": rand(2, 2, 4, 5)})
case("scale", lambda x: 0.18215 * x, {"x": rand(3, 5)})
case("mul", lambda a, b: a * b, {"a": rand(3, 4), "b": rand(3, 4)})
# SD's UNet: flip_sin_to_cos=True, downscale_freq_shift=0; then the DDPM
# defaults (no flip, shift 1) with a scale and a shorter period
case("temb", lambda t: timestep_emb(t, 32, True, 0, 1, 10000),
     {"t": np.array([0, 1, 250.5, 999, 517.25, 63], dtype=np.float32)})
case("temb_ddpm", lambda t: timestep_emb(t, 7, False, 1, 2.0, 1000),
     {"t": np.array([0, 3.5, 40, 120.25], dtype=np.float32)})
case("bcast", lambda x, b: x + b[:, :, None, None], {"x": rand(2, 3, 4, 5), "b": rand(2, 3)})


def check_timestep_emb_against_diffusers():
    """If diffusers is installed, show how far its own float32 embedding is
    from the float64 one stored above (the rounding of t * freq)."""
    try:
        from diffusers.models.embeddings import get_timestep_embedding
    except ImportError:
        return
    t = torch.tensor(out["temb.t"])
    ref = get_timestep_embedding(t, 32, flip_sin_to_cos=True, downscale_freq_shift=0).numpy()
    print("diffusers float32 temb vs float64 golden: max abs diff", float(np.abs(ref - out["temb.y"]).max()))


check_timestep_emb_against_diffusers()



# Token + position embedding (CLIP text), appended after every other case so
# their rng draws are unchanged. The ids are data, not a differentiated
# input: stored as int32, with CLIP-like repeats (a start id 7, padding by
# the end id 8) so rows of the token gradient sum several tokens; the
# position table (8 rows) is longer than the sequence (6), as CLIP's 77 is.
emb_ids = np.array([[7, 3, 3, 5, 8, 8], [7, 0, 2, 3, 8, 8]], dtype=np.int32)
case("embedding", lambda tok, pos: F.embedding(torch.tensor(emb_ids, dtype=torch.long), tok) + pos[:6],
     {"tok": rand(9, 5), "pos": rand(8, 5)})
out["embedding.ids"] = emb_ids

path = os.path.join(here, "ops.safetensors")
save_file(out, path, metadata={"torch": torch.__version__, "generator": "make_ops_golden.py"})
print("wrote", path, os.path.getsize(path), "bytes,", len(out), "tensors")
