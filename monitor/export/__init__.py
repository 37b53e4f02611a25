"""Traced windows as a trace a viewer opens: Perfetto's UI, chrome://tracing and Holistic Trace Analysis.

The format is Chrome's Trace Event Format (JSON), in the flavour PyTorch's Kineto profiler writes: Perfetto's UI
and chrome://tracing open it as it is, and HTA's parser (`hta.common.trace_parser`) reads Kineto's field names
(`traceEvents`, `distributedInfo`, `deviceProperties`, kernel args `device`, `stream`, `correlation`,
`External id`, `grid`, `block`, `registers per thread`). Perfetto's own protobuf format would need a library
to write it (Perfetto's Python package or generated protobuf bindings) that decodemon does not carry, and HTA does
not read it.

    session.feed.windows --lanes--> events --trace_of--> dict --write_trace--> trace.json (.gz)

    export(source)        a recording path, a pid or a Session -> the trace dict
    trace_of(session)     the same from a Session already read
    write_trace(t, path)  written whole through a temporary file, or not at all
"""

from __future__ import annotations

from decodemon.monitor.export.trace import NothingToExport, export, trace_of, write_trace

__all__ = ["NothingToExport", "export", "trace_of", "write_trace"]
