"""Shared code of the four operators.

The handler files live in ``operators/`` and are loaded by ``kopf run operators/*.py``;
everything they share (configuration, clients, events, metrics) and every pure decision
function lives in this package, which is installed from ``pyproject.toml`` so that it is
importable both from a work tree and from the container image.
"""
