"""The agent's half of the wire (probes/frames.py, standard library alone) and the monitor's (probes/wire.py,
msgspec) are one schema: every frame the agent builds decodes to the monitor's struct of the same name, and every
control message the monitor sends decodes in the agent."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodemon.probes import frames, msgpack_std, wire

AGENT_STRUCTS = ["GpuInfo", "ModelFacts", "Hello", "TokenMarks", "KernelWindow", "PmSamples", "ProbeStatus",
                 "StepCounts", "Bye"]


@pytest.mark.parametrize("name", AGENT_STRUCTS)
def test_every_agent_frame_has_the_monitors_tag_fields_and_defaults(name):
    mine, theirs = getattr(frames, name), getattr(wire, name)
    info = msgspec.inspect.type_info(theirs)
    assert mine.TAG == (info.tag if info.tag_field else None)
    assert mine.FIELDS == tuple(f.name for f in info.fields)
    assert set(mine.REQUIRED) == {f.name for f in info.fields if f.required}
    for f in info.fields:  # a default the agent reads back must be the monitor's
        if f.name in mine.DEFAULTS:
            assert mine.DEFAULTS[f.name] == f.default, f.name


def test_the_attach_fields_are_one_table():
    info = msgspec.inspect.type_info(wire.Attach)
    assert [(f.name, f.default) for f in info.fields] == [(n, d) for n, _, d in frames.ATTACH_FIELDS]
    assert wire.Attach() == wire.decode_control(frames.encode(frames.Attach()))


def _col(draw, dtype):
    n = draw(st.integers(0, 6))
    if dtype == "<f8":
        vals = draw(st.lists(st.floats(allow_nan=False), min_size=n, max_size=n))
    else:
        vals = draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n))
    return vals


@st.composite
def token_marks(draw):
    t = _col(draw, "<i8")
    extra = {}
    if draw(st.booleans()):
        extra["batch"] = frames.Column.of(_col(draw, "<i8"))
    if draw(st.booleans()):
        extra["observer_ns"] = frames.Column.of(_col(draw, "<i8"))
    return t, extra


@settings(max_examples=60, deadline=None)
@given(token_marks(), st.text(max_size=40), st.integers(0, 2**40))
def test_the_agents_frames_decode_to_the_monitors_structs(marks, text, big):
    t, extra = marks
    mine = frames.TokenMarks(t_ns=frames.Column.of(t), depth=frames.Column.of(t), **extra)
    got = wire.decode_frame(frames.encode(mine))
    assert isinstance(got, wire.TokenMarks) and list(got.t_ns.array()) == t
    for k, col in extra.items():
        assert getattr(got, k).data == col.data
    model = frames.ModelFacts(name=text, weight_bytes=big, layers=3)
    hello = frames.Hello(wire_version=frames.WIRE_VERSION, pid=7, argv=[text, "-m"], python="3.12.1",
                         hostname="h", model=model, settings={"nvml_hz": 4.0})
    h = wire.decode_frame(frames.encode(hello))
    assert h == wire.Hello(wire_version=wire.WIRE_VERSION, pid=7, argv=[text, "-m"], python="3.12.1", hostname="h",
                           model=wire.ModelFacts(name=text, weight_bytes=big, layers=3), settings={"nvml_hz": 4.0})
    status = frames.ProbeStatus(trace="armed", agent_cpu_ms_per_s=1.5, recent_errors=[text], pm_armed_after_s=None)
    assert wire.decode_frame(frames.encode(status)) == wire.ProbeStatus(
        trace="armed", agent_cpu_ms_per_s=1.5, recent_errors=[text])


def test_a_frame_refuses_a_field_the_schema_does_not_have():
    with pytest.raises(TypeError, match="no field"):
        frames.ProbeStatus(trace_state="armed")
    with pytest.raises(TypeError, match="needs"):
        frames.Bye()


@settings(max_examples=80, deadline=None)
@given(st.floats(0.011, 1.0), st.integers(1, 64), st.booleans(), st.none() | st.floats(0, 3600),
       st.text(max_size=20))
def test_every_attach_the_monitor_sends_decodes_in_the_agent(tick, tokens, trace, first, rng):
    sent = wire.Attach(agent_tick_s=tick, window_tokens=tokens, trace=trace, first_window_s=first, token_range=rng)
    got = frames.decode_control(wire.encode(sent))
    assert isinstance(got, frames.Attach)
    for name, _, _ in frames.ATTACH_FIELDS:
        assert getattr(got, name) == getattr(sent, name), name
    assert isinstance(frames.decode_control(wire.encode(wire.Detach())), frames.Detach)
    assert isinstance(frames.decode_control(wire.encode(wire.Heartbeat())), frames.Heartbeat)
    assert isinstance(wire.decode_control(frames.encode(frames.Heartbeat())), wire.Heartbeat)


@pytest.mark.parametrize("payload, why", [
    (msgpack_std.packb({"type": "exec", "code": "x"}), "not attach, detach or heartbeat"),
    (msgpack_std.packb({"type": "attach", "agent_tick_s": "fast"}), "agent_tick_s"),
    (msgpack_std.packb({"type": "attach", "trace": 1}), "trace"),
    (msgpack_std.packb([1, 2]), "not a map"),
    (b"\x81\xa4type", "truncated"),
    (msgpack_std.packb({"type": "detach"}) + b"\x00", "trailing"),
    (b"\xc1", "0xc1"),
])
def test_the_agent_refuses_anything_but_a_well_typed_attach_or_detach(payload, why):
    with pytest.raises(frames.WireError, match=why):
        frames.decode_control(payload)
    with pytest.raises(wire.WireError):  # and the monitor's decoder agrees
        wire.decode_control(payload)


def test_an_attach_field_the_agent_does_not_know_is_ignored_as_msgspec_does():
    payload = msgpack_std.packb({"type": "attach", "agent_tick_s": 0.25, "from_a_newer_monitor": True})
    assert frames.decode_control(payload).agent_tick_s == 0.25 == wire.decode_control(payload).agent_tick_s


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
                    | st.text() | st.binary(),
                    lambda kids: st.lists(kids, max_size=20) | st.dictionaries(st.text(max_size=8), kids, max_size=20),
                    max_leaves=40))
def test_msgpack_std_writes_what_msgspec_reads_and_reads_it_back(value):
    packed = msgpack_std.packb(value)
    assert msgspec.msgpack.decode(packed) == value
    assert msgpack_std.unpackb(packed) == value


def test_a_float32_column_past_its_range_is_infinite_as_numpy_would_make_it():
    col = frames.Column.of([1e40, -1e40, 1.5], "<f4")
    assert list(wire.Column(col.dtype, col.data).array()) == [math.inf, -math.inf, 1.5]


def test_a_control_message_that_declares_more_entries_than_it_may_is_refused_before_reading_them():
    with pytest.raises(frames.WireError, match="entries"):
        frames.decode_control(b"\xdf\xff\xff\xff\xff")
