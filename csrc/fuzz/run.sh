#!/usr/bin/env bash
# Build fuzz_packet with libFuzzer + ASan + UBSan and run it, bounded.
#
#   csrc/fuzz/run.sh [SECONDS] [RUNS]      (defaults: 20 s, 2000000 runs)
#   csrc/fuzz/run.sh gso [SECONDS] [RUNS]  fuzz_gso.c (csrc/gso.c) instead;
#                                          its seeds: tests/unit/test_fuzz_gso.py
#
# Environment: CC (default clang), FUZZ_OUT (build and work directory,
# default build/fuzz). The seed corpus csrc/fuzz/corpus/ is only read: new
# inputs go to $FUZZ_OUT/work, a crash to $FUZZ_OUT/crash-*. A crash found
# here becomes a regression input: copy it to csrc/fuzz/corpus/regress-NAME
# and name it in tests/unit/test_fuzz_c.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
csrc="$(dirname "$here")"
if [ "${1:-}" = gso ]; then
    shift
    out="${FUZZ_OUT:-$(dirname "$csrc")/build/fuzz}"
    mkdir -p "$out/work-gso"
    "${CC:-clang}" -g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-parameter \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$csrc" "$here/fuzz_gso.c" "$csrc/gso.c" "$csrc/packet.c" -o "$out/fuzz_gso"
    exec "$out/fuzz_gso" -max_total_time="${1:-20}" -runs="${2:-2000000}" -max_len=70000 \
        -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$out/" "$out/work-gso"
fi
seconds="${1:-20}"
runs="${2:-2000000}"
cc="${CC:-clang}"
out="${FUZZ_OUT:-$(dirname "$csrc")/build/fuzz}"
mkdir -p "$out/work"

# -fno-sanitize-recover: a UBSan report aborts the run like an ASan one.
"$cc" -g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-parameter \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$csrc" "$here/fuzz_packet.c" "$csrc/path.c" "$csrc/packet.c" "$csrc/gro.c" \
    "$csrc/routes.c" "$csrc/trace.c" -o "$out/fuzz_packet"

# Every seed and regression input once, then the bounded search.
"$out/fuzz_packet" "$here"/corpus/*
exec "$out/fuzz_packet" -max_total_time="$seconds" -runs="$runs" -max_len=8192 \
    -rss_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$out/" \
    "$out/work" "$here/corpus"
