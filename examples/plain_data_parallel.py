"""A plain data-parallel run (no framework): three workers split a dataset of three items.

    python examples/plain_data_parallel.py

Each worker reads its shard of ``datasets["train"]`` and reports the items it saw; the script checks
that every item was seen by exactly one worker.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import trainforge as train
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig


def train_loop_per_worker() -> None:
    shard = train.get_dataset_shard("train")
    items = [int(x) for batch in shard.iter_batches(batch_size=1) for x in batch["item"]]
    train.report({"rank": train.get_context().get_world_rank(), "items": items})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=3)
    parser.add_argument("--storage-path", default=None, help="where results go (default: trainforge's)")
    args = parser.parse_args(argv)

    data = [1, 2, 3]
    trainer = DataParallelTrainer(
        train_loop_per_worker,
        datasets={"train": data},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(storage_path=args.storage_path),
    )
    seen: Counter[int] = Counter()
    run = trainer.fit_iter()
    for report in run:  # one TrainingReport per round of reports, with every rank's metrics
        for metrics in report.all_metrics:
            print(f"rank {metrics['rank']} saw {metrics['items']}")
            seen.update(metrics["items"])
    result = run.result
    assert result is not None
    print(f"result: {result}")
    print(f"result.metrics (rank 0): {result.metrics}")

    if sorted(seen.elements()) != sorted(data):
        print(f"every item must be seen exactly once; seen counts: {dict(seen)}", file=sys.stderr)
        return 1
    print(f"every item seen exactly once: {sorted(seen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
