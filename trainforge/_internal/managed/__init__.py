"""The managed training loop: ``Model`` (one object for train, tune, registry and serving), the
worker-side loop that runs it inside ``TorchTrainer``, and the RaySGD ``TrainingOperator`` port.

    config.py         LoopConfig, EarlyStopping: what the loop does, validated on construction
    model.py          Model: the user's hooks (setup, forward, train_step, ...) and inference
    operator.py       TrainingOperator: RaySGD's hook names mapped onto Model
    loop.py           the worker side: a plain train_loop_per_worker for trainforge.torch.TorchTrainer
    metrics.py        sample-weighted epoch metrics, one all_reduce per epoch
    data.py           loaders: sharding, deterministic shuffles, resuming mid-epoch
    artifact.py       a model directory (weights, config, class) and the loop's training state
    early_stopping.py the early-stopping tracker
    commands.py       the driver -> workers command channel of driven runs
    driven.py         a driven run: train()/validate() one epoch at a time on a group that stays up
    trainer.py        ModelTrainer: a TorchTrainer whose loop is the managed loop
    sgd.py            RaySGD's TorchTrainer driver class over ModelTrainer
    meters.py         RaySGD's AverageMeter / AverageMeterCollection

Nothing here imports torch at module level except the worker-side modules (loop, metrics, data).
"""
