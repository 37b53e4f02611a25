"""Tensor parallel on CPU (gloo): the sharded demo engine, one view over all ranks, Amdahl, the all-reduce lab.

The H200 part of this work (NCCL, ≥ 2 GPUs, TP=1 vs TP=N recordings) needs a machine with several GPUs,
which was not lent; everything here runs real processes on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import sys

import pytest

from decodemon.engine_adapter.model import SHAPES, DecodeModel
from tests.conftest import Engine, assert_one_line_error, cli, run_script


def run_demo(*args):
    r = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--device", "cpu", *args,
                        "--json", "--print-tokens", "--warmup", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_tp2_decodes_the_same_tokens_as_tp1():
    one, two = run_demo("--tokens", "200"), run_demo("--tokens", "200", "--tp", "2")
    assert one["token_ids"] == two["token_ids"]
    assert two["tp"] == 2 and len(two["rank_pids"]) == 2


def test_collectives_counted_from_the_forward_pass():
    m = DecodeModel(SHAPES["tiny"], "cpu", __import__("torch").float32, 16, tp_size=2, all_reduce=lambda t: t)
    assert m.collectives_per_token() == 2 * SHAPES["tiny"].layers  # attention out + MLP out, every layer
    assert m.collective_bytes() == SHAPES["tiny"].hidden * 4
    assert m.kv_local == SHAPES["tiny"].kv_heads // 2


def test_tp_that_does_not_divide_the_heads_is_one_line():
    r = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--device", "cpu",
                        "--tp", "3", "--tokens", "1"], capture_output=True, text=True, timeout=120)
    assert_one_line_error(r)


def kill_ranks(e: Engine) -> None:
    """Kill a TP engine (rank 0, under its `decodemon run` wrapper), its other ranks first: a TERM'd rank 0 waits
    ~10 s on its collective's timeout for the rank that left. The wrapper then ends with its child."""
    for pid in subprocess.run(["pgrep", "-P", str(e.pid)], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    try:
        os.kill(e.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        e.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        e.proc.kill()
        e.proc.communicate()


@pytest.fixture
def tp2():
    e = Engine("--tp", "2")
    yield e
    kill_ranks(e)


def test_one_view_over_all_ranks_from_any_rank(tp2):
    for pid in (tp2.pid, None):
        if pid is None:  # the other rank: a child of rank 0
            pid = int(subprocess.run(["pgrep", "-P", str(tp2.pid)], capture_output=True, text=True).stdout.split()[0])
        r = cli("attach", pid, "--json", "--seconds", "1.5", timeout=60)
        assert r.returncode == 0, r.stderr
        g = json.loads(r.stdout)["group"]
        assert g["tp"] == 2 and [x["tp_rank"] for x in g["ranks"]] == [0, 1]
        assert g["slowest_rank"] in (0, 1) and g["rank_spread_pct"] >= 0
        for rank in g["ranks"]:
            c = rank["collectives"]
            assert c["counted_per_token"] == 4 and c["payload_bytes"] == 256
            assert c["calls_per_token"] == pytest.approx(4, abs=0.2)
            assert c["us_per_call"] > 0 and c["source"].startswith("engine clock")


def test_a_rank_another_monitor_holds_is_named_in_the_group_not_shown_empty(tp2, tmp_path):
    rec = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "record", str(tp2.pid), "-o",
                            str(tmp_path / "r0.dmon"), "--seconds", "6"], stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while time.time() - t0 < 20 and not list(tmp_path.glob(".r0.dmon.*")):
            time.sleep(0.1)  # until the recorder holds rank 0 (its first frame makes its temporary file)
        r = cli("attach", tp2.pid, "--json", "--seconds", "1.5", timeout=60)
        assert r.returncode == 0, r.stderr
        g = json.loads(r.stdout)["group"]
        assert g["tp"] == 2 and [x["tp_rank"] for x in g["ranks"]] == [1]
        assert any(f"pid {tp2.pid}: busy: monitor pid" in e for e in g["errors"])
        assert f"rank pid {tp2.pid}: busy" in r.stderr
    finally:
        rec.wait(30)


def test_serial_fraction_from_two_recordings(tmp_path):
    recs = {}
    for tp in (1, 2):
        e = Engine("--tp", str(tp))
        try:
            recs[tp] = tmp_path / f"tp{tp}.dmon"
            r = cli("record", e.pid, "-o", recs[tp], "--seconds", "2", timeout=60)
            assert r.returncode == 0, r.stderr
        finally:
            kill_ranks(e)
    r = cli("scaling", recs[1], recs[2], "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n1"] == 1 and d["n"] == 2
    # rounded to 4 decimals: on a loaded machine TP=2 over gloo can run 30x slower, a speedup of 0.03
    assert d["speedup"] == pytest.approx(d["ms_per_token_n1"] / d["ms_per_token_n"], rel=1e-3, abs=5e-5)
    # Amdahl at N=2: s = 2/speedup - 1 (on a 2-core CPU, gloo TP=2 is slower than TP=1, so s comes out > 1)
    # the summary rounds s to 4 decimals: near 0 that rounding is more than 0.1% of it
    assert d["solved_s"] == pytest.approx(2 * d["ms_per_token_n"] / d["ms_per_token_n1"] - 1, rel=1e-3, abs=1e-4)
    assert isinstance(d["stale"], bool)
    assert d["amdahl_applies"] == (0 <= d["solved_s"] <= 1)
    # a fraction only where one explains the runs: never a number outside 0..1 under that name
    assert d["serial_fraction"] == (d["solved_s"] if d["amdahl_applies"] else None)
    if not d["amdahl_applies"]:  # the usual case here: the note says so instead of presenting s as a fraction
        assert "Amdahl's law does not apply" in d["note"]
    assert_one_line_error(cli("scaling", recs[2], recs[1]))  # the second run must have more ranks


def test_allreduce_lab_on_cpu():
    r = cli("allreduce", "--payload-bytes", 4096, "--tp", 2, "--iters", 20, "--device", "cpu", "--json",
            timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["sizes"]) == {"1", "8", "64"}
    assert d["sizes"]["64"]["bytes"] == 64 * d["sizes"]["1"]["bytes"]
    assert all(v["us_per_call"] > 0 for v in d["sizes"].values())
    assert d["regime"]


def test_a_graphed_windows_collectives_price_the_same_without_its_launch_calls():
    """Kernels-only windows (Attach.api_every) of a graphed TP=2 rank: each window of the H200 recording with its
    launch calls taken out (derived here, not recorded) prices the all-reduces as the window itself did; the
    idle inside one cudaGraphLaunch is known to be the device's from the kernels' shared correlation id."""
    import msgspec

    from decodemon.monitor.analysis.window import window_metrics
    from decodemon.monitor.render.json import collectives_json
    from decodemon.monitor.session import Session
    from decodemon.probes import wire

    from tests.conftest import DATA

    path = DATA / "h200_tp2_graph_rank0.dmon"
    full, kern = Session(), Session()
    n = 0
    for rx, f in wire.read_recording(path):
        full.add(rx, f)
        if isinstance(f, wire.KernelWindow):
            k = msgspec.structs.replace(f, apis={}, api_names={}, apis_traced=False)
            a, b = window_metrics(f, 132), window_metrics(k, 132)
            assert b.collective_calls_per_token == a.collective_calls_per_token > 0
            assert b.collective_gap_us == a.collective_gap_us > 0
            assert b.graph_launches_per_token == a.graph_launches_per_token == 1.0
            assert {x: v for x, v in b.gap_ms_per_token.items() if x != "unsplit"} == a.gap_ms_per_token
            assert b.gap_ms_per_token["unsplit"] == 0
            f, n = k, n + 1
        kern.add(rx, f)
    assert n >= 2
    assert collectives_json(kern.snapshot())["us_per_call"] == collectives_json(full.snapshot())["us_per_call"]


HELPER_CHILD = """
import runpy, subprocess, sys
# a helper process that inherits the agent, as torch.compile's compile workers do: not a rank
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
sys.argv = ["demo", "--tiny", "--device", "cpu", "--tokens", "0"]
try:
    runpy.run_module("decodemon.engine_adapter.demo", run_name="__main__")
finally:
    helper.kill()
"""


def test_a_child_that_inherits_the_agent_but_is_no_rank_is_not_watched_as_one(tmp_path):
    from decodemon.probes.wire import socket_path

    script = tmp_path / "engine_with_helper.py"
    script.write_text(HELPER_CHILD)
    proc, pid = run_script(script)
    try:
        kids = []
        for _ in range(200):
            kids = [int(k) for k in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                   text=True).stdout.split()]
            if kids and all(socket_path(k).exists() for k in kids) and socket_path(pid).exists():
                break
            time.sleep(0.05)
        assert kids and socket_path(kids[0]).exists()  # the helper has an agent, and an attach could reach it
        r = cli("attach", pid, "--json", "--seconds", "1.5", timeout=60)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert "group" not in got and got["pid"] == pid and got["tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("helper", ["torch/_inductor/compile_worker/__main__.py", "bin/torchrun"])
def test_helpers_an_engine_starts_get_no_agent(tmp_path, helper):
    """A process started as torch.compile starts its compile workers (`python .../torch/_inductor/compile_worker/
    __main__.py --workers=N ...`), or torchrun, which starts the ranks, loads no agent under `decodemon run`'s
    environment (watched, they would arm PM against the engine); the engine itself does."""
    worker = tmp_path / helper
    worker.parent.mkdir(parents=True)
    worker.write_text("from decodemon.probes import agent\nprint(agent._agent is None)\n")
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", sys.executable, str(worker),
                        "--workers=2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]
    engine = tmp_path / "engine.py"
    engine.write_text(worker.read_text())
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", sys.executable, str(engine)],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False"]


def test_a_child_that_drives_a_gpu_is_a_rank_though_its_rendezvous_was_set_in_code(tmp_path):
    """Ranks started by torch.multiprocessing.spawn, or joining by tcp://, carry no rendezvous in their
    environment; a rank has the CUDA driver mapped, a data loader or tokenizer worker does not. (No GPU here: a
    file of the driver's name, mapped as the loader maps it, stands in for libcuda.)"""
    from decodemon.monitor.ranks import is_rank

    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    code = ("import mmap, sys, time\nf = open(sys.argv[1], 'rb')\nm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)"
            "\nprint('mapped', flush=True)\ntime.sleep(60)\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("WORLD_SIZE", "RANK", "LOCAL_RANK",
                                                                                   "MASTER_PORT"))}
    gpu = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdout=subprocess.PIPE, text=True, env=env)
    plain = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert gpu.stdout.readline().strip() == "mapped" and plain.stdout.readline().strip() == "up"
        assert is_rank(gpu.pid) and not is_rank(plain.pid)
    finally:
        for p in (gpu, plain):
            p.kill()
            p.wait()
