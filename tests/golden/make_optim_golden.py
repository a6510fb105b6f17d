#!/usr/bin/env python3
"""Golden values for sd-train's 8-bit AdamW and Adafactor (trainer/optim_state.c,
libcore/engine/ops_optim8.c, ops_adafactor.c), run by hand, not in CI:

    python3 tests/golden/make_optim_golden.py [path/to/libbitsandbytes_cpu.so]

(needs numpy and safetensors from PyPI). Writes tests/golden/optim/optim.safetensors:
three steps with fixed gradients and per-step rates on a few tensors of the tiny SD
UNet's shapes (a 3x3 conv kernel, a 1x1 conv, linears, a bias, a norm weight, and one
odd linear whose last 8-bit block is short), for

  adamw8bit    bitsandbytes' AdamW8bit (lr per step, betas (0.9, 0.999), eps 1e-8,
               weight decay 1e-2): its CPU path, _optimizer_update_8bit_blockwise_cpu
               in bitsandbytes/backends/cpu/ops.py, for tensors of 4096 values or more,
               and _optimizer_update_32bit_cpu below that (min_8bit_size);
  adafactor    transformers' Adafactor(lr, relative_step=False, scale_parameter=False,
               warmup_init=False, weight_decay=1e-2), no first moment;
  adafactor_b1 the same with beta1=0.9.

torch does not install on this machine (only its CUDA build is on PyPI, with gigabytes
of NVIDIA libraries), so neither optimizer is run here from its package: both are
numpy transcriptions written from the sources (bitsandbytes 0.50.2's cpu/ops.py,
functional.py's create_dynamic_map and optim/optimizer.py; transformers 5.25's
optimization.py), kept in fp32 the way torch's CPU kernels compute: mul_ then
add_(alpha) fused (torch's vectorised add is an fma, emulated here in float64 then
rounded, which differs from a true fma only where the float64 sum lands on an fp32
midpoint), addcmul and addcdiv as separate products. The quantizer, the one piece
where a wrong reading would change the codes, is bitsandbytes' own native CPU function
(cquantize_blockwise_cpu_fp32 from the wheel's libbitsandbytes_cpu.so, called through
ctypes) when the path is given or found in an installed bitsandbytes; otherwise a
transcription of its 65536-entry nearest-code table (csrc/cpu_ops.cpp), said so in the
file's metadata.

Names: "<case>.<tensor>.<what>": p0 (initial weights), g1..g3 (gradients), p3
(weights after three steps), and the state after three steps (adamw8bit: qm, qv codes
and am, av absmax, or m32, v32 for small tensors; adafactor: row, col or v, and m);
"q8.code_m", "q8.code_v" the dynamic maps. Metadata: the tensor list with shapes and
the rates."""
import ctypes
import glob
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import save_file

f32 = np.float32
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim")
rng = np.random.default_rng(28)

# name, shape, gradient scale
TENSORS = [
    ("conv", (32, 16, 3, 3), 1e-2),     # up_blocks.0.resnets.0.conv1.weight-like: 8-bit
    ("ff", (32, 128), 3e-3),            # ff.net.2.weight: 8-bit, exactly 4096
    ("odd", (40, 130), 1e-1),           # 5200 values: 8-bit with a short last block
    ("proj", (32, 32, 1, 1), 2e-2),     # proj_in as a 1x1 conv: fp32 state in bitsandbytes
    ("to_q", (32, 32), 5e-3),           # attn1.to_q.weight: fp32 state in bitsandbytes
    ("bias", (32,), 1e-2),              # a conv bias
    ("norm", (32,), 4e-3),              # a GroupNorm weight
]
LRS = [1e-3, 2e-3, 5e-4]
B1, B2, EPS, WD = 0.9, 0.999, 1e-8, 1e-2


def fma(a, b, c):
    """fp32 a * b + c rounded once (through float64: a * b is exact there)."""
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(f32)


def linspace32(steps):
    """torch.linspace(0.1, 1, steps, dtype=float32): the first half from the start,
    the second from the end (its CPU kernel)."""
    start, end = f32(0.1), f32(1.0)
    step = f32((end - start) / f32(steps - 1))
    half = steps // 2
    return np.array([f32(start + step * f32(i)) if i < half else f32(end - step * f32(steps - i - 1))
                     for i in range(steps)], f32)


def dynamic_map(signed):
    """bitsandbytes' create_dynamic_map(signed, 7, 8) in fp32."""
    data = []
    for i in range(7):
        k = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
        b = linspace32(k)
        means = ((b[:-1] + b[1:]) / f32(2.0)).astype(f32)
        scale = f32(10.0 ** (i - 6))
        data += list((scale * means).astype(f32))
        if signed:
            data += list((-scale * means).astype(f32))
    data += [f32(0.0), f32(1.0)]
    assert len(data) == 256
    return np.array(sorted(data), f32)


