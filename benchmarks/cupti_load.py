"""What loading cupti-python costs an eager loop that is already decoding, step by step, read on its own tokens.

    python benchmarks/cupti_load.py [--plain]

An eager loop (28 layers of small bf16 matmuls and elementwise kernels, a `.item()` a token) runs on the main
thread; 3 s in, a second thread loads cupti-python as the agent does on a first attach (probes/preload.py): the
package's modules loaded with the GIL given up, the paced import, then CUPTI's first start-up
(`activity_register_callbacks`) and one kernel activity enable. `--plain` imports cupti-python directly instead.
Prints each step's time and every token over 2x the median with the steps it overlapped. Needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plain", action="store_true", help="`from cupti import cupti` with nothing loaded first")
    a = ap.parse_args()
    import torch

    from decodemon.probes import preload

    if not torch.cuda.is_available():
        print("cupti_load.py needs a GPU", file=sys.stderr)
        return 2
    layers, d = 28, 1024
    ws = [torch.randn(d, d, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers * 3)]
    x = torch.randn(1, d, device="cuda", dtype=torch.bfloat16)
    F = torch.nn.functional

    def token() -> float:
        h = x
        for i in range(layers):
            h = h + (F.silu(h @ ws[3 * i]) @ ws[3 * i + 1]) * 0.5
            h = F.layer_norm(h, (d,))
            h = h + torch.tanh(h @ ws[3 * i + 2])
        return h.sum().item()

    ends: list[float] = []
    steps: list[tuple[str, float, float]] = []
    done = threading.Event()

    def step(name, fn):
        t0 = time.time()
        out = fn()
        steps.append((name, t0, time.time()))
        time.sleep(0.5)
        return out

    def load() -> None:
        time.sleep(3)
        if a.plain:
            step("from cupti import cupti", lambda: __import__("cupti.cupti"))
        else:
            sos = preload.cupti_package_libraries()
            step(f"{len(sos)} package modules, GIL given up", lambda: [preload.load_without_gil(s) for s in sos])

            def paced() -> None:
                with preload.PacedImports():
                    from cupti import cupti  # noqa: F401
            step(f"paced import (ratio {preload.SLEEP_RATIO:g})", paced)
        from cupti import cupti as c

        step("CUPTI start-up (register callbacks)", lambda: c.activity_register_callbacks(lambda: (8 << 20, 0),
                                                                                         lambda acts: None))
        step("kernel activity enable", lambda: c.activity_enable(c.ActivityKind.CONCURRENT_KERNEL))
        step("disable", lambda: c.activity_disable(c.ActivityKind.CONCURRENT_KERNEL))
        done.set()

    threading.Thread(target=load, daemon=True).start()
    t_end = time.time() + 60
    while time.time() < t_end and not done.is_set():
        token()
        ends.append(time.time())
    dts = [1e3 * (b - a_) for a_, b in zip(ends, ends[1:])]
    med = statistics.median(dts[:300])
    t0 = ends[0]
    print(f"median token {med:.2f} ms over {len(dts)} tokens ({'plain import' if a.plain else 'preload.py'})")
    for name, s, e in steps:
        print(f"  {s - t0:7.3f} s  {1e3 * (e - s):8.2f} ms  {name}")
    for i, dt in enumerate(dts):
        if dt > 2 * med:
            s, e = ends[i], ends[i + 1]
            print(f"  slow token at {s - t0:7.3f} s: {dt:7.2f} ms ({dt / med:.1f}x) during "
                  f"{[n for n, a_, b in steps if a_ < e and b > s]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
