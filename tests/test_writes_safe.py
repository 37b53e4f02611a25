"""Root's outputs go only where asked: every flag that writes, given a link another user planted in a shared sticky
directory (the /tmp attack), refuses in one line and changes no root-owned file; a FIFO or a device is refused at
once; a file is replaced only when it is the writer's own. Real processes and files; the planted links need a
second uid, so these run as root (as CI does) and skip elsewhere."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from decodemon.monitor import ledger, safe_write
from tests.conftest import DATA, REC, assert_one_line_error, cli

OTHER = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid's links need root to make (lchown)")


def _state(d: Path) -> dict:
    """Everything about the files under `d` that a write could change: names, owners, modes, inodes, bytes."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        body = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None
        out[str(p.relative_to(d))] = (st.st_uid, st.st_gid, st.st_mode, st.st_ino, st.st_mtime_ns, body)
    return out


@pytest.fixture
def planted(tmp_path):
    """A root-owned 0640 file and directory, a shared sticky world-writable directory (as /tmp is), and a way to
    plant a link in it that belongs to `nobody`; the test checks `unchanged()` at its end."""
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o755)
    secret = roots / "secret"
    secret.write_text("root's own line\n")
    secret.chmod(0o640)
    os.chown(secret, 0, 42)  # root:shadow, as the file the issue saw replaced
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)

    def plant(name: str, to: Path = secret) -> Path:
        link = shared / name
        link.symlink_to(to)
        os.lchown(link, OTHER, OTHER)
        return link

    before = {}

    def unchanged() -> None:
        assert _state(roots) == before["roots"]
        assert _state(shared) == before["shared"]  # no temporary file left beside the link either

    plant.shared, plant.roots, plant.secret = shared, roots, secret
    plant.snapshot = lambda: before.update(roots=_state(roots), shared=_state(shared))
    plant.unchanged = unchanged
    return plant


# every flag that writes, each given a path through a planted link (LINK), and the words its refusal must hold
WRITERS = {
    "report -o": (["report", REC["eager"], "-o", "LINK"], "out.md"),
    "export -o": (["export", REC["eager"], "-o", "LINK"], "trace.json"),
    "record -o": (["record", "1", "-o", "LINK", "--seconds", "1"], "run.dmon"),  # checked before any attach
    "predict --ledger": (["predict", REC["eager"], "--change", "x", "--expect", "-10%", "--ledger", "LINK"],
                         "decodemon.ledger.jsonl"),
    "grade --ledger": (["grade", REC["graph"], "--ledger", "LINK"], "decodemon.ledger.jsonl"),
    "sweep -o": (["sweep", "--replay", DATA / "h200_sweep_demo_eager", "-o", "LINK"], "sweep-out"),
    "run --pid-file": (["run", "--pid-file", "LINK", "--", sys.executable, "-c", "open('MARK', 'w')"], "pid"),
}


@needs_root
@pytest.mark.parametrize("flag", list(WRITERS))
def test_no_flag_writes_through_another_users_link(flag, planted, tmp_path):
    args, name = WRITERS[flag]
    link = planted(name, planted.roots if flag == "sweep -o" else planted.secret)
    mark = tmp_path / "started"
    planted.snapshot()
    r = cli(*[str(link) if a == "LINK" else str(a).replace("MARK", str(mark)) for a in args], timeout=60)
    assert_one_line_error(r)
    assert "link owned by uid 65534" in r.stderr and "not followed" in r.stderr
    planted.unchanged()
    assert not mark.exists()  # run --pid-file: the command was never started


@needs_root
def test_a_planted_link_beside_a_sweeps_files_or_on_the_way_to_an_output_is_refused(planted, tmp_path):
    planted("sweep.md")  # the output folder is the shared one: one of its files is a link to root's file
    planted("dir", planted.roots)  # a directory link on the way: shared/dir/out.md would land in roots/
    planted.snapshot()
    r = cli("sweep", "--replay", DATA / "h200_sweep_demo_eager", "-o", planted.shared)
    assert_one_line_error(r)
    assert "sweep.md" in r.stderr and "not followed" in r.stderr
    r = cli("report", REC["eager"], "-o", planted.shared / "dir" / "out.md")
    assert_one_line_error(r)
    assert "shared/dir is a link owned by uid 65534" in r.stderr
    planted.unchanged()


