"""The demo engine's per-token clocks: the wall clocks of every timed token (TokenTimes) and, with
`--cpu-clocks`, the decode thread's CPU clocks (TokenClocks), which say where a slow token's time went.

Thread CPU up with wall time: the decode thread worked longer (or its core ran slower); process CPU up without
it: another thread of this process was busy (GIL); run-queue wait up (/proc/thread-self/schedstat): the
scheduler kept the thread off a core. The decode thread's own page faults and context switches (getrusage,
RUSAGE_THREAD) say whether a slow token waited on the kernel's memory work (minor faults, e.g. pages being
migrated or compacted) or was switched out (involuntary switches) while its CPU time still ran.

`gc_ms` / `gc_n`: the cyclic garbage collector's time and collections on the decode thread in the token,
`gc_other_ms` its time on other threads (the agent's): an attached process allocates more, so the collector
may run more often, on whichever thread crosses its threshold (gc.callbacks).

`canary_us` times a fixed bit of pure Python on the decode thread itself each token (~30 us): up with the
token's time, the core itself ran slower. `canary_c_us` times fixed C (zlib.crc32 of 4 KB, 16 times, the GIL
held): the Python canary ran 1-2% faster while decodemon was attached in five of six A/B labels on the H200,
so the core's speed also gets a yardstick that runs no bytecode.
"""

from __future__ import annotations

import collections
import gc
import json
import resource
import statistics
import threading
import time
import zlib

# read()'s first nine, kept as per-token differences; the two canaries are kept as they are
DELTA_KEYS = ("thread_cpu_ms", "process_cpu_ms", "runq_wait_ms", "minflt", "nvcsw", "nivcsw",
              "gc_ms", "gc_n", "gc_other_ms")
CANARY_KEYS = ("canary_us", "canary_c_us")

_WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
# under zlib's 5 KB, so crc32 keeps the GIL: nothing else runs in the C canary's time
_CRC_BUF = bytes(range(256)) * 16


class GcClock:
    """A gc.callbacks entry that sums the cyclic collector's time: `ms` and `n` (collections) on the thread
    `decode_ident`, `other_ms` on any other thread."""

    def __init__(self, decode_ident: int) -> None:
        self.decode_ident = decode_ident
        self.ms, self.n, self.other_ms = 0.0, 0, 0.0
        self._started: dict[int, int] = {}

    def __call__(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.perf_counter_ns()
            return
        t0 = self._started.pop(me, None)
        if t0 is None:
            return
        took = (time.perf_counter_ns() - t0) / 1e6
        if me == self.decode_ident:
            self.ms += took
            self.n += 1
        else:
            self.other_ms += took


class TokenTimes:
    """The wall clocks of the timed tokens: inter-token latency (`times`, stamped as the token reaches the host),
    the iteration clock (`iter_times`, stamped after the token clock's hook), each token's end (unix s, kept with
    a times file), the token ids (with --print-tokens), and the `--log-every` lines."""

    def __init__(self, times_file: str | None, log_every: float, print_tokens: bool) -> None:
        self.times_file, self.log_every, self.print_tokens = times_file, log_every, print_tokens
        self.end_times: list[float] = []
        self.tokens: list[int] = []
        self.times: collections.deque = collections.deque(maxlen=200_000)  # flat memory when run until killed
        self.iter_times: collections.deque = collections.deque(maxlen=200_000)
        self.log_times: list[float] = []
        self.next_log = time.monotonic() + log_every if log_every > 0 else float("inf")

    def add(self, tok: int, took: float, took_iter: float) -> None:
        """Keep one timed token: its id, its two clocks' seconds; print a `--log-every` line when one is due."""
        if self.times_file:
            self.end_times.append(time.time())
        self.times.append(took)
        self.iter_times.append(took_iter)
        if self.log_every > 0:
            self.log_times.append(took)
        if self.print_tokens and len(self.tokens) < 100000:
            self.tokens.append(tok)
        if time.monotonic() >= self.next_log:
            print(json.dumps({"t": round(time.time(), 3), "n": len(self.log_times),
                              "ms_median": round(statistics.median(self.log_times) * 1e3, 4)}), flush=True)
            self.log_times = []
            self.next_log = time.monotonic() + self.log_every

    def as_json(self) -> dict[str, list[float]]:
        """The tokens' end times and both clocks in ms, for the times file."""
        n = len(self.end_times)
        return {"end_unix_s": self.end_times, "ms": [round(t * 1e3, 5) for t in list(self.times)[-n:]],
                "ms_iter": [round(t * 1e3, 5) for t in list(self.iter_times)[-n:]]}


def _runq_wait_ms() -> float:
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


def _canaries() -> tuple[float, float]:
    """Microseconds of a fixed bit of pure Python, then of fixed C (crc32 with the GIL held)."""
    c0 = time.perf_counter_ns()
    x = 0
    for j in range(1000):
        x += j
    canary = (time.perf_counter_ns() - c0) / 1e3
    c1 = time.perf_counter_ns()
    for _ in range(16):
        zlib.crc32(_CRC_BUF)
    return canary, (time.perf_counter_ns() - c1) / 1e3


class TokenClocks:
    """The decode thread's clocks, one entry per timed token. Make it on the decode thread, just before the
    loop: it registers a GcClock for that thread and takes the first reading."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.series: dict[str, list[float]] = {k: [] for k in DELTA_KEYS + CANARY_KEYS}
        self.gc_clock = GcClock(threading.get_ident())
        gc.callbacks.append(self.gc_clock)
        self._prev = self.read()

    def read(self) -> tuple[float, ...]:
        """One reading, in DELTA_KEYS + CANARY_KEYS order: cumulative counters, then this moment's canaries."""
        wait = _runq_wait_ms()
        ru = resource.getrusage(_WHO)
        canary, canary_c = _canaries()
        g = self.gc_clock
        return (time.thread_time() * 1e3, time.process_time() * 1e3, wait, ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw,
                g.ms, g.n, g.other_ms, canary, canary_c)

    def add(self, i: int) -> None:
        """Read the clocks after token `i`; from the first token past the warmup on, keep what it took."""
        now = self.read()
        if i >= self.warmup:
            for k, x, y in zip(DELTA_KEYS, now, self._prev):
                self.series[k].append(round(x - y, 4))
            self.series["canary_us"].append(round(now[9], 3))
            self.series["canary_c_us"].append(round(now[10], 3))
        self._prev = now

    def as_json(self, n: int) -> dict[str, list[float]]:
        """The last `n` tokens of every series, for the times file."""
        return {k: v[-n:] for k, v in self.series.items()}
