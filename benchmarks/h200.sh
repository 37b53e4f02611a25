# The H200 runs behind docs/benchmarks.md's accuracy figures, in stages that each fit one call of the device:
#
#   bash benchmarks/h200.sh OUTDIR clocks     unmarked eager loops (unmarked.py) and transformers' static-cache
#                                             compiled generate(), started plain and injected (unmodified.py)
#   bash benchmarks/h200.sh OUTDIR graphed    the compiled 8B loop marking at enqueue, five records in a row, and
#                                             the deep-KV graphed step, each beside torch.profiler (counters.py)
#
# Run from the repository root with the cp312 wheels in .whl/ (benchmarks/device_setup.sh). Each stage writes its
# JSON, its recordings and its table under OUTDIR, and prints the device, driver, date and commit first.
set -u
out=${1:?OUTDIR}
stage=${2:?clocks or graphed}
mkdir -p "$out"
. benchmarks/device_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
date -u +%FT%TZ
git rev-parse --short HEAD 2>/dev/null || cat .commit 2>/dev/null
case "$stage" in
  clocks)
    timeout 330 python3 benchmarks/unmarked.py "$out/unmarked" 2>&1 | tail -20
    timeout 220 python3 benchmarks/unmodified.py "$out/static" --cases hf_static_plain --record-s 8 2>&1 | tail -12 ;;
  graphed)
    timeout 540 python3 benchmarks/counters.py "$out/counters" \
      --cases compiled8b_marks,compiled8b_profile,kv262k_marks,kv262k_profile 2>&1 | tail -25 ;;
  *) echo "no stage $stage: clocks or graphed"; exit 2 ;;
esac
