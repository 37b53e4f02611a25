"""`decodemon`: run, attach, record, replay, report, compare, demo, export, exporter, sweep, predict, grade,
diagnose, scaling, allreduce.

One module per verb, each with `add(sub)` (its parser) and `run(args)`. Exit codes: 0 ok; 2 bad input (bad
arguments, no such pid, no agent, a corrupt recording, an output that cannot be written, the app without a
terminal); 3 nothing was measured (the target went away first, a recording without tokens); 1 what no check
foresaw (a recording whose frames decode but hold nonsense; DECODEMON_DEBUG=1 re-raises); 130 interrupted.
Errors are one line on stderr that points at the verb's own help, never a traceback.
"""

from __future__ import annotations

import os
import sys

from decodemon.monitor import _lean

_lean.start()  # before numpy's first import (client -> wire): a light start beside the decode loop

from decodemon.monitor.cli import (allreduce, attach, compare, demo, diagnose, export, exporter,  # noqa: E402
                                   grade, predict, record, replay, report, run, scaling, sweep)
from decodemon.monitor.cli._common import Parser, UsageError, resolve_pid, resolve_sources  # noqa: E402
from decodemon.monitor.cli._common import attach_settings as _attach_settings  # noqa: E402
from decodemon.monitor.sources.errors import SourceError  # noqa: E402
from decodemon.monitor.safe_text import visible, visible_lines  # noqa: E402
from decodemon.monitor.sources.collect import VERSION, collect  # noqa: E402
from decodemon.monitor.sources.errors import NothingMeasured
from decodemon.probes import wire  # noqa: E402

__all__ = ["UsageError", "_attach_settings", "build_parser", "collect", "main", "resolve_pid"]

VERBS = (run, attach, record, replay, report, compare, demo, export, exporter, sweep, predict, grade, diagnose,
         scaling, allreduce)
# verbs that take a pid as `PID` or `--pid PID`
PID_VERBS = ("attach", "record")


def build_parser() -> Parser:
    """The `decodemon` parser with every verb."""
    ap = Parser(prog="decodemon", description="Watch an LLM decode loop on an NVIDIA GPU and name the ceiling "
                                              "that binds the token: BANDWIDTH, OCCUPANCY, LAUNCH or COMM.",
                epilog="`decodemon VERB --help` for a verb's options. Exit status: 0 ok; 2 bad input (one line: "
                       "bad arguments, a file named that is not there (a ledger too), no such pid, a corrupt "
                       "recording, an output that cannot be written); 3 nothing was measured (the target went away "
                       "first, a recording with neither tokens nor counters, nothing the figures given could price) "
                       "or, for grade, no open prediction this run can grade (none open, or the run cannot be held "
                       "against it: another device, the recording it was sealed from); 1 what no check foresaw "
                       "(DECODEMON_DEBUG=1 shows where); 130 interrupted.")
    ap.add_argument("--version", action="version", version=f"decodemon {VERSION}")
    sub = ap.add_subparsers(dest="command", parser_class=Parser, metavar="VERB")
    for verb in VERBS:
        verb.add(sub)
    return ap


def _parse(argv):
    parser = build_parser()
    a, extra = parser.parse_known_args(argv)
    if extra:
        prog = f"decodemon {a.command}" if a.command else "decodemon"
        raise UsageError(f"{prog}: unrecognized arguments: {' '.join(extra)} (see `{prog} --help`)")
    if not getattr(a, "fn", None):
        parser.print_help()
        return None
    if a.command in PID_VERBS:
        a.pid = resolve_pid(a)
    return a


def _quiet_stdout() -> None:
    """After a reader closed the pipe (`| head`), send the rest nowhere instead of failing at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _PipeTolerant:
    """stdout that, once its reader has closed the pipe (`| head -4`), sends the rest nowhere and lets the verb run
    to its end: the exit status is the verb's (3 for 'nothing binds'), not the pipe's."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            _quiet_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except BrokenPipeError:
            _quiet_stdout()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _terminate_as_interrupt(_signum, _frame) -> None:
    """SIGTERM ends a verb as Ctrl-C does (a recording keeps what it has, temp files go), and both wait for a
    recording's frame being written to be whole."""
    from decodemon.probes.wire_file import hold_interrupt

    if not hold_interrupt():
        raise KeyboardInterrupt


class _Visible:
    """A text stream that shows control characters as escapes (safe_text.visible_lines), lines and tabs kept:
    whichever line of a verb quotes a target or a recording on stderr, it reaches the terminal as text."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(visible_lines(text))
        return len(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv=None) -> int:
    """Entry point of the `decodemon` command."""
    import signal

    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _terminate_as_interrupt)
    stderr, stdout = sys.stderr, sys.stdout
    if stderr is not None and not isinstance(stderr, _Visible):
        sys.stderr = _Visible(stderr)
    if stdout is not None and not isinstance(stdout, _PipeTolerant) and not _tty(stdout):  # a pipe or a file
        sys.stdout = _PipeTolerant(stdout)
    try:
        status = _main(argv)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at the interpreter's exit
        return status
    finally:
        if sys.stderr.__class__ is _Visible:
            sys.stderr = stderr
        if sys.stdout.__class__ is _PipeTolerant:
            sys.stdout = stdout


def _main(argv) -> int:
    verb = "decodemon"
    try:
        a = _parse(argv)
        if a is None:
            return 2
        verb = f"decodemon {a.command}"
        if getattr(a, "source_names", None):
            resolve_sources(a)
        return a.fn(a)
    except UsageError as exc:
        _say(str(exc))
        return 2
    except NothingMeasured as exc:
        _say(f"{verb}: {exc}")
        return 3
    except (SourceError, wire.WireError) as exc:
        _say(f"{verb}: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as exc:  # a file the checks above could not foresee (a disk that filled, a path that vanished)
        where = f" {exc.filename}" if exc.filename else ""
        _say(f"{verb}:{where} {exc.strerror or exc}")
        return 2
    except Exception as exc:  # what no check foresaw, e.g. a recording whose frames decode but hold nonsense
        if os.environ.get("DECODEMON_DEBUG") == "1":
            raise
        _say(f"{verb}: {type(exc).__name__}: {str(exc)[:200]} (a damaged input? DECODEMON_DEBUG=1 shows where; "
             "if the input is sound, this is a decodemon bug)")
        return 1


def _say(line: str) -> None:
    """The verb's one line on stderr, a line break or escape sequence in what it quotes shown as an escape."""
    print(visible(line), file=sys.stderr)
