"""decodemon's CUPTI injection library (probes/cupti_inject/decodemon_cupti.c): found, or built once with the C
compiler, for `decodemon run` to load into a process with no Python (llama-server) through CUDA_INJECTION64_PATH.

The build needs a C compiler, CUPTI's headers and library (the nvidia-cuda-cupti wheel, decodemon's `gpu`
extra) and CUDA's driver header, cuda.h (CUDA_HOME, /usr/local/cuda, or the CUDA wheels). The
library lands in decodemon's cache under the source's hash, written whole (a temporary file renamed), so an edit
of the source builds anew and an interrupted build leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

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


def build(out_dir: Path | None = None) -> Path:
    """The built library: the one already in `out_dir` (decodemon's cache by default) for this source and CUPTI,
    else built there now (~1 s). BuildError, one line, when it cannot be."""
    src = source()
    inc, lib = cupti_dirs()
    cuda = cuda_include()
    cc = compiler()
    key = hashlib.sha256(src.read_bytes() + str(lib.resolve()).encode()).hexdigest()[:12]
    out = Path(out_dir or cache_dir()) / f"cupti-inject-{key}" / LIB_NAME
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cc, "-O2", "-Wall", "-fPIC", "-shared", "-o", tmp, str(src), f"-I{inc}", f"-I{cuda}", f"-L{lib}",
           "-l:libcupti.so." + _cupti_soname_version(lib), f"-Wl,-rpath,{lib.resolve()}", "-lpthread", "-ldl"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:200])
            raise BuildError(f"{cc} failed building the CUPTI injection library: {first}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _cupti_soname_version(lib: Path) -> str:
    """The major version in libcupti.so.N (the name the wheel ships; it has no unversioned link)."""
    names = sorted(p.name for p in lib.glob("libcupti.so.*"))
    if not names:
        raise BuildError(f"no libcupti.so.N in {lib}")
    return names[0].split("libcupti.so.", 1)[1]
