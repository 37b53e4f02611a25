"""Prometheus: decodemon's gauges from a watched loop, served through prometheus_client's custom collector, and
scraped by a real Prometheus server from the exporter attached to a CPU demo engine."""

from __future__ import annotations

import argparse
import json
import os
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

from decodemon.monitor.exporter import collector, scan, serve, watch
from decodemon.monitor.feed import Feed
from decodemon.monitor.sources.collect import collect
from decodemon.probes import wire
from tests.conftest import DATA, REC, Engine


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


def test_a_batched_engines_tokens_per_second_counts_every_sequence():
    sess = collect(DATA / "h200_hf_cb_16.dmon")  # 16 requests a step
    snap = sess.snapshot()
    labels = collector.target_labels(sess.feed.hello, 4242)
    got = {k[0]: v for k, v in _samples(collector.SnapshotCollector(lambda: [(labels, snap)])).items()}
    assert got["decodemon_tokens_per_step"] == snap.tokens_per_step == 16
    # the engine's throughput, not its steps a second (~19.5)
    assert got["decodemon_tokens_per_second"] == pytest.approx(snap.throughput_tokens_per_s)
    assert got["decodemon_tokens_per_second"] > 10 * snap.tokens.tokens_per_s
    # bytes a token as --json says them: the step's over the tokens in it
    from decodemon.monitor.render import summary_json

    assert got["decodemon_bytes_per_token"] == pytest.approx(summary_json(snap)["bytes_per_token"], rel=1e-3)
    assert got["decodemon_bytes_per_token"] == pytest.approx(snap.bytes_per_token / 16)


def test_collector_gauges_from_a_recordings_snapshot():
    sess = collect(REC["graph"])
    snap = sess.snapshot()
    labels = collector.target_labels(sess.feed.hello, 4242)
    got = _samples(collector.SnapshotCollector(lambda: [(labels, snap)]))
    base = (("engine", labels["engine"]), ("gpu", "0"), ("pid", "4242"))
    assert got[("decodemon_seconds_per_token", base)] == pytest.approx(snap.tokens.ms_per_token / 1e3)
    assert got[("decodemon_tokens_per_second", base)] == pytest.approx(snap.tokens.tokens_per_s)
    assert got[("decodemon_kernels_per_token", base)] == pytest.approx(snap.window.kernels_per_token)
    assert got[("decodemon_gpu_busy_ratio", base)] == pytest.approx(snap.gpu_busy_pct / 100)
    assert got[("decodemon_bytes_per_token", base)] == pytest.approx(snap.bytes_per_token)
    assert got[("decodemon_tokens_total", base)] == snap.tokens_total
    verdicts = {dict(k[1])["ceiling"]: v for k, v in got.items() if k[0] == "decodemon_verdict"}
    assert verdicts[snap.rolling.ceiling] == 1.0 and sum(verdicts.values()) == 1.0
    ceilings = {dict(k[1])["ceiling"]: (dict(k[1])["unit"], v) for k, v in got.items()
                if k[0] == "decodemon_ceiling_value"}
    launch = snap.diagnosis.candidates["launch"]
    assert ceilings["launch"] == (launch.unit, pytest.approx(launch.value))


def test_collector_flags_series_that_are_not_current():
    sess = collect(REC["graph"])
    snap = sess.snapshot()
    labels = collector.target_labels(sess.feed.hello, 4242)
    base = (("engine", labels["engine"]), ("gpu", "0"), ("pid", "4242"))
    got = _samples(collector.SnapshotCollector(lambda: [(labels, snap, collector.Currency(False, 3.5, 120))]))
    assert got[("decodemon_watch_up", base)] == 0.0
    assert got[("decodemon_snapshot_age_seconds", base)] == 3.5
    assert got[("decodemon_tokens_estimated_total", base)] == 120
    assert got[("decodemon_tokens_total", base)] == snap.tokens_total
    got = _samples(collector.SnapshotCollector(lambda: [(labels, snap, collector.Currency(True, 0.2))]))
    assert got[("decodemon_watch_up", base)] == 1.0 and got[("decodemon_tokens_estimated_total", base)] == 0


