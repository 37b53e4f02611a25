"""The fields of an `attach --json` that say whether decodemon's CUPTI library traced the windows of a Python target:
the probe's trace status, the windows, kernels and launches per token, and the agent's CPU.

    python benchmarks/native_smoke.py ATTACH.json
"""

import json
import sys


def main(path: str) -> int:
    try:
        d = json.load(open(path))
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}")
        return 1
    flat = {}

    def walk(x, pre=""):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{pre}{k}.")
        else:
            flat[pre[:-1]] = x

    walk(d)
    keys = ("trace", "trace_reason", "trace_error", "windows", "kernels_per_token", "kernel_launch_calls_per_token",
            "graph_launches_per_token", "traced_token_ms", "ms_per_token", "agent_cpu_ms_per_s", "verdict")
    for k, v in flat.items():
        if k.split(".")[-1] in keys:
            print(f"{k} = {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
