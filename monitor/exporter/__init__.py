"""Prometheus metrics of watched decode loops, through the standard client library (`prometheus_client`).

    decodemon attach PID --prometheus HOST:PORT   one process        serve.serve_pid
    decodemon exporter --listen HOST:PORT          every attachable   serve.run_exporter
                                                   process on the host

    live_frames --> Session --(every second)--> Snapshot --> Watch.latest
                                                                 |  a scrape
                                      SnapshotCollector.collect -+--> /metrics

    collector.py  the gauges of the snapshots there are, at each scrape (SnapshotCollector)
    watch.py      one pid attached on a thread of its own, its latest snapshot kept (Watch)
    scan.py       the pids to watch: agents that listen, llama-servers, the pids named (Exporter)
    serve.py      the HTTP server, and the loops that serve one pid or every one the scan finds

A `Watch` attaches to one pid on a thread of its own and keeps the latest `Snapshot` (plain values); the custom
collector turns the snapshots there are into gauges at each scrape: a scrape reads values already computed and
touches neither the agent's socket nor the analysis.
Names follow the exporter conventions: base units (`_seconds`, `_bytes`, `_ratio` for a fraction of 1) and the
labels pid, engine (the engine's program) and gpu (the device's index; absent without a GPU).

An agent serves one monitor at a time: the exporter yields, so `decodemon attach` to a process it watches is served
and the exporter watches again as soon as it is free (asking twice a second). Meanwhile its series hold their last
values and `decodemon_watch_up` is 0. When the exporter has the agent back, it adds the tokens made meanwhile:
those the agent sent the other monitor, by the agent's own count (its hello says how many it sent, and the engine's
seconds they span, over every attach), and those of the moments no monitor had it, which the agent does not mark,
estimated at the rate measured on either side over what is left of the time between the last token the exporter
counted and the first it counts again (the engine's clock; at most the time it was away, so a loop idle while
watched adds none). `decodemon_tokens_total` adds them and never decreases, and
`decodemon_tokens_estimated_total` says how many of its tokens were estimated, not counted.

It watches only what it is told to: this user's processes whose agent already listens (the process holds a
listening `<pid>.sock`: monitor/agent_socket.find), each proven at its attach by the agent's Hello (the same pid)
and the process's start time (the same process as the one found, not a pid reused since); llama-servers serving
/slots (watched from outside: monitor/outside.py); and the pids named on its command line. It loads an agent into
none of them unless told to (`--inject`, named pids only).
"""
