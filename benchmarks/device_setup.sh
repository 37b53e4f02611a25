# Source on the GPU machine from the repository root, before any benchmarks/*.py. It makes the two environments a
# user has (benchmarks/harness/pythons.py), from the wheels carried in .whl/ (benchmarks/wheels.sh):
#   /tmp/engine  the engine's: the image's torch 2.11.0 and transformers (its venv's site-packages, by a .pth) and llama-cpp-python's
#                Python side; nothing of decodemon. Its `pip freeze` is written to /tmp/freeze/ before decodemon is
#                installed and right after (freeze_engine NAME writes another, after the attaches).
#   /tmp/dm      decodemon's own, by the README's GPU line: `python3 -m venv DIR && DIR/bin/pip install '.[gpu]'`
#                (--no-index --find-links .whl). The benchmarks run in it. It reads the image's numpy and yaml alone, by a
#                .pth (numpy's wheel does not fit the carry); gguf joins it for the llama.cpp benchmark's own code; its cupti-python, 13.4 libcupti and the rest are its own.
# and two folders reached by PYTHONPATH alone: /tmp/dm_marks (decodemon with no dependencies: mark_token for the loops
# that mark) and /tmp/site (the helpers' wheels: the reference PM reader, the GGUF writer). NCCL's NVLink multicast
# stays off (tensor_parallel.py).
set -uo pipefail
freeze_engine() { mkdir -p /tmp/freeze && /tmp/engine/bin/python -m pip freeze --all > "/tmp/freeze/$1.txt"; }
# the image's torch lives in a venv of its own (python3 is its python): the engine's venv reads it through a .pth
img=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
pth() { echo "$2" > "$($1 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/$3.pth"; }
if [ ! -x /tmp/engine/bin/python ]; then
  python3 -m venv /tmp/engine && pth /tmp/engine/bin/python "$img" image_torch &&
    /tmp/engine/bin/pip install -q --no-index --no-deps .whl/llama_cpp_python-*-none-*.whl .whl/diskcache-*.whl ||
    { echo "the engine's venv failed"; return 1 2>/dev/null || exit 1; }
fi
if [ ! -x /tmp/dm/bin/decodemon ]; then
  freeze_engine before_install
  # numpy (decodemon's), and yaml for the gguf reader the llama.cpp benchmark's own code uses (installed below)
  mkdir -p /tmp/dm_image && ln -sfn "$img"/numpy "$img"/numpy-*.dist-info "$img"/numpy.libs "$img"/yaml "$img"/_yaml \
    "$img"/[Pp]y[Yy][Aa][Mm][Ll]-*.dist-info /tmp/dm_image/ 2>/dev/null
  python3 -m venv /tmp/dm && pth /tmp/dm/bin/python /tmp/dm_image image_numpy && /tmp/dm/bin/pip install -q --no-index --find-links .whl '.[gpu]' >/tmp/dm_install.log 2>&1 ||
    { tail -5 /tmp/dm_install.log; echo "decodemon's own venv failed"; return 1 2>/dev/null || exit 1; }
  freeze_engine after_install
  /tmp/dm/bin/pip install -q --no-index --no-deps .whl/gguf-*.whl || echo "gguf for the benchmarks failed"
  /tmp/dm/bin/pip install -q --no-index --find-links .whl --no-deps --target /tmp/dm_marks . >/dev/null 2>&1 ||
    echo "decodemon for the marks failed"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v -e /numpy- -e /setuptools- -e /llama_cpp_python-) \
    >/dev/null 2>&1 || echo "the helpers' wheels failed"
fi
export ENGINE_PY=/tmp/engine/bin/python DM_PY=/tmp/dm/bin/python ENGINE_MARKS_PATH=/tmp/dm_marks TOOLS_PATH=/tmp/site
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export -f freeze_engine
