#!/usr/bin/env bash
# Device call 3 (2026-11-29 afternoon): after the fixes that calls 1-2 asked for — token determinism with and
# without the probe (and without it twice), the monitor SIGKILLed mid-window in both modes with the flush-
# before-detach fix, and a 3.5-minute live pty soak of the monitor with numpy rings.
set -u
T0=$(date +%s)
source scripts/h200_setup.sh
O=${OUT:-out}; mkdir -p /tmp/det /tmp/kill /tmp/soak2
timeout 220 python3 scripts/h200_determinism.py /tmp/det/out > $O/determinism.log 2>&1
cp /tmp/det/out/determinism.json $O/ 2>/dev/null; echo "determinism done at $(( $(date +%s) - T0 )) s"
timeout 100 python3 - /tmp/kill/out > $O/sigkill.log 2>&1 <<'PY'
import json, sys
sys.path.insert(0, "scripts")
import h200_faults as f
res = {m: f.monitor_sigkilled_mid_window(m) for m in ("eager", "graph")}
print(json.dumps(res))
PY
cp $O/sigkill.log $O/sigkill.json; echo "sigkill done at $(( $(date +%s) - T0 )) s"
timeout 270 python3 scripts/h200_soak.py /tmp/soak2 --minutes 3.5 > $O/soak_short.log 2>&1
cp /tmp/soak2/soak.json $O/soak_short.json 2>/dev/null; echo "soak done at $(( $(date +%s) - T0 )) s"
tail -c 1500 $O/soak_short.log
