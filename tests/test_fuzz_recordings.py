"""Recordings whose frames still decode but hold nonsense (bytes flipped inside frames, a fixed seed): every verb
that reads a recording ends in one line and a meaningful exit code, never a traceback. The variants are made from
the bundled H200 recordings; the damage is the test's, the frames are real."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from decodemon.monitor.cli import main
from decodemon.probes import wire
from decodemon.probes.wire import _REC, MAGIC

DATA = Path(__file__).parent / "data"
SOURCES = [DATA / "h200_compiled_llama8b_replays.dmon", DATA / "h200_tp2_eager_samewindow_rank0.dmon"]
VARIANTS = 12  # per source; each verb reads every one


def _frames(path: Path) -> list[tuple[int, bytes]]:
    raw = gzip.decompress(path.read_bytes())
    assert raw.startswith(MAGIC)
    out, i = [], len(MAGIC)
    while i < len(raw):
        n, rx = _REC.unpack_from(raw, i)
        i += _REC.size
        out.append((rx, raw[i:i + n]))
        i += n
    return out


def _write(frames, path: Path) -> None:
    with gzip.open(path, "wb") as gz:
        gz.write(MAGIC)
        for rx, p in frames:
            gz.write(_REC.pack(len(p), rx) + p)


def _variants(tmp: Path) -> list[Path]:
    rng = random.Random(20261202)
    out = []
    for src in SOURCES:
        frames = _frames(src)
        made = 0
        while made < VARIANTS:
            damaged = list(frames)
            for _ in range(rng.randint(1, 6)):
                k = rng.randrange(1, len(damaged))  # the header stays: a foreign header is its own test
                rx, p = damaged[k]
                b = bytearray(p)
                for _ in range(rng.randint(1, 8)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
                try:
                    wire.decode_frame(bytes(b))
                except wire.WireError:
                    continue  # only frames that still decode: nonsense, not noise
                damaged[k] = (rx, bytes(b))
            path = tmp / f"{src.stem}_{made}.dmon"
            _write(damaged, path)
            out.append(path)
            made += 1
    return out


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    return _variants(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("verb", ["replay", "report", "export", "compare"])
def test_damaged_recordings_end_in_one_line_never_a_traceback(verb, variants, tmp_path, capsys):
    codes = []
    for k, v in enumerate(variants):
        argv = {"replay": ["replay", str(v), "--json"],
                "report": ["report", str(v), "-o", str(tmp_path / f"r{k}.md")],
                "export": ["export", str(v), "-o", str(tmp_path / f"t{k}.json")],
                "compare": ["compare", str(v), str(SOURCES[0]), "--json"]}[verb]
        rc = main(argv)
        err = capsys.readouterr().err
        assert "Traceback" not in err and "Warning" not in err, (v.name, err[-1500:])
        assert rc in (0, 1, 2, 3), (v.name, rc, err[-500:])  # 1: the catch-all, still one line
        assert rc == 0 or len(err.strip().splitlines()) == 1, (v.name, err)
        codes.append(rc)
    assert len(codes) == 2 * VARIANTS
