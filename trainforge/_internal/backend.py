"""``Backend`` / ``BackendConfig``: hooks a framework plugs into the worker group's lifecycle."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any


class BackendConfig:
    """Configuration of a training backend. Subclass it (usually as a dataclass) and point
    ``backend_cls`` at your :class:`Backend`. ``backend_cls`` may be a property or a plain method,
    as in Ray Train.

    Example::

        class EnvBackend(Backend):
            def on_start(self, worker_group, backend_config):
                def set_env(value):
                    import os
                    os.environ["MY_ENV_VAR"] = value
                worker_group.execute(set_env, backend_config.env_var)

        @dataclass
        class EnvBackendConfig(BackendConfig):
            env_var: str = "default"

            @property
            def backend_cls(self):
                return EnvBackend
    """

    @property
    def backend_cls(self) -> type[Backend]:
        return Backend

    @property
    def framework(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {}

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        """A function returning the context manager each worker runs the train loop in (Ray Train's
        hook; XGBoost enters its collective communicator here). Picklable: it is sent to the workers."""
        return contextlib.nullcontext


class Backend:
    """Lifecycle hooks run on the driver with the worker group.

    ``worker_group.execute(fn, *args, **kwargs)`` runs ``fn`` on every worker and returns the list of
    results in rank order; ``worker_group.execute_single(rank, fn, ...)`` runs it on one worker.
    ``on_start`` runs after the workers are up (set up process groups, environment variables),
    ``on_training_start`` right before the train loop starts, ``on_shutdown`` after it ended (on
    the workers, which are still up: a clean finish only), ``on_attempt_end`` after the workers
    stopped, whatever the outcome.
    """

    share_cuda_visible_devices: bool = False

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        pass

    def on_training_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        pass

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        pass

    def on_attempt_end(self, backend_config: BackendConfig) -> None:
        """trainforge extension, on the driver: the attempt's workers are gone, however it ended (a
        clean finish, a failed worker, a resize, Ctrl-C). Release what ``on_start`` holds in the
        driver (XGBoost's tracker) so that the next attempt starts afresh."""


def resolve_backend(config: BackendConfig) -> Backend:
    """Instantiate the backend of ``config``; ``backend_cls`` may be a property or a method."""
    if not isinstance(config, BackendConfig):
        raise TypeError(
            f"backend_config={config!r} must be an instance of trainforge.backend.BackendConfig "
            "(or a subclass such as trainforge.torch.TorchConfig)."
        )
    cls = config.backend_cls
    if not isinstance(cls, type) and callable(cls):
        cls = cls()
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(
            f"{type(config).__name__}.backend_cls must be a subclass of trainforge.backend.Backend, got {cls!r}."
        )
    return cls()
