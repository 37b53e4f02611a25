"""The sidecar's PM sampler maps one libcupti, the newest nvidia-cuda-cupti wheel's, before anything can map another
of the same soname (on an H200 PM armed with 13.4 and failed with every 13.0 library loaded first); a libcupti
someone else mapped first is named, not used blindly. Run in fresh interpreters: what a process has mapped is the
subject."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from decodemon.monitor.counters import libcupti as cupti_lib

PROBE = """
import json
from decodemon.monitor.counters import libcupti as cupti_lib
lib, why = cupti_lib.load_newest()
import cupti.pm_sampling  # cupti-python then finds the library already mapped by its soname
print(json.dumps({"lib": lib.path if lib else None, "why": why, "maps": cupti_lib.loaded(),
                  "check": cupti_lib.check()}))
"""


def _run(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_newest_wheels_libcupti_is_the_one_mapped_and_cupti_python_uses_it():
    found = cupti_lib.candidates()
    if not found:
        pytest.skip("no nvidia-cuda-cupti wheel installed")
    out = _run(PROBE)
    assert out["why"] == "" and out["lib"] == found[0].path
    assert out["maps"] == [found[0].path] and out["check"] == ""


def test_a_libcupti_mapped_before_the_choice_is_named_with_why_it_is_not_used(tmp_path):
    found = cupti_lib.candidates()
    if not found:
        pytest.skip("no nvidia-cuda-cupti wheel installed")
    other = tmp_path / "toolkit" / "libcupti.so.13"  # a libcupti outside any wheel (a CUDA toolkit's, say)
    other.parent.mkdir()
    shutil.copy(found[0].path, other)
    out = _run(f"import ctypes, os; ctypes.CDLL({str(other)!r}, mode=os.RTLD_GLOBAL)\n" + PROBE)
    assert out["lib"] == str(other) and "was loaded before decodemon could choose" in out["why"]
    assert "13.4 or newer" in out["why"]
