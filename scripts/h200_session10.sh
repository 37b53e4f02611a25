#!/usr/bin/env bash
# Tenth session, one device call: are cupti-python's records safe to read after the finalize (the tracer now reads
# them on the agent thread), then the overhead benchmark at the new defaults.
#   run on the H200 from the repo root, with OUT set: bash scripts/h200_session10.sh
set -u
source scripts/h200_setup.sh > /dev/null 2>&1
python3 scripts/h200_record_lifetime.py "$OUT" --windows 6 > "$OUT/lifetime.log" 2>&1
if grep -q '"same_after_finalize": false\|"survived": false' "$OUT/record_lifetime.json" 2>/dev/null \
        || [ ! -s "$OUT/record_lifetime.json" ]; then
    echo "records do not outlive the finalize: no benchmark"; exit 3
fi
timeout 520 python3 benchmarks/overhead.py "$OUT" --phase-s 4 --pairs 5 --long-s 20 --eager-pairs 9 \
    --modes eager,graph > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
cp docs/benchmarks.md "$OUT/benchmarks_generated.md"
