# The H200 runs behind docs/benchmarks.md's accuracy figures, in stages that each fit one call of the device:
#
#   bash benchmarks/h200.sh OUTDIR unmarked   eager loops that mark nothing, three records each (unmarked.py)
#   bash benchmarks/h200.sh OUTDIR static     transformers' static-cache compiled generate(), started plain and
#                                             injected (unmodified.py)
#   bash benchmarks/h200.sh OUTDIR graphed    the compiled 8B loop marking at enqueue, five records in a row, and
#                                             the deep-KV graphed step, each beside torch.profiler (counters.py;
#                                             CASES=a,b picks some)
#
# Run from the repository root with the cp312 wheels in .whl/ (benchmarks/device_setup.sh). Each stage writes its
# table, and OUTDIR/STAGE.tgz with its JSON and recordings; it prints the device, driver, date and commit first.
set -uo pipefail
out=${1:?OUTDIR}
stage=${2:?unmarked, static or graphed}
mkdir -p "$out"
. benchmarks/device_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
date -u +%FT%TZ
echo "commit ${COMMIT:-unknown}"
case "$stage" in
  unmarked)
    timeout 330 python3 benchmarks/unmarked.py "$out/unmarked" 2>&1 | tail -12 ;;
  static)
    timeout 220 python3 benchmarks/unmodified.py "$out/static" --cases hf_static_plain --record-s 8 2>&1 | tail -12 ;;
  graphed)
    timeout 420 python3 benchmarks/counters.py "$out/graphed" --cases "${CASES:-compiled8b_marks,compiled8b_profile,kv262k_marks,kv262k_profile}" 2>&1 | tail -25 ;;
  *) echo "no stage $stage: unmarked, static or graphed"; exit 2 ;;
esac
# what comes back from a device is a few files: the stage's recordings and JSON in one archive, its logs left out
(cd "$out" && tar czf "$stage.tgz" --exclude='*.events*' --exclude='*.log' --exclude='*.out' "$stage" && rm -rf "$stage")
