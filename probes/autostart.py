"""One import line makes a process attachable: `import decodemon.probes.autostart`."""

from decodemon.probes.agent import start as _start

socket_path = _start()
