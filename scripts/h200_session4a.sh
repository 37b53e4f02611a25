#!/usr/bin/env bash
# Fourth session, first device call: where an eager window's cost lands, and more GPU-busy counters.
#   bash scripts/h200_session4a.sh   (on the H200 device machine, from the repo root; results under $OUT)
set -u
source scripts/h200_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia_smi.csv"
timeout 300 python3 scripts/h200_window_costs.py "$OUT/window" --reps 8 --gap 30 > "$OUT/window.log" 2>&1
timeout 240 python3 scripts/h200_busy_metrics.py "$OUT/busy" --no-identity --candidates \
  gr__compute_cycles_active.avg,gr__compute_cycles_active.max,gr__compute_cycles_active_queue_sync.avg,gr__compute_cycles_active_queue_async.avg,fe__cycles_active.avg,gpu__cycles_active.avg,sys__cycles_active.avg,gr__dispatch_count.sum,gr__ctas_launched.sum,tpc__cycles_active.max \
  > "$OUT/busy.log" 2>&1
tail -c 3000 "$OUT/window.log"; tail -c 1500 "$OUT/busy.log"
