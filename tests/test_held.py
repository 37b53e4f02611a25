"""probes/held.py: the agent's short calls made keeping the GIL, and their fallbacks (`--probe hold_gil=false`)."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from decodemon.probes import held


@pytest.fixture(params=[True, False], ids=["held", "released"])
def enabled(request, monkeypatch):
    monkeypatch.setattr(held, "ENABLED", request.param)
    return request.param


def test_reader_reads_a_non_blocking_pipe_as_os_read_would(enabled):
    r, w = os.pipe()
    os.set_blocking(r, False)
    rd = held.Reader(8)
    with pytest.raises(BlockingIOError):
        rd.read(r)  # nothing there yet
    os.write(w, b"0123456789ab")
    assert rd.read(r) == b"01234567"  # at most the reader's size
    assert rd.read(r) == b"89ab"
    os.close(w)
    assert rd.read(r) == b""  # the writer has gone
    os.close(r)
    with pytest.raises(OSError):
        rd.read(r)


def test_reader_preads_a_file_from_an_offset(enabled, tmp_path):
    f = tmp_path / "status"
    f.write_bytes(b"voluntary_ctxt_switches:\t42\n")
    fd = os.open(f, os.O_RDONLY)
    try:
        rd = held.Reader(4096)
        assert rd.pread(fd, 0) == rd.pread(fd, 0) == f.read_bytes()  # the same bytes every time (no seek)
        assert rd.pread(fd, 10) == f.read_bytes()[10:]
    finally:
        os.close(fd)


def test_send_sends_what_the_socket_takes_and_says_when_the_peer_has_gone(enabled):
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    data = bytearray(range(256)) * 64
    assert held.send(mine, memoryview(data)[:100]) == 100
    assert held.send(mine, memoryview(b"read-only bytes")) == 15
    sent = 0
    with pytest.raises(BlockingIOError):  # a full socket: as a non-blocking socket.send would
        while True:
            sent += held.send(mine, memoryview(data))
    assert sent > 0
    theirs.close()
    with pytest.raises(OSError):  # EPIPE or ECONNRESET, and no SIGPIPE for the process
        held.send(mine, memoryview(b"x"))
    mine.close()


@pytest.mark.timing
def test_a_held_read_keeps_the_gil_and_a_released_one_does_not():
    """A read that blocks 0.3 s (the writer is another process): while it is held, no other thread of this process
    runs Python; with the calls released (hold_gil=false) another thread runs all along."""
    ticks = {}
    for hold in (True, False):
        held.ENABLED = hold
        try:
            r, w = os.pipe()
            writer = subprocess.Popen([sys.executable, "-c", "import os, sys, time; time.sleep(0.3); "
                                       "os.write(int(sys.argv[1]), b'x')", str(w)], pass_fds=(w,))
            os.close(w)
            time.sleep(0.05)  # the writer started (it sleeps 0.3 s before it writes)
            box = {}

            def read():
                box["t0"] = time.perf_counter()
                box["got"] = held.Reader(16).read(r)
                box["t1"] = time.perf_counter()

            th = threading.Thread(target=read)
            seen = []
            th.start()
            while th.is_alive():
                seen.append(time.perf_counter())
            writer.wait(10)
            os.close(r)
        finally:
            held.ENABLED = True
        assert box["got"] == b"x" and box["t1"] - box["t0"] > 0.1, box
        inside = [box["t0"], *(t for t in seen if box["t0"] < t < box["t1"]), box["t1"]]
        # the longest stretch this thread ran no Python while the read was under way: a held read blocks in C with
        # the GIL, so it spans the read, less the moments before the reading thread took the GIL back (a busy
        # machine can delay that)
        ticks[hold] = (len(inside) - 2, max(b - a for a, b in zip(inside, inside[1:])), box["t1"] - box["t0"])
    n, gap, took = ticks[True]
    assert gap > 0.5 * took, ticks  # the GIL stayed with the reading thread
    n, gap, took = ticks[False]
    assert n > 1000 and gap < 0.5 * took, ticks  # released, this thread ran Python all along



class _P:
    ptr = 1234


