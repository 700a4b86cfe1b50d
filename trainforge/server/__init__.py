"""The train server: a job queue that runs many training jobs at once by the resources they ask for,
with an HTTP API (``/api/v1``), the ``trainforge`` CLI and this Python client.

    import trainforge.server as tfs

    job = trainer.submit()               # queue it on the local server (started if none runs)
    print(job.status().describe())       # e.g. "job 4 (TorchTrainer): QUEUED, needs 2 CPU, 1 free"
    for report in job.reports():         # as fit_iter() yields them
        print(report.metrics)
    result = job.result()                # the Result fit() would have returned

    client = tfs.Client()                # or Client("http://host:8270")
    for status in client.jobs(): ...

Needs the ``[server]`` extra (FastAPI, uvicorn) to serve; the client needs only the standard
library. Submitting a job runs code as the server's user: the server binds 127.0.0.1 and requires its token (``<state-dir>/token``, mode 0600) on every
request. See the README's "Train server" section for the scheduling rule and the job states.
"""

from trainforge.client import (
    Client,
    InvalidJobError,
    Job,
    JobConflictError,
    JobNotFoundError,
    JobStatus,
    ServerError,
    ServerNotFoundError,
)
from trainforge.server._config import ServerConfig
from trainforge.server._main import start_background_server

__all__ = [
    "Client",
    "InvalidJobError",
    "Job",
    "JobConflictError",
    "JobNotFoundError",
    "JobStatus",
    "ServerConfig",
    "ServerError",
    "ServerNotFoundError",
    "start_background_server",
]
