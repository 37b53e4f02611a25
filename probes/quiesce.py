"""Flush and finalize CUPTI with no kernel in flight, for windows traced by time on the agent thread.

A flush from another thread while CUDA graphs kept replaying, followed by a finalize, ended in `unspecified
launch failure` on an H200. A window by time has no token boundary to finalize at, so the agent thread makes
one: it keeps the GIL (ctypes' PyDLL and PYFUNCTYPE calls do not give it up), so a decode thread running
Python can launch nothing more; it waits for the GPU to finish what was enqueued (`cuCtxSynchronize`, twice: a
launch already inside a GIL-free call when the first wait began lands before the second); then it flushes and
finalizes. The decode thread waits for that long (the GPU's backlog, ~0.1 s for a host ~200 graph replays
ahead), once a window.
"""

from __future__ import annotations

import ctypes

_NOARG = ctypes.PYFUNCTYPE(ctypes.c_int)
_FLAG = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_uint32)


class Quiesce:
    """The held calls; `available` is False where libcuda or cupti-python's function pointers are missing."""

    def __init__(self, device: int) -> None:
        self.device, self.cuda, self.flush_all, self.finalize = device, None, None, None
        try:
            self.cuda = ctypes.PyDLL("libcuda.so.1")
            from cupti._internal import cupti as _internal  # noqa: PLC0415 - only with a tracer

            ptrs = _internal._inspect_function_pointers()
            if ptrs.get("__cuptiActivityFlushAll") and ptrs.get("__cuptiFinalize"):
                self.flush_all = _FLAG(ptrs["__cuptiActivityFlushAll"])
                self.finalize = _NOARG(ptrs["__cuptiFinalize"])
        except Exception:
            self.cuda = None

    @property
    def available(self) -> bool:
        """Whether every call can keep the GIL."""
        return self.cuda is not None and self.finalize is not None

    def _context(self) -> bool:
        ctx = ctypes.c_void_p()
        if self.cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
            return True
        dev = ctypes.c_int()
        if self.cuda.cuDeviceGet(ctypes.byref(dev), self.device) != 0:
            return False
        if self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
            return False
        return self.cuda.cuCtxSetCurrent(ctx) == 0

    def flush_and_finalize(self) -> None:
        """Wait for the GPU, flush every record, finalize: all without giving the GIL up."""
        if not self._context():
            raise RuntimeError("no CUDA context on the agent thread")
        for _ in range(2):
            rc = self.cuda.cuCtxSynchronize()
            if rc != 0:
                raise RuntimeError(f"cuCtxSynchronize failed with CUDA error {rc}")
        rc = self.flush_all(1)
        if rc != 0:
            raise RuntimeError(f"cuptiActivityFlushAll: CUPTI error {rc}")
        rc = self.finalize()
        if rc != 0:
            raise RuntimeError(f"cuptiFinalize: CUPTI error {rc}")
