"""What the verbs share: the parser that fails in one line, number checks, the pid and seconds spellings,
the probe's settings (`--probe KEY=VALUE`), the terminal check and JSON output."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from decodemon.monitor.safe_text import visible
from decodemon.probes import wire


class UsageError(Exception):
    """Bad input from the command line; str() is the one line to print."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line pointing at this parser's own help."""

    def error(self, message):
        # "argument --seconds: --seconds must be ..." says the name twice: once is enough
        message = re.sub(r"^argument (\S+?)(?:/\S+)?: (\1 )", r"\2", message)
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def span(lo, hi, closed: bool = True) -> str:
    """A range as the messages write it: "[1, 4194304]", "(0, 3600]", "[0.01, 5]" (no exponents)."""
    def n(x):
        return "inf" if x == math.inf else str(int(x)) if float(x).is_integer() else f"{x:g}"
    return f"{'[' if closed else '('}{n(lo)}, {n(hi)}]"


# what a number on the command line is: ASCII digits, a sign, a point, an exponent (int() and float() also read
# '1_000' and other scripts' digits, '١٢٣' as 123); inf and nan are read to be refused as not finite
INTEGER = re.compile(r"[+-]?[0-9]+")
DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
                     re.IGNORECASE)


def number(name: str, s, integer: bool = False):
    """`s` as an int (`integer`) or a float, written in ASCII digits; ArgumentTypeError with one line otherwise."""
    text = str(s)
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"{name} must be written in ASCII digits, not {visible(text)!r}")
    if not (INTEGER if integer else DECIMAL).fullmatch(text):
        kind = "a whole number in digits 0-9," if integer else "a number, e.g. 3.93 or 1.2e9,"
        raise argparse.ArgumentTypeError(f"{name} must be {kind} not {visible(text)!r}")
    return int(text) if integer else float(text)


def bounded(name, lo=0.0, hi=float("inf"), integer=False, allow_zero=False):
    """An argparse type: a finite number in (lo, hi], or [lo, hi] when lo is not 0 or `allow_zero`."""
    closed = lo != 0 or allow_zero

    def conv(s):
        v = number(name, s, integer)
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be finite, not {s!r}")
        if not ((lo <= v <= hi) if closed else (lo < v <= hi)):
            raise argparse.ArgumentTypeError(f"{name} must be in {span(lo, hi, closed)}, got {s}")
        return v
    return conv


