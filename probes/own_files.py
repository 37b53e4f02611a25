"""What decodemon reads back from a cache: only files that root or the user running it could have put there.

decodemon often runs as root on a machine others share, and root's XDG_CACHE_HOME or HOME may name a directory
another user controls (`sudo -E`). A library or figure read back from there would be that user's: the CUPTI
library `decodemon run` hands to CUDA_INJECTION64_PATH, the copy bandwidth the floor divides by, the bytecode the
monitor imports. So a cache is walked from "/" one directory at a time, by file descriptor, and used only where
every directory on the way and the file itself belong to this user or root and are writable by no one else (a
sticky /tmp is not: others can plant names in it). Standard library only: the probes use it too.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # as the kernel's own path walk
_said: set[str] = set()


class NotOwn(OSError):
    """A directory or file on a cache's path that others could have written; str() is the path and why."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} is not only {_whose(os.geteuid())} ({why})")
        self.path, self.why = path, why

    def about(self, cache: str | os.PathLike) -> str:
        """One line on the cache this was found on the way to (its own path said where it is not the culprit)."""
        cache = os.path.abspath(os.fspath(cache))
        where = "" if self.path == cache else f"{self.path}: "
        return f"the cache {cache} is not only {_whose(os.geteuid())} ({where}{self.why})"


def _whose(uid: int) -> str:
    if uid == 0:
        return "root's"
    try:
        import pwd  # noqa: PLC0415

        return f"{pwd.getpwuid(uid).pw_name}'s"
    except (ImportError, KeyError):
        return f"uid {uid}'s"


def check(st: os.stat_result, path: str, mine: bool = False, sticky_ok: bool = False) -> None:
    """NotOwn unless `st` belongs to this user (or root, unless `mine`) and no one else can write it."""
    uid = os.geteuid()
    ok_owners = (uid,) if mine else (uid, 0)
    if st.st_uid not in ok_owners:
        raise NotOwn(path, f"owned by uid {st.st_uid}")
    if st.st_mode & 0o022 and not (sticky_ok and st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
        raise NotOwn(path, f"writable by {'others' if st.st_mode & 0o002 else 'its group'}")


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def _step(fd: int, name: str, where: list[str], create: bool) -> int | str:
    """Open `name` in the directory `fd`: its fd, or the text of the link it is."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:  # made beside us: opened and checked as any other
            pass
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        try:
            return os.readlink(name, dir_fd=fd)
        except OSError:
            raise NotOwn("/" + "/".join([*where, name]), "not a directory") from None


def open_dir(path: str | os.PathLike, create: bool = False, mine: bool = False,
             sticky_ok: bool = False) -> tuple[int, str]:
    """(an fd on the directory `path`, its path with no links) once every directory from "/" down has passed
    check(); missing ones made 0700 when `create`. `mine`: the last must be this user's own; `sticky_ok`: the
    last may be a root-owned sticky directory (a /tmp to make a private directory in). NotOwn, else OSError."""
    todo = _parts(os.path.abspath(os.fspath(path)))
    fd, where, links = os.open("/", DIR_FLAGS), [], 0
    try:
        check(os.fstat(fd), "/", mine=mine and not todo, sticky_ok=sticky_ok and not todo)
        while todo:
            name = todo.pop(0)
            nxt = _step(fd, name, where, create)
            if isinstance(nxt, str):
                # a link in a directory only root or this user can write was put there by one of them: what it
                # names is walked and checked in turn, so a link out to another user's directory is refused there
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many links", "/" + "/".join(where))
                todo[:0] = _parts(nxt)
                if nxt.startswith("/"):
                    os.close(fd)
                    fd, where = os.open("/", DIR_FLAGS), []
                continue
            os.close(fd)
            fd = nxt
            where = where[:-1] if name == ".." else [*where, name]
            last = not todo
            check(os.fstat(fd), "/" + "/".join(where), mine=mine and last, sticky_ok=sticky_ok and last)
        check(os.fstat(fd), "/" + "/".join(where), mine=mine, sticky_ok=sticky_ok)  # where a link led back to "/"
        return fd, "/" + "/".join(where)
    except BaseException:
        os.close(fd)
        raise


def open_file(dir_fd: int, name: str, dir_path: str) -> int:
    """An fd on the regular file `name` in the checked directory `dir_fd`, itself checked; never through a link."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotOwn(os.path.join(dir_path, name), "not a regular file")
        check(st, os.path.join(dir_path, name))
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_file(path: str | os.PathLike) -> bytes | None:
    """The bytes of the cache file `path` (None where it or a directory above it is missing); NotOwn when it or
    a directory on its way could be another user's."""
    d, name = os.path.split(os.path.abspath(os.fspath(path)))
    try:
        dfd, real = open_dir(d)
    except FileNotFoundError:
        return None
    try:
        fd = open_file(dfd, name, real)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOwn(os.path.join(real, name), "a link") from None
        raise
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def write_file(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write `name` whole in the checked directory `dir_fd`: a new temporary file, renamed over it."""
    tmp = f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def private_dir(prefix: str = "decodemon-") -> str:
    """A new directory (0700) that only this user can reach, in the temporary directory when it and the
    directories above it pass (a root-owned sticky one does: no one else can rename what this user makes in it)."""
    for base in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
        try:
            fd, real = open_dir(base, sticky_ok=True)
        except OSError:
            continue
        try:
            made = tempfile.mkdtemp(prefix=prefix, dir=real)
            name = os.path.basename(made)
            mfd = os.open(name, DIR_FLAGS, dir_fd=fd)  # what mkdtemp made is ours, and no link
            try:
                check(os.fstat(mfd), made, mine=True)
            finally:
                os.close(mfd)
        finally:
            os.close(fd)
        return made
    raise OSError(errno.EACCES, "no temporary directory where only this user could make one", tempfile.gettempdir())


def say_once(text: str) -> None:
    """One line on stderr, the first time this process has it to say."""
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr, flush=True)
