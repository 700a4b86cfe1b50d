"""Trainables (what a trial runs) and how each trial becomes a train run.

- a function ``f(config)`` (or ``async def``) that calls ``tune.report``: the trial is a run of one
  worker process executing it (its resources: ``with_resources``, default 1 CPU);
- a model class of any framework (``trainforge.model.Model``, ``XGBoostModel``, ...) or a registered
  definition (``"models:/name"``): as ``ModelTrainer(MyModel, data=...)`` (below), searching its
  ``hyperparameter_space()`` (a definition's stored space) when no ``param_space`` is given;
- a trainer (``DataParallelTrainer``, ``TorchTrainer``, ...): the trial is that trainer's run with
  ``param_space["train_loop_config"]`` deep-merged into its config and ``["scaling_config"]`` in place
  of its own; rank 0's reports are the trial's results.

Either way the trial's run has its own directory under the experiment's, and the controller,
checkpoints, failure handling and restore of ``fit()``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
from typing import Any

from trainforge import DataParallelTrainer, RunConfig, ScalingConfig
from trainforge._internal.backend import resolve_backend
from trainforge.tune._variants import merge_config

RESOURCES_ATTR = "_trainforge_tune_resources"
PARAMETERS_ATTR = "_trainforge_tune_parameters"


def with_parameters(trainable: Any, **kwargs: Any) -> Any:
    """``trainable(config, **kwargs)`` in every trial: large objects are pickled once with the
    trainable (as Ray's, which puts them in the object store)."""
    if is_trainer(trainable):
        raise ValueError("with_parameters() takes a function trainable; pass objects to a trainer directly")
    _check_function(trainable, extra=tuple(kwargs))

    @functools.wraps(trainable)
    def wrapped(config: dict[str, Any]) -> Any:
        return trainable(config, **kwargs)

    if inspect.iscoroutinefunction(trainable):
        @functools.wraps(trainable)
        async def awrapped(config: dict[str, Any]) -> Any:
            return await trainable(config, **kwargs)

        setattr(awrapped, RESOURCES_ATTR, getattr(trainable, RESOURCES_ATTR, None))
        awrapped.__signature__ = _CONFIG_SIGNATURE  # type: ignore[attr-defined]
        return awrapped
    setattr(wrapped, RESOURCES_ATTR, getattr(trainable, RESOURCES_ATTR, None))
    wrapped.__signature__ = _CONFIG_SIGNATURE  # type: ignore[attr-defined]
    return wrapped


_CONFIG_SIGNATURE = inspect.Signature([inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD)])


def with_resources(trainable: Any, resources: dict[str, float] | Any) -> Any:
    """What one trial of a function trainable holds, e.g. ``{"cpu": 2, "gpu": 1}`` (keys as Ray's:
    cpu, gpu, memory or custom names; a ``ScalingConfig`` also works). For a trainer, give its
    ``scaling_config`` instead."""
    if is_trainer(trainable):
        raise ValueError("with_resources() takes a function trainable; a trainer's resources are its scaling_config")
    if isinstance(resources, ScalingConfig):
        request = {"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker,
                   **(resources.resources_per_worker or {})}  # fmt: skip
    elif isinstance(resources, dict):
        request = {}
        for key, value in resources.items():
            name = {"cpu": "CPU", "gpu": "GPU"}.get(str(key).lower(), str(key))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"with_resources(): {key}={value!r} is not valid: use a number >= 0")
            request[name] = float(value)
    else:
        raise ValueError(f"with_resources(): resources={resources!r} is not valid: use a dict such as {{'cpu': 2}}")

    @functools.wraps(trainable)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return trainable(*args, **kwargs)

    target: Any = wrapped
    if inspect.iscoroutinefunction(trainable):
        @functools.wraps(trainable)
        async def awrapped(*args: Any, **kwargs: Any) -> Any:
            return await trainable(*args, **kwargs)

        target = awrapped
    setattr(target, RESOURCES_ATTR, {k: v for k, v in request.items() if v > 0})
    return target


def as_model_trainer(trainable: Any, param_space: dict[str, Any] | None,
                     data: Any = None) -> tuple[Any, dict[str, Any] | None]:  # fmt: skip
    """``Tuner(MyModel)`` / ``Tuner("models:/name")``: a model class of any framework (or a registered
    definition) is trained by a default ``ModelTrainer(MyModel, data=data)``; a managed trainer given
    no ``param_space`` searches its definition's space (``hyperparameter_space()``, or the space
    stored with a registered definition) over the model's config (``{"train_loop_config": space}``)."""
    from trainforge.model import ModelTrainer, is_managed, is_model_class

    if is_model_class(trainable) or (isinstance(trainable, str) and trainable.startswith("models:/")) or (
        isinstance(getattr(trainable, "uri", None), str) and not is_trainer(trainable)
    ):
        trainable = ModelTrainer(trainable, data=data)
    elif data is not None:
        raise ValueError("Tuner(data=...) is for a model class or a model reference; give a trainer its data itself "
                         "(ModelTrainer(MyModel, data=MyData))")  # fmt: skip
    if param_space is None and is_managed(trainable):
        space = trainable.hyperparameter_space()
        if space is not None:
            param_space = {"train_loop_config": dict(space)}
    return trainable, param_space


