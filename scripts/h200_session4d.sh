#!/usr/bin/env bash
# Fourth session, last device call: slow tokens of an eager loop under default attaches, then the overhead
# benchmark, with PM decoding into a reused counter-data image (and, at the time, guard tokens remembered per
# process, since reverted: docs/benchmarks.md).
#   bash scripts/h200_session4d.sh  (H200 device machine, repo root; results under $OUT)
set -u
T0=$(date +%s)
source scripts/h200_setup.sh
timeout 150 python3 scripts/h200_slow_tokens.py /tmp/slow --attach-s 8 --plan eager > "$OUT/slow.log" 2>&1
cp /tmp/slow/slow_tokens.json "$OUT/" 2>/dev/null
echo "slow tokens done at $(( $(date +%s) - T0 )) s"
timeout 400 python3 benchmarks/overhead.py /tmp/bench --phase-s 4 --pairs 5 --long-s 20 > "$OUT/bench.log" 2>&1
cp /tmp/bench/overhead.json "$OUT/" 2>/dev/null; cp docs/benchmarks.md "$OUT/benchmarks_generated.md"
echo "bench done at $(( $(date +%s) - T0 )) s"; tail -c 1500 "$OUT/slow.log"; tail -c 2500 "$OUT/bench.log"
