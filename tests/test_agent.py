"""The agent in a real CPU decode process: lifecycle, security, faults. Every test uses real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest


from decodemon.monitor import probe_status
from decodemon.probes import agent, attach_loop, eventlog, held, policy, server, wire
from decodemon.probes import session as sess
from decodemon.probes.facts import PROCESS
from decodemon.monitor.counters.pm_config import PM_METRICS
from tests.conftest import Engine, as_monitor_reads, cli


def attach_json(pid, seconds=1.0, *extra):
    r = cli("attach", pid, "--json", "--seconds", seconds, *extra, timeout=60)
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


def test_attach_to_cpu_engine_reports_token_clock_and_gpu_unavailable(engine):
    r, d = attach_json(engine.pid, 1.5)
    assert r.returncode == 0, r.stderr
    assert d["tokens"] > 50 and d["ms_per_token"] > 0
    assert d["probe"]["token_clock"] == "armed"
    assert d["probe"]["gpu"].startswith("unavailable (")
    assert d["device"].startswith("unavailable (")
    assert d["bytes_per_token"] > 0  # model facts from the adapter


def test_socket_is_private(engine):
    st_dir = os.stat(engine.socket.parent)
    st_sock = os.stat(engine.socket)
    assert stat.S_IMODE(st_dir.st_mode) == 0o700
    assert stat.S_IMODE(st_sock.st_mode) == 0o600
    assert st_sock.st_uid == os.getuid()


def test_no_tcp_listener(engine):
    # the agent listens on its Unix socket only: no inet socket belongs to the target
    fds = os.listdir(f"/proc/{engine.pid}/fd")
    inodes = {os.readlink(f"/proc/{engine.pid}/fd/{fd}") for fd in fds if os.path.exists(f"/proc/{engine.pid}/fd/{fd}")}
    sock_inodes = {s[8:-1] for s in inodes if s.startswith("socket:[")}
    for proto in ("tcp", "tcp6"):
        with open(f"/proc/net/{proto}") as fh:
            listening = {ln.split()[9] for ln in fh.readlines()[1:] if ln.split()[3] == "0A"}
        assert not (sock_inodes & listening)


def test_stale_socket_of_dead_pid_is_removed(tmp_path):
    d = wire.socket_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    stale = d / "999999.sock"
    stale.unlink(missing_ok=True)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))  # a socket left by a process that is gone
    dead.close()
    e = Engine()
    try:
        assert not stale.exists()
    finally:
        e.stop()


def test_second_monitor_gets_a_clear_busy_answer(engine):
    first = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(engine.pid), "--json",
                              "--seconds", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    r, d = attach_json(engine.pid, 1)
    assert r.returncode == 3
    assert "busy: monitor pid" in d["ended"] and "one monitor at a time" in d["ended"]
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 0 and json.loads(out)["tokens"] > 0


def test_garbage_on_the_socket_drops_that_connection_only(engine):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(engine.socket))
    s.sendall(b"\xff\x00\x00\x00" + os.urandom(64))
    s.settimeout(5)
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    assert engine.alive()
    r, d = attach_json(engine.pid, 1)
    assert r.returncode == 0 and d["tokens"] > 0


def test_monitor_killed_mid_attach_target_disarms_and_keeps_decoding(engine):
    mon = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(engine.pid), "--json",
                            "--seconds", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    mon.send_signal(signal.SIGKILL)
    mon.wait()
    t0 = time.monotonic()
    # disarmed within 2 s: a new monitor is served, not told "busy"
    while True:
        r, d = attach_json(engine.pid, 0.5)
        if r.returncode == 0:
            break
        assert time.monotonic() - t0 < 2.5, d
        time.sleep(0.2)
    assert engine.alive() and d["tokens"] > 0


@pytest.mark.timing
def test_target_exits_mid_attach_monitor_says_so_and_recording_is_readable(tmp_path):
    # ~8 s of tiny decode, then it exits: long enough that a loaded machine's slow start of the recorder still
    # finds it decoding (at ~2 s it had ended before a busy CI machine's recorder measured a token)
    e = Engine(tokens=16000)
    out = tmp_path / "cut.dmon"
    r = cli("record", e.pid, "-o", out, "--seconds", "60", timeout=120)
    e.stop()
    assert r.returncode == 0, r.stderr
    frames = [f for _, f in wire.read_recording(out)]
    assert isinstance(frames[-1], wire.Bye) and "went away" in frames[-1].reason
    rep = json.loads(cli("replay", out, "--json").stdout)
    assert rep["tokens"] > 100 and "went away" in rep["ended"]


def test_tokens_bit_identical_with_and_without_probe():
    plain = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--tokens", "3000",
                            "--warmup", "0",
                            "--print-tokens", "--json"], capture_output=True, text=True, timeout=120)
    e = Engine("--print-tokens", "--json", "--warmup", "0", tokens=3000)
    r, d = attach_json(e.pid, 0.5)
    out, _ = e.wait()
    watched = json.loads(out.strip().splitlines()[-1])["token_ids"]
    assert json.loads(plain.stdout)["token_ids"] == watched
    assert r.returncode == 0 and d["tokens"] > 0


class _BrokenTracer:
    active = False

    def open(self):
        raise RuntimeError("CUPTI said no")

    def detach(self):
        raise RuntimeError("and no again")


def test_trace_errors_are_reported_never_raised_into_the_loop():
    s = sess.Session(wire.Attach(), _BrokenTracer())
    s.want_window = True
    s.on_token(1)  # must not raise
    assert s.tracer is None and "CUPTI said no" in s.errors[0]
    s.on_token(2)
    assert s.marks_queued == 2



def test_mark_token_is_cheap_while_dormant():
    assert sess.ACTIVE.session is None
    t0 = time.perf_counter()
    for _ in range(100_000):
        agent.mark_token(1)
    per = (time.perf_counter() - t0) / 100_000
    assert per < 2e-6  # one global read and a return


def test_window_spacing_keeps_slow_tokens_under_one_percent_but_never_waits_past_max():
    st = wire.Attach(window_period_s=4, window_min_tokens=250, window_max_s=5)
    due = policy.window_due
    assert not due(st, now=3.9, next_window=4.0, since_s=3.9, tokens_since=10_000)  # period not reached
    assert due(st, now=4.0, next_window=4.0, since_s=4.0, tokens_since=1000)  # graphed: 250 tok/s
    assert not due(st, now=4.0, next_window=4.0, since_s=4.0, tokens_since=200)  # eager at 50 tok/s: wait...
    assert due(st, now=5.0, next_window=4.0, since_s=5.0, tokens_since=249)  # ...but never past 5 s
    slow = 20.0  # a 20 tok/s loop still gets a window every 5 s
    assert due(st, now=5.0, next_window=4.0, since_s=5.0, tokens_since=int(5 * slow))


def test_an_eager_loops_windows_open_at_most_5_s_apart_at_0_25_s_ticks():
    """The agent asks for windows at its ticks (0.25 s, some up to 5 ms late: a tick waits for the GIL) and a
    window opens at the first token boundary after the ask. An eager loop at 40 tokens a second has not made 250
    tokens in 5 s, so its windows come at `window_max_s`. With no lead a tick a hair early pushed the ask to the
    next one (5.25 s apart on an H200); with half a tick the ask fell at 5 s and the opening token came
    on top (5.00-5.05 s on an H200). With cap_lead_s the openings are at most 5 s apart, and not much closer."""
    st = wire.Attach(window_period_s=4, window_min_tokens=250, window_max_s=5)
    tick, slack, token_s = 0.25, 0.125, 0.025

    def opens(lead) -> list[float]:
        out, last, next_window = [], 0.0, 0.5 - slack
        for k in range(1, 400):
            now = k * tick + (0.005 if k % 3 == 0 else -0.0005 if k % 3 == 1 else 0.0)  # late and early ticks
            since, toks = now - last, int((now - last) / token_s)
            if policy.window_due(st, now, next_window, since, toks, 0, lead(since, toks)):
                at = (int(now / token_s) + 1) * token_s  # the next token boundary
                out.append(at)
                last, next_window = now, now + st.window_period_s - slack
        return out

    gaps = lambda xs: [round(b - a, 4) for a, b in zip(xs, xs[1:])]  # noqa: E731
    new = gaps(opens(lambda since, toks: policy.cap_lead_s(tick, since, toks)))
    assert len(new) > 15 and max(new) <= 5.0 and min(new) >= 4.65
    assert max(gaps(opens(lambda since, toks: slack))) > 5.0  # half a tick: the opening token on top
    assert max(gaps(opens(lambda since, toks: 0.0))) >= 5.249  # no lead: some asks a whole tick late
    # a graphed loop (250 tokens in ~1 s) still waits for the period
    assert not policy.window_due(st, 3.8, 4.0 - slack, 3.8, 1000, 0, policy.cap_lead_s(tick, 3.8, 1000))
    # a stalled loop (no token since the last window) counts a quarter second for the opening token
    assert policy.cap_lead_s(tick, 4.0, 0) == pytest.approx(0.51)


def test_a_stopped_target_never_hangs_the_monitor(engine):
    os.kill(engine.pid, signal.SIGSTOP)  # the agent cannot answer: the kernel still accepts the connection
    try:
        t0 = time.monotonic()
        r, d = attach_json(engine.pid, 0.5)
        took = time.monotonic() - t0
    finally:
        os.kill(engine.pid, signal.SIGCONT)
    assert took < 15, took
    assert r.returncode == 3 and "did not answer the detach" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r, d = attach_json(engine.pid, 1.0)  # and once it runs again, it is served
    assert r.returncode == 0 and d["tokens"] > 0


class _RecordingTracer:
    """Stands in for NativeTracer: records the CUPTI calls the agent makes, and from which thread."""

    def __init__(self, active=True):
        import threading

        self.active, self.initialised, self.calls, self._t = active, True, [], threading

    def _note(self, what):
        self.calls.append((what, self._t.current_thread().name))

    def close(self):
        self._note("close")
        self.active = False

    def flush(self):
        self._note("flush")

    def detach(self):
        self._note("detach")
        self.initialised = False


def test_monitor_gone_mid_window_flushes_before_detaching_at_the_next_boundary():
    tr = _RecordingTracer(active=True)
    s = sess.Session(wire.Attach(), tr)
    sess.ACTIVE.session = s
    try:
        s.closing = True
        agent.mark_token(1)  # the decode thread's next boundary
        assert [c for c, _ in tr.calls] == ["close", "flush", "detach"]
        assert sess.ACTIVE.session is None and s.done.is_set()
    finally:
        sess.ACTIVE.session = None


def test_stalled_loop_leaves_cupti_to_the_next_boundary_never_the_agent_thread():
    import threading

    tr = _RecordingTracer(active=True)
    s = sess.Session(wire.Attach(), tr)
    sess.ACTIVE.session = s
    try:
        t = threading.Thread(target=s.finish, kwargs={"at_boundary": False}, name="agent-like")
        t.start()
        t.join()
        assert tr.calls == []  # nothing touched CUPTI from the agent's thread
        assert isinstance(sess.ACTIVE.session, sess.Closer)
        agent.mark_token(1)  # the loop comes back
        assert [c for c, _ in tr.calls] == ["close", "flush", "detach"]
        assert all(th == threading.current_thread().name for _, th in tr.calls)
        assert sess.ACTIVE.session is None
    finally:
        sess.ACTIVE.session = None


def test_no_window_opens_while_torch_profiler_records_in_the_target():
    import torch

    tr = _RecordingTracer(active=False)
    tr.open = lambda: tr._note("open")
    s = sess.Session(wire.Attach(), tr)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        s.want_window = True
        s.on_token(1)
    assert tr.calls == [] and s.skipped_windows == 1
    s.want_window = True
    s.on_token(2)
    assert [c for c, _ in tr.calls] == ["open"]



def test_agent_bursts_hand_the_gil_back_quickly_and_restore_the_interval():
    before = sys.getswitchinterval()
    with held.GilPolite():
        assert sys.getswitchinterval() <= 0.0002
        with held.GilPolite():  # nested (a re-arm inside set-up): still short, restored only at the outer exit
            pass
        assert sys.getswitchinterval() <= 0.0002
    assert sys.getswitchinterval() == before
    try:
        with held.GilPolite():
            raise ValueError("set-up failed")
    except ValueError:
        pass
    assert sys.getswitchinterval() == before


def test_agent_event_log_names_what_the_agent_thread_did(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODEMON_AGENT_EVENTS", str(tmp_path / "ev"))
    log = eventlog.EventLog.from_env()
    log.add("pump", 1_500_000, 1_200_000, 8)
    log.add("want_window")
    log.write()
    (f,) = tmp_path.glob("ev.*.json")
    rows = json.loads(f.read_text())
    assert [r[1] for r in rows] == ["pump", "want_window"] and rows[0][2:] == [1_500_000, 1_200_000, 8]
    monkeypatch.delenv("DECODEMON_AGENT_EVENTS")
    assert eventlog.EventLog.from_env() is None


def test_window_budget_caps_cuptis_memory_per_hour_once_spent():
    # CUPTI keeps ~90 KB per window for the life of the process (measured on an H200)
    st = wire.Attach(window_period_s=4, window_min_tokens=250, window_max_s=5, window_budget=3)
    due = policy.window_due
    assert due(st, now=4.0, next_window=4.0, since_s=4.0, tokens_since=1000, windows_so_far=2)
    assert not due(st, now=4.0, next_window=4.0, since_s=4.0, tokens_since=1000, windows_so_far=3)
    assert not due(st, now=59.0, next_window=4.0, since_s=59.0, tokens_since=10**6, windows_so_far=3)
    assert due(st, now=60.0, next_window=4.0, since_s=policy.BUDGET_PERIOD_S, tokens_since=0, windows_so_far=3)
    cap = policy.BUDGET_CAP * 3  # an absolute ceiling: no window at all after it
    assert due(st, now=60.0, next_window=4.0, since_s=60.0, tokens_since=0, windows_so_far=cap - 1)
    assert not due(st, now=10**6, next_window=4.0, since_s=10**6, tokens_since=10**9, windows_so_far=cap)


def test_attach_sends_the_window_budget_it_was_given():
    from decodemon.monitor import cli as mcli

    a = mcli.build_parser().parse_args(["attach", "1", "--probe", "window_budget=7"])
    assert mcli._attach_settings(a).window_budget == 7
    assert wire.decode_control(wire.encode(mcli._attach_settings(a))).window_budget == 7


def test_attach_sends_the_prepare_lead_it_was_given_and_defaults_to_none():
    from decodemon.monitor import cli as mcli

    default = mcli._attach_settings(mcli.build_parser().parse_args(["attach", "1"]))
    assert default.prepare_lead_tokens == 0  # CUPTI's start-up at the opening boundary, in the traced token
    a = mcli.build_parser().parse_args(["attach", "1", "--probe", "prepare_lead_tokens=3"])
    assert wire.decode_control(wire.encode(mcli._attach_settings(a))).prepare_lead_tokens == 3


def test_first_window_waits_as_long_as_the_monitor_says():
    from decodemon.monitor import cli as mcli

    assert policy.first_window_at(wire.Attach(), 100.0) == 100.5
    assert policy.first_window_at(wire.Attach(window_period_s=0.2), 100.0) == pytest.approx(100.2)
    assert policy.first_window_at(wire.Attach(first_window_s=2.5), 100.0) == 102.5
    assert policy.first_window_at(wire.Attach(first_window_s=1e9), 0.0) == 3600.0
    a = mcli.build_parser().parse_args(["record", "1", "-o", "x.dmon", "--probe", "first_window_s=2.5"])
    assert wire.decode_control(wire.encode(mcli._attach_settings(a))).first_window_s == 2.5


def test_a_process_that_replayed_graphs_keeps_the_guard_in_every_window(monkeypatch):
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)  # (a new attach's NativeTracer starts guarded)
    assert PROCESS.note_window_kernels(False) is False  # an eager window: the next one of this attach traces one token
    assert PROCESS.note_window_kernels(True) is True
    assert PROCESS.note_window_kernels(False) is True  # once a graph was replayed, every window keeps its guard


def test_first_window_guard_follows_what_the_engine_says_about_cuda_graphs(monkeypatch):
    """An eager engine that says so saves the guard token of each attach's first window; nothing else does."""
    from decodemon.engine_adapter import report_cuda_graphs

    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", None)
    g = sess.guard_for_window
    assert g(True) is True and g(False) is False  # not said: a new attach's tracer (needs_guard) guards
    report_cuda_graphs(False)
    assert g(True) is False and g(False) is False  # said eager: even the first window traces one token
    report_cuda_graphs(True)
    assert g(True) is True and g(False) is True  # said graphs: every window guards
    report_cuda_graphs(False)
    PROCESS.note_window_kernels(True)  # but a window saw graph kernels: the process guards for good, whatever was said
    assert g(False) is True


