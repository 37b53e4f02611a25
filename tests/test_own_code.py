"""A root decodemon on a shared machine runs decodemon's own code only: its helper processes read no planted
`decodemon/` package (in the directory root stands in, or on PYTHONPATH), its bytecode cache is never one another
user could fill, and a CUPTI library or copy-bandwidth figure in a cache another uid can write is never used. Real
processes; what needs a second uid's files runs as root and skips elsewhere (as tests/test_hostile.py does)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from decodemon.probes import children, own_files, wire
from tests.conftest import Engine

OTHER = 65534  # nobody
# the verb itself is started isolated here: what is watched is what it starts, in the planted directory and with
# the planted PYTHONPATH in the environment it passes on
DM = [sys.executable, "-I", "-m", "decodemon.monitor.cli"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid's files need root to make (chown)")


def give_away(path: Path) -> None:
    """Make `path` and everything under it uid 65534's."""
    for p in [path, *path.rglob("*")]:
        os.lchown(p, OTHER, OTHER)


@pytest.fixture
def planted(tmp_path):
    """Another user's `decodemon` package (and sitecustomize) in a world-writable directory: the directory, the
    file its code writes when it runs, and this environment with the directory on PYTHONPATH."""
    shared = tmp_path / "shared"
    (shared / "decodemon").mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    marker_line = f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"
    (shared / "decodemon" / "__init__.py").write_text(marker_line)
    (shared / "sitecustomize.py").write_text(marker_line)
    if os.geteuid() == 0:
        give_away(shared)
    shared.chmod(0o1777)
    marker.touch(mode=0o666)  # the planted code writes here whoever it runs as
    marker.chmod(0o666)
    return SimpleNamespace(dir=shared, marker=marker, env={**os.environ, "PYTHONPATH": str(shared)})


def ran(p) -> str:
    return p.marker.read_text()


