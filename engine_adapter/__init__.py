"""The engine side: the token clock and model facts a decode loop reports, and a demo engine.

    from decodemon.engine_adapter import mark_token, report_model
    report_model(name="my-model", weight_bytes=..., kv_bytes_per_position=..., layers=28, dtype="bf16")
    for step in range(n):
        ...decode one token...
        mark_token(depth=position)

`mark_token` is the agent's own function: while no monitor is attached it
costs one global read. Nothing here imports torch until the demo engine runs.
"""

from decodemon.probes.agent import mark_step, mark_token, note_first_tokens, start as start_agent
from decodemon.engine_adapter.adapter import TokenClock, report_cuda_graphs, report_model

__all__ = ["mark_step", "mark_token", "note_first_tokens", "report_cuda_graphs", "report_model", "start_agent",
           "TokenClock"]
