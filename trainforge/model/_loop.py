"""The worker side of the managed loop: what ``ModelTrainer``'s ``train_loop_per_worker`` runs inside
an ordinary ``trainforge.torch.TorchTrainer`` worker (the same controller, restarts, checkpoints and
reports as any train loop; no second execution path).

On each worker: mixed precision is turned on (``trainforge.torch.accelerate``) before the model is
built, the ``Model`` is built with the worker's config (``config[BATCH_SIZE]`` divided by the world
size) and its loaders sharded, and the latest checkpoint (a restart, ``resume_from_checkpoint``) is
loaded: weights, optimizers, schedulers, gradient scaler, epoch, the batch within the epoch, the
epoch's partial metric sums, early stopping, RNG states (rank 0's, restored on rank 0). Then either

- ``fit()``: ``num_epochs`` epochs, each reported (``trainforge.report``) with its train and
  validation metrics and, every ``checkpoint_every_n_epochs`` epochs and after the last, a
  checkpoint written by rank 0 (the others report ``checkpoint=None``); or
- a driven run (``train_loop_config`` holds ``DRIVER_KEY``): commands from the driver, one epoch of
  training or validation each, answered by a report carrying the command's sequence number.

A checkpoint every ``checkpoint_every_n_batches`` batches is reported as ``{"epoch", "batches_done"}``;
a restart resumes after its batch, in the same data order, with the epoch's sums so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

import trainforge
from trainforge import Checkpoint
from trainforge._internal.torch import amp
from trainforge.model import _artifact as artifact
from trainforge.model._commands import (
    DRIVER_KEY,
    LOCAL_KEY,
    RESULT_KEY,
    SEQ_KEY,
    Command,
    CommandClient,
)
from trainforge.model._config import BATCH_COUNT, NUM_SAMPLES, LoopConfig, split_batch_size
from trainforge.model._data import epoch_batches, prepare_loader, setup_worker_data, with_last
from trainforge.model._early_stopping import EarlyStoppingTracker
from trainforge.model._metrics import EpochMetrics, reduce_summary
from trainforge.model._model import Model
from trainforge.model._support import bind_and_init
from trainforge.torch import get_device, prepare_model

STATE_FORMAT = 1


def run_managed(model_cls: type[Model], loop_config: LoopConfig, config: dict[str, Any], options: dict[str, Any]) -> None:
    """The managed train loop of one worker (``train_loop_per_worker`` of a ``ModelTrainer``)."""
    runner = ManagedRunner(model_cls, loop_config, config, options)
    try:
        driver = config.get(DRIVER_KEY)
        if driver is not None:
            runner.serve(driver)
        else:
            runner.fit()
    finally:
        runner.close()


@dataclass
class LoopState:
    """Where the loop is; saved in every checkpoint."""

    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch done (a mid-epoch checkpoint)
    global_step: int = 0  # training batches run
    optimizer_steps: int = 0
    partial: dict[str, Any] | None = None  # the current epoch's metric sums (a mid-epoch checkpoint)
    early_stopping: dict[str, Any] | None = None
    stopped_early: bool = False
    last_train: dict[str, Any] | None = None  # the last training epoch's metrics


class WorkerContext:
    """What a ``Model`` sees of the loop it runs in (``register``, ``backward``, ``optimize``)."""

    def __init__(self, runner: ManagedRunner):
        self._runner = runner
        self.device: torch.device = runner.device
        self.world_rank = runner.rank
        self.local_rank = runner.local_rank
        self.world_size = runner.world_size
        self.loop_config = runner.lc
        self.options = runner.options
        self.info: dict[str, Any] = {}

    @property
    def scheduler_step_freq(self) -> str | None:
        return self.options.get("scheduler_step_freq", self.loop_config.scheduler_step_freq)  # type: ignore[no-any-return]

    def prepare_model(self, module: torch.nn.Module, ddp_args: dict[str, Any]) -> torch.nn.Module:
        strategy = "ddp" if self.options.get("wrap_ddp", True) else None
        return prepare_model(module, move_to_device=True, parallel_strategy=strategy, parallel_strategy_kwargs=ddp_args)

    def backward(self, loss: torch.Tensor) -> None:
        amp.backward(loss)

    def optimize(self, loss: torch.Tensor) -> None:
        self._runner.optimize(loss)

    def run_train_batches(self, iterator: Any, info: dict[str, Any]) -> dict[str, Any]:
        return self._runner.run_train_batches(iterator, info)

    def run_validation_batches(self, iterator: Any, info: dict[str, Any]) -> dict[str, Any]:
        return self._runner.run_validation_batches(iterator, info)


class ManagedRunner:
    def __init__(self, model_cls: type[Model], loop_config: LoopConfig, config: dict[str, Any], options: dict[str, Any]):
        ctx = trainforge.get_context()
        self.rank, self.world_size, self.local_rank = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()
        self.attempt = ctx.get_attempt()
        self.lc = loop_config
        self.options = dict(options)
        self.user_config = {k: v for k, v in config.items() if k != DRIVER_KEY}
        if loop_config.use_fp16:
            amp.accelerate(amp=True, amp_dtype=loop_config.amp_dtype)  # before the model is built
        self.device = get_device()
        self.ctx = WorkerContext(self)
        worker_config = split_batch_size(self.user_config, self.world_size)
        self.model = model = bind_and_init(model_cls, worker_config, self.ctx)
        setup_worker_data(model, worker_config, self.options, self.world_size)
        if not model._registered:
            raise ValueError(
                f"{model_cls.__qualname__}.setup() registered no network: call self.register(models=..., "
                "optimizers=..., criterion=...) there."
            )
        add_sampler = model._add_dist_sampler and self.options.get("add_dist_sampler", True)
        self.train_loader = prepare_loader(model.train_loader, self.world_size, self.rank, add_sampler, self.device)
        self.val_loader = prepare_loader(model.validation_loader, self.world_size, self.rank, add_sampler, self.device)
        model._train_loader, model._validation_loader = self.train_loader, self.val_loader
        self.optimizers = [amp.prepare_optimizer(o) for o in model.optimizers]
        self.state = LoopState()
        self.tracker = EarlyStoppingTracker(loop_config.early_stopping) if loop_config.early_stopping else None
        self._boundary = True  # the current batch ends an accumulation window: step the optimizer
        self._optimize_calls = 0
        self._last_local: dict[str, Any] = {}
        self._epoch_s = 0.0
        self._aio: asyncio.AbstractEventLoop | None = None
        self._restore()

    # -- the two ways to run ----------------------------------------------------------------------
    def fit(self) -> None:
        lc, st = self.lc, self.state
        while st.epoch < lc.num_epochs and not st.stopped_early:
            metrics = self.train_epoch()
            last = st.epoch >= lc.num_epochs
            every = lc.validate_every_n_epochs
            if self.val_loader is not None and every and (st.epoch % every == 0 or last):
                metrics.update(_validation_names(self.validate()))
            if self.tracker is not None:
                st.stopped_early = self.tracker.update(metrics)
                st.early_stopping = self.tracker.state()
                metrics["early_stopped"] = st.stopped_early
            n = lc.checkpoint_every_n_epochs
            self._report(metrics, checkpoint=last or st.stopped_early or bool(n and st.epoch % n == 0))

    def serve(self, driver: dict[str, str]) -> None:
        """A driven run: answer the driver's commands until "stop" (or until the driver is gone)."""
        client = CommandClient.connect(driver, self.attempt, self.rank)
        try:
            while True:
                cmd = client.recv()
                if cmd is None:
                    return
                if cmd.kind == "stop":
                    if cmd.checkpoint:
                        self._report({SEQ_KEY: cmd.seq, "epoch": self.state.epoch}, checkpoint=True)
                    return
                self._answer(cmd)
        finally:
            client.close()

    def _answer(self, cmd: Command) -> None:
        t0 = time.perf_counter()
        st, checkpoint = self.state, False
        if cmd.kind in ("train", "validate") and cmd.epochs is not None:
            while st.epoch < cmd.epochs:  # a restart from an older checkpoint: redo the epochs since
                metrics = self.train_epoch()
                self._report(metrics, checkpoint=self._epoch_checkpoint_due())
        if cmd.kind == "train":
            if cmd.epochs is not None and st.epoch > cmd.epochs and st.last_train is not None:
                metrics = dict(st.last_train)  # done before the restart; its report was not seen
            else:
                metrics = self.train_epoch(cmd.num_steps, cmd.info)
                checkpoint = self._epoch_checkpoint_due()
        elif cmd.kind == "validate":
            metrics = self.validate(cmd.num_steps, cmd.info)
        elif cmd.kind == "checkpoint":
            metrics, checkpoint = {"epoch": st.epoch}, True
        elif cmd.kind == "apply":
            import cloudpickle

            fn = cloudpickle.loads(cmd.fn)
            metrics = {RESULT_KEY: fn(self.model) if cmd.target == "model" else fn()}
        else:
            raise ValueError(f"unknown command {cmd.kind!r} from the driver")
        metrics[SEQ_KEY] = cmd.seq
        if not cmd.reduce:
            metrics[LOCAL_KEY] = self._last_local
        if cmd.profile:
            metrics["profile"] = {f"{cmd.kind}_epoch_s": self._epoch_s, "worker_s": time.perf_counter() - t0}
        self._report(metrics, checkpoint)

    def _epoch_checkpoint_due(self) -> bool:
        n = self.lc.checkpoint_every_n_epochs
        return bool(n) and self.state.epoch % n == 0

    # -- epochs -----------------------------------------------------------------------------------
    def train_epoch(self, num_steps: int | None = None, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """One training epoch (from the resumed batch on); its metrics over every worker."""
        if self.train_loader is None:
            raise ValueError(
                f"{type(self.model).__name__} registered no train_loader: call "
                "self.register_data(train_loader=...) in setup_data() (or setup())."
            )
        t0 = time.perf_counter()
        st, model = self.state, self.model
        info = self._info(info, num_steps)
        model.epoch = st.epoch
        self._set_train_mode(True)
        custom = model._epoch_override("train")
        if custom is not None:  # RaySGD's train_epoch, overridden: it runs the epoch its own way
            stats = self._await(custom(epoch_batches(self.train_loader, st.epoch, 0, num_steps), info))
            metrics, local = self._reduce_override(stats, "train_epoch")
        else:
            # A mid-epoch checkpoint holds the sums of every worker: rank 0 resumes them, the others start at 0.
            acc = EpochMetrics.from_state(st.partial if self.rank == 0 else None)
            batches = epoch_batches(self.train_loader, st.epoch, st.batch_in_epoch, num_steps)
            self._default_train_epoch(batches, acc, st.batch_in_epoch, info, batch_checkpoints=True)
            metrics, local = acc.reduce(), acc.local_summary()
        st.epoch += 1
        st.batch_in_epoch, st.partial = 0, None
        model.epoch = st.epoch
        out = {"epoch": st.epoch, **metrics}
        st.last_train = out
        self._last_local = {"epoch": st.epoch, **local}
        self._epoch_s = time.perf_counter() - t0
        return dict(out)

    def validate(self, num_steps: int | None = None, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """One pass over the validation loader (eval mode, no grad); its metrics over every worker."""
        if self.val_loader is None:
            raise ValueError(
                f"{type(self.model).__name__} registered no validation_loader: call "
                "self.register_data(validation_loader=...) in setup_data() (or setup())."
            )
        t0 = time.perf_counter()
        info = self._info(info, num_steps)
        self._set_train_mode(False)
        batches = epoch_batches(self.val_loader, self.state.epoch, 0, num_steps)
        custom = self.model._epoch_override("validate")
        with torch.no_grad():
            if custom is not None:
                stats = self._await(custom(batches, info))
                metrics, local = self._reduce_override(stats, "validate")
            else:
                acc = EpochMetrics()
                self._validation_batches(batches, acc)
                metrics, local = acc.reduce(), acc.local_summary()
        self._last_local = local
        self._epoch_s = time.perf_counter() - t0
        return metrics

    # What RaySGD's default train_epoch / validate do; also what a TrainingOperator's override reaches
    # with super().train_epoch(iterator, info): this worker's own summary, reduced by the caller.
    def run_train_batches(self, iterator: Any, info: dict[str, Any]) -> dict[str, Any]:
        acc = EpochMetrics()
        self._default_train_epoch(iterator, acc, 0, info, batch_checkpoints=False)
        return acc.local_summary()

    def run_validation_batches(self, iterator: Any, info: dict[str, Any]) -> dict[str, Any]:
        acc = EpochMetrics()
        self._validation_batches(iterator, acc)
        return acc.local_summary()

    def _default_train_epoch(
        self, batches: Any, acc: EpochMetrics, start: int, info: dict[str, Any], batch_checkpoints: bool
    ) -> None:
        st, model, lc = self.state, self.model, self.lc
        self.ctx.info = info
        accumulate = lc.gradient_accumulation_steps
        every = lc.checkpoint_every_n_batches if batch_checkpoints else None
        per_batch = self.ctx.scheduler_step_freq == "batch"
        for batch_idx, (batch, is_last) in enumerate(with_last(batches), start=start):
            self._boundary = is_last or (batch_idx + 1) % accumulate == 0
            self._optimize_calls = 0
            model.global_step = st.global_step
            out = self._await(model.train_step(batch, batch_idx))
            loss, metrics, n = model._train_metrics(out, batch)
            if model.automatic_optimization:
                self.optimize(loss)
            elif per_batch and self._optimize_calls == 0:
                self._step_schedulers()  # RaySGD: after every train_batch that stepped by itself
            acc.add(metrics, n)
            st.global_step += 1
            st.batch_in_epoch = batch_idx + 1
            if every and st.batch_in_epoch % every == 0 and not is_last:
                st.partial = acc.global_state()  # every rank: one all_reduce per mid-epoch checkpoint
                self._report({"epoch": st.epoch, "batches_done": st.batch_in_epoch}, checkpoint=True)
                st.partial = None
        model.global_step = st.global_step
        if self.ctx.scheduler_step_freq == "epoch":
            self._step_schedulers()

    def _validation_batches(self, batches: Any, acc: EpochMetrics) -> None:
        model = self.model
        for batch_idx, batch in enumerate(batches):
            out = self._await(model.validation_step(batch, batch_idx))
            metrics, n = model._val_metrics(out, batch)
            acc.add(metrics, n)

    def _reduce_override(self, stats: Any, hook: str) -> tuple[dict[str, Any], dict[str, Any]]:
        if not isinstance(stats, dict):
            raise ValueError(f"{type(self.model).__name__}.{hook} returned {stats!r}: return a dict of metrics")
        return reduce_summary(stats), dict(stats)

    # -- optimization -----------------------------------------------------------------------------
    def optimize(self, loss: torch.Tensor) -> None:
        """Backward (scaled by the accumulation steps and the gradient scaler; DDP syncs only on the
        window's last batch), then on that batch: clip, step every optimizer, zero the gradients."""
        self._optimize_calls += 1
        accumulate = self.lc.gradient_accumulation_steps
        if accumulate > 1:
            loss = loss / accumulate
        with self._no_sync() if (accumulate > 1 and not self._boundary) else contextlib.nullcontext():
            amp.backward(loss)
        if self._boundary:
            self._optimizer_step()

    def _no_sync(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for m in self.model.models:
            if hasattr(m, "no_sync"):
                stack.enter_context(m.no_sync())
        return stack

    def _optimizer_step(self) -> None:
        model = self.model
        if not self.optimizers:
            raise ValueError(
                f"{type(model).__name__} registered no optimizer: register(models=..., optimizers=...) in setup()."
            )
        current = amp.current()
        scaler = current.scaler if current is not None else None
        clip = self.lc.grad_clip_norm
        if clip is not None:
            if scaler is not None:
                for opt in model.optimizers:
                    scaler.unscale_(opt)
            params = [p for opt in model.optimizers for group in opt.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, clip)
        for opt in model.optimizers:
            model.on_before_optimizer_step(opt)
        if scaler is None:
            for opt in self.optimizers:
                opt.step()
        else:  # every optimizer through the scaler, then one update: the scale of the step just taken
            for opt in model.optimizers:
                scaler.step(opt)
            scaler.update()
        for opt in model.optimizers:
            opt.zero_grad(set_to_none=True)
        self.state.optimizer_steps += 1
        if self.ctx.scheduler_step_freq == "batch":
            self._step_schedulers()

    def _step_schedulers(self) -> None:
        for scheduler in self.model.schedulers:
            scheduler.step()

    # -- checkpoints ------------------------------------------------------------------------------
    def _report(self, metrics: dict[str, Any], checkpoint: bool) -> None:
        """Every rank reports; with ``checkpoint``, rank 0 writes the checkpoint (the state is the same
        on every rank) and the others pass None."""
        if not checkpoint or self.rank != 0:
            trainforge.report(metrics)
            return
        directory = tempfile.mkdtemp(prefix="trainforge-model-")
        try:
            artifact.save_model(self.model, directory, config=self.user_config)
            artifact.save_training_state(self._training_state(), directory)
            trainforge.report(metrics, checkpoint=Checkpoint.from_directory(directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _training_state(self) -> dict[str, Any]:
        model, current = self.model, amp.current()
        return {
            "format": STATE_FORMAT,
            "loop": asdict(self.state),
            "optimizers": [opt.state_dict() for opt in model.optimizers],
            "schedulers": [s.state_dict() for s in model.schedulers],
            "scaler": current.scaler.state_dict() if current is not None and current.scaler is not None else None,
            "rng": _rng_state(),
        }

    def _restore(self) -> None:
        checkpoint = trainforge.get_checkpoint()
        if checkpoint is None:
            return
        model = self.model
        with checkpoint.as_directory() as directory:
            artifact.read_manifest(directory)  # says what is missing when it is not a model directory
            artifact.load_weights(model, directory)
            state = artifact.load_training_state(directory)
        if state is None:
            return  # a model saved with Model.save: its weights, then training from epoch 0
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"{checkpoint.path}: training state format {state.get('format')!r} is not supported")
        _load_each("optimizer", model.optimizers, state["optimizers"])
        _load_each("scheduler", model.schedulers, state["schedulers"])
        current = amp.current()
        if state.get("scaler") is not None and current is not None and current.scaler is not None:
            current.scaler.load_state_dict(state["scaler"])
        self.state = LoopState(**state["loop"])
        if self.tracker is not None and self.state.early_stopping:
            self.tracker = EarlyStoppingTracker(self.lc.early_stopping, self.state.early_stopping)  # type: ignore[arg-type]
        if self.rank == 0 and state.get("rng"):
            _set_rng_state(state["rng"])
        model.epoch, model.global_step = self.state.epoch, self.state.global_step

    # -- helpers ----------------------------------------------------------------------------------
    def _info(self, info: dict[str, Any] | None, num_steps: int | None) -> dict[str, Any]:
        return {**(info or {}), "epoch_idx": self.state.epoch, "num_steps": num_steps, "use_fp16": self.lc.use_fp16,
                "scheduler_step": self.ctx.scheduler_step_freq}  # fmt: skip

    def _set_train_mode(self, training: bool) -> None:
        for m in self.model.models:
            m.train(training)

    def _await(self, value: Any) -> Any:
        """``value``, or its result when a step is ``async def`` (one event loop per worker)."""
        if not inspect.isawaitable(value):
            return value
        if self._aio is None:
            self._aio = asyncio.new_event_loop()
        return self._aio.run_until_complete(_as_coroutine(value))

    def close(self) -> None:
        if self._aio is not None:
            self._aio.close()
            self._aio = None


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


def _validation_names(metrics: dict[str, Any]) -> dict[str, Any]:
    """Validation metrics merged into an epoch's report: its counts get a ``val_`` prefix."""
    rename = {BATCH_COUNT: "val_" + BATCH_COUNT, NUM_SAMPLES: "val_" + NUM_SAMPLES}
    return {rename.get(k, k): v for k, v in metrics.items()}


def _load_each(what: str, objects: list[Any], states: list[Any]) -> None:
    if len(objects) != len(states):
        raise ValueError(
            f"the checkpoint holds {len(states)} {what} state(s), setup() registered {len(objects)}: the model "
            "changed since the checkpoint was written."
        )
    for obj, state in zip(objects, states, strict=True):
        obj.load_state_dict(state)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(RuntimeError):  # fewer GPUs than when it was saved
            torch.cuda.set_rng_state_all(state["cuda"])

