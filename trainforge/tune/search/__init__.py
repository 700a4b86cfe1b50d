"""Search algorithms: the default random/grid generator, a concurrency limiter; Optuna in ``.optuna``."""

from trainforge.tune.search._searcher import (
    PRUNED_RESULT_KEY,
    BasicVariantGenerator,
    ConcurrencyLimiter,
    Searcher,
)

# PRUNED_RESULT_KEY: what a searcher reads in the last result of a trial a scheduler stopped early
__all__: list[str] = ["PRUNED_RESULT_KEY", "BasicVariantGenerator", "ConcurrencyLimiter", "Searcher"]
