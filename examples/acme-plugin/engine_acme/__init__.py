"""engine-acme-plugin: a vendor plugin package, kept outside engine's source tree.

'acme' stands for a vendor accelerator; to stay runnable anywhere it computes on the host CPU.
It extends the cpu platform (inheriting its kernels) and overrides the ``rms_norm`` op.
"""
