"""decodemon's CUPTI injection library (probes/cupti_inject/decodemon_cupti.c), for processes with no Python.

Built here with the C compiler as `decodemon run` builds it; its frames are read with the monitor's own decoder.
With no GPU, it answers on the wire from real processes it is loaded into (`sleep`, and a real llama-server):
DECODEMON_CUPTI_START_AT_LOAD starts it where no cuInit ever will, and CUPTI's refusal comes back as the trace's
state. The windows a GPU gives are encoded by the function the live path calls, from kernel rows given here."""

from __future__ import annotations

import ctypes
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodemon.monitor.sources.live import live_frames
from decodemon.monitor.inject import cupti_lib
from decodemon.monitor.session import Session
from decodemon.probes import wire
from tests.conftest import cli

KCOLS = 16


@pytest.fixture(scope="module")
def lib(injection_library):
    so = ctypes.CDLL(str(injection_library))
    so.decodemon_cupti_encode_window.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                                                 ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_int64,
                                                 ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)),
                                                 ctypes.POINTER(ctypes.c_size_t)]
    so.decodemon_cupti_parse_control.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_double),
                                                 ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int),
                                                 ctypes.c_char_p, ctypes.c_size_t]
    so.decodemon_cupti_free.argtypes = [ctypes.c_void_p]
    return so


def test_the_build_is_kept_and_the_driver_finds_its_entry_point(injection_library, lib):
    assert lib.InitializeInjection  # what the CUDA driver calls at cuInit (CUDA_INJECTION64_PATH)
    t0 = time.monotonic()
    assert cupti_lib.build(injection_library.parent.parent) == injection_library  # the same source: the library already built
    assert time.monotonic() - t0 < 0.5
    assert [p.name for p in injection_library.parent.iterdir()] == [cupti_lib.LIB_NAME]  # no build leftovers beside it


def encode(lib, rows: np.ndarray, names: list[str], window_id=3, t_open=1_000, t_close=9_000_000) -> bytes:
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    arr = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
    out, n = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_size_t()
    assert lib.decodemon_cupti_encode_window(rows.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(rows), arr,
                                             len(names), window_id, t_open, t_close, ctypes.byref(out),
                                             ctypes.byref(n)) == 0
    try:
        return ctypes.string_at(out, n.value)
    finally:
        lib.decodemon_cupti_free(out)


def steps_rows(steps: int, names: int, kernel_ns=20_000, gap_ns=2_000, idle_ns=400_000) -> np.ndarray:
    """`steps` decode steps of `names` kernels each, back to back, with the host's idle time between steps."""
    rows, t = [], 10_000
    for s in range(steps):
        for k in range(names):
            rows.append([k, t, t + kernel_ns, 132 * (k + 1), 1, 1, 128, 1, 1, 64, 0, 4096 * k, 7, 0, 0,
                         1000 + s * names + k])
            t += kernel_ns + gap_ns
        t += idle_ns
    return np.array(rows, dtype=np.int64)


def test_a_window_it_encodes_is_the_monitors_kernel_window(lib):
    names = ["mul_mat_vec_q", "rms_norm_f32", "rope_f32", "soft_max_f32", "add_f32", "cpy_f32_f16"]
    rows = steps_rows(8, len(names))
    w = wire.decode_frame(encode(lib, rows, names))
    assert isinstance(w, wire.KernelWindow)
    assert (w.window_id, w.tokens, w.guard_tokens, w.clock, w.apis_traced) == (3, 0, 0, "time", False)
    assert list(w.token_bounds_ns.array()) == [1_000, 9_000_000]
    assert w.names == names
    cols = ["name", "start", "end", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs",
            "smem_static", "smem_dynamic", "stream", "graph_id", "graph_node_id", "correlation"]
    assert list(w.kernels) == cols
    for j, c in enumerate(cols):
        assert np.array_equal(w.kernels[c].array(), rows[:, j]), c
    # the monitor reads it as any window by time: the GPU's steps found in it, and their launches
    sess = Session(label="native")
    sess.add(0, wire.Hello(wire_version=2, pid=1, argv=["llama-server"], python="", hostname="h",
                           gpu=wire.GpuInfo(index=0, name="NVIDIA H200", sm_count=132, mem_bandwidth_gbs=4800.0,
                                            cc="9.0")))
    sess.add(1, w)
    assert sess.steps[3].steps >= 6 and sess.steps[3].period_kernels == len(names)
    m = sess.metrics[-1][1]
    assert m.kernels_per_token == pytest.approx(len(names))
    assert m.kernel_launch_calls_per_token == pytest.approx(len(names))


