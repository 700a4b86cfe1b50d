"""``trainer.submit()``: a trainer queued as a job of the train server on this machine (started in
the background if none runs), with what the submission tells its user, and, with ``wait=True``,
its output followed until it ends. The trainer is encoded by
:func:`~trainforge._internal.trainer_job.trainer_job`."""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainforge._internal.constants import ENV_ADDRESS, default_state_dir
from trainforge._internal.trainer_job import trainer_job
from trainforge.client import Client, Job, ServerNotFoundError
from trainforge.server._config import DEFAULT_PORT
from trainforge.server._job_view import follow
from trainforge.server._main import start_background_server

if TYPE_CHECKING:
    from trainforge import Result

EARLIER_TRY = " [queued by an earlier try of this submission, before the connection dropped]"


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def submit_trainer(
    trainer: Any,
    *,
    wait: bool = False,
    callback: Callable[[Result], Any] | None = None,
    address: str | None = None,
    name: str | None = None,
    out: Any = None,
    **settings: Any,
) -> Job:
    """Queue ``trainer`` on a train server and return its job, with the arguments of
    ``DataParallelTrainer.submit`` (which documents them): ``settings`` holds the job's own settings
    (``priority``, ``hold``, ``max_retries``, ``env``, ``preemptible``: fields of the API's job spec of
    the same names). ``out``: where the messages go (stdout)."""
    spec = trainer_job(
        trainer, name=name or trainer.run_config.name or type(trainer).__name__,
        cannot_send=f"{type(trainer).__name__}.submit(): the trainer cannot be sent to the server",
        fix=". Its train loop, config and datasets must be picklable by cloudpickle: open files, locks, sockets and "
        "live connections are not; create those inside the loop.",
        **{**settings, "env": dict(settings.get("env") or {})},
        submission_id=uuid.uuid4().hex,  # a retried request queues the job once
    )  # fmt: skip
    out = out or sys.stdout

    def waiting(line: str) -> None:
        print(f"trainforge: {line}", file=out, flush=True)

    try:  # one request when a server runs: the reply carries the job's state
        client = Client(address)
        job = client.submit(spec, on_wait=waiting)
    except ServerNotFoundError as exc:
        if exc.sent or address is not None or os.environ.get(ENV_ADDRESS):
            raise  # a server went away with the submission (retried until the deadline), or one was named
        url = start_background_server(extra_args=[] if _port_free(DEFAULT_PORT) else ["--port", "0"],
                                      announce=lambda line: print(line, file=out, flush=True))  # fmt: skip
        print(f"trainforge: no train server was running; started one at {url} "
              f"(state in {default_state_dir()}; stop it with `trainforge server stop`)", file=out, flush=True)  # fmt: skip
        client = Client(url)
        job = client.submit(spec, on_wait=waiting)  # the same key: never queued twice
    print(submitted_line(job, client.address), file=out, flush=True)
    if callback is not None:

        def deliver() -> None:
            try:
                callback(job.result())
            except BaseException as exc:  # the callback is told through the Result as fit() would raise
                print(f"trainforge: job {job.id}: {exc}", file=out, flush=True)

        threading.Thread(target=deliver, daemon=True, name=f"tf-job{job.id}-callback").start()
    if wait:
        follow(job, out)
    return job


def submitted_line(job: Job, address: str) -> str:
    """What a submission tells its user: the job the server committed, and its state."""
    status = job.submitted or job.status()
    line = f"trainforge: submitted job {job.id} to {address}: {status.state}"
    return line + (f" ({status.pending})" if status.pending else "") + (EARLIER_TRY if not job.created else "")
