"""Outputs written only where asked: every `-o`, ledger, pid file, sweep folder and DIAGNOSIS file goes through here.

- No link owned by another user is followed on the way to an output, in the spirit of the kernel's
  fs.protected_symlinks but whatever it is set to: a link is followed when this user or root owns it, or when its
  owner owns the directory it sits in and that directory is not sticky and world-writable (/tmp). Any other link
  is refused in one line (root writing `-o /tmp/out.md` never writes through a link a local user planted there).
- An output is a regular file, a new path, or this process's own stream (`-`, /dev/stdout, /dev/stderr,
  /dev/fd/N): a FIFO, a device or a socket is refused, so a write never waits for a reader that never comes.
- The output's real directory is reached from `/` (or the working directory) one name at a time by descriptor
  (safe_walk), and every create, write, rename and removal is made relative to that descriptor: no path is looked
  up a second time, so a directory on the way swapped for a link after its check moves no write.
- A file is written whole: a temporary file made beside it in its real directory (created there O_EXCL |
  O_NOFOLLOW), then renamed over the name in that directory.
  An existing file is replaced only when it is this user's own (its mode kept); another user's is refused, never
  renamed over (which would hand it a new owner and mode).
- An append (the ledger) opens the name in its real directory without following a link, into a regular file
  with one name only (a hard link planted beside it would carry the line into another file).
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from pathlib import Path

from decodemon.monitor.safe_walk import MAX_LINKS, Place, Refused, may_follow, walk  # noqa: F401 (callers' names)

_STREAMS = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}


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
    """A checked output: this process's stream `fd`, or `place`, the walked real directory (held open) and name of
    a file; a context manager that closes the directory."""

    def __init__(self, path, inputs=(), stream_ok: bool = True) -> None:
        self.shown = str(path)
        self.place: Place | None = None
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
        self.place = walk(self.shown)
        try:
            self._not_an_input(inputs)
        except BaseException:
            self.close()
            raise

    def _not_an_input(self, inputs) -> None:
        try:
            st = os.stat(self.name, dir_fd=self.dfd, follow_symlinks=False)
        except OSError:
            return  # nothing there yet: no input
        for src in inputs:
            try:
                if src is not None and os.path.samestat(st, os.stat(src)):
                    raise Refused(f"cannot write {self.shown}: it is the input {src} (give another name)")
            except OSError:
                continue

    @property
    def dfd(self) -> int:
        return self.place.dfd

    @property
    def name(self) -> str:
        return self.place.name

    def close(self) -> None:
        if self.place is not None:
            self.place.close()

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check(path, inputs=()) -> None:
    """Refused, in one line, unless `path` can be written as an output: a new path or a regular file of this
    user's, reached through no other user's link, in a directory it can write; or this process's own stream. An
    output that is one of `inputs` is refused (writing it would destroy what is being read)."""
    with _Output(path, inputs) as out:
        if out.fd is not None:
            return
        st = _existing(out.dfd, out.name, out.shown, replace=True)
        fd, tmp = _temp(out.dfd, out.name, out.shown, None if st is None else st.st_mode)  # what access() cannot
        os.close(fd)                                                                        # tell: try it
        os.unlink(tmp, dir_fd=out.dfd)


def _write_stream(fd: int, data: bytes, shown: str) -> None:
    if fd in (1, 2):
        (sys.stdout if fd == 1 else sys.stderr).flush()
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        raise  # a reader that closed the pipe (`| head`): as for any stdout
    except OSError as exc:
        raise Refused(f"cannot write {shown}: {exc.strerror or exc}") from None


def write_whole(path, data: bytes, inputs=()) -> None:
    """Write `data` to `path` (checked as `check` does) through a temporary file renamed over it, so a failure or
    an interrupt leaves no partial file; this process's stream is written as it is open (a shell's `>>` keeps
    appending)."""
    with _Output(path, inputs) as out:
        if out.fd is not None:
            _write_stream(out.fd, data, out.shown)
            return
        st = _existing(out.dfd, out.name, out.shown, replace=True)
        fd, tmp = _temp(out.dfd, out.name, out.shown, None if st is None else st.st_mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, out.name, src_dir_fd=out.dfd, dst_dir_fd=out.dfd)
        except BaseException as exc:
            try:
                os.unlink(tmp, dir_fd=out.dfd)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
            raise


def write_text_whole(path, text: str, inputs=()) -> None:
    """write_whole of `text` (UTF-8)."""
    write_whole(path, text.encode(), inputs)


class Pending:
    """A new hidden file beside a regular-file output, for a writer that fills it over time (a recording): it is
    written through `fd` and renamed over the output by `commit`, both in the directory walked when it was made,
    held open until then; no path is looked up again, so no directory swapped on the way since moves it."""

    def __init__(self, out: _Output, fd: int, tmp: str) -> None:
        self.out, self.fd, self.tmp = out, fd, tmp

    def take_fd(self) -> int:
        """The file's descriptor, open for writing, now the caller's to close."""
        fd, self.fd = self.fd, -1
        return fd

    def commit(self) -> None:
        """Rename the file over the output (a regular file of this user's, or a new name, checked again now) in
        its directory, never over what a link there points to; Refused in one line (and the file removed) when
        the output's path no longer names that directory or the rename fails."""
        try:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            out = self.out
            with walk(out.shown) as now:
                if not os.path.samestat(os.fstat(now.dfd), os.fstat(out.dfd)) or now.name != out.name:
                    raise Refused(f"cannot write {out.shown}: its directory changed while it was written")
            _existing(out.dfd, out.name, out.shown, replace=True)
            try:
                os.replace(self.tmp, out.name, src_dir_fd=out.dfd, dst_dir_fd=out.dfd)
            except OSError as exc:
                raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
            self.tmp = ""
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the file (if not committed) and let go of its directory; again, nothing."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.tmp and self.out.place.dfd >= 0:
            try:
                os.unlink(self.tmp, dir_fd=self.out.dfd)
            except OSError:
                pass
        self.tmp = ""
        self.out.close()


def temp_beside(path) -> Pending:
    """A new empty hidden file beside regular-file output `path` (checked as `check` does, a stream refused), open
    for writing, for a writer that fills it and then commits it (Pending)."""
    out = _Output(path, stream_ok=False)
    try:
        st = _existing(out.dfd, out.name, out.shown, replace=True)
        fd, tmp = _temp(out.dfd, out.name, out.shown, None if st is None else st.st_mode)
    except BaseException:
        out.close()
        raise
    return Pending(out, fd, tmp)


def _one_regular_name(fd: int, shown: str) -> os.stat_result:
    """fstat of the opened ledger: Refused unless a regular file with one name."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"cannot write {shown}: not a regular file ({_kind(st.st_mode)})")
    if st.st_nlink > 1:
        raise Refused(f"cannot write {shown}: it has {st.st_nlink} names (hard links), so a line appended here "
                      "lands in another file too; not appended to")
    return st


def open_append(path) -> tuple[int, bool]:
    """A descriptor for appending to (and reading) regular file `path` (made if new), opened in its real directory
    without following a link, and whether it was made now; Refused in one line for a stream, a device, a FIFO,
    another user's link on the way, or a file with more than one name."""
    with _Output(path, stream_ok=False) as out:
        existed = _existing(out.dfd, out.name, out.shown, replace=False) is not None
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(out.name, flags, 0o644, dir_fd=out.dfd)
        except OSError as exc:
            raise Refused(f"cannot write {out.shown}: {exc.strerror or exc}") from None
        try:
            st = _one_regular_name(fd, out.shown)
            if not existed and not os.path.samestat(st, os.stat(out.name, dir_fd=out.dfd, follow_symlinks=False)):
                raise Refused(f"cannot write {out.shown}: it was replaced while it was opened")
        except BaseException:
            os.close(fd)
            raise
        return fd, not existed


def remove_new(path) -> None:
    """Remove the regular file `path` that open_append just made (by name in its real directory, no link
    followed)."""
    with _Output(path, stream_ok=False) as out:
        try:
            st = os.stat(out.name, dir_fd=out.dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == 0:
                os.unlink(out.name, dir_fd=out.dfd)
        except OSError:
            pass


def open_read(path) -> int:
    """A descriptor for reading `path` (a ledger), reached through no other user's link and opened without
    following one; the caller checks what it is. FileNotFoundError when there is none (nor its directory)."""
    try:
        place = walk(path)
    except Refused:
        if not os.path.exists(path):  # nothing there to read: the writer's own check says what is wrong
            raise FileNotFoundError(path) from None
        raise
    with place:
        return os.open(place.name or ".", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=place.dfd)


def make_dir(path) -> Path:
    """The real path of output directory `path`, made (in its real parent, no link followed) when it is new;
    Refused in one line when it cannot be."""
    shown = str(path)
    if not shown.strip():
        raise Refused("cannot write to an empty path: give a directory")
    with walk(shown, doing="make") as place:
        try:
            st = (os.stat(place.name, dir_fd=place.dfd, follow_symlinks=False) if place.name
                  else os.fstat(place.dfd))
        except FileNotFoundError:
            try:
                os.mkdir(place.name, 0o777, dir_fd=place.dfd)
            except OSError as exc:
                raise Refused(f"cannot make {shown}: {exc.strerror or exc}") from None
            return Path(place.real)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"cannot write {shown}: it is {'a file' if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)}; "
                          "give a directory")
        return Path(place.real)


def check_output(path, inputs=()) -> Path:
    """The output path, or SourceError (Refused) saying in one line why nothing can be written there:
    a regular file of this user's or a new path, reached through no other user's link, or this process's own
    stream ("-" is standard output); never a FIFO or a device; never one of the `inputs` (check)."""
    check(path, inputs)
    return Path("/dev/stdout" if str(path) == "-" else path)


def check_recording_output(path) -> Path:
    """check_output for a recording, which is made whole and then moved into place: a regular file only."""
    if own_stream(path) is not None:
        raise Refused(f"cannot record to {path}: not a regular file (a recording is made whole, then moved "
                          "into place)")
    return check_output(path)
