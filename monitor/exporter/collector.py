"""The gauges of watched processes' snapshots, made at each scrape (a custom `prometheus_client` collector).

A scrape reads snapshots already taken: it touches neither an agent's socket nor the analysis.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable

from decodemon.monitor.render.json import host_launch_calls
from decodemon.monitor.rolling import headline
from decodemon.monitor.safe_text import visible
from decodemon.probes import wire

LABELS = ("pid", "engine", "gpu")
VERDICTS = ("bandwidth", "comm", "launch", "occupancy", "unknown")


def _ratio(pct):
    return None if pct is None else pct / 100.0


def _pm(key):
    return lambda s: _ratio(s.pm.get(key)) if s.pm else None


# (name, help, value from a Snapshot or None when not measured)
GAUGES = (
    ("decodemon_seconds_per_token", "Median time per token on the engine's clock (a batched engine: per step, "
     "decodemon_tokens_per_step tokens in it).",
     lambda s: s.tokens.ms_per_token / 1e3 if s.tokens else None),
    ("decodemon_tokens_per_second", "Tokens per second over the mean token (a batched engine: every sequence's "
     "tokens, all steps together).",
     lambda s: s.throughput_tokens_per_s if s.tokens_per_step is not None else
     (s.tokens.tokens_per_s if s.tokens else None)),
    ("decodemon_tokens_per_step", "A batched engine's tokens per step (one per sequence in it).",
     lambda s: s.tokens_per_step),
    ("decodemon_kernels_per_token", "Kernels per token in the latest traced window, however launched.",
     lambda s: s.window.kernels_per_token if s.window else None),
    ("decodemon_host_launch_calls_per_token", "The host's launch calls per token (kernel launch calls, runtime and "
     "driver, plus graph launches) in the latest traced window.",
     host_launch_calls),
    ("decodemon_gpu_busy_ratio", "Fraction of the time the GPU ran work (PM counters, else traced kernels).",
     lambda s: _ratio(s.gpu_busy_pct)),
    ("decodemon_sm_active_ratio", "Fraction of cycles the SMs were active (PM counters).", _pm("sm_active_pct")),
    ("decodemon_dram_ratio", "DRAM throughput as a fraction of its peak (PM counters).", _pm("dram_pct")),
    ("decodemon_bytes_per_token", "Bytes a token moves: the DRAM counters' read + write over the tokens counted "
     "where PM measured them, else the model's weights plus the KV cache touched (a batched engine: a step's "
     "over the tokens in it, as --json's bytes_per_token).",
     lambda s: s.bytes_per_token / s.tokens_per_step if s.bytes_per_token and s.tokens_per_step
     else s.bytes_per_token),
    ("decodemon_probe_cost_ratio", "Share of the loop's time the traced windows cost the decode thread.",
     lambda s: _ratio((s.observer or {}).get("share_of_loop_pct"))),
)


def target_labels(hello: wire.Hello | None, pid: int) -> dict:
    """pid, engine and gpu labels of a watched process, from the agent's hello."""
    engine = Path(hello.argv[0]).name if hello and hello.argv else ""
    gpu = str(hello.gpu.index) if hello and hello.gpu else ""
    return {"pid": str(pid), "engine": engine, "gpu": gpu}


@dataclasses.dataclass(frozen=True)
class Currency:
    """What a scrape says of a watch besides its snapshot."""

    up: bool  # the snapshot is of the attach the watch holds now (not held from before another monitor's)
    age_s: float  # seconds since the snapshot was taken
    tokens_estimated: int = 0  # of the snapshot's tokens_total, those estimated for the moments no monitor had the agent


def _add(family, label_values: list, value: float) -> None:
    """One sample, its label values escaped (visible()): prometheus_client escapes quotes, backslashes and line
    breaks, not ESC, and a target's program or model name would reach the terminal of whoever curls /metrics."""
    family.add_metric([visible(v) for v in label_values], value)


def metric_families(targets: Iterable[tuple]) -> list:
    """The gauges of every (labels, Snapshot) or (labels, Snapshot, Currency): one family per metric, one sample
    per process."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    given = list(targets)
    targets = [(t[0], t[1]) for t in given]
    currency = [(t[0], t[2]) for t in given if len(t) > 2 and t[2] is not None]
    out = []
    for name, doc, value in GAUGES:
        fam = GaugeMetricFamily(name, doc, labels=LABELS)
        for labels, snap in targets:
            v = value(snap)
            if v is not None:
                _add(fam, [labels[k] for k in LABELS], float(v))
        out.append(fam)
    tokens = CounterMetricFamily("decodemon_tokens", "Tokens made since the process was first watched: counted while "
                                 "watched, by the agent's count while another monitor had it, estimated while none "
                                 "had it; never decreases.", labels=LABELS)
    ceiling = GaugeMetricFamily("decodemon_ceiling_value", "Each ceiling's number, in the unit its label names.",
                                labels=LABELS + ("ceiling", "unit"))
    verdict = GaugeMetricFamily("decodemon_verdict", "1 for the binding ceiling (the rolling verdict), else 0.",
                                labels=LABELS + ("ceiling",))
    info = GaugeMetricFamily("decodemon_model_info", "The model the engine reported (value 1).",
                             labels=LABELS + ("model", "dtype", "tp_degree"))
    for labels, snap in targets:
        lv = [labels[k] for k in LABELS]
        _add(tokens, lv, float(snap.tokens_total))
        for c_name, c in snap.diagnosis.candidates.items():
            if c.value is not None:
                _add(ceiling, lv + [c_name, c.unit], float(c.value))
        for v_name in VERDICTS:
            _add(verdict, lv + [v_name], 1.0 if headline(snap.diagnosis, snap.rolling)[0] == v_name else 0.0)
        if snap.model is not None:
            _add(info, lv + [snap.model.name, snap.model.dtype, str(snap.model.tp_degree)], 1.0)
    out += [tokens, ceiling, verdict, info]
    if currency:
        estimated = CounterMetricFamily("decodemon_tokens_estimated", "Of decodemon_tokens_total, the tokens made "
                                        "while no monitor had the agent: estimated, not counted.", labels=LABELS)
        up = GaugeMetricFamily("decodemon_watch_up", "1 while the series are current, 0 while they hold their last "
                               "values (another monitor has the agent, or the watch ended).", labels=LABELS)
        age = GaugeMetricFamily("decodemon_snapshot_age_seconds", "Seconds since the series were last updated.",
                                labels=LABELS)
        for labels, cur in currency:
            lv = [labels[k] for k in LABELS]
            _add(estimated, lv, float(cur.tokens_estimated))
            _add(up, lv, 1.0 if cur.up else 0.0)
            _add(age, lv, cur.age_s)
        out += [estimated, up, age]
    return out


class SnapshotCollector:
    """A custom collector: at each scrape, the gauges of the latest snapshots `targets()` returns."""

    def __init__(self, targets: Callable[[], Iterable[tuple[dict, object]]]) -> None:
        self._targets = targets

    def collect(self):
        """The metric families of the current snapshots."""
        return metric_families(self._targets())

    def describe(self):
        """Nothing ahead of time: the families depend on the processes watched."""
        return []