def test_a_plain_start_runs_the_plant_and_decodemons_own_start_does_not(planted):
    plain = [sys.executable, "-m", "decodemon.monitor.counters.sampler", "--help"]
    subprocess.run(plain, cwd=planted.dir, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, timeout=60)
    assert "decodemon/__init__.py" in ran(planted)  # the attack, as it was: the package in root's directory ran
    planted.marker.write_text("")
    r = subprocess.run(children.python_argv("decodemon.monitor.counters.sampler", "--help"), cwd=children.CWD,
                       env=planted.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--uuid" in r.stdout, r.stderr
    assert ran(planted) == ""


def test_every_helper_command_line_is_isolated_and_the_engine_reads_only_the_agents_path(planted):
    assert children.python_argv("m", "a")[1:] == ["-I", "-m", "m", "a"]
    cmd, env = children.python_argv("x", flags=children.AGENT_LOADED), children.without_python_vars(planted.env)
    assert "-I" not in cmd and "-s" in cmd and ("-P" in cmd or sys.version_info < (3, 11))
    assert not [k for k in env if k.startswith("PYTHON")] and env["PATH"] == os.environ["PATH"]
    from decodemon.monitor.demo import engine_command

    cmd, env = engine_command(["--tiny"], planted.env)
    assert cmd[1:5] == ["-I", "-m", "decodemon.monitor.cli", "run"]  # `decodemon run` itself: isolated
    assert cmd[6:] == [sys.executable, *children.AGENT_LOADED, "-m", "decodemon.engine_adapter.demo", "--tiny"]
    assert "PYTHONPATH" not in env  # `decodemon run` gives it the bootstrap's, and no other


@pytest.mark.parametrize("verb", ["attach", "record", "report"])
def test_a_verb_that_attaches_starts_its_ptrace_helper_from_decodemons_own_code(planted, tmp_path, verb):
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"], cwd="/",
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        time.sleep(0.5)
        out = ["-o", str(tmp_path / "out")] if verb in ("record", "report") else ["--json"]
        r = subprocess.run([*DM, verb, str(target.pid), "--seconds", "1", *out], cwd=planted.dir, env=planted.env,
                           capture_output=True, text=True, timeout=120)
        assert "helper" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert wire.socket_path(target.pid).exists()  # the helper ran, and loaded the agent
    finally:
        target.kill()
        target.wait()
    assert ran(planted) == ""


def test_allreduce_starts_its_benchmark_and_ranks_from_decodemons_own_code(planted):
    pytest.importorskip("torch")
    r = subprocess.run([*DM, "allreduce", "--payload-bytes", "2048", "--tp", "2", "--iters", "2", "--device", "cpu",
                        "--repeats", "1", "--json"], cwd=planted.dir, env=planted.env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["repeats"] == 1 and ran(planted) == ""


def test_the_demo_engine_its_wrapper_and_its_ranks_run_decodemons_own_code(planted, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(planted.dir)
    monkeypatch.setenv("PYTHONPATH", str(planted.dir))
    e = Engine("--tp", "2")  # `decodemon run` -> the demo engine (agent loaded) -> its rank 1
    try:
        assert e.alive() and e.socket.exists()
    finally:
        e.stop()
    assert ran(planted) == ""


def test_the_sidecar_and_copy_bandwidth_start_from_own_code_with_no_target_text_on_their_command_lines(
        planted, monkeypatch):
    from decodemon.monitor.counters.bandwidth import measure_copy_gbs
    from decodemon.monitor.counters.sidecar import Sidecar

    monkeypatch.chdir(planted.dir)
    monkeypatch.setenv("PYTHONPATH", str(planted.dir))
    hostile = "GPU-0\x1b]2;owned\x07\x1b[2J"  # a target's hello: escapes for whoever reads `ps`
    for uuid, on_argv in ((hostile, False), ("GPU-8c6f0a6e-1b2c-4d5e-8f90-0123456789ab", True)):
        gpu = wire.GpuInfo(index=0, name="x", sm_count=1, mem_bandwidth_gbs=1.0, uuid=uuid, driver_version="1.2")
        side = Sidecar(gpu, os.getpid(), wire.Attach(), pm=False)
        try:
            assert ("--uuid" in side.proc.args) == on_argv and hostile not in side.proc.args
            assert side.proc.args[1] == "-I"
        finally:
            side.close()
        measure_copy_gbs(gpu)  # no GPU here: None, from a child that ran decodemon's code (or nothing, for hostile)
    assert children.gpu_uuid(hostile) == "" and children.gpu_uuid("MIG-GPU-8c6f0a6e-1b2c/1/0")
    assert children.driver_version("580.159.04") == "580.159.04" and children.driver_version("1\n2") == "?"
    assert ran(planted) == ""


def _plant_pyc(src: Path, prefix: Path, marker: Path) -> None:
    """Bytecode for `src` under the pycache prefix `prefix`, valid for its mtime and size: it writes `marker`."""
    import importlib._bootstrap_external as be

    st = src.stat()
    code = compile(f"open({str(marker)!r}, 'a').write('pyc ran\\n')\nX = 666\n", str(src), "exec")
    old, sys.pycache_prefix = sys.pycache_prefix, str(prefix)
    try:
        pyc = Path(importlib.util.cache_from_source(str(src)))
    finally:
        sys.pycache_prefix = old
    pyc.parent.mkdir(parents=True, exist_ok=True)
    pyc.write_bytes(be._code_to_timestamp_pyc(code, st.st_mtime, st.st_size))


def _untrusted_caches(tmp_path, own_dir) -> dict[str, Path]:
    """XDG_CACHE_HOMEs decodemon must not read back from, by how another user could fill them."""
    shared = tmp_path / "shared-1777"
    shared.mkdir()
    shared.chmod(0o1777)
    (own_dir / "group-writable").mkdir(mode=0o775)
    (own_dir / "group-writable").chmod(0o775)
    linked = own_dir / "linked"
    (linked / "decodemon").parent.mkdir()
    (linked / "decodemon").symlink_to(shared)  # ours, but it leads into a directory anyone can write
    cases = {"under /tmp": tmp_path / "cache", "group-writable": own_dir / "group-writable", "linked": linked}
    if os.geteuid() == 0:
        (own_dir / "others").mkdir()
        give_away(own_dir / "others")
        (own_dir / "others-above" / "cache").mkdir(parents=True)
        os.chown(own_dir / "others-above", OTHER, OTHER)  # the cache root's own directory is root's; above it not
        cases.update({"another uid's": own_dir / "others", "another uid's above": own_dir / "others-above" / "cache"})
    return cases


def test_planted_bytecode_is_imported_from_no_cache_another_user_could_fill(tmp_path, own_dir, monkeypatch):
    from decodemon.monitor import _lean

    marker = tmp_path / "pyc-ran"
    monkeypatch.setattr(_lean, "needs_prefix", lambda origin: True)  # as where site-packages is read-only
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the shared-tmp fallback there was: planted too, and linked
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere").chmod(0o1777)
    (tmp_path / f"decodemon-pycache-{os.getuid()}").symlink_to(tmp_path / "elsewhere")
    cases = {**_untrusted_caches(tmp_path, own_dir), "trusted (the control)": own_dir / "mine"}
    for i, (case, cache) in enumerate(cases.items()):
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / f"victim_{i}.py").write_text("X = 1\n")
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        for prefix in (Path(_lean.cache_dir()), tmp_path / "elsewhere"):
            _plant_pyc(src / f"victim_{i}.py", prefix, marker)
        monkeypatch.setattr(sys, "pycache_prefix", None)
        monkeypatch.syspath_prepend(str(src))
        prefix = _lean.bytecode_cache(f"victim_{i}")
        mod = importlib.import_module(f"victim_{i}")
        sys.modules.pop(f"victim_{i}")
        trusted = case.startswith("trusted")
        assert (prefix is not None) == trusted and (mod.X == 666) == trusted, case
        assert marker.exists() == trusted, case  # the control: the planted bytecode is valid, and ran from ours


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """cupti_lib.build with a stand-in compiler (what is tested is where it puts and looks for the library)."""
    from decodemon.monitor.inject import cupti_lib

    (tmp_path / "cupti" / "include").mkdir(parents=True)
    (tmp_path / "cupti" / "lib").mkdir()
    (tmp_path / "cupti" / "lib" / "libcupti.so.13").write_bytes(b"")
    monkeypatch.setattr(cupti_lib, "cupti_dirs", lambda: (tmp_path / "cupti" / "include", tmp_path / "cupti" / "lib"))
    monkeypatch.setattr(cupti_lib, "cuda_include", lambda: tmp_path / "cupti" / "include")
    monkeypatch.setattr(cupti_lib, "compiler", lambda: "cc")
    monkeypatch.setattr(cupti_lib, "_compile", lambda cmd, dfd, real: own_files.write_file(
        dfd, cupti_lib.LIB_NAME, b"\x7fELF decodemon's own", 0o755))
    monkeypatch.setattr(own_files, "_said", set())
    return cupti_lib


def test_a_cupti_library_in_a_cache_another_user_could_fill_is_never_handed_to_cuda(tmp_path, own_dir, fake_build,
                                                                                    monkeypatch, capsys):
    cupti_lib = fake_build
    for case, cache in _untrusted_caches(tmp_path, own_dir).items():
        monkeypatch.setattr(own_files, "_said", set())
        planted = cupti_lib.lib_dir(cache / "decodemon") / cupti_lib.LIB_NAME
        planted.parent.mkdir(parents=True, exist_ok=True)
        planted.write_bytes(b"\x7fELF another user's")
        if case == "another uid's":
            give_away(cache)
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        lib = cupti_lib.build()
        assert lib.read_bytes() == b"\x7fELF decodemon's own" and not lib.is_relative_to(cache), case
        assert lib.stat().st_uid == os.geteuid() and lib.stat().st_mode & 0o777 == 0o755
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("decodemon: the cache ") and \
            err[0].endswith(": built the CUPTI library in a private directory instead"), (case, err)
        assert " is not only " in err[0], err
    mine = cupti_lib.build(own_dir / "mine")
    assert mine.is_relative_to(own_dir / "mine") and cupti_lib.build(own_dir / "mine") == mine  # ours: kept there
    assert capsys.readouterr().err == ""


@needs_root
def test_another_uids_cache_is_named_with_its_owner(own_dir, fake_build, monkeypatch, capsys):
    cache = own_dir / "theirs"
    cache.mkdir()
    give_away(cache)
    fake_build.build(cache / "decodemon")
    err = capsys.readouterr().err.strip()
    assert err == (f"decodemon: the cache {cache / 'decodemon'} is not only root's ({cache}: owned by uid {OTHER}): "
                   "built the CUPTI library in a private directory instead")
    (cache / "decodemon").mkdir()  # root's own, in a directory of theirs: still theirs to swap
    os.chown(cache / "decodemon", 0, 0)
    monkeypatch.setattr(own_files, "_said", set())
    fake_build.build(cache / "decodemon")
    assert capsys.readouterr().err.strip() == err


@needs_root
def test_decodemon_run_hands_cuda_no_library_from_another_uids_cache(own_dir):
    from decodemon.monitor.inject import cupti_lib

    try:
        cupti_lib.cuda_include()
        theirs = cupti_lib.lib_dir(own_dir / "cache" / "decodemon")
    except cupti_lib.BuildError as exc:
        pytest.skip(str(exc))
    theirs.mkdir(parents=True)
    (theirs / cupti_lib.LIB_NAME).write_bytes(b"\x7fELF another user's")
    give_away(own_dir / "cache")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_INJECTION64_PATH"}
    show = ["sh", "-c", 'echo "inject=${CUDA_INJECTION64_PATH:-none}"; head -c 4 "$CUDA_INJECTION64_PATH" | od -c']
    r = subprocess.run([*DM, "run", "--", *show], env={**env, "XDG_CACHE_HOME": str(own_dir / "cache")},
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    lib = Path(r.stdout.splitlines()[0].split("=", 1)[1])
    assert lib.name == cupti_lib.LIB_NAME and not lib.is_relative_to(own_dir) and "E   L   F" in r.stdout
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("decodemon: the cache")]
    assert said == [f"decodemon: the cache {own_dir / 'cache' / 'decodemon'} is not only root's ({own_dir / 'cache'}: "
                    f"owned by uid {OTHER}): built the CUPTI library in a private directory instead"], r.stderr
    assert not lib.exists()  # the private copy goes when the command has ended


def test_a_copy_bandwidth_in_a_cache_another_user_could_fill_is_not_used(tmp_path, own_dir, monkeypatch, capsys):
    from decodemon.monitor.counters.bandwidth import measured_copy_gbs
    from decodemon.monitor.counters import copy_bandwidth as cb

    for case, cache in _untrusted_caches(tmp_path, own_dir).items():
        monkeypatch.setattr(own_files, "_said", set())
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        cb.cache_path().parent.mkdir(parents=True, exist_ok=True)
        planted = json.dumps({"GPU-1|d": {"copy_gbs": 1.0}})
        cb.cache_path().write_text(planted)
        if case == "another uid's":
            give_away(cache)
        gpu = wire.GpuInfo(index=0, name="x", sm_count=1, mem_bandwidth_gbs=1.0, uuid="GPU-1", driver_version="d")
        assert cb.cached_gbs("GPU-1", "d") is None and measured_copy_gbs(gpu) is None, case
        cb.store("GPU-1", "d", {"copy_gbs": 2.0})
        assert cb.cache_path().read_text() == planted  # nothing written through it either
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("decodemon: the cache ") and "is not" in err[0], (case, err)


@needs_root
def test_the_copy_bandwidth_verb_says_it_will_not_read_another_uids_cache(own_dir):
    cache = own_dir / "theirs"
    (cache / "decodemon").mkdir(parents=True)
    (cache / "decodemon" / "copy_bandwidth.json").write_text(json.dumps({"GPU-1|d": {"copy_gbs": 1.0}}))
    give_away(cache)
    r = subprocess.run(children.python_argv("decodemon.monitor.counters.copy_bandwidth", "--uuid", "GPU-1", "--driver", "d",
                                            "--json"), env={**os.environ, "XDG_CACHE_HOME": str(cache)},
                       capture_output=True, text=True, timeout=120)
    assert '"cached": true' not in r.stdout and "1.0" not in r.stdout
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("decodemon: the cache")]
    assert said == [f"decodemon: the cache {cache / 'decodemon'} is not only root's ({cache}: owned by uid {OTHER}): "
                    "the copy bandwidth is neither read from it nor kept in it (measured anew where there is a GPU)"], \
        r.stderr


@needs_root
def test_root_never_runs_a_target_interpreter_another_user_could_have_written(tmp_path, own_dir):
    """Reading a target's Python version (and sys.remote_exec on 3.14) runs the target's own interpreter: as root,
    only one that root or this user owns, in directories no one else can write. A 'python' of uid 65534 is not
    run: the version stays unknown, and remote_exec is refused in one line."""
    from decodemon.monitor import inject

    marker = tmp_path / "ran"
    theirs = own_dir / "bin"
    theirs.mkdir()
    fake = theirs / "python3.14"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho 3 14\n")
    fake.chmod(0o755)
    assert inject.untrusted_program(str(fake)) is None and inject._version_by_running(str(fake)) == (3, 14)
    marker.unlink()  # the control: root's own file in root's own directory is run
    give_away(theirs)
    assert "uid 65534" in inject.untrusted_program(str(fake))
    assert inject._version_by_running(str(fake)) is None and not marker.exists()
