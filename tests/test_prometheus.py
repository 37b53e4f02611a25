"""Prometheus: decodemon's gauges from a watched loop, served through prometheus_client's custom collector, and
scraped by a real Prometheus server from the exporter attached to a CPU demo engine."""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from decodemon.monitor import prometheus as prom
from decodemon.monitor.sources import collect
from tests.conftest import REC, Engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(collector) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_collector_gauges_from_a_recordings_snapshot():
    sess = collect(REC["graph"])
    snap = sess.snapshot()
    labels = prom.target_labels(sess.feed.hello, 4242)
    got = _samples(prom.SnapshotCollector(lambda: [(labels, snap)]))
    base = (("engine", labels["engine"]), ("gpu", "0"), ("pid", "4242"))
    assert got[("decodemon_seconds_per_token", base)] == pytest.approx(snap.tokens.ms_per_token / 1e3)
    assert got[("decodemon_tokens_per_second", base)] == pytest.approx(snap.tokens.tokens_per_s)
    assert got[("decodemon_launches_per_token", base)] == pytest.approx(snap.window.kernels_per_token)
    assert got[("decodemon_gpu_busy_ratio", base)] == pytest.approx(snap.gpu_busy_pct / 100)
    assert got[("decodemon_bytes_per_token", base)] == pytest.approx(snap.bytes_per_token)
    assert got[("decodemon_tokens_total", base)] == snap.tokens_total
    verdicts = {dict(k[1])["ceiling"]: v for k, v in got.items() if k[0] == "decodemon_verdict"}
    assert verdicts[snap.rolling.ceiling] == 1.0 and sum(verdicts.values()) == 1.0
    ceilings = {dict(k[1])["ceiling"]: (dict(k[1])["unit"], v) for k, v in got.items()
                if k[0] == "decodemon_ceiling_value"}
    launch = snap.diagnosis.candidates["launch"]
    assert ceilings["launch"] == (launch.unit, pytest.approx(launch.value))


def test_collector_leaves_out_what_was_not_measured():
    got = _samples(prom.SnapshotCollector(lambda: []))
    assert not any(name.startswith("decodemon_") for name, _labels in got)


@pytest.mark.parametrize("text,want", [("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9000", ("0.0.0.0", 9000)),
                                       ("[::1]:9464", ("::1", 9464))])
def test_address_spellings(text, want):
    assert prom.parse_address(text) == want


@pytest.mark.parametrize("text", ["9464", "host:", "host:port", "h:70000", "h:0"])
def test_bad_address_is_one_clear_line(text):
    with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
        prom.parse_address(text)


def test_a_taken_port_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc = prom.run_exporter("127.0.0.1", s.getsockname()[1], stop=lambda: True)
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("decodemon exporter: cannot listen on 127.0.0.1:")


def _get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _query(api: str, expr: str) -> list:
    try:
        body = json.loads(_get(f"{api}/api/v1/query?query={urllib.parse.quote(expr)}"))
    except OSError:
        return []
    return body["data"]["result"] if body.get("status") == "success" else []


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="the prometheus binary is absent (Debian package `prometheus`)")
def test_prometheus_scrapes_the_exporter_attached_to_a_cpu_engine(tmp_path):
    engine = Engine()
    exporter = prom.Exporter(only=lambda pid: pid == engine.pid)  # other engines on this host are not ours
    done = threading.Event()
    port, prom_port = _free_port(), _free_port()
    serving = threading.Thread(target=prom.run_exporter, args=("127.0.0.1", port),
                               kwargs={"scan_every_s": 0.5, "stop": done.is_set, "exporter": exporter}, daemon=True)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: decodemon\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    server = None
    try:
        assert engine.pid in prom.attachable_pids()
        serving.start()
        server = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        api = f"http://127.0.0.1:{prom_port}"
        series, deadline = [], time.monotonic() + 25
        while time.monotonic() < deadline and not series:
            time.sleep(0.5)
            series = [r for r in _query(api, "decodemon_tokens_per_second")
                      if r["metric"].get("pid") == str(engine.pid)]
        assert series, "Prometheus returned no decodemon_tokens_per_second series for the engine"
        metric = series[0]["metric"]
        assert metric["job"] == "decodemon" and metric["engine"] == "demo.py" and "gpu" not in metric
        assert float(series[0]["value"][1]) > 0
        spt = _query(api, f'decodemon_seconds_per_token{{pid="{engine.pid}"}}')
        assert spt and 0 < float(spt[0]["value"][1]) < 10
    finally:
        done.set()
        serving.join(15)
        if server is not None:
            server.terminate()
            server.wait(10)
        engine.stop()


