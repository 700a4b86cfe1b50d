"""The train server's Python client: :class:`Client` (one method per API call), :class:`Job` (one
submitted job) and :class:`JobStatus`, the job states they report (:class:`JobState`, and its
groups :data:`WAITING_STATES`, :data:`ACTIVE_STATES`, :data:`TERMINAL_STATES`), the types of a
job's events (:class:`JobEvent`), a Tune trial's state (:class:`TrialState`, derived in one place
by :func:`trial_state` from its job's state and the tuner's :class:`TrialDecision`), :func:`discover`
(where the server is) and the client's exceptions, all :class:`ClientError` (the tree:
:mod:`trainforge.client._errors`). It needs only the standard library and never imports the server,
so a machine that only submits jobs installs nothing more than ``trainforge``.

    from trainforge.client import Client

    client = Client()                    # the local server, or Client("http://host:8270", token=...)
    for status in client.jobs(): ...

``trainforge.server`` re-exports ``Client``, ``Job``, ``JobStatus`` and the errors it exported before
the client was a package of its own (``trainforge.server.Client`` is this ``Client``).
"""

from trainforge.client._client import Client
from trainforge.client._discovery import discover
from trainforge.client._errors import (
    BadResponseError,
    ClientConfigError,
    ClientError,
    InvalidJobError,
    JobConflictError,
    JobNotFoundError,
    JobTimeoutError,
    ServerCertificateError,
    ServerError,
    ServerNotFoundError,
    ServerTimeoutError,
)
from trainforge.client._job import Job, JobStatus
from trainforge.client._states import ACTIVE_STATES, TERMINAL_STATES, WAITING_STATES, JobEvent, JobState
from trainforge.client._trial_state import TrialDecision, TrialState, trial_state

__all__ = [
    "ACTIVE_STATES",
    "BadResponseError",
    "Client",
    "ClientConfigError",
    "ClientError",
    "InvalidJobError",
    "Job",
    "JobConflictError",
    "JobEvent",
    "JobNotFoundError",
    "JobState",
    "JobStatus",
    "JobTimeoutError",
    "ServerCertificateError",
    "ServerError",
    "ServerNotFoundError",
    "ServerTimeoutError",
    "TERMINAL_STATES",
    "TrialDecision",
    "TrialState",
    "WAITING_STATES",
    "discover",
    "trial_state",
]
