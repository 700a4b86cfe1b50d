"""A trainer as a job of the train server, both ways: the job spec a trainer is submitted as
(:func:`trainer_job`, the one encoder of ``trainer.submit()`` and Tune's trials) and the
:class:`~trainforge.Result` its run leaves on the server (:func:`fetch_result`, the one fetcher of
``Job.result()`` and Tune's trials). The interface Tune uses of the server's submissions."""

from __future__ import annotations

import base64
import math
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainforge import Result


# A job's worker count, under Ray's name from ``ScalingConfig(num_workers=...)`` to the runner: the
# API's ``JobSpecIn.num_workers`` (the minimum, all started at once; ``max_workers`` above it for an
# elastic job), the key of the spec the server stores, and what its scheduling request starts with.
NUM_WORKERS = "num_workers"
# What servers before it stored the same number as (the API took it as "workers"): a job queued by one
# still runs after an upgrade.
OLDER_NUM_WORKERS_KEYS = ("min_workers",)


def num_workers_of(spec: Mapping[str, Any]) -> int:
    """The worker count of a job spec as the server stores it (:data:`NUM_WORKERS`, or the key an
    older server stored it under); 1 when it names none."""
    for key in (NUM_WORKERS, *OLDER_NUM_WORKERS_KEYS):
        if spec.get(key) is not None:
            return int(spec[key])
    return 1


def trainer_job(trainer: Any, *, name: str, cannot_send: str, fix: str, **fields: Any) -> dict[str, Any]:
    """The API's ``JobSpecIn`` of ``trainer``: the cloudpickled trainer (base64), its workers and
    resources from its ``ScalingConfig``, the caller's working directory and ``sys.path``, its train
    loop's config flattened (:func:`flat_config`: the dashboard groups jobs by it), ``name`` and the
    other ``fields`` (``submission_id``, ``priority``, ...). A trainer that does not pickle raises
    TypeError: ``cannot_send`` (who cannot send what, where), why, then ``fix`` (what to do)."""
    from trainforge._internal import code_pickle

    try:
        blob = code_pickle.dumps(trainer)
    except Exception as exc:
        raise TypeError(f"{cannot_send} because it does not pickle ({type(exc).__name__}: {exc}){fix}") from exc
    return {**_scaling_spec(trainer), "trainer_b64": base64.b64encode(blob).decode(), "name": name, **fields}


def _scaling_spec(trainer: Any) -> dict[str, Any]:
    from trainforge._internal.resources import per_worker

    scaling = trainer.scaling_config
    spec: dict[str, Any] = {
        "kind": "trainer",
        NUM_WORKERS: scaling.min_workers,
        "per_worker": per_worker(scaling) or {"CPU": 0.0},
        "cwd": os.getcwd(),
        "sys_path": [p for p in sys.path if p and os.path.isdir(p)],
    }
    if scaling.max_workers != scaling.min_workers:
        spec["max_workers"] = scaling.max_workers
    storage = getattr(getattr(trainer, "run_config", None), "storage_path", None)
    if isinstance(storage, str) and "://" not in storage:  # where its runs go: writable in its sandbox
        spec["storage"] = [os.path.abspath(os.path.expanduser(storage))]
    config = flat_config(getattr(trainer, "train_loop_config", None) or {})
    if config:
        spec["config"] = config
    return spec


def flat_config(config: dict[str, Any], limit: int = 500) -> dict[str, Any]:
    """A job's configuration as the server keeps it: nested dicts flattened to ``a/b`` keys, only
    JSON scalars (finite numbers, short strings, booleans, None), at most ``limit`` keys."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if len(out) >= limit:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        elif value is None or isinstance(value, (bool, int)) or (isinstance(value, str) and len(value) <= 1000):
            out[prefix] = value
        elif isinstance(value, float) and math.isfinite(value):
            out[prefix] = value

    walk("", config)
    out.pop("", None)
    return {k: v for k, v in out.items() if len(k) <= 200}


class _Requester(Protocol):
    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None) -> Any: ...


def fetch_result(client: _Requester, job_id: int) -> Result:
    """The :class:`~trainforge.Result` job ``job_id``'s run left on the server (``GET
    /jobs/{id}/result``, unpickled here). :class:`~trainforge.client.JobNotFoundError` when it left
    none (it ended before its run returned: stopped, lost, or its code failed outside ``fit()``); a
    Result that does not unpickle in this process (an error class it cannot import) raises what
    unpickling raised."""
    import cloudpickle

    blob = client.request("GET", f"/jobs/{job_id}/result")
    result: Result = cloudpickle.loads(blob)
    return result
