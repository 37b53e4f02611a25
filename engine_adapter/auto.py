"""Register the engine adapters with the agent's attach hooks; imported by the agent's bootstrap.

Importing this imports no engine: each adapter looks in `sys.modules` at attach and applies only to what the
process has already loaded.
"""

from decodemon.engine_adapter import (cuda_graphs, llama_cpp_generate, nvtx_ranges, step_starts, transformers_cb,
                                      transformers_generate)
from decodemon.probes import hooks

hooks.register("transformers", transformers_generate.install, transformers_generate.uninstall)
hooks.register("transformers_cb", transformers_cb.install, transformers_cb.uninstall)
hooks.register("nvtx", nvtx_ranges.install, nvtx_ranges.uninstall)
hooks.register("llama_cpp", llama_cpp_generate.install, llama_cpp_generate.uninstall)
hooks.register("cuda_graphs", cuda_graphs.install, cuda_graphs.uninstall)
hooks.register("step_starts", step_starts.install, step_starts.uninstall)
