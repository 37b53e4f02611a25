"""Hostile recordings: files made to cost the reader time and memory, and a corpus of 1,100 altered copies of the
bundled H200 recordings (one fixed seed: truncations, bit flips, NaN, negative and huge fields, time running
backwards, a second header, unknown wire versions, oversized declared lengths). Each is read in under 5 s with no
traceback; every impossible value is refused in one line or flagged in the summary, never read as the original."""

from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from decodemon.monitor.cli import main
from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.sources.collect import collect_recording
from decodemon.probes import wire
from decodemon.probes.wire import _REC, MAGIC, MAX_FRAME_BYTES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
BUNDLED = sorted(DATA.glob("*.dmon")) + sorted((ROOT / "monitor" / "data").glob("*.dmon"))
# the corpus's sources and how many altered copies each gives: the small recordings most (they read in a few ms),
# the two the package ships fewer
SOURCES = {**{DATA / f"h200_compiled_llama8b_marks_{i}.dmon": 90 for i in range(1, 6)},
           DATA / "h200_compiled_llama8b_replays.dmon": 110, DATA / "h200_hf_cb_4.dmon": 100,
           DATA / "h200_hf_generate_static.dmon": 100, DATA / "h200_tp2_graph_rank0.dmon": 100,
           DATA / "h200_graph_nvtx_range.dmon": 100, ROOT / "monitor" / "data" / "h100_graph.dmon": 70,
           ROOT / "monitor" / "data" / "h100_eager.dmon": 70}
SEED = 20261202
READ_LIMIT_S = 5.0  # CPU seconds a read of a recording of at most 10 MB may take


# -- a recording's raw records ---------------------------------------------------------------------------------

def _records(path: Path) -> list[tuple[int, bytes]]:
    """(receive ns, payload) of every frame, header first."""
    raw = gzip.decompress(path.read_bytes())
    out, i = [], len(MAGIC)
    while i < len(raw):
        n, rx = _REC.unpack_from(raw, i)
        i += _REC.size
        out.append((rx, raw[i:i + n]))
        i += n
    return out


def _stream(records) -> bytes:
    """The decompressed stream of (rx, payload) or (rx, payload, declared length) records."""
    parts = [MAGIC]
    for r in records:
        rx, p = r[0], r[1]
        parts.append(_REC.pack(r[2] if len(r) > 2 else len(p), rx) + p)
    return b"".join(parts)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


# -- the alterations: each returns the file's bytes, or None when the source has nothing to alter that way ------

def _paths(obj, want, prefix=()):
    """Paths to the scalar fields of `obj` (nested structs too) whose value `want(value)` accepts."""
    for name in obj.__struct_fields__:
        v = getattr(obj, name)
        if isinstance(v, msgspec.Struct) and not isinstance(v, wire.Column):
            yield from _paths(v, want, prefix + (name,))
        elif want(v):
            yield prefix + (name,)


def _set(obj, path, value):
    if len(path) == 1:
        return msgspec.structs.replace(obj, **{path[0]: value})
    return msgspec.structs.replace(obj, **{path[0]: _set(getattr(obj, path[0]), path[1:], value)})


def _columns(frame):
    """(field, key or None, column) of every non-empty column of a frame."""
    for name in frame.__struct_fields__:
        v = getattr(frame, name)
        if isinstance(v, wire.Column) and len(v.data):
            yield name, None, v
        elif isinstance(v, dict):
            for k, c in v.items():
                if isinstance(c, wire.Column) and len(c.data):
                    yield name, k, c


def _with_column(frame, name, key, col):
    if key is None:
        return msgspec.structs.replace(frame, **{name: col})
    return msgspec.structs.replace(frame, **{name: {**getattr(frame, name), key: col}})


def _is_float(v):
    return isinstance(v, float)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return _is_float(v) or _is_int(v)


def _alter_field(rng, recs, want, value_for):
    """One frame's scalar field (any frame, the header too) set by `value_for(rng, old)`."""
    frames = [wire.decode_frame(p) for _, p in recs]
    spots = [(i, path) for i, f in enumerate(frames) for path in _paths(f, want)]
    if not spots:
        return None
    i, path = rng.choice(spots)
    old = frames[i]
    for name in path:
        old = getattr(old, name)
    recs = list(recs)
    recs[i] = (recs[i][0], wire.encode(_set(frames[i], path, value_for(rng, old))))
    return _gz(_stream(recs))


