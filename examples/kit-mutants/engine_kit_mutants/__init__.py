"""Mutant platforms: plugins that are empty or wrong in the ways a vendor's plugin can be, each of which the
conformance kit must fail on every seed (``tests/core/testing/test_kit_mutants.py`` checks 8 seeds each).

Read them as a list of what the kit looks for. ``MUTANTS`` maps each platform class to the op the kit is run on
and the words its failure must contain.
"""

from .platforms import MUTANTS

__all__ = ["MUTANTS"]
