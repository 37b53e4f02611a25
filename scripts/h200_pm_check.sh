#!/usr/bin/env bash
# Device call: one eager demo engine, one default attach (--json); checks PM samples arrive and says the pump's CPU.
#   bash scripts/h200_pm_check.sh
set -u
source scripts/h200_setup.sh
O=${OUT:-out}
python3 -m decodemon.monitor.cli run --pid-file /tmp/dm.pid -- python3 -m decodemon.engine_adapter.demo --mode eager \
  --tokens 0 > /dev/null 2> /tmp/eng.err &
for i in $(seq 120); do grep -q decoding /tmp/eng.err 2>/dev/null && break; sleep 0.5; done
python3 -m decodemon.monitor.cli attach "$(cat /tmp/dm.pid)" --json --seconds 5 > $O/attach.json 2> $O/attach.err
echo "attach rc=$?"
kill -TERM "$(cat /tmp/dm.pid)"; wait
python3 - "$O/attach.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print({k: d.get(k) for k in ("pm_gpu_busy_pct", "kernel_share_of_step_pct", "launches_per_token", "windows")})
print({k: v for k, v in (d.get("probe") or {}).items() if k.startswith("pm") or k == "errors"})
PY
