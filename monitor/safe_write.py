"""Outputs written only where asked: every `-o`, ledger, pid file, sweep folder and DIAGNOSIS file goes through here.

- No link owned by another user is followed on the way to an output, in the spirit of the kernel's
  fs.protected_symlinks but whatever it is set to: a link is followed when this user or root owns it, or when its
  owner owns the directory it sits in and that directory is not sticky and world-writable (/tmp). Any other link
  is refused in one line (root writing `-o /tmp/out.md` never writes through a link a local user planted there).
- An output is a regular file, a new path, or this process's own stream (`-`, /dev/stdout, /dev/stderr,
  /dev/fd/N): a FIFO, a device or a socket is refused, so a write never waits for a reader that never comes.
- A file is written whole: a temporary file made beside it in its real directory (the directory opened without
  following a link, the file created there O_EXCL | O_NOFOLLOW), then renamed over the name in that directory.
  An existing file is replaced only when it is this user's own (its mode kept); another user's is refused, never
  renamed over (which would hand it a new owner and mode).
- An append (the ledger) opens the name in its real directory without following a link, into a regular file
  with one name only (a hard link planted beside it would carry the line into another file).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from pathlib import Path

from decodemon.monitor.client import SourceError

MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup
_STREAMS = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(SourceError):
    """A path decodemon will not write (or read as a ledger); str() is the one line that says why."""


def own_stream(path) -> int | None:
    """The descriptor `path` names in this process (`-`, /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N),
    else None: such a stream is already open, so writing it never opens a path."""
    text = str(path)
    if text in _STREAMS:
        return _STREAMS[text]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        rest = text[len(prefix):]
        if text.startswith(prefix) and rest.isascii() and rest.isdigit():
            return int(rest)
    return None


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")


def _may_follow(link: os.stat_result, parent: os.stat_result) -> bool:
    """This user's or root's link; else, for a user other than root, one whose owner owns its directory, unless
    that is shared (sticky and world-writable). Root follows root's links only: a user's link in the user's own
    folder (`-o ~alice/out.md` pointing at /etc/...) would otherwise have root replace what it points at."""
    if link.st_uid in (os.geteuid(), 0):
        return True
    if os.geteuid() == 0:
        return False
    shared = bool(parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH)
    return not shared and link.st_uid == parent.st_uid


def real_path(path, shown: str | None = None, doing: str = "write") -> Path:
    """`path` with every link in it resolved, each checked by _may_follow (Refused in one line otherwise); its
    last part need not exist yet."""
    shown = str(path) if shown is None else shown
    text = str(path)
    todo = text.split("/")[::-1]  # a stack of the parts still to walk
    cur = "/" if text.startswith("/") else os.getcwd()
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        cand = os.path.join(cur, part)
        more = any(p not in ("", ".") for p in todo)
        try:
            st = os.lstat(cand)
        except FileNotFoundError:
            if more:
                raise Refused(f"cannot {doing} {shown}: no directory {cand}") from None
            return Path(cand)
        except OSError as exc:
            raise Refused(f"cannot {doing} {shown}: {cand}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_LINKS:
                raise Refused(f"cannot {doing} {shown}: too many links on the way (a symlink loop?)")
            parent = os.stat(cur)
            if not _may_follow(st, parent):
                what = "it" if not more else cand
                where = "a shared sticky directory" if parent.st_mode & stat.S_ISVTX else cur
                raise Refused(f"cannot {doing} {shown}: {what} is a link owned by uid {st.st_uid} (another user) in "
                              f"{where}; not followed (give the path it points to, if that is meant)")
            target = os.readlink(cand)
            todo.extend(target.split("/")[::-1])
            if target.startswith("/"):
                cur = "/"
            continue
        if more and not stat.S_ISDIR(st.st_mode):
            raise Refused(f"cannot {doing} {shown}: {cand} is not a directory")
        cur = cand
    return Path(cur)


def _open_dir(d: Path, shown: str, doing: str = "write") -> int:
    try:
        return os.open(d, _DIR_FLAGS)
    except FileNotFoundError:
        raise Refused(f"cannot {doing} {shown}: no directory {d}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # ELOOP: it became a link since it was walked
            raise Refused(f"cannot {doing} {shown}: {d} is not a directory") from None
        raise Refused(f"cannot {doing} {shown}: {d}: {exc.strerror or exc}") from None


def _existing(dfd: int, name: str, shown: str, replace: bool) -> os.stat_result | None:
    """What is at `name` in the directory now: None (a new file) or a regular file this user may write (and, to
    `replace` it, owns); Refused in one line for anything else."""
    if not name:
        raise Refused(f"cannot write {shown}: it is a directory (give a file name)")
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Refused(f"cannot write {shown}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"cannot write {shown}: it became a link while it was being checked; not followed")
    if stat.S_ISDIR(st.st_mode):
        raise Refused(f"cannot write {shown}: it is a directory (give a file name)")
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"cannot write {shown}: not a regular file ({_kind(st.st_mode)}); give a regular file or a new "
                      "path")
    if replace and st.st_uid != os.geteuid():
        raise Refused(f"cannot write {shown}: it belongs to uid {st.st_uid}, not to this user, so it is not replaced "
                      "(give a new path, or remove it first)")
    return st


def _clean_stale_parts(dfd: int, name: str) -> None:
    """Remove the hidden partial files an earlier writer of `name` left when it was killed (SIGKILL gives it no
    chance): this user's, regular, and named for a writer pid that is gone."""
    head = f".{name}."
    try:
        names = os.listdir(dfd)
    except OSError:
        return
    for n in names:
        if not (n.startswith(head) and n.endswith(".part")):
            continue
        pid = n[len(head):].split(".", 1)[0]
        if not (pid.isascii() and pid.isdigit()) or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            st = os.stat(n, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.unlink(n, dir_fd=dfd)
        except OSError:
            pass


def _temp(dfd: int, name: str, shown: str, mode: int | None) -> tuple[int, str]:
    """A new hidden file beside `name` (one filesystem, so the rename is whole), named for this process so that a
    later writer can tell a killed writer's leftovers; (its descriptor, its name)."""
    _clean_stale_parts(dfd, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
        except OSError as exc:
            raise Refused(f"cannot write {shown}: {exc.strerror or exc}") from None
        if mode is not None:  # the file it replaces keeps its mode (a 0600 file stays private)
            os.fchmod(fd, stat.S_IMODE(mode) & 0o777)
        return fd, tmp


class _Output:
    """A checked output: this process's stream `fd`, or the real directory and name of a file."""

    def __init__(self, path, inputs=(), stream_ok: bool = True) -> None:
        self.shown = str(path)
        if not self.shown.strip():
            raise Refused("cannot write to an empty path: give a file name")
        self.fd = own_stream(self.shown)
        if self.fd is not None:
            if not stream_ok:
                raise Refused(f"cannot write {self.shown}: not a regular file (a stream of this process)")
            try:
                os.fstat(self.fd)
            except OSError:
                raise Refused(f"cannot write {self.shown}: descriptor {self.fd} is not open") from None
            return
        self.real = real_path(self.shown)
        for src in inputs:
            try:
                if src is not None and self.real.exists() and os.path.samefile(self.real, src):
                    raise Refused(f"cannot write {self.shown}: it is the input {src} (give another name)")
            except OSError:
                continue

    def open_dir(self) -> int:
        return _open_dir(self.real.parent, self.shown)


def check(path, inputs=()) -> None:
    """Refused, in one line, unless `path` can be written as an output: a new path or a regular file of this
    user's, reached through no other user's link, in a directory it can write; or this process's own stream. An
    output that is one of `inputs` is refused (writing it would destroy what is being read)."""
    out = _Output(path, inputs)
    if out.fd is not None:
        return
    dfd = out.open_dir()
    try:
        st = _existing(dfd, out.real.name, out.shown, replace=True)
        fd, tmp = _temp(dfd, out.real.name, out.shown, None if st is None else st.st_mode)  # what access() cannot
        os.close(fd)                                                                          # tell: try it
        os.unlink(tmp, dir_fd=dfd)
    finally:
        os.close(dfd)


def write_whole(path, data: bytes, inputs=()) -> None:
    """Write `data` to `path` (checked as `check` does) through a temporary file renamed over it, so a failure or
    an interrupt leaves no partial file; this process's stream is written as it is open (a shell's `>>` keeps
    appending)."""
    out = _Output(path, inputs)
    if out.fd is not None:
        if out.fd in (1, 2):
            (sys.stdout if out.fd == 1 else sys.stderr).flush()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(out.fd, view):]
        except BrokenPipeError:
            raise  # a reader that closed the pipe (`| head`): as for any stdout
        except OSError as exc:
            raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
        return
    dfd = out.open_dir()
    try:
        st = _existing(dfd, out.real.name, out.shown, replace=True)
        fd, tmp = _temp(dfd, out.real.name, out.shown, None if st is None else st.st_mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, out.real.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
            raise
    finally:
        os.close(dfd)


def write_text_whole(path, text: str, inputs=()) -> None:
    """write_whole of `text` (UTF-8)."""
    write_whole(path, text.encode(), inputs)


def temp_beside(path) -> Path:
    """A new empty hidden file beside regular-file output `path` (checked as `check` does, a stream refused),
    for a writer that fills it by path and then `commit`s it."""
    out = _Output(path, stream_ok=False)
    dfd = out.open_dir()
    try:
        st = _existing(dfd, out.real.name, out.shown, replace=True)
        fd, tmp = _temp(dfd, out.real.name, out.shown, None if st is None else st.st_mode)
        os.close(fd)
    finally:
        os.close(dfd)
    return out.real.parent / tmp


def commit(tmp: Path, path) -> None:
    """Rename `tmp` (from temp_beside) over `path`, checked again now: the rename replaces the name in the real
    directory, never what a link there points to."""
    out = _Output(path, stream_ok=False)
    if out.real.parent != Path(tmp).parent:
        raise Refused(f"cannot write {out.shown}: its directory changed while it was written")
    dfd = out.open_dir()
    try:
        _existing(dfd, out.real.name, out.shown, replace=True)
        try:
            os.replace(Path(tmp).name, out.real.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
    finally:
        os.close(dfd)


def open_append(path) -> tuple[int, bool]:
    """A descriptor for appending to (and reading) regular file `path` (made if new), opened in its real directory
    without following a link, and whether it was made now; Refused in one line for a stream, a device, a FIFO,
    another user's link on the way, or a file with more than one name."""
    out = _Output(path, stream_ok=False)
    dfd = out.open_dir()
    try:
        existed = _existing(dfd, out.real.name, out.shown, replace=False) is not None
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(out.real.name, flags, 0o644, dir_fd=dfd)
        except OSError as exc:
            raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"cannot write {out.shown}: not a regular file ({_kind(st.st_mode)})")
            if st.st_nlink > 1:
                raise Refused(f"cannot write {out.shown}: it has {st.st_nlink} names (hard links), so a line "
                              "appended here lands in another file too; not appended to")
        except BaseException:
            os.close(fd)
            raise
        if not existed and not os.path.samestat(st, os.stat(out.real.name, dir_fd=dfd, follow_symlinks=False)):
            os.close(fd)
            raise Refused(f"cannot write {out.shown}: it was replaced while it was opened")
        return fd, not existed
    finally:
        os.close(dfd)


def remove_new(path) -> None:
    """Remove the regular file `path` that open_append just made (by name in its real directory, no link
    followed)."""
    out = _Output(path, stream_ok=False)
    dfd = out.open_dir()
    try:
        st = os.stat(out.real.name, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == 0:
            os.unlink(out.real.name, dir_fd=dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def open_read(path) -> int:
    """A descriptor for reading `path` (a ledger), reached through no other user's link and opened without
    following one; the caller checks what it is. FileNotFoundError when there is none (nor its directory)."""
    try:
        real = real_path(path)
    except Refused:
        if not os.path.exists(path):  # nothing there to read: the writer's own check says what is wrong
            raise FileNotFoundError(path) from None
        raise
    dfd = _open_dir(real.parent, str(path))
    try:
        return os.open(real.name or ".", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)


def make_dir(path) -> Path:
    """The real path of output directory `path`, made (in its real parent, no link followed) when it is new;
    Refused in one line when it cannot be."""
    shown = str(path)
    if not shown.strip():
        raise Refused("cannot write to an empty path: give a directory")
    real = real_path(shown, doing="make")
    dfd = _open_dir(real.parent, shown, doing="make")
    try:
        try:
            st = os.stat(real.name, dir_fd=dfd, follow_symlinks=False) if real.name else os.fstat(dfd)
        except FileNotFoundError:
            try:
                os.mkdir(real.name, 0o777, dir_fd=dfd)
            except OSError as exc:
                raise Refused(f"cannot make {shown}: {exc.strerror or exc}") from None
            return real
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"cannot write {shown}: it is {'a file' if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)}; "
                          "give a directory")
        return real
    finally:
        os.close(dfd)
