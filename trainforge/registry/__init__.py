"""A model registry on plain storage: versioned, immutable models from checkpoints, with aliases and
their history, lineage, push/pull between registries, and loading by URI.

    from trainforge.registry import Registry, load_model

    reg = Registry()                                   # $TRAINFORGE_REGISTRY, else ~/trainforge/registry
    mv = reg.register("digits", result, model_cls=DigitsNet, alias="staging")
    reg.set_alias("digits", "production", mv.version)
    model = load_model("models:/digits@production")    # the model object, ready for model(x)
    reg.push("digits", "s3://team-bucket/registry")    # every version and alias; only missing files move

A registry is a directory or any fsspec URL; it needs no database or server. Versions are numbered
from 1 and never change; identical files are stored once (by sha256); an alias move is recorded with
who made it and when. ``models:/name/3`` and ``models:/name@production`` work wherever a checkpoint
is accepted (``resume_from_checkpoint``, ``Checkpoint.from_uri``, a tuner's trainer).

Models by reference: ``reg.put(MyModel, "digits-net", config=..., hyperparameter_space=...)`` stores a
*definition* (the class, its default config and search space, no weights) that
``ModelTrainer("models:/digits-net")``, ``Tuner("models:/digits-net")``, ``trainforge train`` and
``load_model("models:/digits-net/1", config=...)`` take; what is trained from it records it in its
lineage (``reg.lineage("digits-net")``: definition -> runs -> trained versions -> aliases).

What is registered is exactly the source's regular files, and the source is left as it was: a
symbolic link in it (to a file or a directory, inside it or out) is refused with ``SymlinkError``
naming it, never followed; no source file is modified, its mode included (files are copied into the
registry, or hard-linked when a committed checkpoint's file is read-only already). A version deleted
by anyone is not found at once, by every ``Registry``. Every error of the registry is a
``RegistryError`` (the tree: :mod:`trainforge.registry._types`).
"""

# Besides __all__, for the platform packages above the registry (serve, the train server), not user
# API: what a model URI and a model or alias name are (NAME_PATTERN, SCHEME, check_name, check_alias).
from trainforge.registry import _entry
from trainforge.registry._registry import Registry, default_registry_url, load_model
from trainforge.registry._types import (
    AliasedVersionError,
    AliasMove,
    ConflictError,
    IntegrityError,
    ModelNotFoundError,
    ModelVersion,
    RegisteredModel,
    RegistryError,
    SymlinkError,
)
from trainforge.registry._uri import NAME_PATTERN as NAME_PATTERN
from trainforge.registry._uri import SCHEME as SCHEME
from trainforge.registry._uri import ModelRef, parse_model_uri
from trainforge.registry._uri import check_alias as check_alias
from trainforge.registry._uri import check_name as check_name

__all__ = [
    "AliasMove",
    "AliasedVersionError",
    "ConflictError",
    "IntegrityError",
    "ModelNotFoundError",
    "ModelRef",
    "ModelVersion",
    "RegisteredModel",
    "Registry",
    "RegistryError",
    "SymlinkError",
    "default_registry_url",
    "load_model",
    "parse_model_uri",
]

_entry.install()  # models:/ references in this process, also from a checkout without installed entry points
