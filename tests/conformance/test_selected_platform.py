"""The conformance kit on the platform engine selects here (cpu in CI): every registered kernel vs its reference.

The same tests the kit ships (``python -m pytest --pyargs engine.core.testing``), collected in this suite.
"""

from engine.core.testing.test_conformance import (
    test_collectives_across_two_processes,
    test_kernel_matches_reference,
    test_kernels_serve_every_dtype_and_shape_claimed,
)

__all__ = ["test_collectives_across_two_processes", "test_kernel_matches_reference",
           "test_kernels_serve_every_dtype_and_shape_claimed"]
