"""engine: a portable LLM inference engine.

``from engine import LLM, SamplingParams``; heavy modules load on first use.
"""

__version__ = "0.1.0"

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