def test_an_eager_engines_first_window_traces_one_token(monkeypatch):
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)

    class Tr:
        active = False
        needs_guard = True  # a new attach's tracer

        def __init__(self):
            self.calls = []

        def open(self):
            self.active = True
            self.calls.append("open")

        def boundary(self):
            self.calls.append("boundary")

        def close(self):
            self.active = False
            self.calls.append("close")

        def flush(self):
            self.calls.append("flush")

        def detach(self):
            self.calls.append("detach")

    tr = Tr()
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    s.want_window = True
    for i in range(4):
        s.on_token(i)
    assert s.guard == 0 and tr.calls == ["open", "close", "flush", "detach"]  # opened, one token, closed


class _FakeLib:
    """Stands in for decodemon's CUPTI library as probes/native_tracer.py calls it: notes each call, under the name
    of the CUPTI call it makes, and the thread that made it; a window's take hands back empty columns."""

    AS = {"decodemon_win_start": "activity_register_callbacks", "decodemon_win_open": "activity_enable",
          "decodemon_win_close": "activity_disable", "decodemon_win_flush": "activity_flush_all",
          "decodemon_win_finalize": "finalize", "decodemon_win_timestamp": "get_timestamp"}

    def __init__(self):
        import threading

        self.calls, self._t, self._now, self.opened_with, self._kept = [], threading, 0, [], []
        self.records = 0  # records the library was handed (a window by time drains until this stops moving)
        self.graph_kernels = False  # whether the window's records hold a CUDA-graph kernel

    def _tick(self) -> int:
        self._now += 100
        return self._now

    def __getattr__(self, name):
        def call(*a):
            if name in self.AS:
                self.calls.append((self.AS[name], self._t.current_thread().name))
            if name == "decodemon_win_timestamp":
                return self._tick()
            if name == "decodemon_win_records":
                return self.records
            if name == "decodemon_win_open":
                self.opened_with.append(bool(a[0]))
                a[1]._obj.value = self._tick()
            if name == "decodemon_win_close":
                a[0]._obj.value = self._tick()
            if name == "decodemon_win_take":
                import ctypes

                from decodemon.probes import msgpack_std

                cols = {part: {c: ["<i8", b""] for c in cols_} for part, cols_ in (
                    ("kernels", ["name", "start", "end", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                                 "block_z", "regs", "smem_static", "smem_dynamic", "stream", "graph_id",
                                 "graph_node_id", "correlation"]),
                    ("apis", ["cbid", "start", "end", "correlation", "domain"]),
                    ("memcpys", ["start", "end", "bytes", "copy_kind"]))}
                data = msgpack_std.packb({"names": [], **cols, "api_names": {}, "dropped_records": 0,
                                          "graph_kernels": self.graph_kernels})
                buf = ctypes.create_string_buffer(data, len(data))
                self._kept.append(buf)
                a[0]._obj.value, a[1]._obj.value = ctypes.addressof(buf), len(data)
            return 0
        return call


