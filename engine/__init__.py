"""engine: a portable LLM inference engine.

``from engine import LLM, SamplingParams``; heavy modules load on first use.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# torch's host ops run on an OpenMP pool whose threads, by libgomp's default, keep spinning for milliseconds after
# each parallel region. On a CPU the native kernels' own threads then share the cores with spinning ones: a prefill
# step's oneDNN GEMMs slowed the native attention and norms between them (512-token prompts 960-1,130 against
# 1,140-1,250 tok/s passive; a mixed prefill and decode run 10% longer; 2-core Zen 5). libgomp reads the policy
# when torch loads it, so it is set here, before the engine imports torch; a value the user set is kept.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["LLM", "SamplingParams", "RequestOutput", "__version__"]


def __getattr__(name):
    if name == "LLM":
        from engine.core.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.core.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "RequestOutput":
        from engine.core.engine.outputs import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
