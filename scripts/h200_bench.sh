#!/usr/bin/env bash
# Device call: the overhead benchmark alone (both modes), copied back with the markdown it writes.
#   bash scripts/h200_bench.sh [more overhead.py options, e.g. --modes eager --pairs 9]
set -u
T0=$(date +%s)
source scripts/h200_setup.sh
O=${OUT:-out}
timeout 540 python3 benchmarks/overhead.py /tmp/bench --phase-s 4 --pairs 5 --long-s 20 "$@" > $O/bench.log 2>&1
cp /tmp/bench/overhead.json $O/ 2>/dev/null; cp docs/benchmarks.md $O/benchmarks_generated.md
echo "bench done at $(( $(date +%s) - T0 )) s"; tail -c 3000 $O/bench.log
