#!/bin/bash
# The GPU check and VAE benchmark (run by hand on a machine with an NVIDIA
# GPU; docs/GPU.md): sd-selftest on cuda:0 (every op against the CPU, the
# tiny golden VAE, the throughput probe; again with TF32, bf16 and fp16),
# then the real SD VAE architecture with random weights encoding 512x512
# images in batches of 1 and 8, sdtk's
# CUDA backend vs PyTorch (diffusers AutoencoderKL) on the same GPU in the
# same run, strict fp32, TF32 and bf16 mixed precision (MODES, default all
# three; PyTorch under torch.autocast for bf16, and also with the whole
# model in bf16, the usual half VAE), with the max difference of the means.
# usage: bench/bench_gpu.sh BUILD_DIR [LOG_DIR [vae]]   (Release build with
#        the CUDA backend; python3 with torch + diffusers; vae: only the VAE
#        benchmark)
# Results: bench/RESULTS.md, "GPU (H100)".
set -u
B=$(realpath "${1:-build}")
LOG=${2:-$(mktemp -d)}
mkdir -p "$LOG"
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "${3:-}" != vae ]; then
echo "== sd-selftest --device cuda:0"
timeout 900 "$B/tools/sd-selftest" --device cuda:0 --golden "$HERE/../tests/golden/vae/sd" 2>&1 | tee "$LOG/selftest.txt"
echo "selftest exit ${PIPESTATUS[0]}"
echo "== sd-selftest --device cuda:0 --tf32 --no-probe"
timeout 900 "$B/tools/sd-selftest" --device cuda:0 --tf32 --no-probe --golden "$HERE/../tests/golden/vae/sd" > "$LOG/selftest_tf32.txt" 2>&1
echo "selftest --tf32 exit $?: $(tail -1 "$LOG/selftest_tf32.txt")"
for mp in bf16 fp16; do
    echo "== sd-selftest --device cuda:0 --mixed-precision $mp --no-probe"
    timeout 900 "$B/tools/sd-selftest" --device cuda:0 --mixed-precision $mp --no-probe --golden "$HERE/../tests/golden/vae/sd" > "$LOG/selftest_$mp.txt" 2>&1
    echo "selftest --mixed-precision $mp exit $?: $(tail -1 "$LOG/selftest_$mp.txt")"
done
fi
python3 "$HERE/bench_vae.py" make "$T" || exit 1
echo "== VAE encoder, SD architecture, random weights, 512x512"
for mode in ${MODES:-strict tf32 bf16}; do
    for batch in 1 8; do
        dev=cuda:0
        [ $mode != strict ] && dev=cuda:0:$mode
        python3 "$HERE/bench_vae.py" gpu "$T" $batch 10 $([ $mode != strict ] && echo $mode) 2>&1 | tee "$T/torch.txt"
        # the usual half VAE: the whole PyTorch model in bf16 (another peer, not in the ratios below)
        [ $mode = bf16 ] && python3 "$HERE/bench_vae.py" gpu "$T" $batch 10 bf16w 2>&1 | grep pytorch
        # cuDNN's heuristic algorithm choice (the default), then its timed search (as torch's cudnn.benchmark)
        timeout 600 "$B/bench/bench_vae" "$T/vae" "$T/x.f32" 512 512 1 10 "$T/sdtk_mean.f32" $dev $batch 2>&1 |
            tee "$T/sdtk.txt"
        timeout 600 "$B/bench/bench_vae" "$T/vae" "$T/x.f32" 512 512 1 10 "$T/sdtk_search_mean.f32" \
            ${dev/cuda:0/cuda:0:search} $batch 2>&1 | tee "$T/sdtk_search.txt"
        python3 - "$T/torch.txt" "$T/sdtk.txt" "$T/sdtk_search.txt" "$T/torch_mean.f32" "$T/sdtk_mean.f32" \
            "$T/sdtk_search_mean.f32" << 'PY'
import re, sys
import numpy as np
try:
    med = [float(re.search(r"median ([\d.]+)", open(f).read()).group(1)) for f in sys.argv[1:4]]
    a, b, c = (np.fromfile(f, np.float32) for f in sys.argv[4:7])
    print("  sdtk/pytorch speed (medians): %.2fx heuristic, %.2fx searched   max |mean diff| %.2e / %.2e "
          "(mean |value| %.2e)" % (med[0] / med[1], med[0] / med[2], np.abs(a - b).max(), np.abs(a - c).max(),
                                   np.abs(a).mean()))
except Exception as e:
    print("  no comparison:", e)
PY
    done
done 2>&1 | tee "$LOG/vae.txt"
