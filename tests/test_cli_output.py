"""Where results go: `-o` paths that cannot be written, and recordings that hold nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REC, assert_one_line_error, cli

FAKE_AGENT = """
import os, socket
from decodemon.probes import wire
path = wire.socket_path(os.getpid())
path.parent.mkdir(parents=True, exist_ok=True)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(str(path))
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
conn.recv(1 << 16)
conn.close()  # the target goes away before it decoded a token
srv.close()
os.unlink(path)
"""


def bad_outputs(tmp_path):
    """A missing directory, an existing directory, a file used as a directory, a place nobody may write."""
    (tmp_path / "plain").write_text("x")
    return {"missing dir": tmp_path / "nope" / "x.dmon", "a directory": tmp_path,
            "file as dir": tmp_path / "plain" / "x.dmon", "unwritable": "/proc/decodemon-out.dmon"}


@pytest.mark.parametrize("case", ["missing dir", "a directory", "file as dir", "unwritable"])
def test_record_to_a_bad_output_is_one_line_and_leaves_nothing(tmp_path, sleeper, case):
    out = bad_outputs(tmp_path)[case]
    before = sorted(os.listdir(tmp_path))
    r = cli("record", sleeper.pid, "-o", out, "--seconds", "1")
    assert_one_line_error(r)
    assert str(out) in r.stderr
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("case", ["missing dir", "a directory", "file as dir", "unwritable"])
def test_report_to_a_bad_output_is_one_line(tmp_path, case):
    out = bad_outputs(tmp_path)[case]
    r = cli("report", REC["graph"], "-o", out)
    assert_one_line_error(r)
    assert str(out) in r.stderr and r.stdout == ""


def test_report_writes_its_file_whole(tmp_path):
    out = tmp_path / "DIAGNOSIS.md"
    r = cli("report", REC["graph"], "--output", out)
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith("#") and os.listdir(tmp_path) == ["DIAGNOSIS.md"]


def test_record_of_a_process_without_agent_leaves_no_file(tmp_path, sleeper):
    out = tmp_path / "x.dmon"
    r = cli("record", sleeper.pid, "-o", out, "--seconds", "1")
    assert_one_line_error(r)
    assert os.listdir(tmp_path) == []


def test_record_of_a_target_that_goes_away_leaves_no_file(tmp_path):
    target = subprocess.Popen([sys.executable, "-c", FAKE_AGENT], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        out = tmp_path / "x.dmon"
        r = cli("record", target.pid, "-o", out, "--seconds", "5")
        assert_one_line_error(r, rc=3)
        assert "went away" in r.stderr and "nothing written" in r.stderr
        assert os.listdir(tmp_path) == []
    finally:
        target.kill()
        target.wait()


def test_a_header_only_recording_is_not_zero_tokens_and_success(tmp_path):
    from decodemon.probes import wire

    path = tmp_path / "header.dmon"
    w = wire.RecordingWriter(path, wire.RecordingHeader(wire_version=wire.WIRE_VERSION, created_unix_s=time.time(),
                                                        decodemon_version="0", source="pid 1"))
    w.close()
    for verb in (["replay", path, "--json"], ["report", path, "--json"], ["compare", path, REC["graph"], "--json"]):
        r = cli(*verb)
        assert_one_line_error(r, rc=3)
        assert str(path) in r.stderr and "no tokens" in r.stderr


def test_run_with_a_bad_pid_file_starts_nothing(tmp_path):
    marker = tmp_path / "started"
    r = cli("run", "--pid-file", tmp_path / "nope" / "pid", "--", sys.executable, "-c",
            f"open({str(marker)!r}, 'w').close()")
    assert_one_line_error(r)
    assert "nope" in r.stderr and not marker.exists()


def test_a_recording_stopped_with_sigterm_keeps_what_it_has_and_no_part_file(tmp_path):
    """`kill PID` on `decodemon record` ends it as Ctrl-C does: the file holds the tokens so far, with the
    user's usual permissions, and no hidden temporary file is left."""
    import signal
    import stat

    from decodemon.probes import wire
    from tests.conftest import Engine

    e = Engine()
    try:
        out = tmp_path / "run.dmon"
        rec = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "record", str(e.pid), "-o", str(out),
                                "--seconds", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4)
        rec.send_signal(signal.SIGTERM)
        _, err = rec.communicate(timeout=30)
        assert rec.returncode == 130, err
        assert err.strip() == f"decodemon record: stopped by an interrupt: what arrived before it is kept in {out}"
        assert sorted(os.listdir(tmp_path)) == ["run.dmon"]
        frames = [f for _, f in wire.read_recording(out)]
        assert sum(isinstance(f, wire.TokenMarks) for f in frames) > 0
        # it ends as a detach does, saying how: a replay of it tells why it stopped
        assert isinstance(frames[-1], wire.Bye) and frames[-1].reason.startswith("stopped by an interrupt")
        r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "replay", str(out), "--json"],
                           capture_output=True, text=True, timeout=60)
        assert json.loads(r.stdout)["ended"].startswith("stopped by an interrupt"), r.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    finally:
        e.stop()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_interrupt_inside_a_frames_write_waits_for_the_frame_to_be_whole(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (as the CLI maps them) arriving while gzip writes a frame: held until the frame is in the
    file, then raised; the recording reads whole up to and with that frame."""
    import gzip

    from decodemon.monitor.cli import _terminate_as_interrupt
    from decodemon.probes import wire

    path = tmp_path / "r.dmon"
    w = wire.RecordingWriter(path, wire.RecordingHeader(wire_version=wire.WIRE_VERSION, created_unix_s=0.0,
                                                        decodemon_version="t"))
    real = gzip.GzipFile.write

    def write_then_signal(self, data):
        n = real(self, data[: len(data) // 2])
        _terminate_as_interrupt(15, None)  # the handler runs here, half way through the frame
        return n + real(self, data[len(data) // 2:])

    monkeypatch.setattr(gzip.GzipFile, "write", write_then_signal)
    with pytest.raises(KeyboardInterrupt):
        w.write(wire.Bye(reason="x" * 1000), 5)
    monkeypatch.setattr(gzip.GzipFile, "write", real)
    w.close()
    frames = [f for _, f in wire.read_recording(path)]
    assert isinstance(frames[-1], wire.Bye) and frames[-1].reason == "x" * 1000
    with pytest.raises(KeyboardInterrupt):  # outside a write it is raised at once
        _terminate_as_interrupt(15, None)


def test_a_report_of_a_source_without_a_gpu_names_no_sm_count():
    from decodemon.monitor.render.markdown import diagnosis_markdown
    from decodemon.monitor.session import Session

    text = diagnosis_markdown(Session(label="pid 4242").snapshot())
    assert "0 SMs" not in text and "Source: pid 4242 · device: ?" in text


@pytest.mark.parametrize("verb", ["report", "export"])
def test_dash_as_the_output_is_standard_output_not_a_file_named_dash(tmp_path, verb):
    r = cli(verb, REC["graph"], "-o", "-", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("device: NVIDIA H200 (132 SMs)" if verb == "report" else '"traceEvents"') in r.stdout
    assert not (tmp_path / "-").exists()
    r = cli("record", "1", "-o", "-", cwd=tmp_path)
    assert_one_line_error(r)
    assert "cannot record to -: not a regular file" in r.stderr and not (tmp_path / "-").exists()
    if verb == "report":  # two things on one stdout would be neither
        r = cli("report", REC["graph"], "--json", "-o", "-", cwd=tmp_path)
        assert_one_line_error(r)
        assert "--json and -o -" in r.stderr
