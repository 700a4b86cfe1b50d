"""Train a gradient-boosted classifier with LightGBM on data-parallel workers (scikit-learn's breast
cancer data: 569 rows, 30 features, shipped with scikit-learn, nothing downloaded).

    python examples/lightgbm_breast_cancer.py --num-workers 2 --num-boost-round 50

Each worker builds a ``lightgbm.Dataset`` from its half of the training set and trains with
``tree_learner="data_parallel"``; ``get_network_params()`` gives it LightGBM's network parameters
for this attempt (fresh ports, a 2-minute ``time_out``). LightGBM evaluates each worker's own data,
so every worker gets the whole validation set: the reported ``valid-*`` metrics are exact.
``RayTrainReportCallback`` reports every round and checkpoints the booster every 10 rounds (rank 0
writes it). With ``--max-failures`` a crashed worker restarts the run from the last checkpoint.
``--params-form`` uses the trainer without a train loop (``params=``, ``label_column=``).
"""

from __future__ import annotations

import argparse
import tempfile

import lightgbm
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import trainforge as train
from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

PARAMS = {"objective": "binary", "metric": ["binary_logloss", "binary_error"], "num_leaves": 15, "verbose": -1}


def train_loop_per_worker(config: dict) -> None:
    def frame(name: str):
        return next(train.get_dataset_shard(name).iter_batches(batch_size=None, batch_format="pandas"))

    train_frame, valid_frame = frame("train"), frame("valid")
    train_set = lightgbm.Dataset(train_frame.drop(columns=["target"]), label=train_frame["target"])
    valid_set = lightgbm.Dataset(valid_frame.drop(columns=["target"]), label=valid_frame["target"], reference=train_set)
    params = {**config["params"], **get_network_params(), "tree_learner": "data_parallel", "pre_partition": True}
    start, rounds = None, config["num_boost_round"]
    checkpoint = train.get_checkpoint()
    if checkpoint:  # a restart (or resume_from_checkpoint): continue from the saved booster
        start = RayTrainReportCallback.get_model(checkpoint)
        rounds -= start.current_iteration()
    lightgbm.train(
        params, train_set, num_boost_round=rounds, valid_sets=[valid_set], valid_names=["valid"],
        init_model=start, callbacks=[RayTrainReportCallback(frequency=10)],
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-boost-round", type=int, default=50)
    parser.add_argument("--max-failures", type=int, default=0, help="restarts allowed after a worker failure")
    parser.add_argument("--storage-path", default=None, help="where runs are saved (default: a temporary directory)")
    parser.add_argument("--params-form", action="store_true", help="no train loop: params=, label_column=")
    args = parser.parse_args()

    x, y = load_breast_cancer(return_X_y=True, as_frame=True)
    train_df, valid_df = train_test_split(x.assign(target=y), test_size=0.25, random_state=0)
    datasets = {"train": train_df, "valid": valid_df}  # "train" is split across the workers
    run_config = RunConfig(
        storage_path=args.storage_path or tempfile.mkdtemp(prefix="trainforge-lightgbm-"),
        failure_config=FailureConfig(max_failures=args.max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_frequency=10),  # the params= form's
    )
    scaling_config = ScalingConfig(num_workers=args.num_workers)
    if args.params_form:
        trainer = LightGBMTrainer(
            params=PARAMS, label_column="target", num_boost_round=args.num_boost_round, datasets=datasets,
            scaling_config=scaling_config, run_config=run_config,
        )  # fmt: skip
    else:
        trainer = LightGBMTrainer(
            train_loop_per_worker, train_loop_config={"params": PARAMS, "num_boost_round": args.num_boost_round},
            datasets=datasets, scaling_config=scaling_config, run_config=run_config,
        )  # fmt: skip
    result = trainer.fit()
    booster = LightGBMTrainer.get_model(result.checkpoint)
    print(f"valid logloss: {result.metrics['valid-binary_logloss']:.4f}")
    print(f"valid accuracy: {1 - result.metrics['valid-binary_error']:.4f}")
    print(f"boosting rounds: {booster.current_iteration()}")
    print(f"checkpoint: {result.checkpoint.path}")


if __name__ == "__main__":
    main()
