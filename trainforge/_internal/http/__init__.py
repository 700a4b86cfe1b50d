"""The HTTP foundation shared by trainforge's servers (the train server, ``trainforge serve``): the
request guard (with its body limit and the dashboard's browser entry), the listening socket, the
SIGTERM handler and the JSON encoding rule. A deliberately named internal interface: platform
packages import it from here."""

from trainforge._internal.amounts import size_text
from trainforge._internal.http.encoding import json_safe
from trainforge._internal.http.entry import safe_location
from trainforge._internal.http.guard import (
    DEFAULT_MAX_BODY,
    SAFE_METHODS,
    WILDCARDS,
    Guard,
    GuardPolicy,
    allowed_hosts,
    deny,
    host_name,
    is_json_type,
    is_loopback,
    json_detail,
    origin_of,
)
from trainforge._internal.http.listen import listen
from trainforge._internal.http.signals import exit_on_signal

__all__ = [
    "DEFAULT_MAX_BODY",
    "SAFE_METHODS",
    "WILDCARDS",
    "Guard",
    "GuardPolicy",
    "allowed_hosts",
    "deny",
    "exit_on_signal",
    "host_name",
    "is_json_type",
    "is_loopback",
    "json_detail",
    "json_safe",
    "listen",
    "origin_of",
    "safe_location",
    "size_text",
]