def _fake_tracer():
    from decodemon.probes.native_tracer import NativeTracer

    tr = NativeTracer(_FakeLib())
    tr._c = tr._lib  # the tests read the calls there
    tr.needs_guard = False
    return tr


def test_cupti_starts_on_the_agent_thread_and_the_decode_threads_open_only_enables(monkeypatch):
    import threading

    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    got = []
    th = threading.Thread(target=lambda: got.append(s.prepare_window()), name="decodemon-session")
    th.start()
    th.join()
    assert got[0] > 0 and tr.prepared and tr.initialised and tr.prepare_ns == got[0]
    assert tr._c.calls == [("activity_register_callbacks", "decodemon-session")]
    tr._c.calls.clear()
    s.want_window = True
    for i in range(3):
        s.on_token(i)  # the decode thread (this one): open, then close + flush + finalize a token later
    names = [n for n, _ in tr._c.calls]
    assert "activity_register_callbacks" not in names  # no second start-up on the decode thread
    assert names[0] == "activity_enable" and names.count("activity_enable") == 1
    assert names[-2:] == ["activity_flush_all", "finalize"] and not tr.initialised and not tr.prepared
    assert {th_ for _, th_ in tr._c.calls} == {threading.current_thread().name}
    w = as_monitor_reads(tr.collect(0, guard_tokens=0))
    assert w.prepare_ns == got[0] and w.tokens == 1


