"""Which processes the exporter watches: this user's whose agent listens, llama-servers serving /slots, and the
pids named; each under a `Watch` (`Exporter`)."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import msgspec

from decodemon.monitor.exporter.collector import Currency
from decodemon.monitor.exporter.watch import Watch
from decodemon.probes import wire

RETRY_AFTER_S = 30.0  # a process whose watch failed is tried again after this

_SOCK_NAME = re.compile(r"/([0-9]{1,7})\.sock$")


def _named_sockets(directory: Path | None) -> set[int]:
    """The pids that `<pid>.sock` names: in `directory`, or (None) in this user's socket directory and among the
    listening Unix sockets of this network namespace (an agent in a private directory is found there)."""
    d = Path(directory) if directory is not None else wire.socket_dir()
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    out = {int(m.group(1)) for n in names if (m := _SOCK_NAME.search("/" + n))}
    if directory is None:
        try:
            lines = Path("/proc/self/net/unix").read_text().splitlines()[1:]
        except OSError:
            lines = []
        for line in lines:
            parts = line.split(None, 7)
            if len(parts) == 8 and int(parts[3], 16) & 0x10000 and (m := _SOCK_NAME.search(parts[7])):
                out.add(int(m.group(1)))
    return out


def attachable_pids(directory: Path | None = None) -> list[int]:
    """This user's processes whose own agent listens (each holds its listening `<pid>.sock`), named in
    `directory` (default: this user's socket directory and this host's listening sockets). A socket left by a
    process that is gone, or by one whose pid another process has since, names no attachable process."""
    from decodemon.monitor.sources import agent_socket

    pids = []
    for pid in sorted(_named_sockets(directory)):
        if agent_socket.target_uid(pid) == os.getuid() and agent_socket.find(pid) is not None:
            pids.append(pid)
    return pids



class Exporter:
    """Every attachable process on the host, and the `pids` named, each under a Watch; `scan()` starts new ones
    and drops ended ones. An agent is loaded only into a named pid, and only with `inject`."""

    def __init__(self, settings: wire.Attach | None = None, directory: Path | None = None,
                 only: Callable[[int], bool] | None = None, pids: Iterable[int] = (), inject: bool = False) -> None:
        # the exporter yields: a user's attach to a process it watches is served, and it watches again after
        self.settings = msgspec.structs.replace(settings or wire.Attach(), yields=True)
        self.directory, self.only = directory, only
        self.named, self.inject = tuple(pids), inject
        self.scans = 0
        self.watches: dict[int, Watch] = {}
        self._ended_at: dict[int, float] = {}
        self._said: set[int] = set()  # named pids whose failed watch was said on stderr
        self._lock = threading.Lock()

    def scan(self) -> None:
        """Attach to processes not yet watched; forget ended watches (retried after RETRY_AFTER_S if alive)."""
        now = time.monotonic()
        from decodemon.monitor.sources.outside import servers

        named = [p for p in self.named if Path(f"/proc/{p}").exists()]
        found = [p for p in attachable_pids(self.directory) + servers() if self.only is None or self.only(p)]
        with self._lock:
            for pid, w in list(self.watches.items()):
                if not w.running:
                    del self.watches[pid]
                    self._ended_at[pid] = now
                    if pid in self.named and not w.attaches and pid not in self._said:  # asked for, never watched
                        self._said.add(pid)
                        print(f"decodemon exporter: pid {pid} is not watched: {w.ended}; tried again every "
                              f"{RETRY_AFTER_S:g} s", file=sys.stderr)
            for pid in dict.fromkeys(named + found):
                if pid not in self.watches and now - self._ended_at.get(pid, -RETRY_AFTER_S) >= RETRY_AFTER_S:
                    inject = self.inject and pid in self.named
                    self.watches[pid] = Watch(pid, self.settings, inject=inject, reattach=True).start()
            self.scans += 1

    def targets(self) -> list[tuple[dict, object]]:
        """(labels, latest Snapshot) of every watched process that has one."""
        with self._lock:
            return [(w.labels, w.latest) for w in self.watches.values() if w.latest is not None]

    def series(self) -> list[tuple[dict, object, Currency]]:
        """(labels, latest Snapshot, Currency) of every watched process that has a snapshot: what is served."""
        with self._lock:
            return [t for t in (w.served() for w in self.watches.values()) if t is not None]

    def stop(self) -> None:
        """Detach from every process."""
        with self._lock:
            watches, self.watches = list(self.watches.values()), {}
        for w in watches:
            w.stop()
