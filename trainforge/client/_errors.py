"""The train server client's exceptions (what the server answered, or that nothing answered)::

    ConnectionError
     └── ServerNotFoundError      no server answers (``sent``: the request may have reached it)
    RuntimeError
     └── ServerError              the server refused a request: ``status`` (HTTP), ``detail``
          ├── JobNotFoundError    404 (also a LookupError)
          ├── JobConflictError    409: not allowed in the job's state
          └── InvalidJobError     422: a bad request, naming the field (also a ValueError)
"""

from __future__ import annotations


class ServerNotFoundError(ConnectionError):
    """No train server answers where the client looked. ``sent``: the request may have reached the
    server before the connection was lost (it connected, then the reply never came)."""

    def __init__(self, message: str, *, sent: bool = False):
        super().__init__(message)
        self.sent = sent


class ServerError(RuntimeError):
    """The server refused a request: ``status`` (HTTP) and ``detail`` (its reason)."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"{detail} (HTTP {status})")
        self.status = status
        self.detail = detail


class JobNotFoundError(ServerError, LookupError):
    pass


class JobConflictError(ServerError):
    pass


class InvalidJobError(ServerError, ValueError):
    pass
