"""A Python target's traced windows come from decodemon's C library (probes/native_tracer.py), loaded from the
bytes an Attach carries, with nothing of the target's environment: checked on CPU against a stand-in libcupti
that hands the library's buffer callbacks real CUPTI activity records (laid out by CUPTI's own headers), and whose
calls take 0.2 s each, so that a thread left holding the GIL would show."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# the stand-in: each window's flush hands back 3 kernels (the last from a CUDA graph), 2 runtime calls (a launch,
# and a graph launch), a copy and a memset; every call is slow. As in CUPTI, a kernel record's name points into
# the stand-in's own memory, which its finalize unmaps: a name read after the finalize is a segfault here, as it
# was on an H100. Every CUPTI call made after a finalize (it would start CUPTI again) is counted
_STUB = r"""
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static CUpti_BuffersCallbackRequestFunc req;
static CUpti_BuffersCallbackCompleteFunc done;
static int enabled[64], runtime_off[1024], finalized, flushes, after_finalize;
static char *name_page;
#define AFTER if (finalized) after_finalize++
static unsigned long long clock_ns = 4000; /* the window opens at 5000: the kernels fall in its first token */
#define SLOW usleep(SLOW_US)
CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r, CUpti_BuffersCallbackCompleteFunc d)
{ SLOW; req = r; done = d; finalized = 0;
  name_page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  strcpy(name_page, "gemv_kernel"); strcpy(name_page + 64, "rms_norm"); strcpy(name_page + 128, "flash_decode");
  return CUPTI_SUCCESS; }
CUptiResult cuptiActivityEnable(CUpti_ActivityKind k) { enabled[k] = 1; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityDisable(CUpti_ActivityKind k) { enabled[k] = 0; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId c, uint8_t on) { if (c < 1024) runtime_off[c] = !on;
                                                                          return CUPTI_SUCCESS; }
CUptiResult cuptiGetTimestamp(uint64_t *t) { AFTER; *t = (clock_ns += 1000); return CUPTI_SUCCESS; }
CUptiResult cuptiFinalize(void) { SLOW; finalized = 1; munmap(name_page, 4096); name_page = NULL;
                                  return CUPTI_SUCCESS; }
CUptiResult cuptiGetVersion(uint32_t *v) { *v = 130400; return CUPTI_SUCCESS; }
CUptiResult cuptiGetResultString(CUptiResult r, const char **s) { *s = "stub"; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext c, uint32_t s, size_t *n) { AFTER; *n = 0;
                                                                                  return CUPTI_SUCCESS; }
CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain d, uint32_t cbid, const char **name) {
    AFTER;
    if (cbid == 211) { *name = "cudaLaunchKernel_v7000"; return CUPTI_SUCCESS; }
    if (cbid == 5) { *name = "cudaGetDevice_v3020"; return CUPTI_SUCCESS; }
    if (cbid == 311) { *name = "cudaGraphLaunch_v10000"; return CUPTI_SUCCESS; }
    if (cbid < 600) { *name = "cudaSomethingElse_v1"; return CUPTI_SUCCESS; }
    return CUPTI_ERROR_INVALID_PARAMETER;
}
#define SLOT 512
CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **rec) {
    AFTER;
    uint8_t *next = *rec ? (uint8_t *)*rec + SLOT : buf;
    if (next + SLOT > buf + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *rec = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}
CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    SLOW;
    AFTER;
    if (flushes++ % 2) return CUPTI_SUCCESS;  /* every other flush finds nothing new */
    uint8_t *b; size_t size, max;
    req(&b, &size, &max);
    memset(b, 0, 7 * SLOT);
    for (int i = 0; i < 3; i++) {
        CUpti_ActivityKernel13 *k = (CUpti_ActivityKernel13 *)(b + i * SLOT);
        k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k->start = 5000 + 100 * i; k->end = k->start + 40 + i; k->gridX = 66 * (i + 1); k->gridY = 1; k->gridZ = 1;
        k->blockX = 128; k->blockY = 1; k->blockZ = 1; k->registersPerThread = 32 + i; k->staticSharedMemory = 16;
        k->dynamicSharedMemory = 1024 * i; k->streamId = 7; k->correlationId = 100 + i; k->name = name_page + 64 * i;
        k->graphId = i == 2 ? 9 : 0; k->graphNodeId = i == 2 ? 0xFFFFFFFFFFFFFFF0ull : 0;
    }
    CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)(b + 3 * SLOT);
    a->kind = CUPTI_ACTIVITY_KIND_RUNTIME; a->cbid = 211; a->start = 4900; a->end = 4950; a->correlationId = 100;
    a = (CUpti_ActivityAPI *)(b + 4 * SLOT);
    a->kind = CUPTI_ACTIVITY_KIND_RUNTIME; a->cbid = 311; a->start = 4960; a->end = 4990; a->correlationId = 102;
    CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)(b + 5 * SLOT);
    m->kind = CUPTI_ACTIVITY_KIND_MEMCPY; m->start = 6000; m->end = 6100; m->bytes = 4096; m->copyKind = 1;
    CUpti_ActivityMemset4 *s = (CUpti_ActivityMemset4 *)(b + 6 * SLOT);
    s->kind = CUPTI_ACTIVITY_KIND_MEMSET; s->start = 6200; s->end = 6210; s->bytes = 512;
    done(NULL, 0, b, size, 7 * SLOT);
    return CUPTI_SUCCESS;
}
int stub_state(int *en, int *rt_off_5, int *rt_off_211, int *after) {
    for (int i = 0; i < 64; i++) en[i] = enabled[i];
    *rt_off_5 = runtime_off[5]; *rt_off_211 = runtime_off[211]; *after = after_finalize;
    return finalized;
}
"""

# runs in a child (a bare interpreter with decodemon's folder mapped in, as the agent's target would be): loads the
# library from its bytes while another thread spins, then one window open to close, each step timed against the
# spins the other thread made meanwhile
_CHILD = r"""
import ctypes, json, sys, threading, time
stub = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)   # as a process that already loaded its libcupti
image = open(sys.argv[3], "rb").read()
from decodemon.probes import native_tracer as nt
from decodemon.probes import frames
spins = [0]; stop = []
def spin():
    while not stop: spins[0] += 1
