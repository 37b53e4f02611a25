"""The wire: typed, versioned, tagged frames between the probe and the monitor.

One schema serves both a live attach (frames over a Unix socket, each behind a
4-byte length) and a recording (`.dmon`: a gzip stream holding a magic line, a
`RecordingHeader`, then the same frames, each behind its length and the
monitor's receive time). Live and replay therefore go through one decoder.

Bulk data travels columnar: a `Column` is a numpy array's dtype and raw bytes,
so the decode process builds one array per field per traced window instead of
one Python object per record, and the monitor reads it back with
`np.frombuffer` at no parsing cost.

This module imports only the standard library and msgspec, and numpy when a column is read or packed from an
array: the monitor may import it, the collectors may not be imported by the monitor. The NVML sidecar, a process
started at every attach, packs its columns from lists without numpy (its import was ~70% of the sidecar's imports).
"""

from __future__ import annotations

import struct
from typing import Annotated, Union

import msgspec

# what the agent and the monitor share is defined once, in the agent's standard-library half of the wire
from decodemon.probes.frames import (ATTACH_BOUNDS, ATTACH_CHOICES, ATTACH_FIELDS, GRAPH_REPLAYS,  # noqa: F401
                                     LEN as _LEN, LENT_TO_ANOTHER, MAX_ENTRIES, MAX_FRAME_BYTES, OBSERVER_STEPS,
                                     STEP_STARTS, WIRE_VERSION, HEARTBEAT_S, WireError,
                                     attach_problem)

MAGIC = b"DECODEMON-RECORDING\n"
_REC = struct.Struct("<IQ")  # payload length, receive time (ns since recording start)


_STRUCT_CODES = {"<i8": "q", "<u8": "Q", "<f8": "d", "<i4": "i", "<u4": "I", "<f4": "f"}


class Column(msgspec.Struct, frozen=True, array_like=True):
    """A numpy array on the wire: dtype string and the raw little-endian bytes."""

    dtype: str
    data: bytes

    @classmethod
    def of(cls, values, dtype: str = "<i8") -> "Column":
        """Pack a sequence or array into a column of the given dtype (a list or tuple of Python numbers of a
        common little-endian 4- or 8-byte dtype through `struct`, anything else through numpy)."""
        code = _STRUCT_CODES.get(dtype)
        if code is not None and isinstance(values, (list, tuple)):
            try:
                return cls(dtype, struct.pack(f"<{len(values)}{code}", *values))
            except (struct.error, OverflowError):
                pass  # e.g. floats for an integer column, or 1e40 as float32: numpy's casting, as before
        import numpy as np

        return cls(dtype, np.asarray(values, dtype=dtype).tobytes())

    def array(self):
        """The column as a read-only numpy array."""
        import numpy as np

        try:
            return np.frombuffer(self.data, dtype=np.dtype(self.dtype))
        except (TypeError, ValueError) as exc:
            raise WireError(f"bad column ({self.dtype}, {len(self.data)} bytes): {exc}") from None


# a frame's lists and dicts hold at most MAX_ENTRIES entries, checked against the length msgpack declares before any
# entry is decoded: a 64 MB frame of one-byte entries would otherwise become 64M Python objects (~1 s and 0.5 GB)
_MANY = msgspec.Meta(max_length=MAX_ENTRIES)
_Strs = Annotated[list[str], _MANY]
_Ints = Annotated[list[int], _MANY]
_Columns = Annotated[dict[str, Column], _MANY]
_Words = Annotated[dict[str, str], _MANY]
_Numbers = Annotated[dict[str, float], _MANY]


class GpuInfo(msgspec.Struct, frozen=True):
    """What the probe learned about the device once, at attach."""

    index: int
    name: str
    sm_count: int
    mem_bandwidth_gbs: float  # peak from NVML: bus width x max memory clock x 2
    memory_total_bytes: int = 0
    uuid: str = ""
    cc: str = ""
    driver_version: str = ""
    cuda_driver_version: int = 0
    # decodemon's own measured copy on this device and driver (GB/s, read + write), from the monitor's cache: added
    # by the monitor to the hello of every live source, so every consumer prices the floor with the same bandwidth
    copy_gbs: float = 0.0


