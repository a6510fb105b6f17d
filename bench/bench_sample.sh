#!/bin/bash
# sd-sample benchmark (run by hand, not in ctest): real-size SD 1.5 with
# seeded random weights (text encoder, UNet, VAE built from SD 1.5's
# configs by bench_sample.py make; nothing downloaded), one 512x512 image,
# STEPS (default 20) steps DPM++ 2M, CFG 7 with a negative prompt, batch 1, fp32 on the
# CPU: sd-sample against diffusers' StableDiffusionPipeline (the same
# scheduler settings, a one-step warm-up) in the same run, ROUNDS rounds of
# sdtk then PyTorch, the best of each side; then the VAE decode of one
# 512x512 image (64x64 latents) against AutoencoderKL.decode the same way;
# then where sdtk's time goes: text encoder, UNet calls, sampler, decode
# (sd-sample -v), and per op class one guided UNet call (batch 2) and one
# decode (bench_sample). Both sides use THREADS threads
# (torch.set_num_threads, sd-sample -j). Model loading is not timed on
# either side. Sanity checks: the two images and the two decodes agree.
# Needs about 5 GB of memory per process, and 3.7 GB of disk for the model.
# Results: bench/RESULTS.md, "Sampling (CPU)".
# usage: bench/bench_sample.sh BUILD_DIR [THREADS] [ROUNDS] [MODEL_DIR] [STEPS]
#        (after building sd-sample and bench_sample in a Release build;
#        PYTHON, default python3, needs torch + diffusers + transformers).
#        MODEL_DIR keeps the model between runs (made there when it has no
#        unet/); without it the model goes to a temporary folder. Fewer
#        STEPS than 20 is for a machine too busy to run 20 on both sides
#        (each step is one guided UNet call, the same work at any count).
set -eu
B=$(realpath "${1:-build}")
TH=${2:-$(nproc)}
ROUNDS=${3:-2}
PY=${PYTHON:-python3}
HERE=$(dirname "$(realpath "$0")")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
M=${4:-$T/model}
STEPS=${5:-20}
mkdir -p "$M"
[ -d "$M/unet" ] || "$PY" "$HERE/bench_sample.py" make "$M" > "$T/make.log" 2>&1 || { cat "$T/make.log"; exit 1; }
"$PY" "$HERE/bench_sample.py" prompt "$STEPS" > "$T/prompts.jsonl"
echo "sd-sample, SD 1.5 architecture (random weights), 512x512, $STEPS steps DPM++ 2M, CFG 7, negative prompt, batch 1," \
    "fp32, $TH threads, $ROUNDS round(s); CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r: load average $(cut -d' ' -f1-3 /proc/loadavg)"
    "$B/tools/sd-sample" --model "$M" --prompts "$T/prompts.jsonl" -o "$T/out$r" -j "$TH" -v --no-contact-sheet \
        2> "$T/sdtk$r.log" || { cat "$T/sdtk$r.log"; exit 1; }
    grep -o 'times: .*' "$T/sdtk$r.log" | sed 's/^/sdtk /'
    echo "  load average $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" "$HERE/bench_sample.py" pipe "$M" "$TH" "$STEPS" 2> "$T/torch$r.err" | tee "$T/torch$r.txt"
    [ -s "$T/torch$r.txt" ] || { cat "$T/torch$r.err"; exit 1; }
done
"$PY" "$HERE/bench_sample.py" compare "$M/torch.png" "$T/out1/00000.png"
for r in $(seq 1 "$ROUNDS"); do
    echo "decode round $r: load average $(cut -d' ' -f1-3 /proc/loadavg)"
    "$B/bench/bench_sample" decode "$M/vae" "$M/z.f32" 64 64 "$TH" 2 "$T/sdtk_img.f32" | tee "$T/sdec$r.txt"
    "$PY" "$HERE/bench_sample.py" decode "$M" "$TH" 2 2> /dev/null | tee "$T/tdec$r.txt"
done
"$PY" "$HERE/bench_sample.py" compare "$M/torch_img.f32" "$T/sdtk_img.f32"
echo "one guided UNet call per op class: load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$B/bench/bench_sample" unet "$M/unet" 64 64 "$TH" 1
"$PY" - "$T" "$ROUNDS" << 'PY'
import re, sys
T, rounds = sys.argv[1], int(sys.argv[2])
def best(prefix, pat):
    return min(float(re.search(pat, open("%s/%s%d%s" % (T, prefix[0], r, prefix[1])).read()).group(1))
               for r in range(1, rounds + 1))
def sdtk_total(r):  # sd-sample -v: "times: text X s" and "times: UNet N calls ... Y s (...), sampler Z s, decode W s"
    log = open("%s/sdtk%d.log" % (T, r)).read()
    return sum(float(re.search(p, log).group(1)) for p in (r"times: text ([\d.]+) s", r"batch \d+ ([\d.]+) s \(",
                                                             r"sampler ([\d.]+) s", r"decode ([\d.]+) s"))
s = min(sdtk_total(r) for r in range(1, rounds + 1))
t = best(("torch", ".txt"), r"total ([\d.]+) s")
su = best(("sdtk", ".log"), r"\(([\d.]+) s each")
tu = best(("torch", ".txt"), r"\(([\d.]+) s each")
sd = best(("sdec", ".txt"), r"best ([\d.]+) s")
td = best(("tdec", ".txt"), r"best ([\d.]+) s")
print("sampling: sdtk best %.1f s, pytorch best %.1f s: ratio %.2fx (one UNet call %.2f s vs %.2f s: %.2fx)"
      % (s, t, t / s, su, tu, tu / su))
print("VAE decode: sdtk best %.2f s, pytorch best %.2f s: ratio %.2fx" % (sd, td, td / sd))
PY
