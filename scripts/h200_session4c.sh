#!/usr/bin/env bash
# Fourth session, fourth device call: what PM sampling's interval costs an eager loop (pump decode time, slow
# tokens), PM only and with defaults.   bash scripts/h200_session4c.sh  (H200 device machine, repo root)
set -u
source scripts/h200_setup.sh
timeout 400 python3 scripts/h200_slow_tokens.py /tmp/slow --attach-s 10 --plan pm > "$OUT/slow.log" 2>&1
cp /tmp/slow/slow_tokens.json "$OUT/" 2>/dev/null
tail -c 4000 "$OUT/slow.log"
