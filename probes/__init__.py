"""Code that runs inside the decode process: the agent, the collectors and the wire.

`import decodemon.probes.autostart` (one line) makes a process attachable.
"""
