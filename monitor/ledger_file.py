"""The ledger's file: one sealed entry a line, only ever appended to (one `os.write` of one whole line under
O_APPEND, then fsync), read back with each line that is not an entry named and kept; never through another user's
link, a regular file only, and bounded. What `decodemon.monitor.ledger` seals and grades is written and read here."""

from __future__ import annotations

import hashlib
import json
import os
import stat

FORMAT = "decodemon-ledger/1"


class LedgerError(Exception):
    """The ledger cannot be read or written, or an argument cannot be a prediction; str() is one line."""


class NotGraded(LedgerError):
    """The prediction cannot be graded against what was measured (the figures it sealed, another device, no
    ms/token): it stays open, and what was measured stands."""


def content_hash(entry: dict) -> str:
    """sha256 of the entry's canonical JSON without its own hash."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     default=str).encode()).hexdigest()


# --- the file ------------------------------------------------------------------------------------------------

def _refused(exc, path, doing: str = "write") -> LedgerError:
    """A safe_write refusal as the ledger's one line."""
    return LedgerError(f"cannot {doing} the ledger {path}: {str(exc).split(': ', 1)[-1]}")


def _open_append(path) -> tuple[int, bool]:
    """safe_write.open_append, its refusals as LedgerError: no other user's link followed, a regular file only."""
    from decodemon.monitor import safe_write

    try:
        return safe_write.open_append(path)
    except safe_write.Refused as exc:
        raise _refused(exc, path) from None


def check_writable(path) -> None:
    """LedgerError in one line if an entry could not be appended to `path`: asked before anything is measured.
    A ledger that does not exist yet is not left behind by the check."""
    from decodemon.monitor import safe_write

    fd, made = _open_append(path)
    os.close(fd)
    if made:
        safe_write.remove_new(path)


def append(path, entry: dict) -> None:
    """Append one sealed entry as one line: a single write under O_APPEND, then fsync."""
    line = json.dumps(entry, ensure_ascii=False, default=str, separators=(",", ":")) + "\n"
    fd, _ = _open_append(path)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # a torn last line stays a line of its own; ours does not merge into it
        data = line.encode()
        if os.write(fd, data) != len(data):
            raise LedgerError(f"cannot write the ledger {path}: short write")
        os.fsync(fd)
    except OSError as exc:
        raise LedgerError(f"cannot write the ledger {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read(path) -> tuple[list[dict], list[str]]:
    """The ledger's entries in file order, and one line for each line that is not one (kept in the file)."""
    raw = _read_bounded(path)
    if raw is None:
        return [], []
    entries, problems = [], []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        why = None
        try:
            e = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            why = "not JSON"
        else:
            if not isinstance(e, dict) or e.get("format") != FORMAT or e.get("kind") not in ("prediction", "grade"):
                why = "not a decodemon ledger entry"
            elif e.get("hash") != content_hash(e):
                why = "its content does not match its hash (edited after it was sealed?)"
        if why:
            problems.append(f"{path}:{n}: {why}; kept as it is, skipped")
        else:
            entries.append(e)
    if problems and not entries and len(problems) > 1:
        raise LedgerError(f"{path} is not a decodemon ledger: none of its {len(problems)} lines is a ledger entry "
                          "(give another file with --ledger)")
    if len(problems) > MAX_PROBLEM_LINES:
        problems = problems[:MAX_PROBLEM_LINES - 1] + [
            f"{path}: {len(problems) - MAX_PROBLEM_LINES + 1} more lines skipped, kept as they are"]
    return entries, problems


MAX_PROBLEM_LINES = 5  # a ledger's skipped lines said one by one up to this many, then counted
MAX_LEDGER_BYTES = 64 << 20  # a ledger is a line a prediction or grade: far under this; past it, refused


def _regular(fd: int, path) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise LedgerError(f"the ledger {path} is not a regular file (give a file with --ledger)")


def _read_bounded(path) -> bytes | None:
    """The ledger's bytes (None when there is none): a regular file only (not /dev/zero, a FIFO or a terminal),
    reached through no other user's link, at most MAX_LEDGER_BYTES."""
    from decodemon.monitor import safe_write

    try:
        fd = safe_write.open_read(path)
    except FileNotFoundError:
        return None
    except safe_write.Refused as exc:
        raise _refused(exc, path, "read") from None
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {exc.strerror or exc}") from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise LedgerError(f"the ledger {path} is a directory (give a file with --ledger)")
        _regular(fd, path)
        if os.fstat(fd).st_size > MAX_LEDGER_BYTES:
            raise LedgerError(f"the ledger {path} is over {MAX_LEDGER_BYTES >> 20} MB: not a decodemon ledger")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_LEDGER_BYTES + 1)
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_LEDGER_BYTES:
        raise LedgerError(f"the ledger {path} is over {MAX_LEDGER_BYTES >> 20} MB: not a decodemon ledger")
    return raw
