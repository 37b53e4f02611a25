# Source on the GPU machine from the repository root, before any benchmarks/*.py: installs the wheels carried in
# .whl/ (what the machine's image lacks: cupti-python, msgspec, textual and theirs) into /tmp/site, then decodemon
# itself, editable. NCCL's NVLink multicast stays off (tensor_parallel.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# decodemon's children run `python -I` (no PYTHONPATH): the wheels reach them through a .pth in the site-packages
echo /tmp/site > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/decodemon_wheels.pth"
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1 || { echo "editable install failed"; exit 1; }