def is_trainer(trainable: Any) -> bool:
    return isinstance(trainable, DataParallelTrainer)


def _check_function(fn: Any, extra: tuple[str, ...] = ()) -> None:
    if not callable(fn):
        raise ValueError(
            f"trainable={fn!r} is not valid: pass a function f(config) (or async def), or a trainer "
            "such as TorchTrainer(...)"
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = [p for p in sig.parameters.values() if p.name not in extra]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    if not (len(required) == 1 or (not required and (positional or varargs))):
        name = getattr(fn, "__qualname__", repr(fn))
        raise ValueError(
            f"trainable {name}{sig} is not valid: a function trainable takes exactly one argument, the "
            "trial's config: def train_fn(config): ... (use tune.with_parameters for more)"
        )


def check_trainable(trainable: Any) -> None:
    """Raise ValueError (before any trial runs) unless ``trainable`` is a trainer or ``f(config)``."""
    if not is_trainer(trainable):
        _check_function(trainable)


def _run_function(fn: Any, config: dict[str, Any]) -> None:
    """A function trial's worker: run it (awaited if async); a dict it returns is its last result."""
    from trainforge.tune._context import report

    if inspect.iscoroutinefunction(fn):
        out = asyncio.run(fn(config))
    else:
        out = fn(config)
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
    if isinstance(out, dict):
        report(out)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def trial_resources(trainable: Any, config: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(workers, what each needs) of the trial that ``config`` makes."""
    if is_trainer(trainable):
        scaling = config.get("scaling_config", trainable.scaling_config)
        if not isinstance(scaling, ScalingConfig):
            raise ValueError(
                f"param_space['scaling_config']={scaling!r} is not valid: use a trainforge.ScalingConfig "
                "(search spaces go inside train_loop_config)"
            )
        need = {"CPU": scaling.cpus_per_worker, "GPU": scaling.gpus_per_worker, **(scaling.resources_per_worker or {})}
        return scaling.min_workers, {k: float(v) for k, v in need.items() if v > 0}
    return 1, dict(getattr(trainable, RESOURCES_ATTR, None) or {"CPU": 1.0})


def make_trial_trainer(
    trainable: Any, config: dict[str, Any], run_config: RunConfig, metadata: dict[str, Any],
    resume_from: Any = None,
) -> DataParallelTrainer:  # fmt: skip
    """The trainer whose ``fit_iter()`` is the trial."""
    if is_trainer(trainable):
        # A trainer may take more top-level keys into its train_loop_config (the params= form of
        # XGBoostTrainer / LightGBMTrainer: param_space={"params": {...}}, as in Ray Tune).
        top_keys = tuple(getattr(trainable, "_param_space_keys", ()))
        unknown = sorted(set(config) - {"train_loop_config", "scaling_config", *top_keys})
        if unknown:
            also = "".join(f", {k!r}: ..." for k in top_keys)
            raise ValueError(
                f"param_space key(s) {unknown} are not valid for a trainer trainable: use "
                f"param_space={{'train_loop_config': {{...}}, 'scaling_config': ScalingConfig(...){also}}}"
            )
        trainer = copy.copy(trainable)
        trainer._backend = resolve_backend(trainer.backend_config)  # its own: a backend may hold driver state
        trainer.train_loop_config = merge_config(trainable.train_loop_config or {}, config.get("train_loop_config") or {})
        top = {key: config[key] for key in top_keys if key in config}
        if top:
            trainer.train_loop_config = merge_config(trainer.train_loop_config, top)
        if "scaling_config" in config:
            trainer.scaling_config = config["scaling_config"]
        trainer.run_config = run_config
        trainer.metadata = {**trainable.metadata, **metadata}
        if resume_from is not None:
            trainer.resume_from_checkpoint = resume_from
        return trainer
    workers, need = trial_resources(trainable, config)
    extra = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
    scaling = ScalingConfig(
        num_workers=1, use_gpu=need.get("GPU", 0) > 0,
        resources_per_worker={"CPU": need.get("CPU", 0.0), **({"GPU": need["GPU"]} if need.get("GPU") else {}), **extra},
    )  # fmt: skip
    return DataParallelTrainer(
        functools.partial(_run_function, trainable), train_loop_config=config, scaling_config=scaling,
        run_config=run_config, metadata=metadata, resume_from_checkpoint=resume_from,
    )  # fmt: skip