def find_native(argv):
    """The wheel's CPU library, from the command line or an installed bitsandbytes."""
    if len(argv) > 1:
        return argv[1]
    for d in sys.path:
        hit = glob.glob(os.path.join(d, "bitsandbytes", "libbitsandbytes_cpu.so"))
        if hit:
            return hit[0]
    return None


NATIVE_PATH = find_native(sys.argv)
NATIVE = ctypes.CDLL(NATIVE_PATH) if NATIVE_PATH else None


def quantize_lut(code, x):
    """csrc/cpu_ops.cpp's quantize_cpu_impl transcribed: per-block absmax, then the
    nearest-code table at (clamp(x / absmax) + 1) / 2 * 65535 + 0.5."""
    mid = (f32(0.5) * (code[:-1] + code[1:])).astype(f32)
    lut = np.zeros(65536, np.uint8)
    c = 0
    for i in range(65536):
        v = f32(f32(-1.0) + f32(f32(2.0 * i) / f32(65535)))
        while c < 255 and mid[c] < v:
            c += 1
        lut[i] = c
    q = np.zeros(x.size, np.uint8)
    am = np.zeros((x.size + 255) // 256, f32)
    for b in range(am.size):
        blk = x[b * 256:(b + 1) * 256]
        am[b] = np.max(np.abs(blk))
        if am[b] == 0:
            continue
        inv = f32(f32(1.0) / am[b])
        t = np.clip((blk * inv).astype(f32), f32(-1), f32(1))
        idx = ((((t + f32(1.0)) * f32(0.5)).astype(f32) * f32(65535)).astype(f32) + f32(0.5)).astype(f32)
        q[b * 256:b * 256 + blk.size] = lut[idx.astype(np.uint16)]
    return q, am


def quantize(code, x):
    """bitsandbytes' blockwise quantization of x (blocks of 256) with the map code."""
    x = np.ascontiguousarray(x, f32)
    if NATIVE is None:
        return quantize_lut(code, x)
    code = np.ascontiguousarray(code, f32)
    q = np.zeros(x.size, np.uint8)
    am = np.zeros((x.size + 255) // 256, f32)
    P = ctypes.c_void_p
    NATIVE.cquantize_blockwise_cpu_fp32(P(code.ctypes.data), P(x.ctypes.data), P(am.ctypes.data),
                                        P(q.ctypes.data), ctypes.c_longlong(256), ctypes.c_longlong(x.size))
    return q, am


def dequantize(code, q, am):
    """code[q] times its block's absmax."""
    out = code[q]
    return (out * np.repeat(am, 256)[:q.size]).astype(f32)


def adamw8(p, grads, code_m, code_v):
    """AdamW8bit's three steps on one tensor; returns p and the state."""
    n = p.size
    p = p.reshape(-1).copy()
    eight = n >= 4096
    if eight:
        qm, qv = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        am, av = np.zeros((n + 255) // 256, f32), np.zeros((n + 255) // 256, f32)
    else:
        m, v = np.zeros(n, f32), np.zeros(n, f32)
    for t, (g, lr) in enumerate(zip(grads, LRS), start=1):
        g = g.reshape(-1)
        c1 = 1.0 - B1 ** t
        c2 = math.sqrt(1.0 - B2 ** t)
        if eight:
            m = dequantize(code_m, qm, am)
            v = dequantize(code_v, qv, av)
        m = fma(g, f32(1.0 - B1), (m * f32(B1)).astype(f32))                      # mul_(b1).add_(g, alpha)
        v = ((v * f32(B2)).astype(f32) + ((f32(1.0 - B2) * g).astype(f32) * g).astype(f32)).astype(f32)
        if eight:
            denom = ((np.sqrt(v) / f32(c2)).astype(f32) + f32(EPS)).astype(f32)  # (sqrt(v) / c2).add_(eps)
            p = (p * f32(1.0 - lr * WD)).astype(f32)
            p = (p + ((f32(-lr / c1) * m).astype(f32) / denom).astype(f32)).astype(f32)  # addcdiv_
            qm, am = quantize(code_m, m)
            qv, av = quantize(code_v, v)
        else:
            upd = (m / (np.sqrt(v) + f32(EPS * c2)).astype(f32)).astype(f32)
            p = (p * f32(1.0 - lr * WD)).astype(f32)
            p = fma(upd, f32(-lr * c2 / c1), p)                                  # add_(upd, alpha=step_size)
    if eight:
        return p, {"qm": qm, "qv": qv, "am": am, "av": av}
    return p, {"m32": m, "v32": v}


def adafactor(p, grads, beta1):
    """transformers' Adafactor, three steps on one tensor (means and norms in float64)."""
    shape = p.shape
    p = p.copy()
    factored = len(shape) >= 2
    if factored:
        row = np.zeros(shape[:-1], f32)
        col = np.zeros(shape[:-2] + shape[-1:], f32)
    else:
        vs = np.zeros(shape, f32)
    m = np.zeros(shape, f32) if beta1 is not None else None
    for t, (g, lr) in enumerate(zip(grads, LRS), start=1):
        b2t = 1.0 - math.pow(t, -0.8)
        upd = (g * g + f32(1e-30)).astype(f32)
        if factored:
            row = fma(upd.astype(np.float64).mean(axis=-1).astype(f32), f32(1.0 - b2t), (row * f32(b2t)).astype(f32))
            col = fma(upd.astype(np.float64).mean(axis=-2).astype(f32), f32(1.0 - b2t), (col * f32(b2t)).astype(f32))
            rmean = row.astype(np.float64).mean(axis=-1, keepdims=True).astype(f32)
            rf = (f32(1.0) / np.sqrt((row / rmean).astype(f32))).astype(f32)[..., None]
            cf = (f32(1.0) / np.sqrt(col)).astype(f32)[..., None, :]
            u = ((rf * cf).astype(f32) * g).astype(f32)
        else:
            vs = fma(upd, f32(1.0 - b2t), (vs * f32(b2t)).astype(f32))
            u = ((f32(1.0) / np.sqrt(vs)).astype(f32) * g).astype(f32)
        rms = math.sqrt(float(np.sum(u.astype(np.float64) ** 2))) / math.sqrt(u.size)
        u = (u / f32(max(rms / 1.0, 1.0))).astype(f32)
        u = (u * f32(lr)).astype(f32)
        if m is not None:
            m = fma(u, f32(1 - beta1), (m * f32(beta1)).astype(f32))
            u = m
        p = fma(p, f32(-WD * lr), p)                                                  # add_(p, alpha=-wd lr)
        p = (p - u).astype(f32)
    state = {"row": row, "col": col} if factored else {"v": vs}
    if m is not None:
        state["m"] = m
    return p, state


def main():
    out = {}
    code_m, code_v = dynamic_map(True), dynamic_map(False)
    out["q8.code_m"], out["q8.code_v"] = code_m, code_v
    for name, shape, gs in TENSORS:
        p0 = (rng.standard_normal(shape) * 0.05).astype(f32)
        grads = [(rng.standard_normal(shape) * gs).astype(f32) for _ in range(3)]
        if name == "conv":  # a block of zero gradients on the first step: an all-zero block's codes
            grads[0].reshape(-1)[256:512] = 0
        out[f"{name}.p0"] = p0
        for i, g in enumerate(grads, start=1):
            out[f"{name}.g{i}"] = g
        p, st = adamw8(p0, grads, code_m, code_v)
        out[f"adamw8bit.{name}.p3"] = p.reshape(shape)
        for k, v in st.items():
            out[f"adamw8bit.{name}.{k}"] = v
        for case, b1 in (("adafactor", None), ("adafactor_b1", 0.9)):
            p, st = adafactor(p0, grads, b1)
            out[f"{case}.{name}.p3"] = p
            for k, v in st.items():
                out[f"{case}.{name}.{k}"] = np.ascontiguousarray(v).reshape(-1)
    meta = {"tensors": json.dumps([[n, list(s)] for n, s, _ in TENSORS]), "lrs": json.dumps(LRS),
            "betas": json.dumps([B1, B2]), "eps": repr(EPS), "weight_decay": repr(WD),
            "quantizer": "bitsandbytes native cquantize_blockwise_cpu_fp32" if NATIVE else "transcribed table"}
    os.makedirs(here, exist_ok=True)
    path = os.path.join(here, "optim.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, path, metadata=meta)
    print("wrote", path, "quantizer:", meta["quantizer"], "(%s)" % NATIVE_PATH)
    if NATIVE:  # the transcribed table against the native quantizer, as a check of the reading
        x = (rng.standard_normal(4096 * 4) * np.repeat(10.0 ** rng.uniform(-8, 0, 64), 256)).astype(f32)
        for code in (code_m, code_v):
            xs = x if code is code_m else np.abs(x)
            a, b = quantize(code, xs), quantize_lut(code, xs)
            print("native vs transcribed table: codes differ in", int(np.sum(a[0] != b[0])), "of", xs.size)


if __name__ == "__main__":
    main()
