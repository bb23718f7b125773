"""The conformance kit on the platform engine selects here (cpu in CI): every registered kernel vs its reference.

The same test the kit ships (``python -m pytest --pyargs engine.core.testing``), collected in this suite.
"""

from engine.core.testing.test_conformance import test_kernel_matches_reference

__all__ = ["test_kernel_matches_reference"]
