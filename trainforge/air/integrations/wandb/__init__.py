"""Weights & Biases (Ray's integration of the same name): ``WandbLoggerCallback`` logs every report
of a run or of each tuner trial (a run per trial, grouped by experiment) from the driver, off the
training path; ``setup_wandb`` starts a run inside the train loop (rank 0 only by default).

Needs ``pip install 'trainforge[wandb]'``; imported only when a run starts. ``WANDB_MODE=offline``
(or ``mode="offline"``) needs no login and no network.
"""

from trainforge._internal.sinks.wandb import WandbLoggerCallback, setup_wandb

__all__ = ["WandbLoggerCallback", "setup_wandb"]