class ModelFacts(msgspec.Struct, frozen=True):
    """What the diagnosis needs from the engine: bytes, shape and parallelism."""

    name: str
    weight_bytes: int
    kv_bytes_per_position: int = 0
    layers: int = 0
    dtype: str = ""
    tp_degree: int = 1
    hidden: int = 0
    measured_bandwidth_gbs: float = 0.0  # the engine's own device-to-device copy, read+write counted
    tp_rank: int = 0
    collectives_per_token: int = 0  # counted from the forward pass
    collective_bytes: int = 0  # payload of one collective
    # "gloo" (synchronous: the engine's clock around a call times the collective), "nccl" (asynchronous: it times
    # the enqueue only; µs per call comes from the NCCL kernels of a traced window), "" when not said
    collective_backend: str = ""
    kv_dtype: str = ""  # the KV cache's element type where it is not the weights' (llama.cpp's q8_0, q4_0, ...)
    # the weights' bytes in all, where a token reads fewer (`weight_bytes`: one row of an embedding table, not all)
    weight_bytes_total: int = 0

    def bytes_per_token(self, depth: int) -> int:
        """Bytes read to make one token at a context depth: weights plus the KV cache touched. For a batched
        engine's step, `depth` is every sequence's positions summed: the weights once plus all of their KV."""
        return self.weight_bytes + self.kv_bytes_per_position * max(depth, 0)


class RecordingHeader(msgspec.Struct, frozen=True, tag="rec"):
    """First frame of a `.dmon` file."""

    wire_version: int
    created_unix_s: float
    decodemon_version: str
    source: str = ""
    note: str = ""


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """The agent's first frame on every connection."""

    wire_version: int
    pid: int
    argv: _Strs
    python: str
    hostname: str
    gpu: Union[GpuInfo, None] = None
    gpu_unavailable: str = ""
    cupti_version: str = ""
    model: Union[ModelFacts, None] = None
    settings: _Numbers = {}
    # seconds an attached monitor may send nothing before the agent drops it (it sends a Heartbeat every
    # HEARTBEAT_S); 0: an agent that reads no Heartbeat, to which a monitor sends none
    lease_s: float = 0.0
    # the token marks this agent sent to monitors before this connection, over every attach: the tokens they stand
    # for, and the engine's seconds they span (each attach's, first mark to last sent); None: an agent that does
    # not say. A monitor that had the agent before counts by them the tokens another monitor got meanwhile.
    tokens_shipped: Union[int, None] = None
    marked_s: Union[float, None] = None
    attaches_marked: Union[int, None] = None  # the attaches among them that sent marks (each one's first ends a token
    # begun before it: the monitor's estimate of the moments between leaves that one out)


class TokenMarks(msgspec.Struct, frozen=True, tag="tokens"):
    """Token boundaries from the engine's clock (perf_counter ns) and the context depth at each.

    When the engine reports its collectives (`note_collective`), each token also carries the number of
    all-reduces it made, their host-side ns and their payload bytes.
    """

    t_ns: Column
    depth: Column
    coll_calls: Union[Column, None] = None
    coll_ns: Union[Column, None] = None
    coll_bytes: Union[Column, None] = None
    # a batched engine's marks are steps: the tokens each step made, one per sequence in it (None: one each)
    batch: Union[Column, None] = None
    # a batched engine's requests whose first token came in these steps: each one's time to that token, from the
    # request's arrival in the engine (ns; an adapter that sees requests gives them)
    first_token_ns: Union[Column, None] = None
    # what the observer did meanwhile that could slow a token: rows of (start, end, step) flattened, start and end
    # on the marks' clock (perf_counter ns), step an index into OBSERVER_STEPS
    observer_ns: Union[Column, None] = None