def test_a_window_nobody_prepared_starts_cupti_in_open(monkeypatch):
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    s.want_window = True
    s.on_token(0)
    assert [n for n, _ in tr._c.calls][0] == "activity_register_callbacks" and tr.active


def test_a_prepared_window_that_never_opens_is_finalized_at_the_next_boundary(monkeypatch):
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(), tr)
    sess.ACTIVE.session = s
    try:
        s.prepare_window()
        s.closing = True  # the monitor left before the window opened
        agent.mark_token(1)
        assert [n for n, _ in tr._c.calls][-2:] == ["activity_flush_all", "finalize"] and not tr.initialised
        assert sess.ACTIVE.session is None
    finally:
        sess.ACTIVE.session = None


def test_no_cupti_start_up_while_torch_profiler_records(monkeypatch):
    monkeypatch.setattr(sess, "foreign_profiler_active", lambda: True)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(), tr)
    assert s.prepare_window() == 0 and tr._c.calls == [] and not tr.initialised


def test_a_failed_prepare_is_noted_and_leaves_the_start_up_to_open(monkeypatch):
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)

    class Tr:
        needs_guard = False

        def prepare(self):
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    s = sess.Session(wire.Attach(), Tr())
    assert s.prepare_window() == 0 and "CUPTI_ERROR_NOT_INITIALIZED" in s.errors[0]


def test_a_process_whose_start_up_was_long_has_every_window_prepared_graphed_or_not(monkeypatch):
    """The compiled Llama-8B loop's CUPTI re-start-ups took 660-740 ms on an H100: at an opening boundary each was
    one token that long. Once the process's last start-up ran past policy.START_OFF_LOOP_NS, the agent thread
    makes it for every window, guarded ones too; a start-up under it leaves graphed windows to open()."""
    from decodemon.probes import policy

    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", None)
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", True)
    monkeypatch.setattr(PROCESS, "windows_in_process", 4)
    tr = _fake_tracer()
    tr.needs_guard = True
    s = sess.Session(wire.Attach(), tr)
    monkeypatch.setattr(PROCESS, "cupti_start_ns", policy.START_OFF_LOOP_NS - 1)
    assert s.prepare_window() == 0 and not tr.prepared
    assert not policy.start_off_loop(4, policy.START_OFF_LOOP_NS - 1)
    monkeypatch.setattr(PROCESS, "cupti_start_ns", 700_000_000)
    assert policy.start_off_loop(4, 700_000_000) and policy.start_off_loop(0, 0)
    assert not policy.start_off_loop(0, 0, prepare_first_window=False)
    assert s.prepare_window() > 0 and tr.prepared and tr.start_ns > 0
    s.want_window = True
    s.on_token(0)  # the opening boundary only enables
    assert [n for n, _ in tr._c.calls].count("activity_register_callbacks") == 1 and tr.active


def test_graphed_windows_start_cupti_in_open_not_on_the_agent_thread(monkeypatch):
    """A process that replays CUDA graphs (said, or seen in a window) keeps the start-up at the opening boundary."""
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", None)
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", True)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(), tr)
    assert s.prepare_window() == 0 and tr._c.calls == [] and not tr.prepared
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "windows_in_process", 3)
    tr.needs_guard = True  # a new attach's first window, engine silent about graphs: guarded, so no prepare
    assert s.prepare_window() == 0 and tr._c.calls == []
    monkeypatch.setattr(PROCESS, "windows_in_process", 0)  # the process's first window ever: prepared off the loop
    assert s.prepare_window() > 0 and tr.prepared
    tr.prepared = False
    monkeypatch.setattr(PROCESS, "windows_in_process", 3)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)  # the engine says eager: prepared
    assert s.prepare_window() > 0 and tr.prepared


def _run_agent_loop(s, ev=None, name: str | None = None, wrap=None):
    """The agent loop of session `s` in a thread of its own, talking to a monitor socket whose bytes are drained
    into `got`: (loop thread, result list, got, the monitor's end of the socket). `wrap(sock)` stands in for the
    agent's end, if given (and is `wrap.made` after)."""
    mine, theirs = socket.socketpair()
    if wrap is not None:
        mine = wrap.made = wrap(mine)
    got = bytearray()

    def drain():
        while True:
            try:
                b = theirs.recv(1 << 16)
            except OSError:
                return
            if not b:
                return
            got.extend(b)

    threading.Thread(target=drain, daemon=True).start()
    result: list = []
    loop = threading.Thread(name=name, target=lambda: result.append(
        attach_loop.AttachLoop(mine, wire.StreamReader(max_frame=1 << 20), s, {}, ev).run()))
    loop.start()
    return loop, result, got, theirs


