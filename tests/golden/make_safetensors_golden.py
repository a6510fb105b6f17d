#!/usr/bin/env python3
"""Golden safetensors files written by the reference implementation (PyPI
`safetensors`), run by hand, not in CI:  python3 tests/golden/make_safetensors_golden.py
Writes tests/golden/safetensors/{tiny.safetensors, tiny.json}: the file and, per
tensor, dtype, shape and the XXH-independent checksum sum(bytes) + first bytes,
so the C reader is checked against a writer it does not share code with."""
import json
import os

import numpy as np
from safetensors.numpy import save_file

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors")
os.makedirs(here, exist_ok=True)
rng = np.random.default_rng(7)
tensors = {
    "encoder.conv_in.weight": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
    "encoder.conv_in.bias": rng.standard_normal((8,)).astype(np.float16),
    "decoder.scale": np.array(0.18215, dtype=np.float64),  # 0-rank
    "empty": np.zeros((0, 4), dtype=np.float32),
    "ids": np.arange(-5, 5, dtype=np.int64),
    "mask": np.array([True, False, True]),
    "bytes": np.arange(17, dtype=np.uint8),
    "small.int16": np.array([[1, -2], [3, -4]], dtype=np.int16),
}
path = os.path.join(here, "tiny.safetensors")
save_file(tensors, path, metadata={"format": "pt", "note": "sdtk golden"})
names = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64",
         np.dtype("int64"): "I64", np.dtype("bool"): "BOOL", np.dtype("uint8"): "U8", np.dtype("int16"): "I16"}
expect = {}
for k, v in tensors.items():
    b = np.ascontiguousarray(v).tobytes()
    expect[k] = {"dtype": names[v.dtype], "shape": list(v.shape), "nbytes": len(b),
                 "byte_sum": int(sum(b)), "head": list(b[:8])}
with open(os.path.join(here, "tiny.json"), "w") as f:
    json.dump({"tensors": expect, "metadata": {"format": "pt", "note": "sdtk golden"}}, f, indent=1, sort_keys=True)
print("wrote", path, os.path.getsize(path), "bytes")
