#!/bin/sh
# Build the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and run
# each for SECONDS (default 60) on a scratch copy of its seed corpus, so the
# repository's corpus is not touched. Crash reproducers land in
# build-fuzz/artifacts/; copy the ones worth keeping to tests/fuzz/regress_*/.
# Usage: scripts/fuzz.sh [SECONDS]   (env: CC, default clang; SDTK_FUZZ_TARGETS="image tar" runs only those)
set -eu
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
CC=${CC:-clang} cmake -S "$root" -B "$build" -DSDTK_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug -DSDTK_CUDA=OFF -DSDTK_MPI=OFF \
    -DCMAKE_C_FLAGS="$san" >/dev/null
cmake --build "$build" -j2 --target fuzz_booru fuzz_tar fuzz_npz fuzz_shardrec fuzz_safetensors fuzz_image fuzz_config fuzz_caption fuzz_bucketrec fuzz_rules fuzz_kohyamatch fuzz_shardpages fuzz_tokjson >/dev/null
mkdir -p "$build/artifacts"
status=0
# run TARGET PROGRAM ARGS...: the caption target under fuzz_caption.sh, which
# provides the CLIP vocabulary; the others as they are
run() {
    if [ "$1" = caption ]; then
        shift
        bash "$root/tests/fuzz/fuzz_caption.sh" "$@"
    else
        shift
        "$@"
    fi
}
for t in ${SDTK_FUZZ_TARGETS:-booru tar npz shardrec safetensors image config caption bucketrec rules kohyamatch shardpages tokjson}; do
    case $t in booru | shardrec | safetensors | config | caption | bucketrec | rules | kohyamatch) max=4096 ;; tar | npz | image | shardpages | tokjson) max=65536 ;; esac
    scratch=$build/corpus_$t
    rm -rf "$scratch"
    cp -r "$root/tests/fuzz/corpus_$t" "$scratch"
    echo "== fuzz_$t for ${secs}s (max_len $max)"
    run "$t" "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -max_len="$max" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$t-" "$scratch" 2>&1 | grep -E '^(#[0-9]+.*DONE|stat::|==[0-9]+==ERROR|SUMMARY|artifact)' || status=1
done
exit $status