def _alter_column(rng, recs, pick, change):
    """One value of one column chosen by `pick(frame, field, key)`, changed by `change(rng, array) -> Column`."""
    frames = [(i, wire.decode_frame(p)) for i, (_, p) in enumerate(recs) if i]
    spots = [(i, f, n, k, c) for i, f in frames for n, k, c in _columns(f) if pick(f, n, k)]
    if not spots:
        return None
    i, f, n, k, c = rng.choice(spots)
    col = change(rng, c.array().copy())
    if col is None:
        return None
    recs = list(recs)
    recs[i] = (recs[i][0], wire.encode(_with_column(f, n, k, col)))
    return _gz(_stream(recs))


def nan_scalar(rng, recs):
    return _alter_field(rng, recs, _is_float, lambda r, old: r.choice([math.nan, math.inf, -math.inf]))


def nan_column(rng, recs):
    def change(r, a):
        a = a.astype(np.float64)
        a[r.randrange(len(a))] = r.choice([math.nan, math.inf, -math.inf])
        return wire.Column("<f8", a.tobytes())
    return _alter_column(rng, recs, lambda f, n, k: True, change)


def negative_scalar(rng, recs):
    return _alter_field(rng, recs, _is_number,
                        lambda r, old: -r.choice([1, 2, 1000, 2**40]) * (1.5 if isinstance(old, float) else 1))


_DIMS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")


def _never_negative(frame, name, key) -> bool:
    """A column whose values cannot be negative: not PM's raw values, and of CUPTI's records (uint64 packed as
    their int64 view) only the kernels' 32-bit dimensions and the probe's own name indices."""
    if name in ("kernels", "apis", "memcpys", "syncs"):
        return name == "kernels" and key in _DIMS + ("name",)
    return name != "values"


def negative_column(rng, recs):
    def change(r, a):
        a[r.randrange(len(a))] = -r.choice([1, 7, 2**40])
        return wire.Column(a.dtype.str, a.tobytes())
    return _alter_column(rng, recs, _never_negative, change)


def huge_scalar(rng, recs):
    return _alter_field(rng, recs, _is_number,
                        lambda r, old: r.choice([1e300, 2.0**60]) if isinstance(old, float) else
                        r.choice([2**53 + 1, 2**62, 2**63 - 1, 2**64 - 1]))


# the columns with a ceiling, and a value past it
_HUGE = {("depth", None): 2**41, ("batch", None): 2**25, ("first_token_ns", None): 3 * 86_400 * 10**9,
         ("gpu_util_pct", None): 101, **{("kernels", d): 2**32 for d in _DIMS}}


def huge_column(rng, recs):
    keys = list(_HUGE)
    rng.shuffle(keys)
    for key in keys:
        def change(r, a, big=_HUGE[key]):
            a[r.randrange(len(a))] = r.choice([1, 2, 1000]) * big
            return wire.Column(a.dtype.str, a.tobytes())
        out = _alter_column(rng, recs, lambda f, n, k, key=key: (n, k) == key, change)
        if out is not None:
            return out
    return None


def backwards(rng, recs):
    """Receive times, token marks, a window's token bounds or a server's step counts running backwards."""
    ways = ["rx", "marks", "marks_across", "bounds", "counts"]
    rng.shuffle(ways)
    frames = [wire.decode_frame(p) for _, p in recs]
    for way in ways:
        recs2 = list(recs)
        if way == "rx":
            ks = [k for k in range(2, len(recs)) if recs[k - 1][0] > 0]
            if not ks:
                continue
            k = rng.choice(ks)
            recs2[k] = (recs[k - 1][0] - rng.randint(1, recs[k - 1][0]), recs[k][1])
            return _gz(_stream(recs2))
        if way in ("marks", "bounds", "counts"):
            field = {"marks": "t_ns", "bounds": "token_bounds_ns", "counts": "t_ns"}[way]
            kind = {"marks": wire.TokenMarks, "bounds": wire.KernelWindow, "counts": wire.StepCounts}[way]
            ks = [k for k, f in enumerate(frames) if isinstance(f, kind) and len(getattr(f, field).array()) > 1
                  and getattr(f, field).array()[-1] > getattr(f, field).array()[0]]
            if not ks:
                continue
            k = rng.choice(ks)
            a = getattr(frames[k], field).array()[::-1].copy()
            recs2[k] = (recs[k][0], wire.encode(msgspec.structs.replace(
                frames[k], **{field: wire.Column(a.dtype.str, a.tobytes())})))
            return _gz(_stream(recs2))
        if way == "marks_across":  # a later frame's marks before the last of an earlier one
            ks = [k for k, f in enumerate(frames) if isinstance(f, wire.TokenMarks) and len(f.t_ns.data)]
            if len(ks) < 2:
                continue
            j = rng.randrange(1, len(ks))
            prev_last = int(frames[ks[j - 1]].t_ns.array()[-1])
            t = frames[ks[j]].t_ns.array().astype(np.int64)
            t = t - (int(t[0]) - prev_last) - rng.randint(1, 10**9)
            recs2[ks[j]] = (recs[ks[j]][0], wire.encode(msgspec.structs.replace(
                frames[ks[j]], t_ns=wire.Column("<i8", t.tobytes()))))
            return _gz(_stream(recs2))
    return None


