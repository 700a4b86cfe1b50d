"""Tracker sinks: driver-side callbacks that send every report of a run (or of each tuner trial) to
CSV/JSON files, TensorBoard, MLflow or Weights & Biases, off the training path.

- ``api``: :class:`LoggerCallback` (Ray Tune's base: ``log_trial_start/result/save/end``), the base
  of every sink, and :class:`TrialInfo`, what a sink is told about the run it logs.
- ``drain``: the bounded queue and the thread that run a sink's hooks, so ``report()`` never waits.
- ``run_info``: who the run is (a plain ``fit()`` or a tuner's trial, its config, where its files go).
- ``values``: flattening, numeric filtering and truncation shared by the sinks.
- ``files``, ``tensorboard``, ``mlflow``, ``wandb``: the sinks; each imports its library only on its
  own thread, when its first run starts.
"""
