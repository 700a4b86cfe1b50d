"""Train a gradient-boosted classifier with XGBoost on data-parallel workers (scikit-learn's breast
cancer data: 569 rows, 30 features, shipped with scikit-learn, nothing downloaded).

    python examples/xgboost_breast_cancer.py --num-workers 2 --num-boost-round 50

Each worker builds a ``DMatrix`` from its half of the training set; XGBoost's collective (a tracker
the driver starts for every attempt) joins the workers so that they grow the same trees from the
histograms of all the data, and sums the evaluation metrics over the workers. ``RayTrainReportCallback``
reports every round's metrics and checkpoints the booster every 10 rounds (rank 0 writes it). With
``--max-failures`` a crashed worker restarts the run, which continues boosting from the last
checkpoint. ``--params-form`` uses the trainer without a train loop (``params=``, ``label_column=``).
"""

from __future__ import annotations

import argparse
import tempfile

import xgboost
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import trainforge as train
from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge.xgboost import RayTrainReportCallback, XGBoostTrainer

PARAMS = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "tree_method": "hist", "max_depth": 4}


def train_loop_per_worker(config: dict) -> None:
    def dmatrix(name: str) -> xgboost.DMatrix:
        frame = next(train.get_dataset_shard(name).iter_batches(batch_size=None, batch_format="pandas"))
        return xgboost.DMatrix(frame.drop(columns=["target"]), label=frame["target"])

    dtrain, dvalid = dmatrix("train"), dmatrix("valid")
    start, rounds = None, config["num_boost_round"]
    checkpoint = train.get_checkpoint()
    if checkpoint:  # a restart (or resume_from_checkpoint): continue from the saved booster
        start = RayTrainReportCallback.get_model(checkpoint)
        rounds -= start.num_boosted_rounds()
    xgboost.train(
        config["params"], dtrain, num_boost_round=rounds, evals=[(dtrain, "train"), (dvalid, "valid")],
        xgb_model=start, verbose_eval=False, callbacks=[RayTrainReportCallback(frequency=10)],
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
    datasets = {"train": train_df, "valid": valid_df}  # both split across the workers
    run_config = RunConfig(
        storage_path=args.storage_path or tempfile.mkdtemp(prefix="trainforge-xgboost-"),
        failure_config=FailureConfig(max_failures=args.max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_frequency=10),  # the params= form's
    )
    scaling_config = ScalingConfig(num_workers=args.num_workers)
    if args.params_form:
        trainer = XGBoostTrainer(
            params=PARAMS, label_column="target", num_boost_round=args.num_boost_round, datasets=datasets,
            scaling_config=scaling_config, run_config=run_config,
        )  # fmt: skip
    else:
        trainer = XGBoostTrainer(
            train_loop_per_worker, train_loop_config={"params": PARAMS, "num_boost_round": args.num_boost_round},
            datasets=datasets, dataset_config={"datasets_to_split": "all"}, scaling_config=scaling_config,
            run_config=run_config,
        )  # fmt: skip
    result = trainer.fit()
    booster = XGBoostTrainer.get_model(result.checkpoint)
    print(f"valid logloss: {result.metrics['valid-logloss']:.4f}")
    print(f"valid accuracy: {1 - result.metrics['valid-error']:.4f}")
    print(f"boosting rounds: {booster.num_boosted_rounds()}")
    print(f"checkpoint: {result.checkpoint.path}")


if __name__ == "__main__":
    main()
