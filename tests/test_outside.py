"""llama-server watched from outside: no Python in it, so the monitor reads the server's own /slots as the token
clock (and the device-wide counters where there is a GPU).

The server is llama.cpp's real `llama-server`, CPU build (`benchmarks/llama_cpp_build.sh server`; `.ci/run`
builds it once and keeps it outside the clone), serving a tiny random-weight GGUF written by the benchmark loop's
writer; those tests are skipped where neither is found. The refusals run against real processes named
llama-server."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from decodemon.monitor.sources import outside
from decodemon.monitor.analysis.tokens import counter_stats, counter_throughput
from decodemon.probes import wire
from tests.conftest import assert_one_line_error, cli

LOOP_DIR = Path(__file__).parents[1] / "benchmarks" / "loops"


def _named_llama_server(*args: str, env=None) -> subprocess.Popen:
    """A real process (bash, sleeping) whose argv is llama-server's: `llama-server -c ... x ARGS`."""
    return subprocess.Popen(["bash", "-c", 'exec -a llama-server bash -c "sleep 60; :" x "$@"', "-", *args], env=env)


def _wait_exec(p: subprocess.Popen) -> None:
    """Until bash has exec'd into the process named llama-server."""
    t0 = time.monotonic()
    while not outside.is_llama_server(p.pid):
        assert time.monotonic() - t0 < 5
        time.sleep(0.01)


def test_a_llama_server_with_its_slots_off_is_one_line_that_says_how(tmp_path):
    p = _named_llama_server("--port", "8080", "--no-slots")
    try:
        _wait_exec(p)
        r = cli("attach", p.pid, "--json", "--seconds", 1)
        assert_one_line_error(r, r.returncode)
        assert r.returncode != 0 and "--no-slots" in r.stderr and "llama-server" in r.stderr
        assert p.poll() is None  # never harmed: nothing was loaded into it
    finally:
        p.kill()
        p.wait()


def test_an_endpoint_nobody_serves_is_one_line_naming_the_url():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = _named_llama_server(f"--port={port}")
    try:
        _wait_exec(p)
        assert outside.endpoint_of(p.pid) == (f"http://127.0.0.1:{port}/slots", "")
        for verb in (["attach", p.pid, "--json", "--seconds", 1], ["record", p.pid, "-o", "x.dmon", "--seconds", 1]):
            r = cli(*verb)
            assert_one_line_error(r, r.returncode)
            assert r.returncode != 0 and f"127.0.0.1:{port}/slots" in r.stderr
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("args, env, want", [
    ((), {"LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_PORT": "9123"}, ("http://127.0.0.1:9123/slots", "")),
    (("--host", "127.0.0.1,::1", "--port", "8081"), {}, ("http://127.0.0.1:8081/slots", "")),  # the first of a list
    (("--host", "[::1]", "--api-prefix", "/llm/", "--api-key", "k1,k2"), {}, ("http://[::1]:8080/llm/slots", "k1")),
    (("--host", "::"), {"LLAMA_API_KEY": "sekrit"}, ("http://[::1]:8080/slots", "sekrit")),
])
def test_the_endpoint_comes_from_the_servers_command_line_and_environment(args, env, want):
    p = _named_llama_server(*args, env={"PATH": "/usr/bin:/bin", **env})
    try:
        _wait_exec(p)
        assert outside.endpoint_of(p.pid) == want  # 0.0.0.0 and :: are read on loopback
    finally:
        p.kill()
        p.wait()


def _slot(i, task, n, busy=True, left=-1, held=0):
    return {"id": i, "id_task": task, "is_processing": busy, "n_prompt_tokens": held,
            "next_token": [{"n_decoded": n, "n_remain": left}]}


