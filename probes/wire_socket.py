"""The live attach's transport: the per-user socket each agent listens on, and frames behind a 4-byte length
(probes/wire.py holds the frames themselves).

The socket's directory is made, checked and used through its fd (`socket_home`): the socket is bound under
/proc/self/fd/N of the checked directory and its mode set by name under N, so no path can be swapped between a
check and a use. A directory that is refused (a link, another uid's) gets a private one of the process's own
beside it; the monitor finds the socket from /proc/PID/net/unix either way (monitor/agent_socket.py).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
from pathlib import Path

from decodemon.probes.frames import LEN as _LEN, MAX_FRAME_BYTES, WireError

BACKLOG = 64


def socket_dir() -> Path:
    """Per-user directory for agent sockets: $XDG_RUNTIME_DIR/decodemon or /tmp/decodemon-<uid>."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "decodemon"
    return Path(f"/tmp/decodemon-{os.getuid()}")


def socket_path(pid: int) -> Path:
    """Where the agent of process `pid` listens, unless that directory was refused (then in a private one beside
    it: socket_home; the monitor finds either from the process's own sockets)."""
    return socket_dir() / f"{pid}.sock"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _checked_dir_fd(name: str, parent_fd: int, shown: Path) -> int:
    """An fd on directory `name` under `parent_fd`, which must be a real directory (not a link) owned by this uid,
    made 0700 through the fd; PermissionError with one line otherwise. Nothing here follows a link."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionError(f"{shown} is a link or not a directory; remove it, or set XDG_RUNTIME_DIR to a "
                                  "directory of your own") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(f"{shown} belongs to uid {st.st_uid}, not to uid {os.getuid()}; remove it, or set "
                              "XDG_RUNTIME_DIR to a directory of your own")
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o700)
    return fd


def open_own_dir(d: Path, make: bool = False) -> int:
    """An fd on directory `d` (made 0700 first when `make`), checked through its parent's fd: a real directory of
    this uid, closed to others; PermissionError with one line otherwise."""
    d = Path(d)
    pfd = os.open(d.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if make:
            try:
                os.mkdir(d.name, 0o700, dir_fd=pfd)
            except FileExistsError:
                pass
        return _checked_dir_fd(d.name, pfd, d)
    finally:
        os.close(pfd)


def ensure_dir(d: Path) -> None:
    """Make the socket directory ours and private (0700), or refuse one that is a link or belongs to someone else.
    Made, checked and set through fds, never through a path."""
    os.close(open_own_dir(d, make=True))


def _is_stale(dir_fd: int, name: str) -> bool:
    """Provably stale: a socket at `name` that nothing listens on (connect refused). A live agent's, and one whose
    queue is full, are not."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(f"/proc/self/fd/{dir_fd}/{name}")
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


FRESH_S = 2.0  # a socket this young, of a process that lives, is not judged stale


def _clean_stale(dir_fd: int) -> list[int]:
    gone: list[int] = []
    for name in os.listdir(dir_fd):
        stem, _, ext = name.rpartition(".")
        if ext != "sock" or not stem.isascii() or not stem.isdigit():
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            # a socket bound a moment ago by a live process may not listen yet (refused between its bind and its
            # listen): another agent starting beside it must not take it for stale
            young = time.time() - st.st_mtime < FRESH_S and os.path.exists(f"/proc/{stem}")
            if stat.S_ISSOCK(st.st_mode) and not young and _is_stale(dir_fd, name):
                os.unlink(name, dir_fd=dir_fd)
                gone.append(int(stem))
        except OSError:
            pass
    return gone


def clean_stale_sockets(d: Path | None = None) -> list[int]:
    """Remove the sockets nothing listens on; return their pids. One named for a live pid goes when nothing
    listens on it (its agent killed, the pid since reused); one that listens stays, whatever its name says. Only
    in a directory of ours (open_own_dir), by name under its fd: a link planted in place of the directory or of
    a socket is never followed."""
    try:
        fd = open_own_dir(d or socket_dir())
    except OSError:
        return []
    try:
        return _clean_stale(fd)
    finally:
        os.close(fd)


