#!/usr/bin/env python3
"""PyTorch CPU fp32 timings of the representative SD-VAE encoder layers at a
512x512 input, the peer of bench/bench_ops.c (same layers, same order, same
output format). Run by bench/bench_ops.sh; needs torch (PyPI). --cpu
reports the main thread's CPU time instead of wall time (meaningful with
1 thread, where torch computes on the calling thread: steadier while others
load the machine), like bench_ops --cpu. --conv CIN COUT HW times one 3x3
pad-1 conv of that shape (one image) instead, like bench_ops --conv.
usage: bench_ops_torch.py THREADS REPEATS [--bwd] [--cpu] [--conv CIN COUT HW]"""
import sys
import time

import torch
import torch.nn.functional as F

threads, reps = int(sys.argv[1]), int(sys.argv[2])
bwd = "--bwd" in sys.argv[3:]
clock = time.thread_time if "--cpu" in sys.argv[3:] else time.perf_counter
torch.set_num_threads(threads)
torch.manual_seed(0)


def conv(cin, cout, hw, k=3, stride=1, pad=(1, 1, 1, 1)):
    """A conv layer as the VAE runs it: explicit F.pad for asymmetric pads
    (as diffusers' Downsample2D does), symmetric ones inside conv2d."""
    x = torch.randn(1, cin, hw, hw)
    w = torch.randn(cout, cin, k, k) * (1.0 / (cin * k * k) ** 0.5)
    b = torch.randn(cout)
    sym = pad[0] == pad[1] == pad[2] == pad[3]

    def f(x, w, b):
        if sym:
            return F.conv2d(x, w, b, stride=stride, padding=pad[0])
        return F.conv2d(F.pad(x, pad), w, b, stride=stride)
    return f, (x, w, b)


def qkv():
    """The mid-block attention's three 512->512 projections over 4096 rows."""
    x = torch.randn(4096, 512)
    ws = [torch.randn(512, 512) * 512 ** -0.5 for _ in range(3)]
    bs = [torch.randn(512) for _ in range(3)]

    def f(x, *p):
        return [F.linear(x, p[i], p[3 + i]) for i in range(3)]
    return f, (x, *ws, *bs)


def sdpa():
    """Single-head attention over 4096 tokens of width 512."""
    q, k, v = (torch.randn(1, 1, 4096, 512) for _ in range(3))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v)), (q, k, v)


layers = [
    ("conv_in 3->128 @512", *conv(3, 128, 512)),
    ("conv 128->128 @512", *conv(128, 128, 512)),
    ("down 128 s2 @512->256", *conv(128, 128, 512, stride=2, pad=(0, 1, 0, 1))),
    ("conv 256->256 @128", *conv(256, 256, 128)),
    ("conv 512->512 @64", *conv(512, 512, 64)),
    ("conv1x1 128->256 @256", *conv(128, 256, 256, k=1, pad=(0, 0, 0, 0))),
    ("linear qkv 3x 512 T4096", *qkv()),
    ("sdpa T4096 d512", *sdpa()),
]
if "--conv" in sys.argv[3:]:
    i = sys.argv.index("--conv")
    cin, cout, hw = (int(a) for a in sys.argv[i + 1:i + 4])
    layers = [("conv (--conv)", *conv(cin, cout, hw))]


def best(fn):
    """Best of reps timed runs after one warm-up, in ms."""
    fn()
    ts = []
    for _ in range(reps):
        t = clock()
        fn()
        ts.append(clock() - t)
    return min(ts) * 1e3


for name, f, args in layers:
    with torch.no_grad():
        fwd_ms = best(lambda: f(*args))
    line = f"{name:26s} fwd {fwd_ms:9.1f} ms"
    if bwd:
        leaves = [a.clone().requires_grad_(True) for a in args]
        out = f(*leaves)
        outs = out if isinstance(out, list) else [out]
        dys = [torch.randn_like(o) for o in outs]

        def back():
            for a in leaves:
                a.grad = None
            torch.autograd.backward(outs, dys, retain_graph=True)
        line += f"  bwd {best(back):9.1f} ms"
    print(line, flush=True)
