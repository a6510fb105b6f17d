#!/usr/bin/env python3
"""The PyTorch side of bench_clip.sh (run by hand; needs torch +
transformers + safetensors from PyPI).

  bench_clip.py make DIR N     the real CLIP ViT-L/14 text encoder
                               architecture (SD 1.x's text_encoder: vocab
                               49408, 77 positions, width 768, 12 layers, 12
                               heads, MLP 3072, quick_gelu) with seeded random
                               weights, written as DIR/text_encoder/
                               {config.json, model.safetensors}, and N
                               caption-like id rows [N, 77] (BOS, 5..75 random
                               tokens, EOS, EOS padding) as raw int32 DIR/ids.i32
  bench_clip.py time DIR N THREADS REPS
                               encode the N rows in one batch with torch fp32
                               on THREADS threads, REPS timed runs after one
                               warm-up; prints the best and median seconds and
                               captions/s (wall time; the best CPU time of the
                               process too), then the best of REPS runs encoding
                               the rows one per call (as sdtk does, so that a
                               caption's result never depends on its batch),
                               and writes last_hidden_state to
                               DIR/torch_hidden.f32"""
import os
import statistics
import sys
import time

import numpy as np
import torch
from transformers import CLIPTextConfig, CLIPTextModel

T, BOS, EOS = 77, 49406, 49407


def make(d, n):
    torch.manual_seed(0)
    conf = CLIPTextConfig(vocab_size=49408, max_position_embeddings=T, hidden_size=768, intermediate_size=3072,
                          num_hidden_layers=12, num_attention_heads=12, hidden_act="quick_gelu", projection_dim=768,
                          bos_token_id=0, eos_token_id=2, pad_token_id=1)
    m = CLIPTextModel(conf).eval()
    with torch.no_grad():  # spread the weights so activations are not tiny
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    m.save_pretrained(os.path.join(d, "text_encoder"), safe_serialization=True)
    rng = np.random.default_rng(1)
    ids = np.full((n, T), EOS, dtype=np.int32)
    for i in range(n):
        k = int(rng.integers(5, 76))
        ids[i, 0] = BOS
        ids[i, 1:1 + k] = rng.integers(0, 49406, size=k)
    ids.tofile(os.path.join(d, "ids.i32"))


def time_it(d, n, threads, reps):
    torch.set_num_threads(threads)
    m = CLIPTextModel.from_pretrained(os.path.join(d, "text_encoder"), attn_implementation="sdpa").eval()
    ids = torch.from_numpy(np.fromfile(os.path.join(d, "ids.i32"), dtype=np.int32).reshape(n, T).astype(np.int64))
    ts, cs, ts1 = [], [], []
    with torch.inference_mode():
        h = m(ids).last_hidden_state  # warm-up
        for _ in range(reps):
            t, c = time.perf_counter(), time.process_time()
            h = m(ids).last_hidden_state
            ts.append(time.perf_counter() - t)
            cs.append(time.process_time() - c)
        for _ in range(reps):  # one caption per call, as sdtk encodes them
            t = time.perf_counter()
            for i in range(n):
                m(ids[i:i + 1])
            ts1.append(time.perf_counter() - t)
    h.numpy().astype(np.float32).tofile(os.path.join(d, "torch_hidden.f32"))
    print("pytorch %s fp32, %d thread(s): best %.3f s, median %.3f s, %.2f captions/s; cpu time best %.3f s, "
          "%.2f captions per cpu-s (one caption per call: best %.3f s, %.2f captions/s)" %
          (torch.__version__, threads, min(ts), statistics.median(ts), n / min(ts), min(cs), n / min(cs), min(ts1),
           n / min(ts1)))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        time_it(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
