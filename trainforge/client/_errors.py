"""The train server client's exceptions. Every error the client raises is a :class:`ClientError`;
each keeps the built-in base that ``except`` clauses written before the tree still catch::

    ClientError                       every error of the client (catch this one for "anything went wrong")
     ├── ServerNotFoundError          nothing answers, or the connection was lost (also a ConnectionError);
     │    │                           ``sent``: the request may have reached the server
     │    └── ServerTimeoutError      connected, but no reply within the client's ``timeout`` (also a TimeoutError)
     ├── ServerCertificateError       an HTTPS server answered with a certificate the client does not trust
     │                                (self-signed, for another name, expired): the reason and what to set
     ├── BadResponseError             something answered, but not as a train server does (not JSON, not
     │                                the fields the API sends, not TLS): another program on that port, or a proxy
     ├── ClientConfigError            a bad address or token given to the client (also a ValueError)
     ├── JobTimeoutError              ``Job.wait(timeout)``: the job had not ended in time (also a TimeoutError)
     └── ServerError                  the server refused a request: ``status`` (HTTP), ``detail`` (also a RuntimeError)
          ├── JobNotFoundError        404 (also a LookupError)
          ├── JobConflictError        409: not allowed in the job's state
          └── InvalidJobError         422: a bad request, naming the field (also a ValueError)

Foreign exceptions (``http.client``'s, ``socket``'s, ``ssl``'s, ``json``'s) are translated where the client
meets them, ``raise ServerNotFoundError(...) from exc``: the original is the ``__cause__``.
Two kinds pass through untranslated: :meth:`Job.result() <trainforge.client.Job.result>` raises the
run's own error, as ``fit()`` would have raised it; an argument of the wrong type (a job spec that
is not JSON) raises Python's ``TypeError``, as any function's would.
"""

from __future__ import annotations


class ClientError(Exception):
    """Any error of the train server client (the base of the tree above)."""


class ServerNotFoundError(ClientError, ConnectionError):
    """No train server answers where the client looked. ``sent``: the request may have reached the
    server before the connection was lost (it connected, then the reply never came)."""

    def __init__(self, message: str, *, sent: bool = False):
        super().__init__(message)
        self.sent = sent


class ServerTimeoutError(ServerNotFoundError, TimeoutError):
    """The server took the connection but did not answer within the client's ``timeout``: it may
    be busy (``Client(timeout=...)`` waits longer). ``sent`` as for :class:`ServerNotFoundError`."""


class ServerCertificateError(ClientError):
    """An HTTPS server answered, but the client does not trust its certificate (OpenSSL's reason in
    the message: self-signed, issued for another name, expired), or it is not the certificate its
    state directory recorded. Not a :class:`ServerNotFoundError`: something does answer there, and
    waiting or retrying changes nothing; the message says what to set."""


class BadResponseError(ClientError):
    """Something answered at the server's address, but not as a train server does (a reply that is
    not JSON, or lacks the fields the API sends): another program listens there, or a proxy."""


class ClientConfigError(ClientError, ValueError):
    """A bad address or token given to the client (as an argument, in ``$TRAINFORGE_ADDRESS`` or
    ``$TRAINFORGE_TOKEN``, or in a state directory's files): the message names it and what is allowed."""


class JobTimeoutError(ClientError, TimeoutError):
    """:meth:`Job.wait() <trainforge.client.Job.wait>` (or ``result()``) with a ``timeout``: the job
    had not ended when it passed. The job goes on; wait again, or stop it."""


class ServerError(ClientError, RuntimeError):
    """The server refused a request: ``status`` (HTTP) and ``detail`` (its reason). ``problems``:
    for a request the schema refused, each ``(field, message)`` it named (``("num_workers", "Input
    should be greater than or equal to 1")``; field "" for the request as a whole), so a caller can
    say which of its own options it was (``trainforge submit`` says ``--workers``)."""

    def __init__(self, status: int, detail: str, problems: tuple[tuple[str, str], ...] = ()):
        super().__init__(f"{detail} (HTTP {status})")
        self.status = status
        self.detail = detail
        self.problems = problems


class JobNotFoundError(ServerError, LookupError):
    pass


class JobConflictError(ServerError):
    pass


class InvalidJobError(ServerError, ValueError):
    pass
