#!/usr/bin/env python3
"""The optimizer kernels do the CPU reference's arithmetic operation for
operation (libcore/engine/cuda/README.md, "Exact arithmetic in the optimizer
kernels"): nvcc must not contract any of their multiplies and adds into a
fused multiply-add. Each file is compiled to PTX twice, as built (nvcc
contracts by default) and with -fmad=false; every kernel must hold the same
number of fma instructions both ways (the explicit fmaf calls). Needs nvcc:
ctest runs it only in a CUDA build.

usage: check_no_contract.py NVCC SRC_DIR [--self-test]"""
import os
import re
import subprocess
import sys
import tempfile

FILES = ["cuda_optim8.cu", "cuda_adafactor.cu", "cuda_bf16w.cu"]


def fma_per_kernel(nvcc, src, path, fmad):
    """{kernel entry: count of fma instructions} of one PTX compile."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "k.ptx")
        cmd = [nvcc, "-arch=sm_90", "-ptx", "-fmad=" + ("true" if fmad else "false"),
               "-I", os.path.join(src, "libcore/engine"), "-I", os.path.join(src, "libcore/base"),
               "-I", os.path.join(src, "libcore/engine/cuda"), path, "-o", out]
        subprocess.run(cmd, check=True)
        ptx = open(out).read()
    counts = {}
    entries = list(re.finditer(r"\.entry\s+(\S+?)\(", ptx))
    for k, m in enumerate(entries):
        end = entries[k + 1].start() if k + 1 < len(entries) else len(ptx)
        counts[m.group(1)] = len(re.findall(r"\bfma\.rn\.f(?:32|64)\b", ptx[m.end():end]))
    return counts


def check(nvcc, src, path):
    """Problems of one file: kernels with contracted multiply-adds."""
    a, b = fma_per_kernel(nvcc, src, path, True), fma_per_kernel(nvcc, src, path, False)
    return ["%s: %s: %d fma as built, %d with -fmad=false (a multiply-add was contracted)"
            % (os.path.basename(path), name, a[name], b.get(name, 0)) for name in a if a[name] != b.get(name, 0)]


def main():
    nvcc, src = sys.argv[1], sys.argv[2]
    if "--self-test" in sys.argv[3:]:
        # a kernel with a plain a * b + c must be reported
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.cu")
            with open(bad, "w") as f:
                f.write("__global__ void k(float *x, float a, float b) { x[0] = x[0] * a + b; }\n")
            problems = check(nvcc, src, bad)
        print("self-test: %s" % ("caught" if problems else "MISSED"))
        return 0 if problems else 1
    problems = []
    for f in FILES:
        problems += check(nvcc, src, os.path.join(src, "libcore/engine/cuda", f))
    for p in problems:
        print(p)
    print("check_no_contract: %d problem(s) in %d files" % (len(problems), len(FILES)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