def second_header(rng, recs):
    k = rng.randrange(1, len(recs) + 1)
    head = recs[0][1]
    if rng.random() < 0.5:
        h = wire.decode_frame(head)
        head = wire.encode(msgspec.structs.replace(h, created_unix_s=h.created_unix_s + rng.randint(1, 10**6)))
    recs = list(recs)
    recs.insert(k, (recs[k - 1][0], head))
    return _gz(_stream(recs))


def wire_version(rng, recs):
    version = rng.choice([-1, 0, wire.WIRE_VERSION + 1, 99, -2**31, 2**40, 2**63 - 1])
    frames = [wire.decode_frame(p) for _, p in recs]
    hellos = [k for k, f in enumerate(frames) if isinstance(f, wire.Hello)]
    k = 0 if not hellos or rng.random() < 0.7 else rng.choice(hellos)
    recs = list(recs)
    recs[k] = (recs[k][0], wire.encode(msgspec.structs.replace(frames[k], wire_version=version)))
    return _gz(_stream(recs))


def oversized_length(rng, recs):
    k = rng.randrange(1, len(recs))
    rest = sum(_REC.size + len(p) for _, p in recs[k:])
    n = rng.choice([2**32 - 1, MAX_FRAME_BYTES + 1, MAX_FRAME_BYTES, rest + rng.randint(1, 4096)])
    recs = list(recs)
    recs[k] = (recs[k][0], recs[k][1], n)
    return _gz(_stream(recs))


def truncation(rng, recs):
    data = _gz(_stream(recs))
    return data[:rng.randrange(1, len(data) - 1)]


def bit_flips(rng, recs):
    raw = bytearray(_stream(recs))
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(MAGIC), len(raw))
        raw[i] ^= 1 << rng.randrange(8)
    return _gz(bytes(raw))


IMPOSSIBLE = [nan_scalar, nan_column, negative_scalar, negative_column, huge_scalar, huge_column, backwards,
              second_header, wire_version, oversized_length, truncation]
ALTERATIONS = IMPOSSIBLE + [bit_flips]


def corpus(out: Path) -> list[tuple[Path, str]]:
    """The altered files (path, alteration), the same ones on every run."""
    rng = random.Random(SEED)
    made = []
    for src, count in SOURCES.items():
        recs = _records(src)
        for k in range(count):
            alter = ALTERATIONS[k % len(ALTERATIONS)]
            data = None
            for _ in range(len(ALTERATIONS)):  # a source without such a field: the next alteration
                data = alter(rng, recs)
                if data is not None:
                    break
                alter = ALTERATIONS[(ALTERATIONS.index(alter) + 1) % len(ALTERATIONS)]
            path = out / f"{src.stem}.{k:03d}.{alter.__name__}.dmon"
            path.write_bytes(data)
            made.append((path, alter.__name__))
    return made


def read(path: Path):
    """(summary or None, refusal or None, CPU seconds): the reader API and the summary, as `replay --json` reads.
    CPU, not wall, time: on a busy 2-core machine the wall clock adds the others' work, not the reader's."""
    t0 = time.process_time()
    try:
        snap = collect_recording(str(path)).snapshot()
        out, why = summary_json(snap), None
    except SourceError as exc:
        out, why = None, str(exc)
    return out, why, time.process_time() - t0


def flagged(summary: dict) -> bool:
    """The summary says the source was not read whole: frames left out, or the file cut short."""
    return bool(summary["rejected_frames"]) or "cut short" in (summary.get("ended") or "")


# -- the tests ---------------------------------------------------------------------------------------------------

def test_every_bundled_recording_reads_whole_with_nothing_left_out():
    """The bounds and checks refuse no real recording and leave out no real frame."""
    for path in BUNDLED:
        out, why, _ = read(path)
        assert why is None, why
        assert out["rejected_frames"] == 0 and out["rejected_why"] == [], (path.name, out["rejected_why"])