def test_steps_are_the_busiest_slots_count_and_tokens_every_slots():
    c = outside.StepCounter()
    assert c.read([_slot(0, 7, 10), _slot(1, 8, 3)]) == (0, 0, 2, 0, 0)  # the first read only sets where counts stand
    assert c.read([_slot(0, 7, 40), _slot(1, 8, 33)]) == (30, 60, 2, 0, 0)  # one step gave each request a token
    # a slot still reading its prompt (no token decoded yet) is not decoding
    assert outside.StepCounter().read([_slot(0, 7, 0), _slot(1, 8, 3)])[2] == 1
    # slot 0 began a new request, slot 1 finished: two ends; the old request's last tokens unknown (no budget)
    assert c.read([_slot(0, 9, 5), _slot(1, 8, 50, busy=False)]) == (47, 82, 1, 2, 0)
    # a request 4 tokens short of its budget ended: those 4, then 6 of the next, and the interval is an end's
    assert c.read([_slot(0, 9, 36, left=4), _slot(1, 8, 50, busy=False)]) == (78, 113, 1, 0, 0)
    assert c.read([_slot(0, 10, 6), _slot(1, 8, 50, busy=False)]) == (88, 123, 1, 1, 0)
    assert c.read([_slot(0, 10, 20), _slot(1, 8, 50, busy=False)]) == (102, 137, 1, 0, 0)  # decoding on: no end


def test_the_kv_depth_is_the_positions_the_decoding_requests_hold():
    """A step reads the KV of every request it decodes: the depth is their `n_prompt_tokens` (prompt and generated
    tokens) summed; a slot still reading its prompt, or idle, holds none the step reads."""
    c = outside.StepCounter()
    assert c.read([_slot(0, 7, 10, held=4010), _slot(1, 8, 3, held=513)])[4] == 4523
    assert c.read([_slot(0, 7, 0, held=4000), _slot(1, 8, 3, busy=False, held=513)])[4] == 0


def _counts(t, steps, busy, ended=None):
    return {"t_ns": np.asarray(t, float), "steps": np.asarray(steps, float), "busy": np.asarray(busy, float),
            "ended": np.zeros(len(t)) if ended is None else np.asarray(ended, float),
            "tokens": np.asarray(steps, float) * 2}