def _marks_feed(t0_s: float, seconds: float, per_s: int) -> Feed:
    """A feed of token marks on the engine's clock: `per_s` a second for `seconds` from `t0_s`."""
    feed = Feed()
    t = [int((t0_s + i / per_s) * 1e9) for i in range(int(seconds * per_s))]
    feed.add(0, wire.TokenMarks(t_ns=wire.Column.of(t), depth=wire.Column.of([1] * len(t))))
    return feed


def test_the_tokens_of_a_lent_stretch_are_estimated_at_the_rate_on_either_side():
    """1,000 tokens a second before and after a 4 s stretch another monitor had the agent, an agent that does not
    say what it sent: about 4,000 made then, less the first one after, which the new attach counts; never more than
    the time the watch was away allows (a loop idle while watched made none)."""
    w = watch.Watch(os.getpid())
    before, after = _marks_feed(100.0, 12.0, 1000), _marks_feed(116.0, 2.0, 1000)
    t, counted = watch._token_points(before)
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, None)
    assert w._lent(after, hello_at=54.0, sent=None) == (0, pytest.approx(4000, abs=3))
    assert w._lent_from is None  # once a stretch
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, None)
    assert w._lent(after, hello_at=51.0, sent=None) == (0, pytest.approx((1 + watch.LENT_SLACK_S) * 1000, abs=3))
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, None)
    assert w._lent(_marks_feed(116.0, 0.0005, 1000), hello_at=54.0, sent=None) is None  # one point: not yet


def test_the_tokens_another_monitor_got_are_counted_not_estimated():
    """The agent's hello says what it sent over every attach: of a 4 s stretch, the 3.0 s another monitor had the
    agent made the 6,000 tokens it sent then (twice the rate the watch saw: a loop faster while the watch's own
    work was off the host), and only the 1 s no monitor had it is estimated at the watch's rate."""
    w = watch.Watch(os.getpid())
    before, after = _marks_feed(100.0, 12.0, 1000), _marks_feed(116.0, 2.0, 1000)
    t, counted = watch._token_points(before)
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, (12_000, 12.0, 1))
    others, estimated = w._lent(after, hello_at=54.0, sent=(18_000, 15.0, 2))
    assert others == 6000 and estimated == pytest.approx(1000, abs=3)
    # the other attach's first mark ended a token of the moments between, which it counted: left out of the estimate
    # (an agent that does not say how many attaches marked leaves it in)
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, (12_000, 12.0))
    assert w._lent(after, hello_at=54.0, sent=(18_000, 15.0))[1] == estimated + 1
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, (12_000, 12.0, 1))
    assert w._lent(after, hello_at=54.0, sent=(18_000, 15.0, 4))[1] == estimated - 2  # three others: two more
    # an agent whose count went back (another process at the pid, a stale hello) is counted as nothing sent
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, (12_000, 12.0))
    assert w._lent(after, hello_at=54.0, sent=(11_000, 11.0)) == (0, pytest.approx(4000, abs=3))
    # another monitor's marks that span the whole stretch leave nothing to estimate
    w._lent_from = (float(t[-1]), watch._span(t, counted, at_end=True), 50.0, (12_000, 12.0))
    assert w._lent(after, hello_at=54.0, sent=(20_000, 17.0)) == (8000, 0)


def test_collector_leaves_out_what_was_not_measured():
    got = _samples(collector.SnapshotCollector(lambda: []))
    assert not any(name.startswith("decodemon_") for name, _labels in got)


@pytest.mark.parametrize("text,want", [("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9000", ("0.0.0.0", 9000)),
                                       ("[::1]:9464", ("::1", 9464))])
def test_address_spellings(text, want):
    assert serve.parse_address(text) == want


@pytest.mark.parametrize("text", ["9464", "host:", "host:port", "h:70000", "h:0"])
def test_bad_address_is_one_clear_line(text):
    with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
        serve.parse_address(text)


