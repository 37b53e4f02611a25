"""Root's outputs against a neighbour who swaps a directory on their path for a link while root writes.

uid 65534 owns a directory on root's output path (home/a, as /home/u/a) and, in a separate process of its own uid,
exchanges it with its link to a root directory (renameat2 RENAME_EXCHANGE, in a tight loop) whose files have the
output's names. Every writing path is tried under the swap, most as direct calls of what the flags call, some as
the real CLI and the app's keys; not one root-owned file or directory may change (names, bytes, mode, owner,
times: a temporary file made and removed there would change the directory's time). Real processes and files, as
root (a second uid's files need it), as CI runs."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from decodemon.monitor import ledger, safe_write
from decodemon.monitor.sources import collect
from tests.conftest import REC, cli

OTHER = 65534  # nobody
RENAME_EXCHANGE = 2
TRIES = 2000  # each direct writer's tries under the swap
NAMES = ("decodemon.ledger.jsonl", "new.jsonl", "out.md", "trace.json", "run.dmon", "pid",
         "DIAGNOSIS-eager-H200.md", "cli.ledger.jsonl")  # the last predict's: the direct appends are no entries

# what a refusal under the swap says: the neighbour's link met on the way, or (a recording, walked again before its
# rename) its directory no longer what the path names
EXPECTED = ("a is a link owned by uid 65534 (another user)", "its directory changed while it was written")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid's process needs root to start (setuid)")
needs_linux = pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                                 reason="renameat2 (RENAME_EXCHANGE) as on Linux x86_64")

# a target with the agent, for `record` (it sleeps between its tokens: the neighbour keeps a core busy already)
LOOP = """
import time
from decodemon.probes import agent
agent.start()
print("ready", flush=True)
while True:
    agent.mark_token(0)
    time.sleep(0.002)
