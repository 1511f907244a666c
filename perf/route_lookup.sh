#!/usr/bin/env bash
# The route table's per-packet calls, this tree's csrc/routes.c against an
# older one's, on the same table: perf/route_lookup.c built twice with the
# extension's flags (gcc -O2), then run in turns (old, new, old, new, ...) so
# that a busy neighbour on a shared machine slows both alike.
#
#   perf/route_lookup.sh [ROUNDS] [NROUTES...]   (defaults: 9 rounds; 256 and 4096 routes)
#
# Environment: OLD (default f8c2acc, the last commit with one lookup per
# family), SECONDS_PER (timing of each call kind in one run, default 0.2).
# Prints, per table size and call kind, the median ns per call of each side
# and the spread (min..max) over the rounds; about ROUNDS * 2 * 0.6 s per size.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
old="${OLD:-f8c2acc}"
rounds="${1:-9}"
shift || true
sizes=("${@:-256 4096}")
per="${SECONDS_PER:-0.2}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/old"
for f in routes.c internal.h dataplane.h; do
    git -C "$root" show "$old:csrc/$f" > "$work/old/$f"
done
flags=(-O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter)
gcc "${flags[@]}" -DOLD_API -I"$work/old" "$here/route_lookup.c" "$work/old/routes.c" -o "$work/rl-old"
gcc "${flags[@]}" -I"$root/csrc" "$here/route_lookup.c" "$root/csrc/routes.c" -o "$work/rl-new"

for n in ${sizes[*]}; do
    : > "$work/runs"
    for ((r = 0; r < rounds; r++)); do
        for side in old new; do
            echo "$side $("$work/rl-$side" "$n" "$per")" >> "$work/runs"
        done
    done
    python3 - "$n" "$work/runs" <<'EOF'
import statistics, sys
n, path = sys.argv[1], sys.argv[2]
runs = {"old": [], "new": []}
for line in open(path):
    w = line.split()
    runs[w[0]].append({w[i]: float(w[i + 1]) for i in (1, 3, 5)})
for kind in ("v4", "v6", "peer4"):
    cells = []
    for side in ("old", "new"):
        xs = [r[kind] for r in runs[side]]
        cells.append(f"{side} {statistics.median(xs):6.2f} ns ({min(xs):.2f}..{max(xs):.2f})")
    ratio = statistics.median(r[kind] for r in runs["new"]) / \
        statistics.median(r[kind] for r in runs["old"])
    print(f"{n:>6} routes {kind:<6} " + "   ".join(cells) + f"   new/old {ratio:.2f}")
EOF
done
