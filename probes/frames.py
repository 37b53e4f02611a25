"""The wire as the agent speaks it, in the standard library alone.

The agent runs inside the engine's interpreter, where nothing of decodemon is installed: it builds its frames
from plain values and packs them with `msgpack_std`; the monitor reads them with the typed schema of
`probes/wire.py` (msgspec). A frame here is its tag and the fields it was given; a field left out is read by the
monitor as its default. The names, tags and fields are the schema's: `tests/test_frames.py` holds every class here
to the msgspec struct of the same name, and the control messages (which the agent decodes) are defined here once,
the monitor's structs made from this table.
"""

from __future__ import annotations

import math
import struct

from decodemon.probes.msgpack_std import UnpackError, packb, unpackb

# 2: the probe's status travels as ProbeStatus (fields with units); version-1 recordings carry Stats (a dict of
# sentences), which the monitor still reads
WIRE_VERSION = 2
# how an agent's goodbye begins when another monitor has it (found busy, or stepped aside for a new one)
LENT_TO_ANOTHER = ("busy:", "stepped aside for monitor")
LEN = struct.Struct("<I")
MAX_FRAME_BYTES = 64 * 1024 * 1024
# a frame's lists and dicts hold at most this many entries (the monitor checks it before decoding any entry)
MAX_ENTRIES = 1 << 20
# the observer's steps that hold the decode thread or its GIL: a traced window on the decode thread (open to
# close), and the agent thread's CUPTI start-up, window collect, PM pump and window by time
OBSERVER_STEPS = ("window", "prepare", "collect", "pump", "time_window")
GRAPH_REPLAYS = "cuda graph replays"  # StepCounts.server when the agent counted the steps
STEP_STARTS = "step starts"  # StepCounts.server for the step starts the agent timed, one row a step


class WireError(ValueError):
    """A frame, stream or recording that cannot be read; the message is one line for the user."""


_STRUCT_CODES = {"<i8": "q", "<u8": "Q", "<f8": "d", "<i4": "i", "<u4": "I", "<f4": "f"}


class Column:
    """An array on the wire: a little-endian dtype string and the raw bytes (the monitor reads it with numpy)."""

    __slots__ = ("dtype", "data")

    def __init__(self, dtype: str, data: bytes) -> None:
        self.dtype, self.data = dtype, bytes(data)

    @classmethod
    def of(cls, values, dtype: str = "<i8") -> "Column":
        """Pack Python numbers (rows of them are flattened, row-major), or an array with `astype`, into a column."""
        if hasattr(values, "astype"):  # a numpy array, from a collector that has numpy where it runs
            return cls(dtype, values.astype(dtype).tobytes())
        code = _STRUCT_CODES[dtype]
        if values and isinstance(values[0], (list, tuple)):
            values = [v for row in values for v in row]
        if code in "fd":
            vals = [float(v) for v in values]
            if code == "f":  # float32 as numpy casts: beyond its range is infinity, not an error
                vals = [v if abs(v) <= 3.4028234663852886e38 or v != v else math.copysign(math.inf, v) for v in vals]
        else:
            vals = [int(v) for v in values]
        return cls(dtype, struct.pack(f"<{len(vals)}{code}", *vals))

    def wire_map(self) -> list:
        return [self.dtype, self.data]  # msgspec's array_like form

    def __eq__(self, other) -> bool:
        return isinstance(other, Column) and (self.dtype, self.data) == (other.dtype, other.data)

    def __repr__(self) -> str:
        return f"Column({self.dtype!r}, {len(self.data)} bytes)"


class _Fields:
    """A struct of the schema: the fields given, by name; those left out are the monitor's defaults. `TAG` is the
    frame's tag (None for a struct nested in a frame); `FIELDS` the schema's field names, in order."""

    TAG: str | None = None
    FIELDS: tuple[str, ...] = ()
    REQUIRED: tuple[str, ...] = ()
    DEFAULTS: dict = {}

    def __init__(self, **fields) -> None:
        unknown = set(fields) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        missing = [f for f in self.REQUIRED if f not in fields]
        if missing:
            raise TypeError(f"{type(self).__name__} needs {', '.join(missing)}")
        self.__dict__.update(fields)

    def __getattr__(self, name: str):
        if name in self.DEFAULTS:
            return self.DEFAULTS[name]
        raise AttributeError(name)

    def given(self) -> dict:
        """The fields set on this value."""
        return dict(self.__dict__)

    def wire_map(self) -> dict:
        m = {"type": self.TAG} if self.TAG is not None else {}
        m.update(self.__dict__)
        return m

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def replace(obj: _Fields, **changes) -> _Fields:
    """A copy of `obj` with some fields changed."""
    return type(obj)(**{**obj.given(), **changes})


