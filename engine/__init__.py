"""engine: a portable LLM inference engine."""
__version__ = "0.1.0"
