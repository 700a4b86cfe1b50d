"""The client's transport: HTTP/1.1 to the train server with the standard library's ``http.client``,
and the one place the client meets ``http.client``'s and ``socket``'s exceptions. Each becomes one
of the client's (:mod:`trainforge.client._errors`), the original as its ``__cause__``:

    could not connect (refused, no route, a name that does not resolve)   ServerNotFoundError(sent=False)
    the connection not accepted within ``timeout``                        ServerTimeoutError(sent=False)
    connected, no reply within ``timeout``                                ServerTimeoutError(sent=True)
    the connection lost, or the reply cut short, after the request went   ServerNotFoundError(sent=True)
    an HTTPS certificate not trusted (self-signed, another name, expired) ServerCertificateError
      or not the one the server's state directory recorded (``pinned``)
    a reply that is not HTTP (a status line, a header that is not), or    BadResponseError
      not TLS where the address says https://

A fresh connection per request (loopback connects in microseconds; nothing kept alive goes stale,
nothing is shared between threads), and nothing heavier imported, so a fresh ``trainforge`` command
or a ``submit()`` from a new process pays no HTTP library import (httpx costs ~0.1 s).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from typing import Any, NamedTuple

from trainforge.client._errors import (
    BadResponseError,
    ClientConfigError,
    ClientError,
    ServerCertificateError,
    ServerNotFoundError,
    ServerTimeoutError,
)

TRUST_HINT = (
    "trust a self-signed certificate with SSL_CERT_FILE=/path/to/cert.pem (the server's --tls-cert); reach the "
    "server by a name its certificate holds; on the server's machine, `trainforge` commands trust it by its "
    "state directory (--state-dir or $TRAINFORGE_SERVER_DIR)"
)


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes


class Transport:
    """Requests to the server at ``address`` (``http[s]://host[:port][/path]``), each path under
    ``prefix``, with ``token`` as the bearer token; ``timeout``: seconds to connect, and then
    between bytes of a reply (not for streams once they answered); ``pinned``: the one certificate
    (DER) an HTTPS server must present, trusted whatever names it holds (the server's own, read from
    its state directory: :func:`~trainforge.client._discovery.server_certificate`), else the
    standard library's trust (the system's authorities, ``$SSL_CERT_FILE``) and a hostname check."""

    def __init__(self, address: str, *, prefix: str, token: str | None, timeout: float, pinned: bytes | None = None):
        url = urllib.parse.urlsplit(address)
        try:
            port = url.port
        except ValueError as exc:
            raise ClientConfigError(f"train server address {address!r}: {exc} (give a port from 1 to 65535)") from exc
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ClientConfigError(f"train server address {address!r}: give an http:// or https:// URL")
        if token is not None and not (token.isascii() and token.isprintable() and token.strip() == token):
            raise ClientConfigError(
                "the train server token has characters a token never has (spaces, line breaks, non-ASCII): "
                "give the token the server wrote to its state directory's `token` file"
            )
        self.address = address
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname, port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/") + prefix
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._pinned = pinned if self._https else None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        context = ssl.create_default_context()
        if self._pinned is not None:  # the certificate itself is the trust: compared after the handshake
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=context)

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        conn = self._connection(timeout)
        try:
            conn.connect()
            assert conn.sock is not None
            if self._pinned is not None and isinstance(conn.sock, ssl.SSLSocket) \
                    and conn.sock.getpeercert(binary_form=True) != self._pinned:  # fmt: skip
                raise ServerCertificateError(
                    f"the train server at {self.address} presents a certificate other than the one its state "
                    "directory holds (server_cert.pem): another program answers at that address, or the server "
                    "restarted with a new certificate since this client read it (a new client reads it again)"
                )
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except ServerCertificateError:
            conn.close()
            raise
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise ServerCertificateError(
                f"the train server at {self.address} answered, but its TLS certificate is not trusted "
                f"({exc.verify_message}): {TRUST_HINT}"
            ) from exc
        except ssl.SSLError as exc:
            conn.close()
            raise BadResponseError(
                f"something answered at {self.address}, but the TLS handshake failed ({exc.reason or exc}): "
                "is it a train server started with --tls-cert? (a plain one's address starts with http://)"
            ) from exc
        except TimeoutError as exc:
            conn.close()
            raise ServerTimeoutError(
                f"no train server answers at {self.address}: the connection was not accepted within {timeout:g} s "
                "(a firewall dropping it, or an address that is not the server's?)"
            ) from exc
        except OSError as exc:
            conn.close()
            raise ServerNotFoundError(
                f"no train server answers at {self.address} ({exc}): is it running? (`trainforge server status`)"
            ) from exc
        return conn

    def _target(self, path: str, params: dict[str, Any] | None) -> str:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
        return self._prefix + path + (f"?{query}" if query else "")

    def _lost(self, exc: Exception) -> ClientError:
        """The error for a reply that did not come whole after the request went out (the server may
        have acted on it): timed out, the connection lost, or something not HTTP answered."""
        if isinstance(exc, TimeoutError):
            return ServerTimeoutError(
                f"the train server at {self.address} did not answer within {self._timeout:g} s: it may be busy "
                "(Client(timeout=...) waits longer)",
                sent=True,
            )
        if isinstance(exc, http.client.HTTPException) and not isinstance(
            exc, (http.client.RemoteDisconnected, http.client.IncompleteRead)
        ):
            return BadResponseError(
                f"something answered at {self.address}, but not in HTTP as a train server does "
                f"({type(exc).__name__}: {exc}): is it a train server's address?"
            )
        return ServerNotFoundError(
            f"the train server at {self.address} closed the connection before it answered ({type(exc).__name__}: "
            f"{exc}): it may have stopped or restarted (`trainforge server status`)",
            sent=True,
        )

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Response:
        """One request and its whole reply. ``body``: sent as JSON (a POST, PUT or PATCH always sends
        one: the server takes state changes as JSON only)."""
        headers = {**self._headers, "Connection": "close"}
        data = None
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = {}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connect(self._timeout)
        try:
            conn.request(method, self._target(path, params), body=data, headers=headers)
            response = conn.getresponse()
            return Response(response.status, response.getheader("content-type", ""), response.read())
        except (OSError, http.client.HTTPException) as exc:
            raise self._lost(exc) from exc
        finally:
            conn.close()

    @contextlib.contextmanager
    def open_stream(self, path: str, *, params: dict[str, Any] | None = None,
                    headers: dict[str, str] | None = None) -> Iterator[EventStream]:  # fmt: skip
        """A GET of server-sent events, read as they come (no read timeout once it answered)."""
        conn = self._connect(10.0)
        try:
            try:
                conn.request("GET", self._target(path, params),
                             headers={**self._headers, **(headers or {}), "Accept": "text/event-stream"})  # fmt: skip
                assert conn.sock is not None
                conn.sock.settimeout(None)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self._lost(exc) from exc
            yield EventStream(response, self)
        finally:
            conn.close()


class EventStream:
    """A stream's reply: ``status``, its whole ``body()`` (an error's), and ``events()``."""

    def __init__(self, response: http.client.HTTPResponse, transport: Transport):
        self._response = response
        self._transport = transport
        self.status = response.status

    def body(self) -> bytes:
        try:
            return self._response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._transport._lost(exc) from exc

    def events(self) -> Iterator[tuple[str, str | None, str]]:
        """Its events as ``(event, id, data)`` (the data's lines joined), until the server ends the
        stream; a connection lost on the way raises :class:`ServerNotFoundError`."""
        event, ident = "message", None
        data: list[str] = []
        while True:
            try:
                raw = self._response.readline()
            except (OSError, http.client.HTTPException) as exc:
                raise self._transport._lost(exc) from exc
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line:
                if data:
                    yield event, ident, "\n".join(data)
                event, data, ident = "message", [], None
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            elif field == "id":
                ident = value

