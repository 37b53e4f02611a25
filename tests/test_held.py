"""probes/held.py: the agent's short calls made keeping the GIL, and their fallbacks (`--probe hold_gil=false`)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from decodemon.probes import held


@pytest.fixture(params=[True, False], ids=["held", "released"])
def enabled(request, monkeypatch):
    monkeypatch.setattr(held, "ENABLED", request.param)
    return request.param


def test_reader_reads_a_non_blocking_pipe_as_os_read_would(enabled):
    r, w = os.pipe()
    os.set_blocking(r, False)
    rd = held.Reader(8)
    with pytest.raises(BlockingIOError):
        rd.read(r)  # nothing there yet
    os.write(w, b"0123456789ab")
    assert rd.read(r) == b"01234567"  # at most the reader's size
    assert rd.read(r) == b"89ab"
    os.close(w)
    assert rd.read(r) == b""  # the writer has gone
    os.close(r)
    with pytest.raises(OSError):
        rd.read(r)


def test_reader_preads_a_file_from_an_offset(enabled, tmp_path):
    f = tmp_path / "status"
    f.write_bytes(b"voluntary_ctxt_switches:\t42\n")
    fd = os.open(f, os.O_RDONLY)
    try:
        rd = held.Reader(4096)
        assert rd.pread(fd, 0) == rd.pread(fd, 0) == f.read_bytes()  # the same bytes every time (no seek)
        assert rd.pread(fd, 10) == f.read_bytes()[10:]
    finally:
        os.close(fd)


def test_send_sends_what_the_socket_takes_and_says_when_the_peer_has_gone(enabled):
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    data = bytearray(range(256)) * 64
    assert held.send(mine, memoryview(data)[:100]) == 100
    assert held.send(mine, memoryview(b"read-only bytes")) == 15
    sent = 0
    with pytest.raises(BlockingIOError):  # a full socket: as a non-blocking socket.send would
        while True:
            sent += held.send(mine, memoryview(data))
    assert sent > 0
    theirs.close()
    with pytest.raises(OSError):  # EPIPE or ECONNRESET, and no SIGPIPE for the process
        held.send(mine, memoryview(b"x"))
    mine.close()


@pytest.mark.timing
def test_a_held_read_keeps_the_gil_and_a_released_one_does_not():
    """A read that blocks 0.3 s (the writer is another process): while it is held, no other thread of this process
    runs Python; with the calls released (hold_gil=false) another thread runs all along."""
    ticks = {}
    for hold in (True, False):
        held.ENABLED = hold
        try:
            r, w = os.pipe()
            writer = subprocess.Popen([sys.executable, "-c", "import os, sys, time; time.sleep(0.3); "
                                       "os.write(int(sys.argv[1]), b'x')", str(w)], pass_fds=(w,))
            os.close(w)
            time.sleep(0.05)  # the writer started (it sleeps 0.3 s before it writes)
            box = {}

            def read():
                box["t0"] = time.perf_counter()
                box["got"] = held.Reader(16).read(r)
                box["t1"] = time.perf_counter()

            th = threading.Thread(target=read)
            seen = []
            th.start()
            while th.is_alive():
                seen.append(time.perf_counter())
            writer.wait(10)
            os.close(r)
        finally:
            held.ENABLED = True
        assert box["got"] == b"x" and box["t1"] - box["t0"] > 0.1, box
        inside = [box["t0"], *(t for t in seen if box["t0"] < t < box["t1"]), box["t1"]]
        # the longest stretch this thread ran no Python while the read was under way: a held read blocks in C with
        # the GIL, so it spans the read, less the moments before the reading thread took the GIL back (a busy
        # machine can delay that)
        ticks[hold] = (len(inside) - 2, max(b - a for a, b in zip(inside, inside[1:])), box["t1"] - box["t0"])
    n, gap, took = ticks[True]
    assert gap > 0.5 * took, ticks  # the GIL stayed with the reading thread
    n, gap, took = ticks[False]
    assert n > 1000 and gap < 0.5 * took, ticks  # released, this thread ran Python all along


_STUB_HELD_CHECK = r"""
import ctypes, json, sys, threading, time
d = sys.argv[1]
ctypes.CDLL(d + "/libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
stub = ctypes.CDLL(d + "/libcupti.so.13", mode=ctypes.RTLD_GLOBAL)
from decodemon.probes import held, pm_inproc
fns = held.cupti_functions(pm_inproc.HELD_CALLS)
out = {"found": sorted(fns)}
for name, fn in fns.items():
    box = {}
    def run():
        box["t0"] = time.perf_counter()
        try:
            held.call(fn, name, 0)
            box["err"] = None
        except held.CuptiError as e:
            box["err"] = e.code
        box["t1"] = time.perf_counter()
    th = threading.Thread(target=run); th.start()
    ticks = []
    while th.is_alive():
        ticks.append(time.monotonic())
    # the stub stamps its own entry and exit (CLOCK_MONOTONIC, time.monotonic's clock): ticks are counted while the
    # C call ran, not from when the thread asked for it (a busy machine can delay its taking the GIL back)
    c_name = pm_inproc.HELD_CALLS[name]
    t_in, t_out = (ctypes.c_double.in_dll(stub, f"{edge}_{c_name}").value for edge in ("entered", "left"))
    out[name] = (round(box["t1"] - box["t0"], 3), sum(t_in + 0.005 < t < t_out - 0.005 for t in ticks),
                 box["err"], round(t_out - t_in, 3))
print(json.dumps(out))
"""


@pytest.mark.timing
def test_the_held_libcupti_calls_are_the_ones_cupti_python_makes_and_keep_the_gil(tmp_path):
    """Against a stub libcupti whose functions sleep 0.2 s: held.cupti_functions finds the pump's short calls
    through cupti-python's own function pointers, each keeps the GIL (no other thread runs Python during it), and
    a CUPTI error code comes back as CuptiError. (tests/test_agent.py shows cupti-python's wrappers of the same
    functions let the GIL go.)"""
    pytest.importorskip("cupti")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stub libcupti")
    from decodemon.probes import pm_inproc

    codes = {"cuptiPmSamplingCounterDataGetSampleInfo": 0, "cuptiProfilerHostEvaluateToGpuValues": 0,
             "cuptiPmSamplingGetCounterDataInfo": 17}
    assert set(codes) == set(pm_inproc.HELD_CALLS.values())
    (tmp_path / "cuda.c").write_text("int cuDriverGetVersion(int *v) { *v = 13020; return 0; }\n")
    stamp = ("#include <time.h>\n#include <unistd.h>\n"
             "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); "
             "return t.tv_sec + 1e-9 * t.tv_nsec; }\n")
    (tmp_path / "cupti.c").write_text(stamp + "".join(
        f"double entered_{fn}, left_{fn};\n"
        f"int {fn}(void *p) {{ entered_{fn} = now(); usleep(200000); left_{fn} = now(); return {code}; }}\n"
        for fn, code in codes.items()))
    for src, lib in (("cuda.c", "libcuda.so.1"), ("cupti.c", "libcupti.so.13")):
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / lib), f"-Wl,-soname,{lib}",
                        str(tmp_path / src)], check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-c", _STUB_HELD_CHECK, str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-800:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["found"] == sorted(pm_inproc.HELD_CALLS)
    for name, c_name in pm_inproc.HELD_CALLS.items():
        took, ticks, err, in_c = res[name]
        assert took >= 0.19 and in_c >= 0.19, (name, took, in_c)  # the stub was called
        assert ticks == 0, (name, ticks)  # and nothing else ran Python meanwhile
        assert err == (codes[c_name] or None), (name, err)


def test_no_cupti_means_no_held_functions(monkeypatch):
    """Without cupti-python's internals (or its library), the pump goes through cupti-python's wrappers."""
    monkeypatch.setitem(sys.modules, "cupti._internal", None)
    assert held.cupti_functions({"x": "cuptiX"}) == {}


def test_a_slicer_gives_the_gil_up_once_per_slice_of_held_calls():
    s = held.Slicer(0.01)
    t_end = time.perf_counter() + 0.1
    n = 0
    while time.perf_counter() < t_end:
        s.tick()
        n += 1
    assert n > 100 and 3 <= s.handbacks <= 11, (n, s.handbacks)  # ~10 in 0.1 s, not one per call


class _P:
    ptr = 1234


def test_the_pump_makes_its_short_calls_held_and_its_decode_through_cupti_python(monkeypatch):
    """PmSampler._call: a HELD_CALLS call goes to the held function (its time is the pump's own CPU, not counted
    as GIL-free); decode_data, and every call with the calls released (`--probe hold_gil=false`), go through cupti-python."""
    from decodemon.probes.pm_inproc import HELD_CALLS, PmSampler

    made = []

    class Wrappers:  # cupti-python's module
        def __getattr__(self, name):
            return lambda ptr: made.append(("wrapper", name, ptr))

    pm = object.__new__(PmSampler)
    pm._c, pm._free_s = Wrappers(), 0.0
    pm._held = {n: (lambda n: lambda ptr: made.append(("held", n, ptr)) or 0)(n) for n in HELD_CALLS}
    monkeypatch.setattr(held, "ENABLED", True)
    pm._call("profiler_host_evaluate_to_gpu_values", _P())
    pm._call("pm_sampling_decode_data", _P())
    assert made == [("held", "profiler_host_evaluate_to_gpu_values", 1234),
                    ("wrapper", "pm_sampling_decode_data", 1234)]
    made.clear()
    monkeypatch.setattr(held, "ENABLED", False)
    pm._call("profiler_host_evaluate_to_gpu_values", _P())
    assert made == [("wrapper", "profiler_host_evaluate_to_gpu_values", 1234)]
    pm._held = {"profiler_host_evaluate_to_gpu_values": lambda ptr: 999}
    monkeypatch.setattr(held, "ENABLED", True)
    with pytest.raises(held.CuptiError, match="CUPTI error 999"):
        pm._call("profiler_host_evaluate_to_gpu_values", _P())
