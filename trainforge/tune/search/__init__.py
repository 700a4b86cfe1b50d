"""Search algorithms: the default random/grid generator, a concurrency limiter; Optuna in ``.optuna``."""

__all__: list[str] = []
