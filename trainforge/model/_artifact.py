"""A model directory, the one format a model registry stores and a server loads, whatever the model's
framework, and the managed loop's training state beside it in a checkpoint.

    model.json          {"format": 1, "framework": "torch" | "xgboost" | "lightgbm" | "keras",
                         "class": "pkg.module:Class" | null, "class_name", "config": {...} | null,
                         "kind": "trained" | "definition", "versions": {...}}
    model_class.pkl     the class pickled by value (cloudpickle), only when it has no import path
                        (defined in __main__ or inside a function), or when asked (a definition)
    config.pkl          the config (cloudpickle), only when it is not JSON
    the framework's files:
      weights.pt        torch: {"models": [state_dict of each registered network, unwrapped, on the
                        CPU], "extra": Model.state_dict()}
      model.ubj         XGBoost's booster; model.txt LightGBM's; model.keras Keras's
    training_state.pt   checkpoints of the torch managed loop only: optimizers, schedulers, gradient
                        scaler, epoch, batch within the epoch, the epoch's partial metric sums, early
                        stopping, RNG states (see loop.py)

A **definition** (``kind: "definition"``, what ``Registry.put`` stores) has no framework files: the
class, its default config, and optionally ``hyperparameter_space.pkl`` (the search space, cloudpickled)
and ``data_class.pkl`` / ``"data"`` (the default ``Data``, by value or by import path); loading it gives
an untrained model built from its config (:func:`read_definition`).

``BaseModel.save`` writes a model directory; a checkpoint of ``ModelTrainer`` is one (plus, for torch,
``training_state.pt``), so ``load`` takes either.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import TYPE_CHECKING, Any

from trainforge.model._support import torch_module, unwrap

if TYPE_CHECKING:
    from trainforge.model._base import BaseModel
    from trainforge.model._definition import ModelDefinition
    from trainforge.model._model import Model

MANIFEST = "model.json"
WEIGHTS = "weights.pt"
CLASS_PICKLE = "model_class.pkl"
CONFIG_PICKLE = "config.pkl"
TRAINING_STATE = "training_state.pt"
SPACE_PICKLE = "hyperparameter_space.pkl"
DATA_PICKLE = "data_class.pkl"
FORMAT = 1


def import_path(path: str) -> Any:
    """The object ``"module:QualName"`` names."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def class_path(cls: type) -> str | None:
    """``"module:QualName"`` when importing it gives back ``cls``; None otherwise."""
    module, qualname = cls.__module__, cls.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return None
    try:
        obj = import_path(f"{module}:{qualname}")
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if obj is cls else None


def _pickle_to(directory: str, filename: str, obj: Any, by_value: bool = False) -> None:
    """``obj`` cloudpickled into ``directory/filename``; ``by_value``: a class (or function) of an
    importable module is pickled with its code, not by its import path."""
    import sys

    import cloudpickle

    cls = obj if isinstance(obj, type) else type(obj)
    # Only a class its module really holds is pickled by reference (anything else by value already).
    module = sys.modules.get(cls.__module__) if by_value and class_path(cls) is not None else None
    register = module is not None and module.__name__ not in cloudpickle.list_registry_pickle_by_value()
    if register:
        cloudpickle.register_pickle_by_value(module)
    try:
        blob = cloudpickle.dumps(obj)
    finally:
        if register:
            cloudpickle.unregister_pickle_by_value(module)
    with open(os.path.join(directory, filename), "wb") as f:
        f.write(blob)


