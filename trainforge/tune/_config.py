"""``TuneConfig`` and tune's ``RunConfig`` (train's, plus ``stop``), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainforge import RunConfig as TrainRunConfig


def _bad(cls: str, field: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{cls}.{field}={value!r} is not valid: {allowed}.")


@dataclass
class TuneConfig:
    """How to search (Ray Tune's ``TuneConfig``).

    ``metric``/``mode``: what "best" means ("min" or "max"), for the searcher, the scheduler and
    ``ResultGrid.get_best_result()``. ``num_samples``: trials to run (each grid point that many times).
    ``max_concurrent_trials``: an optional cap; without it, as many trials run at once as their
    workers fit on the machine (a trial starts only when all its workers fit). ``time_budget_s``:
    after that many seconds every trial is stopped (they end TERMINATED, not errored).
    ``reuse_actors``: None/True (default) forks each trial's local workers from warm processes that
    imported trainforge and the trainable's libraries once (torch, ...), so a trial starts in
    milliseconds; each trial still gets processes of its own, so nothing leaks from one trial into
    the next (unlike Ray, which reuses the actor itself). False: fresh processes for every trial.
    ``server`` (trainforge extension): where trials run. None (default): on the train server that
    ``$TRAINFORGE_ADDRESS`` names (an error if it does not answer), else on the one running on this
    machine (``trainforge server start``) if it answers, else here (always here in a tuner that runs
    as a server's job: its trials stay within the job's grant); a tuner never starts a server.
    False: always here. A URL (``"http://127.0.0.1:8270"``): on that server (an error if it does not
    answer). On a server every trial is a job named ``<experiment>/<trial>`` with its config, shown
    on its dashboard and queued with its other jobs; the experiment directory must be reachable from
    the server's processes at the same path (the same machine, a shared file system, or cloud storage).

    Example::

        TuneConfig(metric="loss", mode="min", num_samples=20, scheduler=ASHAScheduler())
    """

    metric: str | None = None
    mode: str | None = None
    search_alg: Any = None
    scheduler: Any = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    reuse_actors: bool | None = None
    trial_name_creator: Any = None
    trial_dirname_creator: Any = None
    server: str | bool | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in ("min", "max"):
            raise _bad("TuneConfig", "mode", self.mode, 'use "min" or "max"')
        if self.metric is not None and not isinstance(self.metric, str):
            raise _bad("TuneConfig", "metric", self.metric, "use the name of a reported metric (a str)")
        n = self.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1):
            raise _bad("TuneConfig", "num_samples", n, "use an integer >= 1 (-1: until the searcher stops)")
        c = self.max_concurrent_trials
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise _bad("TuneConfig", "max_concurrent_trials", c, "use None (as many as fit) or an integer >= 1")
        t = self.time_budget_s
        if hasattr(t, "total_seconds"):  # a datetime.timedelta, as Ray accepts
            self.time_budget_s = t = float(getattr(t, "total_seconds")())  # noqa: B009
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
            raise _bad("TuneConfig", "time_budget_s", t, "use None or a number of seconds > 0")
        if self.reuse_actors is not None and not isinstance(self.reuse_actors, bool):
            raise _bad("TuneConfig", "reuse_actors", self.reuse_actors, "use None, True or False")
        for name in ("trial_name_creator", "trial_dirname_creator"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise _bad("TuneConfig", name, value, "use a function taking the trial and returning a str")
        if not (self.server is None or self.server is False or _is_url(self.server)):
            raise _bad("TuneConfig", "server", self.server, "use None (the running train server, if any), False "
                       "(run trials on this machine) or a train server's URL such as 'http://127.0.0.1:8270'")


def _is_url(value: Any) -> bool:
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        return False
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return url.scheme in ("http", "https") and bool(url.hostname)


@dataclass
class RunConfig(TrainRunConfig):
    """Train's :class:`trainforge.RunConfig` (``stop`` included: see there), under Tune's name. In a
    Tuner, ``stop`` applies to each trial, and every trial's run directory is
    ``{storage_path}/{name}/{trial}``; ``checkpoint_config`` and ``failure_config`` apply to each trial
    (a failing trial is retried from its latest checkpoint ``max_failures`` times). A Tuner takes
    train's ``RunConfig`` as it is (Ray 2.x code writes ``train.RunConfig(stop=...)``)."""
