"""The directory an output goes in, reached from a descriptor one name at a time: no path is looked up twice.

A path checked name by name with lstat and then opened by path can change between the two: a user who owns a
directory on the way exchanges it with a link (renameat2 RENAME_EXCHANGE) after its check, and the open goes where
the link points (root's ledger line landed in a root-owned file). Here each name is opened relative to the
descriptor of the directory before it, without following a link (O_PATH | O_NOFOLLOW), and what is checked is what
was opened (fstat of that descriptor): a name swapped between two steps is met as what it is at its own step,
and a link is read from its own descriptor (readlinkat of it), never looked up again. The walk starts at `/`, or at
this process's working directory for a relative path. The caller gets the real directory's descriptor and the
last name, and creates, writes, renames and removes relative to that descriptor, so a file lands in the directory
that was checked whatever its path names by then.

A link is followed as it always was (may_follow): when this user or root owns it, or, for a user other than root,
when its owner owns its directory and that directory is not shared (sticky and world-writable).
"""

from __future__ import annotations

import os
import stat

from decodemon.monitor.sources.errors import SourceError

MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # the name itself, a link included; opens no FIFO or device


class Refused(SourceError):
    """A path decodemon will not write (or read as a ledger); str() is the one line that says why."""


def may_follow(link: os.stat_result, parent: os.stat_result) -> bool:
    """This user's or root's link; else, for a user other than root, one whose owner owns its directory, unless
    that is shared (sticky and world-writable). Root follows root's links only: a user's link in the user's own
    folder (`-o ~alice/out.md` pointing at /etc/...) would otherwise have root replace what it points at."""
    if link.st_uid in (os.geteuid(), 0):
        return True
    if os.geteuid() == 0:
        return False
    shared = bool(parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH)
    return not shared and link.st_uid == parent.st_uid


class Place:
    """A walked output: the descriptor of its real directory (this object's, closed by `close`), its name there
    ("" for `/` itself) and its real path, for messages and for a caller that names it later."""

    def __init__(self, dfd: int, name: str, real: str) -> None:
        self.dfd, self.name, self.real = dfd, name, real

    def close(self) -> None:
        if self.dfd >= 0:
            os.close(self.dfd)
            self.dfd = -1

    def __enter__(self) -> Place:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Walk:
    """One walk: a stack of (descriptor, real path) of the directories walked into, the last the current one; a
    `..` goes back to the one before (the directory that was walked through, not whatever holds its name now)."""

    def __init__(self, text: str, shown: str, doing: str) -> None:
        self.shown, self.doing, self.hops = shown, doing, 0
        self.stack: list[tuple[int, str]] = []
        if text.startswith("/"):
            self.to_root()
        else:
            try:
                here = os.getcwd()
                self.stack.append((os.open(".", DIR_FLAGS), here))
            except OSError as exc:
                self.refuse(f"the working directory: {exc.strerror or exc}")

    def refuse(self, why: str):
        raise Refused(f"cannot {self.doing} {self.shown}: {why}")

    def close(self) -> None:
        while self.stack:
            os.close(self.stack.pop()[0])

    def to_root(self) -> None:
        self.close()
        self.stack.append((os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), "/"))

    def up(self) -> None:
        """`..`: back one directory; from the first one, its real parent (the parent of `/` is `/`)."""
        if len(self.stack) > 1:
            os.close(self.stack.pop()[0])
            return
        fd, path = self.stack[0]
        try:
            self.stack[0] = (os.open("..", DIR_FLAGS, dir_fd=fd), os.path.dirname(path))
        except OSError as exc:
            self.refuse(f"{path}/..: {exc.strerror or exc}")
        os.close(fd)

    def step(self, part: str, more: bool) -> str | None:
        """Walk into `part` of the current directory: None once in it (a directory, `more` to come), "" when it is
        the last name (a new one, or anything but a link), or the target of a link to walk next."""
        top, here = self.stack[-1]
        cand = os.path.join(here, part)
        try:
            nfd = os.open(part, _NAME_FLAGS, dir_fd=top)
        except FileNotFoundError:
            if more:
                self.refuse(f"no directory {cand}")
            return ""
        except OSError as exc:
            self.refuse(f"{cand}: {exc.strerror or exc}")
        try:
            st = os.fstat(nfd)
            if stat.S_ISLNK(st.st_mode):
                return self.link(nfd, st, cand, more)
            if not more:
                return ""
            if not stat.S_ISDIR(st.st_mode):
                self.refuse(f"{cand} is not a directory")
            # "." of the name's own descriptor: the very directory checked above, whatever holds `part` by now
            self.stack.append((os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=nfd), cand))
            return None
        except OSError as exc:
            self.refuse(f"{cand}: {exc.strerror or exc}")
        finally:
            os.close(nfd)

    def link(self, nfd: int, st: os.stat_result, cand: str, more: bool) -> str:
        """The target of the link open at `nfd` (read from that descriptor), if may_follow allows it."""
        self.hops += 1
        if self.hops > MAX_LINKS:
            self.refuse("too many links on the way (a symlink loop?)")
        top, here = self.stack[-1]
        parent = os.fstat(top)
        if not may_follow(st, parent):
            what = cand if more else "it"
            where = "a shared sticky directory" if parent.st_mode & stat.S_ISVTX else here
            self.refuse(f"{what} is a link owned by uid {st.st_uid} (another user) in {where}; not followed (give "
                        "the path it points to, if that is meant)")
        return os.readlink("", dir_fd=nfd)  # readlinkat(nfd, ""): this link, not whatever holds its name now

    def run(self, text: str) -> Place:
        todo = text.split("/")[::-1]  # a stack of the names still to walk
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                self.up()
                continue
            target = self.step(part, any(p not in ("", ".") for p in todo))
            if target == "":
                fd, here = self.stack.pop()
                return Place(fd, part, os.path.join(here, part))
            if target is not None:
                todo.extend(target.split("/")[::-1])
                if target.startswith("/"):
                    self.to_root()
        return self.ended_on_a_directory()

    def ended_on_a_directory(self) -> Place:
        """The walk ended in a directory (`/`, `.`, `..`): that directory as a name in its parent, as it was."""
        fd, here = self.stack[-1]
        if here == "/":
            self.stack.pop()
            return Place(fd, "", here)
        if len(self.stack) > 1:
            os.close(self.stack.pop()[0])
            return Place(self.stack.pop()[0], os.path.basename(here), here)
        try:  # the first directory (the working one): its real parent
            return Place(os.open("..", DIR_FLAGS, dir_fd=fd), os.path.basename(here), here)
        except OSError as exc:
            self.refuse(f"{here}/..: {exc.strerror or exc}")


def walk(path, shown: str | None = None, doing: str = "write") -> Place:
    """The real directory of `path` (open, this caller's to close) and its last name, every link on the way and a
    last name that is a link followed when may_follow allows it (Refused in one line otherwise); the last name
    need not exist yet."""
    text = str(path)
    w = _Walk(text, text if shown is None else shown, doing)
    try:
        return w.run(text)
    finally:
        w.close()
