"""Retrying storage operations, and turning their failures into :class:`StorageError`.

``retry_call(operation, url, fn)`` runs ``fn()``. A *transient* error is retried with exponential
backoff (``$TRAINFORGE_STORAGE_RETRIES`` attempts in all, 5 by default; the first wait is
``$TRAINFORGE_STORAGE_RETRY_DELAY_S``, 0.2 s, doubled each time up to 5 s), each retry logged as a
warning on the "trainforge" logger with the operation, URL, attempt and cause. Any other error, or a
transient one on the last attempt, raises ``StorageError`` naming the operation, the URL, the cause
and what to do, ``from`` the original exception.

Transient means: the outermost error is not a permission / not-found / not-a-directory / exists
error, and some exception in its chain (``__cause__``, then ``__context__``) is

- a connection error or a timeout: Python's ``ConnectionError`` / ``TimeoutError``, botocore's
  ``ConnectionError`` and ``HTTPClientError`` families (endpoint unreachable, connect/read timeout,
  connection closed), aiohttp's ``ClientConnectionError`` / ``ClientPayloadError``, fsspec's
  ``FSTimeoutError``;
- an HTTP error response (an exception with a botocore-style ``.response`` dict, as ``ClientError``
  and what s3fs chains under its ``OSError``) with status 429 or >= 500, or a throttling / busy code
  (``SlowDown``, ``Throttling``, ``RequestTimeout``, ``InternalError``, ``ServiceUnavailable``, ...).

Classes are recognised by their qualified names, so neither botocore nor aiohttp is imported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainforge._internal.constants import (
    ENV_STORAGE_RETRIES,
    STORAGE_RETRY_MAX_DELAY_S,
    storage_retries,
    storage_retry_delay_s,
)
from trainforge._internal.exceptions import StorageError

logger = logging.getLogger("trainforge")

T = TypeVar("T")

PERMANENT_TYPES = (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)

TRANSIENT_CLASS_NAMES = frozenset(
    {
        "builtins.ConnectionError",
        "builtins.TimeoutError",
        "asyncio.exceptions.TimeoutError",  # Python 3.10: not yet the builtin
        "concurrent.futures._base.TimeoutError",
        "fsspec.exceptions.FSTimeoutError",
        "botocore.exceptions.ConnectionError",
        "botocore.exceptions.HTTPClientError",
        "aiohttp.client_exceptions.ClientConnectionError",
        "aiohttp.client_exceptions.ClientPayloadError",
    }
)

TRANSIENT_ERROR_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _is_transient_one(exc: BaseException) -> bool:
    if any(f"{c.__module__}.{c.__qualname__}" in TRANSIENT_CLASS_NAMES for c in type(exc).__mro__):
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = (response.get("Error") or {}).get("Code")
        if isinstance(status, int) and (status == 429 or status >= 500):
            return True
        if code in TRANSIENT_ERROR_CODES:
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """True when retrying ``exc`` may help (see the module docstring for the rule)."""
    if isinstance(exc, PERMANENT_TYPES):
        return False
    return any(_is_transient_one(e) for e in _chain(exc))


def _hint(exc: BaseException, transient: bool, attempts: int) -> str:
    if transient:
        return (
            f"the storage kept failing with a transient error for {attempts} attempts; check the network "
            "and the endpoint (e.g. AWS_ENDPOINT_URL), or allow more attempts with "
            f"{ENV_STORAGE_RETRIES}=<n>"
        )
    if isinstance(exc, PermissionError) or any(
        type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError") for e in _chain(exc)
    ):
        return (
            "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or those given to "
            "RunConfig.storage_filesystem) and that they allow reading and writing this location"
        )
    if isinstance(exc, FileNotFoundError):
        return (
            "check that the location exists and was not removed while the run used it (for s3:// the "
            "bucket must exist: create it first)"
        )
    if isinstance(exc, (NotADirectoryError, FileExistsError, IsADirectoryError)):
        return "a file is in the way of this path; remove it or choose another RunConfig.storage_path"
    return "check RunConfig.storage_path and the storage filesystem's configuration"


def storage_error(operation: str, url: str, exc: BaseException, attempts: int, transient: bool) -> StorageError:
    after = f" after {attempts} attempts" if attempts > 1 else ""
    message = (
        f"Storage operation {operation!r} on {url} failed{after}: {type(exc).__name__}: {exc}. "
        f"To fix: {_hint(exc, transient, attempts)}."
    )
    return StorageError(message, operation=operation, url=url, attempts=attempts)


def retry_call(operation: str, url: str, fn: Callable[[], T]) -> T:
    """Run ``fn()``, retrying transient errors; raise :class:`StorageError` when it fails for good."""
    attempts = storage_retries()
    delay = storage_retry_delay_s()
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except StorageError:
            raise
        except Exception as exc:
            transient = is_transient(exc)
            if not transient or attempt == attempts:
                raise storage_error(operation, url, exc, attempt, transient) from exc
            logger.warning(
                "storage operation %r on %s failed (attempt %d of %d), retrying in %.2fs: %s: %s",
                operation, url, attempt, attempts, delay, type(exc).__name__, exc,
            )
            time.sleep(delay)
            delay = min(delay * 2, STORAGE_RETRY_MAX_DELAY_S)
    raise AssertionError("unreachable")  # pragma: no cover


def display_url(fs: Any, path: str) -> str:
    """``path`` as the user would write it: a local path, or ``protocol://path`` for an fsspec fs."""
    if fs is None:
        return path
    try:
        return str(fs.unstrip_protocol(path))
    except Exception:
        return path
