"""The cpu platform's op implementations (native C++ through pybind11)."""

from __future__ import annotations


def register(registry) -> None:
    """Register every native CPU kernel into ``registry``."""
