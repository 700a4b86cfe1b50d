"""``FrameworkTrainer``: what ``TorchTrainer``, ``TensorflowTrainer``, ``XGBoostTrainer`` and
``LightGBMTrainer`` share beneath their Ray-compatible constructors. Each constructor keeps its own
explicit signature (``<framework>_config`` in place of ``backend_config``) and hands its arguments to
:meth:`FrameworkTrainer._init_framework`, which defaults and checks the config, checks that the
framework is installed in the driver's environment (without importing it), and builds the
``DataParallelTrainer``; ``restore()`` gets the config back under the constructor's name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from trainforge._internal.backend import BackendConfig
from trainforge._internal.trainer import DataParallelTrainer


class FrameworkTrainer(DataParallelTrainer):
    """Base of the trainers of one framework. Subclasses set ``_framework`` (``"torch"``: the
    constructor takes ``torch_config``, a ``trainforge.torch.<_config_cls>``) and ``_config_cls``,
    implement ``_check_installed`` and may wrap the workers' ``worker_init_fn``."""

    _framework: ClassVar[str] = ""  # "torch" | "tensorflow" | "xgboost" | "lightgbm"
    _config_cls: ClassVar[type[BackendConfig]] = BackendConfig

    @property
    def _config_arg(self) -> str:
        """The constructor's name for the backend config: ``torch_config``."""
        return f"{self._framework}_config"

    def _init_framework(
        self,
        train_loop_per_worker: Callable[..., Any],
        backend_config: BackendConfig | None,
        /,
        *,
        worker_init_fn: Callable[[], Any] | None = None,
        **common: Any,
    ) -> None:
        """The constructor's body: ``backend_config`` is the ``<framework>_config`` argument, ``common``
        the other arguments of ``DataParallelTrainer``."""
        name, cls = type(self).__name__, self._config_cls
        if backend_config is None:
            backend_config = cls()
        elif not isinstance(backend_config, cls):
            raise TypeError(
                f"{name}({self._config_arg}={backend_config!r}) must be a "
                f"trainforge.{self._framework}.{cls.__name__}, got {type(backend_config).__name__}."
            )
        self._check_installed()
        super().__init__(
            train_loop_per_worker,
            backend_config=backend_config,
            worker_init_fn=self._worker_init(backend_config, worker_init_fn),
            **common,
        )

    def _check_installed(self) -> None:
        """Raise ImportError naming what to install when the framework is missing; import nothing."""
        raise NotImplementedError

    def _worker_init(self, backend_config: Any, worker_init_fn: Callable[[], Any] | None) -> Callable[[], Any] | None:
        """The ``worker_init_fn`` the workers run: the user's, unless the framework prepares them first."""
        return worker_init_fn

    def _backend_state(self) -> dict[str, Any]:
        # What restore() passes back to the constructor: the config, under the constructor's name.
        return {self._config_arg: self.backend_config}
