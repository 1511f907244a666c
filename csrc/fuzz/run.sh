#!/usr/bin/env bash
# Build a libFuzzer target with ASan + UBSan and run it, bounded.
#
#   csrc/fuzz/run.sh [SECONDS] [RUNS]        fuzz_packet.c (defaults: 20 s, 2000000 runs)
#   csrc/fuzz/run.sh gso [SECONDS] [RUNS]    fuzz_gso.c (gso.c); seeds: tests/unit/test_fuzz_gso.py
#   csrc/fuzz/run.sh train [SECONDS] [RUNS]  fuzz_train.c (train.c); seeds: tests/unit/test_fuzz_train.py
#
# Environment: CC (default clang), FUZZ_OUT (build and work directory,
# default build/fuzz). The seed corpus csrc/fuzz/corpus/ is only read: new
# inputs go to $FUZZ_OUT/work*, a crash to $FUZZ_OUT/crash-*. A crash found
# by fuzz_packet becomes a regression input: copy it to
# csrc/fuzz/corpus/regress-NAME and name it in tests/unit/test_fuzz_c.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
csrc="$(dirname "$here")"
out="${FUZZ_OUT:-$(dirname "$csrc")/build/fuzz}"

# Every target links the engine's files without I/O: those csrc/sources.txt marks pure.
pure=()
while read -r file kind _; do
    if [ "${kind:-}" = pure ]; then pure+=("$csrc/$file"); fi
done < <(sed 's/#.*//' "$csrc/sources.txt")

# -fno-sanitize-recover: a UBSan report aborts the run like an ASan one.
build() {   # target
    "${CC:-clang}" -g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-parameter \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$csrc" "$here/$1.c" "${pure[@]}" -o "$out/$1"
}

case "${1:-}" in
gso|train)
    target="fuzz_$1"
    shift
    mkdir -p "$out/work-$target"
    build "$target"
    exec "$out/$target" -max_total_time="${1:-20}" -runs="${2:-2000000}" -max_len=70000 \
        -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$out/" "$out/work-$target"
    ;;
esac

mkdir -p "$out/work"
build fuzz_packet
# Every seed and regression input once, then the bounded search.
"$out/fuzz_packet" "$here"/corpus/*
exec "$out/fuzz_packet" -max_total_time="${1:-20}" -runs="${2:-2000000}" -max_len=8192 \
    -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$out/" \
    "$out/work" "$here/corpus"