@pytest.mark.parametrize("lead,graphs", [(0, False), (3, False), (0, True)])
def test_the_agent_loop_starts_cupti_where_the_prepare_lead_says(monkeypatch, lead, graphs):
    """The agent thread's own loop, driven by a decode thread's token marks. By default (lead 0) the window's
    opening boundary starts CUPTI on the decode thread, in the traced token; with a lead, the agent thread starts
    it and the window opens `lead` or more tokens later. Enable, close and flush always on the decode thread; the
    finalize on the agent thread once it has read the records, but on the decode thread, at the closing boundary,
    in a process the engine says replays CUDA graphs."""
    import socket
    import threading

    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", graphs)
    monkeypatch.setattr(PROCESS, "windows_in_process", 0)
    tr = _fake_tracer()
    tokens = [0]
    calls = []
    fake = tr._c

    class Counting:
        def __getattr__(self, name):
            f = getattr(fake, name)

            def call(*a, **k):
                if name in _FakeLib.AS:
                    calls.append((_FakeLib.AS[name], threading.current_thread().name, tokens[0]))
                return f(*a, **k)
            return call

    tr._lib = tr._c = Counting()
    st = wire.Attach(window_period_s=0.2, window_tokens=1, window_min_tokens=0, prepare_lead_tokens=lead,
                     prepare_first_window=False, agent_tick_s=0.25)  # a tick under the period: one window here
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end and not any(c[0] == "finalize" for c in calls):
        s.on_token(1)  # this thread is the decode thread
        tokens[0] += 1
        time.sleep(0.01)
    for _ in range(5):
        s.on_token(1)
        tokens[0] += 1
        time.sleep(0.01)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    names = [c[0] for c in calls]
    reg = next(c for c in calls if c[0] == "activity_register_callbacks")
    enable = next(c for c in calls if c[0] == "activity_enable")
    assert enable[1] == threading.current_thread().name
    if lead:
        assert reg[1] == "decodemon-session"
        assert enable[2] - reg[2] >= lead, calls  # the window opened tokens after the start-up
    else:
        assert reg[1] == threading.current_thread().name and reg[2] == enable[2]  # one boundary: the traced token's
    assert names.count("activity_register_callbacks") == 1 and names[-2:] == ["activity_flush_all", "finalize"], calls
    flush, finalize = calls[-2:]
    assert flush[1] == threading.current_thread().name
    assert finalize[1] == (threading.current_thread().name if graphs else "decodemon-session"), calls
    assert result == ["monitor went away"]
    frames = [wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got))]
    wins = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert len(wins) == 1 and (wins[0].prepare_ns > 0) == bool(lead) and wins[0].tokens == 1


@pytest.mark.parametrize("graph_kernels", [False, True])
def test_an_eager_process_window_is_finalized_by_the_agent_once_its_records_are_read(monkeypatch, graph_kernels):
    """A process that replays no CUDA graphs: the closing boundary disables and flushes, and the agent thread,
    having read the records, finalizes; the decode thread's bill (probe_host_ns) holds none of it. A window whose
    records show graph kernels leaves the finalize to the decode thread's next boundary instead."""
    import socket
    import threading

    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", None)
    monkeypatch.setattr(PROCESS, "windows_in_process", 1)
    tr = _fake_tracer()
    tr._c.graph_kernels = graph_kernels
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    mine, theirs = socket.socketpair()
    loop = attach_loop.AttachLoop(mine, wire.StreamReader(), s, {}, None)
    assert policy.finalize_off_loop(PROCESS.graph_kernels_seen, PROCESS.engine_cuda_graphs, {})
    s.finalize_off_loop = True
    s.want_window = True
    for i in range(3):
        s.on_token(i)  # open, then close + flush a token later: CUPTI still initialised
    decode = threading.current_thread().name
    assert [c for c in tr._c.calls if c[0] != "get_timestamp"][-2:] == [("activity_disable", decode),
                                                                        ("activity_flush_all", decode)]
    assert s.window_ready.is_set() and tr.initialised
    agent_thread = threading.Thread(target=loop._collect_token_window, args=(time.monotonic(),),
                                    name="decodemon-session")
    agent_thread.start()
    agent_thread.join(10)
    (win,) = [wire.decode_frame(p) for p in wire.StreamReader().feed(bytes(loop.out))]
    if graph_kernels:
        assert PROCESS.graph_kernels_seen and tr.initialised and s.pending_detach is tr
        s.on_token(3)  # the next boundary finalizes, on the decode thread
        assert tr._c.calls[-1] == ("finalize", decode) and not tr.initialised
    else:
        assert tr._c.calls[-1] == ("finalize", "decodemon-session") and not tr.initialised
        assert win.probe_host_ns == tr.host_ns - tr.last_ns["finalize"]  # the decode thread's open, close, flush
        assert loop.finalize_cpu_s >= 0.0  # its CPU, counted apart from the agent's own (cupti_finalize_cpu_ms)
    assert not s.errors
    mine.close()
    theirs.close()


@pytest.mark.parametrize("why", ["replays", "engine", "collect_fails"])
def test_a_window_whose_process_showed_graphs_or_whose_records_were_not_read_is_finalized_by_the_decode_thread(
        monkeypatch, why):
    """The agent finalizes an eager window only where nothing says graphs replay: graph replays the adapter saw
    since the window was asked for, the engine's word given meanwhile, or a collect that failed (what the window
    held is not known) hand the finalize to the decode thread's next boundary, billed to the observer there."""
    import threading

    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "graph_replays_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", None)
    monkeypatch.setattr(PROCESS, "windows_in_process", 1)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    mine, theirs = socket.socketpair()
    loop = attach_loop.AttachLoop(mine, wire.StreamReader(), s, {}, None)
    s.finalize_off_loop = True
    s.want_window = True
    for i in range(3):
        s.on_token(i)
    assert tr.initialised and s.window_ready.is_set()
    if why == "replays":
        s.replay_log.append(7)  # the cuda_graphs adapter saw a replay; the agent's next ship takes it
        loop._ship_replays()
        assert PROCESS.graph_replays_seen
    elif why == "engine":
        monkeypatch.setattr(PROCESS, "engine_cuda_graphs", True)
    else:
        monkeypatch.setattr(tr, "collect", lambda *a, **k: (_ for _ in ()).throw(MemoryError("no room")))
    th = threading.Thread(target=loop._collect_token_window, args=(time.monotonic(),), name="decodemon-session")
    th.start()
    th.join(10)
    assert tr.initialised and s.pending_detach is tr and "finalize" not in [n for n, _ in tr._c.calls]
    steps = len(s.observer)
    s.on_token(3)  # the next boundary: finalized here, on the decode thread, and billed
    assert tr._c.calls[-1] == ("finalize", threading.current_thread().name) and not tr.initialised
    assert s.pending_detach is None and len(s.observer) == steps + 1
    mine.close()
    theirs.close()