def test_serve_pid_serves_one_process_metrics(engine):
    port, done, rc = _free_port(), threading.Event(), []
    t = threading.Thread(target=lambda: rc.append(prom.serve_pid(engine.pid, "127.0.0.1", port, stop=done.is_set)),
                         daemon=True)
    t.start()
    try:
        found, deadline = [], time.monotonic() + 20
        while time.monotonic() < deadline and not found:
            time.sleep(0.3)
            try:
                text = _get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                continue
            found = [s for fam in text_string_to_metric_families(text) for s in fam.samples
                     if s.name == "decodemon_tokens_per_second" and s.labels["pid"] == str(engine.pid)]
        assert found and found[0].value > 0
    finally:
        done.set()
        t.join(15)
    assert rc == [0]


def test_serve_pid_without_an_agent_is_one_line(capsys):
    assert prom.serve_pid(2**22 + 1, "127.0.0.1", _free_port()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no process with pid" in err[0]


def _engine_samples(port: int, pid: int) -> dict:
    """The exporter's samples for `pid` in one scrape: name -> value (the verdict's ceiling label dropped)."""
    text = _get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.labels.get("pid") == str(pid) and "ceiling" not in s.labels}


def test_an_attach_beside_the_exporter_leaves_its_series_continuous(engine):
    """The exporter yields: a user's attach to a loop it watches is served, never `busy`, and every scrape meanwhile
    still has the loop's series (held at their last values); the exporter watches it again as soon as the user
    detaches, and decodemon_tokens_total goes on from where it was, never from 0."""
    port = _free_port()
    exporter = prom.Exporter(only=lambda p: p == engine.pid)
    server = prom.start_server(prom.SnapshotCollector(exporter.targets), "127.0.0.1", port)
    scrapes, done = [], threading.Event()

    def scrape_every_200_ms():
        while not done.wait(0.2):
            scrapes.append(_engine_samples(port, engine.pid))

    scraper = threading.Thread(target=scrape_every_200_ms, daemon=True)
    try:
        exporter.scan()
        t_end = time.monotonic() + 30
        while not any(snap.tokens for _labels, snap in exporter.targets()) and time.monotonic() < t_end:
            time.sleep(0.2)
        assert exporter.targets(), "the exporter never timed the engine's tokens"
        watch = exporter.watches[engine.pid]
        scraper.start()
        t_end = time.monotonic() + 10
        while len(scrapes) < 2 and time.monotonic() < t_end:
            time.sleep(0.1)
        before = scrapes[-1]["decodemon_tokens_total"]
        r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(engine.pid), "--json",
                            "--seconds", "2"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "busy" not in r.stderr, r.stderr
        assert json.loads(r.stdout)["tokens"] > 0
        t_end = time.monotonic() + 30
        while not (watch.attaches >= 2 and scrapes and scrapes[-1]["decodemon_tokens_total"] > before):
            assert time.monotonic() < t_end, f"the exporter did not watch again: {watch.ended or watch.lent}"
            time.sleep(0.1)
        assert watch.running and watch.ended is None
        done.set()
        scraper.join(15)
        totals = [s.get("decodemon_tokens_total") for s in scrapes]
        assert all(s.get("decodemon_seconds_per_token") for s in scrapes), "a scrape without the loop's series"
        assert None not in totals and totals == sorted(totals), totals
    finally:
        done.set()
        exporter.stop()
        server.shutdown()
