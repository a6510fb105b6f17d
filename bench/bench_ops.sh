#!/bin/bash
# Per-layer ms of the engine's heavy CPU ops (conv, linear, attention) on the SD-VAE
# encoder's representative layers at 512x512, vs PyTorch CPU fp32 (oneDNN convs) in the
# same run: ROUNDS rounds alternating sdtk and torch at 2 threads then 1 thread, each
# number the best of REPEATS; the table shows the best over rounds (the VM is shared, so
# single runs vary by ~15%). --bwd adds backward; --cpu times 1 thread only, by the
# computing thread's CPU time (steady while other jobs load the machine).
# Needs: pip install torch. Usage: bench/bench_ops.sh [BUILD_DIR] [ROUNDS] [REPEATS] [--bwd] [--cpu]
# Results: bench/RESULTS.md, "CPU ops".
set -eu
build=${1:-build}; rounds=${2:-3}; reps=${3:-3}; shift $(( $# < 3 ? $# : 3 ))
flags=""; threads="2 1"
for a in "$@"; do
  case "$a" in
    --bwd) flags="$flags --bwd" ;;
    --cpu) flags="$flags --cpu"; threads=1 ;;
    *) echo "bench_ops.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  for t in $threads; do
    "$build/bench/bench_ops" "$t" "$reps" $flags > "$tmp/sdtk.$t.$r"
    python3 "$here/bench_ops_torch.py" "$t" "$reps" $flags > "$tmp/torch.$t.$r"
  done
  echo "round $r done" >&2
done
python3 - "$tmp" "$rounds" "$threads" "$flags" <<'PY'
import glob, re, sys
d, rounds, threads, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
def best(who, t):
    """layer -> {'fwd': ms, 'bwd': ms}, the minimum over rounds."""
    out = {}
    for f in sorted(glob.glob(f"{d}/{who}.{t}.*")):
        for line in open(f):
            name = line[:26].strip()
            for kind, ms in re.findall(r"(fwd|bwd)\s+([0-9.]+) ms", line[26:]):
                cur = out.setdefault(name, {}).get(kind)
                out[name][kind] = min(cur, float(ms)) if cur is not None else float(ms)
    return out
for t in threads:
    s, p = best("sdtk", t), best("torch", t)
    clock = "CPU ms" if "--cpu" in flags else "ms"
    print(f"\n{t} thread(s), best of {rounds} rounds: {clock} (x = torch/sdtk, the speed-up)")
    print(f"{'layer':26s} {'sdtk fwd':>9s} {'torch fwd':>9s} {'x':>5s}" + ("  {:>9s} {:>9s} {:>5s}".format("sdtk bwd", "torch bwd", "x") if any('bwd' in v for v in s.values()) else ""))
    tot = [0.0, 0.0]
    for name, v in s.items():
        tv = p.get(name, {})
        line = f"{name:26s} {v['fwd']:9.1f} {tv.get('fwd', float('nan')):9.1f} {tv.get('fwd', float('nan')) / v['fwd']:5.2f}"
        tot[0] += v['fwd']; tot[1] += tv.get('fwd', 0.0)
        if 'bwd' in v:
            line += f"  {v['bwd']:9.1f} {tv.get('bwd', float('nan')):9.1f} {tv.get('bwd', float('nan')) / v['bwd']:5.2f}"
        print(line)
    print(f"{'sum of forwards':26s} {tot[0]:9.1f} {tot[1]:9.1f} {tot[1] / tot[0]:5.2f}")
PY