def _struct(name: str, tag: str | None, fields: str, required: str = "", defaults: dict | None = None) -> type:
    return type(name, (_Fields,), {"TAG": tag, "FIELDS": tuple(fields.split()), "REQUIRED": tuple(required.split()),
                                   "DEFAULTS": defaults or {}, "__doc__": f"The schema's {name}, as the agent sends it."})


GpuInfo = _struct("GpuInfo", None, "index name sm_count mem_bandwidth_gbs memory_total_bytes uuid cc driver_version "
                                   "cuda_driver_version copy_gbs", "index name sm_count mem_bandwidth_gbs")
ModelFacts = _struct(
    "ModelFacts", None, "name weight_bytes kv_bytes_per_position layers dtype tp_degree hidden measured_bandwidth_gbs "
    "tp_rank collectives_per_token collective_bytes collective_backend kv_dtype weight_bytes_total", "name weight_bytes",
    dict(kv_bytes_per_position=0, layers=0, dtype="", tp_degree=1, hidden=0, measured_bandwidth_gbs=0.0, tp_rank=0,
         collectives_per_token=0, collective_bytes=0, collective_backend="", kv_dtype="", weight_bytes_total=0))
Hello = _struct("Hello", "hello", "wire_version pid argv python hostname gpu gpu_unavailable cupti_version model "
                                  "settings lease_s tokens_shipped marked_s attaches_marked", "wire_version pid argv python hostname", dict(model=None, gpu=None))
TokenMarks = _struct("TokenMarks", "tokens", "t_ns depth coll_calls coll_ns coll_bytes batch first_token_ns "
                                             "observer_ns", "t_ns depth")
KernelWindow = _struct(
    "KernelWindow", "window", "window_id tokens token_bounds_ns names kernels api_names apis memcpys syncs "
    "dropped_records probe_host_ns guard_tokens prepare_ns apis_traced clock nvtx_names nvtx",
    "window_id tokens token_bounds_ns names kernels")
PmSamples = _struct("PmSamples", "pm", "metrics start_ns end_ns values window_span", "metrics start_ns end_ns values")
ProbeStatus = _struct(
    "ProbeStatus", "status",
    "token_clock token_range gpu gpu_error trace trace_reason trace_error window_tokens window_period_s window_clock "
    "window_clock_reason pm pm_reason pm_error pm_where pm_lib pm_interval_us step_count_ns pm_dram_bytes "
    "pm_first_session pm_holders pm_restarts pm_busy_tries pm_armed_after_s pm_last_release pm_restart_cause "
    "pm_stride pm_pumps pm_cpu_ms_per_pump pm_image_reset_ms_per_pump pm_image_reset_bytes pm_first_pump_cpu_ms "
    "pm_held_calls pm_handbacks_per_pump pm_full_pumps pm_overflow_pumps pm_image_samples pm_pump_s nvml nvml_reason "
    "nvml_error nvml_hz decode_waits_per_s agent_cpu_ms_per_s agent_cpu_over_s cupti_start_cpu_ms cupti_finalize_cpu_ms windows_in_process window_budget window_budget_state "
    "windows errors recent_errors dropped_records")
StepCounts = _struct("StepCounts", "counts", "url t_ns steps tokens busy ended server depth",
                     "url t_ns steps tokens busy ended")
Bye = _struct("Bye", "bye", "reason", "reason")


