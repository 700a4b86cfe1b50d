"""Integrations of tune with other parts (``ray_train``: train runs inside a function trial)."""