class KernelWindow(msgspec.Struct, frozen=True, tag="window"):
    """One traced window: every kernel, launch call, copy and sync in it.

    Timestamps are CUPTI's (ns). With `clock="tokens"` the window covers whole
    tokens and `token_bounds_ns` has tokens+1+guard_tokens entries: the token
    clock read through CUPTI at each boundary. With `clock="time"` (a loop that
    marks no tokens, or whose host runs ahead of the GPU) the window covers a
    stretch of time: tokens=0, guard_tokens=0 and `token_bounds_ns` is
    [opened, closed]; kernels enqueued before the close may end after it. A guard
    token is traced but not analysed: on an H200 the graph kernels of the last
    token before CUPTI is disabled came back with bogus end times, so windows
    of a process that replays CUDA graphs carry one; eager windows do not
    (guard_tokens=0), which saves a slow token per window. Columns of `kernels`:
    name, start, end, grid_x, grid_y, grid_z, block_x, block_y, block_z, regs,
    smem_static, smem_dynamic, stream, graph_id, graph_node_id, correlation.
    Columns of `apis`: cbid, start, end, correlation, domain (0 runtime, 1 driver).
    Columns of `memcpys`: start, end, bytes, copy_kind. Columns of `syncs`: start, end, type.
    """

    window_id: int
    tokens: int
    token_bounds_ns: Column
    names: _Strs
    kernels: _Columns
    api_names: _Words = {}
    apis: _Columns = {}
    memcpys: _Columns = {}
    syncs: _Columns = {}
    dropped_records: int = 0
    probe_host_ns: int = 0  # time the probe spent on the decode host thread for this window
    guard_tokens: int = 1  # traced after the analysed tokens and discarded (recordings before this field had 1)
    prepare_ns: int = 0  # CUPTI's start-up, made on the agent thread before the window (not in probe_host_ns)
    # False: runtime-API records were not traced in this window (`Attach.api_every`): `apis` is empty by design,
    # launches are counted from the kernels' correlation ids and the host side of the gaps is not known
    apis_traced: bool = True
    clock: str = "tokens"  # "tokens": opened and closed at token boundaries; "time": by the agent thread's clock
    # NVTX ranges pushed from Python that opened and closed inside the window (engine_adapter/nvtx_ranges.py):
    # columns name (index into nvtx_names), start, end (CUPTI ns), level (how many ranges were open around it)
    nvtx_names: _Strs = []
    nvtx: _Columns = {}

    def analysed_span(self) -> tuple[int, int] | None:
        """(first, last) boundary of the analysed tokens in CUPTI's clock, the guard left out; None if there are none."""
        tb = self.token_bounds_ns.array()
        return (int(tb[0]), int(tb[self.tokens])) if 0 < self.tokens < len(tb) else None


class PmSamples(msgspec.Struct, frozen=True, tag="pm"):
    """CUPTI PM sampling: device-wide hardware counters, one row per interval."""

    metrics: _Strs
    start_ns: Column
    end_ns: Column
    values: Column  # float64, rows x len(metrics), row-major
    # samples evaluated only because they fall in a traced window's tokens (beyond the pump's stride): kept out
    # of the loop's averages, which the regular samples give in proportion to time
    window_span: bool = False


class NvmlSamples(msgspec.Struct, frozen=True, tag="nvml"):
    """NVML telemetry: clocks, power, memory, utilisation and who else is on the GPU."""

    t_unix_ns: Column
    sm_clock_mhz: Column
    mem_clock_mhz: Column
    power_w: Column
    mem_used_bytes: Column
    gpu_util_pct: Column
    other_pids: _Ints = []


class Stats(msgspec.Struct, frozen=True, tag="stats"):
    """The probe's state in wire version 1: a dict of sentences and numbers-as-strings. Only read (recordings made
    before ProbeStatus); the monitor converts it (monitor/probe_status.py)."""

    state: _Words
    dropped_records: int = 0
    windows: int = 0
    errors: _Strs = []