def write_manifest(model_cls: type, directory: str, config: dict[str, Any], *, kind: str = "trained",
                   by_value: bool = False, extra: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Write ``model.json`` for ``model_cls`` with ``config`` (and the class's and the config's pickles
    when they need one) into ``directory``; the framework's files are the caller's."""
    os.makedirs(directory, exist_ok=True)
    config = dict(config)
    path = class_path(model_cls)
    try:
        json_config: Any = json.loads(json.dumps(config))
    except (TypeError, ValueError):
        json_config = None
    versions = dict(model_cls._framework_versions()) if kind == "trained" else {}  # type: ignore[attr-defined]
    try:
        from trainforge import __version__

        versions["trainforge"] = __version__
    except ImportError:
        pass
    manifest = {"format": FORMAT, "framework": getattr(model_cls, "framework", "torch"), "kind": kind,
                "class": path, "class_name": model_cls.__qualname__, "config": json_config, "versions": versions,
                **(extra or {})}  # fmt: skip
    if path is None or by_value:
        _pickle_to(directory, CLASS_PICKLE, model_cls, by_value=by_value)
    if json_config is None:
        _pickle_to(directory, CONFIG_PICKLE, config)
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


def save_model(model: BaseModel, directory: str, config: dict[str, Any] | None = None) -> None:
    """Write ``model`` as a model directory (``config``: the config to record, default ``model.config``)."""
    os.makedirs(directory, exist_ok=True)
    model._save_files(directory)
    write_manifest(type(model), directory, model.config if config is None else config)


def save_weights(model: Model, directory: str) -> None:
    """A torch model's ``weights.pt``."""
    torch = torch_module()
    weights = {
        "models": [{k: v.detach().cpu() for k, v in unwrap(m).state_dict().items()} for m in model.models],
        "extra": model.state_dict(),
    }
    torch.save(weights, os.path.join(directory, WEIGHTS))


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


def model_class(directory: str, manifest: dict[str, Any]) -> type[BaseModel]:
    """The saved class: by import path, else the pickled copy."""
    import cloudpickle

    path = manifest.get("class")
    if path:
        try:
            return import_path(path)  # type: ignore[no-any-return]
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


def load_model(source: Any, expected: type[BaseModel] | None = None, config: dict[str, Any] | None = None) -> Any:
    """The model in ``source`` (a directory path or a ``trainforge.Checkpoint``): a trained one with
    its state (torch: on the CPU, eval mode), or for a definition an untrained one built from its
    config updated with ``config``. ``config`` is refused for a trained model (its state was trained
    with its own config)."""
    from trainforge import Checkpoint

    if isinstance(source, Checkpoint):
        with source.as_directory() as directory:
            return load_model(directory, expected, config)
    directory = os.fspath(source)
    manifest = read_manifest(directory)
    cls = model_class(directory, manifest)
    if not (isinstance(cls, type) and hasattr(cls, "_load_files")) or (expected is not None and not issubclass(cls, expected)):
        wanted = expected.__qualname__ if expected is not None else "model class of trainforge.model"
        raise TypeError(f"{directory} holds a {getattr(cls, '__qualname__', cls)}, not a {wanted}")
    saved = saved_config(directory, manifest)
    if manifest.get("kind") == "definition":
        return cls({**saved, **(config or {})})
    if config is not None:
        raise ValueError(
            f"config={config!r}: {directory} holds a trained {cls.__qualname__}, whose state was trained with its "
            "own config; load it without config=, or load its definition to build a new one"
        )
    model = cls._for_inference(saved)
    model._load_files(directory)
    return model


def read_definition(directory: str, uri: str | None = None) -> ModelDefinition:
    """The definition (class, default config, search space, default data) in a model directory; a
    trained model's directory gives its class and config, and its class's search space."""
    import cloudpickle

    from trainforge.model._definition import ModelDefinition

    manifest = read_manifest(directory)
    cls = model_class(directory, manifest)
    space = cls.hyperparameter_space()
    path = os.path.join(directory, SPACE_PICKLE)
    if os.path.exists(path):
        with open(path, "rb") as f:
            space = cloudpickle.loads(f.read())
    data: Any = None
    if manifest.get("data"):
        data = import_path(manifest["data"])
    elif os.path.exists(os.path.join(directory, DATA_PICKLE)):
        with open(os.path.join(directory, DATA_PICKLE), "rb") as f:
            data = cloudpickle.loads(f.read())
    return ModelDefinition(model_cls=cls, config=saved_config(directory, manifest), hyperparameter_space=space,
                           data=data, uri=uri, by_value=os.path.exists(os.path.join(directory, CLASS_PICKLE)))  # fmt: skip


def pickle_by_value(*objs: Any) -> None:
    """From now on, this process pickles the modules of ``objs`` (classes, or instances of them) with
    their code, not by import path: what a run of a by-value definition sends its workers, and so
    what its workers save (a class they could not import by path is saved with its pickle), carries
    the class wherever it goes. Modules it cannot import by name are pickled so already."""
    import sys

    import cloudpickle

    registered = set(cloudpickle.list_registry_pickle_by_value())
    for obj in objs:
        cls = obj if isinstance(obj, type) else type(obj)
        if obj is None or class_path(cls) is None or cls.__module__ in registered:
            continue
        module = sys.modules.get(cls.__module__)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)
            registered.add(cls.__module__)


def write_definition(model_cls: type[BaseModel], directory: str, config: dict[str, Any], *,
                     hyperparameter_space: dict[str, Any] | None = None, data: Any = None,
                     by_value: bool = False) -> None:  # fmt: skip
    """Write a definition (no trained state): ``model.json`` with ``kind: "definition"``, the class (by
    value when asked or when it has no import path), the search space and the default data."""
    extra: dict[str, Any] = {}
    data_path = class_path(data) if isinstance(data, type) and not by_value else None
    if data_path is not None:
        extra["data"] = data_path
    write_manifest(model_cls, directory, config, kind="definition", by_value=by_value, extra=extra)
    if hyperparameter_space is not None:
        _pickle_to(directory, SPACE_PICKLE, dict(hyperparameter_space))
    if data is not None and data_path is None:
        _pickle_to(directory, DATA_PICKLE, data, by_value=by_value)


def save_training_state(state: dict[str, Any], directory: str) -> None:
    torch_module().save(state, os.path.join(directory, TRAINING_STATE))


def load_training_state(directory: str) -> dict[str, Any] | None:
    path = os.path.join(directory, TRAINING_STATE)
    if not os.path.exists(path):
        return None  # a model directory (Model.save): weights only, training starts at epoch 0
    state: dict[str, Any] = torch_module().load(path, map_location="cpu", weights_only=False)
    return state