def test_names_are_kept_once_and_an_empty_window_is_still_a_window(lib):
    w = wire.decode_frame(encode(lib, steps_rows(3, 2), ["a" * 300, "b"]))  # a 300-character name: str16 on the wire
    assert w.names == ["a" * 300, "b"] and len(w.kernels["name"].array()) == 6
    empty = wire.decode_frame(encode(lib, np.zeros((0, KCOLS)), []))
    assert empty.names == [] and all(len(c.array()) == 0 for c in empty.kernels.values())


def parse(lib, payload: bytes):
    p, t, tr, why = ctypes.c_double(), ctypes.c_double(), ctypes.c_int(), ctypes.create_string_buffer(160)
    k = lib.decodemon_cupti_parse_control(payload, len(payload), ctypes.byref(p), ctypes.byref(t), ctypes.byref(tr),
                                          why, len(why))
    return k, p.value, t.value, tr.value, why.value.decode()


def test_it_reads_the_monitors_attach_and_detach(lib):
    assert parse(lib, wire.encode(wire.Attach(window_period_s=2.0, time_window_s=0.5, trace=False))) == \
        (1, 2.0, 0.5, 0, "")
    assert parse(lib, wire.encode(wire.Attach()))[:4] == (1, 4.0, 0.25, 1)  # the defaults, as the monitor sends them
    assert parse(lib, wire.encode(wire.Attach(window_period_s=7)))[1] == 7.0  # an integer for a float
    assert parse(lib, wire.encode(wire.Detach()))[0] == 2
    assert parse(lib, wire.encode(wire.Heartbeat()))[0] == 3  # the monitor is still there: its lease goes on
    k, *_, why = parse(lib, wire.encode(wire.Attach(time_window_s=9.0)))
    assert k == 1 and why == "time_window_s=9 is outside [0.01, 5.0]"
    assert "window_period_s" in parse(lib, wire.encode(wire.Attach(window_period_s=-1.0)))[4]
    hello = wire.Hello(wire_version=2, pid=1, argv=[], python="", hostname="h")
    assert parse(lib, wire.encode(hello))[0] == 0  # not a control message
    full = wire.encode(wire.Attach(token_range="x" * 40, first_window_s=None))
    assert all(parse(lib, full[:i])[0] == 0 for i in range(len(full)))  # every truncation refused
    assert parse(lib, full + b"\x00")[0] == 0  # trailing bytes too


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_no_bytes_crash_the_control_reader(lib, data):
    assert parse(lib, data)[0] in (0, 1, 2, 3)


@pytest.fixture
def loaded(injection_library):
    """A real process (sleep) with the library loaded and started, as the CUDA driver would at cuInit."""
    env = {**os.environ, "LD_PRELOAD": str(injection_library), "DECODEMON_CUPTI_START_AT_LOAD": "1"}
    p = subprocess.Popen(["sleep", "120"], env=env)
    path = wire.socket_path(p.pid)
    t0 = time.monotonic()
    while not path.exists():
        assert time.monotonic() - t0 < 10 and p.poll() is None, "the library did not listen"
        time.sleep(0.05)
    yield p
    p.kill()
    p.wait()


def test_it_listens_where_an_agent_would_and_only_for_its_user(loaded):
    path = wire.socket_path(loaded.pid)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_an_attach_gets_its_hello_status_and_bye(loaded):
    frames = [f for _, _, f in live_frames(loaded.pid, wire.Attach(window_period_s=0.2), seconds=1.0)]
    hello = frames[0]
    assert isinstance(hello, wire.Hello) and hello.pid == loaded.pid and hello.argv == ["sleep", "120"]
    assert hello.python == "" and hello.gpu is None and hello.gpu_unavailable == "no CUDA driver in this process"
    status = [f for f in frames if isinstance(f, wire.ProbeStatus)]
    # no driver here: CUPTI refuses, and the trace says so with CUPTI's own words (never a crash of the target)
    assert status and status[0].trace == "failed" and status[0].trace_reason == "error"
    assert status[0].trace_error.startswith("cuptiActivityRegisterCallbacks: ")
    assert isinstance(frames[-1], wire.Bye) and frames[-1].reason == "detached"
    assert loaded.poll() is None


def test_one_monitor_at_a_time_then_the_next(loaded):
    first: list = []
    t = threading.Thread(target=lambda: first.extend(f for _, _, f in live_frames(loaded.pid, seconds=1.5)))
    t.start()
    time.sleep(0.5)
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(wire.socket_path(loaded.pid)))
    s.sendall(wire.pack(wire.Attach()))
    s.settimeout(5)
    got = wire.StreamReader().feed(s.recv(4096))
    s.close()
    assert re.fullmatch(rf"busy: monitor pid {os.getpid()} is attached \(last heard \d+\.\d s ago\); one monitor at a "
                        r"time", wire.decode_frame(got[0]).reason)
    t.join()
    assert isinstance(first[-1], wire.Bye) and first[-1].reason == "detached"
    again = [f for _, _, f in live_frames(loaded.pid, seconds=0.3)]
    assert isinstance(again[0], wire.Hello) and again[-1].reason == "detached"