class ProbeStatus(msgspec.Struct, frozen=True, tag="status"):
    """The probe's own state: what is armed, what is not and why, what it costs. Words are enum-like, never
    sentences (the monitor writes those); a field left at its default is "not said" by this frame, so the
    agent's and the sidecar's frames add up (monitor/probe_status.merge).

    Words: gpu ok|unavailable; trace armed|off|unavailable|paused|failed; pm armed|off|unavailable|lost;
    nvml armed|unavailable|error. Reasons: no_gpu, no_permission, hardware_busy, not_importable, env, error,
    foreign_profiler, sidecar_exited; `*_error` holds the exception text when the reason is `error`.
    """

    token_clock: str = ""  # "armed" once the session takes token marks
    token_range: str = ""  # the NVTX range whose closes are the token clock (Attach.token_range), if one
    gpu: str = ""
    gpu_error: str = ""
    trace: str = ""
    trace_reason: str = ""
    trace_error: str = ""
    window_tokens: int = 0  # what an armed trace traces: this many tokens every window_period_s
    window_period_s: float = 0.0
    window_clock: str = ""  # the clock the last window opened by: "tokens", "time", or "none" (no window can)
    # for "time": "no_marks" or "bursts" (the host runs ahead); for "none": "graphs" (it replays CUDA graphs)
    window_clock_reason: str = ""
    pm: str = ""
    pm_reason: str = ""
    pm_error: str = ""
    pm_where: str = ""  # "in_process" or "sidecar"
    pm_lib: str = ""  # the libcupti the sampler loaded: its path and its nvidia-cuda-cupti version
    pm_interval_us: int = 0
    step_count_ns: float = 0.0  # the step-start hook's own cost a call on the decode thread (ns), while it counts
    pm_dram_bytes: bool = False  # dram__bytes_read.sum / dram__bytes_write.sum are among the sampled metrics
    pm_first_session: bool = False  # the first PM session of this process (it has a lasting effect on clocks)
    # with pm_reason "hardware_busy": what may hold the counters, as "name (pid N)" of the profilers running on this
    # host, and "this process" when an earlier attach here armed PM (pm_config.counter_holders)
    pm_holders: _Strs = []
    pm_restarts: int = 0  # PM re-armed this attach after a CUPTI finalize took it down
    pm_busy_tries: int = 0  # arms tried at later pumps after the counters were found busy at the attach
    pm_armed_after_s: Union[float, None] = None  # an arm made at a pump: seconds after the attach
    pm_last_release: _Strs = []  # the steps that failed releasing this process's previous PM session
    pm_restart_cause: str = ""  # the exception type of the last re-arm's cause
    pm_stride: int = 0  # every pm_stride-th sample evaluated (adapts to the pump's budget)
    pm_pumps: int = 0
    pm_cpu_ms_per_pump: Union[float, None] = None  # agent CPU outside GIL-free libcupti calls, pumps after the first
    pm_image_reset_ms_per_pump: Union[float, None] = None  # of it, resetting the counter-data image
    pm_image_reset_bytes: int = 0  # what the last reset copied
    pm_first_pump_cpu_ms: Union[float, None] = None  # the first pump decodes every sample since the arm
    pm_held_calls: int = 0  # libcupti calls made keeping the GIL (probes/held.py)
    pm_handbacks_per_pump: Union[float, None] = None  # GIL hand-backs between those calls
    pm_full_pumps: int = 0  # pumps whose counter-data image filled before the hardware buffer's end
    pm_overflow_pumps: int = 0  # pumps that found the hardware buffer overflowed (the newest samples dropped)
    pm_image_samples: int = 0  # samples one pump's counter-data image holds
    pm_pump_s: float = 0.0
    nvml: str = ""
    nvml_reason: str = ""
    nvml_error: str = ""
    nvml_hz: float = 0.0
    decode_waits_per_s: Union[float, None] = None  # the decode thread's voluntary context switches a second
    # the agent thread's own CPU a second over the attach so far, CUPTI's start-up and finalize not in it
    # (cupti_start_cpu_ms, cupti_finalize_cpu_ms)
    agent_cpu_ms_per_s: Union[float, None] = None
    agent_cpu_over_s: Union[float, None] = None  # the seconds it covers (None: a probe that read its last second)
    cupti_start_cpu_ms: Union[float, None] = None  # the CPU of CUPTI's start-ups made on the agent thread (GIL-free)
    cupti_finalize_cpu_ms: Union[float, None] = None  # ...and of its finalizes made there (GIL-free, an eager loop's)
    windows_in_process: int = 0  # traced windows closed (CUPTI finalized) in this process, over every attach
    window_budget: int = 0  # Attach.window_budget
    window_budget_state: str = ""  # "open", "rationed" (one window every policy.BUDGET_PERIOD_S) or "spent"
    windows: int = 0  # windows sent in this attach
    errors: int = 0  # errors noted in this attach
    recent_errors: _Strs = []  # the last few, as raised
    dropped_records: int = 0



