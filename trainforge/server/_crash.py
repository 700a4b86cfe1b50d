"""Named crash points of the train server, for fault injection: with ``$TRAINFORGE_CRASH_AT`` set to
one of :data:`CRASH_POINTS`, the server process exits at once (``os._exit``, as a ``kill -9`` would
leave it: no cleanup, no reply) the first time it reaches that point. The crash-point test walks every
one and checks that a restarted server has each job whole, none run twice, none stuck."""

from __future__ import annotations

import os

from trainforge._internal.constants import ENV_CRASH_AT

CRASH_EXIT_CODE = 86
CRASH_POINTS = (
    "submit:staged",  # the job's files are in a staging directory; no row yet
    "submit:inserted",  # the row is inserted, not committed; the files are still staged
    "submit:placed",  # the files are in jobs/<id>, the row not yet committed
    "submit:committed",  # the row is committed; the client has no reply yet
    "start:granted",  # the job is STARTING with its grant recorded; no runner yet
    "start:spawned",  # its runner runs; its pid is not recorded yet
    "stop:stopping",  # STOPPING is recorded; the runner has not been signalled
    "stop:signalled",  # the runner has been sent SIGINT
    "finish:read",  # the runner ended and its outcome was read; not recorded yet
    "reattach:recorded",  # (at start) a surviving runner's reattachment is recorded
)


def crash_point(name: str) -> None:
    """Exit the process now if ``$TRAINFORGE_CRASH_AT`` names this point."""
    if os.environ.get(ENV_CRASH_AT) == name:
        assert name in CRASH_POINTS, name
        os.write(2, f"trainforge server: crash point {name}: exiting now\n".encode())
        os._exit(CRASH_EXIT_CODE)
