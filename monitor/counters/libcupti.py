"""Which `libcupti` a process of decodemon's own loads for PM sampling, loaded before anything else can load another.

On an H200 (driver 580.159.04) a PM sampler in a second process armed only with the `nvidia-cuda-cupti` 13.4
wheel's `libcupti.so.13`; with any 13.0 one loaded (torch's bundled `nvidia/cu13/lib`, the CUDA 13.0 toolkit's,
Nsight Compute's) `Collector.configure` failed with ERROR_INVALID_PARAMETER, whatever made the context. All of them
share the soname `libcupti.so.13`, so the first one mapped is the one every later `dlopen("libcupti.so.13")` and
every DT_NEEDED gets. `load_newest()` maps the newest wheel's library by its absolute path first (with its
`libnvperf_*` beside it), and `loaded()` reads back from /proc/self/maps what the process really has.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

MIN_VERSION = (13, 4)  # the oldest nvidia-cuda-cupti whose PM sampling armed from a second process on an H200
COMPANIONS = ("libnvperf_target.so", "libnvperf_host.so")  # the PM libraries CUPTI loads from its own folder


@dataclass(frozen=True)
class CuptiLib:
    """One candidate libcupti: its path and the wheel version it came with ("" if not from a wheel)."""

    path: str
    version: str

    def version_tuple(self) -> tuple[int, ...]:
        """The version as numbers ((0,) when unknown)."""
        out = []
        for part in self.version.split("."):
            if not part.isdigit():
                break
            out.append(int(part))
        return tuple(out) or (0,)

    def describe(self) -> str:
        """`path (nvidia-cuda-cupti X)`, or the path alone."""
        return f"{self.path} (nvidia-cuda-cupti {self.version})" if self.version else self.path


def candidates() -> list[CuptiLib]:
    """Every `nvidia-cuda-cupti` wheel's libcupti on sys.path, newest first."""
    from importlib import metadata

    seen, out = set(), []
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if not name.startswith("nvidia-cuda-cupti"):
            continue
        for f in dist.files or ():
            if f.name.startswith("libcupti.so"):
                p = str(Path(dist.locate_file(f)).resolve())
                if p not in seen and os.path.exists(p):
                    seen.add(p)
                    out.append(CuptiLib(p, dist.version))
    return sorted(out, key=lambda c: c.version_tuple(), reverse=True)


def loaded() -> list[str]:
    """The libcupti files this process has mapped (from /proc/self/maps), in order of first appearance."""
    out: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if "/libcupti.so" in path and path not in out:
                    out.append(path)
    except OSError:
        pass
    return out


# decodemon's GPU parts pin a newer libcupti than an engine's torch does: they live in decodemon's own environment
OWN_ENV_FIX = "decodemon's GPU parts belong in its own environment, not the engine's: " \
              "pipx install 'decodemon[gpu]', or python3 -m venv ~/.decodemon && ~/.decodemon/bin/pip install " \
              "'decodemon[gpu]'"


def load_newest() -> tuple[CuptiLib | None, str]:
    """Map the newest wheel's libcupti (and its nvperf libraries) before cupti-python can pick one: (the library,
    "") on success, else (None or the library that was found, why it is not usable) in one line."""
    already = loaded()
    found = candidates()
    if already:
        mine = next((c for c in found if c.path == os.path.realpath(already[0])), None)
        lib = mine or CuptiLib(already[0], "")
        if lib.version_tuple() < MIN_VERSION:
            return lib, f"{lib.describe()} was loaded before decodemon could choose (PM needs nvidia-cuda-cupti " \
                        f"{'.'.join(map(str, MIN_VERSION))} or newer)"
        return lib, ""
    if not found:
        return None, f"no nvidia-cuda-cupti wheel in decodemon's environment ({OWN_ENV_FIX})"
    best = found[0]
    if best.version_tuple() < MIN_VERSION:
        return best, f"the newest libcupti here is {best.describe()}; PM needs nvidia-cuda-cupti " \
                     f"{'.'.join(map(str, MIN_VERSION))} or newer ({OWN_ENV_FIX})"
    folder = Path(best.path).parent
    try:
        for name in COMPANIONS:
            if (folder / name).exists():
                ctypes.CDLL(str(folder / name), mode=os.RTLD_GLOBAL)
        ctypes.CDLL(best.path, mode=os.RTLD_GLOBAL)
    except OSError as exc:
        return best, f"{best.describe()} did not load: {exc}"
    return best, ""


def check() -> str:
    """Why the libcupti this process has mapped is not the one PM can use ("" if it is): two of one soname, or
    none at all."""
    maps = loaded()
    if not maps:
        return "no libcupti is loaded"
    if len({os.path.realpath(p) for p in maps}) > 1:
        return "two libcupti of one soname are mapped: " + ", ".join(maps)
    return ""
