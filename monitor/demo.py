"""`decodemon demo`: eager vs CUDA-graphed, side by side.

With an NVIDIA GPU (and no --replay) it starts the demo engine twice, eager
and graph, and opens `compare` on both, live. Two engines on one GPU share
its time and its PM counters: the traced-window figures (launches, kernel
times, grids, gaps) stay per process, and the screen says which figures are
device-wide. Without a GPU it plays the H100 recordings bundled with the
package, looping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from importlib import resources

from decodemon.monitor.sources import agent_socket
from decodemon.monitor.sources.errors import SourceError

RECORDINGS = ("h100_eager.dmon", "h100_graph.dmon")


def bundled_recordings() -> list[str]:
    """Paths of the recordings shipped inside the package."""
    base = resources.files("decodemon.monitor") / "data"
    paths = [str(base / name) for name in RECORDINGS]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise SourceError(f"bundled recording missing: {missing[0]}")
    return paths


def gpu_available() -> bool:
    """An NVIDIA driver answers (no torch import: the monitor stays light)."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine_command(args: list[str], env: dict | None = None) -> tuple[list[str], dict]:
    """The demo engine's command line under `decodemon run`, and its environment: decodemon's code only."""
    from decodemon.probes import children

    engine = children.python_argv("decodemon.engine_adapter.demo", *args, flags=children.AGENT_LOADED)
    return children.python_argv("decodemon.monitor.cli", "run", "--", *engine), children.without_python_vars(env)


def spawn_engine(args: list[str], stdout=subprocess.DEVNULL, timeout_s: float = 180,
                 env: dict | None = None) -> tuple[subprocess.Popen, int]:
    """Start the demo engine with the agent loaded (`decodemon run`); return (process, engine pid) once it decodes.

    `env`: the engine's environment (default: this process's), less PYTHON*: the engine reads the PYTHONPATH
    `decodemon run` gives it (the agent's bootstrap) and no other."""
    from decodemon.probes import children

    cmd, env = engine_command(args, env)
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, cwd=children.CWD)
    t0 = time.monotonic()
    pid = None
    while time.monotonic() - t0 < timeout_s:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        if "started pid" in line:
            pid = int(line.split("started pid")[1].split(";")[0])
        if "decoding" in line and pid:
            while agent_socket.find(pid) is None and time.monotonic() - t0 < timeout_s:
                time.sleep(0.05)
            return proc, pid
    proc.kill()
    raise SourceError("the demo engine did not start (is torch with CUDA installed?); "
                      "try `decodemon demo --replay`")


def demo_settings():
    """The live demo's attach settings: the defaults, with the launch calls traced in every window."""
    from decodemon.probes import wire

    return wire.Attach(api_every=1)


@contextlib.contextmanager
def demo_engines(tokens: int = 0):
    """Start the demo engine eager and graphed; yield their pids; stop both on the way out."""
    procs, pids = [], []
    try:
        for mode in ("eager", "graph"):
            proc, pid = spawn_engine(["--mode", mode, "--tokens", str(tokens)])
            procs.append(proc)
            pids.append(pid)
        yield pids
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def live(replay: bool) -> bool:
    """Whether the demo runs live engines (a GPU, and no --replay) or plays the bundled recordings."""
    return not replay and gpu_available()


def replay_players(speed: float = 1.0) -> list:
    """The two players of `decodemon demo` with no GPU (the README's screenshot draws these very ones)."""
    from decodemon.monitor.player import RecordingPlayer, in_step

    a, b = bundled_recordings()
    return in_step([RecordingPlayer(a, "eager (H100 recording)", speed=speed, loop=True),
                    RecordingPlayer(b, "graph (H100 recording)", speed=speed, loop=True)])


def run_demo(replay: bool = False, tokens: int = 0, speed: float = 1.0, seconds: float | None = None,
             refresh_s: float | None = None) -> int:
    """The app, live on a GPU, else on the bundled recordings."""
    from decodemon.monitor.app import DecodemonApp
    from decodemon.monitor.player import LivePlayer

    if not live(replay):
        players = replay_players(speed)
        # start a few seconds in, so the first screen already has a traced window and a verdict
        DecodemonApp(players, start_at_s=6.0, quit_after_s=seconds, refresh_s=refresh_s).run()
        return 0
    with demo_engines(tokens) as (eager, graph):
        # the demo shows the two loops side by side: every window traces the launch calls, so the eager timeline's
        # CPU lane is always the window's own (`attach` traces them in one window of four)
        settings = demo_settings()
        players = [LivePlayer(eager, settings, label=f"eager pid {eager}"),
                   LivePlayer(graph, settings, label=f"graph pid {graph}")]
        DecodemonApp(players, quit_after_s=seconds, refresh_s=refresh_s).run()
    return 0
