"""Do cupti-python's activity records outlive the buffer callback and CUPTI's finalize? (H200)

    bash scripts/h200.sh scripts/h200_record_lifetime.py OUTDIR [--windows 6]

The tracer reads the records' fields on the agent thread after the window (collect), not inside the buffer
callback on the decode thread. That is only safe if the record objects cupti-python hands the callback own their
data (`from_ptr` without an owner copies it). Here: the eager demo model decodes; each window traces one token with
a callback that reads every field at once (the reference) and also keeps the objects; after close, flush and
finalize, 64 MB of fresh allocations are written over freed memory, then the kept objects are read again and
compared field by field with the reference, kernel names as text. Also reports how far apart consecutive records'
`ptr` lie (a view into CUPTI's buffer would put them one record size apart). Writes OUTDIR/record_lifetime.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _child import device_header, run_child_json  # scripts/ is on sys.path when this runs as a script

CHILD = r'''
import json, sys
import torch
from decodemon.engine_adapter.model import SHAPES, DecodeModel
from decodemon.probes.tracer import WindowTracer
windows = int(sys.argv[1])
m = DecodeModel(SHAPES["qwen3-0.6b"], "cuda", torch.bfloat16, 512, seed=0)
m.reset()
for _ in range(20): m.step().item()
def fields(acts):
    tr = object.__new__(WindowTracer)
    tr._names = {}
    tr._k_kernel, tr._k_runtime, tr._k_driver = 10, 5, 6
    from cupti import cupti as c
    K = c.ActivityKind
    tr._k_kernel, tr._k_runtime, tr._k_driver = int(K.CONCURRENT_KERNEL), int(K.RUNTIME), int(K.DRIVER)
    tr._k_memcpy, tr._k_memset, tr._k_sync = int(K.MEMCPY), int(K.MEMSET), int(K.SYNCHRONIZATION)
    tr._reset()
    WindowTracer._read(tr, acts)
    # the kernel names themselves, not only their indices: a record's name is a pointer into CUPTI's memory
    return tr._kernels + tr._apis + tr._memcpys + tr._syncs + [tuple(sorted(tr._names, key=tr._names.get))]
out = {"windows": []}
for w in range(windows):
    tr = WindowTracer()
    kept, ref = [], []
    def cb(acts, kept=kept, ref=ref):
        kept.append(acts); ref.append(fields(acts))
    tr._completed = cb
    tr.open(); m.step().item(); tr.close(); tr.flush(); tr.detach()
    junk = [bytearray(b"\xa5" * (8 << 20)) for _ in range(8)]
    for _ in range(5): m.step().item()
    again = [fields(a) for a in kept]
    n = sum(len(a) for a in kept)
    ptrs = [int(x.ptr) for a in kept for x in a[:50]]
    gaps = sorted({b - a for a, b in zip(ptrs, ptrs[1:])})[:8]
    names = ref[0][-1] if ref else ()
    out["windows"].append({"records": n, "same_after_finalize": again == ref, "kernel_names": len(names),
                           "a_name": names[0][:60] if names else "",
                           "first_ptr_gaps": gaps, "types": sorted({type(x).__name__ for a in kept for x in a})})
    del junk
out["survived"] = True
print(json.dumps(out))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--windows", type=int, default=6)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = device_header(f"bash scripts/h200.sh scripts/h200_record_lifetime.py OUT --windows {a.windows}")
    res.update(run_child_json(CHILD, [str(a.windows)], 300))
    print(json.dumps(res), flush=True)
    (out / "record_lifetime.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
