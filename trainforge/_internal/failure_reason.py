"""A failed run's one-line reason: the exception type and message, then where in the user's own code
it was raised, e.g. ``ValueError: bad lr (raises.py:8, in loop)``. The one derivation every view of a
job reads (``trainforge jobs``, ``trainforge status``, the API's ``reason``, the dashboard's Reason
column); the full traceback stays in the job's ``error``, on its page and in ``trainforge logs``.

- :func:`exception_reason` makes it from what a run raised: for a :class:`TrainingFailedError`, the
  root cause (the earliest failure) of its last attempt, from the worker's failure record;
- :func:`error_text` writes a job's error text as that line, then the whole story; :func:`reason_of`
  reads the first line of such a text back (an older text without one gives its first line too).

"The user's code" is the innermost frame of the traceback in a file outside trainforge, the Python
standard library and installed packages; without one (a failure inside a library) the reason has no
place.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback

from trainforge._internal.exceptions import TrainingFailedError, WorkerFailure

__all__ = ["error_text", "exception_reason", "failure_reason", "reason_of", "user_frame"]

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+?)\s*$', re.MULTILINE)
_TRAINFORGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_NOT_USER = tuple(
    {p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")) if p}
)


def _is_user_file(path: str) -> bool:
    if path.startswith("<") or os.sep + "site-packages" + os.sep in path or os.sep + "dist-packages" + os.sep in path:
        return False
    full = os.path.abspath(path)
    return not full.startswith(_TRAINFORGE) and not any(full.startswith(p + os.sep) for p in _NOT_USER)


def user_frame(traceback_text: str) -> str | None:
    """Where in the user's code a traceback's exception was raised, as ``raises.py:8, in loop``
    (the innermost frame in a user's file), or None when no frame is the user's."""
    found = None
    for m in _FRAME.finditer(traceback_text):
        if _is_user_file(m["file"]):
            found = f"{os.path.basename(m['file'])}:{m['line']}, in {m['name']}"
    return found


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def failure_reason(failure: WorkerFailure) -> str:
    """One worker failure in one line: its headline, and where in the user's code it was raised."""
    head = _first_line(failure.headline())
    where = user_frame(failure.traceback) if failure.kind == "exception" else None
    return f"{head} ({where})" if where else head


def exception_reason(exc: BaseException) -> str:
    """What ``exc`` (a run's error) says in one line: for a :class:`TrainingFailedError`, the root
    cause of its last attempt (with ``, N attempts`` when it was retried); else its type and message
    and the user's frame of its own traceback."""
    if isinstance(exc, TrainingFailedError) and exc.failures and exc.failures[-1]:
        last = exc.failures[-1]
        root = min(last, key=lambda f: (f.time, f.rank))
        tries = f" [{len(exc.failures)} attempts]" if len(exc.failures) > 1 else ""
        return failure_reason(root) + tries
    message = _first_line(str(exc))
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    where = user_frame("".join(traceback.format_exception(exc)))
    return f"{head} ({where})" if where else head


def error_text(exc: BaseException) -> str:
    """A failed job's error text (the one writer; :func:`reason_of` reads its first line): the
    one-line reason, then the whole error: a failed ``fit()``'s message with its ranks' tracebacks,
    or the traceback of what the job's own code raised."""
    if isinstance(exc, TrainingFailedError):
        whole = f"{type(exc).__name__}: {exc}"
    else:
        whole = "".join(traceback.format_exception(exc)).rstrip()
    return f"{exception_reason(exc)}\n{whole}"


def reason_of(error: str | None) -> str | None:
    """A job's one-line reason from its error text (the line the runner puts first), None without one."""
    return _first_line(error) or None if error else None
