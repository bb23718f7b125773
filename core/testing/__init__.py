"""The conformance kit: checks any platform's kernels against the ops' reference implementations.

Run it on the selected platform, or on one by name::

    python -m pytest --pyargs engine.core.testing --engine-platform=NAME

(This package's ``__init__`` stays import-free on purpose: pytest may import the kit's test module
under a second name in source checkouts, and nothing here may register anything twice.)
"""
