"""Finding a train server: its URL and token (:func:`discover`), for the client and the CLI.

Where the client looks: the ``address`` argument, else ``$TRAINFORGE_ADDRESS``, else the ``address``
file of a state directory given (``state_dir`` or ``$TRAINFORGE_SERVER_DIR``), else (in a driver
connected to a Ray cluster) the address the cluster's server published, else the ``address`` file
of ``~/.trainforge/server``. The token: ``token``, else ``$TRAINFORGE_TOKEN``, else the ``token``
file of the state directory the address came from (a Ray-published server publishes its state
directory, not its token). The certificate: a TLS server copies its own into its state directory
(``server_cert.pem``); a client that reaches the address written in that directory trusts exactly
that certificate (:func:`server_certificate`), whatever names it holds, as it trusts the token beside it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import ssl

from trainforge._internal.constants import (
    ENV_ADDRESS,
    ENV_STATE_DIR,
    ENV_TOKEN,
    RAY_KV_KEY,
    RAY_KV_NAMESPACE,
    SERVER_CERT_FILE,
    SERVER_LOCK_FILE,
    default_state_dir,
)
from trainforge._internal.state_files import read_text
from trainforge.client._errors import ServerNotFoundError


def discover(address: str | None = None, token: str | None = None, state_dir: str | None = None) -> tuple[str, str | None]:
    """The server's URL and token, looked for in this order: ``address``; ``$TRAINFORGE_ADDRESS``;
    the ``address`` file of a state directory given (``state_dir`` or ``$TRAINFORGE_SERVER_DIR``);
    in a driver connected to a Ray cluster, the entry a server started against that cluster
    published in its KV; the ``address`` file of the default state directory. The token:
    ``token``, ``$TRAINFORGE_TOKEN``, else the ``token`` file of the state directory the address
    came from (for a Ray-published server, the state directory it published: readable on the
    server's machine by its user; elsewhere pass the token, as the server does not publish it)."""
    given_dir = state_dir or os.environ.get(ENV_STATE_DIR)
    state_dir = given_dir or default_state_dir()
    address = address or os.environ.get(ENV_ADDRESS) or (read_text(os.path.join(given_dir, "address")) if given_dir else None)
    if not address:
        published = _ray_published()
        if published is not None:
            address, state_dir = published[0], published[1] or state_dir
    address = address or read_text(os.path.join(state_dir, "address"))
    if not address:
        raise ServerNotFoundError(
            f"no train server found (no address given, ${ENV_ADDRESS} unset, no {state_dir}/address): "
            "start one with `trainforge server start`"
        )
    token = token or os.environ.get(ENV_TOKEN) or read_text(os.path.join(state_dir, "token"))
    return address.rstrip("/"), token


def server_certificate(address: str, state_dir: str | None = None) -> bytes | None:
    """The certificate (DER) the TLS server at ``address`` copied into its state directory (``state_dir``,
    else ``$TRAINFORGE_SERVER_DIR``, else the default) when that directory's ``address`` file names
    ``address``; None otherwise (another server, a plain-HTTP one, none running there). The client pins
    it: the server's machine trusts its own server, self-signed or issued for another name, with no
    ``SSL_CERT_FILE`` to set, and nothing but that exact certificate."""
    if not address.startswith("https://"):
        return None
    directory = state_dir or os.environ.get(ENV_STATE_DIR) or default_state_dir()
    if (read_text(os.path.join(directory, "address")) or "").rstrip("/") != address.rstrip("/"):
        return None
    pem = read_text(os.path.join(directory, SERVER_CERT_FILE))
    block = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", pem or "", re.S)
    if block is None:
        return None
    try:
        return ssl.PEM_cert_to_DER_cert(block.group(0))
    except ValueError:
        return None


def _ray_published() -> tuple[str, str | None] | None:
    """``(url, state_dir)`` of the server started against this driver's Ray cluster (what it
    published in the cluster's KV), or None: ray not imported, not connected, nothing published.
    Never imports ray nor connects."""
    from trainforge._internal.ray_utils import ray_connected

    if not ray_connected():
        return None
    from ray.experimental import internal_kv

    try:
        value = internal_kv._internal_kv_get(RAY_KV_KEY, namespace=RAY_KV_NAMESPACE)
    except Exception:  # the cluster is unreachable now: look elsewhere
        return None
    if not value:
        return None
    try:
        entry = json.loads(value)
        return str(entry["url"]), entry.get("state_dir")
    except (ValueError, KeyError, TypeError):
        return value.decode(), None  # a bare URL


def server_holds(state_dir: str) -> bool:
    """Whether a train server holds ``state_dir`` now (starting, serving or stopping): it keeps the
    directory's lock file locked for its whole life. Read only: nothing is created or changed."""
    try:
        fd = os.open(os.path.join(state_dir, SERVER_LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