@needs_root
def test_the_apps_files_and_a_grade_in_a_report_are_refused_the_same_way(planted, tmp_path):
    """The app's `d` and `s` write through safe_write.write_text_whole; report grades a ledger it is given."""
    link = planted("DIAGNOSIS-eager-H200.md")
    led = planted("decodemon.ledger.jsonl")
    planted.snapshot()
    with pytest.raises(safe_write.Refused, match="not followed"):
        safe_write.write_text_whole(link, "# DIAGNOSIS\n")
    with pytest.raises(ledger.LedgerError, match="not followed"):
        ledger.append(led, {"kind": "grade"})
    r = cli("report", REC["eager"], "--ledger", led, "-o", tmp_path / "D.md")
    assert_one_line_error(r)
    assert "not followed" in r.stderr
    planted.unchanged()


@needs_root
def test_links_root_or_the_writer_owns_are_still_followed(planted):
    """A link is refused for its owner, not for being a link: root's own link in the shared directory is written
    through, and the link stays a link."""
    target = planted.shared / "real.md"
    target.write_text("old")
    link = planted.shared / "mine.md"
    link.symlink_to(target)
    r = cli("report", REC["eager"], "-o", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and target.read_text().startswith("# DIAGNOSIS")


@needs_root
def test_root_follows_no_users_link_even_in_that_users_own_folder(planted, tmp_path):
    """`-o ~alice/out.md` where alice's own (not shared) folder holds her link to a root file: root refuses it."""
    home = tmp_path / "alice"
    home.mkdir(mode=0o755)
    os.chown(home, OTHER, OTHER)
    link = home / "out.md"
    link.symlink_to(planted.secret)
    os.lchown(link, OTHER, OTHER)
    planted.snapshot()
    r = cli("report", REC["eager"], "-o", link)
    assert_one_line_error(r, 2)
    assert "not followed" in r.stderr
    planted.unchanged()


@needs_root
def test_another_users_file_is_never_replaced_and_ours_keeps_its_mode(planted):
    theirs = planted.shared / "out.md"
    theirs.write_text("nobody's notes\n")
    os.chown(theirs, OTHER, OTHER)
    r = cli("export", REC["eager"], "-o", theirs)
    assert_one_line_error(r)
    assert "belongs to uid 65534" in r.stderr
    assert theirs.read_text() == "nobody's notes\n" and theirs.stat().st_uid == OTHER
    ours = planted.shared / "private.md"
    ours.write_text("old")
    ours.chmod(0o600)
    safe_write.write_text_whole(ours, "new")
    assert ours.read_text() == "new" and stat.S_IMODE(ours.stat().st_mode) == 0o600


def test_a_ledger_with_a_second_name_is_not_appended_to(tmp_path):
    """A hard link planted beside the ledger would carry the appended line into the other file."""
    led = tmp_path / "decodemon.ledger.jsonl"
    led.write_text("")
    os.link(led, tmp_path / "elsewhere")
    with pytest.raises(ledger.LedgerError, match="hard links"):
        ledger.append(led, {"kind": "grade"})
    assert led.read_text() == ""


@pytest.mark.parametrize("verb", ["report", "export"])
def test_an_output_fifo_is_refused_at_once_without_a_reader(verb, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = cli(verb, REC["eager"], "-o", fifo, timeout=60)  # no reader ever opens it: a write would wait forever
    assert_one_line_error(r)
    assert "not a regular file (a FIFO)" in r.stderr and time.monotonic() - t0 < 60
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_standard_output_is_still_an_output():
    r = cli("report", REC["eager"], "-o", "-")
    assert r.returncode == 0 and r.stdout.startswith("# DIAGNOSIS"), r.stderr
