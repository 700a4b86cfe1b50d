"""Ray Train 1.x's names (auto-filled result keys, files and directories), the keys and files of
trainforge.v1's own protocol, and the environment variables it reads (Ray's and MLflow's names).

Nothing here is read at import time: call :func:`detailed_autofilled_metrics`.
"""

from __future__ import annotations

import os

# Auto-filled into every train.report() result, as Ray Train 1.x did.
TIMESTAMP = "_timestamp"
TIME_THIS_ITER_S = "_time_this_iter_s"
TRAINING_ITERATION = "_training_iteration"
# ... and these too with TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS=1.
DATE = "_date"
TIME_TOTAL_S = "_time_total_s"
PID = "_pid"
HOSTNAME = "_hostname"
NODE_IP = "_node_ip"

ENV_DETAILED_AUTOFILLED_METRICS = "TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS"
# MLflow 3's switch for its file store, which MLflowLoggerCallback's default ({run_dir}/mlruns) is.
ENV_MLFLOW_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"

# Ray Train 1.x's layout: {logdir}/run_001/checkpoints/checkpoint_000001, {run_dir}/results.json.
RUN_DIR_FORMAT = "run_{:03d}"
TRAIN_CHECKPOINT_SUBDIR = "checkpoints"
CHECKPOINT_FILE_FORMAT = "checkpoint_{:06d}"
RESULT_FILE_JSON = "results.json"
DEFAULT_LOGDIR_FORMAT = "train_{:%Y-%m-%d_%H-%M-%S}"  # under trainforge's default storage path

# trainforge.v1's own: a worker group's core run is kept in {logdir}/.trainforge/group_<date>_<id>; each
# rank's answer rides the core's report path as metrics[MESSAGE_KEY]; a checkpoint saved with
# train.save_checkpoint() is one file in the core checkpoint's directory.
GROUP_STORAGE_DIR = ".trainforge"
GROUP_NAME_FORMAT = "group_{:%Y-%m-%d_%H-%M-%S}_{}"  # the time it started, a random id
MESSAGE_KEY = "_trainforge_v1"
CHECKPOINT_FILE = "v1_checkpoint.pkl"


def detailed_autofilled_metrics() -> bool:
    """Ray's switch for the detailed auto-filled keys (``_date``, ``_pid``, ...): "1" turns them on."""
    return os.environ.get(ENV_DETAILED_AUTOFILLED_METRICS, "0").strip() not in ("", "0")