def _crafted(path: Path, payload: bytes, count: int, rx_step: int = 1) -> int:
    """A recording of a real header and `count` copies of `payload`, compressed hard; its size. With rx_step 0
    every record is the same: one gzip member, compressed once and repeated (a reader takes the members as one
    stream), so 2.5 GB of frames costs one 64 MB compression."""
    head = _records(DATA / "h200_compiled_llama8b_replays.dmon")[0][1]
    parts = [gzip.compress(MAGIC + _REC.pack(len(head), 0) + head, 9, mtime=0)]
    if rx_step == 0:
        parts += [gzip.compress(_REC.pack(len(payload), 0) + payload, 9, mtime=0)] * count
    else:
        parts.append(gzip.compress(b"".join(_REC.pack(len(payload), i * rx_step) + payload for i in range(count)),
                                   9, mtime=0))
    data = b"".join(parts)
    path.write_bytes(data)
    return len(data)


def _replay_json(capsys, path: Path):
    t0 = time.process_time()
    rc = main(["replay", str(path), "--json"])
    took = time.process_time() - t0
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, took


def test_forty_zero_filled_64mb_frames_are_refused_in_seconds(tmp_path, capsys):
    """2.6 MB of gzip that claims 2.5 GB: its frames are all zeros, token marks of all-zero columns, or a hello of
    64M empty strings. The first that overflows what a file of its size holds is refused before its bytes are read,
    and a list longer than a frame may hold before its entries are made."""
    zeros = bytes(MAX_FRAME_BYTES)
    half = MAX_FRAME_BYTES // 2 - 64
    marks = wire.encode(wire.TokenMarks(t_ns=wire.Column("<i8", bytes(half)), depth=wire.Column("<i8", bytes(half))))
    # a hello whose argv declares 64M empty strings: refused on the count msgpack declares, before any is made
    hello = wire.encode(wire.Hello(wire_version=wire.WIRE_VERSION, pid=1, argv=[], python="", hostname=""))
    n = MAX_FRAME_BYTES - len(hello) - 8
    hello = hello.replace(b"\xa4argv\x90", b"\xa4argv\xdd" + n.to_bytes(4, "big") + b"\xa0" * n, 1)
    assert len(marks) <= MAX_FRAME_BYTES and len(hello) <= MAX_FRAME_BYTES
    for name, frame in (("zeros", zeros), ("marks", marks), ("entries", hello)):
        path = tmp_path / f"{name}.dmon"
        size = _crafted(path, frame, 40, rx_step=0)
        assert size < 3_000_000
        rc, out, err, took = _replay_json(capsys, path)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert took <= READ_LIMIT_S, (name, took)
        if name == "marks":  # whole frames that decode: refused on the bytes they claim
            assert "past what a" in err and "refused" in err, err
        if name == "entries":
            assert f"length <= {wire.MAX_ENTRIES}" in err and "argv" in err, err


def test_three_hundred_thousand_small_frames_are_refused_in_seconds(tmp_path, capsys):
    """0.8 MB holding 300,000 tiny traced windows (each of which would move the verdict) or token marks."""
    window = wire.encode(wire.KernelWindow(window_id=1, tokens=1, token_bounds_ns=wire.Column.of([0, 10, 20]),
                                           names=[], kernels={}))
    mark = wire.encode(wire.TokenMarks(t_ns=wire.Column.of([1]), depth=wire.Column.of([1])))
    for name, frame in (("windows", window), ("marks", mark)):
        path = tmp_path / f"{name}.dmon"
        size = _crafted(path, frame, 300_000, rx_step=1_000_000)
        assert size < 1_500_000
        rc, out, err, took = _replay_json(capsys, path)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "refused" in err and "recording holds" in err, err
        assert took <= READ_LIMIT_S, (name, took)


@pytest.fixture(scope="module")
def altered(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("altered"))


def test_the_altered_corpus_is_refused_or_flagged_in_seconds(altered):
    """Over 1,000 altered files through the reader and the summary: none takes 5 s, none raises anything but a
    refusal, and each impossible value is refused or flagged; a bit flip (which may land on a possible value) only
    never breaks the reader."""
    assert len(altered) >= 1000
    by_kind: dict[str, list[str]] = {}
    slowest = 0.0
    for path, kind in altered:
        out, why, took = read(path)
        slowest = max(slowest, took)
        assert took <= READ_LIMIT_S, (path.name, took)
        if why is not None:
            assert "\n" not in why and str(path) in why, why
            by_kind.setdefault(kind, []).append("refused")
            continue
        json.dumps(out, allow_nan=False)  # no NaN reached a figure (it would print as `NaN`, which is not JSON)
        if kind != "bit_flips":
            assert flagged(out), (path.name, "read like the original with nothing said")
        by_kind.setdefault(kind, []).append("flagged" if flagged(out) else "read")
    assert set(by_kind) == {f.__name__ for f in ALTERATIONS}, sorted(by_kind)
    for kind in ("nan_scalar", "nan_column", "negative_column", "backwards"):  # left out, not only refused
        assert "flagged" in by_kind[kind], kind
    assert by_kind["second_header"] == ["refused"] * len(by_kind["second_header"])


