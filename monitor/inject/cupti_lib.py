"""decodemon's CUPTI library (probes/cupti_inject/decodemon_cupti.c): found, or built once with the C compiler.
`decodemon run` loads it into a process with no Python (llama-server) through CUDA_INJECTION64_PATH; a Python
target's agent is sent its bytes in the Attach (`image`) and traces its windows with it (probes/native_tracer.py).

The build needs a C compiler, CUPTI's headers and library (the nvidia-cuda-cupti wheel, decodemon's `gpu`
extra) and CUDA's driver header, cuda.h (CUDA_HOME, /usr/local/cuda, or the CUDA wheels). The
library lands in decodemon's cache under the source's hash, written whole (a temporary file renamed), so an edit
of the source builds anew and an interrupted build leaves nothing behind; it is read back from there only where
no other user could have put it (probes/own_files.py).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from decodemon.probes import own_files

LIB_NAME = "libdecodemon_cupti.so"


class BuildError(RuntimeError):
    """The library cannot be built here; the message is one line saying what is missing."""


def source() -> Path:
    """The library's C source, as installed with decodemon."""
    return Path(str(resources.files("decodemon.probes") / "cupti_inject" / "decodemon_cupti.c"))


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def cupti_dirs() -> tuple[Path, Path]:
    """(include, lib) of the CUPTI that the nvidia-cuda-cupti wheel installed; BuildError when none is."""
    for site in _site_dirs():
        for cu in sorted((site / "nvidia").glob("cu*"), reverse=True):
            inc, lib = cu / "include", cu / "lib"
            if (inc / "cupti_activity.h").is_file() and any(lib.glob("libcupti.so*")):
                return inc, lib
    raise BuildError("CUPTI's headers are not installed (pip install 'decodemon[gpu]' brings nvidia-cuda-cupti)")


def cuda_include() -> Path:
    """A directory holding cuda.h and what it includes: CUDA_HOME's, /usr/local/cuda's, or the CUDA wheels' (the
    nvidia-cuda-runtime and nvidia-cuda-crt wheels a CUDA build of torch brings)."""
    roots = [Path(os.environ[k]) / "include" for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k)]
    roots.append(Path("/usr/local/cuda/include"))
    roots += [cu / "include" for site in _site_dirs() for cu in sorted((site / "nvidia").glob("cu*"), reverse=True)]
    for r in roots:
        if (r / "cuda.h").is_file() and (r / "crt" / "host_defines.h").is_file():
            return r
    raise BuildError("no CUDA toolkit headers (cuda.h): set CUDA_HOME, or pip install nvidia-cuda-runtime "
                     "nvidia-cuda-crt")


def compiler() -> str:
    """The C compiler: $CC, else cc or gcc on PATH."""
    for c in (os.environ.get("CC"), "cc", "gcc"):
        if c and shutil.which(c):
            return c
    raise BuildError("no C compiler (cc or gcc) on PATH")


def cache_dir() -> Path:
    """Where built libraries are kept: $XDG_CACHE_HOME/decodemon or ~/.cache/decodemon."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "decodemon"


def lib_dir(out_dir: Path | None = None) -> Path:
    """The directory in `out_dir` (decodemon's cache by default) that keeps the library built from this source
    against this CUPTI."""
    key = hashlib.sha256(source().read_bytes() + str(cupti_dirs()[1].resolve()).encode()).hexdigest()[:12]
    return Path(out_dir or cache_dir()) / f"cupti-inject-{key}"


def build(out_dir: Path | None = None) -> Path:
    """The built library: the one already in `out_dir` (decodemon's cache by default) for this source and CUPTI,
    else built there now (~1 s). Where that directory, a directory above it or the library could be another
    user's, the library is built in a private directory instead, said once on stderr: the path returned is
    handed to CUDA_INJECTION64_PATH, so it is always one only this user or root could have written. BuildError,
    one line, when it cannot be built."""
    src = source()
    inc, lib = cupti_dirs()
    cuda = cuda_include()
    cc = compiler()
    where = lib_dir(out_dir)
    try:
        found = _cached(where)
        if found is not None:
            return found
        dfd, real = own_files.open_dir(where, create=True)
    except own_files.NotOwn as exc:
        real = _private_dir(exc, where.parent)
        dfd = os.open(real, own_files.DIR_FLAGS)
    try:
        cmd = [cc, "-O2", "-Wall", "-fPIC", "-shared", "-o", "OUT", str(src), f"-I{inc}", f"-I{cuda}", f"-L{lib}",
               "-l:libcupti.so." + _cupti_soname_version(lib), f"-Wl,-rpath,{lib.resolve()}", "-lpthread", "-ldl"]
        _compile(cmd, dfd, real)
        os.close(own_files.open_file(dfd, LIB_NAME, real))  # what CUDA will load: checked as any cached one
    finally:
        os.close(dfd)
    return Path(real) / LIB_NAME


_IMAGE: list = []


def image() -> tuple[bytes, str]:
    """(the library's bytes, "") for an Attach to carry, or (b"", why it cannot be built here, in one line): built
    once a process, then kept."""
    if not _IMAGE:
        try:
            _IMAGE.append((build().read_bytes(), ""))
        except (BuildError, OSError) as exc:
            _IMAGE.append((b"", str(exc)))
    return _IMAGE[0]


def _private_dir(exc: own_files.NotOwn, cache: Path) -> str:
    """A new directory only this user can reach, to build in instead of `cache` (which `exc` refused); said once."""
    try:
        real = own_files.private_dir("decodemon-cupti-")
    except OSError as made:
        raise BuildError(f"{exc.about(cache)}, and {made.strerror}") from None
    atexit.register(shutil.rmtree, real, True)  # read by the program `decodemon run` waits for, then unused
    own_files.say_once(f"decodemon: {exc.about(cache)}: built the CUPTI library in a private directory instead")
    return real


def _cached(where: Path) -> Path | None:
    """The library already built in `where`, if it and every directory above it are only this user's (or
    root's); NotOwn if one is not."""
    try:
        dfd, real = own_files.open_dir(where)
    except FileNotFoundError:
        return None
    try:
        os.close(own_files.open_file(dfd, LIB_NAME, real))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if isinstance(exc, own_files.NotOwn) or exc.errno != errno.ELOOP:
            raise
        raise own_files.NotOwn(os.path.join(real, LIB_NAME), "a link") from None
    finally:
        os.close(dfd)
    return Path(real) / LIB_NAME


def _compile(cmd: list[str], dfd: int, real: str) -> None:
    """Run the compiler (`cmd`, its output "OUT") into a temporary file in the checked directory `dfd`, then
    rename it to the library: an interrupted build leaves nothing behind."""
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=real)
    os.close(fd)
    name = os.path.basename(tmp)
    try:
        r = subprocess.run([tmp if a == "OUT" else a for a in cmd], capture_output=True, text=True, timeout=120,
                           cwd=real)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:200])
            raise BuildError(f"{cmd[0]} failed building the CUPTI injection library: {first}")
        out = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.fchmod(out, 0o755)  # whatever the umask: a group-writable library would not pass its own check
        finally:
            os.close(out)
        os.replace(name, LIB_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass


def _cupti_soname_version(lib: Path) -> str:
    """The major version in libcupti.so.N (the name the wheel ships; it has no unversioned link)."""
    names = sorted(p.name for p in lib.glob("libcupti.so.*"))
    if not names:
        raise BuildError(f"no libcupti.so.N in {lib}")
    return names[0].split("libcupti.so.", 1)[1]