"""


def _renameat2():
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "renameat2"):
        return libc.renameat2
    return lambda *a: libc.syscall(316, *a)  # SYS_renameat2 on x86_64, for a libc without the wrapper


def _swap_forever(home: Path, flag: mmap.mmap) -> None:
    """The neighbour, in a forked child of uid OTHER: exchange home/a and home/evil until flag[0] is set (or 120 s
    pass), then leave its count of swaps in flag[8:16]."""
    swaps = 0
    try:
        os.setgroups([])
        os.setgid(OTHER)
        os.setuid(OTHER)
        renameat2 = _renameat2()
        d = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
        end = time.monotonic() + 120
        while flag[0] == 0 and time.monotonic() < end:
            for _ in range(63):  # odd: the state it rests in at each check of the flag alternates
                swaps += renameat2(d, b"a", d, b"evil", RENAME_EXCHANGE) == 0
    finally:
        struct.pack_into("q", flag, 8, swaps)
        os._exit(0)


def _state(d: Path) -> dict:
    """Everything a write could change under `d`, `d` itself included: names, owners, modes, inodes, times, bytes."""
    out = {}
    for p in [d, *sorted(d.rglob("*"))]:
        st = p.lstat()
        body = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        out[str(p.relative_to(d))] = (st.st_uid, st.st_mode, st.st_ino, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns,
                                      body)
    return out


@pytest.fixture
def swapped():
    """base/home (the neighbour's, 0755) holds a/b, its own directories, and evil, its link to base/roots, where
    root's b/ holds a root file of every output's name; `swapped.start()` sets the neighbour swapping a and evil,
    `swapped.stop()` stops it and returns its swaps. Under /tmp: pytest's own folder is closed to another uid."""
    base = Path(tempfile.mkdtemp(prefix="dm-writes-"))
    base.chmod(0o755)
    home, roots = base / "home", base / "roots"
    for d in (home, home / "a", home / "a" / "b"):
        d.mkdir(mode=0o755)
        os.chown(d, OTHER, OTHER)
    (roots / "b").mkdir(parents=True, mode=0o755)
    for name in NAMES:
        (roots / "b" / name).write_text("" if name == "new.jsonl" else "root's own line\n")
        (roots / "b" / name).chmod(0o640)
    (home / "evil").symlink_to(roots)
    os.lchown(home / "evil", OTHER, OTHER)
    flag = mmap.mmap(-1, 16)
    pid = None

    class Swapped:
        out = home / "a" / "b"  # root's outputs go here, through the directory the neighbour swaps
        real = os.open(out, os.O_RDONLY | os.O_DIRECTORY)  # the real a/b, whichever name holds it

        @staticmethod
        def start() -> None:
            nonlocal pid
            Swapped.before = _state(roots)
            pid = os.fork()
            if pid == 0:
                _swap_forever(home, flag)

        @staticmethod
        def stop() -> int:
            nonlocal pid
            flag[0] = 1
            os.waitpid(pid, 0)
            pid = None
            return struct.unpack_from("q", flag, 8)[0]

        @staticmethod
        def unchanged() -> None:
            after = _state(roots)
            assert after == Swapped.before, {k: (Swapped.before.get(k), after.get(k)) for k in
                                             set(after) | set(Swapped.before) if after.get(k) != Swapped.before.get(k)}

    yield Swapped
    if pid is not None:
        Swapped.stop()
    os.close(Swapped.real)
    shutil.rmtree(base, ignore_errors=True)


def _direct_writers(out: Path, tries: int) -> dict[str, tuple[int, int]]:
    """Each writer called `tries` times on a path through the swapped directory: {name: (written, refused)}."""
    entry = {"kind": "grade"}

    def record(path):
        rec = collect._Recorder(path, 1)  # the recording: checked, made beside, written by descriptor, committed
        try:  # (a frame's payload is stored as it is: what it holds does not matter here)
            rec.write(1, b"a frame", None)
            rec.keep()
        finally:
            rec.discard()

    writers = {
        "ledger append (predict --ledger)": lambda i: ledger.append(out / NAMES[0], entry),
        "ledger check (made and removed)": lambda i: ledger.check_writable(out / NAMES[1]),
        "write_text_whole (report -o, run --pid-file, d, s)": lambda i: safe_write.write_text_whole(out / NAMES[2],
                                                                                                  f"{i}\n"),
        "write_whole (export -o)": lambda i: safe_write.write_whole(out / NAMES[3], b"%d\n" % i),
        "recording temp and commit (record -o)": lambda i: record(out / NAMES[4]),
        "make_dir (sweep -o)": lambda i: safe_write.make_dir(out / f"made-{i}"),
        "check (every -o)": lambda i: safe_write.check(out / NAMES[5]),
    }
    counts = {}
    for name, write in writers.items():
        written = refused = 0
        for i in range(tries):
            try:
                write(i)
                written += 1
            except (safe_write.Refused, ledger.LedgerError) as exc:  # the link met, in one line
                assert "\n" not in str(exc) and any(w in str(exc) for w in EXPECTED), exc
                refused += 1
        counts[name] = (written, refused)
    return counts


def _cli_runs(out: Path) -> list[str]:
    """Each writing flag of the real CLI, twice: the one line of each run refused (a run that wrote says ""; `run`
    says the pid it started first, and stops it when its pid file is refused)."""
    target = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        runs = [["report", REC["eager"], "-o", out / NAMES[2]], ["export", REC["eager"], "-o", out / NAMES[3]],
                ["predict", REC["eager"], "--change", "x", "--expect", "-10%", "--ledger", out / NAMES[7]],
                ["run", "--pid-file", out / NAMES[5], "--", sys.executable, "-c", "pass"],
                ["record", target.pid, "-o", out / NAMES[4], "--seconds", "1"]]
        said = []
        for args in runs * 2:
            r = cli(*args, timeout=60)
            lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("decodemon: started pid")]
            assert "Traceback" not in r.stderr and (r.returncode == 0 or len(lines) == 1), (args, r.stderr)
            said.append("" if r.returncode == 0 else lines[0])
        return said
    finally:
        target.kill()
        target.wait()


