"""One import line makes a process attachable: `import decodemon.probes.autostart`.

Bootstrap glue, like `decodemon run`'s sitecustomize: it registers the engine adapters' attach hooks (they
import no engine until an attach finds one loaded), then starts the agent.
"""

import importlib as _importlib

try:
    _importlib.import_module("decodemon.engine_adapter.auto")
except Exception:  # no adapters: the agent still counts what the loop marks and what the GPU runs
    pass
from decodemon.probes.agent import start as _start  # noqa: E402

socket_path = _start()
