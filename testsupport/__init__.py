"""What tests/ and bench/ share to drive the local control plane: paths, kubectl, ServiceAccount tokens,
the ``kopf run`` launcher, the API server's audit log and the figures' percentiles.

Not part of the shipped package (pyproject.toml packages only kopf_operators; the Dockerfile copies
kopf_operators/ and operators/): it is imported from the repository root, as tests/ and bench/ are.
"""
