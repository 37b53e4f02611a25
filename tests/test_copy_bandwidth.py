"""The measured copy bandwidth: cached per GPU and driver; no GPU is one line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

from decodemon.monitor.counters import copy_bandwidth as cb


def run(*args, env):
    return subprocess.run([sys.executable, "-m", "decodemon.monitor.counters.copy_bandwidth", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, monkeypatch):
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)}
    r = run("--json", env=env)
    if r.returncode == 0:  # a machine with a GPU measured it
        assert json.loads(r.stdout)["copy_gbs"] > 0
        return
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "CUDA" in r.stderr


def test_a_cached_figure_is_used_for_its_own_gpu_and_driver_only(own_dir, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(own_dir))
    cb.store("GPU-1", "580.159.04", {"copy_gbs": 4170.5})
    cb.store("GPU-2", "580.159.04", {"copy_gbs": 3000.0})
    assert cb.cached_gbs("GPU-1", "580.159.04") == 4170.5
    assert cb.cached_gbs("GPU-1", "590.0") is None
    r = run("--uuid", "GPU-2", "--driver", "580.159.04", "--json", env={"XDG_CACHE_HOME": str(own_dir),
                                                                         "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and json.loads(r.stdout) == {"copy_gbs": 3000.0, "cached": True}
    assert not list(own_dir.glob("decodemon/*.tmp"))


def test_a_corrupt_cache_is_replaced_not_fatal(own_dir, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(own_dir))
    cb.cache_path().parent.mkdir(parents=True)
    cb.cache_path().write_text("{not json")
    assert cb.cached_gbs("GPU-1", "d") is None
    cb.store("GPU-1", "d", {"copy_gbs": 1.0})
    assert cb.cached_gbs("GPU-1", "d") == 1.0


def test_a_recordings_header_keeps_the_figure_the_live_attach_priced_the_floor_with():
    from decodemon.monitor.counters.bandwidth import from_note, header_note
    from decodemon.monitor.sources.collect import collect
    from decodemon.monitor.session import Session
    from decodemon.probes import wire
    from tests.conftest import REC

    assert from_note(header_note(4267.7)) == 4267.7 and from_note("") is None and from_note("{bad") is None
    s = Session()
    s.add(0, wire.RecordingHeader(wire_version=wire.WIRE_VERSION, created_unix_s=0.0, decodemon_version="x",
                                  note=header_note(4267.7)))
    for rx, f in list(wire.read_recording(REC["llama8b_graph"]))[1:]:
        s.add(rx, f)
    snap = s.snapshot()
    assert snap.bandwidth_gbs == 4267.7 and snap.bandwidth_source.startswith("measured copy (decodemon")
    old = collect(str(REC["llama8b_graph"])).snapshot()  # recorded before the note: the engine's own copy
    assert old.bandwidth_source == "measured copy (the engine adapter's: the engine timed its own copy)"


def test_the_cache_keeps_the_best_figure_a_busier_gpu_measures_less(own_dir, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(own_dir))
    cb.store("GPU-1", "d", {"copy_gbs": 4267.7})
    cb.store("GPU-1", "d", {"copy_gbs": 2131.4})  # measured beside a bandwidth-bound loop
    assert cb.cached_gbs("GPU-1", "d") == 4267.7


def test_every_live_consumer_prices_the_floor_with_the_measured_copy_the_hello_carries(monkeypatch):
    """The app, the exporter, `attach --json`, `record` and the sweep all read a live source through
    sources.live.live_frames, which adds decodemon's cached copy bandwidth to the hello (GpuInfo.copy_gbs): one floor
    for every consumer, and a recording replays with the figure its attach used."""
    import ast
    from pathlib import Path

    import msgspec

    from decodemon.monitor.sources import live
    from decodemon.monitor.counters import bandwidth
    from decodemon.monitor.session import Session
    from decodemon.probes import wire
    from tests.conftest import REC

    monkeypatch.setattr(bandwidth, "measured_copy_gbs", lambda gpu: 4267.7 if gpu.uuid else None)
    frames = list(wire.read_recording(REC["llama8b_graph"]))[1:]
    hello = next(f for _, f in frames if isinstance(f, wire.Hello))
    hello = msgspec.structs.replace(hello, gpu=msgspec.structs.replace(hello.gpu, uuid="GPU-1"))
    rewritten, payload = live._with_monitors_facts(hello, wire.encode(hello), pid=0)
    assert rewritten.gpu.copy_gbs == 4267.7 and wire.decode_frame(payload) == rewritten
    s = Session()
    for rx, f in frames:
        s.add(rx, rewritten if isinstance(f, wire.Hello) else f)
    snap = s.snapshot()
    assert snap.bandwidth_gbs == 4267.7 and snap.bandwidth_source.startswith("measured copy (decodemon")
    # no consumer prices the floor on its own: the Session reads the hello, and nothing else sets copy_gbs
    monitor = Path(live.__file__).parents[1]
    setters = [p.relative_to(monitor).as_posix() for p in monitor.rglob("*.py")
               for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Attribute) and t.attr == "copy_gbs"]
    assert sorted(set(setters)) == ["session.py"], setters
