"""What the registry puts in the core's tables (:mod:`trainforge._internal.extensions`): ``models:/``
URIs as checkpoints (``Checkpoint.from_uri``, ``resume_from_checkpoint``) and as model definitions
(``ModelTrainer("models:/digits-net")``). Filled by the distribution's entry points; :func:`install`
fills them in this process too (``import trainforge.registry`` calls it), for a checkout whose
metadata does not list them yet."""

from __future__ import annotations

from typing import Any


def checkpoint_from_uri(uri: str) -> Any:
    """The checkpoint of a registered version (``models:/name/3``, ``models:/name@production``,
    ``models:/name``): its local copy, pulled and verified on first use, from ``Registry()`` or the
    registry named by ``?registry=<url>``."""
    from trainforge.registry import Registry, parse_model_uri

    ref = parse_model_uri(uri)
    return Registry(ref.registry).get(ref).checkpoint


def definition_from_uri(uri: str) -> Any:
    """The ``trainforge.model.ModelDefinition`` of ``models:/name`` (its latest definition),
    ``models:/name/3`` or ``models:/name@alias``, from ``Registry()`` or ``?registry=<url>``'s."""
    from trainforge.registry import Registry, parse_model_uri

    ref = parse_model_uri(uri)
    return Registry(ref.registry).definition(ref)


def install() -> None:
    """Fill the core's tables in this process (what the entry points do for an installed trainforge)."""
    from trainforge._internal.extensions import CHECKPOINT_SCHEMES, MODEL_DEFINITIONS, register

    register(CHECKPOINT_SCHEMES, "models", checkpoint_from_uri)
    register(MODEL_DEFINITIONS, "models", definition_from_uri)
