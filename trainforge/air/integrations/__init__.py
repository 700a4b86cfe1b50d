"""Experiment trackers: ``mlflow`` (``MLflowLoggerCallback``, ``setup_mlflow``) and ``wandb``
(``WandbLoggerCallback``, ``setup_wandb``). Each imports its library only when used."""

__all__: list[str] = []
