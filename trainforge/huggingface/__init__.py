"""Hugging Face integrations, as Ray Train's `huggingface` subpackage: :mod:`trainforge.huggingface.transformers`.

Importing this package imports no Hugging Face library.
"""

from __future__ import annotations

__all__: list[str] = []
