"""The train server's Python client: :class:`Client` (one method per API call), :class:`Job` (one
submitted job) and :class:`JobStatus`, the job states they report (:class:`JobState`), a Tune
trial's state (:class:`TrialState`, derived by :func:`trial_state`) and the client's exceptions. It needs only the standard library and never imports the server, so a machine
that only submits jobs installs nothing more than ``trainforge``.

    from trainforge.client import Client

    client = Client()                    # the local server, or Client("http://host:8270", token=...)
    for status in client.jobs(): ...

``trainforge.server`` re-exports the same names (``trainforge.server.Client`` is this ``Client``).
"""

from trainforge.client._client import Client, Job, JobStatus
from trainforge.client._discovery import discover
from trainforge.client._errors import (
    InvalidJobError,
    JobConflictError,
    JobNotFoundError,
    ServerError,
    ServerNotFoundError,
)
from trainforge.client._states import JobEvent, JobState
from trainforge.client._trial_state import TrialDecision, TrialState, trial_state

__all__ = [
    "Client",
    "InvalidJobError",
    "Job",
    "JobConflictError",
    "JobEvent",
    "JobNotFoundError",
    "JobState",
    "JobStatus",
    "ServerError",
    "ServerNotFoundError",
    "TrialDecision",
    "TrialState",
    "discover",
    "trial_state",
]
