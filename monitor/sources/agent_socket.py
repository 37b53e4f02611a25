"""Finding a process's agent socket, and connecting to it only when the agent of that process answers.

The agent listens on a Unix socket in a directory of its own uid (probes/server.py). The monitor does not trust a
path it computed from its own environment: the target may run with another XDG_RUNTIME_DIR, under another uid
(root may watch any process), and a local user may have planted a directory, a link or a listening socket where
the monitor would look. So:

- the socket is the one the target itself holds: a listening Unix socket named `<pid>.sock` in
  /proc/PID/net/unix whose inode is among /proc/PID/fd's sockets, in a real directory (not a link) owned by the
  target's uid and closed to others. An agent binds it under the fd of its checked directory
  (/proc/self/fd/N/<pid>.sock, probes/wire_socket.socket_home), so it is reached through the target's own fd,
  /proc/PID/fd/N, wherever that directory is (a private one when the usual one was refused);
- after `connect()`, SO_PEERCRED must name that pid and uid, or the connection is refused in one line;
- every socket operation has a timeout.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import time
from pathlib import Path

from decodemon.probes import wire

CONNECT_TIMEOUT_S = 5.0


class Refused(RuntimeError):
    """A socket that is not the target's agent's; str() is one line."""


def target_uid(pid: int) -> int | None:
    """The real uid of `pid` (/proc/PID/status), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _held_socket_inodes(pid: int) -> set[int] | None:
    """The inodes of the sockets `pid` holds open (None when its fds cannot be read)."""
    out: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for n in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if link.startswith("socket:[") and link.endswith("]"):
            try:
                out.add(int(link[8:-1]))
            except ValueError:
                pass
    return out


def _listening_paths(pid: int) -> dict[int, str]:
    """inode -> path of the listening Unix sockets named `<pid>.sock` in the target's network namespace."""
    out: dict[int, str] = {}
    try:
        lines = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line.split(None, 7)
        # Num RefCount Protocol Flags Type St Inode Path; Flags 00010000 is __SO_ACCEPTCON (listening)
        if len(parts) < 8 or not parts[7].endswith(f"/{pid}.sock") or not int(parts[3], 16) & 0x10000:
            continue
        try:
            out[int(parts[6])] = parts[7]
        except ValueError:
            pass
    return out


def _held_dir(pid: int, path: str) -> Path | None:
    """A socket bound under /proc/self/fd/N/NAME: its path where its directory is now (N's link), when that is
    the very socket the target's fd N holds, else through the target's own fd, /proc/PID/fd/N/NAME."""
    rest = path.removeprefix("/proc/self/fd/")
    n, sep, name = rest.partition("/")
    if rest == path or not sep or not n.isascii() or not n.isdigit() or "/" in name:
        return None
    held = Path(f"/proc/{pid}/fd/{n}") / name
    try:
        shown = Path(os.readlink(held.parent)) / name
        a, b = os.lstat(shown), os.stat(held)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return shown
    except (OSError, ValueError):
        pass
    return held


def _dir_problem(d: Path, uid: int) -> str | None:
    # /proc/PID/fd/N is the target's own open directory: followed (it cannot be swapped), every other link refused
    held_fd = d.parent.name == "fd" and d.parent.parent.parent == Path("/proc")
    try:
        st = os.stat(d) if held_fd else os.lstat(d)
    except OSError as exc:
        return f"{d}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{d} is a link or not a directory"
    if st.st_uid != uid:
        return f"{d} belongs to uid {st.st_uid}, not to the target's uid {uid}"
    if st.st_mode & 0o077:
        return f"{d} is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _sock_problem(path: Path, uid: int) -> str | None:
    try:
        sst = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISSOCK(sst.st_mode) or sst.st_uid != uid:
        return f"{path} is not a socket of uid {uid}"
    return None


def safe_dir(path: Path, uid: int) -> str | None:
    """Why socket `path` is not the agent's (its directory a link, not a directory, another uid's or open to
    others; the socket itself not a socket of `uid`), or None when it is."""
    return _dir_problem(path.parent, uid) or _sock_problem(path, uid)


def find(pid: int) -> Path | None:
    """The agent socket `pid` listens on, or None when it has none. Found from the target's own open sockets where
    its fds can be read, else at this user's own socket path; either way in a directory of the target's uid."""
    uid = target_uid(pid)
    if uid is None:
        return None
    held = _held_socket_inodes(pid)
    if held is not None:
        paths = [p for ino, p in _listening_paths(pid).items() if ino in held]
        candidates = [_held_dir(pid, p) if p.startswith("/proc/self/fd/") else Path(p) for p in paths]
    else:
        candidates = [wire.socket_path(pid)] if wire.socket_path(pid).exists() else []
    for c in candidates:
        if c is not None and safe_dir(c, uid) is None:
            return c
    return None


def check_peer(sock: socket.socket, pid: int, uid: int | None) -> None:
    """Refuse (Refused) a connection whose other end is not process `pid` of uid `uid`."""
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    peer_pid, peer_uid, _ = struct.unpack("3i", cred)
    if peer_pid != pid or (uid is not None and peer_uid != uid):
        raise Refused(f"the socket for pid {pid} is answered by pid {peer_pid} (uid {peer_uid}), not by pid {pid}"
                      f"{'' if uid is None else f' (uid {uid})'}; refusing it")


def connect(pid: int, path: Path, timeout_s: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A connected socket to `pid`'s agent at `path`, its peer checked; OSError or Refused otherwise. A queue
    that is full for now (a Unix socket says EAGAIN at once, it does not wait) is tried again until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            break
        except BlockingIOError:
            sock.close()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the agent's queue stayed full for {timeout_s:g} s") from None
            time.sleep(0.01)
        except BaseException:
            sock.close()
            raise
    try:
        check_peer(sock, pid, target_uid(pid))
    except BaseException:
        sock.close()
        raise
    return sock


class Heartbeat:
    """The monitor's side of the agent's lease: a wire.Heartbeat every wire.HEARTBEAT_S, sent by the thread that
    reads the socket each time it passes (`beat()`), from the hello of an agent that reads them (an older one would
    end the attach on a message it does not know) to the detach. Never waits: a target that reads nothing (stopped,
    or holding its GIL) leaves the beat for the next pass, and a connection the agent closed is the reader's to
    find, with the Bye it sent."""

    FRAME = wire.pack(wire.Heartbeat())

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.next_at, self.stopped = sock, None, False

    def start(self, hello: wire.Hello) -> None:
        """Beat from now on, where `hello`'s agent leases its slot."""
        if not self.stopped and self.next_at is None and hello.lease_s > 0:
            self.next_at = 0.0

    def stop(self) -> None:
        """No more beats (the detach is sent)."""
        self.stopped, self.next_at = True, None

    def beat(self) -> None:
        """Send a heartbeat if one is due."""
        now = time.monotonic()
        if self.next_at is None or now < self.next_at:
            return
        try:
            sent = self.sock.send(self.FRAME, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError, TimeoutError):  # its buffer full for now: the next pass
            return
        except OSError:
            self.stop()
            return
        if sent < len(self.FRAME):  # a frame goes whole, or the stream is broken: the rest under the socket's timeout
            try:
                self.sock.sendall(self.FRAME[sent:])
            except OSError:
                self.stop()
                return
        self.next_at = now + wire.HEARTBEAT_S


def read_note(path: Path, uid: int | None) -> str | None:
    """The first line of an agent's failure note at `path`: only a regular file of the target's uid, opened without
    following a link (a planted link to another file is not read). None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
            return None
        text = os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)
    return (text.strip().splitlines() or ["no reason given"])[0][:300]
