"""The wire: every frame round-trips, streams reassemble, recordings refuse what they cannot read."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decodemon.probes import wire
from tests.conftest import REC


def sample_frames():
    col = wire.Column.of([1, 2, 3])
    return [
        wire.Hello(wire_version=1, pid=7, argv=["x"], python="3.11", hostname="h",
                   gpu=wire.GpuInfo(index=0, name="NVIDIA H200", sm_count=132, mem_bandwidth_gbs=4800.0),
                   model=wire.ModelFacts(name="m", weight_bytes=10, kv_bytes_per_position=2, layers=2)),
        wire.TokenMarks(t_ns=col, depth=col),
        wire.KernelWindow(window_id=1, tokens=1, token_bounds_ns=col, names=["k"], kernels={"start": col}),
        wire.PmSamples(metrics=["a"], start_ns=col, end_ns=col, values=wire.Column.of([0.5], "<f8")),
        wire.NvmlSamples(t_unix_ns=col, sm_clock_mhz=col, mem_clock_mhz=col, power_w=wire.Column.of([1.0], "<f8"),
                         mem_used_bytes=col, gpu_util_pct=col, other_pids=[3]),
        wire.KernelWindow(window_id=2, tokens=0, guard_tokens=0, token_bounds_ns=col, names=[], kernels={},
                          clock="time"),
        wire.Stats(state={"pm": "armed"}, dropped_records=2, windows=1, errors=["e"]),
        wire.ProbeStatus(pm="armed", pm_interval_us=2000, decode_waits_per_s=3.5, windows=1, errors=1,
                         recent_errors=["e"]),
        wire.Bye(reason="detached"),
    ]


@pytest.mark.parametrize("frame", sample_frames(), ids=lambda f: type(f).__name__)
def test_frame_round_trip(frame):
    back = wire.decode_frame(wire.encode(frame))
    assert back == frame
    assert type(back) is type(frame)


def test_column_keeps_dtype_and_values():
    c = wire.Column.of([1.5, -2.25], "<f8")
    assert c.array().dtype == np.float64
    assert c.array().tolist() == [1.5, -2.25]


def test_stream_reader_reassembles_split_frames():
    data = b"".join(wire.pack(f) for f in sample_frames())
    r = wire.StreamReader()
    got = []
    for i in range(0, len(data), 7):
        got += r.feed(data[i:i + 7])
    assert [type(wire.decode_frame(p)) for p in got] == [type(f) for f in sample_frames()]


def test_stream_reader_refuses_huge_frame():
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.StreamReader(max_frame=100).feed((10_000).to_bytes(4, "little") + b"x")


def test_control_messages_only():
    assert isinstance(wire.decode_control(wire.encode(wire.Attach())), wire.Attach)
    assert isinstance(wire.decode_control(wire.encode(wire.Heartbeat())), wire.Heartbeat)
    assert wire.encode(wire.Heartbeat()) == b"\x81\xa4type\xa9heartbeat"  # a map of its tag alone, as C writes it
    with pytest.raises(wire.WireError):
        wire.decode_control(wire.encode(wire.Bye(reason="not a control message")))


def header(v=wire.WIRE_VERSION):
    return wire.RecordingHeader(wire_version=v, created_unix_s=0.0, decodemon_version="t")


def test_recording_round_trip(tmp_path):
    p = tmp_path / "r.dmon"
    w = wire.RecordingWriter(p, header())
    for i, f in enumerate(sample_frames()):
        w.write(f, i * 1000)
    w.close()
    got = wire.load_recording(p)
    assert isinstance(got[0][1], wire.RecordingHeader)
    assert [f for _, f in got[1:]] == sample_frames()
    assert [rx for rx, _ in got[1:]] == [i * 1000 for i in range(len(sample_frames()))]


def test_truncated_recording_keeps_whole_frames_then_fails(tmp_path):
    data = wire.recording_bytes([(i, f) for i, f in enumerate(sample_frames())], header())
    raw = gzip.decompress(data)
    cut = tmp_path / "cut.dmon"
    cut.write_bytes(gzip.compress(raw[: len(raw) - 5]))
    frames = []
    with pytest.raises(wire.WireError, match="truncated"):
        for _, f in wire.read_recording(cut):
            frames.append(f)
    assert len(frames) == len(sample_frames())  # header + all but the cut last frame


def test_foreign_and_corrupt_files(tmp_path):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello")
    with pytest.raises(wire.WireError, match="not a decodemon recording"):
        list(wire.read_recording(foreign))
    wrong_magic = tmp_path / "other.gz"
    wrong_magic.write_bytes(gzip.compress(b"something else entirely"))
    with pytest.raises(wire.WireError, match="bad magic"):
        list(wire.read_recording(wrong_magic))
    with pytest.raises(wire.WireError, match="cannot open"):
        list(wire.read_recording(tmp_path / "missing.dmon"))


def test_newer_wire_version_refused_older_loaded(tmp_path):
    newer = tmp_path / "newer.dmon"
    newer.write_bytes(wire.recording_bytes([], header(wire.WIRE_VERSION + 1)))
    with pytest.raises(wire.WireError, match="upgrade decodemon"):
        list(wire.read_recording(newer))
    older = tmp_path / "older.dmon"
    older.write_bytes(wire.recording_bytes([(1, wire.Bye(reason="x"))], header(1)))
    assert isinstance(wire.load_recording(older)[-1][1], wire.Bye)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_fuzz_reader_random_bytes_only_raise_wire_error(tmp_path_factory, blob):
    p = tmp_path_factory.mktemp("fz") / "f.dmon"
    for payload in (blob, gzip.compress(blob), gzip.compress(wire.MAGIC + blob)):
        p.write_bytes(payload)
        try:
            list(wire.read_recording(p))
        except wire.WireError:
            pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=255))
def test_fuzz_reader_mutated_real_recording(tmp_path_factory, pos, byte):
    raw = gzip.decompress(REC["graph"].read_bytes())
    pos = pos % len(raw)
    mutated = raw[:pos] + bytes([byte]) + raw[pos + 1:]
    p = tmp_path_factory.mktemp("mut") / "m.dmon"
    p.write_bytes(gzip.compress(mutated, compresslevel=1))
    try:
        list(wire.read_recording(p))
    except wire.WireError:
        pass


def _pm(metrics, rows):
    flat = [v for r in rows for v in r]
    n = wire.Column.of([0] * len(rows))
    return wire.PmSamples(metrics=metrics, start_ns=n, end_ns=n, values=wire.Column.of(flat, "<f8"))


def test_gpu_busy_is_gr_compute_activity_and_older_recordings_still_read():
    from decodemon.monitor.feed import PM_COLS, pm_columns

    busy = PM_COLS.index("gpu_busy_pct")
    new = _pm(["gr__compute_cycles_active.avg", "gr__cycles_elapsed.max"], [[190.0, 1000.0], [200.0, 1000.0]])
    assert list(pm_columns(5, new)[busy]) == [19.0, 20.0]
    old = _pm(["gr__cycles_active.avg", "gr__cycles_elapsed.max"], [[280.0, 1000.0]])  # before 2026-11-29 16:00
    assert list(pm_columns(5, old)[busy]) == [28.0]
    both = _pm(["gr__cycles_active.avg", "gr__compute_cycles_active.avg", "gr__cycles_elapsed.max"],
               [[280.0, 190.0, 1000.0]])
    assert list(pm_columns(5, both)[busy]) == [19.0]  # the compute counter wins when a frame has both


@pytest.mark.parametrize("values,dtype", [
    ([1, 2, 3], "<i8"), ([1.5, 2.0], "<f8"), ([1, 2], "<f8"), ([1.7, -2.2], "<i8"), ([True, False], "<i8"),
    ([], "<i8"), ([2**40], "<u8"), ([float("nan"), float("inf")], "<f8"), ([1, 2], "<u4"), ((3, 4), "<i4"),
    ([0.25], "<f4"), ([-1], "<u8"), ([1e40], "<f4"),
])
def test_a_column_packed_without_numpy_is_the_column_numpy_packs(values, dtype):
    import numpy as np

    from decodemon.probes.wire import Column

    with np.errstate(all="ignore"):
        try:
            want = np.asarray(values, dtype=dtype).tobytes()
        except OverflowError:
            want = None
    with np.errstate(all="ignore"):
        if want is None:  # numpy refuses -1 as uint64; so must the column
            with pytest.raises(OverflowError):
                Column.of(values, dtype)
        else:  # 1e40 as float32 is inf, as numpy casts it
            assert Column.of(values, dtype) == Column(dtype, want)
    assert Column.of(np.asarray([1, 2]), "<i8").array().tolist() == [1, 2]