class StepCounts(msgspec.Struct, frozen=True, tag="counts"):
    """Decode steps counted, one row per read: a server's own counts read by the monitor (llama-server's /slots,
    the token clock of a process watched from outside), or the CUDA graph replays the agent counted in a process
    that marks no token (server GRAPH_REPLAYS: a step is one replay of each graph a step replays), or the step
    starts it timed in an eager one (server STEP_STARTS: one row a step, at its start). float64 counts; the
    reader's monotonic clock."""

    url: str
    t_ns: Column
    steps: Column  # decode steps so far: one per step, whatever the batch
    tokens: Column  # tokens generated so far, every request's
    busy: Column  # requests in progress at the read
    ended: Column  # requests that ended since the previous read (the interval also holds a reply and a prompt)
    server: str = ""  # whose counts ("llama.cpp")
    # the KV positions the decoding requests hold at each read, summed over them (llama-server's /slots
    # `n_prompt_tokens`, prompt and generated tokens alike): the depth a step's KV is read at; None: not read
    depth: Union[Column, None] = None


class Bye(msgspec.Struct, frozen=True, tag="bye"):
    """Last frame: why the stream ended."""

    reason: str


# Monitor -> agent. The agent acts on these (and Heartbeat) and nothing else; their fields are the agent's table
# (probes/frames.py: ATTACH_FIELDS, with what each means), from which this struct is made.
Attach = msgspec.defstruct("Attach", [(n, t, d) for n, t, d in ATTACH_FIELDS], tag="attach", frozen=True,
                           module=__name__)
Attach.__doc__ = "Arm the probe with these settings (when each applies: probes/policy.py)."


class Detach(msgspec.Struct, frozen=True, tag="detach"):
    """Disarm the probe and close the connection."""


class Heartbeat(msgspec.Struct, frozen=True, tag="heartbeat"):
    """The monitor is still there (every HEARTBEAT_S): an attached client silent for the agent's lease loses the
    slot, so one that sent an Attach and went quiet cannot hold it."""


Frame = Union[RecordingHeader, Hello, TokenMarks, KernelWindow, PmSamples, NvmlSamples, Stats, ProbeStatus, StepCounts,
              Bye]
Control = Union[Attach, Detach, Heartbeat]

_encoder = msgspec.msgpack.Encoder()
_frame_decoder = msgspec.msgpack.Decoder(Frame)
_control_decoder = msgspec.msgpack.Decoder(Control)


def encode(obj) -> bytes:
    """Serialise one frame or control message (no length prefix)."""
    return _encoder.encode(obj)


def decode_frame(payload: bytes) -> Frame:
    """Parse one frame; raise WireError with a one-line reason on anything malformed."""
    try:
        return _frame_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"malformed frame: {exc}") from None


def decode_control(payload: bytes) -> Control:
    """Parse one monitor->agent message; raise WireError on anything else."""
    try:
        return _control_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"malformed control message: {exc}") from None


# a recording is the same frames in a file (probes/wire_file.py); its names are the wire's
from decodemon.probes.wire_file import (RecordingWriter, load_recording, read_recording,  # noqa: E402,F401
                                        recording_bytes)
# the socket a live attach reads, and its length-prefixed framing (probes/wire_socket.py)
from decodemon.probes.wire_socket import StreamReader, pack, socket_dir, socket_path  # noqa: E402,F401
