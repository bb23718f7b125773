"""The one exception the loader raises for a file or directory it cannot use."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model path that cannot be loaded (missing, corrupted, unsupported); the message says what to do."""