def test_at_exit_a_closed_windows_cupti_waiting_for_its_finalize_is_finalized(monkeypatch):
    """The process exits with a window closed and its finalize still to come (the agent's, or a boundary that will
    not come): the agent's shutdown finalizes it on the exiting thread."""
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    s.finalize_off_loop = True
    s.want_window = True
    for i in range(3):
        s.on_token(i)
    assert tr.initialised and not tr.active
    a = server.Agent.__new__(server.Agent)  # its shutdown alone: no socket of its own
    a.home = type("Home", (), {"close": lambda self: None})()
    monkeypatch.setattr(sess.ACTIVE, "session", s)
    a.shutdown()
    assert not tr.initialised and tr._c.calls[-1][0] == "finalize" and s.closing
    assert sess.ACTIVE.session is None


def test_no_start_up_while_an_earlier_attachs_finalize_is_still_due(monkeypatch):
    """A stalled loop left the last attach's tracer to be finalized at the next boundary; a start-up made now would
    be finalized with it, so the window's open() makes its own."""
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    old, tr = _fake_tracer(), _fake_tracer()
    old.initialised = True
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    s.pending_detach = old
    assert s.prepare_window() == 0 and tr._c.calls == []
    s.want_window = True
    s.on_token(0)  # the old tracer is finalized first, then this window starts CUPTI itself
    assert [n for n, _ in old._c.calls][-1] == "finalize"
    assert [n for n, _ in tr._c.calls][0] == "activity_register_callbacks" and tr.active



def test_pm_permission_refused_says_what_to_change():
    words = probe_status.describe(wire.ProbeStatus(pm="unavailable", pm_reason="no_permission", pm_where="sidecar"))
    assert "NVreg_RestrictProfilingToAdminUsers=0" in words["pm"] and "traced windows still work" in words["pm"]


def test_window_span_samples_travel_apart_and_stay_out_of_the_loops_averages():
    """Recordings made while the agent sampled PM in process hold a traced window's own samples apart."""
    from decodemon.monitor.feed import Feed

    def pm(starts, values, span):
        return wire.PmSamples(metrics=PM_METRICS, start_ns=wire.Column.of(starts),
                              end_ns=wire.Column.of([t + 1 for t in starts]),
                              values=wire.Column.of([v for x in values for v in [x] * len(PM_METRICS)], "<f8"),
                              window_span=span)

    feed = Feed()
    for f in (pm([1, 3], [10.0, 30.0], False), pm([2], [20.0], True)):
        feed.add(5, f)
    assert len(feed.pm) == 2 and len(feed.pm_window) == 1
    assert len(feed.pm_since(0)["rx_ns"]) == 2  # what the verdict averages
    assert sorted(feed.pm_within(0, 10)["gpu_t0_ns"]) == [1, 2, 3]  # what the window check reads: all of them


def test_launch_calls_are_traced_from_an_attachs_second_window_then_every_nth():
    sched = [policy.apis_in_window(i, 4) for i in range(10)]
    # a short attach's only window is the cheap kind; the launch calls come ~one period later, then every 4th
    assert [i for i, x in enumerate(sched) if x] == [1, 5, 9]
    assert all(policy.apis_in_window(i, 1) for i in range(5)) and not any(policy.apis_in_window(i, 0) for i in range(5))
    assert [i for i in range(7) if policy.apis_in_window(i, 2)] == [1, 3, 5]
    assert wire.Attach().api_every == 4


def test_a_kernels_only_window_enables_no_runtime_records(monkeypatch):
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    tr = _fake_tracer()
    for with_apis in (False, True):
        tr._c.opened_with.clear()
        tr.with_apis = with_apis
        s = sess.Session(wire.Attach(window_tokens=1), tr)
        s.want_window = True
        for i in range(3):
            s.on_token(i)
        assert tr._c.opened_with == [with_apis]
        w = as_monitor_reads(tr.collect(0, guard_tokens=0))
        assert w.apis_traced is with_apis and w.tokens == 1


def test_attach_passes_api_every():
    from decodemon.monitor.cli import _attach_settings, build_parser

    a = build_parser().parse_args(["attach", "1", "--probe", "api_every=0"])
    assert _attach_settings(a).api_every == 0
    assert _attach_settings(build_parser().parse_args(["attach", "1"])).api_every == 4


def test_the_live_demo_traces_the_launch_calls_in_every_window():
    from decodemon.monitor.demo import demo_settings

    d = demo_settings()
    # a lecture's eager timeline shows its own CPU lane; everything else is attach's defaults
    assert d.api_every == 1 and wire.Attach(**{**{f: getattr(d, f) for f in d.__struct_fields__}, "api_every": 4}) \
        == wire.Attach()



def test_pm_losses_reach_the_probe_state_in_words():
    pm = type("Pm", (), {"full_pumps": 0, "overflows": 0, "max_samples": 1024, "interval_us": 100})()
    assert probe_status.pm_lost_of(pm) is None
    pm.full_pumps, pm.overflows = 3, 1
    text = probe_status.pm_lost_of(pm)
    assert "3 pumps found more samples than their 1024-sample image holds" in text and "overflowed at 1 pumps" in text
    assert "every 100 us" in text and "--probe pm_interval_us=N" in text


def test_the_devices_facts_are_read_at_the_first_attach_only(monkeypatch):
    """cuInit, the device queries and nvmlInit ran on the agent thread at every attach's start; the facts do not
    change within a process."""
    from decodemon.probes import wire

    info = wire.GpuInfo(index=0, name="NVIDIA H200", sm_count=132, mem_bandwidth_gbs=4800.0)
    calls = []
    monkeypatch.setattr(PROCESS, "gpu", {})
    monkeypatch.setattr(server, "gpu_info", lambda idx, nvml=True: calls.append(idx) or info)
    monkeypatch.delenv("DECODEMON_DEVICE", raising=False)
    first = server.hello({})
    second = server.hello({})
    assert first.gpu == second.gpu == info and calls == [0]
    monkeypatch.setenv("DECODEMON_DEVICE", "1")  # another device: its own facts
    server.hello({})
    assert calls == [0, 1]

    def unavailable(idx, nvml=True):
        calls.append(idx)
        raise server.Unavailable("no CUDA device 2")

    monkeypatch.setattr(server, "gpu_info", unavailable)
    monkeypatch.setenv("DECODEMON_DEVICE", "2")
    for _ in range(2):  # not found is not kept: the next attach looks again
        hello = server.hello({})
        assert hello.gpu is None and hello.gpu_unavailable == "no CUDA device 2"
    assert calls == [0, 1, 2, 2]


