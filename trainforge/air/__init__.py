"""Ray AIR's integration modules under their Ray paths (``trainforge.air.integrations.mlflow``,
``trainforge.air.integrations.wandb``), so tracker code ports by changing imports."""

__all__: list[str] = []
