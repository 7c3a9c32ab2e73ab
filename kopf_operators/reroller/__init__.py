"""reroller: the controller (state from Kopf indexes, writes through core.access) and its pure decisions.

The Kopf handlers are operators/reroller.py (the file `kopf run operators/*.py` loads)."""
