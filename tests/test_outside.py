"""llama-server watched from outside: no Python in it, so the monitor reads the server's own metrics endpoint as
the token clock (and the device-wide counters where there is a GPU).

The server is llama.cpp's real `llama-server`, CPU build (`benchmarks/llama_cpp_build.sh server`; `.ci/run`
builds it once and keeps it outside the clone), serving a tiny random-weight GGUF written by the benchmark loop's
writer; those tests are skipped where neither is found. The refusals run against real processes named
llama-server."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from decodemon.monitor import outside
from decodemon.monitor.analysis.tokens import counter_stats
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


def test_a_llama_server_without_its_metrics_endpoint_is_one_line_that_says_how(tmp_path):
    p = _named_llama_server("--port", "8080")
    try:
        _wait_exec(p)
        r = cli("attach", p.pid, "--json", "--seconds", 1)
        assert_one_line_error(r, r.returncode)
        assert r.returncode != 0 and "--metrics" in r.stderr and "llama-server" in r.stderr
        assert p.poll() is None  # never harmed: nothing was loaded into it
    finally:
        p.kill()
        p.wait()


def test_a_metrics_endpoint_nobody_serves_is_one_line_naming_the_url():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = _named_llama_server("--metrics", f"--port={port}")
    try:
        _wait_exec(p)
        assert outside.endpoint_of(p.pid) == f"http://127.0.0.1:{port}/metrics"
        r = cli("attach", p.pid, "--json", "--seconds", 1)
        assert_one_line_error(r, r.returncode)
        assert r.returncode != 0 and f"127.0.0.1:{port}/metrics" in r.stderr
    finally:
        p.kill()
        p.wait()


def test_the_endpoint_comes_from_the_servers_environment_too():
    env = {"PATH": "/usr/bin:/bin", "LLAMA_ARG_ENDPOINT_METRICS": "1", "LLAMA_ARG_HOST": "0.0.0.0",
           "LLAMA_ARG_PORT": "9123"}
    p = _named_llama_server(env=env)
    try:
        _wait_exec(p)
        assert outside.endpoint_of(p.pid) == "http://127.0.0.1:9123/metrics"  # 0.0.0.0 is read on loopback
    finally:
        p.kill()
        p.wait()


def test_the_counter_clock_counts_only_intervals_in_which_the_server_generated():
    # scrapes 250 ms apart: 50 steps each while a request runs, then an idle second between requests
    t = np.arange(12) * 250e6
    busy = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1])
    steps = np.cumsum([0, 50, 50, 50, 50, 10, 0, 0, 0, 2, 50, 50])
    ts = counter_stats(t, steps, busy)
    assert ts.tokens == 300  # the six intervals with requests at both ends; not the tail of one, head of the next
    assert ts.ms_per_token == pytest.approx(5.0) and ts.tokens_per_s == pytest.approx(200.0)
    assert counter_stats(t[:6], steps[:6] * 0, busy[:6]) is None  # no step made: no clock


def test_prometheus_text_is_read_for_its_unlabelled_samples():
    text = ("# HELP llamacpp:n_decode_total Total llama_decode() calls\n# TYPE llamacpp:n_decode_total counter\n"
            "llamacpp:n_decode_total 1234\nllamacpp:requests_processing 1\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7\nbroken line here\n')
    assert outside.parse_metrics(text) == {"llamacpp:n_decode_total": 1234.0, "llamacpp:requests_processing": 1.0}


# -- the real server ---------------------------------------------------------------------------------------------

SERVER = shutil.which("llama-server")
needs_server = pytest.mark.skipif(SERVER is None, reason="no llama-server on PATH (benchmarks/llama_cpp_build.sh "
                                                         "server)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if SERVER is None:
        pytest.skip("no llama-server on PATH")
    pytest.importorskip("gguf")
    sys.path.insert(0, str(LOOP_DIR))
    from llama_cpp_decode import write_gguf

    gguf = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny")
    port = _free_port()
    proc = subprocess.Popen([SERVER, "-m", str(gguf), "--port", str(port), "--metrics", "-c", "4096", "-np", "1",
                             "-t", "1", "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, "llama-server ended"
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() - t0 < 60, "llama-server did not come up"
        time.sleep(0.2)
    stop = threading.Event()
    done: list[tuple[float, float, int, float]] = []  # each request: start, end (wall), tokens, the server's ms

    def client():  # a user's requests, back to back: long generations from a short prompt
        body = json.dumps({"prompt": "hello", "n_predict": 500, "ignore_eos": True, "temperature": 0}).encode()
        while not stop.is_set():
            req = urllib.request.Request(base + "/completion", data=body, headers={"Content-Type": "application/json"})
            t_a = time.time()
            try:
                timings = json.loads(urllib.request.urlopen(req, timeout=120).read())["timings"]
            except (OSError, KeyError, ValueError):
                time.sleep(0.1)
                continue
            done.append((t_a, time.time(), timings["predicted_n"], timings["predicted_ms"]))

    th = threading.Thread(target=client, daemon=True)
    th.start()
    while not done:
        assert time.monotonic() - t0 < 120, "no request finished"
        time.sleep(0.2)
    yield proc, done
    stop.set()
    proc.kill()
    proc.wait()


@needs_server
def test_llama_server_tokens_per_s_matches_its_own_metrics(server):
    """The server's own rate (tokens over its generation milliseconds, as it reports them for each request) over
    the requests made in the span the summary covers (its last 5 s), against decodemon's reading of the server's
    decode-step counter."""
    proc, done = server
    r = cli("attach", proc.pid, "--json", "--seconds", 6)
    t_b = time.time()
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    inside = [d for d in done if d[0] >= t_b - 5.0 and d[1] <= t_b]
    assert len(inside) >= 5, done[-10:]
    own = sum(d[2] for d in inside) / sum(d[3] for d in inside) * 1e3
    print(f"decodemon {j['tokens_per_s']} tok/s, llama-server's own {own:.1f} tok/s over {len(inside)} requests")
    assert j["token_clock"] == "server_metrics" and j["tokens"] > 100
    assert j["tokens_per_s"] == pytest.approx(own, rel=0.03)
    assert "watched from outside" in j["probe"]["trace"]
    assert proc.poll() is None


@needs_server
def test_a_recording_of_llama_server_replays_its_token_clock(server, tmp_path):
    proc, _ = server
    out = tmp_path / "server.dmon"
    r = cli("record", proc.pid, "-o", out, "--seconds", 3)
    assert r.returncode == 0, r.stderr
    frames = [f for _, f in wire.read_recording(out)]
    assert sum(isinstance(f, wire.ServerCounts) for f in frames) >= 8
    j = json.loads(cli("replay", out, "--json").stdout)
    assert j["token_clock"] == "server_metrics" and j["tokens_per_s"] > 0


@needs_server
def test_the_exporter_watches_llama_server_from_outside(server, tmp_path):
    """`decodemon exporter`'s scan finds the server (no agent socket anywhere: an empty socket folder) and its
    snapshot carries the server's tokens a second."""
    from decodemon.monitor.prometheus import Exporter, metric_families

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
