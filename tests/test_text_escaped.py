"""Text a target or a recording supplies (the agent's failure note, a Bye reason, argv, the GPU's and the kernels'
names, a command's own stderr) reaches the terminal and DIAGNOSIS.md as text: escape sequences shown as visible
escapes, Markdown that would make a link, HTML or a table cell escaped. Real processes and recordings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from decodemon.monitor import inject
from decodemon.monitor.safe_text import markdown, markdown_code, visible, visible_lines
from decodemon.probes import wire
from decodemon.probes.wire_file import load_recording, recording_bytes
from tests.conftest import REC, assert_one_line_error, cli

# a title change, a bell, a screen clear, an 8-bit CSI, a right-to-left override, then Markdown and HTML
CONTROLS = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"
PLANT = CONTROLS + "evil | [x](http://e.example) <b>"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def shown_as_text(text: str, markdown_escaped: bool = False) -> None:
    """No control character of the plant is left raw, and its escape sequence is there to read (in Markdown,
    once Markdown's own escapes are read)."""
    assert not any(c in text for c in RAW), repr(text)
    if markdown_escaped:
        text = re.sub(r"\\(.)", r"\1", text)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in text, text


def test_each_control_becomes_a_visible_escape():
    assert visible("a\x1b[31mb\n\r\t\x9b\u202e\x7f") == "a\\x1b[31mb\\n\\r\\t\\x9b\\u202e\\x7f"
    assert visible_lines("one\x1b\ntwo\tthree") == "one\\x1b\ntwo\tthree"
    assert markdown("a|b [x](u) <b> *c*") == "a\\|b \\[x\\](u) \\<b\\> \\*c\\*"
    assert markdown_code("a|`b`", cell=True) == "`` a\\|`b` ``" and markdown_code("x") == "`x`"


@pytest.fixture(scope="module")
def planted_recording(tmp_path_factory) -> Path:
    """The bundled eager recording with the plant in its argv, its GPU's name, a kernel's name and its Bye."""
    return _planted(REC["eager"], tmp_path_factory.mktemp("planted") / "planted.dmon")


def _planted(source, path: Path) -> Path:
    """`source` with the plant in its argv, its GPU's name, a kernel's name and its Bye, written to `path`."""
    frames = load_recording(source)
    header, out = frames[0][1], []
    for rx, f in frames[1:]:
        if isinstance(f, wire.Hello):
            f = msgspec.structs.replace(f, argv=["python", f"engine{CONTROLS}.py"],
                                        gpu=msgspec.structs.replace(f.gpu, name=f"H200 {PLANT}"))
        elif isinstance(f, wire.KernelWindow):
            f = msgspec.structs.replace(f, names=[f"{CONTROLS}evil|k{i}" for i in range(len(f.names))])
        elif isinstance(f, wire.Bye):
            f = wire.Bye(reason=PLANT)
        out.append((rx, f))
    path.write_bytes(recording_bytes(out, header))
    return path


def test_a_report_escapes_the_device_the_kernels_and_the_reason_it_ended(planted_recording, tmp_path):
    r = cli("report", planted_recording, "-o", "-")
    assert r.returncode == 0, r.stderr
    shown_as_text(r.stdout, markdown_escaped=True)
    for line in r.stdout.splitlines():
        assert "[x](http" not in line and "<b>" not in line  # no link, no HTML
    kernel_rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| `") and "evil" in ln]
    assert kernel_rows and all(len(re.findall(r"(?<!\\)\|", ln)) == 8 for ln in kernel_rows)  # no new cell
    assert "The source ended: " + markdown(PLANT) in r.stdout
    r = cli("report", planted_recording, "-o", tmp_path / "D.md")
    assert r.returncode == 0, r.stderr
    shown_as_text((tmp_path / "D.md").read_text(), markdown_escaped=True)


def test_json_escapes_every_control_and_gives_the_text_back_whole(planted_recording):
    r = cli("replay", planted_recording, "--json")
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stdout for c in RAW)
    summary = json.loads(r.stdout)
    assert summary["ended"] == PLANT and summary["device"] == f"H200 {PLANT}"


def test_argv_in_the_ledgers_lines_reaches_the_terminal_escaped(planted_recording, tmp_path):
    led = tmp_path / "ledger.jsonl"
    r = cli("predict", planted_recording, "--change", "capture a graph", "--expect", "-60%", "--ledger", led)
    assert r.returncode == 0, r.stderr
    assert "sealed" in r.stderr and "engine\\x1b]0;owned" in r.stderr and not any(c in r.stderr for c in RAW)
    r = cli("grade", planted_recording, "--ledger", led)  # the very state it sealed: refused, the line escaped
    assert r.returncode == 3 and "engine\\x1b]0;owned" in r.stderr and not any(c in r.stderr for c in RAW)
    after = _planted(REC["graph"], tmp_path / "after.dmon")  # the same loop (its argv), measured again
    r = cli("grade", after, "--ledger", led, "--markdown")
    assert r.returncode == 0, r.stderr
    assert "engine\\x1b]0;owned" in r.stdout and not any(c in r.stdout + r.stderr for c in RAW)


def test_a_bye_reason_with_no_tokens_is_one_escaped_line(tmp_path):
    frames = load_recording(REC["eager"])
    hello = next(f for _, f in frames if isinstance(f, wire.Hello))
    path = tmp_path / "bye.dmon"
    path.write_bytes(recording_bytes([(1, hello), (2, wire.Bye(reason=PLANT))], frames[0][1]))
    r = cli("replay", path, "--json")
    assert_one_line_error(r, rc=3)
    shown_as_text(r.stderr)


STUB_TARGET = f'''
import sys, time, types
# the agent this process "loads" fails with the plant: the bootstrap writes it as its failure note
agent = types.ModuleType("decodemon.probes.agent")
def start():
    raise RuntimeError({PLANT!r})
agent.start = start
sys.modules["decodemon.probes.agent"] = agent
for name in ("decodemon.engine_adapter", "decodemon.engine_adapter.auto"):  # no adapters: a light, quick load
    sys.modules[name] = types.ModuleType(name)
print("ready", flush=True)
t0 = time.monotonic()
while time.monotonic() - t0 < 60:
    time.sleep(0.005)
'''


def test_the_agents_failure_note_reaches_the_terminal_escaped_and_is_removed(tmp_path):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    target = subprocess.Popen([sys.executable, "-c", STUB_TARGET], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        r = cli("attach", target.pid, "--json", "--seconds", "2", env=env, timeout=60)
        assert_one_line_error(r)
        assert "the agent did not start" in r.stderr, r.stderr
        shown_as_text(r.stderr)
        assert not (xdg / "decodemon" / f"{target.pid}.failed").exists()
    finally:
        target.kill()
        target.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of a second uid needs root to make (chown)")
def test_a_note_is_read_and_removed_only_in_a_real_directory_of_the_targets_uid(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    victim = tmp_path / "roots"
    victim.mkdir()
    note = victim / f"{sleeper.pid}.failed"
    note.write_text("root's own file\n")
    (tmp_path / "decodemon").symlink_to(victim)  # the socket directory, planted as a link
    assert inject.take_note(sleeper.pid, 0) is None
    inject._remove_note(sleeper.pid, 0)
    assert note.read_text() == "root's own file\n"
    (tmp_path / "decodemon").unlink()
    theirs = tmp_path / "decodemon"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)  # a real directory, of another uid than the target's
    (theirs / note.name).write_text("planted\n")
    assert inject.take_note(sleeper.pid, 0) is None and (theirs / note.name).exists()


def test_a_commands_own_stderr_in_a_sweep_reaches_the_terminal_escaped(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(f"import sys\nsys.stderr.write({PLANT!r} + '\\n')\nsys.exit(1)\n")
    r = cli("sweep", f"{sys.executable} {script} {{depth}}", "--depths", "1", "--seconds", "1",
            "--start-timeout", "30", timeout=90)
    assert r.returncode == 3, r.stderr
    assert "at depth 1" in r.stderr
    shown_as_text(r.stderr)
    assert not any(c in r.stdout for c in RAW)


# command-line input: numbers in ASCII digits 0-9 only (int() and float() also read '1_000' and other scripts'
# digits), a loop's name that is a name, a payload of whole elements
@pytest.mark.parametrize("args, words", [
    (["attach", "1_000", "--json"], "digits 0-9"),
    (["report", REC["eager"], "--seconds", "١٠"], "ASCII digits"),
    (["sweep", "python x.py {depth}", "--depths", "64,1_024"], "digits 0-9"),
    (["export", REC["eager"], "-o", "t.json", "--window", "٣"], "ASCII digits"),
    (["predict", REC["eager"], "--change", "x", "--expect=-1_0%", "--ledger", "L"], "--expect takes"),
    (["predict", REC["eager"], "--change", "x", "--expect", "-10%", "--label", "", "--ledger", "L"], "--label"),
    (["allreduce", "--payload-bytes", "3", "--dtype", "bfloat16"], "whole number of 2-byte elements"),
])
def test_command_line_input_is_refused_in_one_line(args, words, tmp_path):
    r = cli(*args, cwd=tmp_path)
    assert_one_line_error(r)
    assert words in r.stderr and os.listdir(tmp_path) == []