def test_the_counter_clock_counts_only_intervals_in_which_the_server_generated():
    # reads 250 ms apart: 50 steps each while a request runs, then an idle second between requests
    t = np.arange(12) * 250e6
    busy = [1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    steps = np.cumsum([0, 50, 50, 50, 50, 10, 0, 0, 0, 2, 50, 50])
    ts = counter_stats(_counts(t, steps, busy))
    assert ts.tokens == 300  # the six intervals with requests at both ends; not the tail of one, head of the next
    assert ts.ms_per_token == pytest.approx(5.0) and ts.tokens_per_s == pytest.approx(200.0)
    assert counter_throughput(_counts(t, steps, busy)) == pytest.approx(400.0)  # two requests a step
    ended = [0] * 11 + [1]  # a request ended in the last interval: its last steps were not seen
    assert counter_stats(_counts(t, steps, busy, ended)).tokens == 250
    assert counter_stats(_counts(t[:6], steps[:6] * 0, busy[:6])) is None  # no step made: no clock
    # a prompt read or a reply sent (no request decoding at a read) is not a decode step's time ...
    assert counter_stats(_counts(t[:5], [0, 50, 50, 100, 150], [1, 1, 0, 1, 1])).ms_per_token == pytest.approx(5.0)
    # ... but an interval with requests decoding at both reads and no step in it is: a step longer than the
    # interval (a slow model, a server that got no CPU); left out, the server would read fast
    assert counter_stats(_counts(t[:4], [0, 50, 50, 100], [1, 1, 1, 1])).ms_per_token == pytest.approx(7.5)
    slow = counter_stats(_counts(np.arange(9) * 50e6, [0, 0, 1, 1, 1, 2, 2, 2, 3], [1] * 9))  # 120 ms a step
    assert slow.ms_per_token == pytest.approx(400 / 3)


# -- the real server ---------------------------------------------------------------------------------------------

SERVER = shutil.which("llama-server")
needs_server = pytest.mark.skipif(SERVER is None, reason="no llama-server on PATH (benchmarks/llama_cpp_build.sh "
                                                         "server)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    if SERVER is None:
        pytest.skip("no llama-server on PATH")
    pytest.importorskip("gguf")
    sys.path.insert(0, str(LOOP_DIR))
    from llama_cpp_decode import write_gguf

    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny")


class Server:
    """A real llama-server on the tiny GGUF, and `clients` users sending requests back to back; `done` holds each
    request's (start, end, tokens, the server's own generation ms). The long prompt (kept in the server's cache
    from one request to the next) keeps the depth, and with it the step's time, nearly the same through a
    request (2,000 to 2,400 tokens): on this model a step at depth 1,500 takes ~6x one at 200, and a span that cuts
    requests elsewhere
    than the server's own figures do would then read another rate."""

    def __init__(self, gguf, slots: int = 1, clients: int = 1, n_predict: int = 400, prompt: str = "hello " * 250,
                 env: dict | None = None, args: tuple = ()) -> None:
        port = _free_port()
        self.proc = subprocess.Popen([SERVER, "-m", str(gguf), "--port", str(port), "-c", str(4096 * slots),
                                      "-np", str(slots), "-t", "1", "--no-warmup", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.base, self.pid = f"http://127.0.0.1:{port}", self.proc.pid
        self.done: list[tuple[float, float, int, float]] = []
        self._stop = threading.Event()
        t0 = time.monotonic()
        while not self._healthy():
            assert self.proc.poll() is None, "llama-server ended"
            assert time.monotonic() - t0 < 60, "llama-server did not come up"
            time.sleep(0.2)
        body = json.dumps({"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0}).encode()
        for _ in range(clients):
            threading.Thread(target=self._client, args=(body,), daemon=True).start()
        while len(self.done) < clients:
            assert time.monotonic() - t0 < 120, "no request finished"
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def _client(self, body: bytes) -> None:
        while not self._stop.is_set():
            req = urllib.request.Request(self.base + "/completion", data=body,
                                         headers={"Content-Type": "application/json"})
            t_a = time.time()
            try:
                timings = json.loads(urllib.request.urlopen(req, timeout=120).read())["timings"]
            except (OSError, KeyError, ValueError):
                time.sleep(0.1)
                continue
            self.done.append((t_a, time.time(), timings["predicted_n"], timings["predicted_ms"]))

    def close(self) -> None:
        self._stop.set()
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def server(gguf):
    s = Server(gguf)
    yield s.proc, s.done
    s.close()


def _record_llama_server(s, post, out):
    """Record the server while requests run (see the test below): (the recording's --json, the requests, '') or
    (None, the requests, the record's stderr) where it measured nothing."""
    out.parent.mkdir()
    # Ctrl-C as a terminal sends it: a suite started in the background (`cmd &`) runs with SIGINT ignored, and
    # the record it starts would inherit that and read on past the requests
    rec = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "record", str(s.pid), "-o", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not any(out.parent.iterdir()):  # its first frame written: the watch has read /slots
        assert rec.poll() is None and time.monotonic() < deadline, rec.communicate()[1]
        time.sleep(0.05)
    done, t0 = [], time.monotonic()
    while (sum(d[1] for d in done) < 2000 or time.monotonic() - t0 < 3.0 or len(done) < 2) \
            and time.monotonic() - t0 < 60:
        a = time.time()
        t = post()["timings"]
        done.append((t["predicted_n"], t["predicted_ms"], a, time.time()))
    time.sleep(0.3)  # a few reads with nothing generating: the last request's end is seen
    rec.send_signal(signal.SIGINT)
    _, err = rec.communicate(timeout=60)
    if not out.exists():
        return None, done, err
    return json.loads(cli("replay", out, "--json").stdout), done, ""


@pytest.mark.timing
@needs_server
def test_llama_server_tokens_per_s_matches_its_own_metrics(gguf, tmp_path):
    """decodemon's reading of the server's step count against the server's own rate (tokens over its generation
    milliseconds, as it reports them for each request), over the same requests: a recording is started, the
    test sends requests one after another until they hold 2 s of generation and 3 s have passed (a busy machine
    that starves the watch of reads makes that take longer), then ends the recording (Ctrl-C keeps it). The
    server's own rate is over the requests that ran inside the summary's span. A busy machine slows the requests
    and both figures with them; it cannot put them apart. A recording that counted no interval between reads (a cold
    CI run beside two busy loops: "no token was measured") is made again, up to three times, with what its reads
    saw printed."""
    s = Server(gguf, clients=0)
    try:
        body = json.dumps({"prompt": "hello " * 250, "n_predict": 400, "ignore_eos": True, "temperature": 0}).encode()
        post = lambda: json.loads(urllib.request.urlopen(urllib.request.Request(  # noqa: E731
            s.base + "/completion", data=body, headers={"Content-Type": "application/json"}), timeout=120).read())
        post()  # the prompt into the server's cache: every request after it decodes at the same depth
        prompt_tokens = len(json.loads(urllib.request.urlopen(urllib.request.Request(
            s.base + "/tokenize", data=json.dumps({"content": "hello " * 250}).encode(),
            headers={"Content-Type": "application/json"}), timeout=60).read())["tokens"])
        for attempt in range(3):  # a watch that read nothing it could count says so, with its reads: again
            j, done, err = _record_llama_server(s, post, tmp_path / f"rec{attempt}" / "server.dmon")
            if j is not None:
                break
            print(f"attempt {attempt + 1}: {err.strip()}")
            assert "no token was measured (the server's /slots read" in err, err
        assert j is not None, err
    finally:
        s.close()
    lo = j["span_end_unix_s"] - j["span_s"]  # the requests the summary's span holds (the last one at least)
    inside = [d for d in done if d[2] >= lo] or done[-1:]
    own = sum(d[0] for d in inside) / sum(d[1] for d in inside) * 1e3
    print(f"decodemon {j['tokens_per_s']} tok/s, llama-server's own {own:.1f} tok/s over {len(done)} requests")
    assert j["token_clock"] == "server_metrics" and j["tokens"] > 100
    assert j["tokens_per_s"] == pytest.approx(own, rel=0.03)
    # the model's bytes priced at the KV depth the server's /slots read: the prompt and up to 400 tokens after it
    assert prompt_tokens <= j["bytes_per_token_model_depth"] <= prompt_tokens + 401, (j["bytes_per_token_model_depth"],
                                                                                     prompt_tokens)
    assert "watched from outside" in j["probe"]["trace"]


@needs_server
def test_a_record_of_an_idle_server_says_what_its_reads_saw_and_leaves_no_file(gguf, tmp_path):
    s = Server(gguf, clients=0)
    try:
        r = cli("record", s.pid, "-o", tmp_path / "idle.dmon", "--seconds", 1)
    finally:
        s.close()
    assert r.returncode == 3 and not (tmp_path / "idle.dmon").exists()
    said = re.search(r"no token was measured \(the server's /slots read (\d+) times, 0 of them with a request "
                     r"decoding; 0 intervals", r.stderr)
    assert said and int(said.group(1)) >= 2, r.stderr


@needs_server
def test_a_server_with_decodemons_cupti_library_has_its_trace_beside_its_own_clock(gguf, tmp_path):
    """A real llama-server with the CUPTI injection library loaded (as `decodemon run` loads it; started at load
    here, where no cuInit comes): the outside watch keeps the server's own clock and takes the library's trace
    state over its socket (with no GPU, CUPTI's refusal), then detaches it, so the next attach is served too."""
    from decodemon.monitor.inject import cupti_lib

    try:
        lib = cupti_lib.build(tmp_path)
    except cupti_lib.BuildError as exc:
        pytest.skip(str(exc))
    s = Server(gguf, n_predict=100, env={**os.environ, "LD_PRELOAD": str(lib), "DECODEMON_CUPTI_START_AT_LOAD": "1"})
    try:
        assert wire.socket_path(s.pid).exists()
        for _ in range(2):
            r = cli("attach", s.pid, "--json", "--seconds", 2)
            assert r.returncode == 0, r.stderr
            j = json.loads(r.stdout)
            assert j["token_clock"] == "server_metrics" and j["tokens"] > 10
            assert j["probe"]["trace"].startswith("failed (cuptiActivityRegisterCallbacks: "), j["probe"]
        assert s.proc.poll() is None
    finally:
        s.close()


@needs_server
def test_a_recording_of_llama_server_replays_its_token_clock(server, tmp_path):
    proc, _ = server
    out = tmp_path / "server.dmon"
    r = cli("record", proc.pid, "-o", out, "--seconds", 3)
    assert r.returncode == 0, r.stderr
    frames = [f for _, f in wire.read_recording(out)]
    assert sum(isinstance(f, wire.StepCounts) for f in frames) >= 8
    j = json.loads(cli("replay", out, "--json").stdout)
    assert j["token_clock"] == "server_metrics" and j["tokens_per_s"] > 0


@needs_server
def test_the_exporter_watches_llama_server_from_outside(server, tmp_path):
    """`decodemon exporter`'s scan finds the server (no agent socket anywhere: an empty socket folder) and its
    snapshot carries the server's tokens a second."""
    from decodemon.monitor.exporter.collector import metric_families
    from decodemon.monitor.exporter.scan import Exporter

    proc, _ = server
    ex = Exporter(directory=tmp_path, only=lambda p: p == proc.pid)
    try:
        ex.scan()
        t0 = time.monotonic()
        while not [s for _, s in ex.targets() if s.tokens is not None]:
            assert time.monotonic() - t0 < 20, "the exporter never measured the server"
            time.sleep(0.2)
        labels, snap = ex.targets()[0]
        assert labels["pid"] == str(proc.pid) and labels["engine"] == "llama-server"
        assert snap.token_clock == "server_metrics" and snap.tokens.tokens_per_s > 100
        names = {f.name for f in metric_families(ex.targets())}
        assert "decodemon_seconds_per_token" in names
    finally:
        ex.stop()


@pytest.mark.timing
@needs_server
def test_two_requests_in_each_step_are_twice_the_throughput_of_one_sequences_rate(gguf):
    """-np 2 and two users: a step adds a token to each request, so the steps are the busiest slot's count and
    the throughput every slot's."""
    s = Server(gguf, slots=2, clients=2)
    try:
        j = json.loads(cli("attach", s.pid, "--json", "--seconds", 4).stdout)
        ratio = j["throughput_tokens_per_s"] / j["tokens_per_s"]
        print(f"{j['tokens_per_s']} tok/s a sequence, {j['throughput_tokens_per_s']} in all: {ratio:.2f}x")
        assert 1.6 <= ratio <= 2.01
        # the serving vocabulary: the slots in use as tokens a step, each slot's rate and the total
        assert j["tokens_per_step"] == pytest.approx(ratio, abs=0.01) and j["steps"] > 0
    finally:
        s.close()


@needs_server
def test_a_server_that_ends_mid_watch_ends_the_watch_with_what_was_measured(gguf):
    s = Server(gguf)
    try:
        attach = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(s.pid), "--json",
                                   "--seconds", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3.0)
        t_kill = time.monotonic()
        s.proc.kill()
        out, err = attach.communicate(timeout=20)
        assert time.monotonic() - t_kill < 5, "the watch did not end with the server"
        j = json.loads(out)
        assert j["ended"] == f"pid {s.pid} went away" and j["tokens_per_s"] > 0, err
    finally:
        s.close()


@needs_server
def test_a_quantized_kv_cache_is_priced_in_its_own_type_at_the_depth_slots_reads(tmp_path_factory, tmp_path):
    """llama-server with a q8_0 cache (`--cache-type-k/-v q8_0`), recorded by pid: the model's bytes a token are the
    weights a token reads plus the KV of the positions the decoding request holds (/slots' n_prompt_tokens), priced
    at q8_0's 34 bytes per 32 values, and --json names the type."""
    pytest.importorskip("gguf")
    sys.path.insert(0, str(LOOP_DIR))
    from llama_cpp_decode import write_gguf

    path = write_gguf(tmp_path_factory.mktemp("gguf32") / "tiny-kv32.gguf", "tiny-kv32")
    s = Server(path, clients=1, n_predict=2000, args=("--cache-type-k", "q8_0", "--cache-type-v", "q8_0"))
    try:
        out = tmp_path / "q8.dmon"
        r = cli("record", s.pid, "-o", out, "--seconds", 2)
        assert r.returncode == 0, r.stderr
    finally:
        s.close()
    j = json.loads(cli("replay", out, "--json").stdout)
    assert j["bytes_per_token_model_kv_dtype"] == "q8_0"
    depth = j["bytes_per_token_model_depth"]
    assert depth > 250  # the ~250-token prompt and the tokens after it, from /slots
    hello = next(f for _, f in wire.read_recording(out) if isinstance(f, wire.Hello))
    m = hello.model
    # K and V, 2 layers, 1 KV head of 32 values: 2 x 2 x 32 values, at 34 bytes per block of 32
    assert m.kv_dtype == "q8_0" and m.kv_bytes_per_position == 2 * 2 * 34
    assert j["bytes_per_token_model"] == m.weight_bytes + m.kv_bytes_per_position * depth
