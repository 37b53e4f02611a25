"""The device's copy bandwidth, measured: the bandwidth floor's denominator, never a spec sheet's.

`python -m decodemon.monitor.counters.copy_bandwidth [--device N] [--json]` times device-to-device copies of 1 GiB with
CUDA events through the driver API (ctypes on libcuda: no torch, no CUDA runtime) and counts read + write
bytes, as a decode step's weight reads are counted against it. It runs in its own process, outside the decode
loop, once per device and driver: the figure is cached under the user's cache directory keyed by the GPU's
UUID and the driver version, and read back only from a cache no other user can write (probes/own_files.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

from decodemon.probes import own_files

COPY_BYTES = 1 << 30
ITERS = 10


class CudaError(RuntimeError):
    """A driver call failed, or there is no driver; str() is one line."""


def _driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaError(f"no CUDA driver ({exc})") from None

    def call(name, *args):
        rc = getattr(lib, name)(*args)
        if rc != 0:
            raise CudaError(f"{name} failed with CUDA error {rc}")

    return lib, call


def measure_gbs(device: int = 0, nbytes: int = COPY_BYTES, iters: int = ITERS) -> dict:
    """Time `iters` device-to-device copies of `nbytes`; GB/s with read and write counted."""
    lib, call = _driver()
    call("cuInit", 0)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    call("cuDeviceGet", ctypes.byref(dev), device)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    src, dst = ctypes.c_uint64(), ctypes.c_uint64()
    call("cuMemAlloc_v2", ctypes.byref(src), ctypes.c_size_t(nbytes))
    call("cuMemAlloc_v2", ctypes.byref(dst), ctypes.c_size_t(nbytes))
    e0, e1 = ctypes.c_void_p(), ctypes.c_void_p()
    call("cuEventCreate", ctypes.byref(e0), 0)
    call("cuEventCreate", ctypes.byref(e1), 0)
    best = None
    try:
        call("cuMemcpyDtoD_v2", dst, src, ctypes.c_size_t(nbytes))  # warm
        for _ in range(3):  # the best of three: another process on the GPU only ever slows a trial
            call("cuEventRecord", e0, None)
            for _ in range(iters):
                call("cuMemcpyDtoD_v2", dst, src, ctypes.c_size_t(nbytes))
            call("cuEventRecord", e1, None)
            call("cuEventSynchronize", e1)
            ms = ctypes.c_float()
            call("cuEventElapsedTime", ctypes.byref(ms), e0, e1)
            best = ms.value if best is None else min(best, ms.value)
    finally:
        lib.cuMemFree_v2(src)
        lib.cuMemFree_v2(dst)
        lib.cuDevicePrimaryCtxRelease(dev)
    gbs = 2 * nbytes * iters / (best * 1e-3) / 1e9
    return {"copy_gbs": round(gbs, 1), "bytes": nbytes, "iters": iters, "ms": round(best, 3),
            "device": device, "measured_unix_s": time.time()}


def cache_path() -> Path:
    """Where measured figures are kept (one JSON object, keyed by GPU UUID and driver)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "decodemon" / "copy_bandwidth.json"


def _refused(exc: own_files.NotOwn) -> None:
    own_files.say_once(f"decodemon: {exc.about(cache_path().parent)}: the copy bandwidth is neither read from it "
                       "nor kept in it (measured anew where there is a GPU)")


def _table(raw: bytes | None) -> dict:
    try:
        table = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return table if isinstance(table, dict) else {}


def cached_gbs(uuid: str, driver: str) -> float | None:
    """The cached figure for this GPU and driver, if one was measured and the cache is only this user's (or
    root's): another user's file could set the floor's denominator to anything."""
    try:
        entry = _table(own_files.read_file(cache_path())).get(f"{uuid}|{driver}")
    except own_files.NotOwn as exc:
        _refused(exc)
        return None
    except OSError:
        return None
    try:
        return float(entry["copy_gbs"]) if isinstance(entry, dict) and "copy_gbs" in entry else None
    except (TypeError, ValueError):
        return None


def store(uuid: str, driver: str, result: dict) -> None:
    """Add one figure to the cache, through checked directories only; written whole (a temporary file renamed)."""
    p = cache_path()
    try:
        dfd, real = own_files.open_dir(p.parent, create=True)
    except own_files.NotOwn as exc:
        _refused(exc)
        return
    except OSError:  # no cache to keep it in (a read-only home): the figure is measured again next time
        return
    try:
        try:
            fd = own_files.open_file(dfd, p.name, real)
            with os.fdopen(fd, "rb") as fh:
                table = _table(fh.read())
        except OSError:  # none yet, or one this user did not write (a link, another's file): replaced whole
            table = {}
        old = table.get(f"{uuid}|{driver}")
        if isinstance(old, dict) and float(old.get("copy_gbs") or 0) > float(result.get("copy_gbs") or 0):
            return  # a busier GPU measured less: the cache keeps the best figure
        table[f"{uuid}|{driver}"] = result
        own_files.write_file(dfd, p.name, json.dumps(table, indent=1).encode())
    except OSError:  # a full disk: the figure is measured again next time
        pass
    finally:
        os.close(dfd)


def main(argv: list[str] | None = None) -> int:
    """Measure and print (with --uuid U --driver D: the cached figure if there is one, else measure and cache);
    exit 2 with one line when there is no GPU."""
    argv = sys.argv[1:] if argv is None else argv

    def opt(name, default=None):
        return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default

    device, uuid, driver = int(opt("--device", 0)), opt("--uuid"), opt("--driver")
    hit = cached_gbs(uuid, driver) if uuid and driver else None
    try:
        r = {"copy_gbs": hit, "cached": True} if hit is not None else measure_gbs(device)
    except CudaError as exc:
        print(f"decodemon copy bandwidth: {exc}", file=sys.stderr)
        return 2
    if hit is None and uuid and driver:
        store(uuid, driver, r)
    print(json.dumps(r) if "--json" in argv else f"{r['copy_gbs']:.1f} GB/s (read + write, 1 GiB copies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
