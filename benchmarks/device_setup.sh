# Sourced by the H200 device scripts (run from the repo root): installs the carried wheels and decodemon.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1 || { echo "editable install failed"; exit 1; }
