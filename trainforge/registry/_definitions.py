"""Model definitions in a registry: ``Registry.put`` (a model class, its default config, search space
and data, no weights: a version of ``kind == "definition"``), resolving a reference to one (what
``ModelTrainer("models:/name")``, ``Tuner("models:/name")`` and ``trainforge train`` start from), and
the lineage view ``definition -> runs -> trained versions -> aliases``.

A definition's files are a model directory without a trained state (``trainforge.model``'s format:
``model.json`` with ``kind: "definition"``, the class by import path or pickled by value, the search
space pickled); what is trained from it records ``lineage["definition"]`` (the run's checkpoints carry
it in their metadata), so the registry can show where each trained version came from.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any

from trainforge.registry._types import ModelNotFoundError, ModelVersion
from trainforge.registry._uri import ModelRef, check_name, parse_model_uri

if TYPE_CHECKING:
    from trainforge.model import ModelDefinition
    from trainforge.registry._registry import Registry

DEFINITION = "definition"
TRAINED = "trained"


def put(reg: Registry, model_cls: Any, name: str, *, config: dict[str, Any] | None, hyperparameter_space: Any,
        data: Any, by_value: bool, description: str | None, tags: dict[str, Any] | None, alias: str | None,
        by: str | None) -> ModelVersion:  # fmt: skip
    """See :meth:`Registry.put`."""
    from trainforge.model import check_data, is_model_class, write_definition

    check_name(name)
    if not is_model_class(model_cls):
        raise ValueError(f"Registry.put({model_cls!r}, ...): give a model class (a subclass of trainforge.model.Model, "
                         "XGBoostModel, LightGBMModel or KerasModel)")  # fmt: skip
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"Registry.put(config={config!r}): give the model's default config as a dict (or None)")
    space = model_cls.hyperparameter_space() if hyperparameter_space is None else hyperparameter_space
    if space is not None and not isinstance(space, dict):
        raise ValueError(f"Registry.put(hyperparameter_space={space!r}): give a dict of config keys to search spaces")
    check_data(data, "Registry.put")
    if not isinstance(by_value, bool):
        raise ValueError(f"Registry.put(by_value={by_value!r}): give True or False")
    with tempfile.TemporaryDirectory(prefix="trainforge-definition-") as tmp:
        write_definition(model_cls, tmp, dict(config or {}), hyperparameter_space=space, data=data, by_value=by_value)
        return reg.register(name, tmp, description=description, tags=tags, alias=alias, by=by,
                            lineage={"checkpoint_path": None})  # fmt: skip


def latest_of_kind(reg: Registry, name: str, kind: str) -> ModelVersion:
    """The newest live version of ``name`` of ``kind``; ModelNotFoundError saying what there is."""
    versions = [v for v in reg.versions(name) if v.kind == kind]
    if versions:
        return versions[-1]
    if kind == DEFINITION:
        raise ModelNotFoundError(
            f"model {name!r} has no definition in registry {reg.url}: register one with "
            f"Registry.put(MyModel, {name!r}) (or `trainforge models put {name} module:Class`)"
        )
    raise ModelNotFoundError(f"model {name!r} has no trained version in registry {reg.url} (only definitions): "
                             f"train it (trainforge train models:/{name}) and register the result")  # fmt: skip


def definition(reg: Registry, ref: str | ModelRef) -> ModelDefinition:
    """The definition ``ref`` names: ``name`` (its latest definition), ``name/3`` or ``name@alias``;
    a trained version gives its class and config (and its class's search space)."""
    from trainforge.model import read_definition

    r = ref if isinstance(ref, ModelRef) else parse_model_uri(ref)
    if r.registry is not None and (other := type(reg)(r.registry)) != reg:
        return definition(other, ModelRef(r.name, r.version, r.alias))
    mv = latest_of_kind(reg, r.name, DEFINITION) if r.version is None and r.alias is None else reg.get(r)
    return read_definition(reg.local_dir(mv), mv.uri)


def lineage(reg: Registry, name: str) -> list[dict[str, Any]]:
    """``name``'s definitions, each with the runs trained from it (in this registry, under any model
    name) and the versions registered from each run, with the aliases pointing at them (what is
    served); trained versions of ``name`` from no known definition come last, under ``None``."""
    check_name(name)
    defs = [v for v in reg.versions(name) if v.kind == DEFINITION]
    known = {d.uri for d in defs}
    trained: list[tuple[ModelVersion, list[str]]] = []
    for other in reg.model_names():
        aliases = reg.get_model(other).aliases
        for v in reg.versions(other):
            source = v.lineage.get("definition")
            if v.kind == TRAINED and (source in known or (other == name and source not in known)):
                trained.append((v, sorted(a for a, n in aliases.items() if n == v.version)))
    out = []
    for uri, d in [*((d.uri, d) for d in defs), (None, None)]:
        runs: dict[str | None, list[dict[str, Any]]] = {}
        for v, names in trained:
            source = v.lineage.get("definition")
            if source == uri or (uri is None and source not in known):
                runs.setdefault(v.lineage.get("run_path"), []).append(
                    {"uri": v.uri, "metrics": v.metrics, "aliases": names, "created_at": v.created_at})
        if d is None and not runs:
            continue
        out.append({"definition": uri, "model_class": d.model_class if d is not None else None,
                    "framework": d.framework if d is not None else None,
                    "runs": [{"run_path": path, "versions": vs} for path, vs in runs.items()]})  # fmt: skip
    return out


def check_servable(mv: ModelVersion) -> None:
    """ValueError when ``mv`` is a definition (no trained state to serve)."""
    if mv.kind == DEFINITION:
        raise ValueError(
            f"{mv.uri} is a model definition (a class and its config, no trained state): train it "
            f"(ModelTrainer({mv.uri!r}) or `trainforge train {mv.uri}`), register the result and serve that version"
        )
