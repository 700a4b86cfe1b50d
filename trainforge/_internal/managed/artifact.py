"""A model directory, the one format a model registry stores and a server loads, and the loop's
training state beside it in a checkpoint.

    model.json          {"format": 1, "class": "pkg.module:Class" | null, "config": {...} | null, "versions": {...}}
    weights.pt          {"models": [state_dict of each registered network, unwrapped, on the CPU],
                         "extra": Model.state_dict()}
    model_class.pkl     the class pickled by value (cloudpickle), only when it has no import path
                        (defined in __main__ or inside a function)
    config.pkl          the config (cloudpickle), only when it is not JSON
    training_state.pt   checkpoints of the managed loop only: optimizers, schedulers, gradient scaler,
                        epoch, batch within the epoch, the epoch's partial metric sums, early
                        stopping, RNG states (see loop.py)

``Model.save`` writes the first four; a checkpoint of the managed loop is a model directory plus
``training_state.pt``, so ``Model.load`` takes either.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from trainforge._internal.managed.model import Model, bind_and_init, torch_module, unwrap

MANIFEST = "model.json"
WEIGHTS = "weights.pt"
CLASS_PICKLE = "model_class.pkl"
CONFIG_PICKLE = "config.pkl"
TRAINING_STATE = "training_state.pt"
FORMAT = 1


def class_path(cls: type) -> str | None:
    """``"module:QualName"`` when importing it gives back ``cls``; None otherwise."""
    module, qualname = cls.__module__, cls.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if obj is cls else None


def save_model(model: Model, directory: str, config: dict[str, Any] | None = None) -> None:
    """Write ``model`` as a model directory (``config``: the config to record, default ``model.config``)."""
    import cloudpickle

    torch = torch_module()
    os.makedirs(directory, exist_ok=True)
    config = dict(model.config if config is None else config)
    cls = type(model)
    path = class_path(cls)
    try:
        json_config: Any = json.loads(json.dumps(config))
    except (TypeError, ValueError):
        json_config = None
    versions = {"torch": torch.__version__}
    try:
        from trainforge import __version__

        versions["trainforge"] = __version__
    except ImportError:
        pass
    manifest = {"format": FORMAT, "class": path, "class_name": cls.__qualname__, "config": json_config,
                "versions": versions}  # fmt: skip
    weights = {
        "models": [{k: v.detach().cpu() for k, v in unwrap(m).state_dict().items()} for m in model.models],
        "extra": model.state_dict(),
    }
    torch.save(weights, os.path.join(directory, WEIGHTS))
    if path is None:
        with open(os.path.join(directory, CLASS_PICKLE), "wb") as f:
            f.write(cloudpickle.dumps(cls))
    if json_config is None:
        with open(os.path.join(directory, CONFIG_PICKLE), "wb") as f:
            f.write(cloudpickle.dumps(config))
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        listing = sorted(os.listdir(directory)) if os.path.isdir(directory) else "no such directory"
        raise FileNotFoundError(
            f"{directory!r} is not a trainforge model directory: it has no {MANIFEST} (it holds {listing}). "
            "Pass a directory written by Model.save() or a checkpoint of ModelTrainer."
        )
    with open(path) as f:
        manifest: dict[str, Any] = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: model format {manifest.get('format')!r} is not supported (this trainforge reads {FORMAT})")
    return manifest


def model_class(directory: str, manifest: dict[str, Any]) -> type[Model]:
    """The saved class: by import path, else the pickled copy."""
    import cloudpickle

    path = manifest.get("class")
    if path:
        module, _, qualname = path.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            return obj  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            if not os.path.exists(os.path.join(directory, CLASS_PICKLE)):
                raise ImportError(
                    f"the model class {path} cannot be imported here ({exc}); make its module importable "
                    "(install the package, or add its directory to sys.path)."
                ) from exc
    with open(os.path.join(directory, CLASS_PICKLE), "rb") as f:
        return cloudpickle.loads(f.read())  # type: ignore[no-any-return]


def saved_config(directory: str, manifest: dict[str, Any]) -> dict[str, Any]:
    import cloudpickle

    if manifest.get("config") is not None:
        return dict(manifest["config"])
    with open(os.path.join(directory, CONFIG_PICKLE), "rb") as f:
        return dict(cloudpickle.loads(f.read()))


def load_weights(model: Model, directory: str) -> None:
    """Load ``weights.pt`` into ``model``'s registered networks and its extra state."""
    torch = torch_module()
    weights = torch.load(os.path.join(directory, WEIGHTS), map_location="cpu", weights_only=False)
    saved = weights["models"]
    if len(saved) != len(model.models):
        raise ValueError(
            f"{directory}: the saved model has {len(saved)} network(s), {type(model).__name__}.setup() "
            f"registered {len(model.models)}; the class or its config changed since it was saved."
        )
    for module, state in zip(model.models, saved, strict=True):
        target = unwrap(module)
        device = next((p.device for p in target.parameters()), None)
        target.load_state_dict({k: v.to(device) for k, v in state.items()} if device is not None else state)
    model.load_state_dict(weights.get("extra"))


def load_model(source: Any, expected: type[Model]) -> Model:
    """The model in ``source`` (a directory path or a ``trainforge.Checkpoint``), on the CPU, eval mode."""
    from trainforge._internal.checkpoint import Checkpoint

    if isinstance(source, Checkpoint):
        with source.as_directory() as directory:
            return load_model(directory, expected)
    directory = os.fspath(source)
    manifest = read_manifest(directory)
    cls = model_class(directory, manifest)
    if not (isinstance(cls, type) and issubclass(cls, expected)):
        raise TypeError(f"{directory} holds a {getattr(cls, '__qualname__', cls)}, not a {expected.__qualname__}")
    model = bind_and_init(cls, saved_config(directory, manifest), None)
    load_weights(model, directory)
    for m in model.models:
        m.eval()
    return model


def save_training_state(state: dict[str, Any], directory: str) -> None:
    torch_module().save(state, os.path.join(directory, TRAINING_STATE))


def load_training_state(directory: str) -> dict[str, Any] | None:
    path = os.path.join(directory, TRAINING_STATE)
    if not os.path.exists(path):
        return None  # a model directory (Model.save): weights only, training starts at epoch 0
    state: dict[str, Any] = torch_module().load(path, map_location="cpu", weights_only=False)
    return state
