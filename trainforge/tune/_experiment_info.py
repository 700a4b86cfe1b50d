"""What a train server's Experiments pages learn of a tune experiment, both ways it reaches them:

- while it runs with trials as the server's jobs, every trial job carries the experiment's tag
  (:func:`experiment_tag`: its directory, name, searcher, scheduler, metric, mode and search space
  described by :func:`describe_space`; the server's ``TrialTagIn``), and each stop the tuner decides is
  sent as a decision (:func:`decision_body`: the server's ``DecisionIn``);
- afterwards, from its directory (:func:`read_experiment`: ``experiment_state.json``, read by
  :class:`~trainforge.tune._experiment.ExperimentStore`, and each trial's run directories), as
  ``trainforge experiments import PATH`` sends it (the server's ``ExperimentImportIn``).

Configurations are flattened as a trial job's ``config`` is (:func:`~trainforge._internal.trainer_job.flat_config`:
nested keys joined by ``/``; a trainer's ``train_loop_config``), so the space's keys, the trials' configs
and the server's columns agree.
"""

from __future__ import annotations

import math
import os
from typing import Any

from trainforge._internal.trainer_job import flat_config
from trainforge.client import TrialState
from trainforge.tune._experiment import ExperimentStore
from trainforge.tune._sample import Categorical, Domain, Float, Integer, Normal
from trainforge.tune._trainable import is_trainer
from trainforge.tune._variants import is_grid

# The fields of the server's DecisionIn (trainforge.server.experiments.schemas), which refuses others.
DECISION_KEYS = ("kind", "iteration", "rule", "time_attr", "at", "rung", "rung_at", "value", "source_trial", "text")
MAX_POINTS = 2000  # points per metric of an imported trial's history
MAX_KEYS = 50  # metrics of an imported trial's history


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v))


def _param(domain: Any) -> dict[str, Any] | None:
    """A search-space dimension as the server's ``ParamIn``, or None (not one it can draw)."""
    if isinstance(domain, (Float, Integer)):
        low, high = domain.bounds()
        kind = "float" if isinstance(domain, Float) else "int"
        return {"kind": kind, "low": float(low), "high": float(high), "log": bool(domain.log)}
    if isinstance(domain, Normal):
        return {"kind": "float"}
    choices = list(domain.categories) if isinstance(domain, Categorical) else domain["grid_search"] if is_grid(domain) else None
    if choices is not None and all(_scalar(c) for c in choices) and len(choices) <= 1000:
        unique = list({repr(c): c for c in choices}.values())  # a grid may repeat a value
        return {"kind": "categorical", "choices": unique}
    return None


def describe_space(param_space: dict[str, Any], trainable: Any) -> dict[str, dict[str, Any]]:
    """The search space's dimensions by their key in a trial job's ``config`` (a trainer's: within
    its ``train_loop_config``); constants and ``sample_from`` functions are left out."""
    space = param_space.get("train_loop_config") or {} if is_trainer(trainable) else param_space
    out: dict[str, dict[str, Any]] = {}

    def walk(prefix: str, node: Any) -> None:
        if len(out) >= 500:
            return
        if isinstance(node, Domain) or is_grid(node):
            described = _param(node)
            if described is not None and prefix and len(prefix) <= 200:
                out[prefix] = described
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)

    walk("", space if isinstance(space, dict) else {})
    return out


def searcher_name(searcher: Any) -> str:
    """The searcher's class, the one a ``ConcurrencyLimiter`` wraps included."""
    inner = getattr(searcher, "searcher", None)
    return f"{type(inner).__name__} (limited)" if inner is not None else type(searcher).__name__


def experiment_path(path: str) -> str:
    """The experiment directory as the server keys it: absolute on this machine, a URL as it is."""
    return path if "://" in path else os.path.abspath(path)


def experiment_info(*, searcher: Any, scheduler: Any, metric: str | None, mode: str | None,
                    param_space: dict[str, Any], trainable: Any) -> dict[str, Any]:  # fmt: skip
    """What the experiment is, saved in its snapshot (``info``) and sent with every trial job."""
    return {"searcher": searcher_name(searcher), "scheduler": type(scheduler).__name__, "metric": metric, "mode": mode,
            "space": describe_space(param_space, trainable), "trainer": is_trainer(trainable)}  # fmt: skip


def experiment_tag(info: dict[str, Any], *, path: str, name: str, tune_id: str, trial_id: str) -> dict[str, Any]:
    """A trial job's ``experiment`` (the server's ``TrialTagIn``)."""
    fields = {k: info.get(k) for k in ("searcher", "scheduler", "metric", "mode", "space")}
    return {"path": experiment_path(path), "name": name[:200], "tune_id": tune_id, "trial_id": trial_id, **fields}