def test_an_attach_out_of_bounds_is_refused_in_one_line(loaded):
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(wire.socket_path(loaded.pid)))
    s.sendall(wire.pack(wire.Attach(window_period_s=0.0)))
    s.settimeout(5)
    bye = wire.decode_frame(wire.StreamReader().feed(s.recv(4096))[0])
    s.close()
    assert bye.reason == "refused: window_period_s=0 is outside [0, 3600]"
    s = socket.socket(socket.AF_UNIX)  # garbage: closed unanswered, and the library serves the next monitor
    s.connect(str(wire.socket_path(loaded.pid)))
    s.sendall(b"\x05\x00\x00\x00hello")
    s.settimeout(5)
    assert s.recv(4096) == b""
    s.close()
    assert isinstance(next(f for _, _, f in live_frames(loaded.pid, seconds=0.2)), wire.Hello)
    assert loaded.poll() is None


def test_decodemon_run_loads_it_into_a_command_with_no_python(tmp_path, own_dir):
    env = {**os.environ, "XDG_CACHE_HOME": str(own_dir / "cache")}
    env.pop("CUDA_INJECTION64_PATH", None)
    try:
        cupti_lib.cuda_include()
    except cupti_lib.BuildError as exc:
        pytest.skip(str(exc))
    show = ["sh", "-c", 'echo "inject=${CUDA_INJECTION64_PATH:-none}"']
    r = cli("run", "--", *show, env=env)
    assert r.returncode == 0, r.stderr
    lib = Path(r.stdout.strip().split("=", 1)[1])
    assert lib.name == cupti_lib.LIB_NAME and lib.is_file() and lib.is_relative_to(own_dir / "cache")
    r = cli("run", "--", sys.executable, "-c", "import os; print(os.environ.get('CUDA_INJECTION64_PATH', 'none'))",
            env=env)
    assert r.stdout.strip() == "none"  # Python gets the Python agent
    script = tmp_path / "loop"
    script.write_text("#!/usr/bin/env python3\nimport os\nprint(os.environ.get('CUDA_INJECTION64_PATH', 'none'))\n")
    script.chmod(0o755)
    assert cli("run", "--", script, env=env).stdout.strip() == "none"  # so does a script run by Python
    assert cli("run", "--", *show, env={**env, "DECODEMON_CUPTI_INJECT": "0"}).stdout.strip() == "inject=none"
    r = cli("run", "--", *show, env={**env, "CUDA_INJECTION64_PATH": "/opt/other.so"})
    assert r.stdout.strip() == "inject=/opt/other.so" and "already set" in r.stderr  # another tool's, left alone


def test_the_cuda_recipe_is_valid_bash():
    recipe = Path(__file__).parents[1] / "benchmarks" / "llama_cpp_build.sh"
    r = subprocess.run(["bash", "-n", str(recipe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "inject" in subprocess.run(["bash", str(recipe)], capture_output=True, text=True).stderr  # its usage


def test_a_monitor_that_stalls_mid_frame_is_dropped_and_the_next_served(loaded):
    stalled = socket.socket(socket.AF_UNIX)
    stalled.connect(str(wire.socket_path(loaded.pid)))
    stalled.sendall(b"\x40\x00")  # half a length prefix, then nothing
    time.sleep(0.2)  # taken from the backlog first
    t0 = time.monotonic()
    # the newcomer is read by the door beside the stalled one (dropped after 2 s) and served at once
    frames = [f for _, _, f in live_frames(loaded.pid, seconds=6.0)]
    assert isinstance(frames[0], wire.Hello), frames[:3]
    assert isinstance(frames[-1], wire.Bye) and frames[-1].reason == "detached" and time.monotonic() - t0 < 8
    stalled.close()


def test_an_argv_that_is_not_utf8_still_makes_a_hello(injection_library):
    env = {**os.environ, "LD_PRELOAD": str(injection_library), "DECODEMON_CUPTI_START_AT_LOAD": "1"}
    p = subprocess.Popen([b"bash", b"-c", b"sleep 120; :", b"caf\xe9\xff"], env=env)  # bash stays, argv as given
    try:
        t0 = time.monotonic()
        while not wire.socket_path(p.pid).exists():
            assert time.monotonic() - t0 < 10
            time.sleep(0.05)
        hello = next(f for _, _, f in live_frames(p.pid, seconds=0.2))
        assert hello.argv == ["bash", "-c", "sleep 120; :", "caf??"]
    finally:
        p.kill()
        p.wait()