threading.Thread(target=spin, daemon=True).start()
time.sleep(0.05)
out = {"modules": sorted(m for m in ("numpy", "msgspec", "cupti") if m in sys.modules)}
def timed(name, fn):
    s0, t0 = spins[0], time.perf_counter(); r = fn(); out[name] = [round(time.perf_counter() - t0, 3), spins[0] - s0]
    return r
lib = timed("load", lambda: nt.load(image))
assert nt.load(image) is lib  # once a process
tr = nt.NativeTracer(lib)
timed("prepare", tr.prepare)
tr.with_apis = True
tr.open(); tr.boundary(); tr.close()
timed("flush", tr.flush)
timed("detach", tr.detach)
en = (ctypes.c_int * 64)(); off5 = ctypes.c_int(); off211 = ctypes.c_int(); after = ctypes.c_int()
w = tr.collect(7, guard_tokens=1)  # on the agent thread, after the decode thread's finalize
out["finalized"] = stub.stub_state(en, ctypes.byref(off5), ctypes.byref(off211), ctypes.byref(after))
out["enabled_after"] = [i for i in range(64) if en[i]]
out["runtime_off"] = {"cudaGetDevice": off5.value, "cudaLaunchKernel": off211.value}
out["cupti_calls_after_finalize"] = after.value
out["needs_guard"] = tr.needs_guard
sys.stdout.buffer.write(json.dumps(out).encode() + b"\n" + frames.encode(w))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(stub libcupti, decodemon's library linked to it) built here; skipped without a compiler or CUPTI's headers."""
    from decodemon.monitor.inject import cupti_lib

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    try:
        inc, _ = cupti_lib.cupti_dirs()
        cuda = cupti_lib.cuda_include()
    except cupti_lib.BuildError as exc:
        pytest.skip(str(exc))
    d = tmp_path_factory.mktemp("native")
    (d / "stub.c").write_text(_STUB)
    stub = d / "libcupti.so.13"
    subprocess.run([cc, "-O1", "-fPIC", "-shared", "-DSLOW_US=200000", "-o", str(stub), str(d / "stub.c"),
                    f"-I{inc}", f"-I{cuda}"], check=True)
    lib = d / "libdecodemon_cupti.so"
    subprocess.run([cc, "-O2", "-fPIC", "-shared", "-o", str(lib), str(cupti_lib.source()), f"-I{inc}", f"-I{cuda}",
                    f"-L{d}", "-l:libcupti.so.13", "-lpthread", "-ldl"], check=True)
    return stub, lib


def _run_window(built, tmp_path):
    stub, lib = built
    pkg_parent = Path(__file__).resolve().parents[1]
    # the target: -I (no site-packages, no cwd), decodemon's folder mapped as the package, as an attach maps it
    boot = (f"import sys, types; p = types.ModuleType('decodemon'); p.__path__ = [{str(pkg_parent)!r}]; "
            "sys.modules['decodemon'] = p; exec(open(sys.argv[1]).read())")
    (tmp_path / "child.py").write_text(_CHILD)
    r = subprocess.run([sys.executable, "-I", "-c", boot, str(tmp_path / "child.py"), str(stub), str(lib)],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    head, _, frame = r.stdout.partition(b"\n")
    return json.loads(head), frame


def test_a_window_from_the_c_library_reads_as_the_monitor_reads_any_window(built, tmp_path):
    from decodemon.monitor.analysis.window import window_metrics
    from decodemon.probes import wire

    out, payload = _run_window(built, tmp_path)
    assert out["modules"] == []  # the target imported neither numpy, msgspec nor cupti-python
    w = wire.decode_frame(payload)
    assert isinstance(w, wire.KernelWindow)
    k = {c: w.kernels[c].array().tolist() for c in w.kernels}
    assert [w.names[i] for i in k["name"]] == ["gemv_kernel", "rms_norm", "flash_decode"]
    assert k["start"] == [5000, 5100, 5200] and k["end"] == [5040, 5141, 5242]
    assert k["grid_x"] == [66, 132, 198] and k["regs"] == [32, 33, 34] and k["smem_dynamic"] == [0, 1024, 2048]
    assert k["correlation"] == [100, 101, 102] and k["graph_id"] == [0, 0, 9]
    assert k["graph_node_id"][2] == -16  # a uint64 past int64, as its int64 view
    apis = {c: w.apis[c].array().tolist() for c in w.apis}
    assert apis["cbid"] == [211, 311] and apis["correlation"] == [100, 102] and apis["domain"] == [0, 0]
    assert w.api_names == {"0:211": "cudaLaunchKernel_v7000", "0:311": "cudaGraphLaunch_v10000"}
    cps = {c: w.memcpys[c].array().tolist() for c in w.memcpys}
    assert cps == {"start": [6000, 6200], "end": [6100, 6210], "bytes": [4096, 512], "copy_kind": [1, -1]}
    assert (w.window_id, w.tokens, w.guard_tokens, w.apis_traced) == (7, 1, 1, True)
    assert len(w.token_bounds_ns.array()) == 3
    assert out["needs_guard"] is True  # a graph kernel: the next window keeps its guard token
    m = window_metrics(w, sm_count=132)
    assert m.kernels_per_token == 3


def test_the_window_leaves_cupti_as_it_found_it_and_filters_runtime_calls(built, tmp_path):
    out, _ = _run_window(built, tmp_path)
    assert out["finalized"] == 1 and out["enabled_after"] == []
    assert out["cupti_calls_after_finalize"] == 0  # the take read its own copies: CUPTI was not started again
    assert out["runtime_off"] == {"cudaGetDevice": 1, "cudaLaunchKernel": 0}


def test_the_library_and_cuptis_slow_calls_run_without_the_gil(built, tmp_path):
    """CUPTI's start-up, the flush and the finalize each took 0.2 s in the stand-in: the other thread kept running
    Python through each (a call that held the GIL would leave it a handful of switch-interval turns at most)."""
    out, _ = _run_window(built, tmp_path)
    for step in ("prepare", "flush", "detach"):
        took, spins = out[step]
        assert took >= 0.19, (step, out)
        assert spins > 20_000, (step, out)


def test_an_attach_without_the_library_says_why():
    from decodemon.probes import frames, server

    status: dict = {}
    assert server.Agent._arm_trace(frames.Attach(), status) is None
    assert status["trace"] == "unavailable" and status["trace_reason"] == "no_library"
    status = {}
    assert server.Agent._arm_trace(frames.Attach(cupti_library=b"\x7fELF not a library"), status) is None
    assert status["trace_reason"] == "library" and status["trace_error"]


def test_the_attach_carries_the_library_and_an_agent_reads_it_back():
    from decodemon.probes import frames, wire

    image = bytes(range(256)) * 200
    a = wire.decode_control(wire.pack(wire.Attach(cupti_library=image))[4:])
    assert a.cupti_library == image
    assert frames.attach_problem(frames.Attach(cupti_library=b"x" * (frames.MAX_LIBRARY_BYTES + 1)))


def test_the_monitor_puts_its_library_in_the_attach_or_says_why_not(monkeypatch):
    from decodemon.monitor.sources import live
    from decodemon.monitor.inject import cupti_lib
    from decodemon.probes import wire

    monkeypatch.setattr(cupti_lib, "_IMAGE", [(b"", "no C compiler (cc or gcc) on PATH")])
    a, why = live._with_library(wire.Attach())
    assert a.cupti_library == b"" and "no C compiler" in why
    monkeypatch.setattr(cupti_lib, "_IMAGE", [(b"\x7fELF...", "")])
    a, why = live._with_library(wire.Attach())
    assert a.cupti_library == b"\x7fELF..." and why == ""
    a, why = live._with_library(wire.Attach(trace=False))  # no windows asked for: nothing built or sent
    assert a.cupti_library == b"" and why == ""