# -- monitor -> agent: the two messages the agent acts on, defined here once ---------------------------------------
# (name, type, default); the monitor's msgspec struct is made from this table (probes/wire.py)
ATTACH_FIELDS: tuple[tuple[str, object, object], ...] = (
    ("window_period_s", float, 4.0),
    ("window_tokens", int, 1),
    # a window costs 1-2 slow tokens: wait for this many tokens between windows (under 1% of tokens), but never
    # longer than window_max_s
    ("window_min_tokens", int, 250),
    ("window_max_s", float, 5.0),
    # each window leaves ~90-280 KB in the process for good (H200): past this many, one every
    # policy.BUDGET_PERIOD_S
    ("window_budget", int, 500),
    ("pm_interval_us", int, 2000),
    ("nvml_hz", float, 4.0),
    ("trace", bool, True),
    ("pm", bool, True),
    # seconds from attach to the first window (None: half a second, or the period if shorter); a group's monitor
    # staggers its ranks so the traced rank is the last at each collective and its NCCL kernels time the link
    ("first_window_s", float | None, None),
    # tokens between CUPTI's start-up on the agent thread and the window's opening boundary (0: the opening
    # boundary starts it, in the traced token, already the slowest); eager windows only
    ("prepare_lead_tokens", int, 0),
    # the process's first window has its CUPTI start-up (the library loaded, the context instrumented) made on the
    # agent thread before it opens, whatever prepare_lead_tokens says
    ("prepare_first_window", bool, True),
    # runtime-API records in one window of every N (windows 1, 1+N, ...), the others kernels, copies and memsets
    # only; 1: every window, 0: none (a kernels-only eager window's traced token was 2-16 ms cheaper on an H200)
    ("api_every", int, 4),
    # seconds between the agent thread's wake-ups (each takes the GIL from a decode thread running Python, and
    # costs the agent ~0.2-0.5 ms of CPU: on the CPU demo target, ~3,000 marks a second, a tick of 0.25 s read
    # 1.9-2.3 ms of agent CPU a second and one of 0.5 s 1.1-1.6)
    ("agent_tick_s", float, 0.5),
    # seconds between the PM sidecar's reads of the counters (in decodemon's own process)
    ("pm_pump_s", float, 1.0),
    # the agent's short calls keep the GIL (probes/held.py); False gives it up in each, for A/B runs
    ("hold_gil", bool, True),
    # how long a window opened by time stays open (a loop without token marks, or whose host runs ahead, in a
    # process that replays no CUDA graph)
    ("time_window_s", float, 0.25),
    # a named NVTX range as the token clock: each close of a range of this name, pushed from Python through
    # torch.cuda.nvtx or the nvtx package, marks a token, and the engine's own marks are ignored ("": marks)
    ("token_range", str, ""),
    # this monitor steps aside for one that does not yield (the exporter does: a user's attach is never "busy"
    # because of it)
    ("yields", bool, False),
    # decodemon's CUPTI library (probes/cupti_inject), built in the monitor's environment, for a Python agent's
    # traced windows (probes/native_tracer.py): the agent loads these bytes, and nothing from the target's own
    # environment ("": the monitor has none, and says why; windows are then unavailable)
    ("cupti_library", bytes, b""),
)

# each Attach field's bounds: (lo, hi, whole number, lo allowed); the CLI refuses out-of-range settings with these,
# and the agent refuses an Attach frame that breaks them (another client of the socket may send anything)
ATTACH_BOUNDS = {
    "window_period_s": (0, 3600, False, False), "window_tokens": (1, 64, True, True),
    "window_min_tokens": (0, 10**9, True, True), "window_max_s": (0, 3600, False, False),
    "window_budget": (1, 10**9, True, True), "pm_interval_us": (100, 1_000_000, True, True),
    "nvml_hz": (0, 100, False, True), "first_window_s": (0, 3600, False, True),
    "prepare_lead_tokens": (0, 64, True, True), "api_every": (0, 10**6, True, True),
    "agent_tick_s": (0.01, 1.0, False, True), "pm_pump_s": (0.1, 10, False, True),
    "time_window_s": (0.01, 5.0, False, True),
}
MAX_LIBRARY_BYTES = 1 << 20  # the CUPTI library an Attach carries (~60 KB)
MAX_CONTROL_BYTES = MAX_LIBRARY_BYTES + 64 * 1024  # an Attach with it, as the agent's door reads one
ATTACH_CHOICES: dict[str, tuple[str, ...]] = {}  # the fields that take one of a few words


