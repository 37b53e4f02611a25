"""The agent's first attach brings cupti-python in without holding the GIL through library loads (probes/preload.py)
and paces its Python work (held.Pacer)."""

from __future__ import annotations

import ctypes.util
import importlib.util
import subprocess
import sys
import time

import pytest

from decodemon.probes import held, preload


def test_pacer_sleeps_in_proportion_to_the_cpu_spent():
    slept = []
    p = held.Pacer(4.0, min_s=0.001, sleep=slept.append)
    p()  # nothing done since it was made: the floor
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.02:  # 20 ms of this thread's CPU
        pass
    p()
    assert slept[0] == pytest.approx(0.001, abs=0.001)
    assert 0.07 <= slept[1] <= 0.2  # 4 x 20 ms and a little more
    assert p.slept_s == pytest.approx(sum(slept))


def test_a_library_loads_without_the_gil_and_counts_as_loaded():
    lib = ctypes.util.find_library("m") or "libm.so.6"
    assert preload.load_without_gil(lib)
    assert not preload.load_without_gil("/nonexistent/libnothing.so")


def test_paced_imports_pause_before_every_module_this_thread_loads():
    code = (
        "import sys, threading\n"
        "from decodemon.probes import preload\n"
        "n = []\n"
        "with preload.PacedImports(sleep=n.append) as p:\n"
        "    import xml.dom.minidom, wave\n"
        "assert p not in sys.meta_path\n"
        "got = []\n"
        "def other():\n"
        "    import tabnanny\n"
        "with preload.PacedImports(sleep=got.append):\n"
        "    t = threading.Thread(target=other); t.start(); t.join()\n"
        "print(len(n), len(got))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    mine, others = map(int, out.stdout.split())
    assert mine >= 4  # xml, xml.dom, xml.dom.minidom, wave and their needs
    assert others == 0  # another thread's imports are not delayed


@pytest.mark.skipif(importlib.util.find_spec("cupti") is None, reason="cupti-python not installed")
def test_preload_leaves_cupti_imported():
    code = ("import sys\nfrom decodemon.probes import preload\nspent = preload.preload_cupti()\n"
            "print(sorted(spent), 'cupti.cupti' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("]")[0] + "]" == "['import', 'load']"
    assert out.stdout.strip().endswith("True")
    assert preload.cupti_package_libraries()  # the package's Cython modules, found to be loaded first


PROGRAM = ("import sys, threading, time\n"
           "deadline = time.time() + 60\n"
           "while any(t.name == 'dm-preload' for t in threading.enumerate()) and time.time() < deadline:\n"
           "    time.sleep(0.1)\n"
           "maps = open('/proc/self/maps').read()\n"
           "print('cupti.cupti' in sys.modules, '/cupti/_internal/cupti.cpython' in maps)\n")


@pytest.mark.parametrize("preload", ["1", "0"])
def test_decodemon_run_loads_cuptis_libraries_while_the_program_starts(preload):
    """Under `decodemon run` the agent loads cupti-python's libraries in a background thread at start (where it is
    installed), so no attach loads them into a loop already decoding; their import waits for the first attach, so
    it never races the program's own imports; DECODEMON_PRELOAD=0 leaves it all out."""
    import os

    from tests.conftest import cli

    r = cli("run", "--", sys.executable, "-c", PROGRAM, env={**os.environ, "DECODEMON_PRELOAD": preload}, timeout=120)
    assert r.returncode == 0, r.stderr
    has_cupti = importlib.util.find_spec("cupti") is not None
    assert r.stdout.split() == ["False", str(has_cupti and preload == "1")]