def test_attach_passes_the_agent_tick_and_rejects_a_bad_one():
    from decodemon.monitor.cli import _attach_settings, build_parser

    assert _attach_settings(build_parser().parse_args(["attach", "1"])).agent_tick_s == 0.5 == wire.Attach().agent_tick_s
    a = build_parser().parse_args(["attach", "1", "--probe", "agent_tick_s=0.05"])
    assert wire.decode_control(wire.encode(_attach_settings(a))).agent_tick_s == 0.05
    from decodemon.monitor.cli import UsageError

    with pytest.raises(UsageError, match="agent_tick_s must be in"):
        build_parser().parse_args(["attach", "1", "--probe", "agent_tick_s=0"])


class _Events:
    """An agent event log that keeps what the loop adds (its `send`s, one per wake-up that had something)."""

    def __init__(self):
        self.seen = []

    def add(self, what, *vals):
        self.seen.append((time.monotonic(), what))

    def add_at(self, t_ns, what, *vals):
        self.seen.append((time.monotonic(), what))


def _run_loop_marking(tick: float, seconds: float = 1.6):  # noqa: D401
    """The agent loop (no tracer, no PM) with a decode thread marking a token every 10 ms: (times of the loop's
    sends, frames the monitor got)."""
    s = sess.Session(wire.Attach(agent_tick_s=tick, trace=False, pm=False), None)
    ev = _Events()
    loop, result, got, theirs = _run_agent_loop(s, ev)
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        s.on_token(1)
        time.sleep(0.01)
    time.sleep(tick + 0.1)  # the last marks are shipped at the next tick
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    assert result == ["monitor went away"]
    frames = [wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got))]
    return [t for t, what in ev.seen if what == "send"], frames


def test_the_agent_wakes_at_its_ticks_not_at_every_token():
    """Every wake-up of the agent thread takes the GIL from a decode thread running Python (on the H200 an eager
    decode thread went from 0 to ~70-90 voluntary switches a second while attached). At the default tick the loop
    sends ~2 times a second however often the loop marks, and still ships every token."""
    sends, frames = _run_loop_marking(wire.Attach().agent_tick_s)
    marks = sum(len(f.t_ns.array()) for f in frames if isinstance(f, wire.TokenMarks))
    assert marks > 100
    span = sends[-1] - sends[0]
    assert 3 <= len(sends) <= 6 and span > 1.0, sends  # ~2 per second over ~2.1 s, never one per token



class _CountingConn:
    """The monitor socket as the agent loop uses it, counting the calls that enter the kernel (each gives the GIL up
    and takes it back: a wait for a decode thread running Python)."""

    def __init__(self, sock):
        self._s, self.calls = sock, []

    def __getattr__(self, name):
        f = getattr(self._s, name)
        if name in ("send", "sendall", "recv", "setblocking", "settimeout"):
            def counted(*a, **k):
                self.calls.append(name)
                return f(*a, **k)
            return counted
        return f


@pytest.mark.parametrize("hold", [True, False])
def test_a_tick_makes_one_send_on_the_monitor_socket_and_nothing_else(monkeypatch, hold):
    """Each system call of the agent thread that gives the GIL up takes it back from a decode thread running Python,
    which then waits (on the H200 an eager decode thread made 0 voluntary switches a second unobserved, 66-78
    attached). A tick with something to send makes one send on the socket, which stays non-blocking; it used to
    make four calls (blocking mode on, a timeout, sendall, blocking mode off). By default that send keeps the GIL
    (libc's send through held.py: the socket object's own send() is never called); with `hold_gil` off
    (`--probe hold_gil=false`) it is the socket's send(). And the loop's select() wakes about four times a second at the
    default tick, not twenty."""
    import selectors

    selects = []
    real_select = selectors.DefaultSelector

    class CountingSelector(real_select):
        def select(self, timeout=None):
            selects.append(timeout)
            return super().select(timeout)

    held_sends = []
    real_send = held.send

    def counting_send(sock, view):
        n = real_send(sock, view)
        held_sends.append(n)
        return n

    monkeypatch.setattr(selectors, "DefaultSelector", CountingSelector)
    monkeypatch.setattr(held, "send", counting_send)
    monkeypatch.setattr(held, "ENABLED", hold)
    s = sess.Session(wire.Attach(trace=False, pm=False), None)

    def wrap(sock):
        return _CountingConn(sock)

    loop, _, got, theirs = _run_agent_loop(s, wrap=wrap)
    conn = wrap.made
    t_end = time.monotonic() + 1.6
    while time.monotonic() < t_end:
        s.on_token(1)
        time.sleep(0.005)
    time.sleep(0.3)
    sends = len(held_sends)
    n_selects = len(selects)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    assert conn.calls.count("setblocking") == 1  # made non-blocking once, at the start
    assert "settimeout" not in conn.calls and "sendall" not in conn.calls
    assert 3 <= sends <= 9, held_sends  # one per tick with token marks (and stats) to send: ~1.9 s at 0.25 s
    # the socket object's send() (which lets the GIL go) only when the calls do not hold it
    assert conn.calls.count("send") == (0 if hold else sends), conn.calls
    assert n_selects <= 12, n_selects  # ~8 ticks (+ the end): every 50 ms would be ~38
    marks = [f for f in (wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got)))
             if isinstance(f, wire.TokenMarks)]
    assert sum(len(f.t_ns.array()) for f in marks) > 150  # every token still reached the monitor


def test_send_all_sends_in_one_call_when_there_is_room_waits_when_not_and_gives_up():
    """_send_all on a non-blocking socket: everything arrives though the socket fills many times over (a slow
    monitor); False when the monitor never reads within the timeout, or has gone."""
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    data = bytes(range(256)) * (4 << 12)  # 4 MB, far more than a socket buffer
    got = bytearray()

    def slow_reader():
        while len(got) < len(data):
            time.sleep(0.001)
            b = theirs.recv(1 << 16)
            if not b:
                return
            got.extend(b)

    t = threading.Thread(target=slow_reader)
    t.start()
    assert held.send_all(mine, data, 10.0)
    t.join(10)
    assert bytes(got) == data
    t0 = time.monotonic()
    assert not held.send_all(mine, data, 0.2)  # nobody reads now: the buffer fills and stays full
    assert 0.15 < time.monotonic() - t0 < 2.0
    theirs.close()
    assert not held.send_all(mine, b"x" * 100, 1.0)  # the monitor has gone: at once, not after the timeout
    mine.close()



