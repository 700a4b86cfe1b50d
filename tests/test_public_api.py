"""The public surface: pinned ``__all__``, a light import, driver-side errors of worker functions, and
the train-loop signature check."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

import trainforge
import trainforge.backend
import trainforge.client
import trainforge.model
import trainforge.registry
import trainforge.serve
import trainforge.sgd
import trainforge.sgd.torch
import trainforge.sgd.utils
import trainforge.torch
from trainforge._internal.train_fn import check_train_loop

TOP_LEVEL = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointUploadMode",
    "DataParallelTrainer",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageError",
    "TrainContext",
    "TrainingFailedError",
    "TrainingReport",
    "WorkerFailure",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "report",
]


def test_top_level_all_is_pinned():
    assert trainforge.__all__ == TOP_LEVEL


def test_torch_all_is_pinned():
    assert sorted(trainforge.torch.__all__) == sorted(
        ["TorchTrainer", "TorchConfig", "prepare_model", "prepare_data_loader", "get_device",
         "accelerate", "prepare_optimizer", "backward"]  # the last three: Ray Train's mixed-precision helpers
    )  # fmt: skip


def test_backend_all_is_pinned():
    assert sorted(trainforge.backend.__all__) == ["Backend", "BackendConfig"]
    from trainforge import server

    assert sorted(server.__all__) == [
        "Client", "InvalidJobError", "Job", "JobConflictError", "JobNotFoundError", "JobStatus", "ServerConfig",
        "ServerError", "ServerNotFoundError", "start_background_server",
    ]  # fmt: skip


def test_client_all_is_pinned():
    assert trainforge.client.__all__ == [
        "ACTIVE_STATES", "BadResponseError", "Client", "ClientConfigError", "ClientError", "InvalidJobError", "Job",
        "JobConflictError", "JobEvent", "JobNotFoundError", "JobState", "JobStatus", "JobTimeoutError",
        "ServerCertificateError", "ServerError", "ServerNotFoundError", "ServerTimeoutError", "TERMINAL_STATES",
        "TrialDecision", "TrialState", "WAITING_STATES", "discover", "trial_state",
    ]  # fmt: skip
    from trainforge import server

    # the server re-exports the client's names it had before the client was a package: the same objects
    for name in ("Client", "InvalidJobError", "Job", "JobConflictError", "JobNotFoundError", "JobStatus",
                 "ServerError", "ServerNotFoundError"):  # fmt: skip
        assert getattr(server, name) is getattr(trainforge.client, name)


def test_model_and_sgd_all_are_pinned():
    assert trainforge.model.__all__ == ["BATCH_SIZE", "BaseModel", "Data", "EarlyStopping", "KerasModel",
                                        "LightGBMModel", "LoopConfig", "Model", "ModelTrainer", "XGBoostModel"]
    assert trainforge.sgd.__all__ == trainforge.sgd.torch.__all__ == ["TorchTrainer", "TrainingOperator"]
    assert trainforge.sgd.utils.__all__ == [
        "AverageMeter", "AverageMeterCollection", "BATCH_COUNT", "BATCH_SIZE", "NUM_SAMPLES"]  # fmt: skip


def test_registry_and_serve_all_are_pinned():
    assert trainforge.registry.__all__ == [
        "AliasMove", "AliasedVersionError", "ConflictError", "IntegrityError", "ModelNotFoundError", "ModelRef",
        "ModelVersion", "RegisteredModel", "Registry", "RegistryError", "SymlinkError", "default_registry_url",
        "load_model", "parse_model_uri",
    ]  # fmt: skip
    assert trainforge.serve.__all__ == ["ModelServer", "ServeConfig", "serve"]


@pytest.mark.parametrize(
    "module",
    [trainforge, trainforge.torch, trainforge.backend, trainforge.client, trainforge.model, trainforge.sgd,
     trainforge.sgd.torch, trainforge.sgd.utils, trainforge.registry, trainforge.serve],
    ids=lambda m: m.__name__,
)
def test_every_exported_name_exists(module):
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"{module.__name__}.{name} is missing"


def test_ray_style_names():
    """The parts of the Ray Train API a port relies on are where Ray has them."""
    from trainforge.torch import TorchConfig, TorchTrainer

    assert issubclass(TorchTrainer, trainforge.DataParallelTrainer)
    assert issubclass(TorchConfig, trainforge.backend.BackendConfig)
    assert trainforge.FailureConfig().max_failures == 0
    assert trainforge.ScalingConfig().num_workers == 1
    assert issubclass(trainforge.TrainingFailedError, Exception)


def test_import_is_light():
    code = (
        "import sys, trainforge, trainforge.torch, trainforge.backend, trainforge.server, trainforge.model\n"
        "import trainforge.client\n"
        "import trainforge.sgd, trainforge.sgd.torch, trainforge.sgd.utils, trainforge.registry, trainforge.serve\n"
        "heavy = [m for m in ('torch', 'ray', 'pandas', 'pyarrow', 'fastapi', 'uvicorn', 'httpx', 'fsspec', 's3fs')\n"
        "         if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout, proc.stdout


def test_the_server_client_uses_only_the_standard_library_for_http():
    """A fresh process that talks to a train server (a CLI command, ``submit()``) imports no HTTP
    library: httpx alone would cost ~0.1 s of every submission."""
    code = (
        "import sys\n"
        "from trainforge.server import Client\n"
        "from trainforge.client._http import Transport\n"
        "Transport('http://127.0.0.1:1', prefix='/api/v1', token=None, timeout=1.0)\n"
        "import trainforge.server.cli.commands\n"
        "print('HEAVY=' + ','.join(m for m in ('httpx', 'httpcore', 'fastapi', 'uvicorn', 'pydantic') "
        "if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout, proc.stdout


def test_import_sets_no_environment_and_only_a_null_logging_handler():
    """Only a NullHandler on the library's logger, so Python's last-resort handler does not print its
    warnings bare (fit() shows them as console lines)."""
    code = (
        "import os, logging\n"
        "before = dict(os.environ)\n"
        "import trainforge, trainforge.torch, trainforge.backend\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "handlers = logging.getLogger('trainforge').handlers\n"
        "assert [type(h) for h in handlers] == [logging.NullHandler], handlers  # the only logging set-up\n"
        "assert not logging.getLogger().handlers\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "call",
    [
        lambda: trainforge.report({"loss": 1.0}),
        lambda: trainforge.get_context(),
        lambda: trainforge.get_checkpoint(),
        lambda: trainforge.get_dataset_shard("train"),
    ],
    ids=["report", "get_context", "get_checkpoint", "get_dataset_shard"],
)
def test_worker_functions_outside_a_worker(call):
    with pytest.raises(RuntimeError) as info:
        call()
    msg = str(info.value)
    assert "train loop" in msg and "trainer" in msg


# -- train loop signatures ----------------------------------------------------------------------------


def no_args():
    pass


def one_arg(config):
    pass


def with_defaults(config, verbose=False, *, seed=0):
    pass


def only_defaults(config=None):
    pass


def varargs(*args, **kwargs):
    pass


async def async_loop(config):
    pass


class CallableWithConfig:
    def __call__(self, config):
        pass


class CallableNoArgs:
    def __call__(self):
        pass


class Holder:
    def method(self, config):
        pass


@pytest.mark.parametrize(
    ("fn", "takes_config"),
    [
        (no_args, False),
        (one_arg, True),
        (lambda: None, False),
        (lambda config: None, True),
        (async_loop, True),
        (CallableWithConfig(), True),
        (CallableNoArgs(), False),
        (with_defaults, True),
        (only_defaults, True),
        (varargs, True),
        (Holder().method, True),
        (functools.partial(lambda a, config: None, 1), True),
    ],
    ids=[
        "no_args",
        "one_arg",
        "lambda0",
        "lambda1",
        "async",
        "callable1",
        "callable0",
        "defaults",
        "only_defaults",
        "varargs",
        "bound_method",
        "partial",
    ],
)
def test_check_train_loop_accepts(fn, takes_config):
    assert check_train_loop(fn) is takes_config


def test_check_train_loop_rejects_two_required_args():
    def train(config, model):
        pass

    with pytest.raises(TypeError) as info:
        check_train_loop(train)
    msg = str(info.value)
    assert "'train'" in msg and "2 required arguments" in msg and "(config, model)" in msg
    assert "train_loop_config" in msg


def test_check_train_loop_rejects_lambda_with_two_args():
    with pytest.raises(TypeError, match=r"\(a, b\)"):
        check_train_loop(lambda a, b: None)


def test_check_train_loop_rejects_non_callable():
    with pytest.raises(TypeError, match="must be a callable"):
        check_train_loop({"not": "callable"})


def test_check_train_loop_rejects_required_keyword_only():
    def train(config, *, lr):
        pass

    with pytest.raises(TypeError, match="lr"):
        check_train_loop(train)


def test_trainer_checks_the_loop_before_starting(tmp_path):
    def train(config, model):
        pass

    with pytest.raises(TypeError, match="config, model"):
        trainforge.DataParallelTrainer(train, run_config=trainforge.RunConfig(storage_path=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []  # nothing was created
