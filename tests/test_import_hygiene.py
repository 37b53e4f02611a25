"""Layering you can check: analysis and probes stay light, each in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

VERBS = ["run", "attach", "record", "replay", "report", "diagnose", "compare", "scaling", "allreduce", "demo",
         "sweep", "predict", "grade", "export", "exporter"]
HEADLESS = ["decodemon.monitor.diagnosis", "decodemon.monitor.session", "decodemon.monitor.analysis.window",
            "decodemon.monitor.render.json", "decodemon.monitor.token_clock", "decodemon.monitor.ledger",
            "decodemon.monitor.plots", "decodemon.monitor.export", "decodemon.monitor.exporter.serve",
            "decodemon.monitor.feed", "decodemon.monitor.cli", "decodemon.monitor.sources.live",
            "decodemon.monitor.sources.collect", "decodemon.monitor.api", *(f"decodemon.monitor.cli.{v}" for v in VERBS)]
PROBES = ["decodemon.probes.agent", "decodemon.probes.wire", "decodemon.engine_adapter"]


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", HEADLESS)
def test_analysis_and_cli_import_neither_textual_nor_torch_nor_cupti(module):
    mods = loaded_after(module)
    assert not {m for m in mods if m.split(".")[0] in ("textual", "torch", "cupti")}


@pytest.mark.parametrize("module", PROBES)
def test_probes_never_import_textual_or_the_analysis(module):
    mods = loaded_after(module)
    assert not {m for m in mods if m.split(".")[0] in ("textual", "torch", "cupti")}
    assert not {m for m in mods if m.startswith("decodemon.monitor")}


def test_the_public_api_replays_a_recording_without_textual_or_torch():
    code = ("import sys; from importlib import resources; from decodemon.monitor import api; "
            "s = api.replay(resources.files('decodemon.monitor') / 'data' / 'h100_graph.dmon'); "
            "print(s.verdict, s.tokens, ' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    verdict, tokens, mods = out[0], int(out[1]), set(out[2:])
    assert verdict != "unknown" and tokens > 0  # it really read the recording
    assert not {m for m in mods if m.split(".")[0] in ("textual", "torch", "cupti")}


def test_a_replay_reads_the_recording_alone_nothing_of_the_live_socket_or_the_pid_checks():
    """`decodemon replay REC --json` imports no live source: not the socket reader, the pid checks, the agent's
    loading, the outside watch or the counters' sidecar."""
    code = ("import sys; from importlib import resources; from decodemon.monitor.cli import main; "
            "rc = main(['replay', str(resources.files('decodemon.monitor') / 'data' / 'h100_graph.dmon'), '--json']); "
            "print(rc, ' '.join(sorted(sys.modules)), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rc, *mods = r.stderr.split()
    assert rc == "0" and '"tokens"' in r.stdout  # it really replayed
    live = ("decodemon.monitor.sources.live", "decodemon.monitor.sources.pids", "decodemon.monitor.sources.agent_socket",
            "decodemon.monitor.sources.outside", "decodemon.monitor.inject", "decodemon.monitor.counters.sidecar")
    assert not [m for m in mods if m.startswith(live)]
    assert "decodemon.monitor.sources.recording" in mods


def test_the_cli_parses_every_verb_without_textual():
    """`decodemon VERB --help` and every --json path start without the app's import cost."""
    code = ("import sys; from decodemon.monitor.cli import build_parser; p = build_parser(); "
            "sub = next(a for a in p._actions if getattr(a, 'choices', None)); "
            f"[sub.choices[v].format_help() for v in {VERBS!r}]; print(' '.join(sorted(sys.modules)))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert "textual" not in mods and "torch" not in mods


def test_monitor_uses_only_the_wire_from_probes():
    mods = loaded_after("decodemon.monitor.app")
    probes = {m for m in mods if m.startswith("decodemon.probes")}
    # the wire: its frames (wire.py), their checks (wire_check.py), its file (wire_file.py) and its socket framing
    # (wire_socket.py)
    assert probes <= {"decodemon.probes", "decodemon.probes.wire", "decodemon.probes.wire_check",
                      "decodemon.probes.wire_file", "decodemon.probes.wire_socket", "decodemon.probes.frames",
                      "decodemon.probes.msgpack_std"}, probes


def test_the_agent_and_the_engine_adapters_import_the_standard_library_alone():
    """What runs in the target comes from decodemon's folder, mapped in by the bootstrap, into an interpreter with no
    site-packages at all (`-I -S`): every module it loads is the standard library's or decodemon's."""
    from pathlib import Path

    import decodemon.probes

    root = str(Path(decodemon.probes.__file__).resolve().parent.parent)
    code = ("import sys, types; p = types.ModuleType('decodemon'); p.__path__ = [sys.argv[1]]; "
            "sys.modules['decodemon'] = p; import decodemon.engine_adapter.auto; "
            "from decodemon.probes import agent, server, attach_loop, session; "
            "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, root], capture_output=True, text=True, check=True)
    foreign = set(out.stdout.split()) - set(sys.stdlib_module_names) - {"decodemon", "__main__"}
    assert not foreign, foreign


def test_the_nvml_sidecar_starts_without_numpy():
    """The sidecar is a process started at every attach, and a process starting on another CPU slows an eager
    decode thread while it starts: it imports what it needs only."""
    mods = loaded_after("decodemon.monitor.counters.sampler")
    assert "numpy" not in mods and "decodemon.probes.wire" in mods