def test_a_closed_window_wakes_the_agent_and_a_wake_after_the_attach_is_harmless():
    """The decode thread's wake() makes the agent's wake-up socket readable (one non-blocking send); after the
    tear-down has closed the pair, a late wake() from a decode thread still at its boundary neither blocks nor
    raises."""
    import select as _select

    s = sess.Session(wire.Attach(), None)
    assert _select.select([s.wake_r], [], [], 0)[0] == []
    s.wake()
    assert _select.select([s.wake_r], [], [], 0)[0] == [s.wake_r]
    for _ in range(100_000):  # far more than the socket holds: never blocks
        s.wake()
    s.release()
    s.wake()


def test_the_switch_counter_reads_a_threads_voluntary_switches_per_second():
    """_SwitchCounter: /proc/self/task/TID/status's voluntary_ctxt_switches, per second between two readings of the
    same thread (None at the first, for no thread, or for a thread that is gone); sleeping blocks, so it counts."""
    sc = held.SwitchCounter()
    assert sc.parse(b"Name:\tpython\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t7\n") == 42
    assert sc.parse(b"Name:\tpython\n") is None
    tid = threading.get_native_id()
    assert sc.per_s(None, 1.0) is None and sc.per_s(tid, time.monotonic()) is None  # the first reading
    for _ in range(20):
        time.sleep(0.001)
    rate = sc.per_s(tid, time.monotonic())
    assert rate is not None and rate >= 20 / 0.5  # 20 sleeps in well under half a second
    assert sc.per_s(2**31 - 7, time.monotonic()) is None  # no such thread
    sc.close()
    assert sc.fd is None


def _statuses_while_marking(s, seconds: float) -> list:
    """Serve session `s` from an agent loop while this thread marks a token every ~5 ms for `seconds`, then end
    the attach: the ProbeStatus frames the monitor got."""
    loop, result, got, theirs = _run_agent_loop(s)
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        s.on_token(1)
        time.sleep(0.005)
    time.sleep(0.3)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    return [f for f in (wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got)))
            if isinstance(f, wire.ProbeStatus)]


def test_the_probe_state_carries_the_decode_threads_waits():
    """At its stats ticks the agent reads the voluntary switches of the thread that marks tokens and puts them
    in the probe state (`decode_waits_per_s`), which reaches the monitor's bill; a thread that sleeps between
    tokens blocks at each, so the figure is there and not small."""
    s = sess.Session(wire.Attach(trace=False, pm=False), None)
    stats = _statuses_while_marking(s, 2.6)  # ~200 tokens a second, each after a voluntary switch
    waits = [f.decode_waits_per_s for f in stats if f.decode_waits_per_s is not None]
    assert waits and min(waits) > 50, waits
    # and the agent thread's own CPU a second: a loop that mostly sleeps uses little (well under a whole CPU)
    cpu = [f.agent_cpu_ms_per_s for f in stats if f.agent_cpu_ms_per_s is not None]
    assert cpu and all(0 <= c < 500 for c in cpu), cpu
    assert s.switches.tid == threading.get_native_id()
    s.release()
    assert s.switches.fd is None


@pytest.mark.timing
def test_the_agents_cpu_is_over_the_attach_and_cupti_start_up_is_counted_apart(monkeypatch):
    """agent_cpu_ms_per_s is the agent thread's CPU a second since the attach began; the CPU of CUPTI's start-up,
    made on that thread with the GIL given up (prepare), is not in it but in cupti_start_cpu_ms."""
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    monkeypatch.setattr(PROCESS, "windows_in_process", 0)  # the process's first window: prepared off the loop
    tr = _fake_tracer()
    real_prepare = tr.prepare

    def slow_prepare():  # a start-up that burns 0.4 s of this thread's CPU, as a big process's does
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.4:
            pass
        return real_prepare()

    tr.prepare = slow_prepare
    s = sess.Session(wire.Attach(window_tokens=2, window_period_s=0.5, pm=False), tr)
    stats = _statuses_while_marking(s, 3.2)
    start = [f.cupti_start_cpu_ms for f in stats if f.cupti_start_cpu_ms is not None]
    assert start and 390 <= start[-1] < 2000, start
    cpu = [f.agent_cpu_ms_per_s for f in stats if f.agent_cpu_ms_per_s is not None]
    assert cpu and cpu[-1] < 100, cpu  # 400 ms in ~3 s would read ~130 ms/s were the start-up in it
    over = [f.agent_cpu_over_s for f in stats if f.agent_cpu_over_s is not None]
    assert over and 2.5 <= over[-1] <= 4.0, over  # it covers the attach so far
    s.release()


def test_the_agents_threads_carry_their_own_os_names():
    """/proc/PID/task/TID/comm: a thread that names itself reads so there; the thread that calls nothing keeps the
    process's name (the engine's threads are not renamed)."""
    from decodemon.probes import held

    got = {}

    def named():
        got["ok"] = held.name_this_thread("dm-session-with-a-long-name")
        got["tid"] = threading.get_native_id()

    t = threading.Thread(target=named)
    t.start()
    t.join()
    # the thread is gone once joined: name a live one and read it while it runs
    ready, done = threading.Event(), threading.Event()

    def live():
        held.name_this_thread("dm-agent")
        got["live_tid"] = threading.get_native_id()
        ready.set()
        done.wait(5)

    t2 = threading.Thread(target=live)
    t2.start()
    ready.wait(5)
    try:
        comm = open(f"/proc/self/task/{got['live_tid']}/comm").read().strip()
        main = open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip()
    finally:
        done.set()
        t2.join()
    assert got["ok"] is True and comm == "dm-agent" and main != "dm-agent"


def test_a_batched_engines_step_is_kept_as_one_even_with_a_batch_of_one():
    """mark_step(1) (a serving engine with one request in flight) is a batched engine's step: its batch travels,
    so the monitor reads 1 token a step; mark_token's marks carry none. A session the agent gave up on takes the
    step's boundary too, without raising into the engine's loop."""
    s = sess.Session(wire.Attach(), None)
    s.on_token(0)
    s.on_token(5, 1)
    s.on_token(6, 4)
    assert s.marks[2::sess.MARK_FIELDS] == [None, 1, 4]
    closer = sess.Closer(None)
    with sess.ACTIVE.lock:
        sess.ACTIVE.session = closer
    try:
        closer.on_token(0, 3)
        assert sess.ACTIVE.session is None
    finally:
        sess.ACTIVE.session = None