def attach_problem(a) -> str | None:
    """Why an Attach cannot be served (a field out of its bounds, not finite, a word not among its choices, a name
    too long), or None. Reads the fields by name: the agent's Attach and the monitor's alike."""
    for key, (lo, hi, whole, lo_ok) in ATTACH_BOUNDS.items():
        v = getattr(a, key)
        if v is None and key == "first_window_s":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"{key}={v!r} is not a finite number"
        if v > hi or v < lo or (v == lo and not lo_ok) or (whole and v != int(v)):
            return f"{key}={v!r} is outside [{lo}, {hi}]"
    for key, words in ATTACH_CHOICES.items():
        if getattr(a, key) not in words:
            return f"{key}={getattr(a, key)!r} is not one of {', '.join(words)}"
    if len(a.cupti_library) > MAX_LIBRARY_BYTES:
        return f"cupti_library is over {MAX_LIBRARY_BYTES} bytes"
    if len(a.token_range) > 256 or not a.token_range.isprintable():
        return "token_range is not a name of at most 256 printable characters"
    return None


class Attach:
    """Arm the probe with these settings (ATTACH_FIELDS; when each applies: probes/policy.py)."""

    def __init__(self, **fields) -> None:
        for name, _, default in ATTACH_FIELDS:
            setattr(self, name, fields.pop(name, default))
        if fields:
            raise TypeError(f"Attach has no field {', '.join(sorted(fields))}")

    def wire_map(self) -> dict:
        return {"type": "attach", **{name: getattr(self, name) for name, _, _ in ATTACH_FIELDS}}


class Detach:
    """Disarm the probe and close the connection."""

    def wire_map(self) -> dict:
        return {"type": "detach"}


class Heartbeat:
    """The monitor is still there (every HEARTBEAT_S): an attached client silent for the agent's lease loses the
    slot, so one that sent an Attach and went quiet cannot hold it."""

    def wire_map(self) -> dict:
        return {"type": "heartbeat"}


HEARTBEAT_S = 1.0


def lease_s(agent_tick_s: float) -> float:
    """Hello.lease_s: a few agent ticks, never under 5 s (a heartbeat delayed by a loaded host is not a monitor
    gone)."""
    return max(5.0, 3.0 * agent_tick_s)


def _typed(name: str, kind, v):
    """`v` as field `name` of kind `kind` takes it (an int where a float is asked, as msgspec does), else WireError."""
    kinds = getattr(kind, "__args__", (kind,))
    for k in kinds:
        if k is type(None) and v is None:
            return v
        if k is bool and isinstance(v, bool):
            return v
        if k is int and isinstance(v, int) and not isinstance(v, bool):
            return v
        if k is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if k is str and isinstance(v, str):
            return v
        if k is bytes and isinstance(v, (bytes, bytearray)):
            return bytes(v)
    raise WireError(f"malformed control message: Expected `{kind}`, got `{type(v).__name__}` - at `$.{name}`")


def decode_control(payload: bytes):
    """Parse one monitor->agent message (Attach, Detach or Heartbeat); raise WireError on anything else."""
    try:
        m = unpackb(payload, max_entries=256, max_depth=2)
    except UnpackError as exc:
        raise WireError(f"malformed control message: {exc}") from None
    if not isinstance(m, dict):
        raise WireError("malformed control message: not a map")
    tag = m.pop("type", None)
    if tag == "detach":
        return Detach()
    if tag == "heartbeat":
        return Heartbeat()
    if tag != "attach":
        raise WireError(f"malformed control message: tag {tag!r} is not attach, detach or heartbeat")
    kinds = {name: kind for name, kind, _ in ATTACH_FIELDS}
    return Attach(**{k: _typed(k, kinds[k], v) for k, v in m.items() if k in kinds})  # unknown fields: ignored


def encode(obj) -> bytes:
    """One frame or control message as msgpack (no length prefix)."""
    return packb(obj)


def pack(obj) -> bytes:
    """One frame behind its 4-byte length, as the live socket carries it."""
    payload = encode(obj)
    if len(payload) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return LEN.pack(len(payload)) + payload
