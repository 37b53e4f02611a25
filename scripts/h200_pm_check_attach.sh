#!/bin/bash
# One eager demo engine, two default attaches (`attach --json`), their PM lines printed: does PM sampling stay armed,
# lose nothing and agree with the traced window, and what does a pump's image reset cost (pm_cpu)?
#   bash scripts/h200_pm_check_attach.sh OUTDIR [SECONDS]   (after `source scripts/h200_setup.sh` on the H200)
set -u
out=${1:?OUTDIR}; secs=${2:-8}; mkdir -p "$out"
python3 -m decodemon.monitor.cli run --pid-file "$out/pid" -- python3 -m decodemon.engine_adapter.demo --mode eager \
  --tokens 0 >/dev/null 2>"$out/engine.err" &
for _ in $(seq 600); do grep -q decoding "$out/engine.err" 2>/dev/null && break; sleep 0.3; done
pid=$(cat "$out/pid"); sleep 2
for k in 1 2; do
  python3 -m decodemon.monitor.cli attach "$pid" --json --seconds "$secs" > "$out/attach$k.json" 2>"$out/attach$k.err"
  python3 - "$out/attach$k.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def find(o, keys, path=""):
    if isinstance(o, dict):
        for k, v in o.items():
            if k in keys:
                print(f"{path}{k}: {v}")
            find(v, keys, path + k + ".")
find(d, {"pm", "pm_lost", "pm_cpu", "pm_vs_window", "launches_per_token"})
PY
done
kill "$pid"; wait