def decision_body(decision: dict[str, Any]) -> dict[str, Any]:
    """A decision the tuner recorded, as the server takes it (``DecisionIn``'s fields only)."""
    body = {k: decision[k] for k in DECISION_KEYS if decision.get(k) is not None}
    if isinstance(body.get("iteration"), float):
        body["iteration"] = int(body["iteration"])
    return body


_STOP_REASONS = {"stop criteria": "stopper", "time budget": "budget", "Ctrl-C": "interrupted"}


def _decisions(trial: dict[str, Any]) -> list[dict[str, Any]]:
    """The trial's decisions (older snapshots have none: made from its stop reason)."""
    saved = [decision_body(d) for d in trial.get("decisions") or []]
    if saved:
        return saved
    last = trial.get("last_result") or {}
    it = last.get("training_iteration")
    kind = "pruned" if trial.get("stop_reason") == "scheduler" and last.get("pruned") else _STOP_REASONS.get(
        str(trial.get("stop_reason")))  # fmt: skip
    if kind is None or trial.get("status") != TrialState.TERMINATED:
        return []
    return [{"kind": kind, **({"iteration": int(it)} if isinstance(it, (int, float)) else {})}]


def _history(store: ExperimentStore, trial: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """The trial's numeric metrics by report, from its run directories (one per PBT run)."""
    from trainforge import Result

    out: dict[str, list[list[Any]]] = {}
    base = 0
    for run in range(int(trial.get("run_index") or 0) + 1):
        name = trial["dirname"] if run == 0 else f"{trial['dirname']}_pbt{run}"
        try:
            rows = Result.from_path(f"{store.path}/{name}", store.fs if not store.local else None).metrics_history
        except (ValueError, OSError):
            continue
        for i, row in enumerate(rows):
            for key, value in flat_config(row).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and (key in out or len(out) < MAX_KEYS):
                    out.setdefault(key, []).append([base + i + 1, None, float(value) if math.isfinite(value) else None])
        base += len(rows)
    for key, points in out.items():
        if len(points) > MAX_POINTS:
            step = len(points) / MAX_POINTS
            out[key] = [points[int(k * step)] for k in range(MAX_POINTS - 1)] + [points[-1]]
    return out


def read_experiment(path: str, storage_filesystem: Any = None) -> dict[str, Any]:
    """The experiment in directory ``path`` as the server's ``POST /experiments/import`` takes it.
    ValueError when there is none."""
    store = ExperimentStore(path, storage_filesystem)
    state = store.load_state()
    if state is None:
        raise ValueError(f"{path}: no tune experiment there ({path.rstrip('/')}/experiment_state.json is missing): "
                         "give the directory a Tuner wrote, {storage_path}/{name}")  # fmt: skip
    info = state.get("info") or {}
    sched: dict[str, Any] = state["scheduler"] if isinstance(state.get("scheduler"), dict) else {}
    trainer = bool(info.get("trainer"))
    trials = []
    for t in state.get("trials", []):
        config = t.get("config") or {}
        if trainer and isinstance(config.get("train_loop_config"), dict):
            config = config["train_loop_config"]
        last = t.get("last_result") or {}
        timestamp, total = last.get("timestamp"), last.get("time_total_s")
        started = timestamp - total if isinstance(timestamp, (int, float)) and isinstance(total, (int, float)) else None
        trials.append({
            "trial_id": t["trial_id"], "name": t.get("name") or t["trial_id"], "config": flat_config(config),
            "status": t.get("status", TrialState.TERMINATED), "error": t.get("error"), "pruned": bool(last.get("pruned")),
            "stop_reason": t.get("stop_reason"), "metrics": {k: v for k, v in flat_config(last).items() if _scalar(v)},
            "history": _history(store, t), "decisions": _decisions(t), "checkpoint": t.get("checkpoint"),
            "started_at": started, "ended_at": timestamp if started is not None else None,
        })  # fmt: skip
    return {
        "path": experiment_path(store.path), "name": str(state.get("experiment_name") or os.path.basename(store.path))[:200],
        "tune_id": state.get("experiment_id"), "searcher": info.get("searcher"),
        "scheduler": info.get("scheduler") or sched.get("scheduler"), "metric": info.get("metric") or sched.get("metric"),
        "mode": info.get("mode") or sched.get("mode"), "space": info.get("space") or {}, "saved_at": state.get("saved_at"),
        "trials": trials,
    }  # fmt: skip