class SocketHome:
    """The agent's listening socket and the directory it lives in, held by fd for the agent's life (the monitor
    reaches the socket through /proc/PID/fd/N, wherever the directory has been moved to)."""

    def __init__(self, sock: socket.socket, dir_fd: int, directory: Path, name: str,
                 private_parent_fd: int | None = None) -> None:
        self.sock, self.dir_fd, self.directory, self.name = sock, dir_fd, directory, name
        self._private_parent_fd = private_parent_fd  # set when the directory is this process's own, made here
        self._pid = os.getpid()  # a forked child closes its copy and leaves the socket to its parent

    @property
    def path(self) -> Path:
        """Where the socket was made (the directory may have been moved since; the fd has not)."""
        return self.directory / self.name

    def close(self) -> None:
        """Close the socket and remove it (and a private directory), by name under the directory's fd; once."""
        if self.dir_fd < 0:
            return
        self.sock.close()
        dfd, pfd = self.dir_fd, self._private_parent_fd
        self.dir_fd, self._private_parent_fd = -1, None
        try:
            if os.getpid() == self._pid:
                self._remove(dfd, pfd)
        finally:
            os.close(dfd)
            if pfd is not None:
                os.close(pfd)

    def _remove(self, dfd: int, pfd: int | None) -> None:
        try:
            if stat.S_ISSOCK(os.stat(self.name, dir_fd=dfd, follow_symlinks=False).st_mode):
                os.unlink(self.name, dir_fd=dfd)
            if pfd is not None:  # only the very directory made here (same inode), and only once empty
                st, mine = os.stat(self.directory.name, dir_fd=pfd, follow_symlinks=False), os.fstat(dfd)
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                    os.rmdir(self.directory.name, dir_fd=pfd)
        except OSError:
            pass


def _private_dir(d: Path) -> tuple[int, Path, int]:
    """A directory of this process's own beside `d` (`d`-XXXXXXXX, 0700), for when `d` is refused: (its fd, its
    path, its parent's fd)."""
    pfd = os.open(d.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(16):
            name = f"{d.name}-{os.urandom(4).hex()}"
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
            except FileExistsError:
                continue
            except OSError as exc:
                raise PermissionError(f"{d} is refused and no directory can be made beside it "
                                      f"({exc.strerror})") from None
            try:
                return _checked_dir_fd(name, pfd, d.parent / name), d.parent / name, pfd
            except PermissionError:  # swapped for another's between the mkdir and the open: try another name
                continue
    except BaseException:
        os.close(pfd)
        raise
    os.close(pfd)
    raise PermissionError(f"no private socket directory could be made beside {d}")


def socket_home(d: Path | None = None, pid: int | None = None) -> SocketHome:
    """Listen on `<pid>.sock` (this process's by default) in the per-user directory `d` (socket_dir() by
    default), or, when `d` is refused, in a private directory beside it. Every step goes through the checked
    directory's fd: bound under /proc/self/fd/N, its mode set by name under N."""
    d = Path(d or socket_dir())
    name = f"{os.getpid() if pid is None else pid}.sock"
    private_parent = None
    try:
        dfd = open_own_dir(d, make=True)
        directory = d
    except PermissionError:
        dfd, directory, private_parent = _private_dir(d)
    sock = None
    try:
        _clean_stale(dfd)
        try:
            os.unlink(name, dir_fd=dfd)  # ours, or a stale one of this pid
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(f"/proc/self/fd/{dfd}/{name}")
        # by name in a 0700 directory of ours, which no one else can write: the name is the socket just bound
        os.chmod(name, 0o600, dir_fd=dfd)
        sock.listen(BACKLOG)
    except BaseException:
        if sock is not None:
            sock.close()
        os.close(dfd)
        if private_parent is not None:
            os.close(private_parent)
        raise
    return SocketHome(sock, dfd, directory, name, private_parent)



def pack(obj) -> bytes:
    """One frame of the monitor's schema (probes/wire.py) with its 4-byte length prefix, ready for a socket."""
    from decodemon.probes.wire import encode  # msgspec: the monitor's side (the agent packs with frames.pack)

    payload = encode(obj)
    return _LEN.pack(len(payload)) + payload


class StreamReader:
    """Incremental reader of length-prefixed payloads from a byte stream."""

    def __init__(self, max_frame: int | None = None) -> None:
        self._buf = bytearray()
        self._max = MAX_FRAME_BYTES if max_frame is None else max_frame

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete payload now available."""
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > self._max:
                raise WireError(f"frame of {n} bytes exceeds the {self._max}-byte limit")
            if len(self._buf) < 4 + n:
                break
            out.append(bytes(self._buf[4 : 4 + n]))
            del self._buf[: 4 + n]
        return out