def test_a_taken_port_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc = serve.run_exporter("127.0.0.1", s.getsockname()[1], stop=lambda: True)
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
    exporter = scan.Exporter(only=lambda pid: pid == engine.pid)  # other engines on this host are not ours
    done = threading.Event()
    port, prom_port = _free_port(), _free_port()
    serving = threading.Thread(target=serve.run_exporter, args=("127.0.0.1", port),
                               kwargs={"scan_every_s": 0.5, "stop": done.is_set, "exporter": exporter}, daemon=True)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: decodemon\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    server = None
    try:
        assert engine.pid in scan.attachable_pids()
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


def scrape_until(port: int, name: str, pid: int, seconds: float) -> tuple[list, str]:
    """Scrape /metrics until a sample `name` of `pid` is served (or `seconds` pass): (those samples, the text)."""
    found, text, deadline = [], "", time.monotonic() + seconds
    while time.monotonic() < deadline and not found:
        time.sleep(0.3)
        try:
            text = _get(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            continue
        found = [s for fam in text_string_to_metric_families(text) for s in fam.samples
                 if s.name == name and s.labels["pid"] == str(pid)]
    return found, text


def test_serve_pid_serves_one_process_metrics(engine):
    port, done, rc = _free_port(), threading.Event(), []
    t = threading.Thread(target=lambda: rc.append(serve.serve_pid(engine.pid, "127.0.0.1", port, stop=done.is_set)),
                         daemon=True)
    t.start()
    try:
        found, _ = scrape_until(port, "decodemon_tokens_per_second", engine.pid, 20)
        assert found and found[0].value > 0
    finally:
        done.set()
        t.join(15)
    assert rc == [0]


def test_serve_pid_without_an_agent_is_one_line(capsys):
    assert serve.serve_pid(2**22 + 1, "127.0.0.1", _free_port()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no process with pid" in err[0]


def _engine_samples(port: int, pid: int) -> dict:
    """The exporter's samples for `pid` in one scrape: name -> value (the verdict's ceiling label dropped)."""
    text = _get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.labels.get("pid") == str(pid) and "ceiling" not in s.labels}


def _loop_tokens(times: list[float], lo: float, hi: float) -> int:
    """The demo loop's own count of the tokens it ended in [lo, hi] (unix s), from its times file."""
    import bisect

    return bisect.bisect_right(times, hi) - bisect.bisect_left(times, lo)


@pytest.mark.timing
def test_an_attach_beside_the_exporter_leaves_its_series_continuous(tmp_path, monkeypatch):
    """The exporter yields: a user's attach to a loop it watches is served, never `busy`, and every scrape meanwhile
    still has the loop's series (held at their last values, decodemon_watch_up 0); the exporter watches it again
    as soon as the user detaches, and decodemon_tokens_total, which never decreases, then holds the tokens the
    loop made meanwhile, checked against the loop's own count: those the user's attach got, by the agent's count,
    and those made while no monitor had the agent, estimated (decodemon_tokens_estimated_total)."""
    times_file = tmp_path / "times.json"
    engine = Engine("--times-file", str(times_file))
    attaches = []  # per attach of the exporter: [first, last] token mark it got (engine clock, ns), if any
    real_frames = watch._live_frames

    def frames_seen(*args, **kwargs):
        marks = []
        attaches.append(marks)
        for rx, payload, frame in real_frames(*args, **kwargs):
            if isinstance(frame, wire.TokenMarks) and len(frame.t_ns.data):
                t = frame.t_ns.array()
                marks[:] = [marks[0] if marks else int(t[0]), int(t[-1])]
            yield rx, payload, frame

    monkeypatch.setattr(watch, "_live_frames", frames_seen)
    port = _free_port()
    exporter = scan.Exporter(only=lambda p: p == engine.pid)
    server = serve.start_server(collector.SnapshotCollector(exporter.series), "127.0.0.1", port)
    scrapes, done = [], threading.Event()

    def scrape_every_200_ms():
        while not done.wait(0.2):
            scrapes.append((time.monotonic(), _engine_samples(port, engine.pid)))

    scraper = threading.Thread(target=scrape_every_200_ms, daemon=True)
    try:
        exporter.scan()
        t_end = time.monotonic() + 30
        while not any(snap.tokens for _labels, snap in exporter.targets()) and time.monotonic() < t_end:
            time.sleep(0.2)
        assert exporter.targets(), "the exporter never timed the engine's tokens"
        watched = exporter.watches[engine.pid]
        scraper.start()
        t_end = time.monotonic() + 10
        while len(scrapes) < 2 and time.monotonic() < t_end:
            time.sleep(0.1)
        before = scrapes[-1][1]["decodemon_tokens_total"]
        t_user = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(engine.pid), "--json",
                            "--seconds", "3"], capture_output=True, text=True, timeout=120)
        t_user_end = time.monotonic()
        assert r.returncode == 0 and "busy" not in r.stderr, r.stderr
        user_tokens = json.loads(r.stdout)["tokens"]
        assert user_tokens > 0
        t_end = time.monotonic() + 30
        while not (watched.attaches >= 2 and scrapes and scrapes[-1][1].get("decodemon_watch_up") == 1
                   and scrapes[-1][1]["decodemon_tokens_total"] > before):
            assert time.monotonic() < t_end, f"the exporter did not watch again: {watched.ended or watched.lent}"
            time.sleep(0.1)
        assert watched.running and watched.ended is None
        time.sleep(1.5)
        done.set()
        scraper.join(15)
        exporter.stop()  # the watch's last snapshot: every token it got
        total, estimated, others = watched.latest.tokens_total, watched.tokens_estimated, watched.tokens_others
    finally:
        done.set()
        exporter.stop()
        server.shutdown()
        engine.stop()
    values = [v for _t, v in scrapes]
    totals = [v.get("decodemon_tokens_total") for v in values]
    assert all(v.get("decodemon_seconds_per_token") for v in values), "a scrape without the loop's series"
    assert None not in totals and totals == sorted(totals), totals
    # the series were flagged stale while the user held the agent, and current before and after
    during = [v["decodemon_watch_up"] for t, v in scrapes if t_user < t < t_user_end]
    assert values[0]["decodemon_watch_up"] == 1 and values[-1]["decodemon_watch_up"] == 1
    assert 0 in during, during
    # the tokens made while the user held the agent are in the count once the exporter has it back: those the
    # user's own attach counted, by the agent's count, and an estimate for the moments no monitor had it
    attaches = [a for a in attaches if a]  # those that got the agent, not the asks it answered busy
    assert len(attaches) == 2, attaches
    assert values[-1]["decodemon_tokens_estimated_total"] == estimated, (values[-1], estimated)
    loop_times = json.loads(times_file.read_text())["end_unix_s"]
    unix_minus_mono = time.time() - time.monotonic()  # perf_counter and monotonic: one clock on Linux

    def unix(ns):
        return ns / 1e9 + unix_minus_mono

    (first, left), (back, last) = attaches
    # a token's end is stamped just after its mark
    counted = _loop_tokens(loop_times, unix(first), unix(left) + 1e-4) + _loop_tokens(loop_times, unix(back),
                                                                                       unix(last) + 1e-4)
    made_meanwhile = _loop_tokens(loop_times, unix(left) + 1e-4, unix(back))
    print(f"counted {counted} by the exporter's attaches, {others} by the agent for the user's (the user's attach "
          f"counted {user_tokens}), estimated {estimated}; the loop made {made_meanwhile} while lent")
    # the user's tokens are the agent's count, the exporter's own its marks: within a token or two of the loop's
    assert others == pytest.approx(user_tokens, abs=2)
    assert total - estimated - others == pytest.approx(counted, rel=0.01)
    # only the moments between the attaches are estimated, at the rate on either side: the whole stretch's count
    # is the loop's within 20%, however differently fast the loop ran while the user held the agent
    assert estimated < 0.5 * made_meanwhile
    assert others + estimated == pytest.approx(made_meanwhile, rel=0.2)
    assert made_meanwhile > 0.2 * (counted + made_meanwhile)  # what a count that left them out would be short by