@pytest.mark.parametrize("kind", ["second_header", "wire_version", "nan_column", "backwards", "oversized_length",
                                  "truncation"])
def test_the_real_cli_says_one_line_or_flags_it(altered, kind):
    """A handful of the corpus through `decodemon replay FILE --json` in its own process."""
    path = next(p for p, k in altered if k == kind)
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "replay", str(path), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode == 0:
        assert flagged(json.loads(r.stdout)), r.stdout[-500:]
    else:
        assert r.returncode in (2, 3) and len(r.stderr.strip().splitlines()) == 1, (r.returncode, r.stderr)


def test_the_app_says_what_it_left_out(tmp_path):
    """Played in the app, a recording with an impossible frame says in its header how many frames it left out and
    why."""
    import asyncio

    from decodemon.monitor.app import DecodemonApp
    from decodemon.monitor.player import RecordingPlayer
    from decodemon.monitor.widgets.header import HeaderPanel

    recs = _records(DATA / "h200_hf_cb_4.dmon")
    path = tmp_path / "nan.dmon"
    path.write_bytes(nan_column(random.Random(SEED), recs))

    async def header_text() -> str:
        app = DecodemonApp([RecordingPlayer(str(path), "nan")], start_at_s=recs[-1][0] / 1e9, paused=True,
                           out_dir=str(tmp_path))
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            return str(app.query_one(HeaderPanel).render())

    text = asyncio.run(header_text())
    assert "1 frame left out as impossible (" in text and "NaN" in text, text


def _beside(path: Path, first: list, window: wire.KernelWindow, count: int) -> int:
    """A recording of a real header, the frames `first`, then `count` copies of `window` (one gzip member of 100,
    repeated); its size."""
    head = _records(DATA / "h200_eager_nomarks.dmon")[:2]  # the header and the hello
    rx = head[-1][0]
    lead = _stream(head + [(rx, wire.encode(f)) for f in first])
    block = b"".join(_REC.pack(len(p), rx + 10) + p
                     for p in (wire.encode(msgspec.structs.replace(window, window_id=i)) for i in range(100)))
    data = _gz(lead) + _gz(block) * (count // 100)
    path.write_bytes(data)
    return len(data)


@pytest.mark.parametrize("beside", ["pm_samples", "marks"])
def test_windows_beside_all_the_feed_keeps_are_refused_in_seconds(tmp_path, capsys, beside):
    """A window is read against what the feed keeps: every PM sample (a window opened by time) and the span's token
    marks. 20,000 samples or 200,000 marks in one frame, then windows of 500 kernels: refused once they ask more
    analysis than the file's size allows (read whole, the PM case takes ~17 ms a window)."""
    frames = [f for _, f in wire.read_recording(DATA / "h200_eager_nomarks.dmon")]
    w = next(f for f in frames if isinstance(f, wire.KernelWindow) and f.clock == "time")
    k = {c: v.array()[:500] for c, v in w.kernels.items()}
    w = msgspec.structs.replace(w, kernels={c: wire.Column("<i8", v.tobytes()) for c, v in k.items()}, apis={},
                                memcpys={}, syncs={},
                                token_bounds_ns=wire.Column.of([int(k["start"].min()), int(k["end"].max())]))
    if beside == "pm_samples":
        pm = next(f for f in frames if isinstance(f, wire.PmSamples))
        t0 = np.linspace(int(k["start"].min()), int(k["end"].max()), 20_000).astype(np.int64)
        row = pm.values.array()[:len(pm.metrics)]
        first = [msgspec.structs.replace(pm, start_ns=wire.Column("<i8", t0.tobytes()),
                                         end_ns=wire.Column("<i8", (t0 + 1000).tobytes()),
                                         values=wire.Column("<f8", np.tile(row, 20_000).tobytes()))]
    else:
        t = np.arange(200_000, dtype=np.int64) * 1_000_000 + 10**12
        first = [wire.TokenMarks(t_ns=wire.Column("<i8", t.tobytes()), depth=wire.Column("<i8", t.tobytes()))]
    path = tmp_path / f"{beside}.dmon"
    _beside(path, first, w, 400)
    rc, out, err, took = _replay_json(capsys, path)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "ask more analysis than" in err, err
    assert took <= READ_LIMIT_S, took
