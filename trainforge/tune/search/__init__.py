"""Search algorithms: the default random/grid generator, a concurrency limiter; Optuna in ``.optuna``."""

from trainforge.tune.search._searcher import BasicVariantGenerator, ConcurrencyLimiter, Searcher

__all__: list[str] = ["BasicVariantGenerator", "ConcurrencyLimiter", "Searcher"]
