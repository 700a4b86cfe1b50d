"""Pickling of user code that keeps each function's real file name.

cloudpickle writes every code object it pickles by value (a function of a script's ``__main__``, a
closure, a lambda) with the file name ``<dynamic-code>``, so a traceback from a worker reads
``File "<dynamic-code>", line 8, in loop`` instead of naming the user's script. :func:`dumps` pickles
like ``cloudpickle.dumps`` but carries each code object whole (``marshal``, the format of a ``.pyc``),
its ``co_filename`` included: tracebacks and failure reasons name ``train.py`` wherever the code runs
(local workers, Ray workers, the train server's jobs, Tune trials). The reader is plain
``cloudpickle.loads``/``pickle.loads``. Both sides run the same Python (as cloudpickle's own code
objects require).
"""

from __future__ import annotations

import io
import marshal
import types
from collections import ChainMap
from typing import Any

import cloudpickle

__all__ = ["dumps"]


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    return marshal.loads, (marshal.dumps(code),)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled as ``cloudpickle.dumps(obj)`` does, but with its functions' real file names."""
    with io.BytesIO() as f:
        _Pickler(f).dump(obj)
        return f.getvalue()
