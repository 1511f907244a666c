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

# -fno-sanitize-recover: a UBSan report aborts the run like an ASan one.
build() {   # target, then the csrc files it links
    local target="$1"
    shift
    "${CC:-clang}" -g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-parameter \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$csrc" "$here/$target.c" "${@/#/$csrc/}" -o "$out/$target"
}

case "${1:-}" in
gso|train)
    target="fuzz_$1"
    shift
    mkdir -p "$out/work-$target"
    if [ "$target" = fuzz_gso ]; then build fuzz_gso gso.c packet.c; else build fuzz_train train.c; fi
    exec "$out/$target" -max_total_time="${1:-20}" -runs="${2:-2000000}" -max_len=70000 \
        -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$out/" "$out/work-$target"
    ;;
esac

mkdir -p "$out/work"
build fuzz_packet path.c packet.c gro.c routes.c trace.c local.c
# Every seed and regression input once, then the bounded search.
"$out/fuzz_packet" "$here"/corpus/*
exec "$out/fuzz_packet" -max_total_time="${1:-20}" -runs="${2:-2000000}" -max_len=8192 \
    -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$out/" \
    "$out/work" "$here/corpus"