async def _app_keys(out: Path, presses: int) -> None:
    """The app's `d` (DIAGNOSIS-<source>.md) and `s` (the screen as SVG), each pressed `presses` times."""
    from decodemon.monitor.app import DecodemonApp
    from decodemon.monitor.player import RecordingPlayer

    app = DecodemonApp([RecordingPlayer(str(REC["eager"]), "eager (H200)")], start_at_s=10.0, paused=True,
                       out_dir=str(out))
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(presses):
            await pilot.press("d")
            await pilot.press("s")


@needs_root
@needs_linux
def test_no_write_lands_in_a_root_directory_swapped_onto_its_path(swapped):
    t0 = time.monotonic()
    swapped.start()
    counts = _direct_writers(swapped.out, TRIES)
    said = _cli_runs(swapped.out)
    asyncio.run(_app_keys(swapped.out, 5))
    swaps = swapped.stop()
    swapped.unchanged()  # not one root file or directory changed, none made there, not even for a moment
    tries = sum(w + r for w, r in counts.values())
    print(f"\n{tries} direct tries, {len(said)} CLI runs and 10 app keys in {time.monotonic() - t0:.1f} s "
          f"under {swaps} swaps: {counts}; CLI refusals: {[s for s in said if s]}")
    assert tries == len(counts) * TRIES and swaps > 1000
    # the swap did land between the walk's steps: each writer met the link (refused) and the directory (written)
    assert all(w > 0 and r > 0 for w, r in counts.values()), counts
    assert all(any(w in s for w in EXPECTED) for s in said if s), said
    written = os.listdir(swapped.real)
    assert {NAMES[0], NAMES[2], NAMES[3], NAMES[4]} <= set(written) and not [n for n in written if n.endswith(".part")]


def test_the_walk_by_descriptor_ends_where_the_kernel_would(tmp_path, monkeypatch):
    """Dots, `..` (after a link too), chains of links, relative and absolute targets, a trailing slash and a link
    as the last name: the walked directory and name are those realpath names (a new last name included)."""
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f.txt").write_text("f")
    (tmp_path / "rel").symlink_to("d/e")
    (tmp_path / "d" / "up").symlink_to("..")
    (tmp_path / "abs").symlink_to(tmp_path / "d")
    (tmp_path / "chain").symlink_to("abs/up/rel")
    (tmp_path / "last").symlink_to("d/e/f.txt")
    (tmp_path / "dangling").symlink_to("d/new.txt")
    monkeypatch.chdir(tmp_path / "d")  # a relative path starts from the working directory's descriptor
    for path in ["../rel/f.txt", "../chain/./f.txt", "../abs/up/d/e/../e/f.txt", "../last", "../dangling", "e/",
                 "../abs/e/new", "..", ".", "e/..", "up/chain/..", "../rel/../last", str(tmp_path / "chain" / "f.txt"),
                 "/"]:
        with safe_write.walk(path) as place:
            want = os.path.realpath(path)
            assert place.real == want, path
            assert place.name == os.path.basename(want), path
            assert os.path.samestat(os.fstat(place.dfd), os.stat(os.path.dirname(want))), path


def test_a_recordings_directory_moved_while_it_is_written_is_refused_and_left_clean(tmp_path):
    """The file is written and renamed in the directory walked when it was made; if the path names another one by
    the commit, it is refused in one line and the hidden file removed, from the directory it was in."""
    d = tmp_path / "out"
    d.mkdir()
    pending = safe_write.temp_beside(d / "run.dmon")
    fd = pending.take_fd()
    os.write(fd, b"frames")
    os.close(fd)
    d.rename(tmp_path / "moved")
    d.mkdir()
    with pytest.raises(safe_write.Refused, match="its directory changed while it was written"):
        pending.commit()
    assert os.listdir(tmp_path / "moved") == [] and os.listdir(d) == []
    pending = safe_write.temp_beside(d / "run.dmon")
    os.close(pending.take_fd())
    pending.commit()
    assert os.listdir(d) == ["run.dmon"]
