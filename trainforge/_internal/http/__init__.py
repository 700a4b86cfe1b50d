"""The HTTP foundation shared by trainforge's servers (the train server, ``trainforge serve``): the
request guard. A deliberately named internal interface: platform packages import it from here."""

from trainforge._internal.http.guard import (
    Guard,
    GuardPolicy,
    deny,
    host_name,
    is_json_type,
    is_loopback,
    json_detail,
    origin_of,
    safe_location,
)

__all__ = [
    "Guard",
    "GuardPolicy",
    "deny",
    "host_name",
    "is_json_type",
    "is_loopback",
    "json_detail",
    "origin_of",
    "safe_location",
]