def finite(obj):
    """`obj` with every non-finite float (inf, nan) as None: JSON has no Infinity or NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


# what JSON's encoder leaves raw in a string (ensure_ascii=False): C1 controls (0x9b is CSI to a terminal), the line
# separators and the bidi marks; written as \\uXXXX, so a string a target supplied prints as text
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def json_text(obj, **kw) -> str:
    """`obj` as strict JSON (a non-finite number is null) that is safe on a terminal."""
    text = json.dumps(finite(obj), default=str, ensure_ascii=False, allow_nan=False, **kw)
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def print_json(obj) -> None:
    """Print `obj` as indented JSON on stdout (json_text)."""
    print(json_text(obj, indent=2))


def say(verb: str, message: str, file=None) -> None:
    """One line for `decodemon VERB` (on stderr unless `file`), its control characters shown as escapes: what it
    quotes of a target or a recording (a note, a reason, argv) reaches the terminal as text."""
    print(visible(f"decodemon {verb}: {message}" if verb else message), file=file or sys.stderr)


def fail(verb: str, message: str, code: int = 2) -> int:
    """Print one line for `decodemon VERB` on stderr (say) and return the exit code."""
    say(verb, message)
    return code


def without_tokens(verb: str, snaps) -> int | None:
    """Exit 3 with one line if a source measured no token (a recording that holds only its header, a target
    that went away at once); None when every source has tokens."""
    for s in snaps:
        if not s.measured_anything:
            where = f"pid {s.label}" if str(s.label).isdigit() else s.label
            why = f" ({s.ended})" if s.ended else ""
            return fail(verb, f"{where} holds no tokens{why}: nothing was measured", 3)
    return None


def need_terminal(verb: str, json_hint: str = "add --json for a summary instead") -> None:
    """The app draws on a terminal and reads keys from one; through a pipe it would never end."""
    for name, stream in (("stdout", sys.stdout), ("stdin", sys.stdin)):
        isatty = getattr(stream, "isatty", None)
        if stream is None or isatty is None or not isatty():
            raise UsageError(f"decodemon {verb}: {name} is not a terminal, and the app needs one: {json_hint}")


# --- pids and seconds, in decodemon's spelling and py-spy's ---------------------------------------------------

PID = bounded("pid", 1, 2**22, integer=True)  # Linux's PID_MAX_LIMIT


def add_pid(p) -> None:
    """A pid as the positional (`attach 123`) or as `--pid 123`."""
    p.add_argument("pid", nargs="?", type=PID, help="the decode loop's process id")
    p.add_argument("--pid", dest="pid_opt", type=PID, metavar="PID", help="the same, as py-spy spells it")


def resolve_pid(a) -> int:
    """The one pid given, positionally or with --pid; UsageError if none or two different ones."""
    prog = f"decodemon {a.command}"
    pos, opt = getattr(a, "pid", None), getattr(a, "pid_opt", None)
    if pos is not None and opt is not None and pos != opt:
        raise UsageError(f"{prog}: two pids given ({pos} and --pid {opt}); give one (see `{prog} --help`)")
    if pos is None and opt is None:
        raise UsageError(f"{prog}: give the pid to watch: `{prog} PID` or `--pid PID` (see `{prog} --help`)")
    return pos if pos is not None else opt


def add_source(p, names=("source",), what: str = "a pid or a .dmon recording") -> None:
    """Positional sources (`report 123`, `compare A B`), each also spelled `--pid PID` as py-spy does."""
    for n in names:
        p.add_argument(n, metavar=n.upper(), nargs="?", help=what)
    p.add_argument("--pid", dest="pid_opt", type=PID, action="append", metavar="PID",
                   help="a pid in place of a source, as py-spy spells it" + (" (repeatable)" if len(names) > 1 else ""))
    p.set_defaults(source_names=tuple(names))


def resolve_sources(a) -> None:
    """Fill the sources from the positionals and each `--pid`, in that order; UsageError when too few or many."""
    names = a.source_names
    given = [getattr(a, n) for n in names if getattr(a, n) is not None] + [str(x) for x in (a.pid_opt or [])]
    if len(given) != len(names):
        prog = f"decodemon {a.command}"
        want = " and ".join(n.upper() for n in names)
        raise UsageError(f"{prog}: give {want} (a pid or a recording each; --pid PID for a pid), "
                         f"not {len(given)} (see `{prog} --help`)")
    for n, v in zip(names, given):
        setattr(a, n, v)


def add_seconds(p, default, what: str) -> None:
    """`--seconds S`, also spelled `--duration S`."""
    p.add_argument("--seconds", "--duration", dest="seconds", type=bounded("--seconds", 0, 86400), default=default,
                   metavar="S", help=what)


def live_seconds(a, verb: str, sources, default: float | None) -> float | None:
    """`--seconds` for the pids among `sources` (`default` when not given); UsageError in one line when it was
    given and no source is a pid: a recording is read whole, and `--last S` (where the verb has it) picks its
    last S seconds. A probe option with no pid among them is refused too (live_probe)."""
    live = live_probe(a, verb, sources)
    if a.seconds is None:
        return default
    if live:
        return a.seconds
    what = "a recording, read whole" if len(sources) == 1 else "recordings, each read whole"
    last = "; --last S summarises the last S seconds" if hasattr(a, "last") else ""
    raise UsageError(f"decodemon {verb}: --seconds is how long a live pid is watched, and "
                     f"{' and '.join(map(str, sources))} {'is' if len(sources) == 1 else 'are'} {what}{last} "
                     f"(see `decodemon {verb} --help`)")


LAST_MIN_S = 0.5


def add_last(p, what: str = "the summary") -> None:
    """`--last S`: the summary over the last S seconds (the live screen's rolling span is the last 5) instead of
    the whole span asked for."""
    # the probe ships its marks half a second at a time: a shorter span would be summarised over one shipment
    p.add_argument("--last", type=bounded("--last", LAST_MIN_S, 86400), default=None, metavar="S",
                   help=f"{what} over the last S seconds only, at least {LAST_MIN_S:g} (the marks come half a "
                        "second at a time; the live screen's figures: --last 5); by default it covers the whole "
                        "span, with the rolling last-5-s figures beside it (rolling_5s)")


def need_json_for_last(a, verb: str, json_flag: str = "--json") -> None:
    """`--last` picks what a summary covers; the app shows the rolling 5 s and has no summary to pick it for."""
    if getattr(a, "last", None) is not None and not getattr(a, "json", False):
        raise UsageError(f"decodemon {verb}: --last S picks the span {json_flag} summarises; the app always shows "
                         f"the last 5 s (see `decodemon {verb} --help`)")


def add_refresh(p) -> None:
    """The app's screen refresh period."""
    p.add_argument("--refresh", type=bounded("--refresh", 0.05, 60), default=None, metavar="S",
                   help="seconds between screen refreshes (default 0.5)")


# --- the probe's settings --------------------------------------------------------------------------------------

PROBE_BOUNDS = wire.ATTACH_BOUNDS  # each field's bounds, shared with the agent's check of every Attach frame
# what each setting does, for `--probe help` (the field comments in wire.Attach say more)
PROBE_WORDS = {
    "window_period_s": "seconds between traced (CUPTI) windows",
    "window_tokens": "tokens traced in a window",
    "window_min_tokens": "tokens that pass between windows at least (but no longer than window_max_s)",
    "window_max_s": "the longest wait for window_min_tokens",
    "window_budget": "windows a process gets before they are rationed to one a minute",
    "pm_interval_us": "PM counter sample period",
    "nvml_hz": "NVML reads a second",
    "trace": "CUPTI windows at all (false: the token clock and counters only)",
    "pm": "PM counter sampling at all",
    "first_window_s": "seconds from attach to the first window (none: half a second)",
    "prepare_lead_tokens": "tokens between CUPTI's start-up and an eager window's opening",
    "api_every": "runtime-API records in one window of every N (0: never)",
    "agent_tick_s": "seconds between the agent thread's wake-ups",
    "pm_pump_s": "seconds between PM buffer pumps",
    "hold_gil": "the agent's short calls keep the GIL (false gives it up in each)",
    "time_window_s": "how long a window opened by time stays open (loops that mark no token)",
    "token_range": "an NVTX range name as the token clock (as --token-range)",
    "prepare_first_window": "CUPTI's first start-up in a process made on the agent thread, off the loop",
    "yields": "this monitor steps aside for one that does not (the exporter's setting)",
}
# the probe's own experiment knobs (decodemon's benchmarks set them): they work as any key, and `--probe help-all`
# lists them, but a user's `--probe help` does not
DEVELOPER_KEYS = ("api_every", "hold_gil", "yields", "prepare_lead_tokens", "prepare_first_window", "agent_tick_s",
                  "pm_pump_s")
PROBE_CHOICES = wire.ATTACH_CHOICES
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

def probe_fields() -> dict:
    """wire.Attach's field names a user may set, with their defaults and types (the CUPTI library the monitor
    sends is its own to choose)."""
    import msgspec

    return {f.name: (f.default, f.type) for f in msgspec.structs.fields(wire.Attach) if f.name != "cupti_library"}


def probe_value(key: str, text: str, name: str | None = None):
    """`text` as the value of Attach field `key`, checked; ArgumentTypeError with one line otherwise."""
    name = name or key
    default, typ = probe_fields()[key]
    if typ is bool or isinstance(default, bool):
        low = text.strip().lower()
        if low not in TRUE + FALSE:
            raise argparse.ArgumentTypeError(f"{name} must be true or false, not {text!r}")
        return low in TRUE
    if default is None and text.strip().lower() == "none":
        return None
    if key in PROBE_CHOICES:
        if text.strip() not in PROBE_CHOICES[key]:
            raise argparse.ArgumentTypeError(f"{name} is one of {', '.join(PROBE_CHOICES[key])}, not {text!r}")
        return text.strip()
    if typ is str or isinstance(default, str):
        if not text.strip() or len(text) > 256 or not text.isprintable():
            raise argparse.ArgumentTypeError(f"{name} takes a name of 1 to 256 printable characters, not {text!r}")
        return text
    lo, hi, integer, allow_lo = PROBE_BOUNDS.get(key, (0, math.inf, typ is int, True))
    return bounded(name, lo, hi, integer, allow_zero=allow_lo)(text)


def probe_help(developer: bool = False) -> str:
    """The `--probe help` listing: each key a user sets, its default and what it takes (`developer`: every key,
    the benchmarks' experiment knobs too)."""
    lines = ["--probe KEY=VALUE keys, with their defaults:"]
    for key, (default, typ) in probe_fields().items():
        if key in DEVELOPER_KEYS and not developer:
            continue
        if typ is bool or isinstance(default, bool):
            takes = "true|false"
        elif key in PROBE_CHOICES:
            takes = "|".join(PROBE_CHOICES[key])
        elif typ is str or isinstance(default, str):
            takes = "a name"
        else:
            lo, hi, integer, allow_lo = PROBE_BOUNDS.get(key, (0, math.inf, typ is int, True))
            takes = f"{'whole ' if integer else ''}{span(lo, hi, allow_lo)}"
            takes += " or none" if default is None else ""
        lines.append(f"  {key:<20} {default!s:<6} {takes:<21} {PROBE_WORDS.get(key, '')}".rstrip())
    return "\n".join(lines)


class ProbeAction(argparse.Action):
    """`--probe KEY=VALUE` (repeatable) into a list of (key, value); `--probe help` lists the keys and exits."""

    def __call__(self, parser, namespace, text, option_string=None):
        if text.strip() in ("help", "help-all"):
            print(probe_help(developer=text.strip() == "help-all"))
            parser.exit(0)
        key, eq, value = text.partition("=")
        key = key.strip()
        if not eq:
            parser.error(f"--probe takes KEY=VALUE, not {text!r} (`--probe help` lists the keys)")
        if key not in probe_fields():
            parser.error(f"--probe: no probe setting {key!r} (`--probe help` lists the keys)")
        try:
            parsed = probe_value(key, value)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--probe {text}: {exc}")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), (key, parsed)])


def add_probe(p) -> None:
    """The probe options a user sets, and `--probe KEY=VALUE` for the rest."""
    g = p.add_argument_group("probe")
    g.add_argument("--window-period", type=bounded("--window-period", 0, 3600), default=None, metavar="S",
                   help="seconds between traced windows (default 4)")
    g.add_argument("--no-trace", action="store_true", help="no CUPTI windows: the token clock and counters only")
    g.add_argument("--no-pm", action="store_true", help="no PM counter sampling")
    g.add_argument("--token-range", type=lambda t: probe_value("token_range", t, "--token-range"), default=None,
                   metavar="NAME", help="the token clock is an NVTX range: each close of a range of this name "
                                        "(torch.cuda.nvtx or the nvtx package, from Python) is a token")
    g.add_argument("--probe", action=ProbeAction, default=[], metavar="KEY=VALUE",
                   help="set any probe setting (repeatable); `--probe help` lists them")


def live_probe(a, verb: str, sources) -> bool:
    """Whether a source is a pid; UsageError in one line where a probe option was given and none is: a recording
    was made with the probe's settings of its time, and the option would be silently dropped."""
    from decodemon.monitor.sources.collect import source_of

    live = any(source_of(s)[0] == "pid" for s in sources)
    probe = probe_flags(a)
    if probe and not live:
        noun = "a recording" if len(sources) == 1 else "recordings"
        flags = probe[0] if len(probe) == 1 else f"{', '.join(probe[:-1])} and {probe[-1]}"
        raise UsageError(f"decodemon {verb}: {flags} set{'s' if len(probe) == 1 else ''} the probe of a "
                         f"live pid, and {' and '.join(map(str, sources))} {'is' if len(sources) == 1 else 'are'} "
                         f"{noun}, made with the probe's settings of the time (see `decodemon {verb} --help`)")
    return live


def probe_flags(a) -> list[str]:
    """The probe options given on the command line (add_probe's), by their flags."""
    given = [("--window-period", getattr(a, "window_period", None) is not None),
             ("--no-trace", getattr(a, "no_trace", False)), ("--no-pm", getattr(a, "no_pm", False)),
             ("--token-range", bool(getattr(a, "token_range", None))), ("--probe", bool(getattr(a, "probe", None)))]
    return [flag for flag, on in given if on]


def attach_settings(a) -> wire.Attach:
    """The wire.Attach a verb's options describe: defaults, the user's flags, then each `--probe` in order."""
    fields = probe_fields()
    kw = {}
    if getattr(a, "window_period", None) is not None:
        kw["window_period_s"] = a.window_period
    if getattr(a, "no_trace", False):
        kw["trace"] = False
    if getattr(a, "no_pm", False):
        kw["pm"] = False
    if getattr(a, "token_range", None):
        kw["token_range"] = a.token_range
    for key, v in getattr(a, "probe", None) or []:
        kw[key] = v
    period = kw.get("window_period_s", fields["window_period_s"][0])
    kw["window_max_s"] = max(kw.get("window_max_s", fields["window_max_s"][0]), period)
    return wire.Attach(**kw)
