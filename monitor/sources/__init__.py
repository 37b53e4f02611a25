"""Every way frames arrive, as one stream of `(rx_ns, payload, frame)`: a recording (recording.py), a live agent
over its Unix socket (live.py, after the pid checks and the agent's loading in pids.py; agent_socket.py finds and
checks the socket), or a process watched from outside (outside.py: llama-server, a CUDA program with no Python).
collect.py reads any of them into a Session. errors.py is the ground floor every one of them raises from.

A replay reads recording.py alone: nothing of the live socket or the pid checks.
"""
