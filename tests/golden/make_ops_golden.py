#!/usr/bin/env python3
"""Golden values for the engine's CPU ops (libcore/ops_*.c), run by hand,
not in CI:  python3 tests/golden/make_ops_golden.py   (needs torch, numpy,
safetensors from PyPI). Writes tests/golden/ops/ops.safetensors: for each
case small fp32 inputs, weights, an upstream gradient dy, the forward output
y and the autograd gradients, all named "<case>.<tensor>". Torch computes in
float64 from the fp32 inputs, so the expected values carry no fp32 rounding
of their own; tests/test_ops.c compares its fp32 results with them."""
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

path = os.path.join(here, "ops.safetensors")
save_file(out, path, metadata={"torch": torch.__version__, "generator": "make_ops_golden.py"})
print("wrote", path, os.path.getsize(path), "bytes,", len(out), "tensors")
